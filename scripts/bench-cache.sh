#!/usr/bin/env bash
# The coherent cache's benchmark (issue 13, the seed's Figures 9-11):
# response time and throughput against compute threads on the application
# servers, for ccproxy in modes none / tcp / sockets / rdma and for nginx
# proxy_cache revalidating every request (conditional GET), in network
# namespaces on this machine (scripts/cache-topo.sh: client, proxies and
# application servers each in a namespace, joined by a bridge).
#
#   scripts/bench-cache.sh                 # full: threads 0 25 50 100 200, 3 reps
#   QUICK=1 scripts/bench-cache.sh         # smoke: threads 0 200, 1 rep, 3 s runs
#   THREADS="0 50" REPS=5 DURATION=10 CLIENTS=32 scripts/bench-cache.sh
#   APPS=2 PROXIES=1 scripts/bench-cache.sh  # documents sharded over 2 servers
#   OUT=/tmp/cc scripts/bench-cache.sh     # results elsewhere (default docs/bench/cache)
#
# Workloads (WORKLOADS): single (one 8 KB document, the seed's), zipf (20
# documents of 200 B - 1 MB, Zipf exponent ZIPF), and, if asked for, wc98:
# a replay of a generated WorldCup-98-shaped access log (ccload gen-log),
# its URLs mapped onto WC_DOCS documents sized from the log; LOG=FILE
# replays your own Common/Combined Log Format log instead. Each run: WARMUP seconds
# unrecorded, then DURATION seconds of CLIENTS keep-alive clients (ccload).
# Modes run in a rotated order in each rep, so each mode's runs are paired
# in time with the others'; the report takes the median over reps.
#
# COMPUTE_SLEEP_US=N makes each compute thread sleep N µs after every
# COMPUTE_SLICE_US (default 1000) of work, as request handlers that block on
# I/O do; the default 0 gives the seed's pure busy loops (see
# docs/BENCHMARKS.md for why the two differ under Linux's scheduler).
#
# By default (2+ CPUs) the application tier is pinned to the last CPU and
# the client, proxies and nginx to the others (APP_CPUS / FRONT_CPUS), so
# compute threads load the application server's CPU and not the proxy's.
#
# Writes $OUT/results.jsonl, $OUT/results.md (tables, targets) and
# fig9-response-time.png, fig10-breakdown.png, fig11-throughput.png; then
# runs scripts/bench-cache-push.sh (Figure 12: wasted updates and misses
# of pull / push / hybrid) into the same OUT, so this one command writes
# every table and plot of the issue (PUSH=0 leaves Figure 12 out; under
# QUICK=1 it runs one short repetition).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
say() { echo "bench-cache: $*"; }

QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
    THREADS="${THREADS:-0 200}"
    REPS="${REPS:-1}"
    DURATION="${DURATION:-3}"
    WARMUP="${WARMUP:-1}"
    WORKLOADS="${WORKLOADS:-single zipf}"
else
    THREADS="${THREADS:-0 25 50 100 200}"
    REPS="${REPS:-3}"
    DURATION="${DURATION:-8}"
    WARMUP="${WARMUP:-2}"
    WORKLOADS="${WORKLOADS:-single zipf}"
fi
MODES="${MODES:-none tcp sockets rdma nginx}"
CLIENTS="${CLIENTS:-16}"
# Version-check connections per proxy: one per client, so a check never
# waits for another client's check to finish.
CHECK_CONNS="${CHECK_CONNS:-$CLIENTS}"
ZIPF="${ZIPF:-1.0}"
COMPUTE_SLEEP_US="${COMPUTE_SLEEP_US:-0}"
COMPUTE_SLICE_US="${COMPUTE_SLICE_US:-1000}"
PROXIES="${PROXIES:-1}"
APPS="${APPS:-1}"
OUT="${OUT:-$ROOT/docs/bench/cache}"
NCPU="$(nproc)"
if [ "$NCPU" -ge 2 ]; then
    APP_CPUS="${APP_CPUS-$((NCPU - 1))}"
    FRONT_CPUS="${FRONT_CPUS-0-$((NCPU - 2))}"
fi
export APP_CPUS FRONT_CPUS

