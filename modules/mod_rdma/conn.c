/* mod_rdma: the RDMA connection.
 *
 * Per-connection state (pre_connection), the connect-back to the
 * client's listener and its reuse across keep-alive, bounded waits for
 * completions, RDMA Reads/Writes in chunks, and sending and receiving
 * control messages (codec in wire.c). */
#include "mod_rdma_private.h"

APLOG_USE_MODULE(rdma);

static void drain(iwarp_cq *cq)
{
    iwarp_wc wc[16];
    while (cq && iwarp_poll_cq(cq, 16, wc) > 0) {
    }
}

void conn_drop_qp(rdma_conn *rc)
{
    if (rc->drive) {
        iwarp_drive_release(rc->drive);
        rc->drive = NULL;
    }
    if (rc->qp) {
        iwarp_destroy_qp(rc->qp);
        rc->qp = NULL;
    }
    drain(rc->scq);
    drain(rc->rcq);
    rc->ip[0] = 0;
    rc->port = 0;
}

static apr_status_t conn_cleanup(void *d)
{
    rdma_conn *rc = d;
    if (rc->qp)
        ap_log_cerror(APLOG_MARK, APLOG_DEBUG, 0, rc->c,
                      "mod_rdma: HTTP connection closed: closing RDMA connection to %s:%u "
                      "(%u requests)", rc->ip, rc->port, rc->uses);
    conn_drop_qp(rc);
    iwarp_dereg_mr(rc->ctrl);
    iwarp_destroy_cq(rc->scq);
    iwarp_destroy_cq(rc->rcq);
    rc->ctrl = NULL;
    rc->scq = rc->rcq = NULL;
    return APR_SUCCESS;
}

int pre_connection(conn_rec *c, void *csd)
{
    rdma_conn *rc = apr_pcalloc(c->pool, sizeof *rc);
    (void)csd;
    rc->c = c;
    ap_set_module_config(c->conn_config, &rdma_module, rc);
    apr_pool_cleanup_register(c->pool, rc, conn_cleanup, apr_pool_cleanup_null);
    return OK;
}

static const char *post_slot(rdma_conn *rc, int i, apr_pool_t *p)
{
    iwarp_sge sge;
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(rc->ctrl) + (uint64_t)i * MSG_LEN;
    sge.length = MSG_LEN;
    sge.lkey = iwarp_mr_lkey(rc->ctrl);
    if (iwarp_post_recv(rc->qp, (uint64_t)i, &sge, 1) != IWARP_OK)
        return apr_pstrcat(p, "posting a receive failed: ", iwarp_err(p), NULL);
    return NULL;
}

/* Connect to the client's listener, or reuse the live connection. On
 * failure returns an HTTP status and sets *why. */
