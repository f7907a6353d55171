#!/usr/bin/env bash
# mod_rdma against plain Apache, side by side in one run.
#
#   scripts/bench-modrdma.sh            # results into docs/bench/
#   OUT=/tmp/b scripts/bench-modrdma.sh # elsewhere
#
# Starts two prefork Apaches with the same configuration on loopback ports:
# one with mod_rdma (static registration on the main server, dynamic on a
# vhost), one without the module. Measures, per request, over one
# keep-alive connection:
#   - single client, files of 2K 4K 500K 1M 8M: plain HTTP (rhttp --plain
#     and curl) against mod_rdma server-writes and client-reads, static and
#     dynamic registration; with no load and with two busy processes;
#   - 1..15 clients at once, each fetching five 1 MB files over one
#     connection (aggregate throughput);
#   - the registration cost of each mode (modules/mod_rdma/bench/regcost.c).
# Single-client cells run ROUNDS (default 5) rounds of every variant in
# turn and pool the per-request times (see `single`).
# Environment: OUT (results directory), P1 P2 P3 (server ports; default: free
# ones below the ephemeral range), ROUNDS, VARIANTS and BENCH_SIZES
# (subsets of the single-client variants and sizes), SINGLE_ONLY=1 (stop
# after the single-client cells, no plot: for quick A/B runs), RHTTP (the
# client binary; default target/release/rhttp) and MOD (the module; default
# the one built here), for A/B runs of other builds; RHTTP_BASE (a second
# client binary: a variant named with "@base" appended, e.g.
# VARIANTS="plain sw-static sw-static@base", runs it in the same rounds,
# interleaved with the others, for an A/B of rhttp itself); INLINE_BELOW (writes
# `RDMAInlineBelow $INLINE_BELOW` into mod_rdma's configuration: 0 moves
# every body by RDMA, as before that directive; unset: the module's
# default); LOADS (default "0 2": busy background processes per pass).
# BENCH_SIZES may name sizes beyond SIZES (e.g. "2K 16K 64K 256K"); their
# files are made too.
# Writes OUT/modrdma_results.json (one JSON object per line),
# OUT/modrdma.png and OUT/modrdma_summary.md.
# The plot needs python3-matplotlib (installed with apt-get if missing).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/docs/bench}"
mkdir -p "$OUT"
T="$(mktemp -d /tmp/modrdma-bench.XXXXXX)"
chmod 755 "$T"
PIDS=()
BUSY=()

cleanup() {
    local p
    for p in "${BUSY[@]}" "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    rm -rf "$T"
}
trap cleanup EXIT
die() { echo "bench-modrdma: $*" >&2; exit 1; }

if ! command -v apache2 >/dev/null || ! command -v apxs >/dev/null; then
    die "apache2 and apache2-dev are missing: run scripts/test-modrdma.sh first (it installs them)"
fi
# The system Python, where apt's python3-matplotlib lives (a pyenv or venv
# python3 earlier in PATH would not see it).
PY="${PY:-/usr/bin/python3}"
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq python3-matplotlib >/dev/null ||
        die "could not install python3-matplotlib"
fi
# SKIP_BUILD=1: use the binaries as they are (RHTTP= and MOD= name others).
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp || die "cargo build failed"
    timeout 300 make -s -C modules/mod_rdma >/dev/null 2>&1 || die "building mod_rdma failed (make -C modules/mod_rdma)"
fi
gcc -O2 -std=c11 -Wall -Wextra -Werror -Iinclude modules/mod_rdma/bench/regcost.c \
    -Ltarget/release -liwarp -Wl,-rpath,"$ROOT/target/release" -o "$T/regcost" ||
    die "building regcost failed"
RHTTP="${RHTTP:-$ROOT/target/release/rhttp}"
MOD="${MOD:-$ROOT/modules/mod_rdma/.libs/mod_rdma.so}"

