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

mod config;
mod error;
pub mod hello;
pub mod io;
pub mod msg;
mod progress;
mod random;
pub mod rdma;
mod reorder;
pub mod tcp;
mod transport;
pub mod tune;

use std::net::SocketAddr;
use std::time::Duration;

pub(crate) use config::negotiate;
pub use config::{Config, Mode, MAX_BLOCK, MAX_IODEPTH, MAX_STREAMS, MIN_BLOCK};
pub use error::Error;
pub use io::{
    BlockSink, BlockSource, FileReader, FileWriter, NullSink, ReadSource, WriteSink, ZeroSource,
};
pub use progress::{Progress, ProgressFn};
pub use random::random_u64;
pub use reorder::{AdmitError, InsertError, Reorder, Window};
pub use transport::{Stats, Transport};

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
