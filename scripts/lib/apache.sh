# shellcheck shell=bash
# The Apache prelude the end-to-end scripts share (test-modrdma.sh,
# test-modrdma-https.sh, test-cache.sh, test-rhttp-recursive.sh,
# cache-push-common.sh for test-cache-push.sh and bench-cache-push.sh,
# bench-modrdma-https.sh, bench-wan-http.sh, apps/zipsite/common.sh for
# test-zipsite.sh and bench-zipsite.sh): an unmodified Debian apache2,
# prefork, in the foreground on loopback ports with a config of the
# script's own, never the system's. Each script keeps its own directives
# (modules of its own, vhosts, locations) and appends them after the head.
#
#   apt_install PKG...            apt-get install PKGs quietly, never
#                                 starting a system service they ship
#   apache_install CMD[=PKG]...   apt_install what is missing (a bare CMD
#                                 is its own package); 1 naming the fix if
#                                 a CMD is still absent
#   apache_conf_head RUN LOGS [MOD...]   print the config's common head:
#                                 ServerRoot, ServerName, the runtime dir
#                                 and PidFile in RUN, ErrorLog in LOGS,
#                                 www-data, the prefork MPM, authz_core and
#                                 each Debian module MOD (`mime`, `cgi`, ...)
#   apache_prefork N [MIN MAX LIMIT]   print the prefork pool: StartServers N,
#                                 MinSpareServers MIN, MaxSpareServers MAX,
#                                 ServerLimit/MaxRequestWorkers LIMIT
#                                 (default all N)
#   apache_start CONF PORT OUT [PATH [VSZ_KIB]]   start apache2 -f CONF in
#                                 its own session (stdout+stderr appended to
#                                 OUT), wait until http://127.0.0.1:PORT/PATH
#                                 answers (at most APACHE_WAIT_S, default
#                                 15 s) while it lives; echo its pid either
#                                 way; 1 if it did not answer. VSZ_KIB: a
#                                 soft address-space limit (ulimit -S -v).
#                                 APACHE_PROBE_URL replaces the URL probed
#                                 (an https:// one is not verified: -k).
#                                 APACHE_NETNS: apache2 runs in that network
#                                 namespace (ip netns exec), and the probe
#                                 too unless APACHE_PROBE_NETNS names
#                                 another (the client's side of a path)
#   apache_stop PID...            TERM, wait at most 10 s each, then KILL
#   apache_logs FILE...           print the last 40 lines of each FILE that
#                                 exists, under its name (on a failed start)
#   "${APACHE2[@]}" ARGS...       apache2 as apache_start runs it (for a
#                                 script's own `apache2 -t`): with
#                                 APACHE_PRELOAD set, under LD_PRELOAD of
#                                 that library, the ASan runtime that
#                                 modules built with AddressSanitizer need
#                                 in an uninstrumented apache2
#                                 (scripts/sanitize-apache.sh); only
#                                 apache2 gets it, not the test's clients
#
# Why foreground and setsid: -DFOREGROUND keeps the parent as the pid we
# hold, and on shutdown prefork signals its whole process group, which
# without setsid would include the calling script.

APACHE2=(env ${APACHE_PRELOAD:+"LD_PRELOAD=$APACHE_PRELOAD"} apache2)

# apt_install PKG...
apt_install() {
    echo "installing $*" >&2
    timeout 300 apt-get update -qq >/dev/null
    # policy-rc.d exit 101 (invoke-rc.d(8), "101 - action forbidden"): the
    # packages must not start a system Apache on port 80 or a PostgreSQL;
    # the scripts start their own, on their own ports and sockets.
    local policy=/usr/sbin/policy-rc.d added=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1
    fi
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$@" >/dev/null
    [ "$added" = 1 ] && rm -f "$policy"
    return 0
}

# apache_install CMD[=PKG]...
apache_install() {
    local need=() c
    for c in "$@"; do
        command -v "${c%%=*}" >/dev/null || need+=("${c#*=}")
    done
    [ "${#need[@]}" -eq 0 ] || apt_install "${need[@]}"
    for c in "$@"; do
        if ! command -v "${c%%=*}" >/dev/null; then
            echo "prerequisite ${c%%=*} is missing and could not be installed: apt-get install ${c#*=}" >&2
            return 1
        fi
    done
}

# apache_conf_head RUN LOGS [MOD...]
apache_conf_head() {
    local run="$1" logs="$2" m
    shift 2
    cat <<EOF
ServerRoot /etc/apache2
ServerName 127.0.0.1
DefaultRuntimeDir $run
PidFile $run/httpd.pid
ErrorLog $logs/error.log
User www-data
Group www-data
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
EOF
    for m in "$@"; do
        echo "LoadModule ${m}_module /usr/lib/apache2/modules/mod_$m.so"
    done
}

# apache_prefork N [MIN MAX LIMIT]
apache_prefork() {
    cat <<EOF
StartServers $1
MinSpareServers ${2:-$1}
MaxSpareServers ${3:-$1}
ServerLimit ${4:-$1}
MaxRequestWorkers ${4:-$1}
EOF
}

# apache_start CONF PORT OUT [PATH [VSZ_KIB]] -> pid on stdout
apache_start() {
    local conf="$1" port="$2" out="$3" path="${4:-}" vsz="${5:-}" pid i
    local in_ns=() probe_ns=() pns="${APACHE_PROBE_NETNS:-${APACHE_NETNS:-}}"
    # ip netns exec execs the command, so the pid stays apache2's.
    [ -z "${APACHE_NETNS:-}" ] || in_ns=(ip netns exec "$APACHE_NETNS")
    [ -z "$pns" ] || probe_ns=(ip netns exec "$pns")
    (
        # Soft limit only: a test may lift it later as the workers' user
        # (raising a hard limit needs CAP_SYS_RESOURCE).
        if [ -n "$vsz" ]; then ulimit -S -v "$vsz" || exit 1; fi
        exec "${in_ns[@]}" setsid "${APACHE2[@]}" -d /etc/apache2 -f "$conf" -DFOREGROUND >>"$out" 2>&1
    ) &
    pid=$!
    for ((i = 0; i < ${APACHE_WAIT_S:-15} * 10; i++)); do
        if "${probe_ns[@]}" curl -s -k -o /dev/null --max-time 2 "${APACHE_PROBE_URL:-http://127.0.0.1:$port/$path}"; then
            echo "$pid"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "$pid"
    return 1
}

# apache_stop PID...
apache_stop() {
    local p
    for p in "$@"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
    for p in "$@"; do
        [ -n "$p" ] || continue
        timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    return 0
}

# apache_logs FILE...
apache_logs() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "---- $f (last 40 lines)"
        tail -n 40 "$f"
    done
}
