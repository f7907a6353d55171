#!/usr/bin/env bash
# What sendfile or MSG_ZEROCOPY could save the software provider's transmit
# path (issue 30 section 1, step 1): over loopback TCP, send GiB from a file
# in the page cache as FPDU-like pieces (16-byte header, 65,496-byte payload,
# 4-byte trailer, as `gather_and_send` writes a 64 KiB frame of tagged
# payload) and report the sender's CPU seconds per GB (getrusage, the
# receiver is another process) for:
#   copy       one sendmsg per FPDU, the payload from a MAP_SHARED mapping
#              (what the provider does today: the kernel copies it)
#   sendfile   header send(MSG_MORE), sendfile of the payload, trailer send
#   zerocopy   as copy with MSG_ZEROCOPY (on loopback the kernel copies the
#              frags at delivery, so no gain is expected)
#   write-bulk / sendfile-bulk  the same bytes without framing, 1 MiB per
#              call (plain Apache's sendfile against a plain write)
# and copy/sendfile again with a CRC32C pass over the mapping per FPDU
# (CRC on: the provider reads the region once for the CRC either way), and
# copy-again (copy once more: the A/A pair that shows the noise).
# Modes run interleaved, N rounds; medians and per-round ratios at the end.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/bench-sendfile-ceiling.sh [--rounds N] [--dir DIR] [--gib G]

  --rounds N   interleaved rounds of every mode (default 5)
  --dir DIR    where the 256 MiB body file goes (default /dev/shm; use a
               disk directory to measure a disk file system's page cache)
  --gib G      GiB sent per run (default 1)
  -h, --help   this text

Needs cc and python3. Run it under `nice -n -15` on a quiet machine and
quote the load average it prints.
EOF
}

ROUNDS=5 DIR=/dev/shm GIB=1
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --gib) GIB="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench-sendfile-ceiling: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v cc >/dev/null || { echo "bench-sendfile-ceiling: cc missing: apt-get install gcc" >&2; exit 1; }

T="$(mktemp -d /tmp/sendfile-ceiling.XXXXXX)"
BODY="$(mktemp "$DIR/sendfile-ceiling-body.XXXXXX")"
trap 'rm -rf "$T" "$BODY"' EXIT

cat >"$T/ceil.c" <<'EOF'
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static double secs(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }
static double cpu(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return secs(r.ru_utime) + secs(r.ru_stime);
}
static void die(const char *what) { perror(what); exit(1); }

/* CRC32C (Castagnoli), bitwise-reflected; SSE4.2 when the compiler has it. */
static uint32_t crc32c(const unsigned char *p, size_t n) {
    uint32_t c = ~0u;
#ifdef __SSE4_2__
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
    }
    c = (uint32_t)c64;
#endif
    for (; n; n--, p++) {
        c ^= *p;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & -(c & 1));
    }
    return ~c;
}

/* Drain MSG_ZEROCOPY completions; with `block`, wait for at least one. */
static void reap(int fd, int block) {
    char ctl[128];
    for (;;) {
        struct msghdr m = {0};
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        if (recvmsg(fd, &m, MSG_ERRQUEUE | (block ? 0 : MSG_DONTWAIT)) < 0) return;
        block = 0;
    }
}

/* Send all of iov[0..n) with sendmsg, resuming after partial writes. */
static long send_all(int s, struct iovec *v, int n, int flags) {
    size_t need = 0, done = 0;
    long calls = 0;
    for (int i = 0; i < n; i++) need += v[i].iov_len;
    while (done < need) {
        struct iovec w[4];
        int k = 0;
        size_t skip = done;
        for (int i = 0; i < n; i++) {
            if (skip >= v[i].iov_len) { skip -= v[i].iov_len; continue; }
            w[k].iov_base = (char *)v[i].iov_base + skip;
            w[k++].iov_len = v[i].iov_len - skip;
            skip = 0;
        }
        struct msghdr m = {0};
        m.msg_iov = w;
        m.msg_iovlen = k;
        ssize_t r = sendmsg(s, &m, flags);
        calls++;
        if (r < 0 && errno == ENOBUFS && (flags & MSG_ZEROCOPY)) { reap(s, 1); continue; }
        if (r < 0) die("sendmsg");
        done += r;
        if (flags & MSG_ZEROCOPY) reap(s, 0);
    }
    return calls;
}

