#!/usr/bin/env bash
# The t_* functions are called through `check`, which shellcheck cannot see.
# shellcheck disable=SC2317
# Adaptive push-pull of the coherent cache (issue 13 part 4) end to end on
# 127.0.0.1:
#
#   ccappd --push-listen --push-policy push, updates at a rate on random
#     *accessed* documents (--update-select accessed)
#   Debian apache2 (prefork) + mod_ccache serving /docs/<n>
#   two ccproxy registered for pushes: "rd" validates by RDMA Read and
#     lets ccappd RDMA-Read its cache state region (--state-rdma-listen);
#     "tc" validates over TCP and is asked for its state over the push
#     channel
#   scripts/cache-load.py on both while updates and pushes run: fails on
#     any stale response and on any body that is not the served version
#   the proxies' counters (/_ccproxy/stats): pushes stored and served
#   ccupdate --select accessed
#   the access token: ccappd creates it (mode 600), the proxies read it; a
#     proxy without one refuses to start (naming --token-file and
#     --insecure-no-token); a proxy with another token is refused (502,
#     "access denied" in both logs)
#   faults: ccappd killed during pushes (proxies stay up, answer 502, then
#     register again and are pushed to after the restart, zero stale); a
#     fake ccappd (Python) that sends the real ccproxy a malformed frame, a
#     push for a document it does not have, and half a push before dying
#
#   scripts/test-cache-push.sh           # about 1-2 minutes
#   KEEP=1 scripts/test-cache-push.sh    # keep the temp dir (logs)
#
# Last line: "N passed, M failed"; exit status non-zero on failure.
set -uo pipefail

T="$(mktemp -d /tmp/cache-push.XXXXXX)"
# shellcheck source=scripts/cache-push-common.sh
. "$(dirname "$0")/cache-push-common.sh"
cd "$ROOT" || exit 1
PASS=0
FAIL=0
DOCS=32
RATE="${CACHE_UPDATE_RATE:-20}"
LOAD=(timeout 600 /usr/bin/python3 "$ROOT/scripts/cache-load.py")

