#!/usr/bin/env bash
# AddressSanitizer and UBSan over the Apache parts of mod_rdma and
# mod_ccache (mod_rdma.c, config.c, conn.c, expose.c, request.c,
# response.c, seal.c; mod_ccache's hooks and output filter), in a real
# Debian apache2, driven by the existing end-to-end tests:
#
#   modrdma  mod_rdma built with apxs and -fsanitize=address,undefined,
#            loaded by scripts/test-modrdma.sh (MODRDMA_SO): rhttp with
#            every scheme (GET server-writes and client-reads, PUT/POST
#            server-reads and client-writes, static and dynamic
#            registration, pipelined, 110 MB, CGI), the hostile cases
#            (bad RDMA: headers, SSRF, smuggling, impostors, STag probes,
#            killed clients) and the fault relay. Its fault-injection
#            Apache (an address-space limit) is skipped: ASan cannot run
#            under one
#   ccache   mod_ccache built the same way, loaded by scripts/test-cache.sh
#            (CCACHE_SO) with ccappd and ccproxy (none, tcp, rdma, the
#            CGI), a malformed IPC message, another user refused, ccappd
#            killed and restarted (CACHE_REQUESTS as the script takes it)
#
#   scripts/sanitize-apache.sh                 both (scripts/sanitize.sh long's
#                                              `c-apache` part)
#   scripts/sanitize-apache.sh modrdma         one of them
#   SAN_PATCH=FILE scripts/sanitize-apache.sh  apply FILE (patch -p1, paths
#                                              as in the repository) to the
#                                              scratch copies first: shows
#                                              that a planted bug is caught
#
# apache2 runs as the scripts start it (prefork, in the foreground) with
# the ASan runtime preloaded (APACHE_PRELOAD: apache2 itself is not
# instrumented), ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 (APR pools
# are freed at exit by design) and
# UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1: a worker that hits a
# report aborts. ASan writes its reports to files of their own (log_path,
# in REPORTS); UBSan (gcc's, beside ASan) ignores log_path and writes to
# stderr, which is Apache's error log, so the test scripts keep their
# directory (KEEP=1) and every log in it is searched for reports. A part
# fails if its test script fails, if a report file exists, or if a log
# holds a report. libiwarp (Rust, linked by mod_rdma) is the normal
# release build: its heap allocations go through ASan's malloc (bad frees,
# and overflows by the memory functions it calls, are reported), but its
# own loads and stores are not instrumented.
#
# The modules are built from scratch copies in $SAN_TARGET/apache (never in
# the source directories, whose .libs the normal build owns). Exit status
# non-zero if a part failed; last line "sanitize-apache: OK" or names the
# failed parts.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
export PATH="$HOME/.cargo/bin:$PATH"

declare -a PARTS=()
for arg in "$@"; do
    case $arg in
        modrdma | ccache) PARTS+=("$arg") ;;
        -h | --help)
            sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "usage: $0 [modrdma] [ccache]" >&2
            exit 2
            ;;
    esac
