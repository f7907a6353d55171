//! `rhttp`: an HTTP client like wget/curl that moves bodies by RDMA
//! (software iWARP) when the server runs mod_rdma, and falls back to plain
//! HTTP when it does not. See `rhttp --help` and `docs/MOD_RDMA.md`.
//!
//! Files by role: this one holds the command line and its settings, the
//! HTTP session, the sinks, and `get` one request at a time (plain,
//! server-writes, client-reads); `recursive.rs` drives `get -r`/`-p`
//! (the crawl itself is the library's `crawl`); `rdma.rs` the RDMA
//! side of a session (listener, connection, buffers, control messages,
//! bounded waits); `pipeline.rs` pipelined GETs; `put.rs` uploads and the
//! `probe-stag` test command. The protocol codecs are the library's
//! (`lib.rs`).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use iwarp::cm::{CongestionControl, ConnParam, Listener, MpaConfig, Policy};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr,
    QpState, QueuePair, RecvWr, SendWr, SgList, WcStatus, WrOpcode,
};
use rhttp::ctrl::{CtrlMsg, Kind, MSG_LEN};
use rhttp::header::{private_data_matches, RdmaHeader, Scheme};
use rhttp::http::{Conn, Response, Url};

/// HTTP client that moves request and response bodies by RDMA (software
/// iWARP) to and from an Apache httpd running mod_rdma. The client listens
/// for the server's RDMA connection on the local address of its HTTP
/// connection; one RDMA connection serves all requests of one keep-alive
/// HTTP connection. Without an RDMA answer it falls back to plain HTTP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// Plain HTTP only (no RDMA header): the baseline.
    #[arg(long, global = true)]
    plain: bool,
    /// Largest body moved by RDMA (the advertised maxlen and the size of
    /// the receive buffer), e.g. 256M [default: 256M on soft, 32M on a
    /// kernel device, where registering the buffer pins all of it].
    #[arg(long, global = true, value_parser = parse_size)]
    max_len: Option<u64>,
    /// Bound on every network wait, in seconds.
    #[arg(long, global = true, default_value_t = 30)]
    timeout: u64,
    /// No progress bar.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// MPA CRC32C on the RDMA connection (RFC 5044 §4.4): `required` (the
    /// default: a byte corrupted on the way, e.g. by a faulty middlebox,
    /// ends the transfer with an error instead of reaching the body; the
    /// server uses CRC because our MPA Reply enables it), `optional` (only
    /// if the server asks), or `off`.
    #[arg(long, global = true, value_enum, default_value_t = CrcArg::Required)]
    crc: CrcArg,
    /// RDMA device: soft (software iWARP over TCP), auto (a kernel RDMA
    /// device if there is one, else soft), or a kernel device as
    /// `ibv_devices` lists it (siw0, rxe0, mlx5_0). Default: the
    /// IWARP_DEVICE environment variable, else soft. (`--crc` applies to
    /// soft only: a kernel device's MPA follows its own settings.)
    #[arg(long, global = true, value_name = "NAME")]
    device: Option<String>,
    /// TCP congestion control of this client's connections (tcp(7)
    /// TCP_CONGESTION): reno, cubic, bbr, ... as
    /// /proc/sys/net/ipv4/tcp_available_congestion_control lists them.
    /// It governs what this client sends (uploads; the RDMA Read
    /// Responses of server-reads); what the server sends (GET bodies)
    /// follows the server's choice, mod_rdma's `RDMACongestion`.
    /// [default: the kernel's default]
    #[arg(long, global = true, value_name = "ALGO")]
    congestion: Option<CongestionControl>,
    /// https:// URLs: trust the CA certificate(s) (or the server's own
    /// certificate) in this PEM file instead of the system's
    /// (/etc/ssl/certs/ca-certificates.crt).
    #[arg(long, global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// https:// URLs: do not check the server's certificate (curl -k). The
    /// connection is encrypted, but anyone on the path could pose as the
    /// server; RDMA bodies are still sealed under that TLS session.
    #[arg(short = 'k', long, global = true)]
    insecure: bool,
}

/// The TLS configuration when the URLs are https:// (set once in `get`).
static TLS: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();

/// "https" when the URLs are https://, else "http" (for messages).
fn url_scheme() -> &'static str {
    if TLS.get().is_some() {
        "https"
    } else {
        "http"
    }
}

/// `--congestion`, set once in `main`.
static CONGESTION: std::sync::OnceLock<Option<CongestionControl>> = std::sync::OnceLock::new();

fn congestion() -> Option<&'static CongestionControl> {
    CONGESTION.get().and_then(Option::as_ref)
}

/// `--max-len` when not given: the software provider registers an
/// anonymous mapping without touching it, so a large buffer costs nothing
/// until used; a kernel device pins every page at `ibv_reg_mr` (measured on
/// siw0 in the 1.5 GiB siw-vm guest: 256 MiB failed with ENOMEM).
const DEFAULT_MAX_LEN_SOFT: u64 = 256 << 20;
const DEFAULT_MAX_LEN_KERNEL: u64 = 32 << 20;

