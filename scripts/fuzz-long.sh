#!/usr/bin/env bash
# The long fuzz run: every cargo-fuzz target in fuzz/ and the C libFuzzer
# harnesses, for FUZZ_RUNS executions each (default 10,000,000), one target
# at a time. New inputs that add coverage are merged into the committed
# corpus with libFuzzer's -merge=1 (only inputs that bring new features are
# copied, so the corpus stays small). At the end it prints a markdown table
# (target, executions, seconds, exec/s, coverage, corpus, new features) and
# keeps it in fuzz/target/fuzz-long/table.md; --update-doc also writes it
# into docs/TESTING.md between the "fuzz-long" markers.
#
#   scripts/fuzz-long.sh                     all targets, 10 M executions each
#   scripts/fuzz-long.sh deframe engine_rx   only these (C: rdma_header.c, ...)
#   FUZZ_RUNS=1000000 scripts/fuzz-long.sh   fewer executions
#   scripts/fuzz-long.sh --update-doc        also rewrite the table in TESTING.md
#   scripts/fuzz-long.sh --list              print the targets and exit
#
# Environment: FUZZ_RUNS (executions per target), FUZZ_NICE (niceness of
# the fuzzers, default 15: the machine is shared), FUZZ_TARGET_TIMEOUT
# (seconds one target may take, default 7200; a target that hits it fails),
# FUZZ_MAX_SECONDS (libFuzzer's -max_total_time: the run stops by itself
# after that many seconds, fewer than FUZZ_RUNS executions, and its new
# inputs are still merged; use it to fit a run into a time window, since a
# run stopped by FUZZ_TARGET_TIMEOUT or interrupted merges nothing),
# FUZZ_MERGE=0 (fuzz without touching the corpus), FUZZ_ASAN_OPTIONS
# (ASAN_OPTIONS for every target, default $ASAN_OPTIONS; the per-target
# ones below are appended).
#
# Installs cargo-fuzz if missing (the nightly toolchain must exist; see
# scripts/test.sh). Exit status non-zero if any target crashed, failed a
# property, timed out or did not build; the reproducer is in
# fuzz/artifacts/TARGET/ (Rust) or the harness's artifacts directory (C).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
FUZZ_RUNS="${FUZZ_RUNS:-10000000}"
FUZZ_NICE="${FUZZ_NICE:-15}"
FUZZ_TARGET_TIMEOUT="${FUZZ_TARGET_TIMEOUT:-7200}"
FUZZ_MERGE="${FUZZ_MERGE:-1}"
FUZZ_MAX_SECONDS="${FUZZ_MAX_SECONDS:-}"
declare -a MAX_TIME=()
if [[ -n "$FUZZ_MAX_SECONDS" ]]; then
    [[ "$FUZZ_MAX_SECONDS" =~ ^[0-9]+$ ]] || {
        echo "fuzz-long: FUZZ_MAX_SECONDS must be a number of seconds, not '$FUZZ_MAX_SECONDS'" >&2
        exit 2
    }
    MAX_TIME=(-max_total_time="$FUZZ_MAX_SECONDS")
    # The hard bound must leave the run its time and the merge after it.
    if ((FUZZ_TARGET_TIMEOUT < FUZZ_MAX_SECONDS + 600)); then
        FUZZ_TARGET_TIMEOUT=$((FUZZ_MAX_SECONDS + 600))
    fi
fi
FUZZ_ASAN_OPTIONS="${FUZZ_ASAN_OPTIONS:-${ASAN_OPTIONS:-}}"
# Per-target ASan options. The targets named here test safe Rust only (the
# parsers and the harness hold no `unsafe`; rhttp is #![deny(unsafe_code)]),
# where no pointer can outlive its stack frame, so ASan's
# stack-use-after-return check (on by default since LLVM 15: each large
# frame is allocated on a fake stack) finds nothing there; without it
# they ran 1.3-1.9x more executions per second (2026-11-27, single runs on
# a machine at load 6-10, so noisy; docs/TESTING.md, "the slow targets").
# Targets with `unsafe` below them keep it.
declare -A TARGET_ASAN=(
    [ftp_reply]="detect_stack_use_after_return=0"
    [rhttp_links]="detect_stack_use_after_return=0"
)
# Per-target sanitizer. `none` builds the target without ASan (cargo fuzz
# -s none) but with debug assertions (-a: overflow checks, slice bounds as
# ever), into its own target directory, so the ASan build of the others is
# untouched. Only for targets whose code under test is safe Rust: there ASan
# can find nothing that safe Rust does not already exclude, and it costs
# these two allocation-heavy parsers most of their time (ftp_reply ran 520
# exec/s with ASan against 1,794 without, rhttp_links 1,305 without, in 25 s
# runs from their corpus on a loaded machine, 2026-11-28): a 10 M run takes
# 1.5-2 h without it, 5-9 h with it. A panic, a failed assertion, a timeout
# or running out of memory is caught the same way.
declare -A TARGET_SANITIZER=(
    [ftp_reply]=none
    [rhttp_links]=none
)
NOSAN_DIR="$ROOT/fuzz/target-nosan"
OUT="$ROOT/fuzz/target/fuzz-long"
TRIPLE="x86_64-unknown-linux-gnu"
note() { printf '[fuzz-long] %s\n' "$*"; }

