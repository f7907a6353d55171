#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# The coherent cache in its topology (issue 13): 2 proxies and 2
# application servers (apache2 + mod_ccache + ccappd), each in its own
# network namespace on a bridge (scripts/cache-topo.sh), documents sharded
# over the application servers (doc % 2, ccproxy --shards), updates at a
# rate and compute threads on both servers, load by ccload:
#
#   - ccload's access-log parser: a generated WorldCup-98-shaped log with
#     malformed lines mixed in; they are counted and skipped;
#   - zero stale responses (and every body the served version) through
#     ccproxy in modes tcp, sockets and rdma, two proxies at once, and an
#     access-log replay;
#   - an application server killed mid-run (every process in its
#     namespace, SIGKILL): its documents get 502 (never a 200 after the
#     kill), the other server's still 200; it comes back and its
#     documents are served again, zero stale;
#   - a proxy restarted: it serves again, zero stale.
#
#   scripts/test-cache-topology.sh        # about 1-2 minutes
#   KEEP=1 scripts/test-cache-topology.sh # keep the temp dir (logs)
#
# Last line: "N passed, M failed"; exit status non-zero on failure, 77 if
# network namespaces cannot be made here.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
say() { echo "     $*"; }
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
T="$(mktemp -d /tmp/cache-topo.XXXXXX)"
chmod 755 "$T"
check() { # NAME CMD...: pass if CMD exits 0 (CMD is bounded by the caller)
    local name="$1"
    shift
    local log="$T/check-$((PASS + FAIL + 1)).log"
    if "$@" >"$log" 2>&1; then ok "$name"; else bad "$name (output below)"; tail -n 15 "$log" | sed 's/^/     /'; fi
}
finish() {
    echo "$PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

if [ "$(id -u)" != 0 ]; then echo "SKIPPED: needs root (network namespaces)"; exit 77; fi
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v apache2 >/dev/null || need+=(apache2)
command -v apxs >/dev/null || need+=(apache2-dev)
command -v curl >/dev/null || need+=(curl)
[ -x /usr/bin/python3 ] || need+=(python3)
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing ${need[*]}"
    timeout 300 apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${need[@]}" >/dev/null
fi
for c in ip apache2 apxs curl /usr/bin/python3; do
    command -v "$c" >/dev/null || { bad "prerequisite $c missing (apt-get install failed?)"; finish; }
done
TOPO="${TOPO:-cc13t}"
NET="${NET:-10.79.0}"
if ! ip netns add "$TOPO-probe" 2>/dev/null; then echo "SKIPPED: cannot create network namespaces here"; exit 77; fi
ip netns del "$TOPO-probe"

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if ! timeout 1800 cargo build --release -q -p ccache; then bad "cargo build -p ccache"; finish; fi
if ! timeout 300 make -s -C tools/ccache/apache >"$T/mod-build.log" 2>&1; then
    bad "mod_ccache build (apxs)"; cat "$T/mod-build.log"; finish; fi
LOAD="$TARGET/release/ccload"

# shellcheck source=scripts/cache-topo.sh disable=SC1091
. "$ROOT/scripts/cache-topo.sh"
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    topo_down
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

DOCS=16
RATE="${CACHE_UPDATE_RATE:-50}"
COMPUTE="${CACHE_COMPUTE_THREADS:-4}"

# ---- the access-log parser -----------------------------------------------------
check "ccload gen-log writes a WorldCup-98-shaped log with 25 malformed lines" \
    "$LOAD" gen-log --out "$T/wc98.log" --requests 20000 --urls 2000 --malformed 25
t_logstats() {
    local s
    s="$("$LOAD" log-stats --log "$T/wc98.log" --docs "$DOCS" 2>"$T/logstats.err")" || return 1
    echo "$s"
    cat "$T/logstats.err"
    /usr/bin/python3 -c 'import json,sys; s=json.loads(sys.argv[1]); assert s["lines"]==20000 and s["malformed"]==25 and s["replayed"]+s["skipped"]+25==20000 and s["replayed"]>18000, s' "$s" &&
        grep -q "malformed lines; skipped" "$T/logstats.err"
}
check "the log parser counts 25 malformed lines, warns, and replays the rest" t_logstats
t_nolog() {
    printf 'junk\nmore junk\n' >"$T/junk.log"
    ! "$LOAD" log-stats --log "$T/junk.log" 2>"$T/junk.err" && grep -q "nothing to replay" "$T/junk.err"
}
check "a log with no usable line is an error naming the cause" t_nolog

# ---- the topology ---------------------------------------------------------------
if topo_up 2 2; then ok "topology: 2 proxies, 2 application servers in namespaces $TOPO-*"; else
    bad "cannot build the topology"; finish; fi
start_server() { # J: apache2 and ccappd in a<J>
    start_appd "$1" "$DOCS" "$COMPUTE" --init-docs --doc-size 4096 \
        --update-rate "$RATE" --update-log "$T/a$1/updates.log" || return 1
    chmod -R a+rX "$T/a$1"
    start_apache "$1"
}
for j in 0 1; do
    if start_server "$j"; then ok "application server a$j: ccappd ($COMPUTE compute threads, $RATE updates/s) and apache2 + mod_ccache"; else
        bad "application server a$j did not start"; tail "$T/a$j/ccappd.log" "$T/a$j/logs/"*; finish; fi
done
write_shards 2 "$T/shards.conf"
port_of() { case "$1" in tcp) echo 8081 ;; sockets) echo 8082 ;; rdma) echo 8083 ;; esac; }
declare -A PX
for m in tcp sockets rdma; do
    if start_proxy 0 "$m" "$(port_of "$m")" "$T/shards.conf" --check-timeout-ms 2000; then
        PX[$m]=$PROXY_PID_LAST; ok "ccproxy --mode $m --shards in p0"; else
        bad "ccproxy $m did not start"; tail "$T/ccproxy-p0-$m.log"; finish; fi
