/* Runs the shared test vectors (testdata/rdma-vectors, format in its
 * README.md) against mod_rdma's C codecs: the RDMA: header grammar
 * (rdma_header.c) and the control messages (wire.c). The Rust client runs
 * the same files (tools/rhttp). Built and run by
 * scripts/test-modrdma-vectors.sh.
 *
 *   vectors header.txt ctrl.txt
 *
 * Prints one line per failing vector and a summary; exit status 1 on any
 * failure. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apr_general.h"
#include "apr_strings.h"

#include "../rdma_header.h"
#include "../wire.h"

static int failures, total;

static void fail(const char *file, int line, const char *input, const char *why)
{
    failures++;
    printf("FAIL %s:%d: %s\n     input: %s\n", file, line, why, input);
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s)
        return 0;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return !errno && !*end;
}

/* The C parser's message names the problem; map it to a vector KIND. */
static const char *header_kind(const char *why)
{
    if (strstr(why, "is empty"))
        return "empty";
    if (!strncmp(why, "unknown scheme", 14))
        return "scheme";
    if (strstr(why, "not of the form key=value"))
        return "not-kv";
    if (!strncmp(why, "unknown parameter", 17))
        return "unknown-key";
    if (strstr(why, "appears twice"))
        return "duplicate";
    if (strstr(why, "is not a valid value") || strstr(why, "not an IP address literal"))
        return "bad-value";
    if (strstr(why, " needs the parameter "))
        return "missing";
    if (strstr(why, " does not take the parameter "))
        return "forbidden";
    return "?";
}

/* Undo the escapes \\ \t \v \f \xHH in place. */
static int unescape(char *s)
{
    char *o = s;
    while (*s) {
        if (*s != '\\') {
            *o++ = *s++;
            continue;
        }
        s++;
        switch (*s) {
        case '\\': *o++ = '\\'; s++; break;
        case 't': *o++ = '\t'; s++; break;
        case 'v': *o++ = '\v'; s++; break;
        case 'f': *o++ = '\f'; s++; break;
        case 'x': {
            char hex[3] = {0};
            if (!s[1] || !s[2])
                return 0;
            hex[0] = s[1];
            hex[1] = s[2];
            *o++ = (char)strtoul(hex, NULL, 16);
            s += 3;
            break;
        }
        default: return 0;
        }
    }
    *o = 0;
    return 1;
}

static int same_ip(const char *a, const char *b)
{
    unsigned char x[16], y[16];
    if (inet_pton(AF_INET, a, x) == 1)
        return inet_pton(AF_INET, b, y) == 1 && !memcmp(x, y, 4);
    return inet_pton(AF_INET6, a, x) == 1 && inet_pton(AF_INET6, b, y) == 1 && !memcmp(x, y, 16);
}

/* Compare a parsed header with "SCHEME key=value ..." (modified). */
static const char *check_header(apr_pool_t *p, char *want, const rdma_hdr *h)
{
    static const char *const names[] = {"ip", "port", "stag", "to", "maxlen", "length", "token"};
    char *last, *tok = apr_strtok(want, " ", &last);
    unsigned seen = 0;
    if (!tok || strcmp(tok, scheme_names[h->scheme]))
        return apr_psprintf(p, "parsed scheme %s", scheme_names[h->scheme]);
    while ((tok = apr_strtok(NULL, " ", &last))) {
        char *v = strchr(tok, '=');
        uint64_t n = 0, got;
        int i;
        if (!v)
            return apr_psprintf(p, "bad expectation \"%s\"", tok);
        *v++ = 0;
        for (i = 0; i < 7 && strcmp(tok, names[i]); i++)
            ;
        if (i == 7)
            return apr_psprintf(p, "bad expectation key \"%s\"", tok);
        seen |= 1u << i;
        if (!(h->have & (1u << i)))
            return apr_psprintf(p, "parameter %s missing from the parse", tok);
        if (i == 0) {
            if (!same_ip(v, h->ip))
                return apr_psprintf(p, "parsed ip=%s, expected %s", h->ip, v);
            continue;
        }
        if (!parse_u64(v, &n))
            return apr_psprintf(p, "bad expectation value \"%s\"", v);
        got = i == 1 ? h->port : i == 2 ? h->stag : i == 3 ? h->to : i == 4 ? h->maxlen
            : i == 5 ? h->length : h->token;
        if (got != n)
            return apr_psprintf(p, "parsed %s=%" APR_UINT64_T_FMT ", expected %s", tok,
                                (apr_uint64_t)got, v);
    }
    if (seen != h->have)
        return apr_psprintf(p, "parse has parameters 0x%x, expected 0x%x", h->have, seen);
    return NULL;
}

