#!/usr/bin/env bash
# iwarp-perf --perftest against perftest (`ib_write_bw -R`, `ib_read_bw -R`,
# `ib_read_lat -R`), in the QEMU guest of scripts/guest, on Linux
# siw (siw0) through rdma-core, in both roles:
#
#   <test>-ptsrv   perftest server  <- iwarp-perf --perftest client (siw0)
#   <test>-ptcli   iwarp-perf --perftest --server (siw0) <- perftest client
#   mixA           iwarp-perf client on `soft` (our TCP stack, host side of
#                  the guest's network) -> ib_write_bw -R server on siw0
#   mixB           ib_write_bw -R client on siw0 -> iwarp-perf --perftest
#                  --server on `soft` on the host side
#   native-*       iwarp-perf's own protocol, client and --server both on
#                  siw0, every test with --integrity
#   native-crc     --crc on a kernel device is refused, naming the fix
#   mixC / mixD    iwarp-perf's own protocol between soft (host) and siw0
#                  (guest), each side as the server once
#
# A scenario passes when both ends exit 0 and both report a nonzero
# bandwidth (the perftest server prints the client's report, so it shows
# what iwarp-perf measured; for read_lat the client's median latency).
# Short runs (200 iterations); the whole script takes about a minute and a
# half under TCG, boot included.
#
# Environment: NETNS/TAP/BRIDGE (the guest's network names, as run.sh),
# SIW_WORK (the guest's artefacts, default /var/tmp/iwarp-guest), PTCOMPAT_LOG_DIR
# (keep the logs there). Exits 77 ("SKIPPED: ...") where the guest cannot
# run: no guest tooling, not root, no /dev/net/tun.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIW_VM="${GUEST_DIR:-$ROOT/scripts/guest}"
export WORK="${SIW_WORK:-/var/tmp/iwarp-guest}"
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

# shellcheck source=scripts/lib/guest-host.sh
. "$ROOT/scripts/lib/guest-host.sh"
guest_can_run

note "building iwarp-perf"
cargo build --release -q -p iwarp-perf

guest_built

