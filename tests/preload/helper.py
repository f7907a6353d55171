#!/usr/bin/env python3
"""Socket programs for scripts/test-preload.sh, written with nothing but
Python's `socket`/`selectors` modules, so that they run unmodified under
libiwarp_preload.so.

  helper.py serve-file PORT FILE         serve FILE to every client, forever
  helper.py echo-server PORT MODE        echo, MODE blocking|select|nostreams;
                                         forever. nostreams: the process
                                         first makes an iWARP stream to
                                         itself (connect and accept, one
                                         byte each way, closed), then forks
                                         and the child serves `blocking`
                                         (a process that may make no
                                         streams), printing "serving";
                                         TERM ends both
  helper.py echo-client PORT MODE BYTES  send BYTES random bytes, read the
                                         echo back, exit 0 if identical; MODE
                                         blocking|select|mixed (epoll, then
                                         blocking reads)|dup (through dup()
                                         and dup2() copies, originals closed)
  helper.py fetch PORT N                 connect N times, read to the end,
                                         print each SHA-256
  helper.py hold-server PORT read|sleep  accept one client, read 16 bytes,
                                         print "ready", then block in recv
                                         (print the wall time when it ends)
                                         or sleep
  helper.py hold-client PORT read|sleep|write|close
                                         connect, send 16 bytes, then sleep,
                                         block in recv (as above) or send
                                         until a send blocks and fails, or
                                         fill the send path and close
  helper.py fork-serve PORT FILE         serve FILE to one client, then fork:
                                         the child serves the next client
  helper.py slow-serve PORT FILE SECS    accept one client, wait SECS before
                                         touching it, then send FILE
  helper.py fork-inherit PORT FILE       accept one client (made a stream),
                                         fork: the child's read of the
                                         inherited stream must fail with
                                         EOPNOTSUPP; then the parent sends
                                         FILE to it, and to the next client
  helper.py fork-echo PORT               accept one client (made a stream by
                                         epoll registration), fork: the child
                                         closes its copy and exits, the
                                         parent then echoes
  helper.py stall PORT N HOLD            N clients that send only the 16-byte
                                         MPA key (RFC 5044 §7.1), then
                                         nothing; each held HOLD s. Prints
                                         "connected N" when all are
  helper.py stall-rate PORT RATE SECS HOLD [silent]
                                         such clients arriving RATE per
                                         second for SECS s, each held HOLD s;
                                         prints "steady" after HOLD s. With
                                         `silent` they send nothing at all
  helper.py hold-streams PORT N FIFO     N connections one after another,
                                         each echoing 64 bytes, all held;
                                         prints "held N" then holds them
                                         until FIFO (a named pipe) ends
  helper.py conn-rate PORT SECS          one short echo per connection
                                         (connect, 64 bytes each way, close),
                                         sequentially for SECS s: prints
                                         "rate R" (connections per second)
  helper.py conn-rate-pair PORTA PORTB SECS
                                         as conn-rate, one connection to
                                         each port in turn: prints "rates
                                         MA MB RA RB", each port's rate at
                                         its median connection, then its
                                         connections over the time they
                                         took
  helper.py reuse-server PORT N WAIT LINGER FILE
                                         accept N clients and leave them
                                         alone WAIT s (the shim's settle
                                         timer starts their MPA exchanges),
                                         then close half and reopen a file
                                         on their numbers, dup2 a file onto
                                         the other half; after LINGER s each
                                         number must still be its file
"""
import errno
import hashlib
import os
import select
import selectors
import signal
import socket
import stat
import sys
import threading
import time


