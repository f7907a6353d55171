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
#   ROWS=verify scripts/bench-verify.sh    only the rftp get rows that
#                                          give the cost of verification
#   BENCH_BIN_B=DIR scripts/bench-verify.sh  also DIR's rftp and rftpd
#                                          (their own server), interleaved
#                                          in every pair: before/after
#
# Prints one line per run and a summary: median wall time per row and the
# median over pairs of (GridFTP time / rftp time), i.e. rftp's throughput
# as a multiple of GridFTP's, and the cost of verification (default
# against --no-verify, per pair) beside the A/A band (--no-verify against
# a second --no-verify run in the same pair). Every rftp run also gives
# CPU seconds, the client's (user + system, from bash's `time`) and the
# rftpd's (from /proc), which a loaded machine disturbs much less than
# the wall time. Installs GridFTP (Debian packages) if missing; needs a
# release build (cargo build --release -p rftp).
#
# PRIO (default -15): the whole run goes into a session of its own whose
# autogroup nice and process nice are PRIO (as scripts/bench-scale.sh
# does; with autogroup scheduling `nice` alone does not reach across
# sessions); "" runs as started. Needs root for a negative PRIO, else it
# says so and runs unboosted. Say the load average beside any figure.
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PRIO="${PRIO--15}"
# shellcheck source=scripts/lib/boost.sh
source "$ROOT/scripts/lib/boost.sh"
boost_self bench-verify "$@"
ROWS="${ROWS:-all}"
BIN_B="${BENCH_BIN_B:-}"
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
# start_rftpd BIN NAME: an rftpd from BIN on a free port; sets port_NAME
# and pid_NAME.
start_rftpd() {
    local port
    port=$(free_port)
    cat >"$TMP/rftpd-$2.toml" <<CONF
listen = "127.0.0.1:$port"
root = "$TMP"
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
CONF
    RUST_LOG=warn "$1/rftpd" -c "$TMP/rftpd-$2.toml" >"$TMP/rftpd-$2.log" 2>&1 &
    PIDS+=($!)
    printf -v "port_$2" %s "$port"
    printf -v "pid_$2" %s "$!"
}
# Set by start_rftpd (printf -v); pid_a and pid_b are read by name in rftp_timed.
port_a="" port_b=""
export pid_a="" pid_b=""
start_rftpd "$BIN" a
if [[ -n "$BIN_B" ]]; then start_rftpd "$BIN_B" b; fi
gport=$(free_port)
globus-gridftp-server -aa -anonymous-user nobody -p "$gport" -control-interface 127.0.0.1 \
    -data-interface 127.0.0.1 -d error >"$TMP/gftp.log" 2>&1 &
PIDS+=($!)
sleep 1
R="ftp://bench:bench@127.0.0.1:$port_a"
RB="ftp://bench:bench@127.0.0.1:${port_b:-0}"
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

TICK=$(getconf CLK_TCK)
# CPU seconds (user + system) of process $1 so far, all its threads.
proc_cpu() { awk -v t="$TICK" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }
# rftp_timed LABEL SERVER CMD...: `timed`, plus the client's CPU seconds
# (bash's `time`: the child's user + system) and the rftpd's (SERVER: a or
# b), kept in $TMP/cpu as "LABEL client server".
rftp_timed() {
    local label="$1" srv="$2" pid s0 s1 c
    shift 2
    pid="pid_$srv"
    pid="${!pid}"
    s0=$(proc_cpu "$pid")
    local TIMEFORMAT="%U %S"
    c=$( { time timed "$label" "$@" >"$TMP/timed.out"; } 2>&1)
    cat "$TMP/timed.out"
    if grep -q '^FAILED' "$TMP/timed.out"; then exit 1; fi
    s1=$(proc_cpu "$pid")
    read -r u sy <<<"$c"
    echo "$label $(echo "$u + $sy" | bc) $(echo "$s1 - $s0" | bc)" >>"$TMP/cpu"
}

echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; SHA-NI: $(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no), AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ${SIZE_MIB} MiB tmpfs to tmpfs over loopback, $PAIRS interleaved pairs, rows: $ROWS, PRIO ${PRIO:-none}${BIN_B:+, B: $BIN_B}"
# The default row names the algorithm rftp chose (its final message).
timed "get-rftp-default 0" "$BIN/rftp" get --no-resume "$R/src/file.bin" -o "$TMP/dst/file.bin"
echo "   (rftp get's own words: $(grep -o 'rftp: [^ ]* verified' "$TMP/last.log" | head -1))"
if [[ -n "$BIN_B" ]]; then
    timed "get-rftp-default-b 0" "$BIN_B/rftp" get --no-resume "$RB/src/file.bin" -o "$TMP/dst/file.bin"
    echo "   (B's own words: $(grep -o 'rftp: [^ ]* verified' "$TMP/last.log" | head -1))"
