#!/usr/bin/env python3
"""The house habits of issue 28, checked: run by scripts/check-habits.sh.

Three checks over one source tree (a git checkout: its tracked files; any
other directory: every file under it):

  size     no *.rs / *.c source file over MAX_LINES lines, except the
           categories in EXEMPT below (tests, fuzz targets, generated
           files) and the files listed in the allow-list;
  circle   no import circle between the modules of one Rust crate: the
           module graph is built from `use crate::..`, `use super::..`,
           `use self::..`, `use child::..` and fully qualified
           `crate::x::y` / `super::x` paths in code (file -> module), and
           every strongly connected component of more than one module is
           reported with the lines that make it;
  fact     the MPA key (RFC 5044 §7.1, "MPA ID Req Frame" / "MPA ID Rep
           Frame") spelled out only in iwarp-proto, which exports it
           (`iwarp_proto::wire::mpa::{KEY_REQ, KEY_REP}`): one fact, one
           place; tests and fuzz targets may spell it (they check it);
  parent   no module importing an item (a type, a function, a constant)
           from one of its ancestor modules, the crate root included
           ("put shared types in leaf modules, not in the parent"); naming
           a sibling module through `super::sibling` is fine.
  wait     no application-level wait loop in tools/ and crates/ outside
           the verbs crate (crates/iwarp): every application waits through
           the one API, iwarp::wait::WaitSet (docs/WAITING.md). Flagged
           (code only: comments, strings and `#[cfg(test)] mod tests`
           ignored): its own poll(2) (`libc::poll(` / `ppoll(` /
           `epoll_wait(`); a verbs wait cut into slices (`.wait(`,
           `.wait_one(`, `.get_request(`, `.next_event(` whose argument is
           a `.min(Duration::..)`, a `clamp(..)`, a `slice`, a `..SLICE` or
           a `TICK`); a
           `thread::sleep(` within a few lines after a CQ poll, a
           `progress()`, a `get_request(` or a `next_event(` (sleeping as a
           wait); and the retired `WakePolicy` / `attend()` API.

Known offenders live in the allow-list (scripts/habits-allow.txt), each
with the issue that tracks it. Anything not listed fails. Python 3 only,
no packages, no network; the whole tree takes well under a second.
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

MAX_LINES = 1200

# Files the size check does not look at, and why. (pattern, reason); a
# pattern is a regular expression matched against the path relative to
# the tree's top.
EXEMPT = [
    (r"(^|/)tests/", "integration tests: a test file is a list of cases, long is fine"),
    (r"(^|/)tests\.rs$", "unit-test modules split out of their file (`mod tests;`)"),
    (r"(^|/)[^/]*_tests?\.rs$", "unit-test modules by name"),
    (r"(^|/)benches/", "benchmarks are test code"),
    (r"^fuzz/", "fuzz targets and their harness are test code"),
    (r"(^|/)fuzz/", "C fuzz harnesses beside a module (modules/*/fuzz/)"),
    (r"(^|/)generated/", "generated code (kept as generated, never edited)"),
    (r"\.generated\.(rs|c)$", "generated code by name"),
    (r"(^|/)target/", "build output"),
]

SOURCE_RE = re.compile(r"\.(rs|c)$")

# One fact, one place: these spellings belong to the file that defines them.
FACTS = [
    (re.compile(r"MPA ID Re[qp] Frame"), "crates/iwarp-proto/",
     "the MPA key (RFC 5044 §7.1): use iwarp_proto::wire::mpa::{KEY_REQ, KEY_REP}"),
]
FACT_FILES = re.compile(r"\.(rs|c|h)$")
# Application-level wait loops (issue 28, "one reactor"): where they are
# looked for, and what they look like (matched against code with comments
# and strings blanked).
WAIT_SCOPE = re.compile(r"^(tools|crates)/.*\.rs$")
# The verbs crates: the one waiting API (crates/iwarp) and the layers under
# it (the verbs types and the providers, which implement the waiting).
WAIT_HOME = ("crates/iwarp/", "crates/iwarp-verbs/", "crates/iwarp-soft/", "crates/iwarp-rdmacore/")
WAIT_RULES = [
    (re.compile(r"\blibc\s*::\s*(poll|ppoll|epoll_wait)\s*\("),
     "its own poll(2) loop: put the descriptors in an iwarp::wait::WaitSet (add_fd) beside the CQs"),
    (re.compile(r"\.\s*(wait|wait_one|get_request|next_event)\s*\([^;]*(\.\s*min\s*\(\s*Duration\s*::|\bclamp\s*\(|\b(slice|\w*SLICE|TICK)\b)"),
     "a wait cut into slices: wait once, with the deadline, in an iwarp::wait::WaitSet (a QP failure wakes it through QueuePair::event_fd, a listener through its descriptor)"),
    (re.compile(r"\bWakePolicy\b|\.\s*attend\s*\(\s*\)"),
     "the retired WakePolicy/attend wake-up rules: wait through an iwarp::wait::WaitSet"),
]
WAIT_SLEEP = re.compile(r"\bthread\s*::\s*sleep\s*\(")
WAIT_POLLED = re.compile(r"\.\s*(poll_one|poll|progress|get_request|next_event)\s*\(")
WAIT_SLEEP_NEAR = 6  # lines after a poll in which a sleep is a wait

TEST_TAIL = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*mod tests\b", re.M)
COMMENT_LINE = re.compile(r"^\s*(//|/?\*)")


# --------------------------------------------------------------- files


def tracked_files(root):
    """Tracked files of a git checkout; every file otherwise."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-z"],
            check=True,
            capture_output=True,
        ).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return [f for f in files if os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", "target")]
        for n in names:
            files.append(os.path.relpath(os.path.join(top, n), root))
    return files


def exempt_reason(path):
    for pat, why in EXEMPT:
        if re.search(pat, path):
            return why
    return None


def count_lines(path):
    with open(path, "rb") as f:
        return f.read().count(b"\n")


# --------------------------------------------------------------- allow-list


class Allow:
    """scripts/habits-allow.txt: one known offender a line.

    file   PATH MAX_LINES #ISSUE reason...
    circle PATH PATH [PATH...] #ISSUE reason...
    parent FROM_PATH TO_PATH #ISSUE reason...
    """

    def __init__(self, path):
        self.path = path
        self.files = {}  # path -> (max lines, line no)
        self.circles = []  # (frozenset of paths, line no)
        self.parents = {}  # (from, to) -> line no
        self.facts = {}  # path -> line no
        self.waits = {}  # path -> line no
        self.errors = []
        if path is None or not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as f:
            for no, raw in enumerate(f, 1):
                line = raw.split("#", 1)
                body = line[0].split()
                if not body:
                    continue
                issue = re.match(r"\s*(\d+)", line[1]) if len(line) > 1 else None
                if not issue:
                    self.errors.append(
                        f"{path}:{no}: no issue number: every allowed offender "
                        "names the issue that tracks it ('... #28 why')"
                    )
                    continue
                kind, args = body[0], body[1:]
                if kind == "file" and len(args) == 2 and args[1].isdigit():
                    self.files[args[0]] = (int(args[1]), no)
                elif kind == "circle" and len(args) >= 2:
                    self.circles.append((frozenset(args), no))
                elif kind == "parent" and len(args) == 2:
                    self.parents[(args[0], args[1])] = no
                elif kind == "fact" and len(args) == 1:
                    self.facts[args[0]] = no
                elif kind == "wait" and len(args) == 1:
                    self.waits[args[0]] = no
                else:
                    self.errors.append(
                        f"{path}:{no}: not understood: expected 'file PATH LINES #N', "
                        "'circle PATH PATH... #N', 'parent FROM TO #N', 'fact PATH #N' or 'wait PATH #N'"
                    )


# --------------------------------------------------------------- Rust lexing


TOKEN = re.compile(
    r"//[^\n]*"
    r"|/\*"
    r"|(?<![\w])b?r(#*)\""
    r"|b?\"(?:\\.|[^\"\\])*\""
    r"|'(?:\\(?:x..|u\{[0-9a-fA-F]*\}|.)|[^\\'\n])'",
    re.S,
)
BLOCK = re.compile(r"/\*|\*/")


def blank(s):
    return re.sub(r"[^\n]", " ", s)


def strip_rust(text):
    """`text` with comments, strings and char literals blanked (newlines
    kept, so line numbers hold). Lifetimes stay."""
    out, pos, n = [], 0, len(text)
    while True:
        m = TOKEN.search(text, pos)
        if not m:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos : m.start()])
        tok = m.group(0)
        end = m.end()
        if tok == "/*":  # block comments nest
            depth = 1
            while depth:
                c = BLOCK.search(text, end)
                if not c:
                    end = n
                    break
                depth += 1 if c.group(0) == "/*" else -1
                end = c.end()
        elif m.group(1) is not None:  # raw string: up to '"' and its hashes
            close = text.find('"' + m.group(1), end)
            end = n if close < 0 else close + 1 + len(m.group(1))
        out.append(blank(text[m.start() : end]))
        pos = end