def listener(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    # Room for a burst: with 16, a server thread descheduled for a few ms
    # on a loaded machine let the queue fill at ~1000 connections/s, and a
    # dropped handshake costs its client a 1 s SYN retransmission.
    s.listen(128)
    return s


def serve_file(port, path):
    data = open(path, "rb").read()
    s = listener(port)
    while True:
        c, _ = s.accept()
        try:
            c.sendall(data)
        except OSError:
            pass  # a client that went away (an MPA probe of a plain server)
        c.close()


def echo_blocking(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()


def self_stream(s, port):
    """Makes (and closes) one stream in this process: a connection to our
    own listener `s`, one byte each way."""
    def serve_one():
        c, _ = s.accept()
        c.sendall(c.recv(1))
        c.close()
    t = threading.Thread(target=serve_one)
    t.start()
    k = socket.create_connection(("127.0.0.1", port), timeout=10)
    k.sendall(b"x")
    if k.recv(1) != b"x":
        sys.exit("self_stream: no echo")
    k.close()
    t.join(10)


def echo_server(port, mode):
    s = listener(port)
    if mode == "nostreams":
        self_stream(s, port)
        child = os.fork()
        if child:
            def end(*_):
                try:
                    os.kill(child, signal.SIGTERM)
                except ProcessLookupError:
                    pass  # `timeout` signals the whole group
                os._exit(0)
            signal.signal(signal.SIGTERM, end)
            _, status = os.waitpid(child, 0)
            sys.exit(os.waitstatus_to_exitcode(status))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Only now may clients come: self_stream's thread takes the first
        # connection on `s`.
        print("serving", flush=True)
        mode = "blocking"
    if mode == "blocking":
        while True:
            c, _ = s.accept()
            threading.Thread(target=echo_blocking, args=(c,), daemon=True).start()
    sel = selectors.DefaultSelector()
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
    pending = {}
    eof = set()
    while True:
        for key, ev in sel.select():
            so = key.fileobj
            if so is s:
                try:
                    c, _ = s.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                pending[c] = b""
                sel.register(c, selectors.EVENT_READ)
                continue
            if ev & selectors.EVENT_READ:
                try:
                    b = so.recv(65536)
                except BlockingIOError:
                    b = None
                if b == b"":
                    eof.add(so)
                elif b:
                    pending[so] += b
            if so in eof and not pending.get(so):
                sel.unregister(so)
                so.close()
                pending.pop(so, None)
                eof.discard(so)
                continue
            if pending.get(so):
                try:
                    n = so.send(pending[so])
                    pending[so] = pending[so][n:]
                except BlockingIOError:
                    pass
                want = (0 if so in eof else selectors.EVENT_READ) | (
                    selectors.EVENT_WRITE if pending[so] else 0)
                if not want:
                    sel.unregister(so)
                    so.close()
                    pending.pop(so, None)
                    eof.discard(so)
                    continue
                sel.modify(so, want)
            elif so in pending:
                sel.modify(so, selectors.EVENT_READ)


def echo_client(port, mode, nbytes):
    data = os.urandom(nbytes)
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    got = bytearray()
    if mode == "dup":
        # Work through copies: dup() then close the original, dup2() onto
        # another number then close the first copy.
        d = c.dup()
        c.close()
        spare = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        os.dup2(d.fileno(), spare.fileno())
        d.close()
        c = spare
        # O_NONBLOCK belongs to the open file description, which the
        # copies share with the original (put in non-blocking mode by its
        # timeout): make it blocking, as on TCP.
        c.setblocking(True)
        mode = "blocking"
    if mode == "mixed":
        # Wait with epoll, then read in blocking mode.
        ep = select.epoll()
        ep.register(c.fileno(), select.EPOLLIN)
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        c.settimeout(None)
        while True:
            if not ep.poll(20):
                break
            b = c.recv(65536)
            if not b:
                break
            got += b
        ep.close()
    elif mode == "blocking":
        def writer():
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
        t = threading.Thread(target=writer)
        t.start()
        while True:
            b = c.recv(65536)
            if not b:
                break
            got += b
        t.join()
    else:
        c.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(c, selectors.EVENT_READ | selectors.EVENT_WRITE)
        off = 0
        deadline = time.time() + 20
        while time.time() < deadline:
            for _, ev in sel.select(timeout=1):
                if ev & selectors.EVENT_WRITE and off < len(data):
                    try:
                        off += c.send(data[off:off + 65536])
                    except BlockingIOError:
                        pass
                    if off == len(data):
                        c.shutdown(socket.SHUT_WR)
                        sel.modify(c, selectors.EVENT_READ)
                if ev & selectors.EVENT_READ:
                    try:
                        b = c.recv(65536)
                    except BlockingIOError:
                        continue
                    if not b:
                        deadline = 0
                        break
                    got += b
    c.close()
    ok = hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
    print(f"echo {mode}: sent {len(data)}, got {len(got)}, {'match' if ok else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


def fetch(port, n):
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port), timeout=20)
        h = hashlib.sha256()
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            h.update(b)
        c.close()
        print(h.hexdigest(), flush=True)


def block(c, mode):
    if mode == "sleep":
        time.sleep(60)
        return
    if mode == "close":
        # Fill the send path to a peer that does not read, then close:
        # close must come back (bounded), not hang.
        c.setblocking(False)
        chunk = b"c" * 65536
        try:
            while True:
                c.send(chunk)
        except BlockingIOError:
            pass
        t0 = time.time()
        c.close()
        print(f"closed in {time.time() - t0:.3f} s", flush=True)
        return
    if mode == "write":
        # Fill the peer (which does not read) until send blocks, and
        # report when it fails.
        chunk = b"w" * 65536
        try:
            while True:
                c.sendall(chunk)
        except OSError as e:
            print(f"returned {time.time():.3f} error {e.errno}", flush=True)
        return
    try:
        b = c.recv(65536)
        r = f"eof {len(b)}"
    except OSError as e:
        r = f"error {e.errno}"
    print(f"returned {time.time():.3f} {r}", flush=True)


def hold_server(port, mode):
    s = listener(port)
    c, _ = s.accept()
    c.recv(16)
    print("ready", flush=True)
    block(c, mode)


def hold_client(port, mode):
    # The SIGINT check needs Python's KeyboardInterrupt handler, which
    # Python installs only if SIGINT is not ignored at startup, and a
    # command a non-interactive shell starts with `&` (a CI runner's
    # background job) inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"x" * 16)
    print("ready", flush=True)
    block(c, mode)


def fork_serve(port, path):
    data = open(path, "rb").read()
    s = listener(port)
    c, _ = s.accept()
    c.sendall(data)
    c.close()
    pid = os.fork()
    if pid == 0:
        c, _ = s.accept()
        c.sendall(data)
        c.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(0 if status == 0 else 1)


def fork_echo(port):
    s = listener(port)
    c, _ = s.accept()
    # Registering it makes the stream now (an accept waits for its first
    # use), so the child inherits a stream, not a waiting accept.
    ep = select.epoll()
    ep.register(c, select.EPOLLIN)
    ep.close()
    pid = os.fork()
    if pid == 0:
        c.close()
        s.close()
        os._exit(0)
    os.waitpid(pid, 0)
    echo_blocking(c)


def slow_serve(port, path, secs):
    data = open(path, "rb").read()
    s = listener(port)
    c, _ = s.accept()
    time.sleep(secs)
    c.sendall(data)
    c.close()


def fork_inherit(port, path):
    data = open(path, "rb").read()
    s = listener(port)
    c, _ = s.accept()
    ep = select.epoll()
    ep.register(c, select.EPOLLIN)  # the stream is made here, in the parent
    ep.close()
    pid = os.fork()
    if pid == 0:
        try:
            c.recv(1)
            os._exit(3)  # a child must not drive its parent's stream
        except OSError as e:
            os._exit(0 if e.errno == errno.EOPNOTSUPP else 4)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"child: exit {os.waitstatus_to_exitcode(status)}", file=sys.stderr)
        sys.exit(1)
    c.sendall(data)
    c.close()
    c, _ = s.accept()
    c.sendall(data)
    c.close()


