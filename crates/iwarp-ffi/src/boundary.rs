//! The panic boundary and the argument checks every exported function uses.
//!
//! - `guard` runs a call that returns an [`iwarp_result`]: `Err` becomes
//!   the error's code plus `iwarp_last_error` text prefixed with the
//!   function's name; a panic becomes `IWARP_ERR_PANIC`.
//! - `guard_value` does the same for calls that return a plain value (a
//!   length, a key, a file descriptor): on a panic it returns the given
//!   fallback.
//!
//! A panic must never unwind into C (Rust aborts the process when it tries),
//! so nothing an exported function does happens outside one of these two.
//! After a caught panic the handles stay usable as far as Rust is
//! concerned: the stack's mutexes recover from poisoning.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{iwarp_result, set_last_error, FfiError};

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

fn report_panic(name: &str, payload: &(dyn Any + Send)) {
    set_last_error(format!(
        "{name}: internal panic in libiwarp: {}; this is a bug, please report it with this message",
        panic_message(payload)
    ));
}

/// Run `f` as the body of the exported function `name`.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> Result<(), FfiError>) -> iwarp_result {
    // AssertUnwindSafe: after a panic we only report it; the stack's shared
    // state is behind mutexes that recover from poisoning.
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => iwarp_result::IWARP_OK,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {}", e.msg));
            e.code
        }
        Err(payload) => {
            report_panic(name, &*payload);
            iwarp_result::IWARP_ERR_PANIC
        }
    }
}

/// Run `f` as the body of the exported function `name`, which returns a
/// plain value; `on_panic` is returned if `f` panics.
pub(crate) fn guard_value<T>(name: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            report_panic(name, &*payload);
            on_panic
        }
    }
}

/// Like [`guard_value`] for bodies that can fail: on `Err` the message is
/// stored and `on_err` returned.
pub(crate) fn guard_or<T: Copy>(
    name: &str,
    on_err: T,
    f: impl FnOnce() -> Result<T, FfiError>,
) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {}", e.msg));
            on_err
        }
        Err(payload) => {
            report_panic(name, &*payload);
            on_err
        }
    }
}

/// Borrow the handle behind `p`, or fail with `IWARP_ERR_NULL_ARG` naming
/// the argument.
///
/// # Safety
/// `p` is NULL or points to a live `T` that stays valid, and is not freed
/// by another thread, for the returned lifetime.
pub(crate) unsafe fn handle<'a, T>(p: *const T, arg: &str) -> Result<&'a T, FfiError> {
    // SAFETY: non-NULL pointers are valid handles (caller).
    unsafe { p.as_ref() }.ok_or_else(|| FfiError::null(arg))
}

/// Check an out-pointer for NULL and set `*out = NULL`, so that a failed
/// call leaves no stale handle behind.
///
/// # Safety
/// `out` is NULL or valid for a pointer-sized write.
pub(crate) unsafe fn out_ptr<T>(out: *mut *mut T, arg: &str) -> Result<(), FfiError> {
    if out.is_null() {
        return Err(FfiError::null(arg));
    }
    // SAFETY: non-NULL and writable (caller).
    unsafe { out.write(std::ptr::null_mut()) };
    Ok(())
}

/// Move `value` to the heap and store the handle in `*out`.
///
/// # Safety
/// `out` was checked by [`out_ptr`] and is still valid for writes.
pub(crate) unsafe fn give<T>(out: *mut *mut T, value: T) {
    // SAFETY: see the function's contract.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
}

/// Free a handle made by [`give`]; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or a handle from [`give`] that was not freed yet and that no
/// other thread uses.
pub(crate) unsafe fn free<T>(name: &str, p: *mut T) {
    guard_value(name, (), || {
        if !p.is_null() {
            // SAFETY: `p` came from `Box::into_raw` and is freed once (caller).
            drop(unsafe { Box::from_raw(p) });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;

    #[test]
    fn guard_turns_a_panic_into_iwarp_err_panic() {
        let r = guard("iwarp_test", || panic!("boom"));
        assert_eq!(r, iwarp_result::IWARP_ERR_PANIC);
        let msg = last_error();
        assert!(msg.starts_with("iwarp_test: internal panic"), "{msg}");
        assert!(msg.contains("boom"), "{msg}");
    }

    #[test]
    fn guard_value_returns_the_fallback_on_panic() {
        let v: u32 = guard_value("iwarp_test_value", 7, || panic!("{}", String::from("x")));
        assert_eq!(v, 7);
        assert!(last_error().contains("iwarp_test_value"));
        assert_eq!(guard_or("iwarp_test_or", -1, || panic!("y")), -1);
        assert!(last_error().contains("iwarp_test_or"));
    }

    #[test]
    fn guard_maps_errors_and_prefixes_the_name() {
        let r = guard("iwarp_x", || Err(FfiError::null("qp")));
        assert_eq!(r, iwarp_result::IWARP_ERR_NULL_ARG);
        assert_eq!(
            last_error(),
            "iwarp_x: argument `qp` is NULL: pass a valid pointer"
        );
        assert_eq!(guard("iwarp_x", || Ok(())), iwarp_result::IWARP_OK);
        // Success leaves the message alone (errno semantics).
        assert!(last_error().contains("`qp` is NULL"));
    }

    #[test]
    fn last_error_is_per_thread() {
        let _ = guard("iwarp_main_thread", || Err(FfiError::invalid("here")));
        std::thread::spawn(|| assert_eq!(last_error(), ""))
            .join()
            .unwrap();
        assert!(last_error().contains("iwarp_main_thread"));
    }
}
