#!/usr/bin/env bash
# iwarp-perf --perftest against perftest (`ib_write_bw -R`, `ib_read_bw -R`,
# `ib_read_lat -R`), in the QEMU guest of ../shared/tools/siw-vm, on Linux
# siw (siw0) through rdma-core, in both roles:
#
#   <test>-ptsrv   perftest server  <- iwarp-perf --perftest client (siw0)
#   <test>-ptcli   iwarp-perf --perftest --server (siw0) <- perftest client
#   mixA           iwarp-perf client on `soft` (our TCP stack, host side of
#                  the guest's network) -> ib_write_bw -R server on siw0
#   mixB           ib_write_bw -R client on siw0 -> iwarp-perf --perftest
#                  --server on `soft` on the host side
#
# A scenario passes when both ends exit 0 and both report a nonzero
# bandwidth (the perftest server prints the client's report, so it shows
# what iwarp-perf measured; for read_lat the client's median latency).
# Short runs (200 iterations); the whole script takes about a minute and a
# half under TCG, boot included.
#
# Environment: NETNS/TAP/BRIDGE (the guest's network names, as run.sh),
# SIW_WORK (siw-vm's artefacts, default /var/tmp/siw-vm), PTCOMPAT_LOG_DIR
# (keep the logs there). Exits 77 ("SKIPPED: ...") where the guest cannot
# run: no siw-vm tooling, not root, no /dev/net/tun.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIW_VM="${SIW_VM:-$ROOT/../shared/tools/siw-vm}"
export WORK="${SIW_WORK:-/var/tmp/siw-vm}"
export NETNS="${NETNS:-siwvm}"
LOGS="${PTCOMPAT_LOG_DIR:-$(mktemp -d /tmp/test-perftest-compat.XXXXXX)}"
mkdir -p "$LOGS"
BIN="$ROOT/target/release/iwarp-perf"
GUEST=10.77.0.2
HOST=10.77.0.1
N=200

note() { printf '[test-perftest-compat] %s\n' "$*"; }
skip() {
    note "SKIPPED: $*"
    [[ -n "${PTCOMPAT_LOG_DIR:-}" ]] || rm -rf "$LOGS"
    exit 77
}

[[ -x "$SIW_VM/run.sh" ]] || skip "no siw guest tooling at $SIW_VM (the shared/ folder beside the repository)"
((EUID == 0)) || skip "needs root for the guest's network namespace and tap device"
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun: QEMU cannot attach the guest's tap device here"

note "building iwarp-perf"
cargo build --release -q -p iwarp-perf

if [[ ! -s "$WORK/out/initramfs.cpio.gz" || ! -s "$WORK/out/vmlinuz" ]]; then
    note "building the siw guest (Debian kernel, siw.ko, perftest, initramfs; about a minute)"
    if ! "$SIW_VM/build.sh" >"$LOGS/build.log" 2>&1; then
        tail -20 "$LOGS/build.log"
        note "FAILED: building the siw guest failed (log: $LOGS/build.log)"
        exit 1
    fi
fi
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed and build.sh did not install it"

