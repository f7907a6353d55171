#!/usr/bin/env python3
"""Read a before/after comparison against an A/A run of the same harness.

    scripts/compare_noise.py AB.jsonl AA.jsonl [--md OUT.md]

AB.jsonl is the `compare.jsonl` of `scripts/bench-compare.sh OLD NEW`,
AA.jsonl the one of `scripts/bench-compare.sh OLD OLD` (the same binaries
in both slots, run the same way). For every figure it takes the median of
the per-pair ratios, oriented so that above 1 means "the second slot is
worse" (old/new for higher-is-better figures, new/old for times). The A/A
run shows how far that number strays with identical binaries on this
machine: per part (perf, rftp, modrdma) its largest value is the noise
band. A before/after figure counts as a regression only if it is worse
than that band. Also printed per part: the geometric mean of the ratios
(an overall drift of one slot against the other) and how many figures the
harness's fixed 3 % threshold flags in each run.
"""

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict


def load(path):
    """{(part, figure, crc_impl): worse-is-above-1 median pair ratio}."""
    runs = defaultdict(dict)
    better = {}
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        if not r.get("ok") or r.get("value") is None:
            continue
        key = (r["part"], r["figure"], r["crc_impl"])
        runs[key].setdefault(r["pair"], {})[r["side"]] = float(r["value"])
        better[key] = r["better"]
    out = {}
    for key, pairs in runs.items():
        ratios = []
        for p in pairs.values():
            if "old" in p and "new" in p and p["old"] > 0 and p["new"] > 0:
                if better[key] == "higher":
                    ratios.append(p["old"] / p["new"])
                else:
                    ratios.append(p["new"] / p["old"])
        if ratios:
            out[key] = statistics.median(ratios)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ab", help="compare.jsonl of the before/after run")
    ap.add_argument("aa", help="compare.jsonl of the A/A run (old against old)")
    ap.add_argument("--md", help="also write the tables to this markdown file")
    a = ap.parse_args()
    ab, aa = load(a.ab), load(a.aa)
    if not ab or not aa:
        sys.exit("compare_noise: no complete pairs in one of the inputs; check the paths")
    parts = sorted({k[0] for k in ab})
    lines = []
    for part in parts:
        keys = sorted(k for k in ab if k[0] == part)
        band = max((v for k, v in aa.items() if k[0] == part), default=float("nan"))
        gm = lambda d: math.exp(statistics.mean(math.log(d[k]) for k in d if k[0] == part))
        flag = lambda d: sum(1 for k in d if k[0] == part and d[k] > 1.03)
        n_aa = sum(1 for k in aa if k[0] == part)
        beyond = [k for k in keys if ab[k] > band]
        lines.append(f"### {part}\n")
        lines.append(
            f"- figures: {len(keys)}; flagged by the 3 % threshold: before/after {flag(ab)}, "
            f"A/A {flag(aa)} of {n_aa}"
        )
        lines.append(
            f"- geometric mean of the worse-is-above-1 ratios: before/after {gm(ab):.3f}, A/A {gm(aa):.3f}"
        )
        lines.append(f"- noise band (largest A/A ratio): {band:.3f}")
        lines.append(
            "- before/after figures worse than the band: "
            + (", ".join(f"{k[1]} [{k[2]}] {ab[k]:.3f}" for k in beyond) if beyond else "none")
        )
        lines.append("")
        lines.append("| figure | CRC impl | before/after | A/A |")
        lines.append("| --- | --- | --- | --- |")
        for k in keys:
            mark = " **beyond noise**" if k in beyond else ""
            aav = f"{aa[k]:.3f}" if k in aa else "-"
            lines.append(f"| {k[1]} | {k[2]} | {ab[k]:.3f}{mark} | {aav} |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
