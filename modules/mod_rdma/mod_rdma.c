/*
 * mod_rdma: move HTTP bodies by RDMA (software iWARP, libiwarp) for clients
 * that ask for it with an `RDMA:` request header; every other client gets
 * plain HTTP, byte for byte. The protocol (header grammar, the RDMA
 * channel's control messages, the four schemes) is in docs/MOD_RDMA.md.
 *
 * Hooks:
 *  - post_config: refuse threaded MPMs (see below).
 *  - child_init: open the iWARP device, allocate the protection domain and
 *    the per-process static buffer. libiwarp starts threads, so this must
 *    happen after fork, never in the parent.
 *  - pre_connection: per-connection state; a pool cleanup on the
 *    connection destroys its QP and CQs when the HTTP connection ends.
 *  - fixups: parse and check the `RDMA:` header (400 naming the problem,
 *    403 for a connect-back address that is not allowed), then open or
 *    reuse the RDMA connection to the client's listener (502/504 when it
 *    cannot be reached), so that every failure is a status before the
 *    handler runs.
 *  - insert_filter: add RDMA_OUT (GET) or RDMA_IN (PUT/POST).
 *  - RDMA_OUT: holds the response headers, moves the body by RDMA, then
 *    lets the headers (with `RDMA: ..., length=N` and Content-Length: 0)
 *    go out.
 *  - RDMA_IN: gives the handler the body that arrives by RDMA.
 *
 * Source layout (this file: per-process state, request admission in
 * fixups, hook registration):
 *  - config.c: directives and their defaults;
 *  - rdma_header.c: the RDMA: header grammar (fuzzed alone);
 *  - wire.c: the control messages' codec;
 *  - conn.c: the RDMA connection (connect-back, reuse, transfers, control
 *    messages);
 *  - response.c: RDMA_OUT, response bodies (GET);
 *  - request.c: RDMA_IN, request bodies (PUT/POST);
 *  - seal.c: over TLS, response bodies sealed under the TLS session;
 *  - mod_rdma_private.h: the types and functions they share.
 *
 * MPM: one process serves one connection at a time only under prefork;
 * the static buffer and the STag windows rely on that (a window's STag is
 * registered for one request and deregistered when it ends, in a PD no
 * other connection uses at that time). Threaded MPMs are refused at
 * start-up with a message naming the fix.
 */

#include "mod_rdma_private.h"

/* ---- per-process state (child_init) ------------------------------------ */

iwarp_context *g_ctx;
iwarp_pd *g_pd;
iwarp_mr *g_static_mr; /* local access only: never advertised */
static char g_init_err[512];

const char *iwarp_err(apr_pool_t *p)
{
    char buf[512];
    iwarp_last_error(buf, sizeof buf);
    return apr_pstrdup(p, buf);
}

static apr_status_t process_cleanup(void *d)
{
    (void)d;
    iwarp_dereg_mr(g_static_mr);
    iwarp_dealloc_pd(g_pd);
    iwarp_close_device(g_ctx);
    g_static_mr = NULL;
    g_pd = NULL;
    g_ctx = NULL;
    return APR_SUCCESS;
}

static apr_size_t g_static_want; /* the static buffer this process needs */

/* Open the device, the PD and the static buffer, whichever is still
 * missing: at child_init and again at each RDMA request that needs a
 * missing piece, so a worker recovers once the fault is gone (memory freed,
 * a limit raised) without a restart. Returns NULL, or the cause with the
 * fix (also kept in g_init_err). */
