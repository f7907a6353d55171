//! Small descriptor helpers built only on the C library's functions
//! ([`crate::real`]): a leaf module, so that [`crate::attach`] and
//! [`crate::settle`] share them without importing each other.

use std::os::fd::RawFd;

use crate::real::real;

/// `(O_NONBLOCK set, FD_CLOEXEC set)` of `fd`.
pub fn fd_flags(fd: RawFd) -> (bool, bool) {
    let r = real();
    // SAFETY: plain descriptor calls.
    let (fl, fdf) = unsafe {
        (
            (r.fcntl)(fd, libc::F_GETFL, 0),
            (r.fcntl)(fd, libc::F_GETFD, 0),
        )
    };
    (
        fl >= 0 && fl & libc::O_NONBLOCK != 0,
        fdf >= 0 && fdf & libc::FD_CLOEXEC != 0,
    )
}

/// Makes `fd` a connection whose peer is gone: one end of a socket pair
/// whose other end is closed (what was at `fd` is closed).
pub(crate) fn dead_end(fd: RawFd) {
    let r = real();
    let mut pair = [-1; 2];
    // SAFETY: `pair` has room for the two descriptors; the other calls
    // are plain descriptor calls on descriptors this function made, and
    // `dup2` onto `fd`, which the caller owns.
    unsafe {
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        ) == 0
        {
            (r.close)(pair[1]);
            (r.dup2)(pair[0], fd);
            (r.close)(pair[0]);
        } else {
            (r.shutdown)(fd, libc::SHUT_RDWR);
        }
    }
}
