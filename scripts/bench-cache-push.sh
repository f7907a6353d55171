#!/usr/bin/env bash
# Figure 12 of the coherent cache (issue 13): wasted updates and misses of
# the pull, push and hybrid policies on the same Zipf workload.
#
# Per repetition and policy, on 127.0.0.1: a fresh ccappd (--push-policy
# P, updates at UPDATE_RATE/s on random *accessed* documents, the seed's
# update server), Debian apache2 + mod_ccache (shared by all runs), and a
# fresh ccproxy (rdma checks, cache state region read by RDMA Read, empty
# cache); after a WARMUP_SECONDS warm-up (default 10; counters are taken
# against it), scripts/cache_zipf.py sends REQ_RATE requests/s for SECONDS with
# Zipf(ZIPF) popularity over DOCS documents, the same seed for every
# policy of a repetition. The proxy's counters (/_ccproxy/stats) give:
#
#   misses          requests that found the document absent or stale and
#                   fetched it from the application server
#   wasted updates  pushed copies replaced (by a newer push or a fetch) or
#                   evicted before any request was served from them
#
# Writes, under OUT (default docs/bench/cache): push-pull.md (table of the
# medians over REPS repetitions), push-pull.json (every run), push-pull.png.
#
#   scripts/bench-cache-push.sh                     # about 6 minutes
#   REPS=5 SECONDS_PER_RUN=60 scripts/bench-cache-push.sh
#   DOCS=200 ZIPF=1.0 REQ_RATE=200 UPDATE_RATE=10 HYBRID=20 CACHE_DOCS=0 ...
set -uo pipefail

T="$(mktemp -d /tmp/bench-cache-push.XXXXXX)"
# shellcheck source=scripts/cache-push-common.sh
. "$(dirname "$0")/cache-push-common.sh"
cd "$ROOT" || exit 1
REPS="${REPS:-3}"
SECS="${SECONDS_PER_RUN:-30}"
WARM="${WARMUP_SECONDS:-10}"
DOCS="${DOCS:-200}"
ZIPF="${ZIPF:-1.0}"
REQ_RATE="${REQ_RATE:-200}"
UPDATE_RATE="${UPDATE_RATE:-10}"
HYBRID="${HYBRID:-20}"
CACHE_DOCS="${CACHE_DOCS:-0}"
OUT="${OUT:-$ROOT/docs/bench/cache}"

cleanup() {
    cp_cleanup
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
die() { echo "bench-cache-push: $*" >&2; exit 1; }

cp_prereqs || die "prerequisites"
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || {
    echo "installing python3-matplotlib"
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq python3-matplotlib >/dev/null
}
cp_layout
P_PX=$(cp_free_port)
P_STATE=$(cp_free_port)
# Apache serves the files ccappd writes; the first ccappd creates them.
cp_start_appd --docs "$DOCS" --doc-size 4096 || die "ccappd did not start: $(tail -5 "$T/ccappd.log")"
cp_start_apache || die "apache2 did not start: $(cat "$T/logs/error.log" 2>/dev/null)"
cp_stop_pid "$APPD_PID"

RUNS="$T/runs.jsonl"
REG=0
for rep in $(seq 1 "$REPS"); do
    for pol in pull push hybrid; do
        cp_start_appd --docs "$DOCS" --doc-size 4096 --push-policy "$pol" --hybrid-percent "$HYBRID" \
            --update-rate "$UPDATE_RATE" --update-select accessed --update-log "$T/updates-$rep-$pol.log" ||
            die "ccappd ($pol) did not start: $(tail -5 "$T/ccappd.log")"
        PX_PIDS=""
        cp_start_proxy "$pol" "$P_PX" --mode rdma --state-rdma-listen "127.0.0.1:$P_STATE" \
            --cache-docs "$CACHE_DOCS" || die "ccproxy did not start: $(tail -5 "$T/ccproxy-$pol.log")"
        REG=$((REG + 1))
        cp_registered "$REG" || die "ccproxy did not register with ccappd"
        # Warm-up: the cache fills and the lists settle; counters after it
        # are the baseline the measured run is taken against.
        timeout $((WARM * 3 + 60)) /usr/bin/python3 scripts/cache_zipf.py --url "http://127.0.0.1:$P_PX/docs/" \
            --docs "$DOCS" --zipf "$ZIPF" --rate "$REQ_RATE" --seconds "$WARM" --threads 4 \
            --seed $((rep + 1000)) >/dev/null || die "warm-up load failed"
        warm=$(cp_stats "$P_PX") || die "no stats from ccproxy"
        u0=$(wc -l <"$T/updates-$rep-$pol.log")
        load=$(timeout $((SECS * 3 + 60)) /usr/bin/python3 scripts/cache_zipf.py --url "http://127.0.0.1:$P_PX/docs/" \
            --docs "$DOCS" --zipf "$ZIPF" --rate "$REQ_RATE" --seconds "$SECS" --threads 4 --seed "$rep") ||
            die "load failed"
        stats=$(cp_stats "$P_PX") || die "no stats from ccproxy"
        updates=$(($(wc -l <"$T/updates-$rep-$pol.log") - u0))
        echo "{\"rep\":$rep,\"policy\":\"$pol\",\"updates\":$updates,\"load\":$load,\"warm\":$warm,\"end\":$stats}" | tee -a "$RUNS"
        cp_stop_pid "$PX_PID"
        cp_stop_pid "$APPD_PID"
        APPD_PID=""
    done
done

CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
mkdir -p "$OUT"
/usr/bin/python3 - "$RUNS" "$OUT" "$CPU" "$REPS" "$SECS" "$DOCS" "$ZIPF" "$REQ_RATE" "$UPDATE_RATE" "$HYBRID" "$CACHE_DOCS" "$WARM" <<'EOF'
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
runs_path, out, cpu, reps, secs, docs, zipf, rate, urate, hyb, cdocs, warm = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_path)]
# Counters of the measured run: end minus warm-up (pushed_pending and
# cached_docs are levels, taken at the end).
for r in runs:
    r["proxy"] = {k: (v - r["warm"][k] if k not in ("pushed_pending", "cached_docs") else v)
                  for k, v in r["end"].items()}
