//! The C-visible types of the verbs (libibverbs names): the opaque
//! handles, the enums of flags, opcodes and states, `iwarp_sge`,
//! `iwarp_wc` and `iwarp_qp_event`, and their conversions from and to the
//! Rust API; a leaf the other verbs modules import.

use std::time::Duration;

use iwarp_rs::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QueuePair,
    SgList, Sge, WcOpcode, WcStatus, WorkCompletion,
};

use crate::consts::IWARP_MAX_SGE;
use crate::error::FfiError;

/// The software iWARP device (`struct ibv_context`).
pub struct iwarp_context {
    pub(crate) ctx: Context,
}

/// A protection domain (`struct ibv_pd`).
pub struct iwarp_pd {
    pub(crate) pd: ProtectionDomain,
}

/// A registered memory region (`struct ibv_mr`).
pub struct iwarp_mr {
    pub(crate) mr: MemoryRegion,
}

/// A completion queue (`struct ibv_cq`).
pub struct iwarp_cq {
    pub(crate) cq: CompletionQueue,
}

/// A queue pair (`struct ibv_qp`).
pub struct iwarp_qp {
    pub(crate) qp: QueuePair,
}

/// Deprecated: a connected QP's CQs switched to
/// `IWARP_PROGRESS_APP_DRIVEN` until released (see `iwarp_qp_drive`; use
/// `iwarp_cq_set_progress`).
pub struct iwarp_drive {
    /// The receive CQ first, then the send CQ if it is another one, each
    /// with the mode it had before (restored on release).
    pub(crate) cqs: Vec<(CompletionQueue, ProgressMode)>,
}

impl Drop for iwarp_drive {
    fn drop(&mut self) {
        for (cq, before) in self.cqs.iter().rev() {
            // Back to a mode the CQ already had: only AppDriven can fail
            // (creating its epoll set), and that one was set up before.
            let _ = cq.set_progress(*before);
        }
    }
}

/// Memory-region access flags (`enum ibv_access_flags`), OR-ed together.
/// Local read is always allowed. `IWARP_ACCESS_REMOTE_WRITE` requires
/// `IWARP_ACCESS_LOCAL_WRITE`, as in libibverbs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_access_flags {
    /// Receive buffers and RDMA Read sinks.
    IWARP_ACCESS_LOCAL_WRITE = 1,
    /// Target of the peer's RDMA Write.
    IWARP_ACCESS_REMOTE_WRITE = 2,
    /// Source of the peer's RDMA Read.
    IWARP_ACCESS_REMOTE_READ = 4,
}

/// Send-queue operations (`enum ibv_wr_opcode`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_wr_opcode {
    /// RDMAP Send (RFC 5040 §5.3): consumes a receive posted by the peer.
    IWARP_WR_SEND = 0,
    /// Send with Invalidate: the peer also invalidates `invalidate_rkey`.
    IWARP_WR_SEND_WITH_INV = 1,
    /// RDMA Write of the local SGEs to `remote_addr`/`rkey` (RFC 5040 §5.1).
    IWARP_WR_RDMA_WRITE = 2,
    /// RDMA Read of `remote_addr`/`rkey` into the local SGEs (RFC 5040 §5.2).
    IWARP_WR_RDMA_READ = 3,
}

/// Send flags (`enum ibv_send_flags`), OR-ed together.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_send_flags {
    /// Produce a completion on success (errors always complete).
    IWARP_SEND_SIGNALED = 1,
    /// Send with the Solicited Event flag (ignored for Write and Read).
    IWARP_SEND_SOLICITED = 2,
}

/// Completion status (`enum ibv_wc_status`), in `iwarp_wc.status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_wc_status {
    /// The work request completed.
    IWARP_WC_SUCCESS = 0,
    /// The incoming message was longer than the posted receive buffer.
    IWARP_WC_LOC_LEN_ERR = 1,
    /// A local SGE failed its memory check (bad lkey, bounds, rights).
    IWARP_WC_LOC_PROT_ERR = 2,
    /// The QP hit a local error processing this request.
    IWARP_WC_LOC_QP_OP_ERR = 3,
    /// The QP went to the error state; this request was never executed.
    IWARP_WC_WR_FLUSH_ERR = 4,
    /// The peer refused a remote access (bad rkey, bounds, rights).
    IWARP_WC_REM_ACCESS_ERR = 5,
    /// The peer could not perform the operation.
    IWARP_WC_REM_OP_ERR = 6,
    /// The peer found the request invalid.
    IWARP_WC_REM_INV_REQ_ERR = 7,
    /// Any other fatal error.
    IWARP_WC_GENERAL_ERR = 8,
}

