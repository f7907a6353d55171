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

/// What the first bytes of an accepted connection say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstBytes {
    /// They start with [`MPA_REQ_KEY`]: an MPA Request, an iWARP peer.
    Mpa,
    /// They differ from [`MPA_REQ_KEY`] somewhere: a plain TCP client.
    Plain,
    /// A proper prefix of [`MPA_REQ_KEY`] (or nothing): wait for more.
    NeedMore,
}

/// The decision [`peek_is_mpa`] takes on the bytes peeked so far, without
/// any I/O. Only the first 16 bytes are looked at, so once the answer is
/// [`FirstBytes::Mpa`] or [`FirstBytes::Plain`] more bytes never change it.
pub fn classify_first_bytes(buf: &[u8]) -> FirstBytes {
    let n = buf.len().min(MPA_REQ_KEY.len());
    if buf[..n] != MPA_REQ_KEY[..n] {
        FirstBytes::Plain
    } else if n == MPA_REQ_KEY.len() {
        FirstBytes::Mpa
    } else {
        FirstBytes::NeedMore
    }
}

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
    let stream = accept_stream(fd, opts, nonblocking)?;
    let _inside = Inside::enter();
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

/// Settles in progress: descriptor number -> the settle that claimed it.
///
/// A settle's MPA exchange waits on the remote peer (up to the options'
/// `connect_timeout`), so no lock is held across it: the lock below only
/// guards these claims and the local calls that change what a claimed
/// number refers to (the final `dup2`s). A claimed number is changed only
/// while it is still claimed, and `close`, `dup2` onto it and
/// `close_range` drop the claim first ([`forget`]): a settle can never
/// replace a descriptor the program has closed and reused (issue 26,
/// item 2).
static CLAIMS: std::sync::Mutex<std::collections::BTreeMap<RawFd, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
/// Signalled when a settle ends (its claims are gone).
static SETTLED: std::sync::Condvar = std::sync::Condvar::new();
static NEXT_CLAIM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
/// One bit per descriptor number: claimed (a copy of [`CLAIMS`]' keys),
/// so that [`is_settling`] is one atomic load and never waits for the
/// lock: it is asked on every call on every descriptor, by the socket
/// library's own threads too, which hold their connection's lock then.
static CLAIMED: [std::sync::atomic::AtomicU64; table::MAX_FD / 64] =
    [const { std::sync::atomic::AtomicU64::new(0) }; table::MAX_FD / 64];

fn claimed_bit(fd: RawFd) -> Option<(&'static std::sync::atomic::AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < table::MAX_FD)?;
    Some((&CLAIMED[i / 64], 1u64 << (i % 64)))
}

