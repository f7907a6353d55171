#!/usr/bin/env bash
# iwarp-ping server and client as two processes over 127.0.0.1, the way
# rping is run on two siw hosts: `iwarp-ping -s` and `iwarp-ping -c -V -v`.
#
# For each MPA configuration it checks that both processes exit 0, that the
# client printed one validated "ping data:" line per iteration, and, for
# 64-byte pings, that the first line is exactly what rping on siw sends
# (see docs/TESTING.md: the payload was read from siw-default.pcap).
#
# Environment: IWARP_PING (binary; default target/release/iwarp-ping, built
# if missing), PING_PORT (first port, default 47174), PING_COUNT (default 10).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PING="${IWARP_PING:-$ROOT/target/release/iwarp-ping}"
PORT="${PING_PORT:-47174}"
COUNT="${PING_COUNT:-10}"
WORK="$(mktemp -d)"
SERVER_PID=""

cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

if [[ ! -x "$PING" ]]; then
    echo "building iwarp-ping (release)"
    (cd "$ROOT" && cargo build --release -p iwarp-tools --bin iwarp-ping)
fi

# rping's 64-byte ping 0, as captured from siw (without the final NUL).
FIRST_64='ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\]^_`abcdefghijklmnopqr'

# run_case NAME SIZE EXTRA-FLAGS...
run_case() {
    local name="$1" size="$2"
    shift 2
    local slog="$WORK/$name.server.log" clog="$WORK/$name.client.log" rc=0 src=0
    echo "--- $name: size $size, count $COUNT, flags: ${*:-(defaults)}"
    "$PING" -s -a 127.0.0.1 -p "$PORT" -S "$size" --timeout 20 "$@" >"$slog" 2>&1 &
    SERVER_PID=$!
    local _
    for _ in $(seq 1 100); do
        grep -q 'listening on' "$slog" && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q 'listening on' "$slog"; then
        echo "FAIL: server did not start listening:"
        sed 's/^/    | /' "$slog"
        return 1
    fi
    timeout --kill-after=5 60 "$PING" -c -a 127.0.0.1 -p "$PORT" -S "$size" -C "$COUNT" -V -v \
        --timeout 20 "$@" >"$clog" 2>&1 || rc=$?
    # The server exits by itself when the client disconnects.
    local waited=0
    while kill -0 "$SERVER_PID" 2>/dev/null && ((waited < 100)); do
        sleep 0.1
        waited=$((waited + 1))
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "FAIL: server still running 10 s after the client finished"
        kill "$SERVER_PID" 2>/dev/null || true
        src=124
    fi
    wait "$SERVER_PID" 2>/dev/null || src=$?
    SERVER_PID=""
    PORT=$((PORT + 1))

    local fails=0 lines
    lines="$(grep -c '^ping data: rdma-ping-' "$clog" || true)"
    if ((rc != 0)); then
        echo "FAIL: client exited with status $rc"
        fails=1
    fi
    if ((src != 0)); then
        echo "FAIL: server exited with status $src"
        fails=1
    fi
    if ((lines != COUNT)); then
        echo "FAIL: client printed $lines validated ping lines, expected $COUNT"
        fails=1
    fi
    if ((size == 64)) && [[ "$(grep -m1 '^ping data:' "$clog")" != "$FIRST_64" ]]; then
        echo "FAIL: first ping line differs from rping's: $(grep -m1 '^ping data:' "$clog")"
        fails=1
    fi
    if ((fails)); then
        echo "    client output:"
        sed 's/^/    | /' "$clog"
        echo "    server output:"
        sed 's/^/    | /' "$slog"
        return 1
    fi
    echo "ok: $lines pings validated; last: $(grep '^ping data:' "$clog" | tail -1 | cut -c1-60)..."
}

results=0
run_case default 64 || results=1
run_case crc-required 4096 --crc required || results=1
run_case crc-markers 65535 --crc required --markers required || results=1
run_case crc-off 1000 --crc off || results=1
if ((results)); then
    echo "ping-loopback: FAILED"
    exit 1
fi
echo "ping-loopback: all cases passed"
