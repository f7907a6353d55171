//! The `rsocket.h`-style C API (`include/iwarp_rsocket.h`).
//!
//! Descriptors are real descriptor numbers: `rsocket` makes a TCP socket,
//! `rbind`/`rlisten` bind and listen it (a listening rsocket is a real TCP
//! listening socket, so `poll` on it works), and `rconnect`/`raccept` turn
//! the descriptor into an iWARP stream (see [`crate::table`]). So `rpoll`
//! and `rselect` are `poll` and `select`, and epoll works too. Every
//! function returns -1 with `errno` set on error, like its socket
//! counterpart; none unwinds into C.

use std::net::SocketAddr;
use std::sync::OnceLock;

use iwarp_sockets::Options;
use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::errno::{boundary, fail, fail_with};
use crate::ops;
use crate::real::real;
use crate::table::{self, Sock};

fn base_options() -> &'static Options {
    static O: OnceLock<Options> = OnceLock::new();
    O.get_or_init(|| {
        let _inside = table::Inside::enter();
        Options::from_env()
    })
}

fn stream_of(fd: c_int) -> Result<std::sync::Arc<Sock>, c_int> {
    table::lookup(fd).ok_or_else(|| {
        // A socket that is not (yet) a stream, or not a socket at all.
        let mut ty: c_int = 0;
        let mut l = std::mem::size_of::<c_int>() as socklen_t;
        // SAFETY: `ty` is a valid int with its length in `l`.
        let rc = unsafe {
            (real().getsockopt)(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&mut ty as *mut c_int).cast(),
                &mut l,
            )
        };
        if rc == 0 {
            libc::ENOTCONN
        } else {
            libc::EBADF
        }
    })
}

macro_rules! with_stream {
    ($fd:expr, |$s:ident| $body:expr) => {
        match stream_of($fd) {
            Ok($s) => $body,
            Err(e) => fail_with(e),
        }
    };
}

/// `rsocket(2)`: an IPv4 or IPv6 stream socket (`SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC` allowed in `type`).
#[no_mangle]
pub extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    boundary("rsocket", || {
        if !ops::is_inet(domain) {
            return fail_with(libc::EAFNOSUPPORT);
        }
        if ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != libc::SOCK_STREAM {
            return fail_with(libc::ESOCKTNOSUPPORT);
        }
        if protocol != 0 && protocol != libc::IPPROTO_TCP {
            return fail_with(libc::EPROTONOSUPPORT);
        }
        // SAFETY: plain call.
        unsafe { (real().socket)(domain, ty, protocol) }
    })
}

/// `rbind(2)`.
///
/// # Safety
/// `addr` must be valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rbind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    boundary("rbind", || {
        if addr.is_null() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: the caller's promise.
        unsafe { (real().bind)(fd, addr, len) }
    })
}

/// `rlisten(2)`: a real TCP listening socket; `raccept` takes the MPA
/// Request from each connection.
#[no_mangle]
pub extern "C" fn rlisten(fd: c_int, backlog: c_int) -> c_int {
    boundary("rlisten", || {
        // SAFETY: plain call.
        unsafe { (real().listen)(fd, backlog) }
    })
}

/// `raccept(2)`: the next connection that is an rsockets client over
/// iWARP; other connections (not an MPA Request, or one that fails) are
/// closed and skipped. `addr`/`len` may be null.
///
/// # Safety
/// `addr` must be null or valid for `*len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn raccept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    boundary("raccept", || loop {
        // SAFETY: the caller's promise.
        let nfd = unsafe { (real().accept4)(fd, addr, len, libc::SOCK_CLOEXEC) };
        if nfd < 0 {
            return nfd;
        }
        // As rsocket.c's rs_alloc, the new stream inherits the listening
        // socket's options (sizes, RDMA_IOMAPSIZE).
        let opts = table::options_for(fd, base_options());
        match crate::attach::accept(nfd, &opts, false, false) {
            Ok(()) => return nfd,
            Err(e) => {
                tracing::warn!(error = %e, "raccept: refused a connection that is not an rsockets client");
                // SAFETY: plain call; `nfd` is ours.
                unsafe { (real().close)(nfd) };
            }
        }
    })
}

