#!/usr/bin/env bash
# 1 MB GETs over HTTPS: mod_rdma with the RDMA body sealed under the TLS
# session (rhttp, server-writes with and without MPA CRC, client-reads;
# the AEAD tags already protect the sealed body) against plain HTTPS from
# the same Apache (rhttp --plain, and curl), on loopback
# (docs/MOD_RDMA.md, "HTTPS" under Benchmarks).
#
# Apache (prefork) with mod_ssl and mod_rdma (RDMARegistration dynamic),
# a test CA made here. Each round runs every variant once, interleaved:
# one client process fetches the 1 MiB file N times over one keep-alive
# HTTPS connection (and one RDMA connection); the per-request times are
# the client's own (rhttp's result lines, curl's %{time_total}), the first
# request of each run left out (it pays the TLS handshake and, by RDMA,
# the connect-back). Reported: the median per variant over all rounds,
# and the median of the per-round ratios to rhttp --plain.
#
#   scripts/bench-modrdma-https.sh                  # ROUNDS=7 N=10
#   ROUNDS=11 N=20 scripts/bench-modrdma-https.sh
#   NO_BUILD=1 scripts/bench-modrdma-https.sh       # skip cargo build
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
ROUNDS="${ROUNDS:-7}"
N="${N:-10}"
T="$(mktemp -d /tmp/bench-https.XXXXXX)"
chmod 755 "$T"
APID=""
# The Apache set-up the end-to-end scripts share (apache_*), and ports.
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
cleanup() {
    apache_stop "$APID"
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT
die() { echo "bench-modrdma-https: $*" >&2; exit 1; }

# seal.c includes OpenSSL's headers.
[ -f /usr/include/openssl/ssl.h ] || apt_install libssl-dev
apache_install apache2 apxs=apache2-dev curl openssl python3 || die "prerequisites missing"
if [ "${NO_BUILD:-0}" != 1 ]; then
    timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp || die "cargo build failed"
fi
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" >"$T/build.log" 2>&1 || { cat "$T/build.log"; die "mod_rdma build failed"; }
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"

printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$T/ext.cnf"
{ openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj "/CN=bench CA" -keyout "$T/ca.key" -out "$T/ca.pem" &&
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
      -keyout "$T/key.pem" -out "$T/srv.csr" &&
  openssl x509 -req -in "$T/srv.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
      -days 2 -extfile "$T/ext.cnf" -out "$T/cert.pem"; } >"$T/openssl.log" 2>&1 || { cat "$T/openssl.log"; die "openssl failed"; }
chmod 644 "$T/key.pem"
mkdir -p "$T/docs" "$T/run"
head -c 1048576 /dev/urandom >"$T/docs/1m.bin"
PORT=$(free_port_once "$T/ports")
{
    apache_conf_head "$T/run" "$T" mime socache_shmcb ssl
    echo "LoadModule rdma_module $MOD"
    # 256: prefork's own ServerLimit and MaxRequestWorkers.
    apache_prefork 4 2 4 256
    cat <<EOF
KeepAlive On
MaxKeepAliveRequests 1000
TypesConfig /etc/mime.types
DocumentRoot $T/docs
LogLevel warn
Listen 127.0.0.1:$PORT
SSLEngine on
SSLSessionCache shmcb:$T/run/ssl_scache(512000)
SSLCertificateFile $T/cert.pem
SSLCertificateKeyFile $T/key.pem
RDMARegistration dynamic
<Directory />
    Require all granted
</Directory>
<Location />
    RDMA On
</Location>
EOF
} >"$T/httpd.conf"
APID=$(APACHE_PROBE_URL="https://127.0.0.1:$PORT/" apache_start "$T/httpd.conf" "$PORT" "$T/apache.out") ||
    { apache_logs "$T/apache.out" "$T/error.log" >&2; die "apache2 did not start"; }
URL="https://127.0.0.1:$PORT/1m.bin"
urls=() outs=()
for _ in $(seq 1 "$N"); do urls+=("$URL"); outs+=(-o /dev/null); done

run_rhttp() { # $1 variant file, $2 the get scheme, then global rhttp options
    local f="$1" scheme="$2"
    shift 2
    local raw="$T/raw-${f##*/}"
    "$RHTTP" -q --cacert "$T/ca.pem" "$@" get --scheme "$scheme" "${urls[@]}" "${outs[@]}" >"$raw" 2>&1
    sed -n 's/.* bytes via \(.*\) in \([0-9.]*\) ms .*/\2 \1/p' "$raw" | tail -n +2 >>"$f"
}
run_curl() {
    local args=() i
    for i in $(seq 1 "$N"); do
        args+=("$URL" -o /dev/null)
        [ "$i" -lt "$N" ] && args+=(--next --cacert "$T/ca.pem" -s -w '%{time_total}\n')
    done
    curl --cacert "$T/ca.pem" -s -w '%{time_total}\n' "${args[@]}" |
        awk '{ printf "%.3f curl\n", $1 * 1000 }' | tail -n +2 >>"$1"
}
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

VARIANTS=(plain curl sealed-sw sealed-sw-nocrc sealed-cr-nocrc)
for r in $(seq 1 "$ROUNDS"); do
    for v in "${VARIANTS[@]}"; do
        f="$T/$v.$r"
        : >"$f"
        case "$v" in
            plain) run_rhttp "$f" server-writes --plain ;;
            curl) run_curl "$f" ;;
            sealed-sw) run_rhttp "$f" server-writes ;;
            sealed-sw-nocrc) run_rhttp "$f" server-writes --crc off ;;
            sealed-cr-nocrc) run_rhttp "$f" client-reads --crc off ;;
        esac
        [ "$v" = curl ] || grep -q . "$f" || die "variant $v produced no result lines: $(tail -n 5 "$T/raw-$v.$r")"
    done
done
grep -q "sealed" "$T/sealed-sw.1" || die "the sealed variant did not move bodies sealed by RDMA: $(cat "$T/sealed-sw.1")"

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "1 MiB GET over HTTPS on loopback, $(nproc) cores ($cpu), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ROUNDS=$ROUNDS interleaved, N=$N GETs per client run over one keep-alive connection (first left out); $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)"
echo
echo "| variant | median ms per GET | ratio to rhttp --plain (median of per-round ratios) |"
echo "| --- | --- | --- |"
for v in "${VARIANTS[@]}"; do
    m=$(cat "$T/$v".* | awk '{print $1}' | median)
    ratios=()
    for r in $(seq 1 "$ROUNDS"); do
        a=$(awk '{print $1}' "$T/$v.$r" | median)
        b=$(awk '{print $1}' "$T/plain.$r" | median)
        ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')")
    done
    rm=$(printf '%s\n' "${ratios[@]}" | median)
    name="$v"
    case "$v" in
        plain) name="rhttp --plain (HTTPS body)" ;;
        curl) name="curl (HTTPS body)" ;;
        sealed-sw) name="rhttp server-writes, sealed (MPA CRC required, rhttp's default)" ;;
        sealed-sw-nocrc) name="rhttp server-writes, sealed, --crc off" ;;
        sealed-cr-nocrc) name="rhttp client-reads, sealed, --crc off" ;;
    esac
    echo "| $name | $m | ${rm}x |"
done
