#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# mod_rdma end to end: an unmodified Debian apache2 (prefork) with mod_rdma
# loaded, started in the foreground on a loopback port with its own config,
# driven by rhttp (every scheme, fallbacks, faults) and by curl (bad
# headers, SSRF, unreachable listeners, byte-identical plain HTTP against a
# second Apache without the module), and through delay-bridge's fault relay
# (dropped, stalled, truncated, blackholed, resegmented and corrupted HTTP
# and RDMA connections).
#
#   scripts/test-modrdma.sh            # everything (about 1-2 minutes)
#   KEEP=1 scripts/test-modrdma.sh     # keep the temp dir (configs, logs)
#   RELAY_MATRIX=/tmp/m.md scripts/test-modrdma.sh  # also write the fault
#                                      # relay's outcomes as a table there
#   DELAY_BRIDGE=/path/delay-bridge scripts/test-modrdma.sh  # use that
#                                      # fault relay instead of building it
#   MODRDMA_SO=/path/mod_rdma.so APACHE_PRELOAD=... scripts/test-modrdma.sh
#                                      # another build of the module (ASan:
#                                      # scripts/sanitize-apache.sh)
#
# libiwarp, rhttp and the relay are built into $CARGO_TARGET_DIR (default
# target/), and mod_rdma is linked against that libiwarp.
#
# Last line: "modrdma: N passed, N failed"; exit status non-zero on failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
PASS=0
FAIL=0
T="$(mktemp -d /tmp/modrdma.XXXXXX)"
chmod 755 "$T"
APID=""
PPID_PLAIN=""
FPID=""
RPID=""

