# shellcheck shell=bash
# free_port_once FILE: prints a TCP port that is free on 127.0.0.1 now,
# picked below the kernel's ephemeral range (so no outgoing connection
# takes it as its source port before the server binds it) and never one
# listed in FILE (one script's ports stay distinct); records it in FILE.
# Taking a port from bind(:0) and releasing it allowed both: a CI run of
# test-cache-push.sh once gave one proxy the port another listened on.
free_port_once() {
    /usr/bin/python3 - "$1" <<'PY'
import os, random, socket, sys
path = sys.argv[1]
given = set()
if os.path.exists(path):
    given = {int(w) for w in open(path).read().split()}
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
candidates = range(10000, lo) if lo > 12000 else range(lo + 2000, 65000)
for _ in range(5000):
    p = random.choice(candidates)
    if p in given:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    with open(path, "a") as f:
        f.write(f"{p}\n")
    print(p)
    break
else:
    sys.exit("no free port found")
PY
}
