#!/usr/bin/env bash
# iwarp-perf on the rdma-core provider against perftest, on Linux siw
# (siw0) in the QEMU guest of scripts/guest, same device, same
# guest, same run:
#
#   write_bw at 64 KiB, 256 KiB and 1 MiB, and read_lat at 2 bytes
#   (perftest's default), each with four pairs (server/client):
#     pt/pt      ib_* -R on both ends, perftest's defaults (the baseline)
#     pt/iw      iwarp-perf --perftest client against the same perftest
#                server (only the measuring client differs)
#     pt/iwbusy  the same with iwarp-perf --busy-poll (polls like perftest)
#     iw/iw      iwarp-perf --perftest on both ends
#   (perftest's -e, sleeping on CQ events like iwarp-perf's default, is
#   refused by ib_write_bw: "Events feature not available on WRITE verb".)
#
# PAIRS rounds (default 5); within a round the two run back to back, and
# the order alternates between rounds. Reported: per size the median of
# the per-round ratios (iwarp-perf / perftest; bandwidth: higher is
# better, latency: lower is better) and the medians of the values. The
# guest is TCG-emulated: only the ratios mean something.
#
# Output: a Markdown table on stdout and, with OUT=DIR, DIR/raw.txt (every
# measurement) and DIR/table.md. Environment: NETNS/TAP/BRIDGE as for
# run.sh, SIW_WORK, PAIRS, BYTES (bytes per bandwidth run, default 64 MiB),
# LAT_ITERS (default 500), RAW_IN=FILE (no guest: re-make the table from an
# earlier raw.txt). Exits 77 ("SKIPPED: ...") where the guest cannot run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIW_VM="${GUEST_DIR:-$ROOT/scripts/guest}"
export WORK="${SIW_WORK:-/var/tmp/iwarp-guest}"
export NETNS="${NETNS:-siwvm}"
PAIRS="${PAIRS:-5}"
BYTES="${BYTES:-67108864}"
LAT_ITERS="${LAT_ITERS:-500}"
OUT="${OUT:-}"
BIN="$ROOT/target/release/iwarp-perf"
GUEST=10.77.0.2

note() { printf '[bench-rdmacore] %s\n' "$*" >&2; }
skip() {
    note "SKIPPED: $*"
    exit 77
}

[[ -x "$SIW_VM/run.sh" ]] || skip "no guest tooling at $SIW_VM (GUEST_DIR: unset it to use scripts/guest)"
((EUID == 0)) || skip "needs root for the guest's network namespace and tap device"
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun: QEMU cannot attach the guest's tap device here"

note "building iwarp-perf"
cargo build --release -q -p iwarp-perf
# scripts/guest/build.sh returns at once when its cached guest is current.
"$SIW_VM/build.sh" >&2
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed and build.sh did not install it"

