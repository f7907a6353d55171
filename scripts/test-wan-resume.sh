#!/usr/bin/env bash
# rftp get --retry across a link outage (issue 27 §3): rftpd in one network
# namespace, rftp in the other, joined by the wanem path emulator (20 ms
# RTT, 100 Mbit/s). Once the download has written 8 MiB, the link goes down
# for 8 s, longer than the transfer's silent-peer limit (rftp --timeout 3,
# rftpd data_timeout_secs = 3), so both ends give the session up. rftp must
# reconnect by itself (backoff 1, 2, 4 s while the link is still down),
# resume at the end of FILE.part (REST, never from byte 0), verify the
# whole file with the negotiated checksum (XXH3-128 by default) and say so
# on its output; the script compares both files' SHA-256 too. Then the same
# for an upload (rftp put --retry): the link goes down once rftpd holds
# 8 MiB of it; rftpd keeps the cut-off part (OPTS UPLOAD KEEP), rftp
# reconnects, checks the part's checksum against HASH, resumes after it
# (REST, never from byte 0), verifies the whole file and renames it into
# place. About 40-50 s in all (the put adds about 20 s).
#
# Skips (exit 0, with the reason) only when /dev/net/tun or network
# namespaces are unavailable. Builds rftp and wanem if missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

if [[ ! -c /dev/net/tun ]]; then
    echo "test-wan-resume: SKIP: /dev/net/tun is missing (the wanem path emulator needs TUN devices)"
    exit 0
fi
if ! ip netns add "wanresume-probe-$$" 2>/dev/null; then
    echo "test-wan-resume: SKIP: cannot create network namespaces (need root and netns support)"
    exit 0
fi
ip netns del "wanresume-probe-$$"

cargo build --release -q -p rftp -p wanem
BIN="$ROOT/target/release"
# shellcheck source=scripts/lib/wan.sh disable=SC1091
. "$ROOT/scripts/lib/wan.sh"

TAG="rsm$$"
WORK="$(mktemp -d)"
cleanup() {
    wan_down "$TAG"
    rm -rf "$WORK"
}
trap cleanup EXIT

SIZE_MIB=40
mkdir -p "$WORK/root" "$WORK/local"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/root/big.bin"
cat >"$WORK/rftpd.toml" <<EOF
root = "$WORK/root"
data_timeout_secs = 3
[[users]]
name = "u"
password = "p"
write = true
EOF

wan_up "$TAG" --rtt 20ms --rate 100mbit --queue bdp
ADDR_B="$(wan_addr_b)"
wan_b "$BIN/rftpd" -c "$WORK/rftpd.toml" --listen "$ADDR_B:2121" >"$WORK/rftpd.out" 2>"$WORK/rftpd.log" &
for _ in $(seq 100); do
    grep -q "listening" "$WORK/rftpd.out" 2>/dev/null && break
    sleep 0.1
done
grep -q "listening" "$WORK/rftpd.out" || { echo "test-wan-resume: FAIL: rftpd did not start"; cat "$WORK/rftpd.log"; exit 1; }

OUT="$WORK/local/big.bin"
start=$SECONDS
wan_a timeout 90 "$BIN/rftp" get "ftp://u:p@$ADDR_B:2121/big.bin" -o "$OUT" \
    --timeout 3 --retry 6 -q >"$WORK/rftp.out" 2>&1 &
rftp_pid=$!

# cut_at_8mib WHAT LOG COUNTER: the outage starts once COUNTER (a function
# printing the bytes the receiving side holds) reaches 8 MiB: a real
# signal, not a guess at how long the login takes, bounded by 30 s and by
# rftp ($rftp_pid) still running. Then the link goes down for 8 s; CUT_AT
# is the count at the cut.
cut_at_8mib() {
    local what="$1" log="$2" counter="$3" deadline=$((SECONDS + 30))
    until (($("$counter") >= 8 << 20)); do
        if ((SECONDS >= deadline)) || ! kill -0 "$rftp_pid" 2>/dev/null; then
            echo "test-wan-resume: FAIL: the $what never reached 8 MiB"
            cat "$log"
            exit 1
        fi
        sleep 0.05
    done
    CUT_AT=$("$counter")
    wan_ctl down 8 >/dev/null
    echo "test-wan-resume: link down for 8 s at $((CUT_AT >> 20)) MiB of the $SIZE_MIB MiB $what"
}
part_bytes() { # bytes of the download's part file so far
    if [[ -f "$OUT.part" ]]; then stat -c %s "$OUT.part"; else echo 0; fi
}
cut_at_8mib download "$WORK/rftp.out" part_bytes
kept_at_cut=$CUT_AT

