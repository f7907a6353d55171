#!/usr/bin/env bash
# HTTP in the WAN (issue 27 §4): a web page and the objects it links,
# fetched through the packet-level path emulator (tools/wanem) at 50 ms RTT,
# by rhttp with each mod_rdma scheme against curl and wget over plain HTTP
# keep-alive. Apache (prefork, mod_rdma, RDMARegistration dynamic) runs in
# the path's namespace b, every client in namespace a, so both kernels' TCP
# see the delay end to end (and the server's connect-back crosses the path
# too).
#
#   scripts/bench-wan-http.sh                 # both pages, 5 rounds (~3 min)
#   ROUNDS=3 RTT=100ms RATE=200mbit scripts/bench-wan-http.sh
#   PAGES=page20 VARIANTS="curl rhttp-sw" scripts/bench-wan-http.sh
#   OUT=/tmp/x.md scripts/bench-wan-http.sh   # where the table goes
#   LOSS=0.1% CC=bbr scripts/bench-wan-http.sh  # random loss on the path;
#                                      # RDMACongestion and the TCP default of
#                                      # both namespaces (plain HTTP too)
#
# Pages (made here, same bytes every run: seeded):
#   page20  an HTML page with 20 images of 30-200 KB (the seed's "1 page
#           with 20 images")
#   files5  a page linking five 1 MB files (the seed's "five 1 MB files with
#           wget -r over one connection")
# Variants (each fetches the page, then every object it links, over one
# HTTP connection):
#   curl       curl, the page's and the objects' URLs in one invocation (one
#              keep-alive connection, one request at a time)
#   wget       wget -r -l1 (parses the page; keep-alive, one at a time)
#   plain      rhttp --plain get -r (plain HTTP, one at a time)
#   rhttp-sw1  rhttp get -r --scheme server-writes --pipeline 1 (RDMA,
#              one connection reused, one request at a time: the state
#              before pipelining)
#   rhttp-sw   rhttp get -r --scheme server-writes (8 requests in flight)
#   rhttp-cr   rhttp get -r --scheme client-reads (8 in flight)
# Each round runs every variant once, in turn (interleaved, so drift on a
# busy machine hits all alike); the table gives the median and range of
# the page times, the body bytes saved and the bytes that crossed the path
# (IP packets both ways, from wanem's counters). A second table times
# single requests (2 KB) on a fresh connection and on a reused one, in
# RTTs, to confirm the round-trip counts of docs/MOD_RDMA.md.
#
# Needs root (namespaces), apache2, curl, wget (installed if missing), and
# builds wanem, rhttp, libiwarp and mod_rdma. Last line: the table's path.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-5}"
RTT="${RTT:-50ms}"
RATE="${RATE:-1gbit}"
LOSS="${LOSS:-}"
CC="${CC:-}"
PAGES="${PAGES:-page20 files5}"
VARIANTS="${VARIANTS:-curl wget plain rhttp-sw1 rhttp-sw rhttp-cr}"
OUT="${OUT:-$ROOT/docs/bench/wan_http.md}"
TAG="${WAN_TAG_HTTP:-httpb$$}"
T="$(mktemp -d /tmp/benchwanhttp.XXXXXX)"
chmod 755 "$T"

# The Apache set-up the end-to-end scripts share (apache_*).
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
apache_install apache2 apxs=apache2-dev curl wget || exit 1
echo "building wanem, libiwarp, rhttp and mod_rdma"
timeout 1800 cargo build --release -q -p wanem -p iwarp-ffi -p rhttp
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" >"$T/make.log" 2>&1 ||
    { cat "$T/make.log"; exit 1; }
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"

