//! `rhttp`: an HTTP client like wget/curl that moves bodies by RDMA
//! (software iWARP) when the server runs mod_rdma, and falls back to plain
//! HTTP when it does not. See `rhttp --help` and `docs/MOD_RDMA.md`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
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
        /// http:// URLs.
        #[arg(required = true)]
        urls: Vec<String>,
        /// Recursive, one level (like `wget -r -l1 -nH`): fetch each URL as
        /// a page, then every object it links on the same host and port
        /// (`<img src>`, `<a href>`, `<link href>`, `<script src>`, ...),
        /// over the same HTTP and RDMA connections; everything is saved
        /// under -P DIR by its URL path.
        #[arg(short, long)]
        recursive: bool,
        /// Where -r saves (like wget's --directory-prefix).
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

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a size like 4096, 64K or 256M"))
}

type Res<T> = Result<T, String>;

const RECV_SLOTS: usize = 8;
const CHUNK: usize = 16 << 20;

/// The client's RDMA side of one HTTP connection: the listener the server
/// connects back to, and the connection it made (reused while alive).
struct Rdma {
    pd: ProtectionDomain,
    /// Both CQs are [`ProgressMode::AppDriven`]: this thread does the RDMA
    /// connection's receive work itself whenever it waits (see
    /// [`Rdma::wait_for`]).
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    listener: Listener,
    server_ip: IpAddr,
    /// The tokens of the requests that may still make the server connect
    /// (docs/MOD_RDMA.md, "The request token"): the one request in flight,
    /// or every unanswered request of a pipeline; empty between requests,
    /// when no connection is expected.
    tokens: Vec<u64>,
    qp: Option<QueuePair>,
    ctrl: MemoryRegion,
    msg: MemoryRegion,
    buf: Option<MappedRegion>,
    timeout: Duration,
}

/// A registered buffer in an anonymous mapping: its pages are zero-filled
/// on first touch, so advertising a large `maxlen` costs nothing until the
/// server writes that much (`reg_mr` would zero the whole buffer up front).
struct MappedRegion {
    mr: Option<MemoryRegion>,
    ptr: *mut libc::c_void,
    len: usize,
}

impl MappedRegion {
    fn new(pd: &ProtectionDomain, len: usize, access: Access) -> Res<MappedRegion> {
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "mapping a {len}-byte buffer failed: {}; lower --max-len",
                io::Error::last_os_error()
            ));
        }
        // SAFETY: the mapping stays valid until `drop`, which drops the
        // region (waiting for the driver to finish with it) before unmapping.
        let mr = unsafe { pd.reg_mr_raw(ptr.cast::<u8>(), len, access) };
        match mr {
            Ok(mr) => Ok(MappedRegion {
                mr: Some(mr),
                ptr,
                len,
            }),
            Err(e) => {
                // SAFETY: the mapping made above, not registered.
                unsafe { libc::munmap(ptr, len) };
                Err(format!(
                    "registering a {len}-byte buffer: {e}; lower --max-len (a kernel RDMA \
                     device pins the whole buffer)"
                ))
            }
        }
    }
}

