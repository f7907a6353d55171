# Shared by scripts/test-cache-push.sh and scripts/bench-cache-push.sh
# (sourced, not run): prerequisites, builds, ports, and starting ccappd,
# Debian apache2 with mod_ccache, and ccproxy on 127.0.0.1.
#
# The sourcing script sets T (its temp dir) and defines ok/bad/finish.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
APPD="$TARGET/release/ccappd"
PROXY="$TARGET/release/ccproxy"
# shellcheck disable=SC2034 # used by the sourcing scripts
UPDATE="$TARGET/release/ccupdate"
MOD="$ROOT/tools/ccache/apache/.libs/mod_ccache.so"
APPD_PID=""
APACHE_PID=""
PX_PIDS=""

# The Apache set-up the end-to-end scripts share (apache_*).
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"

# Install what is missing (apt-get) and build ccache and mod_ccache.
cp_prereqs() {
    apache_install apache2 apxs=apache2-dev curl /usr/bin/python3=python3 || return 1
    timeout 1200 cargo build --release -q -p ccache || { echo "cargo build -p ccache failed"; return 1; }
    timeout 300 make -s -C "$ROOT/tools/ccache/apache" >"$T/mod-build.log" 2>&1 ||
        { echo "mod_ccache build (apxs) failed:"; cat "$T/mod-build.log"; return 1; }
}

# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
# cp_free_port: a port for one of this script's servers (T must be set).
cp_free_port() { free_port_once "$T/ports.given"; }

# cp_wait_port PORT PID: until something accepts on PORT (at most 10 s) and PID lives.
cp_wait_port() {
    local _
    for _ in $(seq 1 100); do
        if /usr/bin/python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5).close()' "$1" 2>/dev/null; then
            return 0
        fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

cp_stop_pid() { # $1 pid: TERM, wait at most 10 s, then KILL
    apache_stop "$1"
}

cp_cleanup() {
    local p
    for p in $PX_PIDS $APPD_PID $APACHE_PID; do cp_stop_pid "$p"; done
}

# Ports and paths; call once after T is set.
cp_layout() {
    P_RDMA=$(cp_free_port)
    P_VER=$(cp_free_port)
    P_PUSH=$(cp_free_port)
    P_HTTP=$(cp_free_port)
    IPC="$T/ipc.sock"
    mkdir -p "$T/docs" "$T/run" "$T/logs"
    chmod 755 "$T" "$T/docs"
}

# cp_start_appd ARGS...: ccappd with the push listener and the given extra
# flags (policy, rate, ...); sets APPD_PID. It creates the deployment's
# access token $T/token (mode 0600) on its first start; the proxies read it.
cp_start_appd() {
    "$APPD" --docroot "$T/docs" --init-docs --token-file "$T/token" \
        --rdma-listen "127.0.0.1:$P_RDMA" --version-listen "127.0.0.1:$P_VER" \
        --push-listen "127.0.0.1:$P_PUSH" \
        --ipc "$IPC" --ipc-mode 660 --ipc-group www-data --update-log "$T/updates.log" "$@" \
        >>"$T/ccappd.log" 2>&1 &
    APPD_PID=$!
    disown "$APPD_PID" 2>/dev/null # no "Killed" notice for the fault
    cp_wait_port "$P_PUSH" "$APPD_PID"
}

# Apache prefork with mod_ccache serving $T/docs at /docs/.
cp_start_apache() {
    {
        apache_conf_head "$T/run" "$T/logs" alias
        echo "LoadModule ccache_module $MOD"
        apache_prefork 4 2 8 16
        cat <<EOF
Listen 127.0.0.1:$P_HTTP
LogLevel warn
KeepAlive On
EnableSendfile On
DocumentRoot $T/docs
CCacheIPC $IPC
CCacheTimeout 10000
Alias /docs/ $T/docs/
<Directory />
    Require all granted
</Directory>
<Location /docs/>
    CCache On
</Location>
EOF
    } >"$T/apache.conf"
    # apache_start echoes the pid also when Apache did not answer, so
    # that cleanup stops it.
    local rc=0
    APACHE_PID=$(apache_start "$T/apache.conf" "$P_HTTP" "$T/logs/apache-stdout.log") || rc=1
    return "$rc"
}

# cp_start_proxy NAME PORT ARGS...: ccproxy registered for pushes, with
# ccappd's token; sets PX_PID.
cp_start_proxy() {
    local name="$1" port="$2"
    shift 2
    "$PROXY" --listen "127.0.0.1:$port" --backend "127.0.0.1:$P_HTTP" --prefix /docs/ \
        --appd-rdma "127.0.0.1:$P_RDMA" --appd-tcp "127.0.0.1:$P_VER" \
        --push-appd "127.0.0.1:$P_PUSH" --check-timeout-ms 1000 --token-file "$T/token" "$@" \
        >>"$T/ccproxy-$name.log" 2>&1 &
    PX_PID=$!
    PX_PIDS="$PX_PIDS $PX_PID"
    cp_wait_port "$port" "$PX_PID"
}

# cp_stats PORT: the proxy's counters (JSON).
cp_stats() {
    curl -sS --max-time 5 "http://127.0.0.1:$1/_ccproxy/stats"
}

# cp_stat PORT KEY: one counter.
cp_stat() {
    cp_stats "$1" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# cp_registered N: ccappd's log shows at least N registrations (waits 10 s).
cp_registered() {
    local _
    for _ in $(seq 1 100); do
        [ "$(grep -c 'proxy registered for pushes' "$T/ccappd.log")" -ge "$1" ] && return 0
        sleep 0.1
    done
    return 1
}
