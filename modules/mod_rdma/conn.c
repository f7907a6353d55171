/* mod_rdma: the RDMA connection.
 *
 * Per-connection state (pre_connection), the connect-back to the
 * client's listener and its reuse across keep-alive, bounded waits for
 * completions (application-driven CQs: the worker reads the connection
 * itself while it waits), RDMA Reads/Writes in chunks, and sending and
 * receiving control messages (codec in wire.c). */
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
    /* Every STag still granted to the client dies with its connection. */
    expo_release_all(rc, "the RDMA connection is closed");
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

/* How long a worker polls for a completion, doing the receive work itself,
 * before it sleeps in poll(2) on the connection's socket and the CQ: not at
 * all. On a loaded machine a spinning worker holds a CPU that the processes
 * it waits for need (a loopback client's Read, other workers); with two
 * busy processes on the two cores, 1 MB client-reads took 0.76-0.97 ms
 * with a 500 us spin, 0.28-0.30 with 50 us and 0.22-0.25 with none,
 * against plain Apache's 0.23-0.28, while the unloaded time did not grow
 * (the wake-up goes straight to this thread). */
#define SPIN_US 0

/* A CQ of the connection, application-driven: the worker reads the
 * connection itself whenever it waits (iwarp_wait_cq), since on a busy
 * machine the stack's receive thread would be one more thread to be
 * scheduled before the worker sees the client's Read Requests or DONE.
 * Between requests nothing arrives that needs an answer before the
 * worker's next wait. If the mode cannot be set the CQ stays threaded
 * (the stack's receive thread reads), which works too. */
static int new_cq(rdma_conn *rc, iwarp_cq **cq)
{
    if (iwarp_create_cq(g_ctx, 64, cq) != IWARP_OK)
        return 0;
    if (iwarp_cq_set_progress(*cq, IWARP_PROGRESS_APP_DRIVEN, SPIN_US) != IWARP_OK)
        ap_log_cerror(APLOG_MARK, APLOG_WARNING, 0, rc->c,
                      "mod_rdma: the RDMA connection's CQ stays threaded: %s",
                      iwarp_err(rc->c->pool));
    return 1;
}

/* Connect to the client's listener, or reuse the live connection. On
 * failure returns an HTTP status and sets *why. */
int conn_ensure(rdma_conn *rc, request_rec *r, const rdma_hdr *h, const char **why)
{
    const char *ip = h->ip;
    unsigned port = h->port;
    /* The MPA Request's private data: "mod_rdma/1", then the request's
     * token (8 bytes, big-endian) when the header carried one, so the
     * client accepts this connection and not an impostor's that reached
     * its listener first (docs/MOD_RDMA.md, "The request token"). RFC 5044
     * §7.1: at most 512 bytes of private data; RFC 6581's IRD/ORD block
     * goes before it, added by libiwarp. */
    uint8_t pd[PD_PREFIX_LEN + 8];
    uint32_t pd_len = PD_PREFIX_LEN;
    rdma_srv_conf *c = srv_conf(r->server);
    iwarp_conn_param prm;
    iwarp_result res;
    apr_time_t started;
    int i;
    /* The worker reads its connection only while it waits (the CQs are
     * application-driven): let it see an end or a Terminate that came
     * since, before trusting the state. */
    if (rc->qp)
        (void)iwarp_cq_progress(rc->rcq);
    if (rc->qp && iwarp_query_qp_state(rc->qp) == IWARP_QPS_RTS && rc->port == port &&
        !strcmp(rc->ip, ip)) {
        /* Bodies granted to earlier client-reads answers (expose.c): take
         * the DONEs that came; a request that copies through the static
         * buffer waits (bounded) until no grant holds it. */
        if (cf_mode(c) == MODE_STATIC && h->scheme != S_CLIENT_READS)
            *why = expo_make_room(rc, r, 0, EXPO_STATIC);
        else {
            expo_reap(rc, r);
            *why = NULL;
        }
        if (*why) {
            ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                          "mod_rdma: client-reads: waiting for the DONE of a body in the static "
                          "buffer: %s; RDMA connection closed", *why);
            conn_drop_qp(rc);
            *why = "the client did not release an earlier client-reads body";
            return HTTP_BAD_GATEWAY;
        }
        rc->uses++;
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                      "mod_rdma: reusing the RDMA connection to %s:%u (request %u on it)", ip,
                      port, rc->uses);
        return OK;
    }
    conn_drop_qp(rc);
    if ((!rc->scq && !new_cq(rc, &rc->scq)) || (!rc->rcq && !new_cq(rc, &rc->rcq)) ||
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
    memcpy(pd, PD_PREFIX, PD_PREFIX_LEN);
    if (h->have & K_TOKEN) {
        int k;
        for (k = 0; k < 8; k++)
            pd[PD_PREFIX_LEN + k] = (uint8_t)(h->token >> (56 - 8 * k));
        pd_len += 8;
    }
    iwarp_conn_param_init(&prm);
    /* RDMACongestion: set on the socket before the TCP connect (tcp(7),
     * TCP_CONGESTION); the name was checked at configuration time. */
    if (c->congestion && iwarp_conn_param_set_congestion(&prm, c->congestion) != IWARP_OK) {
        *why = apr_pstrcat(r->pool, "RDMACongestion ", c->congestion, ": ", iwarp_err(r->pool), NULL);
        conn_drop_qp(rc);
        return HTTP_SERVICE_UNAVAILABLE;
    }
    prm.private_data = pd;
    prm.private_data_len = pd_len;
    prm.timeout_ms = (uint32_t)cf_ctimeout(c);
    started = apr_time_now();
    res = iwarp_connect(rc->qp, ip, (uint16_t)port, &prm, NULL, NULL);
    if (res == IWARP_ERR_UNSUPPORTED) {
        /* Not the client's fault: the congestion control cannot be set in
         * this process (or on this device). 503 at once, no limiter. */
        const char *e = iwarp_err(r->pool);
        conn_drop_qp(rc);
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_rdma: RDMACongestion %s cannot be used: %s. Fix: choose an algorithm "
                      "the kernel has and lets the workers use "
                      "(/proc/sys/net/ipv4/tcp_allowed_congestion_control), or remove the "
                      "directive", c->congestion ? c->congestion : "(unset)", e);
        *why = "the server's RDMACongestion setting cannot be used on this host";
        return HTTP_SERVICE_UNAVAILABLE;
    }
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
    {
        char cc[IWARP_CONGESTION_MAX];
        if (iwarp_query_qp_congestion(rc->qp, cc, sizeof cc) != IWARP_OK)
            apr_cpystrn(cc, "unknown", sizeof cc);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                      "mod_rdma: connected to the client's RDMA listener %s:%u (congestion %s)", ip,
                      port, cc);
    }
    return OK;
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
    /* Bounded; the worker does the receive work meanwhile (new_cq). */
    res = iwarp_wait_cq(rc->scq, (uint32_t)tmo, &wc);
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

