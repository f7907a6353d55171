//! The pieces every version check is made of, and that the checks'
//! front ends share: the errors ([`CheckError`]) and the [`VersionCheck`]
//! trait, the RDMA connection that reads a remote slot (`Reader`, and
//! `RdmaConn` on it for the version table; `crate::push` reads a proxy's
//! state region with a `Reader`), the meaning of the version thread's
//! answer, and the iWARP-sockets stream options.
//!
//! A leaf below [`crate::acheck`] (the one implementation of the checks),
//! [`crate::check`] and [`crate::sockets`] (their blocking fronts), so none
//! of those three imports another for these. `crate::check` re-exports the
//! public ones under their old paths.

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
use iwarp_sockets::Options;

use crate::access::Token;
use crate::listen::{refusal_of, request_data};

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
    let pdata = cm::connect(&qp, addr, &param).map_err(|e| match refusal_of(&e) {
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
        let pdata = request_data(token, ccache_proto::auth::LABEL_VERSION_TABLE)
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

/// The stream options for version requests: small rings (messages are 16
/// bytes), the rest from `IWARP_SOCKETS_*` in the environment.
pub fn sockets_options() -> Options {
    Options {
        sbuf_size: 64 * 1024,
        rbuf_size: 64 * 1024,
        sq_size: 64,
        rq_size: 64,
        ..Options::from_env()
    }
}
