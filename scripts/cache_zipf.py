#!/usr/bin/env python3
"""Paced Zipf request generator for the push-pull benchmark
(scripts/bench-cache-push.sh).

  cache_zipf.py --url http://127.0.0.1:8080/docs/ --docs 200 --zipf 1.0 \
      --rate 200 --seconds 30 --threads 4 --seed 1

Document d (0-based) is asked with probability proportional to
1 / (d + 1) ** zipf. Requests are sent at a fixed total rate (each thread
keeps its own schedule; a late thread does not sleep, so the rate is a
ceiling), over keep-alive connections. The same seed gives the same
sequence of documents. Prints one JSON line: requests, statuses, cache
tags, achieved rate, latency percentiles. Standard library only.
"""
import argparse
import bisect
import http.client
import json
import random
import threading
import time
import urllib.parse


def cdf(docs, s):
    w = [1.0 / (d + 1) ** s for d in range(docs)]
    total = sum(w)
    acc, out = 0.0, []
    for x in w:
        acc += x / total
        out.append(acc)
    out[-1] = 1.0
    return out


def worker(args, tid, table, out):
    u = urllib.parse.urlsplit(args.url)
    rnd = random.Random(args.seed * 1000 + tid)
    period = args.threads / args.rate
    start = time.monotonic()
    end = start + args.seconds
    conn = None
    n = 0
    while True:
        due = start + n * period
        now = time.monotonic()
        if due >= end:
            break
        if due > now:
            time.sleep(due - now)
        n += 1
        doc = bisect.bisect_left(table, rnd.random())
        t0 = time.monotonic()
        rec = {"doc": doc}
        try:
            if conn is None:
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=args.timeout)
            conn.request("GET", f"{u.path}{doc}")
            r = conn.getresponse()
            r.read()
            rec["status"] = r.status
            rec["cache"] = r.getheader("X-CC-Cache")
        except (OSError, http.client.HTTPException) as e:
            rec["status"] = 0
            rec["error"] = type(e).__name__
            if conn is not None:
                conn.close()
            conn = None
        rec["ms"] = (time.monotonic() - t0) * 1000
        out.append(rec)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="document URL prefix; the number is appended")
    p.add_argument("--docs", type=int, default=200)
    p.add_argument("--zipf", type=float, default=1.0, help="exponent s")
    p.add_argument("--rate", type=float, default=200.0, help="requests per second, all threads")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    args = p.parse_args()
    table = cdf(args.docs, args.zipf)
    outs = [[] for _ in range(args.threads)]
    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(args, i, table, outs[i])) for i in range(args.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    recs = [r for o in outs for r in o]
    status, tags = {}, {}
    for r in recs:
        status[str(r["status"])] = status.get(str(r["status"]), 0) + 1
        tags[str(r.get("cache"))] = tags.get(str(r.get("cache")), 0) + 1
    ms = sorted(r["ms"] for r in recs) or [0.0]
    pct = lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 3)
    print(json.dumps({
        "requests": len(recs), "status": status, "cache": tags,
        "req_per_s": round(len(recs) / elapsed, 1), "p50_ms": pct(0.5), "p99_ms": pct(0.99),
    }))


if __name__ == "__main__":
    main()
