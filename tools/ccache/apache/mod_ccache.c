/*
 * mod_ccache: the application server's side of the strongly coherent cache
 * (issue 13, docs/CACHE.md), as a loadable module for an unmodified Apache
 * httpd 2.4.
 *
 * For every request under `CCache On` whose last path segment is a
 * document number n, the module takes a read of document n from ccappd
 * before the handler runs, and gives it back after the response was sent:
 *
 *   fixups hook:      READ_REQUEST(n)  ->  READ_PROCEED(n, version)
 *                     (waits while an update of n is queued or running)
 *                     sets X-CC-Doc-Version: version
 *   handler:          any (static file, CGI, ...), unchanged
 *   CCACHE_SNAPSHOT:  output filter: copies file, mmap and pipe data into
 *                     heap buckets while the read is held
 *   request pool end: READ_DONE(n)
 *
 * so the document cannot change while it is served, and the proxy learns
 * the version it was read under. The snapshot filter is needed because
 * httpd may write a response after the request pool is gone: the core
 * output filter sets a short response aside on a keep-alive connection,
 * and a file bucket set aside is read only when it is written (sendfile,
 * or a shared mmap of the file). Without the filter, with EnableSendfile On,
 * test-cache.sh saw bodies that mixed two versions. If ccappd cannot be asked, the request
 * fails with 503 and no document is served. A document ccappd does not
 * know is 404. The IPC message is the 16-byte frame of
 * crates/ccache-proto/src/ipc.rs: "CC" | format 1 | kind | doc (BE u32) |
 * value (BE u64); its constants are in ccache_ipc.h, generated from there.
 *
 *   LoadModule ccache_module .../mod_ccache.so
 *   CCacheIPC /run/ccappd.sock      # ccappd --ipc
 *   CCacheTimeout 10000             # ms, bound on connect and each reply
 *   <Location /docs/>
 *       CCache On
 *   </Location>
 *
 * One unix-socket connection per request (a prefork child serves one
 * request at a time; the connection is the reader's identity at ccappd, and
 * closing it releases the read even if the child dies).
 */
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "apr_strings.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

module AP_MODULE_DECLARE_DATA ccache_module;

/* The frame's constants (length, magic, format, field offsets, kinds,
 * error codes) are generated from crates/ccache-proto/src/ipc.rs; the
 * codec below is checked against the shared vectors
 * crates/ccache-proto/vectors/ipc.txt by test/vectors.c. */
#include "ccache_ipc.h"

#define MSG_LEN CCACHE_IPC_MSG_LEN

typedef struct {
    const char *ipc;
    apr_interval_time_t timeout; /* 0: unset */
} srv_cfg;

typedef struct {
    int on; /* -1: unset */
} dir_cfg;

static void *create_srv(apr_pool_t *p, server_rec *s)
{
    return apr_pcalloc(p, sizeof(srv_cfg));
}

static void *merge_srv(apr_pool_t *p, void *basev, void *addv)
{
    srv_cfg *base = basev, *add = addv, *c = apr_pcalloc(p, sizeof(*c));
    c->ipc = add->ipc ? add->ipc : base->ipc;
    c->timeout = add->timeout ? add->timeout : base->timeout;
    return c;
}

static void *create_dir(apr_pool_t *p, char *dir)
{
    dir_cfg *c = apr_pcalloc(p, sizeof(*c));
    c->on = -1;
    return c;
}

static void *merge_dir(apr_pool_t *p, void *basev, void *addv)
{
    dir_cfg *base = basev, *add = addv, *c = apr_pcalloc(p, sizeof(*c));
    c->on = add->on != -1 ? add->on : base->on;
    return c;
}