/// Claims `fd` for the settle `id` (with the claims held).
fn claim(c: &mut std::collections::BTreeMap<RawFd, u64>, fd: RawFd, id: u64) {
    c.insert(fd, id);
    if let Some((w, b)) = claimed_bit(fd) {
        w.fetch_or(b, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Drops the claim on `fd` (with the claims held).
fn unclaim(c: &mut std::collections::BTreeMap<RawFd, u64>, fd: RawFd) {
    c.remove(&fd);
    if let Some((w, b)) = claimed_bit(fd) {
        w.fetch_and(!b, std::sync::atomic::Ordering::AcqRel);
    }
}

fn claims() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<RawFd, u64>> {
    CLAIMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps settles from changing any descriptor while held: a call that the
/// TCP socket of a deferred accept answers (`getpeername`, ...) holds it,
/// so a settle cannot turn the descriptor into the stream halfway through
/// it. Never held across a wait on a peer.
pub fn hold_settles() -> SettlesHeld {
    SettlesHeld(claims())
}

/// While alive, no settle changes a descriptor ([`hold_settles`]).
#[derive(Debug)]
pub struct SettlesHeld(
    #[allow(dead_code)] std::sync::MutexGuard<'static, std::collections::BTreeMap<RawFd, u64>>,
);

/// Whether a settle of `fd` is in progress (another thread's MPA
/// exchange): calls on it wait for that settle ([`settle`] does).
pub fn is_settling(fd: RawFd) -> bool {
    claimed_bit(fd).is_some_and(|(w, b)| w.load(std::sync::atomic::Ordering::Acquire) & b != 0)
}

/// `fd` is being closed or replaced (`close`, `dup2`/`dup3` onto it,
/// `close_range`): forgets its deferred entry and drops a settle's claim
/// on it, atomically with respect to settles, so that no settle changes
/// the number afterwards. Call before the real call.
pub fn forget(first: RawFd, last: RawFd) {
    // The common case without the lock (the socket library's own threads
    // close descriptors through here while they hold a connection's
    // lock): the deferred bit first, then the claim bit (see `settle`).
    if first == last && !table::is_deferred(first) && !is_settling(first) {
        table::forget(first, last);
        return;
    }
    let mut c = claims();
    table::forget(first, last);
    if first <= last {
        let gone: Vec<RawFd> = c.range(first..=last).map(|(fd, _)| *fd).collect();
        for fd in gone {
            unclaim(&mut c, fd);
        }
    }
}

/// `call` makes `new` a copy of the deferred or settling descriptor `old`
/// (`dup`, `dup2`, `F_DUPFD`): returns its result, with `new` deferred
/// with `old` (`table::defer_copy`), or claimed by the same settle, so
/// the settle makes it a copy of the stream too. `None` when `old` is
/// neither.
pub fn copy_waiting(old: RawFd, call: impl FnOnce() -> libc::c_int) -> Option<libc::c_int> {
    let mut c = claims();
    let settling = c.get(&old).copied();
    if settling.is_none() && !table::is_deferred(old) {
        return None;
    }
    let rc = call();
    if rc >= 0 && rc != old {
        match settling {
            Some(id) => {
                claim(&mut c, rc, id);
            }
            None => table::defer_copy(old, rc),
        }
    }
    Some(rc)
}

/// Makes the deferred connection `fd` a stream now (the MPA exchange, in
/// this process), with the descriptor's current `O_NONBLOCK` and
/// close-on-exec flags and the socket options set on it meanwhile. Its
/// deferred copies in this process ([`table::deferred_siblings`]) become
/// copies of the stream, each keeping its close-on-exec flag. If another
/// thread settles `fd`, waits for that settle instead. Does nothing if
/// `fd` is not deferred (any more). If the stream cannot be made, or the
/// MPA Request is gone (another process sharing the connection made it
/// its stream), `fd` and its copies become closed connections (reads see
/// end of stream, writes `EPIPE`) and the error is returned.
///
/// Only this call's thread waits for the peer: no lock is held during
/// the exchange (see `CLAIMS`). The numbers are claimed first; those
/// the program closes or replaces meanwhile lose their claim and are left
/// alone, and if none is left the stream is dropped (the client sees its
/// connection closed).
pub fn settle(fd: RawFd) -> io::Result<()> {
    // Claim fd and its copies (short lock; local calls only).
    let (id, base, siblings) = {
        let mut c = claims();
        while c.contains_key(&fd) {
            // Another thread's settle of this descriptor: wait for it.
            c = SETTLED.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        if !table::is_deferred(fd) {
            return Ok(());
        }
        let siblings = table::deferred_siblings(fd);
        let id = NEXT_CLAIM.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The claim bit goes up before the deferred bit comes down, so a
        // `close` that tests them in the other order without the lock
        // (`forget`) always sees one of them.
        claim(&mut c, fd, id);
        let Some(base) = table::take_deferred(fd) else {
            unclaim(&mut c, fd);
            return Ok(());
        };
        let siblings: Vec<RawFd> = siblings
            .into_iter()
            .filter(|&d| {
                claim(&mut c, d, id);
                let taken = table::take_deferred(d).is_some();
                if !taken {
                    unclaim(&mut c, d);
                }
                taken
            })
            .collect();
        (id, base, siblings)
    };
    let made = if !peek_is_mpa(fd, std::time::Duration::ZERO) {
        // Another process (a parent or a child sharing the connection)
        // read the Request and made the connection its stream: this
        // descriptor must not read that stream's bytes.
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "another process made this connection its iWARP stream (it was shared through fork)",
        ))
    } else {
        let (nonblocking, _) = fd_flags(fd);
        let opts = table::options_for(fd, &base);
        accept_stream(fd, &opts, nonblocking)
    };
    // Install on the numbers still claimed (short lock).
    let mut c = claims();
    let mine: Vec<RawFd> = std::iter::once(fd)
        .chain(siblings.iter().copied())
        .filter(|d| c.get(d) == Some(&id))
        .chain(
            // copies made during the exchange (`copy_waiting`)
            c.iter()
                .filter(|&(d, &i)| i == id && *d != fd && !siblings.contains(d))
                .map(|(d, _)| *d)
                .collect::<Vec<_>>(),
        )
        .collect();
    for &d in &mine {
        unclaim(&mut c, d);
    }
    let result = match made {
        Err(e) => {
            for &d in &mine {
                dead_end(d);
            }
            Err(e)
        }
        Ok(_) if mine.is_empty() => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the program closed the descriptor during the MPA exchange; the stream is dropped",
        )),
        Ok(stream) => install_copies(stream, &mine),
    };
    drop(c);
    SETTLED.notify_all();
    result
}

/// Makes the numbers `fds` (the first one first) the stream, each keeping
/// its close-on-exec flag. Called with the claims held.
fn install_copies(stream: Stream, fds: &[RawFd]) -> io::Result<()> {
    let r = real();
    let first = fds[0];
    let cloexec = fd_flags(first).1;
    if let Err(e) = table::install(first, stream, cloexec) {
        for &d in fds {
            dead_end(d);
        }
        return Err(e);
    }
    for &d in &fds[1..] {
        let d_cloexec = fd_flags(d).1;
        // SAFETY: plain descriptor calls on descriptors of the program's
        // that referred to this connection and are still claimed (not
        // closed since); `dup2` replaces the TCP socket at `d` by the
        // stream's descriptor, as `install` did at `first`.
        unsafe {
            if (r.dup2)(first, d) < 0 {
                dead_end(d);
                continue;
            }
            if d_cloexec {
                (r.fcntl)(d, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong);
            }
        }
        table::duplicated(first, d);
    }
    Ok(())
}

/// The MPA exchange on a private copy of the accepted connection `fd`
/// (its Request unread): the stream, not yet installed anywhere.
fn accept_stream(fd: RawFd, opts: &Options, nonblocking: bool) -> io::Result<Stream> {
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
    Ok(stream)
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

#[cfg(test)]
mod tests {
    use super::{classify_first_bytes, FirstBytes, MPA_REQ_KEY};

    #[test]
    fn mpa_key_and_a_whole_request_are_mpa() {
        assert_eq!(classify_first_bytes(MPA_REQ_KEY), FirstBytes::Mpa);
        // siw's default Request (siw-default.pcap).
        let req = b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01";
        assert_eq!(classify_first_bytes(req), FirstBytes::Mpa);
    }

    #[test]
    fn partial_key_needs_more() {
        for n in 1..MPA_REQ_KEY.len() {
            assert_eq!(
                classify_first_bytes(&MPA_REQ_KEY[..n]),
                FirstBytes::NeedMore,
                "{n} bytes"
            );
        }
    }

    #[test]
    fn empty_needs_more() {
        assert_eq!(classify_first_bytes(b""), FirstBytes::NeedMore);
    }

    #[test]
    fn plain_http_and_near_misses_are_plain() {
        assert_eq!(
            classify_first_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            FirstBytes::Plain
        );
        assert_eq!(classify_first_bytes(b"G"), FirstBytes::Plain);
        // A Reply key, or a Request key differing in its last byte.
        assert_eq!(classify_first_bytes(b"MPA ID Rep Frame"), FirstBytes::Plain);
        assert_eq!(classify_first_bytes(b"MPA ID Req Fram!"), FirstBytes::Plain);
        // Differs early, before the peer has sent 16 bytes.
        assert_eq!(classify_first_bytes(b"MPB"), FirstBytes::Plain);
    }
}
