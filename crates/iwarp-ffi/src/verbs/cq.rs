//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`): creating, polling
//! and waiting, the CQ's descriptor, and who makes progress while the
//! application waits.

use std::ffi::c_int;
use std::time::Duration;

use iwarp_rs::{ProgressMode, WcOpcode, WcQueue, WcStatus, WorkCompletion};

use super::types::{
    duration_ms, iwarp_context, iwarp_cq, iwarp_drive, iwarp_progress_mode, iwarp_qp, iwarp_wc,
    wc_to_c,
};
use crate::boundary::{free, give, guard, guard_or, handle, out_ptr};
use crate::consts::IWARP_TIMEOUT_INFINITE;
use crate::error::{iwarp_result, FfiError};

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
