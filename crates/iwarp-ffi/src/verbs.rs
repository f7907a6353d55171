//! Verbs (libibverbs names): device, protection domain, memory regions,
//! completion queues, queue pairs, posting and polling.

use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

use iwarp_rs::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpEvent,
    QpInitAttr, QpState, QueuePair, RecvWr, SendWr, SgList, Sge, WcOpcode, WcQueue, WcStatus,
    WorkCompletion, WrOpcode,
};

use crate::boundary::{free, give, guard, guard_or, handle, out_ptr};
use crate::error::{iwarp_result, FfiError};
use crate::{IWARP_MAX_SGE, IWARP_TIMEOUT_INFINITE};

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

fn wc_to_c(wc: &WorkCompletion) -> iwarp_wc {
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

fn access_from_c(access: u32) -> Result<Access, FfiError> {
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
unsafe fn sgl_from_c(sg_list: *const iwarp_sge, num_sge: usize) -> Result<SgList, FfiError> {
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

fn duration_ms(timeout_ms: u32) -> Duration {
    Duration::from_millis(u64::from(timeout_ms))
}

// ---------------------------------------------------------------------------
// Device and protection domain

/// Open the device named by the environment variable `IWARP_DEVICE`
/// ("soft", "auto", or a kernel RDMA device such as "siw0"), the software
/// iWARP device when it is unset (`ibv_open_device`); see
/// `iwarp_open_device_named` to name it. Free it with
/// `iwarp_close_device`.
///
/// # Safety
/// `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn iwarp_open_device(out: *mut *mut iwarp_context) -> iwarp_result {
    guard("iwarp_open_device", || {
        // SAFETY: `out` is NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        let ctx = Context::open()?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_context { ctx }) };
        Ok(())
    })
}

/// Open the device `name` (`ibv_open_device` on a device of
/// `ibv_get_device_list`): "soft" (the software iWARP stack over TCP),
/// "auto" (a kernel RDMA device if there is one, else soft), or a kernel
/// device as `ibv_devices` lists it ("siw0", "rxe0", "mlx5_0"), used
/// through rdma-core. NULL or "" is `iwarp_open_device`
/// (`IWARP_DEVICE`, else soft). A device that is not there gives
/// `IWARP_ERR_INVALID_ARG` and an `iwarp_last_error` naming the cause and
/// the fix. Free it with `iwarp_close_device`.
///
/// # Safety
/// `name` is NULL or NUL-terminated; `out` is NULL or valid for writing a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn iwarp_open_device_named(
    name: *const c_char,
    out: *mut *mut iwarp_context,
) -> iwarp_result {
    guard("iwarp_open_device_named", || {
        // SAFETY: `out` is NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        let ctx = if name.is_null() {
            Context::open()?
        } else {
            // SAFETY: non-NULL and NUL-terminated (caller).
            let name = unsafe { std::ffi::CStr::from_ptr(name) }
                .to_str()
                .map_err(|_| FfiError::invalid("device name is not valid UTF-8"))?;
            if name.is_empty() {
                Context::open()?
            } else {
                Context::open_device(name)?
            }
        };
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_context { ctx }) };
        Ok(())
    })
}

/// Copy the name of the device `ctx` runs on ("soft", "siw0", ...) into
/// `buf` (capacity `len`, NUL-terminated, truncated if needed); returns
/// the name's length without the NUL, or 0 if `ctx` is NULL.
///
/// # Safety
/// `ctx` is NULL or a live device handle; `buf` is NULL or valid for
/// `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_device_name(
    ctx: *const iwarp_context,
    buf: *mut c_char,
    len: usize,
) -> usize {
    guard_or("iwarp_device_name", 0, || {
        // SAFETY: NULL or a live handle (caller).
        let c = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: NULL or valid for `len` bytes (caller).
        Ok(unsafe { crate::error::copy_cstr(c.ctx.device_name(), buf, len) })
    })
}

/// Close the device (`ibv_close_device`). Objects created from it stay
/// usable until they are freed themselves. NULL is a no-op.
///
/// # Safety
/// `ctx` is NULL or a live handle from `iwarp_open_device`, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_close_device(ctx: *mut iwarp_context) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_close_device", ctx) }
}

/// Allocate a protection domain (`ibv_alloc_pd`). Free it with
/// `iwarp_dealloc_pd`.
///
/// # Safety
/// `ctx` is NULL or a live device handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_alloc_pd(
    ctx: *mut iwarp_context,
    out: *mut *mut iwarp_pd,
) -> iwarp_result {
    guard("iwarp_alloc_pd", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let ctx = unsafe { handle(ctx, "ctx") }?;
        let pd = ctx.ctx.alloc_pd();
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_pd { pd }) };
        Ok(())
    })
}

/// Free a protection domain (`ibv_dealloc_pd`). Regions and QPs created in
/// it stay usable until they are freed themselves. NULL is a no-op.
///
/// # Safety
/// `pd` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_dealloc_pd(pd: *mut iwarp_pd) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_dealloc_pd", pd) }
}

// ---------------------------------------------------------------------------
// Memory regions

