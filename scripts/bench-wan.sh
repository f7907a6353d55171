#!/usr/bin/env bash
# RFTP against GridFTP, vsftpd + curl and iperf3 on emulated WAN paths
# (issue 27 §2): every tool runs between two network namespaces joined by
# the wanem packet-level emulator (scripts/lib/wan.sh), so both ends'
# kernel TCP sees the delay, the bottleneck rate and the loss end to end.
#
# For each RTT x loss cell the path is brought up with a drop-tail queue of
# one bandwidth-delay product; each tool moves SIZE bytes file to file
# (tmpfs to tmpfs) N times; the figure is the median, as a fraction of the
# bottleneck rate (wall time of the client command, connection setup
# included). Tools:
#   iperf3        one TCP stream (-n SIZE), the TCP reference
#   rftp-auto     rftp get with no options (sized to the path; its negotiated default
#                 checksum, XXH3-128 against our rftpd, on both ends)
#   rftp-base     the same with the rftp binary in $RFTP_BASE_BIN (an A/B
#                 against an earlier build, e.g. a copy of target/release
#                 taken before a change; same rftpd)
#   rftp-crc      the same with --checksum crc32c (GridFTP -fast and curl verify nothing)
#   rftp-noverify the same with --no-verify
#   rftp-fixed    today's fixed sizing before issue 27 (--streams 1 --iodepth 4)
#   rftp-tuned    tuned by hand (--streams 8 --iodepth 16)
#   gridftp1/8    globus-url-copy -p 1 / -p 8 with -tcp-bs = the path's BDP
#   gridftp8v     the same as gridftp8 with -verify-checksum
#   vsftpd        vsftpd + curl, one stream
# --seed adds the seed paper's table: 200 KB, 1 MB, 10 MB and 100 MB at
# 10 ms RTT, rftp against one-stream TCP FTP (vsftpd + curl), time per file,
# the N runs of each size interleaved across the tools; --seed-rtt,
# --seed-sizes and --seed-tools change the RTTs, sizes and tools (the
# issue's "100 MB at 50 ms": --seed --no-matrix --seed-rtt 50 --seed-sizes 100M).
#
# Usage: scripts/bench-wan.sh [--rtt "10 50"] [--loss "0 0.1"] [--rate 1gbit]
#          [--size 1G] [--n 3] [--tools "iperf3 rftp-auto gridftp8"] [--seed]
#          [--no-matrix] [--seed-rtt "10 50"] [--seed-sizes "200K 100M"]
#          [--seed-tools "rftp-auto rftp-noverify vsftpd"] [--out DIR] [--skip-install]
# RFTPD_CONGESTION=bbr|cubic|reno sets rftpd's congestion control (the
# sender's, for the downloads measured here). BENCH_BIN=DIR takes rftp and
# rftpd from DIR instead of building them into target/release.
# Writes DIR/wan_results.jsonl, DIR/wan_summary.md and DIR/wan.png
# (scripts/plot_wan.py); DIR defaults to docs/bench. Needs root. The full
# matrix (4 RTTs x 4 losses x 8 tools x 3 runs of 1 GiB) takes hours on
# 2 cores; pick a subset with the flags. Read docs/WAN.md for the highest
# rate the emulator sustains here, and run below it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

RTTS="0.2 10 50 100"
LOSSES="0 0.01 0.1 1"
RATE="1gbit"
SIZE="1G"
N=3
TOOLS="iperf3 rftp-auto rftp-fixed rftp-tuned gridftp1 gridftp8 gridftp8v vsftpd"
SEED=0
SEED_RTTS="10"
SEED_SIZES="200K 1M 10M 100M"
SEED_TOOLS="rftp-auto vsftpd"
MATRIX=1
OUT="$ROOT/docs/bench"
SKIP_INSTALL=0
STEP_TIMEOUT=600

