//! Work requests and work completions, named after libibverbs
//! (`struct ibv_send_wr`, `struct ibv_recv_wr`, `struct ibv_wc`).
//!
//! Scatter/gather lists are stored inline ([`SgList`], at most [`MAX_SGE`]
//! entries) so that posting a work request allocates nothing.

use core::fmt;

/// Largest scatter/gather list a work request may carry (siw allows 6).
pub const MAX_SGE: usize = 6;

/// One scatter/gather element (`struct ibv_sge`): `length` bytes at `addr`
/// in the region whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// An inline scatter/gather list of up to [`MAX_SGE`] elements.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SgList {
    len: u8,
    sges: [Sge; MAX_SGE],
}

impl SgList {
    /// An empty list (a zero-length message).
    pub const fn new() -> SgList {
        SgList {
            len: 0,
            sges: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
        }
    }

    /// A list of one element.
    pub fn single(sge: Sge) -> SgList {
        let mut l = SgList::new();
        l.sges[0] = sge;
        l.len = 1;
        l
    }

    /// Build from a slice; `None` if it has more than [`MAX_SGE`] elements.
    pub fn from_slice(sges: &[Sge]) -> Option<SgList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut l = SgList::new();
        l.sges[..sges.len()].copy_from_slice(sges);
        l.len = sges.len() as u8;
        Some(l)
    }

    /// Append one element; `false` if the list is full.
    pub fn push(&mut self, sge: Sge) -> bool {
        if self.len as usize == MAX_SGE {
            return false;
        }
        self.sges[self.len as usize] = sge;
        self.len += 1;
        true
    }

    /// The elements.
    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..self.len as usize]
    }

    /// Total byte length, saturating (a list whose total overflows `u32` is
    /// refused at post time).
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| s.length as u64).sum()
    }
}

impl fmt::Debug for SgList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// The operation of a send-queue work request (`enum ibv_wr_opcode`, the
/// subset iWARP defines in RFC 5040 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    /// RDMAP Send (RFC 5040 §5.3).
    Send,
    /// RDMAP Send with Invalidate: the peer invalidates `invalidate_rkey`.
    SendWithInv { invalidate_rkey: u32 },
    /// RDMA Write of the local SGL to `remote_addr`/`rkey` (RFC 5040 §5.1).
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// RDMA Read of `remote_addr`/`rkey` into the local SGL (RFC 5040 §5.2).
    RdmaRead { remote_addr: u64, rkey: u32 },
}

/// A send-queue work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub sgl: SgList,
    /// `IBV_SEND_SIGNALED`: produce a completion on success. Errors always
    /// complete.
    pub signaled: bool,
    /// `IBV_SEND_SOLICITED`: send the Send with Solicited Event variant
    /// (RFC 5040 §4.3 opcodes 0x5 and 0x6). Ignored for Write and Read.
    pub solicited: bool,
}

/// A receive-queue work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sgl: SgList,
}

/// Completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The incoming message was longer than the posted receive buffer.
    LocLenErr,
    /// A local SGE failed its memory check (bad lkey, bounds, rights).
    LocProtErr,
    /// The QP hit a local error processing this request.
    LocQpOpErr,
    /// The QP went to the error state; this request was never executed.
    WrFlushErr,
    /// The peer refused a remote access (a Terminate with a protection
    /// error answered this request).
    RemAccessErr,
    /// The peer could not perform the operation (remote operation error).
    RemOpErr,
    /// The peer found the request invalid (e.g. too many outstanding Reads).
    RemInvReqErr,
    /// Any other fatal error.
    GeneralErr,
}

impl WcStatus {
    /// `ibv_wc_status_str`-style text.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RemInvReqErr => "invalid request error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// What a completion completes (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
}

/// Which work queue a completion belongs to; the driver routes it to the
/// QP's send or receive CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcQueue {
    Send,
    Recv,
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub queue: WcQueue,
    /// Bytes received (receives) or transferred (Reads).
    pub byte_len: u32,
    /// For a receive completed by Send with Invalidate: the STag the peer
    /// asked us to invalidate, which is now invalid (`IBV_WC_WITH_INV`).
    pub invalidated_rkey: Option<u32>,
    /// The incoming Send carried the Solicited Event flag.
    pub solicited: bool,
}

/// Why `post_send` / `post_recv` refused a work request (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue already holds its configured depth.
    QueueFull { wr_id: u64 },
    /// The device refused the request in the QP's current state (an
    /// rdma-core device's `ibv_post_*` returned a state error such as
    /// `ENOTCONN`: Linux siw refuses a send before the QP is in RTS). A QP
    /// in the error state does not refuse: it flushes the request with
    /// [`WcStatus::WrFlushErr`] (see [`CqFull`](PostError::CqFull)).
    QpError { wr_id: u64 },
    /// The QP is in the error state, where a posted request is completed at
    /// once with [`WcStatus::WrFlushErr`], and the completion queue that
    /// takes that completion already holds its depth: nothing was queued
    /// (Linux siw `siw_sqe_complete` / `siw_rqe_complete` return `-ENOMEM`
    /// when the CQ has no free entry).
    CqFull { wr_id: u64 },
    /// The SGL's total length overflows 32 bits, or an opcode does not
    /// accept an SGL of that shape (a Read sink with more than one SGE is
    /// allowed; a Read of more than 2^31 bytes is not).
    InvalidWr { wr_id: u64, why: &'static str },
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::QueueFull { wr_id } => write!(f, "work request {wr_id}: queue full; poll completions or create the QP with a larger depth"),
            PostError::QpError { wr_id } => write!(f, "work request {wr_id}: refused by the device in the queue pair's current state; post sends once the connection is established"),
            PostError::CqFull { wr_id } => write!(f, "work request {wr_id}: the queue pair is in the error state and flushes it, but the completion queue is full; poll the CQ, then post again (or create the CQ with a larger depth)"),
            PostError::InvalidWr { wr_id, why } => write!(f, "work request {wr_id}: invalid: {why}"),
        }
    }
}

impl std::error::Error for PostError {}