SHARE_DIR="$(mktemp -d /tmp/bench-rdmacore-share.XXXXXX)"
cleanup() {
    rm -rf "$SHARE_DIR"
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
install -m755 "$BIN" "$SHARE_DIR/iwarp-perf"

cat >"$SHARE_DIR/guest.sh" <<GUEST_JOB
P=/mnt/host/iwarp-perf
echo "BENCH cpu \$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') (\$(nproc) vCPUs)"
echo "BENCH kernel \$(uname -r)"
ready() {
  i=0; while [ \$i -lt 300 ] && ! grep -q listening "\$1" 2>/dev/null; do sleep 0.1; i=\$((i+1)); done
}
# perftest's client result: BW average (bandwidth) or t_typical (latency).
pt_value() { awk '/#bytes/ {lat = (\$0 ~ /usec/); getline; if (\$1 ~ /^[0-9]+\$/) print (lat ? \$5 : \$4)}' "\$1" | head -1; }
port=19000
# run SERVER CLIENT TEST SIZE ITERS: SERVER pt (perftest), pte (perftest -e,
# sleeping on CQ events) or iw (iwarp-perf --perftest --server), CLIENT pt,
# pte, iw or iwbusy (iwarp-perf --busy-poll); sets V to the client's BW
# average (MB/s) or median/typical latency (us).
run() {
  port=\$((port + 1))
  ev=""
  [ \$1 != pte ] || ev=-e
  if [ \$1 = pt ] || [ \$1 = pte ]; then
    timeout 120 ib_\$3 -R -d siw0 -p \$port -s \$4 -n \$5 \$ev > /tmp/s.log 2>&1 &
    spid=\$!
    sleep 2
  else
    timeout 120 \$P --perftest --server \$3 -d siw0 -p \$port -s \$4 --idle-timeout 100 --timeout 30 > /tmp/s.log 2>&1 &
    spid=\$!
    ready /tmp/s.log
  fi
  V=0
  try=1
  while [ \$try -le 5 ]; do
    case \$2 in
      pt) timeout 120 ib_\$3 -R -d siw0 -p \$port -s \$4 -n \$5 $GUEST > /tmp/c.log 2>&1 ;;
      pte) timeout 120 ib_\$3 -R -d siw0 -p \$port -s \$4 -n \$5 -e $GUEST > /tmp/c.log 2>&1 ;;
      iw) timeout 120 \$P --perftest \$3 $GUEST -d siw0 -p \$port -s \$4 -n \$5 --timeout 30 --json > /tmp/c.log 2>&1 ;;
      iwbusy) timeout 120 \$P --perftest \$3 $GUEST -d siw0 -p \$port -s \$4 -n \$5 --timeout 30 --json --busy-poll > /tmp/c.log 2>&1 ;;
    esac
    crc=\$?
    # perftest's client fails at once when the server is not listening yet.
    if [ \$crc = 0 ] || ! grep -q 'rdma_connect failed' /tmp/c.log; then break; fi
    sleep 1
    try=\$((try + 1))
  done
  [ \$crc = 0 ] || echo "BENCH error \$1/\$2 \$3 \$4 client: \$(tail -3 /tmp/c.log | tr '\n' ' ')"
  wait \$spid || echo "BENCH error \$1/\$2 \$3 \$4 server: \$(tail -3 /tmp/s.log | tr '\n' ' ')"
  if [ \$2 = pt ] || [ \$2 = pte ]; then
    V=\$(pt_value /tmp/c.log)
  else
    V=\$(grep -o '"bw_mib_s":[0-9.]*' /tmp/c.log | cut -d: -f2)
    [ -n "\$V" ] || V=\$(grep -o '"lat_median_us":[0-9.]*' /tmp/c.log | cut -d: -f2)
  fi
  V=\${V:-0}
}
# one round of one test: the three (or four) pairs in the given order
round() { # TEST SIZE ITERS ORDER(fwd|rev) PAIRS...
  t=\$1; s=\$2; n=\$3; o=\$4; shift 4
  list="\$*"
  [ \$o = fwd ] || list=\$(echo "\$list" | tr ' ' '\n' | sed -n '1!G;h;\$p' | tr '\n' ' ')
  line=""
  for pair in \$list; do
    run \${pair%%/*} \${pair##*/} \$t \$s \$n
    line="\$line \$pair=\$V"
  done
  echo "BENCH \$t \$r \$s\$line"
}
r=1
while [ \$r -le $PAIRS ]; do
  o=fwd; [ \$((r % 2)) = 1 ] || o=rev
  for s in 65536 262144 1048576; do
    round write_bw \$s \$(($BYTES / s)) \$o pt/pt pt/iw pt/iwbusy iw/iw
  done
  round read_lat 2 $LAT_ITERS \$o pt/pt pt/iw pt/iwbusy iw/iw
  r=\$((r + 1))
done
echo "BENCH done"
GUEST_JOB
chmod +x "$SHARE_DIR/guest.sh"

if [[ -n "${RAW_IN:-}" ]]; then
    # Re-make the table from an earlier run's raw lines (OUT/raw.txt or a
    # guest log).
    RAW="$(tr -d '\r' <"$RAW_IN" | grep -a '^BENCH ' || true)"
    GLOG=""
else
    GLOG="$(mktemp /tmp/bench-rdmacore-guest.XXXXXX)"
    note "booting the guest: $PAIRS rounds (log $GLOG)"
    SHARE="$SHARE_DIR" TIMEOUT=3000 "$SIW_VM/run.sh" </dev/null >"$GLOG" 2>&1 || true
    RAW="$(tr -d '\r' <"$GLOG" | grep -a '^BENCH ' || true)"
