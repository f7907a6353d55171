/* mod_rdma: configuration.
 *
 * The directives (RDMA, RDMARegistration, RDMABufferSize, RDMAMaxLength,
 * RDMATimeout, RDMAConnectTimeout, RDMAAllowConnect, RDMAConnectPorts,
 * RDMATrustProxy, RDMATLS, RDMADevice, RDMACongestion, RDMAInlineBelow), their per-server and per-directory merging and the
 * defaults (docs/MOD_RDMA.md, "Directives"). */
#include "mod_rdma_private.h"

APLOG_USE_MODULE(rdma);

void *create_dir_conf(apr_pool_t *p, char *d)
{
    rdma_dir_conf *c = apr_pcalloc(p, sizeof *c);
    (void)d;
    c->enable = -1;
    return c;
}

void *merge_dir_conf(apr_pool_t *p, void *basev, void *addv)
{
    rdma_dir_conf *b = basev, *a = addv, *c = apr_pcalloc(p, sizeof *c);
    c->enable = a->enable != -1 ? a->enable : b->enable;
    return c;
}

void *create_srv_conf(apr_pool_t *p, server_rec *s)
{
    rdma_srv_conf *c = apr_pcalloc(p, sizeof *c);
    (void)s;
    c->mode = -1;
    c->allow_client = 1;
    c->allow = apr_array_make(p, 2, sizeof(char *));
    c->ports = apr_array_make(p, 2, sizeof(port_range));
    c->trust_proxy = -1;
    c->tls = -1;
    c->inline_below = -1;
    return c;
}

void *merge_srv_conf(apr_pool_t *p, void *basev, void *addv)
{
    rdma_srv_conf *b = basev, *a = addv, *c = apr_pcalloc(p, sizeof *c);
    c->mode = a->mode != -1 ? a->mode : b->mode;
    c->bufsize = a->bufsize ? a->bufsize : b->bufsize;
    c->maxlen = a->maxlen ? a->maxlen : b->maxlen;
    c->allow_set = a->allow_set || b->allow_set;
    c->allow_client = a->allow_set ? a->allow_client : b->allow_client;
    c->allow = a->allow_set ? a->allow : b->allow;
    c->timeout_ms = a->timeout_ms ? a->timeout_ms : b->timeout_ms;
    c->connect_timeout_ms = a->connect_timeout_ms ? a->connect_timeout_ms : b->connect_timeout_ms;
    c->ports_set = a->ports_set || b->ports_set;
    c->ports = a->ports_set ? a->ports : b->ports;
    c->trust_proxy = a->trust_proxy != -1 ? a->trust_proxy : b->trust_proxy;
    c->tls = a->tls != -1 ? a->tls : b->tls;
    c->congestion = a->congestion ? a->congestion : b->congestion;
    c->inline_below = a->inline_below != -1 ? a->inline_below : b->inline_below;
    return c;
}

int cf_mode(const rdma_srv_conf *c) { return c->mode == -1 ? MODE_STATIC : c->mode; }
apr_size_t cf_bufsize(const rdma_srv_conf *c) { return c->bufsize ? c->bufsize : DEF_BUFSIZE; }
apr_uint64_t cf_maxlen(const rdma_srv_conf *c) { return c->maxlen ? c->maxlen : DEF_MAXLEN; }
apr_uint64_t cf_inline_below(const rdma_srv_conf *c)
{
    /* Unset: the default, but never above RDMAMaxLength (a server with a
     * small RDMAMaxLength must not fail for a directive it never wrote). */
    if (c->inline_below == -1)
        return cf_maxlen(c) < (apr_uint64_t)DEF_INLINE_BELOW ? cf_maxlen(c)
                                                             : (apr_uint64_t)DEF_INLINE_BELOW;
    return (apr_uint64_t)c->inline_below;
}
int cf_timeout(const rdma_srv_conf *c) { return c->timeout_ms ? c->timeout_ms : DEF_TIMEOUT_MS; }
int cf_ctimeout(const rdma_srv_conf *c)
{
    return c->connect_timeout_ms ? c->connect_timeout_ms : DEF_CONNECT_TIMEOUT_MS;
}