# shellcheck source=scripts/lib/wan.sh
. "$ROOT/scripts/lib/wan.sh"
cleanup() {
    wan_down "$TAG"
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
WAN_LOG_DIR="$T" wan_up "$TAG" --rtt "$RTT" --rate "$RATE" --queue bdp ${LOSS:+--loss "$LOSS"}
if [ -n "$CC" ]; then
    # Every TCP connection of the run, plain HTTP's and the RDMA ones, uses
    # it (tcp(7): net.ipv4.tcp_congestion_control is per namespace).
    # A namespace other than the first may pick only an algorithm that
    # tcp_allowed_congestion_control lists (and the Apache workers too).
    for ns in wan_a wan_b; do
        "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$CC" || {
            echo "CC=$CC cannot be set in the path's namespaces. Fix: add it to" \
                "/proc/sys/net/ipv4/tcp_allowed_congestion_control (now: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control))" >&2
            exit 1
        }
    done
fi
B="$(wan_addr_b)"
PORT=8080
U="http://$B:$PORT"

# ---- content ------------------------------------------------------------
DOCS="$T/docs"
mkdir -p "$DOCS/page20" "$DOCS/files5" "$DOCS/tiny" "$T/run" "$T/logs"
python3 - "$DOCS" <<'EOF'
import random, sys
d = sys.argv[1]
rnd = random.Random(27)
def blob(n):
    return bytes(rnd.getrandbits(8) for _ in range(n)) if n < 4096 else rnd.randbytes(n)
imgs = []
for i in range(20):
    n = rnd.randint(30, 200) * 1024
    open(f"{d}/page20/img{i:02d}.jpg", "wb").write(blob(n))
    imgs.append(f"img{i:02d}.jpg")
with open(f"{d}/page20/index.html", "w") as f:
    f.write("<!doctype html><html><head><title>20 images</title></head><body>\n")
    f.write("<p>" + "text " * 400 + "</p>\n")
    for x in imgs:
        f.write(f'<img src="{x}" alt="{x}">\n')
    f.write("</body></html>\n")
with open(f"{d}/files5/index.html", "w") as f:
    f.write("<!doctype html><html><body>\n")
    for i in range(5):
        open(f"{d}/files5/file{i}.bin", "wb").write(blob(1 << 20))
        f.write(f'<a href="file{i}.bin">file {i}</a>\n')
    f.write("</body></html>\n")
open(f"{d}/tiny/a.bin", "wb").write(blob(2048))
EOF
chmod -R a+rX "$DOCS"

{
    apache_conf_head "$T/run" "$T/logs" mime dir dav dav_fs
    echo "LoadModule rdma_module $MOD"
    apache_prefork 4 2 4 4
    cat <<EOF
# The server's own name on the path (the head names 127.0.0.1).
ServerName $B
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 10
TypesConfig /etc/mime.types
DocumentRoot $DOCS
DirectoryIndex index.html
DavLockDB $T/davlock/lock
Listen $B:$PORT
LogLevel warn
RDMARegistration dynamic
${CC:+RDMACongestion $CC}
<Directory />
    Require all granted
</Directory>
<Location />
    RDMA On
</Location>
<Location /dav>
    Dav On
</Location>
EOF
} >"$T/httpd.conf"
mkdir -p "$DOCS/dav" "$T/davlock"
chown www-data:www-data "$DOCS/dav" "$T/davlock"
# In namespace b, probed from a (wan.sh names them wan-TAG-a and -b);
# wan_down stops it with everything else in the namespaces.
APACHE_NETNS="wan-$WAN_TAG-b" APACHE_PROBE_NETNS="wan-$WAN_TAG-a" APACHE_PROBE_URL="$U/tiny/a.bin" \
    apache_start "$T/httpd.conf" "$PORT" "$T/logs/stdout" >/dev/null ||
    { apache_logs "$T/logs/stdout" "$T/logs/error.log"; exit 1; }
wan_a curl -sf -o /dev/null --max-time 5 "$U/tiny/a.bin" || { apache_logs "$T/logs/stdout" "$T/logs/error.log"; exit 1; }

now_ns() { date +%s%N; }
# wire bytes both ways so far (IP packets through the emulator)
wire() { wan_ctl stats | sed -n 's/.*fwd_bytes=\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}'; }

# run_variant VARIANT PAGE DIR: fetch the page and its objects into DIR.
run_variant() {
    local v="$1" page="$2" d="$3" urls=() f
    case "$v" in
    curl)
        # The page, then its objects in page order (what a browser or
        # wget -r asks for), over one connection.
        urls=(-o index.html "$U/$page/")
        while read -r f; do
            urls+=(-o "$f" "$U/$page/$f")
        done < <(sed -n 's/.*\(src\|href\)="\([^"]*\)".*/\2/p' "$DOCS/$page/index.html")
        mkdir -p "$d"
        (cd "$d" && wan_a curl -sS --fail --max-time 120 "${urls[@]}")
        ;;
    wget) wan_a wget -q -r -l1 -nH -e robots=off -P "$d" --timeout=60 "$U/$page/" ;;
    plain) wan_a "$RHTTP" -q --plain get -r -l 1 -nH -e robots=off -P "$d" "$U/$page/" 2>/dev/null ;;
    rhttp-sw1) wan_a "$RHTTP" -q get -r -l 1 -nH -e robots=off --pipeline 1 --scheme server-writes -P "$d" "$U/$page/" 2>/dev/null ;;
    rhttp-sw) wan_a "$RHTTP" -q get -r -l 1 -nH -e robots=off --scheme server-writes -P "$d" "$U/$page/" 2>/dev/null ;;
    rhttp-cr) wan_a "$RHTTP" -q get -r -l 1 -nH -e robots=off --scheme client-reads -P "$d" "$U/$page/" 2>/dev/null ;;
    *) echo "unknown variant $v" >&2; return 1 ;;
    esac
}

