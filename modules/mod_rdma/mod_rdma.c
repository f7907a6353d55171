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
 * MPM: one process serves one connection at a time only under prefork;
 * the static buffer and the STag windows rely on that (a window's STag is
 * registered for one request and deregistered when it ends, in a PD no
 * other connection uses at that time). Threaded MPMs are refused at
 * start-up with a message naming the fix.
 */

#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_mpm.h"
#include "util_filter.h"
#include "apr_strings.h"
#include "apr_buckets.h"
#include "apr_portable.h"
#include "apr_lib.h"
#include "rdma_header.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iwarp.h>

module AP_MODULE_DECLARE_DATA rdma_module;


/* ---- configuration ---------------------------------------------------- */

enum { MODE_STATIC = 0, MODE_DYNAMIC = 1 };

typedef struct {
    int enable; /* -1 unset, 0 off, 1 on */
} rdma_dir_conf;

typedef struct {
    int mode;                /* MODE_STATIC / MODE_DYNAMIC, -1 unset */
    apr_size_t bufsize;      /* static buffer, 0 unset */
    apr_uint64_t maxlen;     /* largest body moved by RDMA, 0 unset */
    int allow_client;        /* connect back to the request's own address */
    apr_array_header_t *allow; /* further IP literals (char *) */
    int allow_set;
    int timeout_ms;          /* transfers and DONE waits, 0 unset */
    int connect_timeout_ms;  /* connecting to the client's listener */
    apr_array_header_t *ports; /* RDMAConnectPorts: port_range entries */
    int ports_set;
    int trust_proxy;         /* RDMATrustProxy: -1 unset, 0 off, 1 on */
} rdma_srv_conf;

/* One range of RDMAConnectPorts, inclusive. */
typedef struct {
    unsigned lo, hi;
} port_range;

/* Without RDMAConnectPorts the server connects back to unprivileged ports
 * only: a request must not make it knock on a host's system services. */
#define DEF_PORT_LO 1024u
#define DEF_PORT_HI 65535u

#define DEF_BUFSIZE (8u << 20)
#define DEF_MAXLEN ((apr_uint64_t)1 << 30)
#define DEF_TIMEOUT_MS 30000
#define DEF_CONNECT_TIMEOUT_MS 3000

static void *create_dir_conf(apr_pool_t *p, char *d)
{
    rdma_dir_conf *c = apr_pcalloc(p, sizeof *c);
    (void)d;
    c->enable = -1;
    return c;
}

static void *merge_dir_conf(apr_pool_t *p, void *basev, void *addv)
{
    rdma_dir_conf *b = basev, *a = addv, *c = apr_pcalloc(p, sizeof *c);
    c->enable = a->enable != -1 ? a->enable : b->enable;
    return c;
}

static void *create_srv_conf(apr_pool_t *p, server_rec *s)
{
    rdma_srv_conf *c = apr_pcalloc(p, sizeof *c);
    (void)s;
    c->mode = -1;
    c->allow_client = 1;
    c->allow = apr_array_make(p, 2, sizeof(char *));
    c->ports = apr_array_make(p, 2, sizeof(port_range));
    c->trust_proxy = -1;
    return c;
}

static void *merge_srv_conf(apr_pool_t *p, void *basev, void *addv)
{
    rdma_srv_conf *b = basev, *a = addv, *c = apr_pcalloc(p, sizeof *c);
    c->mode = a->mode != -1 ? a->mode : b->mode;
    c->bufsize = a->bufsize ? a->bufsize : b->bufsize;
    c->maxlen = a->maxlen ? a->maxlen : b->maxlen;
    c->allow_set = a->allow_set || b->allow_set;
    c->allow_client = a->allow_set ? a->allow_client : b->allow_client;
    c->allow = a->allow_set ? a->allow : b->allow;
    c->timeout_ms = a->timeout_ms ? a->timeout_ms : b->timeout_ms;
    c->connect_timeout_ms = a->connect_timeout_ms ? a->connect_timeout_ms : b->connect_timeout_ms;
    c->ports_set = a->ports_set || b->ports_set;
    c->ports = a->ports_set ? a->ports : b->ports;
    c->trust_proxy = a->trust_proxy != -1 ? a->trust_proxy : b->trust_proxy;
    return c;
}

static int cf_mode(const rdma_srv_conf *c) { return c->mode == -1 ? MODE_STATIC : c->mode; }
static apr_size_t cf_bufsize(const rdma_srv_conf *c) { return c->bufsize ? c->bufsize : DEF_BUFSIZE; }
static apr_uint64_t cf_maxlen(const rdma_srv_conf *c) { return c->maxlen ? c->maxlen : DEF_MAXLEN; }
static int cf_timeout(const rdma_srv_conf *c) { return c->timeout_ms ? c->timeout_ms : DEF_TIMEOUT_MS; }
static int cf_ctimeout(const rdma_srv_conf *c)
{
    return c->connect_timeout_ms ? c->connect_timeout_ms : DEF_CONNECT_TIMEOUT_MS;
}

/* "4096", "64K", "8M", "1G" */
static const char *parse_size(const char *arg, apr_uint64_t *out)
{
    char *end;
    apr_uint64_t mult = 1;
    unsigned long long n;
    errno = 0;
    n = strtoull(arg, &end, 10);
    if (end == arg || errno)
        return "not a size: use bytes or a K, M or G suffix";
    if (*end == 'K' || *end == 'k') { mult = 1ull << 10; end++; }
    else if (*end == 'M' || *end == 'm') { mult = 1ull << 20; end++; }
    else if (*end == 'G' || *end == 'g') { mult = 1ull << 30; end++; }
    if (*end || n == 0 || n > UINT64_MAX / mult)
        return "not a positive size: use bytes or a K, M or G suffix";
    *out = n * mult;
    return NULL;
}

static const char *set_enable(cmd_parms *cmd, void *dconf, int on)
{
    (void)cmd;
    ((rdma_dir_conf *)dconf)->enable = on;
    return NULL;
}

