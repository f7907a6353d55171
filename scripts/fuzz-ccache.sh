#!/usr/bin/env bash
# Fuzz mod_ccache's reading of ccappd's IPC reply (recv_all and
# decode_reply in tools/ccache/apache/mod_ccache.c, the C client of the
# frame in crates/ccache-proto/src/ipc.rs) with libFuzzer under
# AddressSanitizer and UBSan. Harness tools/ccache/apache/fuzz/ipc_fuzz.c
# (it includes mod_ccache.c, the httpd functions stubbed), seed corpus
# tools/ccache/apache/fuzz/corpus (written by fuzz/gen_corpus.py).
#
#   scripts/fuzz-ccache.sh                        FUZZ_SECONDS (default 15)
#   FUZZ_RUNS=10000000 scripts/fuzz-ccache.sh     a fixed number of executions
#
# Installs clang, libFuzzer and the httpd/APR headers (Debian packages) if
# missing. The binary is tools/ccache/apache/fuzz/ccache_ipc_fuzz (what
# scripts/fuzz-long.sh runs). New inputs go to a scratch directory; the
# committed corpus is only read. Exits non-zero on a crash (the reproducer
# is kept in tools/ccache/apache/fuzz/artifacts/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/tools/ccache/apache"
FUZZ_SECONDS="${FUZZ_SECONDS:-15}"
# shellcheck source=scripts/lib/clang-fuzz.sh
. "$ROOT/scripts/lib/clang-fuzz.sh"
# httpd.h and APR/APR-util (headers and the libraries to link).
clang_fuzz_setup fuzz-ccache /usr/include/apache2/httpd.h:apache2-dev \
    /usr/include/apr-1.0/apr_pools.h:libapr1-dev /usr/include/apr-1.0/apu.h:libaprutil1-dev
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIR/fuzz/artifacts" "$work/corpus"
if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS")
else
    limit=(-max_total_time="$FUZZ_SECONDS")
fi
bin="$DIR/fuzz/ccache_ipc_fuzz"
# -Wno-null-pointer-subtraction: APR's APR_OFFSET (apr_general.h), through
# APR_BRIGADE_SENTINEL in the module's output filter (as in sanitize.sh).
"$CC_FUZZ" -g -O1 "-fsanitize=fuzzer,address,undefined" -fno-sanitize-recover=undefined \
    -D_GNU_SOURCE -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function \
    -Wno-null-pointer-subtraction -Wno-unknown-warning-option \
    -Wno-missing-field-initializers -Wno-unused-parameter \
    -I/usr/include/apache2 -I/usr/include/apr-1.0 \
    "$DIR/fuzz/ipc_fuzz.c" -laprutil-1 -lapr-1 -o "$bin"
echo "fuzz-ccache: ipc: $CC_FUZZ, ${limit[*]}"
# A reply is 16 bytes; 64 leaves room for truncated and oversized streams.
"$bin" "$work/corpus" "$DIR/fuzz/corpus" "${limit[@]}" -max_len=64 -print_final_stats=1 \
    -artifact_prefix="$DIR/fuzz/artifacts/ipc-"
