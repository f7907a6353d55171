#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# The strongly coherent cache (issue 13) end to end on 127.0.0.1:
#
#   ccappd (version table, IPC, version thread, update thread at a rate)
#   Debian apache2 (prefork) with mod_ccache (tools/ccache/apache), which
#     serves /docs/<n> (static files) inside the Table 1 read protocol and
#     reports X-CC-Doc-Version; also tools/ccache/cgi/doc.cgi, the same as a
#     CGI; /raw/<n> serves the same files WITHOUT the protocol (control)
#   ccproxy three times on /docs/: --mode none, tcp, rdma; once rdma on the CGI
#   scripts/cache-load.py: many GETs per mode while updates run; fails on
#     any stale response (older than the version committed before the
#     request was sent) and on any body that is not the served version
#   ccupdate: the update server as a program of its own, beside the thread
#   faults: a malformed IPC message, an IPC client of another user, a document outside the version table,
#     ccappd killed mid-run (rdma/tcp proxies must answer 502, never a
#     document; Apache 503) and restarted (they recover); the rdma proxy
#     restarted
#
#   scripts/test-cache.sh                 # about 1-2 minutes
#   KEEP=1 scripts/test-cache.sh          # keep the temp dir (logs, results)
#   CACHE_REQUESTS=5000 CACHE_UPDATE_RATE=50 scripts/test-cache.sh
#   CCACHE_SO=/path/mod_ccache.so APACHE_PRELOAD=... scripts/test-cache.sh
#                                         # another build of the module
#                                         # (scripts/sanitize-apache.sh)
#
# Last line: "N passed, M failed"; exit status non-zero on failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
PASS=0
FAIL=0
T="$(mktemp -d /tmp/cache.XXXXXX)"
chmod 755 "$T"
DOCS=16
REQS="${CACHE_REQUESTS:-20000}"
RATE="${CACHE_UPDATE_RATE:-50}"
APPD_PID=""
APACHE_PID=""
PX_PIDS=""

# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
cleanup() {
    # shellcheck disable=SC2086 # PX_PIDS is a list of pids
    apache_stop $PX_PIDS "$APPD_PID" "$APACHE_PID"
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
# check NAME CMD...: run CMD (bounded by the caller), pass if it exits 0.
check() {
    local name="$1"
    shift
    local log="$T/check-$((PASS + FAIL + 1)).log"
    if "$@" >"$log" 2>&1; then ok "$name"; else bad "$name (output below)"; tail -n 15 "$log" | sed 's/^/     /'; fi
}
finish() {
    echo "$PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

# ---- prerequisites -----------------------------------------------------------

apache_install apache2 apxs=apache2-dev curl /usr/bin/python3=python3 || { bad "prerequisites (the line above names the missing one)"; finish; }

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if ! timeout 1200 cargo build --release -q -p ccache; then bad "cargo build -p ccache"; finish; fi
# CCACHE_SO: test that build of the module instead (scripts/sanitize-apache.sh:
# built with ASan and UBSan, apache2 run with APACHE_PRELOAD).
if [ -n "${CCACHE_SO:-}" ]; then
    MOD="$CCACHE_SO"
    [ -f "$MOD" ] || { bad "CCACHE_SO=$MOD: no such file"; finish; }
elif ! timeout 300 make -s -C tools/ccache/apache >"$T/mod-build.log" 2>&1; then
    bad "mod_ccache build (apxs)"; cat "$T/mod-build.log"; finish
else
    MOD="$ROOT/tools/ccache/apache/.libs/mod_ccache.so"
fi
# mod_ccache's codec against the shared IPC vectors (the Rust side runs them
# in cargo test -p ccache-proto), about 1 s.
check "mod_ccache's IPC codec passes the shared vectors (crates/ccache-proto/vectors/ipc.txt)" \
    timeout 120 bash "$ROOT/scripts/test-cache-vectors.sh"
APPD="$TARGET/release/ccappd"
UPDATE="$TARGET/release/ccupdate"
PROXY="$TARGET/release/ccproxy"
LOAD=(timeout 900 /usr/bin/python3 "$ROOT/scripts/cache-load.py")

# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$T/ports.given"; }
# wait_port PORT PID: until something accepts on PORT (at most 10 s) and PID lives.
wait_port() {
    for _ in $(seq 1 100); do
        if /usr/bin/python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5).close()' "$1" 2>/dev/null; then
            return 0
        fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

P_RDMA=$(free_port)
P_VER=$(free_port)
P_HTTP=$(free_port)
P_NONE=$(free_port)
P_TCP=$(free_port)
P_RD=$(free_port)
P_CGI=$(free_port)
IPC="$T/ipc.sock"
mkdir -p "$T/docs" "$T/cgi-bin" "$T/run" "$T/logs"
cp tools/ccache/cgi/doc.cgi "$T/cgi-bin/doc.cgi"
chmod 755 "$T/cgi-bin/doc.cgi" "$T/docs"

# ccappd creates the deployment's access token $T/token (mode 0600) on its
# first start; the proxies are given the same file.
start_appd() {
    "$APPD" --docs "$DOCS" --docroot "$T/docs" --init-docs --doc-size 4096 --token-file "$T/token" \
        --rdma-listen "127.0.0.1:$P_RDMA" --version-listen "127.0.0.1:$P_VER" \
        --ipc "$IPC" --ipc-mode 660 --ipc-group www-data --update-rate "$RATE" --update-log "$T/updates.log" \
        >>"$T/ccappd.log" 2>&1 &
    APPD_PID=$!
    disown "$APPD_PID" 2>/dev/null # no "Killed" notice for the fault below
    wait_port "$P_VER" "$APPD_PID"
}

{
    apache_conf_head "$T/run" "$T/logs" alias cgi env
    apache_prefork 4 2 8 16
    cat <<EOF
Listen 127.0.0.1:$P_HTTP
LogLevel warn
LoadModule ccache_module $MOD
KeepAlive On
EnableSendfile On
DocumentRoot $T/docs
ScriptAlias /cgi-bin/ $T/cgi-bin/
SetEnv CCAPPD_IPC $IPC
SetEnv CCACHE_DOCROOT $T/docs
CCacheIPC $IPC
CCacheTimeout 10000
Alias /docs/ $T/docs/
Alias /raw/ $T/docs/
<Directory />
    Require all granted
</Directory>
<Location /docs/>
    CCache On
</Location>
EOF
} >"$T/apache.conf"

if start_appd; then ok "ccappd starts ($DOCS documents, $RATE updates/s)"; else
    bad "ccappd did not start"; cat "$T/ccappd.log"; finish; fi

if APACHE_PID=$(apache_start "$T/apache.conf" "$P_HTTP" "$T/logs/apache-stdout.log"); then
    ok "apache2 starts (prefork, mod_ccache, CGI doc.cgi, port $P_HTTP)"
else
    bad "apache2 did not start"; apache_logs "$T/logs/apache-stdout.log" "$T/logs/error.log"; finish
fi

start_proxy() { # $1 mode, $2 port [, $3 prefix] -> sets PX_PID
    "$PROXY" --mode "$1" --listen "127.0.0.1:$2" --backend "127.0.0.1:$P_HTTP" --prefix "${3:-/docs/}" \
        --appd-rdma "127.0.0.1:$P_RDMA" --appd-tcp "127.0.0.1:$P_VER" --token-file "$T/token" \
        --check-timeout-ms 1000 >>"$T/ccproxy-$1.log" 2>&1 &
    PX_PID=$!
    PX_PIDS="$PX_PIDS $PX_PID"
    wait_port "$2" "$PX_PID"
}
for m in none:$P_NONE tcp:$P_TCP rdma:$P_RD; do
    if start_proxy "${m%%:*}" "${m##*:}"; then ok "ccproxy --mode ${m%%:*} starts"; else
        bad "ccproxy --mode ${m%%:*} did not start"; cat "$T/ccproxy-${m%%:*}.log"; finish; fi
done
if start_proxy rdma "$P_CGI" /cgi-bin/doc.cgi/; then ok "ccproxy --mode rdma on the CGI starts"; else
    bad "ccproxy on the CGI did not start"; finish; fi

url() { echo "http://127.0.0.1:$1${2:-/docs/}"; }

# ---- functional checks ----------------------------------------------------------

check "the stale/half-written checker catches made-up bad responses" "${LOAD[@]}" selftest

t_status() { # $1 port, $2 path, $3 expected status
    local code
    code=$(curl -s --max-time 20 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1$2") || return 1
    echo "got $code"
    [ "$code" = "$3" ]
}
t_backend_versioned() { # [$1 path prefix]
    curl -s --max-time 20 -D "$T/h0" -o "$T/b0" "$(url "$P_HTTP" "${1:-/docs/}")3" || return 1
    grep -qi '^X-CC-Doc-Version: [0-9]' "$T/h0" && grep -q '^doc 000003 version ' "$T/b0"
}
check "apache2 + mod_ccache serves a static document inside the IPC read, with X-CC-Doc-Version" t_backend_versioned /docs/
check "apache2 CGI doc.cgi serves a document inside the IPC read, with X-CC-Doc-Version" t_backend_versioned /cgi-bin/doc.cgi/
check "apache2 + mod_ccache: a document outside the version table is 404" t_status "$P_HTTP" /docs/99999 404

# A request for a document that has not changed since the proxy last
# fetched it is a hit. The update thread runs throughout (RATE updates/s
# over DOCS documents: document 15 changes about 3 times a second), so two
# requests in a row may straddle an update of it; the second is then
# rightly a miss, at a newer X-CC-Version. Not a retry until something
# passes: requests go on until two in a row are answered at the same
# version (the condition under test; at most 30 requests, each bounded by
# curl), and that second answer must be a hit (the first one cached that
# version). A miss at an unchanged version fails at once.
t_hit() { # $1 port
    local prev="" v c i
    for i in $(seq 1 30); do
        curl -s --max-time 20 -D "$T/h1" -o /dev/null "$(url "$1")15" || return 1
        v=$(tr -d '\r' <"$T/h1" | sed -n 's/^[Xx]-[Cc][Cc]-[Vv]ersion: *//p')
        c=$(tr -d '\r' <"$T/h1" | sed -n 's/^[Xx]-[Cc][Cc]-[Cc]ache: *//p')
        echo "request $i: X-CC-Version ${v:-none}, X-CC-Cache ${c:-none}"
        [[ $v =~ ^[0-9]+$ ]] || { cat "$T/h1"; return 1; }
        if [ "$v" = "$prev" ]; then
            [ "$c" = hit ] && return 0
            echo "a $c at version $v, unchanged since the request before: the proxy did not cache it"
            cat "$T/h1"
            return 1
        fi
        prev=$v
    done
    echo "no two requests in a row saw the same version in 30 (is the update rate far above $RATE/s?)"
    return 1
}
check "rdma: a repeated request is answered from cache (validated by RDMA Read)" t_hit "$P_RD"
check "tcp: a repeated request is answered from cache (validated by the version thread)" t_hit "$P_TCP"

check "rdma: a document outside the version table is 404 (no Read of a foreign slot)" t_status "$P_RD" /docs/99999 404
check "tcp: a document outside the version table is 404" t_status "$P_TCP" /docs/99999 404
t_post() { # a POST goes to Apache as it is, uncached
    local direct via
    direct=$(curl -s --max-time 20 -o "$T/bp0" -w '%{http_code}' -X POST -d x "$(url "$P_HTTP")1") || return 1
    via=$(curl -s --max-time 20 -D "$T/hp" -o "$T/bp1" -w '%{http_code}' -X POST -d x "$(url "$P_RD")1") || return 1
    echo "apache $direct, ccproxy $via"
    # (the bodies may differ in the version if an update ran in between)
    [ "$direct" = "$via" ] && grep -qi '^X-CC-Cache: bypass' "$T/hp" &&
        grep -q '^doc 000001 version ' "$T/bp0" && grep -q '^doc 000001 version ' "$T/bp1"
}
check "ccproxy forwards a POST uncached (X-CC-Cache: bypass; Apache's own status, the document)" t_post

t_malformed_ipc() {
    /usr/bin/python3 - "$IPC" <<'EOF' || return 1
import socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
s.sendall(b"GET / HTTP/1.1\r\n")
b = s.recv(16)
magic, fmt, kind, doc, value = struct.unpack(">HBBIQ", b)
assert (magic, kind, value) == (0x4343, 15, 3), (magic, kind, value)
assert s.recv(16) == b"", "connection not closed after a malformed message"
EOF
    kill -0 "$APPD_PID" && t_backend_versioned /docs/
}
check "malformed IPC message: ERROR(malformed), connection closed, ccappd keeps serving" t_malformed_ipc

# Another user (nobody, not in www-data) gets nothing from ccappd: the
# socket's mode 660 refuses the connect, and if it did not, SO_PEERCRED
# would (ERROR(not permitted); tools/ccache/tests/ipc_hostile.rs checks
# that path alone). Apache's www-data gets through (the loads below).
t_other_user_refused() {
    command -v setpriv >/dev/null || { echo "setpriv missing (util-linux)"; return 1; }
    timeout 10 setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 - "$IPC" <<'EOF' || return 1
import socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("connect refused by the socket's mode"); sys.exit(0)
s.sendall(struct.pack(">HBBIQ", 0x4343, 1, 1, 0, 0))
b = s.recv(16)
magic, fmt, kind, doc, value = struct.unpack(">HBBIQ", b)
assert (magic, kind, value) == (0x4343, 15, 6), ("served", kind, value)
print("ERROR(not permitted)")
EOF
    kill -0 "$APPD_PID" && t_backend_versioned /docs/
}
check "IPC as user nobody: refused (socket mode 660 group www-data, SO_PEERCRED)" t_other_user_refused

# ccappd's IPC defaults: no --ipc-mode, a socket in a runtime directory
# that does not exist yet (as /run/ccappd on a first start; $T/rt stands in
# for /run). The directory it creates must be 0750 with the group
# --ipc-group names, the socket 0660 with that group, whatever the umask:
# ccappd runs here under umask 077, a hardened service's (mkdir(2) applies
# the umask, so ccappd sets the directory's mode itself). www-data, the
# group, then reaches the socket through the directory.
# And its token default: no --token-file, so it creates
# /var/lib/ccappd/token (0600, in a new directory 0700). It runs in a mount
# namespace of its own with an empty tmpfs on /var/lib, so this host's
# /var/lib is untouched; the file is seen through /proc/PID/root.
t_ipc_defaults() {
    local sock="$T/rt/ccappd/ipc.sock" pid rc=0
    mkdir -p "$T/rt"
    # shellcheck disable=SC2016 # the inner sh expands "$@"
    (umask 077 && exec unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs /var/lib && exec "$@"' sh \
        env -u CCAPPD_IPC_MODE -u CCAPPD_IPC_GROUP -u CCAPPD_TOKEN_FILE -u CCAPPD_INSECURE_NO_TOKEN "$APPD" --docs 1 \
        --rdma-listen "127.0.0.1:$(free_port)" --version-listen "127.0.0.1:$(free_port)" \
        --ipc "$sock" --ipc-group www-data) >"$T/ccappd-defaults.log" 2>&1 &
    pid=$!
    # Ready when it answers a VERSION_REQUEST: it serves the IPC only after
    # setting the socket's mode and group (bind_ipc).
    /usr/bin/python3 - "$sock" <<'EOF' || rc=1
import socket, struct, sys, time
deadline = time.monotonic() + 10
while True:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(sys.argv[1])
        break
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        if time.monotonic() > deadline:
            sys.exit("no IPC socket after 10 s")
        time.sleep(0.05)
s.sendall(struct.pack(">HBBIQ", 0x4343, 1, 8, 0, 0))
magic, fmt, kind, doc, value = struct.unpack(">HBBIQ", s.recv(16))
assert (magic, kind) == (0x4343, 9), ("no VERSION_REPLY", magic, kind)
print("ccappd answers on its IPC socket")
EOF
    if ((rc == 0)); then
        echo "directory: $(stat -c '%a %G' "$T/rt/ccappd"), socket: $(stat -c '%a %G %F' "$sock")"
        [ "$(stat -c '%a %G' "$T/rt/ccappd")" = "750 www-data" ] || rc=1
        [ "$(stat -c '%a %G %F' "$sock")" = "660 www-data socket" ] || rc=1
        local tok="/proc/$pid/root/var/lib/ccappd/token"
        echo "token: $(stat -c '%a' "$(dirname "$tok")") $(stat -c '%a %s' "$tok")"
        [ "$(stat -c '%a' "$(dirname "$tok")")" = 700 ] || rc=1
        [ "$(stat -c '%a' "$tok")" = 600 ] || rc=1
        [ "$(tr -d '\n' <"$tok" | wc -c)" = 64 ] || rc=1
        if grep -q 'insecure' "$T/ccappd-defaults.log"; then rc=1; fi
        timeout 10 setpriv --reuid=www-data --regid=www-data --clear-groups /usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
print("www-data connects")' "$sock" || rc=1
    fi
    apache_stop "$pid"
    ((rc == 0)) || cat "$T/ccappd-defaults.log"
    return "$rc"
}
check "ccappd's defaults (no --ipc-mode, no --token-file, umask 077): new runtime directory 0750 and socket 0660, group www-data; token /var/lib/ccappd/token 0600 in a new directory 0700" t_ipc_defaults

# ---- load with updates: zero stale responses -------------------------------------

t_load() { # $1 mode, $2 port, $3 requests [, $4 path prefix]
    "${LOAD[@]}" run --url "$(url "$2" "${4:-/docs/}")" --docs "$DOCS" --requests "$3" --threads 8 \
        --update-log "$T/updates.log" --out "$T/results-$1.jsonl" | tee -a "$T/summary" |
        sed "s/^/$1: /" | tee "$T/summary-$1"
}
for m in none:$P_NONE tcp:$P_TCP rdma:$P_RD; do
    mode="${m%%:*}"
    check "$mode: $REQS requests under $RATE updates/s, zero stale, every body whole" t_load "$mode" "${m##*:}" "$REQS"
    cat "$T/summary-$mode" 2>/dev/null
done
check "rdma on the CGI: 500 requests, zero stale, every body whole" t_load rdma-cgi "$P_CGI" 500 /cgi-bin/doc.cgi/
cat "$T/summary-rdma-cgi" 2>/dev/null
# Control: the same files without the read protocol (/raw/, direct). Bodies
# that mix two versions show what the protocol prevents (informational).
"${LOAD[@]}" mixed --url "$(url "$P_HTTP" /raw/)" --docs "$DOCS" --requests "$REQS" --threads 8 |
    sed 's/^/control, no read protocol: /' | tee -a "$T/summary"

# ---- fault: ccappd killed mid-run ------------------------------------------------

# Loads on the rdma and tcp proxies; ccappd is killed 1 s into them. Every
# response must be a 200 that is not stale or a 502, both must occur, and
# no request sent after ccappd was dead may get a 200.
midrun() { # $1 mode, $2 port
    "${LOAD[@]}" run --url "$(url "$2")" --docs "$DOCS" --requests 20000 --threads 4 \
        --update-log "$T/updates.log" --min-ok 0 --allow-status 502 --out "$T/midrun-$1.jsonl" \
        >"$T/midrun-$1.json" 2>"$T/midrun-$1.err"
    echo $? >"$T/midrun-$1.rc"
}
midrun rdma "$P_RD" &
MR1=$!
midrun tcp "$P_TCP" &
MR2=$!
sleep 1
kill -KILL "$APPD_PID" 2>/dev/null
timeout 10 tail --pid="$APPD_PID" -f /dev/null 2>/dev/null
KILLED_NS=$(date +%s%N)
APPD_PID=""
timeout 900 tail --pid="$MR1" -f /dev/null
timeout 900 tail --pid="$MR2" -f /dev/null
t_midrun() { # $1 mode
    cat "$T/midrun-$1.json" "$T/midrun-$1.err"
    [ "$(cat "$T/midrun-$1.rc")" = 0 ] || return 1
    /usr/bin/python3 - "$T/midrun-$1.json" "$T/midrun-$1.jsonl" "$KILLED_NS" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["status"]
assert s.get("200") and s.get("502"), f"want both 200s and 502s: {s}"
late = [r for r in map(json.loads, open(sys.argv[2])) if r["status"] == 200 and r["t0"] > int(sys.argv[3])]
assert not late, f"{len(late)} requests sent after ccappd died got 200: {late[:3]}"
print("no 200 for a request sent after the kill")
EOF
}
check "ccappd killed mid-run: rdma proxy answered fresh 200s and 502s, no 200 after the kill, zero stale" t_midrun rdma
sed 's/^/rdma, killed mid-run: /' "$T/midrun-rdma.json"
check "ccappd killed mid-run: tcp proxy answered fresh 200s and 502s, no 200 after the kill, zero stale" t_midrun tcp
sed 's/^/tcp, killed mid-run: /' "$T/midrun-tcp.json"
t_502() { # $1 port
    "${LOAD[@]}" expect --url "$(url "$1")" --docs "$DOCS" --requests 40 --threads 4 --status 502
}
check "ccappd killed: rdma proxy answers 502 for every document, never content" t_502 "$P_RD"
check "ccappd killed: tcp proxy answers 502 for every document, never content" t_502 "$P_TCP"
check "ccappd killed: apache2 + mod_ccache answers 503, never the document" t_status "$P_HTTP" /docs/1 503
for p in $PX_PIDS; do
    kill -0 "$p" 2>/dev/null || bad "ccproxy pid $p died"
done

if start_appd; then ok "ccappd restarts"; else bad "ccappd did not restart"; tail "$T/ccappd.log"; finish; fi
t_recover() { # $1 mode, $2 port
    "${LOAD[@]}" run --url "$(url "$2")" --docs "$DOCS" --requests 300 --threads 4 \
        --update-log "$T/updates.log" | sed "s/^/$1 after restart: /"
}
check "rdma proxy recovers after ccappd returns (zero stale)" t_recover rdma "$P_RD"
check "tcp proxy recovers after ccappd returns (zero stale)" t_recover tcp "$P_TCP"

# A second, separate update server (ccupdate) at 100/s beside ccappd's own
# update thread, during a load on the rdma proxy.
t_ccupdate() {
    timeout 120 "$UPDATE" --ipc "$IPC" --docroot "$T/docs" --docs "$DOCS" --doc-size 4096 \
        --rate 100 --count 200 --log "$T/updates.log" 2>"$T/ccupdate.log" &
    local up=$! rc=0
    "${LOAD[@]}" run --url "$(url "$P_RD")" --docs "$DOCS" --requests 5000 --threads 8 \
        --update-log "$T/updates.log" | sed "s/^/rdma with ccupdate: /" || rc=1
    wait "$up" || { echo "ccupdate failed:"; cat "$T/ccupdate.log"; rc=1; }
    return "$rc"
}
check "ccupdate (separate update server, 200 updates) beside the update thread: zero stale" t_ccupdate

# ---- fault: proxy restart (empty cache, new version connections) ---------------

RD_OLD=$(for p in $PX_PIDS; do echo "$p"; done | sed -n 3p)
apache_stop "$RD_OLD"
if start_proxy rdma "$P_RD"; then ok "ccproxy --mode rdma restarts"; else
    bad "ccproxy --mode rdma did not restart"; tail "$T/ccproxy-rdma.log"; finish; fi
check "restarted rdma proxy: zero stale" t_recover rdma "$P_RD"

echo "updates committed: $(wc -l <"$T/updates.log") log lines"
finish
