//! Result codes and the thread-local "last error" message.
//!
//! Every failing call returns an [`iwarp_result`] code and stores a sentence
//! naming the cause and the fix in a thread-local slot, read with
//! [`iwarp_last_error`](crate::iwarp_last_error) (the `errno` + `strerror`
//! pattern, but with the detail that only the failing call knows). A
//! successful call leaves the slot alone, as a successful libc call leaves
//! `errno` alone.
//!
//! A leaf: the panic boundary ([`crate::boundary`]) stores its messages
//! here, and the C functions that read them (`iwarp_result_str`,
//! `iwarp_last_error`) sit behind that boundary in [`crate::strerror`].

use std::cell::RefCell;
use std::ffi::c_char;

use iwarp_rs::cm::{CmError, HandshakeError};
use iwarp_rs::PostError;

/// Result of a call. `IWARP_OK` is 0; every other value names a class of
/// failure, and `iwarp_last_error` tells the details.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_result {
    /// Success.
    IWARP_OK = 0,
    /// A required pointer argument was NULL.
    IWARP_ERR_NULL_ARG = 1,
    /// An argument is out of range (unknown opcode or flag, zero length or
    /// depth, too many SGEs, private data over 512 bytes, bad address).
    IWARP_ERR_INVALID_ARG = 2,
    /// The operation did not finish within its timeout.
    IWARP_ERR_TIMEOUT = 3,
    /// Nobody listens at the address (TCP RST).
    IWARP_ERR_REFUSED = 4,
    /// The peer answered with an MPA Reject.
    IWARP_ERR_REJECTED = 5,
    /// The MPA negotiation failed (policy conflict, malformed frame, the
    /// peer closed the connection during the exchange).
    IWARP_ERR_MPA = 6,
    /// A socket or system call failed.
    IWARP_ERR_IO = 7,
    /// The work queue is full, or, for a QP in the error state (which
    /// flushes what is posted), the completion queue that takes the flush
    /// completion is: poll completions first.
    IWARP_ERR_QUEUE_FULL = 8,
    /// The QP is in the wrong state for the call (`iwarp_connect` on a
    /// connected QP; through an rdma-core device, a send posted before the
    /// connection is established). Posting to a QP in the error state does
    /// not return it: the request completes with `IWARP_WC_WR_FLUSH_ERR`.
    IWARP_ERR_QP_STATE = 9,
    /// Memory (or STag indices) exhausted.
    IWARP_ERR_NO_MEMORY = 10,
    /// The library panicked (a bug in libiwarp); the call had no effect or
    /// an unknown part of it. Report it with the `iwarp_last_error` text.
    IWARP_ERR_PANIC = 11,
    /// What was asked cannot be done here: a TCP congestion-control
    /// algorithm the kernel does not have (or does not allow this
    /// process), or a software-provider feature asked of a kernel RDMA
    /// device. `iwarp_last_error` says which, and the fix.
    IWARP_ERR_UNSUPPORTED = 12,
}

use iwarp_result::*;

impl iwarp_result {
    /// The static description of the code.
    pub(crate) fn as_cstr(self) -> &'static std::ffi::CStr {
        match self {
            IWARP_OK => c"success",
            IWARP_ERR_NULL_ARG => c"a required pointer argument is NULL",
            IWARP_ERR_INVALID_ARG => c"invalid argument",
            IWARP_ERR_TIMEOUT => c"timed out",
            IWARP_ERR_REFUSED => c"connection refused",
            IWARP_ERR_REJECTED => c"connection rejected by the peer",
            IWARP_ERR_MPA => c"MPA negotiation failed",
            IWARP_ERR_IO => c"I/O error",
            IWARP_ERR_QUEUE_FULL => c"work queue or completion queue full",
            IWARP_ERR_QP_STATE => c"queue pair in the wrong state",
            IWARP_ERR_NO_MEMORY => c"out of memory",
            IWARP_ERR_PANIC => c"internal error (panic) in libiwarp",
            IWARP_ERR_UNSUPPORTED => c"not supported here",
        }
    }

    /// All codes, in numeric order.
    pub(crate) const ALL: [iwarp_result; 13] = [
        IWARP_OK,
        IWARP_ERR_NULL_ARG,
        IWARP_ERR_INVALID_ARG,
        IWARP_ERR_TIMEOUT,
        IWARP_ERR_REFUSED,
        IWARP_ERR_REJECTED,
        IWARP_ERR_MPA,
        IWARP_ERR_IO,
        IWARP_ERR_QUEUE_FULL,
        IWARP_ERR_QP_STATE,
        IWARP_ERR_NO_MEMORY,
        IWARP_ERR_PANIC,
        IWARP_ERR_UNSUPPORTED,
    ];
}