# The objects' bytes must be the server's, whoever fetched them.
verify() { # DIR PAGE
    local f n=0
    for f in "$DOCS/$2"/*; do
        local g="$1/$2/${f##*/}"
        [ -f "$g" ] || g="$1/${f##*/}"
        [ "${f##*/}" = index.html ] && continue
        cmp -s "$f" "$g" || { echo "MISMATCH $g" >&2; return 1; }
        n=$((n + 1))
    done
    echo "$n"
}

declare -A TIMES BYTES WIRE
for page in $PAGES; do
    for r in $(seq 1 "$ROUNDS"); do
        for v in $VARIANTS; do
            d="$T/out/$page-$v-$r"
            w0=$(wire)
            t0=$(now_ns)
            run_variant "$v" "$page" "$d" || { echo "$v $page round $r failed" >&2; exit 1; }
            t1=$(now_ns)
            w1=$(wire)
            n=$(verify "$d" "$page")
            ms=$(((t1 - t0) / 1000000))
            TIMES["$page/$v"]+="$ms "
            BYTES["$page/$v"]=$(find "$d" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
            WIRE["$page/$v"]+="$((w1 - w0)) "
            echo "$page round $r $v: $ms ms, $n objects, wire $((w1 - w0)) bytes"
            rm -rf "$d"
        done
    done
done

median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
range() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}'; }

# ---- single requests, in RTTs ------------------------------------------
rtt_ms="${RTT%ms}"
single() { # label, then the command; prints the ms of each GET/PUT line
    local label="$1"
    shift
    local out
    out=$(wan_a "$@" 2>&1) || { echo "$label: FAILED: $out"; return 0; }
    echo "$out" | sed -n 's/.* via \(.*\) in \([0-9.]*\) ms.*/\2 ms (\1)/p' | tr '\n' ' ' | sed "s/^/$label: /"
    echo
}
head -c 2048 /dev/urandom >"$T/up.bin"
{
    single "plain GET" "$RHTTP" -q --plain get "$U/tiny/a.bin" "$U/tiny/a.bin" -o /dev/null -o /dev/null
    single "server-writes GET" "$RHTTP" -q get --scheme server-writes "$U/tiny/a.bin" "$U/tiny/a.bin" -o /dev/null -o /dev/null
    single "client-reads GET" "$RHTTP" -q get --scheme client-reads "$U/tiny/a.bin" "$U/tiny/a.bin" -o /dev/null -o /dev/null
    single "plain PUT" "$RHTTP" -q --plain put "$T/up.bin" "$U/dav/up.bin"
    single "server-reads PUT" "$RHTTP" -q put --scheme server-reads "$T/up.bin" "$U/dav/up.bin"
    single "client-writes PUT" "$RHTTP" -q put --scheme client-writes "$T/up.bin" "$U/dav/up.bin"
} >"$T/single.txt"
cat "$T/single.txt"

cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
{
    echo "#### HTTP through the WAN emulator: $RTT RTT, $RATE, bdp queue, ${LOSS:-no} loss, congestion control ${CC:-$(wan_b cat /proc/sys/net/ipv4/tcp_congestion_control) (default)}"
    echo
    echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') at commit $(git rev-parse --short HEAD) on $(nproc) cores ($cpu), by \`scripts/bench-wan-http.sh\`"
    echo "(ROUNDS=$ROUNDS, interleaved; Apache prefork with mod_rdma, RDMARegistration dynamic, in namespace b; clients in a)."
    echo "Page time: from starting the client to its exit (the page, then every object it links, one HTTP connection)."
    echo
    echo "| page | variant | median ms | range ms | RTTs (median / RTT) | body bytes | bytes on the path (median) |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    for page in $PAGES; do
        for v in $VARIANTS; do
            m=$(echo "${TIMES[$page/$v]}" | median)
            echo "| $page | $v | $m | $(echo "${TIMES[$page/$v]}" | range) | $(awk -v m="$m" -v r="$rtt_ms" 'BEGIN {printf "%.1f", m / r}') | ${BYTES[$page/$v]} | $(echo "${WIRE[$page/$v]}" | median) |"
        done
    done
    echo
    echo "Single 2 KB requests (ms of the first request, which opens the RDMA connection, and of the second, which reuses it; the HTTP connection is already open):"
    echo
    echo '```text'
    cat "$T/single.txt"
    echo '```'
    echo
    echo "wanem: $(wan_ctl stats | tr '\n' ' ')"
} >"$OUT"
cat "$OUT"
echo "$OUT"