impl std::ops::Deref for MappedRegion {
    type Target = MemoryRegion;
    fn deref(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("registered until drop")
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: the region that referred to the mapping is gone.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

impl Rdma {
    fn new(http: &Conn, timeout: Duration, crc: Policy) -> Res<Rdma> {
        let ctx = open_device().map_err(|e| format!("opening the RDMA device: {e}"))?;
        let pd = ctx.alloc_pd();
        let send_cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
        let recv_cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
        for cq in [&send_cq, &recv_cq] {
            cq.set_progress(ProgressMode::AppDriven {
                spin: SPIN_PROGRESS,
            })
            .map_err(|e| format!("setting up the completion queues: {e}"))?;
        }
        // The address the server will connect back to, in canonical form:
        // over an IPv4-mapped HTTP connection (http://[::ffff:127.0.0.1]/)
        // the socket's address is ::ffff:a.b.c.d, which an IPv6-only
        // listener cannot bind, and the server sees an IPv4 client.
        let local = SocketAddr::new(http.local.ip().to_canonical(), 0);
        let mpa = MpaConfig {
            crc,
            ..MpaConfig::default()
        };
        let listener = Listener::bind_on(&ctx, local, mpa)
            .map_err(|e| format!("listening for the server's RDMA connection on {local}: {e}"))?;
        if let Some(cc) = congestion() {
            // Accepted connections inherit it (tcp(7), TCP_CONGESTION).
            listener
                .set_congestion(cc)
                .map_err(|e| format!("--congestion {cc}: {e}"))?;
        }
        let ctrl = pd
            .reg_mr(RECV_SLOTS * MSG_LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        // Slot 0: signaled control messages ([`Rdma::send_ctrl`]); slot
        // 1 + i: the unsignaled DONE of pipeline slot i.
        let msg = pd
            .reg_mr((1 + MAX_PIPELINE) * MSG_LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        tracing::debug!(addr = %listener.local_addr(), "RDMA listener up");
        Ok(Rdma {
            pd,
            send_cq,
            recv_cq,
            listener,
            server_ip: http.peer.ip(),
            tokens: Vec::new(),
            qp: None,
            ctrl,
            msg,
            buf: None,
            timeout,
        })
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().port()
    }

    fn ip(&self) -> IpAddr {
        self.listener.local_addr().ip()
    }

    /// The data buffer, grown to at least `len` bytes.
    fn buf(&mut self, len: u64) -> Res<&MappedRegion> {
        let len = len.max(1);
        if self.buf.as_ref().is_none_or(|b| (b.len() as u64) < len) {
            self.buf = None;
            let len =
                usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
            self.buf = Some(MappedRegion::new(
                &self.pd,
                len,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )?);
        }
        Ok(self.buf.as_ref().expect("just set"))
    }

    /// Disconnect the RDMA connection; the listener stays, so the server
    /// can connect again.
    fn close_connection(&mut self) {
        if let Some(qp) = self.qp.take() {
            qp.disconnect();
            // Its posted receives were flushed into the CQs, which the next
            // connection shares: drop them.
            while self.recv_cq.poll_one().is_some() || self.send_cq.poll_one().is_some() {}
        }
    }

    fn live(&self) -> bool {
        // This thread reads the connection only while it waits (the CQs
        // are application-driven): let it see an end or a Terminate that
        // came since.
        self.recv_cq.progress();
        self.qp.as_ref().is_some_and(|q| q.state() == QpState::Rts)
    }

    /// Take `req` if it is the server's connection for the request that
    /// waits: from the HTTP server's address (compared canonically, so
    /// ::ffff:127.0.0.1 is 127.0.0.1) and with the request's token in its
    /// private data. Anything else is an impostor (another host, another
    /// local user who found the port, a stale connection): rejected with
    /// a log line, and `Ok(false)` so the caller keeps waiting for the
    /// server -- refusing must not fail the transfer, or the impostor
    /// would have won anyway.
    fn accept(&mut self, req: iwarp::cm::ConnRequest) -> Res<bool> {
        let peer = req.peer_addr();
        if peer.ip().to_canonical() != self.server_ip.to_canonical() {
            tracing::warn!(
                %peer,
                server = %self.server_ip,
                "refused an RDMA connection that is not from the HTTP server"
            );
            let _ = req.reject(b"rhttp: not the HTTP server");
            return Ok(false);
        }
        if self.tokens.is_empty() {
            tracing::warn!(%peer, "refused an RDMA connection while none was expected");
            let _ = req.reject(b"rhttp: no request waits for a connection");
            return Ok(false);
        }
        let Some(k) = self
            .tokens
            .iter()
            .position(|&t| private_data_matches(req.private_data(), t))
        else {
            tracing::warn!(
                %peer,
                private_data = ?req.private_data(),
                "refused an RDMA connection without this request's token in its private data \
                 (an impostor, or a server that does not send tokens back)"
            );
            let _ = req.reject(b"rhttp: wrong or missing request token");
            return Ok(false);
        };
        let qp = self
            .pd
            .create_qp(&QpInitAttr {
                send_cq: self.send_cq.clone(),
                recv_cq: self.recv_cq.clone(),
                max_send_wr: 64,
                max_recv_wr: RECV_SLOTS as u32,
            })
            .map_err(|e| e.to_string())?;
        for i in 0..RECV_SLOTS {
            self.post_slot(&qp, i)?;
        }
        req.accept(&qp, &ConnParam::default())
            .map_err(|e| format!("accepting the server's RDMA connection: {e}"))?;
        tracing::debug!(
            %peer,
            congestion = iwarp::cm::tcp_congestion(&qp).unwrap_or_default(),
            "RDMA connection from the server accepted"
        );
        self.qp = Some(qp);
        self.tokens.remove(k);
        RDMA_CONNS.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn post_slot(&self, qp: &QueuePair, i: usize) -> Res<()> {
        qp.post_recv(&RecvWr {
            wr_id: i as u64,
            sgl: SgList::single(self.ctrl.sge(i * MSG_LEN, MSG_LEN)),
        })
        .map_err(|e| format!("posting a receive: {e}"))
    }

    /// The `RDMA:` header of a new request with `scheme`, naming our
    /// listener and carrying a fresh token (after [`Rdma::prepare`]).
    /// With `pipelined`, the tokens of earlier unanswered requests stay
    /// valid ([`Rdma::forget_token`] drops each when its answer is in).
    fn request_header(&mut self, scheme: Scheme, pipelined: bool) -> Res<RdmaHeader> {
        self.prepare(pipelined)?;
        let token = new_token()?;
        self.tokens.push(token);
        let mut h = RdmaHeader::new(scheme);
        h.ip = Some(self.ip());
        h.port = Some(self.port());
        h.token = Some(token);
        Ok(h)
    }

    /// Before a request: refuse connections that wait in the listener (no
    /// request expects one now: the server connects while a request
    /// waits for it), and forget a dead connection.
    fn prepare(&mut self, pipelined: bool) -> Res<()> {
        if !self.live() {
            self.qp = None;
        }
        if !pipelined {
            self.tokens.clear();
        }
        while let Ok(req) = self.listener.get_request(Some(Duration::ZERO)) {
            self.accept(req)?;
        }
        Ok(())
    }

    /// The answer to the request that carried `token` is in: the server
    /// will not connect for it any more.
    fn forget_token(&mut self, token: u64) {
        self.tokens.retain(|&t| t != token);
    }

    /// After sending a request with an RDMA header: wait until the server
    /// connected (unless a connection is alive) or answered over HTTP.
    /// Connections that are not the server's are refused and the wait
    /// goes on ([`Rdma::accept`]).
    fn expect_conn(&mut self, http: &Conn) -> Res<()> {
        if self.live() {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the server neither connected to {}:{} nor answered within {:?}",
                    self.ip(),
                    self.port(),
                    self.timeout
                ));
            }
            // Sleep until a connection or the HTTP answer arrives.
            let (conn_ready, http_ready) = poll_two(
                self.listener.as_raw_fd(),
                http.stream().as_raw_fd(),
                left.as_millis().clamp(1, 100) as i32,
            );
            if conn_ready {
                // A connection waits: its MPA Request is due at once, so a
                // peer that connects and sends nothing holds us up for
                // MPA_REQUEST_WAIT at most, not until the deadline.
                match self.listener.get_request(Some(MPA_REQUEST_WAIT.min(left))) {
                    Ok(req) => {
                        if self.accept(req)? {
                            return Ok(());
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "bad RDMA connection attempt"),
                }
            }
            if http_ready || http.has_buffered() {
                return Ok(());
            }
        }
    }

    fn qp(&self) -> Res<&QueuePair> {
        self.qp.as_ref().ok_or_else(|| {
            "the server answered with RDMA but never opened an RDMA connection".to_string()
        })
    }

    /// Post one send-queue request and wait for its completion.
    fn run(&self, wr_id: u64, opcode: WrOpcode, sgl: SgList) -> Res<()> {
        let qp = self.qp()?;
        qp.post_send(&SendWr {
            wr_id,
            opcode,
            sgl,
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("posting {opcode:?}: {e}"))?;
        match self.wait_wc(&self.send_cq) {
            Ok(wc) if wc.status == WcStatus::Success => Ok(()),
            Ok(wc) => {
                let why = qp
                    .next_event(Duration::from_millis(200))
                    .map(|e| format!(" ({e:?})"))
                    .unwrap_or_default();
                Err(format!("{opcode:?} failed: {:?}{why}", wc.status))
            }
            Err(e) => Err(e),
        }
    }

    fn send_ctrl(&self, m: &CtrlMsg) -> Res<()> {
        self.msg.write_at(0, &m.encode());
        self.run(1, WrOpcode::Send, SgList::single(self.msg.sge(0, MSG_LEN)))
    }

    /// The DONE of a client-reads body, as a Send with Invalidate of the
    /// server's `stag` (RFC 5040 §5.3, §6.7.2: the Data Sink invalidates
    /// the STag before it delivers the Send): from then on a Read of it on
    /// this stream is refused with a Terminate (invalid STag), whenever
    /// the server's worker gets to release the body. `slot`: a pipeline
    /// slot's own message buffer, posted unsignaled (its completion would
    /// stand between the Reads' on the send CQ; the buffer is written
    /// again only after a later Read completed, and completions come in
    /// order, so this Send is gone by then); `None`: signaled, waited for.
    fn send_done(&self, stag: u32, len: u64, slot: Option<usize>) -> Res<()> {
        let m = CtrlMsg {
            kind: Kind::Done,
            stag,
            length: len.min(u32::MAX as u64) as u32,
            to: 0,
            offset: 0,
        };
        let opcode = WrOpcode::SendWithInv {
            invalidate_rkey: stag,
        };
        let Some(i) = slot else {
            self.msg.write_at(0, &m.encode());
            return self.run(1, opcode, SgList::single(self.msg.sge(0, MSG_LEN)));
        };
        let at = (1 + i) * MSG_LEN;
        self.msg.write_at(at, &m.encode());
        self.qp()?
            .post_send(&SendWr {
                wr_id: 3,
                opcode,
                sgl: SgList::single(self.msg.sge(at, MSG_LEN)),
                signaled: false,
                solicited: false,
            })
            .map_err(|e| format!("posting the DONE: {e}"))
    }

    /// Wait for a control message, or (with `http`) return `None` as soon
    /// as the HTTP response starts arriving.
    fn wait_ctrl(&self, http: Option<&Conn>) -> Res<Option<CtrlMsg>> {
        let qp = self.qp()?;
        let wc = match http {
            Some(h) => match self.wait_for(h)? {
                Some(wc) => wc,
                None => return Ok(None),
            },
            None => self.wait_wc(&self.recv_cq)?,
        };
        if wc.status != WcStatus::Success {
            return Err(format!("RDMA connection failed: {:?}", wc.status));
        }
        let i = wc.wr_id as usize;
        let mut b = [0u8; MSG_LEN];
        self.ctrl.read_at(i * MSG_LEN, &mut b);
        self.post_slot(qp, i)?;
        let m = CtrlMsg::decode(&b[..wc.byte_len as usize])
            .map_err(|e| format!("bad message from the server: {e}"))?;
        Ok(Some(m))
    }

    /// Wait for a completion on `cq`, doing the RDMA connection's receive
    /// work meanwhile: the CQ polls for up to [`SPIN_PROGRESS`], then
    /// sleeps in `poll(2)` on the connection's socket
    /// ([`ProgressMode::AppDriven`]).
    fn wait_wc(&self, cq: &CompletionQueue) -> Res<iwarp::WorkCompletion> {
        self.qp()?;
        cq.wait_one(self.timeout)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no completion within {:?}", self.timeout))
    }

    /// Wait until the HTTP answer starts arriving, doing the RDMA
    /// connection's receive work meanwhile (the server may be reading our
    /// buffer, or writing into it). Completions stay in their CQs.
    fn wait_http(&self, http: &Conn) -> Res<()> {
        if self.qp.is_none() {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            self.recv_cq.progress();
            if http.has_buffered() {
                return Ok(());
            }
            // Sleep on the connection's socket through a CQ's fd (an epoll
            // set of the socket and the CQ's completions): one whose
            // completions would not wake us at once. The send CQ's are
            // always taken by `run`; a control message may wait in the
            // receive CQ.
            let cq_fd = [&self.send_cq, &self.recv_cq]
                .into_iter()
                .find(|cq| cq.is_empty())
                .map(|cq| cq.as_raw_fd());
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("no HTTP answer within {:?}", self.timeout));
            }
            let ms = match cq_fd {
                Some(_) => left.as_millis().clamp(1, 100) as i32,
                // Both CQs hold completions: wake up to do the receive work.
                None => 1,
            };
            if poll_http(http, cq_fd, ms) {
                return Ok(());
            }
        }
    }

    /// Wait for a completion on the receive CQ (`Some`), or until the HTTP
    /// response starts arriving (`None`).
    ///
    /// This thread does the RDMA connection's receive work itself while it
    /// waits ([`ProgressMode::AppDriven`]): `poll_one` reads whatever the
    /// socket holds, and otherwise the thread sleeps at once (an answer
    /// may not come by RDMA at all) in `poll(2)` on the CQ's fd (the
    /// connection's socket and the CQ's completions) and the HTTP socket.
    /// The stack's receive thread stays parked, so the data is read by the
    /// one thread that is waiting for it: on a loaded machine each extra
    /// thread that must be scheduled can cost a time slice of the
    /// processes that keep the CPUs busy.
    fn wait_for(&self, http: &Conn) -> Res<Option<iwarp::WorkCompletion>> {
        self.qp()?;
        let cq = &self.recv_cq;
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(wc) = cq.poll_one() {
                return Ok(Some(wc));
            }
            if http.has_buffered() {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "no control message or HTTP answer within {:?}",
                    self.timeout
                ));
            }
            if poll_http(
                http,
                Some(cq.as_raw_fd()),
                left.as_millis().clamp(1, 100) as i32,
            ) {
                // The answer is coming; take a completion that came with it.
                return Ok(cq.poll_one());
            }
        }
    }
}

