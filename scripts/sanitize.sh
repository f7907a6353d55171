#!/usr/bin/env bash
# Sanitizer runs over the code where memory and threads are handled by
# hand:
#
#   c-modrdma   mod_rdma's pure C parts (rdma_header.c, wire.c) under
#               AddressSanitizer + UBSan: the shared test vectors
#               (testdata/rdma-vectors) and a replay of the fuzz corpus
#   c-ccache    mod_ccache's IPC client (frame codec, document number,
#               send_all/recv_all over a socketpair with a peer that writes
#               byte by byte or hangs up), ASan + UBSan
#   c-capi      the C API tests (tests/c, tests/c/rsocket), compiled with
#               ASan + UBSan (LeakSanitizer on) against libiwarp and
#               libiwarp_rsocket built normally (debug: overflow checks on)
#   c-apache    mod_rdma and mod_ccache whole (their Apache parts too),
#               built with ASan + UBSan and loaded into a real apache2 by
#               scripts/test-modrdma.sh and scripts/test-cache.sh
#               (scripts/sanitize-apache.sh); long mode only, unless named
#   miri        Miri over pure unsafe code: the MR memory (iwarp-verbs mr.rs),
#               iwarp-proto's CRC kernels, iwarp-ffi's panic boundary
#   tsan        ThreadSanitizer (nightly, -Zbuild-std) over the tests of the
#               crates with unsafe code and threads: iwarp, iwarp-verbs (mr),
#               iwarp-soft, iwarp-rsocket, iwarp-preload (its unit tests;
#               the cdylib's exported calls run in scripts/test-preload.sh),
#               iwarp-ffi
#
#   scripts/sanitize.sh              short mode (the test command's step)
#   scripts/sanitize.sh long         every test of those crates under TSan,
#                                    Miri over the long tests too
#   scripts/sanitize.sh short tsan   only some parts (c-modrdma c-ccache
#                                    c-capi c-apache miri tsan)
#   SANITIZE=long scripts/sanitize.sh
#
# Builds go to target-san/ (SAN_TARGET), never to the shared target/, so
# the release build is not invalidated. Installs what is missing: clang and
# its runtimes, the APR and httpd headers (Debian), rust-src and miri for
# nightly (rustup). Every run is bounded by `timeout`. Prints one
# PASS/FAIL/SKIP line per part and exits non-zero if any part failed.
#
# No suppressions: a report is fixed where it is, or the part fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

MODE="${SANITIZE:-short}"
declare -a PARTS=()
for arg in "$@"; do
    case $arg in
        short | long) MODE=$arg ;;
        c-modrdma | c-ccache | c-capi | c-apache | miri | tsan) PARTS+=("$arg") ;;
        *)
            echo "usage: $0 [short|long] [c-modrdma c-ccache c-capi c-apache miri tsan]" >&2
            exit 2
            ;;
    esac