fn max_len(a: &Args) -> u64 {
    a.max_len.unwrap_or_else(|| match open_device() {
        Ok(ctx) if ctx.device_name() != "soft" => DEFAULT_MAX_LEN_KERNEL,
        _ => DEFAULT_MAX_LEN_SOFT,
    })
}

/// `--device`, set once in `main`.
static DEVICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

fn open_device() -> Result<Context, iwarp::Error> {
    match DEVICE.get().and_then(Option::as_deref) {
        Some(d) => Context::open_device(d),
        None => Context::open(),
    }
}

/// `--crc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CrcArg {
    Required,
    Optional,
    Off,
}

impl From<CrcArg> for Policy {
    fn from(c: CrcArg) -> Policy {
        match c {
            CrcArg::Required => Policy::Required,
            CrcArg::Optional => Policy::Optional,
            CrcArg::Off => Policy::Off,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Fetch URLs over one keep-alive connection per host.
    Get {
        /// http:// or https:// URLs (all of one scheme). Over https the
        /// RDMA body is sealed under the TLS session (AES-256-GCM, the key
        /// from the TLS exporter; docs/MOD_RDMA.md, "HTTPS"); -r and -p
        /// take http:// only, and https fetches one request at a time.
        #[arg(required = true)]
        urls: Vec<String>,
        /// Recursive, like `wget -r`: fetch each URL, then what its pages
        /// link (`<a href>`, `<img src>`, `<link href>`, `<script src>`,
        /// `<iframe>`, ...) down to --level, breadth first, on the same
        /// host and port only (never another host), each URL once, over
        /// the same HTTP connection and its one RDMA connection; honours
        /// robots.txt; saves under -P DIR/HOST[:PORT]/PATH.
        #[arg(short, long)]
        recursive: bool,
        /// -r's depth: 1 is the pages and what they link; `inf` (or 0) no
        /// limit but --max-files [default: 5, as wget].
        #[arg(short = 'l', long, value_name = "N", value_parser = parse_level)]
        level: Option<Level>,
        /// Also fetch what each page needs to be shown (`<img src>`,
        /// `<link rel=stylesheet|icon>`, `<script src>`, ...), even past
        /// --level and, with --no-parent, outside the directory; without
        /// -r: the given pages and their requisites (`wget -p`).
        #[arg(short = 'p', long)]
        page_requisites: bool,
        /// Never go above the starting URLs' directories (`wget -np`).
        #[arg(long)]
        no_parent: bool,
        /// No HOST[:PORT] directory under -P (`wget -nH`).
        #[arg(long)]
        no_host_directories: bool,
        /// `-nH` (= --no-host-directories) and `-np` (= --no-parent), as
        /// wget spells them.
        #[arg(short = 'n', value_name = "H|p", value_parser = ["H", "p"])]
        no: Vec<String>,
        /// wget's `-e robots=off`: do not read or honour robots.txt (RFC
        /// 9309); `robots=on` is the default.
        #[arg(short = 'e', long, value_name = "robots=on|off", value_parser = parse_execute)]
        execute: Vec<bool>,
        /// -r/-p: queue at most this many URLs (a bound on a hostile
        /// server's pages: a million links, a link loop).
        #[arg(long, value_name = "N", default_value_t = 10_000,
              value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        max_files: u64,
        /// Where -r and -p save (like wget's --directory-prefix).
        #[arg(short = 'P', long, default_value = ".", value_name = "DIR")]
        directory_prefix: PathBuf,
        /// Requests in flight on the HTTP connection (HTTP/1.1 pipelining;
        /// 1 = one at a time, at most 8): saves a round trip per object on a
        /// long path. Each server-writes request in flight has its own
        /// --max-len slot of the receive buffer (a mapping: unused pages
        /// cost nothing on the software device; a kernel device pins them).
        /// [default: 8 with -r, else 1]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=8))]
        pipeline: Option<u64>,
        /// Print a summary at the end: requests, bodies moved by RDMA,
        /// bytes, HTTP and RDMA connections made, total time.
        #[arg(long)]
        stats: bool,
        /// Output file for each URL in order ("-" for stdout); URLs without
        /// one are saved under their last path segment.
        #[arg(short, long)]
        output: Vec<PathBuf>,
        /// Who moves the body.
        #[arg(long, value_enum, default_value_t = GetScheme::ServerWrites)]
        scheme: GetScheme,
        /// Test hook: with client-reads, print the advertised STag and wait
        /// this long before the RDMA Read.
        #[arg(long, hide = true, default_value_t = 0)]
        x_hold_ms: u64,
        /// Test hook: after sending a request that needs a new RDMA
        /// connection, print a line and wait this long before accepting the
        /// server's connection (the server waits in its connect; a test
        /// changes the file on the server meanwhile).
        #[arg(long, hide = true, default_value_t = 0)]
        x_delay_accept_ms: u64,
        /// Test hook: after this many GETs, close the RDMA connection (the
        /// HTTP connection stays open): the server must notice and connect
        /// again for the next request.
        #[arg(long, hide = true)]
        x_drop_rdma_after: Option<usize>,
        /// Test hook: before sending each RDMA request, print the RDMA
        /// listener's address and wait for a line on standard input (a
        /// test connects an impostor to the listener meanwhile).
        #[arg(long, hide = true)]
        x_pause_before_request: bool,
        /// Test hook: over https, flip one byte of each sealed RDMA body
        /// as received, before it is checked (the check must refuse it).
        #[arg(long, hide = true)]
        x_tamper_sealed: bool,
    },
    /// Upload FILE to URL with PUT (or POST).
    Put {
        file: PathBuf,
        url: String,
        /// Send the body with POST instead of PUT.
        #[arg(long)]
        post: bool,
        /// Who moves the body.
        #[arg(long, value_enum, default_value_t = PutScheme::ServerReads)]
        scheme: PutScheme,
        /// Save the response body here ("-" for stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Test hook: with client-writes, answer the Nth BUF with ABORT.
        #[arg(long, hide = true)]
        x_abort_at_buf: Option<u32>,
        /// Test hook: with server-reads, advertise a wrong STag.
        #[arg(long, hide = true)]
        x_bad_stag: bool,
    },
    /// Test hook: fetch URL with client-reads, then try an RDMA Read of the
    /// given STag (default: the STag of that fetch, after DONE) on this
    /// connection. Exits 0 if the server refused the access.
    #[command(hide = true)]
    ProbeStag {
        url: String,
        #[arg(long, value_parser = parse_u64)]
        stag: Option<u64>,
        #[arg(long, value_parser = parse_u64)]
        to: Option<u64>,
        #[arg(long, default_value_t = 4096)]
        len: u32,
        /// Instead: before DONE, Read one byte more than the server granted.
        #[arg(long)]
        beyond: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum GetScheme {
    ServerWrites,
    ClientReads,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PutScheme {
    ServerReads,
    ClientWrites,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number"))
}

/// `--level`: the deepest level, `None` for no limit.
#[derive(Clone, Copy, Debug)]
struct Level(Option<u32>);

/// `--level`: a depth, or `inf`/0 for none (wget's `-l inf`, `-l 0`).
fn parse_level(s: &str) -> Result<Level, String> {
    if s.eq_ignore_ascii_case("inf") {
        return Ok(Level(None));
    }
    match s.parse::<u32>() {
        Ok(0) => Ok(Level(None)),
        Ok(n) => Ok(Level(Some(n))),
        Err(_) => Err(format!("{s:?} is not a depth (a number, or inf)")),
    }
}

/// `-e robots=on|off`, the one wgetrc command rhttp knows.
fn parse_execute(s: &str) -> Result<bool, String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: -e takes robots=on or robots=off"))?;
    if !k.trim().eq_ignore_ascii_case("robots") {
        return Err(format!("{s:?}: rhttp's -e knows only robots=on|off"));
    }
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "yes" => Ok(true),
        "off" | "0" | "no" => Ok(false),
        _ => Err(format!("{s:?}: robots= takes on or off")),
    }
}

/// `--max-len`: a size as every tool writes it (crates/iwarp-conf), not 0.
fn parse_size(s: &str) -> Result<u64, String> {
    match iwarp_conf::parse_size(s)? {
        0 => Err(format!(
            "{s:?}: --max-len must be above 0, e.g. 64K or 256M"
        )),
        n => Ok(n),
    }
}

type Res<T> = Result<T, String>;

mod pipeline;
mod put;
mod rdma;
mod recursive;
mod sink;
use pipeline::*;
use put::*;
use rdma::*;
use sink::{bar, copy_out, open_sink, Sink};

/// Print one transfer's result line on stderr with a single `write`
/// (stderr is unbuffered: `eprintln!` wrote each formatted piece with its
/// own system call, about twenty per line).
fn report(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut s = line.to_string();
    s.push('\n');
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// How long rhttp polls for a completion (a Read Response, the server's
/// DONE), reading the RDMA connection itself, before it sleeps in
/// `poll(2)` (the spin of its [`ProgressMode::AppDriven`] CQs; waits that
/// also watch the HTTP socket sleep at once): on loopback the answer
/// usually comes within it. Longer spins cost the server the CPU on a
/// loaded machine (1 MB client-reads under two busy processes: 0.76-0.97
/// ms with 500 us against 0.28-0.30 with 50).
const SPIN_PROGRESS: Duration = Duration::from_micros(50);

/// Set TCP_CONGESTION (tcp(7)) on a connected socket; the kernel switches
/// the connection's algorithm at once. ENOENT: the kernel lacks it.
fn set_tcp_congestion(sock: &std::net::TcpStream, cc: &CongestionControl) -> io::Result<()> {
    let name = cc.as_str().as_bytes();
    // SAFETY: a live socket; optval points to `name.len()` readable bytes.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::ENOENT) => io::Error::new(
                e.kind(),
                format!(
                    "{e}: the kernel has no such algorithm (see \
                     /proc/sys/net/ipv4/tcp_available_congestion_control; modprobe tcp_{cc})"
                ),
            ),
            Some(libc::EPERM) => io::Error::new(
                e.kind(),
                format!(
                    "{e}: unprivileged processes may choose only what \
                     /proc/sys/net/ipv4/tcp_allowed_congestion_control lists"
                ),
            ),
            _ => e,
        })
    }
}