/// `rconnect(2)`: connects over iWARP (rsockets protocol), blocking until
/// the connection is up or failed, even on a non-blocking socket (which
/// then returns 0, not `EINPROGRESS`).
///
/// # Safety
/// `addr` must be valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rconnect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    boundary("rconnect", || {
        if addr.is_null() {
            return fail_with(libc::EINVAL);
        }
        if table::is_taken(fd) {
            return fail_with(libc::EISCONN);
        }
        // SAFETY: the caller's promise.
        let Some(a): Option<SocketAddr> = (unsafe { ops::read_addr(addr, len) }) else {
            return fail_with(libc::EAFNOSUPPORT);
        };
        let opts = table::options_for(fd, base_options());
        match crate::attach::connect(fd, a, &opts) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}

/// `rshutdown(2)`.
#[no_mangle]
pub extern "C" fn rshutdown(fd: c_int, how: c_int) -> c_int {
    boundary("rshutdown", || with_stream!(fd, |s| ops::shutdown(&s, how)))
}

/// `rclose(2)`: closes the descriptor; the stream (disconnect message,
/// bounded linger) when it was the last descriptor of it.
#[no_mangle]
pub extern "C" fn rclose(fd: c_int) -> c_int {
    boundary("rclose", || table::close(fd))
}

/// `rrecv(2)`.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn rrecv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    boundary("rrecv", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::recv(&s, buf, len, flags) }
        })
    })
}

/// `rrecvfrom(2)`: `rrecv`, and the peer's address when asked.
///
/// # Safety
/// `buf` as for `rrecv`; `src` null or valid for `*srclen` bytes.
#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> ssize_t {
    boundary("rrecvfrom", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise.
            let n = unsafe { ops::recv(&s, buf, len, flags) };
            if n >= 0 && !src.is_null() && !srclen.is_null() {
                // SAFETY: the caller's promise.
                unsafe { ops::sockname(&s, true, src, srclen) };
            }
            n
        })
    })
}

/// `rrecvmsg(2)` (no control messages).
///
/// # Safety
/// `msg` must be a valid `msghdr`.
#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    boundary("rrecvmsg", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::recvmsg(&s, msg, flags) }
        })
    })
}

/// `rsend(2)`.
///
/// # Safety
/// `buf` must be valid for `len` bytes of reads.
#[no_mangle]
pub unsafe extern "C" fn rsend(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    boundary("rsend", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::send(&s, buf, len, flags) }
        })
    })
}

/// `rsendto(2)`: `rsend` (the address is ignored: the stream is
/// connected).
///
/// # Safety
/// As `rsend`.
#[no_mangle]
pub unsafe extern "C" fn rsendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    _dest: *const sockaddr,
    _destlen: socklen_t,
) -> ssize_t {
    boundary("rsendto", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::send(&s, buf, len, flags) }
        })
    })
}

/// `rsendmsg(2)` (no control messages).
///
/// # Safety
/// `msg` must be a valid `msghdr`.
#[no_mangle]
pub unsafe extern "C" fn rsendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    boundary("rsendmsg", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::sendmsg(&s, msg, flags) }
        })
    })
}

/// `rread(2)`.
///
/// # Safety
/// As `rrecv`.
#[no_mangle]
pub unsafe extern "C" fn rread(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    boundary("rread", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::recv(&s, buf, len, 0) }
        })
    })
}

/// `rreadv(2)`.
///
/// # Safety
/// `iov` must point to `cnt` valid `iovec`s.
#[no_mangle]
pub unsafe extern "C" fn rreadv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    boundary("rreadv", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::readv(&s, iov, cnt, 0) }
        })
    })
}

/// `rwrite(2)`.
///
/// # Safety
/// As `rsend`.
#[no_mangle]
pub unsafe extern "C" fn rwrite(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    boundary("rwrite", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::send(&s, buf, len, 0) }
        })
    })
}