/* "4096", "64K", "8M", "1G" */
static const char *parse_size(const char *arg, apr_uint64_t *out)
{
    char *end;
    apr_uint64_t mult = 1;
    unsigned long long n;
    errno = 0;
    n = strtoull(arg, &end, 10);
    if (end == arg || errno)
        return "not a size: use bytes or a K, M or G suffix";
    if (*end == 'K' || *end == 'k') { mult = 1ull << 10; end++; }
    else if (*end == 'M' || *end == 'm') { mult = 1ull << 20; end++; }
    else if (*end == 'G' || *end == 'g') { mult = 1ull << 30; end++; }
    if (*end || n == 0 || n > UINT64_MAX / mult)
        return "not a positive size: use bytes or a K, M or G suffix";
    *out = n * mult;
    return NULL;
}

static const char *set_enable(cmd_parms *cmd, void *dconf, int on)
{
    (void)cmd;
    ((rdma_dir_conf *)dconf)->enable = on;
    return NULL;
}

rdma_srv_conf *srv_conf(server_rec *s)
{
    return ap_get_module_config(s->module_config, &rdma_module);
}

static const char *set_mode(cmd_parms *cmd, void *d, const char *arg)
{
    rdma_srv_conf *c = srv_conf(cmd->server);
    (void)d;
    if (!strcasecmp(arg, "static"))
        c->mode = MODE_STATIC;
    else if (!strcasecmp(arg, "dynamic"))
        c->mode = MODE_DYNAMIC;
    else
        return "RDMARegistration must be static or dynamic";
    return NULL;
}

static const char *set_bufsize(cmd_parms *cmd, void *d, const char *arg)
{
    apr_uint64_t n;
    const char *err = parse_size(arg, &n);
    (void)d;
    if (err)
        return apr_pstrcat(cmd->pool, "RDMABufferSize: ", err, NULL);
    if (n < 4096 || n > (1ull << 31))
        return "RDMABufferSize must be between 4K and 2G";
    srv_conf(cmd->server)->bufsize = (apr_size_t)n;
    return NULL;
}

static const char *set_maxlen(cmd_parms *cmd, void *d, const char *arg)
{
    apr_uint64_t n;
    const char *err = parse_size(arg, &n);
    (void)d;
    if (err)
        return apr_pstrcat(cmd->pool, "RDMAMaxLength: ", err, NULL);
    srv_conf(cmd->server)->maxlen = n;
    return NULL;
}

/* RDMAInlineBelow SIZE: GETs of static files smaller than SIZE bytes are
 * answered inline (0: never). Same suffixes as the other sizes; 0 allowed.
 * Whether it stays below RDMAMaxLength is checked in check_config, once
 * every virtual host has merged both. */
static const char *set_inline_below(cmd_parms *cmd, void *d, const char *arg)
{
    apr_uint64_t n = 0;
    const char *err;
    (void)d;
    if (*arg == '-')
        return apr_pstrcat(cmd->pool, "RDMAInlineBelow ", arg, ": must not be negative: give "
                           "a size in bytes (K, M or G suffix), or 0 to move every body by RDMA",
                           NULL);
    if (strcmp(arg, "0") && (err = parse_size(arg, &n)) != NULL)
        return apr_pstrcat(cmd->pool, "RDMAInlineBelow ", arg, ": ", err,
                           " (0 moves every body by RDMA)", NULL);
    if (n > (apr_uint64_t)APR_INT64_MAX)
        return apr_pstrcat(cmd->pool, "RDMAInlineBelow ", arg, ": too large", NULL);
    srv_conf(cmd->server)->inline_below = (apr_int64_t)n;
    return NULL;
}

/* check_config hook: runs after the virtual hosts merged their settings
 * and before `apache2 -t` says "Syntax OK", so a wrong combination fails
 * the configuration test. */
int check_config(apr_pool_t *p, apr_pool_t *plog, apr_pool_t *ptemp, server_rec *s)
{
    (void)p; (void)ptemp;
    for (; s; s = s->next) {
        const rdma_srv_conf *c = srv_conf(s);
        if (c->inline_below != -1 && cf_inline_below(c) > cf_maxlen(c)) {
            ap_log_error(APLOG_MARK, APLOG_STARTUP | APLOG_CRIT, 0, s,
                         "mod_rdma: RDMAInlineBelow %" APR_UINT64_T_FMT " is above RDMAMaxLength %"
                         APR_UINT64_T_FMT " (server %s:%u): the threshold must lie within the "
                         "bodies RDMA may move. Fix: lower RDMAInlineBelow to at most "
                         "RDMAMaxLength, or raise RDMAMaxLength",
                         cf_inline_below(c), cf_maxlen(c),
                         s->server_hostname ? s->server_hostname : "(main)",
                         (unsigned)s->port);
            (void)plog;
            return HTTP_INTERNAL_SERVER_ERROR;
        }
    }
    return OK;
}