/// One HTTP connection plus its RDMA side.
struct Session {
    url0: Url,
    http: Conn,
    rdma: Option<Rdma>,
    args_timeout: Duration,
    crc: Policy,
}

impl Session {
    fn open(url: &Url, timeout: Duration, crc: Policy) -> Res<Session> {
        let http = match TLS.get() {
            Some(tls) => Conn::connect_tls(url, timeout, tls.clone()),
            None => Conn::connect(url, timeout),
        }
        .map_err(|e| {
            format!(
                "connecting to {}:{}: {e}; is the server running?",
                url.host, url.port
            )
        })?;
        HTTP_CONNS.fetch_add(1, Ordering::Relaxed);
        if let Some(cc) = congestion() {
            set_tcp_congestion(http.stream(), cc)
                .map_err(|e| format!("--congestion {cc} on the HTTP connection: {e}"))?;
        }
        Ok(Session {
            url0: url.clone(),
            http,
            rdma: None,
            args_timeout: timeout,
            crc,
        })
    }

    fn rdma(&mut self) -> Res<&mut Rdma> {
        if self.rdma.is_none() {
            self.rdma = Some(Rdma::new(&self.http, self.args_timeout, self.crc)?);
        }
        Ok(self.rdma.as_mut().expect("just set"))
    }

