/* mod_rdma: request bodies (RDMA_IN).
 *
 * The input filter of PUT/POST: client-writes (offer buffers with BUF,
 * wait for DONE) and server-reads (RDMA Read from the client's buffer),
 * producing the body for the handler as HTTP_IN would. */
#include "mod_rdma_private.h"

APLOG_USE_MODULE(rdma);

/* ---- RDMA_IN ------------------------------------------------------------ */

static apr_status_t in_fail(ap_filter_t *f, const char *why)
{
    rdma_req *q = f->ctx;
    request_rec *r = f->r;
    ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                  "mod_rdma: %s of the %s body from %s:%u failed: %s; RDMA connection closed, "
                  "buffer released", scheme_names[q->h.scheme], r->method, q->rc->ip, q->rc->port,
                  why);
    apr_table_setn(r->err_headers_out, "RDMA-Error", header_safe(r->pool, why));
    conn_drop_qp(q->rc);
    req_cleanup(q);
    q->in_err = 1;
    r->connection->keepalive = AP_CONN_CLOSE;
    return APR_EGENERAL;
}

/* Move the next piece of the body into q->pending. */
static apr_status_t in_next(ap_filter_t *f)
{
    rdma_req *q = f->ctx;
    request_rec *r = f->r;
    apr_uint64_t left = q->h.length - q->in_done;
    char *local;
    apr_size_t cap, n;
    const char *e;
    if (!q->in_mr) {
        /* Local buffer: the static one, or the whole body (dynamic). */
        int access = q->h.scheme == S_CLIENT_WRITES
                         ? IWARP_ACCESS_LOCAL_WRITE | IWARP_ACCESS_REMOTE_WRITE
                         : IWARP_ACCESS_LOCAL_WRITE;
        if (q->mode == MODE_STATIC && g_static_mr) {
            local = iwarp_mr_addr(g_static_mr);
            cap = iwarp_mr_length(g_static_mr);
        } else {
            cap = (apr_size_t)(q->h.length ? q->h.length : 1);
            q->in_buf = malloc(cap);
            if (!q->in_buf)
                return in_fail(f, apr_psprintf(r->pool, "cannot allocate %" APR_SIZE_T_FMT
                                               " bytes for the body", cap));
            local = q->in_buf;
        }
        if (iwarp_reg_mr(g_pd, local, cap, access, &q->in_mr) != IWARP_OK)
            return in_fail(f, apr_pstrcat(r->pool, "registering the receive buffer failed: ",
                                          iwarp_err(r->pool), NULL));
    }
    local = iwarp_mr_addr(q->in_mr);
    cap = iwarp_mr_length(q->in_mr);
    n = left < cap ? (apr_size_t)left : cap;
    if (q->h.scheme == S_SERVER_READS) {
        e = xfer(q->rc, r, IWARP_WR_RDMA_READ, (uint64_t)(uintptr_t)local, n,
                 iwarp_mr_lkey(q->in_mr), q->h.to + q->in_done, q->h.stag);
    } else {
        ctrl_msg m = {MSG_BUF, iwarp_mr_rkey(q->in_mr), (uint32_t)n,
                      (uint64_t)(uintptr_t)local, q->in_done};
        ctrl_msg d;
        e = send_ctrl(q->rc, r, &m);
        if (!e)
            e = recv_ctrl(q->rc, r, &d);
        if (!e && d.type != MSG_DONE)
            e = d.type == MSG_ABORT ? "the client aborted the upload" : "expected DONE";
        if (!e && (d.stag != m.stag || d.length != m.length || d.offset != m.offset))
            e = "DONE does not match the BUF it answers";
    }
    if (e)
        return in_fail(f, e);
    APR_BRIGADE_INSERT_TAIL(q->pending,
                            apr_bucket_heap_create(local, n, NULL, r->connection->bucket_alloc));
    q->in_done += n;
    if (q->in_done == q->h.length) {
        apr_table_setn(r->headers_out, "RDMA",
                       apr_psprintf(r->pool, "%s, length=%" APR_UINT64_T_FMT,
                                    scheme_names[q->h.scheme], (apr_uint64_t)q->in_done));
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, "mod_rdma: %s: %" APR_UINT64_T_FMT
                      " bytes received; buffer released", scheme_names[q->h.scheme],
                      (apr_uint64_t)q->in_done);
        req_cleanup(q);
    }
    return APR_SUCCESS;
}

apr_status_t rdma_in_filter(ap_filter_t *f, apr_bucket_brigade *bb, ap_input_mode_t mode,
                            apr_read_type_e block, apr_off_t readbytes)
{
    rdma_req *q = f->ctx;
    apr_bucket *after;
    apr_status_t rv;
    /* The body never comes from the socket (the client sent none), so
     * no mode may reach HTTP_IN, which would wait for Content-Length
     * bytes there. */
    if (mode == AP_MODE_INIT || mode == AP_MODE_EATCRLF)
        return APR_SUCCESS;
    if (q->in_err)
        return APR_EGENERAL;
    if (!q->pending)
        q->pending = apr_brigade_create(f->r->pool, f->c->bucket_alloc);
    if (APR_BRIGADE_EMPTY(q->pending)) {
        if (q->in_done == q->h.length) {
            APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_eos_create(f->c->bucket_alloc));
            return APR_SUCCESS;
        }
        if ((rv = in_next(f)) != APR_SUCCESS)
            return rv;
    }
    if (mode == AP_MODE_GETLINE)
        return apr_brigade_split_line(bb, q->pending, block,
                                      readbytes > 0 ? readbytes : HUGE_STRING_LEN);
    if (mode == AP_MODE_EXHAUSTIVE) {
        APR_BRIGADE_CONCAT(bb, q->pending);
        return APR_SUCCESS;
    }
    if (readbytes <= 0)
        readbytes = 8192;
    rv = apr_brigade_partition(q->pending, readbytes, &after);
    if (rv != APR_SUCCESS && rv != APR_INCOMPLETE)
        return rv;
    if (mode == AP_MODE_SPECULATIVE) {
        apr_bucket *b;
        for (b = APR_BRIGADE_FIRST(q->pending); b != after; b = APR_BUCKET_NEXT(b)) {
            apr_bucket *c;
            apr_bucket_copy(b, &c);
            APR_BRIGADE_INSERT_TAIL(bb, c);
        }
        return APR_SUCCESS;
    }
    while (APR_BRIGADE_FIRST(q->pending) != after) {
        apr_bucket *b = APR_BRIGADE_FIRST(q->pending);
        APR_BUCKET_REMOVE(b);
        APR_BRIGADE_INSERT_TAIL(bb, b);
    }
    return APR_SUCCESS;
}