MPA_KEY = b"MPA ID Req Frame"


def stall(port, n, hold):
    held = []
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(MPA_KEY)
        held.append(c)
    print(f"connected {n}", flush=True)
    time.sleep(hold)


def stall_rate(port, rate, secs, hold, silent=False):
    held = []
    start = time.monotonic()
    i = 0
    steady = False
    while time.monotonic() - start < secs:
        if not steady and time.monotonic() - start >= hold:
            # As many held as there will be from now on.
            print("steady", flush=True)
            steady = True
        due = start + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            if not silent:
                c.sendall(MPA_KEY)
            held.append((time.monotonic() + hold, c))
        except OSError as e:
            print(f"staller: {e}", file=sys.stderr)
        i += 1
        while held and held[0][0] <= time.monotonic():
            held.pop(0)[1].close()
    print(f"stallers {i}", flush=True)


def echo_once(c, msg, what=""):
    """Sends msg on c and reads its echo back whole; exits naming `what`
    if the echo ends early."""
    c.sendall(msg)
    got = b""
    while len(got) < len(msg):
        b = c.recv(len(msg) - len(got))
        if not b:
            sys.exit(f"{what}echo ended early")
        got += b


def hold_streams(port, n, until):
    msg = b"h" * 64
    held = []
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        echo_once(c, msg, f"connection {len(held) + 1}: ")
        held.append(c)
    print(f"held {n}", flush=True)
    with open(until, "rb") as f:
        f.read()
    for c in held:
        c.close()