# Server ports from below the ephemeral range, distinct within this run
# (a port taken from bind(:0) and released can be taken by an outgoing
# connection or handed out twice before the server binds it).
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$T/ports.given"; }
P1=${P1:-$(free_port)}; P2=${P2:-$(free_port)}; P3=${P3:-$(free_port)}
DOCS="$T/docs"
mkdir -p "$DOCS" "$T/run1" "$T/run3"
SIZES="2K 4K 500K 1M 8M"
for s in $SIZES ${BENCH_SIZES:-}; do [ -f "$DOCS/f$s.bin" ] || head -c "$s" /dev/urandom >"$DOCS/f$s.bin"; done
chmod -R a+rX "$DOCS"

conf() { # $1 run dir
    cat <<EOF
ServerRoot /etc/apache2
ServerName 127.0.0.1
DefaultRuntimeDir $1
PidFile $1/httpd.pid
ErrorLog $1/error.log
User www-data
Group www-data
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
StartServers 16
MinSpareServers 16
MaxSpareServers 16
ServerLimit 16
MaxRequestWorkers 16
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 5
TypesConfig /etc/mime.types
DocumentRoot $DOCS
LogLevel warn
<Directory />
    Require all granted
</Directory>
EOF
}
{
    conf "$T/run1"
    cat <<EOF
Listen 127.0.0.1:$P1
Listen 127.0.0.1:$P2
LoadModule rdma_module $MOD
RDMARegistration static
RDMABufferSize 8M
${INLINE_BELOW:+RDMAInlineBelow $INLINE_BELOW}
<Location />
    RDMA On
</Location>
<VirtualHost 127.0.0.1:$P2>
    RDMARegistration dynamic
</VirtualHost>
EOF
} >"$T/rdma.conf"
{ conf "$T/run3"; echo "Listen 127.0.0.1:$P3"; } >"$T/plain.conf"

start() { # $1 conf $2 port
    setsid apache2 -d /etc/apache2 -f "$1" -DFOREGROUND >>"$T/apache.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$2/f2K.bin" && return 0
        sleep 0.1
    done
    die "apache2 ($1) did not start: $(tail -5 "$T/apache.log")"
}
start "$T/rdma.conf" "$P1"
start "$T/plain.conf" "$P3"

RES="$OUT/modrdma_results.json"
: >"$RES"
reps() { case $1 in 2K | 4K | 16K | 64K | 256K | 500K) echo 200 ;; 1M) echo 100 ;; *) echo 30 ;; esac; }

# stats FILE: per-request milliseconds (one per line) -> "median p90 n"
stats() {
    python3 - "$1" <<'EOF'
import statistics, sys
v = [float(x) for x in open(sys.argv[1]).read().split()]
v.sort()
print(f"{statistics.median(v):.4f} {v[int(len(v) * 0.9)]:.4f} {len(v)}")
EOF
}

# Each (load, size) cell is measured in ROUNDS rounds; every round runs
# every variant once, in turn, over a fresh keep-alive connection, so slow
# drifts of the machine (seen as +-40% between back-to-back runs of the
# same variant) hit all variants alike. Per-request times of all rounds
# are pooled; the first request of each connection (connection and RDMA
# set-up) is dropped.
ROUNDS="${ROUNDS:-5}"

# single_round SIZE VARIANT N: N requests over one connection; appends the
# per-request milliseconds (first dropped) to $T/times.VARIANT.
single_round() {
    local size=$1 variant=$2 n=$3 urls=() outs=() i base scheme extra=() bin=$RHTTP
    local kind=${variant%@base}
    if [ "$kind" != "$variant" ]; then
        bin=${RHTTP_BASE:?"variant $variant needs RHTTP_BASE (the baseline rhttp binary)"}
    fi
    case $kind in
        curl)
            for ((i = 0; i < n; i++)); do urls+=(-o /dev/null "http://127.0.0.1:$P3/f$size.bin"); done
            timeout 300 curl -s -w '%{time_total}\n' "${urls[@]}" |
                awk '{ printf "%.4f\n", $1 * 1000 }' >"$T/round" || return 1
            ;;
        *)
            case $kind in
                plain) base=$P3 scheme=server-writes extra=(--plain) ;;
                sw-static) base=$P1 scheme=server-writes ;;
                sw-dynamic) base=$P2 scheme=server-writes ;;
                cr-static) base=$P1 scheme=client-reads ;;
                cr-dynamic) base=$P2 scheme=client-reads ;;
            esac
            for ((i = 0; i < n; i++)); do urls+=("http://127.0.0.1:$base/f$size.bin"); outs+=(-o /dev/null); done
            timeout 300 "$bin" -q "${extra[@]}" get --scheme "$scheme" "${urls[@]}" "${outs[@]}" 2>"$T/err" || {
                tail -3 "$T/err"; return 1; }
            sed -n 's/.* in \([0-9.]*\) ms .*/\1/p' "$T/err" >"$T/round"
            ;;
    esac
    tail -n +2 "$T/round" >>"$T/times.$variant"
}