static const char *set_ipc(cmd_parms *cmd, void *d, const char *arg)
{
    srv_cfg *c = ap_get_module_config(cmd->server->module_config, &ccache_module);
    if (strlen(arg) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return "CCacheIPC: socket path too long for a unix socket (at most 107 bytes)";
    c->ipc = arg;
    return NULL;
}

static const char *set_timeout(cmd_parms *cmd, void *d, const char *arg)
{
    srv_cfg *c = ap_get_module_config(cmd->server->module_config, &ccache_module);
    char *end = NULL;
    long ms = strtol(arg, &end, 10);
    if (!end || *end || ms <= 0 || ms > 3600000)
        return "CCacheTimeout: milliseconds between 1 and 3600000";
    c->timeout = apr_time_from_msec(ms);
    return NULL;
}

static const char *set_on(cmd_parms *cmd, void *d, int flag)
{
    ((dir_cfg *)d)->on = flag;
    return NULL;
}

static const command_rec ccache_cmds[] = {
    AP_INIT_TAKE1("CCacheIPC", set_ipc, NULL, RSRC_CONF,
                  "ccappd's IPC unix socket (ccappd --ipc)"),
    AP_INIT_TAKE1("CCacheTimeout", set_timeout, NULL, RSRC_CONF,
                  "bound on the IPC connect and each reply, in ms (default 10000)"),
    AP_INIT_FLAG("CCache", set_on, NULL, OR_OPTIONS | ACCESS_CONF,
                 "On: serve each document here inside READ_REQUEST/READ_DONE"),
    {NULL}};

static void put_msg(unsigned char b[MSG_LEN], unsigned kind, uint32_t doc, uint64_t value)
{
    int i;
    b[CCACHE_IPC_OFF_MAGIC] = CCACHE_IPC_MAGIC_0;
    b[CCACHE_IPC_OFF_MAGIC + 1] = CCACHE_IPC_MAGIC_1;
    b[CCACHE_IPC_OFF_VERSION] = CCACHE_IPC_FORMAT_VERSION;
    b[CCACHE_IPC_OFF_KIND] = (unsigned char)kind;
    for (i = 0; i < CCACHE_IPC_DOC_LEN; i++) /* big endian */
        b[CCACHE_IPC_OFF_DOC + i] = (unsigned char)(doc >> (8 * (CCACHE_IPC_DOC_LEN - 1 - i)));
    for (i = 0; i < CCACHE_IPC_VALUE_LEN; i++)
        b[CCACHE_IPC_OFF_VALUE + i] = (unsigned char)(value >> (8 * (CCACHE_IPC_VALUE_LEN - 1 - i)));
}

/* 0 if b is a valid frame; its fields in *kind, *doc, *value. */
static int get_msg(const unsigned char b[MSG_LEN], unsigned *kind, uint32_t *doc, uint64_t *value)
{
    int i;
    if (b[CCACHE_IPC_OFF_MAGIC] != CCACHE_IPC_MAGIC_0 ||
        b[CCACHE_IPC_OFF_MAGIC + 1] != CCACHE_IPC_MAGIC_1 ||
        b[CCACHE_IPC_OFF_VERSION] != CCACHE_IPC_FORMAT_VERSION)
        return -1;
    *kind = b[CCACHE_IPC_OFF_KIND];
    *doc = 0;
    for (i = 0; i < CCACHE_IPC_DOC_LEN; i++)
        *doc = (*doc << 8) | b[CCACHE_IPC_OFF_DOC + i];
    *value = 0;
    for (i = 0; i < CCACHE_IPC_VALUE_LEN; i++)
        *value = (*value << 8) | b[CCACHE_IPC_OFF_VALUE + i];
    return 0;
}

/* What ccappd's reply b to READ_REQUEST(doc) means; what the request
 * does with it is in ccache_fixups. Pure (no I/O), so that the fuzz
 * harness (fuzz/ipc_fuzz.c, scripts/fuzz-ccache.sh) can run it on any
 * received bytes. *kind, *rdoc and *value are set unless REPLY_MALFORMED. */
enum reply {
    REPLY_PROCEED,          /* READ_PROCEED(doc): *value is the version */
    REPLY_MALFORMED,        /* not a frame (magic or format version) */
    REPLY_NO_SUCH_DOCUMENT, /* ERROR(no such document): 404 */
    REPLY_NOT_PERMITTED,    /* ERROR(not permitted): SO_PEERCRED refused */
    REPLY_BUSY,             /* ERROR(busy) */
    REPLY_REFUSED,          /* ERROR with another code (*value) */
    REPLY_UNEXPECTED,       /* another kind, or READ_PROCEED of another document */
};

static enum reply decode_reply(const unsigned char b[MSG_LEN], uint32_t doc, unsigned *kind,
                               uint32_t *rdoc, uint64_t *value)
{
    if (get_msg(b, kind, rdoc, value) != 0)
        return REPLY_MALFORMED;
    if (*kind == CCACHE_IPC_KIND_ERROR) {
        if (*value == CCACHE_IPC_ERR_NO_SUCH_DOCUMENT)
            return REPLY_NO_SUCH_DOCUMENT;
        if (*value == CCACHE_IPC_ERR_NOT_PERMITTED)
            return REPLY_NOT_PERMITTED;
        if (*value == CCACHE_IPC_ERR_BUSY)
            return REPLY_BUSY;
        return REPLY_REFUSED;
    }
    if (*kind != CCACHE_IPC_KIND_READ_PROCEED || *rdoc != doc)
        return REPLY_UNEXPECTED;
    return REPLY_PROCEED;
}

static int send_all(int fd, const unsigned char *b, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, unsigned char *b, size_t n)
{
    while (n > 0) {
        ssize_t k = recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = ECONNRESET;
            return -1;
        }
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The document number: the last path segment, digits only, below 2^32. */
static int doc_of(const char *uri, uint32_t *doc)
{
    const char *last = strrchr(uri, '/');
    uint64_t v = 0;
    const char *p = last ? last + 1 : uri;
    if (!*p)
        return -1;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > UINT32_MAX)
            return -1;
    }
    *doc = (uint32_t)v;
    return 0;
}