usage() { sed -n '2,35p' "$0"; exit "${1:-0}"; }
while (($#)); do
    case "$1" in
        --rtt) RTTS="$2"; shift 2 ;;
        --loss) LOSSES="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --size) SIZE="$2"; shift 2 ;;
        --n) N="$2"; shift 2 ;;
        --tools) TOOLS="$2"; shift 2 ;;
        --seed) SEED=1; shift ;;
        --seed-rtt) SEED_RTTS="$2"; shift 2 ;;
        --seed-sizes) SEED_SIZES="$2"; shift 2 ;;
        --seed-tools) SEED_TOOLS="$2"; shift 2 ;;
        --no-matrix) MATRIX=0; shift ;;
        --out) OUT="$2"; shift 2 ;;
        --skip-install) SKIP_INSTALL=1; shift ;;
        -h|--help) usage 0 ;;
        *) echo "bench-wan: unknown option $1" >&2; usage 2 ;;
    esac
done
die() { echo "bench-wan: $*" >&2; exit 1; }
[[ "$(id -u)" -eq 0 ]] || die "needs root (network namespaces, TUN)"
[[ -c /dev/net/tun ]] || die "/dev/net/tun is missing: the wanem emulator needs TUN devices"

# --- dependencies (as scripts/bench-rftp.sh) ----------------------------
missing=()
needs() { [[ " $TOOLS " == *" $1"* ]]; }
if needs gridftp; then
    command -v globus-gridftp-server >/dev/null 2>&1 || missing+=(globus-gridftp-server-progs)
    command -v globus-url-copy >/dev/null 2>&1 || missing+=(globus-gass-copy-progs)
fi
if needs vsftpd || ((SEED)); then
    command -v vsftpd >/dev/null 2>&1 || [[ -x /usr/sbin/vsftpd ]] || missing+=(vsftpd)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
