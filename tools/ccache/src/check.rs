//! The proxy's version checks, blocking, and what every check shares.
//!
//! - [`RdmaCheck`]: one RDMA Read of the document's 16-byte slot in the
//!   module's version table; the module runs no code for it.
//! - [`TcpCheck`]: a `VERSION_REQUEST` to the module's version thread.
//!
//! The checks themselves are written once, in [`crate::acheck`]
//! ([`AsyncCheck`]); these blocking types run one on a runtime of their
//! own (`Blocking`), so they behave alike: one connection, made again
//! when it broke (the module restarted): an operation on a connection that
//! was already up is retried once on a fresh one; a failure on a fresh one
//! is the caller's error (the proxy answers 502). A slot outside the table
//! is refused before any Read; [`RdmaCheck::read_slot_unchecked`] skips
//! that check (tests), and then the module's stack answers with a
//! Terminate, the Read completes with a remote access error, and the
//! connection is dropped: an error, never a stale or made-up version.
//!
//! This module also holds the pieces of a check: the errors, the RDMA
//! connection to the version table (`RdmaConn`, and the `Reader` the
//! push module reads a proxy's state region with), and the meaning of the
//! version thread's answer.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use ccache_proto::slot::{self, Advert, SLOT_LEN};
use iwarp::cm::{self, ConnParam, MpaConfig, Policy};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, QpInitAttr, QpState, QueuePair, SendWr, SgList,
    WcStatus, WorkCompletion, WrOpcode,
};

use crate::access::Token;
use crate::acheck::{AsyncCheck, CqWait};

/// Why a version is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckError {
    /// The module could not be reached (connect or handshake failed).
    Unreachable(String),
    /// The document has no slot in the module's table.
    NoSuchDocument {
        /// Asked for.
        doc: u32,
    },
    /// The RDMA Read completed with an error status.
    Completion(WcStatus),
    /// No answer in time.
    Timeout(Duration),
    /// Every read of the slot overlapped an update (check word wrong).
    Torn {
        /// The slot.
        doc: u32,
    },
    /// The connection failed or the module answered nonsense.
    Protocol(String),
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Unreachable(e) => write!(f, "application module unreachable: {e} (is ccappd running? check --appd-rdma / --appd-tcp)"),
            CheckError::NoSuchDocument { doc } => write!(f, "document {doc} has no version slot at the application module"),
            CheckError::Completion(s) => write!(f, "RDMA Read of the version slot failed: {}", s.as_str()),
            CheckError::Timeout(t) => write!(f, "no version answer within {t:?} (application module hung or overloaded)"),
            CheckError::Torn { doc } => write!(f, "version slot {doc} changed during every read attempt"),
            CheckError::Protocol(e) => write!(f, "version check failed: {e}"),
        }
    }
}

impl std::error::Error for CheckError {}

/// A way to learn a document's current version.
pub trait VersionCheck: Send {
    /// The current version of `doc`.
    fn version(&mut self, doc: u32) -> Result<u64, CheckError>;
}

/// Reads of the same slot that may overlap an update before giving up.
pub(crate) const TORN_RETRIES: usize = 16;

/// The local end of a connection that only RDMA-Reads into a buffer of
/// its own (a version slot here, a proxy's cache state region in
/// `crate::push`). Disconnects when dropped.
pub(crate) struct Reader {
    _ctx: Context,
    pub(crate) cq: CompletionQueue,
    pub(crate) qp: QueuePair,
    pub(crate) buf: MemoryRegion,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.qp.disconnect();
    }
}

/// Connects a [`Reader`] with a `len`-byte buffer to the listener at
/// `addr` (blocking, bounded by `timeout`), with `request_data` as the MPA
/// Request's private data (an access proof, or nothing); the listener's
/// private data. A refusal ([`ccache_proto::auth::Refusal`]) is an error
/// that names it.
/// MPA CRC is off: the remote region may change while the remote stack
/// sends it, after it computed the CRC (see docs/CACHE.md); TCP's checksum
/// and the region's own check words cover it.
pub(crate) fn connect_reader(
    addr: SocketAddr,
    len: usize,
    timeout: Duration,
    progress: Option<iwarp::ProgressMode>,
    request_data: Vec<u8>,
) -> Result<(Reader, Vec<u8>), String> {
    let ctx = Context::open().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8).map_err(|e| e.to_string())?;
    if let Some(mode) = progress {
        cq.set_progress(mode).map_err(|e| e.to_string())?;
    }
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: 4,
            max_recv_wr: 1,
        })
        .map_err(|e| e.to_string())?;
    let buf = pd
        .reg_mr(len.max(1), Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let param = ConnParam {
        mpa: MpaConfig {
            crc: Policy::Off,
            ..MpaConfig::default()
        },
        timeout,
        private_data: request_data,
        ..ConnParam::default()
    };
    let pdata =
        cm::connect(&qp, addr, &param).map_err(|e| match crate::listen::refusal_of(&e) {
            Some(r) => format!("{addr} refused the connection: {r}"),
            None => e.to_string(),
        })?;
    Ok((
        Reader {
            _ctx: ctx,
            cq,
            qp,
            buf,
        },
        pdata.to_vec(),
    ))
}

