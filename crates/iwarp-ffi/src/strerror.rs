//! The C functions that put result codes and the last-error message into
//! words: [`iwarp_result_str`] and [`iwarp_last_error`] (the `strerror`
//! half of the `errno` + `strerror` pattern; the codes and the thread-local
//! slot are in [`crate::error`]). Like every exported function they run
//! behind the panic boundary, which itself reports through `error`: so they
//! live here, apart from both.

use std::ffi::c_char;

use crate::boundary::guard_value;
use crate::error::{copy_last_error, iwarp_result};

/// The static, NUL-terminated description of a result code. Takes an
/// integer rather than the enum so that any value is safe to pass, including
/// the negated codes `iwarp_poll_cq` and `iwarp_query_qp_state` return. Never
/// NULL; unknown values give "unknown iwarp_result".
#[no_mangle]
pub extern "C" fn iwarp_result_str(r: i32) -> *const c_char {
    guard_value(
        "iwarp_result_str",
        c"unknown iwarp_result".as_ptr(),
        || match iwarp_result::ALL.get(r.unsigned_abs() as usize) {
            Some(code) => code.as_cstr().as_ptr(),
            None => c"unknown iwarp_result".as_ptr(),
        },
    )
}

/// Copy the calling thread's last error message (the cause and the fix,
/// prefixed with the failing function's name) into `buf` as a
/// NUL-terminated string of at most `len - 1` characters. Returns the full
/// length of the message without the NUL, like `snprintf`: a return value
/// `>= len` means it was truncated. Returns 0 if no call on this thread has
/// failed yet. `buf` may be NULL (with any `len`) to ask for the length.
///
/// Only failing calls set the message; successful calls leave it alone.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_last_error(buf: *mut c_char, len: usize) -> usize {
    guard_value("iwarp_last_error", 0, || {
        // SAFETY: forwarded from the caller.
        unsafe { copy_last_error(buf, len) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{iwarp_result, set_last_error};
    use std::ffi::CStr;

    #[test]
    fn result_str_covers_every_code_and_negatives() {
        for (i, code) in iwarp_result::ALL.iter().enumerate() {
            assert_eq!(*code as usize, i);
            let s = unsafe { CStr::from_ptr(iwarp_result_str(i as i32)) };
            let neg = unsafe { CStr::from_ptr(iwarp_result_str(-(i as i32))) };
            assert_eq!(s, neg);
            assert!(!s.to_bytes().is_empty());
        }
        let s = unsafe { CStr::from_ptr(iwarp_result_str(1000)) };
        assert_eq!(s.to_str().unwrap(), "unknown iwarp_result");
        let s = unsafe { CStr::from_ptr(iwarp_result_str(i32::MIN)) };
        assert_eq!(s.to_str().unwrap(), "unknown iwarp_result");
    }

    #[test]
    fn last_error_truncates_and_reports_length() {
        set_last_error("abcdef".into());
        let mut buf = [0x55 as c_char; 4];
        // SAFETY: `buf` has 4 bytes.
        let n = unsafe { iwarp_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 6);
        // SAFETY: NUL-terminated by the call.
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(), b"abc");
        // SAFETY: NULL buffer: length query.
        assert_eq!(unsafe { iwarp_last_error(std::ptr::null_mut(), 100) }, 6);
        // SAFETY: a zero-length buffer is never written.
        assert_eq!(unsafe { iwarp_last_error(buf.as_mut_ptr(), 0) }, 6);
    }
}