/// Register caller memory `addr .. addr + length` (`ibv_reg_mr`). `access`
/// is `iwarp_access_flags` OR-ed together. The memory must stay valid until
/// `iwarp_dereg_mr`; the stack's threads read and write it while work
/// requests (and the peer's RDMA operations) use it.
///
/// # Safety
/// `pd` is NULL or a live handle; `out` is NULL or writable; `addr` is NULL
/// or valid for reads and writes of `length` bytes until the region is
/// deregistered.
#[no_mangle]
pub unsafe extern "C" fn iwarp_reg_mr(
    pd: *mut iwarp_pd,
    addr: *mut c_void,
    length: usize,
    access: u32,
    out: *mut *mut iwarp_mr,
) -> iwarp_result {
    guard("iwarp_reg_mr", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let pd = unsafe { handle(pd, "pd") }?;
        if addr.is_null() {
            return Err(FfiError::null("addr"));
        }
        let access = access_from_c(access)?;
        // SAFETY: the caller keeps `addr .. addr + length` valid until
        // iwarp_dereg_mr drops the region (the function's contract).
        let mr = unsafe { pd.pd.reg_mr_raw(addr.cast::<u8>(), length, access) }?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_mr { mr }) };
        Ok(())
    })
}

/// Allocate and register a zeroed, page-aligned buffer of `length` bytes
/// owned by the library (`ibv_reg_mr` over memory you do not manage). Its
/// address is `iwarp_mr_addr`; it is freed by `iwarp_dereg_mr`.
///
/// # Safety
/// `pd` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_alloc_mr(
    pd: *mut iwarp_pd,
    length: usize,
    access: u32,
    out: *mut *mut iwarp_mr,
) -> iwarp_result {
    guard("iwarp_alloc_mr", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let pd = unsafe { handle(pd, "pd") }?;
        let mr = pd.pd.reg_mr(length, access_from_c(access)?)?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_mr { mr }) };
        Ok(())
    })
}

/// Start address of the region (NULL if `mr` is NULL).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_addr(mr: *const iwarp_mr) -> *mut c_void {
    guard_or("iwarp_mr_addr", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live handle (caller).
        let mr = unsafe { handle(mr, "mr") }?;
        Ok(mr.mr.addr() as usize as *mut c_void)
    })
}

/// Length of the region in bytes (0 if `mr` is NULL).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_length(mr: *const iwarp_mr) -> usize {
    guard_or("iwarp_mr_length", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(mr, "mr") }?.mr.len())
    })
}

/// Local key, for `iwarp_sge.lkey` (0 if `mr` is NULL).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_lkey(mr: *const iwarp_mr) -> u32 {
    guard_or("iwarp_mr_lkey", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(mr, "mr") }?.mr.lkey())
    })
}

/// Remote key (STag) the peer uses in RDMA Write and Read (0 if `mr` is
/// NULL; 0 is never a valid key of a registered region).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_rkey(mr: *const iwarp_mr) -> u32 {
    guard_or("iwarp_mr_rkey", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(mr, "mr") }?.mr.rkey())
    })
}

/// Deregister the region (`ibv_dereg_mr`); its keys are invalid from now
/// on, and a library-owned buffer is freed. Waits until no stack thread
/// still copies to or from it. Do not deregister a region an outstanding
/// work request uses. NULL is a no-op.
///
/// # Safety
/// `mr` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_dereg_mr(mr: *mut iwarp_mr) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_dereg_mr", mr) }
}

// ---------------------------------------------------------------------------
// Completion queues

/// Create a completion queue holding up to `depth` completions
/// (`ibv_create_cq`); make it at least the sum of the queue depths of the
/// QPs that use it.
///
/// # Safety
/// `ctx` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_create_cq(
    ctx: *mut iwarp_context,
    depth: u32,
    out: *mut *mut iwarp_cq,
) -> iwarp_result {
    guard("iwarp_create_cq", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let ctx = unsafe { handle(ctx, "ctx") }?;
        let cq = ctx.ctx.create_cq(depth as usize)?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_cq { cq }) };
        Ok(())
    })
}

/// Free a completion queue (`ibv_destroy_cq`). QPs that use it keep it
/// alive internally until they are destroyed. NULL is a no-op.
///
/// # Safety
/// `cq` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_destroy_cq(cq: *mut iwarp_cq) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_destroy_cq", cq) }
}

/// Choose who does the receive work of the QPs that use `cq` while the
/// application waits (an `iwarp_progress_mode`), and so what
/// `iwarp_wait_cq`, `iwarp_poll_cq` and `iwarp_cq_fd` do. `spin_us` is how
/// long `iwarp_wait_cq` polls before it sleeps (THREADED, APP_DRIVEN; 0
/// sleeps at once; ignored for BUSY_POLL). Set it before the QPs connect
/// and before threads wait; it applies to QPs already connected too. A QP
/// whose send and receive CQs differ is application-driven if either of
/// them is. Returns `IWARP_ERR_NULL_ARG` for a NULL `cq`,
/// `IWARP_ERR_INVALID_ARG` for an unknown mode, `IWARP_ERR_IO` if the epoll
/// set of APP_DRIVEN cannot be created.
///
/// # Safety
/// `cq` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_cq_set_progress(
    cq: *mut iwarp_cq,
    mode: i32,
    spin_us: u32,
) -> iwarp_result {
    guard("iwarp_cq_set_progress", || {
        // SAFETY: NULL or a live handle (caller).
        let cq = unsafe { handle(cq, "cq") }?;
        let spin = Duration::from_micros(u64::from(spin_us));
        let mode = match mode {
            m if m == iwarp_progress_mode::IWARP_PROGRESS_THREADED as i32 => {
                ProgressMode::Threaded { spin }
            }
            m if m == iwarp_progress_mode::IWARP_PROGRESS_BUSY_POLL as i32 => ProgressMode::BusyPoll,
            m if m == iwarp_progress_mode::IWARP_PROGRESS_APP_DRIVEN as i32 => {
                ProgressMode::AppDriven { spin }
            }
            other => {
                return Err(FfiError::invalid(format!(
                    "unknown progress mode {other}: use an iwarp_progress_mode (IWARP_PROGRESS_THREADED, IWARP_PROGRESS_BUSY_POLL, IWARP_PROGRESS_APP_DRIVEN)"
                )))
            }
        };
        cq.cq.set_progress(mode)?;
        Ok(())
    })
}

