/* The shared IPC vectors (crates/ccache-proto/vectors/ipc.txt, format in
 * its README.md) against mod_ccache's own codec: put_msg, get_msg and
 * decode_reply, reached by including the module's source (the httpd calls
 * of the request path are stubs that abort; none is called here). The Rust
 * side runs the same file in `cargo test -p ccache-proto`
 * (tests/shared_vectors.rs). Built and run by scripts/test-cache-vectors.sh.
 *
 *   vectors FILE      exit 0 if every vector passes, 1 otherwise
 *
 * For `ok KIND doc=N value=N|code=CODE`: get_msg gives these fields,
 * put_msg of them gives the bytes, and decode_reply answers as mod_ccache
 * must (READ_PROCEED of the asked document proceeds, of another one is
 * unexpected; ERROR NO_SUCH_DOCUMENT is 404, BUSY busy, NOT_PERMITTED not
 * permitted, any other code refused). `err truncated`: fewer than
 * MSG_LEN bytes (recv_all would still wait); `err magic` / `err version`:
 * get_msg refuses, decode_reply says malformed; `err kind`: decoded, but
 * no kind the module knows, and decode_reply says unexpected. Kind and code
 * names are looked up in ccache_ipc.h's lists: a name the header does not
 * have fails the vector. */
#include "../mod_ccache.c"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

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

struct named { const char *name; uint64_t code; };
#define ENTRY(n, c) {#n, c},
static const struct named kinds[] = {CCACHE_IPC_KINDS(ENTRY)};
static const struct named errors[] = {CCACHE_IPC_ERRORS(ENTRY)};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int lookup(const struct named *t, size_t n, const char *name, uint64_t *code)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) {
            *code = t[i].code;
            return 0;
        }
    return -1;
}

static int number(const char *s, uint64_t *v)
{
    char *end = NULL;
    if (!*s || *s == '-')
        return -1;
    errno = 0;
    *v = strtoull(s, &end, 0);
    return errno || *end ? -1 : 0;
}

/* "key=" value of the words w[0..n), or NULL. */
static const char *field(char **w, int n, const char *key)
{
    size_t k = strlen(key);
    int i;
    for (i = 0; i < n; i++)
        if (!strncmp(w[i], key, k) && w[i][k] == '=')
            return w[i] + k + 1;
    return NULL;
}

static int hex(const char *s, unsigned char *out, size_t cap, size_t *len)
{
    size_t n = 0;
    int hi = -1;
    for (; *s; s++) {
        int d;
        if (isspace((unsigned char)*s))
            continue;
        if (!isxdigit((unsigned char)*s))
            return -1;
        d = isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
        if (hi < 0) {
            hi = d;
        } else {
            if (n == cap)
                return -1;
            out[n++] = (unsigned char)(hi << 4 | d);
            hi = -1;
        }
    }
    *len = n;
    return hi < 0 ? 0 : -1;
}

/* The reply decode_reply must give for ERROR(code). */
static enum reply error_reply(uint64_t code)
{
    switch (code) {
    case CCACHE_IPC_ERR_NO_SUCH_DOCUMENT:
        return REPLY_NO_SUCH_DOCUMENT;
    case CCACHE_IPC_ERR_BUSY:
        return REPLY_BUSY;
    case CCACHE_IPC_ERR_NOT_PERMITTED:
        return REPLY_NOT_PERMITTED;
    default:
        return REPLY_REFUSED;
    }
}

