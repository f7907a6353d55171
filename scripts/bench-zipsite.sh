#!/usr/bin/env bash
# The zipsite benchmark (issue 30 part 4, docs/ZIPSITE.md): pages per second
# and the server's CPU per page with 1, 2, 4 and 8 clients, against
#   plain   Apache prefork + mod_php, rhttp --plain
#   rdma    the same with mod_rdma (RDMA On for /pics), as configured by default
#   rdma0   the same with RDMAInlineBelow 0 (every picture by RDMA), when
#           the module has that directive
#   cache   ccproxy (RDMA version checks) + ccappd in front of the rdma
#           Apache (+ mod_ccache) for the pages, pictures from that Apache
# all on the same database, the same rhttp client. Each client loads a page
# "within 10 miles of Z" (PHP: a zip lookup, a bounding-box query,
# haversine for every row in the box), parses its <img src>, and fetches
# the pictures with one rhttp invocation. Server CPU = utime + stime of the
# Apache processes (/proc), plus ccproxy's and ccappd's in the cache runs;
# see apps/zipsite/bench_client.py.
#
#   scripts/bench-zipsite.sh                      # SQLite, 8 s per run, 2 rounds
#   DB=pgsql scripts/bench-zipsite.sh             # PostgreSQL (its own CPU not counted)
#   SECONDS_PER_RUN=15 ROUNDS=3 CLIENTS="1 2 4 8 16" scripts/bench-zipsite.sh
#   ZS_DATA=/tmp/zipsite-data scripts/bench-zipsite.sh   # keep / reuse the data
#                                                 # set (1.6 GB of pictures, ~2-3 min to write)
#   NO_BUILD=1 ...                                # use rhttp, mod_rdma.so, ccache as built
#   NO_CACHE=1 ...                                # without the cache runs
#   NO_REQUISITES=1 ...                           # page, then pictures, even if rhttp has -p
#   PAGES_PER_CONNECTION=10 ...                   # 10 pages per rhttp invocation (one HTTP and
#                                                 # one RDMA connection), not a new client per page
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
PPC="${PAGES_PER_CONNECTION:-1}"

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
# rhttp -p (--page-requisites): page and pictures in one invocation, when
# rhttp has it; else the page, then its pictures in a second invocation.
REQ=()
if "$RHTTP" get --help 2>/dev/null | grep -q -- '--page-requisites' && [ "${NO_REQUISITES:-0}" != 1 ]; then REQ=(--requisites); fi

zs_data all || die "generating the data set failed"
case "$DB" in
sqlite) DSN="sqlite:$ZS_DATA/zipsite.db" ;;
pgsql) zs_pg_start || die "PostgreSQL did not start"; DSN="$(zs_pg_dsn)" ;;
*) die "DB must be sqlite or pgsql" ;;
esac
export ZS_WORKERS=12
P_PLAIN=${P_PLAIN:-$(free_port_once "$T/ports")}
P_RDMA=${P_RDMA:-$(free_port_once "$T/ports")}
P_RDMA0=${P_RDMA0:-$(free_port_once "$T/ports")}
P_PROXY=$(free_port_once "$T/ports")
zs_apache_conf plain "$P_PLAIN" "$DSN" ""
# mod_rdma as configured by default (with RDMAInlineBelow, issue 30 part 1,
# files below 512K, every picture, are answered inline), and, when the
# module has that directive, with RDMAInlineBelow 0: every picture by RDMA.
# The default one also carries mod_ccache (/near/N) for the cache runs.
# (mod_ccache only when the cache runs: NO_CACHE=1 needs no ccache build.)
ZS_CCACHE_IPC=""
[ "${NO_CACHE:-0}" != 1 ] && ZS_CCACHE_IPC="$T/ccappd/ipc.sock"
zs_apache_conf rdma "$P_RDMA" "$DSN" "$MOD"
SERVERS="plain rdma"
if grep -q RDMAInlineBelow "$MOD"; then
    ZS_CCACHE_IPC="" ZS_RDMA_CONF="RDMAInlineBelow 0" zs_apache_conf rdma0 "$P_RDMA0" "$DSN" "$MOD"
    SERVERS="plain rdma rdma0"
fi
declare -A PORT=([plain]=$P_PLAIN [rdma]=$P_RDMA [rdma0]=$P_RDMA0) PID=()
for s in $SERVERS; do
    PID[$s]=$(zs_apache_start "$s" "${PORT[$s]}") || die "Apache $s did not start"
    PIDS+=("${PID[$s]}")