static rdma_srv_conf *srv_conf(server_rec *s)
{
    return ap_get_module_config(s->module_config, &rdma_module);
}

static const char *set_mode(cmd_parms *cmd, void *d, const char *arg)
{
    rdma_srv_conf *c = srv_conf(cmd->server);
    (void)d;
    if (!strcasecmp(arg, "static"))
        c->mode = MODE_STATIC;
    else if (!strcasecmp(arg, "dynamic"))
        c->mode = MODE_DYNAMIC;
    else
        return "RDMARegistration must be static or dynamic";
    return NULL;
}

static const char *set_bufsize(cmd_parms *cmd, void *d, const char *arg)
{
    apr_uint64_t n;
    const char *err = parse_size(arg, &n);
    (void)d;
    if (err)
        return apr_pstrcat(cmd->pool, "RDMABufferSize: ", err, NULL);
    if (n < 4096 || n > (1ull << 31))
        return "RDMABufferSize must be between 4K and 2G";
    srv_conf(cmd->server)->bufsize = (apr_size_t)n;
    return NULL;
}

static const char *set_maxlen(cmd_parms *cmd, void *d, const char *arg)
{
    apr_uint64_t n;
    const char *err = parse_size(arg, &n);
    (void)d;
    if (err)
        return apr_pstrcat(cmd->pool, "RDMAMaxLength: ", err, NULL);
    srv_conf(cmd->server)->maxlen = n;
    return NULL;
}

static const char *set_timeout(cmd_parms *cmd, void *d, const char *arg)
{
    int ms = atoi(arg);
    (void)d;
    if (ms <= 0)
        return "RDMATimeout takes a positive number of milliseconds";
    srv_conf(cmd->server)->timeout_ms = ms;
    return NULL;
}

static const char *set_ctimeout(cmd_parms *cmd, void *d, const char *arg)
{
    int ms = atoi(arg);
    (void)d;
    if (ms <= 0)
        return "RDMAConnectTimeout takes a positive number of milliseconds";
    srv_conf(cmd->server)->connect_timeout_ms = ms;
    return NULL;
}

static const char *set_allow(cmd_parms *cmd, void *d, const char *arg)
{
    rdma_srv_conf *c = srv_conf(cmd->server);
    unsigned char tmp[16];
    (void)d;
    if (!c->allow_set) {
        c->allow_set = 1;
        c->allow_client = 0;
        apr_array_clear(c->allow);
    }
    if (!strcasecmp(arg, "client")) {
        c->allow_client = 1;
        return NULL;
    }
    if (inet_pton(AF_INET, arg, tmp) != 1 && inet_pton(AF_INET6, arg, tmp) != 1)
        return apr_pstrcat(cmd->pool, "RDMAAllowConnect: \"", arg,
                           "\" is neither \"client\" nor an IP address literal", NULL);
    *(const char **)apr_array_push(c->allow) = apr_pstrdup(cmd->pool, arg);
    return NULL;
}

/* RDMAConnectPorts 1024-65535 80 ...: a port or an inclusive range. */
static const char *set_ports(cmd_parms *cmd, void *d, const char *arg)
{
    rdma_srv_conf *c = srv_conf(cmd->server);
    port_range pr;
    char *end;
    unsigned long lo, hi;
    (void)d;
    if (!c->ports_set) {
        c->ports_set = 1;
        apr_array_clear(c->ports);
    }
    errno = 0;
    lo = strtoul(arg, &end, 10);
    hi = lo;
    if (end != arg && *end == '-') {
        const char *h = end + 1;
        hi = strtoul(h, &end, 10);
        if (end == h)
            end = (char *)arg; /* "80-" */
    }
    if (end == arg || *end || errno || lo == 0 || hi > 65535 || lo > hi)
        return apr_pstrcat(cmd->pool, "RDMAConnectPorts: \"", arg,
                           "\" is neither a port (1-65535) nor a range such as 1024-65535",
                           NULL);
    pr.lo = (unsigned)lo;
    pr.hi = (unsigned)hi;
    *(port_range *)apr_array_push(c->ports) = pr;
    return NULL;
}

static const char *set_trust_proxy(cmd_parms *cmd, void *d, int on)
{
    (void)d;
    srv_conf(cmd->server)->trust_proxy = on;
    return NULL;
}

static int port_allowed(const rdma_srv_conf *c, unsigned port)
{
    int i;
    if (!c->ports_set)
        return port >= DEF_PORT_LO && port <= DEF_PORT_HI;
    for (i = 0; i < c->ports->nelts; i++) {
        const port_range *pr = &APR_ARRAY_IDX(c->ports, i, port_range);
        if (port >= pr->lo && port <= pr->hi)
            return 1;
    }
    return 0;
}

/* The ports a refusal names: the configured list, or the default. */
static const char *ports_text(apr_pool_t *p, const rdma_srv_conf *c)
{
    const char *t = NULL;
    int i;
    if (!c->ports_set)
        return apr_psprintf(p, "%u-%u", DEF_PORT_LO, DEF_PORT_HI);
    for (i = 0; i < c->ports->nelts; i++) {
        const port_range *pr = &APR_ARRAY_IDX(c->ports, i, port_range);
        const char *one = pr->lo == pr->hi ? apr_psprintf(p, "%u", pr->lo)
                                           : apr_psprintf(p, "%u-%u", pr->lo, pr->hi);
        t = t ? apr_pstrcat(p, t, " ", one, NULL) : one;
    }
    return t;
}

