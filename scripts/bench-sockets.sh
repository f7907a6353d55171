#!/usr/bin/env bash
# Sockets over iWARP benchmarks (issue 12): iperf3 through the preload shim
# (enhanced, basic) against kernel TCP with CPU seconds per GB, 64-byte
# busy-polled ping-pong, coalescing of small writes, and the size sweep
# with its plot. Every figure is a ratio against kernel TCP measured in the
# same run, median of PAIRS pairs (default 5). Results in
# docs/bench/sockets/ (summary.md, raw.jsonl, sweep.png).
#
#   scripts/bench-sockets.sh [PAIRS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
command -v iperf3 >/dev/null || apt-get install -y -q --no-install-recommends iperf3
# Debian's python3 has Debian's matplotlib; another python3 first on PATH
# may not.
PY=python3
for cand in python3 /usr/bin/python3; do
    if "$cand" -c 'import matplotlib' 2>/dev/null; then PY="$cand"; break; fi
done
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    apt-get install -y -q --no-install-recommends python3-matplotlib
    PY=/usr/bin/python3
fi
cargo build --release -p iwarp-rstream -p iwarp-preload
exec "$PY" scripts/bench_sockets.py "${1:-5}"
