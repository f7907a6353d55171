#!/usr/bin/env bash
# Interop with REAL rsockets' riomap/riowrite: rdma-core's `riostream`
# (librdmacm's rsockets over the Linux kernel's soft-iWARP, siw) in a QEMU
# guest (scripts/guest) against our `iwarp-riostream`
# (iwarp-sockets' riomap/riowrite) on the host side of the guest's private
# network, both directions, every byte of every iteration's last transfer
# verified (-T v).
#
#   scripts/test-riostream-siw.sh              about a minute under TCG
#   RIOSTREAM_SIW_SCENARIOS="bw" scripts/test-riostream-siw.sh
#
# What crosses the wire: both ends advertise an iomap table of one entry
# (RDMA_IOMAPSIZE) in their rs_conn_data, each riomaps its buffer at offset
# 0 (an RDMA Write of its rs_iomap entry into the peer's table, then
# RS_OP_IOMAP_SGL), they exchange 16 stream bytes, then each riowrites the
# whole buffer into the other's mapping -C times per iteration (plain RDMA
# Writes, no message), the last byte (the poll byte) announcing the last
# write of an iteration.
#
# Scenarios (the same riostream arguments on both ends; each runs twice:
# "s" = riostream -b GUEST in the guest, iwarp-riostream -s GUEST on the
# host; "c" = iwarp-riostream -b HOST on the host, riostream -s HOST in the
# guest):
#   bw      -T v -T b -S 65536 -C 20 -I 5      64 KiB writes, blocking
#   nb      -T v -S 4096 -C 10 -I 20           riostream's default non-blocking loop
#   big     -T v -T b -S 1048576 -C 4 -I 3     1 MiB writes (rsocket splits them by its
#                                              send buffer; ours go as one Write each)
#
# A scenario passes when both ends exit 0 and print their table row.
# Skips (exit 77, "SKIPPED: reason") where the guest cannot run: FAST=1,
# no apt-get to build the guest, not root (network namespace, tap), no
# /dev/net/tun. A failed guest build is a failure. If the guest image has
# no riostream, the host's (rdmacm-utils) and its libraries go over 9p.
#
# Environment: RIOSTREAM_SIW_SCENARIOS (default "bw nb big"), SIW_VM
# (default scripts/guest), SIW_WORK (guest artifacts, default
# /var/tmp/iwarp-guest), SIW_LOG_DIR (logs, default a temporary directory, kept
# on failure), RIOSTREAM_SIW_NETNS (default siwrio: a namespace of its own,
# so the other siw scripts can run beside it), RIOSTREAM_VIA_SHARE=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIW_VM="${GUEST_DIR:-$ROOT/scripts/guest}"
export WORK="${SIW_WORK:-/var/tmp/iwarp-guest}"
export NETNS="${RIOSTREAM_SIW_NETNS:-siwrio}"
export BRIDGE="${NETNS}br0"
export TAP="${NETNS}tap0"
LOGS="${SIW_LOG_DIR:-$(mktemp -d /tmp/test-riostream-siw.XXXXXX)}"
mkdir -p "$LOGS"
BIN="$ROOT/target/release/iwarp-riostream"
GUEST=10.77.0.2
HOST=10.77.0.1
PORT=7471
SCENARIOS="${RIOSTREAM_SIW_SCENARIOS:-bw nb big}"

note() { printf '[test-riostream-siw] %s\n' "$*"; }
skip() {
    note "SKIPPED: $*"
    exit 77
}

args_of() {
    case "$1" in
    bw) echo "-T v -T b -S 65536 -C 20 -I 5" ;;
    nb) echo "-T v -S 4096 -C 10 -I 20" ;;
    big) echo "-T v -T b -S 1048576 -C 4 -I 3" ;;
    *) return 1 ;;
    esac
}

# Seconds one run of a scenario may take (riostream itself, under TCG).
LIM=90

for sc in $SCENARIOS; do
    args_of "$sc" >/dev/null || {
        note "unknown scenario $sc (known: bw nb big)"
        exit 2
    }
done

[[ "${FAST:-0}" != 1 ]] || skip "FAST=1 (the siw guest runs under TCG)"
# shellcheck source=scripts/lib/guest-host.sh
. "$ROOT/scripts/lib/guest-host.sh"
guest_can_run

