#!/usr/bin/env python3
"""Plot and tables from scripts/bench-modrdma.sh.

usage: plot_modrdma.py RESULTS.json OUT.png OUT.md

RESULTS.json has one JSON object per line: "single" (median per-request
time by load, size and variant), "multi" (aggregate throughput by number of
clients) and "regcost" (registration cost by size and method).
"""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZES = ["2K", "4K", "500K", "1M", "8M"]
VARIANTS = {
    "curl": "curl, plain Apache",
    "plain": "rhttp --plain, plain Apache",
    "sw-static": "mod_rdma server-writes, static",
    "sw-dynamic": "mod_rdma server-writes, dynamic",
    "cr-static": "mod_rdma client-reads, static",
    "cr-dynamic": "mod_rdma client-reads, dynamic",
}


def main():
    res, png, md = sys.argv[1:4]
    rows = [json.loads(line) for line in open(res) if line.strip()]
    single = {(r["load"], r["size"], r["variant"]): r for r in rows if r["test"] == "single"}
    # Repeated multi-client runs: the median of each point.
    groups = {}
    for r in rows:
        if r["test"] == "multi":
            groups.setdefault((r["clients"], r["variant"]), []).append(r["mb_per_s"])
    multi = [{"clients": c, "variant": v, "mb_per_s": statistics.median(x), "runs": len(x)}
             for (c, v), x in groups.items()]
    reg = [r for r in rows if r["test"] == "regcost"]

    fig, ax = plt.subplots(1, 3, figsize=(18, 5.5))
    for i, load in enumerate((0, 2)):
        a = ax[i]
        for v, label in VARIANTS.items():
            ys = [single[(load, s, v)]["median_ms"] for s in SIZES if (load, s, v) in single]
            if len(ys) == len(SIZES):
                a.plot(SIZES, ys, marker="o", label=label)
        a.set_yscale("log")
        a.set_xlabel("file size")
        a.set_ylabel("median time per GET (ms, log)")
        a.set_title("single client, " + ("no load" if load == 0 else "two busy processes"))
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    a = ax[2]
    for v, label in (("plain", "plain Apache (rhttp --plain)"),
                     ("sw-static", "mod_rdma server-writes"),
                     ("cr-static", "mod_rdma client-reads")):
        pts = sorted((r["clients"], r["mb_per_s"]) for r in multi if r["variant"] == v)
        if pts:
            a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    a.set_xlabel("clients (each: five 1 MB GETs on one connection)")
    a.set_ylabel("aggregate MB/s")
    a.set_title("multiple clients")
    a.grid(True, alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)

    out = []
    for load in (0, 2):
        out.append(f"### Single client, {'no load' if load == 0 else 'two busy background processes'}\n")
        out.append("Median ms per GET over one keep-alive connection (ratio to rhttp --plain "
                   "against plain Apache in brackets).\n")
        out.append("| size | " + " | ".join(VARIANTS[v] for v in VARIANTS) + " |")
        out.append("| --- " * (len(VARIANTS) + 1) + "|")
        for s in SIZES:
            base = single.get((load, s, "plain"), {}).get("median_ms")
            cells = []
            for v in VARIANTS:
                r = single.get((load, s, v))
                if not r:
                    cells.append("not measured")
                    continue
                ratio = f" ({r['median_ms'] / base:.2f}x)" if base and v != "plain" else ""
                cells.append(f"{r['median_ms']:.3f}{ratio}")
            out.append(f"| {s} | " + " | ".join(cells) + " |")
        out.append("")
    # The targets, for every RDMA variant: unloaded 1 MB GET <= 1.25x plain
    # Apache (rhttp --plain), and under load no worse than plain (<= 1.0x).
    b0 = single.get((0, "1M", "plain"), {}).get("median_ms")
    b2 = single.get((2, "1M", "plain"), {}).get("median_ms")
    if b0 and b2:
        out.append("### Targets (1 MB GET against plain Apache)\n")
        out.append(f"Plain Apache (rhttp --plain): {b0:.3f} ms unloaded, {b2:.3f} ms under load.\n")
        out.append("| variant | unloaded ms | ratio (target <= 1.25) | under load ms | ratio (target <= 1.00) |")
        out.append("| --- | --- | --- | --- | --- |")
        for v in ("sw-static", "sw-dynamic", "cr-static", "cr-dynamic"):
            r0 = single.get((0, "1M", v), {}).get("median_ms")
            r2 = single.get((2, "1M", v), {}).get("median_ms")
            if not (r0 and r2):
                continue
            m0 = "met" if r0 <= 1.25 * b0 else "NOT met"
            m2 = "met" if r2 <= b2 else "NOT met"
            out.append(f"| {VARIANTS[v]} | {r0:.3f} | {r0 / b0:.2f}x, **{m0}** | "
                       f"{r2:.3f} | {r2 / b2:.2f}x, **{m2}** |")
        out.append("")
    out.append("### Multiple clients (five 1 MB GETs each, one connection per client)\n")
    out.append("Aggregate MB/s = all bytes / wall time from starting the first client process "
               "to the end of the last (process start-up included); median of the runs.\n")
    out.append("| clients | plain Apache MB/s | mod_rdma server-writes MB/s | mod_rdma client-reads MB/s |")
    out.append("| --- | --- | --- | --- |")
    by = {(r["clients"], r["variant"]): r["mb_per_s"] for r in multi}
    for c in sorted({r["clients"] for r in multi}):
        cells = [f"{by[(c, v)]:.0f}" if (c, v) in by else "not measured"
                 for v in ("plain", "sw-static", "cr-static")]
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("### Registration cost (median of 101, microseconds)\n")
    out.append("| size | reg_mr + dereg of existing memory | mmap + reg + dereg + munmap (dynamic) "
               "| memcpy into the static buffer (static) | alloc_mr + dereg |")
    out.append("| --- | --- | --- | --- | --- |")
    rc = {(r["size"], r["method"]): r["median_us"] for r in reg}
    for size in sorted({r["size"] for r in reg}):
        cells = [f"{rc.get((size, m), float('nan')):.2f}" for m in ("reg", "mmap", "copy", "alloc")]
        out.append(f"| {size} | " + " | ".join(cells) + " |")
    out.append("")
    with open(md, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