SHARE_DIR="$(mktemp -d /tmp/test-perftest-compat-share.XXXXXX)"
HOST_SERVER=""
HOST_SERVER2=""
cleanup() {
    if [[ -n "$HOST_SERVER" ]]; then
        kill "$(cat "$LOGS/mixB-host.pid" 2>/dev/null)" 2>/dev/null || true
        kill "$HOST_SERVER" 2>/dev/null || true
    fi
    if [[ -n "$HOST_SERVER2" ]]; then kill "$HOST_SERVER2" 2>/dev/null || true; fi
    rm -rf "$SHARE_DIR"
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
install -m755 "$BIN" "$SHARE_DIR/iwarp-perf"

# The guest job. bw_of FILE: the BW average of perftest's result line (the
# line after the "#bytes" header), or of iwarp-perf's --json.
cat >"$SHARE_DIR/guest.sh" <<GUEST_JOB
$(cat "$ROOT/scripts/lib/guest-listening.sh")
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
  said=
  # Linux siw's accept race (iwarp-perf names it: the first control
  # message waits unread in the passive side's TCP receive queue, see
  # docs/TESTING.md, "Linux siw's accept race"): not judged, marked on the line.
  if [ \$rc != 0 ] && grep -qs "unread in a TCP receive queue" /tmp/c.log /tmp/s.log; then
    said=" siw_accept_race=1"
  fi
  if [ \$rc != 0 ]; then
    # What each end said last, on the RESULT line itself (the host's FAIL
    # line repeats it, so a CI summary that keeps only that line still
    # names the cause), and what the guest kernel logged of siw.
    said="\$said client_said=\"\$(grep -v '^ *\$' /tmp/c.log 2>/dev/null | tail -n 1 | tr -d '\"')\" server_said=\"\$(grep -v '^ *\$' /tmp/s.log 2>/dev/null | tail -n 1 | tr -d '\"')\""
    dmesg 2>/dev/null | grep -iE 'siw|iwcm|rdma' | tail -n 8 | sed "s/^/PTCOMPAT \$tag: dmesg: /"
  fi
  echo "PTCOMPAT RESULT \$tag rc=\$rc client=\$crc server=\$src client_value=\$cbw server_value=\$sbw\$said"
}
# perftest calibrates its clock when it reports; under TCG the regression
# fails now and then ("Correlation coefficient r^2 ... < 0.9", then "Can't
# produce a report") and perftest exits 1 without the end-of-test
# exchange. That is perftest and the emulator, not the protocol, so a pair
# whose perftest log says so runs again, on fresh ports, at most twice
# more. Any other failure is judged as it is.
uncalibrated() { grep -q "Can't produce a report" "\$1" 2>/dev/null; }
for t in write_bw read_bw read_lat; do
  pt=ib_\$t
  case \$t in write_bw) base=18701 ;; read_bw) base=18703 ;; *) base=18705 ;; esac
  for attempt in 1 2 3; do
    port=\$((base + 100 * (attempt - 1)))
    timeout 60 \$pt -R -d siw0 -p \$port -n $N > /tmp/s.log 2>&1 &
    spid=\$!
    listening \$port || true
    timeout 60 \$P --perftest \$t $GUEST -p \$port -d siw0 -n $N --timeout 15 --json > /tmp/c.log 2>&1; crc=\$?
    wait \$spid; src=\$?
    show \$t-ptsrv /tmp/c.log; show \$t-ptsrv /tmp/s.log
    [ \$((crc + src)) != 0 ] && [ \$attempt -lt 3 ] && uncalibrated /tmp/s.log || break
    echo "PTCOMPAT \$t-ptsrv: note: perftest could not calibrate its clock; running the pair again"
  done
  sbw=-
  [ \$t = read_lat ] || sbw=\$(bw_of /tmp/s.log)
  result \$t-ptsrv \$crc \$src "\$(bw_of /tmp/c.log)" "\$sbw"
  for attempt in 1 2 3; do
    port=\$((base + 1 + 100 * (attempt - 1)))
    timeout 60 \$P --perftest --server \$t -p \$port -d siw0 --idle-timeout 40 --timeout 15 --json > /tmp/s.log 2>&1 &
    spid=\$!
    ready /tmp/s.log listening
    timeout 60 \$pt -R -d siw0 -p \$port -n $N $GUEST > /tmp/c.log 2>&1; crc=\$?
    # perftest gone, our server may still wait for its end of the test.
    [ \$crc = 0 ] || { sleep 1; kill \$spid 2>/dev/null; }
    wait \$spid; src=\$?
    show \$t-ptcli /tmp/s.log; show \$t-ptcli /tmp/c.log
    [ \$crc != 0 ] && [ \$attempt -lt 3 ] && uncalibrated /tmp/c.log || break
    echo "PTCOMPAT \$t-ptcli: note: perftest could not calibrate its clock; running the pair again"
  done
  sbw=-
  [ \$t = read_lat ] || sbw=\$(bw_of /tmp/s.log)
  result \$t-ptcli \$crc \$src "\$(bw_of /tmp/c.log)" "\$sbw"
done
# iwarp-perf's own protocol on siw0, both ends in the guest, every test
# with --integrity; the Send tests also with 24-byte messages, where a
# control message is 32 bytes (a receive's length tells it from data).
# --integrity gives every outstanding message its own slot (8 MiB at
# 64 KiB x 128), and siw pins registered memory against RLIMIT_MEMLOCK
# (8 MiB in the guest): raise it, as iwarp-perf's error says to.
ulimit -l unlimited || echo "PTCOMPAT note: ulimit -l unlimited failed"
nport=18760
for spec in "write_bw 65536" "read_bw 65536" "send_bw 65536" "send_bw 24" "write_lat 8" "read_lat 8" "send_lat 24"; do
  set -- \$spec
  tag=native-\$1-\$2
  nport=\$((nport + 1))
  timeout 60 \$P --server -d siw0 --bind $GUEST -p \$nport --idle-timeout 40 --timeout 15 > /tmp/s.log 2>&1 &
  spid=\$!
  listening \$nport || true
  timeout 60 \$P \$1 $GUEST -s \$2 -n $N -d siw0 -p \$nport --integrity --timeout 15 --json > /tmp/c.log 2>&1; crc=\$?
  wait \$spid; src=\$?
  show \$tag /tmp/c.log; show \$tag /tmp/s.log
  v=\$(grep -o '"bw_mb_s":[0-9.]*' /tmp/c.log | cut -d: -f2)
  case \$1 in *_lat) v=\$(grep -o '"t_median_us":[0-9.]*' /tmp/c.log | cut -d: -f2) ;; esac
  grep -q '"verified":[1-9]' /tmp/c.log || crc=\$((crc + 1000))
  result \$tag \$crc \$src "\${v:-0}" -
