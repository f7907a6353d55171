/* mod_rdma: client-reads bodies granted past their request.
 *
 * A client-reads answer grants the client one STag (remote read rights on
 * the body, RFC 5040 section 6.4: the data source of an RDMA Read is
 * named by the STag its owner advertised). The worker used to hold each
 * request open until the client's DONE, so a pipelined client paid two
 * round trips per object: its Read, then the next answer, which the
 * worker only started after the DONE. Now the grant is moved here when
 * the answer has gone out, and the worker goes on with the next request:
 *
 * - each body keeps its own registration (a fresh STag) and its memory
 *   (a pinned mapping, a heap buffer, or the static buffer, which only
 *   one grant may hold at a time);
 * - the connection grants at most EXPO_MAX bodies and EXPO_MAX_BYTES at
 *   once; a request that would exceed that waits (bounded) for DONEs of
 *   older ones first;
 * - a grant ends at the client's DONE (or ABORT) naming its STag, at its
 *   deadline (RDMATimeout after the grant), or when the RDMA or HTTP
 *   connection ends. The registration is removed then: a Read of that
 *   STag afterwards is answered with a Terminate (RFC 5040 section 7.2,
 *   invalid STag), and so is a Read beyond the granted length (base
 *   bounds violation), by the stack, without the worker;
 * - while any grant is out, the connection's CQs are THREADED: the
 *   stack's receive thread answers the client's Read Requests while the
 *   worker sits in Apache's keep-alive wait or serves another request
 *   (in APP_DRIVEN mode nothing would be read until the worker's next
 *   wait). They go back to APP_DRIVEN when the last grant ends.
 *
 * Prefork workers are single-threaded (post_config), so this state needs
 * no lock; deregistration waits for a Read Response still being copied
 * from the memory before it returns, so the memory can be freed after. */
#include "mod_rdma_private.h"

APLOG_USE_MODULE(rdma);

/* Switch the connection's CQs (both: a QP is application-driven if either
 * CQ is) between THREADED, while grants are out, and APP_DRIVEN. */
static void set_threaded(rdma_conn *rc, int on)
{
    int mode = on ? IWARP_PROGRESS_THREADED : IWARP_PROGRESS_APP_DRIVEN;
    if (rc->threaded == on)
        return;
    if (rc->scq)
        (void)iwarp_cq_set_progress(rc->scq, mode, 0);
    if (rc->rcq)
        (void)iwarp_cq_set_progress(rc->rcq, mode, 0);
    rc->threaded = on;
}

/* End grant i: the STag is invalidated before the memory goes. */
static void release_one(rdma_conn *rc, int i)
{
    rdma_expo *x = &rc->expo[i];
    iwarp_dereg_mr(x->win);
    if (x->map)
        map_unpin(x->map, x->map_len);
    free(x->body);
    rc->expo_bytes -= x->len;
    memmove(&rc->expo[i], &rc->expo[i + 1], (size_t)(rc->n_expo - i - 1) * sizeof rc->expo[0]);
    rc->n_expo--;
    memset(&rc->expo[rc->n_expo], 0, sizeof rc->expo[0]);
    if (rc->n_expo == 0)
        set_threaded(rc, 0);
}

void expo_release_all(rdma_conn *rc, const char *why)
{
    iwarp_wc wc;
    /* Take the DONEs that are already in (for the log: their grants ended
     * normally); the receives are not posted again, the QP is going. */
    while (rc->n_expo && rc->qp && rc->rcq && iwarp_poll_cq(rc->rcq, 1, &wc) == 1) {
        ctrl_msg m;
        if (wc.status == IWARP_WC_SUCCESS &&
            !decode_msg((unsigned char *)iwarp_mr_addr(rc->ctrl) + wc.wr_id * MSG_LEN, wc.byte_len,
                        &m))
            (void)expo_take(rc, &m);
    }
    while (rc->n_expo) {
        rdma_expo *x = &rc->expo[rc->n_expo - 1];
        ap_log_cerror(APLOG_MARK, APLOG_INFO, 0, rc->c,
                      "mod_rdma: client-reads of %s: no DONE before %s; STag 0x%x invalidated, "
                      "buffer released", x->uri, why, x->stag);
        release_one(rc, rc->n_expo - 1);
    }
}

int expo_holds_static(const rdma_conn *rc)
{
    int i;
    for (i = 0; i < rc->n_expo; i++)
        if (rc->expo[i].in_static)
            return 1;
    return 0;
}

/* If `m` is the client's DONE or ABORT for a granted body, end that grant
 * and return 1; else 0 (the message is someone else's). */