    fn reopen_if(&mut self, close: bool) -> Res<()> {
        if close {
            let url = self.url0.clone();
            *self = Session::open(&url, self.args_timeout, self.crc)?;
        }
        Ok(())
    }
}

/// Bytes copied into the registered buffer per step (uploads): small
/// enough to stay in the L2 cache between the read and the copy.
const COPY_CHUNK: usize = 256 << 10;

thread_local! {
    /// The upload scratch buffer, allocated once per thread: a fresh
    /// megabyte per request costs page faults, zeroing and, when it is
    /// unmapped again, TLB shoot-downs.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; COPY_CHUNK]);
}

/// Read the first `len` bytes of `f` into the registered buffer, through
/// the scratch buffer.
fn copy_in(f: &mut File, buf: &MemoryRegion, len: u64) -> Res<()> {
    SCRATCH.with(|scratch| {
        let tmp = &mut scratch.borrow_mut()[..];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(tmp.len() as u64) as usize;
            read_file_at(f, off, &mut tmp[..n])?;
            buf.write_at(off as usize, &tmp[..n]);
            off += n as u64;
        }
        Ok(())
    })
}

/// What one GET did.
struct Outcome {
    status: u16,
    bytes: u64,
    via: String,
    /// The body is an HTML page ([`is_html`]), for -r.
    html: bool,
}

/// Whether a response's body is an HTML page whose links -r follows:
/// `Content-Type` `text/html` or `application/xhtml+xml` (as wget); a
/// response without one is taken as HTML when the path looks like a
/// page (ends in '/', `.html` or `.htm`).
fn is_html(resp: &Response, url: &Url) -> bool {
    match resp.header("Content-Type") {
        Some(t) => {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("text/html") || t.eq_ignore_ascii_case("application/xhtml+xml")
        }
        None => {
            let p = url.path.split('?').next().unwrap_or("");
            p.ends_with('/') || p.ends_with(".html") || p.ends_with(".htm")
        }
    }
}

fn rdma_error_of(resp: &Response) -> Option<String> {
    resp.header("RDMA-Error").map(str::to_string)
}

fn discard_body(s: &mut Session, resp: &Response) -> Res<()> {
    save_body(s, resp, &mut io::sink())
}

fn save_body(s: &mut Session, resp: &Response, sink: &mut dyn Write) -> Res<()> {
    s.http
        .read_body(resp, false, sink, &mut |_| {})
        .map_err(|e| format!("reading the response: {e}"))?;
    Ok(())
}