done
if [ "${NO_CACHE:-0}" != 1 ]; then
    if [ "${NO_BUILD:-0}" != 1 ]; then
        { timeout 1200 cargo build --release -q -p ccache && timeout 300 make -s -C tools/ccache/apache; } || die "building the coherent cache failed"
    fi
    zs_cache_start "$P_RDMA" "$P_PROXY" || die "ccappd/ccproxy did not start"
    PIDS+=("$ZS_PROXY_PID" "$ZS_APPD_PID")
    SERVERS="$SERVERS cache"
fi

model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "# zipsite benchmark: $DB, ${RUN_S} s per run, $ROUNDS rounds, $PPC pages per connection, $(nproc) CPUs ($model), load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${#REQ[@]}" -gt 0 ]; then
    echo "# client: rhttp get -p (page and pictures in one invocation); cache runs: the page from ccproxy, then the pictures from Apache in a second"
else
    echo "# client: rhttp get PAGE, then rhttp get PICTURES... (one invocation each)"
fi
: >"$OUT"
run() { # SERVER CLIENTS [bench_client.py options]: a JSON line on stdout
    local name="$1" c="$2" args=()
    shift 2
    case "$name" in
    plain) args=(--plain --base "http://127.0.0.1:$P_PLAIN" --server-pid "${PID[plain]}") ;;
    cache) args=(--base "http://127.0.0.1:$P_RDMA" --server-pid "${PID[rdma]}" --page-base "http://127.0.0.1:$P_PROXY"
        --extra-pid "$ZS_PROXY_PID" --extra-pid "$ZS_APPD_PID") ;;
    *) args=(--base "http://127.0.0.1:${PORT[$name]}" --server-pid "${PID[$name]}") ;;
    esac
    python3 "$ZS_DIR/bench_client.py" --rhttp "$RHTTP" "${args[@]}" "${REQ[@]}" \
        --pages-per-connection "$PPC" --clients "$c" --seconds "$RUN_S" "$@" | sed "s/^{/{\"server\": \"$name\", \"db\": \"$DB\", /"
}
# Warm-up (not counted): PHP, the database's pages, the page cache for the
# pictures, the proxy's cache (200 distinct pages: all hits afterwards).
for s in $SERVERS; do run "$s" 2 >/dev/null; done
# Where the server's CPU goes: the pages alone (PHP + database), no pictures.
run plain 2 --no-pictures | tee "$T/pages-only.json"
# Rounds: every configuration per client count, the order rotated per round.
for r in $(seq 1 "$ROUNDS"); do
    for c in $CLIENTS; do
        order=$(echo "$SERVERS" | tr ' ' '\n' | awk -v r="$r" '{a[NR]=$0} END {for (i = 0; i < NR; i++) print a[(i + r - 1) % NR + 1]}')
        for s in $order; do run "$s" "$c" | tee -a "$OUT"; done
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
def med(k, rs):
    v = [r[k] for r in rs if r[k] is not None]
    return statistics.median(v) if v else float("nan")
names = {"plain": "plain Apache", "rdma": "mod_rdma (default)", "rdma0": "mod_rdma, pictures by RDMA",
         "cache": "ccproxy in front + mod_rdma"}
servers = [k for k in names if any(r["server"] == k for r in rows)]
print("| clients | " + " | ".join(f"{names[s]}: pages/s, server CPU ms/page" for s in servers) + " |")
print("|---:|" + "---:|" * len(servers))
for c in sorted({k[0] for k in by}):
    cells = []
    for s in servers:
        rs = by.get((c, s), [])
        if not rs:
            cells.append("-")
            continue
        e = sum(r["errors"] for r in rs)
        cells.append(f"{med('pages_per_s', rs):.0f}, {med('cpu_ms_per_page', rs):.2f}" + (f" ({e} errors)" if e else ""))
    print(f"| {c} | " + " | ".join(cells) + " |")
print()
print("| clients | " + " | ".join(f"{names[s]}: p50 / p99 ms" for s in servers) + " |")
print("|---:|" + "---:|" * len(servers))
for c in sorted({k[0] for k in by}):
    print(f"| {c} | " + " | ".join(f"{med('p50_ms', by[(c, s)]):.0f} / {med('p99_ms', by[(c, s)]):.0f}"
                                   if by.get((c, s)) else "-" for s in servers) + " |")
if any(r["server"] == "cache" for r in rows):
    rs = [r for r in rows if r["server"] == "cache"]
    print(f"\ncache runs: ccproxy + ccappd CPU {sum(r['extra_cpu_s'] for r in rs):.1f} s of "
          f"{sum(r['server_cpu_s'] for r in rs):.1f} s server CPU")
PY
