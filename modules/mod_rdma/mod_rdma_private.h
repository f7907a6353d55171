/* mod_rdma's private header: the types, globals and functions that its
 * source files (see mod_rdma.c) share. */
#ifndef MOD_RDMA_PRIVATE_H
#define MOD_RDMA_PRIVATE_H

#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_mpm.h"
#include "util_filter.h"
#include "apr_strings.h"
#include "apr_buckets.h"
#include "apr_portable.h"
#include "apr_lib.h"
#include "rdma_header.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iwarp.h>

extern module AP_MODULE_DECLARE_DATA rdma_module;

/* ---- configuration ---------------------------------------------------- */

enum { MODE_STATIC = 0, MODE_DYNAMIC = 1 };

typedef struct {
    int enable; /* -1 unset, 0 off, 1 on */
} rdma_dir_conf;

typedef struct {
    int mode;                /* MODE_STATIC / MODE_DYNAMIC, -1 unset */
    apr_size_t bufsize;      /* static buffer, 0 unset */
    apr_uint64_t maxlen;     /* largest body moved by RDMA, 0 unset */
    int allow_client;        /* connect back to the request's own address */
    apr_array_header_t *allow; /* further IP literals (char *) */
    int allow_set;
    int timeout_ms;          /* transfers and DONE waits, 0 unset */
    int connect_timeout_ms;  /* connecting to the client's listener */
    apr_array_header_t *ports; /* RDMAConnectPorts: port_range entries */
    int ports_set;
    int trust_proxy;         /* RDMATrustProxy: -1 unset, 0 off, 1 on */
    const char *congestion;  /* RDMACongestion: TCP congestion control, NULL unset */
    apr_int64_t inline_below; /* RDMAInlineBelow: bytes, 0 off, -1 unset */
    int tls;                 /* RDMATLS: TLS_ENCRYPT / TLS_OFF, -1 unset */
} rdma_srv_conf;

enum { TLS_ENCRYPT = 0, TLS_OFF = 1 };

/* One range of RDMAConnectPorts, inclusive. */
typedef struct {
    unsigned lo, hi;
} port_range;

/* Without RDMAConnectPorts the server connects back to unprivileged ports
 * only: a request must not make it knock on a host's system services. */
#define DEF_PORT_LO 1024u
#define DEF_PORT_HI 65535u

#define DEF_BUFSIZE (8u << 20)
#define DEF_MAXLEN ((apr_uint64_t)1 << 30)
#define DEF_TIMEOUT_MS 30000
#define DEF_CONNECT_TIMEOUT_MS 3000
/* RDMAInlineBelow's default: GETs of static files smaller than this are
 * answered inline, as plain Apache would (docs/MOD_RDMA.md, "Small
 * objects", has the measurement that chose it). */
#define DEF_INLINE_BELOW ((apr_int64_t)512 << 10)

/* ---- wire: control messages (docs/MOD_RDMA.md; codec in wire.c) -------- */

/* The private data of the server's MPA Request: this prefix, then the
 * request's token (8 bytes, big-endian) if the RDMA: header had one. */
#define PD_PREFIX "mod_rdma/1"
#define PD_PREFIX_LEN 10

#define RECV_SLOTS 8
#define SEND_SLOT RECV_SLOTS
#define XFER_CHUNK (16u << 20)
#define BOUNCE_LEN (1u << 20)

/* ---- per-connection state (pre_connection) ----------------------------- */

/* A client-reads body still granted to the client (expose.c): its STag
 * stays valid after its request ended, until the client's DONE (or
 * ABORT) for it, its deadline, or the end of the RDMA connection, so a
 * worker answers pipelined requests without waiting for each DONE. */
typedef struct {
    iwarp_mr *win;        /* the registration with remote read rights */
    uint32_t stag;        /* iwarp_mr_rkey(win), what the DONE names */
    apr_uint64_t len;
    apr_time_t deadline;  /* granted + RDMATimeout */
    void *map;            /* dynamic: the file's mapping (pinned if cached) */
    size_t map_len;
    char *body;           /* a collected body (malloc), else NULL */
    int in_static;        /* the body lies in g_static_mr */
    char uri[80];         /* for the log (truncated) */
} rdma_expo;

/* The per-connection budget of exposures. At most RECV_SLOTS objects: the
 * client sends one DONE per granted STag, and each DONE needs a posted
 * receive (RFC 5040 section 7.1: a Send with no receive posted is a
 * Terminate), so the DONEs in flight can never outnumber the receives.
 * And at most EXPO_MAX_BYTES of bodies (a single larger body waits until
 * it is the only one). */
#define EXPO_MAX RECV_SLOTS
#define EXPO_MAX_BYTES ((apr_uint64_t)256 << 20)

typedef struct {
    conn_rec *c;
    /* IWARP_PROGRESS_APP_DRIVEN: the worker does the connection's receive
     * work itself while it waits (conn.c, new_cq). */
    iwarp_cq *scq, *rcq;
    iwarp_qp *qp;
    iwarp_mr *ctrl; /* RECV_SLOTS receive slots + one send slot */
    char ip[64];
    unsigned port;
    unsigned uses;
    rdma_expo expo[EXPO_MAX]; /* oldest first */
    int n_expo;
    apr_uint64_t expo_bytes;
    int threaded;             /* CQs switched to THREADED while n_expo > 0 */
} rdma_conn;

/* ---- per-request state ------------------------------------------------- */

enum { OUT_INIT, OUT_BODY, OUT_DISCARD, OUT_PASS };

/* A body sealed under the TLS session (seal.c): the transfer id the
 * client sent in RDMA-Seal, and the AES-256-GCM key exported for it. */
