//! # rdma_xfer: bulk-transfer middleware over software iWARP
//!
//! Moves a byte stream from a [`BlockSource`] on one host to a
//! [`BlockSink`] on another, in fixed-size blocks, the way RFTP's
//! middleware does (Ren et al., "Protocols for wide-area data-intensive
//! applications"), on the [`iwarp`] verbs of this workspace (RFC 5040
//! RDMAP, RFC 5041 DDP, RFC 5044 MPA):
//!
//! ```text
//!  source host                                         sink host
//!  reader ─ free local block ─> sender thread ── RDMA Write + BlockDone ──> dispatcher ─> reorder ─> writer
//!    ^                              │  (data QP seq % N)                        │                     │
//!    └── dispatcher (Send done) <───┘                                           └── Grant (batch) <───┘
//!                           control QP: Hello/HelloAck, Begin(pre-request), Request, Grant, End, Fin, Abort
//! ```
//!
//! - **Resources.** Each side has a pool of `iodepth × streams` blocks of
//!   `block_size` bytes per session, plus a region of control-message
//!   slots. The source registers its blocks once, for local access only.
//!   The sink registers a block for the peer's RDMA Write only while it is
//!   granted, and deregisters it right before handing it to the
//!   [`BlockSink`]: a source that goes on writing after its `BlockDone`
//!   is refused with a Terminate (invalid STag, RFC 5041 §7.2) instead of
//!   changing the bytes behind the sink's `&[u8]`. The next grant
//!   registers the block again under a new STag.
//! - **Control QP.** Send/Recv with credits ([`rdma`]): session-ID and
//!   stream-count negotiation, block requests (pre-requested ahead of
//!   need) answered by grants in batches, the end of a transfer and its
//!   acknowledgement.
//! - **Data QPs.** Payload moves by one-sided RDMA Write into a granted
//!   sink block; the per-block completion notice rides on the same data
//!   QP right behind the Write, because only messages of one DDP stream
//!   are ordered (RFC 5040 §5.5): a Write's local completion in siw means
//!   "handed to TCP", not "placed", so a notice on the control QP could
//!   overtake its payload. iWARP has no Write-with-Immediate.
//! - **Pipelining.** Up to `iodepth` blocks per stream are in flight
//!   before any is acknowledged.
//! - **Reorder stage.** The sink hands blocks to the writer in sequence
//!   ([`Reorder`]).
//! - **Threads.** Per session, created once and reused by every transfer:
//!   a sender, a completion dispatcher and a progress logger.
//! - **TCP mode.** [`Mode::Tcp`] implements the same [`Transport`] over N
//!   plain TCP streams, for comparison and for peers without RDMA.
//!
//! Every wait is bounded by [`Config::timeout`]: a peer that vanishes
//! or stops answering gives an [`Error`], never a hang.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod hello;
pub mod io;
pub mod msg;
mod progress;
pub mod rdma;
mod reorder;
pub mod tcp;
pub mod tune;

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub use io::{
    BlockSink, BlockSource, FileReader, FileWriter, NullSink, ReadSource, WriteSink, ZeroSource,
};
pub use progress::{Progress, ProgressFn};
pub use reorder::{AdmitError, InsertError, Reorder, Window};

/// Which transport a session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Software iWARP: RDMA Write on the data QPs.
    Rdma,
    /// Plain TCP streams.
    Tcp,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s.to_ascii_lowercase().as_str() {
            "rdma" => Ok(Mode::Rdma),
            "tcp" => Ok(Mode::Tcp),
            _ => Err(format!("unknown transfer mode {s:?}: use rdma or tcp")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Rdma => "rdma",
            Mode::Tcp => "tcp",
        })
    }
}

