#!/usr/bin/env bash
# Build libiwarp (crates/iwarp-ffi), check that include/iwarp.h matches what
# cbindgen generates from the source, write a pkg-config file for the build
# tree, then compile the C tests in tests/c/ against the shared and the
# static library (gcc -Wall -Wextra -Werror) and run them; one of them also
# runs under valgrind when valgrind is installed.
#
#   scripts/test-capi.sh                  # check + test (debug build)
#   scripts/test-capi.sh --update-header  # regenerate include/iwarp.h, then test
#   PROFILE=release scripts/test-capi.sh  # against the release build
#   VALGRIND=0 scripts/test-capi.sh       # skip the valgrind run
#   scripts/test-capi.sh --install-cbindgen  # only install the pinned
#                                         # cbindgen (scripts/test.sh does it
#                                         # in the background, early)
#
# The last line is "capi: N passed, N failed" (checks of all C test runs);
# the exit status is non-zero
# on any failure (stale header, compile error, failed test, valgrind error).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CBINDGEN_VERSION=0.29.4
PROFILE=${PROFILE:-debug}
UPDATE=0
INSTALL_ONLY=0
for arg in "$@"; do
    case $arg in
        --update-header) UPDATE=1 ;;
        --install-cbindgen) INSTALL_ONLY=1 ;;
        *) echo "usage: $0 [--update-header | --install-cbindgen]" >&2; exit 2 ;;
    esac
done

# The pinned cbindgen: on PATH, or built into $1/tools (an unoptimized
# build: it compiles in about half the time, and it reads one crate).
cbindgen_path() {
    local c
    c=$(command -v cbindgen || true)
    if [[ -z $c || $("$c" --version) != "cbindgen $CBINDGEN_VERSION" ]]; then
        c=$1/tools/bin/cbindgen
        if [[ ! -x $c || $("$c" --version) != "cbindgen $CBINDGEN_VERSION" ]]; then
            echo "installing cbindgen $CBINDGEN_VERSION into $1/tools" >&2
            cargo install cbindgen --debug --locked --version "$CBINDGEN_VERSION" --root "$1/tools" >&2
        fi
    fi
    echo "$c"
}

if [[ $INSTALL_ONLY == 1 ]]; then
    TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    cbindgen_path "$TARGET_DIR/capi" >/dev/null
    exit 0
fi

if [[ $PROFILE == release ]]; then
    cargo build -p iwarp-ffi --release
else
    cargo build -p iwarp-ffi
fi
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
LIBDIR=$TARGET_DIR/$PROFILE
OUT=$TARGET_DIR/capi
mkdir -p "$OUT/shared" "$OUT/static" "$OUT/pkgconfig"

# --- header: regenerate with a pinned cbindgen and compare -----------------
CBINDGEN=$(cbindgen_path "$OUT")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$CBINDGEN" --quiet --config crates/iwarp-ffi/cbindgen.toml --crate iwarp-ffi \
    --output "$TMP/iwarp.h" crates/iwarp-ffi
if [[ $UPDATE == 1 ]]; then
    cp "$TMP/iwarp.h" include/iwarp.h
    echo "include/iwarp.h regenerated"
fi
if ! diff -u include/iwarp.h "$TMP/iwarp.h"; then
    echo "include/iwarp.h is stale: run scripts/test-capi.sh --update-header and commit it" >&2
    echo "capi: 0 passed, 1 failed"
    exit 1
fi

# --- pkg-config file pointing at the build tree ---------------------------
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' crates/iwarp-ffi/Cargo.toml | head -1)
sed -e "s|@PREFIX@|$ROOT|" -e "s|@LIBDIR@|$LIBDIR|" -e "s|@INCLUDEDIR@|$ROOT/include|" \
    -e "s|@VERSION@|$VERSION|" crates/iwarp-ffi/iwarp.pc.in > "$OUT/pkgconfig/iwarp.pc"
export PKG_CONFIG_PATH=$OUT/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
if command -v pkg-config >/dev/null; then
    PC_CFLAGS=$(pkg-config --cflags iwarp)
    PC_LIBS=$(pkg-config --libs iwarp)
    PC_STATIC=$(pkg-config --static --libs-only-l iwarp | sed 's/-liwarp//')
else
    PC_CFLAGS="-I$ROOT/include"
    PC_LIBS="-L$LIBDIR -liwarp"
    PC_STATIC="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
fi

# --- compile and run the C tests -------------------------------------------
CFLAGS=${CFLAGS:-"-std=c11 -D_POSIX_C_SOURCE=200809L -O1 -g -Wall -Wextra -Werror -pthread"}
passed=0
failed=0
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

run() { # run NAME CMD... ; adds the test's "N passed, N failed" counts
    local name=$1 log rc=0 p f
    shift
    log=$OUT/${name//[^A-Za-z0-9_]/_}.log
    "$@" >"$log" 2>&1 || rc=$?
    read -r p f < <(tail -n 1 "$log" | sed -n 's/.*\b\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed.*/\1 \2/p'; echo)
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    if [[ $rc == 0 && -n $p ]]; then
        echo "ok   $name: $(tail -n 1 "$log")"
    else
        cat "$log" >&2
        # A crash or a valgrind error may leave no failed check behind.
        [[ ${f:-0} -gt 0 ]] || failed=$((failed + 1))
        echo "FAIL: $name (exit $rc)" >&2
    fi
}

TESTS=()
for src in tests/c/test_*.c; do
    name=$(basename "$src" .c)
    TESTS+=("$name")
    # shellcheck disable=SC2086 # word splitting of the flag lists is wanted
    gcc $CFLAGS $PC_CFLAGS -Itests/c "$src" -o "$OUT/shared/$name" $PC_LIBS \
        -Wl,-rpath,"$LIBDIR" || { fail "compile $name (shared)"; continue; }
    # shellcheck disable=SC2086
    gcc $CFLAGS $PC_CFLAGS -Itests/c "$src" -o "$OUT/static/$name" \
        "$LIBDIR/libiwarp.a" $PC_STATIC || { fail "compile $name (static)"; continue; }
done
# The header must also be valid C++.
# shellcheck disable=SC2086 # PC_CFLAGS holds several flags on purpose.
echo '#include "iwarp.h"' | g++ -x c++ -std=c++11 -Wall -Wextra -Werror $PC_CFLAGS \
    -fsyntax-only - 2>/dev/null || { command -v g++ >/dev/null && fail "iwarp.h is not valid C++"; }

for name in "${TESTS[@]}"; do
    [[ -x $OUT/shared/$name ]] && run "$name (shared)" "$OUT/shared/$name"
    [[ -x $OUT/static/$name ]] && run "$name (static)" "$OUT/static/$name"
done

if [[ ${VALGRIND:-1} != 0 ]] && command -v valgrind >/dev/null; then
    run "test_loopback (valgrind)" valgrind -q --error-exitcode=1 --leak-check=full \
        --errors-for-leak-kinds=definite "$OUT/shared/test_loopback"
fi

echo "capi: $passed passed, $failed failed"
[[ $failed == 0 ]]
