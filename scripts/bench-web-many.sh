#!/usr/bin/env bash
# Many web clients at once: aggregate throughput, per-request latency and
# the server's CPU per GB served, plain Apache against mod_rdma (issue 30
# part 1; the seeds' "RDMA starts out low and stays low; TCP goes high").
#
#   scripts/bench-web-many.sh            # the benchmark, results into docs/
#   scripts/bench-web-many.sh --check    # quick correctness run (< 30 s)
#   scripts/bench-web-many.sh --help
#
# Servers, side by side on loopback, each in its own cpuacct cgroup:
#   plain-prefork  Apache, prefork MPM, no module, EnableSendfile On
#   plain-event    Apache, event MPM, no module, EnableSendfile On
#   mod_rdma       Apache, prefork MPM (mod_rdma refuses threaded MPMs: see
#                  docs/MOD_RDMA.md, "MPM"), EnableSendfile On, default
#                  RDMAInlineBelow; static registration on one port,
#                  dynamic on a vhost. Variants sw-/cr-static|dynamic.
# Clients: N rhttp processes at once, each with its own keep-alive HTTP
# connection (and its own RDMA connection), fetching its list in turn
# (no pipelining, like the seed's wget): workload "seed" = five 1 MiB files,
# REPEAT times; workload "zipf" = 30 * REPEAT objects of 2 KiB-8 MiB drawn
# by Zipf popularity (scripts/web_many.py has the details).
# Per run: wall time from starting the first client to the end of the last,
# the bytes, every request's time (rhttp's own figure), and the server's
# CPU: cpuacct.usage of its cgroup (every Apache process and thread,
# exited children included), or where no cgroup can be made, the sum of
# utime+stime of its children from /proc plus the parent's cutime+cstime.
# Runs of a cell are interleaved across the variants (run 1 of every
# variant, then run 2, ...), so the machine's drift hits all alike.
#
# --check: 4 clients, both workloads, every variant, REPEAT 1; every body
# saved and compared by SHA-256 with the served object. Exit 0 only if all
# match and every mod_rdma request went by RDMA or was answered inline.
set -uo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/bench-web-many.sh [--check] [options]

  --check            correctness: 4 clients, both workloads, every variant,
                     SHA-256 of every body (about 20 s once built)
  --clients LIST     client counts (default "1 2 4 8 16 32")
  --runs N           runs per cell, interleaved across variants (default 3)
  --repeat N         seed: passes over the five files; zipf: 30*N requests
                     per client (default 4)
  --workloads LIST   seed and/or zipf (default "seed zipf")
  --variants LIST    of plain-prefork plain-event sw-dynamic cr-dynamic
                     sw-static cr-static, and any mod_rdma one with -nocrc
                     (rhttp --crc off: no MPA CRC32C on the RDMA
                     connection) (default: the six, plus sw-dynamic-nocrc
                     and cr-dynamic-nocrc)
  --out DIR          results directory (default docs/bench); the table and
                     the plot go to DIR/web_many.md and docs/web-many.png
                     (DIR/web-many.png when --out is given)
  -h, --help         this text

Writes DIR/web_many_results.json (one JSON object per run). Needs apache2
and apache2-dev (scripts/test-modrdma.sh installs them) and, for the plot,
python3-matplotlib (installed with apt-get if missing).
EOF
}

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
CHECK=0 CLIENTS="1 2 4 8 16 32" RUNS=3 REPEAT=4 WORKLOADS="seed zipf"
VARIANTS="plain-prefork plain-event sw-dynamic cr-dynamic sw-static cr-static sw-dynamic-nocrc cr-dynamic-nocrc"
OUT="" PNG="$ROOT/docs/web-many.png"
while [ $# -gt 0 ]; do
    case $1 in
        --check) CHECK=1 ;;
        --clients) CLIENTS=$2; shift ;;
        --runs) RUNS=$2; shift ;;
        --repeat) REPEAT=$2; shift ;;
        --workloads) WORKLOADS=$2; shift ;;
        --variants) VARIANTS=$2; shift ;;
        --out) OUT=$2; PNG="$2/web-many.png"; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-web-many: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$CHECK" = 1 ]; then CLIENTS=4 RUNS=1 REPEAT=1; fi
OUT="${OUT:-$ROOT/docs/bench}"
mkdir -p "$OUT"

