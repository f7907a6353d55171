//! Turning a descriptor into an iWARP stream: after an outgoing connect
//! ([`connect`]) or an accepted TCP connection whose first bytes are an
//! MPA Request ([`accept`], or [`defer`] and, at its first use,
//! [`settle`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, RawFd};

use iwarp_sockets::{Listener, Options, Stream};

pub use crate::classify::{classify_first_bytes, FirstBytes, MPA_REQ_KEY};
pub use crate::fd::fd_flags;
use crate::real::real;
pub use crate::table::may_accept;
use crate::table::{self, Inside, StreamSlot};

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
    let slot = StreamSlot::reserve()?;
    table::note_stream();
    let stream = Stream::connect_with(addr, opts)?;
    stream.set_nonblocking(nonblocking)?;
    table::install(fd, stream, slot, cloexec)
}

/// Accepts the TCP connection `fd` (just accepted, its MPA Request
/// waiting unread) as an iWARP stream and makes `fd` the stream. On error
/// the caller still owns `fd` and should close it.
pub fn accept(fd: RawFd, opts: &Options, nonblocking: bool, cloexec: bool) -> io::Result<()> {
    let (stream, slot) = accept_stream(fd, opts, nonblocking)?;
    let _inside = Inside::enter();
    table::install(fd, stream, slot, cloexec)
}

/// Marks the TCP connection `fd` (just accepted, its MPA Request waiting
/// unread) to become a stream with `opts` at its first use ([`settle`]),
/// in whichever process that is (see `table`, "Accepts wait for their
/// first use"). On error the caller still owns `fd` and should close it.
pub fn defer(fd: RawFd, opts: &Options) -> io::Result<()> {
    may_accept()?;
    table::defer(fd, opts.clone())
}

pub use crate::settle::{copy_waiting, forget, hold_settles, is_settling, settle, SettlesHeld};

/// Marks the TCP connection `fd` (just accepted, nothing from the client
/// yet) to be decided when its first bytes arrive: an MPA client then
/// waits for its first use as [`defer`] does, anything else is plain TCP
/// (see `settle`). On error the caller still owns `fd`.
pub fn defer_undecided(fd: RawFd, opts: &Options) -> io::Result<()> {
    // No `may_accept` here: a process that makes no streams still serves
    // its plain clients; an MPA client is refused when it is decided (the
    // connection is closed under the program, and the client falls back).
    table::defer_undecided(fd, opts.clone())
}

/// The MPA exchange on a private copy of the accepted connection `fd`
/// (its Request unread): the stream, not yet installed anywhere, and its
/// place under the process's bound on streams.
fn accept_stream(fd: RawFd, opts: &Options, nonblocking: bool) -> io::Result<(Stream, StreamSlot)> {
    let _inside = Inside::enter();
    may_accept()?;
    let slot = StreamSlot::reserve()?;
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
    Ok((stream, slot))
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
            match classify_first_bytes(&buf[..n as usize]) {
                FirstBytes::Plain => return false,
                FirstBytes::Mpa => return true,
                FirstBytes::NeedMore => {}
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
