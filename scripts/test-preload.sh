#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# The preload shim (libiwarp_preload.so, crates/iwarp-preload) with real,
# unmodified programs on 127.0.0.1, and the rsocket C API
# (libiwarp_rsocket.so, include/iwarp_rsocket.h):
#
#   a) socat -> socat, both preloaded: 64 MiB, SHA-256 checked;
#   b) the fallback matrix on one port: preloaded/plain client x
#      preloaded/plain server, SHA-256 checked, and which ones ran over
#      iWARP (IWARP_PRELOAD_STATS records each decision); a plain server
#      remembered as plain by a preloaded client;
#   c) Python's socket module: echo with blocking and select() servers and
#      clients;
#   d) iperf3 client and server, both directions;
#   e) redis-benchmark and redis-cli against redis-server;
#   f) curl against nginx (sendfile on) and Apache httpd (prefork, when
#      installed), preloaded and plain curl;
#   g) a peer killed mid-stream: the other side's blocked read returns
#      within 1 s (both directions); fork: a child closes an inherited
#      stream and the parent carries on; vfork and posix_spawn children
#      leave the parent's streams alone;
#   h) the C API: tests/c/rsocket/*.c against iwarp_rsocket.h (echo, riomap/riowrite);
#   i) a setuid-root program run by nobody: the shim and the libraries in it
#      ignore every IWARP_* variable (issue 26 item 10); without setuid they obey;
#   j) descriptors closed or replaced during stalled MPA exchanges;
#   k) a thread-per-connection and an event-loop (selectors/epoll) server keep
#      >= 0.9x their rate of new clients while MPA stallers arrive (issue 26 item 1);
#      so does a blocking server in a process that makes no streams, while
#      silent clients arrive;
#   l) TCP_CONGESTION on a stream reaches its TCP connection (ss -ti);
#   m) IWARP_PRELOAD_MAX_STREAMS: 5 MPA clients against a bound of 4.
#
#   scripts/test-preload.sh          # everything (about a minute)
#   KEEP=1 scripts/test-preload.sh   # keep the temp dir (logs, stats)
#   ONLY='^i\)' scripts/test-preload.sh  # only the checks whose name matches
#   PORT_BASE=27400 scripts/test-preload.sh
#   PRELOAD_LIBDIR=DIR scripts/test-preload.sh  # the libraries in DIR, no build
#   K_BASELINE=1 ONLY='no streams' scripts/test-preload.sh  # check k's third
#       shape also measured without the preload (plain Python), for comparison
#
# Missing Debian packages (socat, iperf3, redis-server, redis-tools, nginx,
# curl, python3, gcc) are installed with apt-get. Last line: "N passed, M
# failed"; the exit status is non-zero on failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
PASS=0
FAIL=0
T="$(mktemp -d /tmp/preload.XXXXXX)"
# nginx workers run as nobody: they must read the files here and append to
# the stats files.
chmod 755 "$T"
PIDS=()
PORT=${PORT_BASE:-27400}
HELPER="$ROOT/tests/preload/helper.py"
HELPER_DIR="$ROOT/tests/preload"

cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        timeout 5 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

