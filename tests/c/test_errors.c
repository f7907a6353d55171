/*
 * Error paths of the C API: NULL arguments, bad arguments, refused and
 * rejected connections, policy conflicts, timeouts, and a bad rkey on RDMA
 * Write and Read (error completion, QP in error).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"

static void null_arguments(void)
{
    iwarp_context *ctx = NULL;
    iwarp_pd *pd = NULL;
    iwarp_cq *cq = NULL;
    iwarp_qp *qp = NULL;
    iwarp_mr *mr = (iwarp_mr *)&ctx; /* must be reset to NULL on failure */
    iwarp_listener *l = NULL;
    iwarp_conn_request *r = NULL;
    iwarp_wc wc;
    iwarp_sge sge = {0, 0, 0};
    const uint8_t *data = (const uint8_t *)"x";
    char buf[8];

    CHECK_RC(iwarp_open_device(NULL), IWARP_ERR_NULL_ARG);
    CHECK(t_last_error_has("iwarp_open_device") && t_last_error_has("`out` is NULL"),
          "message names function and argument");
    {
        char small[8];
        size_t need = iwarp_last_error(NULL, 0);
        size_t got = iwarp_last_error(small, sizeof small);
        CHECK(need > sizeof small && got == need && strlen(small) == sizeof small - 1,
              "truncation: need %zu got %zu strlen %zu", need, got, strlen(small));
    }
    CHECK_RC(iwarp_alloc_pd(NULL, &pd), IWARP_ERR_NULL_ARG);
    CHECK(t_last_error_has("`ctx` is NULL"), "ctx named");
    CHECK(pd == NULL, "out stays NULL");
    CHECK_RC(iwarp_create_cq(NULL, 16, &cq), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_create_qp(NULL, NULL, NULL, 1, 1, &qp), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_alloc_mr(NULL, 64, 0, &mr), IWARP_ERR_NULL_ARG);
    CHECK(mr == NULL, "failed call sets *out = NULL");
    CHECK_RC(iwarp_post_send(NULL, 1, IWARP_WR_SEND, &sge, 1, 0, 0, 0, 0), IWARP_ERR_NULL_ARG);
    CHECK(t_last_error_has("iwarp_post_send") && t_last_error_has("`qp`"), "qp named");
    CHECK_RC(iwarp_post_recv(NULL, 1, &sge, 1), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_wait_cq(NULL, 0, &wc), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_connect(NULL, "127.0.0.1", 1, NULL, NULL, NULL), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_listen(NULL, 0, NULL, &l), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_listen("127.0.0.1", 0, NULL, NULL), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_get_request(NULL, 0, &r), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_accept(NULL, NULL, NULL), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_reject(NULL, NULL, 0), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_disconnect(NULL), IWARP_ERR_NULL_ARG);
    CHECK(iwarp_poll_cq(NULL, 1, &wc) == -IWARP_ERR_NULL_ARG, "poll_cq NULL cq");
    CHECK(iwarp_cq_fd(NULL) == -1, "cq_fd NULL");
    CHECK_RC(iwarp_cq_progress(NULL), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_cq_set_progress(NULL, IWARP_PROGRESS_APP_DRIVEN, 0), IWARP_ERR_NULL_ARG);
    CHECK(t_last_error_has("iwarp_cq_set_progress") && t_last_error_has("`cq`"), "cq named");
    CHECK(iwarp_mr_addr(NULL) == NULL && iwarp_mr_length(NULL) == 0 && iwarp_mr_lkey(NULL) == 0 &&
              iwarp_mr_rkey(NULL) == 0,
          "mr getters on NULL");
    CHECK(t_last_error_has("`mr` is NULL"), "getter sets last error");
    CHECK(iwarp_listener_port(NULL) == 0, "listener_port NULL");
    CHECK(iwarp_query_qp_state(NULL) == -IWARP_ERR_NULL_ARG, "qp_state NULL");
    CHECK(iwarp_conn_request_private_data(NULL, &data) == 0 && data == NULL, "request data NULL");
    CHECK(iwarp_conn_request_peer(NULL, buf, sizeof buf) == 0, "request peer NULL");
    /* Free functions accept NULL. */
    iwarp_close_device(NULL);
    iwarp_dealloc_pd(NULL);
    iwarp_dereg_mr(NULL);
    iwarp_destroy_cq(NULL);
    iwarp_destroy_qp(NULL);
    iwarp_listener_close(NULL);
    iwarp_conn_request_destroy(NULL);
    iwarp_conn_param_init(NULL);
    t_passed++;
    /* Result strings. */
    CHECK(strcmp(iwarp_result_str(IWARP_OK), "success") == 0, "result_str OK");
    CHECK(strcmp(iwarp_result_str(-IWARP_ERR_TIMEOUT), iwarp_result_str(IWARP_ERR_TIMEOUT)) == 0,
          "negated codes");
    CHECK(strcmp(iwarp_result_str(12345), "unknown iwarp_result") == 0, "unknown code");
    CHECK(strlen(iwarp_version()) > 0, "version");
}

