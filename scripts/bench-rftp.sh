#!/usr/bin/env bash
# The bash -c snippets expand $$ and $@ in the child on purpose.
# shellcheck disable=SC2016
# RFTP benchmark: rftp rget/rput (memory to memory, RDMA over software
# iWARP) side by side with GridFTP (globus-url-copy -fast -p N) and vsftpd
# + curl, in one run:
#   - over loopback (127.0.0.1), and over a veth pair between two network
#     namespaces this script creates (rftpA 10.213.0.1 <-> rftpB 10.213.0.2),
#     with 1 and 8 streams, both directions;
#   - throughput and CPU seconds per GB of both ends (cgroup cpuacct of
#     the server and of the client, which includes forked children);
#   - a file-to-file transfer from tmpfs verified by SHA-256 (10 GiB; 1 GiB
#     with BENCH_QUICK=1);
#   - a block-size x I/O-depth sweep with 1 stream through delay-bridge
#     adding 1.8 ms each way (3.6 ms RTT) between the namespaces.
# Results: docs/bench/rftp_results.json, rftp_sweep.json, rftp_summary.md,
# rftp_sweep.png (scripts/plot_rftp.py).
#
#   scripts/bench-rftp.sh                  full run (about 5-10 min)
#   BENCH_QUICK=1 scripts/bench-rftp.sh    quick run (under 3 min)
#
# Environment: BENCH_QUICK=1, SKIP_INSTALL=1 (never apt-get), NO_NETNS=1
# (loopback only), VETH_MTU=N (default 1500), BENCH_OUT=DIR (default
# docs/bench). Needs root for the
# namespaces and cgroups; everything it creates is removed at exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
OUT="${BENCH_OUT:-$ROOT/docs/bench}"
QUICK="${BENCH_QUICK:-0}"
if [ "$QUICK" = 1 ]; then
    MEM_SIZE=$((1 << 30)); FILE_SIZE=$((1 << 30)); SWEEP_MAX=$((256 << 20))
    SWEEP_BS=(262144 1048576 4194304); SWEEP_DEPTH=(1 4 16)
else
    MEM_SIZE=$((4 << 30)); FILE_SIZE=$((10 << 30)); SWEEP_MAX=$((1 << 30))
    SWEEP_BS=(65536 262144 1048576 4194304); SWEEP_DEPTH=(1 2 4 8 16 32)
fi
STEP_TIMEOUT=120
NSA=rftpA; NSB=rftpB
IPA=10.213.0.1; IPB=10.213.0.2
# 1.7 ms each way: with the relay's own latency (sleep overshoot,
# scheduling) the measured RTT comes to about 3.6-4 ms; the run reports it.
DELAY_MS="${DELAY_MS:-1.7}"
# veth MTU: 1500 is Ethernet's default; 9000 models jumbo frames. iWARP
# (MPA) sizes its FPDUs to the MSS, so the MTU matters more to rftp than
# to byte-stream FTP.
VETH_MTU="${VETH_MTU:-1500}"

