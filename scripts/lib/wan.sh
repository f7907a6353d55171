# shellcheck shell=bash
# WAN paths for scripts: source this file, then
#
#   wan_up TAG [wanem up flags...]   # e.g. wan_up t1 --rtt 50ms --rate 1gbit --loss 0.1%
#   trap 'wan_down t1' EXIT          # always clean up, also on failure
#   wan_b iperf3 -s -1 &             # run a command in namespace b (or wan_a: a)
#   wan_a iperf3 -c "$(wan_addr_b)"  # a is 10.201.N.1, b is 10.201.N.2
#   wan_ctl down 5                   # link down for 5 s now; wan_ctl stats
#   wan_down t1                      # stop wanem, kill what runs in the
#                                    # namespaces, delete them
#
# wan_up starts target/release/wanem (or $WANEM) in the background, waits
# (bounded) until it is up and the path answers a ping, and makes TAG the
# current path: wan_a, wan_b, wan_addr_a, wan_addr_b and wan_ctl act on
# $WAN_TAG (set it to switch between several paths). wanem's log and its
# final counters go to ${WAN_LOG_DIR:-/tmp}/wanem-TAG.log. WAN_UP_TIMEOUT
# (seconds, default 15) bounds the wait; WAN_NO_PING=1 skips the ping
# (for a path that starts down or drops everything). See docs/WAN.md.

WAN_ROOT="${WAN_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
WANEM="${WANEM:-$WAN_ROOT/target/release/wanem}"
WAN_TAG="${WAN_TAG:-}"
declare -gA WAN_PIDS=()

# wan_env TAG KEY: a value from the running path's state file.
wan_env() {
    local f="/run/wanem/$1.env"
    [[ -r "$f" ]] || { echo "wan: no path $1 ($f missing: is it up?)" >&2; return 1; }
    sed -n "s/^$2=//p" "$f"
}

wan_up() {
    local tag="$1"; shift
    [[ -x "$WANEM" ]] || { echo "wan: $WANEM missing; run: cargo build --release -p wanem" >&2; return 1; }
    local log="${WAN_LOG_DIR:-/tmp}/wanem-$tag.log"
    "$WANEM" up --tag "$tag" "$@" >"$log" 2>&1 &
    WAN_PIDS[$tag]=$!
    WAN_TAG="$tag"
    local deadline=$((SECONDS + ${WAN_UP_TIMEOUT:-15}))
    until [[ -r "/run/wanem/$tag.env" ]]; do
        if ! kill -0 "${WAN_PIDS[$tag]}" 2>/dev/null; then
            echo "wan: wanem up --tag $tag exited; its log ($log):" >&2
            cat "$log" >&2
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "wan: wanem --tag $tag not up after ${WAN_UP_TIMEOUT:-15}s; log: $log" >&2
            return 1
        fi
        sleep 0.05
    done
    [[ "${WAN_NO_PING:-0}" == 1 ]] && return 0
    until wan_a ping -c 1 -W 1 -q "$(wan_addr_b)" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "wan: path $tag does not answer ping after ${WAN_UP_TIMEOUT:-15}s (WAN_NO_PING=1 for a path that drops everything); log: $log" >&2
            return 1
        fi
    done
}

wan_a() { ip netns exec "wan-$WAN_TAG-a" "$@"; }
wan_b() { ip netns exec "wan-$WAN_TAG-b" "$@"; }
wan_addr_a() { wan_env "$WAN_TAG" WAN_ADDR_A; }
wan_addr_b() { wan_env "$WAN_TAG" WAN_ADDR_B; }
wan_ctl() { "$WANEM" ctl --tag "$WAN_TAG" "$@"; }

# wan_down [TAG]: never fails; safe from a trap, and when nothing is up.
wan_down() {
    local tag="${1:-$WAN_TAG}" ns pid
    [[ -n "$tag" ]] || return 0
    # Whatever the caller started inside the namespaces (servers left behind).
    for ns in "wan-$tag-a" "wan-$tag-b"; do
        [[ -e "/run/netns/$ns" ]] || continue
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill "$pid" 2>/dev/null || true
        done
    done
    pid="${WAN_PIDS[$tag]:-}"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
    fi
    "$WANEM" down --tag "$tag" >/dev/null 2>&1 || true
    [[ -n "$pid" ]] && wait "$pid" 2>/dev/null
    unset "WAN_PIDS[$tag]"
    return 0
}