done
# --crc / --markers are the soft device's: on siw0 they are refused, naming
# siw's module parameter.
timeout 30 \$P write_bw $GUEST -d siw0 -p 18770 -n 1 --crc on > /tmp/c.log 2>&1; crc=\$?
show native-crc /tmp/c.log
nrc=0
[ \$crc = 1 ] || nrc=1
grep -q -- 'mpa_crc_required' /tmp/c.log || nrc=\$((nrc + 2))
echo "PTCOMPAT RESULT native-crc rc=\$nrc client=\$crc server=- client_value=refused server_value=-"
timeout 90 ib_write_bw -R -d siw0 -p 18750 -n $N > /tmp/ma.log 2>&1 &
mpid=\$!
listening 18750 || true
echo "PTCOMPAT READY mixA"
wait \$mpid; src=\$?
show mixA /tmp/ma.log
echo "PTCOMPAT SERVER mixA rc=\$src value=\$(bw_of /tmp/ma.log)"
# mixB against the host's servers on 18751, one per attempt (see the
# host side); a perftest that could not calibrate its clock runs again.
for attempt in 1 2 3; do
  [ \$attempt = 1 ] || sleep 3
  timeout 60 ib_write_bw -R -d siw0 -p 18751 -n $N $HOST > /tmp/mb.log 2>&1; crc=\$?
  show mixB /tmp/mb.log
  [ \$crc != 0 ] && [ \$attempt -lt 3 ] && uncalibrated /tmp/mb.log || break
  echo "PTCOMPAT mixB: note: perftest could not calibrate its clock; running its client again"
  echo "PTCOMPAT RETRY mixB"
done
echo "PTCOMPAT CLIENT mixB rc=\$crc value=\$(bw_of /tmp/mb.log)"
# mixC / mixD: iwarp-perf's own protocol between siw0 (guest) and soft
# (host), each side as the server once.
timeout 90 \$P --server -d siw0 --bind $GUEST -p 18781 --idle-timeout 80 --timeout 15 > /tmp/mc.log 2>&1 &
mpid=\$!
listening 18781 || true
echo "PTCOMPAT READY mixC"
wait \$mpid; src=\$?
show mixC /tmp/mc.log
echo "PTCOMPAT SERVER mixC rc=\$src"
timeout 60 \$P send_bw $HOST -s 24 -n $N -d siw0 -p 18780 --integrity --timeout 15 --json > /tmp/md.log 2>&1; crc=\$?
show mixD /tmp/md.log
grep -q '"verified":[1-9]' /tmp/md.log || crc=\$((crc + 1000))
echo "PTCOMPAT CLIENT mixD rc=\$crc value=\$(grep -o '"bw_mb_s":[0-9.]*' /tmp/md.log | cut -d: -f2)"
echo "PTCOMPAT ALLDONE"
GUEST_JOB
chmod +x "$SHARE_DIR/guest.sh"

