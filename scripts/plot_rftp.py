#!/usr/bin/env python3
"""Plot the RFTP block-size x I/O-depth sweep (docs/bench/rftp_sweep.json,
written by scripts/bench-rftp.sh) as a PNG: throughput against I/O depth,
one line per block size, with the window limit bs*depth/RTT dashed.

Usage: scripts/plot_rftp.py SWEEP.json OUT.png
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_rftp: matplotlib is missing; install python3-matplotlib (apt)", file=sys.stderr)
        return 1
    data = json.load(open(sys.argv[1]))
    pts = data.get("points", [])
    if not pts:
        print(f"plot_rftp: {sys.argv[1]} has no sweep points; run scripts/bench-rftp.sh", file=sys.stderr)
        return 1
    c = data.get("conditions", {})
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, bs in enumerate(sorted({p["block_size"] for p in pts})):
        row = sorted((p for p in pts if p["block_size"] == bs), key=lambda p: p["iodepth"])
        color = f"C{i}"
        ax.plot([p["iodepth"] for p in row], [p["gbps"] for p in row], "o-", color=color,
                label=f"{bs >> 10} KiB blocks")
        ax.plot([p["iodepth"] for p in row], [p["window_limit_gbps"] for p in row], "--",
                color=color, alpha=0.4)
    top = max(p["gbps"] for p in pts)
    ceiling = c.get("bridge_tcp_ceiling_gbps")
    if ceiling:
        ax.axhline(ceiling, color="k", linestyle=":", label=f"one TCP stream through the bridge ({ceiling:.1f})")
        top = max(top, ceiling)
    ax.set_ylim(0, top * 1.3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("I/O depth (blocks in flight per stream)")
    ax.set_ylabel("Gbit/s (memory to memory, 1 stream)")
    rtt = c.get("sweep_rtt_ms")
    ax.set_title(f"rftp rget over veth + delay-bridge, RTT {rtt} ms; dashed: block*depth/RTT")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.text(0.01, 0.01, f"{c.get('date_utc', '')} UTC, {c.get('cpus', '?')} CPUs, load {' '.join(c.get('loadavg_at_end', []))}",
             fontsize=7, alpha=0.7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"plot_rftp: wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
