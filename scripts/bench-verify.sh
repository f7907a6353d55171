#!/usr/bin/env bash
# Verified file-to-file transfers: rftp get/put of a 2 GiB file (tmpfs to
# tmpfs, loopback) with its checksum on (SHA-256 by default, CRC32C) and
# off, against globus-url-copy -fast -p 8 in the same run.
#
#   scripts/bench-verify.sh               5 interleaved pairs per row
#   PAIRS=3 SIZE_MIB=1024 scripts/bench-verify.sh
#
# Prints one line per run and a summary: median wall time per row and the
# median over pairs of (GridFTP time / rftp time), i.e. rftp's throughput
# as a multiple of GridFTP's. Installs GridFTP (Debian packages) if
# missing; needs a release build (cargo build --release -p rftp).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/target/release"
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

echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; SHA-NI: $(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no), AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"
echo "== ${SIZE_MIB} MiB tmpfs to tmpfs over loopback, $PAIRS interleaved pairs"
for i in $(seq 1 "$PAIRS"); do
    timed "get-rftp-sha256 $i" "$BIN/rftp" get -q --no-resume "$R/src/file.bin" -o "$TMP/dst/file.bin"
    timed "get-gridftp $i" globus-url-copy -fast -p 8 "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin"
    timed "put-rftp-sha256 $i" "$BIN/rftp" put -q "$TMP/src/file.bin" "$R/dst/up.bin"
    timed "put-gridftp $i" globus-url-copy -fast -p 8 "file://$TMP/src/file.bin" "$G$TMP/dst/up.bin"
done
for i in 1 2 3; do
    timed "get-rftp-crc32c $i" "$BIN/rftp" get -q --no-resume --checksum crc32c "$R/src/file.bin" -o "$TMP/dst/file.bin"
    timed "get-rftp-noverify $i" "$BIN/rftp" get -q --no-resume --no-verify "$R/src/file.bin" -o "$TMP/dst/file.bin"
    timed "put-rftp-crc32c $i" "$BIN/rftp" put -q --checksum crc32c "$TMP/src/file.bin" "$R/dst/up.bin"
    timed "put-rftp-noverify $i" "$BIN/rftp" put -q --no-verify "$TMP/src/file.bin" "$R/dst/up.bin"
done
python3 - "$TMP/times" "$SIZE_MIB" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, i, t = line.split()
    rows.setdefault(name, {})[int(i)] = float(t)
mib = int(sys.argv[2])
print("== summary (median wall time, MiB/s)")
for name, runs in rows.items():
    m = statistics.median(runs.values())
    print(f"   {name:20s} {m:7.2f} s  {mib / m:8.0f} MiB/s  (n={len(runs)})")
for d in ("get", "put"):
    g, r = rows[f"{d}-gridftp"], rows[f"{d}-rftp-sha256"]
    ratios = [g[i] / r[i] for i in sorted(r) if i in g]
    print(f"   {d}: rftp (SHA-256 verified) / globus-url-copy -fast -p 8 throughput: median "
          f"{statistics.median(ratios):.2f}x (pairs: {' '.join(f'{x:.2f}' for x in ratios)})")
PY
