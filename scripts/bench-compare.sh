#!/usr/bin/env bash
# Before/after comparison of two builds of the stack on the figures of
# docs/BENCHMARKS.md: for every figure, PAIRS pairs of runs (old build,
# then new build, back to back; every other pair new first, so drifts of
# the machine cancel), once per CRC32C back end (IWARP_CRC), and the
# median of the per-pair ratios new/old. A figure passes ("same or
# better") when that median is no worse than 0.97 (higher is better) or
# 1.03 (lower is better); otherwise it is "WORSE".
#
#   scripts/bench-compare.sh OLD_DIR NEW_DIR
#   QUICK=1 scripts/bench-compare.sh OLD_DIR NEW_DIR          # smoke test
#   PARTS="perf rftp" PAIRS=3 scripts/bench-compare.sh OLD_DIR NEW_DIR
#   scripts/bench-compare.sh --build-mod DIR [SRC]           # DIR/mod_rdma.so
#
# OLD_DIR and NEW_DIR hold release binaries of the two builds: iwarp-perf,
# rftp, rftpd, rhttp, libiwarp.so and, for the mod_rdma part, mod_rdma.so
# (the Apache module built against that libiwarp.so; without it the part is
# skipped with a message). Collect them with, in each source tree:
#
#   cargo build --release -p iwarp-perf -p rftp -p rhttp -p iwarp-ffi
#   mkdir -p DIR && cp target/release/{iwarp-perf,rftp,rftpd,rhttp,libiwarp.so} DIR/
#   scripts/bench-compare.sh --build-mod DIR SRC_TREE
#
# --build-mod DIR [SRC] builds mod_rdma with apxs (modules/mod_rdma/Makefile)
# from SRC's modules/mod_rdma and include/iwarp.h against DIR/libiwarp.so
# (linked with an rpath to DIR) and copies it to DIR/mod_rdma.so. SRC is a
# source tree (default: this checkout) or a git revision of this repository
# (e.g. `main`, `d2ef733`; extracted with git archive). SRC itself is not
# modified: the build happens in a temporary copy. Build each module from
# the revision its libiwarp.so was built from (the C API may differ). For
# the provider-seam refactor (issue 15; old binaries built at d2ef733):
#
#   scripts/bench-compare.sh --build-mod OLD_DIR d2ef733   # old
#   scripts/bench-compare.sh --build-mod NEW_DIR           # new (this checkout)
#
# Parts (PARTS, default "perf rftp modrdma"):
#   perf     iwarp-perf --loopback --json, iWARP side only (no --compare: the
#            TCP baseline plays no part in before/after): RDMA Write/Read/Send
#            1 MiB and 64 KiB (Gbit/s), Write 1 MiB with CRC off, 8 B
#            Write/Send/Read latency in event mode and Write/Send with
#            --busy-poll (median us), 64 B message rate at depth 64 (Mmsg/s).
#            -D 2 and -n 20000 as in BENCHMARKS.md. RSS and the sweeps are
#            not compared.
#   rftp     rftpd and rftp on 127.0.0.1, `rftp get|put --mem RFTP_MEM`
#            (memory to memory, as scripts/bench-rftp.sh does), RFTP_STREAMS
#            streams; Gbit/s over the client's wall time (connection set-up
#            included), as in BENCHMARKS.md (which moved 4 GiB:
#            RFTP_MEM=4294967296). Measured without MPA CRC (as the
#            BENCHMARKS.md table is; CRC impl "off", once) and with --crc
#            (rftpd crc = true) per CRC impl.
#   modrdma  scripts/bench-modrdma.sh with SINGLE_ONLY=1, RHTTP=DIR/rhttp,
#            MOD=DIR/mod_rdma.so and LD_LIBRARY_PATH=DIR, called once per
#            side of each pair: median ms per GET of the single-client cells
#            (MOD_SIZES x MOD_VARIANTS, unloaded and with two busy processes,
#            as bench-modrdma.sh measures them; its ROUNDS rounds per call).
#            IWARP_CRC reaches the Apache workers through the environment.
#            bench-modrdma.sh builds iwarp-ffi, rhttp and mod_rdma of the tree
#            it lives in (for its regcost helper; the measured binaries are
#            DIR's), so that tree must build: MOD_BENCH_SRC names it (default
#            this checkout).
#
# Environment: PAIRS (default 5), CRC_IMPLS (default "auto avx2"; values of
# IWARP_CRC, checked against the crc_impl iwarp-perf reports), OUT (default
# docs/bench/compare), QUICK=1 (1 pair, -D 0.5, -n 2000, RFTP_MEM 256 MiB,
# mod_rdma 1M only, 2 rounds: for smoke tests), PARTS, RFTP_MEM (bytes,
# default 1073741824), RFTP_STREAMS (default "1 8", the BENCHMARKS.md rows),
# MOD_SIZES (default "2K 4K 500K 1M 8M"), MOD_VARIANTS (default "plain
# sw-static sw-dynamic cr-static cr-dynamic"), MOD_ROUNDS (default 5),
# MOD_BENCH_SRC.
#
# Writes OUT/compare.md (a table per part, the machine, the commands) and
# OUT/compare.jsonl (one line per run, with the raw measurement).
# Exit status: 0 all figures same or better, 2 some figure WORSE or with
# failed runs, 1 usage or set-up error.
#
# Duration on the 2-vCPU VM of BENCHMARKS.md, PAIRS=5 and two CRC impls
# (estimated from QUICK runs): perf about 7 min, rftp about 3 min (three
# configurations: CRC off, and --crc per impl), modrdma about 8 min (20 calls
# of bench-modrdma.sh, about 23 s each): about 20 min in all, longer on a
# busy machine. QUICK=1: about 1.5 min.
#
# Noise: this VM moves by +-15% between runs, more when other work runs.
# Comparing a build with itself (OLD_DIR = NEW_DIR) shows how much of a
# "WORSE" is noise; the rhttp times of the 2K/4K cells have 1 us resolution
# (about 3% of a 30 us request).
#
# The machine should be otherwise idle; the load average is recorded.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROG=bench-compare

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}
die() { echo "$PROG: $*" >&2; exit 1; }