static const command_rec rdma_cmds[] = {
    AP_INIT_FLAG("RDMA", set_enable, NULL, OR_OPTIONS | ACCESS_CONF | RSRC_CONF,
                 "On: honour the RDMA: request header here; Off (default): plain HTTP only"),
    AP_INIT_TAKE1("RDMARegistration", set_mode, NULL, RSRC_CONF,
                  "static (default): copy through a per-process buffer registered at start-up; "
                  "dynamic: register the file mapping or the body where it lies, per request"),
    AP_INIT_TAKE1("RDMABufferSize", set_bufsize, NULL, RSRC_CONF,
                  "size of the per-process static buffer (default 8M)"),
    AP_INIT_TAKE1("RDMAMaxLength", set_maxlen, NULL, RSRC_CONF,
                  "largest body moved by RDMA (default 1G)"),
    AP_INIT_ITERATE("RDMAAllowConnect", set_allow, NULL, RSRC_CONF,
                    "where the server may connect back: \"client\" (the request's own address, "
                    "the default) and/or IP address literals"),
    AP_INIT_ITERATE("RDMAConnectPorts", set_ports, NULL, RSRC_CONF,
                    "ports the server may connect back to: ports and ranges such as "
                    "1024-65535 (the default: no privileged ports)"),
    AP_INIT_FLAG("RDMATrustProxy", set_trust_proxy, NULL, RSRC_CONF,
                 "Off (default): refuse RDMA for requests that came through a proxy; On: "
                 "connect back to the client address the proxy reports (mod_remoteip)"),
    AP_INIT_TAKE1("RDMATimeout", set_timeout, NULL, RSRC_CONF,
                  "bound on each RDMA transfer and DONE wait, in ms (default 30000)"),
    AP_INIT_TAKE1("RDMAConnectTimeout", set_ctimeout, NULL, RSRC_CONF,
                  "bound on connecting to the client's listener, in ms (default 3000)"),
    {NULL}
};

/* ---- wire: control messages (docs/MOD_RDMA.md; codec in wire.c) -------- */

#define RECV_SLOTS 8
#define SEND_SLOT RECV_SLOTS
#define XFER_CHUNK (16u << 20)
#define BOUNCE_LEN (1u << 20)

/* ---- per-process state (child_init) ------------------------------------ */

static iwarp_context *g_ctx;
static iwarp_pd *g_pd;
static iwarp_mr *g_static_mr; /* local access only: never advertised */
static char g_init_err[512];

static const char *iwarp_err(apr_pool_t *p)
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
        if (iwarp_open_device(&g_ctx) != IWARP_OK || iwarp_alloc_pd(g_ctx, &g_pd) != IWARP_OK) {
            char e[384];
            iwarp_last_error(e, sizeof e);
            iwarp_close_device(g_ctx);
            g_ctx = NULL;
            g_pd = NULL;
            apr_snprintf(g_init_err, sizeof g_init_err,
                         "opening the iWARP device failed: %s; RDMA requests get 503 and clients "
                         "fall back to plain HTTP. Fix: see the cause (libiwarp's message); the "
                         "worker tries again at each RDMA request", e);
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

/* ---- per-connection state (pre_connection) ----------------------------- */

typedef struct {
    conn_rec *c;
    iwarp_cq *scq, *rcq;
    iwarp_qp *qp;
    /* The worker does the connection's receive work itself (waits poll its
     * socket); NULL if iwarp_qp_drive failed (then the stack's receive
     * thread does it, as before). */
    iwarp_drive *drive;
    iwarp_mr *ctrl; /* RECV_SLOTS receive slots + one send slot */
    char ip[64];
    unsigned port;
    unsigned uses;
} rdma_conn;

static void drain(iwarp_cq *cq)
{
    iwarp_wc wc[16];
    while (cq && iwarp_poll_cq(cq, 16, wc) > 0) {
    }
}

static void conn_drop_qp(rdma_conn *rc)
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

static int pre_connection(conn_rec *c, void *csd)
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
static void connect_back_failed(const char *client);
static void connect_back_succeeded(const char *client);

static int conn_ensure(rdma_conn *rc, request_rec *r, const char *ip, unsigned port,
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
static const char *xfer(rdma_conn *rc, request_rec *r, int opcode, uint64_t laddr, uint64_t len,
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

static const char *send_ctrl(rdma_conn *rc, request_rec *r, const ctrl_msg *m)
{
    unsigned char *slot = (unsigned char *)iwarp_mr_addr(rc->ctrl) + SEND_SLOT * MSG_LEN;
    encode_msg(slot, m);
    return run_wr(rc, r, IWARP_WR_SEND, (uint64_t)(uintptr_t)slot, MSG_LEN,
                  iwarp_mr_lkey(rc->ctrl), 0, 0);
}

static const char *recv_ctrl(rdma_conn *rc, request_rec *r, ctrl_msg *m)
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

static int same_ip(const char *a, const char *b)
{
    unsigned char x[16], y[16];
    if (inet_pton(AF_INET, a, x) == 1)
        return inet_pton(AF_INET, b, y) == 1 && !memcmp(x, y, 4);
    if (inet_pton(AF_INET6, a, x) == 1)
        return inet_pton(AF_INET6, b, y) == 1 && !memcmp(x, y, 16);
    return 0;
}

/* ---- per-request state ------------------------------------------------- */

enum { OUT_INIT, OUT_BODY, OUT_DISCARD, OUT_PASS };

typedef struct {
    rdma_conn *rc;
    rdma_hdr h;
    apr_uint64_t limit;  /* largest body for this request */
    int mode;
    /* RDMA_OUT */
    int out_state;
    apr_uint64_t total;  /* body bytes consumed */
    apr_size_t fill;     /* static bounce: bytes waiting in g_static_mr */
    char *body;          /* client-reads: collected body (malloc) */
    apr_size_t body_cap;
    int body_in_static;
    void *map;           /* mmap of a file (dynamic) */
    char *bounce;        /* server-writes, dynamic: file read buffer (malloc) */
    size_t map_len;
    iwarp_mr *win;       /* the advertised or temporary registration */
    /* RDMA_IN */
    apr_uint64_t in_done;
    int in_eos, in_err;
    apr_bucket_brigade *pending;
    void *in_buf;        /* dynamic: malloc'd body buffer */
    iwarp_mr *in_mr;     /* the local buffer's registration */
} rdma_req;

static void release_map(void *m, size_t len);

/* Releases everything a request registered or mapped, on every path. */
static apr_status_t req_cleanup(void *d)
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
static const char *header_safe(apr_pool_t *p, const char *s)
{
    char *c = apr_pstrdup(p, s), *q;
    for (q = c; *q; q++)
        if (apr_iscntrl(*q))
            *q = ' ';
    return c;
}

static int refuse(request_rec *r, int status, const char *why)
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

static void connect_back_failed(const char *client)
{
    unsigned *n = fail_slot(client, apr_time_now(), 1);
    ++*n;
}

/* A client that connects back successfully starts over. */
static void connect_back_succeeded(const char *client)
{
    unsigned *n = fail_slot(client, apr_time_now(), 0);
    if (n)
        *n = 0;
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
    if ((st = conn_ensure(rc, r, q->h.ip, q->h.port, &why)) != OK)
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

/* ---- RDMA_OUT ----------------------------------------------------------- */

/* Replace the response with an error naming the problem; later body
 * buckets are dropped. */
static apr_status_t out_error_log(ap_filter_t *f, int status, const char *why, const char *detail)
{
    request_rec *r = f->r;
    rdma_req *q = f->ctx;
    apr_bucket_brigade *bb = apr_brigade_create(r->pool, r->connection->bucket_alloc);
    const char *body;
    why = header_safe(r->pool, why);
    body = apr_pstrcat(r->pool, "mod_rdma: ", why, "\n", NULL);
    ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, "mod_rdma: GET %s (%s): %s; answering %d%s%s",
                  r->uri, scheme_names[q->h.scheme], why, status, detail ? "; " : "",
                  detail ? detail : "");
    q->out_state = OUT_DISCARD;
    r->status = status;
    r->status_line = NULL;
    apr_table_unset(r->headers_out, "Content-Encoding");
    apr_table_unset(r->headers_out, "ETag");
    apr_table_unset(r->headers_out, "Last-Modified");
    apr_table_setn(r->headers_out, "RDMA-Error", why);
    ap_set_content_type(r, "text/plain; charset=utf-8");
    ap_set_content_length(r, (apr_off_t)strlen(body));
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_pool_create(body, strlen(body), r->pool,
                                                       r->connection->bucket_alloc));
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_eos_create(r->connection->bucket_alloc));
    return ap_pass_brigade(f->next, bb);
}

static apr_status_t out_error(ap_filter_t *f, int status, const char *why)
{
    return out_error_log(f, status, why, NULL);
}

/* Give up on the RDMA connection after a transfer error: the worker
 * continues, the buffers go with the request pool. */
static apr_status_t out_fail(ap_filter_t *f, const char *why)
{
    rdma_req *q = f->ctx;
    ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, f->r,
                  "mod_rdma: RDMA transfer to %s:%u failed: %s; RDMA connection closed, buffer "
                  "released", q->rc->ip, q->rc->port, why);
    conn_drop_qp(q->rc);
    req_cleanup(q);
    f->r->connection->keepalive = AP_CONN_CLOSE;
    return out_error(f, HTTP_BAD_GATEWAY, why);
}

