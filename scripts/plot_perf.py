#!/usr/bin/env python3
"""Plots and a summary table from the JSON lines of scripts/bench-perf.sh.

usage: plot_perf.py DIR

Reads DIR/*.json (one JSON object per line, as printed by
`iwarp-perf --json`), writes DIR/perf_sweep.png (bandwidth and latency
against message size for iWARP with CRC on and off and for TCP) and
DIR/summary.md (the table of docs/BENCHMARKS.md: the median of the
repetitions of each figure on each side, and the median of the iWARP/TCP
ratios of the back-to-back pairs, with the target).
"""
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def split(rows):
    """(iwarp, tcp) measurement lists from compare or single rows."""
    iw, tcp = [], []
    for r in rows:
        if "iwarp" in r:
            iw.append(r["iwarp"])
            tcp.append(r["tcp"])
        elif r.get("transport") == "tcp":
            tcp.append(r)
        else:
            iw.append(r)
    return iw, tcp


def human_size(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"


def plot(d):
    bw_on = split(load(os.path.join(d, "sweep_write_bw_crc_on.json")))
    bw_off = split(load(os.path.join(d, "sweep_write_bw_crc_off.json")))
    lat_on = split(load(os.path.join(d, "sweep_write_lat_crc_on.json")))
    lat_off = split(load(os.path.join(d, "sweep_write_lat_crc_off.json")))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    series = [
        ("iWARP RDMA Write, CRC on", bw_on[0], "C0", "o-"),
        ("iWARP RDMA Write, CRC off", bw_off[0], "C1", "s-"),
        ("TCP (same pattern)", bw_on[1], "C2", "^--"),
    ]
    for label, rows, color, style in series:
        if rows:
            ax1.plot([r["size"] for r in rows], [r["bw_gbit_s"] for r in rows], style, color=color, label=label, markersize=4)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("message size (bytes)")
    ax1.set_ylabel("bandwidth (Gbit/s)")
    ax1.set_title("write_bw, depth 128, loopback")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend()
    series = [
        ("iWARP RDMA Write ping-pong, CRC on", lat_on[0], "C0", "o-"),
        ("iWARP RDMA Write ping-pong, CRC off", lat_off[0], "C1", "s-"),
        ("TCP ping-pong", lat_on[1], "C2", "^--"),
    ]
    for label, rows, color, style in series:
        if rows:
            ax2.plot([r["size"] for r in rows], [r["t_median_us"] for r in rows], style, color=color, label=label, markersize=4)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("message size (bytes)")
    ax2.set_ylabel("median one-way latency (us, half round trip)")
    ax2.set_title("write_lat, loopback")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    out = os.path.join(d, "perf_sweep.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


# (file, label, metric, target ratio, "higher"/"lower" is better for iWARP)
FIGURES = [
    ("write_bw_1m", "RDMA Write 1 MiB, CRC on", "bw", 0.95, "higher"),
    ("write_bw_1m_crc_off", "RDMA Write 1 MiB, CRC off", "bw", None, "higher"),
    ("read_bw_1m", "RDMA Read 1 MiB, CRC on", "bw", 0.9, "higher"),
    ("send_bw_1m", "Send 1 MiB, CRC on", "bw", None, "higher"),
    ("write_bw_64k", "RDMA Write 64 KiB, CRC on", "bw", 0.9, "higher"),
    ("read_bw_64k", "RDMA Read 64 KiB, CRC on", "bw", 0.9, "higher"),
    ("send_bw_64k", "Send 64 KiB, CRC on", "bw", 0.9, "higher"),
    ("write_lat_8", "RDMA Write ping-pong 8 B (median)", "lat", 1.2, "lower"),
    ("send_lat_8", "Send ping-pong 8 B (median)", "lat", 1.2, "lower"),
    ("read_lat_8", "RDMA Read 8 B, full round trip (median)", "lat", None, "lower"),
    ("write_lat_8_busy", "RDMA Write ping-pong 8 B, both busy-poll (median)", "lat", 1.2, "lower"),
    ("send_lat_8_busy", "Send ping-pong 8 B, both busy-poll (median)", "lat", 1.2, "lower"),
    ("msgrate_64", "64 B RDMA Write message rate, depth 64", "rate", None, "higher"),
    ("rss_write_1m_d16", "RSS, 1 MiB write_bw depth 16 (both ends)", "rss", None, "lower"),
]


def value(m, metric):
    return {
        "bw": m["bw_gbit_s"],
        "lat": m["t_median_us"],
        "rate": m["msg_rate_mmsg_s"],
        "rss": m["peak_rss_kib"] / 1024.0,
    }[metric]


def fmt(v, metric):
    return {
        "bw": f"{v:.2f} Gbit/s",
        "lat": f"{v:.2f} us",
        "rate": f"{v:.3f} Mmsg/s",
        "rss": f"{v:.1f} MiB",
    }[metric]


def summary(d):
    lines = [
        "| figure | iWARP (median) | TCP (median) | iWARP/TCP (median of pairs) | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, label, metric, target, better in FIGURES:
        rows = load(os.path.join(d, name + ".json"))
        if not rows:
            continue
        iw, tcp = split(rows)
        # Each repetition is an iWARP run followed at once by its TCP run:
        # the ratio is taken within each pair (the machine drifts between
        # pairs), and the table gives the median of the pair ratios next to
        # the median of each side.
        pairs = list(zip(iw, tcp))
        va = statistics.median(value(p[0], metric) for p in pairs)
        vb = statistics.median(value(p[1], metric) for p in pairs)
        ratios = [value(a, metric) / value(b, metric) for a, b in pairs if value(b, metric)]
        ratio = statistics.median(ratios) if ratios else float("nan")
        spread = ""
        if len(pairs) > 1:
            vals = sorted(value(p[0], metric) for p in pairs)
            spread = f" (runs: {', '.join(fmt(v, metric).split()[0] for v in vals)})"
        if metric == "rss":
            tgt, met = "< 64 MiB", "yes" if va < 64 else "NO"
        elif target is None:
            tgt, met = "published", "-"
        elif better == "higher":
            tgt, met = f">= {target}x", "yes" if ratio >= target else "NO"
        else:
            tgt, met = f"<= {target}x", "yes" if ratio <= target else "NO"
        per_pair = ""
        if len(ratios) > 1:
            per_pair = f" (pairs: {', '.join(f'{r:.2f}' for r in sorted(ratios))})"
        lines.append(
            f"| {label} | {fmt(va, metric)}{spread} | {fmt(vb, metric)} | {ratio:.3f}x{per_pair} | {tgt} | {met} |"
        )
    text = "\n".join(lines) + "\n"
    out = os.path.join(d, "summary.md")
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {out}")


def sweep_table(d):
    on = split(load(os.path.join(d, "sweep_write_bw_crc_on.json")))
    off = split(load(os.path.join(d, "sweep_write_bw_crc_off.json")))
    if not on[0]:
        return
    off_by = {r["size"]: r for r in off[0]}
    lines = [
        "| size | iWARP CRC on (Gbit/s) | iWARP CRC off (Gbit/s) | TCP (Gbit/s) | CRC on / TCP |",
        "|---|---|---|---|---|",
    ]
    for a, t in zip(*on):
        o = off_by.get(a["size"])
        lines.append(
            f"| {human_size(a['size'])} | {a['bw_gbit_s']:.2f} | {o['bw_gbit_s'] if o else float('nan'):.2f} | {t['bw_gbit_s']:.2f} | {a['bw_gbit_s'] / t['bw_gbit_s']:.2f}x |"
        )
    out = os.path.join(d, "sweep.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    plot(d)
    summary(d)
    sweep_table(d)


if __name__ == "__main__":
    main()