typedef struct {
    unsigned char id[16];
    unsigned char key[32];
    apr_uint64_t plain_len; /* the body's length before sealing */
} rdma_seal;

typedef struct {
    rdma_conn *rc;
    rdma_hdr h;
    rdma_seal *seal;     /* non-NULL: the request came over TLS, seal the body */
    apr_uint64_t limit;  /* largest body for this request */
    int mode;
    /* RDMA_OUT */
    int out_state;
    apr_uint64_t total;  /* body bytes consumed */
    apr_size_t fill;     /* static bounce: bytes waiting in g_static_mr */
    char *body;          /* client-reads: collected body (malloc) */
    apr_size_t body_cap;
    int body_in_static;
    void *map;           /* mmap of a file (dynamic) */
    char *bounce;        /* server-writes, dynamic: file read buffer (malloc) */
    size_t map_len;
    iwarp_mr *win;       /* the advertised or temporary registration */
    /* RDMA_IN */
    apr_uint64_t in_done;
    int in_eos, in_err;
    apr_bucket_brigade *pending;
    void *in_buf;        /* dynamic: malloc'd body buffer */
    iwarp_mr *in_mr;     /* the local buffer's registration */
} rdma_req;

/* ---- shared globals and functions, by file ---------------------------- */

/* mod_rdma.c: per-process state (child_init) */
extern iwarp_context *g_ctx;
/* RDMADevice (global): NULL for libiwarp's default (IWARP_DEVICE, else
 * soft), else "soft", "auto" or a kernel device name such as "siw0". */
extern const char *g_device;
extern iwarp_pd *g_pd;
extern iwarp_mr *g_static_mr;

/* config.c */
extern const command_rec rdma_cmds[];
void *create_dir_conf(apr_pool_t *p, char *d);
void *merge_dir_conf(apr_pool_t *p, void *basev, void *addv);
void *create_srv_conf(apr_pool_t *p, server_rec *s);
void *merge_srv_conf(apr_pool_t *p, void *basev, void *addv);
int cf_mode(const rdma_srv_conf *c);
apr_size_t cf_bufsize(const rdma_srv_conf *c);
apr_uint64_t cf_maxlen(const rdma_srv_conf *c);
apr_uint64_t cf_inline_below(const rdma_srv_conf *c);
int check_config(apr_pool_t *p, apr_pool_t *plog, apr_pool_t *ptemp, server_rec *s);
int cf_timeout(const rdma_srv_conf *c);
int cf_ctimeout(const rdma_srv_conf *c);
rdma_srv_conf *srv_conf(server_rec *s);
int port_allowed(const rdma_srv_conf *c, unsigned port);
const char *ports_text(apr_pool_t *p, const rdma_srv_conf *c);
int cf_tls(const rdma_srv_conf *c);

/* conn.c */
void conn_drop_qp(rdma_conn *rc);
int pre_connection(conn_rec *c, void *csd);
int conn_ensure(rdma_conn *rc, request_rec *r, const rdma_hdr *h, const char **why);
const char *xfer(rdma_conn *rc, request_rec *r, int opcode, uint64_t laddr, uint64_t len,
                 uint32_t lkey, uint64_t raddr, uint32_t rkey);
const char *send_ctrl(rdma_conn *rc, request_rec *r, const ctrl_msg *m);
const char *recv_ctrl(rdma_conn *rc, request_rec *r, ctrl_msg *m);
const char *recv_ctrl_for(rdma_conn *rc, request_rec *r, ctrl_msg *m, int tmo_ms);
int poll_ctrl(rdma_conn *rc, request_rec *r, ctrl_msg *m, const char **why);
int canon_ip(const char *in, char *out, size_t outlen);
int same_ip(const char *a, const char *b);

/* mod_rdma.c */
const char *iwarp_err(apr_pool_t *p);
apr_status_t req_cleanup(void *d);
const char *header_safe(apr_pool_t *p, const char *s);
int refuse(request_rec *r, int status, const char *why);
void connect_back_failed(const char *client);
void connect_back_succeeded(const char *client);

/* response.c */
void release_map(void *m, size_t len);
int map_pin(const void *m);
void map_unpin(void *m, size_t len);
apr_status_t rdma_out_filter(ap_filter_t *f, apr_bucket_brigade *bb);

/* expose.c */
int expo_take(rdma_conn *rc, const ctrl_msg *m);
void expo_reap(rdma_conn *rc, request_rec *r);
enum { EXPO_GRANT = 1, EXPO_STATIC = 2 };
const char *expo_make_room(rdma_conn *rc, request_rec *r, apr_uint64_t len, int flags);
void expo_add(rdma_conn *rc, request_rec *r, rdma_req *q);
void expo_release_all(rdma_conn *rc, const char *why);
int expo_holds_static(const rdma_conn *rc);

/* seal.c: RDMA bodies bound to the TLS session */
void seal_register_hooks(void);
void seal_child_init(server_rec *s);
int seal_is_tls(conn_rec *c);
const char *seal_setup(request_rec *r, rdma_req *q, int *status);
const char *seal_body(request_rec *r, rdma_seal *s, const char *pt, apr_uint64_t len,
                      char **ct, apr_uint64_t *ct_len);
apr_uint64_t seal_len(apr_uint64_t plain_len);
const char *seal_hex(apr_pool_t *p, const unsigned char *b, size_t n);

/* request.c */
apr_status_t rdma_in_filter(ap_filter_t *f, apr_bucket_brigade *bb, ap_input_mode_t mode,
                            apr_read_type_e block, apr_off_t readbytes);

#endif
