/* libFuzzer target: mod_rdma's RDMA: header grammar (rdma_header.c) on
 * untrusted input. Besides crashes and sanitizer reports it checks that a
 * header that parses is within range and survives a round trip through
 * its canonical form. Built and run by scripts/fuzz-modrdma.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apr_general.h"
#include "apr_strings.h"

#include "../rdma_header.h"

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "rdma_header_fuzz: check failed: %s (line %d)\n", #c, \
                    __LINE__);                                                     \
            abort();                                                               \
        }                                                                          \
    } while (0)

static const char *canonical(apr_pool_t *p, const rdma_hdr *h)
{
    const char *s = scheme_names[h->scheme];
    if (h->have & K_IP)
        s = apr_pstrcat(p, s, ", ip=", h->ip, NULL);
    if (h->have & K_PORT)
        s = apr_psprintf(p, "%s, port=%u", s, h->port);
    if (h->have & K_STAG)
        s = apr_psprintf(p, "%s, stag=0x%x", s, h->stag);
    if (h->have & K_TO)
        s = apr_psprintf(p, "%s, to=0x%" APR_UINT64_T_HEX_FMT, s, (apr_uint64_t)h->to);
    if (h->have & K_MAXLEN)
        s = apr_psprintf(p, "%s, maxlen=%" APR_UINT64_T_FMT, s, (apr_uint64_t)h->maxlen);
    if (h->have & K_LENGTH)
        s = apr_psprintf(p, "%s, length=%" APR_UINT64_T_FMT, s, (apr_uint64_t)h->length);
    if (h->have & K_TOKEN)
        s = apr_psprintf(p, "%s, token=0x%016" APR_UINT64_T_HEX_FMT, s, (apr_uint64_t)h->token);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static apr_pool_t *root;
    apr_pool_t *p;
    rdma_hdr h, again;
    const char *err;
    char *value;
    if (!root) {
        apr_initialize();
        apr_pool_create(&root, NULL);
    }
    apr_pool_create(&p, root);
    /* An HTTP header value is a NUL-terminated string here. */
    value = apr_pcalloc(p, size + 1);
    memcpy(value, data, size);
    err = parse_header(p, value, &h);
    if (err) {
        CHECK(*err != 0);
    } else {
        const char *c = canonical(p, &h);
        CHECK(h.scheme >= 0 && h.scheme < 4);
        CHECK((h.have & ~127u) == 0);
        CHECK(!(h.have & K_PORT) || (h.port >= 1 && h.port <= 65535));
        CHECK(!(h.have & K_IP) || strlen(h.ip) < sizeof h.ip);
        if ((err = parse_header(p, c, &again)) != NULL)
            fprintf(stderr, "canonical \"%s\" of \"%s\": %s\n", c, value, err);
        CHECK(err == NULL);
        CHECK(again.scheme == h.scheme && again.have == h.have && again.port == h.port &&
              again.stag == h.stag && again.to == h.to && again.maxlen == h.maxlen &&
              again.length == h.length && again.token == h.token && !strcmp(again.ip, h.ip));
    }
    apr_pool_destroy(p);
    return 0;
}