json.dump(runs, open(f"{out}/push-pull.json", "w"), indent=1)
pols = ["pull", "push", "hybrid"]
keys = [("updates", lambda r: r["updates"]),
        ("requests", lambda r: r["proxy"]["requests"]),
        ("misses", lambda r: r["proxy"]["misses"]),
        ("misses (stale)", lambda r: r["proxy"]["misses_stale"]),
        ("wasted updates", lambda r: r["proxy"]["wasted_updates"]),
        ("pushes stored", lambda r: r["proxy"]["pushes_stored"]),
        ("pushed copies served", lambda r: r["proxy"]["pushed_hits"]),
        ("pushed, unread at end", lambda r: r["proxy"]["pushed_pending"]),
        ("hit ratio %", lambda r: round(100 * r["proxy"]["hits"] / max(1, r["proxy"]["requests"]), 1)),
        ("p50 ms", lambda r: r["load"]["p50_ms"]),
        ("p99 ms", lambda r: r["load"]["p99_ms"])]
med = {p: {k: statistics.median(f(r) for r in runs if r["policy"] == p) for k, f in keys} for p in pols}
lines = [f"Zipf {zipf} over {docs} documents of 4 KiB, {rate} requests/s for {secs} s, "
         f"{urate} updates/s on random accessed documents, hybrid = top {hyb} % of the "
         f"most-recently-accessed list, {('cache limit ' + cdocs + ' documents') if cdocs != '0' else 'no cache limit'}; "
         f"counted after a {warm} s warm-up; "
         f"median of {reps} repetitions (one run per policy each); CPU: {cpu}.", "",
         "| | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
for k, _ in keys:
    lines.append(f"| {k} | " + " | ".join(str(med[p][k]) for p in pols) + " |")
h, pu, pl = med["hybrid"], med["push"], med["pull"]
lines += ["",
          f"hybrid / push, wasted updates: {h['wasted updates']} / {pu['wasted updates']}"
          + (f" = {h['wasted updates'] / pu['wasted updates']:.2f}" if pu["wasted updates"] else ""),
          f"hybrid / pull, misses: {h['misses']} / {pl['misses']}"
          + (f" = {h['misses'] / pl['misses']:.2f}" if pl["misses"] else ""),
          f"per repetition, hybrid wasted < push wasted: "
          + str(sum(1 for i in range(1, int(reps) + 1)
                    if [r for r in runs if r["rep"] == i and r["policy"] == "hybrid"][0]["proxy"]["wasted_updates"]
                    < [r for r in runs if r["rep"] == i and r["policy"] == "push"][0]["proxy"]["wasted_updates"]))
          + f" of {reps}; hybrid misses < pull misses: "
          + str(sum(1 for i in range(1, int(reps) + 1)
                    if [r for r in runs if r["rep"] == i and r["policy"] == "hybrid"][0]["proxy"]["misses"]
                    < [r for r in runs if r["rep"] == i and r["policy"] == "pull"][0]["proxy"]["misses"]))
          + f" of {reps}"]
open(f"{out}/push-pull.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
fig, ax = plt.subplots(figsize=(6, 3.6))
x = range(len(pols))
w = 0.38
ax.bar([i - w / 2 for i in x], [med[p]["wasted updates"] for p in pols], w, label="wasted updates")
ax.bar([i + w / 2 for i in x], [med[p]["misses"] for p in pols], w, label="misses")
ax.set_xticks(list(x), pols)
ax.set_ylabel(f"count per {secs} s run (median of {reps})")
ax.set_title(f"Push / pull / hybrid ({hyb} %): Zipf {zipf}, {docs} docs, {urate} upd/s")
ax.legend()
fig.tight_layout()
fig.savefig(f"{out}/push-pull.png", dpi=110)
EOF
echo "wrote $OUT/push-pull.md, push-pull.json, push-pull.png"