/// A file descriptor for poll/epoll, level-triggered: readable (`POLLIN`)
/// while the CQ holds completions and, in `IWARP_PROGRESS_APP_DRIVEN` mode
/// (an epoll set), also while a connected QP's socket holds bytes for
/// `iwarp_poll_cq` to process. When it is readable, call `iwarp_poll_cq`
/// until it returns 0. Set the progress mode first. It belongs to the CQ:
/// never read from or close it. Returns -1 if `cq` is NULL.
///
/// # Safety
/// `cq` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_cq_fd(cq: *const iwarp_cq) -> c_int {
    guard_or("iwarp_cq_fd", -1, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(cq, "cq") }?.cq.as_raw_fd())
    })
}

/// Do the pending receive and transmit work of the QPs attached to `cq`
/// from the calling thread and return at once, without taking completions.
/// A busy-poll loop that spins on memory (the last byte of an RDMA Write)
/// rather than on the CQ calls this in its loop, so it reads its own socket
/// instead of waiting for the stack's receive thread; while it does, the
/// receive threads step aside. In `IWARP_PROGRESS_APP_DRIVEN` mode it is
/// how an application lets the peer's one-sided operations, close or
/// Terminate be seen without waiting (before trusting
/// `iwarp_query_qp_state` after a pause, say). It costs a non-blocking
/// `recv` per connected QP. Returns `IWARP_ERR_NULL_ARG` for a NULL `cq`.
///
/// # Safety
/// `cq` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_cq_progress(cq: *const iwarp_cq) -> iwarp_result {
    guard("iwarp_cq_progress", || {
        // SAFETY: NULL or a live handle (caller).
        unsafe { handle(cq, "cq") }?.cq.progress();
        Ok(())
    })
}

/// Deprecated: use `iwarp_cq_set_progress(cq, IWARP_PROGRESS_APP_DRIVEN,
/// 0)` on the QP's CQs and wait with `iwarp_wait_cq` or `iwarp_cq_fd`.
/// Kept for compatibility: switches the connected QP's send and receive
/// CQs to `IWARP_PROGRESS_APP_DRIVEN` (spin 0; a CQ already in that mode
/// keeps its spin) until `iwarp_drive_release`, which restores their
/// previous modes. Meanwhile nothing is received unless a thread calls
/// `iwarp_drive_progress`, `iwarp_cq_progress`, `iwarp_poll_cq` or
/// `iwarp_wait_cq`. Returns `IWARP_ERR_QP_STATE` if the QP is not
/// connected, `IWARP_ERR_NULL_ARG` for a NULL argument.
///
/// # Safety
/// `qp` is NULL or a live handle; `out` is NULL or valid for a write.
#[deprecated(note = "use iwarp_cq_set_progress")]
#[no_mangle]
pub unsafe extern "C" fn iwarp_qp_drive(
    qp: *const iwarp_qp,
    out: *mut *mut iwarp_drive,
) -> iwarp_result {
    guard("iwarp_qp_drive", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        if qp.qp.peer_addr().is_none() {
            return Err(FfiError::new(
                iwarp_result::IWARP_ERR_QP_STATE,
                "the QP is not connected: drive it after the connection is established",
            ));
        }
        let (rcq, scq) = (qp.qp.recv_cq(), qp.qp.send_cq());
        let mut d = iwarp_drive {
            cqs: Vec::with_capacity(2),
        };
        for cq in [rcq, scq] {
            if d.cqs.iter().any(|(c, _)| c.same_as(cq)) {
                continue;
            }
            let before = cq.progress_mode();
            if !matches!(before, ProgressMode::AppDriven { .. }) {
                // On failure, dropping `d` restores the CQs switched so far.
                cq.set_progress(ProgressMode::AppDriven {
                    spin: Duration::ZERO,
                })?;
            }
            d.cqs.push((cq.clone(), before));
        }
        // SAFETY: checked by out_ptr.
        unsafe { give(out, d) };
        Ok(())
    })
}