/* Decode the control message of receive completion `wc` into *m and post
 * its slot again. NULL, or what went wrong. */
static const char *take_msg(rdma_conn *rc, apr_pool_t *p, const iwarp_wc *wc, ctrl_msg *m)
{
    const char *e;
    if (wc->status != IWARP_WC_SUCCESS)
        return apr_psprintf(p, "the RDMA connection failed while waiting for DONE "
                            "(status %d): the client went away", wc->status);
    e = decode_msg((unsigned char *)iwarp_mr_addr(rc->ctrl) + wc->wr_id * MSG_LEN, wc->byte_len, m);
    if (e)
        return e;
    return post_slot(rc, (int)wc->wr_id, p);
}

/* The next control message, waiting at most tmo_ms; NULL, or what went
 * wrong ("no DONE from the client within N ms" on a timeout). */
const char *recv_ctrl_for(rdma_conn *rc, request_rec *r, ctrl_msg *m, int tmo_ms)
{
    iwarp_wc wc;
    iwarp_result res;
    if (!rc->qp)
        return "the RDMA connection is gone";
    res = iwarp_wait_cq(rc->rcq, (uint32_t)tmo_ms, &wc);
    if (res == IWARP_ERR_TIMEOUT)
        return apr_psprintf(r->pool, "no DONE from the client within %d ms", tmo_ms);
    if (res != IWARP_OK)
        return apr_psprintf(r->pool, "waiting for DONE failed: %s", iwarp_err(r->pool));
    return take_msg(rc, r->pool, &wc, m);
}

/* The next control message of this request (bounded by RDMATimeout). A
 * DONE or ABORT for a client-reads body granted earlier (expose.c) is
 * taken on the way: it releases that body and is not this request's. */
const char *recv_ctrl(rdma_conn *rc, request_rec *r, ctrl_msg *m)
{
    for (;;) {
        const char *e = recv_ctrl_for(rc, r, m, cf_timeout(srv_conf(r->server)));
        if (e || !expo_take(rc, m))
            return e;
    }
}

/* A control message that has already arrived, without waiting: 1 and *m,
 * 0 if none, -1 and *why if the connection failed or sent garbage. */
int poll_ctrl(rdma_conn *rc, request_rec *r, ctrl_msg *m, const char **why)
{
    iwarp_wc wc;
    int n;
    if (!rc->qp)
        return 0;
    n = iwarp_poll_cq(rc->rcq, 1, &wc);
    if (n < 0) {
        *why = apr_psprintf(r->pool, "polling the RDMA connection failed: %s", iwarp_err(r->pool));
        return -1;
    }
    if (n == 0)
        return 0;
    *why = take_msg(rc, r->pool, &wc, m);
    return *why ? -1 : 1;
}

/* The RDMA: header grammar is in rdma_header.c. */

/* The canonical text of the IP literal `in` into `out` (at least
 * INET6_ADDRSTRLEN bytes; may be `in`): an IPv4-mapped IPv6 address
 * (::ffff:a.b.c.d, RFC 4291 §2.5.5.2) is the IPv4 address it maps, which
 * is what a dual-stack socket reports for an IPv4 peer; every other
 * address is inet_ntop(3)'s form (lower case, longest zero run as "::",
 * RFC 5952). Returns 0 if `in` is not an IP literal. */
int canon_ip(const char *in, char *out, size_t outlen)
{
    unsigned char a[16];
    char tmp[INET6_ADDRSTRLEN];
    const char *ok;
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (inet_pton(AF_INET, in, a) == 1)
        ok = inet_ntop(AF_INET, a, tmp, sizeof tmp);
    else if (inet_pton(AF_INET6, in, a) != 1)
        return 0;
    else if (!memcmp(a, mapped, sizeof mapped))
        ok = inet_ntop(AF_INET, a + 12, tmp, sizeof tmp);
    else
        ok = inet_ntop(AF_INET6, a, tmp, sizeof tmp);
    if (!ok || strlen(tmp) >= outlen)
        return 0;
    memcpy(out, tmp, strlen(tmp) + 1);
    return 1;
}

/* Whether two IP literals name the same address: ::ffff:127.0.0.1 is
 * 127.0.0.1 (canon_ip). */
int same_ip(const char *a, const char *b)
{
    char x[INET6_ADDRSTRLEN], y[INET6_ADDRSTRLEN];
    return canon_ip(a, x, sizeof x) && canon_ip(b, y, sizeof y) && !strcmp(x, y);
}
