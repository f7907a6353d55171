/*
 * End to end over 127.0.0.1 in one process, two threads: the server listens
 * (CRC required), exposes a buffer through the private data of its MPA
 * Reply, and keeps a receive posted; the client connects with private data,
 * RDMA-Writes into the server's buffer, RDMA-Reads it back, and Sends a
 * message. Both sides check what arrived.
 */
#include <poll.h>
#include <stdlib.h>

#include "common.h"

static const char MESSAGE[] = "hello, iWARP over C!";
static const char HELLO[] = "client-hello";

struct server {
    iwarp_listener *l;
    int ok_setup;
    iwarp_result accept_rc;
    iwarp_result recv_rc;
    iwarp_wc recv_wc;
    char req_data[64];
    size_t req_len;
    char peer[64];
    char inbox_copy[64];
    char buf_copy[64];
};

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) { p[i] = (uint8_t)v; v >>= 8; }
}

static void put_be32(uint8_t *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--) { p[i] = (uint8_t)v; v >>= 8; }
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

static uint32_t get_be32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | p[i];
    return v;
}

static void *server_main(void *arg)
{
    struct server *s = arg;
    struct side sd;
    iwarp_mr *buf = NULL, *inbox = NULL;
    iwarp_conn_request *req = NULL;
    const uint8_t *data = NULL;
    iwarp_conn_param p;
    uint8_t reply[12];
    iwarp_sge sge;

    if (side_open(&sd) != 0) return NULL;
    if (iwarp_alloc_mr(sd.pd, 4096,
                       IWARP_ACCESS_LOCAL_WRITE | IWARP_ACCESS_REMOTE_WRITE | IWARP_ACCESS_REMOTE_READ,
                       &buf) != IWARP_OK)
        goto out;
    if (iwarp_alloc_mr(sd.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &inbox) != IWARP_OK) goto out;
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(inbox);
    sge.length = 64;
    sge.lkey = iwarp_mr_lkey(inbox);
    if (iwarp_post_recv(sd.qp, 7, &sge, 1) != IWARP_OK) goto out;
    s->ok_setup = 1;

    s->accept_rc = iwarp_get_request(s->l, 5000, &req);
    if (s->accept_rc != IWARP_OK) goto out;
    s->req_len = iwarp_conn_request_private_data(req, &data);
    if (s->req_len <= sizeof s->req_data) memcpy(s->req_data, data, s->req_len);
    iwarp_conn_request_peer(req, s->peer, sizeof s->peer);

    /* Tell the client where to write: address and rkey, big-endian. */
    put_be64(reply, (uint64_t)(uintptr_t)iwarp_mr_addr(buf));
    put_be32(reply + 8, iwarp_mr_rkey(buf));
    iwarp_conn_param_init(&p);
    p.private_data = reply;
    p.private_data_len = sizeof reply;
    s->accept_rc = iwarp_accept(req, sd.qp, &p);
    if (s->accept_rc != IWARP_OK) goto out;

    s->recv_rc = iwarp_wait_cq(sd.cq, 5000, &s->recv_wc);
    memcpy(s->inbox_copy, iwarp_mr_addr(inbox), sizeof s->inbox_copy);
    memcpy(s->buf_copy, iwarp_mr_addr(buf), sizeof s->buf_copy);
out:
    iwarp_dereg_mr(inbox);
    iwarp_dereg_mr(buf);
    side_close(&sd);
    return NULL;
}

