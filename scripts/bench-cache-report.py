#!/usr/bin/env python3
"""Tables, targets and Figures 9-11 of scripts/bench-cache.sh.

  bench-cache-report.py RESULTS.jsonl OUTDIR RUN.txt

RESULTS.jsonl holds one ccload JSON summary per run, labelled
"workload=W,mode=M,threads=N,rep=R". Per (workload, mode, threads) the
median over reps is reported; every ratio is the median of the per-rep
ratios (runs of one rep ran back to back, so they are the pairs).
Writes OUTDIR/results.md and the PNGs; prints results.md.
"""
import json
import statistics
import sys

MODES = ["none", "tcp", "sockets", "rdma", "nginx"]


def load(path):
    runs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            lab = dict(kv.split("=", 1) for kv in r["label"].split(","))
            r["workload"], r["mode"] = lab["workload"], lab["mode"]
            r["threads"], r["rep"] = int(lab["threads"]), int(lab["rep"])
            runs.append(r)
    return runs


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pick(runs, w, m, n):
    return [r for r in runs if r["workload"] == w and r["mode"] == m and r["threads"] == n]


def ok_rps(r):
    """Throughput of 200 responses only (errors are not throughput)."""
    ok = r["status"].get("200", 0)
    return r["req_per_s"] * ok / r["requests"] if r["requests"] else 0.0


def paired(runs, w, n1, m1, n2, m2, f):
    """Median over reps of f(run1) / f(run2)."""
    a = {r["rep"]: r for r in pick(runs, w, m1, n1)}
    b = {r["rep"]: r for r in pick(runs, w, m2, n2)}
    rs = [f(a[k]) / f(b[k]) for k in a if k in b and f(b[k])]
    return (med(rs), len(rs))


def fmt(x, d=1):
    return "—" if x is None else f"{x:.{d}f}"


