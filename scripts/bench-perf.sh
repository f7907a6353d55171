#!/usr/bin/env bash
# Benchmarks of the software iWARP stack against a raw-TCP baseline, both in
# one process over 127.0.0.1 (`iwarp-perf --loopback --compare`), with the
# JSON results and plots written to docs/bench/ (see docs/BENCHMARKS.md).
#
#   scripts/bench-perf.sh              all figures (about 5 minutes)
#   BENCH_QUICK=1 scripts/bench-perf.sh  one repetition, shorter sweeps
#
# Environment: BENCH_OUT (default docs/bench), BENCH_REPEAT (runs per point,
# default 3; the summary uses the median), BENCH_SWEEP_SECS (seconds per
# sweep point, default 0.5), BENCH_BW_SECS (seconds per bandwidth run,
# default 2), PYTHON (interpreter with matplotlib; installed
# with apt `python3-matplotlib` or pip when missing).
#
# The machine should be otherwise idle: with 2 cores, a concurrent build
# halves every number. The script prints the load average before it starts.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${BENCH_OUT:-$ROOT/docs/bench}"
REPEAT="${BENCH_REPEAT:-3}"
SWEEP_SECS="${BENCH_SWEEP_SECS:-0.5}"
BW_SECS="${BENCH_BW_SECS:-2}"
if [[ -n "${BENCH_QUICK:-}" ]]; then
    REPEAT=1
    SWEEP_SECS=0.2
    BW_SECS=0.5
fi
cd "$ROOT"
mkdir -p "$OUT"

echo "== building iwarp-perf (release)"
cargo build --release -p iwarp-perf
BIN="$ROOT/target/release/iwarp-perf"

echo "== machine: $(nproc) cores, $(uname -r), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if awk '{ exit !($1 > 0.7) }' /proc/loadavg; then
    echo "warning: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy" >&2
fi

# run NAME ARGS...: REPEAT runs, one JSON line each, into $OUT/NAME.json.
run() {
    local name="$1"
    shift
    echo "+ iwarp-perf $* --json   (x$REPEAT) -> $name.json"
    : >"$OUT/$name.json"
    for _ in $(seq "$REPEAT"); do
        "$BIN" "$@" --json >>"$OUT/$name.json"
    done
}

echo "== bandwidth (CRC on, event mode, depth 128)"
run write_bw_1m write_bw --loopback --compare -s 1048576 -D "$BW_SECS"
run write_bw_64k write_bw --loopback --compare -s 65536 -D "$BW_SECS"
run read_bw_1m read_bw --loopback --compare -s 1048576 -D "$BW_SECS"
run read_bw_64k read_bw --loopback --compare -s 65536 -D "$BW_SECS"
run send_bw_1m send_bw --loopback --compare -s 1048576 -D "$BW_SECS"
run send_bw_64k send_bw --loopback --compare -s 65536 -D "$BW_SECS"
run write_bw_1m_crc_off write_bw --loopback --compare -s 1048576 --crc off -D "$BW_SECS"

echo "== latency (8-byte ping-pong)"
run write_lat_8 write_lat --loopback --compare -s 8 -n 20000
run send_lat_8 send_lat --loopback --compare -s 8 -n 20000
run read_lat_8 read_lat --loopback --compare -s 8 -n 20000
run write_lat_8_busy write_lat --loopback --compare -s 8 -n 20000 --busy-poll
run send_lat_8_busy send_lat --loopback --compare -s 8 -n 20000 --busy-poll

echo "== 64-byte message rate at depth 64"
run msgrate_64 write_bw --loopback --compare -s 64 -t 64 -D "$BW_SECS"

echo "== memory: 1 MiB write_bw at depth 16"
run rss_write_1m_d16 write_bw --loopback --compare -s 1048576 -t 16 -D "$BW_SECS"

echo "== size sweeps (2 B .. 8 MiB, ${SWEEP_SECS} s per point)"
"$BIN" write_bw --loopback --compare -a -D "$SWEEP_SECS" --crc on --json >"$OUT/sweep_write_bw_crc_on.json"
"$BIN" write_bw --loopback -a -D "$SWEEP_SECS" --crc off --json >"$OUT/sweep_write_bw_crc_off.json"
"$BIN" write_lat --loopback --compare -a -D "$SWEEP_SECS" --crc on --json >"$OUT/sweep_write_lat_crc_on.json"
"$BIN" write_lat --loopback -a -D "$SWEEP_SECS" --crc off --json >"$OUT/sweep_write_lat_crc_off.json"

echo "== plots and summary"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    for cand in python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null && "$cand" -c 'import matplotlib' 2>/dev/null; then
            PY="$cand"
            break
        fi
    done
fi
if [[ -z "$PY" ]]; then
    echo "matplotlib missing: installing python3-matplotlib (apt), else pip"
    if command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib) >/dev/null || true
    fi
    if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
        PY=/usr/bin/python3
    else
        python3 -m pip install --quiet matplotlib
        PY=python3
    fi
fi
"$PY" "$ROOT/scripts/plot_perf.py" "$OUT"
echo "== done: $OUT"