static const char *device_setup(server_rec *s, int at_start)
{
    if (!g_pd) {
        if (iwarp_open_device_named(g_device, &g_ctx) != IWARP_OK ||
            iwarp_alloc_pd(g_ctx, &g_pd) != IWARP_OK) {
            char e[384];
            iwarp_last_error(e, sizeof e);
            iwarp_close_device(g_ctx);
            g_ctx = NULL;
            g_pd = NULL;
            apr_snprintf(g_init_err, sizeof g_init_err,
                         "opening the RDMA device %s failed: %s; RDMA requests get 503 and clients "
                         "fall back to plain HTTP. Fix: see the cause (libiwarp's message); the "
                         "worker tries again at each RDMA request",
                         g_device ? g_device : "(IWARP_DEVICE, else soft)", e);
            if (at_start)
                ap_log_error(APLOG_MARK, APLOG_ERR, 0, s, "mod_rdma: pid %ld: %s", (long)getpid(),
                             g_init_err);
            return g_init_err;
        }
    }
    if (g_static_want && !g_static_mr) {
        if (iwarp_alloc_mr(g_pd, g_static_want, IWARP_ACCESS_LOCAL_WRITE, &g_static_mr) !=
            IWARP_OK) {
            char e[384];
            iwarp_last_error(e, sizeof e);
            g_static_mr = NULL;
            apr_snprintf(g_init_err, sizeof g_init_err,
                         "allocating the %" APR_SIZE_T_FMT "-byte static buffer (RDMABufferSize) "
                         "failed: %s; RDMA requests to servers with static registration get 503 "
                         "and clients fall back to plain HTTP. Fix: lower RDMABufferSize, use "
                         "RDMARegistration dynamic, or raise the memory limit of the Apache "
                         "processes (ulimit -v); the worker tries again at each such request",
                         g_static_want, e);
            if (at_start)
                ap_log_error(APLOG_MARK, APLOG_ERR, 0, s, "mod_rdma: pid %ld: %s", (long)getpid(),
                             g_init_err);
            return g_init_err;
        }
        if (!at_start)
            ap_log_error(APLOG_MARK, APLOG_NOTICE, 0, s,
                         "mod_rdma: pid %ld: the %" APR_SIZE_T_FMT "-byte static buffer is "
                         "allocated now (it failed before); RDMA is available again",
                         (long)getpid(), g_static_want);
    }
    g_init_err[0] = 0;
    return NULL;
}

static void child_init(apr_pool_t *p, server_rec *s)
{
    server_rec *sv;
    g_init_err[0] = 0;
    g_static_want = 0;
    /* One static buffer per process, as large as the largest RDMABufferSize
     * of the (virtual) servers that use static registration. */
    for (sv = s; sv; sv = sv->next) {
        rdma_srv_conf *c = srv_conf(sv);
        if (cf_mode(c) == MODE_STATIC && cf_bufsize(c) > g_static_want)
            g_static_want = cf_bufsize(c);
    }
    /* Frees whatever is open when the process ends (NULLs are no-ops). */
    apr_pool_cleanup_register(p, NULL, process_cleanup, apr_pool_cleanup_null);
    seal_child_init(s);
    if (device_setup(s, 1) == NULL)
        ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, s,
                     "mod_rdma: pid %ld: iWARP device open, static buffer %" APR_SIZE_T_FMT " bytes",
                     (long)getpid(), g_static_want);
}

static int post_config(apr_pool_t *p, apr_pool_t *plog, apr_pool_t *ptemp, server_rec *s)
{
    int threaded = 0;
    (void)p; (void)plog; (void)ptemp;
    if (ap_mpm_query(AP_MPMQ_IS_THREADED, &threaded) == APR_SUCCESS &&
        threaded != AP_MPMQ_NOT_SUPPORTED) {
        ap_log_error(APLOG_MARK, APLOG_CRIT, 0, s,
                     "mod_rdma: needs the prefork MPM (one connection per process: the static "
                     "buffer and STag windows are per process); this MPM is threaded. "
                     "Fix: a2dismod mpm_event; a2enmod mpm_prefork (or LoadModule mpm_prefork_module)");
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    return OK;
}


/* Releases everything a request registered or mapped, on every path. */
apr_status_t req_cleanup(void *d)
{
    rdma_req *q = d;
    if (q->win) {
        iwarp_dereg_mr(q->win);
        q->win = NULL;
    }
    if (q->in_mr) {
        iwarp_dereg_mr(q->in_mr);
        q->in_mr = NULL;
    }
    if (q->map) {
        release_map(q->map, q->map_len);
        q->map = NULL;
    }
    free(q->body);
    q->body = NULL;
    free(q->in_buf);
    q->in_buf = NULL;
    free(q->bounce);
    q->bounce = NULL;
    return APR_SUCCESS;
}

/* A copy of `s` safe as a header value: control characters become spaces. */
const char *header_safe(apr_pool_t *p, const char *s)
{
    char *c = apr_pstrdup(p, s), *q;
    for (q = c; *q; q++)
        if (apr_iscntrl(*q))
            *q = ' ';
    return c;
}

int refuse(request_rec *r, int status, const char *why)
{
    why = header_safe(r->pool, why);
    ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, "mod_rdma: %s %s refused with %d: %s", r->method,
                  r->uri, status, why);
    apr_table_setn(r->err_headers_out, "RDMA-Error", why);
    apr_table_setn(r->notes, "error-notes", ap_escape_html(r->pool, why));
    return status;
}

