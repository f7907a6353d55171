#!/usr/bin/env python3
"""Hostile peers for scripts/test-modrdma.sh (mod_rdma and rhttp).

Subcommands (each exits 0 when the system under test behaved, 1 when it
did not, and prints what it saw):

  smuggle PORT MODE
      A PUT/POST with an RDMA: header that also carries a body on the
      socket (MODE body: a POST with Content-Length and a body; te: a POST
      with Transfer-Encoding chunked; clte: a POST with both; put: a PUT
      with Content-Length and a body). The body is a second request. mod_rdma must
      answer 400 and close the connection: one response, no second one,
      and no connection to the RDMA listener the header names.

  connect-back PORT NAME
      A GET with `RDMA: client-reads, ip=NAME, port=P` where P is a minimal
      MPA responder on 127.0.0.1 (NAME is another spelling of 127.0.0.1,
      such as ::ffff:127.0.0.1). The server must connect back to it (one
      MPA connection) and answer 200 with an RDMA: client-reads header.

  impostor RHTTP URL OUT SOURCE PD
      Runs `RHTTP get --x-pause-before-request URL -o OUT` and, while it
      waits, connects to its RDMA listener first, from SOURCE (an IPv4
      address), sending an MPA Request with private data PD (`old`:
      "mod_rdma/1", the form without a token; `none`: empty). rhttp must
      refuse it (MPA Reject or close) and still move the body by RDMA.

Every socket wait is bounded; no wait is a sleep.
"""

import selectors
import socket
import struct
import subprocess
import sys
import threading
import time

TIMEOUT = 20.0


def read_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError("connection closed after %d of %d bytes" % (len(b), n))
        b += chunk
    return b


# ---- MPA (RFC 5044 §7.1, RFC 6581 §5) --------------------------------------
# 0..16 key, 16 flags M(0x80) C(0x40) R(0x20) E(0x10), 17 revision,
# 18..20 private data length (big-endian), then the private data; with E
# set its first 4 bytes are the IRD/ORD block.
KEY_REQ = b"MPA ID Req Frame"
KEY_REP = b"MPA ID Rep Frame"
F_CRC, F_REJECT, F_ENHANCED = 0x40, 0x20, 0x10


def read_frame(s):
    head = read_exact(s, 20)
    (pd_len,) = struct.unpack(">H", head[18:20])
    return head, read_exact(s, pd_len)


