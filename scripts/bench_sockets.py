#!/usr/bin/env python3
"""Sockets over iWARP benchmarks (issue 12), every figure a ratio against
kernel TCP measured in the same run, as median of several pairs.

  scripts/bench-sockets.sh [PAIRS]        (builds, then runs this)

Parts:
  iperf3   unmodified iperf3, client and server under libiwarp_preload.so
           (enhanced, basic) against kernel TCP, one stream, loopback;
           throughput and CPU seconds per GB (both ends, from iperf3's
           own CPU accounting)
  pingpong iwarp-rstream 64-byte ping-pong with busy polling (rstream's
           non-blocking loop; --busy-poll on the rsockets side) against
           the same loop over kernel TCP (--tcp): enhanced, basic, and
           basic without its per-message credit updates (--ack-each off)
  coalesce iwarp-rstream bandwidth with 64 B - 4 KiB writes: Gbit/s and
           data messages per write (the coalescing by append)
  sweep    iwarp-rstream -S all (blocking), kernel TCP / basic / enhanced:
           bandwidth and latency against message size, plotted

Results: docs/bench/sockets/ (raw JSON lines, summary.md, sweep.png).
"""
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
RSTREAM = os.path.join(REL, "iwarp-rstream")
PRELOAD = os.path.join(REL, "libiwarp_preload.so")
OUT = os.path.join(ROOT, "docs", "bench", "sockets")
PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
PORT = 17471


def run(cmd, env=None, timeout=180):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)


def pair_run(server_cmd, client_cmd, env=None, timeout=180):
    """Starts the server, runs the client, returns (client, server) stdout."""
    e = dict(os.environ)
    if env:
        e.update(env)
    srv = subprocess.Popen(server_cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
    try:
        cli = subprocess.run(client_cmd, env=e, capture_output=True, text=True, timeout=timeout)
        so, se = srv.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
        raise
    if cli.returncode != 0 or srv.returncode != 0:
        raise RuntimeError(f"failed: {client_cmd}\n{cli.stderr[-2000:]}\n{se[-2000:]}")
    return cli.stdout, so


def cpu_model():
    model, flags = "?", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    return model, ("avx512f" in flags.split()), ("sse4_2" in flags.split())


def iperf3(config, secs=3):
    env = {}
    if config != "kernel":
        env = {
            "LD_PRELOAD": PRELOAD,
            "IWARP_SOCKETS_DESIGN": config,
            "IWARP_PRELOAD_PORTS": str(PORT),
        }
    srv = ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(PORT), "-J"]
    cli = ["iperf3", "-c", "127.0.0.1", "-p", str(PORT), "-t", str(secs), "-J"]
    out, _ = pair_run(srv, cli, env)
    j = json.loads(out)
    end = j["end"]
    bps = end["sum_received"]["bits_per_second"]
    nbytes = end["sum_received"]["bytes"]
    cpu = end["cpu_utilization_percent"]
    secs_run = end["sum_received"]["seconds"]
    cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100.0 * secs_run
    return {"config": config, "gbps": bps / 1e9, "bytes": nbytes,
            "cpu_s_per_gb": cpu_s / (nbytes / 1e9), "host_cpu": cpu["host_total"],
            "remote_cpu": cpu["remote_total"]}


def rstream(args, design, tcp=False, busy=False):
    srv = [RSTREAM, "-b", "127.0.0.1", "-p", str(PORT), "--json", "--design", design] + args
    cli = [RSTREAM, "-s", "127.0.0.1", "-p", str(PORT), "--json", "--design", design] + args
    if tcp:
        srv.append("--tcp")
        cli.append("--tcp")
    if busy:
        srv.append("--busy-poll")
        cli.append("--busy-poll")
    out, _ = pair_run(srv, cli, timeout=600)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def median(xs):
    return statistics.median(xs)


