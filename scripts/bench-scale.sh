#!/usr/bin/env bash
# Many connections in one process pair, per progress engine (issue 29,
# item 2): for each connection count, `iwarp-perf --loopback --compare
# write_bw` (RDMA Write of SIZE bytes against kernel TCP with the same
# connection count) and an 8-byte busy-polled Write ping-pong, once with
# the per-connection threads (IWARP_PROGRESS=threads) and once with the
# progress pool (IWARP_PROGRESS=pool), PAIRS times interleaved; prints a
# Markdown table of the medians: aggregate Gbit/s, the ratio to TCP, the
# process's threads (peak, from iwarp-perf), threads and peak RSS per
# connection, CPU-seconds per GB of both transports (process CPU from
# getrusage over the bytes moved), and the ping-pong's median microseconds.
#
#   scripts/bench-scale.sh                      # QPS="1 16 256 1000"
#   QPS="1 16" PAIRS=1 DURATION=1 scripts/bench-scale.sh   # quick look
#   IWARP_PERF=path/to/iwarp-perf scripts/bench-scale.sh
#
# Settings (environment): QPS (connection counts), SIZE (Write size,
# default 65536), DURATION (seconds per run, default 2), PAIRS (runs per
# engine and count, default 3), ENGINES (default "threads pool"; a name
# may carry a label, "threads@aa", to run an engine twice per pair for an
# A/A band), IWARP_PERF (default target/release/iwarp-perf, built if
# missing), IWARP_PROGRESS_THREADS (pool size, passed through), PRIO
# (default -15: every run in a session of its own whose autogroup nice and
# process nice are PRIO; "" runs as started).
#
# Why a session of its own: with autogroup scheduling
# (/proc/sys/kernel/sched_autogroup_enabled = 1, the default of most
# distributions) the CPU is shared between sessions first, and `nice`
# ranks threads only within their own session, so `nice -n -15` alone
# gives a benchmark no more CPU than any other session's build. A pool of
# a few threads then ran at the share of one session and looked idle
# (issue 29 item 2, docs/BENCHMARKS.md). The autogroup's nice needs root
# (or CAP_SYS_NICE); without it the script says so and runs unboosted.
#
# Both ends run in one process (--loopback), so "threads" and "RSS" cover
# both ends of every connection: per connection means per pair of QPs.
# Timing figures on a machine that is also building or testing are noisy:
# say so next to them, and compare engines only within one run.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
QPS="${QPS:-1 16 256 1000}"
SIZE="${SIZE:-65536}"
DURATION="${DURATION:-2}"
PAIRS="${PAIRS:-3}"
ENGINES="${ENGINES:-threads pool}"
PERF="${IWARP_PERF:-$here/target/release/iwarp-perf}"

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
if [[ ! -x "$PERF" ]]; then
    echo "building iwarp-perf (cargo build --release -p iwarp-perf)" >&2
    (cd "$here" && cargo build --release -p iwarp-perf >&2)
fi
# 1,000 connections per side need about 2,000 sockets plus the TCP
# baseline's: ask for the hard limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

PRIO="${PRIO--15}"
# Runs "$@" in a session (and so an autogroup) of its own at nice $PRIO.
boost() {
    if [[ -z "$PRIO" ]]; then
        "$@"
    else
        # shellcheck disable=SC2016 # $0 and $@ expand in the inner bash
        setsid bash -c 'echo "$0" >/proc/self/autogroup 2>/dev/null && exec nice -n "$0" "$@"
            echo "bench-scale: cannot set the autogroup nice ($0); running unboosted" >&2
            exec "$@"' "$PRIO" "$@"
    fi
}

# One bandwidth run; appends a JSON line to $tmp/$engine.$q.bw.
run() {
    local engine="$1" q="$2"
    IWARP_PROGRESS="${engine%@*}" boost timeout 300 "$PERF" --loopback --compare write_bw \
        -q "$q" -s "$SIZE" -D "$DURATION" --json 2>/dev/null | tail -n 1 \
        >>"$tmp/$engine.$q.bw" ||
        echo "bench-scale: write_bw -q $q with $engine failed" >&2
}

