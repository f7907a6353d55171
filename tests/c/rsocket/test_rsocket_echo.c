/*
 * An echo over the rsocket API (include/iwarp_rsocket.h): a server thread
 * (rsocket, rbind, rlisten, raccept, rpoll, rrecv, rsend) and a
 * non-blocking client driven by a poll loop (rfcntl O_NONBLOCK, rwritev,
 * rreadv, rshutdown), 8 MiB checked byte for byte; names, options and the
 * error codes of bad calls. Built and run by scripts/test-preload.sh.
 * Last line: "N passed, M failed".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "iwarp_rsocket.h"

static int passed, failed;
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));      \
        }                                                                      \
    } while (0)

#define TOTAL (8u << 20)

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131u + (i >> 13)); }

static int listen_fd;

static void *server(void *arg) {
    (void)arg;
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    int fd = raccept(listen_fd, (struct sockaddr *)&peer, &plen);
    CHECK(fd >= 0, "raccept");
    if (fd < 0) return NULL;
    CHECK(plen == sizeof peer && peer.sin_family == AF_INET, "raccept peer address");
    static char buf[65536];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int rc = rpoll(&p, 1, 10000);
        if (rc <= 0) {
            CHECK(rc > 0, "server rpoll timed out");
            break;
        }
        ssize_t n = rrecv(fd, buf, sizeof buf, 0);
        if (n == 0) break;
        if (n < 0) {
            CHECK(n >= 0, "server rrecv");
            break;
        }
        ssize_t off = 0;
        while (off < n) {
            ssize_t w = rsend(fd, buf + off, (size_t)(n - off), 0);
            if (w < 0) {
                CHECK(w >= 0, "server rsend");
                goto out;
            }
            off += w;
        }
    }
out:
    CHECK(rclose(fd) == 0, "server rclose");
    return NULL;
}

int main(void) {
    /* Bad calls. */
    errno = 0;
    CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == EAFNOSUPPORT, "rsocket(AF_UNIX)");
    int s0 = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(s0 >= 0, "rsocket");
    char c;
    errno = 0;
    CHECK(rrecv(s0, &c, 1, 0) == -1 && errno == ENOTCONN, "rrecv before connect");
    errno = 0;
    CHECK(rconnect(s0, NULL, 0) == -1 && errno == EINVAL, "rconnect(NULL)");
    errno = 0;
    CHECK(rread(-5, &c, 1) == -1 && errno == EBADF, "rread(-5)");
    CHECK(rclose(s0) == 0, "rclose unconnected");

    /* Listener. */
    listen_fd = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(listen_fd >= 0, "rsocket listener");
    int one = 1;
    CHECK(rsetsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "SO_REUSEADDR");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(rbind(listen_fd, (struct sockaddr *)&a, sizeof a) == 0, "rbind");
    CHECK(rlisten(listen_fd, 8) == 0, "rlisten");
    socklen_t alen = sizeof a;
    CHECK(rgetsockname(listen_fd, (struct sockaddr *)&a, &alen) == 0 && a.sin_port != 0, "rgetsockname listener");

    /* A refused connect: a bound, unlistened port. */
    int dead = rsocket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in d = {.sin_family = AF_INET, .sin_port = 0};
    d.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t dlen = sizeof d;
    int dead_listener = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(rbind(dead_listener, (struct sockaddr *)&d, sizeof d) == 0, "rbind unlistened");
    CHECK(rgetsockname(dead_listener, (struct sockaddr *)&d, &dlen) == 0, "rgetsockname unlistened");
    errno = 0;
    CHECK(rconnect(dead, (struct sockaddr *)&d, sizeof d) == -1 && errno == ECONNREFUSED,
          "rconnect to a port nobody listens on");
    rclose(dead);
    rclose(dead_listener);

    pthread_t th;
    pthread_create(&th, NULL, server, NULL);

    /* Client. */
    int fd = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "rsocket client");
    int rcvbuf = 1 << 16;
    CHECK(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0, "SO_RCVBUF before connect");
    CHECK(rconnect(fd, (struct sockaddr *)&a, sizeof a) == 0, "rconnect");
    struct sockaddr_in me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    CHECK(rgetsockname(fd, (struct sockaddr *)&me, &ml) == 0 && me.sin_port != 0, "rgetsockname");
    CHECK(rgetpeername(fd, (struct sockaddr *)&peer, &pl) == 0 && peer.sin_port == a.sin_port, "rgetpeername");
    int v = -1;
    socklen_t vl = sizeof v;
    CHECK(rgetsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &vl) == 0 && v == 0, "SO_ERROR");
    vl = sizeof v;
    CHECK(rgetsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &vl) == 0 && v == SOCK_STREAM, "SO_TYPE");
    vl = sizeof v;
    CHECK(rgetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &vl) == 0 && v == rcvbuf, "SO_RCVBUF after connect: %d", v);
    CHECK(rsetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "TCP_NODELAY");
    int fl = rfcntl(fd, F_GETFL);
    CHECK(fl >= 0 && !(fl & O_NONBLOCK), "F_GETFL blocking");
    CHECK(rfcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0, "F_SETFL O_NONBLOCK");
    CHECK(rfcntl(fd, F_GETFL) & O_NONBLOCK, "F_GETFL non-blocking");
    errno = 0;
    CHECK(rrecv(fd, &c, 1, 0) == -1 && errno == EAGAIN, "non-blocking rrecv with nothing there");

    unsigned char *out = malloc(TOTAL), *in = malloc(TOTAL);
    for (size_t i = 0; i < TOTAL; i++) out[i] = pattern(i);
    size_t sent = 0, got = 0;
    int shut = 0, loops = 0;
    while (got < TOTAL && loops < 1000000) {
        loops++;
        struct pollfd p = {.fd = fd, .events = POLLIN | (sent < TOTAL ? POLLOUT : 0)};
        int rc = rpoll(&p, 1, 10000);
        if (rc <= 0) {
            CHECK(rc > 0, "client rpoll timed out at sent=%zu got=%zu", sent, got);
            break;
        }
        if ((p.revents & POLLOUT) && sent < TOTAL) {
            size_t left = TOTAL - sent, half = left > 60000 ? 30000 : left / 2;
            struct iovec iov[2] = {{out + sent, half}, {out + sent + half, (left > 60000 ? 30000 : left - half)}};
            ssize_t w = rwritev(fd, iov, 2);
            if (w < 0 && errno != EAGAIN) {
                CHECK(w >= 0, "rwritev");
                break;
            }
            if (w > 0) sent += (size_t)w;
        }
        if (sent == TOTAL && !shut) {
            CHECK(rshutdown(fd, SHUT_WR) == 0, "rshutdown(SHUT_WR)");
            shut = 1;
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            struct iovec iov[2] = {{in + got, (TOTAL - got) / 2}, {in + got + (TOTAL - got) / 2, TOTAL - got - (TOTAL - got) / 2}};
            ssize_t r = rreadv(fd, iov, 2);
            if (r < 0 && errno != EAGAIN) {
                CHECK(r >= 0, "rreadv");
                break;
            }
            if (r == 0) break;
            if (r > 0) got += (size_t)r;
        }
    }
    CHECK(sent == TOTAL && got == TOTAL, "echo length: sent %zu got %zu", sent, got);
    CHECK(memcmp(in, out, TOTAL) == 0, "echo content");
    /* End of stream after the server closes. */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    rpoll(&p, 1, 5000);
    CHECK(rrecv(fd, &c, 1, 0) == 0, "end of stream");
    pthread_join(th, NULL);
    CHECK(rclose(fd) == 0, "rclose");
    CHECK(rclose(listen_fd) == 0, "rclose listener");
    free(in);
    free(out);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
