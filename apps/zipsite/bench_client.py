#!/usr/bin/env python3
"""Load for the zipsite benchmark: C client processes loading pages with
their pictures, and the server's CPU per page from /proc.

Each client loads, in a loop for D seconds, "people within 10 miles of Z"
pages (a seeded list of 200 random places; clients start at different
places in it): first
the page with rhttp (over HTTP: the PHP page is dynamic), then, the page's
`<img src>` parsed here, every picture with one rhttp invocation (one
keep-alive HTTP connection and, with mod_rdma, one RDMA connection for all
of them). `--plain` passes rhttp --plain (no RDMA header): the plain-Apache
baseline with the same client.

With `--requisites`, one `rhttp get --page-requisites URL` per page does
both steps over one HTTP connection (and one RDMA connection), saved to a
temporary directory per client; not with --page-base.

`--pages-per-connection K` puts K pages in each rhttp invocation (and with
the two-step procedure, the pictures of all K in the second): one
connection (HTTP, and RDMA with mod_rdma) for K pages, like a visitor who
browses K pages; the latency reported is the batch's over K.

The server's CPU: utime + stime (proc(5), /proc/PID/stat fields 14 and 15)
of every process in the Apache's session (the parent and its prefork
children, PHP and mod_rdma's threads included), plus the parent's cutime +
cstime (children that exited), read before and after the run.

With --page-base the pages come through the coherent cache (ccproxy,
/near/N) and --extra-pid adds ccproxy's and ccappd's CPU to the server's.

Prints one JSON line: clients, seconds, pages, pages_per_s, pictures,
page_bytes, server_cpu_s (apache_cpu_s + extra_cpu_s), cpu_ms_per_page,
p50_ms, p99_ms (per page with its pictures), errors.
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
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


def pid_cpu(pid):
    """CPU seconds of one process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return (int(fields[14 - 3]) + int(fields[15 - 3])) / TICK


def queries(count, seed):
    """(place id, zip) of `count` random places: the pages are "within 10
    miles" of them."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zipdata

    places, _ = zipdata.generate()
    rng = random.Random(seed)
    return [places[rng.randrange(len(places))][:2] for _ in range(count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--rhttp", required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--requisites", action="store_true")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--server-pid", type=int, required=True, help="the Apache parent (a session leader)")
    ap.add_argument("--page-base", help="load the pages as PAGE_BASE/near/N (the coherent cache's documents) "
                    "instead of BASE/near.php?zip=Z&miles=10; pictures still from BASE")
    ap.add_argument("--extra-pid", type=int, action="append", default=[],
                    help="another server-side process whose CPU counts (ccproxy, ccappd)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--no-pictures", action="store_true", help="load the pages only")
    ap.add_argument("--pages-per-connection", type=int, default=1,
                    help="pages per rhttp invocation, i.e. per HTTP (and RDMA) connection: 1 is a new visitor "
                         "per page, more is a visitor browsing on a kept-alive connection")
    a = ap.parse_args()

    qs = queries(a.queries, 11)
    base = [a.rhttp] + (["--plain"] if a.plain else []) + ["-q", "--timeout", "30"]
    lat, errors, pics, nbytes = [], [], [0], [0]
    lock = threading.Lock()
    stop = time.monotonic() + a.seconds

    def client(k):
        i = k * 37
        while time.monotonic() < stop:
            batch = [qs[(i + j) % len(qs)] for j in range(a.pages_per_connection)]
            i += a.pages_per_connection
            urls = [f"{a.page_base}/near/{n_id}" if a.page_base else f"{a.base}/near.php?zip={z}&miles=10"
                    for n_id, z in batch]
            t0 = time.monotonic()
            try:
                if a.requisites and not a.page_base and not a.no_pictures:
                    r = subprocess.run(base + ["get", "--page-requisites", "-e", "robots=off", "--stats",
                                               "--no-host-directories", "-P", tmp[k]] + urls,
                                       capture_output=True, timeout=120)
                    if r.returncode != 0:
                        raise RuntimeError(r.stderr.decode()[-300:])
                    m = re.search(rb"stats: (\d+) requests", r.stderr)
                    n, size = (int(m.group(1)) - len(urls) if m else 0), 0
                else:
                    outs = [os.path.join(tmp[k], f"page{j}.html") for j in range(len(urls))]
                    args = base + ["get"]
                    for u, o in zip(urls, outs):
                        args += [u, "-o", o]
                    r = subprocess.run(args, capture_output=True, timeout=120)
                    if r.returncode != 0:
                        raise RuntimeError(r.stderr.decode()[-300:])
                    srcs, size = [], 0
                    for o in outs:
                        with open(o, "rb") as f:
                            body = f.read()
                        size += len(body)
                        srcs += [s.decode() for s in IMG.findall(body)]
                    n = 0 if a.no_pictures else len(srcs)
                    if srcs and not a.no_pictures:
                        args = base + ["get"]
                        for s in srcs:
                            args += [a.base + s, "-o", os.devnull]
                        r2 = subprocess.run(args, capture_output=True, timeout=120)
                        if r2.returncode != 0:
                            raise RuntimeError(r2.stderr.decode()[-300:])
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{urls[0]}: {e}")
                continue
            # Latency per page: the batch's time over its pages.
            dt = (time.monotonic() - t0) / len(urls)
            with lock:
                lat.extend([dt] * len(urls))
                pics[0] += n
                nbytes[0] += size

    tmp = [tempfile.mkdtemp(prefix="zipsite-client-") for _ in range(a.clients)]
    cpu0 = session_cpu(a.server_pid)
    extra0 = sum(pid_cpu(p) for p in a.extra_pid)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    apache_cpu = session_cpu(a.server_pid) - cpu0
    extra = sum(pid_cpu(p) for p in a.extra_pid) - extra0
    cpu = apache_cpu + extra
    for d in tmp:
        shutil.rmtree(d, ignore_errors=True)
    lat.sort()
    pages = len(lat)
    out = {
        "clients": a.clients, "plain": a.plain, "pages_per_connection": a.pages_per_connection, "seconds": round(wall, 2), "pages": pages,
        "pages_per_s": round(pages / wall, 2), "pictures": pics[0], "page_bytes": nbytes[0],
        "server_cpu_s": round(cpu, 2), "apache_cpu_s": round(apache_cpu, 2), "extra_cpu_s": round(extra, 2), "cpu_ms_per_page": round(1000 * cpu / pages, 2) if pages else None,
        "p50_ms": round(1000 * lat[pages // 2], 1) if pages else None,
        "p99_ms": round(1000 * lat[min(pages - 1, int(pages * 0.99))], 1) if pages else None,
        "errors": len(errors),
    }
    for e in errors[:3]:
        print(f"bench-client: error: {e}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