pub(crate) struct RdmaConn {
    r: Reader,
    advert: Advert,
    next_wr: u64,
}

impl RdmaConn {
    /// Connect to the module's RDMA listener at `addr` and take its table
    /// advertisement from the MPA private data (blocking: the TCP connect
    /// and the MPA exchange, each bounded by `timeout`).
    pub(crate) fn open(
        addr: SocketAddr,
        timeout: Duration,
        progress: Option<iwarp::ProgressMode>,
        token: Option<&Token>,
    ) -> Result<RdmaConn, CheckError> {
        let pdata = crate::listen::request_data(token, ccache_proto::auth::LABEL_VERSION_TABLE)
            .map_err(CheckError::Unreachable)?;
        let (r, pdata) = connect_reader(addr, SLOT_LEN, timeout, progress, pdata)
            .map_err(CheckError::Unreachable)?;
        let advert = Advert::parse(&pdata).map_err(|e| CheckError::Protocol(e.to_string()))?;
        tracing::info!(%addr, slots = advert.slots, rkey = format_args!("{:#010x}", advert.rkey), "connected to the version table");
        Ok(RdmaConn {
            r,
            advert,
            next_wr: 1,
        })
    }

    /// The table's advertisement (from the MPA Reply).
    pub(crate) fn advert(&self) -> Advert {
        self.advert
    }

    /// The completion queue (its descriptor is what an event loop waits on).
    pub(crate) fn cq(&self) -> &CompletionQueue {
        &self.r.cq
    }

    /// Is the queue pair still connected?
    pub(crate) fn usable(&self) -> bool {
        self.r.qp.state() == QpState::Rts
    }

    /// Refuse a slot outside the advertised table (unless `bounds` is off).
    pub(crate) fn bounds(&self, doc: u32, bounds: bool) -> Result<(), CheckError> {
        if bounds && doc >= self.advert.slots {
            return Err(CheckError::NoSuchDocument { doc });
        }
        Ok(())
    }

    /// Post the RDMA Read of slot `doc` into the local buffer; its `wr_id`.
    pub(crate) fn post_read(&mut self, doc: u32) -> Result<u64, CheckError> {
        let wr_id = self.next_wr;
        self.next_wr += 1;
        self.r
            .qp
            .post_send(&SendWr {
                wr_id,
                opcode: WrOpcode::RdmaRead {
                    remote_addr: self.advert.slot_addr(doc),
                    rkey: self.advert.rkey,
                },
                sgl: SgList::single(self.r.buf.sge(0, SLOT_LEN)),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| CheckError::Protocol(format!("posting the RDMA Read: {e:?}")))?;
        Ok(wr_id)
    }

    /// The version in the slot that the Read `wr_id` completed with `wc`
    /// brought; `None` if it overlapped an update (the check word is wrong:
    /// read again).
    pub(crate) fn slot_version(
        &self,
        doc: u32,
        wr_id: u64,
        wc: &WorkCompletion,
    ) -> Result<Option<u64>, CheckError> {
        if wc.wr_id != wr_id {
            return Err(CheckError::Protocol(format!(
                "completion of work request {} while {wr_id} was due",
                wc.wr_id
            )));
        }
        if wc.status != WcStatus::Success {
            return Err(CheckError::Completion(wc.status));
        }
        let mut b = [0u8; SLOT_LEN];
        self.r.buf.read_at(0, &mut b);
        match slot::decode(doc, &b) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                tracing::debug!(doc, error = %e, "torn slot read; reading again");
                Ok(None)
            }
        }
    }
}

/// A blocking front on one [`AsyncCheck`], the one implementation of the
/// checks: each call runs the check to its end on a current-thread tokio
/// runtime that this value owns (made at the first check), so a blocking
/// check takes no thread besides the caller's.
pub(crate) struct Blocking {
    // Declared first: the check's connections go before their runtime.
    check: AsyncCheck,
    rt: Option<tokio::runtime::Runtime>,
}

impl fmt::Debug for Blocking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocking")
            .field("addr", &self.check.addr())
            .field("connected", &self.check.connected())
            .finish()
    }
}

impl Blocking {
    pub(crate) fn new(check: AsyncCheck) -> Blocking {
        Blocking { check, rt: None }
    }

