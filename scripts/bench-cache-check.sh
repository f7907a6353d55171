#!/usr/bin/env bash
# Version-check latency against ccappd while compute threads (busy loops)
# load its host: RDMA Read of the slot vs. a request to the version thread.
# The seed's claim is that the RDMA path stays flat as the application
# server gets busy; in this software stack the Read Response is produced by
# a receive thread in ccappd, which competes for the CPU too.
#
#   scripts/bench-cache-check.sh                  # threads 0 2 8 32, 5000 checks
#   THREADS="0 4 16" COUNT=20000 scripts/bench-cache-check.sh
#   OUT=/tmp/checks.jsonl scripts/bench-cache-check.sh   # keep the JSON lines
#
# Prints one JSON line per (threads, mode) and a Markdown table.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
THREADS="${THREADS:-0 2 8 32}"
COUNT="${COUNT:-5000}"
T="$(mktemp -d /tmp/cache-bench.XXXXXX)"
OUT="${OUT:-$T/checks.jsonl}"
APPD_PID=""
cleanup() {
    if [ -n "$APPD_PID" ]; then
        kill -TERM "$APPD_PID" 2>/dev/null
        timeout 10 tail --pid="$APPD_PID" -f /dev/null 2>/dev/null || kill -KILL "$APPD_PID" 2>/dev/null
    fi
    rm -rf "$T"
}
trap cleanup EXIT

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
timeout 1200 cargo build --release -q -p ccache || { echo "cargo build -p ccache failed"; exit 1; }
# Server ports from below the ephemeral range, distinct within this run
# (a port taken from bind(:0) and released can be taken by an outgoing
# connection or handed out twice before the server binds it).
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$T/ports.given"; }
: >"$OUT"
for n in $THREADS; do
    PR=$(free_port)
    PV=$(free_port)
    "$TARGET/release/ccappd" --docs 16 --rdma-listen "127.0.0.1:$PR" --version-listen "127.0.0.1:$PV" \
        --ipc "$T/ipc.sock" --token-file "$T/token" --compute-threads "$n" >>"$T/ccappd.log" 2>&1 &
    APPD_PID=$!
    up=0
    for _ in $(seq 1 100); do
        if timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PV" 2>/dev/null; then up=1; break; fi
        sleep 0.1
    done
    if [ "$up" != 1 ]; then echo "ccappd did not start"; cat "$T/ccappd.log"; exit 1; fi
    for m in rdma:threaded rdma:sleep tcp:threaded; do
        timeout 600 "$TARGET/release/ccping" --mode "${m%%:*}" --progress "${m##*:}" \
            --appd-rdma "127.0.0.1:$PR" --appd-tcp "127.0.0.1:$PV" --token-file "$T/token" \
            --count "$COUNT" --label "threads=$n" | tee -a "$OUT"
    done
    kill -TERM "$APPD_PID" 2>/dev/null
    timeout 10 tail --pid="$APPD_PID" -f /dev/null 2>/dev/null || kill -KILL "$APPD_PID" 2>/dev/null
    APPD_PID=""
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n| compute threads | mode | wait | p50 us | p90 us | p99 us | max us | failed checks |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    wait = r["progress"].lower() if r["mode"] == "Rdma" else "-"
    print(f"| {r['label'].split('=')[1]} | {r['mode'].lower()} | {wait} | {r['p50_us']} | {r['p90_us']} | {r['p99_us']} | {r['max_us']} | {r['errors']} |")
PY
