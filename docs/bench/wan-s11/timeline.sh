#!/usr/bin/env bash
# timeline.sh BIN SIZE OUTDIR [rftp args]: one `rftp get` through wanem (RTT=ms, default 50;
# 1 Gbit/s, BDP queue), tcpdump on wan0 in namespace a (OUTDIR/cap.pcap), both ends' debug logs
# with timestamps (OUTDIR/rftp.log, rftpd.log), the client's wall time (OUTDIR/wall.txt). BIN is a
# directory holding rftp and rftpd. Then events.sh OUTDIR prints the milestones in ms and RTTs.
# Session 11: RTT=200 docs/bench/wan-s11/timeline.sh /tmp/new 20M /tmp/tl/N1. Needs root.
set -euo pipefail
BIN="$1"; SIZE="$2"; OUT="$3"; shift 3
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"; cd "$ROOT"
export WANEM="${WANEM:-$ROOT/target/release/wanem}"
. scripts/lib/wan.sh
TAG="wtl$$"; TMP="$(mktemp -d -p /dev/shm)"; chmod 755 "$TMP"
trap 'wan_down "$TAG"; rm -rf "$TMP"' EXIT
WAN_LOG_DIR="$TMP" wan_up "$TAG" --rtt ${RTT:-50}ms --rate 1gbit --queue bdp --subnet 48 >/dev/null
B="$(wan_addr_b)"
mkdir -p "$TMP/data" "$OUT"; head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom >"$TMP/data/m.bin"
cat >"$TMP/rftpd.toml" <<E2
root = "$TMP/data"
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
write = true
E2
wan_b env RUST_LOG=rftp=debug,rdma_xfer=debug "$BIN/rftpd" -c "$TMP/rftpd.toml" --listen "$B:24021" >"$OUT/rftpd.log" 2>&1 &
sleep 0.5
wan_a tcpdump -i wan0 -s 128 -w "$OUT/cap.pcap" >/dev/null 2>&1 &
TP=$!
sleep 0.5
t0=$(date +%s.%N)
wan_a env RUST_LOG=rftp=debug,rdma_xfer=debug "$BIN/rftp" get "ftp://bench:bench@$B:24021/m.bin" -o "$TMP/dl.bin" --no-resume -q "$@" >"$OUT/rftp.log" 2>&1
t1=$(date +%s.%N)
echo "wall $(echo "$t1 - $t0" | bc) s  load $(cut -d' ' -f1 /proc/loadavg)" | tee "$OUT/wall.txt"
sleep 1
kill $TP; wait $TP 2>/dev/null || true
