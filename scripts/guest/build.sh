#!/usr/bin/env bash
# Build the QEMU guest the interop tests boot: a stock Debian kernel, Linux
# soft-iWARP (siw.ko, compiled here) and rxe, and rdma-core's tools (rping,
# rstream, riostream, perftest, librspreload) in a busybox initramfs.
#
# Debian builds its kernels with "# CONFIG_RDMA_SIW is not set" (bookworm's
# 6.1 and 6.12, -amd64 and -cloud alike), so siw.ko comes from the kernel's
# own source package (linux-source-X.Y, only drivers/infiniband/sw/siw is
# unpacked), compiled out of tree against linux-headers-$KVER. The rest
# (ib_core, iw_cm, rdma_cm, rdma_rxe, virtio, 9p) is Debian's own modules.
#
# The artifacts are cached under $WORK and keyed by the kernel version, the
# sha256 of this builder's files (build.sh, init.sh) and the versions of the
# host packages copied into the image; a build whose key matches returns at
# once. See scripts/guest/README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The kernel the tests were written against (bookworm's stock 6.1). If the
# archive no longer has it, the current bookworm kernel is used, with a note.
DEFAULT_KVER=6.1.0-56-amd64

usage() {
    cat <<'EOF'
Usage: scripts/guest/build.sh [--force] [--print-key] [--help]

Builds (or finds cached) the interop guest: $WORK/out/vmlinuz,
$WORK/out/initramfs.cpio.gz, $WORK/out/siw.ko, $WORK/out/.kver, and the
unpacked kernel tree $WORK/kroot-$KVER (its modules).

  --force       rebuild even if the cached artifacts match
  --print-key   print the cache key and exit (no build, no install)
  -h, --help    this text

Environment:
  WORK=DIR        artifacts (default /var/tmp/iwarp-guest)
  KVER=ABI        Debian kernel ABI (default 6.1.0-56-amd64, e.g.
                  6.12.117+deb12-amd64); the source package linux-source-X.Y
                  is derived from it
  SKIP_INSTALL=1  install nothing; fail naming the missing packages
Needs root (apt-get) only when packages are missing. Prints each step and
its time; the last line says "built" or "cached" and the total time.
EOF
}

FORCE=0
PRINT_KEY=0
while (($#)); do
    case "$1" in
    -h | --help)
        usage
        exit 0
        ;;
    -f | --force) FORCE=1 ;;
    --print-key) PRINT_KEY=1 ;;
    *)
        echo "build.sh: unknown argument '$1' (see --help)" >&2
        exit 2
        ;;
    esac
    shift
done

