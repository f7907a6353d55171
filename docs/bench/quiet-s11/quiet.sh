#!/usr/bin/env bash
# The lead's quiet re-take, session 11 (run as PARTS="modrdma wan-seed pingpong8 pingpong64 scale
# connrate", then PARTS="wan-ab50 ceiling wan-ab100"). NEW = main's release build, BASE = 8d7873c's.
set -u
cd /work/main || exit 1
NEW=/work/main/target/release
BASE=/work/ci-f/main/target/release
OUT=/work/notes/s11/quiet
log() { echo "=== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $*"; }
PARTS="${PARTS:-modrdma wan-seed pingpong8 pingpong64 scale connrate wan-ab50 ceiling wan-ab100}"
step() { local name=$1; shift; [[ " $PARTS " == *" $name "* ]] || return 0; log "$name"; "$@" > "$OUT/$name.txt" 2>&1; echo "rc $?" >> "$OUT/$name.txt"; tail -25 "$OUT/$name.txt"; }
lscpu | grep -E "Model name|Flags" > "$OUT/cpu.txt"

# issue 30: small GETs through rhttp (Z)
step modrdma env LOADS=0 SINGLE_ONLY=1 BENCH_SIZES="2K 4K 1M" ROUNDS=9 VARIANTS="curl plain sw-static sw-dynamic cr-dynamic" scripts/bench-modrdma.sh
# issue 27: 100 MB at 50 ms (W)
step wan-seed env BENCH_BIN=$NEW scripts/bench-wan.sh --seed --no-matrix --seed-rtt 50 --seed-sizes 100M --seed-tools "rftp-auto vsftpd" --n 5 --out $OUT/wan-seed-dir
step wan-ab50 env WANEM=$NEW/wanem docs/bench/wan-s10/ab-rftp.sh 50 0 100M 3 "$BASE|" "$NEW|"
# issue 29 item 3: 8-byte ping-pong and 64-byte sockets ping-pong (G2)
pp() { for i in 1 2 3 4 5; do for b in $BASE $NEW; do echo "bin $b"; setsid nice -n -15 $b/iwarp-perf --loopback --compare write_lat -s 8 -n 20000 --busy-poll --json | tail -2; done; done; }
step pingpong8 pp
rs() { local P=29571; for i in 1 2 3 4 5; do
    $NEW/iwarp-rstream -b 127.0.0.1 -p $P --json --design enhanced -S 64 -C 1 -I 20000 --tcp --busy-poll > /tmp/rs-srv.json 2>&1 &
    sleep 0.5
    setsid nice -n -15 $NEW/iwarp-rstream -s 127.0.0.1 -p $P --json --design enhanced -S 64 -C 1 -I 20000 --tcp --busy-poll | grep '"role"'
    wait; done; }
step pingpong64 rs
# issue 29 items 1-2 (G)
step scale env PAIRS=3 DURATION=2 QPS="16 256" ENGINES="pool threads" scripts/bench-scale.sh
step connrate env IWARP_PROGRESS=pool $NEW/iwarp-connrate -n 1000 -c 4 --pairs 3
step ceiling env ROUNDS=3 scripts/bench-ceiling.sh
# issue 27: 100 ms / 1 % (W)
step wan-ab100 env WANEM=$NEW/wanem docs/bench/wan-s10/ab-rftp.sh 100 1 256M 5 "$BASE|" "$NEW|"
log done
