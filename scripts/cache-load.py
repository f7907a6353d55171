#!/usr/bin/env python3
"""Load generator and checker for the coherent cache (scripts/test-cache.sh).

  cache-load.py run --url http://127.0.0.1:8080/cgi-bin/doc.cgi/ --docs 16 \
      --requests 2000 --threads 8 --update-log updates.log [--out results.jsonl]

Sends GETs for random documents over keep-alive connections, then checks
every response:

- a 200 must carry X-CC-Version, and its body must be that document at that
  version throughout (no half-written or mislabelled document);
- stale: the version served is older than the newest version committed
  (update log: "<unix ns> <doc> <version>", written by ccappd after the
  version was published) before the request was sent. The checker fails
  on any stale response.

  cache-load.py expect --url ... --docs 16 --requests 50 --status 502

checks that every response has that status and carries no document (the
fault phase: ccappd killed).

  cache-load.py mixed --url http://127.0.0.1:80/raw/ --docs 16 --requests 3000

is the control: documents served without the read protocol; it counts
bodies that mix two versions (informational, never fails). Prints one JSON summary line; exit status 0
only if the check passed. Standard library only.
"""
import argparse
import bisect
import http.client
import json
import random
import re
import sys
import threading
import time
import urllib.parse

LINE = re.compile(rb"doc (\d{6}) version (\d{20})\n")


def worker(url, docs, n, seed, out, timeout):
    u = urllib.parse.urlsplit(url)
    rnd = random.Random(seed)
    conn = None
    for _ in range(n):
        doc = min(int(rnd.paretovariate(1.2)) - 1, docs - 1)  # skewed, like Zipf
        rec = {"doc": doc}
        rec["t0"] = time.time_ns()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
            conn.request("GET", f"{u.path}{doc}")
            r = conn.getresponse()
            body = r.read()
            rec["status"] = r.status
            rec["version"] = r.getheader("X-CC-Version")
            rec["cache"] = r.getheader("X-CC-Cache")
            rec["body_ok"] = body_ok(body, doc, rec["version"]) if r.status == 200 else None
            rec["versions_in_body"] = len({m.group(2) for m in LINE.finditer(body)})
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException) as e:
            rec["status"] = 0
            rec["error"] = str(e)
            if conn is not None:
                conn.close()
            conn = None
        rec["t1"] = time.time_ns()
        out.append(rec)
    if conn is not None:
        conn.close()


def body_ok(body, doc, version):
    if version is None or not body:
        return False
    pos = 0
    for m in LINE.finditer(body):
        if m.start() != pos or int(m.group(1)) != doc or int(m.group(2)) != int(version):
            return False
        pos = m.end()
    tail = body[pos:]
    whole = f"doc {doc:06} version {int(version):020}\n".encode()
    return whole.startswith(tail)


def load(args):
    per = [[] for _ in range(args.threads)]
    base = args.requests // args.threads
    ts = []
    start = time.monotonic()
    for i in range(args.threads):
        n = base + (1 if i < args.requests % args.threads else 0)
        t = threading.Thread(target=worker, args=(args.url, args.docs, n, args.seed + i, per[i], args.timeout))
        t.start()
        ts.append(t)
    for t in ts:
        t.join(args.timeout * (n + 1))
    elapsed = time.monotonic() - start
    recs = [r for p in per for r in p]
    return recs, elapsed


def read_log(path):
    """Commits per document, sorted by time; and the number of lines that
    are not "<ns> <doc> <version>" with each field below 2^64 (a garbled
    log would make the stale check meaningless, so they fail the run)."""
    commits, bad = {}, 0
    with open(path) as f:
        for line in f:
            parts = line.split()
            try:
                t, d, v = (int(p) for p in parts)
            except ValueError:
                bad += 1
                continue
            if max(t, d, v) >= 2**64 or min(t, d, v) < 0:
                bad += 1
                continue
            commits.setdefault(d, []).append((t, v))
    for d in commits:
        commits[d].sort()
    return commits, bad


def required(commits, doc, t0):
    """Newest version of doc committed before t0 (None if none logged)."""
    cs = commits.get(doc, [])
    i = bisect.bisect_left(cs, (t0, -1))
    if i == 0:
        return None
    return max(v for _, v in cs[:i])


def summarize(recs, elapsed):
    lat = sorted((r["t1"] - r["t0"]) / 1e6 for r in recs)
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None  # noqa: E731
    st = {}
    for r in recs:
        st[str(r["status"])] = st.get(str(r["status"]), 0) + 1
    return {
        "requests": len(recs),
        "seconds": round(elapsed, 2),
        "req_per_s": round(len(recs) / elapsed, 1) if elapsed > 0 else None,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "status": st,
        "hits": sum(1 for r in recs if r.get("cache") == "hit"),
        "misses": sum(1 for r in recs if r.get("cache") == "miss"),
    }


