//! Turning a descriptor into an iWARP stream: after an outgoing connect
//! ([`connect`]) or an accepted TCP connection whose first bytes are an
//! MPA Request ([`accept`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, RawFd};

use iwarp_sockets::{Listener, Options, Stream};

use crate::real::real;
use crate::table::{self, Inside};

/// The 16 bytes an MPA Request starts with (RFC 5044 §7.1, "MPA ID Req
/// Frame").
pub const MPA_REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";

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

/// Connects the socket `fd` to `addr` over iWARP and makes `fd` the
/// stream. `fd` keeps its number, its non-blocking mode and its
/// close-on-exec flag. On error `fd` is untouched (still an unconnected
/// TCP socket).
pub fn connect(fd: RawFd, addr: SocketAddr, opts: &Options) -> io::Result<()> {
    let _inside = Inside::enter();
    if !table::new_streams_allowed() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no new iWARP streams in a child forked after its parent made one (the socket \
             library's progress thread does not exist here)",
        ));
    }
    let (nonblocking, cloexec) = fd_flags(fd);
    table::note_stream();
    let stream = Stream::connect_with(addr, opts)?;
    stream.set_nonblocking(nonblocking)?;
    table::install(fd, stream, cloexec)
}

/// Accepts the TCP connection `fd` (just accepted, its MPA Request
/// waiting unread) as an iWARP stream and makes `fd` the stream. On error
/// the caller still owns `fd` and should close it.
pub fn accept(fd: RawFd, opts: &Options, nonblocking: bool, cloexec: bool) -> io::Result<()> {
    let _inside = Inside::enter();
    if !table::new_streams_allowed() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no new iWARP streams in a child forked after its parent made one (the socket \
             library's progress thread does not exist here)",
        ));
    }
    if table::children_serve_inherited() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a child of this process tried to use a stream it inherited: the program serves \
             its connections in forked children, which cannot drive this process's streams",
        ));
    }
    // SAFETY: plain descriptor call.
    let copy = unsafe { (real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` is a descriptor we just made and own; the TcpStream
    // takes it over (and closes it when the stream is done with it).
    let tcp = unsafe { TcpStream::from_raw_fd(copy) };
    table::note_stream();
    let stream = Listener::accept_tcp(tcp, opts)?;
    stream.set_nonblocking(nonblocking)?;
    table::install(fd, stream, cloexec)
}

/// Waits up to `wait` for the first bytes of the accepted connection `fd`
/// and says whether they are an MPA Request. Nothing is consumed.
pub fn peek_is_mpa(fd: RawFd, wait: std::time::Duration) -> bool {
    let r = real();
    let deadline = std::time::Instant::now() + wait;
    let mut buf = [0u8; 16];
    loop {
        // SAFETY: `buf` is valid for 16 bytes of writes.
        let n = unsafe {
            (r.recv)(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return false; // closed before saying anything
        }
        if n > 0 {
            let n = n as usize;
            if buf[..n] != MPA_REQ_KEY[..n] {
                return false;
            }
            if n == MPA_REQ_KEY.len() {
                return true;
            }
        } else {
            let e = io::Error::last_os_error().raw_os_error();
            if e != Some(libc::EAGAIN) && e != Some(libc::EINTR) {
                return false;
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
        // With a partial key peeked, POLLIN stays set: sleep a little instead.
        let partial = n > 0;
        // SAFETY: one valid pollfd.
        unsafe {
            if partial {
                libc::usleep(1000);
            } else {
                (r.poll)(&mut p, 1, ms);
            }
        }
    }
}
