/* mod_rdma: RDMA bodies bound to the TLS session (RDMATLS encrypt).
 *
 * A request that came over TLS (mod_ssl) must not have its body travel in
 * clear on the RDMA connection, which is plain TCP. The client sends
 *
 *     RDMA-Seal: aes-256-gcm, id=<32 hex digits>
 *
 * (16 random bytes that name this transfer). Both ends derive the key from
 * the TLS session's exporter (RFC 8446 section 7.5; RFC 5705 for TLS 1.2):
 *
 *     key = TLS-Exporter("EXPORTER-iwarp-rdma-body", context = id, 32)
 *
 * and the body is sealed with AES-256-GCM in records of SEAL_CHUNK
 * plaintext bytes, each followed by its 16-byte tag:
 *
 *     nonce(i) = id[0..4] || i (64 bits, big-endian)         12 bytes
 *     aad(i)   = i (64 bits, big-endian) || last (1 byte: 1 for the last)
 *
 * An empty body is one empty record (its tag alone), so every body has a
 * last record and a truncated one is detected. What travels by RDMA is the
 * sealed body; the answer says `RDMA: <scheme>, length=<sealed length>`
 * and `RDMA-Seal: aes-256-gcm, id=<id>, length=<plain length>`. The client
 * checks every tag before it releases any byte. Only someone who holds
 * the TLS session's secrets can derive the key, so the body is as
 * confidential and authentic as the HTTPS response would have been, and a
 * body cannot be replayed into another transfer (another id, another key)
 * or another TLS session (another exporter secret).
 *
 * The SSL object comes from mod_ssl's optional hook `ssl_pre_handshake`
 * (httpd 2.4 modules/ssl/mod_ssl_openssl.h, which Debian's apache2-dev
 * does not ship: its one declaration is repeated below), which hands each
 * connection's SSL* to other modules; it is kept in the connection pool's
 * user data. OpenSSL's SSL_export_keying_material computes the exporter,
 * EVP's AES-256-GCM seals (AES-NI where the CPU has it).
 *
 * Test hook (test-only, scripts/test-modrdma-https.sh): with the
 * environment variable MOD_RDMA_TEST_TAMPER_SEALED=1 in the server's
 * environment, one byte of every sealed body is flipped after sealing, so
 * the client's tag check must fail. It is logged at child start. */
#include "mod_rdma_private.h"
#include "http_ssl.h"
#include "apr_optional_hooks.h"

#include <openssl/evp.h>
#include <openssl/ssl.h>

APLOG_USE_MODULE(rdma);

#define SEAL_LABEL "EXPORTER-iwarp-rdma-body"
#define SEAL_CHUNK ((apr_uint64_t)64 << 10)
#define SEAL_TAG 16u
#define SEAL_USERDATA "mod_rdma:ssl"

/* httpd modules/ssl/mod_ssl_openssl.h (2.4.x):
 * APR_DECLARE_EXTERNAL_HOOK(ssl, SSL, int, pre_handshake,
 *                           (conn_rec *c, SSL *ssl, int is_proxy))
 * run by mod_ssl for each connection once its SSL object exists. */
typedef int ssl_HOOK_pre_handshake_t(conn_rec *c, SSL *ssl, int is_proxy);

static int g_tamper; /* MOD_RDMA_TEST_TAMPER_SEALED */

static int pre_handshake(conn_rec *c, SSL *ssl, int is_proxy)
{
    if (!is_proxy)
        apr_pool_userdata_setn(ssl, SEAL_USERDATA, NULL, c->pool);
    return DECLINED;
}

void seal_register_hooks(void)
{
    APR_OPTIONAL_HOOK(ssl, pre_handshake, pre_handshake, NULL, NULL, APR_HOOK_MIDDLE);
}

void seal_child_init(server_rec *s)
{
    const char *t = getenv("MOD_RDMA_TEST_TAMPER_SEALED");
    g_tamper = t && !strcmp(t, "1");
    if (g_tamper)
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s,
                     "mod_rdma: pid %ld: TEST HOOK MOD_RDMA_TEST_TAMPER_SEALED=1: every sealed "
                     "RDMA body is corrupted on purpose (clients must refuse it). Fix: unset it "
                     "outside tests", (long)getpid());
}

int seal_is_tls(conn_rec *c)
{
    return ap_ssl_conn_is_ssl(c);
}