done
((${#PARTS[@]})) || PARTS=(modrdma ccache)
SAN_TARGET="${SAN_TARGET:-$ROOT/target-san}"
OUT="$SAN_TARGET/apache"
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$ROOT/$TARGET"
note() { printf '[sanitize-apache] %s\n' "$*"; }

# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
apache_install apache2 apxs=apache2-dev curl python3 patch || exit 1
LIBASAN="$(gcc -print-file-name=libasan.so)"
if [[ ! -e $LIBASAN ]]; then
    echo "no ASan runtime for gcc ($LIBASAN). Fix: apt-get install libgcc-$(gcc -dumpversion)-dev" >&2
    exit 1
fi

note "building libiwarp, rhttp, ccache and delay-bridge (release, $TARGET)"
timeout 1800 cargo build --release -q -p iwarp-ffi -p rhttp -p ccache -p fault-relay || {
    echo "cargo build failed" >&2
    exit 1
}

# The modules' own Makefiles, with the sanitizer flags added to apxs: -O1
# and frame pointers for readable stacks; no _FORTIFY_SOURCE (Debian's apxs
# default): its __*_chk variants of the memory and string functions are
# not all intercepted by ASan, and ASan checks those calls itself;
# -fno-sanitize-recover so that a UBSan finding stops the worker like an
# ASan one.
SANFLAGS=("-Wc,-g" "-Wc,-O1" "-Wc,-U_FORTIFY_SOURCE" "-Wc,-fno-omit-frame-pointer"
    "-Wc,-fsanitize=address,undefined" "-Wc,-fno-sanitize-recover=all" -lasan -lubsan)
rm -rf "$OUT/src"
mkdir -p "$OUT/src/mod_rdma" "$OUT/src/mod_ccache"
cp modules/mod_rdma/Makefile modules/mod_rdma/*.[ch] "$OUT/src/mod_rdma/"
cp tools/ccache/apache/Makefile tools/ccache/apache/*.[ch] "$OUT/src/mod_ccache/"
if [[ -n ${SAN_PATCH:-} ]]; then
    note "applying $SAN_PATCH to the scratch copies"
    # Repository paths to the copies' paths.
    sed -e 's#\([ab]\)/modules/mod_rdma/#\1/mod_rdma/#' -e 's#\([ab]\)/tools/ccache/apache/#\1/mod_ccache/#' \
        "$SAN_PATCH" | patch -d "$OUT/src" -p1 || exit 1
fi
build() { # DIR MAKE-ARGS...
    local dir="$1"
    shift
    if ! timeout 600 make -s -C "$dir" APXS="apxs ${SANFLAGS[*]}" "$@" >"$dir/build.log" 2>&1; then
        cat "$dir/build.log"
        return 1
    fi
}
note "building mod_rdma and mod_ccache with -fsanitize=address,undefined in $OUT/src"
build "$OUT/src/mod_rdma" ROOT="$ROOT" IWARP_LIB="$TARGET/release" || exit 1
build "$OUT/src/mod_ccache" || exit 1

REPORTS="$OUT/reports"
export APACHE_PRELOAD="$LIBASAN"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$REPORTS/asan"
# abort_on_error: without it UBSan's exit(1) ends a worker without a
# trace in Apache's log (planting a one-byte stack overread in mod_ccache
# showed it: failed requests, respawned workers, no "exit signal").
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
# What a sanitizer report looks like in a log.
SAN_RE='ERROR: AddressSanitizer|AddressSanitizer:DEADLYSIGNAL|runtime error:|UndefinedBehaviorSanitizer|ERROR: LeakSanitizer'

# run_part NAME CMD...: the test script (KEEP=1, its directory named on
# its output's "kept DIR" line), then the report files and the logs.
run_part() {
    local name="$1" rc t0=$SECONDS f kept found=0
    shift
    rm -rf "$REPORTS"
    # The workers run as www-data and write their reports here.
    mkdir -p "$REPORTS" && chmod 1777 "$REPORTS"
    printf '\n==================== sanitize-apache: %s ====================\n' "$name"
    KEEP=1 "$@" 2>&1 | tee "$OUT/$name.out"
    rc=${PIPESTATUS[0]}
    for f in "$REPORTS"/*; do
        [[ -e $f ]] || continue
        echo "---- sanitizer report $f"
        cat "$f"
        found=1
    done
    kept=$(sed -n 's/^kept \(\/tmp\/.*\)$/\1/p' "$OUT/$name.out" | tail -n 1)
    if [[ -z $kept || ! -d $kept ]]; then
        echo "---- the test script's directory was not kept: its logs cannot be searched"
        found=1
    elif grep -rlE --include='*.log' --include='out' "$SAN_RE" "$kept" >"$OUT/$name.hits"; then
        while read -r f; do
            echo "---- sanitizer report in $f (first 40 lines)"
            grep -m 40 -A 12 -E "$SAN_RE" "$f"
        done <"$OUT/$name.hits"
        found=1
    fi
    [[ -z $kept ]] || rm -rf "$kept"
    if ((found)); then
        RESULTS+=("FAIL  $name ($((SECONDS - t0))s: sanitizer report, test script exit $rc)")
        FAILED+=("$name")
    elif ((rc != 0)); then
        RESULTS+=("FAIL  $name ($((SECONDS - t0))s: test script exit $rc, no sanitizer report)")
        FAILED+=("$name")
    else
        RESULTS+=("PASS  $name ($((SECONDS - t0))s, no sanitizer report)")
    fi
}

declare -a RESULTS=() FAILED=()
for p in "${PARTS[@]}"; do
    case $p in
        modrdma)
            run_part modrdma env MODRDMA_SO="$OUT/src/mod_rdma/.libs/mod_rdma.so" \
                timeout --kill-after=30 1800 bash scripts/test-modrdma.sh
            ;;
        ccache)
            run_part ccache env CCACHE_SO="$OUT/src/mod_ccache/.libs/mod_ccache.so" \
                timeout --kill-after=30 1800 bash scripts/test-cache.sh
            ;;
    esac
done
printf '\n'
printf '%s\n' "${RESULTS[@]}"
if ((${#FAILED[@]})); then
    echo "sanitize-apache: FAILED: ${FAILED[*]}"
    exit 1
fi
echo "sanitize-apache: OK (${PARTS[*]})"