/// How long a connection to our RDMA listener may take to send its MPA
/// Request once accepted (the server sends it right after connecting).
const MPA_REQUEST_WAIT: Duration = Duration::from_secs(2);

/// Sleep in `poll(2)` for up to `ms` on two descriptors; which of them
/// became readable.
fn poll_two(a: std::os::fd::RawFd, b: std::os::fd::RawFd, ms: i32) -> (bool, bool) {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds in a live local array.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    (n > 0 && fds[0].revents != 0, n > 0 && fds[1].revents != 0)
}

/// A fresh request token: 64 bits from the kernel's random source
/// (`/dev/urandom`), so that no one who cannot see the request can guess
/// it.
fn new_token() -> Res<u64> {
    let mut b = [0u8; 8];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("reading /dev/urandom for the request token: {e}"))?;
    Ok(u64::from_be_bytes(b))
}

/// Sleep in `poll(2)` for up to `ms` on the HTTP socket and `cq_fd` (a
/// CQ's descriptor); true if the HTTP socket became readable.
fn poll_http(http: &Conn, cq_fd: Option<std::os::fd::RawFd>, ms: i32) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: http.stream().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // poll(2) ignores a negative fd.
            fd: cq_fd.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds in a live local array.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    n > 0 && fds[0].revents != 0
}

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
        let http = Conn::connect(url, timeout).map_err(|e| {
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

fn bar(quiet: bool, len: u64, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Where a response body goes: a file or standard output. The plain-HTTP
/// path writes through a 64 KiB buffer (it batches the socket reads); an
/// RDMA body is written straight from the registered buffer to the
/// descriptor ([`copy_out`]).
struct Sink {
    out: io::BufWriter<Out>,
}

enum Out {
    File(File),
    Stdout(io::Stdout),
}

impl Write for Out {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Out::File(f) => f.write(b),
            Out::Stdout(o) => o.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Out::File(f) => f.flush(),
            Out::Stdout(o) => o.flush(),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.out.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Sink {
    /// The descriptor, with everything buffered before it written out.
    fn fd(&mut self) -> io::Result<BorrowedFd<'_>> {
        self.out.flush()?;
        Ok(match self.out.get_ref() {
            Out::File(f) => f.as_fd(),
            Out::Stdout(o) => o.as_fd(),
        })
    }
}

fn open_sink(path: &PathBuf) -> Res<Sink> {
    let out = if path.as_os_str() == "-" {
        Out::Stdout(io::stdout())
    } else {
        Out::File(File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?)
    };
    Ok(Sink {
        out: io::BufWriter::with_capacity(64 << 10, out),
    })
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

/// Write `len` bytes of the registered buffer, from offset `at`, to `sink`.
///
/// Straight from the registered memory to the file or pipe with `write(2)`
/// ([`MemoryRegion::write_to_fd`]): no copy in user space, and no Rust
/// slice of memory that stays registered for the next request (a
/// misbehaving server could still be writing into it).
fn copy_out(buf: &MemoryRegion, at: usize, len: u64, sink: &mut Sink) -> Res<()> {
    let fd = sink.fd().map_err(|e| e.to_string())?;
    let mut off = 0usize;
    let len = usize::try_from(len).map_err(|_| "body larger than the address space")?;
    while off < len {
        match buf.write_to_fd(at + off, len - off, fd) {
            Ok(0) => return Err("writing the body: the output accepted no bytes".into()),
            Ok(n) => off += n,
            Err(e) => return Err(format!("writing the body: {e}")),
        }
    }
    Ok(())
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
    s.http
        .send_request("GET", url, &[("RDMA", h.to_string())], None)
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
        if resp.status < 300 {
            eprintln!(
                "rhttp: {}: the server did not answer with RDMA; got the body over plain HTTP",
                url.path
            );
        }
        return Ok(Outcome {
            status: resp.status,
            bytes: n,
            via: "plain HTTP (fallback)".into(),
        });
    };
    let rh = RdmaHeader::parse(&v).map_err(|e| format!("bad RDMA header from the server: {e}"))?;
    discard_body(s, &resp)?;
    let len = rh.length.ok_or("the server's RDMA header has no length")?;
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
    copy_out(r.buf.as_ref().ok_or("no buffer")?, 0, len, sink)?;
    pb.finish_and_clear();
    s.reopen_if(resp.close)?;
    Ok(Outcome {
        status: resp.status,
        bytes: len,
        via: format!("RDMA ({})", rh.scheme),
    })
}

/// Test hooks of `rhttp get` (hidden options).
struct GetHooks {
    hold: u64,
    delay_accept: u64,
    drop_rdma_after: Option<usize>,
    pause_before_request: bool,
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

/// Most requests in flight on one HTTP connection (`--pipeline`): each
/// server-writes request has its own slot of `--max-len` bytes in the
/// receive buffer, and the server's DONE for each may wait, unread, in
/// one of our [`RECV_SLOTS`] posted receives (a Send that finds no
/// posted receive ends the connection, RFC 5040 §5.3).
const MAX_PIPELINE: usize = RECV_SLOTS;

/// The largest page `-r` reads links from.
const MAX_PAGE: u64 = 16 << 20;

fn cmd_get(
    a: &Args,
    urls: &[String],
    outputs: &[PathBuf],
    scheme: GetScheme,
    hooks: GetHooks,
    opts: &GetOpts,
) -> Res<bool> {
    if opts.recursive && !outputs.is_empty() {
        return Err("-r saves every object under -P DIR by its path; drop -o".into());
    }
    let depth = if hooks.any() { 1 } else { opts.depth };
    let started = Instant::now();
    let mut pages = Vec::new();
    for (i, u) in urls.iter().enumerate() {
        let url = Url::parse(u)?;
        let out = if opts.recursive {
            opts.dir.join(rhttp::links::local_path(&url))
        } else {
            outputs
                .get(i)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(url.file_name()))
        };
        pages.push(Job { url, out });
    }
    let mut session: Option<Session> = None;
    let mut all_ok = fetch(a, &mut session, &pages, scheme, &hooks, depth, opts)?;
    if opts.recursive {
        for page in &pages {
            let html = match read_page(&page.out) {
                Some(h) => h,
                None => continue,
            };
            let jobs: Vec<Job> = rhttp::links::page_links(&page.url, &html)
                .into_iter()
                .map(|url| Job {
                    out: opts.dir.join(rhttp::links::local_path(&url)),
                    url,
                })
                .collect();
            tracing::debug!(page = %page.url.path, links = jobs.len(), "links on the page");
            all_ok &= fetch(a, &mut session, &jobs, scheme, &hooks, depth, opts)?;
        }
    }
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
    Ok(all_ok)
}

/// The saved page, if it is there and small enough to scan for links.
fn read_page(path: &PathBuf) -> Option<Vec<u8>> {
    let f = File::open(path).ok()?;
    if f.metadata().ok()?.len() > MAX_PAGE {
        tracing::warn!(page = %path.display(), "page larger than {MAX_PAGE} bytes: links not followed");
        return None;
    }
    let mut v = Vec::new();
    f.take(MAX_PAGE).read_to_end(&mut v).ok()?;
    Some(v)
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

/// The sink for a job, its directories made in recursive mode.
fn job_sink(job: &Job, opts: &GetOpts) -> Res<Sink> {
    if opts.recursive {
        if let Some(d) = job.out.parent() {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("creating the directory {}: {e}", d.display()))?;
        }
    }
    open_sink(&job.out)
}

/// The result line of one GET, and whether it succeeded.
fn report_get(url: &Url, o: &Outcome, secs: f64) -> bool {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    BODY_BYTES.fetch_add(o.bytes, Ordering::Relaxed);
    if o.via.starts_with("RDMA") {
        RDMA_BODIES.fetch_add(1, Ordering::Relaxed);
    }
    report(format_args!(
        "GET http://{}{}: {} {} bytes via {} in {:.3} ms ({:.1} MB/s)",
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
                format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path)
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

/// A pipelined GET that has been sent and not answered yet.
struct InFlight {
    job: usize,
    url: Url,
    /// Its part of the receive buffer: bytes `slot * max_len ..` of it.
    slot: usize,
    token: u64,
    sent: Instant,
}

/// What became of a pipelined GET.
enum Answer {
    Done(Outcome),
    /// The server refused RDMA for it (`RDMA-Error`): fetch it again over
    /// plain HTTP once the pipeline is empty.
    Refused,
    /// A client-reads answer: the caller posts its RDMA Reads into the
    /// request's slot ([`post_reads`]); they complete later
    /// ([`finish_reads`]).
    Reading {
        stag: u32,
        to: u64,
        len: u64,
        status: u16,
    },
}

/// At most this many RDMA Reads posted at once (the send queue and CQ hold
/// 64 entries; the DONEs need room too).
const MAX_POSTED_READS: usize = 32;

/// Post the Reads of a client-reads body of `len` bytes at the server's
/// `stag`/`to` into bytes `at..` of the buffer, in pieces of at most
/// [`CHUNK`]; returns how many completions they will make. A body that
/// needs more than [`MAX_POSTED_READS`] pieces is read here, piece by
/// piece, and makes none.
fn post_reads(r: &Rdma, at: usize, stag: u32, to: u64, len: u64) -> Res<usize> {
    let pieces = len.div_ceil(CHUNK as u64) as usize;
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        let sgl = SgList::single(r.buf.as_ref().ok_or("no buffer")?.sge(at + off as usize, n));
        let opcode = WrOpcode::RdmaRead {
            remote_addr: to + off,
            rkey: stag,
        };
        if pieces > MAX_POSTED_READS {
            // The caller finished every earlier Read (`reading` is empty),
            // so the next send completion is this Read's.
            r.run(2, opcode, sgl)?;
        } else {
            r.qp()?
                .post_send(&SendWr {
                    wr_id: 2,
                    opcode,
                    sgl,
                    signaled: true,
                    solicited: false,
                })
                .map_err(|e| format!("posting the RDMA Read: {e}"))?;
        }
        off += n as u64;
    }
    Ok(if pieces > MAX_POSTED_READS { 0 } else { pieces })
}

/// A client-reads body being read: the Reads are posted, the DONE is not
/// sent yet.
struct Reading {
    p: InFlight,
    sink: Sink,
    stag: u32,
    len: u64,
    chunks: usize,
    status: u16,
}

/// Take the completions of posted client-reads Reads (they complete in the
/// order they were posted, on the send CQ: the DONEs in between are
/// unsignaled) and finish each body whose Reads are all done: its DONE
/// (as a Send with Invalidate of the server's STag, so no Read of it can
/// follow, see [`Rdma::send_done`]), then its bytes to its sink.
///
/// Waits (bounded by `--timeout`) until at least one body is finished,
/// or, with `until_http`, until the next HTTP answer starts arriving,
/// whichever comes first; returns at once if nothing is being read. The
/// wait does the RDMA connection's receive work (the CQs are
/// application-driven). A server that still holds each answer until the
/// previous body's DONE (mod_rdma before grants outlived requests) is
/// served as well: its DONE goes out while we wait for its next answer.
fn pump_reads(
    s: &mut Session,
    reading: &mut std::collections::VecDeque<Reading>,
    span: usize,
    until_http: bool,
) -> Res<bool> {
    let mut all_ok = true;
    if reading.is_empty() {
        return Ok(all_ok);
    }
    let r = s
        .rdma
        .as_mut()
        .ok_or("client-reads without an RDMA connection")?;
    let deadline = Instant::now() + r.timeout;
    let mut finished = 0;
    loop {
        while let Some(wc) = r.send_cq.poll_one() {
            if wc.status != WcStatus::Success {
                let why = r
                    .qp()?
                    .next_event(Duration::from_millis(200))
                    .map(|e| format!(" ({e:?})"))
                    .unwrap_or_default();
                return Err(format!("the RDMA Read failed: {:?}{why}", wc.status));
            }
            let x = reading
                .front_mut()
                .ok_or("a send completion with no RDMA Read posted")?;
            x.chunks = x.chunks.saturating_sub(1);
            while reading.front().is_some_and(|x| x.chunks == 0) {
                let mut x = reading.pop_front().expect("checked");
                r.send_done(x.stag, x.len, Some(x.p.slot))?;
                copy_out(
                    r.buf.as_ref().ok_or("no buffer")?,
                    x.p.slot * span,
                    x.len,
                    &mut x.sink,
                )?;
                x.sink
                    .flush()
                    .map_err(|e| format!("writing the body of {}: {e}", x.p.url.path))?;
                all_ok &= report_get(
                    &x.p.url,
                    &Outcome {
                        status: x.status,
                        bytes: x.len,
                        via: format!("RDMA ({})", Scheme::ClientReads),
                    },
                    x.p.sent.elapsed().as_secs_f64(),
                );
                finished += 1;
            }
        }
        if reading.is_empty() || finished > 0 || (until_http && s.http.has_buffered()) {
            return Ok(all_ok);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the RDMA Reads of {} did not complete within {:?}",
                reading.front().map_or("", |x| x.p.url.path.as_str()),
                r.timeout
            ));
        }
        // Sleep on the send CQ's fd (its completions and the RDMA
        // connection's socket) and the HTTP socket.
        let http_ready = poll_http(
            &s.http,
            Some(r.send_cq.as_raw_fd()),
            left.as_millis().clamp(1, 100) as i32,
        );
        if until_http && http_ready {
            return Ok(all_ok);
        }
    }
}

/// GET `jobs` (all on `s`'s host) with up to `depth` requests in flight
/// on the HTTP connection (HTTP/1.1 pipelining, RFC 9112 §9.3.2: the
/// server answers in order) and the one RDMA connection reused by all.
///
/// A request that needs a new RDMA connection is sent alone: the server
/// connects back while it serves it, and we accept the connection only
/// while we wait for that answer (Apache holds the answers to pipelined
/// requests until its input is drained, so we could be waiting for an
/// earlier answer while the server waits in its connect). Each request
/// carries its own slot of `--max-len` bytes of the receive buffer
/// (server-writes) and its own token. The server's DONE for each
/// server-writes answer waits in the receive CQ, in order, until its
/// answer is read. If the server closes the connection (a 502, or
/// `MaxKeepAliveRequests`), the unanswered requests are sent again on a
/// new one; a request it refused RDMA for is fetched over plain HTTP at
/// the end.
fn get_pipelined(
    a: &Args,
    s: &mut Session,
    jobs: &[Job],
    scheme: GetScheme,
    depth: usize,
    opts: &GetOpts,
) -> Res<bool> {
    let max_len = max_len(a);
    let depth = depth.clamp(1, MAX_PIPELINE);
    let span = usize::try_from(max_len).map_err(|_| "--max-len does not fit in memory")?;
    let total = span
        .checked_mul(depth)
        .ok_or("--max-len times --pipeline does not fit in memory")?;
    let mut queue: std::collections::VecDeque<usize> = (0..jobs.len()).collect();
    let mut inflight: std::collections::VecDeque<InFlight> = Default::default();
    // client-reads bodies whose Reads are posted (each still holds its slot).
    let mut reading: std::collections::VecDeque<Reading> = Default::default();
    let mut refused = Vec::new();
    let mut seq = 0usize;
    let mut all_ok = true;
    loop {
        // No answer is due: wait until a client-reads body is read, which
        // frees its slot for the next request.
        if inflight.is_empty() && !reading.is_empty() {
            all_ok &= pump_reads(s, &mut reading, span, false)?;
        }
        if queue.is_empty() && inflight.is_empty() && reading.is_empty() {
            break;
        }
        // Fill the pipeline.
        while inflight.len() + reading.len() < depth {
            let Some(&job) = queue.front() else { break };
            let r = s.rdma()?;
            if !inflight.is_empty() && !r.live() {
                break; // this one may need a connect-back: send it alone
            }
            queue.pop_front();
            let slot = seq % depth;
            seq += 1;
            let mut h = r.request_header(
                match scheme {
                    GetScheme::ServerWrites => Scheme::ServerWrites,
                    GetScheme::ClientReads => Scheme::ClientReads,
                },
                true,
            )?;
            h.maxlen = Some(max_len);
            // One slot of `span` bytes per request in flight, for both
            // schemes (client-reads bodies are read into their slots
            // side by side); allocated once, before any Read is posted.
            let b = r.buf(total as u64)?;
            if let GetScheme::ServerWrites = scheme {
                h.stag = Some(b.rkey());
                h.to = Some(b.addr() + (slot * span) as u64);
            }
            let token = h.token.expect("request_header sets a token");
            tracing::debug!(header = %h, slot, "GET {} (pipelined)", jobs[job].url.path);
            s.http
                .send_request("GET", &jobs[job].url, &[("RDMA", h.to_string())], None)
                .map_err(|e| format!("sending the request: {e}"))?;
            inflight.push_back(InFlight {
                job,
                url: jobs[job].url.clone(),
                slot,
                token,
                sent: Instant::now(),
            });
        }
        // Take the oldest answer; finish the client-reads bodies whose
        // Reads complete while it comes.
        if inflight.is_empty() {
            continue;
        }
        all_ok &= pump_reads(s, &mut reading, span, true)?;
        let p = inflight.pop_front().expect("the pipeline is not empty");
        let job = &jobs[p.job];
        let mut sink = job_sink(job, opts)?;
        let (answer, close) =
            pipelined_answer(s, &p, scheme, max_len, &mut sink, a, &job.url.file_name()).map_err(
                |e| format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path),
            )?;
        if let Some(r) = s.rdma.as_mut() {
            r.forget_token(p.token);
        }
        match answer {
            Answer::Done(o) => {
                sink.flush()
                    .map_err(|e| format!("writing {}: {e}", job.out.display()))?;
                all_ok &= report_get(&job.url, &o, p.sent.elapsed().as_secs_f64())
            }
            Answer::Refused => refused.push(p.job),
            Answer::Reading {
                stag,
                to,
                len,
                status,
            } => {
                // Post the Reads and go on to the next answer: the server
                // answered it without waiting for this body's DONE, so the
                // Reads of a whole window share one round trip.
                let need = len.div_ceil(CHUNK as u64) as usize;
                while !reading.is_empty()
                    && reading.iter().map(|x| x.chunks).sum::<usize>() + need > MAX_POSTED_READS
                {
                    all_ok &= pump_reads(s, &mut reading, span, false)?;
                }
                let r = s
                    .rdma
                    .as_mut()
                    .ok_or("client-reads without an RDMA connection")?;
                let chunks = post_reads(r, p.slot * span, stag, to, len).map_err(|e| {
                    format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path)
                })?;
                reading.push_back(Reading {
                    p,
                    sink,
                    stag,
                    len,
                    chunks,
                    status,
                });
            }
        }
        if close {
            // The reads of this connection's bodies complete first.
            while !reading.is_empty() {
                all_ok &= pump_reads(s, &mut reading, span, false)?;
            }
            // The server closed the connection after this answer: the
            // rest were never answered. Send them again on a new one.
            tracing::debug!(
                unanswered = inflight.len(),
                "the server closed the connection"
            );
            while let Some(q) = inflight.pop_back() {
                queue.push_front(q.job);
            }
            s.reopen_if(true)?;
        }
    }
    for j in refused {
        let job = &jobs[j];
        let mut sink = job_sink(job, opts)?;
        let t = Instant::now();
        let o = plain_get(s, &job.url, &mut sink, a);
        sink.flush()
            .map_err(|e| format!("writing {}: {e}", job.out.display()))?;
        let o =
            o.map_err(|e| format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path))?;
        all_ok &= report_get(&job.url, &o, t.elapsed().as_secs_f64());
    }
    Ok(all_ok)
}

