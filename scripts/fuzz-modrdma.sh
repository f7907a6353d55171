#!/usr/bin/env bash
# Fuzz mod_rdma's RDMA: header grammar (modules/mod_rdma/rdma_header.c)
# with libFuzzer under AddressSanitizer and UBSan.
#
#   scripts/fuzz-modrdma.sh                 FUZZ_SECONDS (default 15) of fuzzing
#   FUZZ_RUNS=10000000 scripts/fuzz-modrdma.sh   a fixed number of executions
#
# Installs clang and the APR headers (Debian packages) if missing. New
# inputs go to a scratch directory; the committed corpus
# (modules/mod_rdma/fuzz/corpus) is only read. Exits non-zero on a crash
# (the reproducer is kept in modules/mod_rdma/fuzz/artifacts/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/modules/mod_rdma"
FUZZ_SECONDS="${FUZZ_SECONDS:-15}"
CC_FUZZ=""
for c in clang clang-14 clang-15 clang-16; do
    if command -v "$c" >/dev/null; then CC_FUZZ="$c"; break; fi
done
pkgs=()
[ -n "$CC_FUZZ" ] || pkgs+=(clang)
# libFuzzer and the sanitizer runtimes ship apart from the compiler.
compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a' >/dev/null ||
    pkgs+=(libclang-rt-dev)
[ -f /usr/include/apr-1.0/apr_pools.h ] || pkgs+=(libapr1-dev)
if ((${#pkgs[@]})); then
    echo "fuzz-modrdma: installing ${pkgs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
    CC_FUZZ=clang
fi
bin="$DIR/fuzz/rdma_header_fuzz"
"$CC_FUZZ" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -D_GNU_SOURCE -I/usr/include/apr-1.0 \
    "$DIR/rdma_header.c" "$DIR/fuzz/rdma_header_fuzz.c" -lapr-1 -o "$bin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIR/fuzz/artifacts"
if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS")
else
    limit=(-max_total_time="$FUZZ_SECONDS")
fi
echo "fuzz-modrdma: $CC_FUZZ, ${limit[*]}"
"$bin" "$work" "$DIR/fuzz/corpus" "${limit[@]}" -max_len=512 -print_final_stats=1 \
    -artifact_prefix="$DIR/fuzz/artifacts/"