fn plain_get(s: &mut Session, url: &Url, sink: &mut dyn Write, a: &Args) -> Res<Outcome> {
    s.http
        .send_request("GET", url, &[], None)
        .map_err(|e| format!("sending the request: {e}"))?;
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    let len = resp
        .header("Content-Length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let pb = bar(a.quiet, len, &url.file_name());
    let n = s
        .http
        .read_body(&resp, false, sink, &mut |n| pb.set_position(n))
        .map_err(|e| format!("reading the response body: {e}"))?;
    pb.finish_and_clear();
    s.reopen_if(resp.close)?;
    Ok(Outcome {
        status: resp.status,
        bytes: n,
        via: "plain HTTP".into(),
        html: is_html(&resp, url),
    })
}

fn rdma_get(
    s: &mut Session,
    url: &Url,
    scheme: GetScheme,
    sink: &mut Sink,
    a: &Args,
    hooks: &GetHooks,
) -> Res<Outcome> {
    let (hold_ms, delay_accept_ms) = (hooks.hold, hooks.delay_accept);
    let max_len = max_len(a);
    let r = s.rdma()?;
    let mut h = r.request_header(
        match scheme {
            GetScheme::ServerWrites => Scheme::ServerWrites,
            GetScheme::ClientReads => Scheme::ClientReads,
        },
        false,
    )?;
    h.maxlen = Some(max_len);
    if let GetScheme::ServerWrites = scheme {
        let b = r.buf(max_len)?;
        h.stag = Some(b.rkey());
        h.to = Some(b.addr());
    }
    tracing::debug!(header = %h, "GET {}", url.path);
    if hooks.pause_before_request {
        eprintln!(
            "rhttp-test: RDMA listener {} waiting for a line on stdin",
            r.listener.local_addr()
        );
        let mut line = String::new();
        io::stdin()
            .read_line(&mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
    }
    // Over TLS: name this transfer; the body will be sealed under a key
    // the TLS exporter derives for it (docs/MOD_RDMA.md, "HTTPS").
    let seal_id = if s.http.is_tls() {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&rdma::new_token()?.to_be_bytes());
        id[8..].copy_from_slice(&rdma::new_token()?.to_be_bytes());
        Some(id)
    } else {
        None
    };
    let mut extra = vec![("RDMA", h.to_string())];
    if let Some(id) = &seal_id {
        extra.push(("RDMA-Seal", rhttp::seal::request_header(id)));
    }
    s.http
        .send_request("GET", url, &extra, None)
        .map_err(|e| format!("sending the request: {e}"))?;
    let r = s.rdma.as_mut().expect("created above");
    if delay_accept_ms > 0 && !r.live() {
        eprintln!(
            "rhttp-test: request sent; accepting the RDMA connection in {delay_accept_ms} ms"
        );
        std::thread::sleep(Duration::from_millis(delay_accept_ms));
    }
    r.expect_conn(&s.http)?;
    // Server-writes: the body is being placed and the server's DONE comes
    // before its HTTP answer; wait for either, reading the RDMA connection
    // from this thread meanwhile.
    let early = if matches!(scheme, GetScheme::ServerWrites) && r.live() {
        r.wait_ctrl(Some(&s.http))?
    } else {
        None
    };
    r.wait_http(&s.http)?;
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    let Some(v) = resp.header("RDMA").map(str::to_string) else {
        if let Some(err) = rdma_error_of(&resp) {
            discard_body(s, &resp)?;
            s.reopen_if(resp.close)?;
            eprintln!(
                "rhttp: {}: server refused RDMA ({} {}: {err}); retrying over plain HTTP",
                url.path, resp.status, resp.reason
            );
            return plain_get(s, url, sink, a);
        }
        // The server ignored the header: the body is in the response.
        let pb = bar(a.quiet, 0, &url.file_name());
        let n = s
            .http
            .read_body(&resp, false, sink, &mut |n| pb.set_position(n))
            .map_err(|e| format!("reading the response body: {e}"))?;
        pb.finish_and_clear();
        s.reopen_if(resp.close)?;
        if resp.status < 300 && resp.header("RDMA-TLS") == Some("off") {
            eprintln!(
                "rhttp: {}: the server moves no bodies by RDMA over TLS (RDMATLS off); got the \
                 body in the HTTPS response",
                url.path
            );
        } else if resp.status < 300 {
            eprintln!(
                "rhttp: {}: the server did not answer with RDMA; got the body over plain HTTP",
                url.path
            );
        }
        return Ok(Outcome {
            status: resp.status,
            bytes: n,
            via: "plain HTTP (fallback)".into(),
            html: is_html(&resp, url),
        });
    };
    let rh = RdmaHeader::parse(&v).map_err(|e| format!("bad RDMA header from the server: {e}"))?;
    discard_body(s, &resp)?;
    let len = rh.length.ok_or("the server's RDMA header has no length")?;
    // Over TLS the body must come sealed for this transfer: its key from
    // the session's exporter with our id as the context.
    let sealed = match &seal_id {
        None => None,
        Some(id) => {
            let v = resp.header("RDMA-Seal").ok_or(
                "the server moved the body by RDMA over TLS without sealing it (no RDMA-Seal \
                 in its answer): it travelled in clear, so it is refused. Fix: update mod_rdma \
                 on the server, or set RDMATLS off there",
            )?;
            let ans = rhttp::seal::parse_answer(v)
                .map_err(|e| format!("bad RDMA-Seal header from the server: {e}"))?;
            if ans.id != *id {
                return Err("the server's RDMA-Seal names another transfer".into());
            }
            let mut key = [0u8; 32];
            s.http
                .export_keying_material(&mut key, rhttp::seal::LABEL, id)
                .map_err(|e| format!("the TLS exporter failed: {e}"))?;
            Some((key, ans.length))
        }
    };
    if len > max_len {
        return Err(format!(
            "the server announced {len} bytes, more than maxlen {max_len}"
        ));
    }
    let pb = bar(a.quiet, len, &url.file_name());
    let r = s.rdma.as_mut().expect("created above");
    match rh.scheme {
        Scheme::ServerWrites => {
            // The server's DONE follows its Writes on the RDMA stream: once
            // it is here, the whole body is placed in our buffer.
            let done = match early {
                Some(m) => Some(m),
                None => r.wait_ctrl(None)?,
            };
            match done {
                Some(m) if m.kind == Kind::Done => {}
                Some(m) => {
                    return Err(format!(
                        "expected DONE after the server's writes, got {m:?}"
                    ))
                }
                None => return Err("no DONE after the server's writes".into()),
            }
        }
        Scheme::ClientReads => {
            let (stag, to) = rh
                .stag
                .zip(rh.to)
                .ok_or("the server's client-reads answer lacks stag or to")?;
            if hold_ms > 0 {
                eprintln!("rhttp-test: stag={stag:#x} to={to:#x} length={len}");
                std::thread::sleep(Duration::from_millis(hold_ms));
            }
            r.buf(len)?;
            let b = r.buf.as_ref().expect("allocated");
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(CHUNK as u64) as usize;
                r.run(
                    2,
                    WrOpcode::RdmaRead {
                        remote_addr: to + off,
                        rkey: stag,
                    },
                    SgList::single(b.sge(off as usize, n)),
                )?;
                off += n as u64;
                pb.set_position(off);
            }
            r.send_done(stag, len, None)?;
        }
        other => return Err(format!("the server answered a GET with scheme {other}")),
    }
    let buf = r.buf.as_ref().ok_or("no buffer")?;
    let (bytes, via) = match sealed {
        None => {
            copy_out(buf, 0, len, sink)?;
            (len, format!("RDMA ({})", rh.scheme))
        }
        Some((key, plain)) => {
            // Check every record in a private copy (the server could still
            // write into the registered buffer), then release the body.
            let mut body = vec![0u8; usize::try_from(len).map_err(|_| "body too large")?];
            buf.read_at(0, &mut body);
            if hooks.tamper_sealed {
                let at = body.len() / 2;
                body[at] ^= 1;
                eprintln!("rhttp-test: flipped byte {at} of the sealed body");
            }
            let id = seal_id.as_ref().expect("sealed only with an id");
            let n = rhttp::seal::open_in_place(&key, id, plain, &mut body)
                .map_err(|e| format!("refusing the RDMA body: {e}"))?;
            sink.write_all(&body[..n])
                .map_err(|e| format!("writing the body: {e}"))?;
            (n as u64, format!("RDMA ({}, sealed)", rh.scheme))
        }
    };
    pb.finish_and_clear();
    s.reopen_if(resp.close)?;
    Ok(Outcome {
        status: resp.status,
        bytes,
        via,
        html: is_html(&resp, url),
    })
}