fi
command -v iperf3 >/dev/null 2>&1 || missing+=(iperf3)
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || missing+=(python3-matplotlib)
if ((${#missing[@]})); then
    ((SKIP_INSTALL)) && die "missing ${missing[*]} and --skip-install"
    echo "== installing ${missing[*]}"
    apt-get update -qq
    POLICY=/usr/sbin/policy-rc.d
    ADDED_POLICY=0
    if [[ ! -e "$POLICY" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$POLICY"; chmod +x "$POLICY"; ADDED_POLICY=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    ((ADDED_POLICY)) && rm -f "$POLICY"
fi
VSFTPD="$(command -v vsftpd || echo /usr/sbin/vsftpd)"

if [[ -n "${BENCH_BIN:-}" ]]; then
    # rftp and rftpd from a copy (a build that others' rebuilds of the
    # shared target dir cannot change mid-run); wanem from target/release.
    BIN="$BENCH_BIN"
else
    echo "== cargo build --release -p rftp -p wanem"
    cargo build --release -q -p rftp -p wanem
    BIN="$ROOT/target/release"
fi
# shellcheck source=scripts/lib/wan.sh disable=SC1091
. "$ROOT/scripts/lib/wan.sh"

TAG="bw$$"
TMP="$(mktemp -d -p /dev/shm)"
mkdir -p "$OUT"
cleanup() {
    set +e
    wan_down "$TAG"
    rm -rf "$TMP" "/etc/netns/wan-$TAG-a" "/etc/netns/wan-$TAG-b"
}
trap cleanup EXIT

bytes_of() { numfmt --from=iec "${1^^}"; }
rate_bps() { # 1gbit, 500mbit, 100mbit
    local r="${1,,}"
    case "$r" in
        *gbit) echo $((${r%gbit} * 1000000000)) ;;
        *mbit) echo $((${r%mbit} * 1000000)) ;;
        *) die "rate $1: use Nmbit or Ngbit" ;;
    esac
}
LINK_BPS=$(rate_bps "$RATE")
CPU_MODEL="$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1) x $(nproc)"
RESULTS="$OUT/wan_results.jsonl"
: >"$RESULTS"

DATA="$TMP/data"; mkdir -p "$DATA" "$TMP/empty"
# GridFTP serves as nobody, vsftpd as daemon: they must read the files.
chmod 755 "$TMP" "$DATA"
make_file() { [[ -f "$DATA/$1" ]] || { head -c "$2" /dev/urandom >"$DATA/$1"; chmod 644 "$DATA/$1"; }; }

# Bring up the path and the servers in namespace b.
path_up() {
    local rtt="$1" loss="$2"
    local args=(--rtt "${rtt}ms" --rate "$RATE" --queue bdp)
    [[ "$loss" != 0 ]] && args+=(--loss "${loss}%")
    mkdir -p "/etc/netns/wan-$TAG-a" "/etc/netns/wan-$TAG-b"
    printf '127.0.0.1 localhost\n10.201.0.1 wan-a\n10.201.0.2 wan-b %s\n' "$(hostname)" >"/etc/netns/wan-$TAG-b/hosts"
    printf '127.0.0.1 localhost\n10.201.0.1 wan-a %s\n10.201.0.2 wan-b\n' "$(hostname)" >"/etc/netns/wan-$TAG-a/hosts"
    wan_up "$TAG" "${args[@]}"
    B="$(wan_addr_b)"
    local CC_LINE=""
    [[ -n "${RFTPD_CONGESTION:-}" ]] && CC_LINE="congestion = \"$RFTPD_CONGESTION\""
    cat >"$TMP/rftpd.toml" <<EOF
root = "$DATA"
data_timeout_secs = 60
$CC_LINE
[[users]]
name = "bench"
password = "bench"
write = true
EOF
    wan_b env RUST_LOG=warn "$BIN/rftpd" -c "$TMP/rftpd.toml" --listen "$B:2121" >"$TMP/rftpd.log" 2>&1 &
    wan_b iperf3 -s -D -B "$B" >/dev/null 2>&1
    if needs gridftp; then
        wan_b globus-gridftp-server -aa -anonymous-user nobody -p 2811 \
            -control-interface "$B" -data-interface "$B" -d error >"$TMP/gftp.log" 2>&1 &
    fi
    if needs vsftpd || ((SEED)); then
        cat >"$TMP/vsftpd.conf" <<EOF
listen=YES
listen_ipv6=NO
listen_address=$B
listen_port=2100
background=NO
anonymous_enable=YES
no_anon_password=YES
anon_root=$DATA
local_enable=NO
write_enable=NO
ftp_username=daemon
nopriv_user=nobody
pasv_enable=YES
pasv_address=$B
seccomp_sandbox=NO
secure_chroot_dir=$TMP/empty
xferlog_enable=NO
EOF
        wan_b "$VSFTPD" "$TMP/vsftpd.conf" >"$TMP/vsftpd.log" 2>&1 &
    fi
    sleep 1
}

# seconds FILE-OR-DASH CMD...: wall time of CMD in namespace a.
timed() {
    local t0 t1
    t0=$(date +%s.%N)
    if ! wan_a timeout "$STEP_TIMEOUT" "$@" >"$TMP/last.out" 2>&1; then
        echo "bench-wan: failed: $*" >&2; tail -3 "$TMP/last.out" >&2
        echo "nan"; return 0
    fi
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}'
}

run_tool() { # tool file bytes rtt_ms -> seconds
    local tool="$1" file="$2" bytes="$3" rtt="$4" bdp
    bdp=$(awk -v r="$LINK_BPS" -v t="$rtt" 'BEGIN {printf "%d", r / 8 * t / 1000}')
    ((bdp < 65536)) && bdp=65536
    rm -f "$TMP/dl.bin" "$TMP/dl.bin.part"
    local url="ftp://bench:bench@$B:2121/$file"
    case "$tool" in
        iperf3) timed iperf3 -c "$B" -n "$bytes" -f m ;;
        rftp-auto) timed "$BIN/rftp" get "$url" -o "$TMP/dl.bin" -q --no-resume ;;
        rftp-base) timed "${RFTP_BASE_BIN:?rftp-base needs RFTP_BASE_BIN}/rftp" get "$url" -o "$TMP/dl.bin" -q --no-resume ;;
        rftp-crc) timed "$BIN/rftp" get "$url" -o "$TMP/dl.bin" -q --no-resume --checksum crc32c ;;
        rftp-noverify) timed "$BIN/rftp" get "$url" -o "$TMP/dl.bin" -q --no-resume --no-verify ;;
        rftp-fixed) timed "$BIN/rftp" get "$url" -o "$TMP/dl.bin" -q --no-resume --streams 1 --iodepth 4 ;;
        rftp-tuned) timed "$BIN/rftp" get "$url" -o "$TMP/dl.bin" -q --no-resume --streams 8 --iodepth 16 ;;
        gridftp1) timed globus-url-copy -fast -p 1 -tcp-bs "$bdp" "ftp://$B:2811$DATA/$file" "file://$TMP/dl.bin" ;;
        gridftp8) timed globus-url-copy -fast -p 8 -tcp-bs "$bdp" "ftp://$B:2811$DATA/$file" "file://$TMP/dl.bin" ;;
        gridftp8v) timed globus-url-copy -fast -p 8 -tcp-bs "$bdp" -verify-checksum "ftp://$B:2811$DATA/$file" "file://$TMP/dl.bin" ;;
        vsftpd) timed curl -sS -o "$TMP/dl.bin" "ftp://$B:2100/$file" ;;
        *) die "unknown tool $tool" ;;
    esac
}

