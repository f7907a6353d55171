#!/usr/bin/env bash
# Before/after of the preload shim on iperf3: one stream over loopback,
# client and server both preloaded, with an old and a new
# libiwarp_preload.so, in interleaved pairs (odd pairs old first, even
# pairs new first); prints Gbit/s and iperf3's CPU percent (host +
# remote) per run. Give the same library twice for an A/A run, which
# shows the machine's spread.
#
#   scripts/bench-preload-ab.sh OLD.so NEW.so
#   PAIRS=5 DESIGN=basic SECS=3 PORT=25201 scripts/bench-preload-ab.sh OLD.so NEW.so
#   PIN=1 scripts/bench-preload-ab.sh OLD.so NEW.so   server on CPU 0, client on CPU 1
#
# Unpinned, runs on 2 cores land near one of two rates (about 11 or 25
# Gbit/s on the 2-vCPU EPYC of 2026-11-28), by where the scheduler puts the
# two processes' threads; five pairs then mostly measure which mode each
# run fell into. PIN=1 fixes the placement (each process and its provider
# threads on one CPU of its own).
#
# The machine should be otherwise idle; the load average is printed per pair.
set -euo pipefail
if [[ $# -ne 2 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    [[ $# -eq 2 ]] || exit 2
    exit 0
fi
OLD="$1" NEW="$2"
for lib in "$OLD" "$NEW"; do
    [[ -f "$lib" ]] || { echo "bench-preload-ab: $lib: no such library (build one with: cargo build --release -p iwarp-preload)" >&2; exit 1; }
done
command -v iperf3 >/dev/null || apt-get install -y -q --no-install-recommends iperf3
DESIGN="${DESIGN:-enhanced}" PAIRS="${PAIRS:-5}" SECS="${SECS:-3}" PORT="${PORT:-25201}"
PIN="${PIN:-0}"
SRV_PIN=() CLI_PIN=()
if [[ "$PIN" == 1 ]]; then
    SRV_PIN=(taskset -c 0) CLI_PIN=(taskset -c 1)
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

one() {
    local lib="$1" s _
    "${SRV_PIN[@]}" env LD_PRELOAD="$lib" IWARP_SOCKETS_DESIGN="$DESIGN" IWARP_PRELOAD_PORTS="$PORT" \
        timeout 60 iperf3 -s -1 -B 127.0.0.1 -p "$PORT" -J >"$WORK/srv.json" 2>&1 &
    s=$!
    for _ in $(seq 1 50); do
        ss -ltn | grep -q ":$PORT " && break
        sleep 0.1
    done
    "${CLI_PIN[@]}" env LD_PRELOAD="$lib" IWARP_SOCKETS_DESIGN="$DESIGN" IWARP_PRELOAD_PORTS="$PORT" \
        timeout 60 iperf3 -c 127.0.0.1 -p "$PORT" -t "$SECS" -J >"$WORK/cli.json" 2>/dev/null
    wait "$s"
    python3 -c 'import json,sys; e = json.load(open(sys.argv[1]))["end"]; c = e["cpu_utilization_percent"]
print("%.2f Gbit/s %.1f %%CPU" % (e["sum_received"]["bits_per_second"] / 1e9, c["host_total"] + c["remote_total"]))' "$WORK/cli.json"
}

echo "iperf3 under the preload, design $DESIGN, ${SECS} s, $PAIRS pairs; old $OLD, new $NEW"
for i in $(seq 1 "$PAIRS"); do
    if ((i % 2)); then o="$(one "$OLD")"; n="$(one "$NEW")"; else n="$(one "$NEW")"; o="$(one "$OLD")"; fi
    echo "pair $i: old $o; new $n; load $(cut -d' ' -f1 /proc/loadavg)"
done