def main():
    os.makedirs(OUT, exist_ok=True)
    model, avx512, sse42 = cpu_model()
    raw = open(os.path.join(OUT, "raw.jsonl"), "w")
    summary = [f"CPU: {model}; AVX-512: {'yes' if avx512 else 'no'}; SSE4.2 (crc32): {'yes' if sse42 else 'no'}; "
               f"{os.cpu_count()} cores; {PAIRS} pairs per figure; "
               f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]

    # iperf3: pairs of (kernel, enhanced, basic), order rotated per pair.
    runs = {"kernel": [], "enhanced": [], "basic": []}
    order = ["kernel", "enhanced", "basic"]
    for i in range(PAIRS):
        for c in order[i % 3:] + order[:i % 3]:
            r = iperf3(c)
            runs[c].append(r)
            raw.write(json.dumps({"part": "iperf3", "pair": i, **r}) + "\n")
    ratios_ek = [runs["enhanced"][i]["gbps"] / runs["kernel"][i]["gbps"] for i in range(PAIRS)]
    ratios_eb = [runs["enhanced"][i]["gbps"] / runs["basic"][i]["gbps"] for i in range(PAIRS)]
    summary += ["## iperf3 (1 stream, loopback, 3 s, both ends preloaded)", "",
                "| config | Gbit/s (median) | runs | CPU s/GB both ends (median) |", "|---|---|---|---|"]
    for c in order:
        g = [r["gbps"] for r in runs[c]]
        cpu = [r["cpu_s_per_gb"] for r in runs[c]]
        summary.append(f"| {c} | {median(g):.2f} | {', '.join(f'{x:.2f}' for x in g)} | {median(cpu):.3f} |")
    summary += ["", f"enhanced / kernel TCP: median of pairs {median(ratios_ek):.3f}x "
                f"(pairs: {', '.join(f'{x:.2f}' for x in ratios_ek)})",
                f"enhanced / basic: median of pairs {median(ratios_eb):.3f}x "
                f"(pairs: {', '.join(f'{x:.2f}' for x in ratios_eb)})", ""]

    # 64-byte ping-pong, busy polling: enhanced, basic, and basic without
    # its per-message credit updates (which enhancement is worth what).
    pp = {"enhanced": ("enhanced", []), "basic": ("basic", []),
          "basic, ring credits only": ("basic", ["--ack-each", "off"])}
    names = list(pp)
    lat = {n: [] for n in names}
    tcp_lat = {n: [] for n in names}
    for i in range(PAIRS):
        for n in names[i % 3:] + names[:i % 3]:
            design, extra = pp[n]
            rows = rstream(["-S", "64", "-C", "1", "-I", "20000"] + extra, design, tcp=True, busy=True)
            for r in rows:
                raw.write(json.dumps({"part": "pingpong", "config": n, "pair": i, **r}) + "\n")
            cl = [r for r in rows if r["role"] == "client"]
            lat[n].append(next(r["usec_per_xfer"] for r in cl if r["transport"] != "tcp"))
            tcp_lat[n].append(next(r["usec_per_xfer"] for r in cl if r["transport"] == "tcp"))
    summary += ["## 64-byte ping-pong, busy polling (one-way usec, half the round trip)", "",
                "| design | rsockets (median) | kernel TCP same runs (median) | rsockets / TCP (median of pairs) |",
                "|---|---|---|---|"]
    for n in names:
        r = [a / b for a, b in zip(lat[n], tcp_lat[n])]
        summary.append(f"| {n} | {median(lat[n]):.2f} ({', '.join(f'{x:.2f}' for x in lat[n])}) | "
                       f"{median(tcp_lat[n]):.2f} | {median(r):.3f}x ({', '.join(f'{x:.2f}' for x in r)}) |")
    for other in names[1:]:
        eb = [a / b for a, b in zip(lat["enhanced"], lat[other])]
        summary += ["", f"enhanced / {other} latency: median of pairs {median(eb):.3f}x "
                    f"(pairs: {', '.join(f'{x:.2f}' for x in eb)})"]
    summary.append("")

    # Coalescing: small writes, bandwidth test, messages per write.
    summary += ["## Coalescing by append (bandwidth test, blocking, 20000 writes each way)", "",
                "| write size | enhanced Gbit/s | enhanced data msgs / write | basic Gbit/s | basic msgs / write | kernel TCP Gbit/s |",
                "|---|---|---|---|---|---|"]
    for size in (64, 256, 1024, 4096):
        cells = {}
        for d in ("enhanced", "basic"):
            g, m, t = [], [], []
            for i in range(max(1, PAIRS // 2)):
                rows = rstream(["-T", "b", "-S", str(size), "-C", "20000", "-I", "1"], d, tcp=True)
                for r in rows:
                    raw.write(json.dumps({"part": "coalesce", "pair": i, **r}) + "\n")
                cl = [r for r in rows if r["role"] == "client"]
                rs = next(r for r in cl if r["transport"] != "tcp")
                g.append(rs["gbps"])
                m.append(rs["data_msgs"] / max(1, rs["writes"]))
                t.append(next(r["gbps"] for r in cl if r["transport"] == "tcp"))
            cells[d] = (median(g), median(m), median(t))
        summary.append(f"| {size} B | {cells['enhanced'][0]:.3f} | {cells['enhanced'][1]:.3f} | "
                       f"{cells['basic'][0]:.3f} | {cells['basic'][1]:.3f} | {cells['enhanced'][2]:.3f} |")
    summary.append("")

    # Sweep and plot.
    sweep = {}
    for d in ("enhanced", "basic"):
        rows = rstream(["-T", "b", "-S", "all"], d, tcp=True)
        for r in rows:
            raw.write(json.dumps({"part": "sweep", **r}) + "\n")
        sweep[d] = [r for r in rows if r["role"] == "client"]
    raw.close()
    try:
        plot(sweep)
        summary.append("![bandwidth and latency against message size](sweep.png)")
    except Exception as e:  # matplotlib missing: say so, keep the numbers
        summary.append(f"(plot not drawn: {e})")
    with open(os.path.join(OUT, "summary.md"), "w") as f:
        f.write("\n".join(summary) + "\n")
    print("\n".join(summary))


def plot(sweep):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {
        "kernel TCP": [r for r in sweep["enhanced"] if r["transport"] == "tcp"],
        "rsockets basic": [r for r in sweep["basic"] if r["transport"] != "tcp"],
        "rsockets enhanced": [r for r in sweep["enhanced"] if r["transport"] != "tcp"],
    }
    for label, rows in series.items():
        bw = sorted((r["bytes"], r["gbps"]) for r in rows if r["name"].endswith("_bw"))
        lt = sorted((r["bytes"], r["usec_per_xfer"]) for r in rows if r["name"].endswith("_lat"))
        if bw:
            a1.plot([x for x, _ in bw], [y for _, y in bw], marker="o", label=label)
        if lt:
            a2.plot([x for x, _ in lt], [y for _, y in lt], marker="o", label=label)
    for a, t, y in ((a1, "bandwidth", "Gbit/s"), (a2, "latency (one way)", "usec")):
        a.set_xscale("log", base=2)
        a.set_xlabel("message size (bytes)")
        a.set_ylabel(y)
        a.set_title(t)
        a.grid(True, alpha=0.3)
        a.legend()
    a2.set_yscale("log")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "sweep.png"), dpi=100)


if __name__ == "__main__":
    main()
