#!/usr/bin/env bash
# The check functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# The zipsite (issue 30 part 4, apps/zipsite, docs/ZIPSITE.md) end to end:
# the generated data set (42,000 places, one person each) in SQLite and in a
# PostgreSQL cluster this script starts (unprivileged, Unix socket only),
# served by Debian's Apache + mod_php (PDO, prepared statements) with
# mod_rdma loaded (prefork, both need it), and checked against a reference
# computed independently in Python from the generator's data: for 36
# (zip, miles) queries the ids, their order and the distances (to 0.01 mile)
# on both databases; 400 with a message for bad input (non-numeric, unknown
# zip, huge miles, SQL metacharacters); person pages; then one page with
# its pictures fetched by rhttp (pictures by RDMA), every picture
# equal to the generator's; and the coherent cache in front (ccproxy with
# RDMA version checks, ccappd, mod_ccache): /near/N pages a miss then a hit,
# equal to the reference.
#
#   scripts/test-zipsite.sh              # about 30 s once the packages are there
#   KEEP=1 scripts/test-zipsite.sh       # keep the temp dir (configs, logs)
#   NO_PG=1 scripts/test-zipsite.sh      # SQLite only
#   NO_BUILD=1 scripts/test-zipsite.sh   # use the rhttp and mod_rdma.so already built
#
# Installs what is missing: libapache2-mod-php php-sqlite3 php-pgsql postgresql.
# Last line: "zipsite: N passed, N failed"; exit status non-zero on failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
PASS=0
FAIL=0
T="$(mktemp -d /tmp/zipsite.XXXXXX)"
chmod 755 "$T"
PIDS=()
ZS_DATA="$T/data"  # the test always generates its own (pictures of one page)
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

ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
check() {
    local name="$1"
    shift
    local log="$T/check-$((PASS + FAIL + 1)).log"
    if "$@" >"$log" 2>&1; then ok "$name"; else bad "$name (output below)"; tail -n 25 "$log" | sed 's/^/     /'; fi
}
finish() {
    echo "zipsite: $PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}
START=$(date +%s)

# ---- prerequisites ------------------------------------------------------------
if zs_install; then ok "prerequisites: mod_php ($ZS_PHPMOD), PDO SQLite + PostgreSQL, PostgreSQL ($ZS_PGBIN)"; else
    bad "prerequisites could not be installed"; finish; fi
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"
# rhttp and mod_rdma as scripts/test-modrdma.sh builds them, the coherent
# cache as scripts/test-cache.sh does (no-ops when warm); NO_BUILD=1 uses
# the binaries already there. The same cargo invocations as those scripts,
# so that Cargo's feature unification finds their build warm.
if [ "${NO_BUILD:-0}" = 1 ] && [ -x "$RHTTP" ] && [ -f "$MOD" ]; then
    ok "rhttp and mod_rdma present (NO_BUILD=1: not rebuilt)"
elif timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp 2>"$T/build.log" &&
    timeout 1200 cargo build --release -q -p ccache 2>>"$T/build.log" &&
    timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" >>"$T/build.log" 2>&1 && [ -f "$MOD" ] &&
    timeout 300 make -s -C tools/ccache/apache >>"$T/build.log" 2>&1; then
    ok "rhttp, mod_rdma, ccappd, ccproxy and mod_ccache built"
else
    bad "building rhttp / mod_rdma (as scripts/test-modrdma.sh does)"; tail -30 "$T/build.log"; finish
fi

# ---- data ---------------------------------------------------------------------
# Pictures are written for the persons of the page fetched with its pictures
# below (writing all 42,000 takes a minute; scripts/bench-zipsite.sh does).
PAGE_ZIP=32437
PAGE_MILES=20
t_data() {
    (cd "$ROOT/apps/zipsite" && timeout 60 python3 -c "
import reference, sys
r = reference.Reference()
ids = [i for i, _ in r.near('$PAGE_ZIP', $PAGE_MILES)]
open('$T/page-ids', 'w').writelines(f'{i}\n' for i in ids)
print(len(ids), 'people on the page')") || return 1
    zs_data "ids:$T/page-ids" && sqlite3 "$T/data/zipsite.db" 'SELECT count(*) FROM place JOIN person ON person.place_id = place.id' | grep -qx 42000
}
check "data: 42,000 places and people generated (seed 1), loaded into SQLite" t_data
[ -f "$T/data/zipsite.db" ] || finish

HAVE_PG=0
if [ "${NO_PG:-0}" != 1 ]; then
    t_pg() {
        zs_pg_start || return 1
        psql -h "$ZS_PGSOCK" -U zipsite -d zipsite -Atc 'SELECT count(*) FROM place JOIN person ON person.place_id = place.id' | grep -qx 42000
    }
    if check "PostgreSQL: an unprivileged cluster on a Unix socket in the temp dir, 42,000 rows loaded" t_pg; then HAVE_PG=1; fi
fi

# ---- Apache + mod_php (+ mod_rdma) ------------------------------------------------
PORTS="$T/ports"
P_SQL=$(free_port_once "$PORTS")
P_PG=$(free_port_once "$PORTS")
P_PROXY=$(free_port_once "$PORTS")
ZS_CCACHE_IPC="$T/ccappd/ipc.sock"  # mod_ccache on /near/N in the SQLite Apache only
# A mod_rdma with RDMAInlineBelow (issue 30 part 1) answers files below it
# inline by default (512K: every picture); 0 sends the pictures by RDMA,
# which is what this test checks.
ZS_RDMA_CONF=""
grep -q RDMAInlineBelow "$MOD" && ZS_RDMA_CONF="RDMAInlineBelow 0"
zs_apache_conf sqlite "$P_SQL" "sqlite:$T/data/zipsite.db" "$MOD"
if pid=$(zs_apache_start sqlite "$P_SQL"); then PIDS+=("$pid"); ok "Apache (prefork) + mod_php + mod_rdma on SQLite starts (port $P_SQL)"; else
    PIDS+=("$pid"); bad "Apache with mod_php and mod_rdma did not start"; finish; fi
BASES=("http://127.0.0.1:$P_SQL")
if [ "$HAVE_PG" = 1 ]; then
    ZS_CCACHE_IPC="" zs_apache_conf pgsql "$P_PG" "$(zs_pg_dsn)" "$MOD"
    if pid=$(zs_apache_start pgsql "$P_PG"); then PIDS+=("$pid"); ok "the same on PostgreSQL starts (port $P_PG)"; BASES+=("http://127.0.0.1:$P_PG"); else
        PIDS+=("$pid"); bad "Apache on PostgreSQL did not start"; fi
fi

# ---- against the reference ------------------------------------------------------------
t_reference() {
    (cd "$ROOT/apps/zipsite" && timeout 240 python3 reference.py check "$@")
}
for b in "${BASES[@]}"; do
    db=SQLite
    [ "$b" = "http://127.0.0.1:$P_PG" ] && db=PostgreSQL
    check "$db: 36 queries equal to the reference (ids, order, distances to 0.01 mi); bad input 400; person pages" t_reference "$b"
done
grep -h "results per page" "$T"/check-*.log | sed 's/^#/  /' | sort -u

# ---- a page with its pictures, the pictures by RDMA ------------------------------------------
# As a browser does: the page, then the <img src> it names, all of them in
# one rhttp invocation (one keep-alive HTTP connection, one RDMA connection).
t_rhttp_page() {
    local n=0 id src args=()
    timeout 60 "$RHTTP" -q --timeout 20 get "${BASES[0]}/near.php?zip=$PAGE_ZIP&miles=$PAGE_MILES" -o "$T/page.html" || return 1
    mkdir -p "$T/got"
    while read -r src; do
        args+=("${BASES[0]}$src" -o "$T/got/${src##*/}")
    done < <(grep -o '<img src="[^"]*"' "$T/page.html" | cut -d'"' -f2)
    timeout 120 "$RHTTP" -q --timeout 20 get --stats "${args[@]}" 2>"$T/rhttp.err" || { tail "$T/rhttp.err"; return 1; }
    tail -2 "$T/rhttp.err"
    while read -r id; do
        cmp -s "$T/www/pics/$id.png" "$T/got/$id.png" || { echo "picture $id differs or is missing"; return 1; }
        n=$((n + 1))
    done <"$T/page-ids"
    echo "$n pictures equal; the page names $((${#args[@]} / 3))"
    [ "$n" -gt 50 ] && [ "$n" -eq $((${#args[@]} / 3)) ] || return 1
    [ "$(grep -c 'pics/[0-9]*\.png: 200 [0-9]* bytes via RDMA' "$T/rhttp.err")" -eq "$n" ] &&
        grep -q "$n bodies by RDMA, [0-9]* body bytes, 1 HTTP connections, 1 RDMA connections" "$T/rhttp.err"
}
check "page $PAGE_ZIP within $PAGE_MILES mi, then its pictures in one rhttp (1 HTTP + 1 RDMA connection): every picture by RDMA, equal to the generator's" t_rhttp_page

# ---- the coherent cache in front ------------------------------------------------------
t_cache() {
    zs_cache_start "$P_SQL" "$P_PROXY" || return 1
    PIDS+=("$ZS_PROXY_PID" "$ZS_APPD_PID")
    (cd "$ROOT/apps/zipsite" && timeout 120 python3 reference.py check-cache "http://127.0.0.1:$P_PROXY" "${BASES[0]}")
}
check "ccproxy (rdma version checks) + ccappd + mod_ccache in front: /near/N a miss then a hit, equal to the reference and to the direct page" t_cache

t_no_crash() { ! grep -h -E "Segmentation fault|exit signal|AH00052|PHP Fatal" "$T"/sqlite/error.log "$T"/pgsql/error.log 2>/dev/null; }
check "no Apache child crashed, no PHP fatal error (error logs)" t_no_crash
echo "zipsite: $(($(date +%s) - START)) s"
finish
