/* The RDMA: request header of mod_rdma: "SCHEME, key=value, ..." with the
 * keys ip, port, stag, to, maxlen, length and token (docs/MOD_RDMA.md, "The
 * RDMA: header"). Every value is checked here; the caller decides what the
 * addresses may be. */
#include "rdma_header.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "apr_lib.h"
#include "apr_strings.h"

const char *const scheme_names[4] = {"server-writes", "client-reads", "client-writes",
                                     "server-reads"};

static int parse_num(const char *v, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long n;
    int hex = v[0] == '0' && (v[1] == 'x' || v[1] == 'X');
    const char *d = hex ? v + 2 : v;
    if (!*d)
        return 0;
    for (const char *q = d; *q; q++)
        if (hex ? !apr_isxdigit(*q) : !apr_isdigit(*q))
            return 0;
    errno = 0;
    n = strtoull(d, &end, hex ? 16 : 10);
    if (errno || *end || n > max)
        return 0;
    *out = n;
    return 1;
}

/* Returns NULL or the problem, for a 400. */
const char *parse_header(apr_pool_t *p, const char *value, rdma_hdr *h)
{
    char *tok, *next;
    int first = 1;
    memset(h, 0, sizeof *h);
    /* Every element counts, empty ones too: the grammar has no empty list
     * elements (apr_strtok would skip them). */
    for (tok = apr_pstrdup(p, value); tok; tok = next) {
        char *k = tok, *v, *e;
        uint64_t n;
        unsigned bit;
        if ((next = strchr(tok, ',')))
            *next++ = 0;
        while (apr_isspace(*k))
            k++;
        for (e = k + strlen(k); e > k && apr_isspace(e[-1]); e--)
            *--e = 0;
        if (first) {
            int i;
            first = 0;
            if (!*k)
                return "the RDMA header is empty; it must start with a scheme";
            for (i = 0; i < 4; i++)
                if (!strcmp(k, scheme_names[i]))
                    break;
            if (i == 4)
                return apr_psprintf(p, "unknown scheme \"%s\"; use server-writes, client-reads, "
                                    "client-writes or server-reads", k);
            h->scheme = i;
            continue;
        }
        v = strchr(k, '=');
        if (!v)
            return apr_psprintf(p, "parameter \"%s\" is not of the form key=value", k);
        *v++ = 0;
        for (e = k + strlen(k); e > k && apr_isspace(e[-1]); e--)
            *--e = 0;
        while (apr_isspace(*v))
            v++;
        if (!strcmp(k, "ip")) bit = K_IP;
        else if (!strcmp(k, "port")) bit = K_PORT;
        else if (!strcmp(k, "stag")) bit = K_STAG;
        else if (!strcmp(k, "to")) bit = K_TO;
        else if (!strcmp(k, "maxlen")) bit = K_MAXLEN;
        else if (!strcmp(k, "length")) bit = K_LENGTH;
        else if (!strcmp(k, "token")) bit = K_TOKEN;
        else
            return apr_psprintf(p, "unknown parameter \"%s\"; known: ip, port, stag, to, maxlen, "
                                "length, token", k);
        if (h->have & bit)
            return apr_psprintf(p, "parameter \"%s\" appears twice", k);
        h->have |= bit;
        if (bit == K_IP) {
            unsigned char tmp[16];
            if (strlen(v) >= sizeof h->ip ||
                (inet_pton(AF_INET, v, tmp) != 1 && inet_pton(AF_INET6, v, tmp) != 1))
                return apr_psprintf(p, "parameter ip=\"%s\" is not an IP address literal", v);
            apr_cpystrn(h->ip, v, sizeof h->ip);
            continue;
        }
        if (!parse_num(v, bit == K_PORT ? 65535 : bit == K_STAG ? UINT32_MAX : UINT64_MAX, &n) ||
            (bit == K_PORT && n == 0))
            return apr_psprintf(p, "parameter %s=\"%s\" is not a valid value", k, v);
        switch (bit) {
        case K_PORT: h->port = (unsigned)n; break;
        case K_STAG: h->stag = (uint32_t)n; break;
        case K_TO: h->to = n; break;
        case K_MAXLEN: h->maxlen = n; break;
        case K_TOKEN: h->token = n; break;
        default: h->length = n; break;
        }
    }
    {
        static const unsigned need[4] = {K_IP | K_PORT | K_STAG | K_TO | K_MAXLEN, K_IP | K_PORT,
                                         K_IP | K_PORT | K_LENGTH,
                                         K_IP | K_PORT | K_STAG | K_TO | K_LENGTH};
        static const unsigned deny[4] = {K_LENGTH, K_STAG | K_TO | K_LENGTH,
                                         K_STAG | K_TO | K_MAXLEN, K_MAXLEN};
        /* token is optional everywhere: old clients send none. */
        static const char *const names[] = {"ip", "port", "stag", "to", "maxlen", "length"};
        int i;
        for (i = 0; i < 6; i++) {
            unsigned bit = 1u << i;
            if ((need[h->scheme] & bit) && !(h->have & bit))
                return apr_psprintf(p, "scheme %s needs the parameter %s",
                                    scheme_names[h->scheme], names[i]);
            if ((deny[h->scheme] & bit) && (h->have & bit))
                return apr_psprintf(p, "scheme %s does not take the parameter %s",
                                    scheme_names[h->scheme], names[i]);
        }
    }
    return NULL;
}