/* Why this request looks forwarded by a proxy, or NULL. */
static const char *proxy_evidence(request_rec *r)
{
    static const char *const headers[] = {"Forwarded", "X-Forwarded-For", "X-Real-IP", "Via"};
    size_t i;
    if (r->useragent_ip && r->connection->client_ip &&
        strcmp(r->useragent_ip, r->connection->client_ip) != 0)
        return apr_psprintf(r->pool, "its client address %s differs from the connection's %s, "
                            "as mod_remoteip sets it",
                            r->useragent_ip, r->connection->client_ip);
    for (i = 0; i < sizeof headers / sizeof *headers; i++)
        if (apr_table_get(r->headers_in, headers[i]))
            return apr_psprintf(r->pool, "it carries a %s header", headers[i]);
    return NULL;
}

/* Failed connect-backs, per address connected to, in this process
 * (prefork: each worker counts its own). Past FAIL_LIMIT within
 * FAIL_WINDOW that address gets 429 without a connection attempt, so a
 * client cannot use the server to probe ports quickly; a successful
 * connection starts the count over. */
#define FAIL_SLOTS 32
#define FAIL_LIMIT 5
#define FAIL_WINDOW apr_time_from_sec(60)

static struct {
    char ip[64];
    unsigned count;
    apr_time_t first;
} g_fails[FAIL_SLOTS];

static unsigned *fail_slot(const char *ip, apr_time_t now, int create)
{
    int i, oldest = 0;
    for (i = 0; i < FAIL_SLOTS; i++) {
        if (g_fails[i].count && !strcmp(g_fails[i].ip, ip)) {
            if (now - g_fails[i].first > FAIL_WINDOW) {
                g_fails[i].count = 0;
                g_fails[i].first = now;
            }
            return &g_fails[i].count;
        }
        if (g_fails[i].first < g_fails[oldest].first)
            oldest = i;
    }
    if (!create)
        return NULL;
    apr_cpystrn(g_fails[oldest].ip, ip, sizeof g_fails[oldest].ip);
    g_fails[oldest].count = 0;
    g_fails[oldest].first = now;
    return &g_fails[oldest].count;
}

static int connect_back_limited(request_rec *r, const char *client)
{
    unsigned *n = fail_slot(client, apr_time_now(), 0);
    if (n && *n >= FAIL_LIMIT)
        return refuse(r, HTTP_TOO_MANY_REQUESTS,
                      apr_psprintf(r->pool, "%u failed RDMA connections to this client within "
                                   "%d s; retry later",
                                   *n, (int)apr_time_sec(FAIL_WINDOW)));
    return OK;
}

void connect_back_failed(const char *client)
{
    unsigned *n = fail_slot(client, apr_time_now(), 1);
    ++*n;
}

/* A client that connects back successfully starts over. */
void connect_back_succeeded(const char *client)
{
    unsigned *n = fail_slot(client, apr_time_now(), 0);
    if (n)
        *n = 0;
}