/// Deprecated: use `iwarp_cq_fd` of a CQ in `IWARP_PROGRESS_APP_DRIVEN`
/// mode. The driven QP's receive CQ's `iwarp_cq_fd`: wait for `POLLIN` on
/// it, then call `iwarp_drive_progress` (or `iwarp_poll_cq`). Never read,
/// write or close it. -1 for NULL.
///
/// # Safety
/// `d` is NULL or a live handle.
#[deprecated(note = "use iwarp_cq_set_progress")]
#[no_mangle]
pub unsafe extern "C" fn iwarp_drive_fd(d: *const iwarp_drive) -> c_int {
    guard_or("iwarp_drive_fd", -1, || {
        // SAFETY: NULL or a live handle (caller).
        let d = unsafe { handle(d, "drive") }?;
        Ok(d.cqs.first().map_or(-1, |(cq, _)| cq.as_raw_fd()))
    })
}

/// Deprecated: use `iwarp_cq_progress`. Does the pending receive (and
/// transmit) work of the driven QP's CQs from the calling thread; never
/// blocks. `IWARP_ERR_NULL_ARG` for NULL.
///
/// # Safety
/// `d` is NULL or a live handle.
#[deprecated(note = "use iwarp_cq_set_progress")]
#[no_mangle]
pub unsafe extern "C" fn iwarp_drive_progress(d: *const iwarp_drive) -> iwarp_result {
    guard("iwarp_drive_progress", || {
        // SAFETY: NULL or a live handle (caller).
        for (cq, _) in &unsafe { handle(d, "drive") }?.cqs {
            cq.progress();
        }
        Ok(())
    })
}

/// Deprecated: use `iwarp_cq_set_progress`. Ends a drive: the QP's CQs get
/// back the progress modes they had before `iwarp_qp_drive`. NULL is a
/// no-op.
///
/// # Safety
/// `d` is NULL or a live handle, not used again.
#[deprecated(note = "use iwarp_cq_set_progress")]
#[no_mangle]
pub unsafe extern "C" fn iwarp_drive_release(d: *mut iwarp_drive) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_drive_release", d) }
}

/// Move up to `max` completions into `wc[0..max]`, oldest first
/// (`ibv_poll_cq`). Never blocks; in `IWARP_PROGRESS_APP_DRIVEN` mode an
/// empty CQ first gets the receive work done. Returns the number moved (0
/// if the CQ is empty), or a negated `iwarp_result` (`-IWARP_ERR_NULL_ARG`
/// for a NULL `cq` or `wc`, `-IWARP_ERR_INVALID_ARG` for `max < 0`).
///
/// # Safety
/// `cq` is NULL or a live handle; `wc` is NULL or valid for writes of `max`
/// elements.
#[no_mangle]
pub unsafe extern "C" fn iwarp_poll_cq(cq: *mut iwarp_cq, max: i32, wc: *mut iwarp_wc) -> i32 {
    let mut code = iwarp_result::IWARP_OK;
    let n = guard_or("iwarp_poll_cq", -1, || {
        // SAFETY: NULL or a live handle (caller).
        let cq = unsafe { handle(cq, "cq") }.inspect_err(|e| code = e.code)?;
        if wc.is_null() {
            code = iwarp_result::IWARP_ERR_NULL_ARG;
            return Err(FfiError::null("wc"));
        }
        if max < 0 {
            code = iwarp_result::IWARP_ERR_INVALID_ARG;
            return Err(FfiError::invalid(format!(
                "max is {max}: pass the number of elements of the wc array"
            )));
        }
        const PLACEHOLDER: WorkCompletion = WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            queue: WcQueue::Send,
            byte_len: 0,
            invalidated_rkey: None,
            solicited: false,
        };
        let max = max as usize;
        let mut buf = [PLACEHOLDER; 16];
        let mut done = 0usize;
        while done < max {
            let want = (max - done).min(buf.len());
            let got = cq.cq.poll(&mut buf[..want]);
            for (i, w) in buf[..got].iter().enumerate() {
                // SAFETY: `done + i < max` and `wc` is valid for `max`
                // writes (caller); `write` does not read the old value.
                unsafe { wc.add(done + i).write(wc_to_c(w)) };
            }
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done as i32)
    });
    if n < 0 {
        -(if code == iwarp_result::IWARP_OK {
            iwarp_result::IWARP_ERR_PANIC
        } else {
            code
        } as i32)
    } else {
        n
    }
}