typedef struct {
    int fd;
    uint32_t doc;
    server_rec *s;
} held_read;

/* Request pool cleanup: the response has been sent; give the read back. */
static apr_status_t release_read(void *data)
{
    held_read *h = data;
    unsigned char b[MSG_LEN];
    put_msg(b, CCACHE_IPC_KIND_READ_DONE, h->doc, 0);
    if (send_all(h->fd, b, sizeof(b)) != 0)
        ap_log_error(APLOG_MARK, APLOG_WARNING, errno, h->s,
                     "mod_ccache: READ_DONE for document %u not sent; ccappd releases the read when the socket closes",
                     (unsigned)h->doc);
    close(h->fd);
    return APR_SUCCESS;
}

static int ccache_fixups(request_rec *r)
{
    dir_cfg *d = ap_get_module_config(r->per_dir_config, &ccache_module);
    srv_cfg *s = ap_get_module_config(r->server->module_config, &ccache_module);
    apr_interval_time_t t = s->timeout ? s->timeout : apr_time_from_sec(10);
    struct timeval tv;
    struct sockaddr_un sa;
    unsigned char b[MSG_LEN];
    unsigned kind;
    uint32_t doc, rdoc;
    uint64_t value;
    held_read *h;
    int fd;

    if (d->on != 1 || !ap_is_initial_req(r))
        return DECLINED; /* subrequests run inside the initial request's read */
    if (doc_of(r->uri, &doc) != 0) {
        ap_log_rerror(APLOG_MARK, APLOG_INFO, 0, r,
                      "mod_ccache: %s does not end in a document number", r->uri);
        return HTTP_NOT_FOUND;
    }
    if (!s->ipc) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_ccache: CCache On but no CCacheIPC; set CCacheIPC to ccappd's --ipc socket");
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, errno, r, "mod_ccache: socket() failed");
        return HTTP_SERVICE_UNAVAILABLE;
    }
    tv.tv_sec = (time_t)apr_time_sec(t);
    tv.tv_usec = (suseconds_t)apr_time_usec(t);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    apr_cpystrn(sa.sun_path, s->ipc, sizeof(sa.sun_path));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, errno, r,
                      "mod_ccache: ccappd unreachable at %s (is ccappd running with --ipc %s?); document %u not served",
                      s->ipc, s->ipc, (unsigned)doc);
        close(fd);
        return HTTP_SERVICE_UNAVAILABLE;
    }
    put_msg(b, CCACHE_IPC_KIND_READ_REQUEST, doc, 0);
    if (send_all(fd, b, sizeof(b)) != 0 || recv_all(fd, b, sizeof(b)) != 0) {
        ap_log_rerror(APLOG_MARK, APLOG_ERR, errno, r,
                      "mod_ccache: no READ_PROCEED for document %u from %s (ccappd died or held it longer than CCacheTimeout)",
                      (unsigned)doc, s->ipc);
        close(fd);
        return HTTP_SERVICE_UNAVAILABLE;
    }
    switch (decode_reply(b, doc, &kind, &rdoc, &value)) {
    case REPLY_PROCEED:
        break;
    case REPLY_MALFORMED:
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_ccache: malformed IPC reply from %s (not ccappd?)", s->ipc);
        close(fd);
        return HTTP_SERVICE_UNAVAILABLE;
    case REPLY_NO_SUCH_DOCUMENT:
        close(fd);
        return HTTP_NOT_FOUND;
    case REPLY_NOT_PERMITTED:
        close(fd);
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_ccache: ccappd at %s refused this server's user (SO_PEERCRED); run ccappd with --ipc-group or --ipc-allow-user for it",
                      s->ipc);
        return HTTP_SERVICE_UNAVAILABLE;
    case REPLY_BUSY:
        close(fd);
        ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r,
                      "mod_ccache: ccappd at %s is busy (--ipc-max-conns reached, or a version slot kept changing); document %u not served",
                      s->ipc, (unsigned)doc);
        return HTTP_SERVICE_UNAVAILABLE;
    case REPLY_REFUSED:
        close(fd);
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_ccache: ccappd refused document %u (error code %" APR_UINT64_T_FMT ")",
                      (unsigned)doc, (apr_uint64_t)value);
        return HTTP_SERVICE_UNAVAILABLE;
    case REPLY_UNEXPECTED:
    default:
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r,
                      "mod_ccache: ccappd answered kind %u for document %u to READ_REQUEST(%u)",
                      kind, (unsigned)rdoc, (unsigned)doc);
        close(fd);
        return HTTP_SERVICE_UNAVAILABLE;
    }
    h = apr_palloc(r->pool, sizeof(*h));
    h->fd = fd;
    h->doc = doc;
    h->s = r->server;
    apr_pool_cleanup_register(r->pool, h, release_read, apr_pool_cleanup_null);
    ap_add_output_filter("CCACHE_SNAPSHOT", NULL, r, r->connection);
    /* err_headers_out: kept whatever the handler does with headers_out
     * (a CGI's own headers replace those). */
    apr_table_setn(r->err_headers_out, "X-CC-Doc-Version",
                   apr_psprintf(r->pool, "%" APR_UINT64_T_FMT, (apr_uint64_t)value));
    return DECLINED;
}