# ---- prerequisites -----------------------------------------------------------
if [ "$(id -u)" != 0 ]; then echo "SKIPPED: needs root (network namespaces)"; exit 77; fi
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v apache2 >/dev/null || need+=(apache2)
command -v apxs >/dev/null || need+=(apache2-dev)
command -v nginx >/dev/null || need+=(nginx-light)
command -v curl >/dev/null || need+=(curl)
command -v taskset >/dev/null || need+=(util-linux)
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    timeout 300 apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq "${need[@]}" >/dev/null
fi
for c in ip apache2 apxs nginx curl; do
    command -v "$c" >/dev/null || { say "prerequisite $c missing (apt-get install failed?)"; exit 1; }
done
if ! ip netns add cc13b-probe 2>/dev/null; then echo "SKIPPED: cannot create network namespaces here"; exit 77; fi
ip netns del cc13b-probe

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
timeout 1800 cargo build --release -q -p ccache || { say "cargo build -p ccache failed"; exit 1; }
timeout 300 make -s -C tools/ccache/apache >/dev/null || { say "mod_ccache build (apxs) failed"; exit 1; }

T="$(mktemp -d /tmp/bench-cache.XXXXXX)"
chmod 755 "$T"
# shellcheck source=scripts/cache-topo.sh disable=SC1091
. "$ROOT/scripts/cache-topo.sh"
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    topo_down
    if [ "${KEEP:-0}" = 1 ]; then say "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"

say "topology: $PROXIES proxies, $APPS application servers (namespaces $TOPO-*), app CPUs ${APP_CPUS:-all}, front CPUs ${FRONT_CPUS:-all}"
topo_up "$PROXIES" "$APPS" || { say "cannot build the topology"; exit 1; }

# Documents: 0..19 the Zipf set (200 B - 1 MB), 20 the single 8 KB one,
# 100.. the access log's (workload wc98).
VERSION="$(date +%s%N)"
DOCS=21
WC_DOCS="${WC_DOCS:-200}"
if [[ " $WORKLOADS " == *" wc98 "* ]]; then
    if [ -z "${LOG:-}" ]; then
        LOG="$T/wc98.log"
        "$TARGET/release/ccload" gen-log --out "$LOG" --requests 200000 --urls 3000 || exit 1
    fi
    DOCS=$((100 + WC_DOCS))
fi
for j in $(seq 0 $((APPS - 1))); do
    mkdir -p "$T/a$j/docs"
    "$TARGET/release/ccload" mkdocs --docroot "$T/a$j/docs" --docs 21 --min-size 8192 --max-size 8192 --version "$VERSION" >/dev/null
    "$TARGET/release/ccload" mkdocs --docroot "$T/a$j/docs" --docs 20 --min-size 200 --max-size 1048576 --version "$VERSION" >"$T/sizes.txt"
    if [ "$DOCS" -gt 21 ]; then
        "$TARGET/release/ccload" mkdocs --docroot "$T/a$j/docs" --log "$LOG" --docs "$WC_DOCS" --first-doc 100 --version "$VERSION" >/dev/null || exit 1
    fi
    chmod -R a+rX "$T/a$j"
    start_apache "$j" || { say "apache2 in a$j did not start"; cat "$T/a$j/logs/"* 2>/dev/null; exit 1; }
done
write_shards "$APPS" "$T/shards.conf"
NGINX_PORT=8090
if [[ " $MODES " == *" nginx "* ]]; then
    start_nginx 0 "$NGINX_PORT" "$APPS" "$DOCS" || { say "nginx did not start"; cat "$T/nginx-p0/"*.log; exit 1; }
fi

port_of() { case "$1" in none) echo 8080 ;; tcp) echo 8081 ;; sockets) echo 8082 ;; rdma) echo 8083 ;; nginx) echo "$NGINX_PORT" ;; esac; }

level_pids=()
stop_level() {
    local p
    for p in "${level_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${level_pids[@]}"; do timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
    level_pids=()
}