die() { echo "bench-rftp: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, cgroups); run as root or with sudo"

# --- dependencies ------------------------------------------------------
missing=()
command -v globus-gridftp-server >/dev/null 2>&1 || missing+=(globus-gridftp-server-progs)
command -v globus-url-copy >/dev/null 2>&1 || missing+=(globus-gass-copy-progs)
command -v vsftpd >/dev/null 2>&1 || [ -x /usr/sbin/vsftpd ] || missing+=(vsftpd)
command -v curl >/dev/null 2>&1 || missing+=(curl)
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || missing+=(python3-matplotlib)
if [ "${#missing[@]}" -gt 0 ]; then
    [ "${SKIP_INSTALL:-0}" = 1 ] && die "missing ${missing[*]} and SKIP_INSTALL=1"
    echo "== installing ${missing[*]}"
    apt-get update -qq
    # policy-rc.d 101: do not start vsftpd as a system service.
    POLICY=/usr/sbin/policy-rc.d
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$POLICY"; chmod +x "$POLICY"; ADDED_POLICY=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    [ "${ADDED_POLICY:-0}" = 1 ] && rm -f "$POLICY"
fi
VSFTPD="$(command -v vsftpd || echo /usr/sbin/vsftpd)"

echo "== cargo build --release -p rftp -p fault-relay"
cargo build --release -q -p rftp -p fault-relay
BIN="$ROOT/target/release"

# --- state and cleanup -------------------------------------------------
TMP="$(mktemp -d -p /dev/shm)"
DISK_TMP="$(mktemp -d -p /var/tmp)"
PIDS=()
CGROUPS=()
NETNS_MADE=0
CG_V1=/sys/fs/cgroup/cpuacct
CG_V2=/sys/fs/cgroup/unified
if [ -w "$CG_V1" ] && [ -f "$CG_V1/cpuacct.usage" ]; then CGMODE=v1
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && [ -w /sys/fs/cgroup ]; then CGMODE=v2; CG_V2=/sys/fs/cgroup
elif [ -w "$CG_V2" ]; then CGMODE=v2
else CGMODE=none; echo "bench-rftp: no writable cgroup (cpuacct v1 or v2): CPU figures will be n/a" >&2
fi

cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    for cg in "${CGROUPS[@]}"; do
        # Anything still in it is ours: stop it, then remove the group.
        if [ -f "$cg/cgroup.procs" ]; then
            while read -r p; do kill -9 "$p" 2>/dev/null; done < "$cg/cgroup.procs"
            sleep 0.1; rmdir "$cg" 2>/dev/null
        fi
    done
    if [ "$NETNS_MADE" = 1 ]; then
        ip netns del "$NSA" 2>/dev/null; ip netns del "$NSB" 2>/dev/null
        rm -rf "/etc/netns/$NSA" "/etc/netns/$NSB"
        rmdir /etc/netns 2>/dev/null
    fi
    rm -rf "$TMP" "$DISK_TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cg_path() { if [ "$CGMODE" = v1 ]; then echo "$CG_V1/rftpbench_$1"; else echo "$CG_V2/rftpbench_$1"; fi; }
cg_make() {
    [ "$CGMODE" = none ] && return 0
    local d; d="$(cg_path "$1")"
    mkdir -p "$d"; CGROUPS+=("$d")
}
# CPU nanoseconds used so far by everything that ran in group $1.
cg_ns() {
    local d; d="$(cg_path "$1")"
    case "$CGMODE" in
        v1) cat "$d/cpuacct.usage" ;;
        v2) awk '/^usage_usec/ {print $2 * 1000}' "$d/cpu.stat" ;;
        *) echo 0 ;;
    esac
}
# run NS CG CMD...: run CMD in namespace NS ("" = this one) inside cgroup CG.
run() {
    local ns="$1" cg="$2"; shift 2
    local procs=/dev/null
    [ "$CGMODE" != none ] && procs="$(cg_path "$cg")/cgroup.procs"
    # Join the cgroup before entering the namespace: inside it, ip netns
    # exec mounts a fresh /sys without the cgroup hierarchy.
    if [ -n "$ns" ]; then
        bash -c 'echo $$ > "$0"; exec "$@"' "$procs" ip netns exec "$ns" "$@"
    else
        bash -c 'echo $$ > "$0"; exec "$@"' "$procs" "$@"
    fi
}
# start NS CG CMD...: run in the background, remembering the PID (the
# subshell execs, so the PID is the command's own).
start() {
    local ns="$1" cg="$2"; shift 2
    local procs=/dev/null
    [ "$CGMODE" != none ] && procs="$(cg_path "$cg")/cgroup.procs"
    if [ -n "$ns" ]; then
        exec bash -c 'echo $$ > "$0"; exec "$@"' "$procs" ip netns exec "$ns" "$@"
    else
        exec bash -c 'echo $$ > "$0"; exec "$@"' "$procs" "$@"
    fi
}
# Wait until TCP port $2 listens in namespace $1 (bounded).
wait_port() {
    local ns="$1" port="$2"
    for _ in $(seq 1 100); do
        if { [ -n "$ns" ] && ip netns exec "$ns" ss -ltn "sport = :$port" | grep -q LISTEN; } ||
           { [ -z "$ns" ] && ss -ltn "sport = :$port" | grep -q LISTEN; }; then return 0; fi
        sleep 0.1
    done
    die "nothing listens on port $port${ns:+ in $ns} after 10 s"
}
# Server ports from below the ephemeral range, distinct within this run
# (a port taken from bind(:0) and released can be taken by an outgoing
# connection or handed out twice before the server binds it).
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$TMP/ports.given"; }