UPDATE_DOC=0
LIST=0
declare -a WANT=()
for arg in "$@"; do
    case $arg in
        --update-doc) UPDATE_DOC=1 ;;
        --list) LIST=1 ;;
        -*) echo "usage: $0 [--update-doc] [--list] [TARGET...]" >&2; exit 2 ;;
        *) WANT+=("$arg") ;;
    esac
done

# The C harnesses: name | build command | binary | corpus | extra flags.
# The build command is the harness's own script with FUZZ_RUNS=1 (it builds
# the binary with -fsanitize=fuzzer,address,undefined and replays the
# corpus once); this script then runs the binary like a Rust target.
declare -a C_HARNESSES=(
    "rdma_header.c|scripts/fuzz-modrdma.sh|modules/mod_rdma/fuzz/rdma_header_fuzz|modules/mod_rdma/fuzz/corpus|-max_len=512"
    "ctrl.c|scripts/fuzz-modrdma.sh|modules/mod_rdma/fuzz/ctrl_fuzz|modules/mod_rdma/fuzz/ctrl_corpus|-max_len=64"
)
# mod_ccache's IPC client, when its harness script exists.
if [[ -x scripts/fuzz-ccache.sh ]]; then
    C_HARNESSES+=("mod_ccache.c|scripts/fuzz-ccache.sh|${FUZZ_CCACHE_BIN:-tools/ccache/apache/fuzz/ccache_ipc_fuzz}|${FUZZ_CCACHE_CORPUS:-tools/ccache/apache/fuzz/corpus}|-max_len=64")
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz-long: no nightly toolchain (rustup toolchain install nightly --profile minimal)" >&2
    exit 1
fi
if ! cargo fuzz --help >/dev/null 2>&1; then
    note "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

declare -a RUST_TARGETS=()
mapfile -t RUST_TARGETS < <(cd fuzz && cargo +nightly fuzz list)
if ((LIST)); then
    printf '%s\n' "${RUST_TARGETS[@]}"
    for h in "${C_HARNESSES[@]}"; do echo "${h%%|*}"; done
    exit 0
