#!/usr/bin/env bash
# MPA markers on a small-MTU path (issue 27 §4, last bullet): iwarp-ping
# with CRC and markers on, client in namespace a, server in b, through
# wanem with --mtu 1280 and 10 ms RTT; a capture taken on the client's TUN
# device inside the emulated path is checked by the project's wire check
# (scripts/tshark-check.sh --check: every TCP payload byte in a decoded MPA
# frame, every FPDU with a DDP and an RDMAP header, every CRC good, no
# malformed packets or unexpected expert warnings), and markers must be
# decoded.
#
#   scripts/test-wanem-mpa.sh        # about 10 s; needs root and tshark
#   KEEP=1 scripts/test-wanem-mpa.sh # keep the capture (path printed)
#   MARKERS=off scripts/test-wanem-mpa.sh  # the same without markers (the control)
#
# A step of scripts/test.sh; see docs/WAN.md ("MPA markers at MTU 1280").
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=scripts/lib/wan.sh
. "$ROOT/scripts/lib/wan.sh"

((EUID == 0)) || { echo "test-wanem-mpa: needs root" >&2; exit 77; }
command -v tshark >/dev/null || { echo "test-wanem-mpa: needs tshark (scripts/test.sh installs it)" >&2; exit 77; }
PING="${IWARP_PING:-$ROOT/target/release/iwarp-ping}"
[[ -x "$PING" ]] || cargo build --release -q -p iwarp-tools || exit 1
[[ -x "$WANEM" ]] || cargo build --release -q -p wanem || exit 1

TAG="wm$$"
DIR="$(mktemp -d)"
cleanup() {
    wan_down "$TAG"
    if [[ "${KEEP:-0}" == 1 ]]; then echo "kept: $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wan_up "$TAG" --realtime --rtt 10ms --mtu 1280 || exit 1
wan_a tshark -q -i wan0 -f "tcp port 7174" -w "$DIR/mtu1280.pcap" >"$DIR/tshark.log" 2>&1 &
TSHARK=$!
for ((i = 0; i < 100; i++)); do
    grep -q "Capturing on" "$DIR/tshark.log" && break
    sleep 0.1
done
wan_b "$PING" -s -a "$(wan_addr_b)" --crc on --markers "${MARKERS:-on}" >"$DIR/server.log" 2>&1 &
for ((i = 0; i < 100; i++)); do
    wan_b ss -ltn 2>/dev/null | grep -q ':7174 ' && break
    sleep 0.05
done
rc=0
wan_a timeout 60 "$PING" -c -a "$(wan_addr_b)" -C 10 -S 4096 -V --crc on --markers "${MARKERS:-on}" >"$DIR/client.log" 2>&1 || rc=$?
tail -1 "$DIR/client.log"
((rc == 0)) || { echo "FAIL iwarp-ping client exited $rc"; cat "$DIR/client.log"; exit 1; }
sleep 0.5
kill "$TSHARK" 2>/dev/null
wait "$TSHARK" 2>/dev/null

fails=0
scripts/tshark-check.sh --check "$DIR/mtu1280.pcap" crc 0x00 0x01 0x02 0x03 || fails=$((fails + 1))
markers=$(tshark -n -2 -r "$DIR/mtu1280.pcap" -Y iwarp_mpa.markers 2>/dev/null | wc -l)
big=$(tshark -n -r "$DIR/mtu1280.pcap" -T fields -e frame.len 2>/dev/null | awk '$1 > 1280' | wc -l)
want_markers=1
[[ "${MARKERS:-on}" == off ]] && want_markers=0
if (((markers > 0) == want_markers && big == 0)); then
    echo "PASS markers decoded in $markers frame(s); no IP packet above 1280 bytes"
else
    echo "FAIL markers decoded in $markers frame(s), $big IP packet(s) above 1280 bytes"
    fails=$((fails + 1))
fi
echo "test-wanem-mpa: $((fails == 0 ? 1 : 0)) passed, $fails failed"
((fails == 0))