for g in srv_rftp srv_gftp srv_vsftpd cli_rftp cli_gftp cli_curl; do cg_make "$g"; done

# --- network namespaces -------------------------------------------------
ENVS=(lo)
if [ "${NO_NETNS:-0}" != 1 ]; then
    for ns in "$NSA" "$NSB"; do
        ip netns list | grep -qw "$ns" && die "namespace $ns already exists (a previous run?); remove it: ip netns del $ns"
    done
    ip netns add "$NSA"; NETNS_MADE=1; ip netns add "$NSB"
    # Per-namespace /etc/hosts (ip netns exec bind-mounts it): GridFTP
    # resolves its own address and fails without an answer.
    # The host name maps to the namespace's own veth address.
    for ns in "$NSA" "$NSB"; do
        mkdir -p "/etc/netns/$ns"
        own="$IPA"; [ "$ns" = "$NSB" ] && own="$IPB"
        printf '127.0.0.1 localhost\n%s %s rftp-own.bench\n' "$own" "$(hostname)" > "/etc/netns/$ns/hosts"
    done
    ip link add rftp-a netns "$NSA" type veth peer name rftp-b netns "$NSB"
    ip -n "$NSA" addr add "$IPA/24" dev rftp-a
    ip -n "$NSB" addr add "$IPB/24" dev rftp-b
    for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
    ip -n "$NSA" link set rftp-a mtu "$VETH_MTU" up; ip -n "$NSB" link set rftp-b mtu "$VETH_MTU" up
    ENVS+=(veth)
fi

# --- data ---------------------------------------------------------------
DATA="$TMP/data"; mkdir -p "$DATA/up"
chmod 755 "$TMP" "$DATA"; chmod 777 "$DATA/up"
truncate -s "$MEM_SIZE" "$DATA/zero.bin"   # sparse: reads are memory only
chmod 644 "$DATA/zero.bin"

RESULTS="$TMP/results.jsonl"; : > "$RESULTS"
SWEEP="$TMP/sweep.jsonl"; : > "$SWEEP"

# measure ENV TOOL DIR STREAMS BYTES SRVCG CLICG NS CMD...
measure() {
    local env="$1" tool="$2" dir="$3" streams="$4" bytes="$5" scg="$6" ccg="$7" ns="$8"; shift 8
    local s0 c0 t0 t1 s1 c1 rc=0
    s0=$(cg_ns "$scg"); c0=$(cg_ns "$ccg"); t0=$(date +%s.%N)
    run "$ns" "$ccg" timeout "$STEP_TIMEOUT" "$@" > "$TMP/step.log" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    sleep 0.3   # let forked server children exit and be accounted
    s1=$(cg_ns "$scg"); c1=$(cg_ns "$ccg")
    if [ "$rc" != 0 ]; then
        echo "   $env $tool $dir x$streams: FAILED (exit $rc): $(tail -3 "$TMP/step.log" | tr '\n' ' ')"
        printf '{"env":"%s","tool":"%s","dir":"%s","streams":%s,"bytes":%s,"ok":false}\n' \
            "$env" "$tool" "$dir" "$streams" "$bytes" >> "$RESULTS"
        return 0
    fi
    python3 - "$env" "$tool" "$dir" "$streams" "$bytes" "$t0" "$t1" "$s0" "$s1" "$c0" "$c1" "$CGMODE" >> "$RESULTS" <<'EOF'
import json, sys
env, tool, d, streams, nbytes, t0, t1, s0, s1, c0, c1, cg = sys.argv[1:]
secs = float(t1) - float(t0); gb = int(nbytes) / 1e9
srv = (int(s1) - int(s0)) / 1e9; cli = (int(c1) - int(c0)) / 1e9
row = {"env": env, "tool": tool, "dir": d, "streams": int(streams), "bytes": int(nbytes),
       "ok": True, "secs": round(secs, 3), "gbps": round(int(nbytes) * 8 / secs / 1e9, 3),
       "cpu_server_s": round(srv, 3) if cg != "none" else None,
       "cpu_client_s": round(cli, 3) if cg != "none" else None,
       "cpu_s_per_gb": round((srv + cli) / gb, 3) if cg != "none" else None}
print(json.dumps(row))
EOF
    tail -1 "$RESULTS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-5s %-8s %-4s x%-2d %7.2f Gbit/s  %s CPU s/GB (both ends)" % (r["env"], r["tool"], r["dir"], r["streams"], r["gbps"], r["cpu_s_per_gb"]))'
}