fi
get() { "$1/rftp" get -q --no-resume "${@:3}" "$2/src/file.bin" -o "$TMP/dst/file.bin"; }
for i in $(seq 1 "$PAIRS"); do
    rftp_timed "get-rftp-default $i" a get "$BIN" "$R"
    if [[ -n "$BIN_B" ]]; then rftp_timed "get-rftp-default-b $i" b get "$BIN_B" "$RB"; fi
    [[ "$ROWS" == verify ]] || timed "get-gridftp $i" globus-url-copy -fast -p 8 "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin"
    rftp_timed "get-rftp-noverify $i" a get "$BIN" "$R" --no-verify
    if [[ -n "$BIN_B" ]]; then rftp_timed "get-rftp-noverify-b $i" b get "$BIN_B" "$RB" --no-verify; fi
    [[ "$ROWS" == verify ]] || timed "get-gridftp-verify $i" globus-url-copy -fast -p 8 -verify-checksum "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin"
    # The A/A band of the verification cost: a second --no-verify run.
    rftp_timed "get-rftp-noverify-aa $i" a get "$BIN" "$R" --no-verify
    [[ "$ROWS" == verify ]] && continue
    rftp_timed "put-rftp-default $i" a "$BIN/rftp" put -q "$TMP/src/file.bin" "$R/dst/up.bin"
    timed "put-gridftp $i" globus-url-copy -fast -p 8 "file://$TMP/src/file.bin" "$G$TMP/dst/up.bin"
done
[[ "$ROWS" == verify ]] && ALGO_RUNS=0
for i in $(seq 1 "${ALGO_RUNS:-3}"); do
    for a in blake3 sha256 crc32c; do
        timed "get-rftp-$a $i" "$BIN/rftp" get -q --no-resume --checksum "$a" "$R/src/file.bin" -o "$TMP/dst/file.bin"
    done
    timed "put-rftp-noverify $i" "$BIN/rftp" put -q --no-verify "$TMP/src/file.bin" "$R/dst/up.bin"
done
python3 - "$TMP/times" "$SIZE_MIB" "$TMP/cpu" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, i, t = line.split()
    if int(i) > 0:  # run 0 is the warm-up that prints rftp's message
        rows.setdefault(name, {})[int(i)] = float(t)
cpu = {}
for line in open(sys.argv[3]):
    name, i, c, s = line.split()
    cpu.setdefault(name, {})[int(i)] = (float(c), float(s))
mib = int(sys.argv[2])
print(f"== summary (median wall time, MiB/s; rftp rows: median CPU seconds of the client and rftpd), load average now {open('/proc/loadavg').read().split()[0]}")
for name, runs in rows.items():
    m = statistics.median(runs.values())
    extra = ""
    if name in cpu:
        c = statistics.median(v[0] for v in cpu[name].values())
        s = statistics.median(v[1] for v in cpu[name].values())
        extra = f"  CPU s: client {c:.2f}, rftpd {s:.2f}, both {c + s:.2f}"
    print(f"   {name:22s} {m:7.2f} s  {mib / m:8.0f} MiB/s  (n={len(runs)}){extra}")

def per_pair(num, den, table=None, f=lambda v: v):
    t = table or rows
    if num not in t or den not in t:
        return None, ""
    a, b = t[num], t[den]
    r = [f(a[i]) / f(b[i]) for i in sorted(b) if i in a]
    return statistics.median(r), " ".join(f"{x:.2f}" for x in r)

# Issue 29's targets: default verified get >= 2x globus-url-copy -fast -p 8
# (unverified) and >= 5x with -verify-checksum; verification <= 10 % over
# --no-verify (beside the A/A band: --no-verify against --no-verify).
for label, num, den, target in (
    ("get: rftp default / GridFTP -fast -p 8 (throughput)", "get-gridftp", "get-rftp-default", ">= 2"),
    ("get: rftp default / GridFTP -p 8 -verify-checksum", "get-gridftp-verify", "get-rftp-default", ">= 5"),
    ("put: rftp default / GridFTP -fast -p 8", "put-gridftp", "put-rftp-default", "(no target)"),
    ("get: default time / --no-verify time", "get-rftp-default", "get-rftp-noverify", "<= 1.10"),
    ("get: A/A band, --no-verify / --no-verify", "get-rftp-noverify-aa", "get-rftp-noverify", "(1.00)"),
    ("B get: default time / --no-verify time", "get-rftp-default-b", "get-rftp-noverify-b", "<= 1.10"),
    ("get default: B time / A time", "get-rftp-default-b", "get-rftp-default", "(before/after)"),
):
    m, pairs = per_pair(num, den)
    if m is not None:
        print(f"   {label}: median {m:.2f}x, target {target} (pairs: {pairs})")
both = lambda v: v[0] + v[1]
for label, num, den in (
    ("get CPU (both ends): default / --no-verify", "get-rftp-default", "get-rftp-noverify"),
    ("get CPU (both ends): A/A --no-verify", "get-rftp-noverify-aa", "get-rftp-noverify"),
    ("B get CPU (both ends): default / --no-verify", "get-rftp-default-b", "get-rftp-noverify-b"),
):
    m, pairs = per_pair(num, den, cpu, both)
    if m is not None:
        print(f"   {label}: median {m:.2f}x (pairs: {pairs})")
PY