/// A failure on its way to C: the code, and the message for
/// `iwarp_last_error`.
#[derive(Debug)]
pub(crate) struct FfiError {
    pub(crate) code: iwarp_result,
    pub(crate) msg: String,
}

impl FfiError {
    pub(crate) fn new(code: iwarp_result, msg: impl Into<String>) -> FfiError {
        FfiError {
            code,
            msg: msg.into(),
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> FfiError {
        FfiError::new(IWARP_ERR_INVALID_ARG, msg)
    }

    pub(crate) fn null(arg: &str) -> FfiError {
        FfiError::new(
            IWARP_ERR_NULL_ARG,
            format!("argument `{arg}` is NULL: pass a valid pointer"),
        )
    }
}

impl From<iwarp_rs::Error> for FfiError {
    fn from(e: iwarp_rs::Error) -> FfiError {
        use iwarp_rs::Error as E;
        let code = match &e {
            E::OutOfMemory { .. } | E::TooManyRegions => IWARP_ERR_NO_MEMORY,
            E::EventFd(_) => IWARP_ERR_IO,
            _ => IWARP_ERR_INVALID_ARG,
        };
        FfiError::new(code, e.to_string())
    }
}

impl From<PostError> for FfiError {
    fn from(e: PostError) -> FfiError {
        let code = match e {
            // ibverbs answers both with ENOMEM (siw `siw_sqe_complete`);
            // `iwarp_last_error` says which queue is full.
            PostError::QueueFull { .. } | PostError::CqFull { .. } => IWARP_ERR_QUEUE_FULL,
            PostError::QpError { .. } => IWARP_ERR_QP_STATE,
            PostError::InvalidWr { .. } => IWARP_ERR_INVALID_ARG,
        };
        FfiError::new(code, e.to_string())
    }
}

impl From<CmError> for FfiError {
    fn from(e: CmError) -> FfiError {
        let code = match &e {
            CmError::Refused { .. } => IWARP_ERR_REFUSED,
            CmError::Timeout { .. } => IWARP_ERR_TIMEOUT,
            CmError::Rejected { .. } => IWARP_ERR_REJECTED,
            CmError::Mpa {
                error: HandshakeError::PrivateDataTooLong(_),
                ..
            } => IWARP_ERR_INVALID_ARG,
            CmError::Mpa { .. } | CmError::Closed { .. } => IWARP_ERR_MPA,
            CmError::InvalidState { .. } | CmError::NotConnected => IWARP_ERR_QP_STATE,
            CmError::Congestion { .. } | CmError::Unsupported { .. } => IWARP_ERR_UNSUPPORTED,
            _ => IWARP_ERR_IO,
        };
        FfiError::new(code, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Store `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: String) {
    // `try_with`: during thread teardown the slot may be gone; the code
    // still reaches the caller.
    let _ = LAST_ERROR.try_with(|s| *s.borrow_mut() = msg);
}

/// This thread's last error (for tests).
#[cfg(test)]
pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|s| s.borrow().clone())
}

/// Copy `text` into `buf` (capacity `len`) as a NUL-terminated string,
/// truncated if needed; returns the length of `text` (without the NUL).
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes.
pub(crate) unsafe fn copy_cstr(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` is valid for `len` bytes (caller), `n + 1 <= len`,
        // and a `&str` cannot overlap memory the caller lent us mutably.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// Copy this thread's last error into `buf` as [`copy_cstr`] does; 0 when
/// the slot is gone (thread teardown). For `iwarp_last_error`.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes.
pub(crate) unsafe fn copy_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST_ERROR
        .try_with(|s| {
            let s = s.borrow();
            // SAFETY: forwarded from the caller.
            unsafe { copy_cstr(&s, buf, len) }
        })
        .unwrap_or(0)
}