/* Turn every data bucket whose bytes still live in the file (FILE, MMAP)
 * or in a pipe into a heap copy, while the request holds its read. */
static apr_status_t snapshot_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    apr_bucket *b = APR_BRIGADE_FIRST(bb);
    while (b != APR_BRIGADE_SENTINEL(bb)) {
        if (!APR_BUCKET_IS_METADATA(b) && !APR_BUCKET_IS_HEAP(b) && !APR_BUCKET_IS_POOL(b) &&
            !APR_BUCKET_IS_IMMORTAL(b) && !APR_BUCKET_IS_TRANSIENT(b)) {
            const char *data;
            apr_size_t len;
            /* Reading morphs a FILE or PIPE bucket into the bytes read
             * (HEAP or MMAP) followed by the rest, handled next. */
            apr_status_t rv = apr_bucket_read(b, &data, &len, APR_BLOCK_READ);
            if (rv != APR_SUCCESS) {
                ap_log_rerror(APLOG_MARK, APLOG_ERR, rv, f->r,
                              "mod_ccache: reading the response to snapshot it failed");
                return rv;
            }
            if (!APR_BUCKET_IS_HEAP(b)) {
                apr_bucket *h = apr_bucket_heap_create(data, len, NULL, f->c->bucket_alloc);
                APR_BUCKET_INSERT_BEFORE(b, h);
                apr_bucket_delete(b);
                b = h;
            }
        }
        b = APR_BUCKET_NEXT(b);
    }
    return ap_pass_brigade(f->next, bb);
}

static void ccache_hooks(apr_pool_t *p)
{
    ap_hook_fixups(ccache_fixups, NULL, NULL, APR_HOOK_LAST);
    ap_register_output_filter("CCACHE_SNAPSHOT", snapshot_filter, NULL, AP_FTYPE_CONTENT_SET);
}

AP_DECLARE_MODULE(ccache) = {
    STANDARD20_MODULE_STUFF,
    create_dir,
    merge_dir,
    create_srv,
    merge_srv,
    ccache_cmds,
    ccache_hooks,
};