int conn_ensure(rdma_conn *rc, request_rec *r, const char *ip, unsigned port,
                const char **why)
{
    rdma_srv_conf *c = srv_conf(r->server);
    iwarp_conn_param prm;
    iwarp_result res;
    apr_time_t started;
    int i;
    /* The worker reads its driven connection only while it waits: let it
     * see an end or a Terminate that came since, before trusting the
     * state. */
    if (rc->drive)
        (void)iwarp_drive_progress(rc->drive);
    if (rc->qp && iwarp_query_qp_state(rc->qp) == IWARP_QPS_RTS && rc->port == port &&
        !strcmp(rc->ip, ip)) {
        rc->uses++;
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                      "mod_rdma: reusing the RDMA connection to %s:%u (request %u on it)", ip,
                      port, rc->uses);
        return OK;
    }
    conn_drop_qp(rc);
    if ((!rc->scq && iwarp_create_cq(g_ctx, 64, &rc->scq) != IWARP_OK) ||
        (!rc->rcq && iwarp_create_cq(g_ctx, 64, &rc->rcq) != IWARP_OK) ||
        (!rc->ctrl && iwarp_alloc_mr(g_pd, (RECV_SLOTS + 1) * MSG_LEN, IWARP_ACCESS_LOCAL_WRITE,
                                     &rc->ctrl) != IWARP_OK) ||
        iwarp_create_qp(g_pd, rc->scq, rc->rcq, 64, RECV_SLOTS, &rc->qp) != IWARP_OK) {
        *why = apr_pstrcat(r->pool, "setting up the RDMA connection failed: ", iwarp_err(r->pool),
                           NULL);
        return HTTP_SERVICE_UNAVAILABLE;
    }
    for (i = 0; i < RECV_SLOTS; i++) {
        if ((*why = post_slot(rc, i, r->pool)) != NULL) {
            conn_drop_qp(rc);
            return HTTP_SERVICE_UNAVAILABLE;
        }
    }
    iwarp_conn_param_init(&prm);
    prm.private_data = (const uint8_t *)"mod_rdma/1";
    prm.private_data_len = 10;
    prm.timeout_ms = (uint32_t)cf_ctimeout(c);
    started = apr_time_now();
    res = iwarp_connect(rc->qp, ip, (uint16_t)port, &prm, NULL, NULL);
    if (res != IWARP_OK) {
        const char *e = iwarp_err(r->pool);
        apr_interval_time_t left;
        conn_drop_qp(rc);
        /* The cause goes to the error log only. The client gets the same
         * answer, after the same time (the connect timeout), whether the
         * port was closed, filtered, or answered without MPA: the server
         * is no port scanner. */
        ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r,
                      "mod_rdma: connecting back to %s:%u failed (%s%s)", ip, port,
                      res == IWARP_ERR_TIMEOUT ? "timed out: " : "", e);
        connect_back_failed(ip);
        left = apr_time_from_msec(cf_ctimeout(c)) - (apr_time_now() - started);
        if (left > 0)
            apr_sleep(left);
        *why = apr_psprintf(r->pool,
                            "no RDMA connection to the client's listener at %s:%u within %d ms; "
                            "is the client listening there and reachable?",
                            ip, port, cf_ctimeout(c));
        return HTTP_BAD_GATEWAY;
    }
    connect_back_succeeded(ip);
    apr_cpystrn(rc->ip, ip, sizeof rc->ip);
    rc->port = port;
    rc->uses = 1;
    /* From now on this worker reads the connection itself whenever it waits
     * (wait_wc): on a busy machine the stack's receive thread would be one
     * more thread to be scheduled before the worker sees the client's
     * Read Requests or DONE. Between requests nothing arrives that needs
     * an answer before the worker's next wait. */
    if (iwarp_qp_drive(rc->qp, &rc->drive) != IWARP_OK)
        rc->drive = NULL;
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, "mod_rdma: connected to the client's RDMA listener %s:%u",
                  ip, port);
    return OK;
}

/* How long a worker that does not drive its connection (iwarp_qp_drive
 * failed) polls for a completion, doing the receive work itself, before it
 * sleeps in the CQ: about the time a 1 MB body takes over loopback. */
#define SPIN_PROGRESS_US 500

/* Wait (bounded by tmo_ms) for one completion on cq.
 *
 * Driving the connection (rc->drive), the worker reads whatever arrives
 * and otherwise sleeps at once in poll(2) on the connection's socket and
 * the CQ's fd. It does not spin first: on a loaded machine a spinning
 * worker holds a CPU that the processes it waits for need (a loopback
 * client's Read, other workers); with two busy processes on the two cores,
 * 1 MB client-reads took 0.76-0.97 ms with a 500 us spin, 0.28-0.30 with
 * 50 us and 0.22-0.25 with none, against plain Apache's 0.23-0.28, while
 * the unloaded time did not grow (the wake-up goes straight to this
 * thread).
 *
 * Otherwise it polls for SPIN_PROGRESS_US, reading the connection itself
 * (iwarp_cq_progress), then sleeps in the CQ while the stack's receive
 * thread reads. */
static iwarp_result wait_wc(rdma_conn *rc, iwarp_cq *cq, uint32_t tmo_ms, iwarp_wc *wc)
{
    apr_time_t start = apr_time_now();
    if (rc->drive) {
        apr_time_t deadline = start + (apr_time_t)tmo_ms * 1000;
        for (;;) {
            struct pollfd fds[2];
            apr_time_t now, left_ms;
            int n;
            (void)iwarp_drive_progress(rc->drive);
            n = iwarp_poll_cq(cq, 1, wc);
            if (n > 0)
                return IWARP_OK;
            if (n < 0)
                return (iwarp_result)(-n);
            now = apr_time_now();
            if (now >= deadline)
                return IWARP_ERR_TIMEOUT;
            left_ms = (deadline - now) / 1000 + 1;
            fds[0].fd = iwarp_drive_fd(rc->drive);
            fds[0].events = POLLIN;
            fds[0].revents = 0;
            fds[1].fd = iwarp_cq_fd(cq);
            fds[1].events = POLLIN;
            fds[1].revents = 0;
            poll(fds, 2, left_ms > 100 ? 100 : (int)left_ms);
        }
    }
    for (;;) {
        int n = iwarp_poll_cq(cq, 1, wc);
        if (n > 0)
            return IWARP_OK;
        if (n < 0)
            return (iwarp_result)(-n);
        if (apr_time_now() >= start + SPIN_PROGRESS_US)
            break;
        iwarp_cq_progress(cq);
    }
    return iwarp_wait_cq(cq, tmo_ms, wc);
}

