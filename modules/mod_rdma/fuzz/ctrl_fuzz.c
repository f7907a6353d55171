/* libFuzzer target: mod_rdma's control-message decoder (wire.c,
 * decode_msg), which conn.c's recv_ctrl runs on every message the client
 * sends on the RDMA channel (docs/MOD_RDMA.md, "Control messages on the
 * RDMA channel"). The input is the received bytes, of any length (the
 * receive completion's byte count is the peer's choice up to the slot
 * size). Besides crashes and sanitizer reports it checks the decoder's
 * contract: only 32-byte messages with the magic, version 1 and a known
 * type decode; a decoded message encodes to the same bytes except the
 * reserved ones (6..8), and decodes again to itself. Built and run by
 * scripts/fuzz-modrdma.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../wire.h"

#define CHECK(c)                                                                \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "ctrl_fuzz: check failed: %s (line %d)\n", #c,     \
                    __LINE__);                                                  \
            abort();                                                            \
        }                                                                       \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ctrl_msg m, again;
    unsigned char enc[MSG_LEN];
    unsigned char *copy;
    const char *err;
    /* The decoder reads from a buffer of exactly `size` bytes, so that
     * AddressSanitizer sees any read beyond the received length. */
    copy = malloc(size ? size : 1);
    CHECK(copy != NULL);
    memcpy(copy, data, size);
    memset(&m, 0x5a, sizeof m);
    err = decode_msg(copy, size, &m);
    if (err) {
        CHECK(*err != 0);
        /* Every refusal has its cause. */
        CHECK(size != MSG_LEN || memcmp(copy, "RDMA", 4) || copy[4] != 1 || copy[5] < MSG_BUF ||
              copy[5] > MSG_ABORT);
    } else {
        CHECK(size == MSG_LEN);
        CHECK(!memcmp(copy, "RDMA", 4) && copy[4] == 1);
        CHECK(m.type >= MSG_BUF && m.type <= MSG_ABORT && m.type == copy[5]);
        encode_msg(enc, &m);
        CHECK(!memcmp(enc, copy, 6));
        CHECK(enc[6] == 0 && enc[7] == 0);
        CHECK(!memcmp(enc + 8, copy + 8, MSG_LEN - 8));
        CHECK(decode_msg(enc, MSG_LEN, &again) == NULL);
        CHECK(again.type == m.type && again.stag == m.stag && again.length == m.length &&
              again.to == m.to && again.offset == m.offset);
    }
    free(copy);
    return 0;
}
