/*
 * iwarp_cq_set_progress: in each progress mode a Send is received and both
 * completions come out of iwarp_wait_cq; in IWARP_PROGRESS_APP_DRIVEN the
 * receiver's iwarp_cq_fd wakes poll(2) and iwarp_poll_cq does the receive
 * work, and iwarp_cq_progress lets the peer's RDMA Read of our memory
 * complete without taking completions.
 */
#include <poll.h>

#include "common.h"

static const char *mode_name(iwarp_progress_mode m)
{
    switch (m) {
    case IWARP_PROGRESS_THREADED: return "THREADED";
    case IWARP_PROGRESS_BUSY_POLL: return "BUSY_POLL";
    case IWARP_PROGRESS_APP_DRIVEN: return "APP_DRIVEN";
    }
    return "?";
}

static void set_sge(iwarp_sge *sge, iwarp_mr *mr, size_t off, uint32_t len)
{
    sge->addr = (uint64_t)(uintptr_t)iwarp_mr_addr(mr) + off;
    sge->length = len;
    sge->lkey = iwarp_mr_lkey(mr);
}

/* A Send from the client into the server's posted receive, both sides'
 * CQs in `mode`; both wait with iwarp_wait_cq. */
static void send_in_mode(iwarp_progress_mode mode)
{
    struct pair pr;
    iwarp_mr *in = NULL, *out = NULL;
    iwarp_sge sge;
    iwarp_wc wc;
    const char *name = mode_name(mode);

    CHECK(pair_connect(&pr) == 0, "%s: pair", name);
    CHECK_RC(iwarp_cq_set_progress(pr.srv.cq, mode, 20), IWARP_OK);
    CHECK_RC(iwarp_cq_set_progress(pr.cli.cq, mode, 20), IWARP_OK);
    CHECK_RC(iwarp_alloc_mr(pr.srv.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &in), IWARP_OK);
    CHECK_RC(iwarp_alloc_mr(pr.cli.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &out), IWARP_OK);
    set_sge(&sge, in, 0, 64);
    CHECK_RC(iwarp_post_recv(pr.srv.qp, 5, &sge, 1), IWARP_OK);
    memcpy(iwarp_mr_addr(out), name, strlen(name));
    set_sge(&sge, out, 0, (uint32_t)strlen(name));
    CHECK_RC(iwarp_post_send(pr.cli.qp, 6, IWARP_WR_SEND, &sge, 1, 0, 0, 0, IWARP_SEND_SIGNALED),
             IWARP_OK);
    /* The server waits first: the client's send completion needs nobody. */
    memset(&wc, 0, sizeof wc);
    CHECK_RC(iwarp_wait_cq(pr.srv.cq, 5000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 5 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RECV &&
              wc.byte_len == strlen(name),
          "%s: recv wc: wr_id %llu status %d len %u", name, (unsigned long long)wc.wr_id,
          wc.status, wc.byte_len);
    CHECK(memcmp(iwarp_mr_addr(in), name, strlen(name)) == 0, "%s: payload", name);
    memset(&wc, 0, sizeof wc);
    CHECK_RC(iwarp_wait_cq(pr.cli.cq, 5000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 6 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_SEND,
          "%s: send wc: wr_id %llu status %d", name, (unsigned long long)wc.wr_id, wc.status);
    CHECK_RC(iwarp_wait_cq(pr.srv.cq, 10, &wc), IWARP_ERR_TIMEOUT);
    iwarp_dereg_mr(in);
    iwarp_dereg_mr(out);
    pair_close(&pr);
}

/* APP_DRIVEN as an event loop would use it: sleep in poll(2) on the CQ's
 * fd, then iwarp_poll_cq; and iwarp_cq_progress for one-sided work. */
static void app_driven_event_loop(void)
{
    struct pair pr;
    iwarp_mr *in = NULL, *out = NULL, *src = NULL;
    iwarp_sge sge;
    iwarp_wc wc;
    int got = 0;
    double t0;
    static const char READ_ME[] = "read me while I progress";

    CHECK(pair_connect(&pr) == 0, "pair");
    CHECK_RC(iwarp_cq_set_progress(pr.srv.cq, IWARP_PROGRESS_APP_DRIVEN, 0), IWARP_OK);
    CHECK(iwarp_cq_fd(pr.srv.cq) >= 0, "fd");
    CHECK_RC(iwarp_alloc_mr(pr.srv.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &in), IWARP_OK);
    CHECK_RC(iwarp_alloc_mr(pr.cli.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &out), IWARP_OK);
    set_sge(&sge, in, 0, 64);
    CHECK_RC(iwarp_post_recv(pr.srv.qp, 1, &sge, 1), IWARP_OK);
    memcpy(iwarp_mr_addr(out), "loop", 4);
    set_sge(&sge, out, 0, 4);
    CHECK_RC(iwarp_post_send(pr.cli.qp, 2, IWARP_WR_SEND, &sge, 1, 0, 0, 0, 0), IWARP_OK);
    t0 = t_now_ms();
    while (!got && t_now_ms() - t0 < 5000) {
        struct pollfd pfd = {iwarp_cq_fd(pr.srv.cq), POLLIN, 0};
        if (poll(&pfd, 1, 1000) != 1)
            continue;
        got = iwarp_poll_cq(pr.srv.cq, 1, &wc);
        if (got < 0)
            break;
    }
    CHECK(got == 1 && wc.wr_id == 1 && wc.status == IWARP_WC_SUCCESS && wc.byte_len == 4,
          "event loop: got %d wr_id %llu status %d", got, (unsigned long long)wc.wr_id, wc.status);

    /* The client reads the server's memory; the server only progresses. */
    CHECK_RC(iwarp_alloc_mr(pr.srv.pd, 64, IWARP_ACCESS_LOCAL_WRITE | IWARP_ACCESS_REMOTE_READ,
                            &src),
             IWARP_OK);
    memcpy(iwarp_mr_addr(src), READ_ME, sizeof READ_ME);
    memset(iwarp_mr_addr(out), 0, 64);
    set_sge(&sge, out, 0, sizeof READ_ME);
    CHECK_RC(iwarp_post_send(pr.cli.qp, 3, IWARP_WR_RDMA_READ, &sge, 1,
                             (uint64_t)(uintptr_t)iwarp_mr_addr(src), iwarp_mr_rkey(src), 0,
                             IWARP_SEND_SIGNALED),
             IWARP_OK);
    {
        iwarp_result prc = IWARP_OK;
        got = 0;
        t0 = t_now_ms();
        while (!got && prc == IWARP_OK && t_now_ms() - t0 < 5000) {
            prc = iwarp_cq_progress(pr.srv.cq);
            got = iwarp_poll_cq(pr.cli.cq, 1, &wc);
        }
        CHECK_RC(prc, IWARP_OK);
    }
    CHECK(got == 1 && wc.wr_id == 3 && wc.status == IWARP_WC_SUCCESS &&
              wc.opcode == IWARP_WC_RDMA_READ,
          "read: got %d wr_id %llu status %d", got, (unsigned long long)wc.wr_id, wc.status);
    CHECK(memcmp(iwarp_mr_addr(out), READ_ME, sizeof READ_ME) == 0, "read back \"%s\"",
          (const char *)iwarp_mr_addr(out));
    CHECK(iwarp_poll_cq(pr.srv.cq, 1, &wc) == 0, "progress took no completion");

    /* Back to the default: the receive threads read again. */
    CHECK_RC(iwarp_cq_set_progress(pr.srv.cq, IWARP_PROGRESS_THREADED, 50), IWARP_OK);
    set_sge(&sge, in, 0, 64);
    CHECK_RC(iwarp_post_recv(pr.srv.qp, 4, &sge, 1), IWARP_OK);
    set_sge(&sge, out, 0, 4);
    CHECK_RC(iwarp_post_send(pr.cli.qp, 5, IWARP_WR_SEND, &sge, 1, 0, 0, 0, 0), IWARP_OK);
    CHECK_RC(iwarp_wait_cq(pr.srv.cq, 5000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 4 && wc.status == IWARP_WC_SUCCESS, "threaded again: wr_id %llu status %d",
          (unsigned long long)wc.wr_id, wc.status);

    iwarp_dereg_mr(in);
    iwarp_dereg_mr(out);
    iwarp_dereg_mr(src);
    pair_close(&pr);
}

int main(void)
{
    send_in_mode(IWARP_PROGRESS_THREADED);
    send_in_mode(IWARP_PROGRESS_BUSY_POLL);
    send_in_mode(IWARP_PROGRESS_APP_DRIVEN);
    app_driven_event_loop();
    return t_finish("test_progress");
}
