#!/usr/bin/env python3
"""The zipsite's reference answers, and the check of the site against them.

The reference is computed independently of the site: straight from the
generator's data (zipdata.generate, same seed), by brute force over every
place (no bounding box, no database; places whose latitude alone puts them
out of reach are skipped, an exact bound), with the haversine formula written
with the same floating-point operations as the site's PHP (lib.php).

    reference.py queries [--count N]            # the (zip, miles) queries, one a line
    reference.py ids FILE                       # person ids on those pages -> FILE
    reference.py check URL [URL ...]            # fetch every query from each site, compare
    reference.py check-cache PROXY DIRECT       # /near/N through ccproxy (miss, hit)
    reference.py near ZIP MILES                 # print the reference answer

`check` compares, for each query: the ids and their order exactly, and each
distance to 0.01 mile; then the refusals (bad zip, unknown zip, huge or
non-numeric miles, SQL metacharacters: 400 with a message) and a few person
pages. Output: one "ok"/"FAIL" line per check, then "zipsite-check: N passed,
N failed"; exit status 1 on any failure.
"""

import argparse
import math
import random
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

import zipdata

EARTH_MILES = 3958.8
MAX_MILES = 100.0


def rad(deg):
    return deg * math.pi / 180.0


def miles_between(lat1, lon1, lat2, lon2):
    # The same operations as lib.php's miles_between (haversine).
    p1, p2 = rad(lat1), rad(lat2)
    dp, dl = rad(lat2 - lat1), rad(lon2 - lon1)
    a = math.sin(dp / 2.0) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2.0) ** 2
    return 2.0 * EARTH_MILES * math.asin(min(1.0, math.sqrt(a)))


class Reference:
    def __init__(self, seed=zipdata.DEFAULT_SEED, n=zipdata.DEFAULT_PLACES):
        self.places, self.people = zipdata.generate(seed, n)
        self.by_zip = {p[1]: p for p in self.places}
        self.place_of = {p[0]: p for p in self.places}
        self.coords = [(pe[0], float(self.place_of[pe[2]][3]), float(self.place_of[pe[2]][4]))
                       for pe in self.people]

    def near(self, zip_code, miles):
        """[(person id, distance)] within `miles` of `zip_code`, nearest first."""
        _, _, _, lat, lon = self.by_zip[zip_code]
        clat, clon = float(lat), float(lon)
        # Only a speed-up, and exact: a great-circle distance is at least R
        # times the latitude difference in radians, so a place farther than
        # that (with a margin) cannot be inside; every other place is
        # measured. No longitude bound (that is the site's box, not used here).
        band = (miles * 1.01 + 0.01) / EARTH_MILES * 180.0 / math.pi
        out = [(pid, d) for pid, la, lo in self.coords
               if abs(la - clat) <= band and (d := miles_between(clat, clon, la, lo)) <= miles]
        out.sort(key=lambda t: (t[1], t[0]))
        return out


def queries(ref, count=36, seed=7):
    """Deterministic (zip, miles) queries: zips of random places, radii from
    half a mile (often empty) to the 100-mile limit."""
    rng = random.Random(seed)
    radii = ["0.5", "1", "2.5", "5", "7.25", "10", "15", "20", "30", "45", "60", "100"]
    out = []
    for i in range(count):
        place = ref.places[rng.randrange(len(ref.places))]
        out.append((place[1], radii[i % len(radii)]))
    return out


ROW = re.compile(r'<tr class="person" data-id="(\d+)" data-miles="([0-9.]+)">')