done
if start_proxy 1 rdma 8083 "$T/shards.conf" --check-timeout-ms 2000; then ok "ccproxy --mode rdma --shards in p1"; else
    bad "ccproxy rdma in p1 did not start"; finish; fi
P0="$(addr_of p0)"
P1="$(addr_of p1)"
LOGS=(--update-log "$T/a0/updates.log" --update-log "$T/a1/updates.log")

t_shard_header() { # the document's version comes from its own shard's module
    local v
    v="$(in_ns cl curl -s -m 10 -D - -o /dev/null "http://$P0:8083/docs/3" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-cc-version"{print $2}')"
    [ -n "$v" ] && grep -q " 3 $v\$" "$T/a1/updates.log"
}
check "document 3 is served at a version of its shard's module (a1)" t_shard_header

cl_load() { in_ns cl timeout 300 "$LOAD" run "$@"; }
for m in tcp sockets rdma; do
    check "zero stale through p0 mode $m (4000 requests, Zipf, updates, compute load)" \
        cl_load --url "http://$P0:$(port_of "$m")/docs/" --docs "$DOCS" --zipf 0.8 --clients 8 --requests 4000 "${LOGS[@]}"
done
t_two_proxies() {
    cl_load --url "http://$P0:8083/docs/" --docs "$DOCS" --clients 4 --requests 3000 "${LOGS[@]}" --seed 7 >"$T/two-a.out" 2>&1 &
    local a=$!
    cl_load --url "http://$P1:8083/docs/" --docs "$DOCS" --clients 4 --requests 3000 "${LOGS[@]}" --seed 8 >"$T/two-b.out" 2>&1
    local rb=$?
    wait "$a"
    local ra=$?
    tail -n 2 "$T/two-a.out" "$T/two-b.out"
    [ "$ra" = 0 ] && [ "$rb" = 0 ]
}
check "zero stale through two proxies at once (rdma, 2 x 3000 requests)" t_two_proxies
check "zero stale replaying the access log (rdma, 5000 requests)" \
    cl_load --url "http://$P0:8083/docs/" --workload log --log "$T/wc98.log" --docs "$DOCS" --clients 8 --requests 5000 "${LOGS[@]}"

