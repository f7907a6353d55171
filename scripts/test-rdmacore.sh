#!/usr/bin/env bash
# The verbs API through the rdma-core provider on real kernel RDMA devices:
# crates/iwarp/examples/rdma_loopback.rs (a server and a client thread
# connected with rdma_cm; Send/Recv both ways with private data both ways,
# a 4 KiB RDMA Write, a 4 KiB RDMA Read with the data checked, and a
# disconnect that flushes a posted receive) run inside the QEMU guest of
# ../shared/tools/siw-vm, first on siw0 (Linux soft-iWARP), then on rxe0
# (Linux soft-RoCE, rdma_rxe), over the guest's eth0 address.
#
#   scripts/test-rdmacore.sh            about 30 s under TCG once built
#
# The binary goes to the guest through the siw-vm SHARE= 9p export, with
# the guest job (guest.sh) next to it; the guest's initramfs already holds
# libibverbs, librdmacm and the siw/rxe user-space providers (siw-vm's
# build.sh puts them there for rping).
#
# Skips (exit 77, with the reason) only where the guest cannot run: no
# ../shared/tools/siw-vm, not root (network namespace, tap), or no
# /dev/net/tun. A failed build of the guest or of the example is a failure.
#
# Environment: SIW_VM (default ../shared/tools/siw-vm), SIW_WORK (guest
# artifacts, default /var/tmp/siw-vm), RDMACORE_LOG_DIR (logs, default a
# temporary directory, kept on failure).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIW_VM="${SIW_VM:-$ROOT/../shared/tools/siw-vm}"
export WORK="${SIW_WORK:-/var/tmp/siw-vm}"
LOGS="${RDMACORE_LOG_DIR:-$(mktemp -d /tmp/test-rdmacore.XXXXXX)}"
mkdir -p "$LOGS"
BIN="$ROOT/target/release/examples/rdma_loopback"
GUEST=10.77.0.2

note() { printf '[test-rdmacore] %s\n' "$*"; }
skip() {
    note "SKIPPED: $*"
    exit 77
}

[[ -x "$SIW_VM/run.sh" ]] || skip "no siw guest tooling at $SIW_VM (the shared/ folder beside the repository)"
((EUID == 0)) || skip "needs root for the guest's network namespace and tap device"
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun: QEMU cannot attach the guest's tap device here"

note "building examples/rdma_loopback (feature rdma-core)"
cargo build --release -q -p iwarp --example rdma_loopback

if [[ ! -s "$WORK/out/initramfs.cpio.gz" || ! -s "$WORK/out/vmlinuz" ]]; then
    note "building the siw guest (Debian kernel, siw.ko, initramfs; about a minute)"
    if ! "$SIW_VM/build.sh" >"$LOGS/build.log" 2>&1; then
        tail -20 "$LOGS/build.log"
        note "FAILED: building the siw guest failed (log: $LOGS/build.log)"
        exit 1
    fi
fi
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed and build.sh did not install it"

SHARE_DIR="$(mktemp -d /tmp/test-rdmacore-share.XXXXXX)"
cleanup() {
    rm -rf "$SHARE_DIR"
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
install -m755 "$BIN" "$SHARE_DIR/rdma_loopback"
# rdma_rxe computes its ICRC with the kernel's "crc32" shash, which Debian
# builds as crc32_generic.ko; siw-vm's initramfs does not carry it (siw
# needs only crc32c), so rdma_rxe refuses to add a device ("failed to add
# eth0", ENOENT). Hand it to the guest from the kernel tree build.sh
# unpacked.
KVER="$(cat "$WORK/out/.kver" 2>/dev/null || true)"
CRC32_KO="$WORK/kroot-$KVER/lib/modules/$KVER/kernel/crypto/crc32_generic.ko"
if [[ -n "$KVER" && -f "$CRC32_KO" ]]; then
    install -m644 "$CRC32_KO" "$SHARE_DIR/crc32_generic.ko"
else
    note "no crc32_generic.ko under $WORK/kroot-$KVER: rxe0 will likely fail to come up"
fi

# The guest job. siw0 and rxe0 would both sit on eth0 with one address, and
# rdma_cm resolves an address to one device, so the devices take turns:
# siw0 (created by the guest's init) first, then it is removed and rxe0
# added. Every command is bounded by `timeout`.
cat >"$SHARE_DIR/guest.sh" <<EOF
#!/bin/sh
B=/mnt/host/rdma_loopback
echo "RDMACORE LIST BEGIN"
timeout 30 \$B list
echo "RDMACORE LIST END"
run() {
  dev=\$1 port=\$2
  timeout 90 \$B \$dev $GUEST \$port > /tmp/\$dev.log 2>&1; rc=\$?
  sed "s/^/RDMACORE \$dev: /" /tmp/\$dev.log
  echo "RDMACORE RESULT \$dev rc=\$rc"
}
run siw0 7400
rdma link delete siw0 || echo "RDMACORE note: rdma link delete siw0 failed"
[ -f /mnt/host/crc32_generic.ko ] && { insmod /mnt/host/crc32_generic.ko || echo "RDMACORE note: insmod crc32_generic failed"; }
modprobe rdma_rxe || echo "RDMACORE note: modprobe rdma_rxe failed"
rdma link add rxe0 type rxe netdev eth0 || echo "RDMACORE note: rdma link add rxe0 failed"
rdma link show
run rxe0 7401
echo "RDMACORE ALLDONE"
EOF
chmod +x "$SHARE_DIR/guest.sh"

GLOG="$LOGS/guest.log"
note "booting the guest (logs in $LOGS)"
rc=0
SHARE="$SHARE_DIR" TIMEOUT=300 "$SIW_VM/run.sh" </dev/null >"$GLOG" 2>&1 || rc=$?
tr -d '\r' <"$GLOG" | sed -n '/RDMACORE LIST BEGIN/,/RDMACORE LIST END/p' | grep -v 'RDMACORE LIST' | sed 's/^/    /'

FAILS=0
for dev in siw0 rxe0; do
    tr -d '\r' <"$GLOG" | grep -a "^RDMACORE $dev: " | sed "s/^RDMACORE $dev: /    /" || true
    if tr -d '\r' <"$GLOG" | grep -aqE "^RDMACORE RESULT $dev rc=0\$"; then
        note "PASS $dev: Send/Recv, RDMA Write, RDMA Read, flush through rdma-core"
    else
        note "FAIL $dev: $(tr -d '\r' <"$GLOG" | grep -a "^RDMACORE RESULT $dev " || echo "no result (guest exit $rc)")"
        FAILS=$((FAILS + 1))
    fi
done
if ! grep -aq "RDMACORE ALLDONE" "$GLOG"; then
    note "the guest did not finish its job (log: $GLOG)"
    FAILS=$((FAILS + 1))
fi

if ((FAILS > 0)); then
    note "$FAILS failed; logs kept in $LOGS"
    exit 1
fi
note "2 passed"
[[ -n "${RDMACORE_LOG_DIR:-}" ]] || rm -rf "$LOGS"