static const char *set_timeout(cmd_parms *cmd, void *d, const char *arg)
{
    int ms = atoi(arg);
    (void)d;
    if (ms <= 0)
        return "RDMATimeout takes a positive number of milliseconds";
    srv_conf(cmd->server)->timeout_ms = ms;
    return NULL;
}

static const char *set_ctimeout(cmd_parms *cmd, void *d, const char *arg)
{
    int ms = atoi(arg);
    (void)d;
    if (ms <= 0)
        return "RDMAConnectTimeout takes a positive number of milliseconds";
    srv_conf(cmd->server)->connect_timeout_ms = ms;
    return NULL;
}

/* Whether the word `name` is in the space-separated list of the file
 * `path` (a line of /proc/sys/net/ipv4); -1 if it cannot be read. */
static int in_proc_list(apr_pool_t *p, const char *path, const char *name)
{
    char buf[512], *tok, *last;
    FILE *f = fopen(path, "r");
    size_t n;
    (void)p;
    if (!f)
        return -1;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (tok = apr_strtok(buf, " \t\n", &last); tok; tok = apr_strtok(NULL, " \t\n", &last))
        if (!strcmp(tok, name))
            return 1;
    return 0;
}

/* RDMACongestion NAME: the TCP congestion control (TCP_CONGESTION, tcp(7))
 * of the RDMA connections this server opens. Checked here against what the
 * kernel offers, and against what it lets unprivileged processes choose:
 * the workers run as the User of the configuration, and tcp(7) allows a
 * process without CAP_NET_ADMIN only the algorithms in
 * tcp_allowed_congestion_control. */
static const char *set_congestion(cmd_parms *cmd, void *d, const char *arg)
{
    const char *s;
    int r;
    (void)d;
    if (!strcmp(arg, "default")) {
        srv_conf(cmd->server)->congestion = NULL;
        return NULL;
    }
    if (!*arg || strlen(arg) >= IWARP_CONGESTION_MAX)
        return apr_psprintf(cmd->pool, "RDMACongestion takes an algorithm name of 1 to %d bytes "
                            "(reno, cubic, bbr, ...) or \"default\"", IWARP_CONGESTION_MAX - 1);
    for (s = arg; *s; s++)
        if (!apr_isalnum(*s) && *s != '_' && *s != '-' && *s != '.')
            return "RDMACongestion: the name has characters no TCP congestion control has";
    r = in_proc_list(cmd->pool, "/proc/sys/net/ipv4/tcp_available_congestion_control", arg);
    if (r == 0)
        return apr_psprintf(cmd->pool,
                            "RDMACongestion %s: the kernel has no such TCP congestion control "
                            "(see /proc/sys/net/ipv4/tcp_available_congestion_control). Fix: "
                            "modprobe tcp_%s, or choose one of that list", arg, arg);
    r = in_proc_list(cmd->pool, "/proc/sys/net/ipv4/tcp_allowed_congestion_control", arg);
    if (r == 0)
        return apr_psprintf(cmd->pool,
                            "RDMACongestion %s: the Apache workers (unprivileged) may not choose "
                            "it: tcp(7) allows them only what "
                            "/proc/sys/net/ipv4/tcp_allowed_congestion_control lists. Fix: add it "
                            "there (sysctl -w net.ipv4.tcp_allowed_congestion_control=\"$(cat "
                            "/proc/sys/net/ipv4/tcp_allowed_congestion_control) %s\")", arg, arg);
    srv_conf(cmd->server)->congestion = apr_pstrdup(cmd->pool, arg);
    return NULL;
}

