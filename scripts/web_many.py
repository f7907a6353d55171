#!/usr/bin/env python3
"""Helpers of scripts/bench-web-many.sh: the objects, the clients' request
lists, each run's statistics, the SHA-256 check, and the report (markdown
table and PNG plot).

  web_many.py objects DOCS                     make the seed and Zipf objects
  web_many.py plan DOCS WORKLOAD CLIENTS REPEAT DIR
                                               one request list per client
  web_many.py runstats DOCS DIR                statistics of one run (JSON)
  web_many.py check DOCS DIR                   SHA-256 of every body saved
  web_many.py report RESULTS.jsonl OUT.md OUT.png
  web_many.py cpu PID                          CPU seconds of PID's tree

Workloads (the objects live in DOCS):
  seed  five 1 MiB files (s1..s5.bin) per client, fetched REPEAT times
        in turn over its one connection, like the seed's wget of five
        1 MB files;
  zipf  26 objects of 2 KiB..8 MiB (two per power of two), popularity
        Zipf (s = 1) by size rank, smallest first (small objects are the
        popular ones on the web); 30 * REPEAT requests per client, drawn
        with the client's own seed, so every variant fetches the same
        sequence.
"""
import hashlib
import json
import os
import random
import re
import statistics
import sys

SEED_FILES = [f"s{i}.bin" for i in range(1, 6)]
ZIPF_SIZES = [2048 << k for k in range(13)]  # 2 KiB .. 8 MiB


def zipf_objects():
    return [(f"z{size}_{j}.bin", size) for size in ZIPF_SIZES for j in (0, 1)]


