/* mod_rdma: response bodies (RDMA_OUT).
 *
 * The output filter of GET responses: server-writes (RDMA Writes into the
 * client's buffer, then DONE) and client-reads (register the body, answer
 * with its STag and hand the grant to the connection, expose.c), static
 * bounce buffer or dynamic
 * registration, and the mapping cache of dynamic registration. Over TLS
 * (seal.c) the body is collected, sealed, then written or granted. */
#include "mod_rdma_private.h"

APLOG_USE_MODULE(rdma);

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

/* Whether the body is collected in memory before it moves: client-reads
 * (registered once, then granted), and any body sealed under TLS
 * (seal.c: sealed as a whole, then written or granted). */
static int collecting(const rdma_req *q)
{
    return q->h.scheme == S_CLIENT_READS || q->seal;
}

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
    unsigned pins;      /* client-reads exposures still granting it (expose.c):
                         * a pinned entry is never unmapped */
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
void release_map(void *m, size_t len)
{
    if (m && !map_cached(m))
        munmap(m, len);
}

/* A client-reads exposure outlives its request (expose.c): a cached
 * mapping it grants must not be evicted (unmapped) until the exposure is
 * released. Returns 1 if `m` is cached (and now pinned), 0 if the caller
 * owns an uncached mapping (released with release_map). */
int map_pin(const void *m)
{
    int i;
    for (i = 0; i < MAPCACHE_SLOTS; i++)
        if (g_maps[i].used && g_maps[i].map == m) {
            g_maps[i].pins++;
            return 1;
        }
    return 0;
}