static void run_header(apr_pool_t *p, const char *file, int line, char *want, char *input)
{
    char *shown = apr_pstrdup(p, input);
    rdma_hdr h;
    const char *why;
    if (!unescape(input)) {
        fail(file, line, shown, "bad escape in the vector");
        return;
    }
    why = parse_header(p, input, &h);
    if (!strncmp(want, "ok", 2) && (want[2] == ' ' || !want[2])) {
        const char *e;
        if (why)
            fail(file, line, shown, apr_psprintf(p, "expected ok, refused: %s", why));
        else if ((e = check_header(p, want + 3, &h)))
            fail(file, line, shown, e);
    } else if (!strncmp(want, "err", 3) && (want[3] == ' ' || !want[3])) {
        const char *kind = want[3] ? want + 4 : "";
        if (!why)
            fail(file, line, shown, "expected an error, accepted");
        else if (*kind && strcmp(kind, header_kind(why)))
            fail(file, line, shown,
                 apr_psprintf(p, "expected %s, got %s: %s", kind, header_kind(why), why));
    } else {
        fail(file, line, shown, "bad verdict in the vector");
    }
}

static const char *ctrl_kind(const char *why)
{
    if (strstr(why, "wrong size"))
        return "length";
    if (strstr(why, "magic"))
        return "magic";
    if (strstr(why, "version"))
        return "version";
    if (strstr(why, "type"))
        return "type";
    return "?";
}

static void run_ctrl(apr_pool_t *p, const char *file, int line, char *want, char *input)
{
    unsigned char b[256], enc[MSG_LEN];
    size_t n = 0;
    const char *why;
    ctrl_msg m;
    for (const char *q = input; *q; q++) {
        char hex[3] = {0};
        if (*q == ' ')
            continue;
        if (!q[1] || n == sizeof b) {
            fail(file, line, input, "bad hex in the vector");
            return;
        }
        hex[0] = q[0];
        hex[1] = q[1];
        b[n++] = (unsigned char)strtoul(hex, NULL, 16);
        q++;
    }
    why = decode_msg(b, n, &m);
    if (!strncmp(want, "ok ", 3)) {
        static const char *const types[] = {"", "BUF", "DONE", "ABORT"};
        char *last, *tok = apr_strtok(want + 3, " ", &last);
        ctrl_msg w = {0};
        if (why) {
            fail(file, line, input, apr_psprintf(p, "expected ok, refused: %s", why));
            return;
        }
        for (w.type = MSG_BUF; w.type <= MSG_ABORT && strcmp(tok, types[w.type]); w.type++)
            ;
        while ((tok = apr_strtok(NULL, " ", &last))) {
            char *v = strchr(tok, '=');
            uint64_t x;
            if (!v || !parse_u64(v + 1, &x)) {
                fail(file, line, input, "bad expectation in the vector");
                return;
            }
            *v = 0;
            if (!strcmp(tok, "stag")) w.stag = (uint32_t)x;
            else if (!strcmp(tok, "length")) w.length = (uint32_t)x;
            else if (!strcmp(tok, "to")) w.to = x;
            else if (!strcmp(tok, "offset")) w.offset = x;
        }
        if (m.type != w.type || m.stag != w.stag || m.length != w.length || m.to != w.to ||
            m.offset != w.offset) {
            fail(file, line, input, "decoded fields differ from the expected ones");
            return;
        }
        encode_msg(enc, &w);
        b[6] = b[7] = 0;
        if (memcmp(enc, b, MSG_LEN))
            fail(file, line, input, "encoding the fields gives other bytes");
    } else if (!strncmp(want, "err ", 4)) {
        if (!why)
            fail(file, line, input, "expected an error, accepted");
        else if (strcmp(want + 4, ctrl_kind(why)))
            fail(file, line, input,
                 apr_psprintf(p, "expected %s, got %s: %s", want + 4, ctrl_kind(why), why));
    } else {
        fail(file, line, input, "bad verdict in the vector");
    }
}

static void run_file(apr_pool_t *p, const char *path, int ctrl)
{
    FILE *f = fopen(path, "r");
    char buf[4096];
    int line = 0;
    if (!f) {
        printf("FAIL cannot open %s: %s\n", path, strerror(errno));
        failures++;
        return;
    }
    while (fgets(buf, sizeof buf, f)) {
        char *sep;
        size_t len = strlen(buf);
        line++;
        if (len && buf[len - 1] == '\n')
            buf[--len] = 0;
        if (!len || buf[0] == '#')
            continue;
        sep = strstr(buf, " |");
        if (!sep) {
            fail(path, line, buf, "no \" |\" in the vector");
            continue;
        }
        *sep = 0;
        sep += 2;
        if (*sep == ' ')
            sep++;
        total++;
        if (ctrl)
            run_ctrl(p, path, line, buf, sep);
        else
            run_header(p, path, line, buf, sep);
        apr_pool_clear(p);
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    apr_pool_t *p;
    if (argc != 3) {
        fprintf(stderr, "usage: %s header.txt ctrl.txt\n", argv[0]);
        return 2;
    }
    apr_initialize();
    apr_pool_create(&p, NULL);
    run_file(p, argv[1], 0);
    run_file(p, argv[2], 1);
    printf("rdma-vectors (C): %d vectors, %d failed\n", total, failures);
    apr_terminate();
    return failures ? 1 : 0;
}
