#!/usr/bin/env bash
# Run the shared RDMA: header and control-message vectors
# (testdata/rdma-vectors) against mod_rdma's C codecs (rdma_header.c,
# wire.c). The Rust side runs the same files in `cargo test -p rhttp`.
# Needs a C compiler and the APR headers (libapr1-dev, which apache2-dev
# brings). Exit status non-zero if a vector fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/modules/mod_rdma"
APR_INC="$(apr-1-config --includes 2>/dev/null || echo -I/usr/include/apr-1.0)"
bin="$(mktemp -d)/vectors"
trap 'rm -rf "$(dirname "$bin")"' EXIT
# shellcheck disable=SC2086 # APR_INC may hold several flags
"${CC:-cc}" -std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE $APR_INC \
    "$DIR/test/vectors.c" "$DIR/rdma_header.c" "$DIR/wire.c" -lapr-1 -o "$bin"
"$bin" "$ROOT/testdata/rdma-vectors/header.txt" "$ROOT/testdata/rdma-vectors/ctrl.txt"