def main():
    path, out, runinfo = sys.argv[1], sys.argv[2], sys.argv[3]
    runs = load(path)
    if not runs:
        print("no runs in", path)
        return 1
    workloads = sorted({r["workload"] for r in runs}, key=lambda w: (w != "single", w))
    threads = sorted({r["threads"] for r in runs})
    modes = [m for m in MODES if any(r["mode"] == m for r in runs)]
    lo, hi = threads[0], threads[-1]
    md = ["# Coherent cache benchmark (scripts/bench-cache.sh)", ""]
    md += [open(runinfo).read().strip().replace("\n", "  \n"), ""]
    for w in workloads:
        md += [f"## Workload `{w}`", "",
               "Mean response time in ms (p99 in parentheses), and throughput of 200 responses in req/s; median over reps.", ""]
        md += ["| compute threads | " + " | ".join(f"{m} ms" for m in modes) + " | " + " | ".join(f"{m} req/s" for m in modes) + " | errors |"]
        md += ["|---" * (1 + 2 * len(modes) + 1) + "|"]
        for n in threads:
            lat = []
            thr = []
            errs = 0
            for m in modes:
                rs = pick(runs, w, m, n)
                errs += sum(r["errors"] + sum(v for k, v in r["status"].items() if k != "200") for r in rs)
                lat.append(f"{fmt(med([r['mean_us'] / 1000 for r in rs]), 2)} ({fmt(med([r['p99_us'] / 1000 for r in rs]), 1)})")
                thr.append(fmt(med([ok_rps(r) for r in rs]), 0))
            md.append(f"| {n} | " + " | ".join(lat) + " | " + " | ".join(thr) + f" | {errs} |")
        md.append("")

    # Figure 10: breakdown at the lowest and highest load, workload single.
    w0 = workloads[0]
    bd_modes = [m for m in modes if m != "nginx"]
    md += [f"## Response-time breakdown (workload `{w0}`, mean µs)", "",
           "client+HTTP = ccload's response time minus ccproxy's `total` (network, HTTP parsing and writing, both ends); "
           "module = the proxy module (cache lookup/store); check = version check; app server = fetch from Apache+mod_ccache (misses, or every request in mode none).", "",
           "| compute threads | mode | client+HTTP | module | check | app server | total |", "|---|---|---|---|---|---|---|"]
    bd = {}
    for n in sorted({lo, hi}):
        for m in bd_modes:
            rs = pick(runs, w0, m, n)
            if not rs:
                continue
            st = lambda k: med([r["stage_mean_us"].get(k, 0.0) for r in rs])  # noqa: E731
            total = med([r["mean_us"] for r in rs])
            inproxy = st("total") or 0.0
            row = {"client+HTTP": max(total - inproxy, 0.0), "module": st("module") or 0.0,
                   "check": st("check") or 0.0, "app server": st("fetch") or 0.0}
            bd[(n, m)] = row
            md.append(f"| {n} | {m} | " + " | ".join(fmt(row[k], 0) for k in row) + f" | {fmt(total, 0)} |")
    md.append("")

    # Targets.
    md += ["## Targets of issue 13", ""]
    for w in workloads:
        r1, k1 = paired(runs, w, lo, "rdma", lo, "none", ok_rps)
        met = r1 is not None and r1 >= 1.5
        md.append(f"- `{w}`: rdma throughput / no cache at {lo} compute threads = **{fmt(r1, 2)}x** (target ≥ 1.5x; {'met' if met else 'NOT met'}; median of {k1} pairs)")
        r2, k2 = paired(runs, w, hi, "rdma", lo, "rdma", lambda r: r["mean_us"])
        met = r2 is not None and r2 <= 1.2
        md.append(f"- `{w}`: rdma response time at {hi} / at {lo} compute threads = **{fmt(r2, 2)}x** (target ≤ 1.2x; {'met' if met else 'NOT met'}; {k2} pairs)")
        for m in ("tcp", "sockets", "none"):
            if m in modes:
                r3, _ = paired(runs, w, hi, m, lo, m, lambda r: r["mean_us"])
                md.append(f"  - {m}: response time at {hi} / at {lo} compute threads = {fmt(r3, 2)}x")
        if "nginx" in modes:
            parts, allmet = [], True
            for n in threads:
                r4, _ = paired(runs, w, n, "nginx", n, "rdma", lambda r: r["mean_us"])
                parts.append(f"{n}: {fmt(r4, 2)}x")
                allmet &= r4 is not None and r4 > 1.0
            md.append(f"- `{w}`: nginx revalidation response time / rdma, per compute-thread count: {', '.join(parts)} (target: rdma faster at every load, > 1x; {'met' if allmet else 'NOT met'})")
    md.append("")
    text = "\n".join(md) + "\n"
    with open(f"{out}/results.md", "w") as f:
        f.write(text)
    print(text)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no figures (apt-get install python3-matplotlib)")
        return 0
    style = {"none": "k:o", "tcp": "b-s", "sockets": "g-^", "rdma": "r-o", "nginx": "m--d"}
    # Figure 9: response time against compute threads.
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for m in modes:
            ys = [med([r["mean_us"] / 1000 for r in pick(runs, w, m, n)]) for n in threads]
            ax.plot(threads, ys, style[m], label=m)
        ax.set_xlabel("compute threads on the application server")
        ax.set_ylabel("mean response time (ms)")
        ax.set_title(f"Figure 9: response time, workload {w}")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/fig9-response-time.png", dpi=110)
    # Figure 11: throughput.
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for m in modes:
            ys = [med([ok_rps(r) for r in pick(runs, w, m, n)]) for n in threads]
            ax.plot(threads, ys, style[m], label=m)
        ax.set_xlabel("compute threads on the application server")
        ax.set_ylabel("throughput (200 responses/s)")
        ax.set_title(f"Figure 11: throughput, workload {w}")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/fig11-throughput.png", dpi=110)
    # Figure 10: breakdown.
    keys = ["client+HTTP", "module", "check", "app server"]
    colors = ["#bbbbbb", "#f0a030", "#d03030", "#3060c0"]
    labels, bottoms = [], []
    bars = {k: [] for k in keys}
    for n in sorted({lo, hi}):
        for m in bd_modes:
            if (n, m) in bd:
                labels.append(f"{m}\n{n} thr")
                for k in keys:
                    bars[k].append(bd[(n, m)][k] / 1000)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels)), 4))
    bottoms = [0.0] * len(labels)
    for k, c in zip(keys, colors):
        ax.bar(labels, bars[k], bottom=bottoms, color=c, label=k)
        bottoms = [b + v for b, v in zip(bottoms, bars[k])]
    ax.set_ylabel("mean response time (ms)")
    ax.set_title(f"Figure 10: response-time breakdown, workload {w0}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/fig10-breakdown.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
