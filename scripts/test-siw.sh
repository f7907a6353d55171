#!/usr/bin/env bash
# Interop with a real Linux kernel soft-iWARP (siw) peer: rdma-core's rping
# in a QEMU guest (scripts/guest) against iwarp-ping on the host
# side of the guest's private network, in both directions, with and without
# MPA CRC, and in RFC 6581 peer-to-peer mode (RTR). rping's exchange is a
# Send, an RDMA Read of the client's buffer, a Send, an RDMA Write back and
# a Send per ping, so each run covers Send, Read and Write both ways.
#
#   scripts/test-siw.sh                 every scenario (about 100 s under TCG)
#   SIW_RUNS=30 scripts/test-siw.sh     more connections per scenario
#
# Each scenario connects SIW_RUNS times (default 16; a stall that hit 1 run
# in 6 is missed by 16 runs with probability 0.054, by 24 with 0.013), each
# connection a fresh rping process and a fresh iwarp-ping connection.
#
# Boot 1 (siw defaults: MPA rev 2, CRC only if asked):
#   A  iwarp-ping -c            -> rping -s     (the first-FPDU stall, issue 11)
#   B  iwarp-ping -c --crc on   -> rping -s     (siw honours our CRC request)
#   C  rping -c -V              -> iwarp-ping -s
#   D  iwarp-ping -c -S 65535   -> rping -s     (multi-FPDU Read/Write)
# Boot 2 (siw mpa_crc_required=1 peer_to_peer=1):
#   E  rping -c -V              -> iwarp-ping -s --crc on   (siw asks for CRC and RTR)
#   F  iwarp-ping -c --crc on --rtr write -> rping -s
#
# Skips (exit 77, with the reason) only where the guest cannot run: no
# apt-get to build the guest (and none built), not root (network namespaces, tap), or no
# /dev/net/tun. A failed build of the guest is a failure.
#
# Environment: SIW_RUNS (default 16), SIW_A_ARGS (extra iwarp-ping flags for
# scenario A; `--no-wake-nudge` shows the stall the nudge repairs), GUEST_DIR (the guest tooling, default scripts/guest),
# SIW_WORK (guest artifacts, default /var/tmp/iwarp-guest), NETNS (default
# siwvm), SIW_LOG_DIR (logs,
# default a temporary directory, kept on failure).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIW_VM="${GUEST_DIR:-$ROOT/scripts/guest}"
RUNS="${SIW_RUNS:-16}"
export WORK="${SIW_WORK:-/var/tmp/iwarp-guest}"
# run.sh takes the network namespace (and TAP, BRIDGE) from the environment.
export NETNS="${NETNS:-siwvm}"
LOGS="${SIW_LOG_DIR:-$(mktemp -d /tmp/test-siw.XXXXXX)}"
mkdir -p "$LOGS"
PING="$ROOT/target/release/iwarp-ping"
GUEST=10.77.0.2
HOST=10.77.0.1
SRV_PORT=7174   # rping -s in the guest
OUR_PORT=7175   # iwarp-ping -s on the host side

note() { printf '[test-siw] %s\n' "$*"; }
# Exit status 77 (the automake convention) means "skipped"; the test
# command reports it as SKIP with the reason.
skip() {
    note "SKIPPED: $*"
    exit 77
}

# shellcheck source=scripts/lib/guest-host.sh
. "$ROOT/scripts/lib/guest-host.sh"
guest_can_run

if [[ ! -x "$PING" ]]; then
    note "building iwarp-ping"
    cargo build --release -q -p iwarp-tools --bin iwarp-ping
fi

guest_built

FAILS=0
PASSES=0
SERVER_PID=""
SERVER_LOG=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; fi
    "$SIW_VM/run.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT

# guest_job FILE: write the guest's script. It runs, in order, the guest
# side of each scenario given as "TAG:server[:ARGS]" (rping -s, RUNS times,
# each announced with READY and reported with RESULT) or "TAG:client:ARGS"
# (rping -c RUNS times against our server, each reported with RESULT).
guest_job() {
    local file="$1"
    shift
    {
        echo '#!/bin/sh'
        cat "$ROOT/scripts/lib/guest-listening.sh"
        echo "RUNS=$RUNS"
        local sc tag kind args
        for sc in "$@"; do
            tag="${sc%%:*}"
            kind="${sc#*:}"
            args=""
            case "$kind" in
            client:*)
                args="${kind#client:}"
                kind=client
                ;;
            server:*)
                args="${kind#server:}"
                kind=server
                ;;
            esac
            if [[ "$kind" == server ]]; then
                cat <<EOF
i=1
while [ \$i -le \$RUNS ]; do
  timeout 25 rping -s -a $GUEST -p $SRV_PORT -C 3 $args > /tmp/s.log 2>&1 &
  pid=\$!
  listening $SRV_PORT || true
  echo "SIWTEST READY $tag \$i"
  wait \$pid; rc=\$?
  echo "SIWTEST RESULT $tag \$i rc=\$rc"
  [ \$rc -eq 0 ] || tail -3 /tmp/s.log
  i=\$((i+1))
done
EOF
            else
                cat <<EOF
sleep 1
i=1
while [ \$i -le \$RUNS ]; do
  timeout 30 rping -c -a $HOST -p $OUR_PORT $args > /tmp/c.log 2>&1; rc=\$?
  echo "SIWTEST RESULT $tag \$i rc=\$rc"
  [ \$rc -eq 0 ] || tail -3 /tmp/c.log
  sleep 0.3
  i=\$((i+1))
