#!/usr/bin/env bash
# Boot the interop guest that scripts/guest/build.sh made, with its NIC on a
# tap device inside a private network namespace: the host side of that
# network is $HOST_IP (10.77.0.1) on a bridge, the guest is 10.77.0.(2+VM).
# Nothing is routed out of the namespace. See scripts/guest/README.md.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/guest/run.sh up | down | hostns CMD... | [boot] [JOB] | --help

  up            make the network namespace $NETNS: bridge $BRIDGE with
                $HOST_IP/24 and tap $TAP on it (idempotent)
  down          delete the namespace (and the tap and bridge with it)
  hostns CMD    run CMD in the namespace (the host side of the guest's net)
  [boot] [JOB]  boot the guest (does `up` first); JOB, a sh script, runs in
                the guest as /etc/guest/job.sh and the guest powers off when
                it returns. With SHARE=DIR, DIR is the guest's /mnt/host (9p)
                and DIR/guest.sh is the job. No job: a shell on the console
                (Ctrl-A X quits QEMU).

Environment:
  WORK=/var/tmp/iwarp-guest   the artifacts of build.sh
  SIWOPTS=a=1,b=0             siw module parameters (mpa_crc_required,
                              mpa_crc_strict, peer_to_peer, mpa_version,
                              try_gso, siw_tcp_nagle)
  SIWLO=1                     also siw_lo on the guest's loopback
  SHARE=DIR                   9p export to /mnt/host
  GUEST_SHELL=1               a shell after the job
  TIMEOUT=600                 seconds the VM may live in all
  MEM=1024 SMP=2              guest memory (MiB) and vCPUs
  ACCEL=kvm|tcg               default kvm where /dev/kvm runs stock kernels
  GUEST_PVH=0                 boot the bzImage, not the extracted vmlinux
  NETNS=siwvm BRIDGE=siwbr0 HOST_IP=10.77.0.1
  VM=0                        guest index: tap siwtapN, 10.77.0.(2+N),
                              MAC 52:54:00:77:00:(02+N) (TAP, GUEST_IP, MAC
                              override each)
EOF
}

WORK="${WORK:-/var/tmp/iwarp-guest}"
NETNS="${NETNS:-siwvm}"
VM="${VM:-0}"
BRIDGE="${BRIDGE:-siwbr0}"
TAP="${TAP:-siwtap$VM}"
HOST_IP="${HOST_IP:-10.77.0.1}"
GUEST_IP="${GUEST_IP:-10.77.0.$((2 + VM))}"
MAC="${MAC:-52:54:00:77:00:$(printf %02x $((2 + VM)))}"
MEM="${MEM:-1024}"
SMP="${SMP:-2}"
TIMEOUT="${TIMEOUT:-600}"

die() {
    echo "[guest-run] FAILED: $*" >&2
    exit 1
}

netns_up() {
    ip netns list | grep -qw "$NETNS" || ip netns add "$NETNS" || die "cannot create network namespace $NETNS (root needed)"
    ip -n "$NETNS" link set lo up
    if ! ip -n "$NETNS" link show "$BRIDGE" >/dev/null 2>&1; then
        ip -n "$NETNS" link add "$BRIDGE" type bridge
        ip -n "$NETNS" addr add "$HOST_IP/24" dev "$BRIDGE"
    fi
    ip -n "$NETNS" link set "$BRIDGE" up
    if ! ip -n "$NETNS" link show "$TAP" >/dev/null 2>&1; then
        ip netns exec "$NETNS" ip tuntap add "$TAP" mode tap || die "cannot create tap $TAP (is /dev/net/tun there?)"
        ip -n "$NETNS" link set "$TAP" master "$BRIDGE"
    fi
    ip -n "$NETNS" link set "$TAP" up
}

netns_down() {
    if ip netns list | grep -qw "$NETNS"; then ip netns del "$NETNS"; fi
}

case "${1:-boot}" in
-h | --help)
    usage
    exit 0
    ;;
up)
    netns_up
    ip -n "$NETNS" -br addr
    exit 0
    ;;
down)
    netns_down
    exit 0
    ;;
hostns)
    shift
    exec ip netns exec "$NETNS" "$@"
    ;;
