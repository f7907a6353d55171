/* The control messages of mod_rdma's RDMA channel (docs/MOD_RDMA.md,
 * "Control messages on the RDMA channel"): 32 bytes, big-endian. Plain C,
 * apart from Apache and libiwarp, so that the shared test vectors
 * (testdata/rdma-vectors) can run against it alone. */
#ifndef MOD_RDMA_WIRE_H
#define MOD_RDMA_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define MSG_LEN 32
enum { MSG_BUF = 1, MSG_DONE = 2, MSG_ABORT = 3 };

typedef struct {
    int type;
    uint32_t stag, length;
    uint64_t to, offset;
} ctrl_msg;

/* Write `m` into the MSG_LEN bytes at `b`. */
void encode_msg(unsigned char *b, const ctrl_msg *m);

/* Decode `len` received bytes (untrusted). Returns NULL, or the problem. */
const char *decode_msg(const unsigned char *b, size_t len, ctrl_msg *m);

#endif
