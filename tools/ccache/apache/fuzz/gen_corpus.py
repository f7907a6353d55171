#!/usr/bin/env python3
"""Writes the seed corpus of ipc_fuzz.c (tools/ccache/apache/fuzz/corpus):
replies ccappd sends to mod_ccache's READ_REQUEST(7), byte for byte as
crates/ccache-proto/src/ipc.rs's Repr::to_bytes encodes them ("CC" |
format 1 | kind | doc BE u32 | value BE u64), and broken streams
(truncated, oversized, not ccappd). Rerun after a change to the frame:
    python3 tools/ccache/apache/fuzz/gen_corpus.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

KINDS = {"READ_REQUEST": 1, "READ_PROCEED": 2, "READ_DONE": 3, "UPDATE_REQUEST": 4,
         "UPDATE_PROCEED": 5, "UPDATE_DONE": 6, "UPDATE_COMMITTED": 7,
         "VERSION_REQUEST": 8, "VERSION_REPLY": 9, "PICK_ACCESSED": 10, "PICKED": 11,
         "ERROR": 15}


def frame(kind, doc, value=0):
    return b"CC" + struct.pack(">BBIQ", 1, KINDS[kind], doc, value)


# ipc.rs's test vector PROCEED: READ_PROCEED(7, 0x0102030405060708).
PROCEED = bytes([0x43, 0x43, 0x01, 0x02, 0x00, 0x00, 0x00, 0x07,
                 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08])
assert frame("READ_PROCEED", 7, 0x0102030405060708) == PROCEED

SEEDS = {
    # What ccappd answers (tools/ccache/src/ipc.rs).
    "proceed-doc7-v1": frame("READ_PROCEED", 7, 1),
    "proceed-doc7-v0": frame("READ_PROCEED", 7, 0),
    "proceed-doc7-ipc-rs-vector": PROCEED,
    "proceed-doc7-vmax": frame("READ_PROCEED", 7, 2**64 - 1),
    "proceed-doc8": frame("READ_PROCEED", 8, 1),
    "proceed-docmax": frame("READ_PROCEED", 2**32 - 1, 3),
    "error-no-such-document": frame("ERROR", 7, 1),
    "error-out-of-order": frame("ERROR", 7, 2),
    "error-malformed": frame("ERROR", 7, 3),
    "error-not-a-request": frame("ERROR", 7, 4),
    "error-busy": frame("ERROR", 0, 5),
    "error-not-permitted": frame("ERROR", 0, 6),
    "error-unknown-code": frame("ERROR", 7, 7),
    "error-code-max": frame("ERROR", 7, 2**64 - 1),
    # Kinds ccappd does not send to a reader.
    "read-request": frame("READ_REQUEST", 7),
    "read-done": frame("READ_DONE", 7),
    "update-proceed": frame("UPDATE_PROCEED", 7, 4),
    "update-committed": frame("UPDATE_COMMITTED", 7, 5),
    "version-reply": frame("VERSION_REPLY", 7, 6),
    "picked": frame("PICKED", 7, 100),
    "kind-0": PROCEED[:3] + b"\x00" + PROCEED[4:],
    "kind-255": PROCEED[:3] + b"\xff" + PROCEED[4:],
    # Not ccappd, or another format.
    "http-request": b"GET / HTTP/1.1\r\n",
    "format-2": PROCEED[:2] + b"\x02" + PROCEED[3:],
    "magic-cd": b"CD" + PROCEED[2:],
    # Truncated: the peer closed mid-frame (libFuzzer tries the empty input
    # itself).
    "one-byte": PROCEED[:1],
    "half": PROCEED[:8],
    "fifteen": PROCEED[:15],
    # Oversized: only the first 16 bytes are the reply.
    "proceed-trailing": PROCEED + b"trailing",
    "proceed-then-error": PROCEED + frame("ERROR", 7, 6),
    "error-then-proceed": frame("ERROR", 7, 1) + PROCEED,
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(SEEDS)} seeds in {OUT}")