static const char *flush_bounce(ap_filter_t *f, int wait)
{
    rdma_req *q = f->ctx;
    const char *e = NULL;
    if (!q->fill)
        return NULL;
    if (!wait && q->fill <= XFER_CHUNK) {
        /* The last piece: post it unsignaled; the DONE Send that follows
         * is waited for, and an error of this Write completes (with its
         * error status) ahead of it. Saves one completion round trip. */
        iwarp_sge sge;
        sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(g_static_mr);
        sge.length = (uint32_t)q->fill;
        sge.lkey = iwarp_mr_lkey(g_static_mr);
        if (iwarp_post_send(q->rc->qp, 8, IWARP_WR_RDMA_WRITE, &sge, 1,
                            q->h.to + (q->total - q->fill), q->h.stag, 0, 0) != IWARP_OK)
            e = apr_pstrcat(f->r->pool, "posting the RDMA Write failed: ", iwarp_err(f->r->pool),
                            NULL);
        q->fill = 0;
        return e;
    }
    e = xfer(q->rc, f->r, IWARP_WR_RDMA_WRITE, (uint64_t)(uintptr_t)iwarp_mr_addr(g_static_mr),
             q->fill, iwarp_mr_lkey(g_static_mr), q->h.to + (q->total - q->fill), q->h.stag);
    q->fill = 0;
    return e;
}

/* server-writes, dynamic: write straight from where the bytes are. */
static const char *write_in_place(ap_filter_t *f, const void *p, apr_size_t len)
{
    rdma_req *q = f->ctx;
    iwarp_mr *mr;
    const char *e;
    if (iwarp_reg_mr(g_pd, (void *)p, len, 0, &mr) != IWARP_OK)
        return apr_pstrcat(f->r->pool, "registering the body failed: ", iwarp_err(f->r->pool), NULL);
    e = xfer(q->rc, f->r, IWARP_WR_RDMA_WRITE, (uint64_t)(uintptr_t)p, len, iwarp_mr_lkey(mr),
             q->h.to + q->total, q->h.stag);
    iwarp_dereg_mr(mr);
    return e;
}

static void drain_body(apr_bucket_brigade *bb);

/* A file bucket's file could not be read at bucket offset `at` (err: the
 * errno, or 0 for an end of file before the bucket's end). Returns the
 * cause for the client (no server path in it); *detail gets what only the
 * log shows: the file's path and the fix. */
static const char *file_fault(request_rec *r, apr_bucket *b, int fd, apr_size_t at, int err,
                              const char **detail)
{
    apr_bucket_file *fb = b->data;
    const char *name = NULL;
    struct stat st;
    apr_off_t pos = b->start + (apr_off_t)at, end = b->start + (apr_off_t)b->length;
    if (apr_file_name_get(&name, fb->fd) != APR_SUCCESS || !name)
        name = r->filename ? r->filename : "(unknown file)";
    if (err) {
        char eb[160];
        apr_strerror(APR_FROM_OS_ERROR(err), eb, sizeof eb);
        *detail = apr_psprintf(r->pool, "file %s. Fix: check the file and the file system or "
                               "disk it is on (dmesg)", name);
        return apr_psprintf(r->pool, "reading the file failed at byte %" APR_OFF_T_FMT ": %s",
                            pos, eb);
    }
    *detail = apr_psprintf(r->pool, "file %s, now %s bytes. Fix: replace served files by "
                           "rename(2) (write the new version under another name, then rename "
                           "it over the old one) instead of truncating or rewriting them in place",
                           name, fstat(fd, &st) == 0 ? apr_off_t_toa(r->pool, st.st_size) : "?");
    return apr_psprintf(r->pool, "the file ends at byte %" APR_OFF_T_FMT ", before the %"
                        APR_OFF_T_FMT " bytes to send: it was truncated while being served; "
                        "fetch it again", pos, end);
}

