/*
 * The C API on a named device: iwarp_open_device_named, iwarp_device_name,
 * iwarp_listen_on, then a connection on that device with private data
 * both ways, an RDMA Write, an RDMA Read of the same bytes, a two-SGE Send
 * into a posted receive, and a disconnect.
 *
 * TEST_DEVICE (default "soft") names the device and TEST_ADDR (default
 * 127.0.0.1) the address to listen on and connect to: scripts/test-capi.sh
 * runs it on soft; scripts/test-rdmacore-apps.sh runs it in the siw-vm guest
 * on siw0 and rxe0 at the guest's address.
 */
#include "common.h"

static const char MESSAGE[] = "hello from the C API on a named device";
static const char HELLO[] = "c-hello";

struct srv {
    iwarp_listener *l;
    iwarp_qp *qp;
    uint8_t reply[12];
    iwarp_result rc;
    uint8_t req[64];
    size_t req_len;
};

static void *srv_main(void *arg)
{
    struct srv *s = arg;
    iwarp_conn_request *r = NULL;
    const uint8_t *data = NULL;
    iwarp_conn_param p;

    s->rc = iwarp_get_request(s->l, 30000, &r);
    if (s->rc != IWARP_OK) return NULL;
    s->req_len = iwarp_conn_request_private_data(r, &data);
    if (s->req_len > sizeof s->req) s->req_len = sizeof s->req;
    memcpy(s->req, data, s->req_len);
    iwarp_conn_param_init(&p);
    p.private_data = s->reply;
    p.private_data_len = sizeof s->reply;
    p.timeout_ms = 30000;
    s->rc = iwarp_accept(r, s->qp, &p);
    return NULL;
}

static int open_side(const char *dev, struct side *sd)
{
    memset(sd, 0, sizeof *sd);
    if (iwarp_open_device_named(dev, &sd->ctx) != IWARP_OK) return -1;
    if (iwarp_alloc_pd(sd->ctx, &sd->pd) != IWARP_OK) return -1;
    if (iwarp_create_cq(sd->ctx, 64, &sd->cq) != IWARP_OK) return -1;
    if (iwarp_create_qp(sd->pd, sd->cq, sd->cq, 16, 16, &sd->qp) != IWARP_OK) return -1;
    return 0;
}

