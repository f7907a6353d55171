#!/usr/bin/env bash
# The zipsite benchmark (issue 30 part 4, docs/ZIPSITE.md): pages per second
# and the server's CPU per page with 1, 2, 4 and 8 clients, plain Apache
# against Apache with mod_rdma serving the pictures (RDMA On for /pics),
# both prefork + mod_php on the same database, the same rhttp client
# (--plain for the baseline). Each client loads a page (PHP: a zip lookup,
# a bounding-box query, haversine for every row in the box), parses its
# <img src>, and fetches the pictures with one rhttp invocation. Server CPU
# = utime + stime of the Apache processes (/proc), see bench_client.py.
#
#   scripts/bench-zipsite.sh                      # SQLite, 8 s per run, 2 rounds
#   DB=pgsql scripts/bench-zipsite.sh             # PostgreSQL (its own CPU not counted)
#   SECONDS_PER_RUN=15 ROUNDS=3 CLIENTS="1 2 4 8 16" scripts/bench-zipsite.sh
#   ZS_DATA=/tmp/zipsite-data scripts/bench-zipsite.sh   # keep / reuse the data
#                                                 # set (1.6 GB of pictures, ~2-3 min to write)
#   NO_BUILD=1 ...                                # use rhttp and mod_rdma.so as built
#
# Prints a Markdown table (median over rounds; plain and mod_rdma runs
# interleaved) and writes the raw JSON lines to $OUT (default
# /tmp/bench-zipsite.jsonl).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
T="$(mktemp -d /tmp/zipsite-bench.XXXXXX)"
chmod 755 "$T"
PIDS=()
# shellcheck source=apps/zipsite/common.sh
. "$ROOT/apps/zipsite/common.sh"
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
cleanup() {
    [ "${#PIDS[@]}" -gt 0 ] && zs_stop "${PIDS[@]}"
    zs_pg_stop
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
die() { echo "bench-zipsite: $*" >&2; exit 1; }

DB="${DB:-sqlite}"
RUN_S="${SECONDS_PER_RUN:-8}"
ROUNDS="${ROUNDS:-2}"
CLIENTS="${CLIENTS:-1 2 4 8}"
OUT="${OUT:-/tmp/bench-zipsite.jsonl}"

zs_install || die "prerequisites missing (see above)"
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"
if [ "${NO_BUILD:-0}" != 1 ]; then
    timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp || die "cargo build -p iwarp-ffi -p rhttp failed"
    timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" || die "building mod_rdma failed"
fi
{ [ -x "$RHTTP" ] && [ -f "$MOD" ]; } || die "rhttp or mod_rdma.so is missing: run without NO_BUILD=1"
REQ=()
"$RHTTP" get --help 2>/dev/null | grep -q -- '--page-requisites' && [ "${NO_REQUISITES:-0}" != 1 ] && REQ=(--requisites)

zs_data all || die "generating the data set failed"
case "$DB" in
sqlite) DSN="sqlite:$ZS_DATA/zipsite.db" ;;
pgsql) zs_pg_start || die "PostgreSQL did not start"; DSN="$(zs_pg_dsn)" ;;
*) die "DB must be sqlite or pgsql" ;;
esac
export ZS_WORKERS=12
P_PLAIN=$(free_port_once "$T/ports")
P_RDMA=$(free_port_once "$T/ports")
zs_apache_conf plain "$P_PLAIN" "$DSN" ""
zs_apache_conf rdma "$P_RDMA" "$DSN" "$MOD"
PLAIN_PID=$(zs_apache_start plain "$P_PLAIN") || die "plain Apache did not start"
PIDS+=("$PLAIN_PID")
RDMA_PID=$(zs_apache_start rdma "$P_RDMA") || die "Apache with mod_rdma did not start"
PIDS+=("$RDMA_PID")

model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "# zipsite benchmark: $DB, ${RUN_S} s per run, $ROUNDS rounds, $(nproc) CPUs ($model), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# rhttp: ${REQ[*]:-page, then its pictures in one invocation}"
: >"$OUT"
run() { # plain|rdma CLIENTS [bench_client.py options]: a JSON line on stdout
    local port pid name="$1" c="$2" args=()
    shift 2
    if [ "$name" = plain ]; then port=$P_PLAIN; pid=$PLAIN_PID; args=(--plain); else port=$P_RDMA; pid=$RDMA_PID; fi
    python3 "$ZS_DIR/bench_client.py" --base "http://127.0.0.1:$port" --rhttp "$RHTTP" "${args[@]}" "${REQ[@]}" \
        --clients "$c" --seconds "$RUN_S" --server-pid "$pid" "$@" | sed "s/^{/{\"server\": \"$name\", \"db\": \"$DB\", /"
}
# Warm-up (not counted): PHP, SQLite's pages, the page cache for pictures.
run plain 2 >/dev/null
run rdma 2 >/dev/null
# Where the server's CPU goes: the pages alone (PHP + database), no pictures.
run plain 2 --no-pictures | tee "$T/pages-only.json"
for r in $(seq 1 "$ROUNDS"); do
    for c in $CLIENTS; do
        if [ $((r % 2)) = 1 ]; then
            run plain "$c" | tee -a "$OUT"; run rdma "$c" | tee -a "$OUT"
        else
            run rdma "$c" | tee -a "$OUT"; run plain "$c" | tee -a "$OUT"
        fi
    done
done
python3 - "$OUT" "$T/pages-only.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
po = json.loads(open(sys.argv[2]).read())
print(f"\npages alone (no pictures, plain, 2 clients): {po['pages_per_s']} pages/s, "
      f"{po['cpu_ms_per_page']} ms server CPU per page\n")
by = {}
for r in rows:
    by.setdefault((r["clients"], r["server"]), []).append(r)
med = lambda k, rs: statistics.median(r[k] for r in rs if r[k] is not None)
print("| clients | plain pages/s | mod_rdma pages/s | ratio | plain server CPU ms/page | mod_rdma server CPU ms/page | ratio | p50 ms plain / rdma | errors |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in sorted({k[0] for k in by}):
    p, d = by.get((c, "plain"), []), by.get((c, "rdma"), [])
    if not p or not d:
        continue
    pp, dp = med("pages_per_s", p), med("pages_per_s", d)
    pc, dc = med("cpu_ms_per_page", p), med("cpu_ms_per_page", d)
    print(f"| {c} | {pp:.1f} | {dp:.1f} | {dp / pp:.2f}x | {pc:.1f} | {dc:.1f} | {dc / pc:.2f}x | "
          f"{med('p50_ms', p):.0f} / {med('p50_ms', d):.0f} | {sum(r['errors'] for r in p + d)} |")
PY
