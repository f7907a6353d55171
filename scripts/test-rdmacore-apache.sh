#!/usr/bin/env bash
# Apache httpd with mod_rdma on kernel RDMA devices: Debian's apache2 and
# this project's mod_rdma run inside the QEMU guest of scripts/guest
# (the host's binaries and their libraries, handed over 9p), with
# `RDMADevice siw0` and then `RDMADevice rxe0`, so mod_rdma goes through the
# rdma-core provider of libiwarp:
#
#   apache-siw0   rhttp --device siw0 in the guest -> Apache + mod_rdma on
#                 siw0 in the guest: GET (server-writes, client-reads) and
#                 PUT (server-reads), SHA-256 compared
#   apache-mix    rhttp on soft on the host side -> the same Apache on siw0:
#                 GET server-writes and PUT, SHA-256 compared on the host
#                 (the reverse of test-rdmacore-apps.sh's rhttp-modrdma)
#   apache-rxe0   rhttp --device rxe0 -> Apache + mod_rdma on rxe0
#                 (soft-RoCE): GET and PUT, SHA-256 compared
#
# Each transfer must report "via RDMA" (not the plain-HTTP fallback).
# Apache runs as uid 65534 after start-up, as it would under Debian's
# www-data: the job opens /dev/infiniband to it (udev does that on a
# distribution) and raises RLIMIT_MEMLOCK (a kernel device pins registered
# memory against it).
#
#   scripts/test-rdmacore-apache.sh     about a minute under TCG
#
# Skips (exit 77, with the reason) where the guest cannot run, or where
# apache2/apxs cannot be installed. Environment: SIW_VM, SIW_WORK,
# NETNS/TAP/BRIDGE, RDMACORE_LOG_DIR as scripts/test-rdmacore.sh;
# APPS_SIZE (bytes per file, default 2097152).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIW_VM="${GUEST_DIR:-$ROOT/scripts/guest}"
export WORK="${SIW_WORK:-/var/tmp/iwarp-guest}"
export NETNS="${NETNS:-siwvm}"
LOGS="${RDMACORE_LOG_DIR:-$(mktemp -d /tmp/test-rdmacore-apache.XXXXXX)}"
mkdir -p "$LOGS"
SIZE="${APPS_SIZE:-2097152}"
GUEST=10.77.0.2
REL="$ROOT/target/release"

note() { printf '[test-rdmacore-apache] %s\n' "$*"; }
skip() {
    note "SKIPPED: $*"
    [[ -n "${RDMACORE_LOG_DIR:-}" ]] || rm -rf "$LOGS"
    exit 77
}

# shellcheck source=scripts/lib/guest-host.sh
. "$ROOT/scripts/lib/guest-host.sh"
guest_can_run