int expo_take(rdma_conn *rc, const ctrl_msg *m)
{
    int i;
    if (m->type != MSG_DONE && m->type != MSG_ABORT)
        return 0;
    for (i = 0; i < rc->n_expo; i++)
        if (rc->expo[i].stag == m->stag) {
            ap_log_cerror(APLOG_MARK, APLOG_DEBUG, 0, rc->c,
                          "mod_rdma: client-reads of %s: %s for stag 0x%x, %u of %" APR_UINT64_T_FMT
                          " bytes; buffer released", rc->expo[i].uri,
                          m->type == MSG_DONE ? "DONE" : "ABORT", m->stag, m->length,
                          rc->expo[i].len);
            release_one(rc, i);
            return 1;
        }
    return 0;
}

/* End the grants whose deadline has passed. */
static void expire(rdma_conn *rc, request_rec *r)
{
    apr_time_t now = apr_time_now();
    int i = 0;
    while (i < rc->n_expo) {
        if (rc->expo[i].deadline > now) {
            i++;
            continue;
        }
        ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r,
                      "mod_rdma: client-reads of %s: no DONE for stag 0x%x (%" APR_UINT64_T_FMT
                      " bytes) within RDMATimeout %d ms; STag invalidated, buffer released",
                      rc->expo[i].uri, rc->expo[i].stag, rc->expo[i].len,
                      cf_timeout(srv_conf(r->server)));
        release_one(rc, i);
    }
}

/* A message that ended no grant, outside a transfer that waits for one. */
static void stray(request_rec *r, const ctrl_msg *m)
{
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                  "mod_rdma: ignoring a control message (type %u, stag 0x%x) that names no "
                  "granted buffer (a late DONE after its deadline?)", m->type, m->stag);
}

/* Take the DONEs that have arrived, without waiting, and end expired
 * grants. A failed connection ends them all. */
void expo_reap(rdma_conn *rc, request_rec *r)
{
    ctrl_msg m;
    const char *e = NULL;
    int got;
    if (!rc->n_expo)
        return;
    while (rc->n_expo && (got = poll_ctrl(rc, r, &m, &e)) > 0)
        if (!expo_take(rc, &m))
            stray(r, &m);
    if (e) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r,
                      "mod_rdma: client-reads: %s; the granted STags are invalidated", e);
        expo_release_all(rc, e);
        return;
    }
    expire(rc, r);
}

static int must_wait(const rdma_conn *rc, apr_uint64_t len, int flags)
{
    if ((flags & EXPO_STATIC) && expo_holds_static(rc))
        return 1;
    return (flags & EXPO_GRANT) &&
           (rc->n_expo >= EXPO_MAX || (rc->n_expo && rc->expo_bytes + len > EXPO_MAX_BYTES));
}

/* Wait for the client's DONEs until the connection can grant one more body
 * of `len` bytes (EXPO_GRANT) and/or no grant holds the static buffer
 * (EXPO_STATIC: a request about to use it); each wait is bounded by the
 * oldest grant's deadline, at which it ends anyway. NULL, or why the
 * connection must be given up. */
const char *expo_make_room(rdma_conn *rc, request_rec *r, apr_uint64_t len, int flags)
{
    expo_reap(rc, r);
    while (rc->n_expo && must_wait(rc, len, flags)) {
        ctrl_msg m;
        const char *e;
        apr_time_t left = rc->expo[0].deadline - apr_time_now();
        int ms = left > 0 ? (int)apr_time_msec(left) + 1 : 1;
        e = recv_ctrl_for(rc, r, &m, ms);
        if (e && !strncmp(e, "no DONE", 7)) {
            expire(rc, r);
            continue;
        }
        if (e)
            return e;
        if (!expo_take(rc, &m))
            stray(r, &m);
    }
    return NULL;
}

/* Move the request's advertised body into the connection's grants (room
 * was made by expo_make_room); the request no longer owns it. */
void expo_add(rdma_conn *rc, request_rec *r, rdma_req *q)
{
    rdma_expo *x = &rc->expo[rc->n_expo++];
    x->win = q->win;
    x->stag = iwarp_mr_rkey(q->win);
    x->len = q->total;
    x->deadline = apr_time_now() + apr_time_from_msec(cf_timeout(srv_conf(r->server)));
    x->map = q->map;
    x->map_len = q->map_len;
    if (x->map)
        (void)map_pin(x->map); /* uncached: the grant owns the mapping */
    x->body = q->body;
    x->in_static = q->body_in_static;
    apr_cpystrn(x->uri, r->uri, sizeof x->uri);
    rc->expo_bytes += x->len;
    q->win = NULL;
    q->map = NULL;
    q->body = NULL;
    q->body_cap = 0;
    q->body_in_static = 0;
    set_threaded(rc, 1);
}