def cmd_objects(docs):
    rnd = random.Random(20261127)
    os.makedirs(docs, exist_ok=True)
    manifest = {}
    for name, size in [(n, 1 << 20) for n in SEED_FILES] + zipf_objects():
        data = rnd.randbytes(size)
        with open(os.path.join(docs, name), "wb") as f:
            f.write(data)
        manifest[name] = {"size": size, "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(docs, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def cmd_plan(docs, workload, clients, repeat, outdir):
    clients, repeat = int(clients), int(repeat)
    os.makedirs(outdir, exist_ok=True)
    objs = zipf_objects()
    weights = [1.0 / (rank + 1) for rank in range(len(objs))]
    for c in range(clients):
        if workload == "seed":
            names = SEED_FILES * repeat
        elif workload == "zipf":
            rnd = random.Random(1000 + c)
            names = [n for n, _ in rnd.choices(objs, weights, k=30 * repeat)]
        else:
            sys.exit(f"web_many.py: unknown workload {workload!r} (seed or zipf)")
        with open(os.path.join(outdir, f"list{c}"), "w") as f:
            f.write("\n".join(names) + "\n")


LINE = re.compile(
    r"^GET http://[^ ]*/([^/ ]+): (\d+) (\d+) bytes via (.*?) in ([0-9.]+) ms"
)


def parse_client(path):
    """The transfer lines of one rhttp run: (name, status, bytes, via, ms)."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                name, st, n, via, ms = m.groups()
                out.append((name, int(st), int(n), via, float(ms)))
    return out


def cmd_runstats(docs, rundir):
    manifest = json.load(open(os.path.join(docs, "manifest.json")))
    times, nbytes, rdma, inline, errors = [], 0, 0, 0, []
    c = 0
    while os.path.exists(os.path.join(rundir, f"list{c}")):
        want = open(os.path.join(rundir, f"list{c}")).read().split()
        got = parse_client(os.path.join(rundir, f"err{c}"))
        if len(got) != len(want):
            errors.append(f"client {c}: {len(got)} transfers reported, {len(want)} asked")
        for (name, st, n, via, ms), w in zip(got, want):
            if name != w or st != 200 or n != manifest[w]["size"]:
                errors.append(f"client {c}: {name} {st} {n} bytes, expected {w} 200 "
                              f"{manifest[w]['size']}")
            times.append(ms)
            nbytes += n
            if via.startswith("RDMA"):
                rdma += 1
            elif "RDMA-Inline" in via or "fallback" in via:
                # The server answered in the HTTP response: rhttp says "plain
                # HTTP (RDMA-Inline)" since session 11, "plain HTTP
                # (fallback)" before.
                inline += 1
        c += 1
    times.sort()
    res = {
        "requests": len(times),
        "bytes": nbytes,
        "by_rdma": rdma,
        "inline": inline,
        "p50_ms": round(statistics.median(times), 4) if times else None,
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 4) if times else None,
        "errors": errors[:5],
    }
    print(json.dumps(res))


def cmd_check(docs, rundir):
    """Every body each client saved (rundir/c<C>/<i>) against the manifest."""
    manifest = json.load(open(os.path.join(docs, "manifest.json")))
    bad, n, c = [], 0, 0
    while os.path.exists(os.path.join(rundir, f"list{c}")):
        want = open(os.path.join(rundir, f"list{c}")).read().split()
        for i, w in enumerate(want):
            p = os.path.join(rundir, f"c{c}", str(i))
            try:
                h = hashlib.sha256(open(p, "rb").read()).hexdigest()
            except OSError as e:
                bad.append(f"client {c} request {i} ({w}): {e}")
                continue
            n += 1
            if h != manifest[w]["sha256"]:
                bad.append(f"client {c} request {i} ({w}): SHA-256 {h[:16]}... differs")
        c += 1
    for b in bad[:10]:
        print(b)
    print(f"{n} bodies checked, {len(bad)} bad")
    sys.exit(1 if bad or n == 0 else 0)


def cmd_cpu(pid):
    """CPU seconds of an Apache parent PID, its children (all threads: the
    utime/stime of /proc/PID/stat are the whole process's) and, through the
    parent's cutime/cstime, its children that exited and were reaped."""
    tck = os.sysconf("SC_CLK_TCK")

    def stat(p):
        with open(f"/proc/{p}/stat") as f:
            s = f.read()
        return s[s.rindex(")") + 2:].split()  # fields from 3 (state) on

    total = 0
    f = stat(pid)
    total += sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            g = stat(d)
        except OSError:
            continue
        if g[1] == str(pid):  # ppid
            total += int(g[11]) + int(g[12])
    print(f"{total / tck:.3f}")


VARIANT_NAMES = {
    "plain-prefork": "plain Apache, prefork (sendfile)",
    "plain-event": "plain Apache, event (sendfile)",
    "sw-dynamic": "mod_rdma server-writes, dynamic",
    "cr-dynamic": "mod_rdma client-reads, dynamic",
    "sw-static": "mod_rdma server-writes, static",
    "cr-static": "mod_rdma client-reads, static",
    "sw-dynamic-nocrc": "mod_rdma server-writes, dynamic, CRC off",
    "cr-dynamic-nocrc": "mod_rdma client-reads, dynamic, CRC off",
    "sw-static-nocrc": "mod_rdma server-writes, static, CRC off",
    "cr-static-nocrc": "mod_rdma client-reads, static, CRC off",
}


def cmd_report(results, out_md, out_png):
    rows = [json.loads(l) for l in open(results) if l.strip()]
    rows = [r for r in rows if r.get("test") == "many"]
    cells = {}
    for r in rows:
        cells.setdefault((r["workload"], r["variant"], r["clients"]), []).append(r)
    workloads = sorted({k[0] for k in cells}, key=lambda w: ["seed", "zipf"].index(w)
                       if w in ("seed", "zipf") else 9)
    variants = [v for v in VARIANT_NAMES if any(k[1] == v for k in cells)]
    med = statistics.median
    lines = []
    summary = {}
    for w in workloads:
        title = ("five 1 MiB files per client" if w == "seed"
                 else "Zipf mix of 2 KiB-8 MiB objects")
        counts = sorted({k[2] for k in cells if k[0] == w})
        stat = {}
        for c in counts:
            for v in variants:
                rs = cells.get((w, v, c))
                if rs:
                    stat[(v, c)] = {f: med([x[f] for x in rs])
                                    for f in ("mb_per_s", "cpu_s_per_gb", "p50_ms", "p99_ms")}
                    summary[(w, v, c)] = (stat[(v, c)]["mb_per_s"], stat[(v, c)]["cpu_s_per_gb"])
        head = ["| clients | " + " | ".join(VARIANT_NAMES[v] for v in variants) + " |",
                "| --- |" + " --- |" * len(variants)]

        def table(fmt):
            out = list(head)
            for c in counts:
                base = stat.get(("plain-prefork", c))
                row = [str(c)] + [fmt(stat[(v, c)], base, v) if (v, c) in stat else ""
                                  for v in variants]
                out.append("| " + " | ".join(row) + " |")
            return out

        def ratio(x, b, v, f):
            return f" ({x[f] / b[f]:.2f}x)" if b and v != "plain-prefork" and b[f] else ""

        n = sorted({len(v) for k, v in cells.items() if k[0] == w})
        lines += [f"#### {title} ({w}): aggregate MB/s", "",
                  "All bytes / wall time from starting the first client to the end of the last "
                  "(client start-up included); in brackets the ratio to plain Apache prefork. "
                  f"Median of {', '.join(map(str, n))} runs.", ""]
        lines += table(lambda x, b, v: f"{x['mb_per_s']:.0f}{ratio(x, b, v, 'mb_per_s')}")
        lines += ["", f"#### {title} ({w}): server CPU seconds per GB served", "",
                  "CPU of every process and thread of the Apache serving the run (its cgroup's "
                  "cpuacct.usage) over the bytes served; in brackets the ratio to plain Apache "
                  "prefork.", ""]
        lines += table(lambda x, b, v: f"{x['cpu_s_per_gb']:.2f}"
                       f"{ratio(x, b, v, 'cpu_s_per_gb')}")
        lines += ["", f"#### {title} ({w}): ms per request, p50 / p99", "",
                  "rhttp's own time per request, all requests of a run pooled; median over the "
                  "runs.", ""]
        lines += table(lambda x, b, v: f"{x['p50_ms']:.2f} / {x['p99_ms']:.1f}")
        lines.append("")
    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("web_many.py: matplotlib missing (apt-get install python3-matplotlib): no plot",
              file=sys.stderr)
        return
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for i, w in enumerate(workloads):
        for v in variants:
            cs = sorted(c for (ww, vv, c) in summary if ww == w and vv == v)
            if not cs:
                continue
            style = "--" if v.startswith("plain") else "-"
            axes[0][i].plot(cs, [summary[(w, v, c)][0] for c in cs], style, marker="o",
                            label=VARIANT_NAMES[v])
            axes[1][i].plot(cs, [summary[(w, v, c)][1] for c in cs], style, marker="o",
                            label=VARIANT_NAMES[v])
        for ax, yl in ((axes[0][i], "aggregate MB/s"), (axes[1][i], "server CPU s per GB")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients (one keep-alive connection each)")
            ax.set_ylabel(yl)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        axes[0][i].set_title("five 1 MiB files per client" if w == "seed"
                             else "Zipf mix, 2 KiB-8 MiB")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)


def main(argv):
    cmds = {"objects": (cmd_objects, 1), "plan": (cmd_plan, 5), "runstats": (cmd_runstats, 2),
            "check": (cmd_check, 2), "report": (cmd_report, 3), "cpu": (cmd_cpu, 1)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        sys.exit(__doc__)
    fn, _ = cmds[argv[1]]
    fn(*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