/* Read [at, at+len) of a file bucket (bucket offsets) into dst with pread
 * (never through apr_bucket_read: at an early end of file that silently
 * shortens the body, and a file it maps kills the process with SIGBUS when
 * it was truncated). NULL, or the cause for the client and *detail. */
static const char *file_pread(request_rec *r, apr_bucket *b, apr_size_t at, char *dst,
                              apr_size_t len, const char **detail)
{
    apr_bucket_file *fb = b->data;
    apr_os_file_t fd;
    apr_size_t done = 0;
    if (apr_os_file_get(&fd, fb->fd) != APR_SUCCESS) {
        *detail = NULL;
        return "the file has no descriptor to read";
    }
    while (done < len) {
        ssize_t got = pread(fd, dst + done, len - done, (off_t)(b->start + at + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return file_fault(r, b, fd, at + done, got < 0 ? errno : 0, detail);
        done += (apr_size_t)got;
    }
    return NULL;
}

/* ---- the mapping cache (dynamic registration) -------------------------
 *
 * Mapping a 1 MB file and unmapping it again cost about as much as the
 * rest of a loopback GET (page-table set-up, and at munmap the teardown
 * and a TLB shoot-down to the CPUs the stack's threads ran on). A worker
 * therefore keeps its recent mappings: an entry is found again only for the
 * same file (device and inode), the same size and modification time as a
 * fresh fstat of the request's descriptor shows, and the same range, so a
 * file that was rewritten, truncated or replaced is mapped anew; stale
 * entries age out. The mappings are PROT_READ and MAP_SHARED (the page
 * cache itself, as plain Apache's EnableMMAP uses), so nothing is copied
 * or pinned. Prefork workers are single-threaded (post_config refuses a
 * threaded MPM), so the cache needs no lock. */
#define MAPCACHE_SLOTS 16
#define MAPCACHE_MAX_ENTRY (64u << 20)
#define MAPCACHE_MAX_TOTAL (256u << 20)
/* An entry unused this long is unmapped at the worker's next lookup, so a
 * deleted or replaced file's old pages (and disk space) are not held for
 * long by a worker that keeps serving other files. */
#define MAPCACHE_IDLE apr_time_from_sec(30)

typedef struct {
    void *map;
    size_t len;
    dev_t dev;
    ino_t ino;
    off_t size, base;
    struct timespec mtime;
    unsigned long used; /* LRU clock; 0 = free slot */
    apr_time_t last;    /* when it was last used */
} map_ent;

static map_ent g_maps[MAPCACHE_SLOTS];
static size_t g_map_bytes;
static unsigned long g_map_clock;

static int map_cached(const void *m)
{
    int i;
    for (i = 0; i < MAPCACHE_SLOTS; i++)
        if (g_maps[i].used && g_maps[i].map == m)
            return 1;
    return 0;
}

/* Give back a mapping from map_file: cached ones stay mapped. */
static void release_map(void *m, size_t len)
{
    if (m && !map_cached(m))
        munmap(m, len);
}

static void map_evict(int i)
{
    munmap(g_maps[i].map, g_maps[i].len);
    g_map_bytes -= g_maps[i].len;
    memset(&g_maps[i], 0, sizeof g_maps[i]);
}

static void *map_lookup(const struct stat *st, off_t base, size_t len)
{
    int i;
    apr_time_t now = apr_time_now();
    for (i = 0; i < MAPCACHE_SLOTS; i++)
        if (g_maps[i].used && now - g_maps[i].last > MAPCACHE_IDLE)
            map_evict(i);
    for (i = 0; i < MAPCACHE_SLOTS; i++) {
        map_ent *e = &g_maps[i];
        if (e->used && e->dev == st->st_dev && e->ino == st->st_ino && e->size == st->st_size &&
            e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec &&
            e->base == base && e->len == len) {
            e->used = ++g_map_clock;
            e->last = now;
            return e->map;
        }
    }
    return NULL;
}

/* Keep a new mapping if it is small enough, evicting the least recently
 * used entries (and entries of an older version of the same file). */
static void map_insert(const struct stat *st, off_t base, size_t len, void *m)
{
    int i, lru;
    if (len > MAPCACHE_MAX_ENTRY)
        return;
    for (i = 0; i < MAPCACHE_SLOTS; i++)
        if (g_maps[i].used && g_maps[i].dev == st->st_dev && g_maps[i].ino == st->st_ino &&
            (g_maps[i].size != st->st_size || g_maps[i].mtime.tv_sec != st->st_mtim.tv_sec ||
             g_maps[i].mtime.tv_nsec != st->st_mtim.tv_nsec))
            map_evict(i);
    for (;;) {
        int free_slot = -1;
        lru = -1;
        for (i = 0; i < MAPCACHE_SLOTS; i++) {
            if (!g_maps[i].used)
                free_slot = i;
            else if (lru < 0 || g_maps[i].used < g_maps[lru].used)
                lru = i;
        }
        if (free_slot >= 0 && g_map_bytes + len <= MAPCACHE_MAX_TOTAL) {
            map_ent *e = &g_maps[free_slot];
            e->map = m;
            e->len = len;
            e->dev = st->st_dev;
            e->ino = st->st_ino;
            e->size = st->st_size;
            e->base = base;
            e->mtime = st->st_mtim;
            e->used = ++g_map_clock;
            e->last = apr_time_now();
            g_map_bytes += len;
            return;
        }
        if (lru < 0)
            return;
        map_evict(lru);
    }
}

/* Map a file bucket's range (dynamic registration). NULL with *why NULL:
 * mapping is not possible, read the bucket instead; NULL with *why set: the
 * file is shorter than the bucket (truncated since the request began) --
 * touching such a mapping past the end of the file raises SIGBUS. */
static void *map_file(request_rec *r, apr_bucket *b, size_t *map_len, size_t *delta,
                      const char **why, const char **detail)
{
    apr_bucket_file *fb = b->data;
    apr_os_file_t fd;
    long pg = sysconf(_SC_PAGESIZE);
    off_t start = (off_t)b->start, base = start - start % pg;
    struct stat st;
    void *m;
    *why = NULL;
    if (apr_os_file_get(&fd, fb->fd) != APR_SUCCESS || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return NULL;
    if (st.st_size < start + (off_t)b->length) {
        *why = file_fault(r, b, fd, st.st_size > start ? (apr_size_t)(st.st_size - start) : 0, 0,
                          detail);
        return NULL;
    }
    *delta = (size_t)(start - base);
    *map_len = *delta + (size_t)b->length;
    if ((m = map_lookup(&st, base, *map_len)) != NULL)
        return m;
    /* MAP_POPULATE: the RDMA Write reads every page at once; setting up the
     * page tables here is cheaper than taking the faults one by one inside
     * the socket copy. */
    m = mmap(NULL, *map_len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, base);
    if (m == MAP_FAILED)
        return NULL;
    map_insert(&st, base, *map_len, m);
    return m;
}

/* client-reads: room for `len` more body bytes at q->total -- the static
 * buffer while the body fits, else a heap buffer that grows by doubling but
 * never beyond the request's limit. NULL when memory runs out (*why says
 * how much was asked for); the caller releases the buffer. */
static char *collect_space(ap_filter_t *f, apr_size_t len, const char **why)
{
    rdma_req *q = f->ctx;
    apr_size_t need = (apr_size_t)q->total + len;
    if (q->mode == MODE_STATIC && g_static_mr && need <= iwarp_mr_length(g_static_mr) &&
        (q->body_in_static || q->total == 0)) {
        q->body_in_static = 1;
        return (char *)iwarp_mr_addr(g_static_mr) + q->total;
    }
    if (need > q->body_cap) {
        apr_size_t cap = q->body_cap ? q->body_cap : 64 * 1024;
        char *nb;
        while (cap < need && cap <= ((apr_size_t)-1) / 2)
            cap *= 2;
        if ((apr_uint64_t)cap > q->limit)
            cap = (apr_uint64_t)need > q->limit ? need : (apr_size_t)q->limit;
        if (cap < need)
            cap = need;
        /* Outgrowing the static buffer: continue in a heap buffer. */
        nb = q->body_in_static ? malloc(cap) : realloc(q->body, cap);
        if (!nb) {
            *why = apr_psprintf(f->r->pool, "out of memory collecting the body for client-reads: "
                                "a buffer of %" APR_SIZE_T_FMT " bytes could not be allocated (%"
                                APR_UINT64_T_FMT " bytes collected so far)",
                                cap, (apr_uint64_t)q->total);
            return NULL;
        }
        if (q->body_in_static) {
            memcpy(nb, iwarp_mr_addr(g_static_mr), (size_t)q->total);
            q->body_in_static = 0;
        }
        q->body = nb;
        q->body_cap = cap;
    }
    return q->body + q->total;
}

/* Memory ran out while collecting a client-reads body: release the buffer
 * at once, drop the rest of the body (a CGI can finish) and answer 503.
 * Nothing was sent on the RDMA connection; Apache closes the HTTP
 * connection after a 503, and the client retries on a new one. */
static apr_status_t out_oom(ap_filter_t *f, apr_bucket_brigade *bb, const char *why)
{
    rdma_req *q = f->ctx;
    req_cleanup(q);
    q->body_in_static = 0;
    q->body_cap = 0;
    drain_body(bb);
    return out_error_log(f, HTTP_SERVICE_UNAVAILABLE,
                         apr_pstrcat(f->r->pool, why, "; fetch it with server-writes or over "
                                     "plain HTTP", NULL),
                         "buffer released. Fix: large dynamic responses are better fetched with "
                         "server-writes (streamed through a fixed buffer); or lower RDMAMaxLength "
                         "so that client-reads bodies this large are refused, or raise the memory "
                         "limit of the Apache processes");
}

static apr_status_t out_finish(ap_filter_t *f)
{
    request_rec *r = f->r;
    rdma_req *q = f->ctx;
    apr_bucket_brigade *bb = apr_brigade_create(r->pool, r->connection->bucket_alloc);
    const char *e;
    apr_status_t rv;
    ctrl_msg m;
    if (q->h.scheme == S_SERVER_WRITES) {
        if (q->mode == MODE_STATIC && (e = flush_bounce(f, 0)) != NULL)
            return out_fail(f, e);
        /* A Write completes locally once handed to TCP: the DONE Send,
         * ordered after the Writes on the same stream, tells the client
         * that all of the body is placed (RFC 5040 section 5.5 ordering). */
        {
            ctrl_msg done = {MSG_DONE, q->h.stag, (uint32_t)(q->total > UINT32_MAX ? UINT32_MAX : q->total), 0, 0};
            if ((e = send_ctrl(q->rc, r, &done)) != NULL)
                return out_fail(f, e);
        }
        apr_table_setn(r->headers_out, "RDMA",
                       apr_psprintf(r->pool, "server-writes, length=%" APR_UINT64_T_FMT, q->total));
        ap_set_content_length(r, 0);
        APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_eos_create(r->connection->bucket_alloc));
        q->out_state = OUT_PASS;
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                      "mod_rdma: server-writes: %" APR_UINT64_T_FMT " bytes written", q->total);
        return ap_pass_brigade(f->next, bb);
    }
    /* client-reads: register the body for the client's RDMA Read. */
    {
        void *addr = q->map ? q->map
                   : q->body_in_static ? iwarp_mr_addr(g_static_mr)
                                       : q->body;
        uint64_t off = 0;
        if (q->map)
            off = (uint64_t)q->fill; /* page delta of the mapping */
        if (!addr) {
            addr = iwarp_mr_addr(g_static_mr ? g_static_mr : q->rc->ctrl);
        }
        if (iwarp_reg_mr(g_pd, (char *)addr + off, q->total ? (size_t)q->total : 1,
                         IWARP_ACCESS_REMOTE_READ, &q->win) != IWARP_OK)
            return out_fail(f, apr_pstrcat(r->pool, "registering the body failed: ",
                                           iwarp_err(r->pool), NULL));
        apr_table_setn(r->headers_out, "RDMA",
                       apr_psprintf(r->pool, "client-reads, stag=0x%x, to=0x%" APR_UINT64_T_HEX_FMT
                                    ", length=%" APR_UINT64_T_FMT,
                                    iwarp_mr_rkey(q->win),
                                    (apr_uint64_t)(uintptr_t)((char *)addr + off), q->total));
    }
    ap_set_content_length(r, 0);
    q->out_state = OUT_PASS;
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_eos_create(r->connection->bucket_alloc));
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_flush_create(r->connection->bucket_alloc));
    rv = ap_pass_brigade(f->next, bb);
    if (rv != APR_SUCCESS) {
        conn_drop_qp(q->rc);
        req_cleanup(q);
        return rv;
    }
    /* Hold the STag window open until the client's DONE (bounded). */
    e = recv_ctrl(q->rc, r, &m);
    if (!e && m.type != MSG_DONE)
        e = m.type == MSG_ABORT ? "the client aborted the read" : "expected DONE, got BUF";
    if (!e && m.stag != iwarp_mr_rkey(q->win))
        e = apr_psprintf(r->pool, "DONE names stag 0x%x, not the advertised 0x%x", m.stag,
                         iwarp_mr_rkey(q->win));
    if (e) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_rdma: client-reads of %s: %s; RDMA connection closed, buffer released",
                      r->uri, e);
        conn_drop_qp(q->rc);
        r->connection->keepalive = AP_CONN_CLOSE;
    } else {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                      "mod_rdma: client-reads: DONE for stag 0x%x, %u bytes; buffer released", m.stag,
                      m.length);
    }
    req_cleanup(q);
    return APR_SUCCESS;
}

