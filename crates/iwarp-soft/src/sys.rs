//! The system calls of the software provider's data path that std and
//! socket2 do not offer safely: the two calls that move bytes between a
//! socket and registered memory through raw pointers (so no Rust reference
//! to memory the application or the peer may also touch is ever created),
//! plain non-blocking and blocking `recv`/`send`, and the `TCP_INFO` and
//! `SIOCOUTQ` queries. (The eventfd, the epoll set and `poll(2)` on one
//! descriptor, which completion queues also use, are `iwarp_verbs::sys`.)

use std::io;
use std::os::fd::RawFd;

/// Non-blocking scatter `recvmsg(2)` into the iovecs, in order; returns the
/// bytes received.
///
/// # Safety
/// Every iovec must describe memory valid for writes for the duration of
/// the call (registered memory whose region the caller holds, or a buffer
/// it borrows).
pub(crate) unsafe fn recv_iovecs(fd: RawFd, iov: &mut [libc::iovec]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is a valid empty message header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: `msg` points at `iov`, whose entries the caller guarantees
        // to be writable; MSG_DONTWAIT makes the call return at once, so the
        // memory is held only for the length of one copy.
        let rc = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What a non-blocking receive found.
pub(crate) enum Recv {
    /// This many bytes (0: the peer closed).
    Data(usize),
    /// Nothing to read now (`EAGAIN`).
    Empty,
    /// Any other error.
    Failed(io::Error),
}

/// Non-blocking `recv(2)` into `buf`.
///
/// Made as a raw `recvfrom` system call, not through glibc's `recv`: that
/// wrapper is a thread-cancellation point and brackets the call with
/// `__pthread_enable_asynccancel` / `__pthread_disable_asynccancel`, which
/// a busy poller pays on every empty look (3 % of a busy-polled ping-pong's
/// CPU, issue 29). Rust threads are never cancelled, and a call with
/// `MSG_DONTWAIT` does not block, so there is nothing to cancel. An empty
/// socket is [`Recv::Empty`], told by its errno alone: no `io::Error` is
/// made, asked its kind and dropped on every empty look.
pub(crate) fn recv_nb(fd: RawFd, buf: &mut [u8]) -> Recv {
    loop {
        // SAFETY: `buf` is an exclusively borrowed, initialised slice, valid
        // for writes of `buf.len()` bytes for the length of the call, which
        // does not block (MSG_DONTWAIT). The null address and length make
        // `recvfrom` the same call as `recv` (recv(2)); `syscall` returns -1
        // and sets errno on failure, as `recv` does.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                fd,
                buf.as_mut_ptr(),
                buf.len(),
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::sockaddr>(),
                std::ptr::null_mut::<libc::socklen_t>(),
            )
        };
        if rc >= 0 {
            return Recv::Data(rc as usize);
        }
        // SAFETY: `__errno_location` returns the calling thread's errno,
        // valid for the thread's lifetime; read right after the failed call.
        let errno = unsafe { *libc::__errno_location() };
        match errno {
            // EWOULDBLOCK is EAGAIN on Linux.
            libc::EAGAIN => return Recv::Empty,
            libc::EINTR => continue,
            _ => return Recv::Failed(io::Error::from_raw_os_error(errno)),
        }
    }
}

/// [`recv_nb`] as an `io::Result` (an empty socket is `WouldBlock`), for
/// callers off the busy-poll path.
pub(crate) fn recv_nonblocking(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    match recv_nb(fd, buf) {
        Recv::Data(n) => Ok(n),
        Recv::Empty => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
        Recv::Failed(e) => Err(e),
    }
}

/// Non-blocking `send(2)` of `buf` (`MSG_DONTWAIT | MSG_NOSIGNAL`);
/// returns the bytes written.
///
/// `flags` are added to `MSG_DONTWAIT | MSG_NOSIGNAL` (e.g. `MSG_EOR`).
pub(crate) fn send_nonblocking(fd: RawFd, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is a borrowed slice, readable for `buf.len()` bytes
        // for the length of the call; the kernel only reads it. The call does
        // not block and raises no SIGPIPE.
        let rc = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | flags,
            )
        };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Blocking `recv(2)` into `buf` (the socket is in blocking mode); returns
/// the bytes received, 0 at EOF or after a `shutdown`.
pub(crate) fn recv_blocking(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is an exclusively borrowed, initialised slice, valid
        // for writes of `buf.len()` bytes for the length of the call.
        let rc = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Non-blocking gather write (`sendmsg(2)` with `MSG_DONTWAIT |
/// MSG_NOSIGNAL`, plus `flags`) of the iovecs; returns the bytes written.
///
/// # Safety
/// Every iovec must describe memory valid for reads for the duration of the
/// call.
pub(crate) unsafe fn send_iovecs(
    fd: RawFd,
    iov: &[libc::iovec],
    flags: libc::c_int,
) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is a valid empty message header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: `msg` points at `iov`, whose entries the caller guarantees
        // to be readable; the kernel only reads them. The call does not
        // block (MSG_DONTWAIT) and raises no SIGPIPE (MSG_NOSIGNAL).
        let rc =
            unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | flags) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The connection's `TCP_INFO` (tcp(7)), or `None` if the kernel does not
/// give it.
pub(crate) fn tcp_info(fd: RawFd) -> Option<libc::tcp_info> {
    // SAFETY: an all-zero tcp_info is a valid value of this plain C struct.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes and `len` is passed by
    // pointer as getsockopt(2) requires; the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info)
}

/// The send MSS and the MSS this end advertised (`tcpi_snd_mss`, the
/// value `TCP_MAXSEG` reads on a connected socket, and `tcpi_advmss` of
/// `TCP_INFO`: the path MTU's MSS, where the send MSS early in a
/// connection may still be bounded by half the peer's initial window, 32
/// KiB on loopback), from one `getsockopt`; `None` if the kernel does not
/// say.
pub(crate) fn tcp_mss_pair(fd: RawFd) -> Option<(u32, u32)> {
    tcp_info(fd).map(|i| (i.tcpi_snd_mss, i.tcpi_advmss))
}

/// The smoothed round-trip time of the connection and the receiver's own
/// estimate (`tcpi_rtt`, `tcpi_rcv_rtt` of `TCP_INFO`, microseconds), or
/// `None` if the kernel does not say.
pub(crate) fn tcp_rtts(fd: RawFd) -> Option<(u32, u32)> {
    tcp_info(fd).map(|i| (i.tcpi_rtt, i.tcpi_rcv_rtt))
}

/// Bytes in the socket's send queue that the peer has not acknowledged
/// yet (`SIOCOUTQ`, the same request as `TIOCOUTQ`), or `None` if the
/// kernel does not say.
pub(crate) fn unacked_bytes(fd: RawFd) -> Option<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int to the live local `n`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (rc == 0 && n >= 0).then_some(n as u32)
}