def fetch(url, timeout=30):
    """(status, body text); HTTP errors are answers, not exceptions."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


class Checker:
    def __init__(self):
        self.passed = self.failed = 0

    def result(self, ok, name, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   - {name}")
        else:
            self.failed += 1
            print(f"FAIL - {name}: {detail}")


def compare(ref_rows, body):
    """None if the page matches the reference, else what differs."""
    got = [(int(i), float(m)) for i, m in ROW.findall(body)]
    count = re.search(r'data-count="(\d+)"', body)
    if not count or int(count.group(1)) != len(got):
        return f"the page's data-count ({count and count.group(1)}) is not its {len(got)} rows"
    if [i for i, _ in got] != [i for i, _ in ref_rows]:
        a, b = [i for i, _ in got], [i for i, _ in ref_rows]
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        return (f"ids differ: page has {len(a)} rows, reference {len(b)}; first difference at "
                f"row {k}: page {a[k:k + 3]}, reference {b[k:k + 3]}")
    for (i, m), (_, d) in zip(got, ref_rows):
        if abs(m - d) > 0.01:
            return f"person {i}: page says {m} miles, reference {d:.4f}"
    return None


def check(ref, bases, count):
    c = Checker()
    qs = queries(ref, count)
    wants = {(z, m): ref.near(z, float(m)) for z, m in qs}
    for base in bases:
        sizes = []
        for z, m in qs:
            want = wants[(z, m)]
            status, body = fetch(f"{base}/near.php?zip={z}&miles={m}")
            if status != 200:
                c.result(False, f"{base} near {z} {m} mi", f"HTTP {status}: {body[:200]}")
                continue
            diff = compare(want, body)
            sizes.append(len(want))
            c.result(diff is None, f"{base} near {z} within {m} mi: {len(want)} people, same ids, order, distances",
                     diff or "")
        if sizes:
            print(f"#    {base}: {len(sizes)} queries, results per page min {min(sizes)} "
                  f"median {sorted(sizes)[len(sizes) // 2]} max {max(sizes)}")
        # Refusals: 400 with a message naming the problem.
        z0 = qs[0][0]
        unknown = next(f"{k:05d}" for k in range(0, 100000) if f"{k:05d}" not in ref.by_zip)
        bad = [
            (f"zip=abcde&miles=5", "zip must be a 5-digit"),
            (f"zip=1234&miles=5", "zip must be a 5-digit"),
            (f"zip={unknown}&miles=5", f"zip code {unknown} is not in the database"),
            (f"zip={z0}&miles=1000", "at most 100"),
            (f"zip={z0}&miles=0", "more than 0"),
            (f"zip={z0}&miles=1e3", "miles must be a decimal number"),
            (f"zip={z0}&miles=ten", "miles must be a decimal number"),
            (f"miles=5", "zip must be a 5-digit"),
            (f"zip={z0}", "miles must be a decimal number"),
            ("zip=" + urllib.parse.quote(f"{z0}' OR '1'='1") + "&miles=5", "zip must be a 5-digit"),
            ("zip=" + urllib.parse.quote("1; DROP TABLE place; --") + "&miles=5", "zip must be a 5-digit"),
            (f"zip={z0}&miles=" + urllib.parse.quote("5 OR 1=1"), "miles must be a decimal number"),
            (f"zip[]={z0}&miles=5", "zip must be a 5-digit"),
        ]
        for qs_, msg in bad:
            status, body = fetch(f"{base}/near.php?{qs_}")
            c.result(status == 400 and msg in body, f"{base} near.php?{qs_}: 400 naming the problem",
                     f"HTTP {status}: {body[:200]!r}")
        # The database survived the metacharacters: the first query again.
        status, body = fetch(f"{base}/near.php?zip={qs[0][0]}&miles={qs[0][1]}")
        c.result(status == 200 and compare(ref.near(qs[0][0], float(qs[0][1])), body) is None,
                 f"{base} still answers correctly after the refusals", f"HTTP {status}")
        # Person pages.
        for pid in (1, 4242, len(ref.people)):
            pe = ref.people[pid - 1]
            pl = ref.place_of[pe[2]]
            status, body = fetch(f"{base}/person.php?id={pid}")
            ok = (status == 200 and f'data-id="{pid}" data-zip="{pl[1]}"' in body
                  and f'src="/pics/{pid}.png"' in body and htmlesc(pe[1]) in body and htmlesc(pl[2]) in body)
            c.result(ok, f"{base} person.php?id={pid}: {pe[1]} of {pl[2]} {pl[1]}", f"HTTP {status}: {body[:300]!r}")
        for q, want, msg in ((f"id={len(ref.people) + 1}", 404, "no person"), ("id=0", 400, "id must be"),
                             ("id=1%20OR%201=1", 400, "id must be")):
            status, body = fetch(f"{base}/person.php?{q}")
            c.result(status == want and msg in body, f"{base} person.php?{q}: {want}", f"HTTP {status}: {body[:200]!r}")
    print(f"zipsite-check: {c.passed} passed, {c.failed} failed")
    return c.failed == 0


def fetch_headers(url, timeout=30):
    """(status, headers, body text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode("utf-8", "replace")


def check_cache(ref, proxy, direct, count=8):
    """The coherent cache in front (ccproxy --prefix /near/): /near/N through
    the proxy is a miss, then a hit, both equal to the reference for 10 miles
    around place N and byte-identical to near.php?zip=..&miles=10 direct."""
    c = Checker()
    rng = random.Random(5)
    for _ in range(count):
        pl = ref.places[rng.randrange(len(ref.places))]
        want = ref.near(pl[1], 10.0)
        _, _, page = fetch_headers(f"{direct}/near.php?zip={pl[1]}&miles=10")
        seen = []
        for _ in range(2):
            status, hdr, body = fetch_headers(f"{proxy}/near/{pl[0]}")
            seen.append(hdr.get("X-CC-Cache"))
            if status != 200 or body != page or compare(want, body) is not None:
                c.result(False, f"/near/{pl[0]} through ccproxy",
                         f"HTTP {status}, {hdr.get('X-CC-Cache')}, equal to direct: {body == page}, "
                         f"reference: {compare(want, body)}: {body[:200]!r}")
                break
        else:
            c.result(seen == ["miss", "hit"], f"/near/{pl[0]} ({pl[1]}, {len(want)} people) through ccproxy: "
                     f"{' then '.join(map(str, seen))}, equal to the reference and to near.php direct",
                     f"X-CC-Cache {seen}")
    status, hdr, body = fetch_headers(f"{proxy}/near/{len(ref.places) + 1}")
    c.result(status == 404, "a place number past the last one: 404", f"HTTP {status}: {body[:200]!r}")
    print(f"zipsite-check: {c.passed} passed, {c.failed} failed")
    return c.failed == 0


def htmlesc(s):
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=zipdata.DEFAULT_SEED)
    ap.add_argument("--places", type=int, default=zipdata.DEFAULT_PLACES)
    ap.add_argument("--count", type=int, default=36, help="number of (zip, miles) queries")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("queries")
    p = sub.add_parser("ids")
    p.add_argument("file")
    p = sub.add_parser("check")
    p.add_argument("urls", nargs="+")
    p = sub.add_parser("check-cache")
    p.add_argument("proxy")
    p.add_argument("direct")
    p = sub.add_parser("near")
    p.add_argument("zip")
    p.add_argument("miles", type=float)
    a = ap.parse_args()
    ref = Reference(a.seed, a.places)
    if a.cmd == "queries":
        for z, m in queries(ref, a.count):
            print(z, m)
    elif a.cmd == "ids":
        ids = set()
        for z, m in queries(ref, a.count):
            ids.update(i for i, _ in ref.near(z, float(m)))
        with open(a.file, "w") as f:
            f.writelines(f"{i}\n" for i in sorted(ids))
        print(f"{len(ids)} ids")
    elif a.cmd == "near":
        for i, d in ref.near(a.zip, a.miles):
            print(i, f"{d:.2f}")
    elif a.cmd == "check-cache":
        sys.exit(0 if check_cache(ref, a.proxy.rstrip("/"), a.direct.rstrip("/")) else 1)
    else:
        sys.exit(0 if check(ref, [u.rstrip("/") for u in a.urls], a.count) else 1)


if __name__ == "__main__":
    main()