MOD_DECL = re.compile(
    r"((?:#\s*\[[^\]]*\]\s*)*)(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(r#)?(\w+)\s*([;{])"
)
PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]+)"\s*\]')
USE_STMT = re.compile(r"\buse\s+([^;]+);")
QUALIFIED = re.compile(r"(?<![\w$])(?:crate|self|super)(?:\s*::\s*\w+)+")


def expand_use(tree):
    """`a::{b, c::{d as x, e}}` -> [('a::b', 'b'), ('a::c::d', 'x'),
    ('a::c::e', 'e')]: each path with the name it brings in."""
    tree = re.sub(r"\s+as\s+", "@", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        b = s.find("{")
        if b < 0:
            return [prefix + s]
        head = s[:b]
        inner = s[b + 1 : s.rfind("}")]
        res = []
        for p in split_top(inner):
            res.extend(go(prefix + head, p))
        return res

    out = []
    for p in go("", tree):
        if not p:
            continue
        path, _, alias = p.partition("@")
        segs = path.split("::")
        if segs[-1] == "self" and len(segs) > 1:
            segs = segs[:-1]
        out.append(("::".join(segs), alias or segs[-1]))
    return out


class Module:
    def __init__(self, path, file, test):
        self.path = path  # tuple of names; () is the crate root
        self.file = file  # the file the module's code is in
        self.test = test  # declared under #[cfg(test)] (or inside one)
        self.children = set()


def block_end(code, start):
    """Index just past the '}' that closes the '{' at `start`."""
    depth = 0
    for j in range(start, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


class Crate:
    """One crate (one target root), its modules and their code."""

    def __init__(self, root, root_file, name):
        self.root = root
        self.name = name
        self.modules = {}  # path tuple -> Module
        # (file, code, line offset, span in file, module path) pieces of code
        self.pieces = []
        self.files = set()
        self.load(root_file, (), is_mod_rs=True, test=False)
        # module -> name -> the path its `use` brings that name from
        self.imports = defaultdict(dict)
        for file, code, a, b, modpath in self.pieces:
            for m in USE_STMT.finditer(code, a, b):
                for path, name in expand_use(m.group(1)):
                    if name not in ("*", "_"):
                        self.imports[modpath][name] = path

    def load(self, file, modpath, is_mod_rs, test):
        full = os.path.join(self.root, file)
        if not os.path.isfile(full) or file in self.files:
            return
        self.files.add(file)
        with open(full, encoding="utf-8", errors="replace") as f:
            code = strip_rust(f.read())
        self.modules[modpath] = Module(modpath, file, test)
        base = os.path.dirname(file)
        if not is_mod_rs:
            base = os.path.join(base, os.path.splitext(os.path.basename(file))[0])
        self.scan(file, code, 0, len(code), modpath, base, test)

    def scan(self, file, code, lo, hi, modpath, base, test):
        """Module declarations in code[lo:hi] (the body of `modpath`),
        recursing into inline modules; records the code pieces that belong
        to `modpath` itself."""
        pos, start, own = lo, lo, []
        while True:
            m = MOD_DECL.search(code, pos, hi)
            if not m:
                break
            attrs, name, kind = m.group(1), m.group(3), m.group(4)
            ctest = test or bool(re.search(r"cfg\s*\(\s*test\s*\)", attrs))
            child = modpath + (name,)
            self.modules.setdefault(modpath, Module(modpath, file, test))
            self.modules[modpath].children.add(name)
            if kind == ";":
                p = PATH_ATTR.search(attrs)
                if p:
                    cands = [os.path.normpath(os.path.join(os.path.dirname(file), p.group(1)))]
                else:
                    cands = [os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")]
                for c in cands:
                    if os.path.isfile(os.path.join(self.root, c)):
                        self.load(c, child, c.endswith("mod.rs") or bool(p), ctest)
                        break
                pos = m.end()
            else:
                end = block_end(code, m.end() - 1)
                own.append((start, m.start()))
                self.modules.setdefault(child, Module(child, file, ctest))
                self.scan(file, code, m.end(), end - 1, child, os.path.join(base, name), ctest)
                pos = start = end
        own.append((start, hi))
        for a, b in own:
            self.pieces.append((file, code, a, b, modpath))

    def resolve(self, modpath, path):
        """The module a path names (its deepest module prefix), or None
        when it leaves the crate."""
        return self._resolve(modpath, path, 0)

    def _resolve(self, modpath, path, depth):
        segs = [s for s in re.split(r"\s*::\s*", path.strip()) if s]
        if not segs:
            return None
        cur = None
        if segs[0] == "crate":
            cur, segs = (), segs[1:]
        elif segs[0] in ("self", "super"):
            cur = modpath
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super":
                    if not cur:
                        return None
                    cur = cur[:-1]
                segs = segs[1:]
        elif segs[0] in self.modules.get(modpath, Module((), "", False)).children:
            cur = modpath
        else:
            return None
        while segs and cur + (segs[0],) in self.modules:
            cur, segs = cur + (segs[0],), segs[1:]
        # `item` names something the module holds; none: the path named a
        # module itself (or a glob).
        item = segs[0] if segs else None
        # A name the module only re-imports (`pub use conn::IoMap;` in
        # lib.rs, `use other_crate::params;`): the path depends on where
        # the name comes from, not on the module passing it on.
        via = self.imports.get(cur, {}).get(item) if item else None
        if via is not None and depth < 8 and via != path:
            return self._resolve(cur, via + "::" + "::".join(segs[1:]) if segs[1:] else via, depth + 1)
        return cur, item

    def edges(self):
        """(from module, to module, file, line, imported item or None)."""
        out = []
        for file, code, a, b, modpath in self.pieces:
            if self.modules[modpath].test:
                continue
            seen = []
            for m in USE_STMT.finditer(code, a, b):
                line = code.count("\n", 0, m.start()) + 1
                for p, _ in expand_use(m.group(1)):
                    r = self.resolve(modpath, p)
                    if r is not None:
                        out.append((modpath, r[0], file, line, r[1]))
                seen.append((m.start(), m.end()))
            k = 0
            for m in QUALIFIED.finditer(code, a, b):
                while k < len(seen) and seen[k][1] <= m.start():
                    k += 1
                if k < len(seen) and seen[k][0] <= m.start():
                    continue
                pre = code[max(a, m.start() - 8) : m.start()]
                if re.search(r"\bin\s*$", pre):  # pub(in crate::x)
                    continue
                line = code.count("\n", 0, m.start()) + 1
                r = self.resolve(modpath, m.group(0))
                if r is not None:
                    out.append((modpath, r[0], file, line, r[1]))
        return [e for e in out if e[1] != e[0] and not self.modules[e[1]].test]


def crate_roots(root, files):
    """(crate name, root file) of every lib and bin target (tests,
    examples, benches and fuzz targets are test code)."""
    fileset = set(files)
    roots = []
    for toml in sorted(f for f in files if os.path.basename(f) == "Cargo.toml"):
        d = os.path.dirname(toml)
        if d.split("/")[0] == "fuzz":
            continue
        with open(os.path.join(root, toml), encoding="utf-8") as f:
            text = f.read()
        if "[package]" not in text:
            continue
        m = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M)
        name = m.group(1) if m else d
        cands = [os.path.join(d, "src/lib.rs"), os.path.join(d, "src/main.rs")]
        for tgt in re.finditer(r"\[(lib|\[bin\])\][^\[]*?path\s*=\s*\"([^\"]+)\"", text, re.S):
            cands.append(os.path.normpath(os.path.join(d, tgt.group(2))))
        bins = re.compile(re.escape(os.path.join(d, "src/bin/")) + r"([^/]+\.rs|[^/]+/main\.rs)$")
        cands += [f for f in files if f.startswith(d + "/src/bin/") and bins.match(f)]
        for c in dict.fromkeys(os.path.normpath(c) for c in cands):
            if c in fileset:
                roots.append((f"{name} ({os.path.relpath(c, d)})", c))
    return roots


def sccs(nodes, adj):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(adj[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(adj[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


# --------------------------------------------------------------- checks


def modname(crate, mp):
    return crate.name.split(" ")[0].replace("-", "_") + ("::" + "::".join(mp) if mp else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".", help="the source tree (default: .)")
    ap.add_argument("--allow", help="the allow-list (default: ROOT/scripts/habits-allow.txt)")
    ap.add_argument("--max-lines", type=int, default=MAX_LINES)
    ap.add_argument("--list", action="store_true", help="print every offender as an allow-list line (to start a list), then exit 0")
    ap.add_argument("--graph", action="store_true", help="print every module edge")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    allow_path = args.allow or os.path.join(root, "scripts/habits-allow.txt")
    allow = Allow(allow_path)
    files = tracked_files(root)
    fails, notes, listing = [], [], []
    fails += allow.errors

    # size
    for f in sorted(files):
        if not SOURCE_RE.search(f) or exempt_reason(f):
            continue
        n = count_lines(os.path.join(root, f))
        if n <= args.max_lines:
            if f in allow.files:
                notes.append(f"{allow_path}:{allow.files[f][1]}: {f} is {n} lines now, within {args.max_lines}: remove its 'file' line")
            continue
        listing.append(f"file {f} {n} #ISSUE over {args.max_lines} lines")
        if f in allow.files and n <= allow.files[f][0]:
            continue
        if f in allow.files:
            fails.append(f"size: {f} has {n} lines, more than the {allow.files[f][0]} its allow-list line ({allow_path}:{allow.files[f][1]}) accepts: it may only shrink; split it by role (rx/tx/cm/mem as Linux siw does)")
        else:
            fails.append(f"size: {f} has {n} lines (limit {args.max_lines}): split it by role, the way Linux siw splits rx, tx, cm and mem, before it grows further")

    # A listed file that is gone (deleted, or split and renamed) needs its
    # line no more.
    for f, (_, no) in sorted(allow.files.items()):
        if f not in files:
            notes.append(f"{allow_path}:{no}: {f} no longer exists: remove its 'file' line")

    # one fact, one place
    for f in sorted(files):
        if not FACT_FILES.search(f) or exempt_reason(f):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if f.endswith(".rs"):
            m = TEST_TAIL.search(text)
            text = text[: m.start()] if m else text
        for pat, home, why in FACTS:
            if f.startswith(home):
                continue
            for no, line in enumerate(text.split("\n"), 1):
                if pat.search(line) and not COMMENT_LINE.match(line):
                    listing.append(f"fact {f} #ISSUE spells out {pat.pattern}")
                    if f not in allow.facts:
                        fails.append(f"fact: {f}:{no}: spells out {why.split(':')[0]} again: {why.split(': ', 1)[1]}")
                    break

    # no application-level wait loop
    seen_waits = set()
    for f in sorted(files):
        if not WAIT_SCOPE.search(f) or f.startswith(WAIT_HOME) or exempt_reason(f):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        m = TEST_TAIL.search(text)
        code = strip_rust(text[: m.start()] if m else text).split("\n")
        found = []
        last_poll = -WAIT_SLEEP_NEAR - 1
        for no, line in enumerate(code, 1):
            for pat, why in WAIT_RULES:
                if pat.search(line):
                    found.append((no, why))
            if re.search(r"\bfn\s", line):
                last_poll = -WAIT_SLEEP_NEAR - 1  # a new function
            if WAIT_POLLED.search(line):
                last_poll = no
            elif WAIT_SLEEP.search(line) and no - last_poll <= WAIT_SLEEP_NEAR:
                found.append((no, "a sleep as a wait (after a poll): wait for the thing itself in an iwarp::wait::WaitSet"))
        if not found:
            continue
        seen_waits.add(f)
        listing.append(f"wait {f} #ISSUE application-level wait loop")
        if f in allow.waits:
            continue
        for no, why in found:
            fails.append(f"wait: {f}:{no}: {why} (issue 28: no application-level wait loop; docs/WAITING.md)")

    # module graph
    seen_circles, seen_parents = [], set()
    for name, rootfile in crate_roots(root, files):
        crate = Crate(root, rootfile, name)
        edges = crate.edges()
        adj = defaultdict(set)
        why = defaultdict(list)
        for a, b, file, line, item in edges:
            adj[a].add(b)
            why[(a, b)].append(f"{file}:{line}")
            if args.graph:
                print(f"edge {modname(crate, a)} -> {modname(crate, b)} {file}:{line}{' (' + item + ')' if item else ''}")
            # parent: `b` is a proper ancestor of `a` and an item is taken from it
            if item and b == a[: len(b)] and len(b) < len(a):
                key = (crate.modules[a].file, crate.modules[b].file)
                if key in seen_parents or key[0] == key[1]:
                    continue
                seen_parents.add(key)
                listing.append(f"parent {key[0]} {key[1]} #ISSUE takes {item} from an ancestor module")
                if key not in allow.parents:
                    fails.append(f"parent: {file}:{line}: module {modname(crate, a)} takes `{item}` from its ancestor {modname(crate, b)} ({key[1]}): move the shared item into a leaf module both import (issue 28: no module importing its parent for types)")
        for comp in sccs(sorted(crate.modules), adj):
            if len(comp) < 2:
                continue
            cset = set(comp)
            cfiles = frozenset(crate.modules[m].file for m in comp)
            if len(cfiles) < 2:
                continue  # inline modules of one file
            seen_circles.append(cfiles)
            listing.append("circle " + " ".join(sorted(cfiles)) + " #ISSUE import circle")
            if any(cfiles <= ok for ok, _ in allow.circles):
                continue
            lines = [f"circle: {len(comp)} modules of crate {crate.name} import each other:"]
            for a in sorted(comp):
                for b in sorted(adj[a] & cset):
                    if b != a:
                        lines.append(f"    {modname(crate, a)} -> {modname(crate, b)}: {', '.join(dict.fromkeys(why[(a, b)]))}")
            lines.append("  fix: move what both sides need into a leaf module that imports neither (or merge them); a circle means the two are one module in two files")
            fails.append("\n".join(lines))
    for ok, no in allow.circles:
        if not any(c & ok and c <= ok for c in seen_circles):
            notes.append(f"{allow_path}:{no}: the circle {' '.join(sorted(ok))} is gone: remove its line")
    for path, no in allow.facts.items():
        if not any(l.startswith(f"fact {path} ") for l in listing):
            notes.append(f"{allow_path}:{no}: {path} no longer spells out a fact of another file: remove its line")
    for path, no in allow.waits.items():
        if path not in seen_waits:
            notes.append(f"{allow_path}:{no}: {path} has no application-level wait loop any more: remove its line")
    for key, no in allow.parents.items():
        if key not in seen_parents:
            notes.append(f"{allow_path}:{no}: {key[0]} no longer takes items from {key[1]}: remove its line")

    if args.list:
        print("\n".join(listing))
        return 0
    for n in notes:
        print("note: " + n)
    if fails:
        for f in fails:
            print("FAIL " + f)
        print(
            f"check-habits: {len(fails)} problem(s). Fix them; only if a fix is "
            f"planned elsewhere, add a line to {os.path.relpath(allow_path, root)} "
            "with the issue number that tracks it ('file PATH LINES #N why', "
            "'circle PATH PATH #N why', 'parent FROM TO #N why', 'fact PATH #N why', "
            "'wait PATH #N why').",
            file=sys.stderr,
        )
        return 1
    print(f"check-habits: OK ({len(files)} files, no new file over {args.max_lines} lines, no new import circle, no new import from a parent module, no new application-level wait loop)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