# --- the mod_rdma build helper -------------------------------------------
build_mod() { # DIR [SRC]
    local dir src="${2:-$ROOT}" tmp
    [ -n "${1:-}" ] || die "--build-mod needs DIR (holding libiwarp.so)"
    dir="$(cd "$1" 2>/dev/null && pwd)" || die "--build-mod: no directory $1"
    [ -f "$dir/libiwarp.so" ] || die "--build-mod: $dir/libiwarp.so missing; copy target/release/libiwarp.so of that build there"
    command -v apxs >/dev/null || die "apxs missing: apt-get install apache2-dev (scripts/test-modrdma.sh installs it)"
    tmp="$(mktemp -d /tmp/bench-compare-mod.XXXXXX)"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    if [ -d "$src" ]; then
        if [ ! -f "$src/modules/mod_rdma/Makefile" ] || [ ! -f "$src/include/iwarp.h" ]; then
            die "--build-mod: $src is not a source tree (no modules/mod_rdma/Makefile or include/iwarp.h)"
        fi
        mkdir -p "$tmp/modules"
        cp -r "$src/modules/mod_rdma" "$tmp/modules/"
        cp -r "$src/include" "$tmp/"
        rm -rf "$tmp/modules/mod_rdma/.libs" "$tmp"/modules/mod_rdma/*.{o,lo,slo,la}
    else
        git -C "$ROOT" rev-parse --verify -q "$src^{commit}" >/dev/null ||
            die "--build-mod: $src is neither a directory nor a git revision of $ROOT"
        git -C "$ROOT" archive "$src" modules/mod_rdma include | tar -x -C "$tmp" ||
            die "--build-mod: git archive $src failed"
    fi
    echo "== building mod_rdma from $src against $dir/libiwarp.so"
    timeout 300 make -s -C "$tmp/modules/mod_rdma" ROOT="$tmp" IWARP_LIB="$dir" IWARP_INC="$tmp/include" \
        >"$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log" >&2; die "building mod_rdma failed (log above)"; }
    cp "$tmp/modules/mod_rdma/.libs/mod_rdma.so" "$dir/mod_rdma.so"
    echo "== $dir/mod_rdma.so (RUNPATH $dir)"
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    --build-mod) shift; build_mod "$@"; exit 0 ;;
esac
[ $# -eq 2 ] || { usage >&2; die "usage: scripts/bench-compare.sh OLD_DIR NEW_DIR (see --help)"; }

OLD="$(cd "$1" 2>/dev/null && pwd)" || die "OLD_DIR $1 is not a directory"
NEW="$(cd "$2" 2>/dev/null && pwd)" || die "NEW_DIR $2 is not a directory"
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
    PAIRS="${PAIRS:-1}"; BW_SECS=0.5; LAT_ITERS=2000; RFTP_MEM="${RFTP_MEM:-268435456}"
    MOD_SIZES="${MOD_SIZES:-1M}"; MOD_ROUNDS="${MOD_ROUNDS:-2}"
    MOD_VARIANTS="${MOD_VARIANTS:-sw-dynamic cr-dynamic}"
else
    PAIRS="${PAIRS:-5}"; BW_SECS=2; LAT_ITERS=20000; RFTP_MEM="${RFTP_MEM:-1073741824}"
    MOD_SIZES="${MOD_SIZES:-2K 4K 500K 1M 8M}"; MOD_ROUNDS="${MOD_ROUNDS:-5}"
    MOD_VARIANTS="${MOD_VARIANTS:-plain sw-static sw-dynamic cr-static cr-dynamic}"
fi
CRC_IMPLS="${CRC_IMPLS:-auto avx2}"
PARTS="${PARTS:-perf rftp modrdma}"
RFTP_STREAMS="${RFTP_STREAMS:-1 8}"
MOD_BENCH_SRC="${MOD_BENCH_SRC:-$ROOT}"
OUT="${OUT:-$ROOT/docs/bench/compare}"
mkdir -p "$OUT" || die "cannot create OUT=$OUT"
OUT="$(cd "$OUT" && pwd)"
[[ "$PAIRS" =~ ^[1-9][0-9]*$ ]] || die "PAIRS=$PAIRS: must be a positive integer"
[[ "$RFTP_MEM" =~ ^[1-9][0-9]*$ ]] || die "RFTP_MEM=$RFTP_MEM: must be a byte count"
for p in $PARTS; do
    case "$p" in perf | rftp | modrdma) ;; *) die "PARTS: unknown part $p (use perf, rftp, modrdma)" ;; esac
done
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
command -v python3 >/dev/null || die "python3 missing (apt-get install python3)"

# --- what each part needs ------------------------------------------------
need_bin() { # PART FILE...
    local part="$1" f d
    shift
    for d in "$OLD" "$NEW"; do
        for f in "$@"; do
            [ -f "$d/$f" ] || die "$part: $d/$f missing (copy it from target/release of that build, or leave the part out with PARTS)"
        done
    done
}
has_part perf && need_bin perf iwarp-perf
has_part rftp && need_bin rftp rftp rftpd
MOD_SKIP=""
if has_part modrdma; then
    need_bin modrdma rhttp libiwarp.so
    for d in "$OLD" "$NEW"; do
        [ -f "$d/mod_rdma.so" ] || MOD_SKIP="$d/mod_rdma.so is missing: build it with scripts/bench-compare.sh --build-mod $d SRC (see --help)"
    done
    if [ -z "$MOD_SKIP" ]; then
        if ! command -v apache2 >/dev/null || ! command -v apxs >/dev/null; then
            MOD_SKIP="apache2/apxs missing: run scripts/test-modrdma.sh once (it installs apache2 and apache2-dev)"
        elif [ ! -x "$MOD_BENCH_SRC/scripts/bench-modrdma.sh" ]; then
            MOD_SKIP="MOD_BENCH_SRC=$MOD_BENCH_SRC has no scripts/bench-modrdma.sh"
        fi
    fi
    [ -n "$MOD_SKIP" ] && echo "$PROG: skipping the mod_rdma part: $MOD_SKIP" >&2
fi

# --- state and cleanup ----------------------------------------------------
TMP="$(mktemp -d /dev/shm/bench-compare.XXXXXX)"
chmod 755 "$TMP"
CUR=""      # the timeout process of the run in progress
SERVERS=()  # timeout processes of the rftpd servers
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    set +e
    local p
    for p in $CUR "${SERVERS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in $CUR "${SERVERS[@]}"; do
        timeout 15 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "$PROG: interrupted" >&2; exit 130' INT TERM HUP

# run_bounded SECS LOG CMD...: CMD under timeout, in the background so a
# signal to this script is handled at once (cleanup stops it).
run_bounded() {
    local secs="$1" log="$2" rc=0
    shift 2
    timeout -k 5 "$secs" "$@" >"$log" 2>&1 &
    CUR=$!
    wait "$CUR" || rc=$?
    CUR=""
    return "$rc"
}

JSONL="$OUT/compare.jsonl"
: >"$JSONL"
PYH="$TMP/cmp.py"
cat >"$PYH" <<'EOF'
import json, os, re, statistics, sys, time

def meta(a):
    part, figure, impl, side, pair, first, unit, better, cmd = a
    return {"part": part, "figure": figure, "crc_impl": impl, "side": side, "pair": int(pair),
            "first": first, "unit": unit, "better": better, "cmd": cmd,
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg": open("/proc/loadavg").read().split()[:3]}

def emit(jsonl, rec):
    with open(jsonl, "a") as f:
        f.write(json.dumps(rec) + "\n")
    v = rec.get("value")
    tag = f"{v:.4g} {rec['unit']}" if rec["ok"] else "FAILED: " + rec.get("error", "?")
    print(f"   {rec['side']:3} {tag}")

EXPECT = {"avx512": "avx512-vpclmulqdq", "avx2": "avx2-vpclmulqdq",
          "sse42": "sse42-crc32-3way", "soft": "soft-slice8"}

def perf(jsonl, raw, rc, field, *m):
    rec = meta(m)
    text = open(raw, errors="replace").read()
    obj = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("transport") == "iwarp":
                obj = o
    rec["ok"] = False
    if rc != "0":
        rec["error"] = f"exit {rc}: " + " ".join(text.strip().splitlines()[-2:])[:300]
    elif obj is None or obj.get(field) is None:
        rec["error"] = f"no iWARP JSON with {field} in the output: " + text.strip()[-200:]
    else:
        impl = rec["crc_impl"]
        got = obj.get("crc_impl")
        if impl == "off" and obj.get("crc"):
            rec["error"] = "CRC was on in a CRC-off run"
        elif impl in EXPECT and got != EXPECT[impl]:
            rec["error"] = f"IWARP_CRC={impl} but the run reports crc_impl {got}"
        else:
            rec["ok"] = True
            rec["value"] = float(obj[field])
        rec["crc_impl_ran"] = got
        rec["raw"] = obj
    emit(jsonl, rec)

def rftp(jsonl, log, rc, t0, t1, nbytes, streams, *m):
    rec = meta(m)
    text = open(log, errors="replace").read()
    secs = float(t1) - float(t0)
    rec["ok"] = False
    mm = re.search(r"in ([0-9.]+) s, ([0-9.]+) Gbit/s via (\S+) x(\d+)", text)
    if rc != "0":
        rec["error"] = f"exit {rc}: " + " ".join(text.strip().splitlines()[-2:])[:300]
    elif not mm:
        rec["error"] = "no 'N MiB in S s, G Gbit/s via rdma xN' line: " + text.strip()[-200:]
    elif mm.group(3) != "rdma" or mm.group(4) != streams:
        rec["error"] = f"transfer went via {mm.group(3)} x{mm.group(4)}, not rdma x{streams}"
    else:
        rec["ok"] = True
        rec["value"] = int(nbytes) * 8 / secs / 1e9
        rec["wall_s"] = round(secs, 4)
        rec["rftp_reported_gbps"] = float(mm.group(2))
        rec["rftp_reported_s"] = float(mm.group(1))
    emit(jsonl, rec)

def mod(jsonl, res, rc, log, impl, side, pair, first, cmd):
    rows = []
    if os.path.exists(res):
        rows = [json.loads(l) for l in open(res) if l.strip().startswith("{")]
    rows = [r for r in rows if r.get("test") == "single"]
    if rc != "0" or not rows:
        text = open(log, errors="replace").read() if os.path.exists(log) else ""
        rec = meta(["modrdma", "bench-modrdma.sh run", impl, side, pair, first, "ms", "lower", cmd])
        rec["ok"] = False
        rec["error"] = f"exit {rc}: " + " ".join(text.strip().splitlines()[-3:])[:300]
        emit(jsonl, rec)
        return
    for r in rows:
        fig = f"{r['size']} {r['variant']}, {'unloaded' if r['load'] == 0 else str(r['load']) + ' busy processes'}"
        rec = meta(["modrdma", fig, impl, side, pair, first, "ms", "lower", cmd])
        rec["ok"] = True
        rec["value"] = float(r["median_ms"])
        rec["raw"] = r
        emit(jsonl, rec)

def med(v):
    return statistics.median(v) if v else None

def report(jsonl, md, header, pairs, old, new):
    recs = [json.loads(l) for l in open(jsonl) if l.strip()]
    parts = {"perf": "iwarp-perf (iWARP side, --loopback --json)",
             "rftp": "RFTP (rftpd + rftp on 127.0.0.1, memory to memory)",
             "modrdma": "mod_rdma (bench-modrdma.sh single-client cells, median ms per GET)"}
    L = [open(header).read().rstrip(), ""]
    bad = 0
    for part, title in parts.items():
        pr = [r for r in recs if r["part"] == part]
        if not pr:
            continue
        L += [f"## {title}", "",
              "| figure | CRC impl | old median | new median | new/old (median of pair ratios) | all pair ratios | better is | verdict |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        keys = []
        for r in pr:
            k = (r["figure"], r["crc_impl"])
            if k not in keys:
                keys.append(k)
        cmds = {}
        for fig, impl in keys:
            rs = [r for r in pr if (r["figure"], r["crc_impl"]) == (fig, impl)]
            unit, better = rs[0]["unit"], rs[0]["better"]
            c = rs[0]["cmd"]
            for d in sorted((old, new), key=len, reverse=True):
                c = c.replace(d, "$DIR")
            c = re.sub(r"IWARP_CRC=\S+", "IWARP_CRC=$IMPL", c)
            c = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", c)
            cmds.setdefault(fig + (" (CRC off)" if impl == "off" and part != "perf" else ""), c)
            o = {r["pair"]: r["value"] for r in rs if r["side"] == "old" and r["ok"]}
            n = {r["pair"]: r["value"] for r in rs if r["side"] == "new" and r["ok"]}
            failed = sum(1 for r in rs if not r["ok"])
            ratios = [n[p] / o[p] for p in sorted(o) if p in n and o[p] > 0]
            mr = med(ratios)
            fmt = lambda x: "n/a" if x is None else f"{x:.4g} {unit}"
            if mr is None:
                verdict = "FAILED (no complete pair)"
            elif (better == "higher" and mr < 0.97) or (better == "lower" and mr > 1.03):
                verdict = "**WORSE**"
            else:
                verdict = "same or better"
            if failed and mr is not None:
                verdict += f" (INCOMPLETE: {failed} failed runs, {len(ratios)} of {pairs} pairs)"
            if failed or verdict.startswith("**WORSE") or mr is None:
                bad += 1
            L.append(f"| {fig} | {impl} | {fmt(med(list(o.values())))} | {fmt(med(list(n.values())))} | "
                     f"{'n/a' if mr is None else f'{mr:.3f}x'} | {', '.join(f'{x:.3f}' for x in ratios) or '-'} | "
                     f"{better} | {verdict} |")
        L += ["", "Commands (`$DIR` = OLD_DIR or NEW_DIR, `$IMPL` = the CRC impl):", ""]
        by_cmd = {}
        for fig, c in cmds.items():
            by_cmd.setdefault(c, []).append(fig)
        for c, figs in by_cmd.items():
            L.append(f"- {'every figure' if len(by_cmd) == 1 and len(figs) > 1 else '; '.join(figs)}: `{c}`")
        L.append("")
        errs = [r for r in pr if not r["ok"]]
        if errs:
            L += ["Failed runs:", ""]
            for r in errs:
                L.append(f"- {r['figure']} ({r['crc_impl']}, {r['side']}, pair {r['pair']}): {r.get('error', '?')}")
            L.append("")
    n = len({(r["part"], r["figure"], r["crc_impl"]) for r in recs})
    if n == 0:
        bad = 1
        summary = "nothing was measured"
    elif bad:
        summary = f"{bad} of {n} figure(s) WORSE, failed or incomplete"
    else:
        summary = f"all {n} figures same or better"
    if "mod_rdma part skipped" in L[0]:
        summary += " (the mod_rdma part was skipped, see above)"
    L.append(f"Summary: {summary}.")
    open(md, "w").write("\n".join(L) + "\n")
    print("\n".join(L))
    sys.exit(2 if bad else 0)

cmd = sys.argv[1]
args = sys.argv[2:]
if cmd == "report":
    report(args[0], args[1], args[2], int(args[3]), args[4], args[5])
else:
    {"perf": perf, "rftp": rftp, "mod": mod}[cmd](*args)
EOF

# --- the header ------------------------------------------------------------
cpu_model="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
cpu_flags=""
for f in sse4_2 pclmulqdq avx2 avx512f avx512vl vpclmulqdq; do
    if grep -m1 '^flags' /proc/cpuinfo | grep -qw "$f"; then cpu_flags+="$f "; else cpu_flags+="(no $f) "; fi
done
sums() { # DIR: short sha256 of each binary
    local d="$1" f out=""
    for f in iwarp-perf rftp rftpd rhttp libiwarp.so mod_rdma.so; do
        [ -f "$d/$f" ] && out+="$f $(sha256sum "$d/$f" | cut -c1-12), "
    done
    echo "${out%, }"
}
START="$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
LOAD0="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $PROG: $OLD (old) vs $NEW (new); PAIRS=$PAIRS CRC_IMPLS=\"$CRC_IMPLS\" PARTS=\"$PARTS\" QUICK=$QUICK"
echo "== CPU: $cpu_model; $(nproc) cores; CRC flags: $cpu_flags; load average $LOAD0"
if awk '{ exit !($1 > 0.7) }' /proc/loadavg; then
    echo "$PROG: warning: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy" >&2
fi

# Each CRC impl must exist on this CPU (iwarp-perf names the variable).
if [ -f "$OLD/iwarp-perf" ]; then
    for impl in $CRC_IMPLS; do
        run_bounded 60 "$TMP/probe.log" env IWARP_CRC="$impl" "$OLD/iwarp-perf" write_lat --loopback -s 8 -n 10 --json ||
            die "IWARP_CRC=$impl does not run here: $(tail -1 "$TMP/probe.log") (set CRC_IMPLS to back ends this CPU has)"
    done
fi
# Every path is absolute from here on; rftp runs where a stray file could go.
mkdir -p "$TMP/root"
cd "$TMP/root"

# pair_order P: "old new" for odd pairs, "new old" for even ones.
pair_order() { if [ $(($1 % 2)) = 1 ]; then echo "old new"; else echo "new old"; fi; }
dir_of() { if [ "$1" = old ]; then echo "$OLD"; else echo "$NEW"; fi; }

# --- perf --------------------------------------------------------------------
# perf_figure IMPL FIGURE FIELD UNIT BETTER ARGS...
perf_figure() {
    local impl="$1" fig="$2" field="$3" unit="$4" better="$5" p side first rc d
    shift 5
    echo "-- perf: $fig [CRC $impl]"
    for ((p = 1; p <= PAIRS; p++)); do
        first=""
        for side in $(pair_order "$p"); do
            first="${first:-$side}"
            d="$(dir_of "$side")"
            local envs=()
            [ "$impl" != off ] && envs=(IWARP_CRC="$impl")
            rc=0
            run_bounded 300 "$TMP/perf.log" env "${envs[@]}" "$d/iwarp-perf" "$@" --json || rc=$?
            python3 "$PYH" perf "$JSONL" "$TMP/perf.log" "$rc" "$field" \
                perf "$fig" "$impl" "$side" "$p" "$first" "$unit" "$better" \
                "${envs[*]}${envs[*]:+ }$d/iwarp-perf $* --json"
        done
    done
}
perf_part() {
    local impl bw=(--loopback -D "$BW_SECS") lat=(--loopback -s 8 -n "$LAT_ITERS")
    for impl in $CRC_IMPLS; do
        perf_figure "$impl" "RDMA Write 1 MiB" bw_gbit_s Gbit/s higher write_bw "${bw[@]}" -s 1048576
        perf_figure "$impl" "RDMA Read 1 MiB" bw_gbit_s Gbit/s higher read_bw "${bw[@]}" -s 1048576
        perf_figure "$impl" "Send 1 MiB" bw_gbit_s Gbit/s higher send_bw "${bw[@]}" -s 1048576
        perf_figure "$impl" "RDMA Write 64 KiB" bw_gbit_s Gbit/s higher write_bw "${bw[@]}" -s 65536
        perf_figure "$impl" "RDMA Read 64 KiB" bw_gbit_s Gbit/s higher read_bw "${bw[@]}" -s 65536
        perf_figure "$impl" "Send 64 KiB" bw_gbit_s Gbit/s higher send_bw "${bw[@]}" -s 65536
        perf_figure "$impl" "RDMA Write ping-pong 8 B (median)" t_median_us us lower write_lat "${lat[@]}"
        perf_figure "$impl" "Send ping-pong 8 B (median)" t_median_us us lower send_lat "${lat[@]}"
        perf_figure "$impl" "RDMA Read 8 B, full round trip (median)" t_median_us us lower read_lat "${lat[@]}"
        perf_figure "$impl" "RDMA Write ping-pong 8 B, busy-poll (median)" t_median_us us lower write_lat "${lat[@]}" --busy-poll
        perf_figure "$impl" "Send ping-pong 8 B, busy-poll (median)" t_median_us us lower send_lat "${lat[@]}" --busy-poll
        perf_figure "$impl" "64 B RDMA Write message rate, depth 64" msg_rate_mmsg_s Mmsg/s higher write_bw "${bw[@]}" -s 64 -t 64
    done
    # No CRC runs, so the CRC back end plays no part: measured once.
    perf_figure off "RDMA Write 1 MiB, CRC off" bw_gbit_s Gbit/s higher write_bw "${bw[@]}" -s 1048576 --crc off
}

# --- rftp --------------------------------------------------------------------
# Server ports from below the ephemeral range, distinct within this run
# (a port taken from bind(:0) and released can be taken by an outgoing
# connection or handed out twice before the server binds it).
# shellcheck source=scripts/lib/free-port.sh
. "$ROOT/scripts/lib/free-port.sh"
free_port() { free_port_once "$TMP/ports.given"; }
wait_port() { # PORT LOG
    local i
    for i in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        [ "$i" = 100 ] || sleep 0.1
    done
    die "rftpd did not listen on 127.0.0.1:$1 within 10 s: $(tail -3 "$2")"
}
# start_rftpd SIDE IMPL CRC(true|false): prints the port
declare -A RPORT
start_rftpd() {
    local side="$1" impl="$2" crc="$3" d port conf envs=()
    d="$(dir_of "$side")"
    port="$(free_port)"
    conf="$TMP/rftpd-$side.toml"
    cat >"$conf" <<EOF
listen = "127.0.0.1:$port"
root = "$TMP/root"
max_streams = 16
block_size = 4194304
iodepth = 64
crc = $crc
max_mem_bytes = 1099511627776
session_mem_budget_bytes = 68719476736
data_timeout_secs = 60
[[users]]
name = "bench"
password = "bench"
EOF
    [ "$impl" != off ] && envs=(IWARP_CRC="$impl")
    timeout -k 5 14400 env "${envs[@]}" RUST_LOG=warn "$d/rftpd" -c "$conf" >"$TMP/rftpd-$side.log" 2>&1 &
    SERVERS+=($!)
    wait_port "$port" "$TMP/rftpd-$side.log"
    RPORT[$side]="$port"
}
stop_rftpds() {
    local p
    for p in "${SERVERS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${SERVERS[@]}"; do
        timeout 15 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
    done
    SERVERS=()
}
rftp_config() { # IMPL CRC(true|false)
    local impl="$1" crc="$2" s dir p side first d rc t0 t1 envs=() extra=()
    [ "$impl" != off ] && envs=(IWARP_CRC="$impl")
    [ "$crc" = true ] && extra=(--crc)
    start_rftpd old "$impl" "$crc"
    start_rftpd new "$impl" "$crc"
    for s in $RFTP_STREAMS; do
        for dir in get put; do
            local fig="r$dir $s streams"
            [ "$s" = 1 ] && fig="r$dir 1 stream"
            echo "-- rftp: $fig [CRC $impl]"
            for ((p = 1; p <= PAIRS; p++)); do
                first=""
                for side in $(pair_order "$p"); do
                    first="${first:-$side}"
                    d="$(dir_of "$side")"
                    local args=("$dir" --mem "$RFTP_MEM" "ftp://bench:bench@127.0.0.1:${RPORT[$side]}/x" --streams "$s" -q "${extra[@]}")
                    rc=0
                    t0="$(date +%s.%N)"
                    run_bounded 300 "$TMP/rftp.log" env "${envs[@]}" "$d/rftp" "${args[@]}" || rc=$?
                    t1="$(date +%s.%N)"
                    python3 "$PYH" rftp "$JSONL" "$TMP/rftp.log" "$rc" "$t0" "$t1" "$RFTP_MEM" "$s" \
                        rftp "$fig" "$impl" "$side" "$p" "$first" Gbit/s higher \
                        "${envs[*]}${envs[*]:+ }$d/rftp ${args[*]} (server: ${envs[*]}${envs[*]:+ }$d/rftpd -c rftpd.toml; rftpd.toml: $(grep -v '^\[\|^name\|^password\|^listen\|^root' "$TMP/rftpd-$side.toml" | tr '\n' ' ')and user bench)"
                done
            done
        done
    done
    stop_rftpds
}
rftp_part() {
    local impl
    rftp_config off false
    for impl in $CRC_IMPLS; do rftp_config "$impl" true; done
}

# --- mod_rdma ------------------------------------------------------------------
mod_part() {
    local impl p side first d rc outd
    for impl in $CRC_IMPLS; do
        echo "-- modrdma: sizes $MOD_SIZES, variants $MOD_VARIANTS [CRC $impl]"
        for ((p = 1; p <= PAIRS; p++)); do
            first=""
            for side in $(pair_order "$p"); do
                first="${first:-$side}"
                d="$(dir_of "$side")"
                outd="$TMP/mod-$impl-$p-$side"
                mkdir -p "$outd"
                local envs=(LD_LIBRARY_PATH="$d" IWARP_CRC="$impl" RHTTP="$d/rhttp" MOD="$d/mod_rdma.so"
                    SINGLE_ONLY=1 ROUNDS="$MOD_ROUNDS" VARIANTS="$MOD_VARIANTS" BENCH_SIZES="$MOD_SIZES")
                echo "   $side: bench-modrdma.sh ..."
                rc=0
                # CARGO_TARGET_DIR unset: bench-modrdma.sh expects its tree's target/.
                run_bounded 1800 "$outd/log" env -u CARGO_TARGET_DIR "${envs[@]}" OUT="$outd" \
                    "$MOD_BENCH_SRC/scripts/bench-modrdma.sh" || rc=$?
                python3 "$PYH" mod "$JSONL" "$outd/modrdma_results.json" "$rc" "$outd/log" "$impl" "$side" "$p" "$first" \
                    "$(printf '%q ' "${envs[@]}")OUT=TMPDIR $MOD_BENCH_SRC/scripts/bench-modrdma.sh"
                if [ "$rc" != 0 ] && grep -q "cargo build failed\|building mod_rdma failed\|building regcost failed" "$outd/log"; then
                    echo "$PROG: bench-modrdma.sh could not build its own tree $MOD_BENCH_SRC ($(grep -m1 'bench-modrdma:' "$outd/log")); it needs a tree that builds (cargo build --release -p iwarp-ffi -p rhttp there): set MOD_BENCH_SRC. Stopping the mod_rdma part." >&2
                    return 0
                fi
            done
        done
    done
}

T_START=$SECONDS
declare -A TOOK
for part in perf rftp modrdma; do
    has_part "$part" || continue
    t=$SECONDS
    case "$part" in
        perf) echo "== perf"; perf_part ;;
        rftp) echo "== rftp"; rftp_part ;;
        modrdma)
            if [ -n "$MOD_SKIP" ]; then
                echo "== modrdma: skipped: $MOD_SKIP"
            else
                echo "== modrdma"; mod_part
            fi
            ;;
    esac
    TOOK[$part]=$((SECONDS - t))
done

# --- report ----------------------------------------------------------------------
HDR="$TMP/header.md"
{
    echo "# Before/after comparison"
    echo
    echo "Generated by \`scripts/bench-compare.sh\`$([ "$QUICK" = 1 ] && echo ' with QUICK=1 (smoke test: 1 pair, short runs; not a measurement)')."
    echo
    echo "- Started $START, finished $(date -u '+%Y-%m-%d %H:%M:%S UTC'); took $((SECONDS - T_START)) s ($(for k in "${!TOOK[@]}"; do printf '%s %s s; ' "$k" "${TOOK[$k]}"; done | sed 's/; $//'))."
    echo "- CPU: $cpu_model, $(nproc) cores; CRC-relevant flags: $cpu_flags"
    echo "- Kernel $(uname -r); load average $LOAD0 before, $(cut -d' ' -f1-3 /proc/loadavg) after."
    echo "- OLD_DIR \`$OLD\`: $(sums "$OLD")"
    echo "- NEW_DIR \`$NEW\`: $(sums "$NEW")"
    echo "- PAIRS=$PAIRS (pair 1 old first, pair 2 new first, alternating), CRC_IMPLS=\"$CRC_IMPLS\", PARTS=\"$PARTS\"; bandwidth -D $BW_SECS, latency -n $LAT_ITERS; RFTP_MEM=$RFTP_MEM, RFTP_STREAMS=\"$RFTP_STREAMS\"; MOD_SIZES=\"$MOD_SIZES\", MOD_VARIANTS=\"$MOD_VARIANTS\", MOD_ROUNDS=$MOD_ROUNDS."
    [ -n "$MOD_SKIP" ] && has_part modrdma && echo "- mod_rdma part skipped: $MOD_SKIP"
    echo "- Verdict: new/old is the median of the per-pair ratios; \"same or better\" when it is >= 0.97 (higher is better) or <= 1.03 (lower is better). CRC impl \"off\": figures measured without MPA CRC (once; the back end plays no part). Every run: \`compare.jsonl\`."
} >"$HDR"
rc=0
python3 "$PYH" report "$JSONL" "$OUT/compare.md" "$HDR" "$PAIRS" "$OLD" "$NEW" || rc=$?
echo "== wrote $OUT/compare.md and $OUT/compare.jsonl"
exit "$rc"