need_pkgs=()
command -v apache2 >/dev/null || need_pkgs+=(apache2)
command -v apxs >/dev/null || need_pkgs+=(apache2-dev)
if ((${#need_pkgs[@]})); then
    note "installing ${need_pkgs[*]}"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"; } >"$LOGS/apt.log" 2>&1; then
        skip "could not install ${need_pkgs[*]} (log: $LOGS/apt.log)"
    fi
fi

note "building rhttp, libiwarp and mod_rdma (release)"
cargo build --release -q -p rhttp -p iwarp-ffi
MOD="$ROOT/modules/mod_rdma/.libs/mod_rdma.so"
if ! timeout 300 make -s -C modules/mod_rdma IWARP_LIB="$REL" >"$LOGS/mod_rdma-build.log" 2>&1 || [[ ! -f "$MOD" ]]; then
    tail -20 "$LOGS/mod_rdma-build.log"
    note "FAILED: building mod_rdma (log: $LOGS/mod_rdma-build.log)"
    exit 1
fi

guest_built

SHARE_DIR="$(mktemp -d /tmp/test-rdmacore-apache-share.XXXXXX)"
HT="$(mktemp -d /tmp/test-rdmacore-apache-host.XXXXXX)"
cleanup() {
    rm -rf "$SHARE_DIR" "$HT"
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT

# The guest's Apache: the host's apache2, the modules the configuration
# loads, mod_rdma and libiwarp, and every library they link (the guest's
# own glibc comes from this same host, so the versions agree).
MODDIR=/usr/lib/apache2/modules
mkdir -p "$SHARE_DIR/bin" "$SHARE_DIR/lib" "$SHARE_DIR/mod"
install -m755 "$(command -v apache2)" "$SHARE_DIR/bin/apache2"
install -m755 "$REL/rhttp" "$SHARE_DIR/bin/rhttp"
for m in mpm_prefork authz_core alias dav dav_fs; do
    install -m644 "$MODDIR/mod_$m.so" "$SHARE_DIR/mod/mod_$m.so"
done
install -m644 "$MOD" "$SHARE_DIR/mod/mod_rdma.so"
install -m755 "$REL/libiwarp.so" "$SHARE_DIR/lib/libiwarp.so"
# mod_dav_fs keeps its lock database through apr-util's DBM drivers, which
# apr-util loads from its own directory: the job puts them there.
APRU=/usr/lib/x86_64-linux-gnu/apr-util-1
mkdir -p "$SHARE_DIR/apr-util-1"
cp -L "$APRU"/apr_dbm_*.so "$SHARE_DIR/apr-util-1/" 2>/dev/null || note "no apr-util DBM drivers in $APRU: PUT will fail"
for f in "$SHARE_DIR/bin/apache2" "$SHARE_DIR"/mod/*.so "$SHARE_DIR/lib/libiwarp.so" "$SHARE_DIR"/apr-util-1/*.so; do
    ldd "$f" | grep -oE '/[^ ]+\.so[^ ]*' | while read -r l; do
        [[ -e "$SHARE_DIR/lib/$(basename "$l")" ]] || cp -L "$l" "$SHARE_DIR/lib/"
    done
done
# Apache's and the modules' own libraries (libapr, libaprutil, ...) may be
# found through the binary's runpath on the host: ldd listed them anyway.

# ---- the guest job ---------------------------------------------------------
# Results: "RDMACORE RESULT <tag> rc=N".
cat >"$SHARE_DIR/guest.sh" <<GUEST_JOB
#!/bin/sh
$(cat "$ROOT/scripts/lib/guest-listening.sh")
H=/mnt/host
G=$GUEST
SIZE=$SIZE
export HOME=/tmp RUST_LOG=warn NO_COLOR=1
show() { sed "s/^/RDMACORE \$1: /" "\$2"; }
sha() { sha256sum "\$1" 2>/dev/null | cut -d' ' -f1; }
ulimit -l unlimited || echo "RDMACORE note: ulimit -l unlimited failed"
mkdir -p $APRU && cp \$H/apr-util-1/*.so $APRU/
A=/tmp/ap
mkdir -p \$A/docs \$A/dav \$A/run/dav \$A/logs /tmp/cli
head -c \$SIZE /dev/urandom > \$A/docs/page.bin
head -c \$SIZE /dev/urandom > /tmp/cli/up.bin
chmod -R a+rX \$A/docs
chown -R 65534:65534 \$A/dav \$A/run/dav \$A/logs
echo "RDMACORE SHA page \$(sha \$A/docs/page.bin)"
# conf DEV: the Apache configuration with mod_rdma on DEV.
conf() {
  cat <<EOF
ServerRoot \$A
ServerName \$G
DefaultRuntimeDir \$A/run
PidFile \$A/run/httpd.pid
ErrorLog \$A/logs/error-\$1.log
User #65534
Group #65534
LoadModule mpm_prefork_module \$H/mod/mod_mpm_prefork.so
LoadModule authz_core_module \$H/mod/mod_authz_core.so
LoadModule alias_module \$H/mod/mod_alias.so
LoadModule dav_module \$H/mod/mod_dav.so
LoadModule dav_fs_module \$H/mod/mod_dav_fs.so
LoadModule rdma_module \$H/mod/mod_rdma.so
StartServers 1
MinSpareServers 1
MaxSpareServers 2
ServerLimit 2
MaxRequestWorkers 2
KeepAlive On
DocumentRoot \$A/docs
Alias /dav \$A/dav
DavLockDB \$A/run/dav/lock
Listen \$G:8089
LogLevel warn rdma:debug
RDMADevice \$1
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
}
# start DEV: Apache with mod_rdma on DEV; 0 once it listens.
start() {
  chmod 666 /dev/infiniband/* 2>/dev/null
  conf \$1 > \$A/apache-\$1.conf
  # setsid: Apache's parent signals its whole process group on shutdown.
  LD_LIBRARY_PATH=\$H/lib setsid \$H/bin/apache2 -d \$A -f \$A/apache-\$1.conf -DFOREGROUND > \$A/logs/stdout-\$1.log 2>&1 &
  apid=\$!
  listening 8089 || { show "apache-\$1 stdout" \$A/logs/stdout-\$1.log; show "apache-\$1 error" \$A/logs/error-\$1.log; return 1; }
}
stop() {
  kill \$apid 2>/dev/null
  i=0; while [ \$i -lt 100 ] && kill -0 \$apid 2>/dev/null; do sleep 0.1; i=\$((i+1)); done
  kill -9 \$apid 2>/dev/null
  wait \$apid 2>/dev/null
}
# local TAG DEV: rhttp on DEV against the guest's Apache.
local_pair() {
  tag=\$1; dev=\$2; rc=0
  for s in server-writes client-reads; do
    rm -f /tmp/cli/page-\$s.bin
    timeout 120 \$H/bin/rhttp --device \$dev -q --timeout 60 get --scheme \$s http://\$G:8089/page.bin -o /tmp/cli/page-\$s.bin > /tmp/\$tag-\$s.log 2>&1 || rc=\$((rc+1))
    show "\$tag get-\$s" /tmp/\$tag-\$s.log
    [ "\$(sha /tmp/cli/page-\$s.bin)" = "\$(sha \$A/docs/page.bin)" ] || { echo "RDMACORE \$tag: get-\$s: SHA-256 differs"; rc=\$((rc+2)); }
    grep -q "via RDMA" /tmp/\$tag-\$s.log || { echo "RDMACORE \$tag: get-\$s did not go via RDMA"; rc=\$((rc+4)); }
  done
  rm -f \$A/dav/up-\$tag.bin
  timeout 120 \$H/bin/rhttp --device \$dev -q --timeout 60 put --scheme server-reads /tmp/cli/up.bin http://\$G:8089/dav/up-\$tag.bin > /tmp/\$tag-put.log 2>&1 || rc=\$((rc+8))
  show "\$tag put" /tmp/\$tag-put.log
  [ "\$(sha \$A/dav/up-\$tag.bin)" = "\$(sha /tmp/cli/up.bin)" ] || { echo "RDMACORE \$tag: put: SHA-256 differs"; rc=\$((rc+16)); }
  grep -q "via RDMA" /tmp/\$tag-put.log || { echo "RDMACORE \$tag: put did not go via RDMA"; rc=\$((rc+32)); }
  [ \$rc = 0 ] || show "\$tag apache error log" \$A/logs/error-\$dev.log
  echo "RDMACORE RESULT \$tag rc=\$rc"
}

if start siw0; then
  local_pair apache-siw0 siw0
  # apache-mix: the host's rhttp on soft drives this Apache.
  echo "RDMACORE READY mix"
  i=0; while [ \$i -lt 1200 ] && [ ! -f \$H/mix.done ]; do sleep 0.1; i=\$((i+1)); done
  echo "RDMACORE SHA apache-mix put \$(sha \$A/dav/from-host.bin)"
  show "apache-mix apache error log" \$A/logs/error-siw0.log
  stop
else
  echo "RDMACORE RESULT apache-siw0 rc=100"
  echo "RDMACORE READY mix"
fi

rdma link delete siw0 || echo "RDMACORE note: rdma link delete siw0 failed"
[ -f \$H/crc32_generic.ko ] && { insmod \$H/crc32_generic.ko || echo "RDMACORE note: insmod crc32_generic failed"; }
modprobe rdma_rxe || echo "RDMACORE note: modprobe rdma_rxe failed"
rdma link add rxe0 type rxe netdev eth0 || echo "RDMACORE note: rdma link add rxe0 failed"
if start rxe0; then
  local_pair apache-rxe0 rxe0
  stop
else
  echo "RDMACORE RESULT apache-rxe0 rc=100"
fi
echo "RDMACORE ALLDONE"
GUEST_JOB
chmod +x "$SHARE_DIR/guest.sh"
KVER="$(cat "$WORK/out/.kver" 2>/dev/null || true)"
CRC32_KO="$WORK/kroot-$KVER/lib/modules/$KVER/kernel/crypto/crc32_generic.ko"
[[ -n "$KVER" && -f "$CRC32_KO" ]] && install -m644 "$CRC32_KO" "$SHARE_DIR/crc32_generic.ko"
head -c "$SIZE" /dev/urandom >"$HT/hostup.bin"

"$SIW_VM/run.sh" up >/dev/null
GLOG="$LOGS/guest.log"
note "booting the guest (logs in $LOGS)"
: >"$GLOG"
SHARE="$SHARE_DIR" TIMEOUT=420 MEM=1536 "$SIW_VM/run.sh" </dev/null >"$GLOG" 2>&1 &
BOOT=$!
# apache-mix's host side: rhttp on soft against the guest's Apache on siw0.
MIX_RC=1
: >"$LOGS/mix-host.log"
if wait_line "$GLOG" "RDMACORE READY mix" 300; then
    MIX_RC=0
    ip netns exec "$NETNS" timeout 120 "$REL/rhttp" --device soft -q --timeout 60 get --scheme server-writes \
        "http://$GUEST:8089/page.bin" -o "$HT/got.bin" >>"$LOGS/mix-host.log" 2>&1 || MIX_RC=$((MIX_RC + 1))
    ip netns exec "$NETNS" timeout 120 "$REL/rhttp" --device soft -q --timeout 60 put --scheme server-reads \
        "$HT/hostup.bin" "http://$GUEST:8089/dav/from-host.bin" >>"$LOGS/mix-host.log" 2>&1 || MIX_RC=$((MIX_RC + 2))
    [[ "$(grep -c "via RDMA" "$LOGS/mix-host.log")" == 2 ]] || MIX_RC=$((MIX_RC + 4))
else
    note "the guest never announced the mixed pair"
fi
: >"$SHARE_DIR/mix.done"
rc=0
wait "$BOOT" || rc=$?

FAILS=0
PASSES=0
CLEAN="$LOGS/guest.clean.log"
tr -d '\r' <"$GLOG" >"$CLEAN"
gsha() { grep -a "^RDMACORE SHA $1 " "$CLEAN" | awk '{print $NF}' | tail -1; }
sha() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }
check() { # TAG HOST_RC DESC
    local tag="$1" hrc="$2" desc="$3"
    grep -a "^RDMACORE $tag" "$CLEAN" | grep -v "^RDMACORE RESULT" | sed "s/^RDMACORE /    /" || true
    if ((hrc == 0)) && grep -aqE "^RDMACORE RESULT $tag rc=0\$" "$CLEAN"; then
        note "PASS $tag: $desc"
        PASSES=$((PASSES + 1))
    else
        note "FAIL $tag: $desc: host side $hrc; $(grep -a "^RDMACORE RESULT $tag " "$CLEAN" || echo "no guest result (guest exit $rc)")"
        FAILS=$((FAILS + 1))
    fi
}
check apache-siw0 0 "rhttp --device siw0 -> Apache + mod_rdma (RDMADevice siw0), both in the guest: GET server-writes and client-reads, PUT server-reads, SHA-256 equal, via RDMA"
sed 's/^/    host: /' "$LOGS/mix-host.log" || true
grep -a "^RDMACORE apache-mix" "$CLEAN" | sed "s/^RDMACORE /    /" || true
[[ "$(sha "$HT/got.bin")" == "$(gsha page)" ]] || { note "apache-mix get: SHA-256 differs"; MIX_RC=$((MIX_RC + 8)); }
[[ "$(gsha "apache-mix put")" == "$(sha "$HT/hostup.bin")" ]] || { note "apache-mix put: SHA-256 differs"; MIX_RC=$((MIX_RC + 16)); }
if ((MIX_RC == 0)); then
    note "PASS apache-mix: rhttp on soft (host) -> Apache + mod_rdma on siw0 (guest): GET server-writes and PUT server-reads, SHA-256 equal, via RDMA"
    PASSES=$((PASSES + 1))
else
    note "FAIL apache-mix: rhttp on soft (host) -> Apache + mod_rdma on siw0 (guest): host side $MIX_RC"
    FAILS=$((FAILS + 1))
fi
check apache-rxe0 0 "rhttp --device rxe0 -> Apache + mod_rdma (RDMADevice rxe0), both in the guest: GET and PUT, SHA-256 equal, via RDMA"
if ! grep -aq "RDMACORE ALLDONE" "$CLEAN"; then
    note "the guest did not finish its job (log: $GLOG)"
    FAILS=$((FAILS + 1))
fi
note "$PASSES passed, $FAILS failed"
if ((FAILS > 0)); then
    note "logs kept in $LOGS"
    exit 1
fi
[[ -n "${RDMACORE_LOG_DIR:-}" ]] || rm -rf "$LOGS"