/// Read the answer to the oldest pipelined GET `p` and move its body to
/// `sink`; also whether the server closes the connection after it.
fn pipelined_answer(
    s: &mut Session,
    p: &InFlight,
    scheme: GetScheme,
    max_len: u64,
    sink: &mut Sink,
    a: &Args,
    name: &str,
) -> Res<(Answer, bool)> {
    let r = s.rdma.as_mut().expect("created when the request was sent");
    r.expect_conn(&s.http)?;
    r.wait_http(&s.http)?;
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    let Some(v) = resp.header("RDMA").map(str::to_string) else {
        if let Some(err) = rdma_error_of(&resp) {
            discard_body(s, &resp)?;
            eprintln!(
                "rhttp: server refused RDMA ({} {}: {err}); fetching it over plain HTTP",
                resp.status, resp.reason
            );
            return Ok((Answer::Refused, resp.close));
        }
        // The server ignored the header (a 404, RDMA Off): the body is in
        // the response, and no DONE comes for it.
        let n = s
            .http
            .read_body(&resp, false, sink, &mut |_| {})
            .map_err(|e| format!("reading the response body: {e}"))?;
        return Ok((
            Answer::Done(Outcome {
                status: resp.status,
                bytes: n,
                via: "plain HTTP (fallback)".into(),
            }),
            resp.close,
        ));
    };
    let rh = RdmaHeader::parse(&v).map_err(|e| format!("bad RDMA header from the server: {e}"))?;
    discard_body(s, &resp)?;
    let len = rh.length.ok_or("the server's RDMA header has no length")?;
    if len > max_len {
        return Err(format!(
            "the server announced {len} bytes, more than maxlen {max_len}"
        ));
    }
    // The caller checked that max_len * depth fits in a usize and
    // allocated the buffer: each answer goes to its request's slot.
    let span = max_len as usize;
    let at = p.slot * span;
    let pb = bar(a.quiet, len, name);
    let r = s.rdma.as_mut().expect("created when the request was sent");
    match (rh.scheme, scheme) {
        (Scheme::ServerWrites, GetScheme::ServerWrites) => {
            // DONEs come in the order of the answers, each before its
            // HTTP answer on the server's side (RFC 5040 §5.5 orders it
            // behind the Writes): the oldest one in the CQ is this one's.
            match r.wait_ctrl(None)? {
                Some(m) if m.kind == Kind::Done => {}
                Some(m) => {
                    return Err(format!(
                        "expected DONE after the server's writes, got {m:?}"
                    ))
                }
                None => return Err("no DONE after the server's writes".into()),
            }
        }
        (Scheme::ClientReads, GetScheme::ClientReads) => {
            let (stag, to) = rh
                .stag
                .zip(rh.to)
                .ok_or("the server's client-reads answer lacks stag or to")?;
            pb.finish_and_clear();
            return Ok((
                Answer::Reading {
                    stag,
                    to,
                    len,
                    status: resp.status,
                },
                resp.close,
            ));
        }
        (got, _) => return Err(format!("the server answered with scheme {got}")),
    }
    copy_out(r.buf.as_ref().ok_or("no buffer")?, at, len, sink)?;
    pb.finish_and_clear();
    Ok((
        Answer::Done(Outcome {
            status: resp.status,
            bytes: len,
            via: format!("RDMA ({})", rh.scheme),
        }),
        resp.close,
    ))
}