T="$(mktemp -d /tmp/web-many.XXXXXX)"
chmod 755 "$T"
PIDS=()
CGROUPS=()
cleanup() {
    local p g
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    for g in "${CGROUPS[@]}"; do rmdir "$g" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
die() { echo "bench-web-many: $*" >&2; exit 1; }

if ! command -v apache2 >/dev/null || ! command -v apxs >/dev/null; then
    die "apache2 and apache2-dev are missing: run scripts/test-modrdma.sh first (it installs them)"
fi
PY="${PY:-/usr/bin/python3}"
if [ "$CHECK" = 0 ] && ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq python3-matplotlib >/dev/null ||
        die "could not install python3-matplotlib"
fi
# SKIP_BUILD=1: use the binaries as they are (RHTTP= and MOD= name others).
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    timeout 1200 cargo build --release -q -p iwarp-ffi -p rhttp || die "cargo build failed"
    timeout 300 make -s -C modules/mod_rdma >/dev/null 2>&1 || die "building mod_rdma failed (make -C modules/mod_rdma)"
fi
RHTTP="${RHTTP:-$ROOT/target/release/rhttp}"
MOD="${MOD:-$ROOT/modules/mod_rdma/.libs/mod_rdma.so}"
WM="$ROOT/scripts/web_many.py"

# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$T/ports.given"; }
PA=$(free_port) PB=$(free_port) PC=$(free_port) PD=$(free_port)
DOCS="$T/docs"
"$PY" "$WM" objects "$DOCS" || die "making the objects failed"
chmod -R a+rX "$DOCS"

# Enough workers for the largest client count plus spares, all started up
# front (no forks during a run).
MAXC=1
for c in $CLIENTS; do [ "$c" -gt "$MAXC" ] && MAXC=$c; done
W=$((MAXC + 8))
conf() { # $1 run dir, $2 mpm (prefork or event)
    cat <<EOF
ServerRoot /etc/apache2
ServerName 127.0.0.1
DefaultRuntimeDir $1
PidFile $1/httpd.pid
ErrorLog $1/error.log
User www-data
Group www-data
LoadModule mpm_$2_module /usr/lib/apache2/modules/mod_mpm_$2.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 5
EnableSendfile On
TypesConfig /etc/mime.types
DocumentRoot $DOCS
LogLevel warn
<Directory />
    Require all granted
</Directory>
EOF
    if [ "$2" = prefork ]; then
        printf 'StartServers %s\nMinSpareServers %s\nMaxSpareServers %s\nServerLimit %s\nMaxRequestWorkers %s\n' \
            "$W" "$W" "$W" "$W" "$W"
    else
        printf 'StartServers 2\nServerLimit 2\nThreadsPerChild %s\nThreadLimit %s\nMaxRequestWorkers %s\nMinSpareThreads %s\nMaxSpareThreads %s\n' \
            "$W" "$W" $((2 * W)) "$W" $((2 * W))
    fi
}
mkdir -p "$T/ra" "$T/rb" "$T/rc"
{ conf "$T/ra" prefork; echo "Listen 127.0.0.1:$PA"; } >"$T/prefork.conf"
{ conf "$T/rb" event; echo "Listen 127.0.0.1:$PB"; } >"$T/event.conf"
{
    conf "$T/rc" prefork
    cat <<EOF
Listen 127.0.0.1:$PC
Listen 127.0.0.1:$PD
LoadModule rdma_module $MOD
RDMARegistration static
RDMABufferSize 8M
<Location />
    RDMA On
</Location>
<VirtualHost 127.0.0.1:$PD>
    RDMARegistration dynamic
</VirtualHost>
EOF
} >"$T/rdma.conf"

# Each Apache in its own cpuacct cgroup (v1 here; v2's cpu.stat where that
# is the hierarchy), entered before it forks, so every process and thread
# it ever has is counted, exited ones included.
CGROOT=""
for d in /sys/fs/cgroup/cpuacct /sys/fs/cgroup/cpu,cpuacct; do
    [ -w "$d" ] && [ -f "$d/cpuacct.usage" ] && { CGROOT=$d; break; }
done
if [ -z "$CGROOT" ] && [ -f /sys/fs/cgroup/cgroup.controllers ] && [ -w /sys/fs/cgroup ]; then CGROOT=/sys/fs/cgroup; fi
declare -A APID CG
start() { # $1 name, $2 conf, $3 port
    local g=""
    if [ -n "$CGROOT" ]; then
        g="$CGROOT/web-many-$$-$1"
        mkdir "$g" 2>/dev/null && CGROUPS+=("$g") || g=""
    fi
    CG[$1]=$g
    (
        [ -n "$g" ] && echo "$BASHPID" >"$g/cgroup.procs"
        exec setsid apache2 -d /etc/apache2 -f "$2" -DFOREGROUND >>"$T/apache.log" 2>&1
    ) &
    APID[$1]=$!
    PIDS+=($!)
    for _ in $(seq 1 100); do
        curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$3/s1.bin" && return 0
        sleep 0.1
    done
    die "apache2 ($1) did not start: $(tail -5 "$T/apache.log")"
}
# cpu NAME: the server's CPU seconds so far.
cpu() {
    local g=${CG[$1]}
    if [ -n "$g" ] && [ -f "$g/cpuacct.usage" ]; then
        awk '{ printf "%.6f\n", $1 / 1e9 }' "$g/cpuacct.usage"
    elif [ -n "$g" ] && [ -f "$g/cpu.stat" ]; then
        awk '$1 == "usage_usec" { printf "%.6f\n", $2 / 1e6 }' "$g/cpu.stat"
    else
        "$PY" "$WM" cpu "${APID[$1]}"
    fi
}
CPU_METHOD=$([ -n "$CGROOT" ] && echo "cgroup $CGROOT" || echo "/proc utime+stime")

start prefork "$T/prefork.conf" "$PA"
start event "$T/event.conf" "$PB"
start rdma "$T/rdma.conf" "$PC"

RES="$OUT/web_many_results.json"
[ "$CHECK" = 1 ] && RES="$T/results.json"
: >"$RES"

# one WORKLOAD CLIENTS VARIANT RUN: one run, one JSON line.
one() {
    local w=$1 c=$2 v=$3 run=$4 server port extra=() scheme=server-writes dir i t0 t1 c0 c1 stats
    # VARIANT-nocrc: the same with the RDMA connection's MPA CRC off
    # (rhttp --crc off; rhttp's default `required` makes the server
    # compute CRC32C over every FPDU it sends, RFC 5044 section 4.4).
    case $v in *-nocrc) extra=(--crc off) ;; esac
    case ${v%-nocrc} in
        plain-prefork) server=prefork port=$PA extra+=(--plain) ;;
        plain-event) server=event port=$PB extra+=(--plain) ;;
        sw-static) server=rdma port=$PC ;;
        cr-static) server=rdma port=$PC scheme=client-reads ;;
        sw-dynamic) server=rdma port=$PD ;;
        cr-dynamic) server=rdma port=$PD scheme=client-reads ;;
        *) die "unknown variant $v" ;;
    esac
    dir="$T/run-$w-$c-$v-$run"
    "$PY" "$WM" plan "$DOCS" "$w" "$c" "$REPEAT" "$dir" || die "plan failed"
    local -a args pids=()
    c0=$(cpu "$server")
    t0=$(date +%s%N)
    for ((i = 0; i < c; i++)); do
        args=()
        local n=0 name
        while read -r name; do
            args+=("http://127.0.0.1:$port/$name")
            if [ "$CHECK" = 1 ]; then args+=(-o "$dir/c$i/$n"); else args+=(-o /dev/null); fi
            n=$((n + 1))
        done <"$dir/list$i"
        mkdir -p "$dir/c$i"
        timeout 300 "$RHTTP" -q "${extra[@]}" get --scheme "$scheme" "${args[@]}" 2>"$dir/err$i" &
        pids+=($!)
    done
    local failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    t1=$(date +%s%N)
    c1=$(cpu "$server")
    if [ "$failed" = 1 ]; then
        tail -n 3 "$dir"/err* >&2
        die "$v: a client failed ($w, $c clients, run $run)"
    fi
    stats=$("$PY" "$WM" runstats "$DOCS" "$dir") || die "runstats failed"
    if [ "$CHECK" = 1 ]; then
        "$PY" "$WM" check "$DOCS" "$dir" >"$dir/check.out" || {
            cat "$dir/check.out" >&2; die "$v $w: SHA-256 mismatch"; }
        echo "check $v $w: $(tail -1 "$dir/check.out")"
    fi
    "$PY" - "$stats" "$w" "$c" "$v" "$run" "$t0" "$t1" "$c0" "$c1" "$CPU_METHOD" >>"$RES" <<'EOF' || die "bad run"