fi
grep -q '^BENCH done' <<<"$RAW" || {
    note "the guest did not finish (log ${GLOG:-$RAW_IN})"
    exit 1
}
# A failed run (nonzero exit, or no result line) is listed, counted in the
# table and left out of the medians; the script still fails if more than
# a quarter of the runs failed.
FAILED_RUNS="$(grep -c '^BENCH error .* client:' <<<"$RAW" || true)"
if ((FAILED_RUNS > 0)); then
    grep '^BENCH error' <<<"$RAW" | cut -c1-200 >&2
    note "$FAILED_RUNS runs failed (left out of the medians)"
fi

HOST_CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
HOST_FLAGS="$(grep -m1 '^flags' /proc/cpuinfo | grep -oE '\b(avx512f|avx2|sse4_2|aes|pclmulqdq)\b' | sort -u | tr '\n' ' ')"
RAWF="$SHARE_DIR/raw.txt"
printf '%s\n' "$RAW" >"$RAWF"
TABLE="$(
    python3 - "$PAIRS" "$HOST_CPU" "$HOST_FLAGS" "$RAWF" <<'PY'
import statistics, sys
pairs, host_cpu, host_flags = sys.argv[1], sys.argv[2], sys.argv[3]
with open(sys.argv[4]) as fh:
    raw = fh.read().splitlines()
guest_cpu = next((l[len("BENCH cpu "):] for l in raw if l.startswith("BENCH cpu ")), "?")
kernel = next((l[len("BENCH kernel "):] for l in raw if l.startswith("BENCH kernel ")), "?")
rows = {}
for l in raw:
    f = l.split()
    if len(f) < 5 or f[1] not in ("write_bw", "read_lat"):
        continue
    vals = {k: float(v) for k, v in (x.split("=", 1) for x in f[4:])}
    rows.setdefault((f[1], int(f[3])), []).append(vals)
med = statistics.median
def size(s):
    return f"{s // 1048576} MiB" if s >= 1048576 else (f"{s // 1024} KiB" if s >= 1024 else f"{s} B")
NAMES = {"pt/iw": "iwarp-perf client (event), perftest server", "pt/iwbusy": "iwarp-perf --busy-poll client, perftest server",
         "iw/iw": "iwarp-perf on both ends (event)", "pte/pte": "perftest -e on both ends (event)"}
print(f"Guest: Linux {kernel} under QEMU TCG (emulated, `-cpu max`), CPU \"{guest_cpu}\", siw0 on the guest's eth0; "
      f"host CPU {host_cpu} (flags: {host_flags.strip()}). {pairs} rounds, order reversed every other round. "
      "Baseline: perftest on both ends (pt/pt). Ratio = candidate / baseline of the same round; the median over rounds.")
print()
print("| test | size | perftest pair (median) | other pair | its median | ratio to perftest (median) | ratios min-max | rounds used | failed runs (perftest pair/other) |")
print("|---|---|---|---|---|---|---|---|---|")
for (test, s) in sorted(rows):
    allr = rows[(test, s)]
    rs = [r for r in allr if r.get("pt/pt", 0) > 0]
    base_fail = len(allr) - len(rs)
    unit = "MB/s" if test == "write_bw" else "µs"
    better = "" if test == "write_bw" else " (lower is better)"
    for cand in ("pt/iw", "pt/iwbusy", "iw/iw", "pte/pte"):
        ok = [r for r in rs if r.get(cand, 0) > 0]
        if not ok:
            continue
        ratios = [r[cand] / r["pt/pt"] for r in ok]
        fails = sum(1 for r in allr if r.get(cand, 0) <= 0)
        print(f"| {test} | {size(s)} | {med(r['pt/pt'] for r in ok):.1f} {unit} | {NAMES[cand]} | {med(r[cand] for r in ok):.1f} {unit} | "
              f"**{med(ratios):.3f}**{better} | {min(ratios):.3f}-{max(ratios):.3f} | {len(ok)} | {base_fail}/{fails} |")
PY
)"
printf '%s\n' "$TABLE"
if [[ -n "$OUT" ]]; then
    mkdir -p "$OUT"
    printf '%s\n' "$RAW" >"$OUT/raw.txt"
    printf '%s\n' "$TABLE" >"$OUT/table.md"
    note "wrote $OUT/raw.txt and $OUT/table.md"
fi
[[ -z "$GLOG" ]] || rm -f "$GLOG"
RUNS="$(grep -c '^BENCH \(write_bw\|read_lat\) ' <<<"$RAW" || true)"
# Each result line holds four runs: fail above a quarter of them.
if ((FAILED_RUNS > RUNS)); then
    note "more than a quarter of the runs failed"
    exit 1
fi