const char *seal_hex(apr_pool_t *p, const unsigned char *b, size_t n)
{
    char *s = apr_palloc(p, 2 * n + 1);
    size_t i;
    for (i = 0; i < n; i++)
        apr_snprintf(s + 2 * i, 3, "%02x", b[i]);
    return s;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = apr_tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* `aes-256-gcm, id=<32 hex digits>` (OWS around the comma). */
static const char *parse_seal(const char *v, unsigned char id[16])
{
    const char *p = v;
    int i;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncasecmp(p, "aes-256-gcm", 11))
        return "the cipher must be aes-256-gcm";
    p += 11;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p++ != ',')
        return "expected \", id=<32 hex digits>\" after the cipher";
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncasecmp(p, "id=", 3))
        return "expected id=<32 hex digits>";
    p += 3;
    for (i = 0; i < 16; i++) {
        int hi = hexval((unsigned char)p[2 * i]), lo = hi < 0 ? -1 : hexval((unsigned char)p[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return "id must be 32 hex digits";
        id[i] = (unsigned char)(hi << 4 | lo);
    }
    p += 32;
    while (*p == ' ' || *p == '\t')
        p++;
    return *p ? "unexpected text after id" : NULL;
}

/* For a GET that came over TLS with RDMATLS encrypt: parse RDMA-Seal and
 * derive the key. NULL, or the reason for the client with *status. */
const char *seal_setup(request_rec *r, rdma_req *q, int *status)
{
    const char *v = apr_table_get(r->headers_in, "RDMA-Seal"), *e;
    SSL *ssl = NULL;
    rdma_seal *s;
    if (!v) {
        *status = HTTP_BAD_REQUEST;
        return "this request came over TLS: an RDMA body must be sealed under the TLS "
               "session, and the request has no RDMA-Seal header (send RDMA-Seal: aes-256-gcm, "
               "id=<32 hex digits>, or fetch it over plain HTTPS)";
    }
    s = apr_pcalloc(r->pool, sizeof *s);
    if ((e = parse_seal(v, s->id)) != NULL) {
        *status = HTTP_BAD_REQUEST;
        return apr_pstrcat(r->pool, "malformed RDMA-Seal header: ", e, NULL);
    }
    apr_pool_userdata_get((void **)&ssl, SEAL_USERDATA, r->connection->pool);
    if (!ssl) {
        *status = HTTP_SERVICE_UNAVAILABLE;
        return "the TLS session of this connection is not available to mod_rdma (mod_ssl did "
               "not run its pre_handshake hook), so the body cannot be sealed; fetch it over "
               "plain HTTPS";
    }
    /* RFC 8446 section 7.5 / RFC 5705 section 4: the exporter with a
     * context value (use_context = 1), the transfer id. */
    if (SSL_export_keying_material(ssl, s->key, sizeof s->key, SEAL_LABEL, strlen(SEAL_LABEL),
                                   s->id, sizeof s->id, 1) != 1) {
        *status = HTTP_SERVICE_UNAVAILABLE;
        return "the TLS session's exporter failed (SSL_export_keying_material), so the body "
               "cannot be sealed; fetch it over plain HTTPS";
    }
    q->seal = s;
    return NULL;
}

/* The sealed length of a body of plain_len bytes: one tag per record,
 * and at least one record. */
apr_uint64_t seal_len(apr_uint64_t plain_len)
{
    apr_uint64_t n = plain_len ? (plain_len + SEAL_CHUNK - 1) / SEAL_CHUNK : 1;
    return plain_len + n * SEAL_TAG;
}

static void be64(unsigned char *p, apr_uint64_t v)
{
    int i;
    for (i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

/* Seal `len` bytes at pt into a new malloc'd buffer (*ct, *ct_len; the
 * caller frees it). NULL, or what failed. */
const char *seal_body(request_rec *r, rdma_seal *s, const char *pt, apr_uint64_t len, char **ct,
                      apr_uint64_t *ct_len)
{
    apr_uint64_t total = seal_len(len), off = 0, i = 0;
    EVP_CIPHER_CTX *ctx;
    unsigned char *out;
    const char *e = NULL;
    *ct = NULL;
    if ((apr_size_t)total != total || !(out = malloc((size_t)total ? (size_t)total : 1)))
        return apr_psprintf(r->pool, "out of memory for the sealed body (%" APR_UINT64_T_FMT
                            " bytes)", total);
    if (!(ctx = EVP_CIPHER_CTX_new()) ||
        EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, s->key, NULL) != 1) {
        e = "initialising AES-256-GCM failed (OpenSSL)";
        goto out;
    }
    for (;;) {
        apr_uint64_t n = len - off < SEAL_CHUNK ? len - off : SEAL_CHUNK;
        unsigned char nonce[12], aad[9], *dst = out + off + i * SEAL_TAG;
        int last = off + n == len, w = 0, w2 = 0;
        memcpy(nonce, s->id, 4);
        be64(nonce + 4, i);
        be64(aad, i);
        aad[8] = (unsigned char)last;
        if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1 ||
            EVP_EncryptUpdate(ctx, NULL, &w, aad, sizeof aad) != 1 ||
            (n && EVP_EncryptUpdate(ctx, dst, &w, (const unsigned char *)pt + off, (int)n) != 1) ||
            EVP_EncryptFinal_ex(ctx, dst + n, &w2) != 1 ||
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG, dst + n) != 1) {
            e = "AES-256-GCM sealing failed (OpenSSL)";
            goto out;
        }
        off += n;
        i++;
        if (last)
            break;
    }
    if (g_tamper) {
        out[total / 2] ^= 0x01;
        ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r,
                      "mod_rdma: TEST HOOK: flipped byte %" APR_UINT64_T_FMT " of the sealed body",
                      total / 2);
    }
out:
    EVP_CIPHER_CTX_free(ctx);
    if (e) {
        free(out);
        return e;
    }
    *ct = (char *)out;
    *ct_len = total;
    return NULL;
}