def judge(recs, commits):
    """Split the 200 responses into (stale, bad_body, unversioned, no_log_entry)."""
    stale, bad_body, unversioned, unknown = [], [], [], 0
    for r in recs:
        if r["status"] != 200:
            continue
        if r["version"] is None:
            unversioned.append(r)
            continue
        if not r["body_ok"]:
            bad_body.append(r)
        need = required(commits, r["doc"], r["t0"])
        if need is None:
            unknown += 1
        elif int(r["version"]) < need:
            r["required"] = need
            stale.append(r)
    return stale, bad_body, unversioned, unknown


def cmd_run(args):
    recs, elapsed = load(args)
    commits, bad_log = read_log(args.update_log)
    s = summarize(recs, elapsed)
    stale, bad_body, unversioned, unknown = judge(recs, commits)
    s.update(stale=len(stale), bad_body=len(bad_body), unversioned=len(unversioned),
             no_log_entry=unknown, updates_logged=sum(len(v) for v in commits.values()),
             bad_log_lines=bad_log)
    if args.out:
        with open(args.out, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    for r in (stale + bad_body + unversioned)[:5]:
        print("offending:", json.dumps(r), file=sys.stderr)
    ok200 = s["status"].get("200", 0)
    allowed = {200, *args.allow_status}
    others = sum(1 for r in recs if r["status"] not in allowed)
    s["unexpected_status"] = others
    s["pass"] = (not stale and not bad_body and not unversioned and unknown == 0
                 and others == 0 and bad_log == 0 and ok200 >= args.min_ok * len(recs))
    print(json.dumps(s))
    return 0 if s["pass"] else 1


def cmd_mixed(args):
    """Control run against documents served WITHOUT the read protocol:
    count bodies that mix two versions (what the protocol prevents)."""
    recs, elapsed = load(args)
    s = summarize(recs, elapsed)
    s["mixed_bodies"] = sum(1 for r in recs if r["status"] == 200 and r.get("versions_in_body", 0) > 1)
    print(json.dumps(s))
    return 0


def cmd_selftest(_args):
    """The checker catches what it must: stale, half-written, mislabelled."""
    commits = {3: [(100, 5), (200, 6), (300, 7)]}

    def rec(t0, version, body):
        return {"doc": 3, "t0": t0, "status": 200, "version": str(version),
                "body_ok": body_ok(body, 3, str(version))}

    whole = lambda v: (f"doc 000003 version {v:020}\n" * 3).encode()[:100]  # noqa: E731
    half = whole(7)[:50] + whole(6)[50:]
    cases = [
        (rec(250, 6, whole(6)), (0, 0)),   # current when sent
        (rec(250, 7, whole(7)), (0, 0)),   # newer than required: fine
        (rec(301, 6, whole(6)), (1, 0)),   # version 7 committed before: stale
        (rec(301, 7, half), (0, 1)),       # half-written body
        (rec(301, 7, whole(6)), (0, 1)),   # body of another version
        (rec(150, 5, whole(5)[:7]), (0, 0)),  # a cut line at the end is fine
    ]
    for r, (want_stale, want_bad) in cases:
        st, bb, _, _ = judge([r], commits)
        assert (len(st), len(bb)) == (want_stale, want_bad), (r, len(st), len(bb))
    assert judge([rec(50, 5, whole(5))], commits)[3] == 1  # before any log entry
    print(json.dumps({"selftest": "pass", "cases": len(cases) + 1}))
    return 0


def cmd_expect(args):
    recs, elapsed = load(args)
    s = summarize(recs, elapsed)
    wrong = [r for r in recs if r["status"] != args.status or r.get("version") is not None]
    s["wrong"] = len(wrong)
    for r in wrong[:5]:
        print("offending:", json.dumps(r), file=sys.stderr)
    s["pass"] = not wrong and len(recs) == args.requests
    print(json.dumps(s))
    return 0 if s["pass"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest", help="check the checker on made-up responses")
    for name in ("run", "expect", "mixed"):
        c = sub.add_parser(name)
        c.add_argument("--url", required=True, help="document URL prefix, the number is appended")
        c.add_argument("--docs", type=int, default=16)
        c.add_argument("--requests", type=int, default=1000)
        c.add_argument("--threads", type=int, default=8)
        c.add_argument("--seed", type=int, default=1)
        c.add_argument("--timeout", type=float, default=20.0, help="per request, seconds")
        if name == "run":
            c.add_argument("--update-log", required=True)
            c.add_argument("--out")
            c.add_argument("--min-ok", type=float, default=0.99, help="fraction of 200s required")
            c.add_argument("--allow-status", type=int, action="append", default=[],
                           help="a status besides 200 that is not a failure (repeatable)")
        elif name == "expect":
            c.add_argument("--status", type=int, required=True)
    args = p.parse_args()
    sys.exit({"run": cmd_run, "expect": cmd_expect, "mixed": cmd_mixed, "selftest": cmd_selftest}[args.cmd](args))


if __name__ == "__main__":
    main()
