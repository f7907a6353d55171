#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# rhttp's wget -r (issue 30 part 3) against an unmodified Debian apache2
# (prefork) with mod_rdma, started in the foreground on loopback ports with
# its own config (as scripts/test-modrdma.sh does):
#
#   (a) a page of 20 images and a stylesheet: `rhttp get -r` fetches all 22
#       objects by RDMA over 1 HTTP and 1 RDMA connection (rhttp's --stats
#       and the server log: 1 connect-back, 21 reuses), SHA-256 equal, saved
#       in wget's layout (-P DIR/127.0.0.1:PORT/page20/...);
#   (b) the seed's directory of five 1 MB files as Apache's autoindex:
#       `rhttp get -r -np` fetches the listing and the five files, SHA-256
#       equal, 1 HTTP + 1 RDMA connection, the parent directory not followed;
#   (c) the page again where mod_rdma's RDMAInlineBelow (default 512K)
#       answers the small objects inline: same files, 1 HTTP connection.
#
# Then a measurement (not a check): `rhttp get -r` (RDMA, mod_rdma) and
# `rhttp --plain get -r` and Debian's `wget -r` against plain Apache for the
# five-file directory, ROUNDS interleaved rounds (default 7), medians.
#
#   scripts/test-rhttp-recursive.sh        # about 10-20 s after the build
#   KEEP=1 ROUNDS=11 scripts/test-rhttp-recursive.sh
#
# Installs apache2, apache2-dev, wget, curl and python3 if missing. Last
# line: "rhttp-recursive: N passed, N failed"; exit status non-zero on
# failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
PASS=0
FAIL=0
T="$(mktemp -d /tmp/rhttp-rec.XXXXXX)"
chmod 755 "$T"
APID=""
PPID_PLAIN=""
ROUNDS="${ROUNDS:-7}"