/* Device selection (iwarp_open_device_named, iwarp_device_name,
 * iwarp_listen_on): soft opens by name; a bad name and a kernel device that
 * is not there fail naming the fix (skipped where the host has RDMA). */
static void device_selection(void)
{
    iwarp_context *ctx = NULL;
    iwarp_listener *l = NULL;
    char name[16];

    CHECK_RC(iwarp_open_device_named("soft", NULL), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_open_device_named("soft", &ctx), IWARP_OK);
    CHECK(iwarp_device_name(ctx, name, sizeof name) == 4 && strcmp(name, "soft") == 0,
          "device name soft, got %s", name);
    CHECK(iwarp_device_name(NULL, name, sizeof name) == 0, "device_name NULL ctx");
    CHECK_RC(iwarp_listen_on(NULL, "127.0.0.1", 0, NULL, &l), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_listen_on(ctx, "127.0.0.1", 0, NULL, &l), IWARP_OK);
    CHECK(iwarp_listener_port(l) != 0, "listen_on picked a port");
    iwarp_listener_close(l);
    iwarp_close_device(ctx);
    ctx = (iwarp_context *)&l; /* must be reset to NULL on failure */
    CHECK_RC(iwarp_open_device_named("no/such", &ctx), IWARP_ERR_INVALID_ARG);
    CHECK(ctx == NULL, "failed call sets *out = NULL");
    CHECK(t_last_error_has("invalid device name"), "bad name explained");
    if (access("/sys/class/infiniband", F_OK) != 0) {
        CHECK_RC(iwarp_open_device_named("siw0", &ctx), IWARP_ERR_INVALID_ARG);
        CHECK(t_last_error_has("--device soft"), "missing device names the fix");
    }
}