boot) [[ $# -eq 0 ]] || shift ;;
esac
JOB="${1:-}"

[[ -s "$WORK/out/vmlinuz" && -s "$WORK/out/initramfs.cpio.gz" ]] ||
    die "no guest in $WORK/out: build it with scripts/guest/build.sh (same WORK)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: scripts/guest/build.sh installs it (qemu-system-x86)"

if [[ -z "${ACCEL:-}" ]]; then
    # A /dev/kvm from kvm_pvm (pagetable-based VMs in some cloud sandboxes)
    # runs only PVM-aware guest kernels: a stock Debian kernel hangs there.
    if [[ -r /dev/kvm && -w /dev/kvm && ! -d /sys/module/kvm_pvm ]]; then ACCEL=kvm; else ACCEL=tcg; fi
fi
if [[ "$ACCEL" == kvm ]]; then
    ACCEL_ARGS=(-accel kvm -cpu host)
else
    ACCEL_ARGS=(-accel "tcg,thread=multi" -cpu max)
fi

# The kernel: the ELF vmlinux inside the bzImage when it has a PVH entry,
# so QEMU enters it directly instead of running the bzImage's real-mode
# decompressor in emulated code (under TCG: 42 s of a 75 s boot; 21 s in
# all with PVH; see extract-vmlinux.py). Extracted once per build of the
# guest into $WORK/out/vmlinux (out/vmlinux.none: the kernel cannot).
# GUEST_PVH=0 boots the bzImage.
KERNEL="$WORK/out/vmlinuz"
if [[ "${GUEST_PVH:-1}" == 1 ]]; then
    if [[ ! -s "$WORK/out/vmlinux" && ! -e "$WORK/out/vmlinux.none" ]]; then
        (
            flock 9
            [[ -s "$WORK/out/vmlinux" || -e "$WORK/out/vmlinux.none" ]] && exit 0
            xrc=0
            python3 "$(dirname "${BASH_SOURCE[0]}")/extract-vmlinux.py" "$WORK/out/vmlinuz" "$WORK/out/vmlinux" || xrc=$?
            if ((xrc == 3)); then : >"$WORK/out/vmlinux.none"; fi
        ) 9>"$WORK/.vmlinux.lock" || true
    fi
    if [[ -s "$WORK/out/vmlinux" ]]; then
        KERNEL="$WORK/out/vmlinux"
    else
        echo "[guest-run] booting the bzImage (no PVH kernel: see the line above, or $WORK/out/vmlinux.none)" >&2
    fi
fi

INITRD="$WORK/out/initramfs.cpio.gz"
TMP="$(mktemp -d /tmp/guest-run.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
if [[ -n "$JOB" ]]; then
    [[ -f "$JOB" ]] || die "no job script $JOB"
    # The kernel unpacks concatenated cpio archives in order: the job is a
    # second one on top of the image.
    mkdir -p "$TMP/root/etc/guest"
    install -m755 "$JOB" "$TMP/root/etc/guest/job.sh"
    (cd "$TMP/root" && find . | cpio -o -H newc --quiet | gzip -1) >"$TMP/job.cpio.gz"
    cat "$INITRD" "$TMP/job.cpio.gz" >"$TMP/initrd"
    INITRD="$TMP/initrd"
fi

APPEND="console=ttyS0 quiet loglevel=4 panic=-1 no_timer_check guest_ip=$GUEST_IP/24 guest_siwlo=${SIWLO:-0} guest_shell=${GUEST_SHELL:-0}"
[[ -z "${SIWOPTS:-}" ]] || APPEND+=" guest_siw=$SIWOPTS"
SHARE_ARGS=()
if [[ -n "${SHARE:-}" ]]; then
    [[ -d "$SHARE" ]] || die "SHARE=$SHARE is not a directory"
    APPEND+=" guest_9p=1"
    SHARE_ARGS=(-virtfs "local,path=$SHARE,mount_tag=hostshare,security_model=none,id=share0")
fi

netns_up
echo "[guest-run] accel=$ACCEL kernel=$(cat "$WORK/out/.kver" 2>/dev/null || echo '?') ($(basename "$KERNEL")) netns=$NETNS guest=$GUEST_IP job=${JOB:-${SHARE:+$SHARE/guest.sh}}" >&2
rc=0
# --foreground: timeout stays in the caller's process group (without it,
# it makes a group of its own), so a caller that stops this script's
# group on its own time limit (scripts/stress.sh -t, a test step's
# timeout) stops QEMU with it instead of leaving the guest running on
# (seen in session 9). timeout's own bound still stops QEMU.
ip netns exec "$NETNS" timeout --foreground "$TIMEOUT" qemu-system-x86_64 \
    -machine q35 "${ACCEL_ARGS[@]}" -smp "$SMP" -m "$MEM" \
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" \
    -display none -serial mon:stdio -no-reboot \
    -netdev "tap,id=net0,ifname=$TAP,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=net0,mac=$MAC" \
    "${SHARE_ARGS[@]}" || rc=$?
((rc != 124)) || echo "[guest-run] the guest ran out of its TIMEOUT=${TIMEOUT}s and was stopped" >&2
exit "$rc"