fn read_file_at(f: &mut File, off: u64, buf: &mut [u8]) -> Res<()> {
    f.seek(SeekFrom::Start(off)).map_err(|e| e.to_string())?;
    f.read_exact(buf)
        .map_err(|e| format!("reading the file: {e}"))
}

/// Fault injection for the test command (hidden options).
#[derive(Debug, Clone, Copy)]
struct PutHooks {
    abort_at_buf: Option<u32>,
    bad_stag: bool,
}

fn plain_put(
    method: &str,
    s: &mut Session,
    url: &Url,
    path: &PathBuf,
    a: &Args,
    out: &mut dyn Write,
) -> Res<Response> {
    let mut f = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    s.http
        .send_request(method, url, &[("Content-Length", size.to_string())], None)
        .map_err(|e| format!("sending the request: {e}"))?;
    let pb = bar(a.quiet, size, &url.file_name());
    let mut buf = vec![0u8; 256 << 10];
    let mut sent = 0u64;
    while sent < size {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("{} shrank while uploading", path.display()));
        }
        s.http
            .write_body(&buf[..n])
            .map_err(|e| format!("sending the body: {e}"))?;
        sent += n as u64;
        pb.set_position(sent);
    }
    pb.finish_and_clear();
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    save_body(s, &resp, out)?;
    Ok(resp)
}