/// What a completion completes (`enum ibv_wc_opcode`), in `iwarp_wc.opcode`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_wc_opcode {
    /// A Send or Send with Invalidate.
    IWARP_WC_SEND = 0,
    /// An RDMA Write.
    IWARP_WC_RDMA_WRITE = 1,
    /// An RDMA Read.
    IWARP_WC_RDMA_READ = 2,
    /// A posted receive consumed by the peer's Send.
    IWARP_WC_RECV = 3,
}

/// Completion flags (`enum ibv_wc_flags`), in `iwarp_wc.flags`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_wc_flags {
    /// A receive completed by Send with Invalidate: `invalidated_rkey` is
    /// valid and that region is now invalid.
    IWARP_WC_WITH_INV = 1,
    /// The incoming Send carried the Solicited Event flag.
    IWARP_WC_SOLICITED = 2,
}

/// Queue-pair states (`enum ibv_qp_state`), returned by `iwarp_query_qp_state`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_qp_state {
    /// Created, not connected: receives may be posted.
    IWARP_QPS_INIT = 0,
    /// Connected: ready to send and receive.
    IWARP_QPS_RTS = 1,
    /// Error: all outstanding work was flushed; work posted now completes
    /// at once with `IWARP_WC_WR_FLUSH_ERR`.
    IWARP_QPS_ERROR = 2,
    /// Disconnected in order; as in `IWARP_QPS_ERROR`, work posted now
    /// completes at once with `IWARP_WC_WR_FLUSH_ERR`.
    IWARP_QPS_CLOSED = 3,
}

/// Who does the receive work of a CQ's QPs while the application waits,
/// and so what `iwarp_wait_cq`, `iwarp_poll_cq` and `iwarp_cq_fd` do; set
/// with `iwarp_cq_set_progress`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_progress_mode {
    /// The default. The stack's receive threads read the sockets;
    /// `iwarp_wait_cq` polls the CQ (yielding the CPU) for up to `spin_us`,
    /// then sleeps until a completion arrives. The only mode in which the
    /// peer's one-sided operations (RDMA Write, Read) progress while no
    /// application thread waits or polls.
    IWARP_PROGRESS_THREADED = 0,
    /// `iwarp_wait_cq` does the receive work itself in a loop and never
    /// sleeps (until its timeout); the receive threads step aside meanwhile.
    /// Lowest latency, at the cost of a CPU. `spin_us` is ignored.
    IWARP_PROGRESS_BUSY_POLL = 1,
    /// Only application threads read the sockets; the stack's receive
    /// threads stay parked. `iwarp_wait_cq` does the receive work, polls for
    /// up to `spin_us`, then sleeps in poll(2); `iwarp_cq_fd` is an epoll
    /// set of the CQ's completions and its connected QPs' sockets, and
    /// `iwarp_poll_cq` does the receive work when the CQ is empty. Nothing
    /// is received (not even the peer's RDMA Write, close or Terminate)
    /// until a thread calls `iwarp_wait_cq`, `iwarp_poll_cq` or
    /// `iwarp_cq_progress`. For an event loop that waits for several
    /// things at once: the data is read by the thread that wakes anyway.
    IWARP_PROGRESS_APP_DRIVEN = 2,
}

/// Queue-pair events (`rdma_cm_event_type` / `ibv_event_type` subset), in
/// `iwarp_qp_event.event_type`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_event_type {
    /// The connection is established (`RDMA_CM_EVENT_ESTABLISHED`).
    IWARP_EVENT_ESTABLISHED = 0,
    /// The connection is gone; outstanding work was flushed
    /// (`RDMA_CM_EVENT_DISCONNECTED`). Reported once.
    IWARP_EVENT_DISCONNECTED = 1,
    /// The peer sent a Terminate (RFC 5040 §4.8); the QP is in error.
    IWARP_EVENT_TERMINATE_RECEIVED = 2,
    /// We sent the peer a Terminate; the QP is in error.
    IWARP_EVENT_TERMINATE_SENT = 3,
    /// The peer stayed silent for `peer_timeout_ms` while it owed an
    /// answer; the connection is given up and `IWARP_EVENT_DISCONNECTED`
    /// follows. `iwarp_last_error` says which wait timed out.
    IWARP_EVENT_PEER_TIMEOUT = 4,
    /// An event this version of the header does not know.
    IWARP_EVENT_OTHER = 99,
}

/// One scatter/gather element (`struct ibv_sge`): `length` bytes at `addr`
/// inside the region whose local key is `lkey`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct iwarp_sge {
    /// Start address (inside the region: `iwarp_mr_addr(mr) + offset`).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// `iwarp_mr_lkey(mr)`.
    pub lkey: u32,
}

