#!/usr/bin/env bash
# ab-rftp.sh RTT LOSS SIZE N "BIN1|ARGS1" "BIN2|ARGS2" ...: one wanem path (1 Gbit/s, BDP queue),
# N rounds, each round runs every variant once (interleaved: a burst of load from other users hits
# all variants alike); prints per run the time, the fraction of 1 Gbit/s, the emulator's CPU share
# over that run and the load average. Each BIN is a directory holding rftp and rftpd (a copy of
# target/release); each BIN runs its own rftpd, so an A/B compares whole builds (client and
# server). An A/A run ("/tmp/base|" "/tmp/base|") shows the noise. Needs root. Session 10:
#   docs/bench/wan-s10/ab-rftp.sh 100 1 256M 4 "/tmp/base|" "/tmp/new|"
# shellcheck disable=SC1091
set -euo pipefail
RTT="$1"; LOSS="$2"; SIZE="$3"; N="$4"; shift 4
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"; cd "$ROOT"
export WANEM="${WANEM:-$ROOT/target/release/wanem}"
. scripts/lib/wan.sh
TAG="w$$"; TMP="$(mktemp -d -p /dev/shm)"; chmod 755 "$TMP"
trap 'wan_down "$TAG"; rm -rf "$TMP"' EXIT
args=(--rtt "${RTT}ms" --rate 1gbit --queue bdp --subnet 47)
[[ "$LOSS" != 0 ]] && args+=(--loss "${LOSS}%")
WAN_LOG_DIR="$TMP" wan_up "$TAG" "${args[@]}" >/dev/null
B="$(wan_addr_b)"
BYTES="$(numfmt --from=iec "$SIZE")"
mkdir -p "$TMP/data"; head -c "$BYTES" /dev/urandom >"$TMP/data/m.bin"
cat >"$TMP/rftpd.toml" <<E2
root = "$TMP/data"
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
write = true
E2
declare -A started=()
port=2121
for v in "$@"; do
    bin="${v%%|*}"
    if [[ -z "${started[$bin]:-}" ]]; then
        wan_b env RUST_LOG=warn "$bin/rftpd" -c "$TMP/rftpd.toml" --listen "$B:$port" >"$TMP/rftpd.$port.log" 2>&1 &
        started[$bin]=$port; port=$((port + 1))
    fi
done
sleep 0.5
cpu() { wan_ctl stats | sed -n 's/.*user_s=\([0-9.]*\) sys_s=\([0-9.]*\) wall_s=\([0-9.]*\).*/\1 \2 \3/p'; }
for r in $(seq "$N"); do
    for v in "$@"; do
        bin="${v%%|*}"; a="${v#*|}"; p=${started[$bin]}
        read -r u0 s0 _ < <(cpu)
        t0=$(date +%s.%N)
        ok=1
        # shellcheck disable=SC2086 # ARGS are words
        wan_a timeout 300 "$bin/rftp" get "ftp://bench:bench@$B:$p/m.bin" -o "$TMP/dl.bin" -q --no-resume $a >"$TMP/out" 2>&1 || { ok=0; tail -2 "$TMP/out"; }
        t1=$(date +%s.%N)
        read -r u1 s1 _ < <(cpu)
        awk -v r="$r" -v v="$v" -v a="$t0" -v b="$t1" -v n="$BYTES" -v ok="$ok" \
            -v cu="$(echo "$u1 $s1 $u0 $s0" | awk '{print $1+$2-$3-$4}')" -v l="$(cut -d' ' -f1 /proc/loadavg)" \
            'BEGIN{printf "round %d  %-40s %7.3f s  %.3f of link  wanem %.0f%% of a core  load %s %s\n", r, v, b-a, n*8/(b-a)/1e9, 100*cu/(b-a), l, ok?"":"FAILED"}'
        rm -f "$TMP/dl.bin"
    done
done