cleanup() {
    apache_stop "$APID" "$PPID_PLAIN" "$FPID" "$RPID"
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
# check NAME CMD...: run CMD (bounded by the caller), pass if it exits 0.
check() {
    local name="$1"
    shift
    local log="$T/check-$((PASS + FAIL + 1)).log"
    if "$@" >"$log" 2>&1; then ok "$name"; else bad "$name (output below)"; tail -n 15 "$log" | sed 's/^/     /'; fi
}
finish() {
    echo "modrdma: $PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

# ---- prerequisites ---------------------------------------------------------
apache_install apache2 apxs=apache2-dev curl python3 || { bad "prerequisites (the line above names the missing one)"; finish; }

echo "building libiwarp, rhttp and mod_rdma"
if ! timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp; then bad "cargo build"; finish; fi
# Cargo's output directory: $CARGO_TARGET_DIR if set (relative to the
# repository root, like cargo's), else target/.
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
RHTTP="$TARGET/release/rhttp"
# MODRDMA_SO: test that build of the module instead (scripts/sanitize-apache.sh:
# built with ASan and UBSan, apache2 run with APACHE_PRELOAD).
if [ -n "${MODRDMA_SO:-}" ]; then
    MOD="$MODRDMA_SO"
    if [ -f "$MOD" ]; then ok "mod_rdma given by MODRDMA_SO: $MOD"; else bad "MODRDMA_SO=$MOD: no such file"; finish; fi
elif timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$TARGET/release" >"$T/build.log" 2>&1 && [ -f modules/mod_rdma/.libs/mod_rdma.so ]; then
    ok "mod_rdma builds with apxs (-Wall -Wextra -Werror)"
    MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"
else
    bad "mod_rdma build"; cat "$T/build.log"; finish
fi
check "shared RDMA: header and control-message vectors (C codecs)" timeout 120 bash scripts/test-modrdma-vectors.sh

# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
# Ports below the ephemeral range, each given once (scripts/lib/free-port.sh
# says why: a port taken from bind(:0) can become a client's source port
# before the server binds it).
free_port() { free_port_once "$T/ports"; }

# ---- configuration errors ---------------------------------------------------
t_conf_errors() {
    local c="$T/bad.conf"
    printf 'ServerRoot /etc/apache2\nLoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so\nLoadModule rdma_module %s\nRDMARegistration sometimes\n' "$MOD" >"$c"
    timeout 20 "${APACHE2[@]}" -d /etc/apache2 -f "$c" -t >"$T/bad.out" 2>&1
    cat "$T/bad.out"
    grep -q "RDMARegistration must be static or dynamic" "$T/bad.out" || return 1
    printf 'ServerRoot /etc/apache2\nLoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so\nLoadModule rdma_module %s\nRDMAAllowConnect client example.com\n' "$MOD" >"$c"
    timeout 20 "${APACHE2[@]}" -d /etc/apache2 -f "$c" -t >"$T/bad.out" 2>&1
    cat "$T/bad.out"
    grep -q "neither \"client\" nor an IP address literal" "$T/bad.out"
}
check "bad directives are refused at config check, naming the fix" t_conf_errors
# RDMAInlineBelow: a negative or garbage size, and a threshold above
# RDMAMaxLength (checked once the vhosts merged theirs: check_config), fail
# `apache2 -t` naming the directive; 0 and a size with a suffix pass.
t_inline_conf() {
    local c="$T/inl.conf" v want
    while IFS='|' read -r v want; do
        printf 'ServerRoot /etc/apache2\nServerName 127.0.0.1\nErrorLog %s/inl-error.log\nLoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so\nLoadModule rdma_module %s\nRDMAMaxLength 1M\n%b\n' "$T" "$MOD" "$v" >"$c"
        timeout 20 "${APACHE2[@]}" -d /etc/apache2 -f "$c" -t >"$T/inl.out" 2>&1
        echo "$v -> rc $?: $(cat "$T/inl.out")"
        if [ "$want" = ok ]; then
            grep -q "Syntax OK" "$T/inl.out" || return 1
        else
            ! grep -q "Syntax OK" "$T/inl.out" && grep -q "$want" "$T/inl.out" || return 1
        fi
    done <<'EOF'
RDMAInlineBelow -4096|RDMAInlineBelow -4096: must not be negative
RDMAInlineBelow lots|RDMAInlineBelow lots: not a size
RDMAInlineBelow 4Kb|RDMAInlineBelow 4Kb: not a positive size
RDMAInlineBelow 2M|RDMAInlineBelow 2097152 is above RDMAMaxLength 1048576.*Fix: lower RDMAInlineBelow
Listen 127.0.0.1:1\n<VirtualHost 127.0.0.1:1>\nRDMAInlineBelow 4M\n</VirtualHost>|RDMAInlineBelow 4194304 is above RDMAMaxLength 1048576
RDMAInlineBelow 0|ok
RDMAInlineBelow 64K|ok
EOF
}
check "RDMAInlineBelow: negative, garbage and above RDMAMaxLength (also in a vhost) fail the config test naming the fix; 0 and 64K pass" t_inline_conf
t_threaded() {
    local c="$T/event.conf" rc
    mkdir -p "$T/evrun"
    printf 'ServerRoot /etc/apache2\nServerName 127.0.0.1\nListen 127.0.0.1:%s\nDefaultRuntimeDir %s\nPidFile %s/pid\nErrorLog %s/error.log\nLoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so\nLoadModule rdma_module %s\n' \
        "$(free_port)" "$T/evrun" "$T/evrun" "$T/evrun" "$MOD" >"$c"
    setsid timeout 20 "${APACHE2[@]}" -d /etc/apache2 -f "$c" -DFOREGROUND >"$T/evrun/out" 2>&1
    rc=$?
    echo "event MPM exit: $rc"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "mod_rdma: needs the prefork MPM" "$T/evrun/error.log" "$T/evrun/out"
}
check "a threaded MPM (event) is refused at start-up with a message naming the fix" t_threaded

# ---- content ---------------------------------------------------------------
P1=$(free_port)      # mod_rdma, static registration
P2=$(free_port)      # mod_rdma vhost, dynamic registration
P3=$(free_port)      # plain Apache, no module
P6=$(free_port)      # mod_rdma on [::1] (static), when the host has IPv6 loopback
P7=$(free_port)      # mod_rdma vhost: reno, every connection closed after 5 requests
P8=$(free_port)      # mod_rdma vhost: dynamic, RDMAInlineBelow 8K
HAVE_V6=0
python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null && HAVE_V6=1
DOCS="$T/docs"
mkdir -p "$DOCS/nordma" "$T/cgi-bin" "$T/dav" "$T/run" "$T/logs" "$T/plainlogs" "$T/out" "$T/plainrun"
for s in 2K 4K 500K 1M 8M; do head -c "$s" /dev/urandom >"$DOCS/f$s.bin"; done
head -c 110M /dev/urandom >"$DOCS/big.bin"
echo "<html><body>hello</body></html>" >"$DOCS/index.html"
cp "$DOCS/f1M.bin" "$DOCS/nordma/f1M.bin"
cat >"$T/cgi-bin/gen.cgi" <<'EOF'
#!/bin/sh
# Dynamic output without Content-Length: 300000 deterministic bytes.
printf 'Content-Type: application/octet-stream\r\n\r\n'
exec python3 -c 'import sys; sys.stdout.buffer.write(bytes(i*7 % 251 for i in range(300000)))'
EOF
cat >"$T/cgi-bin/echo.cgi" <<'EOF'
#!/bin/sh
# Reads its body (CONTENT_LENGTH bytes) and answers its length and SHA-256.
printf 'Content-Type: text/plain\r\n\r\n'
head -c "${CONTENT_LENGTH:-0}" | sha256sum | cut -d' ' -f1
echo "length=${CONTENT_LENGTH:-none}"
EOF
cat >"$T/cgi-bin/slow.cgi" <<'EOF'
#!/bin/sh
# 1 MiB every half second, 8 times: a long transfer to cut off.
printf 'Content-Type: application/octet-stream\r\n\r\n'
for i in 1 2 3 4 5 6 7 8; do head -c 1048576 /dev/zero; sleep 0.5; done
EOF
chmod 755 "$T/cgi-bin/"*.cgi
mkdir -p "$T/run/dav" "$T/plainrun/dav"
chown -R www-data:www-data "$T/dav" "$T/run/dav" "$T/plainrun/dav"
chmod -R a+rX "$DOCS" "$T/cgi-bin"

common_conf() { # $1 = runtime dir, $2 = log dir
    apache_conf_head "$1" "$2" mime dir alias cgi dav dav_fs
    apache_prefork 2 1 2 2
    cat <<EOF
LogFormat "%h %l %u %t \"%r\" %>s %b" common
CustomLog $2/access.log common
KeepAlive On
KeepAliveTimeout 2
TypesConfig /etc/mime.types
DocumentRoot $DOCS
DirectoryIndex index.html
ScriptAlias /cgi-bin/ $T/cgi-bin/
Alias /dav $T/dav
DavLockDB $1/dav/lock
<Directory />
    Require all granted
</Directory>
<Location /dav>
    Dav On
</Location>
EOF
}

{
    common_conf "$T/run" "$T/logs"
    cat <<EOF
Listen 127.0.0.1:$P1
Listen 127.0.0.1:$P2
Listen 127.0.0.1:$P7
Listen 127.0.0.1:$P8
$([ "$HAVE_V6" = 1 ] && echo "Listen [::1]:$P6")
LoadModule rdma_module $MOD
LoadModule remoteip_module /usr/lib/apache2/modules/mod_remoteip.so
RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy 127.0.0.1
LogLevel warn rdma:debug
RDMARegistration static
RDMABufferSize 4M
RDMAConnectTimeout 2000
RDMATimeout 5000
# Every body by RDMA here (the checks below fetch 2K and 4K files by RDMA);
# the vhost on P8 answers small files inline.
RDMAInlineBelow 0
<Location />
    RDMA On
</Location>
<Location /nordma>
    RDMA Off
</Location>
<VirtualHost 127.0.0.1:$P2>
    RDMARegistration dynamic
    RDMAAllowConnect client 127.0.0.2
    RDMAConnectPorts 1024-65535 79
    RDMATrustProxy On
</VirtualHost>
<VirtualHost 127.0.0.1:$P7>
    MaxKeepAliveRequests 4
    RDMACongestion reno
</VirtualHost>
<VirtualHost 127.0.0.1:$P8>
    RDMARegistration dynamic
    RDMAInlineBelow 8K
</VirtualHost>
EOF
} >"$T/rdma.conf"
{
    common_conf "$T/plainrun" "$T/plainlogs"
    echo "Listen 127.0.0.1:$P3"
    echo "LogLevel warn"
} >"$T/plain.conf"

start_apache() { # $1 conf, $2 port [, $3 address-space limit in KiB] -> pid on stdout
    apache_start "$1" "$2" "$T/apache-stdout.log" "" "${3:-}"
}

if APID=$(start_apache "$T/rdma.conf" "$P1"); then ok "apache2 with mod_rdma starts (prefork, port $P1)"; else
    bad "apache2 with mod_rdma did not start"; apache_logs "$T/apache-stdout.log" "$T/logs/error.log"; finish; fi
if PPID_PLAIN=$(start_apache "$T/plain.conf" "$P3"); then ok "plain apache2 starts (port $P3)"; else
    bad "plain apache2 did not start"; apache_logs "$T/apache-stdout.log" "$T/plainlogs/error.log"; finish; fi

U1="http://127.0.0.1:$P1"
U2="http://127.0.0.1:$P2"
U3="http://127.0.0.1:$P3"
R() { timeout 120 "$RHTTP" -q --timeout 20 "$@"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
same() { cmp -s "$1" "$2"; }

# ---- GET, every scheme and registration mode --------------------------------
for scheme in server-writes client-reads; do
    for port_url in "static $U1" "dynamic $U2"; do
        read -r mode base <<<"$port_url"
        outs=()
        args=()
        for s in 2K 4K 500K 1M 8M; do
            args+=("$base/f$s.bin")
            outs+=(-o "$T/out/$scheme-$mode-$s")
        done
        t_get() {
            R get --scheme "$scheme" "${args[@]}" "${outs[@]}" 2>"$T/out/$scheme-$mode.err" || return 1
            grep -c "via RDMA ($scheme)" "$T/out/$scheme-$mode.err" | grep -qx 5 || return 1
            for s in 2K 4K 500K 1M 8M; do same "$DOCS/f$s.bin" "$T/out/$scheme-$mode-$s" || return 1; done
        }
        check "GET $scheme, $mode registration: 2K 4K 500K 1M 8M over one connection, contents equal" t_get
    done
done
# RDMAInlineBelow (the vhost on P8: 8K): a GET of a static file smaller
# than the threshold is answered in the HTTP response, as plain Apache
# would, with `RDMA-Inline: length=N` and no `RDMA:` header, and without
# a connect-back (curl names a port nobody listens on: a connect-back would
# end in 502 after RDMAConnectTimeout); a file of exactly 8K and larger
# ones go by RDMA. rhttp takes the inline answers as plain HTTP, on their
# own and pipelined between RDMA answers; every body equal.
t_inline() {
    local code sch pl n
    code=$(curl -s --max-time 10 -D "$T/out/inl.h" -o "$T/out/inl.body" -w '%{http_code}' \
        -H "RDMA: client-reads, ip=127.0.0.1, port=$(free_port)" "http://127.0.0.1:$P8/f2K.bin")
    cat "$T/out/inl.h"
    [ "$code" = 200 ] && grep -qi "^RDMA-Inline: length=2048" "$T/out/inl.h" &&
        ! grep -qi "^RDMA:" "$T/out/inl.h" && same "$DOCS/f2K.bin" "$T/out/inl.body" || return 1
    curl -s --max-time 10 -D "$T/out/inl0.h" -o /dev/null "http://127.0.0.1:$P8/f2K.bin" || return 1
    ! grep -qi "^RDMA-Inline" "$T/out/inl0.h" || return 1
    head -c 8192 /dev/urandom >"$DOCS/i8K.bin" && chmod 644 "$DOCS/i8K.bin"
    for sch in server-writes client-reads; do
        for pl in 1 8; do
            R get --pipeline "$pl" --scheme "$sch" "http://127.0.0.1:$P8/f2K.bin" "http://127.0.0.1:$P8/f500K.bin" \
                "http://127.0.0.1:$P8/f4K.bin" "http://127.0.0.1:$P8/i8K.bin" "http://127.0.0.1:$P8/f1M.bin" \
                -o "$T/out/i1" -o "$T/out/i2" -o "$T/out/i3" -o "$T/out/i4" -o "$T/out/i5" 2>"$T/out/inl.err" || return 1
            cat "$T/out/inl.err"
            n=$(grep -c "via RDMA ($sch)" "$T/out/inl.err")
            [ "$n" = 3 ] || { echo "$sch pipeline $pl: $n by RDMA, expected 3"; return 1; }
            grep "f2K.bin: 200 2048 bytes via plain" "$T/out/inl.err" &&
                grep "f4K.bin: 200 4096 bytes via plain" "$T/out/inl.err" || return 1
            same "$DOCS/f2K.bin" "$T/out/i1" && same "$DOCS/f500K.bin" "$T/out/i2" &&
                same "$DOCS/f4K.bin" "$T/out/i3" && same "$DOCS/i8K.bin" "$T/out/i4" &&
                same "$DOCS/f1M.bin" "$T/out/i5" || return 1
        done
    done
}
check "RDMAInlineBelow 8K: 2K and 4K answered inline (RDMA-Inline header, no connect-back, byte-exact), 8K and larger by RDMA, both schemes, alone and pipelined" t_inline
# Dynamic registration keeps each worker's recent file mappings (keyed by
# device, inode, size, mtime and range). Fill the workers' caches, then
# change the file in place (same inode, other size and content) and replace
# it by rename(2): every later GET, by either scheme and whichever worker
# serves it, must carry the current content.
t_map_cache() {
    local sch f="$DOCS/mc.bin"
    fetch_all() { # $1: expected content
        for _ in 1 2 3 4 5 6; do
            for sch in server-writes client-reads; do
                R get --scheme "$sch" "$U2/mc.bin" "$U2/mc.bin" -o "$T/out/mc1" -o "$T/out/mc2" \
                    2>"$T/out/mc.err" || return 1
                grep -c "via RDMA ($sch)" "$T/out/mc.err" | grep -qx 2 || return 1
                same "$1" "$T/out/mc1" && same "$1" "$T/out/mc2" || return 1
            done
        done
    }
    head -c 700000 /dev/urandom >"$T/mc.v1"
    cp "$T/mc.v1" "$f" && chmod 644 "$f"
    fetch_all "$T/mc.v1" || return 1
    head -c 900000 /dev/urandom >"$T/mc.v2"
    cat "$T/mc.v2" >"$f"
    fetch_all "$T/mc.v2" || return 1
    # The same length as v2: only the inode tells the versions apart.
    head -c 900000 /dev/urandom >"$T/mc.v3"
    cp "$T/mc.v3" "$DOCS/mc.tmp" && chmod 644 "$DOCS/mc.tmp" && mv -f "$DOCS/mc.tmp" "$f"
    fetch_all "$T/mc.v3"
}
check "dynamic mapping cache: a file rewritten in place, then replaced by rename, is served current (both schemes)" t_map_cache

reuse_count() { grep -c "reusing the RDMA connection" "$T/logs/error.log"; }
t_reuse() {
    local before after
    before=$(reuse_count)
    R get "$U1/f2K.bin" "$U1/f4K.bin" "$U1/f1M.bin" -o "$T/out/r1" -o "$T/out/r2" -o "$T/out/r3" || return 1
    after=$(reuse_count)
    [ $((after - before)) -eq 2 ]
}
check "keep-alive: 3 GETs on one HTTP connection reuse one RDMA connection (2 reuses logged)" t_reuse
connect_count() { grep -c "connected to the client's RDMA listener" "$T/logs/error.log"; }
# rhttp get -r (like wget -r -l1): a page and the objects it links, the
# objects pipelined (8 in flight) over the page's HTTP connection and its one
# RDMA connection, each body checked. A link to another host, one to the
# page itself and a duplicate are not fetched.
PAGE_OBJS=()
mkdir -p "$DOCS/page/img"
{
    echo '<html><head><link rel="stylesheet" href="/page/style.css"></head><body>'
    echo '<a href="http://192.0.2.1/elsewhere.html">other host</a> <a href="./">this page</a>'
    for i in 01 02 03 04 05 06 07 08 09 10 11; do
        head -c "$((10#$i * 27 + 3))K" /dev/urandom >"$DOCS/page/img/p$i.jpg"
        PAGE_OBJS+=("img/p$i.jpg")
        echo "<img src=\"img/p$i.jpg\" alt=\"$i\">"
    done
    echo '<img src="img/p01.jpg"></body></html>'
} >"$DOCS/page/index.html"
echo "body { color: black }" >"$DOCS/page/style.css"
PAGE_OBJS+=(style.css index.html)
chmod -R a+rX "$DOCS/page"
page_same() { # $1: the -P directory; every object equal to the server's
    local o
    for o in "${PAGE_OBJS[@]}"; do
        [ "$(sha "$1/page/$o")" = "$(sha "$DOCS/page/$o")" ] || { echo "$o differs"; return 1; }
    done
    [ "$(find "$1" -type f | wc -l)" -eq "${#PAGE_OBJS[@]}" ] || { find "$1" -type f; return 1; }
}
t_recursive() { # $1 scheme [$2 base URL, default $U1]
    local d="$T/out/rec-$1" c0 r0 c1 r1 l0 most
    rm -rf "$d"
    c0=$(connect_count)
    r0=$(reuse_count)
    l0=$(wc -l <"$T/logs/error.log")
    R get -r -l 1 -nH --stats --scheme "$1" -P "$d" "${2:-$U1}/page/" 2>"$d.err" || { cat "$d.err"; return 1; }
    c1=$(connect_count)
    r1=$(reuse_count)
    cat "$d.err"
    page_same "$d" || return 1
    [ "$(grep -c "via RDMA ($1)" "$d.err")" -eq 13 ] || return 1
    grep -q "stats: 13 requests, 13 bodies by RDMA, .* 1 HTTP connections, 1 RDMA connections" "$d.err" || return 1
    echo "server: $((c1 - c0)) connect-backs, $((r1 - r0)) reuses"
    [ $((c1 - c0)) -eq 1 ] && [ $((r1 - r0)) -eq 12 ] || return 1
    if [ "$1" = client-reads ]; then
        # One round trip per window, not two per object: the worker answers
        # the pipelined requests without waiting for each DONE, so several
        # bodies are granted at once (expose.c). Every grant ends: by its
        # DONE, or (the last ones, whose DONE may still be in the socket
        # when the client's close reaches the worker) by the connection's
        # end; none by the deadline.
        tail -n +"$((l0 + 1))" "$T/logs/error.log" >"$d.log"
        most=$(sed -n 's/.*client-reads: granted stag .* (\([0-9]*\) grants out).*/\1/p' "$d.log" |
            sort -n | tail -1)
        echo "server: at most ${most:-0} client-reads grants out at once;" \
            "$(grep -c "client-reads of /page/.*: DONE for stag" "$d.log") ended by DONE"
        [ "${most:-0}" -ge 2 ] || return 1
        [ "$(grep -c "client-reads of /page/.*: \(DONE for stag\|no DONE before\)" "$d.log")" -eq 13 ] &&
            ! grep -q "within RDMATimeout" "$d.log"
    fi
}
check "rhttp get -r, server-writes: a page and its 12 linked objects, pipelined, over 1 HTTP and 1 RDMA connection (server log: 1 connect-back, 12 reuses), SHA-256 equal" t_recursive server-writes
check "rhttp get -r, client-reads: a page and its 12 linked objects, pipelined, over 1 HTTP and 1 RDMA connection (server log: 1 connect-back, 12 reuses, several bodies granted at once, 13 DONEs), SHA-256 equal" t_recursive client-reads
check "rhttp get -r, client-reads, dynamic registration (mapped files, pinned in the mapping cache while granted): as above" t_recursive client-reads "$U2"
# The server closes the connection after every 5th answer (Apache serves
# MaxKeepAliveRequests + 1 requests on a connection) while 8 requests are in
# flight: the unanswered ones are sent again on a new connection.
t_recursive_close() { # [$1 scheme, default server-writes]
    local d="$T/out/rec-close" sch="${1:-server-writes}"
    rm -rf "$d"
    R get -r -l 1 -nH --stats --scheme "$sch" -P "$d" "http://127.0.0.1:$P7/page/" 2>"$d.err" || { cat "$d.err"; return 1; }
    cat "$d.err"
    page_same "$d" || return 1
    [ "$(grep -c "via RDMA ($sch)" "$d.err")" -eq 13 ] &&
        grep -q "stats: 13 requests, 13 bodies by RDMA, .* 3 HTTP connections, 3 RDMA connections" "$d.err"
}
check "rhttp get -r against MaxKeepAliveRequests 4: the pipelined requests the server did not answer are sent again (13 objects over 3 connections), SHA-256 equal" t_recursive_close
check "rhttp get -r --scheme client-reads against MaxKeepAliveRequests 4: bodies granted before the close are read and released first, the rest sent again, SHA-256 equal" t_recursive_close client-reads
# A pipelined request that gets a 404 (its body on the HTTP connection, no
# DONE) between RDMA answers: the answers after it still get their own bodies.
t_pipeline_404() {
    local d="$T/out/pipe404" rc
    rm -rf "$d" && mkdir -p "$d"
    R get --pipeline 8 --stats "$U1/f4K.bin" "$U1/missing" "$U1/f500K.bin" "$U1/nordma/f1M.bin" "$U1/f2K.bin" \
        -o "$d/a" -o "$d/b" -o "$d/c" -o "$d/d" -o "$d/e" 2>"$d.err"
    rc=$?
    cat "$d.err"
    [ "$rc" -eq 1 ] && grep -q "missing: 404 .* via plain HTTP (fallback)" "$d.err" &&
        grep -q "f1M.bin: 200 1048576 bytes via plain HTTP (fallback)" "$d.err" &&
        [ "$(grep -c "via RDMA (server-writes)" "$d.err")" -eq 3 ] &&
        same "$d/a" "$DOCS/f4K.bin" && same "$d/c" "$DOCS/f500K.bin" && same "$d/d" "$DOCS/f1M.bin" &&
        same "$d/e" "$DOCS/f2K.bin" &&
        grep -q "stats: 5 requests, 3 bodies by RDMA, .* 1 HTTP connections, 1 RDMA connections" "$d.err"
}
check "pipelined GETs with a 404 and an RDMA Off location among them: each body in its place (3 by RDMA, 2 plain, 1 connection)" t_pipeline_404

# RDMACongestion (the P7 vhost: reno) and rhttp --congestion: both ends of
# the RDMA connection use the algorithm asked for (tcp(7) TCP_CONGESTION,
# read back with getsockopt and logged).
t_congestion() {
    local c0 e="$T/out/cc.err"
    c0=$(grep -c "connected to the client's RDMA listener .* (congestion reno)" "$T/logs/error.log")
    RUST_LOG=rhttp=debug R --congestion reno get "http://127.0.0.1:$P7/f500K.bin" -o "$T/out/cc" 2>"$e" ||
        { cat "$e"; return 1; }
    grep -E "GET|congestion" "$e"
    same "$T/out/cc" "$DOCS/f500K.bin" && grep -q "via RDMA (server-writes)" "$e" &&
        grep -q 'RDMA connection from the server accepted.*congestion.*"reno"' "$e" &&
        [ "$(grep -c "connected to the client's RDMA listener .* (congestion reno)" "$T/logs/error.log")" -gt "$c0" ]
}
check "RDMACongestion reno (vhost) and rhttp --congestion reno: the RDMA connection runs reno on both ends (logged by each), body equal" t_congestion
t_congestion_bad() {
    local c="$T/badcc.conf"
    printf 'ServerRoot /etc/apache2\nLoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so\nLoadModule rdma_module %s\nRDMACongestion nosuchcc\n' "$MOD" >"$c"
    timeout 20 "${APACHE2[@]}" -d /etc/apache2 -f "$c" -t >"$T/badcc.out" 2>&1
    cat "$T/badcc.out"
    grep -q "RDMACongestion nosuchcc: the kernel has no such TCP congestion control.*Fix: modprobe tcp_nosuchcc" "$T/badcc.out" || return 1
    R --congestion nosuchcc get "$U1/f2K.bin" -o "$T/out/ccbad" 2>"$T/out/ccbad.err"
    [ $? -eq 2 ] && cat "$T/out/ccbad.err" && grep -q "no such algorithm.*modprobe tcp_nosuchcc" "$T/out/ccbad.err"
}
check "an unknown congestion control is refused, naming the fix: RDMACongestion at config check, rhttp --congestion at start" t_congestion_bad

t_redial() {
    local before after
    before=$(connect_count)
    R get --x-drop-rdma-after 1 "$U1/f4K.bin" "$U1/f1M.bin" -o "$T/out/d1" -o "$T/out/d2" \
        2>"$T/out/redial.err" || { cat "$T/out/redial.err"; return 1; }
    after=$(connect_count)
    same "$T/out/d1" "$DOCS/f4K.bin" && same "$T/out/d2" "$DOCS/f1M.bin" &&
        [ "$(grep -c 'via RDMA' "$T/out/redial.err")" -eq 2 ] && [ $((after - before)) -eq 2 ]
}
check "keep-alive: the client closes its RDMA connection between two GETs; the worker notices and connects again (both by RDMA)" t_redial

t_index() {
    R get "$U1/" -o "$T/out/index" 2>"$T/out/index.err" || return 1
    cat "$T/out/index.err"
    grep -q "via RDMA (server-writes)" "$T/out/index.err" && same "$DOCS/index.html" "$T/out/index"
}
check "GET / (DirectoryIndex internal redirect) by RDMA" t_index
t_head_404() {
    R get "$U1/missing" -o "$T/out/missing" 2>"$T/out/missing.err"
    [ $? -eq 1 ] || return 1
    cat "$T/out/missing.err"
    grep -q "404 .* via plain HTTP (fallback)" "$T/out/missing.err" && grep -q "Not Found" "$T/out/missing"
}
check "a 404 with an RDMA request comes back as plain HTTP (exit status 1)" t_head_404

t_cgi_get() {
    curl -s --max-time 20 "$U3/cgi-bin/gen.cgi" -o "$T/out/gen.plain" || return 1
    [ "$(stat -c %s "$T/out/gen.plain")" -eq 300000 ] || return 1
    R get --scheme server-writes "$U1/cgi-bin/gen.cgi" -o "$T/out/gen.sw" 2>"$T/out/gen.err" || return 1
    R get --scheme client-reads "$U2/cgi-bin/gen.cgi" -o "$T/out/gen.cr" 2>>"$T/out/gen.err" || return 1
    [ "$(grep -c 'via RDMA' "$T/out/gen.err")" -eq 2 ] || return 1
    same "$T/out/gen.plain" "$T/out/gen.sw" && same "$T/out/gen.plain" "$T/out/gen.cr"
}
check "GET of CGI output (no Content-Length): server-writes static and client-reads dynamic equal plain" t_cgi_get

# ---- PUT / POST --------------------------------------------------------------
for scheme in server-reads client-writes; do
    for port_url in "static $U1" "dynamic $U2"; do
        read -r mode base <<<"$port_url"
        t_put() {
            rm -f "$T/dav/put-$scheme-$mode"
            R put --scheme "$scheme" "$DOCS/f8M.bin" "$base/dav/put-$scheme-$mode" 2>"$T/out/put.err" || return 1
            grep -q "via RDMA ($scheme)" "$T/out/put.err" || return 1
            same "$DOCS/f8M.bin" "$T/dav/put-$scheme-$mode"
        }
        check "PUT $scheme, $mode registration: 8M file via mod_dav, contents equal" t_put
        t_cgi_put() {
            R put --scheme "$scheme" "$DOCS/f500K.bin" "$base/cgi-bin/echo.cgi" -o "$T/out/echo" 2>"$T/out/echo.err" || return 1
            grep -q "via RDMA ($scheme)" "$T/out/echo.err" || return 1
            [ "$(head -1 "$T/out/echo")" = "$(sha "$DOCS/f500K.bin")" ] && grep -qx "length=512000" "$T/out/echo"
        }
        check "PUT $scheme, $mode: a CGI script reads the 500K body (SHA-256 and CONTENT_LENGTH match)" t_cgi_put
    done
done

for scheme in server-reads client-writes; do
    t_post() {
        R put --post --scheme "$scheme" "$DOCS/f1M.bin" "$U1/cgi-bin/echo.cgi" -o "$T/out/post" 2>"$T/out/post.err" || return 1
        cat "$T/out/post.err"
        grep -q "^POST .* via RDMA ($scheme)" "$T/out/post.err" || return 1
        [ "$(head -1 "$T/out/post")" = "$(sha "$DOCS/f1M.bin")" ] && grep -qx "length=1048576" "$T/out/post"
    }
    check "POST $scheme: a CGI script reads the 1M body (SHA-256 and CONTENT_LENGTH match)" t_post
done

t_put_405() {
    local rc before
    before=$(sha "$DOCS/f2K.bin")
    R put --scheme client-writes "$DOCS/f4K.bin" "$U1/f2K.bin" 2>"$T/out/405.err"
    rc=$?
    cat "$T/out/405.err"
    [ "$rc" -eq 1 ] && grep -q "^PUT .*: 405 " "$T/out/405.err" && [ "$(sha "$DOCS/f2K.bin")" = "$before" ]
}
check "PUT where no handler takes it: 405 (body discarded through RDMA_IN), file untouched" t_put_405

# ---- over 100 MB, SHA-256 ----------------------------------------------------
BIGSHA=$(sha "$DOCS/big.bin")
t_big_get() { # $1 scheme $2 base
    R --max-len 128M get --scheme "$1" "$2/big.bin" -o "$T/out/big" 2>"$T/out/big.err" || return 1
    grep -q "via RDMA ($1)" "$T/out/big.err" && [ "$(sha "$T/out/big")" = "$BIGSHA" ]
}
check "110 MB GET server-writes, static (4M bounce buffer): SHA-256 equal" t_big_get server-writes "$U1"
check "110 MB GET client-reads, dynamic (file mapped and registered): SHA-256 equal" t_big_get client-reads "$U2"
t_big_put() { # $1 scheme $2 base
    rm -f "$T/dav/big-$1"
    R put --scheme "$1" "$DOCS/big.bin" "$2/dav/big-$1" 2>"$T/out/bigput.err" || return 1
    grep -q "via RDMA ($1)" "$T/out/bigput.err" && [ "$(sha "$T/dav/big-$1")" = "$BIGSHA" ]
}
check "110 MB PUT server-reads, static (chunked through the 4M buffer): SHA-256 equal" t_big_put server-reads "$U1"
check "110 MB PUT client-writes, static (28 BUF/DONE rounds): SHA-256 equal" t_big_put client-writes "$U1"
rm -f "$T/out/big" "$T/dav/big-"*

# ---- fallbacks -----------------------------------------------------------------
t_fb_off() {
    R get "$U1/nordma/f1M.bin" -o "$T/out/fb1" 2>"$T/out/fb1.err" || return 1
    grep -q "plain HTTP (fallback)" "$T/out/fb1.err" && same "$DOCS/f1M.bin" "$T/out/fb1"
}
check "GET where RDMA is Off: rhttp falls back to the plain body" t_fb_off
t_fb_plain_server() {
    R get "$U3/f500K.bin" -o "$T/out/fb2" 2>"$T/out/fb2.err" || return 1
    grep -q "plain HTTP (fallback)" "$T/out/fb2.err" && same "$DOCS/f500K.bin" "$T/out/fb2" || return 1
    R put --scheme client-writes "$DOCS/f500K.bin" "$U3/dav/fb-put" 2>"$T/out/fb3.err" || return 1
    grep -q "plain HTTP (fallback)" "$T/out/fb3.err" && same "$DOCS/f500K.bin" "$T/dav/fb-put"
}
check "GET and PUT against Apache without mod_rdma: plain HTTP fallback, contents equal" t_fb_plain_server
t_maxlen() {
    R --max-len 1M get "$U1/f8M.bin" -o "$T/out/ml" 2>"$T/out/ml.err" || return 1
    grep -q "413" "$T/out/ml.err" && grep -q "exceeds maxlen" "$T/out/ml.err" &&
        grep -q "retrying over plain HTTP" "$T/out/ml.err" && same "$DOCS/f8M.bin" "$T/out/ml"
}
check "8M file with maxlen=1M: 413 naming maxlen, then the client retries over plain HTTP" t_maxlen
t_maxlen_cgi() {
    R --max-len 100K get "$U1/cgi-bin/gen.cgi" -o "$T/out/ml2" 2>"$T/out/ml2.err" || return 1
    grep -q "exceeds maxlen" "$T/out/ml2.err" && same "$T/out/gen.plain" "$T/out/ml2"
}
check "CGI output over maxlen (found mid-stream): 413, then plain retry with the right body" t_maxlen_cgi

# ---- malformed headers, SSRF, unreachable listeners (curl) ---------------------
hdr_400() { # $1 header value, $2 text the answer must contain
    local code
    code=$(curl -s --max-time 10 -o "$T/out/400.body" -w '%{http_code}' -H "RDMA: $1" "$U1/f2K.bin")
    [ "$code" = 400 ] && grep -q -- "$2" "$T/out/400.body"
}
check "400 names an unknown scheme" hdr_400 "server-pushes, ip=127.0.0.1, port=9" "unknown scheme"
check "400 names an unknown parameter" hdr_400 "client-reads, ip=127.0.0.1, port=9, colour=blue" "unknown parameter"
check "400 names a missing parameter" hdr_400 "server-writes, ip=127.0.0.1, port=9, stag=1, to=0" "needs the parameter maxlen"
check "400 names a bad number" hdr_400 "client-reads, ip=127.0.0.1, port=99999" "port="
check "400 names a duplicate" hdr_400 "client-reads, ip=127.0.0.1, port=1, port=2" "appears twice"
check "400 names a non-literal ip" hdr_400 "client-reads, ip=example.com, port=1" "not an IP address"
check "400 for a PUT scheme on GET" hdr_400 "client-writes, ip=127.0.0.1, port=1, length=3" "is for PUT"
t_ssrf() {
    local code
    code=$(curl -s --max-time 10 -D "$T/out/ssrf.h" -o /dev/null -w '%{http_code}' \
        -H "RDMA: client-reads, ip=127.0.0.2, port=80" "$U1/f2K.bin")
    [ "$code" = 403 ] && grep -qi "^RDMA-Error: ip=127.0.0.2 is not the address" "$T/out/ssrf.h" &&
        grep -q "refused with 403: ip=127.0.0.2" "$T/logs/error.log"
}
check "SSRF: ip= naming another host gets 403, an RDMA-Error header and a log line" t_ssrf
# attempted URL CURL-ARGS...: the server tries to connect back (nobody
# listens there: 502), it does not refuse the request (403).
attempted() {
    local url="$1" code
    shift
    code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$@" "$url")
    echo "connect-back attempted? status $code"
    [ "$code" = 502 ]
}
# refused URL TEXT CURL-ARGS...: 403 whose RDMA-Error header starts with TEXT.
refused() {
    local url="$1" text="$2" code
    shift 2
    code=$(curl -s --max-time 10 -D "$T/out/refused.h" -o /dev/null -w '%{http_code}' "$@" "$url")
    echo "status $code: $(grep -i '^RDMA-Error' "$T/out/refused.h")"
    [ "$code" = 403 ] && grep -qiF "RDMA-Error: $text" "$T/out/refused.h"
}
# The dynamic vhost also allows 127.0.0.2: not refused as SSRF.
check "RDMAAllowConnect client 127.0.0.2: that address is allowed (connect attempted, 502), not 403" \
    attempted "$U2/f2K.bin" -H "RDMA: client-reads, ip=127.0.0.2, port=$(free_port)"
check "connect-back to a privileged port (22) is refused: 403 naming RDMAConnectPorts" \
    refused "$U1/f2K.bin" "port=22 is not among the ports this server connects back to (RDMAConnectPorts 1024-65535)" \
    -H "RDMA: client-reads, ip=127.0.0.1, port=22"
check "RDMAConnectPorts 1024-65535 79: port 79 is attempted (502), not refused" \
    attempted "$U2/f2K.bin" -H "RDMA: client-reads, ip=127.0.0.1, port=79"
check "a request with a Forwarded header gets 403 for RDMA (RDMATrustProxy Off)" \
    refused "$U1/f2K.bin" "this request came through a proxy (it carries a Forwarded header)" \
    -H "Forwarded: for=127.0.0.1" -H "RDMA: client-reads, ip=127.0.0.1, port=$(free_port)"
# mod_remoteip (trusting 127.0.0.1) makes 127.0.0.2 the request's client
# address; without the proxy check the server would connect to whatever
# address the header names.
check "mod_remoteip-rewritten client address: 403 unless RDMATrustProxy" \
    refused "$U1/f2K.bin" "this request came through a proxy (its client address 127.0.0.2 differs from the connection's 127.0.0.1" \
    -H "X-Forwarded-For: 127.0.0.2" -H "RDMA: client-reads, ip=127.0.0.2, port=$(free_port)"
# The vhost trusts the proxy: it connects back to the reported client.
check "RDMATrustProxy On: the address mod_remoteip reports is the client (connect attempted, 502)" \
    attempted "$U2/f2K.bin" -H "X-Forwarded-For: 127.0.0.2" -H "RDMA: client-reads, ip=127.0.0.2, port=$(free_port)"
# refused_or_silent KIND: one connect-back to a closed port (refused) or to
# a listener that accepts TCP and never answers MPA (silent); prints
# "code elapsed-ms" and keeps the RDMA-Error header in $T/out/KIND.h.
refused_or_silent() {
    local port code start el lp=""
    port=$(free_port)
    if [ "$1" = silent ]; then
        python3 -c "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1',$port)); s.listen(8); time.sleep(20)" &
        lp=$!
        sleep 0.3
    fi
    start=$(date +%s%N)
    code=$(curl -s --max-time 15 -D "$T/out/$1.h" -o /dev/null -w '%{http_code}' \
        -H "RDMA: client-reads, ip=127.0.0.1, port=$port" "$U1/f2K.bin")
    el=$(( ($(date +%s%N) - start) / 1000000 ))
    [ -n "$lp" ] && kill "$lp" 2>/dev/null
    # The port is the only difference allowed between the two answers.
    grep -i '^RDMA-Error:' "$T/out/$1.h" | sed "s/:$port /:PORT /" | tr -d '\r' >"$T/out/$1.err"
    echo "$code $el"
}
t_no_oracle() {
    local r s
    r=$(refused_or_silent refused)
    s=$(refused_or_silent silent)
    echo "closed port: $r ms; silent listener: $s ms; $(cat "$T/out/refused.err")"
    # Same status, same text; both padded to RDMAConnectTimeout (2 s).
    [ "${r% *}" = 502 ] && [ "${s% *}" = 502 ] && cmp -s "$T/out/refused.err" "$T/out/silent.err" &&
        grep -q "no RDMA connection to the client's listener at 127.0.0.1:PORT within 2000 ms" "$T/out/refused.err" &&
        [ "${r#* }" -ge 1900 ] && [ "${r#* }" -lt 5000 ] && [ "${s#* }" -ge 1900 ] && [ "${s#* }" -lt 5000 ] &&
        grep -q "connecting back to 127.0.0.1:.* failed" "$T/logs/error.log"
}
check "closed port and non-MPA listener: identical 502 after the connect timeout (no port-scan oracle), cause in the log" t_no_oracle
t_fail_limit() {
    local codes p i
    local -a args=()
    p=$(free_port)
    for i in 1 2 3 4 5 6 7; do args+=(-o /dev/null "$U2/f2K.bin?n=$i"); done
    # One keep-alive connection, so one worker counts: after at most five
    # failures (earlier checks may have counted some) only 429s follow.
    codes=$(curl -s --max-time 40 -w '%{http_code} ' \
        -H "RDMA: client-reads, ip=127.0.0.2, port=$p" "${args[@]}")
    echo "codes: $codes"
    [[ "$codes" =~ ^(502\ ){1,5}(429\ )+$ ]] && grep -q "refused with 429: 5 failed RDMA connections" "$T/logs/error.log"
}
check "five failed connect-backs to one address in a worker, then 429 without a connection attempt" t_fail_limit
t_alive() { R get "$U1/f1M.bin" -o "$T/out/alive" && same "$DOCS/f1M.bin" "$T/out/alive"; }
check "server still serves RDMA after the connect faults" t_alive

# ---- hostile peers and hostile users (issue 26) ---------------------------------
HOSTILE="$ROOT/modules/mod_rdma/test/hostile.py"
# Request smuggling: a PUT/POST with an RDMA: header whose body also
# travels on the socket (its body is a second request). The module takes
# the body from RDMA, so Apache would parse the socket's body as the next
# request: it must answer 400 and close, before any connect-back.
t_smuggle() { # $1 mode: body (Content-Length), te (chunked), clte (both), put (PUT, Content-Length)
    timeout 60 python3 "$HOSTILE" smuggle "$P1" "$1" || return 1
    ! grep -q "smuggled-$1" "$T/logs/access.log"
}
check "smuggling: body on the socket plus RDMA: (Content-Length) gets 400 and close, no second response" t_smuggle body
check "smuggling: Transfer-Encoding chunked plus RDMA: gets 400 and close, no second response" t_smuggle te
check "smuggling: Content-Length plus Transfer-Encoding plus RDMA: gets 400 and close, no second response" t_smuggle clte
check "smuggling: a PUT with a body on the socket plus RDMA: gets 400 and close, no second response" t_smuggle put
t_no_smuggle_plain() { # rhttp's uploads (Content-Length: 0) are not affected
    R put --scheme client-writes "$DOCS/f4K.bin" "$U1/cgi-bin/echo.cgi" -o "$T/out/ns" 2>"$T/out/ns.err" || return 1
    grep -q "via RDMA (client-writes)" "$T/out/ns.err" && grep -qx "length=4096" "$T/out/ns"
}
check "an RDMA upload with Content-Length: 0 still goes by RDMA" t_no_smuggle_plain
# Impostors at rhttp's RDMA listener: rhttp names its listener in the
# request, someone else connects to it before the server does. rhttp must
# refuse it (not the HTTP server's address, or not the request's token) and
# still take the server's connection.
t_impostor() { # $1 source address, $2 private data (old: "mod_rdma/1", none)
    rm -f "$T/out/imp"
    timeout 90 python3 "$HOSTILE" impostor "$RHTTP" "$U1/f1M.bin" "$T/out/imp" "$1" "$2" || return 1
    same "$DOCS/f1M.bin" "$T/out/imp"
}
check "impostor from the server's address with mod_rdma's old private data (no token) is refused; the GET goes by RDMA" \
    t_impostor 127.0.0.1 old
check "impostor from another address (127.0.0.2) is refused; the GET goes by RDMA" t_impostor 127.0.0.2 old
check "impostor without private data is refused; the GET goes by RDMA" t_impostor 127.0.0.1 none
# Connect-back policy on canonical addresses: ::ffff:127.0.0.1 is
# 127.0.0.1 (RFC 4291 §2.5.5.2), and the server connects to it.
check "connect-back: ip=::ffff:127.0.0.1 from 127.0.0.1 is the client (connected, 200 client-reads), not 403" \
    timeout 60 python3 "$HOSTILE" connect-back "$P1" ::ffff:127.0.0.1
t_mapped_client() { # rhttp over an IPv4-mapped HTTP connection
    R get "http://[::ffff:127.0.0.1]:$P1/f1M.bin" -o "$T/out/mapped" 2>"$T/out/mapped.err" || { cat "$T/out/mapped.err"; return 1; }
    cat "$T/out/mapped.err"
    grep -q "via RDMA (server-writes)" "$T/out/mapped.err" && same "$DOCS/f1M.bin" "$T/out/mapped"
}
check "rhttp over http://[::ffff:127.0.0.1]: listens on 127.0.0.1, the GET goes by RDMA" t_mapped_client
t_ipv6() {
    local sch
    for sch in server-writes client-reads; do
        R get --scheme "$sch" "http://[::1]:$P6/f1M.bin" "http://[::1]:$P6/f8M.bin" \
            -o "$T/out/v6a" -o "$T/out/v6b" 2>"$T/out/v6.err" || { cat "$T/out/v6.err"; return 1; }
        cat "$T/out/v6.err"
        [ "$(grep -c "via RDMA ($sch)" "$T/out/v6.err")" -eq 2 ] || return 1
        same "$DOCS/f1M.bin" "$T/out/v6a" && same "$DOCS/f8M.bin" "$T/out/v6b" || return 1
    done
    rm -f "$T/dav/v6put"
    R put --scheme server-reads "$DOCS/f1M.bin" "http://[::1]:$P6/dav/v6put" 2>"$T/out/v6.err" || return 1
    grep -q "via RDMA (server-reads)" "$T/out/v6.err" && same "$DOCS/f1M.bin" "$T/dav/v6put" &&
        grep -q "connected to the client's RDMA listener ::1:" "$T/logs/error.log"
}
if [ "$HAVE_V6" = 1 ]; then
    check "IPv6: GETs (both schemes) and a PUT from [::1], connect-back to ::1" t_ipv6
else
    echo "skip - IPv6: this host has no IPv6 loopback"
fi

# ---- client disconnects mid-write ----------------------------------------------
t_cut() {
    local rp n0 n1
    n0=$(grep -c "failed: .*buffer released" "$T/logs/error.log")
    for _ in 1 2; do  # twice: with 2 workers, a hung worker per cut would stop the server
        "$RHTTP" -q get --scheme server-writes "$U1/cgi-bin/slow.cgi" -o "$T/out/cut" 2>/dev/null &
        rp=$!
        sleep 1.2
        kill -KILL "$rp"
        wait "$rp" 2>/dev/null
    done
    for _ in $(seq 1 100); do
        n1=$(grep -c "failed: .*buffer released" "$T/logs/error.log")
        [ "$n1" -ge $((n0 + 2)) ] && break
        sleep 0.1
    done
    echo "recovery log lines: $n0 -> $n1"
    [ "$n1" -ge $((n0 + 2)) ] || return 1
    R get "$U1/f500K.bin" -o "$T/out/aftercut" && same "$DOCS/f500K.bin" "$T/out/aftercut"
}
check "client killed mid-write (twice): worker logs the failure, releases the buffer, serves the next request" t_cut

t_cut_reader() {
    local rp n0 n1
    n0=$(grep -c "client-reads of /f1M.bin: .*buffer released" "$T/logs/error.log")
    "$RHTTP" -q get --scheme client-reads --x-hold-ms 10000 "$U1/f1M.bin" -o "$T/out/cutr" 2>"$T/out/cutr.err" &
    rp=$!
    for _ in $(seq 1 50); do grep -q "rhttp-test: stag=" "$T/out/cutr.err" && break; sleep 0.1; done
    kill -KILL "$rp"
    wait "$rp" 2>/dev/null
    for _ in $(seq 1 50); do
        n1=$(grep -c "client-reads of /f1M.bin: .*buffer released" "$T/logs/error.log")
        [ "$n1" -gt "$n0" ] && break
        sleep 0.1
    done
    grep "client-reads of /f1M.bin: .*buffer released" "$T/logs/error.log" | tail -1
    [ "$n1" -gt "$n0" ] || return 1
    R get "$U1/f500K.bin" -o "$T/out/aftercutr" && same "$DOCS/f500K.bin" "$T/out/aftercutr"
}
check "client killed while the server waits for its DONE (client-reads): released within 5 s, next request served" t_cut_reader

t_abort_upload() {
    local n0 n1
    n0=$(grep -c "client-writes of the PUT body .* failed: the client aborted the upload; RDMA connection closed, buffer released" "$T/logs/error.log")
    rm -f "$T/dav/aborted"
    R put --scheme client-writes --x-abort-at-buf 2 "$DOCS/f8M.bin" "$U1/dav/aborted" 2>"$T/out/abort.err" || { cat "$T/out/abort.err"; return 1; }
    cat "$T/out/abort.err"
    n1=$(grep -c "client-writes of the PUT body .* failed: the client aborted the upload; RDMA connection closed, buffer released" "$T/logs/error.log")
    grep -q "answering BUF 2 with ABORT" "$T/out/abort.err" && grep -q "retrying over plain HTTP" "$T/out/abort.err" &&
        [ "$n1" -gt "$n0" ] && same "$DOCS/f8M.bin" "$T/dav/aborted"
}
check "client ABORTs a client-writes upload: the worker logs it and releases the buffer; rhttp retries plain" t_abort_upload

t_bad_stag_upload() {
    local n0 n1 pat="server-reads of the PUT body .* failed: the RDMA Read failed with completion status"
    n0=$(grep -c "$pat" "$T/logs/error.log")
    rm -f "$T/dav/badstag"
    R put --scheme server-reads --x-bad-stag "$DOCS/f1M.bin" "$U1/dav/badstag" 2>"$T/out/badstag.err" || { cat "$T/out/badstag.err"; return 1; }
    cat "$T/out/badstag.err"
    n1=$(grep -c "$pat" "$T/logs/error.log")
    [ "$n1" -gt "$n0" ] && grep -q "retrying over plain HTTP" "$T/out/badstag.err" && same "$DOCS/f1M.bin" "$T/dav/badstag"
}
check "server-reads with a wrong STag: the Read is refused by the client's stack, logged, plain retry" t_bad_stag_upload

# ---- STag scope ---------------------------------------------------------------
# The grant outlives its request (expose.c): the worker may be in its
# keep-alive wait when the DONE comes. The DONE is a Send with Invalidate, so
# the STag is dead on arrival, before the worker releases the body: a Read
# right behind it (no pause) must get a Terminate, and so must a Read one
# byte beyond the granted length; the worker serves the next request.
t_stale() {
    R probe-stag "$U1/f4K.bin" >"$T/out/probe1" 2>&1 || { cat "$T/out/probe1"; return 1; }
    cat "$T/out/probe1"
    grep -q "refused the RDMA Read" "$T/out/probe1" || return 1
    R probe-stag "$U2/f4K.bin" >"$T/out/probe1d" 2>&1 || { cat "$T/out/probe1d"; return 1; }
    cat "$T/out/probe1d"
    grep -q "refused the RDMA Read" "$T/out/probe1d" || return 1
    R get --scheme client-reads "$U1/f4K.bin" -o "$T/out/afterstale" && same "$DOCS/f4K.bin" "$T/out/afterstale"
}
check "a client-reads STag is dead right after DONE (a Read behind it is refused with a Terminate), static and dynamic; next request served" t_stale
t_beyond() {
    R probe-stag --beyond "$U1/f4K.bin" >"$T/out/probe3" 2>&1 || { cat "$T/out/probe3"; return 1; }
    cat "$T/out/probe3"
    grep -q "refused the RDMA Read" "$T/out/probe3" || return 1
    R get --scheme client-reads "$U1/f4K.bin" -o "$T/out/afterbeyond" && same "$DOCS/f4K.bin" "$T/out/afterbeyond"
}
check "a Read one byte beyond the granted length is refused with a Terminate; next request served" t_beyond
t_cross() {
    local hp stag to
    timeout 60 "$RHTTP" -q get --scheme client-reads --x-hold-ms 3000 "$U1/f1M.bin" -o "$T/out/held" 2>"$T/out/held.err" &
    hp=$!
    for _ in $(seq 1 50); do grep -q "rhttp-test: stag=" "$T/out/held.err" && break; sleep 0.1; done
    stag=$(sed -n 's/.*rhttp-test: stag=\(0x[0-9a-f]*\).*/\1/p' "$T/out/held.err")
    to=$(sed -n 's/.*rhttp-test: stag=0x[0-9a-f]* to=\(0x[0-9a-f]*\).*/\1/p' "$T/out/held.err")
    [ -n "$stag" ] || { wait "$hp"; return 1; }
    R probe-stag "$U1/f2K.bin" --stag "$stag" --to "$to" --len 4096 >"$T/out/probe2" 2>&1
    cat "$T/out/probe2"
    grep -q "refused the RDMA Read" "$T/out/probe2" || { wait "$hp"; return 1; }
    timeout 30 tail --pid="$hp" -f /dev/null
    wait "$hp" && same "$DOCS/f1M.bin" "$T/out/held"
}
check "an STag advertised to one connection is refused on another; the owner still reads it" t_cross

# ---- server-side faults: the file, the device, memory -------------------------
# A file truncated between Apache's stat (before fixups) and the read (in
# RDMA_OUT): rhttp's test hook holds back the RDMA connection for 1 s, so
# the server waits in its connect after the stat; the test truncates the
# file meanwhile. Every scheme and registration mode reads the file its own
# way (pread into the static buffer, pread into the collected body, mmap
# after an fstat check), and each must answer 500 naming the truncation
# (not a short body, not SIGBUS), keep the connection and serve the next
# request by RDMA.
t_truncated() {
    local combo scheme mode base rp t gate="$T/out/trunc.gate"
    for combo in "server-writes static $U1" "client-reads static $U1" \
        "server-writes dynamic $U2" "client-reads dynamic $U2"; do
        read -r scheme mode base <<<"$combo"
        echo "== $scheme, $mode"
        cp "$DOCS/f1M.bin" "$DOCS/trunc.bin" && chmod 644 "$DOCS/trunc.bin"
        : >"$T/out/trunc.err"
        rm -f "$gate" && mkfifo "$gate" || return 1
        # The truncation goes between Apache's stat and mod_rdma's read on
        # an event, not after a sleep: mod_rdma connects to the client from
        # its fixups hook (after the stat, before the handler reads), and
        # --x-hold-accept makes rhttp say when that connection waits in its
        # listener and accept it only after a line on its standard input.
        R get --scheme "$scheme" --x-hold-accept "$base/trunc.bin" "$base/f500K.bin" \
            -o "$T/out/trunc" -o "$T/out/trunc-next" <"$gate" 2>"$T/out/trunc.err" &
        rp=$!
        exec 7<>"$gate" # read-write: never blocks, and lets rhttp's open of it return
        t=0
        until grep -q "rhttp-test: the server's RDMA connection waits in the listener" "$T/out/trunc.err"; do
            if ! kill -0 "$rp" 2>/dev/null || [ "$t" -ge 600 ]; then
                echo "rhttp did not report the server's RDMA connection (waited $((t / 20)) s)"
                exec 7>&-
                wait "$rp"
                cat "$T/out/trunc.err"
                return 1
            fi
            sleep 0.05
            t=$((t + 1))
        done
        : >"$DOCS/trunc.bin"
        echo truncated >&7
        exec 7>&-
        wait "$rp" || { cat "$T/out/trunc.err"; return 1; }
        cat "$T/out/trunc.err"
        grep -q "server refused RDMA (500 Internal Server Error: the file ends at byte 0, before the 1048576 bytes to send: it was truncated while being served" "$T/out/trunc.err" || return 1
        grep -q "/trunc.bin: 200 0 bytes via plain HTTP" "$T/out/trunc.err" || return 1
        [ ! -s "$T/out/trunc" ] || return 1
        grep -q "/f500K.bin: 200 512000 bytes via RDMA ($scheme)" "$T/out/trunc.err" &&
            same "$DOCS/f500K.bin" "$T/out/trunc-next" || return 1
        grep -q "GET /trunc.bin ($scheme): the file ends at byte 0.*answering 500; file $DOCS/trunc.bin, now 0 bytes. Fix: replace served files by rename(2)" "$T/logs/error.log" || return 1
    done
}
check "file truncated after stat (all 4 scheme/mode paths): 500 naming it, log names file and fix, plain retry, next GET by RDMA" t_truncated

# A real read error: sysfs reports 4096 bytes for /sys/class/net/lo/speed
# but read(2) fails with EINVAL (loopback has no speed). Apache opens it like
# any file; every path must answer 500 with the errno text, and the worker
# must serve the next request by RDMA. (rhttp's plain retry then fails the
# way plain Apache does on such a file, so its exit status is not checked.)
t_read_error() {
    local combo scheme mode base
    if [ ! -r /sys/class/net/lo/speed ] || cat /sys/class/net/lo/speed >/dev/null 2>&1; then
        echo "/sys/class/net/lo/speed is not a file whose read fails here"
        return 1
    fi
    ln -sfn /sys/class/net/lo/speed "$DOCS/ioerr.bin"
    for combo in "server-writes static $U1" "client-reads static $U1" \
        "server-writes dynamic $U2" "client-reads dynamic $U2"; do
        read -r scheme mode base <<<"$combo"
        echo "== $scheme, $mode"
        R get --scheme "$scheme" "$base/ioerr.bin" -o "$T/out/ioerr" 2>"$T/out/ioerr.err"
        cat "$T/out/ioerr.err"
        grep -q "server refused RDMA (500 Internal Server Error: reading the file failed at byte 0: Invalid argument)" "$T/out/ioerr.err" || return 1
        grep -q "GET /ioerr.bin ($scheme): reading the file failed at byte 0: Invalid argument; answering 500; file $DOCS/ioerr.bin. Fix: check the file" "$T/logs/error.log" || return 1
        R get --scheme "$scheme" "$base/f500K.bin" -o "$T/out/ioerr-next" 2>"$T/out/ioerr.err" || return 1
        grep -q "via RDMA ($scheme)" "$T/out/ioerr.err" && same "$DOCS/f500K.bin" "$T/out/ioerr-next" || return 1
    done
    rm -f "$DOCS/ioerr.bin"
}
check "read(2) fails (EINVAL from a sysfs file, all 4 paths): 500 with the errno text, logged with the file, next GET by RDMA" t_read_error

# The fault-injection instance below limits its address space (ulimit -v,
# prlimit), under which AddressSanitizer cannot start (its shadow memory
# reserves terabytes of address space): with APACHE_PRELOAD (a sanitized
# module, scripts/sanitize-apache.sh) it is skipped. Its body is not
# indented, so that its here-documents stay as they are.
fault_instance() {
# A third Apache whose processes may use 1.5 GiB of address space (ulimit
# -v) while RDMABufferSize asks for 2G: every worker's child_init fails to
# set up its iWARP resources -- the real failure behind "the device is not
# available" in this stack (libiwarp's iwarp_open_device itself cannot
# fail: it allocates no resources; both failures take the same path).
P4=$(free_port)      # fault instance, static registration (2G buffer)
P5=$(free_port)      # fault instance vhost, dynamic registration
U4="http://127.0.0.1:$P4"
U5="http://127.0.0.1:$P5"
mkdir -p "$T/frun/dav" "$T/flogs"
chown -R www-data:www-data "$T/frun/dav"
cat >"$T/cgi-bin/huge.cgi" <<'CGI'
#!/bin/sh
# 300 MiB of output without Content-Length.
printf 'Content-Type: application/octet-stream\r\n\r\n'
exec head -c 314572800 /dev/zero
CGI
chmod 755 "$T/cgi-bin/huge.cgi"
{
    common_conf "$T/frun" "$T/flogs"
    cat <<EOC
Listen 127.0.0.1:$P4
Listen 127.0.0.1:$P5
LoadModule rdma_module $MOD
LoadModule remoteip_module /usr/lib/apache2/modules/mod_remoteip.so
RemoteIPHeader X-Forwarded-For
RemoteIPInternalProxy 127.0.0.1
LogLevel warn rdma:debug
RDMARegistration static
RDMABufferSize 2G
RDMATimeout 5000
RDMAInlineBelow 0
<Location />
    RDMA On
</Location>
<VirtualHost 127.0.0.1:$P5>
    RDMARegistration dynamic
</VirtualHost>
EOC
} >"$T/fault.conf"
if FPID=$(start_apache "$T/fault.conf" "$P4" 1572864); then ok "apache2 with RDMABufferSize 2G under ulimit -v 1.5G starts (port $P4)"; else
    bad "the fault-injection apache2 did not start"; tail -20 "$T/apache-stdout.log" "$T/flogs/error.log"; finish; fi
workers() { pgrep -P "$FPID"; }
# prlimit on a worker, as its user (root here lacks CAP_SYS_RESOURCE, which
# acting on another user's process would need).
wlimit() { timeout 10 setpriv --reuid=www-data --regid=www-data --clear-groups prlimit --pid "$1" --as="$2"; }

t_device_fault() {
    local n
    n=$(grep -c "mod_rdma: pid [0-9]*: allocating the 2147483648-byte static buffer (RDMABufferSize) failed: .*could not allocate .*Fix: lower RDMABufferSize" "$T/flogs/error.log")
    echo "child_init failures logged: $n"
    [ "$n" -ge 2 ] || return 1
    R get "$U4/f1M.bin" "$U4/f500K.bin" -o "$T/out/dev1" -o "$T/out/dev2" 2>"$T/out/dev.err" || { cat "$T/out/dev.err"; return 1; }
    cat "$T/out/dev.err"
    [ "$(grep -c "server refused RDMA (503 Service Unavailable: RDMA is not available in this server process: allocating the 2147483648-byte static buffer (RDMABufferSize) failed: .*); retrying over plain HTTP" "$T/out/dev.err")" -eq 2 ] || return 1
    same "$DOCS/f1M.bin" "$T/out/dev1" && same "$DOCS/f500K.bin" "$T/out/dev2" || return 1
    grep -q "GET /f1M.bin refused with 503: RDMA is not available in this server process: allocating the 2147483648-byte static buffer" "$T/flogs/error.log" || return 1
    # Only the static buffer failed: the same workers' dynamic vhost moves bodies by RDMA.
    R get --scheme client-reads "$U5/f1M.bin" -o "$T/out/dev3" 2>"$T/out/dev.err" || return 1
    grep -q "via RDMA (client-reads)" "$T/out/dev.err" && same "$DOCS/f1M.bin" "$T/out/dev3"
}
check "worker's iWARP setup fails at child_init: logged with cause and fix; RDMA GETs get 503 + RDMA-Error, rhttp falls back; dynamic vhost unaffected" t_device_fault

t_device_recover() {
    local p
    # The fault goes away (the limit is lifted on the running workers): the
    # next RDMA request sets up the buffer and moves the body by RDMA.
    for p in $(workers); do wlimit "$p" unlimited: || return 1; done
    R get "$U4/f1M.bin" -o "$T/out/dev4" 2>"$T/out/dev.err" || return 1
    cat "$T/out/dev.err"
    grep -q "via RDMA (server-writes)" "$T/out/dev.err" && same "$DOCS/f1M.bin" "$T/out/dev4" &&
        grep -q "the 2147483648-byte static buffer is allocated now (it failed before); RDMA is available again" "$T/flogs/error.log"
}
check "once the memory limit is lifted, the same worker sets RDMA up at the next request (no restart)" t_device_recover

# Out of memory collecting a client-reads body: the workers' address space
# is limited to their current size + 384 MiB (prlimit), and a CGI produces
# 300 MiB with client-reads (the body must be collected before it can be
# registered; the buffer doubles to 512 MiB, which does not fit).
vsz_kib() { awk '/^VmSize:/ {print $2}' "/proc/$1/status"; }
t_oom() {
    local p ok=0 v before after w1 w2 sizes=""
    # Warm up both workers (two connections at once: one each) so that the
    # driver's threads and malloc arenas exist before the sizes are taken.
    R get --scheme client-reads --x-hold-ms 500 "$U5/f4K.bin" -o "$T/out/warm1" 2>/dev/null &
    w1=$!
    R get --scheme client-reads --x-hold-ms 500 "$U5/f4K.bin" -o "$T/out/warm2" 2>/dev/null &
    w2=$!
    wait "$w1" && wait "$w2" || return 1
    for p in $(workers); do
        v=$(vsz_kib "$p")
        echo "worker $p: VmSize $v KiB, limit +384 MiB"
        sizes="$sizes $p:$v"
        wlimit "$p" "$(( (v + 393216) * 1024 )):" || return 1
    done
    before=$(grep -c "out of memory collecting the body" "$T/flogs/error.log")
    R --max-len 1G get --scheme client-reads "$U5/cgi-bin/huge.cgi" -o /dev/null 2>"$T/out/oom.err" || { cat "$T/out/oom.err"; return 1; }
    cat "$T/out/oom.err"
    grep -q "server refused RDMA (503 Service Unavailable: out of memory collecting the body for client-reads: a buffer of [0-9]* bytes could not be allocated" "$T/out/oom.err" &&
        grep -q "huge.cgi: 200 314572800 bytes via plain HTTP" "$T/out/oom.err" || return 1
    after=$(grep -c "GET /cgi-bin/huge.cgi (client-reads): out of memory collecting the body for client-reads: .*answering 503; buffer released. Fix: " "$T/flogs/error.log")
    [ "$after" -gt "$before" ] || return 1
    # Released: every worker is back near its size before (under +64 MiB),
    # and still under the limit it serves client-reads of CGI output by RDMA.
    for v in $sizes; do
        p=${v%%:*}
        echo "worker $p: VmSize now $(vsz_kib "$p") KiB"
        [ "$(vsz_kib "$p")" -lt $(( ${v#*:} + 65536 )) ] || return 1
    done
    R get --scheme client-reads "$U5/cgi-bin/gen.cgi" "$U5/f1M.bin" -o "$T/out/oom1" -o "$T/out/oom2" 2>"$T/out/oom.err" || return 1
    [ "$(grep -c 'via RDMA (client-reads)' "$T/out/oom.err")" -eq 2 ] &&
        same "$T/out/gen.plain" "$T/out/oom1" && same "$DOCS/f1M.bin" "$T/out/oom2" && ok=1
    for p in $(workers); do wlimit "$p" unlimited:; done
    [ "$ok" = 1 ]
}
check "out of memory collecting a 300M CGI body (client-reads, RLIMIT_AS): 503 naming it, buffer released, plain retry, next requests by RDMA" t_oom
t_fault_no_crash() { ! grep -E "Segmentation fault|Bus error|exit signal|AH00052" "$T/flogs/error.log"; }
check "no child of the fault-injection Apache crashed" t_fault_no_crash
}
if [ -n "${APACHE_PRELOAD:-}" ]; then
    echo "skip - the fault-injection Apache (RLIMIT_AS: 5 checks): AddressSanitizer cannot run under an address-space limit"
else
    fault_instance
fi

# ---- plain clients see no difference ------------------------------------------
t_identical() {
    local p
    for p in / /f2K.bin /f1M.bin /cgi-bin/gen.cgi /missing /nordma/f1M.bin /dav/; do
        curl -s --max-time 20 -i "$U1$p" | grep -v -i '^Date:' >"$T/out/with" || return 1
        curl -s --max-time 20 -i "$U3$p" | grep -v -i '^Date:' >"$T/out/without" || return 1
        cmp "$T/out/with" "$T/out/without" || { echo "differs: $p"; diff <(head -c 2000 "$T/out/with") <(head -c 2000 "$T/out/without") | head; return 1; }
    done
}
check "curl output (status, headers but Date, body) is byte-identical with and without mod_rdma" t_identical

# ---- through the fault relay (delay-bridge) ------------------------------------
# rhttp talks to Apache through delay-bridge (tools/rftp). --rdma-connect-back
# rewrites port= in the RDMA: header to a relay listener on the same IP, so
# the server's connect-back runs through the relay too (relay mapping 1; the
# HTTP connection is mapping 0), and RDMAAllowConnect client still accepts
# it (everything is 127.0.0.1). Apache connects, so on mapping 1 "up" is
# Apache -> rhttp: it carries GET bodies (server-writes: RDMA Writes;
# client-reads: Read Responses); "down" carries PUT bodies. Every case must
# end within 60 s (rhttp --timeout 5, RDMATimeout 5000) either with exit 0
# and the right body (by RDMA, or by rhttp's plain-HTTP retry) or with a
# non-zero exit and an error naming the cause; then Apache serves a direct
# GET by RDMA. RELAY_MATRIX=FILE appends one line per case there.
BRIDGE="${DELAY_BRIDGE:-$TARGET/release/delay-bridge}"
relay_start() { # FAULT... -> RPID, RPORT
    local f
    local -a args=()
    for f in "$@"; do args+=(--fault "$f"); done
    : >"$T/relay.out"
    NO_COLOR=1 RUST_LOG=info "$BRIDGE" --delay-ms 0 --rdma-connect-back --listen "127.0.0.1:0=127.0.0.1:$P1" \
        "${args[@]}" >"$T/relay.out" 2>"$T/relay.log" &
    RPID=$!
    RPORT=""
    for _ in $(seq 1 100); do
        RPORT=$(sed -n 's/^delay-bridge 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$T/relay.out")
        [ -n "$RPORT" ] && return 0
        kill -0 "$RPID" 2>/dev/null || break
        sleep 0.05
    done
    cat "$T/relay.log"
    return 1
}
relay_stop() {
    [ -n "$RPID" ] || return 0
    kill "$RPID" 2>/dev/null
    timeout 10 tail --pid="$RPID" -f /dev/null 2>/dev/null || kill -KILL "$RPID" 2>/dev/null
    wait "$RPID" 2>/dev/null
    RPID=""
}
# relay_case OP SCHEME EXPECT FAULT...: OP is get or put (8M, to /dav;
# RELAY_FILE=f1M.bin for a smaller body). EXPECT: "body" (must complete
# with the right body), or an ERE the error must match when rhttp fails
# ("body|ERE": either).
relay_case() {
    local op="$1" scheme="$2" expect="$3" rc start el res err="$T/out/relay.err" how
    local f="${RELAY_FILE:-f8M.bin}"
    shift 3
    relay_start "$@" || return 1
    res="$T/out/relay-get"
    [ "$op" = put ] && res="$T/dav/relay-put"
    rm -f "$res"
    start=$(date +%s%N)
    if [ "$op" = get ]; then
        timeout 60 "$RHTTP" -q --timeout 5 get --scheme "$scheme" "http://127.0.0.1:$RPORT/$f" -o "$res" 2>"$err"
    else
        timeout 60 "$RHTTP" -q --timeout 5 put --scheme "$scheme" "$DOCS/$f" "http://127.0.0.1:$RPORT/dav/relay-put" 2>"$err"
    fi
    rc=$?
    el=$(( ($(date +%s%N) - start) / 1000000 ))
    relay_stop
    cat "$err"
    grep -E "fault fires|connect-back relayed" "$T/relay.log" | sed 's/^/relay: /' | head -5
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then how="HUNG (killed after 60 s)"
    elif [ "$rc" -eq 0 ] && same "$DOCS/$f" "$res"; then how="completed, body equal ($(grep -o 'via [^;]*' "$err" | tail -1))"
    elif [ "$rc" -eq 0 ]; then how="WRONG BODY with exit 0"
    else how="failed: $(grep -v '^rhttp-test' "$err" | tail -1 | cut -c1-160)"; fi
    echo "$op $scheme [$*]: $how in $el ms"
    [ -n "${RELAY_MATRIX:-}" ] && echo "| $op $scheme | \`$*\` | $how | $el ms |" >>"$RELAY_MATRIX"
    [ "$el" -lt 60000 ] || return 1
    if [ "$rc" -eq 0 ]; then
        same "$DOCS/$f" "$res" || return 1
        [[ "$expect" == body* ]] || { echo "expected a failure matching: $expect"; return 1; }
    else
        [ "$expect" != body ] || { echo "expected the right body"; return 1; }
        grep -Eq "${expect#body|}" "$err" || { echo "the error does not name the cause: ${expect#body|}"; return 1; }
        # A failed PUT leaves no (wrong) file behind.
        if [ "$op" = put ] && [ -e "$res" ]; then same "$DOCS/$f" "$res" || return 1; fi
    fi
    # Apache still serves, directly and by RDMA.
    local gs=server-writes
    [ "$op" = get ] && gs="$scheme"
    R get --scheme "$gs" "$U1/f1M.bin" -o "$T/out/relay-alive" 2>"$T/out/relay-alive.err" || return 1
    grep -q "via RDMA" "$T/out/relay-alive.err" && same "$DOCS/f1M.bin" "$T/out/relay-alive"
}
relay_check() { # NAME OP SCHEME EXPECT FAULT...
    local name="$1"
    shift
    check "relay: $name" relay_case "$@"
}
# What the errors say, by cause. Where the server notices the RDMA failure
# first, it answers over HTTP (400) and rhttp retries over plain HTTP: a
# right body is as good an outcome as a named error ("body|..."). A
# client-writes transfer can also see its own RDMA Write flushed first (the
# connection dropped under it): that names the loss as well.
# (A client-writes PUT whose RDMA Writes all left before the loss learns
# it from its DONE: "Send failed: WrFlushErr".)
LOST='RDMA connection failed: WrFlushErr|Rdma(Read|Write) .* failed: WrFlushErr|Send failed: WrFlushErr|the queue pair is in the error state'
# A silent RDMA connection ends in the 5 s timeout of whichever wait the
# client was in: a completion, the HTTP answer, or either of a control
# message and the HTTP answer (a client-writes PUT waiting for the server's
# DONE; seen once in two runs, the same failure in other words).
SILENT='no completion within 5s|no HTTP answer within 5s|no control message or HTTP answer within 5s|RDMA connection failed: WrFlushErr|the queue pair is in the error state'
if [ -n "${DELAY_BRIDGE:-}" ] || timeout 1200 cargo build --release -q -p fault-relay --bin delay-bridge; then
    for f in "drop:at=2M,dir=up,map=1,how=rst" "drop:at=2M,dir=up,map=1,how=fin" "truncate:at=2M,dir=up,map=1"; do
        relay_check "GET server-writes, RDMA connection [$f]: fails naming the lost connection" get server-writes "body|$LOST" "$f"
        relay_check "GET client-reads, RDMA connection [$f]: fails naming the lost connection" get client-reads "body|$LOST" "$f"
    done
    for f in "drop:at=2M,dir=down,map=1,how=rst" "drop:at=2M,dir=down,map=1,how=fin" "truncate:at=2M,dir=down,map=1"; do
        # The server's RDMA Read fails: 400, and rhttp sends the body again over plain HTTP.
        relay_check "PUT server-reads, RDMA connection [$f]: plain-HTTP retry, body equal" put server-reads "body|RDMA Read failed|$LOST" "$f"
        relay_check "PUT client-writes, RDMA connection [$f]: fails naming the lost connection (or plain retry)" put client-writes "body|$LOST" "$f"
    done
    relay_check "GET server-writes, RDMA connection stalled 2 s: body equal" get server-writes body "stall:at=2M,dir=up,map=1,for=2000"
    relay_check "GET client-reads, RDMA connection stalled 2 s: body equal" get client-reads body "stall:at=2M,dir=up,map=1,for=2000"
    relay_check "PUT server-reads, RDMA connection stalled 2 s: body equal" put server-reads body "stall:at=2M,dir=down,map=1,for=2000"
    relay_check "PUT client-writes, RDMA connection stalled 2 s: body equal" put client-writes body "stall:at=2M,dir=down,map=1,for=2000"
    relay_check "GET server-writes, RDMA connection blackholed: fails after the 5 s timeout" get server-writes "body|$SILENT" "blackhole:at=2M,dir=up,map=1"
    relay_check "GET client-reads, RDMA connection blackholed: fails after the 5 s timeout" get client-reads "body|$SILENT" "blackhole:at=2M,dir=up,map=1"
    relay_check "PUT server-reads, RDMA connection blackholed: fails after the 5 s timeout" put server-reads "body|$SILENT" "blackhole:at=2M,dir=down,map=1"
    relay_check "PUT client-writes, RDMA connection blackholed: fails after the 5 s timeout (or plain retry)" put client-writes "body|$SILENT" "blackhole:at=2M,dir=down,map=1"
    for s in "get server-writes" "get client-reads" "put server-reads" "put client-writes"; do
        read -r op scheme <<<"$s"
        relay_check "${op^^} $scheme, both connections resegmented (1 B..5000 B pieces): body equal" "$op" "$scheme" body "reseg:seed=3,max=5000"
    done
    # 1 MB here: the case is about FPDUs cut into 1-64 byte pieces (about
    # 32,000 of them), not speed; 8 MB took 1.7 to over 5 s (the timeout)
    # through the relay's small writes on an idle 2-core machine.
    RELAY_FILE=f1M.bin relay_check "GET server-writes, both connections in 1-64 byte pieces (1 MB): body equal" get server-writes body "reseg:seed=4,max=64"
    relay_check "GET server-writes, HTTP connection reset 10 bytes into the response: fails naming the reset" \
        get server-writes "reading the response: Connection reset by peer" "drop:at=10,dir=down,map=0,how=rst"
    relay_check "GET client-reads, HTTP connection closed 10 bytes into the response: fails naming the close" \
        get client-reads "the server closed the connection after 10 bytes" "drop:at=10,dir=down,map=0,how=fin"
    relay_check "GET server-writes, HTTP responses blackholed: fails after the 5 s timeout" get server-writes "no HTTP answer within 5s" "blackhole:dir=down,map=0"
    relay_check "PUT client-writes, request blackholed after 100 bytes: fails after the 5 s timeout" \
        put client-writes "neither connected to .* nor answered within 5s" "blackhole:at=100,dir=up,map=0"
    relay_check "PUT server-reads, HTTP request stalled 2 s: body equal" put server-reads body "stall:dir=up,map=0,for=2000"
    # The response head arrives before the RDMA transfer ends: a reset of the
    # HTTP connection after it does not spoil the body.
    relay_check "GET server-writes, HTTP connection reset mid-transfer: body equal (or a named reset)" \
        get server-writes "body|reading the response: Connection reset by peer" "drop:at=300ms,map=0,how=rst" "stall:at=1M,dir=up,map=1,for=2000"
    # A byte flipped on the RDMA connection: rhttp asks for MPA CRC by
    # default (--crc required), so the FPDU fails its CRC check (RFC 5044
    # §4.4) and the transfer ends with an error, or the plain-HTTP retry
    # delivers the right body; a wrong body is never accepted. With
    # `--crc off` the same byte reached the body with exit 0 (the gap this
    # closes), which the second check keeps visible.
    t_relay_corrupt() {
        local rc crc="$1"
        relay_start "corrupt:at=2000001,dir=up,map=1" || return 1
        timeout 60 "$RHTTP" -q --timeout 5 --crc "$crc" get "http://127.0.0.1:$RPORT/f8M.bin" -o "$T/out/relay-corrupt" 2>"$T/out/relay.err"
        rc=$?
        relay_stop
        cat "$T/out/relay.err"
        [ -n "${RELAY_MATRIX:-}" ] && echo "| get server-writes, \`--crc $crc\` | \`corrupt:at=2000001,dir=up,map=1\` | exit $rc, body $(cmp -s "$DOCS/f8M.bin" "$T/out/relay-corrupt" && echo equal || echo differs) | |" >>"$RELAY_MATRIX"
        if [ "$crc" = off ]; then
            [ "$rc" -eq 0 ] && [ "$(cmp -l "$DOCS/f8M.bin" "$T/out/relay-corrupt" | wc -l)" -eq 1 ]
        elif [ "$rc" -eq 0 ]; then
            same "$DOCS/f8M.bin" "$T/out/relay-corrupt"
        else
            grep -qiE "crc|terminat|WrFlushErr|connection" "$T/out/relay.err"
        fi
    }
    check "relay: a byte flipped on the RDMA connection fails MPA CRC (rhttp default): an error or the right body, never a wrong one" t_relay_corrupt required
    check "relay: with --crc off the flipped byte reaches the body (what the CRC default prevents)" t_relay_corrupt off
else
    bad "cargo build of delay-bridge"
fi

# ---- the workers are fine at the end --------------------------------------------
t_no_crash() { ! grep -E "Segmentation fault|exit signal|AH00052" "$T/logs/error.log"; }
check "no Apache child crashed (error log)" t_no_crash

finish