done
EOF
            fi
        done
        echo 'echo "SIWTEST ALLDONE"'
    } >"$file"
    chmod +x "$file"
}

# our_client TAG GUESTLOG ARGS...: the host side of a "server" scenario.
our_client() {
    local tag="$1" glog="$2"
    shift 2
    local i ok=0 bad=0 rc
    for ((i = 1; i <= RUNS; i++)); do
        if ! wait_line "$glog" "SIWTEST READY $tag ${i}[[:space:]]*\$" 120; then
            note "$tag: the guest never announced run $i"
            bad=$((bad + RUNS - i + 1))
            break
        fi
        rc=0
        timeout -k 2 30 ip netns exec "$NETNS" "$PING" -c -a "$GUEST" -p "$SRV_PORT" -C 3 -V \
            --timeout 8 -d "$@" >"$LOGS/$tag.$i.log" 2>&1 || rc=$?
        wait_line "$glog" "SIWTEST RESULT $tag $i rc=" 60 || true
        if ((rc == 0)) && grep -aqE "SIWTEST RESULT $tag $i rc=0[[:space:]]*\$" "$glog"; then
            ok=$((ok + 1))
        else
            bad=$((bad + 1))
            note "$tag run $i FAILED (iwarp-ping exit $rc; $(grep -aE "SIWTEST RESULT $tag $i " "$glog" | tr -d '\r'))"
            tail -2 "$LOGS/$tag.$i.log" | sed 's/^/    /'
        fi
    done
    report "$tag" "$ok" "$bad" "iwarp-ping -c $* -> rping -s"
}

# their_client TAG GUESTLOG DESC: count the guest's rping -c results.
their_client() {
    local tag="$1" glog="$2" desc="$3" ok bad
    wait_line "$glog" "SIWTEST RESULT $tag $RUNS rc=" 400 || true
    ok=$(grep -acE "SIWTEST RESULT $tag [0-9]+ rc=0[[:space:]]*\$" "$glog" || true)
    bad=$((RUNS - ok))
    ((bad == 0)) || grep -aE "SIWTEST RESULT $tag [0-9]+ rc=[1-9]" "$glog" | sed 's/^/    /'
    report "$tag" "$ok" "$bad" "$desc"
}

report() {
    local tag="$1" ok="$2" bad="$3" desc="$4"
    if ((bad == 0)); then
        note "PASS $tag: $ok of $RUNS connections ($desc)"
        PASSES=$((PASSES + 1))
    else
        note "FAIL $tag: $ok of $RUNS connections passed ($desc)"
        FAILS=$((FAILS + 1))
    fi
}

# boot GUESTLOG SIWOPTS JOB: boot the guest in the background.
boot() {
    local glog="$1" opts="$2" job="$3"
    : >"$glog"
    SIWOPTS="$opts" TIMEOUT=900 "$SIW_VM/run.sh" "$job" >"$glog" 2>&1 &
    BOOT_PID=$!
}

finish_boot() {
    local glog="$1"
    if ! wait_line "$glog" "SIWTEST ALLDONE" 600; then
        note "the guest did not finish its job (log: $glog)"
        FAILS=$((FAILS + 1))
    fi
    wait "$BOOT_PID" 2>/dev/null || true
}

# start_server LOG [ARGS...]: our iwarp-ping server for one boot, its
# output in LOG (one file per boot, so a failure in boot 1 keeps its log).
start_server() {
    SERVER_LOG="$1"
    shift
    ip netns exec "$NETNS" "$PING" -s -P -a "$HOST" -p "$OUR_PORT" --timeout 10 "$@" \
        >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
}

stop_server() {
    if [[ -n "$SERVER_PID" ]]; then
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            note "FAIL: iwarp-ping -s exited during the run (log: $SERVER_LOG)"
            FAILS=$((FAILS + 1))
        fi
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}

"$SIW_VM/run.sh" up >/dev/null
note "logs in $LOGS; $RUNS connections per scenario"

# ---- boot 1: siw defaults
G1="$LOGS/guest1.log"
guest_job "$LOGS/job1.sh" A:server B:server C:client:"-C 3 -V" D:server:"-S 65535"
start_server "$LOGS/server.boot1.log"
boot "$G1" "" "$LOGS/job1.sh"
read -ra A_ARGS <<<"${SIW_A_ARGS:-}"
our_client A "$G1" "${A_ARGS[@]}"
our_client B "$G1" --crc on
their_client C "$G1" "rping -c -V -> iwarp-ping -s"
our_client D "$G1" -S 65535
finish_boot "$G1"
stop_server

# ---- boot 2: siw requires CRC and uses peer-to-peer mode
G2="$LOGS/guest2.log"
guest_job "$LOGS/job2.sh" E:client:"-C 3 -V" F:server
start_server "$LOGS/server.boot2.log" --crc on
boot "$G2" "mpa_crc_required=1,peer_to_peer=1" "$LOGS/job2.sh"
their_client E "$G2" "rping -c -V (siw CRC required, peer-to-peer) -> iwarp-ping -s --crc on"
our_client F "$G2" --crc on --rtr write
finish_boot "$G2"
stop_server

note "$PASSES passed, $FAILS failed"
if ((FAILS > 0)); then
    note "logs kept in $LOGS"
    exit 1
fi
[[ -n "${SIW_LOG_DIR:-}" ]] || rm -rf "$LOGS"