if [[ ! -x "$BIN" ]]; then
    note "building iwarp-riostream"
    (cd "$ROOT" && cargo build --release -q -p iwarp-rstream)
fi

guest_built

# Does the guest image hold riostream? If not, hand the host's over 9p.
RIO=riostream
SHARE_DIR=""
gzip -dc "$WORK/out/initramfs.cpio.gz" | cpio -it --quiet >"$LOGS/initramfs.list" 2>/dev/null || true
if [[ "${RIOSTREAM_VIA_SHARE:-0}" == 1 ]] || ! grep -qxE '(\./)?usr/bin/riostream' "$LOGS/initramfs.list"; then
    if ! command -v riostream >/dev/null; then
        note "neither the guest image nor this host has riostream; installing rdmacm-utils"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends rdmacm-utils >/dev/null
    fi
    SHARE_DIR="$LOGS/share"
    mkdir -p "$SHARE_DIR/bin" "$SHARE_DIR/lib"
    cp -L "$(command -v riostream)" "$SHARE_DIR/bin/riostream"
    ldd "$(command -v riostream)" | grep -oE '/[^ ]+\.so[^ ]*' | while read -r l; do
        cp -L "$l" "$SHARE_DIR/lib/"
    done
    RIO="env LD_LIBRARY_PATH=/mnt/host/lib /mnt/host/bin/riostream"
    note "the guest image has no riostream: passing the host's (and its libraries) over 9p"
fi
SERVER_PID=""
DUMP_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; fi
    if [[ -n "$DUMP_PID" ]]; then kill "$DUMP_PID" 2>/dev/null || true; fi
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT

# The guest's job: per scenario, riostream as the server (announced with
# READY, reported with RESULT and its output), then riostream as the client
# of our server (retried while our server is not listening yet).
{
    echo '#!/bin/sh'
    cat "$ROOT/scripts/lib/guest-listening.sh"
    for sc in $SCENARIOS; do
        a="$(args_of "$sc")"
        lim="$LIM"
        cat <<EOF
timeout $lim $RIO -b $GUEST -p $PORT $a > /tmp/s.log 2>&1 &
pid=\$!
listening $PORT || true
echo "RSX READY $sc-s"
wait \$pid; rc=\$?
sed 's/^/RSX OUT $sc-s /' /tmp/s.log
echo "RSX RESULT $sc-s rc=\$rc"
EOF
        cat <<EOF
sleep 2
n=0
while :; do
  timeout $lim $RIO -s $HOST -p $PORT $a > /tmp/c.log 2>&1; rc=\$?
  if [ \$rc -ne 0 ] && grep -q rconnect /tmp/c.log && [ \$n -lt 15 ]; then n=\$((n+1)); sleep 1; continue; fi
  break
done
sed 's/^/RSX OUT $sc-c /' /tmp/c.log
echo "RSX RESULT $sc-c rc=\$rc"
EOF
    done
    echo 'echo "RSX ALLDONE"'
} >"$LOGS/job.sh"
chmod +x "$LOGS/job.sh"

# The guest's whole lifetime: boot, then every scenario at its limit.
VM_TIMEOUT=60
for sc in $SCENARIOS; do VM_TIMEOUT=$((VM_TIMEOUT + 2 * LIM + 30)); done

"$SIW_VM/run.sh" up >/dev/null
if command -v tcpdump >/dev/null; then
    ip netns exec "$NETNS" timeout "$VM_TIMEOUT" tcpdump -i "$BRIDGE" -s 0 -U -w "$LOGS/riostream-siw.pcap" tcp \
        >"$LOGS/tcpdump.log" 2>&1 &
    DUMP_PID=$!
fi
note "logs in $LOGS; scenarios: $SCENARIOS"

G="$LOGS/guest.log"
: >"$G"
SHARE="$SHARE_DIR" TIMEOUT="$VM_TIMEOUT" "$SIW_VM/run.sh" "$LOGS/job.sh" >"$G" 2>&1 &
BOOT_PID=$!

PASSES=0
FAILS=0
declare -a SUMMARY=()