static const char *set_allow(cmd_parms *cmd, void *d, const char *arg)
{
    rdma_srv_conf *c = srv_conf(cmd->server);
    unsigned char tmp[16];
    (void)d;
    if (!c->allow_set) {
        c->allow_set = 1;
        c->allow_client = 0;
        apr_array_clear(c->allow);
    }
    if (!strcasecmp(arg, "client")) {
        c->allow_client = 1;
        return NULL;
    }
    if (inet_pton(AF_INET, arg, tmp) != 1 && inet_pton(AF_INET6, arg, tmp) != 1)
        return apr_pstrcat(cmd->pool, "RDMAAllowConnect: \"", arg,
                           "\" is neither \"client\" nor an IP address literal", NULL);
    *(const char **)apr_array_push(c->allow) = apr_pstrdup(cmd->pool, arg);
    return NULL;
}

/* RDMAConnectPorts 1024-65535 80 ...: a port or an inclusive range. */
static const char *set_ports(cmd_parms *cmd, void *d, const char *arg)
{
    rdma_srv_conf *c = srv_conf(cmd->server);
    port_range pr;
    char *end;
    unsigned long lo, hi;
    (void)d;
    if (!c->ports_set) {
        c->ports_set = 1;
        apr_array_clear(c->ports);
    }
    errno = 0;
    lo = strtoul(arg, &end, 10);
    hi = lo;
    if (end != arg && *end == '-') {
        const char *h = end + 1;
        hi = strtoul(h, &end, 10);
        if (end == h)
            end = (char *)arg; /* "80-" */
    }
    if (end == arg || *end || errno || lo == 0 || hi > 65535 || lo > hi)
        return apr_pstrcat(cmd->pool, "RDMAConnectPorts: \"", arg,
                           "\" is neither a port (1-65535) nor a range such as 1024-65535",
                           NULL);
    pr.lo = (unsigned)lo;
    pr.hi = (unsigned)hi;
    *(port_range *)apr_array_push(c->ports) = pr;
    return NULL;
}

const char *g_device;

/* The name lives in the configuration pool: forget it with the pool, so a
 * reloaded configuration without RDMADevice goes back to the default. */
static apr_status_t forget_device(void *unused)
{
    (void)unused;
    g_device = NULL;
    return APR_SUCCESS;
}

/* RDMADevice NAME: the device every worker opens. One per server (the
 * device is opened per process, before any virtual host is known). The
 * name is checked here for its form only; whether the device exists is
 * known when a worker opens it (child_init logs the cause and the fix). */
static const char *set_device(cmd_parms *cmd, void *d, const char *arg)
{
    const char *p;
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    (void)d;
    if (err)
        return err;
    if (!*arg || strlen(arg) > 63)
        return "RDMADevice: give soft, auto, or a kernel RDMA device name as ibv_devices lists "
               "it (siw0, rxe0, mlx5_0)";
    for (p = arg; *p; p++)
        if (!apr_isalnum(*p) && *p != '_' && *p != '-' && *p != '.')
            return apr_psprintf(cmd->pool,
                                "RDMADevice: \"%s\" is not a device name: give soft, auto, or a "
                                "kernel RDMA device name as ibv_devices lists it (siw0, rxe0)",
                                arg);
    g_device = arg;
    apr_pool_cleanup_register(cmd->pool, NULL, forget_device, apr_pool_cleanup_null);
    return NULL;
}

static const char *set_trust_proxy(cmd_parms *cmd, void *d, int on)
{
    (void)d;
    srv_conf(cmd->server)->trust_proxy = on;
    return NULL;
}

/* RDMATLS encrypt|off: what RDMA does for a request that came over TLS
 * (mod_ssl). encrypt (default): the body is sealed under the TLS session's
 * exporter (seal.c); off: the RDMA header is ignored on TLS connections,
 * so the body goes in the HTTPS response. */
static const char *set_tls(cmd_parms *cmd, void *d, const char *arg)
{
    (void)d;
    if (!strcasecmp(arg, "encrypt"))
        srv_conf(cmd->server)->tls = TLS_ENCRYPT;
    else if (!strcasecmp(arg, "off"))
        srv_conf(cmd->server)->tls = TLS_OFF;
    else
        return apr_psprintf(cmd->pool, "RDMATLS must be encrypt or off, not \"%s\"", arg);
    return NULL;
}

int cf_tls(const rdma_srv_conf *c)
{
    return c->tls == -1 ? TLS_ENCRYPT : c->tls;
}