fn cmd_put(
    method: &str,
    a: &Args,
    path: &PathBuf,
    u: &str,
    scheme: PutScheme,
    output: Option<&PathBuf>,
    hooks: PutHooks,
) -> Res<bool> {
    let abort_at_buf = hooks.abort_at_buf;
    let mut out: Box<dyn Write> = match output {
        Some(p) => Box::new(open_sink(p)?),
        None => Box::new(io::sink()),
    };
    let timeout = Duration::from_secs(a.timeout);
    let url = Url::parse(u)?;
    let mut s = Session::open(&url, timeout, a.crc.into())?;
    let t = Instant::now();
    let mut f = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let (resp, via) = if a.plain {
        (
            plain_put(method, &mut s, &url, path, a, &mut *out)?,
            "plain HTTP".to_string(),
        )
    } else {
        let r = s.rdma()?;
        let mut h = r.request_header(
            match scheme {
                PutScheme::ServerReads => Scheme::ServerReads,
                PutScheme::ClientWrites => Scheme::ClientWrites,
            },
            false,
        )?;
        h.length = Some(size);
        let pb = bar(a.quiet, size, &url.file_name());
        if let PutScheme::ServerReads = scheme {
            let b = r.buf(size)?;
            copy_in(&mut f, b, size)?;
            h.stag = Some(if hooks.bad_stag {
                b.rkey() ^ 0x5a5a_5a00
            } else {
                b.rkey()
            });
            h.to = Some(b.addr());
        }
        s.http
            .send_request(
                method,
                &url,
                &[("RDMA", h.to_string()), ("Content-Length", "0".into())],
                None,
            )
            .map_err(|e| format!("sending the request: {e}"))?;
        let r = s.rdma.as_mut().expect("created above");
        r.expect_conn(&s.http)?;
        if let PutScheme::ClientWrites = scheme {
            if r.live() {
                let mut tmp = Vec::new();
                let mut bufs = 0u32;
                while let Some(m) = r.wait_ctrl(Some(&s.http))? {
                    bufs += 1;
                    if abort_at_buf == Some(bufs) && m.kind == Kind::Buf {
                        eprintln!("rhttp-test: answering BUF {bufs} with ABORT");
                        r.send_ctrl(&CtrlMsg {
                            kind: Kind::Abort,
                            stag: m.stag,
                            length: 0,
                            to: 0,
                            offset: m.offset,
                        })?;
                        break;
                    }
                    match m.kind {
                        Kind::Buf => {}
                        Kind::Abort => {
                            tracing::warn!("the server aborted the upload");
                            break;
                        }
                        Kind::Done => return Err("unexpected DONE from the server".into()),
                    }
                    let n = m.length as usize;
                    if m.offset + n as u64 > size {
                        return Err(format!(
                            "the server asked for bytes {}..{} of a {size}-byte body",
                            m.offset,
                            m.offset + n as u64
                        ));
                    }
                    tmp.resize(n, 0);
                    read_file_at(&mut f, m.offset, &mut tmp)?;
                    let b = r.buf(n as u64)?;
                    b.write_at(0, &tmp);
                    let sge = b.sge(0, n);
                    r.run(
                        3,
                        WrOpcode::RdmaWrite {
                            remote_addr: m.to,
                            rkey: m.stag,
                        },
                        SgList::single(sge),
                    )?;
                    r.send_ctrl(&CtrlMsg {
                        kind: Kind::Done,
                        stag: m.stag,
                        length: m.length,
                        to: 0,
                        offset: m.offset,
                    })?;
                    pb.set_position(m.offset + n as u64);
                    if m.offset + n as u64 == size {
                        break; // all written: the HTTP answer comes next
                    }
                }
            }
        }
        r.wait_http(&s.http)?;
        let resp = s
            .http
            .read_head()
            .map_err(|e| format!("reading the response: {e}"))?;
        pb.finish_and_clear();
        if resp.header("RDMA").is_some() {
            save_body(&mut s, &resp, &mut *out)?;
            (resp, format!("RDMA ({})", h.scheme))
        } else {
            let why = rdma_error_of(&resp)
                .map(|e| format!("{} {}: {e}", resp.status, resp.reason))
                .unwrap_or_else(|| "the server did not answer with RDMA".into());
            discard_body(&mut s, &resp)?;
            eprintln!("rhttp: {method} {u}: {why}; retrying over plain HTTP");
            s.reopen_if(resp.close)?;
            (
                plain_put(method, &mut s, &url, path, a, &mut *out)?,
                "plain HTTP (fallback)".into(),
            )
        }
    };
    out.flush()
        .map_err(|e| format!("writing the response body: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    report(format_args!(
        "{method} {u}: {} {size} bytes via {via} in {:.3} ms ({:.1} MB/s)",
        resp.status,
        secs * 1e3,
        size as f64 / secs.max(1e-9) / 1e6
    ));
    Ok(resp.status < 400)
}

