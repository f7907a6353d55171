#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# mod_rdma over HTTPS (docs/MOD_RDMA.md, "HTTPS"): Debian's apache2
# (prefork) with mod_ssl and mod_rdma, a test CA and server certificate made
# here with openssl, driven by rhttp (https:// URLs) and curl.
#
#  - server-writes and client-reads over HTTPS: the body is sealed under the
#    TLS session (AES-256-GCM, key from the TLS exporter), SHA-256 checked,
#    with dynamic and static registration;
#  - a tampered sealed body (one byte flipped in the server, by the test-only
#    environment variable MOD_RDMA_TEST_TAMPER_SEALED=1 of a second Apache,
#    and in the client, by rhttp's hidden --x-tamper-sealed) is refused by
#    the client with a clear error and no byte released, both schemes;
#  - RDMATLS off: no RDMA on TLS connections, the body comes in the HTTPS
#    response and rhttp says why;
#  - the module's refusals: RDMA over TLS without RDMA-Seal (400), RDMA-Seal
#    on plain HTTP (400), an upload by RDMA over TLS (403);
#  - with tshark: a capture of the loopback during a sealed fetch holds no
#    plaintext of the body (a marker string), while the same fetch over
#    plain HTTP does (so the capture would have seen it).
#
#   scripts/test-modrdma-https.sh          # about 15-30 s once built
#   KEEP=1 scripts/test-modrdma-https.sh   # keep the temp dir
#   NO_BUILD=1 scripts/test-modrdma-https.sh  # skip cargo build (already built)
#
# Last line: "modrdma-https: N passed, N failed"; exit status non-zero on
# failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
PASS=0
FAIL=0
T="$(mktemp -d /tmp/modrdma-https.XXXXXX)"
chmod 755 "$T"
APID=""
TPID=""

# The Apache set-up the end-to-end scripts share (apache_*).
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"

