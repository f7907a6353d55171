/* libFuzzer target: mod_ccache's reading of ccappd's IPC reply
 * (tools/ccache/apache/mod_ccache.c: recv_all, then decode_reply, which
 * ccache_fixups runs on the answer to every READ_REQUEST). The input is the
 * byte stream ccappd (or whatever listens on CCacheIPC) sends before it
 * closes the connection, of any length; the request was READ_REQUEST(7)
 * (HARNESS_DOC). The frame is crates/ccache-proto/src/ipc.rs's: "CC" |
 * format 1 | kind | doc (BE u32) | value (BE u64), 16 bytes.
 *
 * recv() is replaced by one that hands out the input in pieces of 1 to 5
 * bytes with an EINTR before every third piece, then end of stream, so
 * that recv_all's gathering loop is exercised too. Besides crashes and
 * sanitizer reports it checks the contract against a model written from
 * ipc.rs: fewer than 16 bytes is a failed receive (ECONNRESET) and never
 * decoded; the module reads exactly 16 bytes and no more (the connection
 * carries READ_DONE afterwards); a wrong magic or format version is
 * MALFORMED; ERROR(1) is 404, ERROR(5) busy, ERROR(6) not permitted, any
 * other code refused, whatever the document; only READ_PROCEED(7) proceeds,
 * with the frame's value as the version; a decoded frame encodes back to
 * the same bytes (put_msg). Built and run by scripts/fuzz-ccache.sh.
 *
 * The module's static functions are reached by including its source (as
 * scripts/sanitize.sh's c-ccache part does); the httpd functions it calls
 * on the request path are stubs, never called here. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

static ssize_t fuzz_recv(int fd, void *buf, size_t n, int flags);
#define recv fuzz_recv
#include "../mod_ccache.c"
#undef recv

#define NOT_HERE abort()
ap_filter_t *ap_add_output_filter(const char *n, void *x, request_rec *r, conn_rec *c)
{ (void)n; (void)x; (void)r; (void)c; NOT_HERE; }
void ap_hook_fixups(ap_HOOK_fixups_t *pf, const char *const *pre, const char *const *succ, int order)
{ (void)pf; (void)pre; (void)succ; (void)order; NOT_HERE; }
int ap_is_initial_req(request_rec *r) { (void)r; NOT_HERE; }
void ap_log_error_(const char *f, int l, int m, int lv, apr_status_t st, const server_rec *s, const char *fmt, ...)
{ (void)f; (void)l; (void)m; (void)lv; (void)st; (void)s; (void)fmt; NOT_HERE; }
void ap_log_rerror_(const char *f, int l, int m, int lv, apr_status_t st, const request_rec *r, const char *fmt, ...)
{ (void)f; (void)l; (void)m; (void)lv; (void)st; (void)r; (void)fmt; NOT_HERE; }
apr_status_t ap_pass_brigade(ap_filter_t *f, apr_bucket_brigade *bb) { (void)f; (void)bb; NOT_HERE; }
ap_filter_rec_t *ap_register_output_filter(const char *n, ap_out_filter_func f, ap_init_filter_func i, ap_filter_type t)
{ (void)n; (void)f; (void)i; (void)t; NOT_HERE; }

#define HARNESS_DOC 7u
#define FAKE_FD 1000

#define CHECK(c)                                                                \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "ipc_fuzz: check failed: %s (line %d)\n", #c,      \
                    __LINE__);                                                  \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* The stream: the input, in a buffer of exactly its size (so that
 * AddressSanitizer sees a read beyond what was sent). */
static const unsigned char *stream;
static size_t stream_len, stream_pos;
static unsigned recv_calls;

static ssize_t fuzz_recv(int fd, void *buf, size_t n, int flags)
{
    size_t k;
    CHECK(fd == FAKE_FD && flags == 0 && n > 0 && n <= MSG_LEN);
    recv_calls++;
    if (recv_calls % 3 == 0) {
        errno = EINTR;
        return -1;
    }
    if (stream_pos == stream_len)
        return 0;
    k = stream_len - stream_pos;
    if (k > 1 + recv_calls % 5)
        k = 1 + recv_calls % 5;
    if (k > n)
        k = n;
    memcpy(buf, stream + stream_pos, k);
    stream_pos += k;
    return (ssize_t)k;
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    int i;
    for (i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char *copy, b[MSG_LEN], enc[MSG_LEN];
    unsigned kind = 0x5a5a;
    uint32_t rdoc = 0x5a5a5a5a;
    uint64_t value = 0x5a5a5a5a5a5a5a5aULL, mvalue;
    enum reply got, want;
    int rc;

    copy = malloc(size ? size : 1);
    CHECK(copy != NULL);
    memcpy(copy, data, size);
    stream = copy;
    stream_len = size;
    stream_pos = 0;
    recv_calls = 0;
    memset(b, 0xa5, sizeof b);
    errno = 0;
    rc = recv_all(FAKE_FD, b, sizeof b);
    if (size < MSG_LEN) {
        /* The peer closed mid-frame: 503, nothing decoded. */
        CHECK(rc == -1 && errno == ECONNRESET);
        CHECK(stream_pos == size && !memcmp(b, copy, size));
        free(copy);
        return 0;
    }
    CHECK(rc == 0);
    CHECK(stream_pos == MSG_LEN); /* not one byte of what follows */
    CHECK(!memcmp(b, copy, MSG_LEN));

    /* The model, from crates/ccache-proto/src/ipc.rs (its constants from
     * ccache_ipc.h, which is generated from ipc.rs). */
    mvalue = be(b + CCACHE_IPC_OFF_VALUE, CCACHE_IPC_VALUE_LEN);
    if (b[0] != CCACHE_IPC_MAGIC_0 || b[1] != CCACHE_IPC_MAGIC_1 || b[2] != CCACHE_IPC_FORMAT_VERSION)
        want = REPLY_MALFORMED;
    else if (b[3] == CCACHE_IPC_KIND_ERROR)
        want = mvalue == CCACHE_IPC_ERR_NO_SUCH_DOCUMENT ? REPLY_NO_SUCH_DOCUMENT
             : mvalue == CCACHE_IPC_ERR_BUSY          ? REPLY_BUSY
             : mvalue == CCACHE_IPC_ERR_NOT_PERMITTED ? REPLY_NOT_PERMITTED
                                                      : REPLY_REFUSED;
    else if (b[3] == CCACHE_IPC_KIND_READ_PROCEED && be(b + CCACHE_IPC_OFF_DOC, CCACHE_IPC_DOC_LEN) == HARNESS_DOC)
        want = REPLY_PROCEED;
    else
        want = REPLY_UNEXPECTED;

    got = decode_reply(b, HARNESS_DOC, &kind, &rdoc, &value);
    CHECK(got == want);
    CHECK(!memcmp(b, copy, MSG_LEN)); /* the reply is only read */
    if (got != REPLY_MALFORMED) {
        CHECK(kind == b[3] && rdoc == be(b + CCACHE_IPC_OFF_DOC, CCACHE_IPC_DOC_LEN) && value == mvalue);
        put_msg(enc, kind, rdoc, value);
        CHECK(!memcmp(enc, b, MSG_LEN));
    }
    if (got == REPLY_PROCEED)
        CHECK(rdoc == HARNESS_DOC && kind == CCACHE_IPC_KIND_READ_PROCEED);
    free(copy);
    return 0;
}