# The data row of a riostream table (the custom test).
ROW='custom '
rows_of() {
    { grep -aE "^$ROW" "$1" || true; } | tr -d '\r'
}
guest_rows() {
    { grep -aE "^RSX OUT $1 $ROW" "$G" || true; } | sed -E "s/^RSX OUT $1 //" | tr -d '\r'
}

verdict() {
    local tag="$1" ours_rc="$2" ours_log="$3" desc="$4" want=1 grc ours theirs
    grc="$(grep -aoE "RSX RESULT $tag rc=[0-9]+" "$G" | tail -1 | sed 's/.*rc=//')"
    ours="$(rows_of "$ours_log")"
    theirs="$(guest_rows "$tag")"
    if [[ "$ours_rc" == 0 && "$grc" == 0 && "$(grep -c . <<<"$ours")" == "$want" &&
        "$(grep -c . <<<"$theirs")" == "$want" ]]; then
        note "PASS $tag: $desc"
        PASSES=$((PASSES + 1))
        SUMMARY+=("PASS $tag $desc")
    else
        note "FAIL $tag: $desc (iwarp-riostream exit $ours_rc, riostream exit ${grc:-none})"
        tail -5 "$ours_log" | sed 's/^/    ours: /' || true
        { grep -aE "^RSX OUT $tag " "$G" || true; } | tail -5 | sed 's/^/    riostream: /'
        FAILS=$((FAILS + 1))
        SUMMARY+=("FAIL $tag $desc")
    fi
    local r
    while read -r r; do SUMMARY+=("    iwarp-riostream: $r"); done <<<"${ours:-<no row>}"
    while read -r r; do SUMMARY+=("    riostream:       $r"); done <<<"${theirs:-<no row>}"
}

for sc in $SCENARIOS; do
    R="$(args_of "$sc")"
    read -ra A <<<"$R"
    # s: riostream server in the guest, our client.
    if wait_line "$G" "RSX READY $sc-s" 300; then
        rc=0
        timeout -k 2 $((LIM + 10)) ip netns exec "$NETNS" "$BIN" -s "$GUEST" -p "$PORT" --timeout 30 "${A[@]}" \
            >"$LOGS/$sc-s.log" 2>&1 || rc=$?
        wait_line "$G" "RSX RESULT $sc-s rc=" $((LIM + 10)) || true
    else
        rc=none
        note "$sc-s: the guest never announced its server"
    fi
    verdict "$sc-s" "$rc" "$LOGS/$sc-s.log" "iwarp-riostream -s $GUEST ${A[*]} -> riostream -b $GUEST $R"

    # c: our server, riostream client in the guest.
    ip netns exec "$NETNS" timeout -k 2 $((2 * LIM + 20)) "$BIN" -b "$HOST" -p "$PORT" --timeout 120 "${A[@]}" \
        >"$LOGS/$sc-c.log" 2>&1 &
    SERVER_PID=$!
    rc=0
    if wait_line "$G" "RSX RESULT $sc-c rc=" $((2 * LIM + 20)); then
        wait "$SERVER_PID" || rc=$?
    else
        note "$sc-c: the guest's riostream client never finished"
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        rc=timeout
    fi
    SERVER_PID=""
    verdict "$sc-c" "$rc" "$LOGS/$sc-c.log" "riostream -s $HOST $R -> iwarp-riostream -b $HOST ${A[*]}"
done

if ! wait_line "$G" "RSX ALLDONE" 120; then
    note "the guest did not finish its job (log: $G)"
    FAILS=$((FAILS + 1))
fi
wait "$BOOT_PID" 2>/dev/null || true
if [[ -n "$DUMP_PID" ]]; then
    kill "$DUMP_PID" 2>/dev/null || true
    wait "$DUMP_PID" 2>/dev/null || true
    DUMP_PID=""
fi

note "results (columns: name bytes xfers iters total time Gb/sec usec/xfer):"
printf '  %s\n' "${SUMMARY[@]}"
note "$PASSES passed, $FAILS failed"
if ((FAILS > 0)); then
    note "logs and the capture kept in $LOGS"
    exit 1
fi
[[ -n "${SIW_LOG_DIR:-}" ]] || rm -rf "$LOGS"