/* Why a PUT/POST with an RDMA: header also carries a body on the socket,
 * or NULL: any Transfer-Encoding, or a Content-Length other than 0. The
 * body of such a request travels by RDMA only (docs/MOD_RDMA.md). */
static const char *body_on_socket(request_rec *r)
{
    const char *te = apr_table_get(r->headers_in, "Transfer-Encoding");
    const char *cl = apr_table_get(r->headers_in, "Content-Length");
    const char *c;
    if (te)
        return apr_psprintf(r->pool, "a request with an RDMA header must not carry "
                            "Transfer-Encoding (here \"%s\"): its body travels by RDMA only; "
                            "send Content-Length: 0 and no body on the connection", te);
    if (!cl)
        return NULL;
    for (c = cl; *c == '0'; c++)
        ;
    if (c == cl || *c)
        return apr_psprintf(r->pool, "a request with an RDMA header must not carry a body on "
                            "the connection (Content-Length: %s): its body travels by RDMA "
                            "only; send Content-Length: 0", cl);
    return NULL;
}

/* RDMAInlineBelow: a GET of a static file smaller than the threshold is
 * answered as plain Apache would (the default handler, sendfile or mmap,
 * Content-Length), with `RDMA-Inline: length=N` (N = the file's size) so
 * the client knows the server chose this; no connect-back, no RDMA state.
 * One write on the HTTP connection costs less than the RDMA path's extra
 * round trip (server-writes: the DONE; client-reads: the client's Read)
 * for small bodies: the sockets design's bcopy/zcopy threshold applied to
 * HTTP. Only when the file itself is the answer: no handler (the default
 * handler serves it) and a regular file; CGI, PHP and other generated
 * bodies have no known size here and go by RDMA. The header goes in
 * headers_out, which Apache drops from error answers. */
static int answer_inline(request_rec *r, const rdma_srv_conf *sc)
{
    apr_uint64_t below = cf_inline_below(sc);
    if (!below || r->finfo.filetype != APR_REG || r->finfo.size < 0 ||
        (apr_uint64_t)r->finfo.size >= below)
        return 0;
    if (r->handler && strcmp(r->handler, "default-handler"))
        return 0;
    apr_table_setn(r->headers_out, "RDMA-Inline",
                   apr_psprintf(r->pool, "length=%" APR_OFF_T_FMT, r->finfo.size));
    ap_log_rerror(APLOG_MARK, APLOG_TRACE1, 0, r,
                  "mod_rdma: %" APR_OFF_T_FMT "-byte file answered inline (RDMAInlineBelow %"
                  APR_UINT64_T_FMT ")", r->finfo.size, below);
    return 1;
}

