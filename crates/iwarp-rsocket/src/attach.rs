//! Turning a descriptor into an iWARP stream: after an outgoing connect
//! ([`connect`]) or an accepted TCP connection whose first bytes are an
//! MPA Request ([`accept`], or [`defer`] and, at its first use,
//! [`settle`]).

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

/// Whether this process may accept MPA clients as streams (the errors
/// name why not).
fn may_accept() -> io::Result<()> {
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
    Ok(())
}

/// Accepts the TCP connection `fd` (just accepted, its MPA Request
/// waiting unread) as an iWARP stream and makes `fd` the stream. On error
/// the caller still owns `fd` and should close it.
pub fn accept(fd: RawFd, opts: &Options, nonblocking: bool, cloexec: bool) -> io::Result<()> {
    let _inside = Inside::enter();
    may_accept()?;
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

/// Marks the TCP connection `fd` (just accepted, its MPA Request waiting
/// unread) to become a stream with `opts` at its first use ([`settle`]),
/// in whichever process that is (see `table`, "Accepts wait for their
/// first use"). On error the caller still owns `fd` and should close it.
pub fn defer(fd: RawFd, opts: &Options) -> io::Result<()> {
    may_accept()?;
    table::defer(fd, opts.clone())
}

/// Serializes [`settle`]s, so that two threads using one deferred
/// descriptor make one stream.
static SETTLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Keeps every [`settle`] out while held: a call that the TCP socket of a
/// deferred accept answers (`getpeername`, ...) holds it, so the settle
/// thread cannot turn the descriptor into the stream halfway through it.
pub fn hold_settles() -> std::sync::MutexGuard<'static, ()> {
    SETTLING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the deferred connection `fd` a stream now (the MPA exchange, in
/// this process), with the descriptor's current `O_NONBLOCK` and
/// close-on-exec flags and the socket options set on it meanwhile. Its
/// deferred copies in this process ([`table::deferred_siblings`]) become
/// copies of the stream, each keeping its close-on-exec flag. Does
/// nothing if `fd` is not deferred (any more). If the stream cannot be
/// made, or the MPA Request is gone (another process sharing the
/// connection made it its stream), `fd` and its copies become closed
/// connections (reads see end of stream, writes `EPIPE`) and the error is
/// returned.
pub fn settle(fd: RawFd) -> io::Result<()> {
    let _one = SETTLING.lock().unwrap_or_else(|e| e.into_inner());
    if !table::is_deferred(fd) {
        return Ok(());
    }
    let siblings = table::deferred_siblings(fd);
    let Some(base) = table::take_deferred(fd) else {
        return Ok(());
    };
    let siblings: Vec<(RawFd, bool)> = siblings
        .into_iter()
        .filter(|&d| table::take_deferred(d).is_some())
        .map(|d| (d, fd_flags(d).1))
        .collect();
    let dead = |fd: RawFd| {
        dead_end(fd);
        for &(d, _) in &siblings {
            dead_end(d);
        }
    };
    if !peek_is_mpa(fd, std::time::Duration::ZERO) {
        // Another process (a parent or a child sharing the connection)
        // read the Request and made the connection its stream: this
        // descriptor must not read that stream's bytes.
        dead(fd);
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "another process made this connection its iWARP stream (it was shared through fork)",
        ));
    }
    let (nonblocking, cloexec) = fd_flags(fd);
    let r = real();
    if nonblocking {
        // The MPA exchange blocks (bounded by the options' timeout); the
        // program's mode goes to the stream after it.
        // SAFETY: plain descriptor calls.
        unsafe {
            let fl = (r.fcntl)(fd, libc::F_GETFL, 0);
            (r.fcntl)(fd, libc::F_SETFL, (fl & !libc::O_NONBLOCK) as libc::c_ulong);
        }
    }
    let opts = table::options_for(fd, &base);
    if let Err(e) = accept(fd, &opts, nonblocking, cloexec) {
        dead(fd);
        return Err(e);
    }
    for (d, d_cloexec) in siblings {
        // SAFETY: plain descriptor calls on descriptors of the program's
        // that referred to this connection; `dup2` replaces the TCP socket
        // at `d` by the stream's descriptor, as `install` did at `fd`.
        unsafe {
            if (r.dup2)(fd, d) < 0 {
                dead_end(d);
                continue;
            }
            if d_cloexec {
                (r.fcntl)(d, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong);
            }
        }
        table::duplicated(fd, d);
    }
    Ok(())
}

/// Makes `fd` a connection whose peer is gone: one end of a socket pair
/// whose other end is closed (what was at `fd` is closed).
fn dead_end(fd: RawFd) {
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