"$SIW_VM/run.sh" up >/dev/null
# The guest's whole job (boot included) is bounded by GUEST_TIMEOUT. The
# host's servers start before the guest boots, so each must wait for its
# client at least that long: with 280 s, under load (stress-ng beside a
# TCG guest, load average 30) the guest reached mixD after the host's
# server had given up ("no client connected within 280s", the client
# refused), inside its own bound (session 9).
GUEST_TIMEOUT=300
# mixB's servers: one after another, one for each attempt of the guest's
# client (it runs again when perftest could not calibrate its clock, see
# the guest job). Server k logs to mixB-host-k.log and leaves its exit
# status in mixB-host-k.rc; the ones nobody needed are stopped at the end.
(
    for k in 1 2 3; do
        ip netns exec "$NETNS" timeout $((GUEST_TIMEOUT + 20)) "$BIN" --perftest --server write_bw -d soft --bind "$HOST" -p 18751 \
            --idle-timeout "$GUEST_TIMEOUT" --timeout 15 --json >"$LOGS/mixB-host-$k.log" 2>&1 &
        echo $! >"$LOGS/mixB-host.pid"
        krc=0
        wait $! || krc=$?
        echo "$krc" >"$LOGS/mixB-host-$k.rc"
    done
) &
HOST_SERVER=$!
ip netns exec "$NETNS" timeout $((GUEST_TIMEOUT + 20)) "$BIN" --server -d soft --bind "$HOST" -p 18780 \
    --idle-timeout "$GUEST_TIMEOUT" --timeout 15 >"$LOGS/mixD-host.log" 2>&1 &
HOST_SERVER2=$!

GLOG="$LOGS/guest.log"
note "booting the guest (logs in $LOGS)"
: >"$GLOG"
SHARE="$SHARE_DIR" TIMEOUT="$GUEST_TIMEOUT" "$SIW_VM/run.sh" </dev/null >"$GLOG" 2>&1 &
BOOT=$!
MIXA_RC=1
if wait_line "$GLOG" "PTCOMPAT READY mixA" 240; then
    MIXA_RC=0
    ip netns exec "$NETNS" timeout 60 "$BIN" --perftest write_bw "$GUEST" -p 18750 -d soft -n "$N" \
        --timeout 15 --json >"$LOGS/mixA-host.log" 2>&1 || MIXA_RC=$?
else
    note "the guest never announced mixA"
fi
MIXC_RC=1
if wait_line "$GLOG" "PTCOMPAT READY mixC" 120; then
    MIXC_RC=0
    ip netns exec "$NETNS" timeout 60 "$BIN" write_bw "$GUEST" -p 18781 -d soft -n "$N" --integrity \
        --timeout 15 --json >"$LOGS/mixC-host.log" 2>&1 || MIXC_RC=$?
else
    note "the guest never announced mixC"
fi
rc=0
wait "$BOOT" || rc=$?
# The guest's last attempt met server k = retries + 1.
K=$(($(grep -ac "PTCOMPAT RETRY mixB" "$GLOG" || true) + 1))
((K == 1)) || note "mixB: perftest could not calibrate its clock in the guest $((K - 1)) time(s); its run $K is the one judged"
for _i in $(seq 100); do [ -s "$LOGS/mixB-host-$K.rc" ] && break; sleep 0.1; done
MIXB_RC="$(cat "$LOGS/mixB-host-$K.rc" 2>/dev/null || echo 1)"
[ -s "$LOGS/mixB-host-$K.rc" ] || note "mixB: the host's server $K had not ended 10 s after the guest"
cp "$LOGS/mixB-host-$K.log" "$LOGS/mixB-host.log" 2>/dev/null || true
kill "$(cat "$LOGS/mixB-host.pid" 2>/dev/null)" 2>/dev/null || true
kill "$HOST_SERVER" 2>/dev/null || true
wait "$HOST_SERVER" 2>/dev/null || true
HOST_SERVER=""
MIXD_RC=0
wait "$HOST_SERVER2" || MIXD_RC=$?
HOST_SERVER2=""