int port_allowed(const rdma_srv_conf *c, unsigned port)
{
    int i;
    if (!c->ports_set)
        return port >= DEF_PORT_LO && port <= DEF_PORT_HI;
    for (i = 0; i < c->ports->nelts; i++) {
        const port_range *pr = &APR_ARRAY_IDX(c->ports, i, port_range);
        if (port >= pr->lo && port <= pr->hi)
            return 1;
    }
    return 0;
}

/* The ports a refusal names: the configured list, or the default. */
const char *ports_text(apr_pool_t *p, const rdma_srv_conf *c)
{
    const char *t = NULL;
    int i;
    if (!c->ports_set)
        return apr_psprintf(p, "%u-%u", DEF_PORT_LO, DEF_PORT_HI);
    for (i = 0; i < c->ports->nelts; i++) {
        const port_range *pr = &APR_ARRAY_IDX(c->ports, i, port_range);
        const char *one = pr->lo == pr->hi ? apr_psprintf(p, "%u", pr->lo)
                                           : apr_psprintf(p, "%u-%u", pr->lo, pr->hi);
        t = t ? apr_pstrcat(p, t, " ", one, NULL) : one;
    }
    return t;
}

const command_rec rdma_cmds[] = {
    AP_INIT_FLAG("RDMA", set_enable, NULL, OR_OPTIONS | ACCESS_CONF | RSRC_CONF,
                 "On: honour the RDMA: request header here; Off (default): plain HTTP only"),
    AP_INIT_TAKE1("RDMARegistration", set_mode, NULL, RSRC_CONF,
                  "static (default): copy through a per-process buffer registered at start-up; "
                  "dynamic: register the file mapping or the body where it lies, per request"),
    AP_INIT_TAKE1("RDMABufferSize", set_bufsize, NULL, RSRC_CONF,
                  "size of the per-process static buffer (default 8M)"),
    AP_INIT_TAKE1("RDMAMaxLength", set_maxlen, NULL, RSRC_CONF,
                  "largest body moved by RDMA (default 1G)"),
    AP_INIT_TAKE1("RDMAInlineBelow", set_inline_below, NULL, RSRC_CONF,
                  "GETs of static files smaller than this many bytes are answered in the HTTP "
                  "response, as plain Apache would, with an RDMA-Inline header (0: never; "
                  "default 512K)"),
    AP_INIT_ITERATE("RDMAAllowConnect", set_allow, NULL, RSRC_CONF,
                    "where the server may connect back: \"client\" (the request's own address, "
                    "the default) and/or IP address literals"),
    AP_INIT_ITERATE("RDMAConnectPorts", set_ports, NULL, RSRC_CONF,
                    "ports the server may connect back to: ports and ranges such as "
                    "1024-65535 (the default: no privileged ports)"),
    AP_INIT_FLAG("RDMATrustProxy", set_trust_proxy, NULL, RSRC_CONF,
                 "Off (default): refuse RDMA for requests that came through a proxy; On: "
                 "connect back to the client address the proxy reports (mod_remoteip)"),
    AP_INIT_TAKE1("RDMATLS", set_tls, NULL, RSRC_CONF,
                  "encrypt (default): over HTTPS, RDMA bodies are sealed with AES-256-GCM under "
                  "a key from the TLS session's exporter (the client must send RDMA-Seal); off: "
                  "no RDMA on TLS connections, bodies go in the HTTPS response"),
    AP_INIT_TAKE1("RDMATimeout", set_timeout, NULL, RSRC_CONF,
                  "bound on each RDMA transfer and DONE wait, in ms (default 30000)"),
    AP_INIT_TAKE1("RDMAConnectTimeout", set_ctimeout, NULL, RSRC_CONF,
                  "bound on connecting to the client's listener, in ms (default 3000)"),
    AP_INIT_TAKE1("RDMACongestion", set_congestion, NULL, RSRC_CONF,
                  "TCP congestion control of the RDMA connections the server opens: reno, "
                  "cubic, bbr, ... (default: the kernel's default)"),
    AP_INIT_TAKE1("RDMADevice", set_device, NULL, RSRC_CONF,
                  "RDMA device of the workers: soft (software iWARP over TCP), auto (a kernel "
                  "RDMA device if there is one, else soft), or a kernel device such as siw0 "
                  "(default: the IWARP_DEVICE environment variable, else soft)"),
    {NULL}
};
