#!/usr/bin/env python3
"""The zipsite's data set: places, people and pictures, generated (no download).

Deterministic from a seed (Python 3 standard library only): about 42,000
places (a name, a unique 5-digit zip code, a latitude and a longitude spread
over the continental US, denser around ~60 metropolitan areas), one person
per place, and one PNG picture per person (a few tens of KB, written with
zlib; RFC 2083 / the PNG specification: signature, IHDR, IDAT, IEND, each
chunk with its CRC-32).

    zipdata.py --out DIR                  # places.csv, people.csv, zipsite.db
    zipdata.py --out DIR --pictures all   # also DIR/pics/<id>.png for everyone
    zipdata.py --out DIR --pictures ids:FILE   # only the ids listed in FILE

Coordinates are decimal strings with 6 digits after the point, so every
consumer (SQLite, PostgreSQL, PHP, the Python reference) parses the same
string to the same IEEE double.

The reference (reference.py) imports `generate()` from here: it recomputes
the answers from the generator's own data, never from a database.
"""

import argparse
import csv
import math
import os
import random
import sqlite3
import struct
import sys
import zlib

DEFAULT_SEED = 1
DEFAULT_PLACES = 42000

# Metropolitan anchors (approximate centres, degrees): the places cluster
# around them the way towns do, and the rest is spread over the lower 48.
METROS = [
    (40.71, -74.01), (34.05, -118.24), (41.88, -87.63), (29.76, -95.37),
    (33.45, -112.07), (39.95, -75.17), (29.42, -98.49), (32.72, -117.16),
    (32.78, -96.80), (37.34, -121.89), (30.27, -97.74), (30.33, -81.66),
    (39.96, -82.99), (35.23, -80.84), (37.77, -122.42), (39.77, -86.16),
    (47.61, -122.33), (39.74, -104.99), (38.91, -77.04), (42.36, -71.06),
    (36.16, -86.78), (35.15, -90.05), (45.52, -122.68), (35.47, -97.52),
    (36.17, -115.14), (38.25, -85.76), (39.29, -76.61), (43.04, -87.91),
    (35.08, -106.65), (32.22, -110.97), (36.74, -119.79), (38.58, -121.49),
    (33.75, -84.39), (39.10, -94.58), (25.76, -80.19), (41.26, -95.94),
    (44.98, -93.27), (36.15, -95.99), (41.50, -81.69), (27.95, -82.46),
    (29.95, -90.07), (37.69, -97.34), (42.33, -83.05), (40.44, -79.99),
    (38.63, -90.20), (39.10, -84.51), (43.05, -76.15), (40.76, -111.89),
    (35.78, -78.64), (28.54, -81.38), (42.89, -78.88), (43.62, -116.20),
    (46.88, -96.79), (44.08, -103.23), (46.59, -112.04), (41.14, -104.82),
    (31.76, -106.49), (35.20, -101.83), (32.30, -90.18), (33.52, -86.80),
]

# The lower 48 as a union of rectangles (lat_min, lat_max, lon_min, lon_max):
# coarse, but it keeps the uniform background out of the oceans and the Gulf.
LAND = [
    (32.5, 49.0, -124.5, -114.0),
    (31.3, 49.0, -114.0, -104.0),
    (26.0, 49.0, -104.0, -97.0),
    (29.5, 49.0, -97.0, -89.5),
    (30.5, 47.0, -89.5, -82.0),
    (25.5, 30.5, -82.5, -80.1),
    (31.0, 45.0, -82.0, -75.5),
    (38.5, 47.3, -75.5, -67.0),
]

SYLLABLES = ["ash", "bel", "brook", "cam", "car", "clay", "dale", "east", "elm", "fair",
             "field", "glen", "green", "ham", "har", "hill", "kings", "lake", "lin",
             "mar", "mill", "mont", "new", "north", "oak", "pine", "ridge", "river",
             "rock", "spring", "stan", "sum", "wal", "west", "wood", "york"]