# wanted NAME: ONLY (an extended regex) is unset or matches NAME.
wanted() { [ -z "${ONLY:-}" ] || grep -qE -- "$ONLY" <<<"$1"; }
ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
# check NAME CMD...: run CMD (bounded inside), pass if it exits 0.
check() {
    local name="$1"
    shift
    wanted "$name" || return 0
    local log="$T/check-$((PASS + FAIL + 1)).log"
    if "$@" >"$log" 2>&1; then
        ok "$name"
        grep '^info:' "$log" | sed 's/^info:/     /'
    else
        bad "$name (output below)"
        tail -n 20 "$log" | sed 's/^/     /'
    fi
}
finish() {
    echo "$PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}
next_port() { PORT=$((PORT + 1)); }

# ---- prerequisites ----------------------------------------------------------
need_pkgs=()
command -v socat >/dev/null || need_pkgs+=(socat)
command -v iperf3 >/dev/null || need_pkgs+=(iperf3)
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v redis-benchmark >/dev/null || need_pkgs+=(redis-tools)
command -v nginx >/dev/null || need_pkgs+=(nginx-light)
command -v curl >/dev/null || need_pkgs+=(curl)
[ -x /usr/bin/python3 ] || need_pkgs+=(python3)
command -v gcc >/dev/null || need_pkgs+=(gcc)
command -v ss >/dev/null || need_pkgs+=(iproute2)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    echo "installing ${need_pkgs[*]}"
    timeout 300 apt-get update -qq >/dev/null
    # policy-rc.d exit 101: the packages must not start system services
    # (the tests start their own on loopback ports).
    POLICY=/usr/sbin/policy-rc.d
    ADDED_POLICY=0
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$POLICY" && chmod +x "$POLICY" && ADDED_POLICY=1
    fi
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    [ "$ADDED_POLICY" = 1 ] && rm -f "$POLICY"
fi
# The system Python (a pyenv shim in front of it starts slowly).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)

if [ -n "${PRELOAD_LIBDIR:-}" ]; then
    # Libraries built elsewhere (a copy of target/release), no build.
    LIBDIR=$(cd "$PRELOAD_LIBDIR" && pwd) || exit 1
else
    echo "building libiwarp_preload.so and libiwarp_rsocket.so (release)"
    if ! timeout 1200 cargo build --release -q -p iwarp-preload -p iwarp-rsocket; then
        bad "cargo build -p iwarp-preload -p iwarp-rsocket"
        finish
    fi
    TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    LIBDIR=$TARGET_DIR/release
fi
LIB=$LIBDIR/libiwarp_preload.so

# pre STATS CMD...: run CMD preloaded, its decisions appended to STATS.
pre() {
    local stats="$1"
    shift
    touch "$stats" && chmod 666 "$stats"
    env LD_PRELOAD="$LIB" IWARP_PRELOAD_STATS="$stats" "$@"
}
# bgpre STATS CMD...: `pre` in the background, as the process itself (so
# that $BGPID is the program's pid, or its `timeout`'s).
bgpre() {
    local stats="$1"
    shift
    touch "$stats" && chmod 666 "$stats"
    (exec env LD_PRELOAD="$LIB" IWARP_PRELOAD_STATS="$stats" "$@") &
    BGPID=$!
    PIDS+=("$BGPID")
}
# bg CMD...: start CMD in the background; its pid is $BGPID.
bg() {
    "$@" &
    BGPID=$!
    PIDS+=("$BGPID")
}
# wait_listen PORT: until something listens there (at most 10 s). Only
# looks (ss), never connects: a connection would use up a one-shot server.
wait_listen() {
    local _i
    for _i in $(seq 100); do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1 after 10 s"
    return 1
}
# wait_pid PID [SECS]: wait for a background process to end (bounded).
wait_pid() {
    timeout "${2:-30}" tail --pid="$1" -f /dev/null
}
stop() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null
    wait_pid "$1" 5 || kill -KILL "$1" 2>/dev/null
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
# has STATS PATTERN: the stats file records PATTERN.
has() {
    if grep -q -- "$2" "$1"; then return 0; fi
    echo "$1 does not record \"$2\"; it has:"
    cat "$1"
    return 1
}

head -c 64M /dev/urandom >"$T/in64"
head -c 4M /dev/urandom >"$T/in4"

# ---- a) socat --------------------------------------------------------------
t_socat() {
    next_port
    local s c t0 t1
    bgpre "$T/a-srv.stats" timeout 60 socat -u "TCP-LISTEN:$PORT,bind=127.0.0.1,reuseaddr" \
        "CREATE:$T/out64"
    s=$BGPID
    wait_listen "$PORT" || return 1
    t0=$(date +%s%N)
    pre "$T/a-cli.stats" timeout 60 socat -u "OPEN:$T/in64" "TCP:127.0.0.1:$PORT" || return 1
    wait_pid "$s" 60 || return 1
    t1=$(date +%s%N)
    c=$(sha "$T/out64")
    [ "$c" = "$(sha "$T/in64")" ] || { echo "SHA-256 differs: $c"; return 1; }
    has "$T/a-cli.stats" "connect iwarp" && has "$T/a-srv.stats" "accept iwarp" || return 1
    echo "info: 64 MiB in $(((t1 - t0) / 1000000)) ms (process start included), SHA-256 ${c:0:16}…"
}
check "a) socat -> socat, both preloaded, 64 MiB over iWARP, SHA-256" t_socat
t_socat6() {
    next_port
    local s
    rm -f "$T/a6-srv.stats" "$T/a6-cli.stats" "$T/out6"
    bgpre "$T/a6-srv.stats" timeout 60 socat -u "TCP6-LISTEN:$PORT,bind=[::1],reuseaddr" \
        "CREATE:$T/out6"
    s=$BGPID
    wait_listen "$PORT" || return 1
    pre "$T/a6-cli.stats" timeout 60 socat -u "OPEN:$T/in4" "TCP6:[::1]:$PORT" || return 1
    wait_pid "$s" 60 || return 1
    [ "$(sha "$T/out6")" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs"; return 1; }
    has "$T/a6-cli.stats" "connect iwarp \[::1\]" && has "$T/a6-srv.stats" "accept iwarp \[::1\]"
}
if ip -6 addr show dev lo 2>/dev/null | grep -q '::1/128'; then
    check "a) socat -> socat over IPv6 ([::1]), 4 MiB, SHA-256" t_socat6
else
    echo "skip - a) IPv6: no ::1 on lo"
fi

# ---- b) the fallback matrix ----------------------------------------------------
MPORT=0
MSRV=""
start_matrix_server() { # pre|plain
    [ -n "$MSRV" ] && stop "$MSRV"
    next_port
    MPORT=$PORT
    rm -f "$T/b-srv.stats"
    if [ "$1" = pre ]; then
        bgpre "$T/b-srv.stats" timeout 120 "$PY" "$HELPER" serve-file "$MPORT" "$T/in4"
    else
        touch "$T/b-srv.stats"
        bg timeout 120 "$PY" "$HELPER" serve-file "$MPORT" "$T/in4"
    fi
    MSRV=$BGPID
    wait_listen "$MPORT"
}
# t_matrix SRV CLI: one download from the server started last.
t_matrix() {
    local srv=$1 cli=$2 out="$T/b-out" before
    rm -f "$out" "$T/b-cli.stats"
    before=$(wc -l <"$T/b-srv.stats")
    if [ "$cli" = pre ]; then
        pre "$T/b-cli.stats" timeout 20 socat -u "TCP:127.0.0.1:$MPORT" "CREATE:$out" || return 1
    else
        timeout 20 socat -u "TCP:127.0.0.1:$MPORT" "CREATE:$out" || return 1
    fi
    [ "$(sha "$out")" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs"; return 1; }
    sleep 0.2
    local new
    new=$(tail -n +"$((before + 1))" "$T/b-srv.stats")
    echo "server recorded: ${new:-nothing}"
    case "$srv/$cli" in
        pre/pre)
            has "$T/b-cli.stats" "connect iwarp" || return 1
            grep -q "accept iwarp" <<<"$new" || { echo "server did not accept over iWARP"; return 1; }
            echo "info: ran over iWARP" ;;
        pre/plain)
            grep -q "accept plain" <<<"$new" || { echo "server did not hand over plain TCP"; return 1; }
            echo "info: plain TCP (the preloaded server saw no MPA Request)" ;;
        plain/pre)
            has "$T/b-cli.stats" "connect plain" || return 1
            echo "info: plain TCP after the MPA attempt: $(cut -d' ' -f5- "$T/b-cli.stats" | cut -c1-80)" ;;
        plain/plain) echo "info: plain TCP" ;;
    esac
}
check "b) matrix: start a preloaded server" start_matrix_server pre
check "b) matrix: preloaded client -> preloaded server (same port)" t_matrix pre pre
check "b) matrix: plain client -> preloaded server (same port)" t_matrix pre plain
check "b) matrix: start a plain server" start_matrix_server plain
check "b) matrix: preloaded client -> plain server (same port)" t_matrix plain pre
check "b) matrix: plain client -> plain server (same port)" t_matrix plain plain
t_remembered() {
    rm -f "$T/b-fetch.stats"
    local out
    out=$(pre "$T/b-fetch.stats" timeout 20 "$PY" "$HELPER" fetch "$MPORT" 2) || return 1
    echo "$out"
    [ "$(sort -u <<<"$out")" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs"; return 1; }
    has "$T/b-fetch.stats" "no MPA answer" && has "$T/b-fetch.stats" "remembered" || return 1
    echo "info: the second connect to the plain server went plain at once (remembered)"
}
check "b) matrix: a plain peer is remembered (second connect plain at once)" t_remembered
stop "$MSRV"
MSRV=""

# t_config: IWARP_PRELOAD_PORTS leaves other ports alone; the same key in
# an IWARP_PRELOAD_CONFIG file takes the port over.
t_config() {
    local s out
    next_port
    rm -f "$T/b-cfg-srv.stats" "$T/b-cfg-cli.stats"
    printf '# test config\nports = %s\npeek_ms = 300\n' "$PORT" >"$T/preload.conf"
    chmod 644 "$T/preload.conf"
    bgpre "$T/b-cfg-srv.stats" env IWARP_PRELOAD_CONFIG="$T/preload.conf" \
        timeout 60 "$PY" "$HELPER" serve-file "$PORT" "$T/in4"
    s=$BGPID
    wait_listen "$PORT" || return 1
    out=$(pre "$T/b-cfg-cli.stats" env IWARP_PRELOAD_PORTS=1 timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (PORTS=1)"; return 1; }
    [ ! -s "$T/b-cfg-cli.stats" ] || { echo "a client limited to port 1 took port $PORT over:"; cat "$T/b-cfg-cli.stats"; return 1; }
    has "$T/b-cfg-srv.stats" "accept plain" || return 1
    out=$(pre "$T/b-cfg-cli.stats" env IWARP_PRELOAD_CONFIG="$T/preload.conf" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (config file)"; return 1; }
    stop "$s"
    has "$T/b-cfg-cli.stats" "connect iwarp" && has "$T/b-cfg-srv.stats" "accept iwarp" || return 1
    echo "info: IWARP_PRELOAD_PORTS=1 left port $PORT plain; ports = $PORT in the config file took it over"
}
check "b) config: IWARP_PRELOAD_PORTS filter and IWARP_PRELOAD_CONFIG file" t_config

# ---- c) Python's socket module ----------------------------------------------------
t_python() { # server mode, client mode
    next_port
    local s
    rm -f "$T/c-srv.stats" "$T/c-cli.stats"
    bgpre "$T/c-srv.stats" timeout 60 "$PY" "$HELPER" echo-server "$PORT" "$1"
    s=$BGPID
    wait_listen "$PORT" || return 1
    pre "$T/c-cli.stats" timeout 30 "$PY" "$HELPER" echo-client "$PORT" "$2" 4000000 || return 1
    stop "$s"
    has "$T/c-cli.stats" "connect iwarp" && has "$T/c-srv.stats" "accept iwarp"
}
check "c) Python: blocking client -> blocking (threads) server" t_python blocking blocking
check "c) Python: select() client -> blocking server" t_python blocking select
check "c) Python: blocking client -> select() server" t_python select blocking
check "c) Python: select() client -> select() server" t_python select select
check "c) Python: epoll then blocking reads (mixed) -> select() server" t_python select mixed
check "c) Python: dup()/dup2() copies, originals closed -> blocking server" t_python blocking dup

# ---- d) iperf3 -------------------------------------------------------------------------
IPERF_TCP=""
t_iperf() { # pre|plain, extra client args
    local mode=$1 s
    shift
    next_port
    rm -f "$T/d-srv.stats" "$T/d-cli.stats"
    if [ "$mode" = pre ]; then
        bgpre "$T/d-srv.stats" timeout 60 iperf3 -s -B 127.0.0.1 -p "$PORT" -1
    else
        bg timeout 60 iperf3 -s -B 127.0.0.1 -p "$PORT" -1
    fi
    s=$BGPID
    wait_listen "$PORT" || return 1
    if [ "$mode" = pre ]; then
        pre "$T/d-cli.stats" timeout 60 iperf3 -c 127.0.0.1 -p "$PORT" -t 3 -J "$@" >"$T/d.json" || return 1
    else
        timeout 60 iperf3 -c 127.0.0.1 -p "$PORT" -t 3 -J "$@" >"$T/d.json" || return 1
    fi
    wait_pid "$s" 20 || return 1
    local bps
    bps=$("$PY" -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]))' "$T/d.json") || return 1
    [ "$bps" -gt 0 ] || { echo "zero throughput"; return 1; }
    if [ "$mode" = pre ]; then
        has "$T/d-cli.stats" "connect iwarp" && has "$T/d-srv.stats" "accept iwarp" || return 1
        echo "info: iperf3 ${*:-client sends} over iWARP: $((bps / 1000000)) Mbit/s${IPERF_TCP:+ (kernel TCP, same run: $IPERF_TCP Mbit/s)}"
    else
        IPERF_TCP=$((bps / 1000000))
    fi
}
if wanted "d) iperf3"; then t_iperf plain >"$T/d-baseline.log" 2>&1 || IPERF_TCP=""; fi
check "d) iperf3 -c -> iperf3 -s, both preloaded, 3 s" t_iperf pre
check "d) iperf3 -c -R (server sends), both preloaded, 3 s" t_iperf pre -R

# ---- e) redis ------------------------------------------------------------------------------
t_redis() {
    next_port
    local s v
    rm -f "$T/e-srv.stats" "$T/e-cli.stats"
    bgpre "$T/e-srv.stats" timeout 120 redis-server --port "$PORT" --bind 127.0.0.1 --save '' \
        --appendonly no --daemonize no --dir "$T"
    s=$BGPID
    wait_listen "$PORT" || return 1
    pre "$T/e-cli.stats" timeout 60 redis-benchmark -h 127.0.0.1 -p "$PORT" -n 2000 -c 4 \
        -t set,get,incr,lpush -q >"$T/e-bench.txt" || return 1
    pre "$T/e-cli.stats" timeout 10 redis-cli -h 127.0.0.1 -p "$PORT" set k preload-ok || return 1
    v=$(pre "$T/e-cli.stats" timeout 10 redis-cli -h 127.0.0.1 -p "$PORT" get k) || return 1
    stop "$s"
    [ "$v" = preload-ok ] || { echo "GET returned '$v'"; return 1; }
    has "$T/e-cli.stats" "connect iwarp" && has "$T/e-srv.stats" "accept iwarp" || return 1
    echo "info: $(tr '\r' '\n' <"$T/e-bench.txt" | grep 'requests per second' | cut -d, -f1 | tr '\n' ';')"
}
check "e) redis-benchmark and redis-cli -> redis-server, all preloaded" t_redis

# ---- f) nginx and curl -------------------------------------------------------------------------
t_nginx() {
    next_port
    local s n="$T/nginx"
    mkdir -p "$n/www" "$n/logs" "$n/tmp"
    chmod 755 "$n" "$n/www"
    cp "$T/in64" "$n/www/f.bin"
    chmod 644 "$n/www/f.bin"
    cat >"$n/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
error_log $n/logs/error.log info;
pid $n/nginx.pid;
events { worker_connections 64; }
http {
    access_log $n/logs/access.log;
    client_body_temp_path $n/tmp; proxy_temp_path $n/tmp; fastcgi_temp_path $n/tmp;
    uwsgi_temp_path $n/tmp; scgi_temp_path $n/tmp;
    sendfile on;
    server { listen 127.0.0.1:$PORT; root $n/www; }
}
EOF
    rm -f "$T/f-srv.stats" "$T/f-cli.stats"
    bgpre "$T/f-srv.stats" timeout 120 nginx -p "$n" -c "$n/nginx.conf" -e "$n/logs/error.log"
    s=$BGPID
    wait_listen "$PORT" || return 1
    pre "$T/f-cli.stats" timeout 60 curl -sS -o "$T/f-got" "http://127.0.0.1:$PORT/f.bin" || return 1
    [ "$(sha "$T/f-got")" = "$(sha "$T/in64")" ] || { echo "preloaded curl: SHA-256 differs"; return 1; }
    timeout 60 curl -sS -o "$T/f-got2" "http://127.0.0.1:$PORT/f.bin" || return 1
    [ "$(sha "$T/f-got2")" = "$(sha "$T/in64")" ] || { echo "plain curl: SHA-256 differs"; return 1; }
    stop "$s"
    has "$T/f-cli.stats" "connect iwarp" && has "$T/f-srv.stats" "accept iwarp" &&
        has "$T/f-srv.stats" "accept plain" || return 1
    echo "info: 64 MiB body over iWARP (preloaded curl) and over TCP (plain curl), same port"
}
check "f) curl -> nginx (sendfile), preloaded and plain curl, 64 MiB, SHA-256" t_nginx

# Apache prefork: the children accept (each makes its own streams).
t_apache() {
    next_port
    local s a="$T/apache" i
    mkdir -p "$a/www" "$a/run"
    chmod 755 "$a" "$a/www" "$a/run"
    cp "$T/in4" "$a/www/f.bin"
    chmod 644 "$a/www/f.bin"
    cat >"$a/httpd.conf" <<EOF
ServerRoot /etc/apache2
ServerName 127.0.0.1
Listen 127.0.0.1:$PORT
DefaultRuntimeDir $a/run
PidFile $a/run/pid
ErrorLog $a/error.log
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
User www-data
Group www-data
StartServers 2
DocumentRoot $a/www
<Directory $a/www>
    Require all granted
</Directory>
EnableSendfile On
EOF
    rm -f "$T/f-ap-srv.stats" "$T/f-ap-cli.stats"
    bgpre "$T/f-ap-srv.stats" timeout 120 apache2 -d /etc/apache2 -f "$a/httpd.conf" -DFOREGROUND
    s=$BGPID
    wait_listen "$PORT" || return 1
    for i in 1 2 3 4; do
        pre "$T/f-ap-cli.stats" timeout 20 curl -sS -o "$T/f-ap-got" "http://127.0.0.1:$PORT/f.bin" || return 1
        [ "$(sha "$T/f-ap-got")" = "$(sha "$T/in4")" ] || { echo "request $i: SHA-256 differs"; return 1; }
    done
    timeout 20 curl -sS -o "$T/f-ap-got" "http://127.0.0.1:$PORT/f.bin" || return 1
    [ "$(sha "$T/f-ap-got")" = "$(sha "$T/in4")" ] || { echo "plain curl: SHA-256 differs"; return 1; }
    stop "$s"
    [ "$(grep -c "accept iwarp" "$T/f-ap-srv.stats")" = 4 ] || { echo "not 4 iWARP accepts:"; cat "$T/f-ap-srv.stats"; return 1; }
    has "$T/f-ap-srv.stats" "accept plain" || return 1
    echo "info: 4 requests over iWARP and 1 plain, served by prefork children"
}
if [ -x /usr/sbin/apache2 ] && [ -e /usr/lib/apache2/modules/mod_mpm_prefork.so ]; then
    check "f) curl -> Apache httpd (prefork, sendfile), preloaded and plain curl" t_apache
else
    echo "skip - f) Apache httpd: not installed (scripts/test.sh installs it)"
fi

# ---- g) faults and fork ----------------------------------------------------------------------------
# t_kill WHO [write]: WHO (client|server) is killed while the other side
# is blocked in recv (or, with `write`, the client in send to a server that
# does not read); that call must return within 1 s.
t_kill() {
    next_port
    local victim=$1 how=${2:-read} s c blocked_out killed ret
    rm -f "$T/g-srv.out" "$T/g-cli.out"
    if [ "$victim" = client ]; then
        bgpre "$T/g.stats" timeout 30 "$PY" "$HELPER" hold-server "$PORT" read >"$T/g-srv.out"
        s=$BGPID
        wait_listen "$PORT" || return 1
        # Not under `timeout`: the kill must reach Python itself.
        bgpre "$T/g.stats" "$PY" "$HELPER" hold-client "$PORT" sleep >"$T/g-cli.out"
        c=$BGPID
        blocked_out="$T/g-srv.out"
        killed=$c
    else
        bgpre "$T/g.stats" "$PY" "$HELPER" hold-server "$PORT" sleep >"$T/g-srv.out"
        s=$BGPID
        wait_listen "$PORT" || return 1
        bgpre "$T/g.stats" timeout 30 "$PY" "$HELPER" hold-client "$PORT" "$how" >"$T/g-cli.out"
        c=$BGPID
        blocked_out="$T/g-cli.out"
        killed=$s
    fi
    local _i
    for _i in $(seq 100); do
        grep -q ready "$T/g-srv.out" && grep -q ready "$T/g-cli.out" && break
        sleep 0.1
    done
    sleep 0.5 # the survivor is in recv by now
    local t0
    t0=$(date +%s.%N)
    kill -KILL "$killed"
    wait_pid "$s" 10
    wait_pid "$c" 10
    ret=$(sed -n 's/^returned \([0-9.]*\) .*/\1/p' "$blocked_out")
    [ -n "$ret" ] || { echo "the blocked recv did not return"; cat "$blocked_out"; return 1; }
    local ms
    ms=$("$PY" -c "print(int((max($ret - $t0, 0)) * 1000))")
    echo "info: $how returned $((ms)) ms after the kill ($(sed -n 's/^returned [0-9.]* //p' "$blocked_out"))"
    [ "$ms" -le 1000 ] || { echo "too slow: $ms ms"; return 1; }
    has "$T/g.stats" "connect iwarp"
}
check "g) client killed: the server's blocked recv returns within 1 s" t_kill client
check "g) server killed: the client's blocked recv returns within 1 s" t_kill server
check "g) server killed: the client's blocked send returns within 1 s" t_kill server write
t_fork() {
    next_port
    local s
    rm -f "$T/g-fork.stats"
    bgpre "$T/g-fork.stats" timeout 30 "$PY" "$HELPER" fork-echo "$PORT"
    s=$BGPID
    wait_listen "$PORT" || return 1
    pre "$T/g-fork.stats" timeout 30 "$PY" "$HELPER" echo-client "$PORT" blocking 1000000 || return 1
    wait_pid "$s" 10 && has "$T/g-fork.stats" "accept iwarp"
}
# close with a live peer that does not read: bounded (the linger time,
# then the wait for the peer's end of stream), never a hang.
t_close_stuck() {
    next_port
    local s out secs
    rm -f "$T/g-cs.stats"
    bgpre "$T/g-cs.stats" timeout 30 "$PY" "$HELPER" hold-server "$PORT" sleep >/dev/null
    s=$BGPID
    wait_listen "$PORT" || return 1
    out=$(pre "$T/g-cs.stats" timeout 20 "$PY" "$HELPER" hold-client "$PORT" close) || return 1
    stop "$s"
    echo "$out"
    secs=$(sed -n 's/^closed in \([0-9.]*\) s/\1/p' <<<"$out")
    [ -n "$secs" ] || return 1
    "$PY" -c "import sys; sys.exit(0 if float('$secs') <= 3.0 else 1)" || { echo "close took $secs s"; return 1; }
    has "$T/g-cs.stats" "connect iwarp" || return 1
    echo "info: close with unsent data and a peer that does not read returned in $secs s"
}
check "g) close with a live peer that does not read returns (bounded)" t_close_stuck
# A signal interrupts a blocked recv (EINTR, as on TCP): Python's Ctrl-C.
t_sigint() {
    next_port
    local s c t0 t1
    rm -f "$T/g-si.stats" "$T/g-si.out"
    bgpre "$T/g-si.stats" timeout 30 "$PY" "$HELPER" hold-server "$PORT" sleep >/dev/null
    s=$BGPID
    wait_listen "$PORT" || return 1
    bgpre "$T/g-si.stats" "$PY" "$HELPER" hold-client "$PORT" read >"$T/g-si.out" 2>&1
    c=$BGPID
    for _i in $(seq 100); do grep -q ready "$T/g-si.out" && break; sleep 0.1; done
    sleep 0.5
    t0=$(date +%s%N)
    kill -INT "$c"
    wait_pid "$c" 10 || { echo "SIGINT did not end the blocked recv"; kill -KILL "$c"; return 1; }
    t1=$(date +%s%N)
    stop "$s"
    grep -q KeyboardInterrupt "$T/g-si.out" || { cat "$T/g-si.out"; return 1; }
    has "$T/g-si.stats" "connect iwarp" || return 1
    echo "info: KeyboardInterrupt; the process ended $(((t1 - t0) / 1000000)) ms after SIGINT (its exit closes the stream: bounded linger)"
}
check "g) SIGINT interrupts a blocked recv (Python KeyboardInterrupt)" t_sigint
check "g) fork: the child closes an inherited stream, the parent echoes on" t_fork
# A child forked after its parent made a stream makes no new ones: an
# iWARP client it accepts is closed, and falls back to plain TCP.
t_fork_child() {
    next_port
    local s out
    rm -f "$T/g-fs-srv.stats" "$T/g-fs-cli.stats"
    bgpre "$T/g-fs-srv.stats" timeout 30 "$PY" "$HELPER" fork-serve "$PORT" "$T/in4"
    s=$BGPID
    wait_listen "$PORT" || return 1
    out=$(pre "$T/g-fs-cli.stats" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (parent)"; return 1; }
    out=$(pre "$T/g-fs-cli.stats" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (child)"; return 1; }
    wait_pid "$s" 10 || return 1
    has "$T/g-fs-cli.stats" "connect iwarp" && has "$T/g-fs-cli.stats" "connect plain" &&
        has "$T/g-fs-srv.stats" "accept refused" && has "$T/g-fs-srv.stats" "accept plain" || return 1
    echo "info: parent served over iWARP; the child's client fell back to plain TCP"
}
check "g) fork: a child of a parent with streams serves its client over plain TCP" t_fork_child
# The same child, deterministically: its client's MPA Request arrives
# 100 ms after the TCP handshake (a loaded client; this was the race that
# made the check above fail 1 run in 3). A process that makes no streams
# must decide at accept, so the MPA client is closed before the program
# sees it and the program's one accept is the client's plain fallback;
# handed over undecided, the child would write the file into the MPA
# connection and never serve the fallback.
t_fork_child_late() {
    next_port
    local s out
    rm -f "$T/g-fl-srv.stats" "$T/g-fl-cli.stats"
    bgpre "$T/g-fl-srv.stats" timeout 30 "$PY" "$HELPER" fork-serve "$PORT" "$T/in4"
    s=$BGPID
    wait_listen "$PORT" || return 1
    out=$(pre "$T/g-fl-cli.stats" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (parent)"; return 1; }
    # A raw MPA client (RFC 5044 §7.1 Request header, no private data),
    # then its fallback: a plain connection that reads the file.
    out=$(timeout 20 "$PY" - "$PORT" <<'PYEOF'
import hashlib, socket, sys, time
port = int(sys.argv[1])
c = socket.create_connection(("127.0.0.1", port), timeout=10)
time.sleep(0.1)
c.sendall(b"MPA ID Req Frame" + bytes([0x40, 0x01, 0, 0]))
got = b""
try:
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
except OSError:
    pass
if got:
    sys.exit(f"the MPA client got {len(got)} bytes of plain data instead of a close")
c = socket.create_connection(("127.0.0.1", port), timeout=10)
h = hashlib.sha256()
while True:
    b = c.recv(65536)
    if not b:
        break
    h.update(b)
print(h.hexdigest())
PYEOF
    ) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (child): $out"; return 1; }
    wait_pid "$s" 10 || return 1
    has "$T/g-fl-srv.stats" "accept refused" && has "$T/g-fl-srv.stats" "accept plain" || return 1
    echo "info: a late MPA Request (100 ms after the handshake) was refused at the child's accept; its plain fallback was served"
}
check "g) fork: a child of a parent with streams refuses a late MPA client at accept, serves its fallback" t_fork_child_late
# socat_echo TAG SERVICE: a socat that accepts in the parent and serves
# each connection in a forked child with SERVICE (socat's second
# address); 4 preloaded clients echo 4 MiB each through it. Passes when
# every echo is SHA-256 equal and every client went over iWARP.
socat_echo() {
    local tag="$1" service="$2" s i out
    next_port
    rm -f "$T/g-$tag-srv.stats" "$T/g-$tag-cli.stats" "$T/g-$tag-srv.err"
    # -t 30: wait for the echo after our EOF.
    bgpre "$T/g-$tag-srv.stats" timeout 90 socat -t 30 "TCP-LISTEN:$PORT,bind=127.0.0.1,reuseaddr,fork" "$service" 2>"$T/g-$tag-srv.err"
    s=$BGPID
    wait_listen "$PORT" || return 1
    for i in 1 2 3 4; do
        out=$(pre "$T/g-$tag-cli.stats" timeout 30 socat -t 30 - "TCP:127.0.0.1:$PORT" <"$T/in4" | sha256sum | cut -d' ' -f1)
        [ "$out" = "$(sha "$T/in4")" ] || { echo "echo $i: SHA-256 differs"; cat "$T/g-$tag-srv.err" "$T/g-$tag-cli.stats" "$T/g-$tag-srv.stats"; return 1; }
    done
    stop "$s"
    [ "$(grep -c ' connect iwarp ' "$T/g-$tag-cli.stats")" = 4 ] || { echo "client stats:"; cat "$T/g-$tag-cli.stats"; return 1; }
    # The server side records "accept iwarp" where it decides (the
    # accepting parent when the Request was there at accept, else the
    # process that first looks at it): at least one per client process is
    # not required, but no refusal is allowed (below).
    grep -q ' accept iwarp ' "$T/g-$tag-srv.stats" || { echo "server stats:"; cat "$T/g-$tag-srv.stats"; return 1; }
    if grep -q "connect plain" "$T/g-$tag-cli.stats" || grep -q refused "$T/g-$tag-srv.stats"; then
        echo "a client fell back:"; cat "$T/g-$tag-cli.stats" "$T/g-$tag-srv.stats"; return 1
    fi
    ! grep -q "inherited it through fork" "$T/g-$tag-srv.err" || { echo "a child used an inherited stream:"; cat "$T/g-$tag-srv.err"; return 1; }
}
# A server that accepts in the parent and serves in a forked child
# (socat's fork option): the accept waits for its first use, so the
# stream is made in the child, and every client is served over iWARP.
# EXEC:cat, not PIPE: socat's PIPE echo loses bytes of a 4 MiB echo even
# without the shim.
t_socat_fork() {
    socat_echo sf EXEC:cat || return 1
    echo "info: 4 of 4 clients served over iWARP by socat's forked children, 4 MiB echoes SHA-256 equal"
}
check "g) fork: socat fork (accept in the parent, serve in a child) serves every client over iWARP" t_socat_fork
# inetd style: the parent accepts, a child puts the connection on its
# standard input and output and execs the service (socat's nofork). The
# copies made by dup2 wait for their first use like the accept, and the
# program started by exec finds the MPA Request unread and makes the
# stream itself (with both descriptors one stream).
t_socat_exec() {
    socat_echo se EXEC:cat,nofork || return 1
    echo "info: 4 of 4 clients served over iWARP by cat exec'd with the connection as stdin and stdout, 4 MiB echoes SHA-256 equal"
}
check "g) exec: inetd style (socat fork + EXEC:cat,nofork) serves every client over iWARP" t_socat_exec
# A child that reads a stream its parent made before the fork: the read
# fails (EOPNOTSUPP, one line on stderr says why), the parent learns it
# through the shared page and sends its next MPA client to plain TCP.
t_fork_inherit() {
    next_port
    local s out
    rm -f "$T/g-fi-srv.stats" "$T/g-fi-cli.stats" "$T/g-fi-srv.err"
    bgpre "$T/g-fi-srv.stats" timeout 30 "$PY" "$HELPER" fork-inherit "$PORT" "$T/in4" 2>"$T/g-fi-srv.err"
    s=$BGPID
    wait_listen "$PORT" || return 1
    out=$(pre "$T/g-fi-cli.stats" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (first client)"; cat "$T/g-fi-srv.err"; return 1; }
    out=$(pre "$T/g-fi-cli.stats" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs (second client)"; cat "$T/g-fi-srv.err"; return 1; }
    wait_pid "$s" 10 || { cat "$T/g-fi-srv.err"; return 1; }
    has "$T/g-fi-cli.stats" "connect iwarp" && has "$T/g-fi-cli.stats" "connect plain" &&
        has "$T/g-fi-srv.stats" "serves its connections in forked children" || return 1
    grep -q "inherited it through fork" "$T/g-fi-srv.err" || { echo "no warning from the child:"; cat "$T/g-fi-srv.err"; return 1; }
    echo "info: the child's read failed with EOPNOTSUPP and said why; the parent served its stream, then sent the next client to plain TCP"
}
check "g) fork: a child reading its parent's stream fails clearly, and the parent falls back for later clients" t_fork_inherit
# A server that leaves an accepted connection alone for 2 s: the shim makes
# it a stream after IWARP_PRELOAD_SETTLE_MS (300 ms), so the client gets its
# MPA Reply well within its 1 s connect timeout and stays on iWARP.
t_slow_accept() {
    next_port
    local s out
    rm -f "$T/g-sa-srv.stats" "$T/g-sa-cli.stats"
    bgpre "$T/g-sa-srv.stats" timeout 30 "$PY" "$HELPER" slow-serve "$PORT" "$T/in4" 2
    s=$BGPID
    wait_listen "$PORT" || return 1
    out=$(pre "$T/g-sa-cli.stats" timeout 20 "$PY" "$HELPER" fetch "$PORT" 1) || return 1
    [ "$out" = "$(sha "$T/in4")" ] || { echo "SHA-256 differs"; return 1; }
    wait_pid "$s" 10 || return 1
    has "$T/g-sa-cli.stats" "connect iwarp" && has "$T/g-sa-srv.stats" "accept iwarp" || return 1
    if grep -q "connect plain" "$T/g-sa-cli.stats"; then echo "the client fell back:"; cat "$T/g-sa-cli.stats"; return 1; fi
    echo "info: accepted connection untouched for 2 s: made a stream by the settle timer, the client stayed on iWARP"
}
check "g) an accepted connection left alone for 2 s still becomes iWARP (settle timer)" t_slow_accept
# vfork: a child made by vfork (or posix_spawn, CLONE_VM | CLONE_VFORK)
# runs in its parent's memory until exec, so what it does through the
# shim must not touch the parent's streams, deferred accepts or settle
# claims (tests/preload/vfork_exec.c says what the children do). The
# server holds a stream (A), a deferred accept (B) and 4 stalled MPA
# exchanges while three children close, close_range, dup2 and exit();
# afterwards its 0-2 are still its files, A and B echo SHA-256 equal over
# iWARP, and the stalled exchanges end. About 3 s.
t_vfork() {
    next_port
    local s a b st _i
    rm -f "$T/g-vf-srv.stats" "$T/g-vf-cli.stats" "$T/g-vf-srv.out"
    gcc -O1 -Wall -Wextra -Werror "$HELPER_DIR/vfork_exec.c" -o "$T/vfork_exec" || return 1
    bgpre "$T/g-vf-srv.stats" env IWARP_PRELOAD_SETTLE_MS=2000 IWARP_PRELOAD_CONNECT_MS=1500 \
        timeout 30 "$T/vfork_exec" "$PORT" 4 </dev/null >"$T/g-vf-srv.out" 2>&1
    s=$BGPID
    wait_listen "$PORT" || return 1
    bgpre "$T/g-vf-cli.stats" env IWARP_PRELOAD_CONNECT_MS=5000 \
        timeout 30 "$PY" "$HELPER" echo-client "$PORT" blocking 262144 >"$T/g-vf-a.out" 2>&1
    a=$BGPID
    for _i in $(seq 100); do grep -q '^stream A' "$T/g-vf-srv.out" && break; sleep 0.1; done
    bgpre "$T/g-vf-cli.stats" env IWARP_PRELOAD_CONNECT_MS=5000 \
        timeout 30 "$PY" "$HELPER" echo-client "$PORT" blocking 262144 >"$T/g-vf-b.out" 2>&1
    b=$BGPID
    for _i in $(seq 100); do grep -q '^accepted B' "$T/g-vf-srv.out" && break; sleep 0.1; done
    bg timeout 30 "$PY" "$HELPER" stall "$PORT" 4 4 >/dev/null
    wait "$s"
    st=$?
    cat "$T/g-vf-srv.out"
    wait "$a" || { echo "client A:"; cat "$T/g-vf-a.out"; st=1; }
    wait "$b" || { echo "client B:"; cat "$T/g-vf-b.out"; st=1; }
    [ "$st" = 0 ] || return 1
    [ "$(grep -c 'connect iwarp' "$T/g-vf-cli.stats")" = 2 ] || { echo "not 2 iWARP clients:"; cat "$T/g-vf-cli.stats"; return 1; }
    echo "info: 2 vfork children and a posix_spawn left the parent's stream, deferred accept, stalled exchanges and 0-2 alone"
}
check "g) vfork and posix_spawn children leave the parent's streams and stalled exchanges alone" t_vfork
# Python's subprocess (3.10+) starts children with vfork, and their
# close_fds closes with close_range(3, ~0) before the exec: a preloaded
# Python server that runs a command while it holds a stream must keep it.
t_vfork_python() {
    next_port
    local s
    rm -f "$T/g-vp.stats"
    bgpre "$T/g-vp.stats" timeout 30 "$PY" "$HELPER_DIR/subprocess_echo.py" "$PORT"
    s=$BGPID
    wait_listen "$PORT" || return 1
    pre "$T/g-vp.stats" timeout 30 "$PY" "$HELPER" echo-client "$PORT" blocking 262144 || return 1
    wait_pid "$s" 10 || return 1
    has "$T/g-vp.stats" "accept iwarp" && has "$T/g-vp.stats" "connect iwarp"
}
check "g) vfork: a Python server's subprocess.run (vfork, close_range) leaves its stream alone" t_vfork_python

# ---- h) the C API ----------------------------------------------------------------------------
t_capi() {
    local src name
    for src in tests/c/rsocket/test_*.c; do
        name=$(basename "$src" .c)
        gcc -std=c11 -D_POSIX_C_SOURCE=200809L -O1 -g -Wall -Wextra -Werror -pthread -Iinclude \
            "$src" -o "$T/$name" -L"$LIBDIR" -liwarp_rsocket -Wl,-rpath,"$LIBDIR" || return 1
        timeout 60 "$T/$name" || return 1
        # And against the static library.
        gcc -std=c11 -D_POSIX_C_SOURCE=200809L -O1 -g -Wall -Wextra -Werror -pthread -Iinclude \
            "$src" -o "$T/$name-static" "$LIBDIR/libiwarp_rsocket.a" \
            -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc || return 1
        timeout 60 "$T/$name-static" || return 1
    done
    if command -v g++ >/dev/null; then
        echo '#include "iwarp_rsocket.h"' | g++ -x c++ -std=c++11 -Wall -Wextra -Werror -Iinclude \
            -fsyntax-only - || { echo "iwarp_rsocket.h is not valid C++"; return 1; }
    fi
}
check "h) C API: rsocket echo with a poll loop, riomap/riowrite (tests/c/rsocket), shared and static" t_capi

# ---- j) hostile clients: stalled MPA exchanges ----------------------------------------------
# A settle (the MPA exchange of a deferred accept) must never change a
# descriptor the program closed or replaced meanwhile (issue 26 item 2):
# 8 clients send only the MPA key; the server leaves them alone until the
# settle timer (100 ms) has started their exchanges (3 s timeout), closes
# half of them and reopens a file on each number, dup2s a file onto the
# other half, and checks after the exchanges ended that every number
# still refers to its file.
t_reuse() {
    next_port
    local s st out
    rm -f "$T/j.stats"
    printf 'the file\n' >"$T/j-file"
    chmod 644 "$T/j-file"
    bgpre "$T/j.stats" env IWARP_PRELOAD_SETTLE_MS=100 IWARP_PRELOAD_CONNECT_MS=3000 \
        timeout 30 "$PY" "$HELPER" reuse-server "$PORT" 8 0.8 4 "$T/j-file" >"$T/j-srv.out" 2>&1
    s=$BGPID
    wait_listen "$PORT" || return 1
    bg timeout 30 "$PY" "$HELPER" stall "$PORT" 8 10 >/dev/null
    wait "$s"
    st=$?
    cat "$T/j-srv.out"
    [ "$st" = 0 ] || return 1
    [ "$(grep -c ' accept iwarp ' "$T/j.stats")" = 8 ] || { echo "not 8 MPA accepts:"; cat "$T/j.stats"; return 1; }
    echo "info: $(cat "$T/j-srv.out")"
}
check "j) descriptors closed or replaced during stalled MPA exchanges stay the program's" t_reuse

# rate_round PORT SECS [stall]: one measured round of short preloaded
# connections (connect, echo 64 bytes, close) against the server on PORT;
# with `stall`, while clients that send only the MPA key arrive 10 per
# second and hold for 1.2 s (longer than the server's 1 s MPA timeout),
# measured from when their number is steady. Prints the rate.
rate_round() {
    local port=$1 secs=$2 st _i
    if [ "${3:-}" = stall ]; then
        rm -f "$T/k-stall.out"
        bg timeout 30 "$PY" "$HELPER" stall-rate "$port" 10 $((secs + 3)) 1.2 >"$T/k-stall.out"
        st=$BGPID
        for _i in $(seq 100); do grep -q steady "$T/k-stall.out" && break; sleep 0.1; done
        grep -q steady "$T/k-stall.out" || { echo "stallers did not start" >&2; return 1; }
    fi
    pre "$T/k-cli.stats" timeout 30 "$PY" "$HELPER" conn-rate "$port" "$secs" | sed -n 's/^rate //p'
    # The stallers outlive the measured round by design (SECS + 3 s);
    # once it is over they are only waited for: end them (their held
    # sockets close with them).
    [ -z "${st:-}" ] || stop "$st"
}
# t_stall_rate MODE: a preloaded echo server (helper.py echo-server MODE:
# `blocking`, a thread per connection, or `select`, one thread with
# selectors/epoll and non-blocking sockets) keeps >= 0.9x its rate of new
# preloaded clients while stallers arrive (issue 26 item 1). Interleaved
# rounds, medians compared; every measured client must have gone over
# iWARP (a fallback to TCP would compare unlike things).
t_stall_rate() {
    local mode=$1 s _round base=() with=() ratio
    next_port
    rm -f "$T/k-srv.stats" "$T/k-cli.stats"
    bgpre "$T/k-srv.stats" timeout 120 "$PY" "$HELPER" echo-server "$PORT" "$mode"
    s=$BGPID
    wait_listen "$PORT" || return 1
    rate_round "$PORT" 1 >/dev/null || return 1 # warm-up
    for _round in 1 2 3; do
        base+=("$(rate_round "$PORT" 2)") || return 1
        with+=("$(rate_round "$PORT" 2 stall)") || return 1
    done
    stop "$s"
    echo "connections/s without stallers: ${base[*]}; with stallers: ${with[*]}"
    if grep -q "connect plain" "$T/k-cli.stats"; then
        echo "a measured client fell back to TCP:"; grep "connect plain" "$T/k-cli.stats" | head -3; return 1
    fi
    grep -q "accept refused" "$T/k-srv.stats" || { echo "no staller reached the server's MPA exchange"; return 1; }
    ratio=$("$PY" -c 'import statistics as s,sys; a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]; print(f"{s.median(b)/s.median(a):.2f}")' "${base[*]}" "${with[*]}")
    echo "info: $mode server: median rate with stallers / without = $ratio (${with[*]} vs ${base[*]} connections/s)"
    # The issue's gate. A staller costs the server nothing on its own
    # threads now (its exchange waits in the shim's one watcher thread), so
    # what is left is CPU: the stallers' processes share the 2 cores.
    "$PY" -c "import sys; sys.exit(0 if $ratio >= 0.9 else 1)" || { echo "below 0.9x"; return 1; }
}
check "k) a blocking (thread per connection) server keeps >= 0.9x its rate while MPA stallers arrive" t_stall_rate blocking
# The event loop: before the fix its first read of a staller's accept ran
# the MPA exchange on its only thread (up to 1 s each).
check "k) an event-loop (selectors/epoll) server keeps >= 0.9x its rate while MPA stallers arrive" t_stall_rate select

# The same in a process that may make no streams (helper.py echo-server
# nostreams: a child forked after its parent made a stream; issue 26 item 1,
# audit gap 11): its accept must not wait for a silent client's first
# bytes either (before the fix it peeked up to IWARP_PRELOAD_PEEK_MS, 1 s,
# on the program's thread per client, so 10 silent clients a second held
# the accepting thread all the time).
#
# silent_pair_rate RUN ROUNDS: two identical no-streams echo servers (RUN
# `bgpre`: preloaded; `bgnopre`: plain Python), and one plain client that
# connects to each in turn (connect, echo 64 bytes, close; helper.py
# conn-rate-pair), ROUNDS rounds of 1 s while silent clients arrive at one
# of them (10 a second, each held 1.2 s), then ROUNDS more with them moved
# to the other. The other server is the baseline measured in the same
# milliseconds, so the machine's load and the silent clients' generator
# (a process of its own on the same 2 cores) weigh on both alike. Sets
# K_RATIOS (each round's rate at the median connection of the server
# with silent clients over the other's), K_RATIO (their median), K_MEANS
# (the same for each round's whole rate: connections over the time they
# took) and K_MEAN, K_SRV_PIDS and K_SRV_STATS (the servers, left
# running).
silent_pair_rate() {
    local run=$1 rounds=$2 pa pb tgt ctl st _r _i ma mb ra rb
    K_RATIOS=()
    K_MEANS=()
    next_port
    pa=$PORT
    next_port
    pb=$PORT
    rm -f "$T/k-srv-$pa.stats" "$T/k-srv-$pb.stats" "$T/k-srv-$pa.out" "$T/k-srv-$pb.out"
    # CONNECT_MS: the server's stream to itself (its parent's, before the
    # fork) must not fall back on a loaded machine; PEEK_MS is its
    # default then (1 s) as in the other checks.
    $run "$T/k-srv-$pa.stats" env IWARP_PRELOAD_CONNECT_MS=5000 IWARP_PRELOAD_PEEK_MS=1000 \
        timeout 120 "$PY" "$HELPER" echo-server "$pa" nostreams >"$T/k-srv-$pa.out"
    K_SRV_PIDS=("$BGPID")
    $run "$T/k-srv-$pb.stats" env IWARP_PRELOAD_CONNECT_MS=5000 IWARP_PRELOAD_PEEK_MS=1000 \
        timeout 120 "$PY" "$HELPER" echo-server "$pb" nostreams >"$T/k-srv-$pb.out"
    K_SRV_PIDS+=("$BGPID")
    K_SRV_STATS=("$T/k-srv-$pa.stats" "$T/k-srv-$pb.stats")
    # Not before "serving": until then the server's own first stream (its
    # parent's) takes the next connection.
    for _i in $(seq 200); do
        grep -q serving "$T/k-srv-$pa.out" && grep -q serving "$T/k-srv-$pb.out" && break
        sleep 0.1
    done
    if ! grep -q serving "$T/k-srv-$pa.out" || ! grep -q serving "$T/k-srv-$pb.out"; then
        echo "the servers did not start within 20 s"
        return 1
    fi
    timeout 30 "$PY" "$HELPER" conn-rate-pair "$pa" "$pb" 0.3 >/dev/null || return 1 # warm-up
    for tgt in "$pb" "$pa"; do
        ctl=$pa
        [ "$tgt" = "$pa" ] && ctl=$pb
        rm -f "$T/k-stall.out"
        bg timeout 30 "$PY" "$HELPER" stall-rate "$tgt" 10 $((2 * rounds + 4)) 1.2 silent >"$T/k-stall.out"
        st=$BGPID
        for _i in $(seq 100); do grep -q steady "$T/k-stall.out" && break; sleep 0.1; done
        grep -q steady "$T/k-stall.out" || { echo "silent clients did not start"; return 1; }
        for _r in $(seq "$rounds"); do
            read -r ma mb ra rb < <(timeout 30 "$PY" "$HELPER" conn-rate-pair "$tgt" "$ctl" 1 | sed -n 's/^rates //p')
            [ -n "$rb" ] || return 1
            echo "round: connections/s at the median $ma with silent clients, $mb without; all $ra, $rb (ports $tgt, $ctl)"
            K_RATIOS+=("$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$ma" "$mb")")
            K_MEANS+=("$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$ra" "$rb")")
        done
        stop "$st"
    done
    K_RATIO=$("$PY" -c 'import statistics as s, sys; print(f"{s.median(float(x) for x in sys.argv[1:]):.2f}")' "${K_RATIOS[@]}")
    K_MEAN=$("$PY" -c 'import statistics as s, sys; print(f"{s.median(float(x) for x in sys.argv[1:]):.2f}")' "${K_MEANS[@]}")
}
# bgnopre STATS CMD...: `bgpre` without the preload.
bgnopre() {
    shift
    bg "$@"
}
# The issue's gate, on the right ratio: a preloaded server's rate with
# silent clients over an identical preloaded server's in the same
# milliseconds (above), >= 0.9; the median of 6 rounds. Then one preloaded
# client, whose MPA Request is refused (closed) in such a process, must be
# served after falling back.
#
# Why a twin server and the median connection. Sessions 9-10 measured this
# server against itself in turns (a round without, a round with) and got
# 0.88-0.93x on a quiet machine, without finding where the 7-12 % went.
# Session 11: not in the shim. In turns, plain Python without the preload
# loses as much or more (0.49x in one run at load 11, 0.99-1.38x in
# others: single rounds swing 500-3000 connections/s on a shared machine,
# and the silent clients' generator is one more process on the 2 cores);
# the silent clients cost the server about 3 % more CPU per connection
# served, plain or preloaded alike (their own accepts and threads); the
# accepting thread makes the same system calls per client with them as
# without (strace -c, session 9). Against a twin, one connection to each
# in turn, over 18 runs at load 23-51: preloaded 0.97-1.00; plain Python
# (K_BASELINE=1, 12 of them at load 23-31) 0.95-1.04. The whole rates
# (connections over all their time, printed beside) dip under load for
# both, plain Python too (0.70-1.03 preloaded, median 0.92; 0.80-1.41
# plain, median 0.96, in those 12 runs): a few slow connections weigh as
# much as hundreds of fast ones, so the gate takes the rate at the median
# connection. Whether the preloaded server's somewhat deeper dips are the
# shim's was not settled (they come and go with the load; not traced). A
# library that waits on each silent client on the program's thread (the
# behaviour before the fix) gives 0.00 (0.8 connections/s against
# 240-3500 for its twin). About 15 s.
t_stall_rate_nostreams() {
    local s pre_ratio
    rm -f "$T/k-mpa.stats"
    silent_pair_rate bgpre 3 || return 1
    for s in "${K_SRV_STATS[@]}"; do
        has "$s" "connect iwarp" || { echo "the server's parent made no stream"; return 1; }
        # The silent clients' accepts were decided off the program's thread.
        grep -q "accept plain .*no first bytes within IWARP_PRELOAD_PEEK_MS" "$s" ||
            { echo "$s: no silent client reached the server"; cat "$s"; return 1; }
    done
    pre "$T/k-mpa.stats" timeout 20 "$PY" "$HELPER" echo-client "$PORT" blocking 4096 || return 1
    for s in "${K_SRV_PIDS[@]}"; do stop "$s"; done
    has "$T/k-mpa.stats" "connect plain" || return 1
    has "$T/k-srv-$PORT.stats" "accept refused .*no new iWARP streams in a child" || return 1
    echo "info: no-streams server: rate at the median connection with silent clients / its twin's = $K_RATIO (rounds: ${K_RATIOS[*]}); whole rates: $K_MEAN (${K_MEANS[*]})"
    pre_ratio=$K_RATIO
    if [ "${K_BASELINE:-0}" = 1 ]; then
        silent_pair_rate bgnopre 3 || return 1
        for s in "${K_SRV_PIDS[@]}"; do stop "$s"; done
        echo "info: the same without the preload (plain Python servers): $K_RATIO (rounds: ${K_RATIOS[*]}); whole rates: $K_MEAN (${K_MEANS[*]})"
    fi
    if ! "$PY" -c "import sys; sys.exit(0 if $pre_ratio >= 0.9 else 1)"; then
        # Whose loss: the same pair of servers without the preload.
        silent_pair_rate bgnopre 3 || return 1
        for s in "${K_SRV_PIDS[@]}"; do stop "$s"; done
        echo "below 0.9x; plain Python servers measured so just after: $K_RATIO (rounds: ${K_RATIOS[*]}); whole rates: $K_MEAN (${K_MEANS[*]})"
        return 1
    fi
}
check "k) a blocking server in a process that makes no streams keeps >= 0.9x its rate while silent clients arrive" t_stall_rate_nostreams

# ---- m) the bound on live streams ----------------------------------------------------------
# IWARP_PRELOAD_MAX_STREAMS (issue 26 item 1: bounded streams and threads
# per process). A thread-per-connection server with the bound at 4; 5
# preloaded clients connect one after another, each echoes 64 bytes and
# holds its connection. The 5th MPA client is closed at accept and falls
# back to TCP (and is served); the server keeps serving (a plain client
# too) with at most 2 x 4 provider threads (iwarp-rx-*, iwarp-tx-*). Once
# the clients close, the threads go and the next MPA client is iWARP
# again. About 3 s.
t_max_streams() {
    next_port
    local s spid c rxtx threads _i
    rm -f "$T/m-srv.stats" "$T/m-cli.stats" "$T/m-again.stats" "$T/m.fifo" "$T/m-cli.out"
    mkfifo "$T/m.fifo"
    bgpre "$T/m-srv.stats" env IWARP_PRELOAD_MAX_STREAMS=4 timeout 60 "$PY" "$HELPER" echo-server "$PORT" blocking
    s=$BGPID
    wait_listen "$PORT" || return 1
    spid=$(pgrep -P "$s" | head -1)
    [ -n "$spid" ] || { echo "no server process under $s"; return 1; }
    # The clients hold until the FIFO ends: this shell keeps its only
    # writer (opened read-write, which does not block) and closes it when
    # done; the client gets no copy of it.
    exec 9<>"$T/m.fifo"
    bgpre "$T/m-cli.stats" timeout 30 "$PY" "$HELPER" hold-streams "$PORT" 5 "$T/m.fifo" >"$T/m-cli.out" 9>&-
    c=$BGPID
    for _i in $(seq 200); do grep -q "held 5" "$T/m-cli.out" && break; sleep 0.1; done
    rxtx=$(cat /proc/"$spid"/task/*/comm 2>/dev/null | grep -c '^iwarp-[rt]x-')
    threads=$(find /proc/"$spid"/task -mindepth 1 -maxdepth 1 | wc -l)
    timeout 20 "$PY" "$HELPER" echo-client "$PORT" blocking 4096 >/dev/null || { exec 9>&-; echo "a plain client was not served at the bound"; return 1; }
    exec 9>&-
    wait_pid "$c" 20 || return 1
    grep -q "held 5" "$T/m-cli.out" || { echo "the 5 clients were not all served"; return 1; }
    echo "server threads with 5 clients held: $threads, of them provider threads: $rxtx"
    [ "$(grep -c ' connect iwarp ' "$T/m-cli.stats")" = 4 ] || { echo "not 4 iWARP connects:"; cat "$T/m-cli.stats"; return 1; }
    has "$T/m-cli.stats" "connect plain" || return 1
    [ "$(grep -c ' accept iwarp ' "$T/m-srv.stats")" = 4 ] || { echo "not 4 iWARP accepts:"; cat "$T/m-srv.stats"; return 1; }
    has "$T/m-srv.stats" "accept refused .*IWARP_PRELOAD_MAX_STREAMS" || return 1
    [ "$rxtx" -le 8 ] || { echo "$rxtx provider threads for a bound of 4 streams"; return 1; }
    [ "$rxtx" -ge 2 ] || { echo "no provider threads seen: the count measures nothing"; return 1; }
    # The places come back when the streams close: wait (bounded) for the
    # provider threads to end, then a new MPA client is iWARP again.
    for _i in $(seq 100); do
        [ "$(cat /proc/"$spid"/task/*/comm 2>/dev/null | grep -c '^iwarp-[rt]x-')" = 0 ] && break
        sleep 0.1
    done
    pre "$T/m-again.stats" timeout 20 "$PY" "$HELPER" echo-client "$PORT" blocking 4096 || return 1
    stop "$s"
    has "$T/m-again.stats" "connect iwarp" || return 1
    echo "info: bound 4: 4 of 5 MPA clients iWARP, the 5th fell back and was served; $rxtx provider threads ($threads in all) while held; iWARP again after they closed"
}
check "m) IWARP_PRELOAD_MAX_STREAMS bounds live streams and their threads; past it MPA clients fall back" t_max_streams

# ---- l) TCP_CONGESTION ---------------------------------------------------------------------
# A preloaded client sets TCP_CONGESTION (tcp(7)) before connect and
# changes it on the live stream: the TCP connection below the stream must
# use each (ss -ti shows the kernel's view), and getsockopt on the stream
# returns it. The default here is bbr, so reno first, then bbr.
t_congestion() {
    next_port
    local s c out k1 k2 _i
    rm -f "$T/l-srv.stats" "$T/l-cli.stats" "$T/l.out" "$T/l-go1" "$T/l-go2"
    bgpre "$T/l-srv.stats" timeout 30 "$PY" "$HELPER" echo-server "$PORT" blocking
    s=$BGPID
    wait_listen "$PORT" || return 1
    # The client waits for the shell's ss (a file appears) between steps:
    # ss runs outside the preloaded process (a vfork'd child of it would
    # share its descriptor table's memory).
    cat >"$T/l.py" <<'PYEOF'
import os, socket, sys, time
port, go1, go2 = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def cc_of(c):
    return c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()
def wait_for(path):
    for _ in range(200):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    sys.exit(f"no {path} after 10 s")
c = socket.socket()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
c.connect(("127.0.0.1", port))
c.sendall(b"x"); c.recv(1)
print(f"step1 {cc_of(c)}", flush=True)
wait_for(go1)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")
print(f"step2 {cc_of(c)}", flush=True)
wait_for(go2)
try:
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"nosuchcc")
    print("unknown accepted", flush=True)
except OSError as e:
    print(f"unknown errno {e.errno}", flush=True)
PYEOF
    bgpre "$T/l-cli.stats" timeout 30 "$PY" "$T/l.py" "$PORT" "$T/l-go1" "$T/l-go2" >"$T/l.out" 2>&1
    c=$BGPID
    # kernel_cc: the algorithm of the established connection to $PORT, as
    # the kernel sees it (the client side of the stream's TCP connection).
    kernel_cc() { ss -Htin state established "( dport = :$PORT )" | grep -oE '\b(reno|bbr|cubic)\b' | head -1; }
    for _i in $(seq 100); do grep -q step1 "$T/l.out" && break; sleep 0.1; done
    k1=$(kernel_cc)
    touch "$T/l-go1"
    for _i in $(seq 100); do grep -q step2 "$T/l.out" && break; sleep 0.1; done
    k2=$(kernel_cc)
    touch "$T/l-go2"
    wait_pid "$c" 10
    stop "$s"
    out="$(tr '\n' ' ' <"$T/l.out")kernel: $k1 then $k2"
    echo "$out"
    grep -q "step1 reno" "$T/l.out" && [ "$k1" = reno ] && grep -q "step2 bbr" "$T/l.out" &&
        [ "$k2" = bbr ] && grep -q "unknown errno 2" "$T/l.out" || return 1
    has "$T/l-cli.stats" "connect iwarp" || return 1
    echo "info: TCP_CONGESTION set before connect (reno) and on the live stream (bbr): getsockopt and ss -ti agree; an unknown name is ENOENT"
}
check "l) TCP_CONGESTION set before connect and on the live stream reaches the stream's TCP connection" t_congestion

# ---- i) a privileged program --------------------------------------------------------------
# Under secure execution (AT_SECURE: setuid, setgid, file capabilities) the
# shim must ignore its environment, as ld.so ignores LD_* variables:
# otherwise IWARP_PRELOAD_STATS makes a setuid-root program create a file
# anywhere. So must the library crates inside it (IWARP_DEVICE,
# IWARP_PROGRESS, IWARP_PROGRESS_THREADS, IWARP_CRC..., read through
# iwarp_proto::env). Layers: the unit tests (cargo test -p iwarp-preload,
# config.rs; -p iwarp-proto, env.rs) check the gates themselves (secure
# set: every variable ignored; getauxval reads "not secure" in a plain
# process); this test checks the kernel and loader side: a real
# setuid-root program run by `nobody`, with the shim linked in (glibc
# drops LD_PRELOAD for setuid programs unless the library is in a trusted
# directory and setuid itself; LD_PRELOAD is set anyway, as a user would),
# is in secure execution, has the shim mapped, and with
#   IWARP_PRELOAD_STATS=<a root-only directory>  its stats file is not created,
#   IWARP_DEVICE=nosuch                          connects over iWARP all the same
#                                                (the preloaded server records it),
#   IWARP_PROGRESS=pool IWARP_PROGRESS_THREADS=3 has no pool thread,
#   IWARP_CRC=nosuch, IWARP_PRELOAD_LOG=warn     says nothing of `nosuch`.
# The same program without the setuid bit (the controls) obeys each of
# them, so the check can fail: it records; IWARP_DEVICE=nosuch makes it
# connect plain, naming `nosuch`; the pool has 3 threads; IWARP_CRC=nosuch
# is logged (with IWARP_SOCKETS_CRC=on: without it the shims negotiate no
# CRC and never choose a back end). IWARP_CRC has no effect but that log
# line, which needs IWARP_PRELOAD_LOG, itself ignored under secure
# execution: the setuid run cannot show IWARP_CRC obeyed; the unit tests
# (iwarp-proto env.rs) hold every read to the one gate.
t_secure() {
    local d="$T/secure" out s n
    command -v setpriv >/dev/null || { echo "setpriv (util-linux) missing"; return 1; }
    [ "$(id -u)" = 0 ] || { echo "needs root (to install a setuid-root program)"; return 77; }
    rm -rf "$d"
    mkdir -p "$d/lib" "$d/rootonly" "$d/public"
    chmod 755 "$d" "$d/lib" "$d/rootonly"
    chmod 1777 "$d/public"
    install -m 755 "$LIB" "$d/lib/libiwarp_preload.so"
    gcc -O1 -Wall -Wextra -Werror "$HELPER_DIR/secure_exec.c" -o "$d/secure_exec" \
        -Wl,--no-as-needed -L"$d/lib" -liwarp_preload -Wl,-rpath,"$d/lib" || return 1
    cp "$d/secure_exec" "$d/plain_exec"
    chown root:root "$d/secure_exec" && chmod 4755 "$d/secure_exec" || return 1
    chmod 755 "$d/plain_exec"
    # The program's one connection goes to a preloaded echo server, which
    # records whether it came over iWARP.
    next_port
    bgpre "$T/i-srv.stats" timeout 60 "$PY" "$HELPER" echo-server "$PORT" blocking
    s=$BGPID
    wait_listen "$PORT" || return 1
    # as_nobody PROGRAM STDERR VAR=VALUE...: PROGRAM run by nobody with the
    # shim in LD_PRELOAD and the variables; its stdout on one line.
    as_nobody() {
        local prog="$1" err="$2"
        shift 2
        env LD_PRELOAD="$d/lib/libiwarp_preload.so" IWARP_PRELOAD_CONNECT_MS=2000 "$@" \
            timeout 20 setpriv --reuid=nobody --regid=nogroup --clear-groups "$prog" "$PORT" \
            2>"$err" | tr '\n' ' '
    }
    out=$(as_nobody "$d/secure_exec" "$d/err" IWARP_PRELOAD_STATS="$d/rootonly/owned" \
        IWARP_PRELOAD_LOG=warn IWARP_DEVICE=nosuch IWARP_CRC=nosuch IWARP_PROGRESS=pool \
        IWARP_PROGRESS_THREADS=3)
    echo "setuid run: $out; stderr: $(cat "$d/err")"
    case "$out" in
    "secure=1 preload=1 "*) ;;
    *) echo "expected secure=1 preload=1 (is $T on a nosuid mount?)"; return 1 ;;
    esac
    [ "$out" = "secure=1 preload=1 pool=0 " ] ||
        { echo "expected pool=0: the setuid program obeyed IWARP_PROGRESS"; return 1; }
    if [ -e "$d/rootonly/owned" ]; then
        echo "the setuid program obeyed IWARP_PRELOAD_STATS:"; ls -l "$d/rootonly/owned"; return 1
    fi
    grep -q "IWARP_\* environment is ignored" "$d/err" || { echo "no line on stderr saying why"; return 1; }
    if grep -q nosuch "$d/err"; then echo "the setuid program read IWARP_DEVICE or IWARP_CRC"; return 1; fi
    n=$(grep -c " accept iwarp " "$T/i-srv.stats")
    [ "$n" = 1 ] || { echo "the setuid program did not connect over iWARP (IWARP_DEVICE=nosuch obeyed?):"; cat "$T/i-srv.stats"; return 1; }
    # Controls: the same program without the setuid bit obeys the variables.
    out=$(as_nobody "$d/plain_exec" "$d/err1" IWARP_PRELOAD_STATS="$d/public/owned" \
        IWARP_DEVICE=nosuch)
    [ "$out" = "secure=0 preload=1 pool=0 " ] || { echo "control 1: $out"; cat "$d/err1"; return 1; }
    has "$d/public/owned" "connect plain.*nosuch" || { echo "control 1: IWARP_DEVICE=nosuch not obeyed"; return 1; }
    out=$(as_nobody "$d/plain_exec" "$d/err2" IWARP_PRELOAD_STATS="$d/public/owned2" \
        IWARP_PRELOAD_LOG=warn IWARP_CRC=nosuch IWARP_SOCKETS_CRC=on IWARP_PROGRESS=pool \
        IWARP_PROGRESS_THREADS=3)
    [ "$out" = "secure=0 preload=1 pool=3 " ] || { echo "control 2: $out"; cat "$d/err2"; return 1; }
    has "$d/public/owned2" "connect iwarp" || return 1
    grep -q nosuch "$d/err2" || { echo "control 2: IWARP_CRC=nosuch not logged:"; cat "$d/err2"; return 1; }
    stop "$s"
    echo "info: setuid root run by nobody: AT_SECURE=1, shim loaded, IWARP_PRELOAD_STATS (no file), IWARP_DEVICE (iWARP all the same), IWARP_PROGRESS(_THREADS) (no pool) ignored, IWARP_CRC not logged; without setuid the same program obeys each"
}
check "i) setuid program: the shim ignores IWARP_* under secure execution" t_secure

finish