static long sendfile_all(int s, int f, off_t off, size_t n) {
    long calls = 0;
    while (n) {
        ssize_t r = sendfile(s, f, &off, n);
        calls++;
        if (r <= 0) { fprintf(stderr, "sendfile: short (%zd): %s\n", r, strerror(errno)); exit(1); }
        n -= r;
    }
    return calls;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: ceil FILE MODE BYTES CRC\n"); return 2; }
    const char *mode = argv[2];
    long total = atol(argv[3]);
    int crc = atoi(argv[4]);
    int f = open(argv[1], O_RDONLY);
    if (f < 0) die("open");
    off_t flen = lseek(f, 0, SEEK_END);
    unsigned char *map = mmap(0, flen, PROT_READ, MAP_SHARED, f, 0);
    if (map == MAP_FAILED) die("mmap");
    int bulk = !strcmp(mode, "write-bulk") || !strcmp(mode, "sendfile-bulk");
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) die("listen");
    pid_t pid = fork();
    if (pid == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a)) die("connect");
        static char buf[1 << 20];
        long n = 0;
        ssize_t r;
        while ((r = read(s, buf, sizeof buf)) > 0) n += r;
        printf("recv_cpu_s_per_GB=%.4f ", cpu() / (n / 1e9));
        fflush(stdout);
        _exit(n == total ? 0 : 1);
    }
    int s = accept(ls, 0, 0);
    if (s < 0) die("accept");
    int one = 1;
    if (!strcmp(mode, "zerocopy") && setsockopt(s, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) die("SO_ZEROCOPY");
    const size_t payload = bulk ? (1 << 20) : 65496;
    unsigned char hdr[16] = {0}, trailer[4] = {0};
    long sent = 0, calls = 0;
    off_t fo = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double c0 = cpu();
    while (sent < total) {
        if (fo >= flen) fo = 0;
        size_t n = payload;
        if ((long)n > total - sent) n = total - sent;
        if (fo + (off_t)n > flen) n = flen - fo;
        if (crc) {
            uint32_t c = crc32c(map + fo, n);
            memcpy(trailer, &c, 4);
        }
        if (!strcmp(mode, "write-bulk")) {
            struct iovec v[1] = {{map + fo, n}};
            calls += send_all(s, v, 1, 0);
        } else if (!strcmp(mode, "sendfile-bulk")) {
            calls += sendfile_all(s, f, fo, n);
        } else if (!strcmp(mode, "sendfile")) {
            if (send(s, hdr, 16, MSG_MORE) != 16) die("send header");
            calls += 2 + sendfile_all(s, f, fo, n);
            if (send(s, trailer, 4, 0) != 4) die("send trailer");
        } else { /* copy, copy-again, zerocopy */
            struct iovec v[3] = {{hdr, 16}, {map + fo, n}, {trailer, 4}};
            calls += send_all(s, v, 3, !strcmp(mode, "zerocopy") ? MSG_ZEROCOPY : 0);
        }
        fo += n;
        sent += n;
    }
    double c1 = cpu();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    shutdown(s, SHUT_WR);
    int st;
    waitpid(pid, &st, 0);
    double wall = t1.tv_sec - t0.tv_sec + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("mode=%s crc=%d cpu_s_per_GB=%.4f MB_s=%.0f calls=%ld\n", mode, crc, (c1 - c0) / (sent / 1e9),
           sent / 1e6 / wall, calls);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
EOF
cc -O2 -march=native -o "$T/ceil" "$T/ceil.c"
dd if=/dev/urandom of="$BODY" bs=1M count=256 status=none
cat "$BODY" >/dev/null
BYTES=$((GIB * 1024 * 1024 * 1024))
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, body in $DIR ($(df -T "$DIR" | awk 'NR==2{print $2}'))"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
    for m in copy:0 sendfile:0 zerocopy:0 copy-again:0 write-bulk:0 sendfile-bulk:0 copy:1 sendfile:1; do
        echo "round=$r $("$T/ceil" "$BODY" "${m%:*}" "$BYTES" "${m#*:}")"
    done
done | tee "$T/runs.txt"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$T/runs.txt" <<'EOF'
import re, statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    d = dict(kv.split("=", 1) for kv in line.split())
    rows.setdefault(d["round"], {})[d["mode"] + ("+crc" if d["crc"] == "1" else "")] = (
        float(d["cpu_s_per_GB"]), float(d["recv_cpu_s_per_GB"]), float(d["MB_s"]))
modes = list(next(iter(rows.values())))
print("| mode | sender CPU-s/GB (median, range) | receiver CPU-s/GB | MB/s |")
print("| --- | --- | --- | --- |")
for m in modes:
    v = [r[m] for r in rows.values() if m in r]
    s = [x[0] for x in v]
    print(f"| {m} | {st.median(s):.3f} ({min(s):.3f}-{max(s):.3f}) | {st.median(x[1] for x in v):.3f} | {st.median(x[2] for x in v):.0f} |")
for a, b in (("copy-again", "copy"), ("sendfile", "copy"), ("zerocopy", "copy"), ("sendfile-bulk", "write-bulk"), ("sendfile+crc", "copy+crc")):
    q = [r[a][0] / r[b][0] for r in rows.values() if a in r and b in r]
    print(f"{a} / {b}, sender CPU per GB, per round: {' '.join(f'{x:.2f}' for x in q)}; median {st.median(q):.2f}")
EOF