def conn_rate(port, secs):
    msg = b"r" * 64
    n = 0
    start = time.monotonic()
    while time.monotonic() - start < secs:
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        echo_once(c, msg)
        c.close()
        n += 1
    print(f"rate {n / (time.monotonic() - start):.1f}", flush=True)


def conn_rate_pair(port_a, port_b, secs):
    """conn_rate against two servers in turn, one connection to each
    alternately, so that both meet the machine's load alike. Prints each
    server's rate at its median connection (1 / the median time a
    connection took), then its connections over the time they all took."""
    msg = b"r" * 64
    took = {port_a: [], port_b: []}
    start = time.monotonic()
    while time.monotonic() - start < secs:
        for port in (port_a, port_b):
            t0 = time.monotonic()
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            echo_once(c, msg)
            c.close()
            took[port].append(time.monotonic() - t0)
    a, b = sorted(took[port_a]), sorted(took[port_b])
    print(f"rates {1 / a[len(a) // 2]:.1f} {1 / b[len(b) // 2]:.1f}"
          f" {len(a) / sum(a):.1f} {len(b) / sum(b):.1f}", flush=True)


def reuse_server(port, n, wait, linger, path):
    s = listener(port)
    conns = [s.accept()[0] for _ in range(n)]
    time.sleep(wait)
    numbers = []
    for i, c in enumerate(conns):
        fd = c.detach()
        if i % 2 == 0:
            os.close(fd)
            f = os.open(path, os.O_RDONLY)
            if f != fd:
                # The lowest free number: the one just closed.
                sys.exit(f"reopened as {f}, not {fd}")
        else:
            f = os.open(path, os.O_RDONLY)
            os.dup2(f, fd)
            os.close(f)
        numbers.append(fd)
    time.sleep(linger)
    want = open(path, "rb").read()
    bad = []
    for fd in numbers:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or os.pread(fd, len(want) + 1, 0) != want:
            bad.append(fd)
    if bad:
        sys.exit(f"descriptors {bad} of {numbers} no longer refer to the file")
    print(f"{len(numbers)} descriptors closed or replaced during MPA exchanges still refer to the file", flush=True)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "serve-file":
        serve_file(int(args[0]), args[1])
    elif cmd == "echo-server":
        echo_server(int(args[0]), args[1])
    elif cmd == "echo-client":
        echo_client(int(args[0]), args[1], int(args[2]))
    elif cmd == "fetch":
        fetch(int(args[0]), int(args[1]))
    elif cmd == "hold-server":
        hold_server(int(args[0]), args[1])
    elif cmd == "hold-client":
        hold_client(int(args[0]), args[1])
    elif cmd == "fork-serve":
        fork_serve(int(args[0]), args[1])
    elif cmd == "slow-serve":
        slow_serve(int(args[0]), args[1], float(args[2]))
    elif cmd == "fork-inherit":
        fork_inherit(int(args[0]), args[1])
    elif cmd == "fork-echo":
        fork_echo(int(args[0]))
    elif cmd == "stall":
        stall(int(args[0]), int(args[1]), float(args[2]))
    elif cmd == "stall-rate":
        stall_rate(int(args[0]), float(args[1]), float(args[2]), float(args[3]),
                   args[4:] == ["silent"])
    elif cmd == "hold-streams":
        hold_streams(int(args[0]), int(args[1]), args[2])
    elif cmd == "conn-rate":
        conn_rate(int(args[0]), float(args[1]))
    elif cmd == "conn-rate-pair":
        conn_rate_pair(int(args[0]), int(args[1]), float(args[2]))
    elif cmd == "reuse-server":
        reuse_server(int(args[0]), int(args[1]), float(args[2]), float(args[3]), args[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