WORK="${WORK:-/var/tmp/iwarp-guest}"
DEBS="$WORK/debs"
T0=$SECONDS
say() { printf '[guest-build %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
# step WORD TEXT: start a step; the last line lists each step's seconds.
STEP_NAME=""
STEP_T=$SECONDS
STEP_TIMES=""
step() {
    [[ -z "$STEP_NAME" ]] || STEP_TIMES+="${STEP_TIMES:+, }$STEP_NAME $((SECONDS - STEP_T))s"
    STEP_NAME="${1:-}"
    STEP_T=$SECONDS
    (($# < 2)) || say "${*:2}"
}
die() {
    printf '[guest-build] FAILED: %s\n' "$*" >&2
    exit 1
}

APT=(apt-get -q -o DPkg::Lock::Timeout=600 -o APT::Sandbox::User=root)
APT_UPDATED=0
apt_update_once() {
    ((APT_UPDATED)) && return 0
    [[ "${SKIP_INSTALL:-0}" != 1 ]] || die "the apt index is needed (SKIP_INSTALL=1 forbids apt-get update)"
    say "apt-get update"
    "${APT[@]}" update -qq || die "apt-get update failed: check the network and /etc/apt/sources.list"
    APT_UPDATED=1
}
apt_knows() { [[ -n "$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ && $2 != "(none)" {print $2}')" ]]; }
# newest GLOB: the highest version among the files GLOB matches; 1 if none.
newest() { compgen -G "$1" | sort -V | tail -1 | grep .; }
installed_version() { dpkg-query -W -f='${db:Status-Abbrev} ${Version}' "$1" 2>/dev/null | awk '$1 == "ii" {print $2}'; }

mkdir -p "$WORK" "$DEBS"
if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    die "no dpkg/apt-get: the guest is made of Debian packages, build it on Debian 12 (or point WORK at a built guest)"
fi

# One build at a time per WORK: a second caller waits, then finds the cache.
exec 9>"$WORK/.lock"
flock -w 1800 9 || die "another build held $WORK/.lock for 30 minutes"

# ---------------------------------------------------------------- kernel ABI
if [[ -z "${KVER:-}" ]]; then
    KVER="$DEFAULT_KVER"
    if ! compgen -G "$DEBS/linux-image-${KVER}_*.deb" >/dev/null && ! apt_knows "linux-image-$KVER"; then
        apt_update_once
        if ! apt_knows "linux-image-$KVER"; then
            KVER="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {sub("linux-image-", "", $2); print $2; exit}')"
            [[ -n "$KVER" ]] || die "neither linux-image-$DEFAULT_KVER nor linux-image-amd64 is in the apt index: set KVER"
            say "note: linux-image-$DEFAULT_KVER is no longer in the archive; using the current $KVER"
        fi
    fi
fi
# 6.1.0-56-amd64 -> 6.1, 6.12.117+deb12-amd64 -> 6.12
KSERIES="$(sed -E 's/^([0-9]+\.[0-9]+).*/\1/' <<<"$KVER")"
SRCPKG="linux-source-$KSERIES"

# ---------------------------------------------------------------- packages
# Host tools the build uses, and the packages whose files go into the image.
BUILD_PKGS=(qemu-system-x86 cpio kmod xz-utils gzip make gcc binutils libc-bin "linux-headers-$KVER")
IMAGE_PKGS=(busybox-static rdmacm-utils librdmacm1 perftest ibverbs-providers ibverbs-utils libibverbs1 iproute2 tcpdump libgcc-s1 libc6)
if ((!PRINT_KEY)); then
    missing=()
    for p in "${BUILD_PKGS[@]}" "${IMAGE_PKGS[@]}"; do
        [[ -n "$(installed_version "$p")" ]] || missing+=("$p")
    done
    if ((${#missing[@]})); then
        [[ "${SKIP_INSTALL:-0}" != 1 ]] ||
            die "missing packages: ${missing[*]} (install them: apt-get install --no-install-recommends ${missing[*]}, or unset SKIP_INSTALL)"
        ((EUID == 0)) || die "missing packages: ${missing[*]}; run as root so apt-get can install them"
        apt_update_once
        step install "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >"$WORK/apt.log" 2>&1 ||
            die "apt-get install ${missing[*]} failed (log: $WORK/apt.log)"
    fi
fi

# ---------------------------------------------------------------- cache key
KEY="$({
    echo "kver $KVER"
    (cd "$HERE" && sha256sum build.sh init.sh)
    for p in "${IMAGE_PKGS[@]}"; do echo "$p $(installed_version "$p")"; done
} | sha256sum | cut -c1-16)"
if ((PRINT_KEY)); then
    echo "$KEY"
    exit 0
fi
OUT="$WORK/out"
if ((!FORCE)) && [[ "$(cat "$OUT/.key" 2>/dev/null)" == "$KEY" && -s "$OUT/vmlinuz" && -s "$OUT/initramfs.cpio.gz" && -d "$WORK/kroot-$KVER/lib/modules/$KVER" ]]; then
    say "cached: kernel $KVER, key $KEY in $OUT ($((SECONDS - T0))s)"
    exit 0
fi
say "building: kernel $KVER, key $KEY, into $WORK"

# ---------------------------------------------------------------- downloads
step fetch "fetching linux-image-$KVER and $SRCPKG (cached in $DEBS)"
cd "$DEBS"
if ! compgen -G "linux-image-${KVER}_*.deb" >/dev/null; then
    apt_knows "linux-image-$KVER" || apt_update_once
    "${APT[@]}" download "linux-image-$KVER" >/dev/null || die "apt-get download linux-image-$KVER failed: is KVER=$KVER a Debian kernel ABI?"
fi
KDEB="$DEBS/$(newest "linux-image-${KVER}_*.deb")"
KVERSION="$(dpkg-deb -f "$KDEB" Version)"
# The source of the very kernel we boot; the newest one only if that is gone.
if ! compgen -G "${SRCPKG}_${KVERSION}_*.deb" >/dev/null; then
    apt_knows "$SRCPKG" || apt_update_once
    if ! "${APT[@]}" download "$SRCPKG=$KVERSION" >/dev/null 2>&1; then
        compgen -G "${SRCPKG}_*.deb" >/dev/null || "${APT[@]}" download "$SRCPKG" >/dev/null ||
            die "apt-get download $SRCPKG failed (siw.ko is built from it)"
        say "note: $SRCPKG $KVERSION is not in the archive; building siw from $(newest "${SRCPKG}_*.deb")"
    fi
fi
SDEB="$DEBS/$(newest "${SRCPKG}_${KVERSION}_*.deb" || newest "${SRCPKG}_*.deb")"
say "kernel: ${KDEB##*/}; source: ${SDEB##*/}"
cd "$WORK"

# ---------------------------------------------------------------- kernel tree
step kernel "unpacking the kernel into $WORK/kroot-$KVER"
KROOT="$WORK/kroot-$KVER"
rm -rf "$KROOT"
mkdir -p "$KROOT"
dpkg-deb -x "$KDEB" "$KROOT"
[[ -d "$KROOT/lib/modules/$KVER" ]] || die "$KDEB has no lib/modules/$KVER: KVER and the package disagree"
# Debian >= 6.12 compresses modules; busybox's modprobe/insmod want plain .ko.
find "$KROOT/lib/modules/$KVER" -name '*.ko.xz' -exec xz -d {} +

# ---------------------------------------------------------------- siw.ko
step siw "building siw.ko from ${SDEB##*/}"
SIWSRC="$WORK/siw-src-$KVER"
rm -rf "$SIWSRC" "$WORK/src.tmp"
mkdir -p "$WORK/src.tmp"
dpkg-deb --fsys-tarfile "$SDEB" | tar -xO "./usr/src/linux-source-$KSERIES.tar.xz" | xz -dc |
    tar -x -C "$WORK/src.tmp" --wildcards "linux-source-$KSERIES/drivers/infiniband/sw/siw/*"
mv "$WORK/src.tmp/linux-source-$KSERIES/drivers/infiniband/sw/siw" "$SIWSRC"
rm -rf "$WORK/src.tmp"
# siw fixes its MPA/TCP behaviour at compile time (`const bool` globals in
# siw_main.c, declared `extern const` in siw.h). Make each a read-only module
# parameter with the same default, so a test can load
# `siw mpa_crc_required=1 peer_to_peer=1` (the guest's SIWOPTS).
for knob in try_gso mpa_crc_required mpa_crc_strict siw_tcp_nagle peer_to_peer; do
    grep -qE "^const bool $knob( = (true|false))?;" "$SIWSRC/siw_main.c" ||
        die "siw_main.c of $SRCPKG has no 'const bool $knob': update the parameter list in build.sh"
    sed -i -E "s/^const bool $knob( = (true|false))?;/bool $knob\1;\nmodule_param($knob, bool, 0444);\nMODULE_PARM_DESC($knob, \"(iwarp-rs guest) compile-time knob made a parameter\");/" "$SIWSRC/siw_main.c"
    sed -i -E "s/^extern const bool $knob;/extern bool $knob;/" "$SIWSRC/siw.h"
done
grep -qE '^u_char mpa_version = MPA_REVISION_[12];' "$SIWSRC/siw_main.c" ||
    die "siw_main.c of $SRCPKG has no 'u_char mpa_version': update build.sh"
sed -i -E 's/^(u_char mpa_version = MPA_REVISION_[12];)/\1\nmodule_param(mpa_version, byte, 0444);/' "$SIWSRC/siw_main.c"
[[ "$(grep -c '^module_param(' "$SIWSRC/siw_main.c")" -ge 6 ]] || die "siw's knobs did not all become module parameters"
make -s -C "/usr/src/linux-headers-$KVER" M="$SIWSRC" CONFIG_RDMA_SIW=m modules >"$WORK/siw-build.log" 2>&1 ||
    die "building siw.ko failed (log: $WORK/siw-build.log)"
strip --strip-debug "$SIWSRC/siw.ko"
install -D -m644 "$SIWSRC/siw.ko" "$KROOT/lib/modules/$KVER/extra/siw.ko"
depmod -b "$KROOT" "$KVER"

# ---------------------------------------------------------------- initramfs
step initramfs "assembling the initramfs"
IR="$WORK/initramfs.tmp"
rm -rf "$IR"
# Merged /usr like the Debian 12 host, so ldd's paths land in one place.
mkdir -p "$IR"/usr/{bin,sbin,lib,lib64} "$IR"/{etc,proc,sys,dev,tmp,run,root,mnt,var/tmp}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$IR/$d"; done
cp /usr/bin/busybox "$IR/usr/bin/busybox"
for applet in $("$IR/usr/bin/busybox" --list-full); do
    [[ -e "$IR/$applet" || -L "$IR/$applet" ]] || ln -s /usr/bin/busybox "$IR/$applet"
done

# put FILE [DEST]: copy FILE (symlinks resolved) to DEST in the image, with
# the shared libraries ldd lists for it.
put() {
    local src="$1" dst="${2:-$1}" lib
    [[ -e "$src" ]] || die "$src is missing on the host (its package is installed?)"
    mkdir -p "$IR$(dirname "$dst")"
    rm -f "$IR$dst"
    cp -L "$src" "$IR$dst"
    while read -r lib; do
        [[ -e "$IR$lib" ]] || put "$lib"
    done < <(ldd "$src" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*')
}
# Real tools override busybox applets of the same name (ip).
for tool in rping ucmatose udaddy rdma_server rdma_client rstream riostream rcopy \
    ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat \
    ibv_devices ibv_devinfo ibv_rc_pingpong rdma ip tcpdump; do
    path="$(command -v "$tool")" || die "$tool is not on this host (packages: ${IMAGE_PKGS[*]})"
    put "$path"
done
MA=/usr/lib/x86_64-linux-gnu
# libibverbs loads its providers by the names in /etc/libibverbs.d.
for provider in siw rxe; do
    lib="$(compgen -G "$MA/libibverbs/lib$provider-rdmav*.so" | head -1)" || die "no lib$provider provider in $MA/libibverbs (ibverbs-providers)"
    put "$lib"
    install -D -m644 "/etc/libibverbs.d/$provider.driver" "$IR/etc/libibverbs.d/$provider.driver"
done
# LD_PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so in the guest.
put "$MA/rsocket/librspreload.so.1" "$MA/rsocket/librspreload.so"
# glibc dlopen()s libgcc_s for pthread_exit/cancel: without it rping aborts
# when it exits.
put "$MA/libgcc_s.so.1"
if [[ -d /usr/share/iproute2 ]]; then
    mkdir -p "$IR/usr/share"
    cp -r /usr/share/iproute2 "$IR/usr/share/"
fi
printf 'root:x:0:0:root:/root:/bin/sh\ntcpdump:x:0:0::/:/bin/sh\n' >"$IR/etc/passwd"
printf 'root:x:0:\n' >"$IR/etc/group"
printf '127.0.0.1 localhost\n' >"$IR/etc/hosts"
cp /etc/protocols /etc/services "$IR/etc/" 2>/dev/null || true

# Modules with their dependencies, as modprobe resolves them in the kernel
# tree. crc32_generic is rxe's ICRC ("crc32" shash).
REQUIRED_MODS=(virtio_pci virtio_net crc32c_generic siw rdma_rxe rdma_ucm ib_uverbs ib_umad 9pnet_virtio 9p)
OPTIONAL_MODS=(crc32c_intel crc32_generic)
{
    for m in "${REQUIRED_MODS[@]}"; do
        modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" || die "kernel $KVER has no module $m"
    done
    for m in "${OPTIONAL_MODS[@]}"; do
        modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null || say "note: no module $m in $KVER"
    done
} | awk '$1 == "insmod" {print $2}' | sort -u | while read -r ko; do
    install -D -m644 "$ko" "$IR/usr${ko#"$KROOT"}"
done
for f in modules.order modules.builtin modules.builtin.modinfo; do
    [[ -f "$KROOT/lib/modules/$KVER/$f" ]] && cp "$KROOT/lib/modules/$KVER/$f" "$IR/usr/lib/modules/$KVER/"
done
depmod -b "$IR" "$KVER"

install -m755 "$HERE/init.sh" "$IR/init"
echo "$KVER" >"$IR/etc/guest-kver"

# ---------------------------------------------------------------- install
step write "writing $OUT"
NEW="$WORK/out.new"
rm -rf "$NEW"
mkdir -p "$NEW"
(cd "$IR" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$NEW/initramfs.cpio.gz"
cp "$KROOT/boot/vmlinuz-$KVER" "$NEW/vmlinuz"
cp "$SIWSRC/siw.ko" "$NEW/siw.ko"
echo "$KVER" >"$NEW/.kver"
echo "$KEY" >"$NEW/.key"
IRSIZE="$(du -sh "$IR" | cut -f1)"
rm -rf "$IR" "$OUT.old"
[[ ! -e "$OUT" ]] || mv "$OUT" "$OUT.old"
mv "$NEW" "$OUT"
rm -rf "$OUT.old"
step
say "built in $((SECONDS - T0))s ($STEP_TIMES): kernel $KVER, $IRSIZE unpacked, initramfs $(du -h "$OUT/initramfs.cpio.gz" | cut -f1), vmlinuz $(du -h "$OUT/vmlinuz" | cut -f1), key $KEY"
