#!/usr/bin/env python3
"""A server for scripts/test-preload.sh "g) vfork": accepts one client,
reads its first bytes (the connection is now an iWARP stream), runs
`true` with subprocess.run (Python 3.10+ starts it with vfork and, for
close_fds=True, calls close_range(3, ~0) in the child before the exec),
then reads the client to its end of stream and echoes everything back.

  subprocess_echo.py PORT
"""
import socket
import subprocess
import sys


def main():
    port = int(sys.argv[1])
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(4)
    c, _ = s.accept()
    c.settimeout(20)
    got = bytearray(c.recv(65536))
    if not got:
        sys.exit("the client sent nothing")
    for _ in range(3):
        subprocess.run(["true"], check=True, timeout=20)
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    c.sendall(got)
    c.close()
    print(f"echoed {len(got)} bytes after 3 subprocess runs", flush=True)


if __name__ == "__main__":
    main()