static int rdma_fixups(request_rec *r)
{
    rdma_dir_conf *dc = ap_get_module_config(r->per_dir_config, &rdma_module);
    rdma_srv_conf *sc = srv_conf(r->server);
    rdma_conn *rc = ap_get_module_config(r->connection->conn_config, &rdma_module);
    const char *v = apr_table_get(r->headers_in, "RDMA"), *why, *via, *client;
    rdma_req *q;
    int is_get, st, i, allowed;
    if (!v || r->main || dc->enable != 1 || !rc)
        return DECLINED;
    q = apr_pcalloc(r->pool, sizeof *q);
    if ((why = parse_header(r->pool, v, &q->h)) != NULL)
        return refuse(r, HTTP_BAD_REQUEST, apr_pstrcat(r->pool, "malformed RDMA header: ", why, NULL));
    is_get = q->h.scheme == S_SERVER_WRITES || q->h.scheme == S_CLIENT_READS;
    if (r->header_only)
        return DECLINED; /* HEAD: no body to move */
    if (is_get ? r->method_number != M_GET
               : (r->method_number != M_PUT && r->method_number != M_POST))
        return refuse(r, HTTP_BAD_REQUEST,
                      apr_psprintf(r->pool, "scheme %s is for %s requests, not %s",
                                   scheme_names[q->h.scheme], is_get ? "GET" : "PUT and POST",
                                   r->method));
    if (!is_get && (why = body_on_socket(r)) != NULL) {
        /* The module replaces the request's framing (Content-Length := the
         * RDMA length, no Transfer-Encoding), so a body the client also
         * sent on the socket would never be read: Apache would parse it as
         * the next request on this connection -- request smuggling behind
         * a proxy that reuses connections. RFC 9112 §6.3 makes the framing
         * headers decide where a message ends; with two framings a
         * message cannot be delimited, so like RFC 9112 §6.3 (3) for
         * Transfer-Encoding with Content-Length: refuse, and close the
         * connection rather than guess (400 drops the connection in
         * Apache, set here explicitly too; the body is not read). */
        r->connection->keepalive = AP_CONN_CLOSE;
        return refuse(r, HTTP_BAD_REQUEST, why);
    }
    /* Over TLS the RDMA connection (plain TCP) must not carry the body in
     * clear: RDMATLS encrypt seals it under the TLS session (seal.c),
     * RDMATLS off answers in the HTTPS response instead. Request bodies
     * are not sealed (the client would have to seal, and the handler be
     * fed from a checked buffer): refused, so the client sends the body in
     * the request. */
    if (seal_is_tls(r->connection)) {
        if (!is_get)
            return refuse(r, HTTP_FORBIDDEN,
                          "request bodies are not moved by RDMA over TLS (they would travel in "
                          "clear); send the body in the request over HTTPS");
        if (cf_tls(sc) == TLS_OFF) {
            apr_table_setn(r->headers_out, "RDMA-TLS", "off");
            ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                          "mod_rdma: RDMATLS off: the body goes in the HTTPS response");
            return DECLINED;
        }
        if ((why = seal_setup(r, q, &st)) != NULL)
            return refuse(r, st, why);
    } else if (apr_table_get(r->headers_in, "RDMA-Seal")) {
        return refuse(r, HTTP_BAD_REQUEST,
                      "RDMA-Seal is for requests over TLS (HTTPS); this connection is plain "
                      "HTTP, drop the header");
    }
    /* The client is the TCP peer of this connection. A request that came
     * through a proxy (mod_remoteip rewrote the address, or it carries a
     * forwarding header) would make the server connect to whatever the
     * proxy's client claims: refused unless RDMATrustProxy On, which
     * takes the address mod_remoteip established instead. */
    via = proxy_evidence(r);
    if (via && sc->trust_proxy != 1)
        return refuse(r, HTTP_FORBIDDEN,
                      apr_psprintf(r->pool, "this request came through a proxy (%s); the server "
                                   "connects back only to clients that reach it directly "
                                   "(RDMATrustProxy)",
                                   via));
    client = via ? r->useragent_ip : r->connection->client_ip;
    /* Compare and connect in canonical form: a dual-stack listener reports
     * an IPv4 client as ::ffff:a.b.c.d, and the client may name itself
     * either way (canon_ip). The same text then keys the failure count
     * and the reuse of the RDMA connection. */
    if (!canon_ip(q->h.ip, q->h.ip, sizeof q->h.ip))
        return refuse(r, HTTP_BAD_REQUEST,
                      apr_psprintf(r->pool, "malformed RDMA header: ip=%s is not an IP address "
                                   "literal", q->h.ip));
    allowed = sc->allow_client && same_ip(q->h.ip, client);
    for (i = 0; !allowed && i < sc->allow->nelts; i++)
        allowed = same_ip(q->h.ip, APR_ARRAY_IDX(sc->allow, i, const char *));
    if (!allowed)
        return refuse(r, HTTP_FORBIDDEN,
                      apr_psprintf(r->pool, "ip=%s is not the address this request came from (%s); "
                                   "the server connects back only to the requesting client "
                                   "(RDMAAllowConnect)",
                                   q->h.ip, client));
    if (!port_allowed(sc, q->h.port))
        return refuse(r, HTTP_FORBIDDEN,
                      apr_psprintf(r->pool, "port=%u is not among the ports this server connects "
                                   "back to (RDMAConnectPorts %s); listen on one of those",
                                   q->h.port, ports_text(r->pool, sc)));
    if (is_get && answer_inline(r, sc))
        return DECLINED;
    if ((st = connect_back_limited(r, q->h.ip)) != OK)
        return st;
    if (!g_pd || (cf_mode(sc) == MODE_STATIC && !g_static_mr)) {
        /* child_init could not set up the device or the static buffer: try
         * again (the fault may be gone). A dynamic server needs only the
         * device; the static buffer concerns static servers alone. */
        why = device_setup(r->server, 0);
        if (!g_pd || (cf_mode(sc) == MODE_STATIC && !g_static_mr))
            return refuse(r, HTTP_SERVICE_UNAVAILABLE,
                          apr_pstrcat(r->pool, "RDMA is not available in this server process: ",
                                      why ? why : "not initialised", NULL));
    }
    q->limit = cf_maxlen(sc);
    if (q->h.scheme == S_SERVER_WRITES || (q->h.have & K_MAXLEN)) {
        if (q->h.maxlen < q->limit)
            q->limit = q->h.maxlen;
    }
    if (!is_get && q->h.length > q->limit)
        return refuse(r, HTTP_REQUEST_ENTITY_TOO_LARGE,
                      apr_psprintf(r->pool, "request body of %" APR_UINT64_T_FMT
                                   " bytes exceeds RDMAMaxLength %" APR_UINT64_T_FMT
                                   "; send it over plain HTTP",
                                   (apr_uint64_t)q->h.length, q->limit));
    if ((st = conn_ensure(rc, r, &q->h, &why)) != OK)
        return refuse(r, st, why);
    q->rc = rc;
    q->mode = cf_mode(sc);
    apr_pool_cleanup_register(r->pool, q, req_cleanup, apr_pool_cleanup_null);
    if (is_get) {
        /* RDMA moves the whole entity: a Range would have the byterange
         * filter (which runs after RDMA_OUT) cut an already empty body. */
        apr_table_unset(r->headers_in, "Range");
        apr_table_unset(r->headers_in, "If-Range");
    } else {
        apr_table_setn(r->headers_in, "Content-Length",
                       apr_psprintf(r->pool, "%" APR_UINT64_T_FMT, (apr_uint64_t)q->h.length));
        apr_table_unset(r->headers_in, "Transfer-Encoding");
    }
    ap_set_module_config(r->request_config, &rdma_module, q);
    return DECLINED;
}