# --- one environment: start the three servers, run every client ---------
bench_env() {
    local env="$1" sns="" cns="" host=127.0.0.1
    if [ "$env" = veth ]; then sns="$NSB"; cns="$NSA"; host="$IPB"; fi
    local rport gport vport
    rport=$(free_port); gport=$(free_port); vport=$(free_port)
    echo "== $env: servers on $host (rftpd :$rport, GridFTP :$gport, vsftpd :$vport)"

    cat > "$TMP/rftpd-$env.toml" <<EOF
listen = "$host:$rport"
root = "$DATA"
max_streams = 16
block_size = 4194304
iodepth = 64
max_mem_bytes = 1099511627776
session_mem_budget_bytes = 68719476736
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
EOF
    start "$sns" srv_rftp env RUST_LOG=warn "$BIN/rftpd" -c "$TMP/rftpd-$env.toml" > "$TMP/rftpd-$env.log" 2>&1 &
    PIDS+=($!)
    start "$sns" srv_gftp globus-gridftp-server -aa -anonymous-user nobody -p "$gport" \
        -control-interface "$host" -data-interface "$host" -d error > "$TMP/gftp-$env.log" 2>&1 &
    PIDS+=($!)
    cat > "$TMP/vsftpd-$env.conf" <<EOF
listen=YES
listen_ipv6=NO
listen_address=$host
listen_port=$vport
background=NO
anonymous_enable=YES
no_anon_password=YES
anon_root=$DATA
local_enable=NO
write_enable=NO
ftp_username=daemon
nopriv_user=nobody
pasv_enable=YES
pasv_address=$host
seccomp_sandbox=NO
secure_chroot_dir=$TMP/empty
xferlog_enable=NO
EOF
    mkdir -p "$TMP/empty"
    start "$sns" srv_vsftpd "$VSFTPD" "$TMP/vsftpd-$env.conf" > "$TMP/vsftpd-$env.log" 2>&1 &
    PIDS+=($!)
    wait_port "$sns" "$rport"; wait_port "$sns" "$gport"; wait_port "$sns" "$vport"

    local url="ftp://bench:bench@$host:$rport"
    for s in 1 8; do
        measure "$env" rftp get "$s" "$MEM_SIZE" srv_rftp cli_rftp "$cns" \
            "$BIN/rftp" get --mem "$MEM_SIZE" "$url/x" --streams "$s" -q
        measure "$env" rftp put "$s" "$MEM_SIZE" srv_rftp cli_rftp "$cns" \
            "$BIN/rftp" put --mem "$MEM_SIZE" "$url/x" --streams "$s" -q
        measure "$env" gridftp get "$s" "$MEM_SIZE" srv_gftp cli_gftp "$cns" \
            globus-url-copy -fast -p "$s" -len "$MEM_SIZE" "ftp://$host:$gport/dev/zero" file:///dev/null
        measure "$env" gridftp put "$s" "$MEM_SIZE" srv_gftp cli_gftp "$cns" \
            globus-url-copy -fast -p "$s" -len "$MEM_SIZE" file:///dev/zero "ftp://$host:$gport/dev/null"
    done
    measure "$env" vsftpd get 1 "$MEM_SIZE" srv_vsftpd cli_curl "$cns" \
        curl -sS --max-time "$STEP_TIMEOUT" -o /dev/null "ftp://$host:$vport/zero.bin"
}