/* After an error, read (and drop) the rest of the body instead of just
 * freeing it: a generator such as a CGI script must be able to finish
 * writing, or mod_cgi waits for its stderr until Timeout. File and mmap
 * buckets have no producer and are only freed. */
static void drain_body(apr_bucket_brigade *bb)
{
    apr_bucket *b;
    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb); b = APR_BUCKET_NEXT(b)) {
        const char *data;
        apr_size_t len;
        if (APR_BUCKET_IS_METADATA(b) || APR_BUCKET_IS_FILE(b) || APR_BUCKET_IS_MMAP(b) ||
            APR_BUCKET_IS_HEAP(b) || APR_BUCKET_IS_POOL(b) || APR_BUCKET_IS_TRANSIENT(b) ||
            APR_BUCKET_IS_IMMORTAL(b))
            continue;
        if (apr_bucket_read(b, &data, &len, APR_BLOCK_READ) != APR_SUCCESS)
            break;
    }
    apr_brigade_cleanup(bb);
}

static apr_status_t rdma_out_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    request_rec *r = f->r;
    rdma_req *q = f->ctx;
    apr_bucket *b;
    const char *e;
    if (q->out_state == OUT_PASS)
        return ap_pass_brigade(f->next, bb);
    if (q->out_state == OUT_DISCARD) {
        drain_body(bb);
        return APR_SUCCESS;
    }
    if (q->out_state == OUT_INIT) {
        apr_off_t len = -1;
        if (r->status != HTTP_OK || r->header_only) {
            /* Errors, redirects, 304: plain HTTP, untouched. */
            ap_remove_output_filter(f);
            return ap_pass_brigade(f->next, bb);
        }
        q->out_state = OUT_BODY;
        if (!APR_BRIGADE_EMPTY(bb) && APR_BUCKET_IS_EOS(APR_BRIGADE_LAST(bb)) &&
            apr_brigade_length(bb, 0, &len) == APR_SUCCESS && len >= 0 &&
            (apr_uint64_t)len > q->limit) {
            drain_body(bb);
            return out_error(f, HTTP_REQUEST_ENTITY_TOO_LARGE,
                             apr_psprintf(r->pool, "the body of %" APR_OFF_T_FMT " bytes exceeds "
                                          "maxlen %" APR_UINT64_T_FMT "; fetch it over plain HTTP",
                                          len, q->limit));
        }
        /* One file bucket + EOS in dynamic client-reads: map the file. */
        b = APR_BRIGADE_FIRST(bb);
        if (q->mode == MODE_DYNAMIC && q->h.scheme == S_CLIENT_READS && APR_BUCKET_IS_FILE(b) &&
            APR_BUCKET_NEXT(b) != APR_BRIGADE_SENTINEL(bb) && APR_BUCKET_IS_EOS(APR_BUCKET_NEXT(b)) &&
            b->length > 0) {
            size_t delta;
            const char *detail = NULL;
            q->map = map_file(r, b, &q->map_len, &delta, &e, &detail);
            if (e) {
                drain_body(bb);
                return out_error_log(f, HTTP_INTERNAL_SERVER_ERROR, e, detail);
            }
            if (q->map) {
                q->fill = delta;
                q->total = b->length;
                apr_brigade_cleanup(bb);
                return out_finish(f);
            }
        }
    }
    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb); b = APR_BUCKET_NEXT(b)) {
        const char *data, *detail = NULL;
        apr_size_t len;
        apr_status_t rv;
        if (APR_BUCKET_IS_EOS(b)) {
            apr_brigade_cleanup(bb);
            return out_finish(f);
        }
        if (APR_BUCKET_IS_FLUSH(b)) {
            if (q->h.scheme == S_SERVER_WRITES && q->mode == MODE_STATIC &&
                (e = flush_bounce(f, 1)) != NULL) {
                drain_body(bb);
                return out_fail(f, e);
            }
            continue;
        }
        if (APR_BUCKET_IS_METADATA(b))
            continue;
        if (b->length != (apr_size_t)-1 && q->total + b->length > q->limit) {
            drain_body(bb);
            return out_error(f, HTTP_REQUEST_ENTITY_TOO_LARGE,
                             apr_psprintf(r->pool, "the body exceeds maxlen %" APR_UINT64_T_FMT
                                          "; fetch it over plain HTTP", q->limit));
        }
        if (q->h.scheme == S_SERVER_WRITES && q->mode == MODE_DYNAMIC && APR_BUCKET_IS_FILE(b) &&
            b->length > 0) {
            size_t map_len, delta;
            void *m = map_file(r, b, &map_len, &delta, &e, &detail);
            if (e) {
                drain_body(bb);
                return out_error_log(f, HTTP_INTERNAL_SERVER_ERROR, e, detail);
            }
            if (m) {
                e = write_in_place(f, (char *)m + delta, b->length);
                release_map(m, map_len);
                if (e) {
                    drain_body(bb);
                    return out_fail(f, e);
                }
                q->total += b->length;
                continue;
            }
        }
        if (APR_BUCKET_IS_FILE(b) && b->length > 0) {
            /* Files are read with pread: straight into the static buffer
             * (server-writes, static), into the collected body
             * (client-reads), or through a bounce buffer (server-writes,
             * dynamic, when the file cannot be mapped). */
            apr_size_t done = 0;
            while (done < b->length) {
                char *dst;
                apr_size_t n = b->length - done;
                if (q->h.scheme == S_CLIENT_READS) {
                    if ((dst = collect_space(f, n, &e)) == NULL)
                        return out_oom(f, bb, e);
                } else if (q->mode == MODE_STATIC) {
                    apr_size_t cap = iwarp_mr_length(g_static_mr);
                    if (n > cap - q->fill)
                        n = cap - q->fill;
                    dst = (char *)iwarp_mr_addr(g_static_mr) + q->fill;
                } else {
                    if (!q->bounce) {
                        q->bounce = malloc(BOUNCE_LEN);
                        if (!q->bounce) {
                            drain_body(bb);
                            return out_error(f, HTTP_SERVICE_UNAVAILABLE,
                                             "out of memory for a bounce buffer");
                        }
                    }
                    if (n > BOUNCE_LEN)
                        n = BOUNCE_LEN;
                    dst = q->bounce;
                }
                if ((e = file_pread(r, b, done, dst, n, &detail)) != NULL) {
                    drain_body(bb);
                    return out_error_log(f, HTTP_INTERNAL_SERVER_ERROR, e, detail);
                }
                if (q->h.scheme == S_SERVER_WRITES && q->mode == MODE_DYNAMIC &&
                    (e = write_in_place(f, dst, n)) != NULL) { /* at q->total */
                    drain_body(bb);
                    return out_fail(f, e);
                }
                q->total += n;
                done += n;
                if (q->h.scheme == S_SERVER_WRITES && q->mode == MODE_STATIC) {
                    q->fill += n; /* flush_bounce writes it at q->total - q->fill */
                    if (q->fill == iwarp_mr_length(g_static_mr) &&
                        (e = flush_bounce(f, 1)) != NULL) {
                        drain_body(bb);
                        return out_fail(f, e);
                    }
                }
            }
            continue;
        }
        if ((rv = apr_bucket_read(b, &data, &len, APR_BLOCK_READ)) != APR_SUCCESS) {
            char eb[160];
            drain_body(bb);
            apr_strerror(rv, eb, sizeof eb);
            return out_error(f, HTTP_INTERNAL_SERVER_ERROR,
                             apr_pstrcat(r->pool, "reading the response body failed: ", eb, NULL));
        }
        if (q->total + len > q->limit) {
            drain_body(bb);
            return out_error(f, HTTP_REQUEST_ENTITY_TOO_LARGE,
                             apr_psprintf(r->pool, "the body exceeds maxlen %" APR_UINT64_T_FMT
                                          "; fetch it over plain HTTP", q->limit));
        }
        if (q->h.scheme == S_SERVER_WRITES && q->mode == MODE_STATIC) {
            apr_size_t cap = iwarp_mr_length(g_static_mr), done = 0;
            while (done < len) {
                apr_size_t n = len - done < cap - q->fill ? len - done : cap - q->fill;
                memcpy((char *)iwarp_mr_addr(g_static_mr) + q->fill, data + done, n);
                q->fill += n;
                q->total += n;
                done += n;
                if (q->fill == cap && (e = flush_bounce(f, 1)) != NULL) {
                    drain_body(bb);
                    return out_fail(f, e);
                }
            }
        } else if (q->h.scheme == S_SERVER_WRITES) {
            if (len && (e = write_in_place(f, data, len)) != NULL) {
                drain_body(bb);
                return out_fail(f, e);
            }
            q->total += len;
        } else {
            char *dst;
            if (len && (dst = collect_space(f, len, &e)) == NULL)
                return out_oom(f, bb, e);
            if (len)
                memcpy(dst, data, len);
            q->total += len;
        }
    }
    apr_brigade_cleanup(bb);
    return APR_SUCCESS;
}

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

static apr_status_t rdma_in_filter(ap_filter_t *f, apr_bucket_brigade *bb, ap_input_mode_t mode,
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

/* ---- registration --------------------------------------------------------- */

static void register_hooks(apr_pool_t *p)
{
    (void)p;
    ap_hook_post_config(post_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_init(child_init, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_pre_connection(pre_connection, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_fixups(rdma_fixups, NULL, NULL, APR_HOOK_LAST);
    ap_hook_insert_filter(rdma_insert_filter, NULL, NULL, APR_HOOK_MIDDLE);
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