SUFFIXES = ["ville", "ton", "burg", "field", " City", " Springs", "port", " Falls",
            "wood", " Heights", "ford", " Junction", "dale", " Center", ""]
FIRST = ["Alex", "Ana", "Ben", "Carla", "Chen", "Dana", "Eli", "Emma", "Farah", "Gus",
         "Hana", "Ivan", "Jade", "Jon", "Kai", "Lena", "Luis", "Maya", "Nia", "Omar",
         "Pia", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Vic", "Wen", "Yara", "Zoe"]
LAST = ["Abbott", "Baker", "Castro", "Diaz", "Evans", "Fischer", "Garcia", "Hughes",
        "Ito", "Jensen", "Kim", "Lopez", "Moreau", "Nakamura", "O'Neil", "Patel",
        "Quist", "Rossi", "Smith", "Tanaka", "Usman", "Vargas", "Walsh", "Xu",
        "Young", "Zimmer"]


def _on_land(lat, lon):
    return any(a <= lat <= b and c <= lon <= d for a, b, c, d in LAND)


def generate(seed=DEFAULT_SEED, n=DEFAULT_PLACES):
    """Returns (places, people).

    places: list of (id, zip, name, lat_str, lon_str), ids 1..n, zips unique
    and increasing from east to west (as US zip codes roughly do).
    people: list of (id, name, place_id), person i lives in place i.
    """
    rng = random.Random(seed)
    pts = []
    area = [(b - a) * (d - c) for a, b, c, d in LAND]
    while len(pts) < n:
        if rng.random() < 0.55:
            clat, clon = METROS[rng.randrange(len(METROS))]
            sigma = rng.choice((0.15, 0.4, 0.9))
            lat, lon = rng.gauss(clat, sigma), rng.gauss(clon, sigma * 1.25)
        else:
            a, b, c, d = rng.choices(LAND, weights=area)[0]
            lat, lon = rng.uniform(a, b), rng.uniform(c, d)
        if _on_land(lat, lon):
            pts.append((f"{lat:.6f}", f"{lon:.6f}"))
    # Zip codes: n distinct numbers from 00501-99950, assigned east to west.
    zips = sorted(rng.sample(range(501, 99951), n))
    order = sorted(range(n), key=lambda i: (-float(pts[i][1]), pts[i][0]))
    zip_of = [0] * n
    for rank, i in enumerate(order):
        zip_of[i] = zips[rank]
    places, people = [], []
    for i, (lat, lon) in enumerate(pts):
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2)))).capitalize()
        name += rng.choice(SUFFIXES)
        places.append((i + 1, f"{zip_of[i]:05d}", name, lat, lon))
        people.append((i + 1, f"{rng.choice(FIRST)} {rng.choice(LAST)}", i + 1))
    return places, people


# ---- pictures ---------------------------------------------------------------