/// A work completion (`struct ibv_wc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct iwarp_wc {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// An `iwarp_wc_status`.
    pub status: i32,
    /// An `iwarp_wc_opcode`.
    pub opcode: i32,
    /// Bytes received (receives) or transferred (RDMA Reads).
    pub byte_len: u32,
    /// With `IWARP_WC_WITH_INV`: the STag the peer invalidated.
    pub invalidated_rkey: u32,
    /// `iwarp_wc_flags` OR-ed together.
    pub flags: u32,
}

/// A queue-pair event, filled by `iwarp_qp_next_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct iwarp_qp_event {
    /// An `iwarp_event_type`.
    pub event_type: i32,
    /// For Terminate events: the Terminate's layer (RFC 5040 §4.8).
    pub term_layer: u8,
    /// For Terminate events: the error type.
    pub term_etype: u8,
    /// For Terminate events: the error code.
    pub term_ecode: u8,
}

pub(crate) fn wc_to_c(wc: &WorkCompletion) -> iwarp_wc {
    let status = match wc.status {
        WcStatus::Success => iwarp_wc_status::IWARP_WC_SUCCESS,
        WcStatus::LocLenErr => iwarp_wc_status::IWARP_WC_LOC_LEN_ERR,
        WcStatus::LocProtErr => iwarp_wc_status::IWARP_WC_LOC_PROT_ERR,
        WcStatus::LocQpOpErr => iwarp_wc_status::IWARP_WC_LOC_QP_OP_ERR,
        WcStatus::WrFlushErr => iwarp_wc_status::IWARP_WC_WR_FLUSH_ERR,
        WcStatus::RemAccessErr => iwarp_wc_status::IWARP_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => iwarp_wc_status::IWARP_WC_REM_OP_ERR,
        WcStatus::RemInvReqErr => iwarp_wc_status::IWARP_WC_REM_INV_REQ_ERR,
        WcStatus::GeneralErr => iwarp_wc_status::IWARP_WC_GENERAL_ERR,
    };
    let opcode = match wc.opcode {
        WcOpcode::Send => iwarp_wc_opcode::IWARP_WC_SEND,
        WcOpcode::RdmaWrite => iwarp_wc_opcode::IWARP_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => iwarp_wc_opcode::IWARP_WC_RDMA_READ,
        WcOpcode::Recv => iwarp_wc_opcode::IWARP_WC_RECV,
    };
    let mut flags = 0;
    if wc.invalidated_rkey.is_some() {
        flags |= iwarp_wc_flags::IWARP_WC_WITH_INV as u32;
    }
    if wc.solicited {
        flags |= iwarp_wc_flags::IWARP_WC_SOLICITED as u32;
    }
    iwarp_wc {
        wr_id: wc.wr_id,
        status: status as i32,
        opcode: opcode as i32,
        byte_len: wc.byte_len,
        invalidated_rkey: wc.invalidated_rkey.unwrap_or(0),
        flags,
    }
}

pub(crate) fn access_from_c(access: u32) -> Result<Access, FfiError> {
    if access & !7 != 0 {
        return Err(FfiError::invalid(format!(
            "unknown access flags {access:#x}: use IWARP_ACCESS_LOCAL_WRITE, IWARP_ACCESS_REMOTE_WRITE and IWARP_ACCESS_REMOTE_READ"
        )));
    }
    Ok(Access::from_bits_truncate(access as u8))
}

/// Copy `num_sge` C SGEs into an [`SgList`].
///
/// # Safety
/// `sg_list` is NULL or valid for reads of `num_sge` elements.
pub(crate) unsafe fn sgl_from_c(
    sg_list: *const iwarp_sge,
    num_sge: usize,
) -> Result<SgList, FfiError> {
    if num_sge == 0 {
        return Ok(SgList::new());
    }
    if sg_list.is_null() {
        return Err(FfiError::null("sg_list"));
    }
    if num_sge > IWARP_MAX_SGE {
        return Err(FfiError::invalid(format!(
            "{num_sge} scatter/gather elements; at most IWARP_MAX_SGE ({IWARP_MAX_SGE}) per work request"
        )));
    }
    // SAFETY: non-NULL and valid for `num_sge` reads (caller); iwarp_sge is
    // plain old data, so every bit pattern is a valid value.
    let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge) };
    let mut l = SgList::new();
    for s in sges {
        l.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        });
    }
    Ok(l)
}

pub(crate) fn duration_ms(timeout_ms: u32) -> Duration {
    Duration::from_millis(u64::from(timeout_ms))
}