/// Wait up to `timeout_ms` (or `IWARP_TIMEOUT_INFINITE`) for one completion
/// and move it into `*wc`. How it waits, and who does the receive work
/// meanwhile, is the CQ's `iwarp_progress_mode` (`iwarp_cq_set_progress`).
/// Returns `IWARP_ERR_TIMEOUT` if none arrived.
///
/// # Safety
/// `cq` is NULL or a live handle; `wc` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_wait_cq(
    cq: *mut iwarp_cq,
    timeout_ms: u32,
    wc: *mut iwarp_wc,
) -> iwarp_result {
    guard("iwarp_wait_cq", || {
        // SAFETY: NULL or a live handle (caller).
        let cq = unsafe { handle(cq, "cq") }?;
        if wc.is_null() {
            return Err(FfiError::null("wc"));
        }
        let got = loop {
            let step = if timeout_ms == IWARP_TIMEOUT_INFINITE {
                Duration::from_secs(3600)
            } else {
                duration_ms(timeout_ms)
            };
            match cq.cq.wait_one(step)? {
                Some(w) => break w,
                None if timeout_ms == IWARP_TIMEOUT_INFINITE => continue,
                None => {
                    return Err(FfiError::new(
                        iwarp_result::IWARP_ERR_TIMEOUT,
                        format!("no completion within {timeout_ms} ms: is a work request outstanding on a QP that uses this CQ?"),
                    ))
                }
            }
        };
        // SAFETY: non-NULL and writable (caller).
        unsafe { wc.write(wc_to_c(&got)) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Queue pairs

/// Create a queue pair in state INIT (`ibv_create_qp`): receives may be
/// posted at once; connect it with `iwarp_connect` or `iwarp_accept`.
/// `send_cq` and `recv_cq` may be the same CQ.
///
/// # Safety
/// `pd`, `send_cq`, `recv_cq` are NULL or live handles; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_create_qp(
    pd: *mut iwarp_pd,
    send_cq: *mut iwarp_cq,
    recv_cq: *mut iwarp_cq,
    max_send_wr: u32,
    max_recv_wr: u32,
    out: *mut *mut iwarp_qp,
) -> iwarp_result {
    guard("iwarp_create_qp", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or live handles (caller).
        let (pd, scq, rcq) = unsafe {
            (
                handle(pd, "pd")?,
                handle(send_cq, "send_cq")?,
                handle(recv_cq, "recv_cq")?,
            )
        };
        let qp = pd.pd.create_qp(&QpInitAttr {
            send_cq: scq.cq.clone(),
            recv_cq: rcq.cq.clone(),
            max_send_wr,
            max_recv_wr,
        })?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_qp { qp }) };
        Ok(())
    })
}

/// Destroy a queue pair (`rdma_destroy_qp` after `rdma_disconnect`): it is
/// disconnected, outstanding work requests are flushed into the CQs
/// (`IWARP_WC_WR_FLUSH_ERR`), the stack's threads for it exit (bounded
/// wait), and the handle is freed. NULL is a no-op.
///
/// # Safety
/// `qp` is NULL or a live handle, not used again (by any thread).
#[no_mangle]
pub unsafe extern "C" fn iwarp_destroy_qp(qp: *mut iwarp_qp) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_destroy_qp", qp) }
}

/// Post one send-queue work request (`ibv_post_send`). `opcode` is an
/// `iwarp_wr_opcode`; `remote_addr` and `rkey` are used by RDMA Write and
/// Read, `invalidate_rkey` by Send with Invalidate; `flags` is
/// `iwarp_send_flags` OR-ed together. `sg_list` may be NULL when `num_sge`
/// is 0 (a zero-length operation). Never blocks on the network. Failures
/// after posting arrive as error completions.
///
/// On a QP in the error state (`IWARP_QPS_ERROR`, or `IWARP_QPS_CLOSED`
/// after a disconnect) the request is accepted and completes at once with
/// `IWARP_WC_WR_FLUSH_ERR`, signaled or not, with its own opcode and a
/// byte count of 0, after the requests posted before it; nothing is sent
/// (as Linux siw does; the kernel's `ib_drain_qp`
/// posts such a marker and waits for its flush completion). If the send
/// CQ already holds its depth, `IWARP_ERR_QUEUE_FULL` instead: poll it,
/// then post again. Before the connection exists (`IWARP_QPS_INIT`) the
/// software device queues the request until the connection is
/// established; an rdma-core device refuses it with `IWARP_ERR_QP_STATE`.
///
/// # Safety
/// `qp` is NULL or a live handle; `sg_list` is NULL or valid for reads of
/// `num_sge` elements (only during the call).
#[no_mangle]
pub unsafe extern "C" fn iwarp_post_send(
    qp: *mut iwarp_qp,
    wr_id: u64,
    opcode: i32,
    sg_list: *const iwarp_sge,
    num_sge: usize,
    remote_addr: u64,
    rkey: u32,
    invalidate_rkey: u32,
    flags: u32,
) -> iwarp_result {
    guard("iwarp_post_send", || {
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        // SAFETY: NULL or valid for `num_sge` reads (caller).
        let sgl = unsafe { sgl_from_c(sg_list, num_sge) }?;
        let opcode = match opcode {
            0 => WrOpcode::Send,
            1 => WrOpcode::SendWithInv { invalidate_rkey },
            2 => WrOpcode::RdmaWrite { remote_addr, rkey },
            3 => WrOpcode::RdmaRead { remote_addr, rkey },
            other => {
                return Err(FfiError::invalid(format!(
                    "work request {wr_id}: unknown opcode {other}: use an iwarp_wr_opcode (IWARP_WR_SEND ... IWARP_WR_RDMA_READ)"
                )))
            }
        };
        let known = iwarp_send_flags::IWARP_SEND_SIGNALED as u32
            | iwarp_send_flags::IWARP_SEND_SOLICITED as u32;
        if flags & !known != 0 {
            return Err(FfiError::invalid(format!(
                "work request {wr_id}: unknown send flags {flags:#x}: use IWARP_SEND_SIGNALED and IWARP_SEND_SOLICITED"
            )));
        }
        qp.qp.post_send(&SendWr {
            wr_id,
            opcode,
            sgl,
            signaled: flags & iwarp_send_flags::IWARP_SEND_SIGNALED as u32 != 0,
            solicited: flags & iwarp_send_flags::IWARP_SEND_SOLICITED as u32 != 0,
        })?;
        Ok(())
    })
}