# single LOAD SIZE: every variant, ROUNDS rounds, one JSON line per variant.
single() {
    local load=$1 size=$2 v r per med p90 cnt
    per=$(( $(reps "$size") / ROUNDS + 1 ))
    for v in $VARIANTS; do : >"$T/times.$v"; done
    for ((r = 0; r < ROUNDS; r++)); do
        for v in $VARIANTS; do single_round "$size" "$v" "$per" || return 1; done
    done
    for v in $VARIANTS; do
        read -r med p90 cnt < <(stats "$T/times.$v")
        printf '{"test":"single","load":%s,"size":"%s","variant":"%s","median_ms":%s,"p90_ms":%s,"n":%s,"rounds":%s}\n' \
            "$load" "$size" "$v" "$med" "$p90" "$cnt" "$ROUNDS" | tee -a "$RES"
    done
}

VARIANTS="${VARIANTS:-curl plain sw-static sw-dynamic cr-static cr-dynamic}"
for load in ${LOADS:-0 2}; do
    if [ "$load" = 2 ]; then
        for _ in 1 2; do sh -c 'while :; do :; done' & BUSY+=($!); done
    fi
    for size in ${BENCH_SIZES:-$SIZES}; do single "$load" "$size" || die "single $load $size failed"; done
    for p in "${BUSY[@]}"; do kill "$p" 2>/dev/null; done
    BUSY=()
done
[ "${SINGLE_ONLY:-0}" = 1 ] && exit 0

# multi CLIENTS VARIANT: CLIENTS processes, each five 1 MB GETs on one connection.
multi() {
    local c=$1 variant=$2 base extra=() pids=() start end i scheme=server-writes
    case $variant in
        plain) base=$P3 extra=(--plain) ;;
        sw-static) base=$P1 ;;
        cr-static) base=$P1 scheme=client-reads ;;
    esac
    local u="http://127.0.0.1:$base/f1M.bin"
    start=$(date +%s%N)
    for ((i = 0; i < c; i++)); do
        timeout 120 "$RHTTP" -q "${extra[@]}" get --scheme "$scheme" "$u" "$u" "$u" "$u" "$u" \
            -o /dev/null -o /dev/null -o /dev/null -o /dev/null -o /dev/null 2>"$T/m$i.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$T"/m*.err | tail -3; return 1; }; done
    end=$(date +%s%N)
    local ms=$(( (end - start) / 1000000 ))
    grep -h " in " "$T"/m*.err | grep -c "200 1048576" | grep -qx $((c * 5)) || { echo "missing transfers"; return 1; }
    rm -f "$T"/m*.err
    printf '{"test":"multi","clients":%s,"variant":"%s","wall_ms":%s,"mb_per_s":%.1f}\n' \
        "$c" "$variant" "$ms" "$(echo "$c * 5 * 1.048576 * 1000 / $ms" | bc -l)" | tee -a "$RES"
}
command -v bc >/dev/null || DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq bc >/dev/null
for c in $(seq 1 15); do
    for v in plain sw-static cr-static; do
        for _ in 1 2 3; do multi "$c" "$v" || die "multi $c $v failed"; done
    done
done

args=()
for s in $SIZES; do args+=("$DOCS/f$s.bin"); done
"$T/regcost" "${args[@]}" | sed 's/^{/{"test":"regcost",/' | tee -a "$RES" || die "regcost failed"

"$PY" "$ROOT/modules/mod_rdma/bench/plot_modrdma.py" "$RES" "$OUT/modrdma.png" "$OUT/modrdma_summary.md" ||
    die "plotting failed"
echo "results: $RES, $OUT/modrdma.png, $OUT/modrdma_summary.md"
