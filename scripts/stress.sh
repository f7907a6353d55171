#!/usr/bin/env bash
# Run one command several times under added CPU load and record each run:
# the flaky-test hunt of issue 26 ("run cargo test and the script steps 5
# times under added CPU load and fix each failure at its cause").
#
#   scripts/stress.sh [options] -- COMMAND [ARGS...]
#
#   scripts/stress.sh -- cargo test --release -p iwarp-sockets
#   scripts/stress.sh -n 10 -l "--cpu 1" -- scripts/test-rstream-siw.sh
#   STRESS_RUNS=5 scripts/stress.sh -o /tmp/hunt -- scripts/test-capi.sh
#
# Options (each also an environment variable):
#   -n RUNS       runs (STRESS_RUNS, default 5)
#   -l LOAD       stress-ng arguments for the added load (STRESS_LOAD,
#                 default "--cpu 2"); "none" runs without added load, as
#                 a baseline to compare the failure rate with
#   -t SECONDS    time limit of one run (STRESS_TIMEOUT, default 1800);
#                 a run that outlives it is killed and counted as failed
#   -o DIR        log directory (STRESS_DIR, default a new /tmp/stress.*):
#                 run-N.log (the command's output), runs.tsv, summary.md
#   --name NAME   name of the command in the summary (default the command)
#   -h, --help    this text
#
# Each run starts its own stress-ng (bounded by its own --timeout, so it
# can never outlive the run), runs COMMAND with a time limit, and logs
# pass/fail (exit 0 passes, 77 is a skip, anything else fails), the
# duration and the load average (1-minute) at the start and at the end.
# The summary (summary.md, printed at the end) has one table row per run
# and the pass count. The exit status is 0 when no run failed, else 1.
#
# stress-ng is installed (apt) when missing. The load is CPU only; on a
# machine where other people build, "--cpu 1" keeps it usable while the
# builds provide the rest of the load: say which load was used next to
# any result.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

RUNS="${STRESS_RUNS:-5}"
LOAD="${STRESS_LOAD:---cpu 2}"
LIMIT="${STRESS_TIMEOUT:-1800}"
DIR="${STRESS_DIR:-}"
NAME=""
while (($#)); do
    case "$1" in
    -n) RUNS="$2"; shift 2 ;;
    -l) LOAD="$2"; shift 2 ;;
    -t) LIMIT="$2"; shift 2 ;;
    -o) DIR="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *)
        echo "stress.sh: unknown option $1 (the command goes after --; see --help)" >&2
        exit 2
        ;;
    esac
done
if (($# == 0)); then
    echo "stress.sh: no command given: scripts/stress.sh [options] -- COMMAND [ARGS...] (see --help)" >&2
    exit 2
fi
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "stress.sh: -n wants a positive count, not '$RUNS'" >&2; exit 2; }
[[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || { echo "stress.sh: -t wants seconds, not '$LIMIT'" >&2; exit 2; }
NAME="${NAME:-$*}"
DIR="${DIR:-$(mktemp -d /tmp/stress.XXXXXX)}"
mkdir -p "$DIR"

note() { printf '[stress] %s\n' "$*"; }
load1() { cut -d' ' -f1 /proc/loadavg; }

read -ra LOAD_ARGS <<<"$LOAD"
if [[ "$LOAD" == none ]]; then
    LOAD_ARGS=()
elif ! command -v stress-ng >/dev/null; then
    note "installing stress-ng (apt)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends stress-ng >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends stress-ng >/dev/null
    fi
fi

STRESS_PID=""
stop_load() {
    if [[ -n "$STRESS_PID" ]]; then
        kill "$STRESS_PID" 2>/dev/null || true
        wait "$STRESS_PID" 2>/dev/null || true
        STRESS_PID=""
    fi
}
trap stop_load EXIT

printf 'run\tresult\texit\tseconds\tload_start\tload_end\n' >"$DIR/runs.tsv"
note "$RUNS runs of: $NAME"
note "added load: ${LOAD}; time limit ${LIMIT} s per run; logs in $DIR"
PASS=0
FAIL=0
SKIP=0
for ((i = 1; i <= RUNS; i++)); do
    if ((${#LOAD_ARGS[@]})); then
        # Its own bound, so a killed script never leaves it running.
        stress-ng "${LOAD_ARGS[@]}" --timeout "$((LIMIT + 60))s" >"$DIR/stress-ng-$i.log" 2>&1 &
        STRESS_PID=$!
    fi
    l0="$(load1)"
    t0="$(date +%s.%N)"
    rc=0
    timeout --kill-after=30 "$LIMIT" "$@" >"$DIR/run-$i.log" 2>&1 </dev/null || rc=$?
    t1="$(date +%s.%N)"
    l1="$(load1)"
    stop_load
    secs="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
    case "$rc" in
    0) res=PASS; PASS=$((PASS + 1)) ;;
    77) res=SKIP; SKIP=$((SKIP + 1)) ;;
    124 | 137) res=TIMEOUT; FAIL=$((FAIL + 1)) ;;
    *) res=FAIL; FAIL=$((FAIL + 1)) ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "$res" "$rc" "$secs" "$l0" "$l1" >>"$DIR/runs.tsv"
    note "run $i/$RUNS: $res (exit $rc) in ${secs} s, load average $l0 -> $l1 (log: $DIR/run-$i.log)"
done

{
    echo "Stress runs of \`$NAME\`"
    echo
    if [[ "$LOAD" == none ]]; then added="none"; else added="\`stress-ng $LOAD\`"; fi
    echo "Added load: $added, $(nproc) CPUs, time limit $LIMIT s per run, $(date -u +%Y-%m-%dT%H:%MZ)."
    echo
    echo "| run | result | exit | seconds | load average start | end |"
    echo "| --- | --- | --- | --- | --- | --- |"
    tail -n +2 "$DIR/runs.tsv" | while IFS=$'\t' read -r n r e s a b; do
        echo "| $n | $r | $e | $s | $a | $b |"
    done
    echo
    echo "$PASS of $RUNS passed, $FAIL failed, $SKIP skipped."
} >"$DIR/summary.md"
cat "$DIR/summary.md"
((FAIL == 0))