/// Post one receive (`ibv_post_recv`); allowed from state INIT on, so
/// buffers can be in place before the peer's first Send. On a QP in the
/// error state it completes at once with `IWARP_WC_WR_FLUSH_ERR` and a
/// byte count of 0, or fails with `IWARP_ERR_QUEUE_FULL` if the receive CQ
/// already holds its depth, as in `iwarp_post_send`.
///
/// # Safety
/// `qp` is NULL or a live handle; `sg_list` is NULL or valid for reads of
/// `num_sge` elements (only during the call).
#[no_mangle]
pub unsafe extern "C" fn iwarp_post_recv(
    qp: *mut iwarp_qp,
    wr_id: u64,
    sg_list: *const iwarp_sge,
    num_sge: usize,
) -> iwarp_result {
    guard("iwarp_post_recv", || {
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        // SAFETY: NULL or valid for `num_sge` reads (caller).
        let sgl = unsafe { sgl_from_c(sg_list, num_sge) }?;
        qp.qp.post_recv(&RecvWr { wr_id, sgl })?;
        Ok(())
    })
}

/// The QP's state: an `iwarp_qp_state`, or `-IWARP_ERR_NULL_ARG` if `qp`
/// is NULL.
///
/// # Safety
/// `qp` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_query_qp_state(qp: *const iwarp_qp) -> i32 {
    guard_or(
        "iwarp_query_qp_state",
        -(iwarp_result::IWARP_ERR_NULL_ARG as i32),
        || {
            // SAFETY: NULL or a live handle (caller).
            let qp = unsafe { handle(qp, "qp") }?;
            Ok(match qp.qp.state() {
                QpState::Init => iwarp_qp_state::IWARP_QPS_INIT,
                QpState::Rts => iwarp_qp_state::IWARP_QPS_RTS,
                QpState::Error => iwarp_qp_state::IWARP_QPS_ERROR,
                QpState::Closed => iwarp_qp_state::IWARP_QPS_CLOSED,
            } as i32)
        },
    )
}

/// Wait up to `timeout_ms` (or `IWARP_TIMEOUT_INFINITE`) for the QP's next
/// event and store it in `*event`; `IWARP_ERR_TIMEOUT` if none came. For
/// Terminate events the reason is also stored as this thread's
/// `iwarp_last_error` text.
///
/// # Safety
/// `qp` is NULL or a live handle; `event` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_qp_next_event(
    qp: *mut iwarp_qp,
    timeout_ms: u32,
    event: *mut iwarp_qp_event,
) -> iwarp_result {
    guard("iwarp_qp_next_event", || {
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        if event.is_null() {
            return Err(FfiError::null("event"));
        }
        let ev = loop {
            let step = if timeout_ms == IWARP_TIMEOUT_INFINITE {
                Duration::from_secs(3600)
            } else {
                duration_ms(timeout_ms)
            };
            match qp.qp.next_event(step) {
                Some(ev) => break ev,
                None if timeout_ms == IWARP_TIMEOUT_INFINITE => continue,
                None => {
                    return Err(FfiError::new(
                        iwarp_result::IWARP_ERR_TIMEOUT,
                        format!("no queue-pair event within {timeout_ms} ms"),
                    ))
                }
            }
        };
        let mut out = iwarp_qp_event::default();
        let term = |out: &mut iwarp_qp_event, t: &iwarp_rs::TermInfo, ty: iwarp_event_type| {
            out.event_type = ty as i32;
            out.term_layer = t.layer;
            out.term_etype = t.etype;
            out.term_ecode = t.ecode;
            crate::error::set_last_error(format!("iwarp_qp_next_event: Terminate: {t}"));
        };
        match &ev {
            QpEvent::Established => {
                out.event_type = iwarp_event_type::IWARP_EVENT_ESTABLISHED as i32;
            }
            QpEvent::Disconnected => {
                out.event_type = iwarp_event_type::IWARP_EVENT_DISCONNECTED as i32;
            }
            QpEvent::TerminateReceived(t) => term(
                &mut out,
                t,
                iwarp_event_type::IWARP_EVENT_TERMINATE_RECEIVED,
            ),
            QpEvent::TerminateSent(t) => {
                term(&mut out, t, iwarp_event_type::IWARP_EVENT_TERMINATE_SENT)
            }
            QpEvent::PeerTimeout(why) => {
                out.event_type = iwarp_event_type::IWARP_EVENT_PEER_TIMEOUT as i32;
                crate::error::set_last_error(format!("iwarp_qp_next_event: {why}"));
            }
            _ => out.event_type = iwarp_event_type::IWARP_EVENT_OTHER as i32,
        }
        // SAFETY: non-NULL and writable (caller).
        unsafe { event.write(out) };
        Ok(())
    })
}

/// Disconnect the QP (`rdma_disconnect`): it stops accepting work,
/// outstanding work requests are flushed with `IWARP_WC_WR_FLUSH_ERR`, and
/// the TCP connection is closed. Idempotent; the handle stays valid until
/// `iwarp_destroy_qp`.
///
/// # Safety
/// `qp` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_disconnect(qp: *mut iwarp_qp) -> iwarp_result {
    guard("iwarp_disconnect", || {
        // SAFETY: NULL or a live handle (caller).
        unsafe { handle(qp, "qp") }?.qp.disconnect();
        Ok(())
    })
}

