#!/usr/bin/env bash
# Tests of the transfer middleware (crates/rdma-xfer) and of rftpd/rftp
# (tools/rftp): loopback transfers over RDMA and TCP with 1 and 8 streams,
# curl, lftp and Python ftplib against rftpd, the fault cases (client or
# server killed mid-transfer, disk full, traversal, bad logins, ...), the
# interactive mode through stdin, the rftp-demo main job, the fault relay
# (crates/fault-relay) and transfers through it, hostile peers (a client dribbling or
# flooding before login, one login after the whole session memory budget,
# IPv4-mapped and IPv6 addresses, fake servers with an endless or dribbled
# reply or a PASV/RADR naming another host: tools/rftp/tests/hostile.rs),
# the documented config defaults, and one 1 GiB RDMA transfer verified by
# SHA-256.
#
#   scripts/test-rftp.sh             the default run (about 110 s + build)
#   RFTP_BIG=1 scripts/test-rftp.sh  also 1 GiB in every transfer case
#
# Environment:
#   SKIP_INSTALL=1   never install anything (a missing lftp only skips its test)
#   TEST_TIMEOUT=N   seconds allowed for the cargo test run (default 420)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
TEST_TIMEOUT="${TEST_TIMEOUT:-420}"

missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v lftp >/dev/null 2>&1 || missing+=(lftp)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ "${#missing[@]}" -gt 0 ] && [ "${SKIP_INSTALL:-0}" != 1 ]; then
    echo "== installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
for tool in curl python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "test-rftp: $tool is required" >&2; exit 1; }
done

echo "== cargo test (release) -p rdma-xfer -p rftp -p fault-relay"
timeout --kill-after=10 "$TEST_TIMEOUT" \
    cargo test --release -p rdma-xfer -p rftp -p fault-relay -- --test-threads=2
