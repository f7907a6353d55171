/* Control messages on the RDMA channel: encoding and decoding
 * (docs/MOD_RDMA.md, "Control messages on the RDMA channel"). */
#include "wire.h"

#include <string.h>

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

void encode_msg(unsigned char *b, const ctrl_msg *m)
{
    memset(b, 0, MSG_LEN);
    memcpy(b, "RDMA", 4);
    b[4] = 1;
    b[5] = (unsigned char)m->type;
    put32(b + 8, m->stag);
    put32(b + 12, m->length);
    put64(b + 16, m->to);
    put64(b + 24, m->offset);
}

const char *decode_msg(const unsigned char *b, size_t len, ctrl_msg *m)
{
    if (len != MSG_LEN)
        return "control message of the wrong size";
    if (memcmp(b, "RDMA", 4))
        return "control message without the RDMA magic";
    if (b[4] != 1)
        return "control message of an unknown version";
    if (b[5] < MSG_BUF || b[5] > MSG_ABORT)
        return "control message of an unknown type";
    m->type = b[5];
    m->stag = get32(b + 8);
    m->length = get32(b + 12);
    m->to = get64(b + 16);
    m->offset = get64(b + 24);
    return NULL;
}