rc=0
wait "$rftp_pid" || rc=$?
took=$((SECONDS - start))
cat "$WORK/rftp.out"
fail() {
    echo "test-wan-resume: FAIL: $*"
    echo "--- rftpd log (tail)"; tail -20 "$WORK/rftpd.log"
    exit 1
}
((rc == 0)) || fail "rftp exited $rc"
[[ "$(sha256sum <"$OUT" | cut -d' ' -f1)" == "$(sha256sum <"$WORK/root/big.bin" | cut -d' ' -f1)" ]] ||
    fail "the downloaded file differs from the server's"
grep -q "transfer interrupted" "$WORK/rftp.out" || fail "rftp did not say the transfer was interrupted"
grep -Eq "(XXH3-128|BLAKE3|SHA-256|CRC32C) verified" "$WORK/rftp.out" || fail "rftp did not verify the checksum"
resumed=$(sed -n 's/.*resumed at byte \([0-9]*\).*/\1/p' "$WORK/rftp.out" | tail -1)
[[ -n "$resumed" ]] || fail "no resume offset in rftp's summary (started over?)"
((resumed >= kept_at_cut)) || fail "resumed at byte $resumed, before the $kept_at_cut bytes kept when the link went down"
echo "test-wan-resume: get OK in ${took} s: resumed at byte $resumed (>= $kept_at_cut kept at the cut), rftp's checksum verified, and the file's SHA-256 equals the server's"

# The upload: rftp puts to up.bin.part, which rftpd writes through a
# temporary file (.up.bin.part.rftp-part-XXXXXXXX) in its root (a put
# without --retry: .up.bin.rftp-part-XXXXXXXX).
UP="$WORK/local/up.bin"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$UP"
start=$SECONDS
wan_a timeout 90 "$BIN/rftp" put "$UP" "ftp://u:p@$ADDR_B:2121/up.bin" \
    --timeout 3 --retry 6 -q >"$WORK/put.out" 2>&1 &
rftp_pid=$!
held() { # bytes rftpd holds of the upload so far
    local f n=0
    for f in "$WORK"/root/.up.bin*.rftp-part-*; do
        [[ -f "$f" ]] && n=$(stat -c %s "$f")
    done
    echo "$n"
}
cut_at_8mib upload "$WORK/put.out" held
held_at_cut=$CUT_AT
rc=0
wait "$rftp_pid" || rc=$?
took=$((SECONDS - start))
cat "$WORK/put.out"
((rc == 0)) || fail "rftp put exited $rc"
[[ -f "$WORK/root/up.bin" ]] || fail "the upload is not on the server under its name"
[[ "$(sha256sum <"$WORK/root/up.bin" | cut -d' ' -f1)" == "$(sha256sum <"$UP" | cut -d' ' -f1)" ]] ||
    fail "the uploaded file differs from the local one"
[[ ! -e "$WORK/root/up.bin.part" ]] || fail "the upload's .part was left on the server"
grep -q "transfer interrupted" "$WORK/put.out" || fail "rftp put did not say the transfer was interrupted"
grep -Eq "(XXH3-128|BLAKE3|SHA-256|CRC32C) verified" "$WORK/put.out" || fail "rftp put did not verify the checksum"
resumed=$(sed -n 's/.*resumed at byte \([0-9]*\).*/\1/p' "$WORK/put.out" | tail -1)
if [[ -z "$resumed" ]] || ((resumed == 0)); then
    fail "the upload did not resume (sent again from byte 0?)"
fi
echo "test-wan-resume: put OK in ${took} s: resumed at byte $resumed (rftpd held $held_at_cut at the cut), rftp's checksum verified, and the server's file's SHA-256 equals the local one"