/// Test hooks of `rhttp get` (hidden options).
struct GetHooks {
    hold: u64,
    delay_accept: u64,
    drop_rdma_after: Option<usize>,
    pause_before_request: bool,
    tamper_sealed: bool,
}

impl GetHooks {
    /// Whether a test hook is set: hooks act on one request at a time, so
    /// they turn pipelining off.
    fn any(&self) -> bool {
        self.hold > 0
            || self.delay_accept > 0
            || self.drop_rdma_after.is_some()
            || self.pause_before_request
    }
}

/// Options of `rhttp get` beyond the URLs.
struct GetOpts {
    recursive: bool,
    dir: PathBuf,
    depth: usize,
    stats: bool,
    /// -r and -p: the crawl's settings.
    crawl: recursive::CrawlOpts,
}

impl GetOpts {
    /// -r or -p: objects saved in a tree under -P DIR.
    fn tree(&self) -> bool {
        self.recursive || self.crawl.page_requisites
    }
}

/// One URL to fetch and where its body goes.
struct Job {
    url: Url,
    out: PathBuf,
}

/// Counters for `--stats` (and the test command): what one run of rhttp
/// did on the network.
static HTTP_CONNS: AtomicU64 = AtomicU64::new(0);
static RDMA_CONNS: AtomicU64 = AtomicU64::new(0);
static REQUESTS: AtomicU64 = AtomicU64::new(0);
static RDMA_BODIES: AtomicU64 = AtomicU64::new(0);
static BODY_BYTES: AtomicU64 = AtomicU64::new(0);