    pub(crate) fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        drive(runtime(&mut self.rt)?, self.check.version(doc))
    }

    fn advert(&mut self) -> Result<Advert, CheckError> {
        drive(runtime(&mut self.rt)?, self.check.advert())
    }

    fn read_slot_unchecked(&mut self, doc: u32) -> Result<u64, CheckError> {
        drive(runtime(&mut self.rt)?, self.check.read_slot_unchecked(doc))
    }
}

/// Run `fut` to its end on `rt`. The RDMA and TCP checks of a blocking
/// check finish in their first poll (their waits are blocking calls), so
/// that poll is made directly, inside the runtime's context; only a check
/// that waits on the reactor (iWARP sockets) goes through `block_on`.
fn drive<T>(rt: &tokio::runtime::Runtime, fut: impl std::future::Future<Output = T>) -> T {
    use std::task::{Context, Poll, Waker};
    let mut fut = std::pin::pin!(fut);
    let first = {
        let _in = rt.enter();
        fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    };
    match first {
        Poll::Ready(v) => v,
        // Polled again by block_on with its own waker, which replaces
        // the no-op one wherever the future registered it.
        Poll::Pending => rt.block_on(fut),
    }
}

/// The blocking check's runtime, made at its first use.
fn runtime(
    rt: &mut Option<tokio::runtime::Runtime>,
) -> Result<&tokio::runtime::Runtime, CheckError> {
    if rt.is_none() {
        let made = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                CheckError::Unreachable(format!(
                    "creating the check's event loop: {e} (out of file descriptors? raise ulimit -n)"
                ))
            })?;
        *rt = Some(made);
    }
    Ok(rt.as_ref().expect("made above"))
}

/// Version checks by RDMA Read (blocking; [`AsyncCheck::rdma`] is the
/// same check on an event loop).
#[derive(Debug)]
pub struct RdmaCheck {
    inner: Blocking,
    addr: SocketAddr,
    timeout: Duration,
    progress: Option<iwarp::ProgressMode>,
    token: Option<Token>,
}

impl RdmaCheck {
    /// Checks against the module at `addr` (its `--rdma-listen`), each
    /// operation bounded by `timeout`. Connects lazily.
    pub fn new(addr: SocketAddr, timeout: Duration) -> RdmaCheck {
        RdmaCheck {
            inner: Blocking::new(AsyncCheck::rdma_waiting(
                addr,
                timeout,
                CqWait::Blocking(None),
            )),
            addr,
            timeout,
            progress: None,
            token: None,
        }
    }

    fn rebuild(mut self) -> RdmaCheck {
        let c = AsyncCheck::rdma_waiting(self.addr, self.timeout, CqWait::Blocking(self.progress));
        self.inner = Blocking::new(c.with_token(self.token.clone()));
        self
    }

    /// Prove `token` when connecting (ccappd's `--token-file`).
    pub fn with_token(mut self, token: Option<Token>) -> RdmaCheck {
        self.token = token;
        self.rebuild()
    }

    /// Wait for the Read's completion this way (default: the CQ's default,
    /// `Threaded` with a short spin).
    pub fn with_progress(mut self, mode: iwarp::ProgressMode) -> RdmaCheck {
        self.progress = Some(mode);
        self.rebuild()
    }

    /// The table's advertisement (connecting if needed).
    pub fn advert(&mut self) -> Result<Advert, CheckError> {
        self.inner.advert()
    }

    /// Read slot `doc` even if it is outside the advertised table (to
    /// exercise the module's bounds check).
    pub fn read_slot_unchecked(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.read_slot_unchecked(doc)
    }
}

impl VersionCheck for RdmaCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.version(doc)
    }
}

/// Version checks by a request to the module's version thread (blocking;
/// [`AsyncCheck::tcp`] is the same check on an event loop).
#[derive(Debug)]
pub struct TcpCheck {
    inner: Blocking,
}

impl TcpCheck {
    /// Checks against the module's `--version-listen` at `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> TcpCheck {
        TcpCheck {
            inner: Blocking::new(AsyncCheck::tcp_blocking(addr, timeout)),
        }
    }
}

impl VersionCheck for TcpCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.version(doc)
    }
}

/// The version in the version thread's answer `m` to a request for `doc`.
pub(crate) fn version_of_reply(m: &Repr, doc: u32) -> Result<u64, CheckError> {
    match m.kind {
        Kind::VersionReply if m.doc == doc => Ok(m.value),
        Kind::Error if ErrorCode::from(m.value) == ErrorCode::NoSuchDocument => {
            Err(CheckError::NoSuchDocument { doc })
        }
        _ => Err(CheckError::Protocol(format!(
            "the version thread answered {m} to a request for document {doc}"
        ))),
    }
}
