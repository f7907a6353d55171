//! Queue pairs (`ibv_create_qp`, `ibv_post_send`, `ibv_post_recv`):
//! creating, posting work requests, states and events.

use std::ffi::c_char;
use std::time::Duration;

use iwarp_rs::{QpEvent, QpInitAttr, QpState, RecvWr, SendWr, WrOpcode};

use super::types::{
    duration_ms, iwarp_cq, iwarp_event_type, iwarp_pd, iwarp_qp, iwarp_qp_event, iwarp_qp_state,
    iwarp_send_flags, iwarp_sge, sgl_from_c,
};
use crate::boundary::{free, give, guard, guard_or, handle, out_ptr};
use crate::consts::IWARP_TIMEOUT_INFINITE;
use crate::error::{iwarp_result, FfiError};

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

/// Write the QP's peer address as `ip:port` (`[ip6]:port` for IPv6) into
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