/* Check one vector; NULL if it passes, else why not. */
static const char *check(char **w, int nw, const unsigned char *b, size_t len)
{
    unsigned char enc[MSG_LEN];
    unsigned kind = 0, k2 = 0;
    uint32_t doc = 0, rdoc = 0;
    uint64_t value = 0, v2 = 0, want_kind, want_doc, want_value;
    const char *s;

    if (nw < 2)
        return "no verdict";
    if (!strcmp(w[0], "err")) {
        if (!strcmp(w[1], "truncated"))
            return len < MSG_LEN ? NULL : "not truncated: a whole frame would be read";
        if (len < MSG_LEN)
            return "short frame for a non-truncated err";
        if (!strcmp(w[1], "magic") || !strcmp(w[1], "version")) {
            if (get_msg(b, &kind, &doc, &value) != -1)
                return "get_msg accepted it";
            if (decode_reply(b, 7, &kind, &rdoc, &value) != REPLY_MALFORMED)
                return "decode_reply did not call it malformed";
            /* The two fields get_msg checks: which one is wrong. */
            if (!strcmp(w[1], "magic") == (b[0] == CCACHE_IPC_MAGIC_0 && b[1] == CCACHE_IPC_MAGIC_1))
                return "refused for the other reason";
            return NULL;
        }
        if (!strcmp(w[1], "kind")) {
            size_t i;
            if (get_msg(b, &kind, &doc, &value) != 0)
                return "get_msg refused the frame itself";
            for (i = 0; i < COUNT(kinds); i++)
                if (kinds[i].code == kind)
                    return "the header knows this kind";
            if (decode_reply(b, doc, &k2, &rdoc, &v2) != REPLY_UNEXPECTED)
                return "decode_reply did not call it unexpected";
            return NULL;
        }
        return "unknown err reason";
    }
    if (strcmp(w[0], "ok"))
        return "verdict neither ok nor err";
    if (len < MSG_LEN)
        return "ok vector shorter than a frame";
    if (lookup(kinds, COUNT(kinds), w[1], &want_kind) != 0)
        return "kind not in ccache_ipc.h";
    if (!(s = field(w, nw, "doc")) || number(s, &want_doc) != 0 || want_doc > UINT32_MAX)
        return "bad doc=";
    if ((s = field(w, nw, "value")) != NULL) {
        if (number(s, &want_value) != 0)
            return "bad value=";
    } else if ((s = field(w, nw, "code")) != NULL) {
        if (lookup(errors, COUNT(errors), s, &want_value) != 0 && number(s, &want_value) != 0)
            return "code= neither a name in ccache_ipc.h nor a number";
    } else {
        return "no value= or code=";
    }
    if (get_msg(b, &kind, &doc, &value) != 0)
        return "get_msg refused it";
    if (kind != want_kind || doc != want_doc || value != want_value)
        return "get_msg decoded other fields";
    put_msg(enc, (unsigned)want_kind, (uint32_t)want_doc, want_value);
    if (memcmp(enc, b, MSG_LEN))
        return "put_msg encoded other bytes";
    if (want_kind == CCACHE_IPC_KIND_ERROR) {
        if (decode_reply(b, (uint32_t)want_doc, &k2, &rdoc, &v2) != error_reply(want_value))
            return "decode_reply mapped the error code wrongly";
    } else if (want_kind == CCACHE_IPC_KIND_READ_PROCEED) {
        if (decode_reply(b, (uint32_t)want_doc, &k2, &rdoc, &v2) != REPLY_PROCEED || v2 != want_value)
            return "decode_reply did not proceed with the version";
        if (decode_reply(b, (uint32_t)want_doc + 1, &k2, &rdoc, &v2) != REPLY_UNEXPECTED)
            return "decode_reply proceeded on another document's READ_PROCEED";
    } else if (decode_reply(b, (uint32_t)want_doc, &k2, &rdoc, &v2) != REPLY_UNEXPECTED) {
        return "decode_reply accepted a kind ccappd does not answer a read with";
    }
    return NULL;
}

int main(int argc, char **argv)
{
    FILE *f;
    char line[1024];
    unsigned lineno = 0, passed = 0, failed = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: %s crates/ccache-proto/vectors/ipc.txt\n", argv[0]);
        return 2;
    }
    if (!(f = fopen(argv[1], "r"))) {
        perror(argv[1]);
        return 2;
    }
    while (fgets(line, sizeof line, f)) {
        char *bar, *p, *w[8], *name;
        int nw = 0;
        unsigned char b[64];
        size_t len;
        const char *why;
        lineno++;
        line[strcspn(line, "\r\n")] = 0;
        for (p = line; isspace((unsigned char)*p); p++)
            ;
        if (!*p || *p == '#')
            continue;
        if (!(bar = strchr(p, '|'))) {
            printf("FAIL ipc.txt:%u: no '|'\n", lineno);
            failed++;
            continue;
        }
        *bar = 0;
        name = strtok(p, " \t");
        while (nw < 8 && (w[nw] = strtok(NULL, " \t")) != NULL)
            nw++;
        if (!name || hex(bar + 1, b, sizeof b, &len) != 0) {
            printf("FAIL ipc.txt:%u: bad line\n", lineno);
            failed++;
            continue;
        }
        if ((why = check(w, nw, b, len)) != NULL) {
            printf("FAIL ipc.txt:%u %s: %s\n", lineno, name, why);
            failed++;
        } else {
            passed++;
        }
    }
    fclose(f);
    printf("ccache IPC vectors (C, mod_ccache): %u passed, %u failed\n", passed, failed);
    return failed || !passed;
}
