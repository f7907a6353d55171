#!/usr/bin/env python3
"""Table and plot of scripts/bench-wan.sh results.

Usage: plot_wan.py RESULTS.jsonl SUMMARY.md PLOT.png

RESULTS.jsonl has one JSON object per line (kind "matrix" or "seed"; rtt_ms,
loss_pct, rate, tool, bytes, median_s, fraction of the link rate,
emu_cpu_pct, cpu). The summary is a markdown table per kind; the plot has one
panel per loss rate: fraction of the link rate against RTT, a line per tool.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def summary(rows):
    out = []
    cpu = next((r["cpu"] for r in rows if r.get("cpu")), "unknown CPU")
    matrix = [r for r in rows if r["kind"] == "matrix"]
    if matrix:
        tools = list(dict.fromkeys(r["tool"] for r in matrix))
        cells = list(dict.fromkeys((r["rtt_ms"], r["loss_pct"], r["rate"]) for r in matrix))
        out.append(f"Fraction of the link rate (median), {cpu}; emulator CPU share in brackets.")
        out.append("")
        out.append("| RTT ms | loss % | rate | " + " | ".join(tools) + " |")
        out.append("| --- | --- | --- | " + " | ".join("---" for _ in tools) + " |")
        for rtt, loss, rate in cells:
            line = [str(rtt), str(loss), rate]
            for t in tools:
                r = next((x for x in matrix if (x["rtt_ms"], x["loss_pct"], x["rate"], x["tool"]) == (rtt, loss, rate, t)), None)
                if r is None:
                    line.append("")
                else:
                    line.append(f"{fmt(r['fraction'], '.2f')} ({fmt(r.get('emu_cpu_pct'), '.0f')} %)")
            out.append("| " + " | ".join(line) + " |")
    seed = [r for r in rows if r["kind"] == "seed"]
    if seed:
        out.append("")
        out.append(f"Seed table: time per file (median; ratio = first tool / last tool), {cpu}.")
        out.append("")
        tools = list(dict.fromkeys(r["tool"] for r in seed))
        out.append("| RTT ms | size | " + " | ".join(f"{t} s" for t in tools) + " | ratio |")
        out.append("| --- | --- | " + " | ".join("---" for _ in tools) + " | --- |")
        for rtt, b in sorted(set((r["rtt_ms"], r["bytes"]) for r in seed)):
            ts = [
                next((r["median_s"] for r in seed if (r["rtt_ms"], r["bytes"], r["tool"]) == (rtt, b, t)), None)
                for t in tools
            ]
            ratio = fmt(ts[0] / ts[-1], ".2f") if len(ts) > 1 and ts[0] and ts[-1] else "n/a"
            out.append(f"| {rtt} | {b} | " + " | ".join(fmt(t, ".3f") for t in ts) + f" | {ratio} |")
    return "\n".join(out) + "\n"


def plot(rows, path):
    matrix = [r for r in rows if r["kind"] == "matrix" and r["fraction"] is not None]
    if not matrix:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = sorted(set(r["loss_pct"] for r in matrix))
    fig, axes = plt.subplots(1, len(losses), figsize=(4.5 * len(losses), 4), squeeze=False)
    for ax, loss in zip(axes[0], losses):
        for tool in dict.fromkeys(r["tool"] for r in matrix):
            pts = sorted((r["rtt_ms"], r["fraction"]) for r in matrix if r["loss_pct"] == loss and r["tool"] == tool)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=tool)
        ax.set_title(f"loss {loss} %")
        ax.set_xlabel("RTT (ms)")
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("fraction of link rate")
    axes[0][-1].legend(fontsize="small")
    fig.suptitle(f"WAN transfers through wanem at {matrix[0]['rate']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    text = summary(rows)
    with open(sys.argv[2], "w") as f:
        f.write(text)
    sys.stdout.write(text)
    plot(rows, sys.argv[3])


if __name__ == "__main__":
    main()
