#!/usr/bin/env bash
# The applications, unchanged but for how they pick the device, on kernel
# RDMA devices through the rdma-core provider, inside the QEMU guest of
# scripts/guest, and in mixed pairs with this project's software
# stack (`soft`) on the host side of the guest's private network:
#
#   rftp-siw0     rftpd --device siw0 (via its config key `device`) and rftp
#                 --device siw0 in the guest: get and put, SHA-256 compared
#   rftp-rxe0     the same on rxe0 (soft-RoCE), with IWARP_DEVICE=rxe0
#   rftp-mixA     guest rftp on siw0 -> host rftpd on soft: get and put
#   rftp-mixB     host rftp on soft -> guest rftpd on siw0: get and put
#   rhttp-modrdma guest rhttp --device siw0 -> Apache with mod_rdma on the
#                 host (soft, RDMADevice soft): GET (server-writes and
#                 client-reads) and PUT (server-reads), SHA-256 compared;
#                 the server connects back to rhttp's rdma_cm listener
#   capi-siw0, capi-rxe0  tests/c/test_device.c: the C API on the named
#                 device (iwarp_open_device_named, iwarp_listen_on, Write,
#                 Read, Send, disconnect)
#   ping-srv      guest iwarp-ping -s --device siw0 (a server on a kernel
#                 device through iwarp::cm::Listener) <- host iwarp-ping -c
#                 on soft, and <- rping -c on siw0 in the guest
#
#   scripts/test-rdmacore-apps.sh      about 1-2 min under TCG once built
#
# Every transfer prints "RDMACORE SIZE/TIME" lines: size in bytes and the
# transfer's wall time as the guest measures it (TCG: not a benchmark).
#
# Skips (exit 77, with the reason) only where the guest cannot run: no
# apt-get to build the guest (and none built), not root, no /dev/net/tun; the Apache scenario is
# reported as skipped when apache2/apxs cannot be installed.
#
# Environment: SIW_VM, SIW_WORK, NETNS/TAP/BRIDGE, RDMACORE_LOG_DIR as for
# scripts/test-rdmacore.sh; APPS_SIZE (bytes per file, default 2097152).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIW_VM="${GUEST_DIR:-$ROOT/scripts/guest}"
export WORK="${SIW_WORK:-/var/tmp/iwarp-guest}"
export NETNS="${NETNS:-siwvm}"
LOGS="${RDMACORE_LOG_DIR:-$(mktemp -d /tmp/test-rdmacore-apps.XXXXXX)}"
mkdir -p "$LOGS"
SIZE="${APPS_SIZE:-2097152}"
GUEST=10.77.0.2
HOST=10.77.0.1
REL="$ROOT/target/release"

note() { printf '[test-rdmacore-apps] %s\n' "$*"; }
skip() {
    note "SKIPPED: $*"
    [[ -n "${RDMACORE_LOG_DIR:-}" ]] || rm -rf "$LOGS"
    exit 77
}

# shellcheck source=scripts/lib/guest-host.sh
. "$ROOT/scripts/lib/guest-host.sh"
guest_can_run

note "building rftp, rftpd, rhttp, iwarp-ping, libiwarp (release)"
cargo build --release -q -p rftp -p rhttp -p iwarp-tools -p iwarp-ffi