/* Post one send-queue request and wait for it (bounded). */
static const char *run_wr(rdma_conn *rc, request_rec *r, int opcode, uint64_t laddr, uint32_t len,
                          uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    iwarp_sge sge;
    iwarp_wc wc;
    iwarp_result res;
    static const char *names[] = {"Send", "Send with Invalidate", "RDMA Write", "RDMA Read"};
    int tmo = cf_timeout(srv_conf(r->server));
    if (!rc->qp)
        return "the RDMA connection is gone";
    sge.addr = laddr;
    sge.length = len;
    sge.lkey = lkey;
    if (iwarp_post_send(rc->qp, 7, opcode, &sge, len ? 1 : 0, raddr, rkey, 0, IWARP_SEND_SIGNALED) !=
        IWARP_OK)
        return apr_psprintf(r->pool, "posting the %s failed: %s", names[opcode], iwarp_err(r->pool));
    res = wait_wc(rc, rc->scq, (uint32_t)tmo, &wc);
    if (res == IWARP_ERR_TIMEOUT)
        return apr_psprintf(r->pool, "the %s of %u bytes did not complete within %d ms",
                            names[opcode], len, tmo);
    if (res != IWARP_OK)
        return apr_psprintf(r->pool, "waiting for the %s failed: %s", names[opcode],
                            iwarp_err(r->pool));
    if (wc.status != IWARP_WC_SUCCESS)
        return apr_psprintf(r->pool, "the %s failed with completion status %d (the client went "
                            "away or refused the access)",
                            names[opcode], wc.status);
    return NULL;
}

/* Move `len` bytes at local `laddr` (lkey) to/from remote raddr/rkey in
 * XFER_CHUNK pieces. */
const char *xfer(rdma_conn *rc, request_rec *r, int opcode, uint64_t laddr, uint64_t len,
                 uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    uint64_t off = 0;
    while (off < len) {
        uint32_t n = (uint32_t)(len - off < XFER_CHUNK ? len - off : XFER_CHUNK);
        const char *e = run_wr(rc, r, opcode, laddr + off, n, lkey, raddr + off, rkey);
        if (e)
            return e;
        off += n;
    }
    return NULL;
}

const char *send_ctrl(rdma_conn *rc, request_rec *r, const ctrl_msg *m)
{
    unsigned char *slot = (unsigned char *)iwarp_mr_addr(rc->ctrl) + SEND_SLOT * MSG_LEN;
    encode_msg(slot, m);
    return run_wr(rc, r, IWARP_WR_SEND, (uint64_t)(uintptr_t)slot, MSG_LEN,
                  iwarp_mr_lkey(rc->ctrl), 0, 0);
}

const char *recv_ctrl(rdma_conn *rc, request_rec *r, ctrl_msg *m)
{
    iwarp_wc wc;
    iwarp_result res;
    const char *e;
    int tmo = cf_timeout(srv_conf(r->server));
    if (!rc->qp)
        return "the RDMA connection is gone";
    res = wait_wc(rc, rc->rcq, (uint32_t)tmo, &wc);
    if (res == IWARP_ERR_TIMEOUT)
        return apr_psprintf(r->pool, "no DONE from the client within %d ms", tmo);
    if (res != IWARP_OK)
        return apr_psprintf(r->pool, "waiting for DONE failed: %s", iwarp_err(r->pool));
    if (wc.status != IWARP_WC_SUCCESS)
        return apr_psprintf(r->pool, "the RDMA connection failed while waiting for DONE "
                            "(status %d): the client went away", wc.status);
    e = decode_msg((unsigned char *)iwarp_mr_addr(rc->ctrl) + wc.wr_id * MSG_LEN, wc.byte_len, m);
    if (e)
        return e;
    return post_slot(rc, (int)wc.wr_id, r->pool);
}

/* The RDMA: header grammar is in rdma_header.c. */

int same_ip(const char *a, const char *b)
{
    unsigned char x[16], y[16];
    if (inet_pton(AF_INET, a, x) == 1)
        return inet_pton(AF_INET, b, y) == 1 && !memcmp(x, y, 4);
    if (inet_pton(AF_INET6, a, x) == 1)
        return inet_pton(AF_INET6, b, y) == 1 && !memcmp(x, y, 16);
    return 0;
}