/// Session parameters. The active side proposes, the passive side grants
/// the minimum of both for streams, block size and I/O depth.
#[derive(Debug, Clone)]
pub struct Config {
    /// Data streams (QPs or TCP connections), 1..=[`MAX_STREAMS`].
    pub streams: u32,
    /// Block size in bytes (a multiple of 4096 keeps `O_DIRECT` usable).
    pub block_size: u32,
    /// Blocks in flight per stream.
    pub iodepth: u32,
    /// Longest wait for any progress (peer silent, CQ empty, ...).
    pub timeout: Duration,
    /// Bound on each connection setup.
    pub connect_timeout: Duration,
    /// Require MPA CRC32C on every FPDU.
    pub crc: bool,
    /// How often the progress callback runs.
    pub progress_interval: Duration,
    /// The RDMA device of [`Mode::Rdma`] sessions: `soft` (this crate's
    /// software iWARP), `auto`, or a kernel device (`siw0`, `rxe0`,
    /// `mlx5_0`) through rdma-core. `None`: `IWARP_DEVICE`, else `soft`
    /// ([`iwarp::Context::open`]).
    pub device: Option<String>,
    /// Let the sink size the blocks in flight inside the pool as the
    /// transfer goes ([`tune::Autotune`]); `false` keeps the whole pool
    /// granted (a pinned `--iodepth`). Local: not negotiated.
    pub autotune: bool,
    /// TCP congestion control of the session's connections
    /// (`TCP_CONGESTION`, tcp(7): reno, cubic, bbr, ...); `None` keeps the
    /// kernel's default (`net.ipv4.tcp_congestion_control`). RDMA mode
    /// sets it through the CM ([`iwarp::cm::ConnParam::congestion`]), TCP
    /// mode on its sockets. Local: not negotiated.
    pub congestion: Option<String>,
    /// Protocol features this side offers or grants ([`hello::feature`];
    /// [`hello::feature::ALL`] by default). In the configuration of an
    /// established session ([`Transport::config`]): the features both
    /// sides share. `0` speaks the setup of rdma-xfer 0.4.0 and earlier,
    /// as an older peer does (for interoperability tests, or to rule a
    /// feature out).
    pub features: u32,
}

/// Most data streams a session may have.
pub const MAX_STREAMS: u32 = 64;
/// Smallest and largest block sizes.
pub const MIN_BLOCK: u32 = 4096;
/// Largest block size (64 MiB).
pub const MAX_BLOCK: u32 = 64 << 20;
/// Largest I/O depth per stream.
pub const MAX_IODEPTH: u32 = 256;

impl Default for Config {
    fn default() -> Config {
        Config {
            streams: 1,
            block_size: 1 << 20,
            iodepth: 4,
            timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
            crc: false,
            progress_interval: Duration::from_millis(200),
            device: None,
            autotune: true,
            congestion: None,
            features: hello::feature::ALL,
        }
    }
}

impl Config {
    /// Check the ranges; returns the config with values clamped where the
    /// fix is obvious.
    pub fn validated(mut self) -> Result<Config, Error> {
        if self.streams == 0 || self.streams > MAX_STREAMS {
            return Err(Error::Config(format!(
                "streams must be 1..={MAX_STREAMS}, got {}",
                self.streams
            )));
        }
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_size) {
            return Err(Error::Config(format!(
                "block size must be {MIN_BLOCK}..={MAX_BLOCK} bytes, got {}",
                self.block_size
            )));
        }
        if self.iodepth == 0 || self.iodepth > MAX_IODEPTH {
            return Err(Error::Config(format!(
                "iodepth must be 1..={MAX_IODEPTH}, got {}",
                self.iodepth
            )));
        }
        if self.timeout.is_zero() {
            self.timeout = Duration::from_secs(1);
        }
        if let Some(c) = &self.congestion {
            iwarp::cm::CongestionControl::new(c)
                .map_err(|e| Error::Config(format!("congestion control: {e}")))?;
        }
        if let Some(d) = &self.device {
            d.parse::<iwarp::DeviceSpec>()
                .map_err(|e| Error::Config(e.to_string()))?;
        }
        Ok(self)
    }

    /// Open the RDMA device this config names ([`Config::device`]).
    pub fn open_device(&self) -> Result<iwarp::Context, Error> {
        match &self.device {
            Some(d) => iwarp::Context::open_device(d),
            None => iwarp::Context::open(),
        }
        .map_err(|e| Error::Setup(e.to_string()))
    }

    /// Blocks in each side's pool.
    pub fn pool_depth(&self) -> u32 {
        self.iodepth * self.streams
    }
}

/// What one transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Payload bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
    /// Wall time of the transfer.
    pub elapsed: Duration,
}

impl Stats {
    /// Throughput in bits per second.
    pub fn bits_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 * 8.0 / s
        } else {
            0.0
        }
    }
}

