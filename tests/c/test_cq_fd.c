/*
 * The CQ file descriptor with poll(2): not readable while the CQ is empty,
 * readable once a completion arrives, not readable again once drained.
 */
#include <poll.h>

#include "common.h"

static int readable(iwarp_cq *cq, int timeout_ms)
{
    struct pollfd pfd;
    pfd.fd = iwarp_cq_fd(cq);
    pfd.events = POLLIN;
    pfd.revents = 0;
    return poll(&pfd, 1, timeout_ms) == 1 && (pfd.revents & POLLIN);
}

int main(void)
{
    struct pair pr;
    iwarp_mr *in = NULL, *out = NULL;
    iwarp_sge sge;
    iwarp_wc wc[8];
    int n;

    CHECK(pair_connect(&pr) == 0, "pair");
    CHECK(iwarp_cq_fd(pr.srv.cq) >= 0, "fd");
    CHECK(!readable(pr.srv.cq, 0), "empty CQ is not readable");

    CHECK_RC(iwarp_alloc_mr(pr.srv.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &in), IWARP_OK);
    CHECK_RC(iwarp_alloc_mr(pr.cli.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &out), IWARP_OK);
    for (int i = 0; i < 3; i++) {
        sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(in) + 16u * (unsigned)i;
        sge.length = 16;
        sge.lkey = iwarp_mr_lkey(in);
        CHECK_RC(iwarp_post_recv(pr.srv.qp, 100 + (uint64_t)i, &sge, 1), IWARP_OK);
    }
    memcpy(iwarp_mr_addr(out), "ping", 4);
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(out);
    sge.length = 4;
    sge.lkey = iwarp_mr_lkey(out);
    /* Unsignaled sends: only the receiver's CQ gets completions. */
    for (int i = 0; i < 3; i++)
        CHECK_RC(iwarp_post_send(pr.cli.qp, 1, IWARP_WR_SEND, &sge, 1, 0, 0, 0, 0), IWARP_OK);

    CHECK(readable(pr.srv.cq, 5000), "CQ readable after a receive completed");
    CHECK(readable(pr.srv.cq, 0), "still readable (level-triggered)");
    {
        double t0 = t_now_ms();
        n = 0;
        while (n < 3 && t_now_ms() - t0 < 5000) {
            int got;
            if (!readable(pr.srv.cq, 1000)) continue;
            got = iwarp_poll_cq(pr.srv.cq, 8 - n, wc + n);
            CHECK(got >= 0, "poll_cq returned %d", got);
            if (got < 0) break;
            n += got;
        }
    }
    CHECK(n == 3, "%d receive completions, want 3", n);
    for (int i = 0; i < n; i++)
        CHECK(wc[i].wr_id == 100 + (uint64_t)i && wc[i].status == IWARP_WC_SUCCESS &&
                  wc[i].opcode == IWARP_WC_RECV && wc[i].byte_len == 4,
              "wc[%d]: wr_id %llu status %d", i, (unsigned long long)wc[i].wr_id, wc[i].status);
    CHECK(!readable(pr.srv.cq, 0), "drained CQ is not readable");
    CHECK(!readable(pr.cli.cq, 0), "unsignaled sends leave the sender's CQ empty");

    /* Disconnect flushes nothing here, but a posted receive is flushed. */
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(in);
    sge.length = 16;
    sge.lkey = iwarp_mr_lkey(in);
    CHECK_RC(iwarp_post_recv(pr.srv.qp, 200, &sge, 1), IWARP_OK);
    CHECK_RC(iwarp_disconnect(pr.srv.qp), IWARP_OK);
    CHECK(readable(pr.srv.cq, 5000), "flush completion makes the CQ readable");
    n = iwarp_poll_cq(pr.srv.cq, 8, wc);
    CHECK(n == 1 && wc[0].wr_id == 200 && wc[0].status == IWARP_WC_WR_FLUSH_ERR,
          "flush: n %d wr_id %llu status %d", n, (unsigned long long)wc[0].wr_id, wc[0].status);

    iwarp_dereg_mr(in);
    iwarp_dereg_mr(out);
    pair_close(&pr);
    return t_finish("test_cq_fd");
}