/// What became of each GET since the last [`take_fetched`] (for -r: the
/// status, and whether the body is a page to read links from).
static FETCHED: std::sync::Mutex<Vec<Fetched>> = std::sync::Mutex::new(Vec::new());

/// One GET's result, as the crawl needs it.
struct Fetched {
    path: String,
    status: u16,
    bytes: u64,
    html: bool,
}

fn take_fetched() -> Vec<Fetched> {
    std::mem::take(&mut *FETCHED.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Most requests in flight on one HTTP connection (`--pipeline`): each
/// server-writes request has its own slot of `--max-len` bytes in the
/// receive buffer, and the server's DONE for each may wait, unread, in
/// one of our [`RECV_SLOTS`] posted receives (a Send that finds no
/// posted receive ends the connection, RFC 5040 §5.3).
const MAX_PIPELINE: usize = RECV_SLOTS;

fn cmd_get(
    a: &Args,
    urls: &[String],
    outputs: &[PathBuf],
    scheme: GetScheme,
    hooks: GetHooks,
    opts: &GetOpts,
) -> Res<bool> {
    if opts.tree() {
        if !outputs.is_empty() {
            return Err("-r and -p save every object under -P DIR by its path; drop -o".into());
        }
        return recursive::cmd_crawl(a, urls, scheme, &hooks, opts);
    }
    let mut depth = if hooks.any() { 1 } else { opts.depth };
    let started = Instant::now();
    let mut pages = Vec::new();
    let mut https = None;
    for (i, u) in urls.iter().enumerate() {
        let (url, tls) = Url::parse_any(u)?;
        if *https.get_or_insert(tls) != tls {
            return Err(format!(
                "{u:?}: give either http:// or https:// URLs in one command, not both"
            ));
        }
        let out = outputs
            .get(i)
            .cloned()
            .unwrap_or_else(|| PathBuf::from(url.file_name()));
        pages.push(Job { url, out });
    }
    if https == Some(true) {
        let tls = rhttp::http::tls_config(a.cacert.as_deref(), a.insecure)?;
        let _ = TLS.set(tls);
        // One request at a time: rdma_get seals and checks each body.
        depth = 1;
    }
    let mut session: Option<Session> = None;
    let all_ok = fetch(a, &mut session, &pages, scheme, &hooks, depth, opts)?;
    print_stats(opts, started);
    Ok(all_ok)
}

/// `--stats`: the run's counters on one line.
fn print_stats(opts: &GetOpts, started: Instant) {
    if opts.stats {
        report(format_args!(
            "rhttp: stats: {} requests, {} bodies by RDMA, {} body bytes, {} HTTP connections, \
             {} RDMA connections, {:.3} ms",
            REQUESTS.load(Ordering::Relaxed),
            RDMA_BODIES.load(Ordering::Relaxed),
            BODY_BYTES.load(Ordering::Relaxed),
            HTTP_CONNS.load(Ordering::Relaxed),
            RDMA_CONNS.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64() * 1e3
        ));
    }
}

/// Open the session for `url`'s host, unless the current one is for it.
fn session_for<'s>(session: &'s mut Option<Session>, url: &Url, a: &Args) -> Res<&'s mut Session> {
    if session
        .as_ref()
        .is_some_and(|s| s.url0.host != url.host || s.url0.port != url.port)
    {
        *session = None;
    }
    if session.is_none() {
        *session = Some(Session::open(
            url,
            Duration::from_secs(a.timeout),
            a.crc.into(),
        )?);
    }
    Ok(session.as_mut().expect("just set"))
}

/// The sink for a job, its directories made with -r and -p.
fn job_sink(job: &Job, opts: &GetOpts) -> Res<Sink> {
    if opts.tree() {
        if let Some(d) = job.out.parent() {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("creating the directory {}: {e}", d.display()))?;
        }
    }
    open_sink(&job.out)
}

/// The result line of one GET, and whether it succeeded.
fn report_get(url: &Url, o: &Outcome, secs: f64) -> bool {
    FETCHED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Fetched {
            path: url.path.clone(),
            status: o.status,
            bytes: o.bytes,
            html: o.html,
        });
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    BODY_BYTES.fetch_add(o.bytes, Ordering::Relaxed);
    if o.via.starts_with("RDMA") {
        RDMA_BODIES.fetch_add(1, Ordering::Relaxed);
    }
    report(format_args!(
        "GET {}://{}{}: {} {} bytes via {} in {:.3} ms ({:.1} MB/s)",
        url_scheme(),
        url.host_header(),
        url.path,
        o.status,
        o.bytes,
        o.via,
        secs * 1e3,
        o.bytes as f64 / secs.max(1e-9) / 1e6
    ));
    o.status < 400
}