/// Errors of a session or a transfer. `Display` names the cause.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Bad parameters.
    Config(String),
    /// Setting up the session failed (connect, accept, negotiation).
    Setup(String),
    /// The peer broke the protocol.
    Protocol(String),
    /// Reading the source or writing the sink failed here.
    Local(std::io::Error),
    /// The peer aborted the transfer, with its reason.
    PeerAborted(String),
    /// The connection to the peer is gone.
    Disconnected(String),
    /// Nothing happened for this long.
    Timeout {
        waiting_for: &'static str,
        after: Duration,
    },
    /// An earlier error left the session unusable.
    Broken(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(s) => write!(f, "invalid transfer configuration: {s}"),
            Error::Setup(s) => write!(f, "transfer session setup failed: {s}"),
            Error::Protocol(s) => write!(f, "transfer protocol violation by the peer: {s}"),
            Error::Local(e) => write!(f, "local I/O error: {e}"),
            Error::PeerAborted(s) => write!(f, "the peer aborted the transfer: {s}"),
            Error::Disconnected(s) => write!(f, "connection to the peer lost: {s}"),
            Error::Timeout { waiting_for, after } => write!(
                f,
                "timed out after {:.1} s waiting for {waiting_for}: the peer stopped responding",
                after.as_secs_f64()
            ),
            Error::Broken(s) => write!(
                f,
                "the transfer session is unusable after an earlier error ({s}): open a new one"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Local(e) => Some(e),
            _ => None,
        }
    }
}

/// A connected transfer session: either side can send or receive, one
/// transfer at a time, as often as wanted.
pub trait Transport: Send + fmt::Debug {
    /// Send everything `src` yields to the peer, which must be in
    /// [`Transport::recv`]. Returns once the peer's sink has finished
    /// (its `Fin`): [`Transport::send_unconfirmed`], then
    /// [`Transport::confirm`].
    fn send(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        let start = std::time::Instant::now();
        let mut st = self.send_unconfirmed(src)?;
        self.confirm()?;
        st.elapsed = start.elapsed();
        Ok(st)
    }
    /// Send everything `src` yields, and return once every block and the
    /// `End` are handed to the transport, without waiting the round trip
    /// for the sink's `Fin` (issue 27: a server can send its final reply
    /// meanwhile). The `Fin` is checked by [`Transport::confirm`], which
    /// the next `send`, `send_unconfirmed` or `recv` calls first. Success
    /// here says only that the source's part is done: whoever reports the
    /// transfer as delivered must confirm it, or check the data end to end
    /// (rftp compares the file's checksum with the server's `HASH`).
    fn send_unconfirmed(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error>;
    /// Wait for the sink's `Fin` of the last [`Transport::send_unconfirmed`]
    /// (at once if there is none outstanding): an error if the sink failed
    /// or acknowledged other than the bytes sent.
    fn confirm(&mut self) -> Result<(), Error>;
    /// Receive one transfer into `sink`, in order.
    fn recv(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error>;
    /// The next transfer on this session comes from the peer, into a
    /// transfer of about `len_hint` bytes: offer the sink's blocks now
    /// (RDMA mode, when both sides have [`hello::feature::PREGRANT`]), so
    /// the source's first block need not wait a round trip for a grant
    /// after its `Begin`. The next [`Transport::recv`] continues with what
    /// was granted. Does nothing where the feature is missing (TCP mode,
    /// an older peer) or was already done for the next transfer.
    fn prepare_recv(&mut self, len_hint: Option<u64>) -> Result<(), Error> {
        let _ = len_hint;
        Ok(())
    }
    /// Install (or remove) the progress callback.
    fn set_progress(&mut self, cb: Option<ProgressFn>);
    /// The negotiated parameters.
    fn config(&self) -> &Config;
    /// The transport.
    fn mode(&self) -> Mode;
    /// The negotiated session ID.
    fn session_id(&self) -> u64;
}

/// The passive side: a listener that accepts one session at a time.
#[derive(Debug)]
pub struct XferListener {
    inner: ListenerInner,
    token: u64,
    cfg: Config,
    peer: Option<std::net::IpAddr>,
}

#[derive(Debug)]
enum ListenerInner {
    Rdma(iwarp::cm::Listener),
    Tcp(std::net::TcpListener),
}

impl XferListener {
    /// Listen on `addr` (port 0 picks one). `cfg` holds the most the
    /// passive side grants. A fresh random token must be presented by the
    /// active side (it is handed over out of band, e.g. in the FTP `RADR`
    /// reply).
    pub fn bind(addr: SocketAddr, mode: Mode, cfg: Config) -> Result<XferListener, Error> {
        let cfg = cfg.validated()?;
        let inner = match mode {
            Mode::Rdma => ListenerInner::Rdma(
                iwarp::cm::Listener::bind_on(&cfg.open_device()?, addr, rdma::mpa_config(cfg.crc))
                    .map_err(|e| Error::Setup(e.to_string()))?,
            ),
            Mode::Tcp => ListenerInner::Tcp(
                std::net::TcpListener::bind(addr)
                    .map_err(|e| Error::Setup(format!("binding {addr}: {e}")))?,
            ),
        };
        Ok(XferListener {
            inner,
            token: random_u64(),
            cfg,
            peer: None,
        })
    }

    /// Accept connections only from `ip` (e.g. the address of the FTP
    /// control connection that asked for this session). A connection from
    /// elsewhere is refused and logged, and the token stays good for the
    /// legitimate peer until the accept deadline.
    pub fn only_from(mut self, ip: std::net::IpAddr) -> XferListener {
        self.peer = Some(ip);
        self
    }

    /// The address the active side connects to.
    pub fn local_addr(&self) -> SocketAddr {
        match &self.inner {
            ListenerInner::Rdma(l) => l.local_addr(),
            ListenerInner::Tcp(l) => l
                .local_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0))),
        }
    }

    /// The token the active side must present.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The transport.
    pub fn mode(&self) -> Mode {
        match self.inner {
            ListenerInner::Rdma(_) => Mode::Rdma,
            ListenerInner::Tcp(_) => Mode::Tcp,
        }
    }

    /// Accept one session (control connection, negotiation, then the data
    /// streams), all within `timeout`.
    pub fn accept(&self, timeout: Duration) -> Result<Box<dyn Transport>, Error> {
        match &self.inner {
            ListenerInner::Rdma(l) => Ok(Box::new(rdma::RdmaSession::accept(
                l, self.token, &self.cfg, self.peer, timeout,
            )?)),
            ListenerInner::Tcp(l) => Ok(Box::new(tcp::TcpSession::accept(
                l, self.token, &self.cfg, self.peer, timeout,
            )?)),
        }
    }
}

