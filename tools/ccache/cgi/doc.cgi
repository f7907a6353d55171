#!/usr/bin/python3
"""The application server's side of the coherent cache, as a CGI under an
unmodified Apache httpd: wraps the read of document PATH_INFO in the Table 1
IPC (READ_REQUEST -> READ_PROCEED -> READ_DONE) with ccappd, and tells the
proxy the version the document was read under (X-CC-Doc-Version).

Environment (Apache SetEnv): CCAPPD_IPC (the unix socket), CCACHE_DOCROOT
(the documents' directory). Stands in for the Apache module issue 13 asks
for (not written yet, see docs/CACHE.md)."""
import os
import socket
import struct
import sys

MAGIC, FORMAT = 0x4343, 1
READ_REQUEST, READ_PROCEED, READ_DONE, ERROR = 1, 2, 3, 15
NO_SUCH_DOCUMENT = 1


def reply(status, text):
    sys.stdout.write(f"Status: {status}\r\nContent-Type: text/plain\r\n\r\nccache cgi: {text}\n")
    sys.exit(0)


def msg(kind, doc, value=0):
    return struct.pack(">HBBIQ", MAGIC, FORMAT, kind, doc, value)


def recv(s):
    b = b""
    while len(b) < 16:
        part = s.recv(16 - len(b))
        if not part:
            raise OSError("ccappd closed the IPC connection")
        b += part
    magic, fmt, kind, doc, value = struct.unpack(">HBBIQ", b)
    if magic != MAGIC or fmt != FORMAT:
        raise OSError("ccappd sent a malformed message")
    return kind, doc, value


def main():
    path = os.environ.get("PATH_INFO", "").strip("/")
    if not path.isdigit() or int(path) >= 2**32:
        reply(404, f"no document {path!r}: ask for /doc.cgi/<number>")
    doc = int(path)
    ipc = os.environ.get("CCAPPD_IPC", "/run/ccappd/ipc.sock")
    root = os.environ.get("CCACHE_DOCROOT", "")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(ipc)
        s.sendall(msg(READ_REQUEST, doc))
        kind, rdoc, value = recv(s)
        if kind == ERROR:
            reply(404 if value == NO_SUCH_DOCUMENT else 500, f"ccappd refused document {doc} (code {value})")
        if kind != READ_PROCEED or rdoc != doc:
            reply(500, f"ccappd answered kind {kind} for document {rdoc}")
        with open(os.path.join(root, str(doc)), "rb") as f:
            body = f.read()
        s.sendall(msg(READ_DONE, doc))
    except OSError as e:
        reply(503, f"application module unavailable ({ipc}): {e}")
    finally:
        s.close()
    head = f"Content-Type: text/plain\r\nX-CC-Doc-Version: {value}\r\n\r\n".encode()
    sys.stdout.buffer.write(head + body)


main()