done
if ((${#PARTS[@]} == 0)); then
    # c-apache (the two end-to-end Apache scripts again, about 3 minutes
    # warm at load average 10-14) is a long-mode part: the test command's
    # sanitizer step may grow by 60 s at most.
    PARTS=(c-modrdma c-ccache c-capi miri tsan)
    [[ $MODE != long ]] || PARTS=(c-modrdma c-ccache c-capi c-apache miri tsan)
fi
SAN_TARGET="${SAN_TARGET:-$ROOT/target-san}"
TRIPLE=x86_64-unknown-linux-gnu
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
note() { printf '[sanitize] %s\n' "$*"; }

# ASan/UBSan: stop at the first report, with a non-zero exit.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
SANFLAGS=(-g -O1 -fno-omit-frame-pointer "-fsanitize=address,undefined" -fno-sanitize-recover=all)

APT_UPDATED=0
apt_need() { # apt_need PACKAGE...: install the Debian packages given
    ((APT_UPDATED)) || { apt-get update -qq && APT_UPDATED=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

find_clang() {
    local c
    for c in clang clang-14 clang-15 clang-16; do
        command -v "$c" >/dev/null && { echo "$c"; return 0; }
    done
    return 1
}

# ---------------------------------------------------------------- C parts

c_prereqs() {
    local -a pkgs=()
    find_clang >/dev/null || pkgs+=(clang)
    compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a' >/dev/null ||
        pkgs+=(libclang-rt-dev)
    [[ -f /usr/include/apr-1.0/apr_pools.h ]] || pkgs+=(libapr1-dev)
    [[ -f /usr/include/apache2/httpd.h ]] || pkgs+=(apache2-dev)
    if ((${#pkgs[@]})); then
        note "installing ${pkgs[*]}"
        apt_need "${pkgs[@]}"
    fi
    CC_SAN="$(find_clang)"
}

part_c_modrdma() {
    c_prereqs
    local dir=modules/mod_rdma out="$SAN_TARGET/c"
    mkdir -p "$out"
    # The shared vectors against the C codecs.
    "$CC_SAN" "${SANFLAGS[@]}" -std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE \
        -I/usr/include/apr-1.0 "$dir/test/vectors.c" "$dir/rdma_header.c" "$dir/wire.c" \
        -lapr-1 -o "$out/modrdma_vectors"
    timeout 120 "$out/modrdma_vectors" testdata/rdma-vectors/header.txt testdata/rdma-vectors/ctrl.txt
    # The fuzz corpus, each input once (-runs=0 replays the corpus and stops).
    "$CC_SAN" "${SANFLAGS[@]}" -fsanitize=fuzzer -D_GNU_SOURCE -I/usr/include/apr-1.0 \
        "$dir/rdma_header.c" "$dir/fuzz/rdma_header_fuzz.c" -lapr-1 -o "$out/modrdma_fuzz"
    timeout 300 "$out/modrdma_fuzz" -runs=0 -max_len=512 "$dir/fuzz/corpus" 2>&1 | tail -n 3
    [[ ${PIPESTATUS[0]} == 0 ]]
}

part_c_ccache() {
    c_prereqs
    local out="$SAN_TARGET/c"
    mkdir -p "$out"
    # The module's static functions are reached by including the source;
    # the httpd functions it calls on the request path are stubs (never
    # called here).
    cat >"$WORK/ccache_ipc.c" <<'EOF'
#include "mod_ccache.c"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* The httpd functions of the request path, never called here. */
#define NOT_HERE abort()
ap_filter_t *ap_add_output_filter(const char *n, void *x, request_rec *r, conn_rec *c)
{ (void)n; (void)x; (void)r; (void)c; NOT_HERE; }
void ap_hook_fixups(ap_HOOK_fixups_t *pf, const char *const *pre, const char *const *succ, int order)
{ (void)pf; (void)pre; (void)succ; (void)order; NOT_HERE; }
int ap_is_initial_req(request_rec *r) { (void)r; NOT_HERE; }
void ap_log_error_(const char *f, int l, int m, int lv, apr_status_t st, const server_rec *s, const char *fmt, ...)
{ (void)f; (void)l; (void)m; (void)lv; (void)st; (void)s; (void)fmt; }
void ap_log_rerror_(const char *f, int l, int m, int lv, apr_status_t st, const request_rec *r, const char *fmt, ...)
{ (void)f; (void)l; (void)m; (void)lv; (void)st; (void)r; (void)fmt; }
apr_status_t ap_pass_brigade(ap_filter_t *f, apr_bucket_brigade *bb) { (void)f; (void)bb; NOT_HERE; }
ap_filter_rec_t *ap_register_output_filter(const char *n, ap_out_filter_func f, ap_init_filter_func i, ap_filter_type t)
{ (void)n; (void)f; (void)i; (void)t; NOT_HERE; }

static int failures;
#define CHECK(c) do { if (!(c)) { failures++; printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); } } while (0)

struct peer { int fd; const unsigned char *b; size_t n; size_t hang_up_after; };

/* Writes b one byte at a time (recv_all must gather them), then closes
 * after hang_up_after bytes. */
static void *peer_main(void *arg)
{
    struct peer *p = arg;
    size_t i;
    for (i = 0; i < p->n && i < p->hang_up_after; i++) {
        if (send(p->fd, p->b + i, 1, MSG_NOSIGNAL) != 1)
            break;
        usleep(200);
    }
    close(p->fd);
    return NULL;
}

static void recv_from_peer(size_t hang_up_after, int want_rc)
{
    int sv[2];
    unsigned char frame[MSG_LEN], got[MSG_LEN];
    unsigned kind;
    uint32_t doc;
    uint64_t value;
    pthread_t t;
    struct peer p;
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    put_msg(frame, CCACHE_IPC_KIND_READ_PROCEED, 77, 0x0102030405060708ULL);
    p.fd = sv[1];
    p.b = frame;
    p.n = sizeof frame;
    p.hang_up_after = hang_up_after;
    CHECK(pthread_create(&t, NULL, peer_main, &p) == 0);
    errno = 0;
    CHECK(recv_all(sv[0], got, sizeof got) == want_rc);
    if (want_rc == 0) {
        CHECK(get_msg(got, &kind, &doc, &value) == 0);
        CHECK(kind == CCACHE_IPC_KIND_READ_PROCEED && doc == 77 && value == 0x0102030405060708ULL);
    } else {
        CHECK(errno == ECONNRESET);
    }
    pthread_join(t, NULL);
    /* The peer is gone: a send fails with an error, not with SIGPIPE. */
    CHECK(send_all(sv[0], frame, sizeof frame) != 0);
    close(sv[0]);
}

int main(void)
{
    static const struct { const char *uri; int rc; uint32_t doc; } docs[] = {
        {"/docs/0", 0, 0}, {"/docs/42", 0, 42}, {"7", 0, 7},
        {"/a/b/4294967295", 0, 4294967295u}, {"/docs/4294967296", -1, 0},
        {"/docs/99999999999999999999999999999", -1, 0}, {"/docs/", -1, 0},
        {"/", -1, 0}, {"", -1, 0}, {"/docs/12a", -1, 0}, {"/docs/-1", -1, 0},
        {"/docs/ 1", -1, 0}, {"/docs/1/", -1, 0},
    };
    static const unsigned kinds[] = {0, CCACHE_IPC_KIND_READ_REQUEST, CCACHE_IPC_KIND_READ_PROCEED, CCACHE_IPC_KIND_READ_DONE, CCACHE_IPC_KIND_ERROR, 255};
    static const uint64_t values[] = {0, 1, 0x8000000000000000ULL, UINT64_MAX};
    unsigned char b[MSG_LEN];
    size_t i, j, k;
    for (i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        uint32_t doc = 12345;
        int rc = doc_of(docs[i].uri, &doc);
        CHECK(rc == docs[i].rc);
        if (rc == 0)
            CHECK(doc == docs[i].doc);
    }
    for (i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        for (j = 0; j < sizeof values / sizeof values[0]; j++) {
            unsigned kind;
            uint32_t doc;
            uint64_t value;
            put_msg(b, kinds[i], (uint32_t)values[j], values[j]);
            CHECK(get_msg(b, &kind, &doc, &value) == 0);
            CHECK(kind == kinds[i] && doc == (uint32_t)values[j] && value == values[j]);
            /* Any change to the magic or the format is refused. */
            for (k = 0; k < 3; k++) {
                b[k] ^= 0x01;
                CHECK(get_msg(b, &kind, &doc, &value) == -1);
                b[k] ^= 0x01;
            }
        }
    recv_from_peer(MSG_LEN, 0);      /* a whole frame in 16 pieces */
    recv_from_peer(7, -1);           /* half a frame, then hang-up */
    recv_from_peer(0, -1);           /* hang-up at once */
    printf("ccache_ipc: %d failed\n", failures);
    return failures != 0;
}
EOF
    # -Wno-null-pointer-subtraction: APR's own APR_OFFSET macro (apr_general.h),
    # through APR_BRIGADE_SENTINEL in the module's output filter.
    "$CC_SAN" "${SANFLAGS[@]}" -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function -Wno-null-pointer-subtraction \
        -Wno-missing-field-initializers -Wno-unused-parameter -D_GNU_SOURCE -pthread \
        -I/usr/include/apache2 -I/usr/include/apr-1.0 -Itools/ccache/apache \
        "$WORK/ccache_ipc.c" -laprutil-1 -lapr-1 \
        -o "$out/ccache_ipc"
    timeout 120 "$out/ccache_ipc"
}

part_c_capi() {
    c_prereqs
    local tdir="$SAN_TARGET/capi" out="$SAN_TARGET/c/capi" src name log rc=0
    mkdir -p "$out"
    note "building libiwarp and libiwarp_rsocket (debug) in $tdir"
    CARGO_TARGET_DIR="$tdir" nice -n 10 timeout 3600 cargo build -q -p iwarp-ffi -p iwarp-rsocket
    local lib="$tdir/debug"
    for src in tests/c/test_*.c; do
        name=$(basename "$src" .c)
        "$CC_SAN" "${SANFLAGS[@]}" -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror \
            -pthread -Iinclude -Itests/c "$src" -o "$out/$name" -L"$lib" -liwarp -Wl,-rpath,"$lib"
    done
    for src in tests/c/rsocket/test_*.c; do
        name=$(basename "$src" .c)
        "$CC_SAN" "${SANFLAGS[@]}" -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror \
            -pthread -Iinclude "$src" -o "$out/$name" -L"$lib" -liwarp_rsocket -Wl,-rpath,"$lib"
    done
    mkdir -p "$out/logs"
    for name in "$out"/test_*; do
        log="$out/logs/${name##*/}.log"
        note "run $(basename "$name")"
        if ! timeout --kill-after=10 300 "$name" >"$log" 2>&1; then
            cat "$log"
            note "$(basename "$name") FAILED"
            rc=1
        else
            tail -n 1 "$log"
        fi
    done
    return "$rc"
}

part_c_apache() {
    SAN_TARGET="$SAN_TARGET" timeout --kill-after=30 3600 bash scripts/sanitize-apache.sh
}

# ---------------------------------------------------------------- Rust parts

nightly_component() { # nightly_component NAME: add a nightly component if missing
    rustup component list --toolchain nightly --installed 2>/dev/null | grep -q "^$1" ||
        rustup component add "$1" --toolchain nightly
}

part_miri() {
    nightly_component rust-src
    nightly_component miri
    export CARGO_TARGET_DIR="$SAN_TARGET/miri"
    # SANITIZE_BUILD_ONLY=1: build what the run needs (Miri's sysroot, the
    # test binaries) and run nothing; scripts/test.sh does that in the
    # background long before its sanitizer step.
    local -a norun=()
    [[ "${SANITIZE_BUILD_ONLY:-0}" != 1 ]] || norun=(--no-run)
    local -a skip=()
    # Each set has its own timeout, and a set that fails or times out does
    # not stop the next ones (in session 9 the MR set's timeout ended the
    # part before the CRC and FFI sets ran); the part fails at the end,
    # naming the sets that failed.
    local -a failed=()
    miri_set() { # NAME SECONDS COMMAND...: one set, bounded
        local name="$1" secs="$2" t0=$SECONDS rc=0 why
        shift 2
        timeout "$secs" "$@" || rc=$?
        note "miri set $name: exit $rc after $((SECONDS - t0)) s (limit $secs s)"
        if ((rc != 0)); then
            why="exit $rc"
            if ((rc == 124)); then why="timed out after $secs s"; fi
            failed+=("$name ($why)")
        fi
    }
    # The re-registration rounds and the 2048 regions of the key
    # statistics: minutes under Miri, and the memory they touch is that of
    # the other MR tests; long mode runs them. (Under Miri the rounds are 3
    # of the reuse queue, not the native 256, a million registrations that
    # outlasted this part's hour: cfg!(miri) in the test.)
    [[ $MODE == long ]] || skip=(--skip no_stag_repeats_in_a_million_re_registrations --skip keys_are_drawn_at_random)
    # `mr::` names the MR table (crates/iwarp-verbs/src/mr.rs, since the
    # provider crates; the rdma-core provider's own `mr`, which calls
    # getrlimit(2) that Miri cannot run, is in iwarp-rdmacore, not here).
    miri_set mr 3600 cargo +nightly miri test -q "${norun[@]}" -p iwarp-verbs --lib mr:: -- "${skip[@]}"
    # The CRC kernels: the portable code and, with the target features on,
    # the SSE4.2 and PCLMULQDQ ones (Miri has no CPUID; it reports what the
    # build enables). Their proptests read the working directory (failure
    # persistence), which Miri's isolation refuses; and each case is slow
    # when interpreted, so fewer cases than natively.
    export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
    if [[ $MODE == long ]]; then export PROPTEST_CASES=64; else export PROPTEST_CASES=8; fi
    # Short: the RFC 3720 and siw vectors and split appends (each back end,
    # a few hundred bytes); long: every CRC test, the 1 KiB sweep and the
    # proptests included (an hour or more interpreted).
    local -a crc=(wire::crc::tests::rfc3720 wire::crc::tests::siw_crc wire::crc::tests::append_matches)
    [[ $MODE == long ]] && crc=(wire::crc)
    miri_set crc 3600 cargo +nightly miri test -q "${norun[@]}" -p iwarp-proto --lib -- "${crc[@]}"
    miri_set crc-simd 3600 env RUSTFLAGS="-C target-feature=+sse4.2,+pclmulqdq" \
        CARGO_TARGET_DIR="$SAN_TARGET/miri-simd" \
        cargo +nightly miri test -q "${norun[@]}" -p iwarp-proto --lib -- "${crc[@]}"
    # The C API's panic boundary and error strings (no sockets).
    miri_set ffi 1800 cargo +nightly miri test -q "${norun[@]}" -p iwarp-ffi --lib -- boundary:: error:: strerror::
    if ((${#failed[@]})); then
        note "miri: failed sets: ${failed[*]}"
        return 1
    fi
}

part_tsan() {
    nightly_component rust-src
    local -a skip=()
    # Short: the unit tests of iwarp-verbs (MR table) and iwarp-soft (the
    # soft provider) but the million re-registrations (4 minutes under
    # TSan); iwarp's MR tests (registration, placement and invalidation
    # from the receive thread against the application's reads), the CQs,
    # liveness, the progress modes (receive thread, application-driven,
    # busy polling), and a peer killed under full send queues of Writes
    # and Reads (kill.rs, ops.rs: the receive thread placing Read
    # Responses while sendmsg gathers Writes from the same MR). Long:
    # every test of the six crates.
    #
    # kill.rs and ops.rs were out of the short run until 32bc12b: they
    # posted RDMA Writes from and RDMA Reads into the same bytes of one MR
    # at once, which TSan reported, rightly (a verbs consumer must not do
    # that); the Reads now land in another MiB. See docs/TESTING.md.
    #
    # iwarp-rsocket's tests/deferred.rs runs its tests one at a time: the
    # crate closes descriptors through dlsym(RTLD_NEXT) functions, which
    # TSan does not intercept, so a number reused by a concurrent test
    # looked like a race on the descriptor (see the file's module doc).
    # The MR table and the soft provider's unit tests live in iwarp-verbs
    # and iwarp-soft since the provider crates; the integration tests in
    # the facade, iwarp.
    local rc=0
    if [[ $MODE == long ]]; then
        tsan_run -p iwarp -p iwarp-verbs -p iwarp-soft -p iwarp-rsocket -p iwarp-preload -p iwarp-ffi -- || rc=$?
    else
        skip=(--skip no_stag_repeats_in_a_million_re_registrations)
        tsan_run -p iwarp-verbs -p iwarp-soft --lib -- "${skip[@]}" || rc=$?
        tsan_run -p iwarp --test mr --test cq --test liveness --test progress --test kill --test ops -- "${skip[@]}" || rc=$?
    fi
    return "$rc"
}

# tsan_run CARGO-ARGS... -- TEST-ARGS...: one `cargo test` under TSan.
tsan_run() {
    RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" \
        CARGO_TARGET_DIR="$SAN_TARGET/tsan" nice -n 10 timeout --kill-after=30 5400 \
        cargo +nightly test -Zbuild-std --target "$TRIPLE" --no-fail-fast "$@" --test-threads=2
}

# ---------------------------------------------------------------- main

declare -a RESULTS=()
FAILED=0
note "mode $MODE, parts: ${PARTS[*]}, builds in $SAN_TARGET"
for p in "${PARTS[@]}"; do
    printf '\n==================== sanitize: %s (%s) ====================\n' "$p" "$MODE"
    t0=$SECONDS
    # Not `(part) || rc=$?`: bash ignores `set -e` inside anything on the
    # left of `||`, so only a part's last command would count (the short
    # Miri run once passed with its first test binary failing).
    set +e
    (
        set -e
        "part_${p//-/_}"
    )
    rc=$?
    set -e
    if ((rc == 0)); then
        RESULTS+=("PASS  $p ($((SECONDS - t0))s)")
    else
        RESULTS+=("FAIL  $p ($((SECONDS - t0))s, exit $rc)")
        FAILED=$((FAILED + 1))
    fi
done
printf '\n'
printf '%s\n' "${RESULTS[@]}"
if ((FAILED)); then
    echo "sanitize: FAILED: $FAILED of ${#PARTS[@]} parts"
    exit 1
fi
echo "sanitize: OK: ${#PARTS[@]} parts ($MODE)"
