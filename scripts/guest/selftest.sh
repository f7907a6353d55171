#!/usr/bin/env bash
# A quick check of the interop guest by itself (about 20 s under TCG, after
# the build): one boot with SIWOPTS=mpa_crc_required=1,peer_to_peer=1 and its
# job over the 9p share, which checks that siw0 is ACTIVE, that the siw
# parameters took effect, rping over siw0 inside the guest (Send, Read,
# Write, data verified), rxe0 on eth0 (needs crc32_generic in the image),
# and writes its results back through the share.
#
#   scripts/guest/selftest.sh [--help]
#
# Exits 0 when every check passed, 1 otherwise, 77 where the guest cannot
# run (not root, no /dev/net/tun). Environment: WORK (as build.sh), NETNS
# (default guestself, so it runs beside the interop tests), TIMEOUT.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
note() { printf '[guest-selftest] %s\n' "$*"; }
((EUID == 0)) || {
    note "SKIPPED: needs root for the guest's network namespace and tap device"
    exit 77
}
[[ -c /dev/net/tun ]] || {
    note "SKIPPED: no /dev/net/tun"
    exit 77
}

export WORK="${WORK:-/var/tmp/iwarp-guest}"
export NETNS="${NETNS:-guestself}"
export BRIDGE="${NETNS}br0" TAP="${NETNS}tap0"
"$HERE/build.sh"

SHARE="$(mktemp -d /tmp/guest-selftest.XXXXXX)"
cleanup() {
    "$HERE/run.sh" down || true
    rm -rf "$SHARE"
}
trap cleanup EXIT
cat >"$SHARE/guest.sh" <<'JOB'
#!/bin/sh
R=/mnt/host/results
check() { if [ "$2" = 0 ]; then echo "ok $1" >>$R; else echo "FAIL $1" >>$R; fi; }
rdma link show | grep -q 'link siw0/1 state ACTIVE'; check siw0-active $?
[ "$(cat /sys/module/siw/parameters/mpa_crc_required)" = Y ]; check param-crc $?
[ "$(cat /sys/module/siw/parameters/peer_to_peer)" = Y ]; check param-p2p $?
timeout 30 rping -s -a 10.77.0.2 -p 7300 -C 3 >/tmp/s.log 2>&1 &
s=$!
sleep 1
timeout 30 rping -c -a 10.77.0.2 -p 7300 -C 3 -V -v >/tmp/c.log 2>&1; check rping-siw0 $?
wait $s; check rping-siw0-server $?
rdma link del siw0
rdma link add rxe0 type rxe netdev eth0
ibv_devices | grep -q rxe0; check rxe0 $?
echo done >>$R
JOB
t0=$SECONDS
SIWOPTS=mpa_crc_required=1,peer_to_peer=1 SHARE="$SHARE" TIMEOUT="${TIMEOUT:-180}" \
    "$HERE/run.sh" </dev/null >"$SHARE/console.log" 2>&1 || true
note "guest ran $((SECONDS - t0))s"
if ! grep -qx "done" "$SHARE/results" 2>/dev/null; then
    tail -30 "$SHARE/console.log"
    note "FAILED: the guest's job did not finish (console above)"
    exit 1
fi
sed 's/^/    /' "$SHARE/results"
if grep -q '^FAIL' "$SHARE/results"; then
    tail -30 "$SHARE/console.log"
    note "FAILED"
    exit 1
fi
note "PASS: $(grep -c '^ok' "$SHARE/results") checks"