P0="$(addr_of p0)"
failed=0
for n in $THREADS; do
    say "compute threads $n"
    for j in $(seq 0 $((APPS - 1))); do
        start_appd "$j" "$DOCS" "$n" --initial-version "$VERSION" \
            --compute-sleep-us "$COMPUTE_SLEEP_US" --compute-slice-us "$COMPUTE_SLICE_US" || { say "ccappd in a$j did not start"; tail "$T/a$j/ccappd.log"; exit 1; }
        level_pids+=("$APPD_PID_LAST")
    done
    for m in $MODES; do
        [ "$m" = nginx ] && continue
        start_proxy 0 "$m" "$(port_of "$m")" "$T/shards.conf" --check-timeout-ms 5000 --check-conns "$CHECK_CONNS" || { say "ccproxy $m did not start"; tail "$T/ccproxy-p0-$m.log"; exit 1; }
        level_pids+=("$PROXY_PID_LAST")
    done
    # Each path answers the 8 KB document (and nginx revalidates it).
    for m in $MODES; do
        if ! in_ns cl curl -sf -m 20 -o /dev/null "http://$P0:$(port_of "$m")/docs/20"; then
            say "mode $m does not answer /docs/20"; failed=1
        fi
    done
    if [[ " $MODES " == *" nginx "* ]]; then
        st="$(in_ns cl curl -s -m 20 -D - -o /dev/null "http://$P0:$NGINX_PORT/docs/20" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-cache-status"{print $2}')"
        if [ "$st" != REVALIDATED ]; then say "nginx did not revalidate a cached document (X-Cache-Status: '$st'); its numbers would not be the coherent configuration"; failed=1; fi
    fi
    for rep in $(seq 1 "$REPS"); do
        # Rotate the order of the modes each rep.
        read -r -a ms <<<"$MODES"
        k=$(((rep - 1) % ${#ms[@]}))
        order=("${ms[@]:$k}" "${ms[@]:0:$k}")
        for w in $WORKLOADS; do
            case "$w" in
            single) wargs=(--workload single --first-doc 20) ;;
            zipf) wargs=(--workload zipf --docs 20 --zipf "$ZIPF") ;;
            wc98) wargs=(--workload log --log "$LOG" --docs "$WC_DOCS" --first-doc 100) ;;
            *) say "unknown workload $w (single, zipf, wc98)"; exit 1 ;;
            esac
            for m in "${order[@]}"; do
                label="workload=$w,mode=$m,threads=$n,rep=$rep"
                if ! in_ns cl "${PIN_FRONT[@]}" timeout $((DURATION + WARMUP + 120)) "$TARGET/release/ccload" run \
                    --url "http://$P0:$(port_of "$m")/docs/" "${wargs[@]}" --clients "$CLIENTS" \
                    --duration "$DURATION" --warmup "$WARMUP" --timeout 30 --label "$label" \
                    >>"$RESULTS" 2>>"$T/ccload.log"; then
                    say "ccload failed: $label"; tail -n 3 "$T/ccload.log"
                fi
                tail -n 1 "$RESULTS" | /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("  %-48s %8.0f req/s  mean %7.0f us  p99 %8d us  errors %d  status %s" % (r["label"], r["req_per_s"], r["mean_us"], r["p99_us"], r["errors"], r["status"]))' 2>/dev/null
            done
        done
    done
    stop_level
done

{
    echo "command: ${BENCH_CMD:-scripts/bench-cache.sh} (QUICK=$QUICK THREADS='$THREADS' REPS=$REPS DURATION=$DURATION WARMUP=$WARMUP CLIENTS=$CLIENTS CHECK_CONNS=$CHECK_CONNS WORKLOADS='$WORKLOADS' PROXIES=$PROXIES APPS=$APPS COMPUTE_SLEEP_US=$COMPUTE_SLEEP_US COMPUTE_SLICE_US=$COMPUTE_SLICE_US)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($NCPU CPUs; app tier on ${APP_CPUS:-all}, front on ${FRONT_CPUS:-all}); load average before the report: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/run.txt"
/usr/bin/python3 "$ROOT/scripts/bench-cache-report.py" "$RESULTS" "$OUT" "$OUT/run.txt" || failed=1
if [ "${PUSH:-1}" != 0 ]; then
    say "Figure 12: pull / push / hybrid (scripts/bench-cache-push.sh)"
    if [ "$QUICK" = 1 ]; then
        OUT="$OUT" REPS="${PUSH_REPS:-1}" SECONDS_PER_RUN="${PUSH_SECONDS:-10}" WARMUP_SECONDS=3 \
            "$ROOT/scripts/bench-cache-push.sh" || failed=1
    else
        OUT="$OUT" REPS="${PUSH_REPS:-5}" "$ROOT/scripts/bench-cache-push.sh" || failed=1
    fi
fi
say "results in $OUT"
exit "$failed"