for env in "${ENVS[@]}"; do bench_env "$env"; done

# --- file to file from tmpfs, SHA-256 verified ---------------------------
echo "== file to file: $((FILE_SIZE >> 20)) MiB from tmpfs, SHA-256 verified (rftp get, 8 streams, loopback)"
head -c "$FILE_SIZE" /dev/urandom > "$DATA/file.bin" 2>/dev/null ||
    die "cannot create the $((FILE_SIZE >> 20)) MiB test file in $DATA (tmpfs full?)"
chmod 644 "$DATA/file.bin"
LO_PORT=$(awk -F'[:"]' '/^listen/ {print $(NF-1)}' "$TMP/rftpd-lo.toml")
t0=$(date +%s.%N)
if timeout 600 "$BIN/rftp" get "ftp://bench:bench@127.0.0.1:$LO_PORT/file.bin" -o "$DISK_TMP/file.bin" \
        --streams 8 --checksum sha256 -q > "$TMP/file.log" 2>&1; then
    t1=$(date +%s.%N)
    cat "$TMP/file.log"
    want=$(sha256sum "$DATA/file.bin" | cut -d' ' -f1)
    got=$(sha256sum "$DISK_TMP/file.bin" | cut -d' ' -f1)
    verified=false; [ "$want" = "$got" ] && grep -q "SHA-256 verified: $want" "$TMP/file.log" && verified=true
    line=$(grep -o '[0-9.]* Gbit/s' "$TMP/file.log" | head -1)
    printf '{"file_bytes":%s,"sha256":"%s","verified":%s,"wall_s":%s,"rate":"%s","dest":"disk (/var/tmp)"}\n' \
        "$FILE_SIZE" "$want" "$verified" "$(python3 -c "print(round($t1-$t0,2))")" "$line" > "$TMP/file.json"
else
    cat "$TMP/file.log"
    printf '{"file_bytes":%s,"verified":false,"error":"rftp get failed"}\n' "$FILE_SIZE" > "$TMP/file.json"
fi
rm -f "$DATA/file.bin" "$DISK_TMP/file.bin"

# --- sweep: block size x I/O depth, 1 stream, 3.6 ms RTT ------------------
if [ "${NO_NETNS:-0}" != 1 ]; then
    echo "== sweep: block size x iodepth, 1 stream, $IPA <-> $IPB via delay-bridge ${DELAY_MS} ms each way"
    sport=$(free_port); xport=$(free_port); bport=$(free_port); bxport=$(free_port)
    cat > "$TMP/rftpd-sweep.toml" <<EOF
listen = "$IPB:$sport"
root = "$DATA"
max_streams = 16
block_size = 4194304
iodepth = 64
data_timeout_secs = 60
rdma_port = $xport
rdma_advertise = "127.0.0.1:$bxport"
[[users]]
name = "bench"
password = "bench"
EOF
    start "$NSB" srv_rftp env RUST_LOG=warn "$BIN/rftpd" -c "$TMP/rftpd-sweep.toml" > "$TMP/rftpd-sweep.log" 2>&1 &
    PIDS+=($!)
    wait_port "$NSB" "$sport"
    # A plain TCP sink in rftpB: the ceiling of one TCP stream through
    # the bridge, the line the sweep should reach.
    tport=$(free_port); btport=$(free_port)
    start "$NSB" srv_rftp /usr/bin/python3 -c '
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2]))); l.listen(4)
buf = bytearray(4 << 20)
while True:
    c, _ = l.accept()
    while c.recv_into(buf):
        pass
    c.close()