SHARE_DIR="$(mktemp -d /tmp/test-perftest-compat-share.XXXXXX)"
HOST_SERVER=""
cleanup() {
    if [[ -n "$HOST_SERVER" ]]; then kill "$HOST_SERVER" 2>/dev/null || true; fi
    rm -rf "$SHARE_DIR"
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
install -m755 "$BIN" "$SHARE_DIR/iwarp-perf"

wait_line() {
    local file="$1" pat="$2" secs="$3" t=0
    while ((t < secs * 10)); do
        grep -aqE "$pat" "$file" 2>/dev/null && return 0
        sleep 0.1
        t=$((t + 1))
    done
    return 1
}

# The guest job. bw_of FILE: the BW average of perftest's result line (the
# line after the "#bytes" header), or of iwarp-perf's --json.
cat >"$SHARE_DIR/guest.sh" <<GUEST_JOB
P=/mnt/host/iwarp-perf
show() { sed "s/^/PTCOMPAT \$1: /" "\$2"; }
bw_of() {
  v=\$(grep -o '"bw_mib_s":[0-9.]*' "\$1" | cut -d: -f2)
  [ -n "\$v" ] || v=\$(grep -o '"lat_median_us":[0-9.]*' "\$1" | cut -d: -f2)
  [ -n "\$v" ] || v=\$(awk '/#bytes/ {lat = (\$0 ~ /usec/); getline; if (\$1 ~ /^[0-9]+\$/) print (lat ? \$5 : \$4)}' "\$1" | head -1)
  echo "\${v:-0}"
}
nonzero() { awk -v v="\$1" 'BEGIN { exit !(v + 0 > 0) }'; }
ready() {
  i=0; while [ \$i -lt 300 ] && ! grep -q "\$2" "\$1" 2>/dev/null; do sleep 0.1; i=\$((i+1)); done
}
result() {
  tag=\$1; crc=\$2; src=\$3; cbw=\$4; sbw=\$5
  rc=\$((crc + src))
  nonzero "\$cbw" || rc=\$((rc + 100))
  [ "\$sbw" = - ] || nonzero "\$sbw" || rc=\$((rc + 200))
  echo "PTCOMPAT RESULT \$tag rc=\$rc client=\$crc server=\$src client_value=\$cbw server_value=\$sbw"
}
port=18700
for t in write_bw read_bw read_lat; do
  pt=ib_\$t
  port=\$((port + 1))
  timeout 60 \$pt -R -d siw0 -p \$port -n $N > /tmp/s.log 2>&1 &
  spid=\$!
  sleep 1
  timeout 60 \$P --perftest \$t $GUEST -p \$port -d siw0 -n $N --timeout 15 --json > /tmp/c.log 2>&1; crc=\$?
  wait \$spid; src=\$?
  show \$t-ptsrv /tmp/c.log; show \$t-ptsrv /tmp/s.log
  sbw=-
  [ \$t = read_lat ] || sbw=\$(bw_of /tmp/s.log)
  result \$t-ptsrv \$crc \$src "\$(bw_of /tmp/c.log)" "\$sbw"
  port=\$((port + 1))
  timeout 60 \$P --perftest --server \$t -p \$port -d siw0 --idle-timeout 40 --timeout 15 --json > /tmp/s.log 2>&1 &
  spid=\$!
  ready /tmp/s.log listening
  timeout 60 \$pt -R -d siw0 -p \$port -n $N $GUEST > /tmp/c.log 2>&1; crc=\$?
  wait \$spid; src=\$?
  show \$t-ptcli /tmp/s.log; show \$t-ptcli /tmp/c.log
  sbw=-
  [ \$t = read_lat ] || sbw=\$(bw_of /tmp/s.log)
  result \$t-ptcli \$crc \$src "\$(bw_of /tmp/c.log)" "\$sbw"
done
# iwarp-perf's own protocol is refused on a kernel device, with the reason
# and the fix (--perftest).
timeout 30 \$P write_bw $GUEST -d siw0 -p 18760 -n 1 > /tmp/c.log 2>&1; crc=\$?
show native /tmp/c.log
nrc=0
[ \$crc = 1 ] || nrc=1
grep -q -- '--perftest' /tmp/c.log || nrc=\$((nrc + 2))
echo "PTCOMPAT RESULT native rc=\$nrc client=\$crc server=- client_value=refused server_value=-"
timeout 90 ib_write_bw -R -d siw0 -p 18750 -n $N > /tmp/ma.log 2>&1 &
mpid=\$!
sleep 1
echo "PTCOMPAT READY mixA"
wait \$mpid; src=\$?
show mixA /tmp/ma.log
echo "PTCOMPAT SERVER mixA rc=\$src value=\$(bw_of /tmp/ma.log)"
timeout 60 ib_write_bw -R -d siw0 -p 18751 -n $N $HOST > /tmp/mb.log 2>&1; crc=\$?
show mixB /tmp/mb.log
echo "PTCOMPAT CLIENT mixB rc=\$crc value=\$(bw_of /tmp/mb.log)"
echo "PTCOMPAT ALLDONE"
GUEST_JOB
chmod +x "$SHARE_DIR/guest.sh"

"$SIW_VM/run.sh" up >/dev/null
ip netns exec "$NETNS" timeout 300 "$BIN" --perftest --server write_bw -d soft --bind "$HOST" -p 18751 \
    --idle-timeout 280 --timeout 15 --json >"$LOGS/mixB-host.log" 2>&1 &
HOST_SERVER=$!

GLOG="$LOGS/guest.log"
note "booting the guest (logs in $LOGS)"
: >"$GLOG"
SHARE="$SHARE_DIR" TIMEOUT=300 "$SIW_VM/run.sh" </dev/null >"$GLOG" 2>&1 &
BOOT=$!
MIXA_RC=1
if wait_line "$GLOG" "PTCOMPAT READY mixA" 240; then
    MIXA_RC=0
    ip netns exec "$NETNS" timeout 60 "$BIN" --perftest write_bw "$GUEST" -p 18750 -d soft -n "$N" \
        --timeout 15 --json >"$LOGS/mixA-host.log" 2>&1 || MIXA_RC=$?
else
    note "the guest never announced mixA"
fi
rc=0
wait "$BOOT" || rc=$?
MIXB_RC=0
wait "$HOST_SERVER" || MIXB_RC=$?
HOST_SERVER=""

FAILS=0
PASSES=0
CLEAN="$LOGS/guest.clean.log"
tr -d '\r' <"$GLOG" >"$CLEAN"
nonzero() { awk -v v="$1" 'BEGIN { exit !(v + 0 > 0) }'; }
pass() {
    note "PASS $1: $2"
    PASSES=$((PASSES + 1))
}
fail() {
    note "FAIL $1: $2"
    FAILS=$((FAILS + 1))
}
check() {
    local tag="$1" desc="$2" line
    grep -a "^PTCOMPAT $tag: " "$CLEAN" | sed "s/^PTCOMPAT $tag: /    /" | grep -aE 'bw_mib|lat_med|error|Error|failed|^ *[0-9]+ ' || true
    line="$(grep -a "^PTCOMPAT RESULT $tag " "$CLEAN" || true)"
    if [[ "$line" == *" rc=0 "* ]]; then
        pass "$tag" "$desc (${line#*client_value=})"
    else
        fail "$tag" "$desc: ${line:-no guest result (guest exit $rc)}"
    fi
}
check write_bw-ptsrv "ib_write_bw -R server <- iwarp-perf --perftest client, siw0"
check write_bw-ptcli "iwarp-perf --perftest --server <- ib_write_bw -R client, siw0"
check read_bw-ptsrv "ib_read_bw -R server <- iwarp-perf --perftest client, siw0"
check read_bw-ptcli "iwarp-perf --perftest --server <- ib_read_bw -R client, siw0"
check read_lat-ptsrv "ib_read_lat -R server <- iwarp-perf --perftest client, siw0"
check read_lat-ptcli "iwarp-perf --perftest --server <- ib_read_lat -R client, siw0"
check native "iwarp-perf's own protocol on siw0 is refused, naming --perftest"

# mixA: our client on soft (host) -> perftest server on siw0 (guest).
sed 's/^/    host: /' "$LOGS/mixA-host.log" 2>/dev/null || true
line="$(grep -a "^PTCOMPAT SERVER mixA " "$CLEAN" || true)"
hbw="$(grep -o '"bw_mib_s":[0-9.]*' "$LOGS/mixA-host.log" 2>/dev/null | cut -d: -f2 || true)"
if ((MIXA_RC == 0)) && [[ "$line" == *" rc=0 "* ]] && nonzero "${hbw:-0}" && nonzero "${line##*value=}"; then
    pass mixA "iwarp-perf --perftest client on soft (host) -> ib_write_bw -R server on siw0 (guest) ($hbw MB/s; perftest server printed ${line##*value=})"
else
    fail mixA "host client exit $MIXA_RC, value ${hbw:-none}; guest: ${line:-no result}"
fi
# mixB: perftest client on siw0 (guest) -> our server on soft (host).
sed 's/^/    host: /' "$LOGS/mixB-host.log" 2>/dev/null || true
line="$(grep -a "^PTCOMPAT CLIENT mixB " "$CLEAN" || true)"
hbw="$(grep -o '"bw_mib_s":[0-9.]*' "$LOGS/mixB-host.log" 2>/dev/null | cut -d: -f2 || true)"
if ((MIXB_RC == 0)) && [[ "$line" == *" rc=0 "* ]] && nonzero "${hbw:-0}" && nonzero "${line##*value=}"; then
    pass mixB "ib_write_bw -R client on siw0 (guest) -> iwarp-perf --perftest --server on soft (host) (${line##*value=} MB/s)"
else
    fail mixB "host server exit $MIXB_RC, value ${hbw:-none}; guest: ${line:-no result}"
fi
if ! grep -aq "PTCOMPAT ALLDONE" "$CLEAN"; then
    note "the guest did not finish its job (log: $GLOG)"
    FAILS=$((FAILS + 1))
fi

note "$PASSES passed, $FAILS failed"
if ((FAILS > 0)); then
    note "logs kept in $LOGS"
    exit 1
fi
[[ -n "${PTCOMPAT_LOG_DIR:-}" ]] || rm -rf "$LOGS"