/// Write the QP's peer address as "ip:port" ("[ip6]:port" for IPv6) into
/// `buf` (NUL-terminated, truncated to `len - 1` characters) and return its
/// full length without the NUL (`snprintf` semantics). Returns 0 (and
/// writes "") if the QP is not connected or `qp` is NULL.
///
/// # Safety
/// `qp` is NULL or a live handle; `buf` is NULL or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_qp_peer(qp: *const iwarp_qp, buf: *mut c_char, len: usize) -> usize {
    guard_or("iwarp_qp_peer", 0, || {
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") };
        let text = match qp {
            Ok(qp) => qp.qp.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
            Err(_) => String::new(),
        };
        // SAFETY: NULL or valid for `len` bytes (caller).
        let n = unsafe { crate::error::copy_cstr(&text, buf, len) };
        qp.map(|_| n)
    })
}

/// The depth the CQ was created with (0 if `cq` is NULL).
///
/// # Safety
/// `cq` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_cq_depth(cq: *const iwarp_cq) -> u32 {
    guard_or("iwarp_cq_depth", 0, || {
        // SAFETY: NULL or a live handle (caller).
        let cq = unsafe { handle(cq, "cq") }?;
        Ok(u32::try_from(cq.cq.depth()).unwrap_or(u32::MAX))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;
    use iwarp_result::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn open_device_named_and_listen_on() {
        let has_rdma = std::fs::read_dir("/sys/class/infiniband")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        // SAFETY (whole test): every pointer is NULL, a live local, a C
        // string literal, or a handle these calls returned.
        unsafe {
            let mut ctx = null_mut();
            assert_eq!(
                iwarp_open_device_named(c"soft".as_ptr(), null_mut()),
                IWARP_ERR_NULL_ARG
            );
            assert_eq!(
                iwarp_open_device_named(c"soft".as_ptr(), &mut ctx),
                IWARP_OK
            );
            let mut name = [0 as c_char; 16];
            assert_eq!(iwarp_device_name(ctx, name.as_mut_ptr(), name.len()), 4);
            assert_eq!(
                std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
                "soft"
            );
            assert_eq!(iwarp_device_name(null(), name.as_mut_ptr(), name.len()), 0);
            let mut l = null_mut();
            assert_eq!(
                crate::cm::iwarp_listen_on(null(), c"127.0.0.1".as_ptr(), 0, null(), &mut l),
                IWARP_ERR_NULL_ARG
            );
            assert_eq!(
                crate::cm::iwarp_listen_on(ctx, c"127.0.0.1".as_ptr(), 0, null(), &mut l),
                IWARP_OK
            );
            assert_ne!(crate::cm::iwarp_listener_port(l), 0);
            crate::cm::iwarp_listener_close(l);
            iwarp_close_device(ctx);
            // NULL or "" is iwarp_open_device: IWARP_DEVICE, else soft.
            for n in [null(), c"".as_ptr()] {
                let mut c2 = null_mut();
                assert_eq!(iwarp_open_device_named(n, &mut c2), IWARP_OK);
                iwarp_close_device(c2);
            }
            let mut bad = std::ptr::dangling_mut::<iwarp_context>();
            assert_eq!(
                iwarp_open_device_named(c"no/such".as_ptr(), &mut bad),
                IWARP_ERR_INVALID_ARG
            );
            assert!(bad.is_null(), "a failed call resets *out");
            assert!(
                last_error().contains("invalid device name"),
                "{}",
                last_error()
            );
            if !has_rdma {
                assert_eq!(
                    iwarp_open_device_named(c"siw0".as_ptr(), &mut bad),
                    IWARP_ERR_INVALID_ARG
                );
                assert!(last_error().contains("--device soft"), "{}", last_error());
            }
        }
    }

    #[test]
    #[allow(deprecated)] // iwarp_qp_drive & co. keep their NULL checks
    fn null_handles_give_null_arg_and_a_message() {
        // SAFETY (whole test): every pointer is NULL or points to a live
        // local, which is what the functions' contracts allow.
        unsafe {
            assert_eq!(iwarp_open_device(null_mut()), IWARP_ERR_NULL_ARG);
            assert!(last_error().contains("iwarp_open_device: argument `out` is NULL"));
            let mut pd = std::ptr::dangling_mut::<iwarp_pd>();
            assert_eq!(iwarp_alloc_pd(null_mut(), &mut pd), IWARP_ERR_NULL_ARG);
            assert!(pd.is_null(), "a failed call resets *out");
            let sge = iwarp_sge::default();
            assert_eq!(
                iwarp_post_send(null_mut(), 1, 0, &sge, 1, 0, 0, 0, 0),
                IWARP_ERR_NULL_ARG
            );
            assert_eq!(
                iwarp_post_recv(null_mut(), 1, null(), 0),
                IWARP_ERR_NULL_ARG
            );
            let mut wc = iwarp_wc::default();
            assert_eq!(
                iwarp_poll_cq(null_mut(), 1, &mut wc),
                -(IWARP_ERR_NULL_ARG as i32)
            );
            assert_eq!(iwarp_wait_cq(null_mut(), 0, &mut wc), IWARP_ERR_NULL_ARG);
            assert_eq!(iwarp_cq_fd(null()), -1);
            assert_eq!(iwarp_cq_set_progress(null_mut(), 0, 0), IWARP_ERR_NULL_ARG);
            assert_eq!(iwarp_drive_fd(null()), -1);
            assert_eq!(iwarp_drive_progress(null()), IWARP_ERR_NULL_ARG);
            let mut d = null_mut();
            assert_eq!(iwarp_qp_drive(null(), &mut d), IWARP_ERR_NULL_ARG);
            assert!(d.is_null());
            iwarp_drive_release(null_mut());
            assert!(iwarp_mr_addr(null()).is_null());
            assert_eq!(iwarp_mr_lkey(null()), 0);
            assert_eq!(iwarp_query_qp_state(null()), -(IWARP_ERR_NULL_ARG as i32));
            assert_eq!(iwarp_disconnect(null_mut()), IWARP_ERR_NULL_ARG);
            // Free functions: NULL is a no-op.
            iwarp_close_device(null_mut());
            iwarp_dealloc_pd(null_mut());
            iwarp_dereg_mr(null_mut());
            iwarp_destroy_cq(null_mut());
            iwarp_destroy_qp(null_mut());
        }
    }

    #[test]
    fn objects_and_argument_checks() {
        // SAFETY (whole test): handles come from the create calls and are
        // freed once at the end; other pointers point to live locals.
        unsafe {
            let mut ctx = null_mut();
            assert_eq!(iwarp_open_device(&mut ctx), IWARP_OK);
            let mut pd = null_mut();
            assert_eq!(iwarp_alloc_pd(ctx, &mut pd), IWARP_OK);
            let mut cq = null_mut();
            assert_eq!(iwarp_create_cq(ctx, 0, &mut cq), IWARP_ERR_INVALID_ARG);
            assert_eq!(iwarp_create_cq(ctx, 8, &mut cq), IWARP_OK);
            let mut qp = null_mut();
            assert_eq!(iwarp_create_qp(pd, cq, cq, 4, 4, &mut qp), IWARP_OK);
            let mut mr = null_mut();
            assert_eq!(
                iwarp_alloc_mr(pd, 100, 0x10, &mut mr),
                IWARP_ERR_INVALID_ARG
            );
            assert_eq!(iwarp_alloc_mr(pd, 100, 1, &mut mr), IWARP_OK);
            assert_eq!(iwarp_mr_length(mr), 100);
            assert_eq!(iwarp_mr_addr(mr) as usize % 4096, 0, "page-aligned");
            assert_ne!(iwarp_mr_lkey(mr), 0);
            let sge = iwarp_sge {
                addr: iwarp_mr_addr(mr) as u64,
                length: 100,
                lkey: iwarp_mr_lkey(mr),
            };
            assert_eq!(
                iwarp_post_send(qp, 1, 9, &sge, 1, 0, 0, 0, 0),
                IWARP_ERR_INVALID_ARG
            );
            assert!(last_error().contains("unknown opcode 9"));
            assert_eq!(iwarp_post_recv(qp, 1, &sge, 7), IWARP_ERR_INVALID_ARG);
            assert_eq!(iwarp_post_recv(qp, 1, &sge, 1), IWARP_OK);
            assert_eq!(
                iwarp_query_qp_state(qp),
                iwarp_qp_state::IWARP_QPS_INIT as i32
            );
            let mut wc = [iwarp_wc::default(); 4];
            assert_eq!(iwarp_poll_cq(cq, -1, wc.as_mut_ptr()), -2);
            assert_eq!(iwarp_poll_cq(cq, 4, null_mut()), -1);
            assert_eq!(iwarp_poll_cq(cq, 4, wc.as_mut_ptr()), 0);
            assert_eq!(iwarp_cq_set_progress(cq, 3, 0), IWARP_ERR_INVALID_ARG);
            assert!(last_error().contains("unknown progress mode 3"));
            assert_eq!(iwarp_cq_set_progress(cq, -1, 0), IWARP_ERR_INVALID_ARG);
            for mode in [
                iwarp_progress_mode::IWARP_PROGRESS_APP_DRIVEN,
                iwarp_progress_mode::IWARP_PROGRESS_BUSY_POLL,
                iwarp_progress_mode::IWARP_PROGRESS_THREADED,
            ] {
                assert_eq!(iwarp_cq_set_progress(cq, mode as i32, 10), IWARP_OK);
            }
            assert_eq!(
                (*cq).cq.progress_mode(),
                ProgressMode::Threaded {
                    spin: Duration::from_micros(10)
                }
            );
            // Destroying the QP flushes the posted receive into the CQ,
            // which outlives the QP handle.
            iwarp_destroy_qp(qp);
            assert_eq!(iwarp_wait_cq(cq, 2000, wc.as_mut_ptr()), IWARP_OK);
            assert_eq!(wc[0].status, iwarp_wc_status::IWARP_WC_WR_FLUSH_ERR as i32);
            assert_eq!(wc[0].opcode, iwarp_wc_opcode::IWARP_WC_RECV as i32);
            assert_eq!(iwarp_wait_cq(cq, 10, wc.as_mut_ptr()), IWARP_ERR_TIMEOUT);
            // Any order of freeing is fine.
            iwarp_close_device(ctx);
            iwarp_dealloc_pd(pd);
            iwarp_destroy_cq(cq);
            iwarp_dereg_mr(mr);
        }
    }
}
