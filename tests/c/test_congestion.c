/*
 * TCP congestion control per connection through the C API
 * (iwarp_conn_param.congestion, TCP_CONGESTION in tcp(7)):
 *  - "reno" set on the client's parameters and on the listener reads back
 *    as "reno" on both ends (iwarp_query_qp_congestion; the accepted
 *    connection inherits the listener's);
 *  - "nosuch", a well-formed name the kernel lacks, fails connect and
 *    listen with IWARP_ERR_UNSUPPORTED and a message naming
 *    /proc/sys/net/ipv4/tcp_available_congestion_control and
 *    `modprobe tcp_nosuch`, and leaves the QP free to connect;
 *  - a 16-byte name (over TCP_CA_NAME_MAX - 1) is refused by the setter;
 *  - the getter on an unconnected QP is IWARP_ERR_QP_STATE.
 */
#include "common.h"

int main(void)
{
    struct side c, s;
    struct acceptor a;
    iwarp_conn_param p;
    char name[IWARP_CONGESTION_MAX];

    CHECK(side_open(&c) == 0, "client setup");
    CHECK(side_open(&s) == 0, "server setup");

    /* Names are checked when set; 15 bytes is the kernel's limit. */
    iwarp_conn_param_init(&p);
    CHECK(p.congestion[0] == '\0', "default congestion is not empty");
    CHECK_RC(iwarp_conn_param_set_congestion(&p, "abcdefghijklmnop"), IWARP_ERR_INVALID_ARG);
    CHECK(t_last_error_has("15 bytes"), "message does not give the limit");
    CHECK(p.congestion[0] == '\0', "a refused name changed the parameters");
    CHECK_RC(iwarp_conn_param_set_congestion(NULL, "reno"), IWARP_ERR_NULL_ARG);

    /* Not connected yet: nothing to read. */
    CHECK_RC(iwarp_query_qp_congestion(c.qp, name, sizeof name), IWARP_ERR_QP_STATE);

    /* An algorithm this kernel lacks. */
    CHECK_RC(iwarp_conn_param_set_congestion(&p, "nosuch"), IWARP_OK);
    CHECK(strcmp(p.congestion, "nosuch") == 0, "field holds \"%s\"", p.congestion);
    {
        iwarp_listener *bad = NULL;
        CHECK_RC(iwarp_listen("127.0.0.1", 0, &p, &bad), IWARP_ERR_UNSUPPORTED);
        CHECK(bad == NULL, "a listener was returned on failure");
        CHECK(t_last_error_has("/proc/sys/net/ipv4/tcp_available_congestion_control"),
              "message does not name the kernel's list");
    }

    /* The real listener: "reno" on the listening socket. */
    memset(&a, 0, sizeof a);
    CHECK_RC(iwarp_conn_param_set_congestion(&p, "reno"), IWARP_OK);
    CHECK_RC(iwarp_listen("127.0.0.1", 0, &p, &a.l), IWARP_OK);
    a.qp = s.qp;

    /* Connect with "nosuch": refused before any TCP connect is made. */
    CHECK_RC(iwarp_conn_param_set_congestion(&p, "nosuch"), IWARP_OK);
    CHECK_RC(iwarp_connect(c.qp, "127.0.0.1", iwarp_listener_port(a.l), &p, NULL, NULL),
             IWARP_ERR_UNSUPPORTED);
    CHECK(t_last_error_has("tcp_available_congestion_control"),
          "message does not name the kernel's list");
    CHECK(t_last_error_has("modprobe tcp_nosuch"), "message does not say how to load it");

    /* Then "reno", on the same QP: it was left free to connect. */
    CHECK_RC(iwarp_conn_param_set_congestion(&p, "reno"), IWARP_OK);
    CHECK(acceptor_start(&a) == 0, "pthread_create");
    CHECK_RC(iwarp_connect(c.qp, "127.0.0.1", iwarp_listener_port(a.l), &p, NULL, NULL),
             IWARP_OK);
    acceptor_join(&a);
    CHECK_RC(a.rc, IWARP_OK);

    memset(name, 0, sizeof name);
    CHECK_RC(iwarp_query_qp_congestion(c.qp, name, sizeof name), IWARP_OK);
    CHECK(strcmp(name, "reno") == 0, "client uses \"%s\", want reno", name);
    memset(name, 0, sizeof name);
    CHECK_RC(iwarp_query_qp_congestion(s.qp, name, sizeof name), IWARP_OK);
    CHECK(strcmp(name, "reno") == 0, "server (inherited) uses \"%s\", want reno", name);
    CHECK_RC(iwarp_query_qp_congestion(s.qp, name, 0), IWARP_ERR_INVALID_ARG);
    CHECK_RC(iwarp_query_qp_congestion(NULL, name, sizeof name), IWARP_ERR_NULL_ARG);
    CHECK(strcmp(iwarp_result_str(IWARP_ERR_UNSUPPORTED), "not supported here") == 0,
          "result string");

    iwarp_listener_close(a.l);
    side_close(&c);
    side_close(&s);
    return t_finish("test_congestion");
}
