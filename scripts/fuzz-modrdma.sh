#!/usr/bin/env bash
# Fuzz mod_rdma's parsers of untrusted input with libFuzzer under
# AddressSanitizer and UBSan, one harness after the other:
#  - rdma_header: the RDMA: header grammar (modules/mod_rdma/rdma_header.c),
#    corpus modules/mod_rdma/fuzz/corpus;
#  - ctrl: the control-message decoder (modules/mod_rdma/wire.c, what
#    conn.c runs on every message from the client), corpus
#    modules/mod_rdma/fuzz/ctrl_corpus.
#
#   scripts/fuzz-modrdma.sh                 FUZZ_SECONDS (default 15) per harness
#   FUZZ_RUNS=10000000 scripts/fuzz-modrdma.sh   a fixed number of executions each
#   FUZZ_TARGETS=ctrl scripts/fuzz-modrdma.sh    only these harnesses
#
# Installs clang and the APR headers (Debian packages) if missing. New
# inputs go to a scratch directory; the committed corpora are only read.
# Exits non-zero on a crash (the reproducer is kept in
# modules/mod_rdma/fuzz/artifacts/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/modules/mod_rdma"
FUZZ_SECONDS="${FUZZ_SECONDS:-15}"
# shellcheck source=scripts/lib/clang-fuzz.sh
. "$ROOT/scripts/lib/clang-fuzz.sh"
clang_fuzz_setup fuzz-modrdma /usr/include/apr-1.0/apr_pools.h:libapr1-dev
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIR/fuzz/artifacts"
if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS")
else
    limit=(-max_total_time="$FUZZ_SECONDS")
fi
CFLAGS_FUZZ=(-g -O1 "-fsanitize=fuzzer,address,undefined" -fno-sanitize-recover=undefined -D_GNU_SOURCE)
# run NAME MAX_LEN SOURCES...: build the harness NAME and fuzz it.
run() {
    local name="$1" max_len="$2" corpus bin
    shift 2
    case "$name" in
        rdma_header) corpus="$DIR/fuzz/corpus" ;;
        *) corpus="$DIR/fuzz/${name}_corpus" ;;
    esac
    # Kept beside its source (git-ignored): scripts/fuzz-long.sh runs it.
    bin="$DIR/fuzz/${name}_fuzz"
    "$CC_FUZZ" "${CFLAGS_FUZZ[@]}" "$@" -o "$bin"
    mkdir -p "$work/$name"
    echo "fuzz-modrdma: $name: $CC_FUZZ, ${limit[*]}"
    "$bin" "$work/$name" "$corpus" "${limit[@]}" -max_len="$max_len" -print_final_stats=1 \
        -artifact_prefix="$DIR/fuzz/artifacts/${name}-"
}
for t in ${FUZZ_TARGETS:-rdma_header ctrl}; do
    case "$t" in
        rdma_header)
            run rdma_header 512 -I/usr/include/apr-1.0 "$DIR/rdma_header.c" \
                "$DIR/fuzz/rdma_header_fuzz.c" -lapr-1 ;;
        ctrl)
            run ctrl 64 "$DIR/wire.c" "$DIR/fuzz/ctrl_fuzz.c" ;;
        *)
            echo "fuzz-modrdma: unknown harness $t (known: rdma_header ctrl)" >&2
            exit 2 ;;
    esac
done
