#!/usr/bin/env python3
"""Load for the zipsite benchmark: C client processes loading pages with
their pictures, and the server's CPU per page from /proc.

Each client loads, in a loop for D seconds, "people within X miles of Z"
pages (a seeded list of queries, 5-15 miles around random places): first
the page with rhttp (over HTTP: the PHP page is dynamic), then, the page's
`<img src>` parsed here, every picture with one rhttp invocation (one
keep-alive HTTP connection and, with mod_rdma, one RDMA connection for all
of them). `--plain` passes rhttp --plain (no RDMA header): the plain-Apache
baseline with the same client.

With `--requisites`, one `rhttp get --page-requisites URL` per page does
both steps (when rhttp has it).

The server's CPU: utime + stime (proc(5), /proc/PID/stat fields 14 and 15)
of every process in the Apache's session (the parent and its prefork
children, PHP and mod_rdma's threads included), plus the parent's cutime +
cstime (children that exited), read before and after the run.

Prints one JSON line: clients, seconds, pages, pages_per_s, pictures,
bytes, server_cpu_s, cpu_ms_per_page, p50_ms, p99_ms, errors.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

IMG = re.compile(rb'<img src="([^"]+)"')
TICK = os.sysconf("SC_CLK_TCK")


def session_cpu(sid):
    """CPU seconds of every process whose session id is `sid`, plus the
    leader's reaped children."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        # fields[0] is field 3 (state): field N is fields[N - 3].
        if int(fields[6 - 3]) != sid:
            continue
        total += int(fields[14 - 3]) + int(fields[15 - 3])
        if int(d) == sid:
            total += int(fields[16 - 3]) + int(fields[17 - 3])
    return total / TICK


def queries(count, seed):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zipdata

    places, _ = zipdata.generate()
    rng = random.Random(seed)
    return [(places[rng.randrange(len(places))][1], rng.choice(("5", "10", "15"))) for _ in range(count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--rhttp", required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--requisites", action="store_true")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--server-pid", type=int, required=True, help="the Apache parent (a session leader)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--no-pictures", action="store_true", help="load the pages only")
    a = ap.parse_args()

    qs = queries(a.queries, 11)
    base = [a.rhttp] + (["--plain"] if a.plain else []) + ["-q", "--timeout", "30"]
    lat, errors, pics, nbytes = [], [], [0], [0]
    lock = threading.Lock()
    stop = time.monotonic() + a.seconds

    def client(k):
        i = k * 37
        while time.monotonic() < stop:
            z, m = qs[i % len(qs)]
            i += 1
            url = f"{a.base}/near.php?zip={z}&miles={m}"
            t0 = time.monotonic()
            try:
                if a.requisites:
                    r = subprocess.run(base + ["get", "--page-requisites", "-P", os.devnull, url],
                                       capture_output=True, timeout=60)
                    if r.returncode != 0:
                        raise RuntimeError(r.stderr.decode()[-300:])
                    n, size = 0, 0
                else:
                    r = subprocess.run(base + ["get", url, "-o", "-"], capture_output=True, timeout=60)
                    if r.returncode != 0:
                        raise RuntimeError(r.stderr.decode()[-300:])
                    srcs = [s.decode() for s in IMG.findall(r.stdout)]
                    size = len(r.stdout)
                    n = 0 if a.no_pictures else len(srcs)
                    if srcs and not a.no_pictures:
                        args = base + ["get"]
                        for s in srcs:
                            args += [a.base + s, "-o", os.devnull]
                        r2 = subprocess.run(args, capture_output=True, timeout=60)
                        if r2.returncode != 0:
                            raise RuntimeError(r2.stderr.decode()[-300:])
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{url}: {e}")
                continue
            dt = time.monotonic() - t0
            with lock:
                lat.append(dt)
                pics[0] += n
                nbytes[0] += size

    cpu0 = session_cpu(a.server_pid)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    cpu = session_cpu(a.server_pid) - cpu0
    lat.sort()
    pages = len(lat)
    out = {
        "clients": a.clients, "plain": a.plain, "seconds": round(wall, 2), "pages": pages,
        "pages_per_s": round(pages / wall, 2), "pictures": pics[0], "page_bytes": nbytes[0],
        "server_cpu_s": round(cpu, 2), "cpu_ms_per_page": round(1000 * cpu / pages, 2) if pages else None,
        "p50_ms": round(1000 * lat[pages // 2], 1) if pages else None,
        "p99_ms": round(1000 * lat[min(pages - 1, int(pages * 0.99))], 1) if pages else None,
        "errors": len(errors),
    }
    for e in errors[:3]:
        print(f"bench-client: error: {e}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