/// Fetch `jobs` in order, one session per run of URLs on the same host:
/// one request at a time (`depth` 1, `--plain`) or pipelined.
fn fetch(
    a: &Args,
    session: &mut Option<Session>,
    jobs: &[Job],
    scheme: GetScheme,
    hooks: &GetHooks,
    depth: usize,
    opts: &GetOpts,
) -> Res<bool> {
    let mut all_ok = true;
    let mut i = 0;
    while i < jobs.len() {
        let s = session_for(session, &jobs[i].url, a)?;
        let run = jobs[i..]
            .iter()
            .take_while(|j| j.url.host == s.url0.host && j.url.port == s.url0.port)
            .count();
        if depth > 1 && !a.plain {
            all_ok &= get_pipelined(a, s, &jobs[i..i + run], scheme, depth, opts)?;
            i += run;
            continue;
        }
        for (k, job) in jobs[i..i + run].iter().enumerate() {
            let mut sink = job_sink(job, opts)?;
            let t = Instant::now();
            let o = if a.plain {
                plain_get(s, &job.url, &mut sink, a)
            } else {
                rdma_get(s, &job.url, scheme, &mut sink, a, hooks)
            };
            sink.flush()
                .map_err(|e| format!("writing {}: {e}", job.out.display()))?;
            let o = o.map_err(|e| {
                format!(
                    "GET {}://{}{}: {e}",
                    url_scheme(),
                    job.url.host_header(),
                    job.url.path
                )
            })?;
            all_ok &= report_get(&job.url, &o, t.elapsed().as_secs_f64());
            if hooks.drop_rdma_after == Some(i + k + 1) {
                if let Some(r) = s.rdma.as_mut() {
                    eprintln!("rhttp-test: closing the RDMA connection");
                    r.close_connection();
                }
            }
        }
        i += run;
    }
    Ok(all_ok)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr)
        .init();
    let a = Args::parse();
    let _ = DEVICE.set(a.device.clone());
    let _ = CONGESTION.set(a.congestion.clone());
    if !a.plain {
        // Fail at start, with the reason and the fix, rather than at the
        // first RDMA request.
        if let Err(e) = open_device() {
            eprintln!("rhttp: {e}");
            return ExitCode::from(2);
        }
    }
    let r = match &a.cmd {
        Cmd::Get {
            urls,
            recursive,
            level,
            page_requisites,
            no_parent,
            no_host_directories,
            no,
            execute,
            max_files,
            directory_prefix,
            pipeline,
            stats,
            output,
            scheme,
            x_hold_ms,
            x_delay_accept_ms,
            x_drop_rdma_after,
            x_pause_before_request,
            x_tamper_sealed,
        } => cmd_get(
            &a,
            urls,
            output,
            *scheme,
            GetHooks {
                hold: *x_hold_ms,
                delay_accept: *x_delay_accept_ms,
                drop_rdma_after: *x_drop_rdma_after,
                pause_before_request: *x_pause_before_request,
                tamper_sealed: *x_tamper_sealed,
            },
            &GetOpts {
                recursive: *recursive,
                dir: directory_prefix.clone(),
                depth: pipeline.unwrap_or(if *recursive || *page_requisites { 8 } else { 1 })
                    as usize,
                stats: *stats,
                crawl: recursive::CrawlOpts {
                    level: level.map_or(Some(5), |l| l.0),
                    page_requisites: *page_requisites,
                    no_parent: *no_parent || no.iter().any(|n| n == "p"),
                    host_dirs: !(*no_host_directories || no.iter().any(|n| n == "H")),
                    robots: execute.last().copied().unwrap_or(true),
                    max_files: *max_files as usize,
                },
            },
        ),
        Cmd::Put {
            file,
            url,
            post,
            scheme,
            output,
            x_abort_at_buf,
            x_bad_stag,
        } => {
            let method = if *post { "POST" } else { "PUT" };
            let hooks = PutHooks {
                abort_at_buf: *x_abort_at_buf,
                bad_stag: *x_bad_stag,
            };
            cmd_put(method, &a, file, url, *scheme, output.as_ref(), hooks)
        }
        Cmd::ProbeStag {
            url,
            stag,
            to,
            len,
            beyond,
        } => cmd_probe(&a, url, *stag, *to, *len, *beyond),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rhttp: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn max_len_takes_the_shared_size_forms_and_refuses_zero() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("0")
            .unwrap_err()
            .contains("--max-len must be above 0"));
        assert!(parse_size("1.5M").unwrap_err().contains("invalid size"));
    }
}