int main(void)
{
    struct server s;
    struct side c;
    iwarp_conn_param p;
    pthread_t th;
    uint8_t peer_data[64];
    size_t peer_len = sizeof peer_data;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    char *mem = NULL;
    iwarp_mr *mr = NULL;
    iwarp_sge sge;
    iwarp_wc wc;
    double t0;

    memset(&s, 0, sizeof s);
    iwarp_conn_param_init(&p);
    p.crc = IWARP_MPA_REQUIRED;
    CHECK_RC(iwarp_listen("127.0.0.1", 0, &p, &s.l), IWARP_OK);
    CHECK(iwarp_listener_port(s.l) != 0, "listener port is 0");
    CHECK(pthread_create(&th, NULL, server_main, &s) == 0, "pthread_create");

    CHECK(side_open(&c) == 0, "client setup");
    p.private_data = (const uint8_t *)HELLO;
    p.private_data_len = strlen(HELLO);
    t0 = t_now_ms();
    CHECK_RC(iwarp_connect(c.qp, "127.0.0.1", iwarp_listener_port(s.l), &p, peer_data, &peer_len),
             IWARP_OK);
    CHECK(t_now_ms() - t0 < 5000, "connect took %.0f ms", t_now_ms() - t0);
    CHECK(peer_len == 12, "peer private data length %zu, want 12", peer_len);
    if (peer_len == 12) {
        remote_addr = get_be64(peer_data);
        rkey = get_be32(peer_data + 8);
    }
    CHECK(iwarp_query_qp_state(c.qp) == IWARP_QPS_RTS, "client QP state %d",
          iwarp_query_qp_state(c.qp));
    {
        iwarp_qp_event ev;
        CHECK_RC(iwarp_qp_next_event(c.qp, 1000, &ev), IWARP_OK);
        CHECK(ev.event_type == IWARP_EVENT_ESTABLISHED, "event %d", ev.event_type);
        char peer[64];
        size_t n = iwarp_qp_peer(c.qp, peer, sizeof peer);
        CHECK(n > 0 && strncmp(peer, "127.0.0.1:", 10) == 0, "qp peer \"%s\"", peer);
    }

    /* Caller-owned memory: registered with iwarp_reg_mr. */
    CHECK(posix_memalign((void **)&mem, 4096, 4096) == 0, "posix_memalign");
    memset(mem, 0, 4096);
    CHECK_RC(iwarp_reg_mr(c.pd, mem, 4096, IWARP_ACCESS_LOCAL_WRITE, &mr), IWARP_OK);
    CHECK(iwarp_mr_addr(mr) == mem, "mr addr %p, want %p", iwarp_mr_addr(mr), (void *)mem);
    CHECK(iwarp_mr_length(mr) == 4096, "mr length %zu", iwarp_mr_length(mr));
    memcpy(mem, MESSAGE, sizeof MESSAGE);

    /* RDMA Write into the server's buffer. */
    sge.addr = (uint64_t)(uintptr_t)mem;
    sge.length = sizeof MESSAGE;
    sge.lkey = iwarp_mr_lkey(mr);
    CHECK_RC(iwarp_post_send(c.qp, 10, IWARP_WR_RDMA_WRITE, &sge, 1, remote_addr, rkey, 0,
                             IWARP_SEND_SIGNALED),
             IWARP_OK);
    CHECK_RC(iwarp_wait_cq(c.cq, 5000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 10 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RDMA_WRITE,
          "write wc: wr_id %llu status %d opcode %d", (unsigned long long)wc.wr_id, wc.status,
          wc.opcode);

    /* RDMA Read it back to offset 1024, busy-polling: the bytes land in our
     * memory while this thread spins on it and drives progress itself. */
    sge.addr = (uint64_t)(uintptr_t)(mem + 1024);
    CHECK_RC(iwarp_post_send(c.qp, 11, IWARP_WR_RDMA_READ, &sge, 1, remote_addr, rkey, 0,
                             IWARP_SEND_SIGNALED),
             IWARP_OK);
    {
        iwarp_result prc = IWARP_OK;
        t0 = t_now_ms();
        while (prc == IWARP_OK && memcmp(mem + 1024, MESSAGE, sizeof MESSAGE) != 0 &&
               t_now_ms() - t0 < 5000)
            prc = iwarp_cq_progress(c.cq);
        CHECK_RC(prc, IWARP_OK);
        CHECK(memcmp(mem + 1024, MESSAGE, sizeof MESSAGE) == 0, "busy-polled Read did not land");
    }
    CHECK_RC(iwarp_wait_cq(c.cq, 5000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 11 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RDMA_READ,
          "read wc: wr_id %llu status %d opcode %d", (unsigned long long)wc.wr_id, wc.status,
          wc.opcode);
    CHECK(wc.byte_len == sizeof MESSAGE, "read byte_len %u", wc.byte_len);
    CHECK(memcmp(mem + 1024, MESSAGE, sizeof MESSAGE) == 0, "read back \"%.*s\"",
          (int)sizeof MESSAGE, mem + 1024);

    /* The same Read, driven with the deprecated iwarp_qp_drive (kept for
     * compatibility; it sets the QP's CQs to IWARP_PROGRESS_APP_DRIVEN):
     * this thread waits in poll(2) on the drive's fd and the CQ's fd and
     * does the receive work itself. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    {
        iwarp_drive *d = NULL;
        iwarp_qp *unconnected = NULL;
        int got = 0, drive_fd = -1;
        CHECK_RC(iwarp_create_qp(c.pd, c.cq, c.cq, 4, 4, &unconnected), IWARP_OK);
        CHECK_RC(iwarp_qp_drive(unconnected, &d), IWARP_ERR_QP_STATE);
        CHECK(d == NULL, "a failed iwarp_qp_drive left a handle");
        iwarp_destroy_qp(unconnected);
        CHECK_RC(iwarp_qp_drive(c.qp, &d), IWARP_OK);
        CHECK(iwarp_drive_fd(d) >= 0, "drive fd %d", iwarp_drive_fd(d));
        drive_fd = iwarp_drive_fd(d);
        sge.addr = (uint64_t)(uintptr_t)(mem + 1536);
        CHECK_RC(iwarp_post_send(c.qp, 13, IWARP_WR_RDMA_READ, &sge, 1, remote_addr, rkey, 0,
                                 IWARP_SEND_SIGNALED),
                 IWARP_OK);
        t0 = t_now_ms();
        while (!got && t_now_ms() - t0 < 5000) {
            struct pollfd fds[2] = {{iwarp_drive_fd(d), POLLIN, 0}, {iwarp_cq_fd(c.cq), POLLIN, 0}};
            CHECK_RC(iwarp_drive_progress(d), IWARP_OK);
            got = iwarp_poll_cq(c.cq, 1, &wc);
            if (!got)
                poll(fds, 2, 100);
        }
        CHECK(got == 1, "driven Read did not complete (%d)", got);
        CHECK(wc.wr_id == 13 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RDMA_READ,
              "driven read wc: wr_id %llu status %d opcode %d", (unsigned long long)wc.wr_id,
              wc.status, wc.opcode);
        CHECK(memcmp(mem + 1536, MESSAGE, sizeof MESSAGE) == 0, "driven Read read back \"%.*s\"",
              (int)sizeof MESSAGE, mem + 1536);
        CHECK(iwarp_drive_fd(d) == iwarp_cq_fd(c.cq), "drive fd is the app-driven CQ's fd");
        iwarp_drive_release(d);
        CHECK(iwarp_cq_fd(c.cq) >= 0 && iwarp_cq_fd(c.cq) != drive_fd,
              "release restores the threaded CQ's fd");
    }
#pragma GCC diagnostic pop

    /* Two-sided Send (two SGEs) into the server's posted receive. */
    {
        iwarp_sge two[2];
        memcpy(mem + 2048, "do", 2);
        memcpy(mem + 3000, "ne", 2);
        two[0].addr = (uint64_t)(uintptr_t)(mem + 2048);
        two[0].length = 2;
        two[0].lkey = iwarp_mr_lkey(mr);
        two[1].addr = (uint64_t)(uintptr_t)(mem + 3000);
        two[1].length = 2;
        two[1].lkey = iwarp_mr_lkey(mr);
        CHECK_RC(iwarp_post_send(c.qp, 12, IWARP_WR_SEND, two, 2, 0, 0, 0,
                                 IWARP_SEND_SIGNALED | IWARP_SEND_SOLICITED),
                 IWARP_OK);
    }
    CHECK_RC(iwarp_wait_cq(c.cq, 5000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 12 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_SEND,
          "send wc: wr_id %llu status %d", (unsigned long long)wc.wr_id, wc.status);

    pthread_join(th, NULL);
    CHECK(s.ok_setup, "server setup failed");
    CHECK_RC(s.accept_rc, IWARP_OK);
    CHECK(s.req_len == strlen(HELLO) && memcmp(s.req_data, HELLO, s.req_len) == 0,
          "server saw request private data \"%.*s\"", (int)s.req_len, s.req_data);
    CHECK(strncmp(s.peer, "127.0.0.1:", 10) == 0, "server saw peer \"%s\"", s.peer);
    CHECK_RC(s.recv_rc, IWARP_OK);
    CHECK(s.recv_wc.wr_id == 7 && s.recv_wc.status == IWARP_WC_SUCCESS &&
              s.recv_wc.opcode == IWARP_WC_RECV && s.recv_wc.byte_len == 4,
          "recv wc: wr_id %llu status %d opcode %d len %u",
          (unsigned long long)s.recv_wc.wr_id, s.recv_wc.status, s.recv_wc.opcode,
          s.recv_wc.byte_len);
    CHECK(s.recv_wc.flags & IWARP_WC_SOLICITED, "recv wc flags %#x", s.recv_wc.flags);
    CHECK(memcmp(s.inbox_copy, "done", 4) == 0, "server inbox \"%.4s\"", s.inbox_copy);
    CHECK(memcmp(s.buf_copy, MESSAGE, sizeof MESSAGE) == 0, "server buffer \"%.*s\"",
          (int)sizeof MESSAGE, s.buf_copy);

    CHECK_RC(iwarp_disconnect(c.qp), IWARP_OK);
    CHECK_RC(iwarp_disconnect(c.qp), IWARP_OK); /* idempotent */
    iwarp_dereg_mr(mr);
    free(mem);
    side_close(&c);
    iwarp_listener_close(s.l);
    return t_finish("test_loopback");
}