/// The active side: connect a session to a listener presenting `token`.
pub fn connect(
    addr: SocketAddr,
    mode: Mode,
    token: u64,
    cfg: Config,
) -> Result<Box<dyn Transport>, Error> {
    let cfg = cfg.validated()?;
    match mode {
        Mode::Rdma => Ok(Box::new(rdma::RdmaSession::connect(addr, token, &cfg)?)),
        Mode::Tcp => Ok(Box::new(tcp::TcpSession::connect(addr, token, &cfg)?)),
    }
}

/// The parameters the passive side grants for a proposal.
pub(crate) fn negotiate(ours: &Config, streams: u32, block_size: u32, iodepth: u32) -> Config {
    let mut c = ours.clone();
    c.streams = streams.clamp(1, ours.streams);
    c.block_size = block_size.clamp(MIN_BLOCK, ours.block_size);
    c.iodepth = iodepth.clamp(1, ours.iodepth);
    c
}

/// 64 random bits from the kernel (`/dev/urandom`), or from the hasher's
/// per-process random keys if that fails.
pub fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_ne_bytes(b);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_takes_the_minimum_and_clamps() {
        let ours = Config {
            streams: 8,
            block_size: 1 << 20,
            iodepth: 4,
            ..Config::default()
        };
        let c = negotiate(&ours, 16, 256 << 10, 64);
        assert_eq!((c.streams, c.block_size, c.iodepth), (8, 256 << 10, 4));
        let c = negotiate(&ours, 0, 1, 0);
        assert_eq!((c.streams, c.block_size, c.iodepth), (1, MIN_BLOCK, 1));
    }

    #[test]
    fn device_is_checked_and_opened() {
        let bad = Config {
            device: Some("no/such".into()),
            ..Config::default()
        };
        match bad.validated() {
            Err(Error::Config(e)) => assert!(e.contains("invalid device name"), "{e}"),
            other => panic!("expected a config error, got {other:?}"),
        }
        let soft = Config {
            device: Some("soft".into()),
            ..Config::default()
        };
        assert_eq!(soft.open_device().unwrap().device_name(), "soft");
        let has_rdma = std::fs::read_dir("/sys/class/infiniband")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if !has_rdma {
            let missing = Config {
                device: Some("siw0".into()),
                ..Config::default()
            };
            match missing.open_device() {
                Err(Error::Setup(e)) => assert!(e.contains("--device soft"), "{e}"),
                other => panic!(
                    "expected a setup error, got {:?}",
                    other.map(|c| c.device_name().to_string())
                ),
            }
        }
    }

    #[test]
    fn config_validation() {
        assert!(Config::default().validated().is_ok());
        for bad in [
            Config {
                streams: 0,
                ..Config::default()
            },
            Config {
                block_size: 100,
                ..Config::default()
            },
            Config {
                iodepth: 0,
                ..Config::default()
            },
        ] {
            assert!(matches!(bad.validated(), Err(Error::Config(_))));
        }
    }
}