int main(void)
{
    const char *dev = getenv("TEST_DEVICE") ? getenv("TEST_DEVICE") : "soft";
    const char *addr = getenv("TEST_ADDR") ? getenv("TEST_ADDR") : "127.0.0.1";
    struct side sv, cl;
    struct srv s;
    pthread_t th;
    iwarp_mr *sbuf = NULL, *inbox = NULL, *cbuf = NULL;
    iwarp_sge sge, two[2];
    iwarp_wc wc;
    iwarp_conn_param p;
    uint8_t peer[64];
    size_t peer_len = sizeof peer;
    char name[64];
    uint64_t raddr = 0;
    uint32_t rkey = 0;
    char *cm;
    int i;

    if (open_side(dev, &sv) != 0 || open_side(dev, &cl) != 0) {
        char e[512];
        iwarp_last_error(e, sizeof e);
        fprintf(stderr, "test_device: cannot open device %s: %s\n", dev, e);
        return 1;
    }
    iwarp_device_name(sv.ctx, name, sizeof name);
    CHECK(strcmp(dev, "auto") == 0 || strcmp(name, dev) == 0, "device name %s, want %s", name,
          dev);
    printf("test_device: device %s, address %s\n", name, addr);

    /* Server memory: a target for Write and Read, and a receive. */
    CHECK_RC(iwarp_alloc_mr(sv.pd, 4096,
                            IWARP_ACCESS_LOCAL_WRITE | IWARP_ACCESS_REMOTE_WRITE |
                                IWARP_ACCESS_REMOTE_READ,
                            &sbuf),
             IWARP_OK);
    CHECK_RC(iwarp_alloc_mr(sv.pd, 64, IWARP_ACCESS_LOCAL_WRITE, &inbox), IWARP_OK);
    sge.addr = (uint64_t)(uintptr_t)iwarp_mr_addr(inbox);
    sge.length = 64;
    sge.lkey = iwarp_mr_lkey(inbox);
    CHECK_RC(iwarp_post_recv(sv.qp, 7, &sge, 1), IWARP_OK);

    memset(&s, 0, sizeof s);
    s.qp = sv.qp;
    for (i = 0; i < 8; i++)
        s.reply[i] = (uint8_t)((uint64_t)(uintptr_t)iwarp_mr_addr(sbuf) >> (56 - 8 * i));
    for (i = 0; i < 4; i++)
        s.reply[8 + i] = (uint8_t)(iwarp_mr_rkey(sbuf) >> (24 - 8 * i));
    CHECK_RC(iwarp_listen_on(sv.ctx, addr, 0, NULL, &s.l), IWARP_OK);
    CHECK(iwarp_listener_port(s.l) != 0, "listener port 0");
    CHECK(pthread_create(&th, NULL, srv_main, &s) == 0, "pthread_create");

    iwarp_conn_param_init(&p);
    p.private_data = (const uint8_t *)HELLO;
    p.private_data_len = strlen(HELLO);
    p.timeout_ms = 30000;
    CHECK_RC(iwarp_connect(cl.qp, addr, iwarp_listener_port(s.l), &p, peer, &peer_len), IWARP_OK);
    pthread_join(th, NULL);
    CHECK_RC(s.rc, IWARP_OK);
    /* InfiniBand/RoCE CMs pad private data (to 56 bytes for a REQ, 196 for
     * a REP); iWARP delivers it at its length. Compare the prefix. */
    CHECK(s.req_len >= strlen(HELLO) && memcmp(s.req, HELLO, strlen(HELLO)) == 0,
          "server saw %zu bytes of request private data", s.req_len);
    CHECK(peer_len >= 12, "peer private data length %zu", peer_len);
    for (i = 0; i < 8; i++) raddr = raddr << 8 | peer[i];
    for (i = 8; i < 12; i++) rkey = rkey << 8 | peer[i];

    /* The Read's sink needs REMOTE_WRITE on iWARP (RFC 5040 §4.4: the
     * Read Response is a tagged write into it). */
    CHECK_RC(iwarp_alloc_mr(cl.pd, 4096, IWARP_ACCESS_LOCAL_WRITE | IWARP_ACCESS_REMOTE_WRITE, &cbuf),
             IWARP_OK);
    cm = iwarp_mr_addr(cbuf);
    memcpy(cm, MESSAGE, sizeof MESSAGE);
    sge.addr = (uint64_t)(uintptr_t)cm;
    sge.length = sizeof MESSAGE;
    sge.lkey = iwarp_mr_lkey(cbuf);
    CHECK_RC(iwarp_post_send(cl.qp, 10, IWARP_WR_RDMA_WRITE, &sge, 1, raddr, rkey, 0,
                             IWARP_SEND_SIGNALED),
             IWARP_OK);
    CHECK_RC(iwarp_wait_cq(cl.cq, 30000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 10 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RDMA_WRITE,
          "write wc: status %d opcode %d", wc.status, wc.opcode);

    sge.addr = (uint64_t)(uintptr_t)(cm + 1024);
    CHECK_RC(iwarp_post_send(cl.qp, 11, IWARP_WR_RDMA_READ, &sge, 1, raddr, rkey, 0,
                             IWARP_SEND_SIGNALED),
             IWARP_OK);
    CHECK_RC(iwarp_wait_cq(cl.cq, 30000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 11 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RDMA_READ &&
              wc.byte_len == sizeof MESSAGE,
          "read wc: status %d opcode %d len %u", wc.status, wc.opcode, wc.byte_len);
    CHECK(memcmp(cm + 1024, MESSAGE, sizeof MESSAGE) == 0, "read back \"%.*s\"",
          (int)sizeof MESSAGE, cm + 1024);
    CHECK(memcmp(iwarp_mr_addr(sbuf), MESSAGE, sizeof MESSAGE) == 0, "server buffer");

    memcpy(cm + 2048, "do", 2);
    memcpy(cm + 3000, "ne", 2);
    two[0].addr = (uint64_t)(uintptr_t)(cm + 2048);
    two[0].length = 2;
    two[0].lkey = iwarp_mr_lkey(cbuf);
    two[1].addr = (uint64_t)(uintptr_t)(cm + 3000);
    two[1].length = 2;
    two[1].lkey = iwarp_mr_lkey(cbuf);
    CHECK_RC(iwarp_post_send(cl.qp, 12, IWARP_WR_SEND, two, 2, 0, 0, 0, IWARP_SEND_SIGNALED),
             IWARP_OK);
    CHECK_RC(iwarp_wait_cq(cl.cq, 30000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 12 && wc.status == IWARP_WC_SUCCESS, "send wc: status %d", wc.status);
    CHECK_RC(iwarp_wait_cq(sv.cq, 30000, &wc), IWARP_OK);
    CHECK(wc.wr_id == 7 && wc.status == IWARP_WC_SUCCESS && wc.opcode == IWARP_WC_RECV &&
              wc.byte_len == 4,
          "recv wc: status %d opcode %d len %u", wc.status, wc.opcode, wc.byte_len);
    CHECK(memcmp(iwarp_mr_addr(inbox), "done", 4) == 0, "inbox");

    CHECK_RC(iwarp_disconnect(cl.qp), IWARP_OK);
    iwarp_dereg_mr(cbuf);
    iwarp_dereg_mr(inbox);
    iwarp_dereg_mr(sbuf);
    side_close(&cl);
    side_close(&sv);
    iwarp_listener_close(s.l);
    return t_finish("test_device");
}