cleanup() {
    apache_stop "$APID" "$TPID"
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
skip() { echo "skip - $1"; }
check() {
    local name="$1"
    shift
    local log="$T/check-$((PASS + FAIL + 1)).log"
    if "$@" >"$log" 2>&1; then ok "$name"; else bad "$name (output below)"; tail -n 15 "$log" | sed 's/^/     /'; fi
}
finish() {
    echo "modrdma-https: $PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

# ---- prerequisites ---------------------------------------------------------
# seal.c includes OpenSSL's headers.
[ -f /usr/include/openssl/ssl.h ] || apt_install libssl-dev
apache_install apache2 apxs=apache2-dev curl openssl python3 || { bad "prerequisites"; finish; }

if [ "${NO_BUILD:-0}" = 1 ]; then
    echo "NO_BUILD=1: using the libiwarp and rhttp already built"
else
    echo "building libiwarp, rhttp and mod_rdma"
    if ! timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp; then bad "cargo build"; finish; fi
fi
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
if timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" >"$T/build.log" 2>&1 && [ -f modules/mod_rdma/.libs/mod_rdma.so ]; then
    ok "mod_rdma (with seal.c, linked to OpenSSL) builds with apxs"
else
    bad "mod_rdma build"; cat "$T/build.log"; finish
fi
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"

# Ports below the ephemeral range, each given once (scripts/lib/free-port.sh:
# a port taken from bind(:0) and released once went to two servers in CI).
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$T/ports"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---- certificate and content -------------------------------------------------
# A CA (given to rhttp with --cacert) and the server's certificate signed by
# it (webpki refuses a CA certificate as the server's own).
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$T/ext.cnf"
if ! { timeout 60 openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -days 2 -subj "/CN=mod_rdma test CA" -keyout "$T/ca.key" -out "$T/ca.pem" &&
    timeout 60 openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj /CN=127.0.0.1 -keyout "$T/key.pem" -out "$T/srv.csr" &&
    timeout 60 openssl x509 -req -in "$T/srv.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" \
        -CAcreateserial -days 2 -extfile "$T/ext.cnf" -out "$T/cert.pem"; } >"$T/openssl.log" 2>&1; then
    bad "openssl could not make the test certificates"; cat "$T/openssl.log"; finish
fi
chmod 644 "$T/key.pem"
DOCS="$T/docs"
mkdir -p "$DOCS"
MARKER="IWARP-SEAL-MARKER-7f3a9c"
# 1 MiB + 12345 bytes (17 records, the last one short) of a marker line: a
# plaintext byte of the body on the wire shows as the marker in a capture.
python3 - "$DOCS/big.bin" "$MARKER" <<'EOF'
import sys
line = (sys.argv[2] + " 0123456789abcdefghijklmnopqrstuvwxyz\n").encode()
n = (1 << 20) + 12345
open(sys.argv[1], "wb").write((line * (n // len(line) + 1))[:n])
EOF
head -c 600000 /dev/urandom >"$DOCS/r600k.bin"
P1=$(free_port) P2=$(free_port) P3=$(free_port) P4=$(free_port) P5=$(free_port)

conf() { # $1 = name, then extra lines on stdin; its error log: $T/logs-$1/error.log
    apache_conf_head "$T/run-$1" "$T/logs-$1" mime socache_shmcb ssl
    echo "LoadModule rdma_module $MOD"
    apache_prefork 2 1 2 2
    cat <<EOF
KeepAlive On
KeepAliveTimeout 2
TypesConfig /etc/mime.types
DocumentRoot $DOCS
LogLevel warn rdma:debug
SSLSessionCache shmcb:$T/run-$1/ssl_scache(512000)
SSLCertificateFile $T/cert.pem
SSLCertificateKeyFile $T/key.pem
RDMAConnectTimeout 2000
RDMATimeout 5000
<Directory />
    Require all granted
</Directory>
<Location />
    RDMA On
</Location>
EOF
    cat
}
mkdir -p "$T/run-main" "$T/run-tamper" "$T/logs-main" "$T/logs-tamper"
# P1: HTTPS, dynamic registration (RDMATLS encrypt is the default);
# P2: HTTPS, static registration; P3: HTTPS with RDMATLS off; P4: plain
# HTTP with RDMA (the capture's positive control, RDMA-Seal refused).
conf main >"$T/main.conf" <<EOF
Listen 127.0.0.1:$P1
Listen 127.0.0.1:$P2
Listen 127.0.0.1:$P3
Listen 127.0.0.1:$P4
<VirtualHost 127.0.0.1:$P1>
    SSLEngine on
    RDMARegistration dynamic
</VirtualHost>
<VirtualHost 127.0.0.1:$P2>
    SSLEngine on
    RDMARegistration static
    RDMABufferSize 4M
</VirtualHost>
<VirtualHost 127.0.0.1:$P3>
    SSLEngine on
    RDMATLS off
</VirtualHost>
<VirtualHost 127.0.0.1:$P4>
    RDMARegistration dynamic
</VirtualHost>
EOF
# P5: HTTPS with the test-only tamper hook in the environment.
conf tamper >"$T/tamper.conf" <<EOF
Listen 127.0.0.1:$P5
SSLEngine on
RDMARegistration dynamic
EOF

start_apache() { # $1 conf, $2 port (HTTPS only) -> pid on stdout
    APACHE_PROBE_URL="https://127.0.0.1:$2/" apache_start "$1" "$2" "$T/apache-stdout.log"
}

if ! timeout 20 apache2 -d /etc/apache2 -f "$T/main.conf" -t >"$T/conftest.log" 2>&1; then
    bad "apache2 -t with mod_ssl and mod_rdma"; cat "$T/conftest.log"; finish
fi
if APID=$(start_apache "$T/main.conf" "$P1"); then ok "apache2 with mod_ssl and mod_rdma starts"; else
    bad "apache2 did not start"; apache_logs "$T/apache-stdout.log" "$T/logs-main/error.log"; finish; fi
if TPID=$(MOD_RDMA_TEST_TAMPER_SEALED=1 start_apache "$T/tamper.conf" "$P5"); then
    ok "apache2 with MOD_RDMA_TEST_TAMPER_SEALED=1 starts"; else
    bad "the tamper apache2 did not start"; apache_logs "$T/apache-stdout.log" "$T/logs-tamper/error.log"; finish; fi

R=(timeout 60 "$RHTTP" -q --timeout 10 --cacert "$T/ca.pem")
BIG_SHA=$(sha "$DOCS/big.bin")
R600_SHA=$(sha "$DOCS/r600k.bin")

# ---- both schemes, sealed ------------------------------------------------------
t_sealed_out() { # $1 port, $2 scheme: the result lines say "sealed", stats 1 RDMA connection
    rm -f "$T/o1" "$T/o2"
    "${R[@]}" get --stats --scheme "$2" "https://127.0.0.1:$1/big.bin" "https://127.0.0.1:$1/r600k.bin" \
        -o "$T/o1" -o "$T/o2" >"$T/sealed.out" 2>&1
    local rc=$?
    cat "$T/sealed.out"
    [ "$rc" = 0 ] || return 1
    [ "$(grep -c "via RDMA ($2, sealed)" "$T/sealed.out")" = 2 ] || return 1
    grep -q ", 1 RDMA connections" "$T/sealed.out" || return 1
    [ "$(sha "$T/o1")" = "$BIG_SHA" ] && [ "$(sha "$T/o2")" = "$R600_SHA" ]
}
for s in server-writes client-reads; do
    check "$s over HTTPS, dynamic registration: two bodies sealed on one RDMA connection, SHA-256 equal" \
        t_sealed_out "$P1" "$s"
    check "$s over HTTPS, static registration: sealed, SHA-256 equal" t_sealed_out "$P2" "$s"
done

# ---- tampered bodies --------------------------------------------------------
t_tamper() { # $1 port, $2 scheme, then extra rhttp options
    local port="$1" scheme="$2"
    shift 2
    rm -f "$T/ot"
    "${R[@]}" get --scheme "$scheme" "$@" "https://127.0.0.1:$port/big.bin" -o "$T/ot" >"$T/tamper.out" 2>&1
    local rc=$?
    cat "$T/tamper.out"
    [ "$rc" != 0 ] || { echo "rhttp succeeded on a tampered body"; return 1; }
    grep -q "failed its AES-256-GCM authentication" "$T/tamper.out" || return 1
    # No byte released: the output is empty (or was never made).
    [ ! -s "$T/ot" ] || { echo "$(stat -c %s "$T/ot") bytes were written"; return 1; }
}
for s in server-writes client-reads; do
    check "$s: a byte flipped in the server (MOD_RDMA_TEST_TAMPER_SEALED) is refused, nothing released" \
        t_tamper "$P5" "$s"
    check "$s: a byte flipped in the client (--x-tamper-sealed) is refused, nothing released" \
        t_tamper "$P1" "$s" --x-tamper-sealed
done
t_tamper_logged() { grep -q "TEST HOOK: flipped byte" "$T/logs-tamper/error.log"; }
check "the tamper hook says so in the server's log" t_tamper_logged

# ---- RDMATLS off ------------------------------------------------------------
t_tls_off() {
    rm -f "$T/oo"
    "${R[@]}" get --stats "https://127.0.0.1:$P3/big.bin" -o "$T/oo" >"$T/off.out" 2>&1
    local rc=$?
    cat "$T/off.out"
    [ "$rc" = 0 ] || return 1
    grep -q "RDMATLS off" "$T/off.out" || return 1
    grep -q "via plain HTTP (fallback)" "$T/off.out" || return 1
    grep -q ", 0 RDMA connections" "$T/off.out" || return 1
    [ "$(sha "$T/oo")" = "$BIG_SHA" ]
}
check "RDMATLS off: no RDMA on TLS, the body comes in the HTTPS response (rhttp says why), SHA-256 equal" t_tls_off

# ---- the module's refusals (curl) --------------------------------------------
t_no_seal() {
    curl -sk --max-time 10 -o /dev/null -D "$T/ns.h" -w '%{http_code}\n' \
        -H "RDMA: server-writes, ip=127.0.0.1, port=4791, stag=0x1, to=0x0, maxlen=4096" \
        "https://127.0.0.1:$P1/big.bin" >"$T/ns.code"
    cat "$T/ns.code" "$T/ns.h"
    grep -qx 400 "$T/ns.code" && grep -qi "^RDMA-Error: .*no RDMA-Seal header" "$T/ns.h"
}
check "RDMA over TLS without RDMA-Seal: 400 naming the header" t_no_seal
t_seal_plain() {
    curl -s --max-time 10 -o /dev/null -D "$T/sp.h" -w '%{http_code}\n' \
        -H "RDMA: server-writes, ip=127.0.0.1, port=4791, stag=0x1, to=0x0, maxlen=4096" \
        -H "RDMA-Seal: aes-256-gcm, id=00112233445566778899aabbccddeeff" \
        "http://127.0.0.1:$P4/big.bin" >"$T/sp.code"
    cat "$T/sp.code" "$T/sp.h"
    grep -qx 400 "$T/sp.code" && grep -qi "^RDMA-Error: RDMA-Seal is for requests over TLS" "$T/sp.h"
}
check "RDMA-Seal on plain HTTP: 400" t_seal_plain
t_put_tls() {
    curl -sk --max-time 10 -o /dev/null -D "$T/pt.h" -w '%{http_code}\n' -X PUT -H "Content-Length: 0" \
        -H "RDMA: client-writes, ip=127.0.0.1, port=4791, length=10" \
        "https://127.0.0.1:$P1/up.bin" >"$T/pt.code"
    cat "$T/pt.code" "$T/pt.h"
    grep -qx 403 "$T/pt.code" && grep -qi "^RDMA-Error: request bodies are not moved by RDMA over TLS" "$T/pt.h"
}
check "an upload by RDMA over TLS: 403 (its body would travel in clear)" t_put_tls
t_bad_tlsconf() {
    printf 'ServerRoot /etc/apache2\nLoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so\nLoadModule rdma_module %s\nRDMATLS maybe\n' "$MOD" >"$T/bad.conf"
    timeout 20 apache2 -d /etc/apache2 -f "$T/bad.conf" -t >"$T/bad.out" 2>&1
    cat "$T/bad.out"
    grep -q 'RDMATLS must be encrypt or off' "$T/bad.out"
}
check "RDMATLS with a bad value fails the config test" t_bad_tlsconf

# ---- no plaintext on the wire (tshark) ----------------------------------------
t_capture() { # $1 URL, $2 expected marker count test: "none" or "some"
    local pcap="$T/cap-$2.pcap"
    rm -f "$pcap"
    tshark -i lo -f "tcp" -w "$pcap" >"$T/tshark-$2.log" 2>&1 &
    local tp=$!
    # Capturing once tshark says so (bounded): "Capture started" comes
    # when dumpcap has the interface open ("Capturing on" comes earlier).
    for _ in $(seq 1 100); do
        grep -q "Capture started" "$T/tshark-$2.log" && break
        kill -0 "$tp" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q "Capture started" "$T/tshark-$2.log"; then
        cat "$T/tshark-$2.log"; kill "$tp" 2>/dev/null; return 1
    fi
    "${R[@]}" get --scheme server-writes "$1" -o "$T/oc" >"$T/cap.out" 2>&1
    local rc=$?
    kill -INT "$tp"
    timeout 10 tail --pid="$tp" -f /dev/null || kill -KILL "$tp"
    cat "$T/cap.out"
    [ "$rc" = 0 ] && [ "$(sha "$T/oc")" = "$BIG_SHA" ] || return 1
    local n
    n=$(grep -a -o "$MARKER" "$pcap" | wc -l)
    echo "marker occurrences in the capture: $n ($(stat -c %s "$pcap") bytes)"
    if [ "$2" = none ]; then [ "$n" = 0 ]; else [ "$n" -gt 1000 ]; fi
}
if command -v tshark >/dev/null; then
    check "capture of a plain-HTTP RDMA fetch shows the body's marker (the capture sees RDMA payloads)" \
        t_capture "http://127.0.0.1:$P4/big.bin" some
    check "capture of an HTTPS RDMA fetch holds no plaintext of the body (no marker)" \
        t_capture "https://127.0.0.1:$P1/big.bin" none
else
    skip "tshark not installed: the capture checks (apt-get install tshark)"
fi

finish