static void bad_arguments(void)
{
    struct side s;
    iwarp_mr *mr = NULL;
    iwarp_cq *cq = NULL;
    iwarp_qp *qp = NULL;
    iwarp_wc wc[4];
    iwarp_sge sges[IWARP_MAX_SGE + 1];
    char mem[64];

    CHECK(side_open(&s) == 0, "setup");
    CHECK_RC(iwarp_create_cq(s.ctx, 0, &cq), IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_create_qp(s.pd, s.cq, s.cq, 0, 4, &qp), IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_alloc_mr(s.pd, 0, IWARP_ACCESS_LOCAL_WRITE, &mr), IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_alloc_mr(s.pd, 64, 0x80, &mr), IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_alloc_mr(s.pd, 64, IWARP_ACCESS_REMOTE_WRITE, &mr), IWARP_ERR_INVALID_ARG);
    CHECK(t_last_error_has("LOCAL_WRITE"), "access message names the fix");
    CHECK_RC(iwarp_reg_mr(s.pd, NULL, 64, IWARP_ACCESS_LOCAL_WRITE, &mr), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_reg_mr(s.pd, mem, sizeof mem, IWARP_ACCESS_LOCAL_WRITE, &mr), IWARP_OK);

    /* iwarp_poll_cq argument checks. */
    CHECK(iwarp_poll_cq(s.cq, -1, wc) == -IWARP_ERR_INVALID_ARG, "max < 0");
    CHECK(iwarp_poll_cq(s.cq, 4, NULL) == -IWARP_ERR_NULL_ARG, "wc NULL");
    CHECK(iwarp_poll_cq(s.cq, 0, wc) == 0, "max 0");
    CHECK_RC(iwarp_cq_progress(s.cq), IWARP_OK); /* no connection yet: a no-op */
    CHECK(iwarp_poll_cq(s.cq, 4, wc) == 0, "empty CQ");
    CHECK_RC(iwarp_wait_cq(s.cq, 20, wc), IWARP_ERR_TIMEOUT);
    CHECK(iwarp_cq_depth(s.cq) == 64, "cq depth %u", iwarp_cq_depth(s.cq));

    /* iwarp_cq_set_progress: unknown modes are refused and change nothing. */
    CHECK_RC(iwarp_cq_set_progress(s.cq, (iwarp_progress_mode)3, 0), IWARP_ERR_INVALID_ARG);
    CHECK(t_last_error_has("unknown progress mode 3"), "mode message names the value");
    CHECK_RC(iwarp_cq_set_progress(s.cq, (iwarp_progress_mode)-1, 0), IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_cq_set_progress(s.cq, IWARP_PROGRESS_APP_DRIVEN, 0), IWARP_OK);
    CHECK_RC(iwarp_wait_cq(s.cq, 20, wc), IWARP_ERR_TIMEOUT); /* no QP connected: sleeps */
    CHECK_RC(iwarp_cq_set_progress(s.cq, IWARP_PROGRESS_BUSY_POLL, 0), IWARP_OK);
    CHECK_RC(iwarp_wait_cq(s.cq, 20, wc), IWARP_ERR_TIMEOUT);
    CHECK_RC(iwarp_cq_set_progress(s.cq, IWARP_PROGRESS_THREADED, 50), IWARP_OK);

    /* Work requests. */
    memset(sges, 0, sizeof sges);
    CHECK_RC(iwarp_post_send(s.qp, 1, 42, NULL, 0, 0, 0, 0, 0), IWARP_ERR_INVALID_ARG);
    CHECK(t_last_error_has("unknown opcode 42"), "opcode named");
    CHECK_RC(iwarp_post_send(s.qp, 1, IWARP_WR_SEND, NULL, 0, 0, 0, 0, 0x100),
             IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_post_send(s.qp, 1, IWARP_WR_SEND, sges, IWARP_MAX_SGE + 1, 0, 0, 0, 0),
             IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_post_send(s.qp, 1, IWARP_WR_SEND, NULL, 1, 0, 0, 0, 0), IWARP_ERR_NULL_ARG);
    CHECK_RC(iwarp_post_recv(s.qp, 1, sges, IWARP_MAX_SGE + 1), IWARP_ERR_INVALID_ARG);
    CHECK(iwarp_query_qp_state(s.qp) == IWARP_QPS_INIT, "fresh QP in INIT");

    /* Private data over 512 bytes. */
    {
        static uint8_t big[600];
        iwarp_conn_param p;
        iwarp_listener *l = NULL;
        iwarp_conn_param_init(&p);
        p.private_data = big;
        p.private_data_len = 513;
        CHECK_RC(iwarp_connect(s.qp, "127.0.0.1", 1, &p, NULL, NULL), IWARP_ERR_INVALID_ARG);
        CHECK(t_last_error_has("513 bytes of private data"), "length named");
        p.private_data = NULL;
        p.private_data_len = 4;
        CHECK_RC(iwarp_connect(s.qp, "127.0.0.1", 1, &p, NULL, NULL), IWARP_ERR_NULL_ARG);
        iwarp_conn_param_init(&p);
        p.crc = 7;
        CHECK_RC(iwarp_listen("127.0.0.1", 0, &p, &l), IWARP_ERR_INVALID_ARG);
        CHECK(l == NULL, "no listener");
        CHECK_RC(iwarp_connect(s.qp, "not an address!", 1, NULL, NULL, NULL), IWARP_ERR_IO);
    }
    iwarp_dereg_mr(mr);
    side_close(&s);
}

