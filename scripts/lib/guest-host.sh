# shellcheck shell=bash
# Host-side helpers of the scripts that test against the project's QEMU
# guest, scripts/guest (test-siw, test-rstream-siw, test-riostream-siw,
# test-perftest-compat, test-rdmacore, -apps, -apache). Sourced after the
# caller has defined `note`, `skip` (prints "SKIPPED: ..." and exits 77),
# SIW_VM (the guest's tooling: scripts/guest, or GUEST_DIR), WORK (its
# artefacts) and LOGS.

# guest_ours: the tooling is scripts/guest (not a GUEST_DIR override).
guest_ours() {
    [[ "$SIW_VM" -ef "$(dirname "${BASH_SOURCE[0]}")/../guest" ]]
}

# guest_can_run: skip where the guest cannot run here.
guest_can_run() {
    [[ -x "$SIW_VM/run.sh" ]] || skip "no guest tooling at $SIW_VM (GUEST_DIR: unset it to use scripts/guest)"
    ((EUID == 0)) || skip "needs root for the guest's network namespace and tap device"
    [[ -c /dev/net/tun ]] || skip "no /dev/net/tun: QEMU cannot attach the guest's tap device here"
    if guest_ours && [[ ! -s "$WORK/out/initramfs.cpio.gz" ]] && ! command -v apt-get >/dev/null; then
        skip "no apt-get: scripts/guest/build.sh makes the guest from Debian packages (build it on Debian 12 and point SIW_WORK at it)"
    fi
}

# guest_built: build the guest, or find it cached (scripts/guest/build.sh
# rebuilds when the kernel, its own files or the copied packages changed;
# about 2 minutes from scratch, 1-2 s cached), then make sure QEMU is there.
# A GUEST_DIR override's build.sh runs only when nothing is built. A failed
# build fails the caller with the end of its log.
guest_built() {
    if guest_ours || [[ ! -s "$WORK/out/initramfs.cpio.gz" || ! -s "$WORK/out/vmlinuz" ]]; then
        guest_ours || note "building the guest with $SIW_VM/build.sh"
        if ! "$SIW_VM/build.sh" >"$LOGS/build.log" 2>&1; then
            tail -20 "$LOGS/build.log"
            note "FAILED: building the guest failed (log: $LOGS/build.log)"
            exit 1
        fi
        note "$(tail -1 "$LOGS/build.log")"
    fi
    command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed and build.sh did not install it"
}

# wait_line FILE PATTERN SECS: wait until FILE has a line matching PATTERN
# (extended regex); 1 if it did not within SECS.
wait_line() {
    local file="$1" pat="$2" secs="$3" t=0
    while ((t < secs * 10)); do
        grep -aqE "$pat" "$file" 2>/dev/null && return 0
        sleep 0.1
        t=$((t + 1))
    done
    return 1
}