class Responder:
    """Accepts MPA connections on 127.0.0.1, completes the handshake (no
    CRC, no markers, IRD = ORD = 1) and holds them open until close()."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.private_data = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            c.settimeout(TIMEOUT)
            try:
                head, pd = read_frame(c)
                if head[:16] != KEY_REQ:
                    c.close()
                    continue
                flags, rev = head[16], head[17]
                reply_flags = flags & (F_CRC | F_ENHANCED)
                block = b"\x00\x01\x00\x01" if flags & F_ENHANCED else b""
                self.private_data.append(pd[len(block):])
                # Counted before the Reply goes out: the server's connect
                # completes only with it, so its HTTP answer (which no
                # longer waits for a DONE) cannot overtake the count.
                self.conns.append(c)
                c.sendall(KEY_REP + bytes([reply_flags, rev]) + struct.pack(">H", len(block)) + block)
            except (OSError, EOFError):
                c.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def read_responses(s):
    """Everything the server sends until it closes (bounded); the status
    lines of the responses in it and whether it closed."""
    s.settimeout(TIMEOUT)
    data = b""
    closed = False
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            closed = True
            break
        data += chunk
    statuses = []
    i = 0
    # Walk the responses by their framing (Content-Length bodies).
    while i < len(data):
        end = data.find(b"\r\n\r\n", i)
        if end < 0 or not data.startswith(b"HTTP/1.", i):
            statuses.append("unparsed: %r" % data[i:i + 60])
            break
        head = data[i:end].decode("latin-1")
        statuses.append(head.split("\r\n", 1)[0])
        length = 0
        for line in head.split("\r\n")[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        i = end + 4 + length
    return data, statuses, closed


def smuggle(port, mode):
    if mode not in ("body", "te", "clte", "put"):
        print("smuggle: unknown MODE %r (body, te, clte, put)" % mode, file=sys.stderr)
        return 2
    r = Responder()
    try:
        smuggled = b"GET /smuggled-%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % mode.encode()
        head = (
            "%s /cgi-bin/echo.cgi HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "RDMA: client-writes, ip=127.0.0.1, port=%d, length=0\r\n"
            % ("PUT" if mode == "put" else "POST", r.port)
        )
        if mode in ("body", "clte", "put"):
            head += "Content-Length: %d\r\n" % len(smuggled)
        if mode in ("te", "clte"):
            head += "Transfer-Encoding: chunked\r\n"
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        s.sendall(head.encode() + b"\r\n" + smuggled)
        data, statuses, closed = read_responses(s)
        s.close()
        print("responses: %s; closed by the server: %s; RDMA connections: %d"
              % (statuses, closed, len(r.conns)))
        print(data.decode("latin-1")[:600])
        ok = (len(statuses) == 1 and statuses[0].split(" ")[1] == "400" and closed
              and not r.conns and b"must not carry" in data)
        return 0 if ok else 1
    finally:
        r.close()


def connect_back(port, name):
    r = Responder()
    try:
        req = (
            "GET /f2K.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            "RDMA: client-reads, ip=%s, port=%d\r\n\r\n" % (name, r.port)
        ).encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        s.sendall(req)
        # The head comes at once (the body stays granted until a DONE that
        # never comes; closing the connections below releases it).
        s.settimeout(TIMEOUT)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        print(head)
        print("MPA connections to 127.0.0.1:%d: %d" % (r.port, len(r.conns)))
        ok = head.startswith("HTTP/1.1 200") and "RDMA: client-reads" in head and len(r.conns) == 1
        return 0 if ok else 1
    finally:
        r.close()


def impostor(rhttp, url, out, source, pd_kind):
    p = subprocess.Popen(
        [rhttp, "-q", "--timeout", "20", "get", "--x-pause-before-request", url, "-o", out],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    sel = selectors.DefaultSelector()
    sel.register(p.stderr, selectors.EVENT_READ)
    err = b""
    listener = None
    deadline = time.monotonic() + TIMEOUT
    while listener is None and time.monotonic() < deadline:
        if not sel.select(deadline - time.monotonic()):
            break
        line = p.stderr.readline()
        if not line:
            break
        err += line
        if line.startswith(b"rhttp-test: RDMA listener "):
            host, _, lport = line.split()[3].decode().rpartition(":")
            listener = (host, int(lport))
    if listener is None:
        p.kill()
        print("rhttp did not announce its listener:", err.decode(errors="replace"))
        return 1
    s = socket.socket()
    s.settimeout(TIMEOUT)
    s.bind((source, 0))
    s.connect(listener)
    pd = {"old": b"mod_rdma/1", "none": b""}[pd_kind]
    block = b"\x00\x01\x00\x01"
    s.sendall(KEY_REQ + bytes([F_CRC | F_ENHANCED, 2])
              + struct.pack(">H", len(block) + len(pd)) + block + pd)
    # Only now may rhttp send its request: the impostor is first in the
    # listener's queue, ahead of the server's connection.
    p.stdin.write(b"go\n")
    p.stdin.close()
    p.stdin = None  # communicate() below must not flush it
    try:
        head, _ = read_frame(s)
        verdict = "rejected" if head[16] & F_REJECT else "ACCEPTED"
    except (EOFError, ConnectionResetError):
        verdict = "closed"
    except socket.timeout:
        verdict = "no answer"
    s.close()
    try:
        _, rest = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, rest = p.communicate()
    err += rest
    print("impostor from %s (private data %s): %s" % (source, pd_kind, verdict))
    print("rhttp exit %d:\n%s" % (p.returncode, err.decode(errors="replace")))
    ok = verdict in ("rejected", "closed") and p.returncode == 0 and b"via RDMA" in err
    return 0 if ok else 1


def main(argv):
    if len(argv) == 4 and argv[1] == "smuggle":
        return smuggle(int(argv[2]), argv[3])
    if len(argv) == 4 and argv[1] == "connect-back":
        return connect_back(int(argv[2]), argv[3])
    if len(argv) == 7 and argv[1] == "impostor":
        return impostor(*argv[2:7])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