' "$IPB" "$tport" > /dev/null 2>&1 &
    PIDS+=($!)
    wait_port "$NSB" "$tport"
    start "$NSA" cli_rftp env RUST_LOG=warn "$BIN/delay-bridge" --delay-ms "$DELAY_MS" \
        --listen "127.0.0.1:$bport=$IPB:$sport" --listen "127.0.0.1:$bxport=$IPB:$xport" \
        --listen "127.0.0.1:$btport=$IPB:$tport" \
        > "$TMP/bridge.log" 2>&1 &
    PIDS+=($!)
    wait_port "$NSA" "$bport"; wait_port "$NSA" "$bxport"
    rtt=$(ip netns exec "$NSA" python3 - "$bport" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
f = s.makefile("rwb")
f.readline()
best = 1e9
for _ in range(5):
    t = time.perf_counter(); f.write(b"NOOP\r\n"); f.flush(); f.readline()
    best = min(best, time.perf_counter() - t)
print(round(best * 1e3, 2))
EOF
)
    echo "   measured control RTT through the bridge: ${rtt} ms"
    ceiling=$(ip netns exec "$NSA" timeout "$STEP_TIMEOUT" /usr/bin/python3 - "$btport" "$SWEEP_MAX" <<'EOF'
import socket, sys, time
port, total = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port), timeout=30)
buf = memoryview(bytearray(4 << 20)); sent = 0
t = time.perf_counter()
while sent < total:
    n = min(len(buf), total - sent); s.sendall(buf[:n]); sent += n
s.shutdown(socket.SHUT_WR); s.recv(1)
print(round(total * 8 / (time.perf_counter() - t) / 1e9, 3))
EOF
) || ceiling=null
    echo "   one plain TCP stream through the bridge: ${ceiling} Gbit/s"
    for bs in "${SWEEP_BS[@]}"; do
        for d in "${SWEEP_DEPTH[@]}"; do
            # Enough bytes for ~250 round trips at the window-limited rate.
            size=$(( bs * d * 250 )); [ "$size" -lt $((32 << 20)) ] && size=$((32 << 20))
            [ "$size" -gt "$SWEEP_MAX" ] && size=$SWEEP_MAX
            if run "$NSA" cli_rftp timeout "$STEP_TIMEOUT" "$BIN/rftp" get --mem "$size" \
                    "ftp://bench:bench@127.0.0.1:$bport/x" --streams 1 --block-size "$bs" --iodepth "$d" -q \
                    > "$TMP/sweep.log" 2>&1; then
                g=$(grep -o '[0-9.]* Gbit/s' "$TMP/sweep.log" | head -1 | cut -d' ' -f1)
                printf '{"block_size":%s,"iodepth":%s,"bytes":%s,"gbps":%s,"rtt_ms":%s,"window_limit_gbps":%s}\n' \
                    "$bs" "$d" "$size" "$g" "$rtt" \
                    "$(python3 -c "print(round($bs*$d*8/($rtt/1e3)/1e9,3))")" >> "$SWEEP"
                printf '   bs %8d depth %2d: %6s Gbit/s\n' "$bs" "$d" "$g"
            else
                echo "   bs $bs depth $d: FAILED: $(tail -2 "$TMP/sweep.log" | tr '\n' ' ')"
            fi
        done
    done
fi

# --- write results --------------------------------------------------------
mkdir -p "$OUT"
python3 - "$RESULTS" "$SWEEP" "$TMP/file.json" "$OUT" "$QUICK" "$CGMODE" "$MEM_SIZE" "${rtt:-}" "$DELAY_MS" "$VETH_MTU" "${ceiling:-null}" <<'EOF'
import json, os, platform, sys, time
res_p, sweep_p, file_p, out, quick, cgmode, mem, rtt, delay, mtu, ceiling = sys.argv[1:]
rows = [json.loads(l) for l in open(res_p) if l.strip()]
sweep = [json.loads(l) for l in open(sweep_p) if l.strip()]
filej = json.load(open(file_p)) if os.path.exists(file_p) else None
load = open("/proc/loadavg").read().split()[:3]
conds = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "host": platform.node(),
         "kernel": platform.release(), "cpus": os.cpu_count(), "loadavg_at_end": load,
         "quick": quick == "1", "mem_bytes": int(mem), "cpu_accounting": "cgroup " + cgmode,
         "sweep_rtt_ms": float(rtt) if rtt else None, "bridge_delay_ms_each_way": float(delay),
         "veth_mtu": int(mtu), "bridge_tcp_ceiling_gbps": json.loads(ceiling)}