# One 8-byte busy-polled Write ping-pong against TCP; appends to
# $tmp/$engine.lat.
lat() {
    local engine="$1"
    IWARP_PROGRESS="${engine%@*}" boost timeout 300 "$PERF" --loopback --compare write_lat --busy-poll \
        -s 8 -n 20000 --json 2>/dev/null | tail -n 1 >>"$tmp/$engine.lat" ||
        echo "bench-scale: write_lat with $engine failed" >&2
}

for ((p = 0; p < PAIRS; p++)); do
    for q in $QPS; do
        # Alternate which engine goes first, so a drift of the machine
        # does not always favour the same one.
        if ((p % 2 == 0)); then order="$ENGINES"; else order="$(echo "$ENGINES" | tr ' ' '\n' | tac | tr '\n' ' ')"; fi
        for engine in $order; do
            run "$engine" "$q"
        done
    done
    for engine in $order; do
        lat "$engine"
    done
done

python3 - "$tmp" "$QPS" "$ENGINES" "$SIZE" "$PAIRS" <<'EOF'
import json, os, statistics, sys
tmp, qps, engines, size, pairs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4], sys.argv[5]

def load(path):
    out = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def f(x, spec):
    return "n/a" if x is None else format(x, spec)

print(f"RDMA Write {size} B, --loopback (both ends in one process), median of {pairs} runs per cell")
print()
base = engines[0]
print(f"| conns | engine | iWARP Gbit/s | TCP Gbit/s | iWARP/TCP | / {base} (range) | CPU s | iWARP CPU-s/GB | TCP CPU-s/GB | threads | threads/conn | peak RSS MiB | RSS KiB/conn |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

def per_gb(r):
    # CPU-seconds per GB moved (getrusage over the bytes counted): the
    # figure a loaded machine disturbs least; on C busy cores a transport
    # cannot pass C / (CPU-s per GB) GB/s.
    if not r or not r.get("cpu_s") or not r.get("iters"):
        return None
    return r["cpu_s"] / (r["iters"] * r["size"] / 1e9)
for q in qps:
    for e in engines:
        bw = load(f"{tmp}/{e}.{q}.bw")
        iw = [r["iwarp"] for r in bw if "iwarp" in r]
        tc = [r["tcp"] for r in bw if "tcp" in r]
        ratio = med([r["ratio"]["bw"] for r in bw if "ratio" in r])
        thr = med([r.get("threads") for r in iw])
        rss = med([r.get("peak_rss_kib") for r in iw])
        n = int(q)
        # Pair k of this engine against pair k of the first engine.
        b = [r["iwarp"]["bw_gbit_s"] if "iwarp" in r else None for r in load(f"{tmp}/{base}.{q}.bw")]
        mine = [r["iwarp"]["bw_gbit_s"] if "iwarp" in r else None for r in bw]
        pr = [m / x for m, x in zip(mine, b) if m and x]
        vs = "n/a" if not pr else f"{statistics.median(pr):.2f} ({min(pr):.2f}-{max(pr):.2f})"
        cpu = med([r.get("cpu_s") for r in iw])
        print(f"| {q} | {e} | {f(med([r['bw_gbit_s'] for r in iw]), '.2f')} | "
              f"{f(med([r['bw_gbit_s'] for r in tc]), '.2f')} | {f(ratio, '.2f')} | {vs} | "
              f"{f(cpu, '.2f')} | "
              f"{f(med([per_gb(r) for r in iw]), '.3f')} | {f(med([per_gb(r) for r in tc]), '.3f')} | "
              f"{f(thr, '.0f')} | {f(None if thr is None else thr / n, '.3f')} | "
              f"{f(None if rss is None else rss / 1024, '.1f')} | "
              f"{f(None if rss is None else rss / n, '.0f')} |")
print()
print("8-byte busy-polled RDMA Write ping-pong (one connection), median of the runs' medians")
print()
print("| engine | iWARP us | TCP us | iWARP/TCP |")
print("|---|---|---|---|")
for e in engines:
    lat = load(f"{tmp}/{e}.lat")
    iw = med([r["iwarp"]["t_median_us"] for r in lat if "iwarp" in r])
    tc = med([r["tcp"]["t_median_us"] for r in lat if "tcp" in r])
    ratio = None if iw is None or not tc else iw / tc
    print(f"| {e} | {f(iw, '.2f')} | {f(tc, '.2f')} | {f(ratio, '.2f')} |")
EOF