emu_share() { wan_ctl stats 2>/dev/null | sed -n 's/.*share=\([0-9.]*\)%.*/\1/p' | tail -1; }

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

record() { # kind rtt loss tool bytes seconds-list
    local kind="$1" rtt="$2" loss="$3" tool="$4" bytes="$5" secs="$6" med frac share
    med=$(tr ' ' '\n' <<<"$secs" | { grep -Ev '^(nan)?$' || true; } | median)
    frac=nan
    [[ "$med" != nan ]] && frac=$(awk -v b="$bytes" -v m="$med" -v l="$LINK_BPS" 'BEGIN {printf "%.4f", b * 8 / m / l}')
    share=$(emu_share)
    printf '{"kind":"%s","rtt_ms":%s,"loss_pct":%s,"rate":"%s","tool":"%s","bytes":%s,"runs_s":[%s],"median_s":%s,"fraction":%s,"emu_cpu_pct":%s,"cpu":"%s","date":"%s"}\n' \
        "$kind" "$rtt" "$loss" "$RATE" "$tool" "$bytes" "$(tr ' ' ',' <<<"${secs% }")" \
        "$med" "$frac" "${share:-null}" "$CPU_MODEL" "$(date -u +%FT%TZ)" |
        sed 's/nan/null/g' >>"$RESULTS"
    printf '  %-11s %8.3f s  %.3f of the link  (emulator CPU %s%%)\n' "$tool" "${med/nan/0}" "${frac/nan/0}" "${share:-?}"
}

if ((MATRIX)); then
    SIZE_B=$(bytes_of "$SIZE")
    make_file "m.bin" "$SIZE_B"
    for rtt in $RTTS; do
        for loss in $LOSSES; do
            echo "== RTT $rtt ms, loss $loss %, $RATE, $SIZE x $N"
            path_up "$rtt" "$loss"
            for tool in $TOOLS; do
                secs=""
                for _ in $(seq "$N"); do secs+="$(run_tool "$tool" m.bin "$SIZE_B" "$rtt") "; done
                record matrix "$rtt" "$loss" "$tool" "$SIZE_B" "$secs"
            done
            wan_down "$TAG"
        done
    done
fi

if ((SEED)); then
    for rtt in $SEED_RTTS; do
        echo "== seed table: $rtt ms RTT, $RATE, $SEED_TOOLS, $N runs interleaved"
        path_up "$rtt" 0
        for s in $SEED_SIZES; do
            b=$(bytes_of "$s"); make_file "s$s.bin" "$b"
            # Interleaved: run 1 of every tool, then run 2, ...: a burst
            # of load from the other users of the machine hits all tools
            # alike instead of one tool's three runs.
            declare -A secs=()
            for _ in $(seq "$N"); do
                for tool in $SEED_TOOLS; do
                    secs[$tool]+="$(run_tool "$tool" "s$s.bin" "$b" "$rtt") "
                done
            done
            for tool in $SEED_TOOLS; do
                record seed "$rtt" 0 "$tool" "$b" "${secs[$tool]}"
            done
            unset secs
        done
        wan_down "$TAG"
    done
fi

/usr/bin/python3 "$ROOT/scripts/plot_wan.py" "$RESULTS" "$OUT/wan_summary.md" "$OUT/wan.png"
echo "== wrote $RESULTS, $OUT/wan_summary.md, $OUT/wan.png"
