/* The RDMA: request header of mod_rdma (docs/MOD_RDMA.md): its grammar,
 * apart from Apache so that it can be unit-tested and fuzzed alone. APR
 * only (pools and string helpers). */
#ifndef MOD_RDMA_RDMA_HEADER_H
#define MOD_RDMA_RDMA_HEADER_H

#include <stdint.h>

#include "apr_pools.h"

enum { S_SERVER_WRITES, S_CLIENT_READS, S_CLIENT_WRITES, S_SERVER_READS };
extern const char *const scheme_names[4];

/* Bits of rdma_hdr.have: which parameters the header carried. */
enum { K_IP = 1, K_PORT = 2, K_STAG = 4, K_TO = 8, K_MAXLEN = 16, K_LENGTH = 32, K_TOKEN = 64 };

typedef struct {
    int scheme;
    unsigned have;
    char ip[64];
    unsigned port;
    uint32_t stag;
    uint64_t to, maxlen, length;
    /* token: optional in every scheme (docs/MOD_RDMA.md, "The request
     * token"): a nonce the client chose for this request; the server
     * sends it back in the private data of its MPA Request when it
     * connects back, so the client can tell the server's connection from
     * an impostor's. */
    uint64_t token;
} rdma_hdr;

/* Parse the header `value` (untrusted) into `h`. Returns NULL, or the
 * problem (allocated from `p`) for a 400 response. */
const char *parse_header(apr_pool_t *p, const char *value, rdma_hdr *h);

#endif
