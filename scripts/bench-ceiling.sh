#!/usr/bin/env bash
# The ceiling of this machine for a 2 GiB tmpfs-to-tmpfs get over loopback
# (issue 29's "rftp get >= 2x globus-url-copy -fast -p 8"): the least work
# any mover must do (read the file from tmpfs, move it through loopback
# TCP, write it to tmpfs, both ends on the same cores), timed in the same
# run as GridFTP and rftp. Movers, interleaved in every round:
#   splice       a C pair: sendfile(file -> socket), splice(socket -> pipe
#                -> file); no user-space copy at all (1 stream)
#   rw           the same pair with read/write through a 1 MiB user buffer
#                at each end (the copies a plain user-space mover makes)
#   gridftp-p8   globus-url-copy -fast -p 8 (issue 29's baseline)
#   gridftp-p1   globus-url-copy -fast (one stream)
#   rftp         rftp get, default (verified, XXH3-128 negotiated)
#   rftp-nv      rftp get --no-verify
# Each mover (with its server) runs in a cpuacct cgroup of its own, so the
# CPU seconds are those of both ends, kernel included (the loopback
# receive path runs in softirq context on the sender's CPU time). Prints
# one line per run and a summary: median wall seconds, median CPU-seconds
# per GiB, and per round the ratio of each mover's throughput to GridFTP
# -p 8's, with the least CPU/GiB bound: on C cores a mover that needs X
# CPU-s/GiB cannot take less than X * GiB / C seconds.
#
#   scripts/bench-ceiling.sh                  5 rounds, 2 GiB
#   ROUNDS=3 SIZE_MIB=1024 scripts/bench-ceiling.sh
#   MOVERS="splice rw gridftp-p8 rftp-nv" scripts/bench-ceiling.sh
#   LOG=FILE         also append every run's line to FILE
#   BENCH_BIN=DIR    rftp and rftpd from DIR (default target/release)
#   PORT_BASE=N      the movers' ports N..N+9 (default 25100)
#   PRIO (default -15): the run goes into a session of its own whose
#   autogroup nice and process nice are PRIO (as bench-scale.sh and
#   bench-verify.sh); "" runs as started.
#
# Needs root (cgroup v1 cpuacct at /sys/fs/cgroup/cpuacct, the autogroup
# nice), cc, python3, GridFTP (installed from Debian packages if
# missing) and a release build of rftp. Say the load average beside any
# figure; wall times at load > 4 are noise, the CPU-seconds much less so.
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PRIO="${PRIO--15}"
# shellcheck source=scripts/lib/boost.sh
source "$ROOT/scripts/lib/boost.sh"
boost_self bench-ceiling "$@"
BIN="${BENCH_BIN:-$ROOT/target/release}"
ROUNDS="${ROUNDS:-5}"
SIZE_MIB="${SIZE_MIB:-2048}"
MOVERS="${MOVERS:-splice rw gridftp-p8 gridftp-p1 rftp rftp-nv}"
PORT_BASE="${PORT_BASE:-25100}"
CG=/sys/fs/cgroup/cpuacct
[[ -w "$CG" ]] || { echo "bench-ceiling: $CG is not writable: run as root on a host with cgroup v1 cpuacct" >&2; exit 1; }
command -v cc >/dev/null || { echo "bench-ceiling: cc missing: apt-get install gcc" >&2; exit 1; }
missing=()
command -v globus-gridftp-server >/dev/null 2>&1 || missing+=(globus-gridftp-server-progs)
command -v globus-url-copy >/dev/null 2>&1 || missing+=(globus-gass-copy-progs)
if ((${#missing[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if [ ! -x "$BIN/rftp" ] || [ ! -x "$BIN/rftpd" ]; then (cd "$ROOT" && cargo build --release -p rftp); fi

TMP=$(mktemp -d /dev/shm/bench-ceiling.XXXXXX)
PIDS=()
GROUPS_MADE=()
cleanup() {
    # $! of a backgrounded in_group is a subshell, not the server: the
    # servers are found by their groups, which hold only what this script
    # started.
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for g in "${GROUPS_MADE[@]}"; do
        while read -r p; do kill "$p" 2>/dev/null || true; done <"$g/cgroup.procs"
    done
    wait 2>/dev/null || true
    for g in "${GROUPS_MADE[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$g" 2>/dev/null && break; sleep 0.2; done
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

cat >"$TMP/mover.c" <<'EOF'
/* The least a mover does: mover recv PORT OUT splice|rw, mover send PORT IN splice|rw. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#define CHUNK (1 << 20)
static void die(const char *what) { perror(what); exit(1); }
int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: mover recv|send PORT FILE splice|rw\n"); return 2; }
    int recv_side = !strcmp(argv[1], "recv"), splice_mode = !strcmp(argv[4], "splice");
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    static char buf[CHUNK];
    if (recv_side) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) die("bind/listen");
        printf("ready\n"); fflush(stdout);
        int s = accept(l, 0, 0), f = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (s < 0 || f < 0) die("accept/open");
        if (splice_mode) {
            int p[2];
            if (pipe(p)) die("pipe");
            fcntl(p[1], F_SETPIPE_SZ, CHUNK);
            for (;;) {
                ssize_t n = splice(s, 0, p[1], 0, CHUNK, SPLICE_F_MOVE | SPLICE_F_MORE);
                if (n < 0) die("splice in");
                if (n == 0) break;
                while (n > 0) {
                    ssize_t m = splice(p[0], 0, f, 0, n, SPLICE_F_MOVE);
                    if (m <= 0) die("splice out");
                    n -= m;
                }
            }
        } else {
            for (;;) {
                ssize_t n = read(s, buf, CHUNK);
                if (n < 0) die("read");
                if (n == 0) break;
                for (ssize_t o = 0; o < n;) {
                    ssize_t m = write(f, buf + o, n - o);
                    if (m <= 0) die("write");
                    o += m;
                }
            }
        }
        if (close(f)) die("close");
        return 0;
    }
    int s = socket(AF_INET, SOCK_STREAM, 0), f = open(argv[3], O_RDONLY);
    if (s < 0 || f < 0 || connect(s, (void *)&a, sizeof a)) die("connect/open");
    struct stat st;
    fstat(f, &st);
    if (splice_mode) {
        off_t off = 0;
        while (off < st.st_size)
            if (sendfile(s, f, &off, CHUNK) <= 0) die("sendfile");
    } else {
        for (;;) {
            ssize_t n = read(f, buf, CHUNK);
            if (n < 0) die("read");
            if (n == 0) break;
            for (ssize_t o = 0; o < n;) {
                ssize_t m = write(s, buf + o, n - o);
                if (m <= 0) die("write");
                o += m;
            }
        }
    }
    return 0;
}
EOF
cc -O2 -o "$TMP/mover" "$TMP/mover.c"

mkdir -p "$TMP/src" "$TMP/dst"
chmod 777 "$TMP" "$TMP/src" "$TMP/dst"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$TMP/src/file.bin"
chmod 644 "$TMP/src/file.bin"

# A cpuacct group per mover: g11ceil-NAME-$$ (servers started inside it
# are counted with their client).
group() {
    local g="$CG/bench-ceiling-$1-$$"
    if [[ ! -d "$g" ]]; then
        mkdir "$g"
        GROUPS_MADE+=("$g")
    fi
    echo "$g"
}
# in_group NAME CMD...: CMD (in the background or not, as called) inside NAME's group.
in_group() {
    local g
    g=$(group "$1")
    shift
    sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$g" "$@"
}
usage_ns() { cat "$(group "$1")/cpuacct.usage"; }
# Made here, not in the $(...) subshells, so that cleanup knows them.
for g in splice rw gridftp rftp; do group "$g" >/dev/null; done

rport=$((PORT_BASE + 1))
cat >"$TMP/rftpd.toml" <<CONF
listen = "127.0.0.1:$rport"
root = "$TMP"
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
CONF
gport=$((PORT_BASE + 2))
if [[ " $MOVERS " == *" rftp"* ]]; then
    RUST_LOG=warn in_group rftp "$BIN/rftpd" -c "$TMP/rftpd.toml" >"$TMP/rftpd.log" 2>&1 &
    PIDS+=($!)
    # rftp and rftp-nv share the server; their CPU is the group's delta.
fi
if [[ " $MOVERS " == *" gridftp"* ]]; then
    in_group gridftp globus-gridftp-server -aa -anonymous-user nobody -p "$gport" -control-interface 127.0.0.1 \
        -data-interface 127.0.0.1 -d error >"$TMP/gftp.log" 2>&1 &
    PIDS+=($!)
fi
sleep 1
R="ftp://bench:bench@127.0.0.1:$rport"
G="ftp://127.0.0.1:$gport"

# (iperf3 -F is no mover: its server writes only what arrived before the
# test's end, 251 of 256 MiB in a trial, so it is left out.)
# run NAME: one transfer of the mover NAME; appends "NAME round wall cpu" to $TMP/runs.
run() {
    local name="$1" round="$2" grp t0 t1 c0 c1 rp
    grp="$name"
    [[ "$name" == rftp* ]] && grp=rftp
    [[ "$name" == gridftp* ]] && grp=gridftp
    rm -f "$TMP/dst/"*
    sync
    c0=$(usage_ns "$grp")
    case "$name" in
    splice | rw)
        rp=$((PORT_BASE + 3))
        # The last run's "ready" must not be taken for this receiver's.
        rm -f "$TMP/recv.out"
        in_group "$grp" "$TMP/mover" recv "$rp" "$TMP/dst/file.bin" "$name" >"$TMP/recv.out" &
        local recv=$!
        for _ in $(seq 1 500); do grep -q ready "$TMP/recv.out" 2>/dev/null && break; sleep 0.01; done
        t0=$(date +%s.%N)
        in_group "$grp" "$TMP/mover" send "$rp" "$TMP/src/file.bin" "$name"
        wait "$recv"
        ;;
    gridftp-p8)
        t0=$(date +%s.%N)
        in_group "$grp" globus-url-copy -fast -p 8 "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin" >"$TMP/last.log" 2>&1 || true
        ;;
    gridftp-p1)
        t0=$(date +%s.%N)
        in_group "$grp" globus-url-copy -fast "$G$TMP/src/file.bin" "file://$TMP/dst/file.bin" >"$TMP/last.log" 2>&1 || true
        ;;
    rftp)
        t0=$(date +%s.%N)
        in_group "$grp" "$BIN/rftp" get -q --no-resume "$R/src/file.bin" -o "$TMP/dst/file.bin" >"$TMP/last.log" 2>&1 || true
        ;;
    rftp-nv)
        t0=$(date +%s.%N)
        in_group "$grp" "$BIN/rftp" get -q --no-resume --no-verify "$R/src/file.bin" -o "$TMP/dst/file.bin" >"$TMP/last.log" 2>&1 || true
        ;;
    *) echo "bench-ceiling: unknown mover $name" >&2; exit 2 ;;
    esac
    t1=$(date +%s.%N)
    c1=$(usage_ns "$grp")
    local got
    got=$(stat -c %s "$TMP/dst/file.bin" 2>/dev/null || echo 0)
    if [[ "$got" != "$((SIZE_MIB << 20))" ]]; then
        echo "FAILED: $name moved $got bytes, not $((SIZE_MIB << 20))" >&2
        cat "$TMP/last.log" "$TMP/rftpd.log" 2>/dev/null | tail -20 >&2
        exit 1
    fi
    local line
    line="$name $round $(echo "$t1 - $t0" | bc) $(echo "scale=3; ($c1 - $c0) / 1000000000" | bc)"
    echo "$line load $(cut -d' ' -f1 /proc/loadavg)"
    echo "$line" >>"$TMP/runs"
    [[ -n "${LOG:-}" ]] && echo "$line" >>"$LOG"
    return 0
}

echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ${SIZE_MIB} MiB tmpfs to tmpfs over loopback, $ROUNDS interleaved rounds, PRIO ${PRIO:-none}; columns: mover round wall-s cpu-s"
for m in $MOVERS; do run "$m" 0 >/dev/null; done # warm-up: page cache, servers
for i in $(seq 1 "$ROUNDS"); do
    order="$MOVERS"
    ((i % 2 == 0)) && order=$(echo "$MOVERS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for m in $order; do run "$m" "$i"; done
done
python3 - "$TMP/runs" "$SIZE_MIB" "$(nproc)" "$MOVERS" <<'PY'
import statistics, sys
runs, mib, cores, movers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
gib = mib / 1024
t, c = {}, {}
for line in open(runs):
    name, i, w, cpu = line.split()
    if int(i) == 0:
        continue  # the warm-up round
    t.setdefault(name, {})[int(i)] = float(w)
    c.setdefault(name, {})[int(i)] = float(cpu)
print(f"== summary, load average now {open('/proc/loadavg').read().split()[0]}")
print(f"| mover | wall s (median) | MiB/s | CPU-s per GiB (median, range) | least wall on {cores} cores | / GridFTP -p 8 (median of rounds, range) |")
print("|---|---:|---:|---:|---:|---:|")
base = t.get("gridftp-p8")
for m in movers:
    if m not in t:
        continue
    w = statistics.median(t[m].values())
    cpg = [v / gib for v in c[m].values()]
    cm = statistics.median(cpg)
    vs = "n/a"
    if base:
        r = [base[i] / t[m][i] for i in t[m] if i in base]
        vs = f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
    print(f"| {m} | {w:.2f} | {mib / w:.0f} | {cm:.3f} ({min(cpg):.3f}-{max(cpg):.3f}) | {cm * gib / cores:.2f} | {vs} |")
if base:
    g = statistics.median(base.values())
    print(f"2x GridFTP -p 8 means {g / 2:.2f} s for {gib:g} GiB: a mover needs <= {g / 2 * cores / gib:.3f} CPU-s per GiB on {cores} busy cores.")
PY