cleanup() {
    cp_cleanup
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
check() {
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

if ! cp_prereqs; then bad "prerequisites"; finish; fi
cp_layout
P_RD=$(cp_free_port)
P_TC=$(cp_free_port)
P_STATE=$(cp_free_port)
P_FAKE=$(cp_free_port)
P_FX=$(cp_free_port)
P_NT=$(cp_free_port)

APPD_ARGS=(--docs "$DOCS" --doc-size 4096 --push-policy push --update-rate "$RATE" --update-select accessed)
if cp_start_appd "${APPD_ARGS[@]}"; then ok "ccappd starts with --push-listen, policy push, $RATE updates/s on accessed documents"; else
    bad "ccappd did not start"; cat "$T/ccappd.log"; finish; fi
if cp_start_apache; then ok "apache2 + mod_ccache starts"; else
    bad "apache2 did not start"; cat "$T/logs/apache-stdout.log" "$T/logs/error.log" 2>/dev/null; finish; fi
if cp_start_proxy rd "$P_RD" --mode rdma --state-rdma-listen "127.0.0.1:$P_STATE"; then ok "ccproxy rd (rdma checks, state by RDMA Read) starts"; else
    bad "ccproxy rd did not start"; cat "$T/ccproxy-rd.log"; finish; fi
if cp_start_proxy tc "$P_TC" --mode tcp; then ok "ccproxy tc (tcp checks, state over the channel) starts"; else
    bad "ccproxy tc did not start"; cat "$T/ccproxy-tc.log"; finish; fi
check "both proxies register with ccappd" cp_registered 2

# ---- the access token (issue 26 item 4) ---------------------------------------
t_token_file() { # ccappd made the token file, readable by its owner only
    [ "$(stat -c %a "$T/token")" = 600 ] && [ "$(tr -d '\n' <"$T/token" | wc -c)" = 64 ]
}
check "ccappd created the access token file (mode 600, 64 hex digits)" t_token_file
t_no_token() { # a proxy without a token refuses to start, naming the cause and the fixes
    local rc=0 out
    out=$(timeout 20 "$PROXY" --listen "127.0.0.1:$P_NT" --backend "127.0.0.1:$P_HTTP" --prefix /docs/ \
        --mode rdma --appd-rdma "127.0.0.1:$P_RDMA" --push-appd "127.0.0.1:$P_PUSH" 2>&1) || rc=$?
    echo "$out"
    echo "exit status: $rc"
    # 1: it refused; 124 would be timeout(1): it started.
    [ "$rc" = 1 ] || return 1
    for want in 'no access token' '--token-file PATH' '--insecure-no-token' '/var/lib/ccappd/token'; do
        grep -qF -- "$want" <<<"$out" || { echo "missing: $want"; return 1; }
    done
}
check "a proxy without a token refuses to start: the message names the token file, --token-file and --insecure-no-token" t_no_token
t_wrong_token() { # a proxy with another token: its RDMA checks and its registration are refused
    (umask 077 && /usr/bin/python3 -c 'import secrets; print(secrets.token_hex(32))' >"$T/other-token")
    "$PROXY" --listen "127.0.0.1:$P_NT" --backend "127.0.0.1:$P_HTTP" --prefix /docs/ --mode rdma \
        --appd-rdma "127.0.0.1:$P_RDMA" --push-appd "127.0.0.1:$P_PUSH" --check-timeout-ms 1000 \
        --token-file "$T/other-token" >>"$T/ccproxy-nt.log" 2>&1 &
    local px=$! code=none
    # Not in PX_PIDS: this proxy is stopped here, the others must live on.
    if cp_wait_port "$P_NT" "$px"; then
        code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$P_NT/docs/1")
    fi
    kill "$px"
    wait "$px" 2>/dev/null
    echo "status with another token: $code"
    [ "$code" = 502 ] || return 1
    grep 'access denied' "$T/ccproxy-nt.log" | head -3
    grep -q 'refused the connection: access denied' "$T/ccproxy-nt.log" || return 1
    grep -q 'RDMA connection refused: access denied' "$T/ccappd.log"
}
check "a proxy with another token: 502, its RDMA check refused (access denied)" t_wrong_token

url() { echo "http://127.0.0.1:$1/docs/"; }
t_load() { # $1 name, $2 port, $3 requests
    "${LOAD[@]}" run --url "$(url "$2")" --docs "$DOCS" --requests "$3" --threads 6 \
        --update-log "$T/updates.log" | sed "s/^/$1: /"
}
t_pushed() { # $1 port: pushes were stored and served (a fast load may end
    # before a push lands: then more requests, at most 10 rounds of 0.5 s)
    local s _
    for _ in $(seq 1 10); do
        s=$(cp_stats "$1") || return 1
        echo "$s"
        /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["pushes_stored"] > 0 and d["pushed_hits"] > 0 else 1)' "$s" && return 0
        sleep 0.5
        "${LOAD[@]}" run --url "$(url "$1")" --docs "$DOCS" --requests 300 --threads 2 \
            --update-log "$T/updates.log" >/dev/null || return 1
    done
    return 1
}
check "rd: load under updates and pushes, zero stale, every body its version" t_load rd "$P_RD" 5000
check "tc: load under updates and pushes, zero stale, every body its version" t_load tc "$P_TC" 5000
check "rd: pushes were stored and served (stats)" t_pushed "$P_RD"
cp_stats "$P_RD" | sed 's/^/rd stats: /'
check "tc: pushes were stored and served (stats)" t_pushed "$P_TC"
cp_stats "$P_TC" | sed 's/^/tc stats: /'
t_state_rdma() { # ccappd read rd's state by RDMA Read (it logs the connection)
    grep -q 'RDMA reader connected.*cache state' "$T/ccproxy-rd.log"
}
check "ccappd reads rd's state region by RDMA Read" t_state_rdma

t_ccupdate() {
    local before after
    before=$(wc -l <"$T/updates.log")
    timeout 60 "$UPDATE" --ipc "$IPC" --docroot "$T/docs" --docs "$DOCS" --doc-size 4096 \
        --rate 50 --count 20 --select accessed --log "$T/updates.log" || return 1
    after=$(wc -l <"$T/updates.log")
    echo "update log: $before -> $after lines"
    [ "$((after - before))" -ge 20 ]
}
check "ccupdate --select accessed commits 20 updates" t_ccupdate

# ---- fault: ccappd killed while pushes run --------------------------------------
t_kill_during_push() {
    "${LOAD[@]}" run --url "$(url "$P_RD")" --docs "$DOCS" --requests 4000 --threads 4 \
        --update-log "$T/updates.log" --min-ok 0 --allow-status 502 >"$T/kill-load.json" &
    local lp=$!
    sleep 1
    kill -KILL "$APPD_PID"
    local rc=0
    wait "$lp" || rc=1
    cat "$T/kill-load.json"
    return "$rc"
}
check "ccappd killed during pushes: the rd load sees zero stale (502s allowed)" t_kill_during_push
for p in $PX_PIDS; do
    kill -0 "$p" 2>/dev/null || bad "ccproxy pid $p died after ccappd was killed"
done
t_only502() {
    "${LOAD[@]}" expect --url "$(url "$1")" --docs "$DOCS" --requests 20 --threads 2 --status 502
}
check "ccappd dead: rd answers 502, never content" t_only502 "$P_RD"
check "ccappd dead: tc answers 502, never content" t_only502 "$P_TC"
STORED_RD=$(cp_stat "$P_RD" pushes_stored)
if cp_start_appd "${APPD_ARGS[@]}"; then ok "ccappd restarts"; else bad "ccappd did not restart"; tail "$T/ccappd.log"; finish; fi
check "both proxies register again with the restarted ccappd" cp_registered 4
check "rd after the restart: zero stale" t_load "rd after restart" "$P_RD" 2000
check "tc after the restart: zero stale" t_load "tc after restart" "$P_TC" 2000
t_pushes_resume() {
    local now
    now=$(cp_stat "$P_RD" pushes_stored) || return 1
    echo "rd pushes stored: $STORED_RD before the restart, $now now"
    [ "$now" -gt "$STORED_RD" ]
}
check "pushes to rd resume after the restart" t_pushes_resume

# ---- fault: a hostile or dying ccappd on the push channel ----------------------
# A Python stand-in for ccappd's push listener drives the real ccproxy.
cat >"$T/fake.py" <<'EOF'
import socket, struct, sys
port = int(sys.argv[1])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(4); l.settimeout(10)
def hdr(kind, doc=0, ver=0, blen=0, status=0):
    return b"CP\x01" + bytes([kind]) + struct.pack(">IQII", doc, ver, blen, status)
def recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: raise SystemExit(f"closed after {len(b)} of {n} bytes")
        b += c
    return b
def accept():
    s, _ = l.accept(); s.settimeout(10)
    h = recvn(s, 24)
    assert h[:4] == b"CP\x01\x01", f"not REGISTER: {h!r}"
    recvn(s, struct.unpack(">I", h[16:20])[0])
    s.sendall(hdr(2))
    return s
s = accept()
s.sendall(b"XP\x01\x03" + bytes(20))                 # malformed: bad magic
h = recvn(s, 24)
assert h[3] == 15 and struct.unpack(">I", h[20:24])[0] == 3, f"want ERROR(malformed), got {h!r}"
print("malformed frame: ERROR(malformed)")
s = accept()                                          # it registers again
s.sendall(hdr(3, doc=5, ver=99, blen=3) + b"abc")     # a document it does not have
h = recvn(s, 24)
assert h[3] == 4 and struct.unpack(">I", h[20:24])[0] == 2, f"want PUSH_ACK(not cached), got {h!r}"
print("push for an unknown document: PUSH_ACK(not cached)")
s.sendall(hdr(3, doc=5, ver=100, blen=1000) + b"x" * 10)  # half a push, then die
s.close()
s = accept()                                          # and it comes back again
print("registered again after a push cut short")
EOF
t_fake() {
    timeout 60 /usr/bin/python3 "$T/fake.py" "$P_FAKE" &
    local fp=$!
    sleep 0.3
    # --insecure-no-token: the fake speaks the channel without the token's
    # proofs (a proxy with a token leaves a REGISTERED that proves none).
    "$PROXY" --listen "127.0.0.1:$P_FX" --backend "127.0.0.1:$P_HTTP" --prefix /docs/ --mode tcp \
        --appd-tcp "127.0.0.1:$P_VER" --push-appd "127.0.0.1:$P_FAKE" --insecure-no-token >>"$T/ccproxy-fx.log" 2>&1 &
    local px=$!
    PX_PIDS="$PX_PIDS $px"
    wait "$fp" || return 1
    kill -0 "$px" || { echo "ccproxy died"; return 1; }
    local s
    s=$(cp_stats "$P_FX") || return 1
    echo "$s"
    # One push received (the unknown document), nothing stored.
    /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["pushes"] == 1 and d["pushes_not_cached"] == 1 and d["pushes_stored"] == 0 else 1)' "$s"
}
check "fake ccappd: malformed frame, push for an unknown document, half a push: errors, nothing stored, no crash" t_fake
check "that proxy still serves coherently" t_load fx "$P_FX" 300

echo "updates committed: $(wc -l <"$T/updates.log") log lines"
finish
