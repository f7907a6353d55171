#!/usr/bin/env bash
# Verified file-to-file transfers: rftp get/put of a 2 GiB file (tmpfs to
# tmpfs, loopback) with its default checksum (negotiated: XXH3-128 against
# our rftpd), with BLAKE3, SHA-256 and CRC32C, and with --no-verify, against
# globus-url-copy -fast -p 8 with and without -verify-checksum in the same
# run (issue 29's targets: see the summary lines).
#
#   scripts/bench-verify.sh               5 interleaved pairs per row
#   PAIRS=3 ALGO_RUNS=1 SIZE_MIB=1024 scripts/bench-verify.sh
#   BENCH_BIN=DIR scripts/bench-verify.sh  rftp and rftpd from DIR
#
# Prints one line per run and a summary: median wall time per row and the
# median over pairs of (GridFTP time / rftp time), i.e. rftp's throughput
# as a multiple of GridFTP's, and the cost of verification (default
# against --no-verify, per pair). Installs GridFTP (Debian packages) if
# missing; needs a release build (cargo build --release -p rftp).
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BENCH_BIN:-$ROOT/target/release}"
PAIRS="${PAIRS:-5}"
SIZE_MIB="${SIZE_MIB:-2048}"

missing=()
command -v globus-gridftp-server >/dev/null 2>&1 || missing+=(globus-gridftp-server-progs)
command -v globus-url-copy >/dev/null 2>&1 || missing+=(globus-gass-copy-progs)
if ((${#missing[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if [ ! -x "$BIN/rftp" ] || [ ! -x "$BIN/rftpd" ]; then (cd "$ROOT" && cargo build --release -p rftp); fi

TMP=$(mktemp -d /dev/shm/bench-verify.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

mkdir -p "$TMP/src" "$TMP/dst"
chmod 777 "$TMP" "$TMP/src" "$TMP/dst"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$TMP/src/file.bin"
chmod 644 "$TMP/src/file.bin"
rport=$(free_port)
gport=$(free_port)
cat >"$TMP/rftpd.toml" <<CONF
listen = "127.0.0.1:$rport"
root = "$TMP"
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
CONF
RUST_LOG=warn "$BIN/rftpd" -c "$TMP/rftpd.toml" >"$TMP/rftpd.log" 2>&1 &
PIDS+=($!)
globus-gridftp-server -aa -anonymous-user nobody -p "$gport" -control-interface 127.0.0.1 \
    -data-interface 127.0.0.1 -d error >"$TMP/gftp.log" 2>&1 &
PIDS+=($!)
sleep 1
R="ftp://bench:bench@127.0.0.1:$rport"
G="ftp://127.0.0.1:$gport"

# timed LABEL CMD...: run CMD, print "LABEL seconds", keep it in $TMP/times.
timed() {
    local label="$1" t0 t1
    shift
    rm -f "$TMP/dst/"*
    sync
    t0=$(date +%s.%N)
    "$@" >"$TMP/last.log" 2>&1 || { echo "FAILED: $label"; cat "$TMP/last.log"; exit 1; }
    t1=$(date +%s.%N)
    echo "$label $(echo "$t1 - $t0" | bc)" | tee -a "$TMP/times"
}

echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; SHA-NI: $(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no), AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ${SIZE_MIB} MiB tmpfs to tmpfs over loopback, $PAIRS interleaved pairs"
# The default row names the algorithm rftp chose (its final message).
timed "get-rftp-default 0" "$BIN/rftp" get --no-resume "$R/src/file.bin" -o "$TMP/dst/file.bin"
echo "   (rftp get's own words: $(grep -o 'rftp: [^ ]* verified' "$TMP/last.log" | head -1))"
for i in $(seq 1 "$PAIRS"); do
    timed "get-rftp-default $i" "$BIN/rftp" get -q --no-resume "$R/src/file.bin" -o "$TMP/dst/file.bin"
    timed "get-gridftp $i" globus-url-copy -fast -p 8 "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin"
    timed "get-rftp-noverify $i" "$BIN/rftp" get -q --no-resume --no-verify "$R/src/file.bin" -o "$TMP/dst/file.bin"
    timed "get-gridftp-verify $i" globus-url-copy -fast -p 8 -verify-checksum "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin"
    timed "put-rftp-default $i" "$BIN/rftp" put -q "$TMP/src/file.bin" "$R/dst/up.bin"
    timed "put-gridftp $i" globus-url-copy -fast -p 8 "file://$TMP/src/file.bin" "$G$TMP/dst/up.bin"
done
for i in $(seq 1 "${ALGO_RUNS:-3}"); do
    for a in blake3 sha256 crc32c; do
        timed "get-rftp-$a $i" "$BIN/rftp" get -q --no-resume --checksum "$a" "$R/src/file.bin" -o "$TMP/dst/file.bin"
    done
    timed "put-rftp-noverify $i" "$BIN/rftp" put -q --no-verify "$TMP/src/file.bin" "$R/dst/up.bin"
done
python3 - "$TMP/times" "$SIZE_MIB" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, i, t = line.split()
    if int(i) > 0:  # run 0 is the warm-up that prints rftp's message
        rows.setdefault(name, {})[int(i)] = float(t)
mib = int(sys.argv[2])
print("== summary (median wall time, MiB/s)")
for name, runs in rows.items():
    m = statistics.median(runs.values())
    print(f"   {name:22s} {m:7.2f} s  {mib / m:8.0f} MiB/s  (n={len(runs)})")

def per_pair(num, den):
    a, b = rows[num], rows[den]
    r = [a[i] / b[i] for i in sorted(b) if i in a]
    return statistics.median(r), " ".join(f"{x:.2f}" for x in r)

# Issue 29's targets: default verified get >= 2x globus-url-copy -fast -p 8
# (unverified) and >= 5x with -verify-checksum; verification <= 10 % over
# --no-verify.
for label, num, den, target in (
    ("get: rftp default / GridFTP -fast -p 8 (throughput)", "get-gridftp", "get-rftp-default", ">= 2"),
    ("get: rftp default / GridFTP -p 8 -verify-checksum", "get-gridftp-verify", "get-rftp-default", ">= 5"),
    ("put: rftp default / GridFTP -fast -p 8", "put-gridftp", "put-rftp-default", "(no target)"),
    ("get: default time / --no-verify time", "get-rftp-default", "get-rftp-noverify", "<= 1.10"),
):
    m, pairs = per_pair(num, den)
    print(f"   {label}: median {m:.2f}x, target {target} (pairs: {pairs})")
PY
