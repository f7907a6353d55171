# shellcheck shell=bash
# clang_fuzz_setup TAG [FILE:PACKAGE ...]: sets CC_FUZZ to a clang that can
# build libFuzzer harnesses under ASan/UBSan, installing from Debian what is
# missing: clang, the fuzzer and sanitizer runtimes (they ship apart from
# the compiler), and each PACKAGE whose FILE (a header) is absent. Used by
# the C fuzz scripts (fuzz-modrdma.sh, fuzz-ccache.sh).
clang_fuzz_setup() {
    local tag="$1" c fp
    shift
    CC_FUZZ=""
    for c in clang clang-14 clang-15 clang-16; do
        if command -v "$c" >/dev/null; then
            CC_FUZZ="$c"
            break
        fi
    done
    local -a pkgs=()
    [ -n "$CC_FUZZ" ] || pkgs+=(clang)
    compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a' >/dev/null ||
        pkgs+=(libclang-rt-dev)
    for fp in "$@"; do
        [ -f "${fp%%:*}" ] || pkgs+=("${fp##*:}")
    done
    if ((${#pkgs[@]})); then
        echo "$tag: installing ${pkgs[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
        command -v "${CC_FUZZ:-clang}" >/dev/null || CC_FUZZ=clang
    fi
    [ -n "$CC_FUZZ" ] || CC_FUZZ=clang
}