/* Undo map_pin; an uncached mapping is unmapped. */
void map_unpin(void *m, size_t len)
{
    int i;
    for (i = 0; i < MAPCACHE_SLOTS; i++)
        if (g_maps[i].used && g_maps[i].map == m) {
            if (g_maps[i].pins)
                g_maps[i].pins--;
            return;
        }
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
        if (g_maps[i].used && !g_maps[i].pins && now - g_maps[i].last > MAPCACHE_IDLE)
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
        if (g_maps[i].used && !g_maps[i].pins && g_maps[i].dev == st->st_dev &&
            g_maps[i].ino == st->st_ino && (g_maps[i].size != st->st_size || g_maps[i].mtime.tv_sec != st->st_mtim.tv_sec ||
             g_maps[i].mtime.tv_nsec != st->st_mtim.tv_nsec))
            map_evict(i);
    for (;;) {
        int free_slot = -1;
        lru = -1;
        for (i = 0; i < MAPCACHE_SLOTS; i++) {
            if (!g_maps[i].used)
                free_slot = i;
            else if (!g_maps[i].pins && (lru < 0 || g_maps[i].used < g_maps[lru].used))
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
            return; /* every entry is pinned: the caller keeps it uncached */
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
    /* The static buffer holds one granted body at a time (expose.c); a
     * body to be sealed is collected on the heap (seal_body writes the
     * sealed copy to a buffer of its own). */
    if (!q->seal && q->mode == MODE_STATIC && g_static_mr && need <= iwarp_mr_length(g_static_mr) &&
        (q->body_in_static || (q->total == 0 && !expo_holds_static(q->rc)))) {
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
    if (q->seal) {
        /* Seal the collected body (seal.c); the sealed copy replaces it. */
        char *ct;
        apr_uint64_t ct_len;
        static const char nothing[1];
        const char *src = q->map ? (const char *)q->map + q->fill /* page delta */
                        : q->body ? q->body
                                  : nothing;
        e = seal_body(r, q->seal, src, q->total, &ct, &ct_len);
        if (q->map) {
            release_map(q->map, q->map_len);
            q->map = NULL;
            q->fill = 0;
        }
        if (e)
            return out_error(f, HTTP_SERVICE_UNAVAILABLE,
                             apr_pstrcat(r->pool, e, "; fetch it over plain HTTPS", NULL));
        free(q->body);
        q->body = ct;
        q->body_cap = (apr_size_t)ct_len;
        q->seal->plain_len = q->total;
        if (q->h.scheme == S_SERVER_WRITES && ct_len > q->limit)
            return out_error(f, HTTP_REQUEST_ENTITY_TOO_LARGE,
                             apr_psprintf(r->pool, "the sealed body of %" APR_UINT64_T_FMT
                                          " bytes exceeds maxlen %" APR_UINT64_T_FMT "; fetch it "
                                          "over plain HTTPS", ct_len, q->limit));
        apr_table_setn(r->headers_out, "RDMA-Seal",
                       apr_psprintf(r->pool, "aes-256-gcm, id=%s, length=%" APR_UINT64_T_FMT,
                                    seal_hex(r->pool, q->seal->id, sizeof q->seal->id), q->total));
        q->total = 0;
        if (q->h.scheme == S_SERVER_WRITES && (e = write_in_place(f, ct, (apr_size_t)ct_len)) != NULL)
            return out_fail(f, e);
        q->total = ct_len;
    }
    if (q->h.scheme == S_SERVER_WRITES) {
        if (!q->seal && q->mode == MODE_STATIC && (e = flush_bounce(f, 0)) != NULL)
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
    /* client-reads: make room among the connection's grants (waiting for
     * DONEs of earlier bodies if the budget is spent), register the body
     * for the client's RDMA Read under a fresh STag, hand the grant to the
     * connection (expose.c) and answer; the worker does not wait for this
     * body's DONE, so it serves the next pipelined request at once. */
    if ((e = expo_make_room(q->rc, r, q->total, EXPO_GRANT)) != NULL)
        return out_fail(f, apr_pstrcat(r->pool, "waiting for the client's DONE of earlier bodies: ",
                                       e, NULL));
    {
        /* An empty body grants one byte that holds nothing of anyone's. */
        static char empty[1];
        void *addr = q->map ? q->map
                   : q->body_in_static ? iwarp_mr_addr(g_static_mr)
                   : q->body ? (void *)q->body
                             : (void *)empty;
        uint64_t off = 0;
        if (q->map)
            off = (uint64_t)q->fill; /* page delta of the mapping */
        if (iwarp_reg_mr(g_pd, (char *)addr + off, q->total ? (size_t)q->total : 1,
                         IWARP_ACCESS_REMOTE_READ, &q->win) != IWARP_OK)
            return out_fail(f, apr_pstrcat(r->pool, "registering the body failed: ",
                                           iwarp_err(r->pool), NULL));
        apr_table_setn(r->headers_out, "RDMA",
                       apr_psprintf(r->pool, "client-reads, stag=0x%x, to=0x%" APR_UINT64_T_HEX_FMT
                                    ", length=%" APR_UINT64_T_FMT,
                                    iwarp_mr_rkey(q->win),
                                    (apr_uint64_t)(uintptr_t)((char *)addr + off), q->total));
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r,
                      "mod_rdma: client-reads: granted stag 0x%x, %" APR_UINT64_T_FMT " bytes (%d "
                      "grants out)", iwarp_mr_rkey(q->win), q->total, q->rc->n_expo + 1);
    }
    /* From here the connection owns the body; it is released at the
     * client's DONE, the deadline, or the connection's end. */
    expo_add(q->rc, r, q);
    ap_set_content_length(r, 0);
    q->out_state = OUT_PASS;
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_eos_create(r->connection->bucket_alloc));
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_flush_create(r->connection->bucket_alloc));
    rv = ap_pass_brigade(f->next, bb);
    if (rv != APR_SUCCESS) {
        conn_drop_qp(q->rc);
        req_cleanup(q);
    }
    return rv;
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

apr_status_t rdma_out_filter(ap_filter_t *f, apr_bucket_brigade *bb)
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
        /* Also a body to seal (seal.c), which is sealed from the mapping
         * without collecting it first. */
        if (q->mode == MODE_DYNAMIC && collecting(q) && APR_BUCKET_IS_FILE(b) &&
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
            if (!collecting(q) && q->mode == MODE_STATIC && (e = flush_bounce(f, 1)) != NULL) {
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
        if (!collecting(q) && q->mode == MODE_DYNAMIC && APR_BUCKET_IS_FILE(b) &&
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
                if (collecting(q)) {
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
                if (!collecting(q) && q->mode == MODE_DYNAMIC &&
                    (e = write_in_place(f, dst, n)) != NULL) { /* at q->total */
                    drain_body(bb);
                    return out_fail(f, e);
                }
                q->total += n;
                done += n;
                if (!collecting(q) && q->mode == MODE_STATIC) {
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
        if (!collecting(q) && q->mode == MODE_STATIC) {
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
        } else if (!collecting(q)) {
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
