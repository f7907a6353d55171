/*
 * Helpers shared by the C tests of libiwarp: a tiny check/count harness and
 * a connected QP pair over 127.0.0.1 (the server side accepts on a thread).
 *
 * Every test prints "N passed, N failed" as its last line and exits non-zero
 * if anything failed.
 */
#ifndef IWARP_TEST_COMMON_H
#define IWARP_TEST_COMMON_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "iwarp.h"

static int t_passed;
static int t_failed;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (cond) {                                                          \
            t_passed++;                                                      \
        } else {                                                             \
            char t_err_[512];                                                \
            t_failed++;                                                      \
            iwarp_last_error(t_err_, sizeof t_err_);                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, " (last error: %s)\n", t_err_);                  \
        }                                                                    \
    } while (0)

/* Check that a call returned `want`, printing both names if not. */
#define CHECK_RC(call, want)                                                 \
    do {                                                                     \
        iwarp_result t_rc_ = (call);                                         \
        CHECK(t_rc_ == (want), "%s returned %s (%d), want %s", #call,       \
              iwarp_result_str(t_rc_), (int)t_rc_, iwarp_result_str(want));  \
    } while (0)

static inline int t_finish(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, t_passed, t_failed);
    return t_failed == 0 ? 0 : 1;
}

static inline double t_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Does this thread's last error mention `needle`? */
static inline int t_last_error_has(const char *needle)
{
    char buf[1024];
    size_t n = iwarp_last_error(buf, sizeof buf);
    return n > 0 && strstr(buf, needle) != NULL;
}

/* One endpoint: device, PD, one CQ for both queues, a QP. */
struct side {
    iwarp_context *ctx;
    iwarp_pd *pd;
    iwarp_cq *cq;
    iwarp_qp *qp;
};

static inline int side_open(struct side *s)
{
    memset(s, 0, sizeof *s);
    if (iwarp_open_device(&s->ctx) != IWARP_OK) return -1;
    if (iwarp_alloc_pd(s->ctx, &s->pd) != IWARP_OK) return -1;
    if (iwarp_create_cq(s->ctx, 64, &s->cq) != IWARP_OK) return -1;
    if (iwarp_create_qp(s->pd, s->cq, s->cq, 16, 16, &s->qp) != IWARP_OK) return -1;
    return 0;
}

static inline void side_close(struct side *s)
{
    /* Any order works; this is the libibverbs order. */
    iwarp_destroy_qp(s->qp);
    iwarp_destroy_cq(s->cq);
    iwarp_dealloc_pd(s->pd);
    iwarp_close_device(s->ctx);
    memset(s, 0, sizeof *s);
}

/* The server half of a connection: get one request and accept it. */
struct acceptor {
    iwarp_listener *l;
    iwarp_qp *qp;
    const uint8_t *reply;      /* private data of the Reply */
    size_t reply_len;
    int reject;                /* reject instead of accepting */
    iwarp_result rc;           /* result of get_request / accept / reject */
    uint8_t req_data[512];     /* private data of the Request */
    size_t req_len;
    char peer[64];
    pthread_t thread;
};

static inline void *acceptor_main(void *arg)
{
    struct acceptor *a = arg;
    iwarp_conn_request *r = NULL;
    const uint8_t *data = NULL;
    iwarp_conn_param p;

    a->rc = iwarp_get_request(a->l, 5000, &r);
    if (a->rc != IWARP_OK) return NULL;
    a->req_len = iwarp_conn_request_private_data(r, &data);
    if (a->req_len > sizeof a->req_data) a->req_len = sizeof a->req_data;
    if (a->req_len > 0) memcpy(a->req_data, data, a->req_len);
    iwarp_conn_request_peer(r, a->peer, sizeof a->peer);
    if (a->reject) {
        a->rc = iwarp_reject(r, a->reply, a->reply_len);
        return NULL;
    }
    iwarp_conn_param_init(&p);
    p.private_data = a->reply;
    p.private_data_len = a->reply_len;
    a->rc = iwarp_accept(r, a->qp, &p);
    return NULL;
}

static inline int acceptor_start(struct acceptor *a)
{
    return pthread_create(&a->thread, NULL, acceptor_main, a);
}

static inline void acceptor_join(struct acceptor *a)
{
    pthread_join(a->thread, NULL);
}

/* A connected pair over 127.0.0.1 with default MPA parameters. */
struct pair {
    struct side srv, cli;
    iwarp_listener *l;
};

static inline int pair_connect(struct pair *p)
{
    struct acceptor a;
    iwarp_result rc;

    memset(p, 0, sizeof *p);
    if (side_open(&p->srv) || side_open(&p->cli)) return -1;
    if (iwarp_listen("127.0.0.1", 0, NULL, &p->l) != IWARP_OK) return -1;
    memset(&a, 0, sizeof a);
    a.l = p->l;
    a.qp = p->srv.qp;
    if (acceptor_start(&a)) return -1;
    rc = iwarp_connect(p->cli.qp, "127.0.0.1", iwarp_listener_port(p->l), NULL, NULL, NULL);
    acceptor_join(&a);
    return rc == IWARP_OK && a.rc == IWARP_OK ? 0 : -1;
}

static inline void pair_close(struct pair *p)
{
    side_close(&p->cli);
    side_close(&p->srv);
    iwarp_listener_close(p->l);
}

#endif /* IWARP_TEST_COMMON_H */