static void rdma_insert_filter(request_rec *r)
{
    rdma_req *q = ap_get_module_config(r->request_config, &rdma_module);
    if (!q)
        return;
    if (q->h.scheme == S_SERVER_WRITES || q->h.scheme == S_CLIENT_READS)
        ap_add_output_filter("RDMA_OUT", q, r, r->connection);
    else
        ap_add_input_filter("RDMA_IN", q, r, r->connection);
}

/* ---- registration --------------------------------------------------------- */

static void register_hooks(apr_pool_t *p)
{
    (void)p;
    ap_hook_check_config(check_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(post_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_init(child_init, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_pre_connection(pre_connection, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_fixups(rdma_fixups, NULL, NULL, APR_HOOK_LAST);
    ap_hook_insert_filter(rdma_insert_filter, NULL, NULL, APR_HOOK_MIDDLE);
    seal_register_hooks();
    /* Just above the protocol filters (HTTP_HEADER, CONTENT_LENGTH): after
     * content filters such as deflate, before the headers are written. */
    ap_register_output_filter("RDMA_OUT", rdma_out_filter, NULL,
                              (ap_filter_type)(AP_FTYPE_PROTOCOL - 1));
    ap_register_input_filter("RDMA_IN", rdma_in_filter, NULL,
                             (ap_filter_type)(AP_FTYPE_PROTOCOL - 1));
}

AP_DECLARE_MODULE(rdma) = {
    STANDARD20_MODULE_STUFF,
    create_dir_conf,
    merge_dir_conf,
    create_srv_conf,
    merge_srv_conf,
    rdma_cmds,
    register_hooks
};
