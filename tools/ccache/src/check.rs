//! The proxy's version checks.
//!
//! - [`RdmaCheck`]: one RDMA Read of the document's 16-byte slot in the
//!   module's version table; the module runs no code for it.
//! - [`TcpCheck`]: a `VERSION_REQUEST` to the module's version thread.
//!
//! Both keep one connection and make it again when it broke (the module
//! restarted): an operation on a connection that was already up is
//! retried once on a fresh one; a failure on a fresh one is the caller's
//! error (the proxy answers 502). A slot outside the table is refused
//! before any Read; [`RdmaCheck::read_slot_unchecked`] skips that check
//! (tests), and then the module's stack answers with a Terminate, the
//! Read completes with a remote access error, and the connection is
//! dropped: an error, never a stale or made-up version.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use ccache_proto::slot::{self, Advert, SLOT_LEN};
use iwarp::cm::{self, ConnParam, MpaConfig, Policy};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, QpInitAttr, QpState, QueuePair, SendWr, SgList,
    WcStatus, WorkCompletion, WrOpcode,
};

use crate::access::Token;
use crate::msgio::{read_msg, write_msg};

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

/// Version checks by RDMA Read.
pub struct RdmaCheck {
    addr: SocketAddr,
    timeout: Duration,
    progress: Option<iwarp::ProgressMode>,
    token: Option<Token>,
    conn: Option<RdmaConn>,
}

impl fmt::Debug for RdmaCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaCheck")
            .field("addr", &self.addr)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

impl RdmaCheck {
    /// Checks against the module at `addr` (its `--rdma-listen`), each
    /// operation bounded by `timeout`. Connects lazily.
    pub fn new(addr: SocketAddr, timeout: Duration) -> RdmaCheck {
        RdmaCheck {
            addr,
            timeout,
            progress: None,
            token: None,
            conn: None,
        }
    }

    /// Prove `token` when connecting (ccappd's `--token-file`).
    pub fn with_token(mut self, token: Option<Token>) -> RdmaCheck {
        self.token = token;
        self
    }

    /// Wait for the Read's completion this way (default: the CQ's default,
    /// `Threaded` with a short spin).
    pub fn with_progress(mut self, mode: iwarp::ProgressMode) -> RdmaCheck {
        self.progress = Some(mode);
        self
    }

    fn connect(&self) -> Result<RdmaConn, CheckError> {
        RdmaConn::open(self.addr, self.timeout, self.progress, self.token.as_ref())
    }

    /// The table's advertisement (connecting if needed).
    pub fn advert(&mut self) -> Result<Advert, CheckError> {
        if self.conn.is_none() {
            self.conn = Some(self.connect()?);
        }
        Ok(self
            .conn
            .as_ref()
            .map(|c| c.advert)
            .expect("connected above"))
    }

    fn read_once(&mut self, doc: u32, bounds: bool) -> Result<u64, CheckError> {
        let c = self.conn.as_mut().expect("caller connects");
        c.bounds(doc, bounds)?;
        for _ in 0..TORN_RETRIES {
            let wr_id = c.post_read(doc)?;
            let wc =
                c.r.cq
                    .wait_one(self.timeout)
                    .map_err(|e| CheckError::Protocol(e.to_string()))?
                    .ok_or(CheckError::Timeout(self.timeout))?;
            if let Some(v) = c.slot_version(doc, wr_id, &wc)? {
                return Ok(v);
            }
        }
        Err(CheckError::Torn { doc })
    }

    fn read(&mut self, doc: u32, bounds: bool) -> Result<u64, CheckError> {
        let reused = match &self.conn {
            Some(c) if c.usable() => true,
            _ => {
                self.conn = None;
                self.conn = Some(self.connect()?);
                false
            }
        };
        match self.read_once(doc, bounds) {
            Ok(v) => Ok(v),
            Err(e @ CheckError::NoSuchDocument { .. }) => Err(e),
            Err(e) => {
                // The connection is unusable after a failed Read (the QP is
                // in error, or a late completion may still arrive).
                self.conn = None;
                if reused && !matches!(e, CheckError::Completion(WcStatus::RemAccessErr)) {
                    tracing::info!(error = %e, "version connection broke; reconnecting once");
                    self.conn = Some(self.connect()?);
                    let r = self.read_once(doc, bounds);
                    if r.is_err() {
                        self.conn = None;
                    }
                    r
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Read slot `doc` even if it is outside the advertised table (to
    /// exercise the module's bounds check).
    pub fn read_slot_unchecked(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.read(doc, false)
    }
}

impl VersionCheck for RdmaCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.read(doc, true)
    }
}

/// Version checks by a request to the module's version thread.
#[derive(Debug)]
pub struct TcpCheck {
    addr: SocketAddr,
    timeout: Duration,
    conn: Option<TcpStream>,
}

impl TcpCheck {
    /// Checks against the module's `--version-listen` at `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> TcpCheck {
        TcpCheck {
            addr,
            timeout,
            conn: None,
        }
    }

    fn connect(&self) -> Result<TcpStream, CheckError> {
        let s = TcpStream::connect_timeout(&self.addr, self.timeout)
            .map_err(|e| CheckError::Unreachable(format!("{}: {e}", self.addr)))?;
        let io = |e: io::Error| CheckError::Unreachable(e.to_string());
        s.set_nodelay(true).map_err(io)?;
        s.set_read_timeout(Some(self.timeout)).map_err(io)?;
        s.set_write_timeout(Some(self.timeout)).map_err(io)?;
        Ok(s)
    }
}

/// One two-sided version request on a connected stream (a TCP stream, or
/// an iWARP socket in `sockets` mode): `VERSION_REQUEST`, then the
/// `VERSION_REPLY` or `ERROR` (`timeout` is the stream's read timeout,
/// named in the error).
pub(crate) fn ask_version(
    s: &mut (impl io::Read + io::Write),
    doc: u32,
    timeout: Duration,
) -> Result<u64, CheckError> {
    write_msg(s, &Repr::new(Kind::VersionRequest, doc))
        .map_err(|e| CheckError::Protocol(format!("sending the version request: {e}")))?;
    let m = read_msg(s).map_err(|e| match e {
        crate::msgio::MsgError::Io(io)
            if matches!(
                io.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            CheckError::Timeout(timeout)
        }
        e => CheckError::Protocol(e.to_string()),
    })?;
    version_of_reply(&m, doc)
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

impl VersionCheck for TcpCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        let reused = self.conn.is_some();
        let mut s = match self.conn.take() {
            Some(s) => s,
            None => self.connect()?,
        };
        match ask_version(&mut s, doc, self.timeout) {
            Ok(v) => {
                self.conn = Some(s);
                Ok(v)
            }
            Err(e @ CheckError::NoSuchDocument { .. }) => {
                self.conn = Some(s);
                Err(e)
            }
            Err(e) if reused => {
                tracing::info!(error = %e, "version connection broke; reconnecting once");
                let mut s = self.connect()?;
                let v = ask_version(&mut s, doc, self.timeout)?;
                self.conn = Some(s);
                Ok(v)
            }
            Err(e) => Err(e),
        }
    }
}
