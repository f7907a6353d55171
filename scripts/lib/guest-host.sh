# shellcheck shell=bash
# Host-side helpers of the scripts that test against the QEMU guest of
# ../shared/tools/siw-vm (test-siw, test-rstream-siw, test-riostream-siw,
# test-perftest-compat, test-rdmacore, -apps, -apache). Sourced after the
# caller has defined `note`, `skip` (prints "SKIPPED: ..." and exits 77),
# SIW_VM, WORK (siw-vm's artefacts) and LOGS.

# guest_can_run: skip where the guest cannot run here.
guest_can_run() {
    [[ -x "$SIW_VM/run.sh" ]] || skip "no siw guest tooling at $SIW_VM (the shared/ folder beside the repository)"
    ((EUID == 0)) || skip "needs root for the guest's network namespace and tap device"
    [[ -c /dev/net/tun ]] || skip "no /dev/net/tun: QEMU cannot attach the guest's tap device here"
}

# guest_built: build siw-vm's guest unless an earlier step did (kernel,
# siw.ko, the initramfs with rdma-core's tools), then make sure QEMU is
# there. A failed build fails the caller with the end of its log.
guest_built() {
    if [[ ! -s "$WORK/out/initramfs.cpio.gz" || ! -s "$WORK/out/vmlinuz" ]]; then
        note "building the siw guest (Debian kernel, siw.ko, rdma-core's tools, initramfs; about a minute)"
        if ! "$SIW_VM/build.sh" >"$LOGS/build.log" 2>&1; then
            tail -20 "$LOGS/build.log"
            note "FAILED: building the siw guest failed (log: $LOGS/build.log)"
            exit 1
        fi
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
