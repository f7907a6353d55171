#!/usr/bin/env python3
"""Self-test of scripts/check_habits.py (run by `check-habits.sh
--self-test`, well under a second): fake crates in a temp dir, with a
circle, a 1,300-line file, an import from a parent module, the MPA key
spelled out outside iwarp-proto and application-level wait loops (a
poll(2), a sliced CQ wait, a sleep after a poll), must be
rejected, each for its own reason; a clean crate (with the look-alikes a
naive grep would trip on) must be accepted; the allow-list must accept
exactly what it lists."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_habits.py")
FAILED = []


def tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def run(root, allow=None):
    cmd = [sys.executable, CHECK, "--root", root, "--allow", allow or os.path.join(root, "none.txt")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def expect(name, cond, out):
    print(("ok   " if cond else "FAIL ") + name)
    if not cond:
        FAILED.append(name)
        print("  output was:\n    " + out.replace("\n", "\n    "))


CARGO = '[package]\nname = "fake"\nversion = "0.1.0"\n'
LONG = "".join(f"pub const C{i}: u32 = {i};\n" for i in range(1300))

BAD = {
    "Cargo.toml": CARGO,
    "src/lib.rs": "mod a;\nmod b;\nmod big;\nmod key;\npub mod p;\n",
    "src/key.rs": 'pub const KEY: &[u8; 16] = b"MPA ID Req Frame";\n',
    "src/a.rs": "use crate::b::B;\npub struct A(pub B);\n",
    "src/b.rs": "pub struct B;\npub fn f() -> crate::a::A {\n    crate::a::A(B)\n}\n",
    "src/big.rs": LONG,
    "src/p.rs": "mod kid;\npub struct Shared;\n",
    "src/p/kid.rs": "use super::Shared;\npub fn g(_: Shared) {}\n",
    "tools/app/src/waits.rs": (
        "pub fn a(fds: &mut [libc::pollfd]) {\n"
        "    unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };\n"
        "}\n"
        "pub fn b(cq: &Cq, left: Duration) {\n"
        "    loop {\n"
        "        let _ = cq.wait(left.min(Duration::from_millis(200)));\n"
        "    }\n"
        "}\n"
        "pub fn c(cq: &Cq) {\n"
        "    while cq.poll_one().is_none() {\n"
        "        std::thread::sleep(Duration::from_millis(1));\n"
        "    }\n"
        "}\n"
    ),
}

CLEAN = {
    "Cargo.toml": CARGO,
    "src/lib.rs": "mod a;\nmod b;\nmod types;\npub use a::A;\n",
    "src/types.rs": "pub struct T;\n",
    "src/a.rs": (
        "use crate::types::T;\n"
        "// use crate::b::B; (a comment, not an import)\n"
        'pub const S: &str = "crate::b::f";\n'
        "pub struct A(pub T);\n"
        "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::b::f;\n    #[test]\n    fn t() { f(); let _ = A(T); }\n}\n"
    ),
    "src/b.rs": "use super::types::T;\nuse crate::A;\npub fn f() -> A {\n    A(T)\n}\n",
    "tests/long.rs": LONG + 'const KEY: &[u8; 16] = b"MPA ID Req Frame";\n',
    # Look-alikes of wait loops that are not: a comment, a string, a
    # non-blocking take, a grace capped by what is left, a sleep far from
    # any poll, a test module, and the verbs crate itself.
    "tools/app/src/ok.rs": (
        "// libc::poll( in a comment\n"
        'pub const S: &str = "cq.wait(left.min(Duration::from_millis(1)))";\n'
        "pub fn a(l: &L, left: Duration) {\n"
        "    let _ = l.get_request(Some(Duration::ZERO));\n"
        "    let _ = l.get_request(Some(REQUEST_WAIT.min(left)));\n"
        "}\n"
        "pub fn b() {\n"
        "    std::thread::sleep(Duration::from_millis(1));\n"
        "}\n"
        "#[cfg(test)]\nmod tests {\n    fn t() { unsafe { libc::poll(std::ptr::null_mut(), 0, 1) }; }\n}\n"
    ),
    "crates/iwarp/src/wait.rs": "pub fn w() { unsafe { libc::poll(std::ptr::null_mut(), 0, 1) }; }\n",
}

with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, "bad")
    tree(bad, BAD)
    rc, out = run(bad)
    expect("bad crate rejected", rc == 1, out)
    expect("the circle named with its edges", "circle:" in out and "src/a.rs:1" in out and "src/b.rs:2" in out, out)
    expect("the 1,300-line file named", "size: src/big.rs has 1300 lines" in out, out)
    expect("the import from the parent named", "parent: src/p/kid.rs:1" in out and "`Shared`" in out, out)
    expect("the MPA key spelled out again named", "fact: src/key.rs:1" in out, out)
    expect("an application's own poll(2) named", "wait: tools/app/src/waits.rs:2: its own poll(2)" in out, out)
    expect("a sliced CQ wait named", "wait: tools/app/src/waits.rs:6: a wait cut into slices" in out, out)
    expect("a sleep after a poll named", "wait: tools/app/src/waits.rs:11: a sleep as a wait" in out, out)
    expect("it says what to do", "habits-allow.txt" in out or "none.txt" in out, out)

    clean = os.path.join(tmp, "clean")
    tree(clean, CLEAN)
    rc, out = run(clean)
    expect("clean crate accepted", rc == 0, out)

    # The allow-list accepts exactly what it lists, and a listed file may
    # only shrink.
    allow = os.path.join(tmp, "allow.txt")
    with open(allow, "w") as f:
        f.write(
            "circle src/a.rs src/b.rs #28 test\n"
            "file src/big.rs 1300 #28 test\n"
            "parent src/p/kid.rs src/p.rs #28 test\n"
            "fact src/key.rs #28 test\n"
            "wait tools/app/src/waits.rs #28 test\n"
        )
    rc, out = run(bad, allow)
    expect("listed offenders accepted", rc == 0, out)
    with open(os.path.join(bad, "src/big.rs"), "a") as f:
        f.write("pub const GROWN: u32 = 0;\n")
    rc, out = run(bad, allow)
    expect("a listed file that grew rejected", rc == 1 and "may only shrink" in out, out)
    with open(allow, "a") as f:
        f.write("file src/gone.rs 1500 #28 test\n")
    rc, out = run(bad, allow)
    expect("a listed file that no longer exists noted", "src/gone.rs no longer exists: remove its 'file' line" in out, out)
    with open(allow, "a") as f:
        f.write("file src/x.rs 10 no issue number\n")
    rc, out = run(bad, allow)
    expect("an allow line without an issue number rejected", rc == 1 and "no issue number" in out, out)

if FAILED:
    print(f"check-habits self-test: {len(FAILED)} FAILED: {', '.join(FAILED)}")
    sys.exit(1)
print("check-habits self-test: OK")