# The checker itself, end to end: a server that answers with snapshots
# taken a moment ago (whole documents, correctly labelled, but older than
# the updates committed since) must be caught as stale. The load starts on
# events, not after a fixed sleep (which a loaded machine outlasted: the
# server was not listening yet): the server takes its snapshots, waits
# (bounded) until the update logs hold a newer version of every document,
# listens, and only then writes the ready file the script waits for
# (bounded); it stops when the script writes the stop file.
t_checker_catches_stale() {
    local ready="$T/snap.ready" stop="$T/snap.stop"
    rm -f "$ready" "$stop"
    in_ns cl timeout 300 /usr/bin/python3 - "http://$P0:8083/docs/" "$DOCS" 19099 "$ready" "$stop" \
        "$T/a0/updates.log" "$T/a1/updates.log" <<'PY' &
import http.client, http.server, os, sys, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
docs, port, ready, stop, logs = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6:]
snap = {}
for d in range(docs):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("GET", f"{u.path}{d}")
    r = c.getresponse()
    snap[d] = (r.read(), r.getheader("X-CC-Version"))
def newest():  # the update logs: "<unix ns> <doc> <version>" lines
    v = {}
    for p in logs:
        for line in open(p):
            w = line.split()
            if len(w) == 3 and w[1].isdigit() and w[2].isdigit():
                v[int(w[1])] = max(v.get(int(w[1]), 0), int(w[2]))
    return v
end = time.time() + 120
while True:
    v = newest()
    old = [d for d in range(docs) if v.get(d, 0) <= int(snap[d][1])]
    if not old:
        break
    if time.time() > end:
        sys.exit(f"no update newer than the snapshot of documents {old} within 120 s")
    time.sleep(0.1)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body, v = snap[int(self.path.rsplit("/", 1)[1])]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-CC-Version", v)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)  # bound and listening
with open(ready + ".tmp", "w") as f:
    f.write(" ".join(f"{d}:{snap[d][1]}" for d in range(docs)) + "\n")
os.rename(ready + ".tmp", ready)
s.timeout = 0.2
end = time.time() + 240
while not os.path.exists(stop) and time.time() < end:
    s.handle_request()
PY
    local srv=$! t=0 out rc
    until [ -s "$ready" ]; do
        if ! kill -0 "$srv" 2>/dev/null || [ "$t" -ge 1500 ]; then
            echo "the snapshot server did not get ready (waited $((t / 10)) s)"
            : >"$stop"
            wait "$srv"
            return 1
        fi
        sleep 0.1
        t=$((t + 1))
    done
    echo "snapshots (doc:version), each older than a committed update: $(cat "$ready")"
    out="$(in_ns cl timeout 60 "$LOAD" run --url "http://127.0.0.1:19099/docs/" --docs "$DOCS" --zipf 0 --clients 2 --requests 400 "${LOGS[@]}" 2>&1)"
    rc=$?
    : >"$stop"
    wait "$srv" 2>/dev/null
    echo "$out"
    [ "$rc" = 1 ] && echo "$out" | tail -n 1 | /usr/bin/python3 -c 'import json,sys; s=json.loads(sys.stdin.read()); assert s["stale"] > 0 and s["bad_body"] == 0 and not s["pass"], s'
}
check "the stale checker catches a server answering with older snapshots" t_checker_catches_stale

