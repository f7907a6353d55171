//! `errno` from `io::Error`, and the panic boundary of every C entry point.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

use libc::c_int;

/// The `errno` value a socket call reports for `e`.
pub fn code(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset => libc::ECONNRESET,
        K::WouldBlock => libc::EAGAIN,
        K::BrokenPipe => libc::EPIPE,
        K::TimedOut => libc::ETIMEDOUT,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::NotConnected => libc::ENOTCONN,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        K::InvalidData => libc::EPROTO,
        K::Interrupted => libc::EINTR,
        K::PermissionDenied => libc::EACCES,
        K::Unsupported => libc::EOPNOTSUPP,
        K::OutOfMemory => libc::ENOMEM,
        K::NotFound => libc::ENOENT,
        K::HostUnreachable => libc::EHOSTUNREACH,
        K::NetworkUnreachable => libc::ENETUNREACH,
        K::NetworkDown => libc::ENETDOWN,
        K::UnexpectedEof => libc::ECONNRESET,
        _ => libc::EIO,
    }
}

/// Sets `errno`.
pub fn set(n: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() = n };
}

/// `-1` with `errno` set from `e`.
pub fn fail<T: From<i8>>(e: &io::Error) -> T {
    set(code(e));
    T::from(-1)
}

/// `-1` with `errno` = `n`.
pub fn fail_with<T: From<i8>>(n: c_int) -> T {
    set(n);
    T::from(-1)
}

/// Runs `f` behind a panic boundary: a panic becomes `-1` with `EIO`
/// (and a message on stderr) instead of unwinding into C.
pub fn boundary<T: From<i8>>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!(
                "iwarp-rsocket: internal error (panic) in {what}; returning EIO. Please report it \
                 with IWARP_PRELOAD_LOG=debug output"
            );
            fail_with(libc::EIO)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_socket_errnos() {
        use io::ErrorKind as K;
        for (k, n) in [
            (K::ConnectionReset, libc::ECONNRESET),
            (K::WouldBlock, libc::EAGAIN),
            (K::BrokenPipe, libc::EPIPE),
            (K::TimedOut, libc::ETIMEDOUT),
            (K::ConnectionRefused, libc::ECONNREFUSED),
            (K::NotConnected, libc::ENOTCONN),
            (K::Unsupported, libc::EOPNOTSUPP),
            (K::Other, libc::EIO),
        ] {
            assert_eq!(code(&io::Error::new(k, "x")), n, "{k:?}");
        }
        // An OS error keeps its own number.
        assert_eq!(
            code(&io::Error::from_raw_os_error(libc::EMFILE)),
            libc::EMFILE
        );
    }

    #[test]
    fn a_panic_becomes_eio() {
        let r: c_int = boundary("test", || panic!("boom"));
        assert_eq!(r, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EIO));
    }
}