static uint16_t closed_port(void)
{
    /* Bind a port and close it again: nobody listens there right after. */
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0) close(fd);
        return 1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void connection_errors(void)
{
    struct side s, srv;
    iwarp_conn_param p;
    iwarp_listener *l = NULL;
    iwarp_conn_request *r = NULL;
    struct acceptor a;
    uint8_t peer_data[32];
    size_t peer_len;
    double t0;

    CHECK(side_open(&s) == 0, "setup");
    iwarp_conn_param_init(&p);
    p.timeout_ms = 2000;
    t0 = t_now_ms();
    CHECK_RC(iwarp_connect(s.qp, "127.0.0.1", closed_port(), &p, NULL, NULL), IWARP_ERR_REFUSED);
    CHECK(t_now_ms() - t0 < 2000, "refused after %.0f ms", t_now_ms() - t0);
    CHECK(t_last_error_has("refused"), "message says refused");
    CHECK(iwarp_query_qp_state(s.qp) == IWARP_QPS_INIT, "QP still usable after refusal");

    /* get_request times out. */
    CHECK_RC(iwarp_listen("127.0.0.1", 0, NULL, &l), IWARP_OK);
    t0 = t_now_ms();
    CHECK_RC(iwarp_get_request(l, 100, &r), IWARP_ERR_TIMEOUT);
    CHECK(t_now_ms() - t0 < 2000, "get_request timeout took %.0f ms", t_now_ms() - t0);
    CHECK(r == NULL, "no request");

    /* Rejected, with the server's private data. */
    memset(&a, 0, sizeof a);
    a.l = l;
    a.reject = 1;
    a.reply = (const uint8_t *)"go away";
    a.reply_len = 7;
    CHECK(acceptor_start(&a) == 0, "thread");
    peer_len = sizeof peer_data;
    CHECK_RC(iwarp_connect(s.qp, "127.0.0.1", iwarp_listener_port(l), &p, peer_data, &peer_len),
             IWARP_ERR_REJECTED);
    acceptor_join(&a);
    CHECK_RC(a.rc, IWARP_OK);
    CHECK(peer_len == 7 && memcmp(peer_data, "go away", 7) == 0, "reject data (%zu bytes)",
          peer_len);
    iwarp_listener_close(l);
    l = NULL;

    /* CRC required by the client, refused by the server's policy. */
    {
        iwarp_conn_param lp;
        iwarp_conn_param_init(&lp);
        lp.crc = IWARP_MPA_OFF;
        CHECK_RC(iwarp_listen("127.0.0.1", 0, &lp, &l), IWARP_OK);
        memset(&a, 0, sizeof a);
        a.l = l;
        CHECK(side_open(&srv) == 0, "setup");
        a.qp = srv.qp;
        CHECK(acceptor_start(&a) == 0, "thread");
        p.crc = IWARP_MPA_REQUIRED;
        {
            iwarp_result rc = iwarp_connect(s.qp, "127.0.0.1", iwarp_listener_port(l), &p, NULL,
                                            NULL);
            CHECK(rc == IWARP_ERR_REJECTED || rc == IWARP_ERR_MPA, "CRC conflict gave %s",
                  iwarp_result_str(rc));
        }
        acceptor_join(&a);
        CHECK_RC(a.rc, IWARP_ERR_MPA);
        side_close(&srv);
        iwarp_listener_close(l);
    }
    side_close(&s);

    /* A connected QP cannot connect again; accept with too much data. */
    {
        struct pair pr;
        CHECK(pair_connect(&pr) == 0, "pair");
        CHECK_RC(iwarp_connect(pr.cli.qp, "127.0.0.1", iwarp_listener_port(pr.l), NULL, NULL,
                               NULL),
                 IWARP_ERR_QP_STATE);
        pair_close(&pr);
    }
}