FAILS=0
PASSES=0
RACES=0
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
    grep -a "^PTCOMPAT $tag: " "$CLEAN" | sed "s/^PTCOMPAT $tag: /    /" | grep -aE 'bw_mib|bw_mb_s|lat_med|t_median|error|Error|failed|Failed|Unable|Unexpected|Couldn|^ *[0-9]+ ' || true
    line="$(grep -a "^PTCOMPAT RESULT $tag " "$CLEAN" || true)"
    if [[ "$line" == *" rc=0 "* ]]; then
        pass "$tag" "$desc (${line#*client_value=})"
    elif [[ "$line" == *" siw_accept_race=1 "* ]]; then
        # iwarp-perf found the first control message unread in the
        # passive side's TCP receive queue, where only the kernel's siw
        # can read it: Linux siw's accept race, not the pair's protocol.
        # Not judged, never retried; counted and shown.
        grep -a "^PTCOMPAT $tag: " "$CLEAN" | grep -a "unread in a TCP receive queue" | sed "s/^PTCOMPAT $tag: /    guest: /" || true
        note "NOT JUDGED $tag: Linux siw's accept race (the first message was never read by the passive side's siw; see docs/TESTING.md, \"Linux siw's accept race\")"
        RACES=$((RACES + 1))
    else
        # All of the guest's lines for it, not only the figures.
        grep -a "^PTCOMPAT $tag: " "$CLEAN" | sed "s/^PTCOMPAT $tag: /    guest: /" || true
        fail "$tag" "$desc: ${line:-no guest result (guest exit $rc)}"
    fi
}
check write_bw-ptsrv "ib_write_bw -R server <- iwarp-perf --perftest client, siw0"
check write_bw-ptcli "iwarp-perf --perftest --server <- ib_write_bw -R client, siw0"
check read_bw-ptsrv "ib_read_bw -R server <- iwarp-perf --perftest client, siw0"
check read_bw-ptcli "iwarp-perf --perftest --server <- ib_read_bw -R client, siw0"
check read_lat-ptsrv "ib_read_lat -R server <- iwarp-perf --perftest client, siw0"
check read_lat-ptcli "iwarp-perf --perftest --server <- ib_read_lat -R client, siw0"
for spec in "write_bw 65536" "read_bw 65536" "send_bw 65536" "send_bw 24" "write_lat 8" "read_lat 8" "send_lat 24"; do
    read -r t s <<<"$spec"
    check "native-$t-$s" "iwarp-perf $t -s $s --integrity -> iwarp-perf --server, its own protocol, both on siw0"
done
check native-crc "--crc on a kernel device is refused, naming siw's mpa_crc_required"

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
    grep -a "^PTCOMPAT mixB: " "$CLEAN" | sed "s/^PTCOMPAT mixB: /    guest: /" || true
    fail mixB "host server exit $MIXB_RC, value ${hbw:-none}; guest: ${line:-no result}"
fi
# mixC: our client on soft (host) -> our server on siw0 (guest), own protocol.
sed 's/^/    host: /' "$LOGS/mixC-host.log" 2>/dev/null || true
line="$(grep -a "^PTCOMPAT SERVER mixC " "$CLEAN" || true)"
hbw="$(grep -o '"bw_mb_s":[0-9.]*' "$LOGS/mixC-host.log" 2>/dev/null | cut -d: -f2 || true)"
if ((MIXC_RC == 0)) && [[ "$line" == *" rc=0"* ]] && nonzero "${hbw:-0}" &&
    grep -q '"verified":[1-9]' "$LOGS/mixC-host.log"; then
    pass mixC "iwarp-perf write_bw --integrity on soft (host) -> iwarp-perf --server on siw0 (guest) ($hbw MB/s)"
else
    fail mixC "host client exit $MIXC_RC, value ${hbw:-none}; guest: ${line:-no result}"
fi
# mixD: our client on siw0 (guest) -> our server on soft (host), own protocol.
sed 's/^/    host: /' "$LOGS/mixD-host.log" 2>/dev/null || true
line="$(grep -a "^PTCOMPAT CLIENT mixD " "$CLEAN" || true)"
if ((MIXD_RC == 0)) && [[ "$line" == *" rc=0 "* ]] && nonzero "${line##*value=}"; then
    pass mixD "iwarp-perf send_bw -s 24 --integrity on siw0 (guest) -> iwarp-perf --server on soft (host) (${line##*value=} MB/s)"
else
    fail mixD "host server exit $MIXD_RC; guest: ${line:-no result}"
fi
if ! grep -aq "PTCOMPAT ALLDONE" "$CLEAN"; then
    note "the guest did not finish its job (log: $GLOG)"
    FAILS=$((FAILS + 1))
fi

if ((RACES > 0)); then
    note "$PASSES passed, $FAILS failed, $RACES not judged (Linux siw's accept race)"
else
    note "$PASSES passed, $FAILS failed"
fi
if ((FAILS > 0)); then
    note "logs kept in $LOGS"
    exit 1
fi
[[ -n "${PTCOMPAT_LOG_DIR:-}" ]] || rm -rf "$LOGS"
