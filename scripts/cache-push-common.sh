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

# Install what is missing (apt-get) and build ccache and mod_ccache.
cp_prereqs() {
    local need=()
    command -v apache2 >/dev/null || need+=(apache2)
    command -v apxs >/dev/null || need+=(apache2-dev)
    command -v curl >/dev/null || need+=(curl)
    [ -x /usr/bin/python3 ] || need+=(python3)
    if [ "${#need[@]}" -gt 0 ]; then
        echo "installing ${need[*]}"
        timeout 300 apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    local c
    for c in apache2 apxs curl /usr/bin/python3; do
        command -v "$c" >/dev/null || { echo "prerequisite $c missing (apt-get install failed?)"; return 1; }
    done
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
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null
    timeout 10 tail --pid="$1" -f /dev/null 2>/dev/null || kill -KILL "$1" 2>/dev/null
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
    cat >"$T/apache.conf" <<EOF
ServerRoot /etc/apache2
ServerName 127.0.0.1
Listen 127.0.0.1:$P_HTTP
DefaultRuntimeDir $T/run
PidFile $T/run/httpd.pid
ErrorLog $T/logs/error.log
LogLevel warn
User www-data
Group www-data
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule alias_module /usr/lib/apache2/modules/mod_alias.so
LoadModule ccache_module $MOD
StartServers 4
MinSpareServers 2
MaxSpareServers 8
ServerLimit 16
MaxRequestWorkers 16
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
    # Own session: on shutdown prefork signals its whole process group.
    setsid apache2 -d /etc/apache2 -f "$T/apache.conf" -DFOREGROUND >>"$T/logs/apache-stdout.log" 2>&1 &
    APACHE_PID=$!
    cp_wait_port "$P_HTTP" "$APACHE_PID"
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