import json, sys
s = json.loads(sys.argv[1])
w, c, v, run, t0, t1, c0, c1, how = sys.argv[2:]
if s["errors"]:
    sys.exit(f"bench-web-many: {v} {w} {c} clients: " + "; ".join(s["errors"]))
if v.startswith(("sw-", "cr-")) and s["by_rdma"] + s["inline"] != s["requests"]:
    sys.exit(f"bench-web-many: {v}: {s['requests'] - s['by_rdma'] - s['inline']} requests neither by RDMA nor inline")
wall = (int(t1) - int(t0)) / 1e9
cpu = float(c1) - float(c0)
gb = s["bytes"] / 1e9
s.pop("errors")
s.update(test="many", workload=w, clients=int(c), variant=v, run=int(run), wall_s=round(wall, 4),
         mb_per_s=round(s["bytes"] / 1e6 / wall, 1), server_cpu_s=round(cpu, 4),
         cpu_s_per_gb=round(cpu / gb, 4), cpu_method=how)
print(json.dumps(s))
EOF
    tail -n 1 "$RES"
    [ "$CHECK" = 1 ] || rm -rf "$dir"
}

for w in $WORKLOADS; do
    for c in $CLIENTS; do
        for ((r = 1; r <= RUNS; r++)); do
            for v in $VARIANTS; do one "$w" "$c" "$v" "$r"; done
        done
    done
done
if [ "$CHECK" = 1 ]; then
    echo "bench-web-many --check: every body of every variant equal by SHA-256"
    exit 0
fi
"$PY" "$WM" report "$RES" "$OUT/web_many.md" "$PNG" || die "report failed"
{
    echo
    echo "Conditions: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), load average before the report $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD), server CPU by $CPU_METHOD; clients: $CLIENTS; runs $RUNS; repeat $REPEAT."
} >>"$OUT/web_many.md"
cat "$OUT/web_many.md"
echo "results: $RES, $OUT/web_many.md, $PNG"