# ---- an application server killed -----------------------------------------------
# The load runs 1.5 s, then a1 is killed; the load goes on for 2 s after
# a1 is gone (however long the kill took: under load it once took longer
# than a fixed 4 s run had left, and no request came after it), then
# SIGTERM ends it with its report (ccload's --duration is only a bound).
# $l is the background subshell; the load is its grandchild (ip netns exec
# execs timeout, which runs ccload): signal the two by their command line.
stop_load() { pkill -TERM -f -- "--records $T/kill.rec"; }
t_kill_midrun() {
    in_ns cl timeout 300 "$LOAD" run --url "http://$P0:8083/docs/" --docs "$DOCS" --zipf 0 --clients 8 --duration 120 \
        "${LOGS[@]}" --allow-status 502 --min-ok 0.2 --records "$T/kill.rec" >"$T/kill.out" 2>&1 &
    local l=$!
    sleep 1.5
    local t0 tk
    t0="$(date +%s%N)"
    kill_node a1 || { echo "a1 did not die"; stop_load; wait "$l"; return 1; }
    tk="$(date +%s%N)"
    echo "a1 killed in $(((tk - t0) / 1000000)) ms"
    sleep 2
    stop_load
    wait "$l"
    local rc=$?
    cat "$T/kill.out"
    # After the kill, odd documents (a1's) never get a 200; even ones still do.
    /usr/bin/python3 - "$T/kill.rec" "$tk" <<'PY' || return 1
import sys
tk = int(sys.argv[2])
odd200 = even200 = odd502 = 0
for line in open(sys.argv[1]):
    t0, doc, status = line.split()[:3]
    if int(t0) <= tk:
        continue
    doc, status = int(doc), int(status)
    if doc % 2 and status == 200: odd200 += 1
    if doc % 2 and status == 502: odd502 += 1
    if doc % 2 == 0 and status == 200: even200 += 1
print("after the kill: odd 200s", odd200, "odd 502s", odd502, "even 200s", even200)
assert odd200 == 0 and odd502 > 0 and even200 > 0
PY
    [ "$rc" = 0 ]
}
check "a1 killed mid-run: zero stale; after the kill its documents 502, a0's still 200" t_kill_midrun
t_after_kill() {
    local d s
    for d in 1 3 5 7; do
        s="$(in_ns cl curl -s -m 10 -o "$T/body" -w '%{http_code}' "http://$P0:8083/docs/$d")"
        [ "$s" = 502 ] || { echo "doc $d: $s"; return 1; }
        grep -q "version" "$T/body" && grep -q "^doc " "$T/body" && { echo "doc $d: a 502 with a document body"; return 1; }
        s="$(in_ns cl curl -s -m 10 -o /dev/null -w '%{http_code}' "http://$P0:8082/docs/$d")"
        [ "$s" = 502 ] || { echo "sockets doc $d: $s"; return 1; }
    done
    for d in 0 2 4; do
        s="$(in_ns cl curl -s -m 10 -o /dev/null -w '%{http_code}' "http://$P0:8083/docs/$d")"
        [ "$s" = 200 ] || { echo "doc $d: $s"; return 1; }
    done
}
check "with a1 down: its documents 502 without content (rdma, sockets), a0's 200" t_after_kill
if start_server 1; then ok "a1 restarted"; else bad "a1 did not restart"; tail "$T/a1/ccappd.log"; fi
# Recovery is not instantaneous: each of a proxy's checkers reconnects on
# its next check, and a reconnect racing ccappd's start can still fail
# (one 502). So: within 15 s, 8 requests in a row for a1's documents are
# 200; from then on only 200s.
t_recovers() { # MODE
    local s d i ok_run=0
    for i in $(seq 1 150); do
        d=$((2 * (i % 8) + 1))
        s="$(in_ns cl curl -s -m 5 -o /dev/null -w '%{http_code}' "http://$P0:$(port_of "$1")/docs/$d")"
        if [ "$s" = 200 ]; then ok_run=$((ok_run + 1)); else ok_run=0; sleep 0.1; fi
        [ "$ok_run" -ge 8 ] && { echo "recovered after $i requests"; return 0; }
    done
    return 1
}
for m in rdma tcp sockets; do
    check "a1 back: p0 mode $m answers a1's documents again (8 x 200 in a row within 15 s)" t_recovers "$m"
    check "a1 back: p0 mode $m serves all documents, only 200s, zero stale" \
        cl_load --url "http://$P0:$(port_of "$m")/docs/" --docs "$DOCS" --zipf 0 --clients 4 --requests 1500 "${LOGS[@]}" --min-ok 1.0
done

# ---- a proxy restarted --------------------------------------------------------------
kill -TERM "${PX[rdma]}" 2>/dev/null
timeout 10 tail --pid="${PX[rdma]}" -f /dev/null 2>/dev/null || kill -KILL "${PX[rdma]}" 2>/dev/null
if start_proxy 0 rdma 8083 "$T/shards.conf" --check-timeout-ms 2000; then ok "p0's rdma proxy restarted"; else bad "p0's rdma proxy did not restart"; fi
check "restarted proxy: zero stale (2000 requests)" \
    cl_load --url "http://$P0:8083/docs/" --docs "$DOCS" --clients 8 --requests 2000 "${LOGS[@]}" --min-ok 1.0
finish