/// `rwritev(2)`.
///
/// # Safety
/// `iov` must point to `cnt` valid `iovec`s.
#[no_mangle]
pub unsafe extern "C" fn rwritev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    boundary("rwritev", || {
        with_stream!(fd, |s| {
            // SAFETY: the caller's promise (see the function's doc).
            unsafe { ops::writev(&s, iov, cnt, 0) }
        })
    })
}

/// `rpoll(2)`: `poll` (stream descriptors are readiness descriptors).
///
/// # Safety
/// `fds` must point to `nfds` valid `pollfd`s.
#[no_mangle]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    boundary("rpoll", || {
        if fds.is_null() && nfds > 0 {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: the caller's promise.
        unsafe { (real().poll)(fds, nfds, timeout) }
    })
}

/// `rselect(2)`: `select`.
///
/// # Safety
/// The sets must be null or valid `fd_set`s, `timeout` null or valid.
#[no_mangle]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's promise.
    boundary("rselect", || unsafe {
        (real().select)(nfds, r, w, e, timeout)
    })
}

/// `rgetsockname(2)`.
///
/// # Safety
/// `addr` must be valid for `*len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn rgetsockname(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    boundary("rgetsockname", || {
        if addr.is_null() || len.is_null() {
            return fail_with(libc::EINVAL);
        }
        match table::lookup(fd) {
            // SAFETY: the caller's promise.
            Some(s) => unsafe { ops::sockname(&s, false, addr, len) },
            // SAFETY: the caller's promise.
            None => unsafe { (real().getsockname)(fd, addr, len) },
        }
    })
}

/// `rgetpeername(2)`.
///
/// # Safety
/// `addr` must be valid for `*len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn rgetpeername(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    boundary("rgetpeername", || {
        if addr.is_null() || len.is_null() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: the caller's promise.
        with_stream!(fd, |s| unsafe { ops::sockname(&s, true, addr, len) })
    })
}

/// `rsetsockopt(2)`: on a stream, see `ops::setsockopt`; before connect,
/// `SO_RCVBUF`/`SO_SNDBUF` size the rings and `SO_KEEPALIVE` turns on
/// keepalives (and the option is also set on the TCP socket), and
/// `SOL_RDMA`/`RDMA_IOMAPSIZE` sizes the iomap table (a listening socket
/// passes its options on to the streams it accepts).
///
/// # Safety
/// `val` must be valid for `len` bytes of reads.
#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    boundary("rsetsockopt", || {
        if val.is_null() {
            return fail_with(libc::EINVAL);
        }
        match table::lookup(fd) {
            // SAFETY: the caller's promise.
            Some(s) => unsafe { ops::setsockopt(&s, level, name, val, len) },
            None => {
                // SAFETY: the caller's promise.
                unsafe { ops::note_sockopt(fd, level, name, val, len) };
                if level == ops::SOL_RDMA {
                    // rsocket's own level: no TCP counterpart.
                    return if name == ops::RDMA_IOMAPSIZE {
                        0
                    } else {
                        fail_with(libc::ENOPROTOOPT)
                    };
                }
                // SAFETY: the caller's promise.
                unsafe { (real().setsockopt)(fd, level, name, val, len) }
            }
        }
    })
}

/// `rgetsockopt(2)`.
///
/// # Safety
/// `val` must be valid for `*len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    boundary("rgetsockopt", || {
        if val.is_null() || len.is_null() {
            return fail_with(libc::EINVAL);
        }
        match table::lookup(fd) {
            // SAFETY: the caller's promise.
            Some(s) => unsafe { ops::getsockopt(&s, level, name, val, len) },
            // SAFETY: the caller's promise.
            None => unsafe { (real().getsockopt)(fd, level, name, val, len) },
        }
    })
}

/// `rfcntl(2)`: `F_GETFL`/`F_SETFL` (`O_NONBLOCK`) on a stream; every
/// other command, and every command on a socket that is not a stream
/// yet, goes to `fcntl`. Variadic in the header (as in `rsocket.h`); the
/// third argument is read as an integer.
#[no_mangle]
pub extern "C" fn rfcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    boundary("rfcntl", || ops::fcntl(fd, cmd, arg))
}