/* RDMA Write or Read with a wrong rkey: error completion, QP in error. */
static void bad_rkey(int opcode)
{
    struct pair pr;
    iwarp_mr *local = NULL, *remote = NULL;
    iwarp_sge sge;
    iwarp_wc wc;
    iwarp_qp_event ev;
    int st = -1;

    CHECK(pair_connect(&pr) == 0, "pair");
    CHECK_RC(iwarp_alloc_mr(pr.cli.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &local), IWARP_OK);
    CHECK_RC(iwarp_alloc_mr(pr.srv.pd, 64,
                            IWARP_ACCESS_LOCAL_WRITE | IWARP_ACCESS_REMOTE_WRITE |
                                IWARP_ACCESS_REMOTE_READ,
                            &remote),
             IWARP_OK);
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(local);
    sge.length = 16;
    sge.lkey = iwarp_mr_lkey(local);
    /* A posted receive: flushed when the QP goes to error. */
    CHECK_RC(iwarp_post_recv(pr.cli.qp, 98, &sge, 1), IWARP_OK);
    CHECK_RC(iwarp_post_send(pr.cli.qp, 99, opcode, &sge, 1,
                             (uint64_t)(uintptr_t)iwarp_mr_addr(remote),
                             iwarp_mr_rkey(remote) ^ 0x5a, 0, IWARP_SEND_SIGNALED),
             IWARP_OK);
    {
        int st98 = -1, st99 = -1;
        while ((st98 < 0 || st99 < 0) && iwarp_wait_cq(pr.cli.cq, 5000, &wc) == IWARP_OK) {
            if (wc.wr_id == 98) st98 = wc.status;
            if (wc.wr_id == 99) st99 = wc.status;
        }
        if (opcode == IWARP_WR_RDMA_READ) {
            /* The Read response never comes: the peer's Terminate answers it. */
            CHECK(st99 == IWARP_WC_REM_ACCESS_ERR, "read status %d, want IWARP_WC_REM_ACCESS_ERR",
                  st99);
        } else {
            /* A Write completes locally once sent (RFC 5040 has no Write
             * acknowledgement); the peer's Terminate then fails the QP. */
            CHECK(st99 == IWARP_WC_SUCCESS || st99 == IWARP_WC_REM_ACCESS_ERR,
                  "write status %d", st99);
        }
        CHECK(st98 == IWARP_WC_WR_FLUSH_ERR, "receive status %d, want IWARP_WC_WR_FLUSH_ERR",
              st98);
    }
    /* The QP goes to error; the peer's Terminate is reported as an event. */
    for (int i = 0; i < 50; i++) {
        st = iwarp_query_qp_state(pr.cli.qp);
        if (st == IWARP_QPS_ERROR) break;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    CHECK(st == IWARP_QPS_ERROR, "client QP state %d, want IWARP_QPS_ERROR", st);
    {
        int saw_term = 0;
        while (iwarp_qp_next_event(pr.cli.qp, 200, &ev) == IWARP_OK)
            if (ev.event_type == IWARP_EVENT_TERMINATE_RECEIVED) saw_term = 1;
        CHECK(saw_term, "no TERMINATE_RECEIVED event");
    }
    /* Posting in the error state flushes, as Linux siw does
     * (siw_sq_flush_wr, siw_rq_flush_wr): accepted, then completed with
     * IWARP_WC_WR_FLUSH_ERR, unsignaled too, with its own opcode. */
    CHECK_RC(iwarp_post_send(pr.cli.qp, 100, IWARP_WR_SEND, &sge, 1, 0, 0, 0, 0), IWARP_OK);
    CHECK_RC(iwarp_post_recv(pr.cli.qp, 101, &sge, 1), IWARP_OK);
    {
        iwarp_wc w100, w101;
        memset(&w100, 0xff, sizeof w100);
        memset(&w101, 0xff, sizeof w101);
        while (w100.wr_id != 100 || w101.wr_id != 101) {
            if (iwarp_wait_cq(pr.cli.cq, 5000, &wc) != IWARP_OK) break;
            if (wc.wr_id == 100) w100 = wc;
            if (wc.wr_id == 101) w101 = wc;
        }
        CHECK(w100.wr_id == 100 && w100.status == IWARP_WC_WR_FLUSH_ERR &&
                  w100.opcode == IWARP_WC_SEND && w100.byte_len == 0,
              "send posted in error: wr_id %llu status %d opcode %d, want a flushed SEND",
              (unsigned long long)w100.wr_id, w100.status, w100.opcode);
        CHECK(w101.wr_id == 101 && w101.status == IWARP_WC_WR_FLUSH_ERR &&
                  w101.opcode == IWARP_WC_RECV && w101.byte_len == 0,
              "receive posted in error: wr_id %llu status %d opcode %d, want a flushed RECV",
              (unsigned long long)w101.wr_id, w101.status, w101.opcode);
    }
    iwarp_dereg_mr(local);
    iwarp_dereg_mr(remote);
    pair_close(&pr);
}

/* ib_drain_qp by hand: disconnect (an iWARP QP goes to the error state),
 * post a marker on each queue, wait (bounded) until both come back flushed;
 * by then every request posted before has completed. */
static void drain_by_hand(void)
{
    struct pair pr;
    iwarp_mr *m = NULL;
    iwarp_sge sge;
    iwarp_wc wc;
    int flushed = 0, send_marker = 0, recv_marker = 0;
    const uint64_t marker = UINT64_MAX - 2;
    double t0;

    CHECK(pair_connect(&pr) == 0, "pair");
    CHECK_RC(iwarp_alloc_mr(pr.cli.pd, 256, IWARP_ACCESS_LOCAL_WRITE, &m), IWARP_OK);
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(m);
    sge.length = 64;
    sge.lkey = iwarp_mr_lkey(m);
    for (uint64_t id = 1; id <= 3; id++) CHECK_RC(iwarp_post_recv(pr.cli.qp, id, &sge, 1), IWARP_OK);
    CHECK_RC(iwarp_disconnect(pr.cli.qp), IWARP_OK);
    CHECK(iwarp_query_qp_state(pr.cli.qp) == IWARP_QPS_CLOSED, "state %d after disconnect",
          iwarp_query_qp_state(pr.cli.qp));
    /* ib_drain_sq: a zero-length RDMA Write; ib_drain_rq: a receive
     * without buffers. */
    CHECK_RC(iwarp_post_send(pr.cli.qp, marker, IWARP_WR_RDMA_WRITE, NULL, 0, 0, 0, 0,
                             IWARP_SEND_SIGNALED),
             IWARP_OK);
    CHECK_RC(iwarp_post_recv(pr.cli.qp, marker, NULL, 0), IWARP_OK);
    t0 = t_now_ms();
    while (!(send_marker && recv_marker) && iwarp_wait_cq(pr.cli.cq, 5000, &wc) == IWARP_OK) {
        CHECK(wc.status == IWARP_WC_WR_FLUSH_ERR, "wr_id %llu status %d, want flushed",
              (unsigned long long)wc.wr_id, wc.status);
        if (wc.wr_id == marker && wc.opcode == IWARP_WC_RDMA_WRITE) {
            send_marker = 1;
        } else if (wc.wr_id == marker && wc.opcode == IWARP_WC_RECV) {
            CHECK(flushed == 3, "receive marker after %d of 3 receives", flushed);
            recv_marker = 1;
        } else {
            CHECK(wc.wr_id == (uint64_t)flushed + 1, "receive %llu flushed out of order",
                  (unsigned long long)wc.wr_id);
            flushed++;
        }
    }
    CHECK(send_marker && recv_marker, "markers back: send %d, receive %d (within 5 s)",
          send_marker, recv_marker);
    CHECK(t_now_ms() - t0 < 5000, "drain took %.0f ms", t_now_ms() - t0);
    CHECK(iwarp_poll_cq(pr.cli.cq, 1, &wc) == 0, "nothing after the markers");
    iwarp_dereg_mr(m);
    pair_close(&pr);
}

/* In the error state a posted request goes straight to the CQ, so a full
 * CQ refuses it (siw: ENOMEM from siw_sqe_complete) instead of growing. */
static void flush_into_a_full_cq(void)
{
    iwarp_context *ctx = NULL;
    iwarp_pd *pd = NULL;
    iwarp_cq *cq = NULL;
    iwarp_qp *qp = NULL;
    iwarp_wc wc[4];

    memset(wc, 0, sizeof wc);
    CHECK_RC(iwarp_open_device(&ctx), IWARP_OK);
    CHECK_RC(iwarp_alloc_pd(ctx, &pd), IWARP_OK);
    CHECK_RC(iwarp_create_cq(ctx, 2, &cq), IWARP_OK);
    CHECK_RC(iwarp_create_qp(pd, cq, cq, 16, 16, &qp), IWARP_OK);
    CHECK_RC(iwarp_disconnect(qp), IWARP_OK);
    CHECK_RC(iwarp_post_send(qp, 1, IWARP_WR_SEND, NULL, 0, 0, 0, 0, 0), IWARP_OK);
    CHECK_RC(iwarp_post_recv(qp, 2, NULL, 0), IWARP_OK);
    CHECK_RC(iwarp_post_send(qp, 3, IWARP_WR_SEND, NULL, 0, 0, 0, 0, 0), IWARP_ERR_QUEUE_FULL);
    CHECK(t_last_error_has("completion queue is full") && t_last_error_has("poll the CQ"),
          "the error names the full CQ and the fix");
    CHECK(iwarp_poll_cq(cq, 4, wc) == 2, "two flushed");
    CHECK(wc[0].wr_id == 1 && wc[0].status == IWARP_WC_WR_FLUSH_ERR && wc[1].wr_id == 2 &&
              wc[1].status == IWARP_WC_WR_FLUSH_ERR,
          "flushed %llu/%d %llu/%d", (unsigned long long)wc[0].wr_id, wc[0].status,
          (unsigned long long)wc[1].wr_id, wc[1].status);
    CHECK_RC(iwarp_post_send(qp, 3, IWARP_WR_SEND, NULL, 0, 0, 0, 0, 0), IWARP_OK);
    CHECK(iwarp_poll_cq(cq, 4, wc) == 1 && wc[0].wr_id == 3, "room again");
    iwarp_destroy_qp(qp);
    iwarp_destroy_cq(cq);
    iwarp_dealloc_pd(pd);
    iwarp_close_device(ctx);
}

int main(void)
{
    null_arguments();
    device_selection();
    bad_arguments();
    connection_errors();
    bad_rkey(IWARP_WR_RDMA_WRITE);
    bad_rkey(IWARP_WR_RDMA_READ);
    drain_by_hand();
    flush_into_a_full_cq();
    return t_finish("test_errors");
}