fn cmd_probe(
    a: &Args,
    u: &str,
    stag: Option<u64>,
    to: Option<u64>,
    len: u32,
    beyond: bool,
) -> Res<bool> {
    let url = Url::parse(u)?;
    let mut s = Session::open(&url, Duration::from_secs(a.timeout), a.crc.into())?;
    let h = s.rdma()?.request_header(Scheme::ClientReads, false)?;
    s.http
        .send_request("GET", &url, &[("RDMA", h.to_string())], None)
        .map_err(|e| e.to_string())?;
    let r = s.rdma.as_mut().expect("created");
    r.expect_conn(&s.http)?;
    let resp = s.http.read_head().map_err(|e| e.to_string())?;
    let rh = RdmaHeader::parse(
        resp.header("RDMA")
            .ok_or("no RDMA answer to the probe's GET")?,
    )
    .map_err(|e| e.to_string())?;
    discard_body(&mut s, &resp)?;
    let own = (
        rh.stag.unwrap_or(0),
        rh.to.unwrap_or(0),
        rh.length.unwrap_or(0),
    );
    let r = s.rdma.as_mut().expect("created");
    r.buf(own.2.max(len as u64) + 1)?;
    let b = r.buf.as_ref().expect("allocated");
    if beyond {
        // One byte more than granted, before DONE: the base and bounds
        // check of the Read's source (RFC 5040 §7.2, base or bounds
        // violation) must refuse it.
        let n = own.2 as usize + 1;
        eprintln!(
            "rhttp-test: probing stag={:#x} to={:#x} len={n} (granted {})",
            own.0, own.1, own.2
        );
        return Ok(probe_verdict(
            own.0,
            r.run(
                4,
                WrOpcode::RdmaRead {
                    remote_addr: own.1,
                    rkey: own.0,
                },
                SgList::single(b.sge(0, n)),
            ),
        ));
    }
    r.run(
        2,
        WrOpcode::RdmaRead {
            remote_addr: own.1,
            rkey: own.0,
        },
        SgList::single(b.sge(0, own.2 as usize)),
    )?;
    // DONE invalidates the STag on arrival (Send with Invalidate), so the
    // Read that follows it on the same stream must be refused at once,
    // whenever the server's worker releases the body.
    r.send_done(own.0, own.2, None)?;
    let (ps, pt) = (stag.unwrap_or(own.0 as u64) as u32, to.unwrap_or(own.1));
    eprintln!("rhttp-test: probing stag={ps:#x} to={pt:#x} len={len}");
    Ok(probe_verdict(
        ps,
        r.run(
            4,
            WrOpcode::RdmaRead {
                remote_addr: pt,
                rkey: ps,
            },
            SgList::single(b.sge(0, len as usize)),
        ),
    ))
}

/// Print what became of a probing Read; true if the server refused it.
fn probe_verdict(stag: u32, res: Res<()>) -> bool {
    match res {
        Ok(()) => {
            eprintln!("rhttp-test: the server ALLOWED the RDMA Read of stag {stag:#x}");
            false
        }
        Err(e) => {
            eprintln!("rhttp-test: the server refused the RDMA Read of stag {stag:#x}: {e}");
            true
        }
    }
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
            directory_prefix,
            pipeline,
            stats,
            output,
            scheme,
            x_hold_ms,
            x_delay_accept_ms,
            x_drop_rdma_after,
            x_pause_before_request,
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
            },
            &GetOpts {
                recursive: *recursive,
                dir: directory_prefix.clone(),
                depth: pipeline.unwrap_or(if *recursive { 8 } else { 1 }) as usize,
                stats: *stats,
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