def _chunk(kind, data):
    # PNG: length, type, data, CRC-32 over type and data.
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def picture(seed, person_id):
    """A deterministic RGB PNG for one person: a coloured gradient with a
    disc (a "face") and noise in the low bits, so it compresses only partly:
    20-60 KB depending on its size (96..144 pixels square)."""
    rng = random.Random(seed * 1_000_003 + person_id)
    side = rng.randrange(96, 145, 8)
    r0, g0, b0 = rng.randrange(40, 200), rng.randrange(40, 200), rng.randrange(40, 200)
    cx, cy, rad = side // 2, side // 2 - 6, side // 4
    skin = bytes((230, 200, 170))
    rows = []
    for y in range(side):
        # A vertical gradient: one colour per row, a disc's span replaced.
        px = bytes(((r0 + y) & 0xFF, g0, (b0 + y // 2) & 0xFF))
        row = bytearray(b"\x00" + px * side)  # filter byte 0 (None)
        dy = y - cy
        if dy * dy <= rad * rad:
            half = math.isqrt(rad * rad - dy * dy)
            x0, x1 = cx - half, cx + half + 1
            row[1 + 3 * x0:1 + 3 * x1] = skin * (x1 - x0)
        rows.append(bytes(row))
    base = b"".join(rows)
    # Noise in the low 5 bits of every sample (not the filter bytes): one big
    # integer AND/XOR instead of a per-sample Python loop.
    mask_row = b"\x00" + b"\x1f" * (3 * side)
    noise = int.from_bytes(rng.randbytes(len(base)), "big") & int.from_bytes(mask_row * side, "big")
    raw = (int.from_bytes(base, "big") ^ noise).to_bytes(len(base), "big")
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
            + _chunk(b"IDAT", zlib.compress(raw, 1)) + _chunk(b"IEND", b""))


def _write_some(args):
    seed, ids, outdir = args
    for pid in ids:
        path = os.path.join(outdir, f"{pid}.png")
        with open(path + ".tmp", "wb") as f:
            f.write(picture(seed, pid))
        os.replace(path + ".tmp", path)


def write_pictures(seed, ids, outdir, jobs=1):
    """Each picture depends only on (seed, id): any split over processes
    writes the same files."""
    os.makedirs(outdir, exist_ok=True)
    ids = list(ids)
    if jobs <= 1 or len(ids) < 1000:
        _write_some((seed, ids, outdir))
        return
    import multiprocessing
    with multiprocessing.Pool(jobs) as pool:
        pool.map(_write_some, [(seed, ids[k::jobs], outdir) for k in range(jobs)])


# ---- outputs ----------------------------------------------------------------

SCHEMA = """
CREATE TABLE place (id INTEGER PRIMARY KEY, zip CHAR(5) NOT NULL UNIQUE,
                    name TEXT NOT NULL, lat DOUBLE PRECISION NOT NULL,
                    lon DOUBLE PRECISION NOT NULL);
CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
                     place_id INTEGER NOT NULL REFERENCES place(id));
CREATE INDEX place_lat_lon ON place (lat, lon);
CREATE INDEX person_place ON person (place_id);
"""


def write_sqlite(places, people, path):
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO place VALUES (?, ?, ?, ?, ?)",
                   [(i, z, n, float(a), float(o)) for i, z, n, a, o in places])
    db.executemany("INSERT INTO person VALUES (?, ?, ?)", people)
    db.commit()
    db.close()


def write_csv(places, people, outdir):
    with open(os.path.join(outdir, "places.csv"), "w", newline="") as f:
        csv.writer(f).writerows(places)
    with open(os.path.join(outdir, "people.csv"), "w", newline="") as f:
        csv.writer(f).writerows(people)
    with open(os.path.join(outdir, "schema.sql"), "w") as f:
        f.write(SCHEMA)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--places", type=int, default=DEFAULT_PLACES)
    ap.add_argument("--pictures", default="none",
                    help="none, all, or ids:FILE (one person id per line)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes writing pictures (default: one per CPU)")
    ap.add_argument("--no-sqlite", action="store_true", help="skip DIR/zipsite.db")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    places, people = generate(a.seed, a.places)
    write_csv(places, people, a.out)
    if not a.no_sqlite:
        write_sqlite(places, people, os.path.join(a.out, "zipsite.db"))
    if a.pictures == "all":
        ids = [p[0] for p in people]
    elif a.pictures.startswith("ids:"):
        with open(a.pictures[4:]) as f:
            ids = sorted({int(line) for line in f if line.strip()})
    elif a.pictures == "none":
        ids = []
    else:
        sys.exit(f"zipdata: --pictures {a.pictures!r}: expected none, all or ids:FILE")
    write_pictures(a.seed, ids, os.path.join(a.out, "pics"), a.jobs)
    print(f"zipdata: {len(places)} places, {len(people)} people, {len(ids)} pictures in {a.out}")


if __name__ == "__main__":
    main()