json.dump({"conditions": conds, "rows": rows, "file_to_file": filej}, open(f"{out}/rftp_results.json", "w"), indent=1)
json.dump({"conditions": conds, "points": sweep}, open(f"{out}/rftp_sweep.json", "w"), indent=1)
def get(env, tool, d, s):
    for r in rows:
        if (r["env"], r["tool"], r["dir"], r["streams"]) == (env, tool, d, s) and r.get("ok"):
            return r
L = ["# RFTP benchmark results", "",
     f"Generated by `scripts/bench-rftp.sh` on {conds['date_utc']} UTC ({conds['cpus']} CPUs, kernel {conds['kernel']}, "
     f"load average at the end {' '.join(load)}; {'BENCH_QUICK' if quick == '1' else 'full'} run, "
     f"{int(mem) >> 20} MiB per memory-to-memory transfer; veth MTU {mtu}; CPU from {conds['cpu_accounting']}, server and client summed; "
     "throughput is bytes over the client command's wall time, connection setup included, for every tool).", "",
     "| env | streams | dir | rftp Gbit/s | GridFTP Gbit/s | ratio (≥1.2) | rftp CPU s/GB | GridFTP CPU s/GB | ratio (≤0.8) | verdict |",
     "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for env in ("lo", "veth"):
    for s in (1, 8):
        for d in ("get", "put"):
            a, b = get(env, "rftp", d, s), get(env, "gridftp", d, s)
            if not a and not b:
                continue
            f = lambda r, k: (f"{r[k]:.2f}" if r and r.get(k) is not None else "n/a")
            tr = a["gbps"] / b["gbps"] if a and b else None
            cr = a["cpu_s_per_gb"] / b["cpu_s_per_gb"] if a and b and a.get("cpu_s_per_gb") and b.get("cpu_s_per_gb") else None
            ok = tr is not None and cr is not None and tr >= 1.2 and cr <= 0.8
            L.append(f"| {env} | {s} | {'rget' if d == 'get' else 'rput'} | {f(a,'gbps')} | {f(b,'gbps')} | "
                     f"{'n/a' if tr is None else f'{tr:.2f}'} | {f(a,'cpu_s_per_gb')} | {f(b,'cpu_s_per_gb')} | "
                     f"{'n/a' if cr is None else f'{cr:.2f}'} | {'met' if ok else 'NOT met'} |")
L += ["", "vsftpd + curl (download, 1 connection):", ""]
for env in ("lo", "veth"):
    r = get(env, "vsftpd", "get", 1)
    if r:
        L.append(f"- {env}: {r['gbps']:.2f} Gbit/s, {r['cpu_s_per_gb']} CPU s/GB")
if filej:
    L += ["", f"File to file ({filej['file_bytes'] >> 20} MiB, tmpfs → {filej.get('dest','?')}, rftp get x8): "
          f"{'SHA-256 verified ' + filej.get('sha256','') if filej.get('verified') else 'NOT verified: ' + filej.get('error','hash mismatch')}"
          + (f", {filej.get('rate')} transfer, {filej.get('wall_s')} s wall with both hashes" if filej.get('verified') else "")]
if sweep:
    L += ["", f"Sweep (1 stream, memory to memory, control RTT through delay-bridge {rtt} ms; "
          f"one plain TCP stream through the same bridge: {json.loads(ceiling)} Gbit/s):", "",
          "| block size | iodepth | Gbit/s | window bs×depth/RTT Gbit/s |", "| --- | --- | --- | --- |"]
    for p in sweep:
        L.append(f"| {p['block_size'] >> 10} KiB | {p['iodepth']} | {p['gbps']} | {p['window_limit_gbps']} |")
open(f"{out}/rftp_summary.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
if [ -s "$SWEEP" ]; then
    /usr/bin/python3 "$ROOT/scripts/plot_rftp.py" "$OUT/rftp_sweep.json" "$OUT/rftp_sweep.png"
fi
echo "== wrote $OUT/rftp_results.json rftp_sweep.json rftp_summary.md rftp_sweep.png"
