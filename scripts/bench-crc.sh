#!/usr/bin/env bash
# RDMA Write with CRC against raw TCP, per CRC32C back end (issue 11).
#
#   scripts/bench-crc.sh                 # every back end this CPU has
#   PATHS="avx512 avx2" PAIRS=5 scripts/bench-crc.sh
#
# For each back end (IWARP_CRC=avx512|avx2|sse42|soft, see
# crates/iwarp-proto/src/wire/crc.rs) runs PAIRS (default 5) back-to-back
#   iwarp-perf --loopback --compare write_bw -s SIZE --crc on -D SECS
# pairs (iWARP then TCP, SIZE default 1048576, SECS default 2), and PAIRS
# pairs with --crc off as the reference (round-robin over the paths), and
# prints per path the median
# iWARP/TCP bandwidth ratio, its range, and the median CPU seconds per GB
# of each side. Then the per-back-end microbenchmark
# (crates/iwarp-proto/examples/crc_bench.rs): GB/s at 64 B .. 1 MiB.
# Prints the CPU model, its CRC-related flags and the load average before
# and after (the machine should be quiet: load below 1).
# Environment: PATHS, PAIRS, SIZE, SECS, NO_BUILD=1 (use the binaries in
# target/release as they are), OUT (also write the raw JSON lines there).
# Needs jq.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

PATHS="${PATHS:-avx512 avx2 sse42 soft}"
PAIRS="${PAIRS:-5}"
SIZE="${SIZE:-1048576}"
SECS="${SECS:-2}"
OUT="${OUT:-}"
PERF=target/release/iwarp-perf
MICRO=target/release/examples/crc_bench

command -v jq >/dev/null || { echo "bench-crc.sh: needs jq" >&2; exit 1; }

if [[ "${NO_BUILD:-0}" != 1 ]]; then
    timeout 1800 cargo build --release -q -p iwarp-perf
    timeout 1800 cargo build --release -q -p iwarp-proto --example crc_bench
fi

if [[ -n "$OUT" ]]; then
    mkdir -p "$OUT"
    : >"$OUT/bench-crc.jsonl"
fi

# Median and range of the numbers on stdin, one per line.
stats() {
    sort -g | awk '{ v[NR] = $1 }
        END {
            if (NR == 0) { print "n/a"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.3f (%.3f-%.3f)", m, v[1], v[NR]
        }'
}

median() {
    sort -g | awk '{ v[NR] = $1 }
        END {
            if (NR == 0) { print "n/a"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.3f", m
        }'
}

declare -A RATIOS BW IW_CPU TCP_CPU IMPL

# one_pair LABEL IWARP_CRC CRC: one iWARP/TCP pair, added to LABEL's lists.
one_pair() {
    local label="$1" path="$2" crc="$3" line
    if ! line="$(IWARP_CRC="$path" timeout $((SECS * 4 + 60)) "$PERF" --loopback --compare \
        write_bw -s "$SIZE" --crc "$crc" -D "$SECS" --json)"; then
        echo "bench-crc.sh: $label pair failed" >&2
        return 1
    fi
    if [[ -n "$OUT" ]]; then
        jq -c --arg p "$label" '. + {iwarp_crc: $p}' <<<"$line" >>"$OUT/bench-crc.jsonl"
    fi
    RATIOS[$label]+="$(jq -r '.ratio.bw' <<<"$line")"$'\n'
    BW[$label]+="$(jq -r '.iwarp.bw_mb_s / 1000' <<<"$line")"$'\n'
    # CPU seconds per GB moved (10^9 bytes).
    IW_CPU[$label]+="$(jq -r '.iwarp.cpu_s / (.iwarp.bw_mb_s * .iwarp.elapsed_s / 1000)' <<<"$line")"$'\n'
    TCP_CPU[$label]+="$(jq -r '.tcp.cpu_s / (.tcp.bw_mb_s * .tcp.elapsed_s / 1000)' <<<"$line")"$'\n'
    IMPL[$label]="$(jq -r '.crc_impl // "none"' <<<"$line")"
}

row() {
    local label="$1"
    printf '| %-10s | %-18s | %-24s | %10s | %10s | %10s |\n' "$label" "${IMPL[$label]}" \
        "$(printf '%s' "${RATIOS[$label]}" | stats)" "$(printf '%s' "${BW[$label]}" | median)" \
        "$(printf '%s' "${IW_CPU[$label]}" | median)" "$(printf '%s' "${TCP_CPU[$label]}" | median)"
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "CRC-related flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
    grep -xE 'sse4_2|pclmulqdq|avx2|avx512f|avx512vl|vpclmulqdq|sha_ni' | tr '\n' ' ')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: IWARP_CRC=PATH $PERF --loopback --compare write_bw -s $SIZE --crc on|off -D $SECS --json, $PAIRS pairs each"
echo
run=()
for p in $PATHS; do
    # Without a test iwarp-perf stops at once, after refusing a back end
    # this CPU lacks (the message names IWARP_CRC).
    why="$(IWARP_CRC="$p" "$PERF" 2>&1 || true)"
    if grep -q IWARP_CRC <<<"$why"; then
        echo "skipped $p: $(grep -m1 IWARP_CRC <<<"$why")"
        continue
    fi
    run+=("$p")
done
# Round-robin: pair k of every path, then pair k+1, so that the machine's
# drift spreads over all paths alike.
for ((k = 0; k < PAIRS; k++)); do
    for p in "${run[@]}"; do
        one_pair "$p" "$p" on
    done
    one_pair "crc off" auto off
    echo "round $((k + 1))/$PAIRS done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
printf '| %-10s | %-18s | %-24s | %10s | %10s | %10s |\n' "IWARP_CRC" "crc_impl" \
    "iWARP/TCP median (range)" "iWARP GB/s" "iWARP s/GB" "TCP s/GB"
echo "|------------|--------------------|--------------------------|------------|------------|------------|"
for p in "${run[@]}" "crc off"; do
    row "$p"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Microbenchmark (one thread, data in cache, odd start address):"
"$MICRO"