# Apache with mod_rdma on the host side (as scripts/test-modrdma.sh).
APACHE=1
need_pkgs=()
command -v apache2 >/dev/null || need_pkgs+=(apache2)
command -v apxs >/dev/null || need_pkgs+=(apache2-dev)
command -v curl >/dev/null || need_pkgs+=(curl)
if ((${#need_pkgs[@]})); then
    note "installing ${need_pkgs[*]}"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"; } >"$LOGS/apt.log" 2>&1; then
        note "could not install ${need_pkgs[*]} (log: $LOGS/apt.log): the mod_rdma scenario is skipped"
        APACHE=0
    fi
fi
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"
if ((APACHE)); then
    if ! timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$REL" >"$LOGS/mod_rdma-build.log" 2>&1 || [[ ! -f "$MOD" ]]; then
        tail -20 "$LOGS/mod_rdma-build.log"
        note "FAILED: building mod_rdma (log: $LOGS/mod_rdma-build.log)"
        exit 1
    fi
fi

guest_built

SHARE_DIR="$(mktemp -d /tmp/test-rdmacore-apps-share.XXXXXX)"
HT="$(mktemp -d /tmp/test-rdmacore-apps-host.XXXXXX)"
chmod 755 "$HT"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [[ -n "${APID:-}" ]]; then
        kill -TERM "$APID" 2>/dev/null || true
        timeout 10 tail --pid="$APID" -f /dev/null 2>/dev/null || kill -KILL "$APID" 2>/dev/null || true
    fi
    rm -rf "$SHARE_DIR" "$HT"
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
for b in rftp rftpd rhttp iwarp-ping; do install -m755 "$REL/$b" "$SHARE_DIR/$b"; done
# The C API test on a named device, against libiwarp.so from the share.
install -m755 "$REL/libiwarp.so" "$SHARE_DIR/libiwarp.so"
if ! gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Itests/c tests/c/test_device.c \
    -o "$SHARE_DIR/test_device" -L"$REL" -liwarp -lpthread >"$LOGS/capi-build.log" 2>&1; then
    cat "$LOGS/capi-build.log"
    note "FAILED: compiling tests/c/test_device.c"
    exit 1
fi
KVER="$(cat "$WORK/out/.kver" 2>/dev/null || true)"
CRC32_KO="$WORK/kroot-$KVER/lib/modules/$KVER/kernel/crypto/crc32_generic.ko"
[[ -n "$KVER" && -f "$CRC32_KO" ]] && install -m644 "$CRC32_KO" "$SHARE_DIR/crc32_generic.ko"

# Host side files: what the host serves (mixA), and what it uploads (mixB).
mkdir -p "$HT/srv" "$HT/up" "$HT/docs" "$HT/dav" "$HT/run/dav" "$HT/logs"
head -c "$SIZE" /dev/urandom >"$HT/srv/host.bin"
head -c "$SIZE" /dev/urandom >"$HT/up/hostup.bin"
head -c "$SIZE" /dev/urandom >"$HT/docs/page.bin"
cat >"$HT/rftpd.toml" <<EOF
listen = "$HOST:2122"
root = "$HT/srv"
device = "soft"
data_timeout_secs = 60
[[users]]
name = "alice"
password = "secret"
write = true
EOF

# ---- the guest job ---------------------------------------------------------
# Results: "RDMACORE RESULT <tag> rc=N"; sizes and times: "RDMACORE TIME
# <tag> <what> <bytes> <ms>".
cat >"$SHARE_DIR/guest.sh" <<GUEST_JOB
#!/bin/sh
H=/mnt/host
G=$GUEST
HOSTIP=$HOST
SIZE=$SIZE
export HOME=/tmp RUST_LOG=warn NO_COLOR=1
show() { sed "s/^/RDMACORE \$1: /" "\$2"; }
ms() { cut -d' ' -f1 /proc/uptime | tr -d .; }
sha() { sha256sum "\$1" | cut -d' ' -f1; }
mkdir -p /tmp/srv /tmp/cli
head -c \$SIZE /dev/urandom > /tmp/srv/guest.bin
head -c \$SIZE /dev/urandom > /tmp/cli/up.bin
# timed TAG WHAT CMD...: run CMD (bounded), log, and print its time in ms.
timed() {
  tag=\$1; what=\$2; shift 2
  t0=\$(ms)
  timeout 120 "\$@" > /tmp/\$tag-\$what.log 2>&1; r=\$?
  t1=\$(ms)
  show "\$tag \$what" /tmp/\$tag-\$what.log
  echo "RDMACORE TIME \$tag \$what \$SIZE \$(( (t1 - t0) * 10 )) rc=\$r"
  return \$r
}
# rftp_pair TAG DEV PORT: rftpd and rftp on DEV in the guest, get and put.
rftp_pair() {
  tag=\$1; dev=\$2; port=\$3
  rm -f /tmp/srv/up-\$tag.bin /tmp/cli/got-\$tag.bin
  printf 'listen = "%s:%s"\nroot = "/tmp/srv"\ndevice = "%s"\ndata_timeout_secs = 60\n[[users]]\nname = "alice"\npassword = "secret"\nwrite = true\n' \$G \$port \$dev > /tmp/rftpd-\$tag.toml
  timeout 200 \$H/rftpd -c /tmp/rftpd-\$tag.toml > /tmp/rftpd-\$tag.log 2>&1 &
  spid=\$!
  i=0; while [ \$i -lt 100 ] && ! grep -q listening /tmp/rftpd-\$tag.log; do sleep 0.1; i=\$((i+1)); done
  rc=0
  timed \$tag get \$H/rftp get --device \$dev -q ftp://alice:secret@\$G:\$port/guest.bin -o /tmp/cli/got-\$tag.bin || rc=\$((rc+1))
  [ "\$(sha /tmp/cli/got-\$tag.bin)" = "\$(sha /tmp/srv/guest.bin)" ] || { echo "RDMACORE \$tag: get: SHA-256 differs"; rc=\$((rc+2)); }
  timed \$tag put env IWARP_DEVICE=\$dev \$H/rftp put -q /tmp/cli/up.bin ftp://alice:secret@\$G:\$port/up-\$tag.bin || rc=\$((rc+4))
  [ "\$(sha /tmp/srv/up-\$tag.bin)" = "\$(sha /tmp/cli/up.bin)" ] || { echo "RDMACORE \$tag: put: SHA-256 differs"; rc=\$((rc+8)); }
  kill \$spid 2>/dev/null; wait \$spid
  show "\$tag rftpd" /tmp/rftpd-\$tag.log
  echo "RDMACORE RESULT \$tag rc=\$rc"
}

rftp_pair rftp-siw0 siw0 2121
# capi DEV: tests/c/test_device.c (the C API on a named device).
capi() {
  TEST_DEVICE=\$1 TEST_ADDR=\$G LD_LIBRARY_PATH=\$H timeout 120 \$H/test_device > /tmp/capi-\$1.log 2>&1; r=\$?
  show capi-\$1 /tmp/capi-\$1.log
  echo "RDMACORE RESULT capi-\$1 rc=\$r"
}
capi siw0

# mixA: guest rftp on siw0 -> host rftpd on soft.
rc=0
rm -f /tmp/cli/host.bin
timed rftp-mixA get \$H/rftp get --device siw0 -q ftp://alice:secret@\$HOSTIP:2122/host.bin -o /tmp/cli/host.bin || rc=\$((rc+1))
echo "RDMACORE SHA rftp-mixA get \$(sha /tmp/cli/host.bin)"
timed rftp-mixA put \$H/rftp put --device siw0 -q /tmp/cli/up.bin ftp://alice:secret@\$HOSTIP:2122/from-guest.bin || rc=\$((rc+4))
echo "RDMACORE SHA rftp-mixA put \$(sha /tmp/cli/up.bin)"
echo "RDMACORE RESULT rftp-mixA rc=\$rc"

# mixB: host rftp on soft -> guest rftpd on siw0 (the host drives it).
printf 'listen = "%s:2123"\nroot = "/tmp/srv"\ndevice = "siw0"\ndata_timeout_secs = 60\n[[users]]\nname = "alice"\npassword = "secret"\nwrite = true\n' \$G > /tmp/rftpd-mixB.toml
timeout 200 \$H/rftpd -c /tmp/rftpd-mixB.toml > /tmp/rftpd-mixB.log 2>&1 &
bpid=\$!
i=0; while [ \$i -lt 100 ] && ! grep -q listening /tmp/rftpd-mixB.log; do sleep 0.1; i=\$((i+1)); done
echo "RDMACORE SHA rftp-mixB served \$(sha /tmp/srv/guest.bin)"
echo "RDMACORE READY mixB"
i=0; while [ \$i -lt 1500 ] && [ ! -f /mnt/host/mixB.done ]; do sleep 0.1; i=\$((i+1)); done
echo "RDMACORE SHA rftp-mixB uploaded \$(sha /tmp/srv/from-host.bin 2>/dev/null)"
kill \$bpid 2>/dev/null; wait \$bpid
show "rftp-mixB rftpd" /tmp/rftpd-mixB.log

# iwarp-ping as a server on siw0 (iwarp::cm::Listener on a kernel device):
# rping -c on siw0 in the guest, then the host's iwarp-ping -c on soft.
timeout 60 \$H/iwarp-ping -s --device siw0 -a \$G -p 7411 -C 3 -V --timeout 20 > /tmp/ps1.log 2>&1 &
p1=\$!
i=0; while [ \$i -lt 200 ] && ! grep -q listening /tmp/ps1.log; do sleep 0.1; i=\$((i+1)); done
timeout 60 rping -c -a \$G -p 7411 -C 3 -V > /tmp/pc1.log 2>&1; r1=\$?
wait \$p1; r2=\$?
show ping-srv /tmp/ps1.log; show ping-srv /tmp/pc1.log
timeout 60 \$H/iwarp-ping -s --device siw0 -a \$G -p 7412 -C 3 -V --timeout 30 > /tmp/ps2.log 2>&1 &
p2=\$!
i=0; while [ \$i -lt 200 ] && ! grep -q listening /tmp/ps2.log; do sleep 0.1; i=\$((i+1)); done
echo "RDMACORE READY ping-srv"
wait \$p2; r3=\$?
show ping-srv /tmp/ps2.log
echo "RDMACORE RESULT ping-srv rc=\$((r1 + r2 + r3))"

# rhttp in the guest on siw0 -> Apache with mod_rdma on the host (soft).
if [ -f /mnt/host/apache.up ]; then
  rc=0
  # At the default locked-memory limit (8 MiB) siw refuses to register
  # rhttp's 32 MiB server-writes buffer (ENOMEM): the error must say so and
  # name the fix; then raise the limit, as RDMA hosts do.
  timeout 60 \$H/rhttp --device siw0 -q --timeout 60 get http://\$HOSTIP:8089/page.bin -o /tmp/cli/memlock.bin > /tmp/memlock.log 2>&1 && rc=\$((rc+16))
  show "rhttp-modrdma memlock" /tmp/memlock.log
  grep -q "ulimit -l" /tmp/memlock.log || { echo "RDMACORE rhttp-modrdma: ENOMEM without the memlock hint"; rc=\$((rc+32)); }
  ulimit -l unlimited || echo "RDMACORE note: ulimit -l unlimited failed"
  for s in server-writes client-reads; do
    rm -f /tmp/cli/page-\$s.bin
    timed rhttp-modrdma get-\$s \$H/rhttp --device siw0 -q --timeout 60 get --scheme \$s http://\$HOSTIP:8089/page.bin -o /tmp/cli/page-\$s.bin || rc=\$((rc+1))
    echo "RDMACORE SHA rhttp-modrdma get-\$s \$(sha /tmp/cli/page-\$s.bin)"
    grep -q "via RDMA" /tmp/rhttp-modrdma-get-\$s.log || { echo "RDMACORE rhttp-modrdma: get-\$s did not go via RDMA"; rc=\$((rc+2)); }
  done
  timed rhttp-modrdma put \$H/rhttp --device siw0 -q --timeout 60 put --scheme server-reads /tmp/cli/up.bin http://\$HOSTIP:8089/dav/from-guest.bin || rc=\$((rc+4))
  grep -q "via RDMA" /tmp/rhttp-modrdma-put.log || { echo "RDMACORE rhttp-modrdma: put did not go via RDMA"; rc=\$((rc+8)); }
  echo "RDMACORE SHA rhttp-modrdma put \$(sha /tmp/cli/up.bin)"
  echo "RDMACORE RESULT rhttp-modrdma rc=\$rc"
else
  echo "RDMACORE RESULT rhttp-modrdma skipped"
fi

# rxe0: siw0 and rxe0 take turns on eth0 (see scripts/test-rdmacore.sh).
rdma link delete siw0 || echo "RDMACORE note: rdma link delete siw0 failed"
[ -f \$H/crc32_generic.ko ] && { insmod \$H/crc32_generic.ko || echo "RDMACORE note: insmod crc32_generic failed"; }
modprobe rdma_rxe || echo "RDMACORE note: modprobe rdma_rxe failed"
rdma link add rxe0 type rxe netdev eth0 || echo "RDMACORE note: rdma link add rxe0 failed"
rftp_pair rftp-rxe0 rxe0 2124
capi rxe0
echo "RDMACORE ALLDONE"
GUEST_JOB
chmod +x "$SHARE_DIR/guest.sh"

"$SIW_VM/run.sh" up >/dev/null
# mixA's server: rftpd on soft in the netns.
ip netns exec "$NETNS" timeout 400 "$REL/rftpd" -c "$HT/rftpd.toml" >"$LOGS/host-rftpd.log" 2>&1 &
PIDS+=($!)
# Apache with mod_rdma on soft in the netns, port 8089.
APID=""
if ((APACHE)); then
    chown -R www-data:www-data "$HT/dav" "$HT/run/dav"
    chmod -R a+rX "$HT/docs"
    cat >"$HT/apache.conf" <<EOF
ServerRoot /etc/apache2
ServerName $HOST
DefaultRuntimeDir $HT/run
PidFile $HT/run/httpd.pid
ErrorLog $HT/logs/error.log
User www-data
Group www-data
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
LoadModule alias_module /usr/lib/apache2/modules/mod_alias.so
LoadModule dav_module /usr/lib/apache2/modules/mod_dav.so
LoadModule dav_fs_module /usr/lib/apache2/modules/mod_dav_fs.so
LoadModule rdma_module $MOD
StartServers 1
MinSpareServers 1
MaxSpareServers 2
ServerLimit 2
MaxRequestWorkers 2
KeepAlive On
TypesConfig /etc/mime.types
DocumentRoot $HT/docs
Alias /dav $HT/dav
DavLockDB $HT/run/dav/lock
Listen $HOST:8089
LogLevel warn rdma:debug
RDMADevice soft
RDMARegistration static
RDMABufferSize 8M
RDMAConnectTimeout 20000
RDMATimeout 60000
<Directory />
    Require all granted
</Directory>
<Location /dav>
    Dav On
</Location>
<Location />
    RDMA On
</Location>
EOF
    (exec ip netns exec "$NETNS" setsid apache2 -d /etc/apache2 -f "$HT/apache.conf" -DFOREGROUND >"$LOGS/apache-stdout.log" 2>&1) &
    APID=$!
    for _ in $(seq 1 100); do
        if ip netns exec "$NETNS" curl -s -o /dev/null --max-time 1 "http://$HOST:8089/page.bin"; then
            : >"$SHARE_DIR/apache.up"
            break
        fi
        sleep 0.1
    done
    [[ -f "$SHARE_DIR/apache.up" ]] || note "apache2 with mod_rdma did not come up in the netns (logs: $LOGS/apache-stdout.log, $HT/logs/error.log)"
fi

GLOG="$LOGS/guest.log"
note "booting the guest (logs in $LOGS)"
: >"$GLOG"
SHARE="$SHARE_DIR" TIMEOUT=420 MEM=1536 "$SIW_VM/run.sh" </dev/null >"$GLOG" 2>&1 &
BOOT=$!
# mixB's host side: rftp on soft against the guest's rftpd on siw0.
MIXB_RC=1
: >"$LOGS/mixB-host.log"
if wait_line "$GLOG" "RDMACORE READY mixB" 300; then
    MIXB_RC=0
    t0=$(date +%s%N)
    ip netns exec "$NETNS" timeout 120 "$REL/rftp" get --device soft -q "ftp://alice:secret@$GUEST:2123/guest.bin" -o "$HT/got-mixB.bin" >>"$LOGS/mixB-host.log" 2>&1 || MIXB_RC=$((MIXB_RC + 1))
    t1=$(date +%s%N)
    ip netns exec "$NETNS" timeout 120 "$REL/rftp" put --device soft -q "$HT/up/hostup.bin" "ftp://alice:secret@$GUEST:2123/from-host.bin" >>"$LOGS/mixB-host.log" 2>&1 || MIXB_RC=$((MIXB_RC + 2))
    t2=$(date +%s%N)
    echo "TIME rftp-mixB get $SIZE $(((t1 - t0) / 1000000)) ms; put $SIZE $(((t2 - t1) / 1000000)) ms" >>"$LOGS/mixB-host.log"
else
    note "the guest never announced mixB"
fi
: >"$SHARE_DIR/mixB.done"
# ping-srv's host side: iwarp-ping -c on soft against the guest's server on siw0.
PING_RC=1
if wait_line "$GLOG" "RDMACORE READY ping-srv" 200; then
    PING_RC=0
    ip netns exec "$NETNS" timeout 60 "$REL/iwarp-ping" -c --device soft -a "$GUEST" -p 7412 -C 3 -V --timeout 20 >"$LOGS/ping-host.log" 2>&1 || PING_RC=$?
fi
rc=0
wait "$BOOT" || rc=$?

FAILS=0
PASSES=0
CLEAN="$LOGS/guest.clean.log"
tr -d '\r' <"$GLOG" >"$CLEAN"
gsha() { grep -a "^RDMACORE SHA $1 " "$CLEAN" | awk '{print $NF}' | tail -1; }
check() { # TAG HOST_RC DESC
    local tag="$1" hrc="$2" desc="$3"
    grep -a "^RDMACORE $tag" "$CLEAN" | grep -v "^RDMACORE RESULT" | sed "s/^RDMACORE /    /" || true
    if grep -aqE "^RDMACORE RESULT $tag skipped" "$CLEAN"; then
        note "SKIP $tag: $desc (apache2 with mod_rdma not available on the host side)"
    elif ((hrc == 0)) && grep -aqE "^RDMACORE RESULT $tag rc=0\$" "$CLEAN"; then
        note "PASS $tag: $desc"
        PASSES=$((PASSES + 1))
    else
        note "FAIL $tag: $desc: host side $hrc; $(grep -a "^RDMACORE RESULT $tag " "$CLEAN" || echo "no guest result (guest exit $rc)")"
        FAILS=$((FAILS + 1))
    fi
}
sha() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }
# Host-side SHA-256 comparisons of the mixed pairs.
MIXA_RC=0
[[ "$(gsha "rftp-mixA get")" == "$(sha "$HT/srv/host.bin")" ]] || { note "rftp-mixA get: SHA-256 differs"; MIXA_RC=1; }
[[ "$(gsha "rftp-mixA put")" == "$(sha "$HT/srv/from-guest.bin")" ]] || { note "rftp-mixA put: SHA-256 differs"; MIXA_RC=1; }
[[ "$(gsha "rftp-mixB served")" == "$(sha "$HT/got-mixB.bin")" ]] || { note "rftp-mixB get: SHA-256 differs"; MIXB_RC=$((MIXB_RC + 4)); }
[[ "$(gsha "rftp-mixB uploaded")" == "$(sha "$HT/up/hostup.bin")" ]] || { note "rftp-mixB put: SHA-256 differs"; MIXB_RC=$((MIXB_RC + 8)); }
RHTTP_RC=0
if [[ -f "$SHARE_DIR/apache.up" ]]; then
    for s in server-writes client-reads; do
        [[ "$(gsha "rhttp-modrdma get-$s")" == "$(sha "$HT/docs/page.bin")" ]] || { note "rhttp-modrdma get-$s: SHA-256 differs"; RHTTP_RC=1; }
    done
    [[ "$(gsha "rhttp-modrdma put")" == "$(sha "$HT/dav/from-guest.bin")" ]] || { note "rhttp-modrdma put: SHA-256 differs"; RHTTP_RC=1; }
fi

check rftp-siw0 0 "rftpd and rftp on siw0 (config key device / --device / IWARP_DEVICE): get and put of $SIZE bytes, SHA-256 equal"
check rftp-mixA "$MIXA_RC" "guest rftp on siw0 -> host rftpd on soft: get and put, SHA-256 equal"
sed 's/^/    host: /' "$LOGS/mixB-host.log" || true
grep -a "RDMACORE SHA rftp-mixB" "$CLEAN" | sed 's/^RDMACORE /    /' || true
if ((MIXB_RC == 0)) && grep -aq "RDMACORE READY mixB" "$CLEAN"; then
    note "PASS rftp-mixB: host rftp on soft -> guest rftpd on siw0: get and put, SHA-256 equal"
    PASSES=$((PASSES + 1))
else
    note "FAIL rftp-mixB: host rftp on soft -> guest rftpd on siw0: host side $MIXB_RC"
    FAILS=$((FAILS + 1))
fi
sed 's/^/    host: /' "$LOGS/ping-host.log" 2>/dev/null || true
check ping-srv "$PING_RC" "iwarp-ping -s --device siw0 (iwarp::cm::Listener on a kernel device) <- rping -c on siw0 and <- iwarp-ping -c on soft from the host"
check rhttp-modrdma "$RHTTP_RC" "rhttp --device siw0 in the guest <-> Apache + mod_rdma on soft on the host: GET server-writes and client-reads, PUT server-reads, SHA-256 equal"
check rftp-rxe0 0 "rftpd and rftp on rxe0 (soft-RoCE): get and put, SHA-256 equal"
check capi-siw0 0 "C API on siw0 (iwarp_open_device_named, iwarp_listen_on; Write, Read, Send, disconnect)"
check capi-rxe0 0 "C API on rxe0 (the same)"
if ! grep -aq "RDMACORE ALLDONE" "$CLEAN"; then
    note "the guest did not finish its job (log: $GLOG)"
    FAILS=$((FAILS + 1))
fi
grep -a "^RDMACORE TIME" "$CLEAN" | sed 's/^RDMACORE TIME /    time: /' || true
note "$PASSES passed, $FAILS failed"
if ((FAILS > 0)); then
    cp -f "$HT/logs/error.log" "$LOGS/apache-error.log" 2>/dev/null || true
    note "logs kept in $LOGS"
    exit 1
fi
[[ -n "${RDMACORE_LOG_DIR:-}" ]] || rm -rf "$LOGS"