cleanup() {
    apache_stop "$APID" "$PPID_PLAIN"
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
    echo "rhttp-recursive: $PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

# ---- prerequisites ---------------------------------------------------------
apache_install apache2 apxs=apache2-dev wget curl python3 || { bad "prerequisites (the line above names the missing one)"; finish; }

echo "building libiwarp, rhttp and mod_rdma"
if ! timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp; then bad "cargo build"; finish; fi
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
if ! timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" >"$T/build.log" 2>&1 ||
    [ ! -f modules/mod_rdma/.libs/mod_rdma.so ]; then
    bad "mod_rdma build"; cat "$T/build.log"; finish
fi
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"

# ---- content ---------------------------------------------------------------
PORTS="$T/ports"
P1=$(free_port_once "$PORTS")   # mod_rdma, RDMAInlineBelow 0: every body by RDMA
P2=$(free_port_once "$PORTS")   # mod_rdma vhost, the default RDMAInlineBelow
P3=$(free_port_once "$PORTS")   # plain Apache, no module
DOCS="$T/docs"
mkdir -p "$DOCS/page20/img" "$DOCS/files5" "$T/out" "$T/run" "$T/logs" "$T/plainrun" "$T/plainlogs"
{
    echo '<!DOCTYPE html><html><head><title>20 images</title>'
    echo '<link rel="stylesheet" href="style.css"></head><body>'
    echo '<a href="http://192.0.2.1/elsewhere.html">another host: never followed</a>'
    for i in $(seq -w 1 20); do
        head -c "$((10#$i * 7 + 3))K" /dev/urandom >"$DOCS/page20/img/p$i.jpg"
        echo "<img src=\"img/p$i.jpg\" alt=\"picture $i\">"
    done
    echo '</body></html>'
} >"$DOCS/page20/index.html"
echo "img { margin: 1px }" >"$DOCS/page20/style.css"
for i in 1 2 3 4 5; do head -c 1M /dev/urandom >"$DOCS/files5/file$i.bin"; done
chmod -R a+rX "$DOCS"

common_conf() { # $1 = runtime dir, $2 = log dir
    apache_conf_head "$1" "$2" mime dir autoindex
    apache_prefork 2 1 2 2
    cat <<EOF
LogFormat "%h %l %u %t \"%r\" %>s %b" common
CustomLog $2/access.log common
KeepAlive On
KeepAliveTimeout 5
MaxKeepAliveRequests 1000
TypesConfig /etc/mime.types
DocumentRoot $DOCS
DirectoryIndex index.html
<Directory />
    Require all granted
    Options +Indexes
    IndexOptions SuppressColumnSorting
</Directory>
EOF
}
{
    common_conf "$T/run" "$T/logs"
    cat <<EOF
Listen 127.0.0.1:$P1
Listen 127.0.0.1:$P2
LoadModule rdma_module $MOD
LogLevel warn rdma:debug
RDMARegistration dynamic
RDMAInlineBelow 0
<Location />
    RDMA On
</Location>
<VirtualHost 127.0.0.1:$P2>
    RDMAInlineBelow 512K
</VirtualHost>
EOF
} >"$T/rdma.conf"
{
    common_conf "$T/plainrun" "$T/plainlogs"
    echo "Listen 127.0.0.1:$P3"
    echo "LogLevel warn"
} >"$T/plain.conf"

if APID=$(apache_start "$T/rdma.conf" "$P1" "$T/apache-stdout.log"); then ok "apache2 with mod_rdma starts (port $P1)"; else
    bad "apache2 with mod_rdma did not start"; apache_logs "$T/apache-stdout.log" "$T/logs/error.log"; finish; fi
if PPID_PLAIN=$(apache_start "$T/plain.conf" "$P3" "$T/apache-stdout.log"); then ok "plain apache2 starts (port $P3)"; else
    bad "plain apache2 did not start"; apache_logs "$T/apache-stdout.log" "$T/plainlogs/error.log"; finish; fi

U1="http://127.0.0.1:$P1"
U2="http://127.0.0.1:$P2"
U3="http://127.0.0.1:$P3"
R() { timeout 60 "$RHTTP" -q --timeout 20 "$@"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
connects() { grep -c "connected to the client's RDMA listener" "$T/logs/error.log"; }
reuses() { grep -c "reusing the RDMA connection" "$T/logs/error.log"; }
# same_tree SRC DST: every file under SRC has an equal file (SHA-256) in
# DST, and DST holds nothing else.
same_tree() {
    local f n=0
    while IFS= read -r f; do
        n=$((n + 1))
        [ -f "$2/$f" ] || { echo "missing: $f"; return 1; }
        [ "$(sha "$1/$f")" = "$(sha "$2/$f")" ] || { echo "differs: $f"; return 1; }
    done < <(cd "$1" && find . -type f | sort)
    [ "$(find "$2" -type f | wc -l)" -eq "$n" ] || { echo "extra files:"; find "$2" -type f; return 1; }
    echo "$n files equal (SHA-256)"
}

# ---- (a) the page of 20 images ------------------------------------------------
t_page20() {
    local d="$T/out/page20" c0 r0 c1 r1
    rm -rf "$d"
    c0=$(connects)
    r0=$(reuses)
    R get -r --stats -P "$d" "$U1/page20/" 2>"$d.err" || { cat "$d.err"; return 1; }
    c1=$(connects)
    r1=$(reuses)
    cat "$d.err"
    same_tree "$DOCS/page20" "$d/127.0.0.1:$P1/page20" || return 1
    [ "$(grep -c "via RDMA (server-writes)" "$d.err")" -eq 22 ] || return 1
    grep -q "stats: 22 requests, 22 bodies by RDMA, .* 1 HTTP connections, 1 RDMA connections" "$d.err" || return 1
    grep -q "^Downloaded: 22 files, " "$d.err" || return 1
    grep -q "links not followed: 1 to other hosts" "$d.err" || return 1
    echo "server: $((c1 - c0)) connect-backs, $((r1 - r0)) reuses"
    [ $((c1 - c0)) -eq 1 ] && [ $((r1 - r0)) -eq 21 ]
}
check "rhttp get -r: a page of 20 images and a stylesheet, 22 objects by RDMA over 1 HTTP and 1 RDMA connection (server log: 1 connect-back, 21 reuses), SHA-256 equal, saved as wget saves them" t_page20

# ---- (b) the five-file directory (autoindex) ---------------------------------
t_files5() {
    local d="$T/out/files5" c0 c1 i
    rm -rf "$d"
    c0=$(connects)
    R get -r -np --stats --scheme "$1" -P "$d" "$U1/files5/" 2>"$d.err" || { cat "$d.err"; return 1; }
    c1=$(connects)
    cat "$d.err"
    for i in 1 2 3 4 5; do
        [ "$(sha "$DOCS/files5/file$i.bin")" = "$(sha "$d/127.0.0.1:$P1/files5/file$i.bin")" ] || { echo "file$i differs"; return 1; }
    done
    [ "$(find "$d" -type f | wc -l)" -eq 6 ] || { find "$d" -type f; return 1; }
    grep -q "above the start (--no-parent)" "$d.err" || return 1
    [ "$(grep -c "via RDMA ($1)" "$d.err")" -eq 6 ] || return 1
    grep -q "stats: 6 requests, 6 bodies by RDMA, .* 1 HTTP connections, 1 RDMA connections" "$d.err" || return 1
    echo "server: $((c1 - c0)) connect-backs"
    [ $((c1 - c0)) -eq 1 ]
}
check "rhttp get -r -np, server-writes: the autoindex of five 1 MB files and the files, 6 bodies by RDMA over 1 HTTP and 1 RDMA connection, parent not followed, SHA-256 equal" t_files5 server-writes
check "rhttp get -r -np, client-reads: as above" t_files5 client-reads

# ---- (c) small objects inline (RDMAInlineBelow 512K) ---------------------------
t_inline() {
    local d="$T/out/inline"
    rm -rf "$d"
    R get -r -nH --stats -P "$d" "$U2/page20/" 2>"$d.err" || { cat "$d.err"; return 1; }
    cat "$d.err"
    same_tree "$DOCS/page20" "$d/page20" || return 1
    grep -q "stats: 22 requests, .* 1 HTTP connections" "$d.err"
}
check "rhttp get -r -nH against the default RDMAInlineBelow (objects below 512K answered inline): the same 22 files, 1 HTTP connection" t_inline

# ---- measurement: rhttp -r against wget -r, the five-file directory ------------
# Each run from process start to exit, into a fresh directory; the three
# tools interleaved in each round; medians. wget and rhttp --plain against
# plain Apache (no module), rhttp by RDMA (server-writes) against mod_rdma.
ms_now() { date +%s%N; }
run_one() { # $1 tool, $2 dir
    case "$1" in
    wget) timeout 60 wget -q -r -np -P "$2" "$U3/files5/" ;;
    plain) R --plain get -r -np -P "$2" "$U3/files5/" 2>/dev/null ;;
    rdma) R get -r -np -P "$2" "$U1/files5/" 2>/dev/null ;;
    esac
}
t_bench() {
    local tool r t0 t1 d
    for tool in wget plain rdma; do : >"$T/bench-$tool"; done
    for r in $(seq 1 "$ROUNDS"); do
        for tool in wget plain rdma; do
            d="$T/bench/$tool-$r"
            rm -rf "$d"
            t0=$(ms_now)
            run_one "$tool" "$d" || { echo "$tool failed in round $r"; return 1; }
            t1=$(ms_now)
            echo $(((t1 - t0) / 1000)) >>"$T/bench-$tool"
            # Every tool fetched the same five files.
            for i in 1 2 3 4 5; do
                cmp -s "$DOCS/files5/file$i.bin" "$(find "$d" -name "file$i.bin" | head -1)" ||
                    { echo "$tool round $r: file$i differs"; return 1; }
            done
            rm -rf "$d"
        done
    done
    python3 - "$T" "$ROUNDS" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" <<'PY'
import statistics, sys
t, rounds, cores, cpu = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [("wget", "wget -r -np (Debian), plain Apache"),
        ("plain", "rhttp --plain get -r -np, plain Apache"),
        ("rdma", "rhttp get -r -np (server-writes), Apache + mod_rdma")]
med = {}
print(f"five 1 MB files + the autoindex page, {rounds} interleaved rounds, {cores} cores ({cpu}):")
print("| client | median ms | range ms | MB/s (5 MiB / median) |")
print("| --- | --- | --- | --- |")
for k, name in rows:
    v = [int(x) / 1000 for x in open(f"{t}/bench-{k}").read().split()]
    med[k] = statistics.median(v)
    print(f"| {name} | {med[k]:.1f} | {min(v):.1f}-{max(v):.1f} | {5 * 1048576 / med[k] / 1e3:.0f} |")
print(f"rhttp -r by RDMA / wget -r: {med['rdma'] / med['wget']:.2f}x; rhttp --plain -r / wget -r: {med['plain'] / med['wget']:.2f}x")
PY
}
check "measurement: rhttp get -r (RDMA) vs rhttp --plain get -r vs wget -r, five 1 MB files, $ROUNDS interleaved rounds (every run's files equal; timing not asserted)" t_bench
sed -n '/^five 1 MB files/,/^rhttp -r by RDMA/p' "$T/check-$((PASS + FAIL)).log"

finish
