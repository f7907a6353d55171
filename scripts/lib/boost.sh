# shellcheck shell=bash
# boost_self NAME [ARGS...]: re-run the calling script (with ARGS) in a
# session of its own whose autogroup nice and process nice are $PRIO, once:
# with autogroup scheduling `nice` alone does not reach across sessions
# (docs/BENCHMARKS.md, "The pool's idle gaps"). Returns at once when PRIO
# is empty or the script already runs boosted; without the right to set
# the autogroup's nice (not root, for a negative PRIO) it says so and runs
# unboosted. NAME names the script in that message and in the marker
# variable (BENCH_<NAME without bench->_BOOSTED) that stops the second round.
boost_self() {
    local name=$1 marker
    shift
    marker=${name#bench-}
    marker="BENCH_${marker^^}_BOOSTED"
    marker=${marker//-/_}
    [[ -n "${PRIO:-}" && -z "${!marker:-}" ]] || return 0
    export "$marker=1"
    # shellcheck disable=SC2016 # $0 and $@ expand in the inner bash
    exec setsid bash -c 'n=$1
        shift
        echo "$0" >/proc/self/autogroup 2>/dev/null && exec nice -n "$0" "$@"
        echo "$n: cannot set the autogroup nice ($0); running unboosted" >&2
        exec "$@"' "$PRIO" "$name" "$0" "$@"
}
