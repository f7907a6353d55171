#!/usr/bin/env bash
# Run the shared IPC vectors (crates/ccache-proto/vectors/ipc.txt) against
# mod_ccache's C codec (put_msg, get_msg, decode_reply in
# tools/ccache/apache/mod_ccache.c, its constants from the generated
# ccache_ipc.h). The Rust side runs the same file in
# `cargo test -p ccache-proto`, which also checks that ccache_ipc.h is what
# crates/ccache-proto/src/ipc.rs gives. A step of scripts/test-cache.sh;
# about 1 s. Needs a C compiler and the httpd/APR headers (apache2-dev).
# Exit status non-zero if a vector fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/tools/ccache/apache"
for h in /usr/include/apache2/httpd.h /usr/include/apr-1.0/apr_pools.h; do
    [ -e "$h" ] || { echo "test-cache-vectors: $h missing: apt-get install apache2-dev" >&2; exit 1; }
done
bin="$(mktemp -d)/vectors"
trap 'rm -rf "$(dirname "$bin")"' EXIT
# -Wno-null-pointer-subtraction: APR's APR_OFFSET (apr_general.h), through
# APR_BRIGADE_SENTINEL in the module's output filter (as in sanitize.sh).
"${CC:-cc}" -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function -Wno-unknown-warning-option \
    -Wno-missing-field-initializers -Wno-unused-parameter -D_GNU_SOURCE \
    -I/usr/include/apache2 -I/usr/include/apr-1.0 \
    "$DIR/test/vectors.c" -laprutil-1 -lapr-1 -o "$bin"
"$bin" "$ROOT/crates/ccache-proto/vectors/ipc.txt"