fi
wanted() { # wanted NAME: true if NAME was asked for (or nothing was)
    local w
    ((${#WANT[@]} == 0)) && return 0
    for w in "${WANT[@]}"; do [[ "$w" == "$1" ]] && return 0; done
    return 1
}

mkdir -p "$OUT"
declare -a ROWS=()
FAILED=0

# count DIR: number of files in DIR (0 if it does not exist).
count() { [[ -d "$1" ]] && find "$1" -maxdepth 1 -type f | wc -l || echo 0; }

# commas N: 10000000 -> 10,000,000 (printf's %'d depends on the locale).
commas() { echo "$1" | sed -e ':a' -e 's/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/' -e 'ta'; }

# stat_of LOG NAME: a libFuzzer "stat::NAME:" value from -print_final_stats.
stat_of() { sed -n "s/^stat::$2: *\([0-9]*\).*/\1/p" "$1" | tail -n 1; }

# fuzz_one NAME BINARY CORPUS ARTIFACTS [FLAGS...]: run, merge, record a row.
fuzz_one() {
    local name="$1" bin="$2" corpus="$3" artifacts="$4"
    shift 4
    local work log mlog rc=0 t0 dt before after execs eps cov ft newfiles newft asan
    asan="$FUZZ_ASAN_OPTIONS${FUZZ_ASAN_OPTIONS:+:}${TARGET_ASAN[$name]:-}"
    asan="${asan%:}"
    work="$(mktemp -d)"
    log="$OUT/$name.log"
    mlog="$OUT/$name.merge.log"
    mkdir -p "$corpus" "$artifacts"
    before=$(count "$corpus")
    note "$name: $FUZZ_RUNS executions from $before inputs (log: $log${asan:+, ASAN_OPTIONS=$asan})"
    t0=$SECONDS
    # New inputs go to the scratch directory (the first corpus argument);
    # the committed corpus is only read during the run.
    ASAN_OPTIONS="$asan" timeout --kill-after=30 "$FUZZ_TARGET_TIMEOUT" nice -n "$FUZZ_NICE" \
        "$bin" "$work" "$corpus" -runs="$FUZZ_RUNS" "${MAX_TIME[@]}" -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "$@" >"$log" 2>&1 || rc=$?
    dt=$((SECONDS - t0))
    execs=$(stat_of "$log" number_of_executed_units)
    eps=$(stat_of "$log" average_exec_per_sec)
    # libFuzzer rounds the rate down to 0 for a run under a second.
    ((dt > 0 && ${execs:-0} > 0)) && eps=$((execs / dt))
    read -r cov ft < <(grep -E '^#[0-9]+.*cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 |
        sed -n 's/.*cov: \([0-9]*\) ft: \([0-9]*\).*/\1 \2/p'; echo)
    newfiles=0
    newft=0
    if ((rc != 0)); then
        FAILED=$((FAILED + 1))
        tail -n 40 "$log" >&2
        note "$name: FAILED (exit $rc; reproducer in $artifacts/)"
    elif [[ "$FUZZ_MERGE" == 1 ]] && (($(count "$work") > 0)); then
        # -merge=1 copies to the first directory only the inputs of the
        # others that add features to it.
        if ASAN_OPTIONS="$asan" timeout --kill-after=30 "$FUZZ_TARGET_TIMEOUT" nice -n "$FUZZ_NICE" \
            "$bin" -merge=1 "$corpus" "$work" "$@" >"$mlog" 2>&1; then
            read -r newfiles newft < <(sed -n \
                's/.*MERGE-OUTER: \([0-9]*\) new files with \([0-9]*\) new features.*/\1 \2/p' \
                "$mlog" | tail -n 1; echo)
        else
            FAILED=$((FAILED + 1))
            tail -n 20 "$mlog" >&2
            note "$name: merge FAILED"
            rc=1
        fi
    fi
    rm -rf "$work"
    after=$(count "$corpus")
    local status="ok"
    ((rc == 0)) || status="FAILED (exit $rc)"
    [[ "${TARGET_SANITIZER[$name]:-address}" != none ]] || status+=" (no sanitizer, debug assertions)"
    note "$name: $status, ${execs:-?} executions in $dt s, ${eps:-?}/s, cov ${cov:-?} ft ${ft:-?}, corpus $before -> $after (+${newfiles:-0} files, ${newft:-0} new features)"
    ROWS+=("| \`$name\` | $(commas "${execs:-0}") | $dt | $(commas "${eps:-0}") | ${cov:-?} / $(commas "${ft:-0}") | $before → $after | ${newfiles:-0} / ${newft:-0} | $status |")
    return 0
}

# ---------------------------------------------------------------- Rust
declare -a RUN_RUST=()
for t in "${RUST_TARGETS[@]}"; do wanted "$t" && RUN_RUST+=("$t"); done
if ((${#RUN_RUST[@]})); then
    for t in "${RUN_RUST[@]}"; do
        bin="fuzz/target/$TRIPLE/release/$t"
        if [[ "${TARGET_SANITIZER[$t]:-address}" != none ]]; then
            note "$t: building (release, ASan)"
            (cd fuzz && nice -n "$FUZZ_NICE" timeout --kill-after=30 3600 cargo +nightly fuzz build -O "$t")
        else
            note "$t: building without a sanitizer, with debug assertions (safe Rust only, see TARGET_SANITIZER)"
            (cd fuzz && nice -n "$FUZZ_NICE" timeout --kill-after=30 3600 \
                cargo +nightly fuzz build -O -a -s none --target-dir "$NOSAN_DIR" "$t")
            bin="$NOSAN_DIR/$TRIPLE/release/$t"
        fi
        fuzz_one "$t" "$bin" "fuzz/corpus/$t" "fuzz/artifacts/$t"
    done
fi

# ---------------------------------------------------------------- C
for h in "${C_HARNESSES[@]}"; do
    IFS='|' read -r name build bin corpus flags <<<"$h"
    wanted "$name" || continue
    note "building $name with $build"
    if ! FUZZ_RUNS=1 nice -n "$FUZZ_NICE" timeout --kill-after=30 1800 "$build" >"$OUT/$name.build.log" 2>&1; then
        tail -n 20 "$OUT/$name.build.log" >&2
        ROWS+=("| \`$name\` | - | - | - | - | - | - | FAILED (build) |")
        FAILED=$((FAILED + 1))
        continue
    fi
    # shellcheck disable=SC2086 # flags is a list of libFuzzer flags
    fuzz_one "$name" "$bin" "$corpus" "$(dirname "$bin")/artifacts" $flags
done

# ---------------------------------------------------------------- table
table="$OUT/table.md"
{
    echo "Run of $(date -u +%Y-%m-%d), $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), FUZZ_RUNS=$FUZZ_RUNS, nice $FUZZ_NICE, shared with other work:"
    echo
    echo "| target | executions | seconds | exec/s | cov / features | corpus before → after | merged (files / new features) | result |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
} >"$table"
echo
cat "$table"
if ((UPDATE_DOC)); then
    # Replace the lines between the markers with the new table.
    doc="$ROOT/docs/TESTING.md"
    if grep -q '^<!-- fuzz-long:begin -->$' "$doc" && grep -q '^<!-- fuzz-long:end -->$' "$doc"; then
        awk -v table="$table" '
            /^<!-- fuzz-long:begin -->$/ { print; while ((getline l < table) > 0) print l; skip = 1; next }
            /^<!-- fuzz-long:end -->$/ { skip = 0 }
            !skip' "$doc" >"$doc.tmp" && mv "$doc.tmp" "$doc"
        note "table written to docs/TESTING.md"
    else
        note "no fuzz-long markers in docs/TESTING.md; paste the table above"
    fi
fi
((FAILED == 0))
