/*
 * riomap / riowrite / riounmap over the rsocket API
 * (include/iwarp_rsocket.h): both sides advertise an iomap table with
 * rsetsockopt(SOL_RDMA, RDMA_IOMAPSIZE) (the server on its listening
 * socket), the server maps a buffer, the client riowrites 4 MiB into it in
 * pieces and then rsends one byte; the server checks every byte. Then the
 * error codes: outside the mapping (EINVAL), a full table (ENOMEM), unmap
 * of something never mapped (EINVAL), a bad prot (EINVAL), the option
 * after connect (EINVAL). Built and run by scripts/test-preload.sh.
 * Last line: "N passed, M failed".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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

#define LEN (4u << 20)
#define OFFSET 0x40000

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131u + (i >> 13) + 7); }

static int listen_fd;
static unsigned char *target;

static int recv_all(int fd, void *buf, size_t len) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = rrecv(fd, (char *)buf + done, len - done, 0);
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static void *server(void *arg) {
    (void)arg;
    int fd = raccept(listen_fd, NULL, NULL);
    CHECK(fd >= 0, "raccept");
    if (fd < 0) return NULL;
    int v = -1;
    socklen_t vl = sizeof v;
    CHECK(rgetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &v, &vl) == 0 && v == 2,
          "the accepted socket inherits RDMA_IOMAPSIZE (got %d)", v);
    v = 4;
    errno = 0;
    CHECK(rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &v, sizeof v) == -1 && errno == EINVAL,
          "RDMA_IOMAPSIZE after the connection");
    target = calloc(1, LEN);
    off_t off = riomap(fd, target, LEN, PROT_WRITE, 0, OFFSET);
    CHECK(off == OFFSET, "riomap returned %lld", (long long)off);
    /* The client's table has one entry: a second mapping does not fit. */
    static unsigned char more[64];
    errno = 0;
    CHECK(riomap(fd, more, sizeof more, PROT_WRITE, 0, 0) == -1 && errno == ENOMEM,
          "second riomap into a one-entry table");
    errno = 0;
    CHECK(riomap(fd, more, sizeof more, PROT_READ, 0, 0) == -1 && errno == EINVAL,
          "riomap with PROT_READ");
    errno = 0;
    CHECK(riounmap(fd, more, sizeof more) == -1 && errno == EINVAL, "riounmap of nothing");
    /* Tell the client the mapping is sent; wait for its "done" byte. */
    CHECK(rsend(fd, "m", 1, 0) == 1, "rsend m");
    char b = 0;
    CHECK(recv_all(fd, &b, 1) == 0 && b == 'd', "done byte");
    size_t bad = LEN;
    for (size_t i = 0; i < LEN; i++) {
        if (target[i] != pattern(i)) {
            bad = i;
            break;
        }
    }
    CHECK(bad == LEN, "byte %zu of the mapping differs", bad);
    CHECK(riounmap(fd, target, LEN) == 0, "riounmap");
    CHECK(rsend(fd, "u", 1, 0) == 1, "rsend u");
    CHECK(recv_all(fd, &b, 1) == 0 && b == 'x', "last byte");
    rclose(fd);
    free(target);
    return NULL;
}

int main(void) {
    listen_fd = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(listen_fd >= 0, "rsocket");
    int one = 1, two = 2;
    CHECK(rsetsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "reuse");
    CHECK(rsetsockopt(listen_fd, SOL_RDMA, RDMA_IOMAPSIZE, &two, sizeof two) == 0,
          "RDMA_IOMAPSIZE on the listening socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(rbind(listen_fd, (struct sockaddr *)&a, sizeof a) == 0, "rbind");
    CHECK(rlisten(listen_fd, 4) == 0, "rlisten");
    socklen_t al = sizeof a;
    CHECK(rgetsockname(listen_fd, (struct sockaddr *)&a, &al) == 0, "rgetsockname");

    pthread_t th;
    pthread_create(&th, NULL, server, NULL);

    int fd = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof one) == 0, "RDMA_IOMAPSIZE");
    CHECK(rconnect(fd, (struct sockaddr *)&a, sizeof a) == 0, "rconnect");
    unsigned char *src = malloc(LEN);
    for (size_t i = 0; i < LEN; i++) src[i] = pattern(i);
    errno = 0;
    CHECK(riowrite(fd, src, 16, 0, 0) == (size_t)-1 && errno == EINVAL,
          "riowrite before the peer mapped anything");
    char b = 0;
    CHECK(recv_all(fd, &b, 1) == 0 && b == 'm', "mapping announced");
    errno = 0;
    CHECK(riowrite(fd, src, 16, OFFSET + LEN - 8, 0) == (size_t)-1 && errno == EINVAL,
          "riowrite across the end of the mapping");
    size_t done = 0, piece = 1000;
    while (done < LEN) {
        size_t n = LEN - done < piece ? LEN - done : piece;
        size_t w = riowrite(fd, src + done, n, OFFSET + (off_t)done, 0);
        CHECK(w == n, "riowrite of %zu at %zu returned %zd", n, done, (ssize_t)w);
        if (w != n) break;
        done += n;
        piece *= 3;
    }
    CHECK(rsend(fd, "d", 1, 0) == 1, "rsend d");
    CHECK(recv_all(fd, &b, 1) == 0 && b == 'u', "unmapped");
    CHECK(rsend(fd, "x", 1, 0) == 1, "rsend x");
    pthread_join(th, NULL);
    rclose(fd);
    rclose(listen_fd);
    free(src);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
