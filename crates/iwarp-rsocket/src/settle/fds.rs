//! Descriptor-level work: which numbers a job claims, the calls the
//! preload forwards while a job owns a number (`close`, `dup2`,
//! `epoll_ctl`), swapping a placeholder onto a number, and peeking at the
//! first bytes of an accepted connection (RFC 5044 §7.1: an MPA Request
//! starts with its key).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::MutexGuard;

use super::config::MPA_MAX_REQUEST;
use super::state::{claim, pid, set, state, test, unclaim, State, CLAIMED, EPOLLS, KICKED};
use crate::classify::{classify_first_bytes, FirstBytes};
use crate::fd::fd_flags;
use crate::real::real;
use crate::table::{self};

/// Whether a job of this process claims `fd` (calls on it wait for the job
/// or get `EAGAIN`).
pub fn is_settling(fd: RawFd) -> bool {
    test(&CLAIMED, fd)
}

/// Keeps jobs from changing any descriptor while held: a call that the
/// TCP socket answers (`getpeername`, ...) holds it. Never held across a
/// wait on a peer.
pub fn hold_settles() -> SettlesHeld {
    SettlesHeld(state())
}

/// While alive, no job changes a descriptor ([`hold_settles`]).
pub struct SettlesHeld(MutexGuard<'static, State>);

impl std::fmt::Debug for SettlesHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SettlesHeld")
    }
}

impl SettlesHeld {
    /// The descriptor that answers name and option calls for `fd`: the
    /// TCP socket's private copy while a job of this process has replaced
    /// `fd` by its placeholder, else `fd` itself.
    pub fn tcp_of(&self, fd: RawFd) -> RawFd {
        self.0
            .claims
            .get(&fd)
            .and_then(|id| self.0.jobs.get(id))
            .filter(|j| j.pid == pid())
            .map_or(fd, |j| j.names.as_raw_fd())
    }
}

/// `fd` is being closed or replaced (`close`, `dup2`/`dup3` onto it,
/// `close_range`): forgets its deferred entry, its recorded epoll
/// registrations (and those recorded in it, if it is an epoll
/// descriptor), and drops a job's claim on it, atomically with respect to
/// jobs, so that no job changes the number afterwards. Call before the
/// real call.
pub fn forget(first: RawFd, last: RawFd) {
    // The common case without the lock (the socket library's own threads
    // close descriptors through here while they hold a connection's
    // lock): the deferred bit first, then the claim bit (see `begin`).
    if first == last
        && !table::is_deferred(first)
        && !is_settling(first)
        && !test(&EPOLLS, first)
        && !test(&KICKED, first)
    {
        table::forget(first, last);
        return;
    }
    let mut st = state();
    table::forget(first, last);
    if first > last {
        return;
    }
    let gone: Vec<RawFd> = st.claims.range(first..=last).map(|(fd, _)| *fd).collect();
    for fd in gone {
        unclaim(&mut st, fd);
    }
    let gone: Vec<RawFd> = st.regs.range(first..=last).map(|(fd, _)| *fd).collect();
    for fd in gone {
        st.regs.remove(&fd);
    }
    st.kicks.retain(|k| !(first..=last).contains(&k.number));
    for fd in first..=last.min(first.saturating_add(4096)) {
        set(&KICKED, fd, false);
    }
    for ep in first..=last.min(table::MAX_FD as RawFd - 1) {
        if test(&EPOLLS, ep) {
            set(&EPOLLS, ep, false);
            for v in st.regs.values_mut() {
                v.retain(|(e, _)| *e != ep);
            }
        }
        if last - first > 4096 && ep - first > 4096 {
            // close_range over a huge range: epoll descriptors beyond the
            // first 4096 numbers keep stale entries, harmless (only used
            // with the number they name, which the lookups check).
            break;
        }
    }
}

/// `call` makes `new` a copy of the deferred or settling descriptor `old`
/// (`dup`, `dup2`, `F_DUPFD`): returns its result, with `new` deferred
/// with `old` (`table::defer_copy`), or claimed by the same job, so the
/// job makes it a copy of the stream too. `None` when `old` is neither.
pub fn copy_waiting(old: RawFd, call: impl FnOnce() -> libc::c_int) -> Option<libc::c_int> {
    let mut st = state();
    let settling = st.claims.get(&old).copied();
    if settling.is_none() && !table::is_deferred(old) {
        return None;
    }
    let rc = call();
    if rc >= 0 && rc != old {
        match settling {
            Some(id) => claim(&mut st, rc, id),
            None => table::defer_copy(old, rc),
        }
    }
    Some(rc)
}

/// The program's `epoll_ctl(epfd, op, fd, ev)` on a number a job claims:
/// made, and recorded so that the job's replacements of the number keep
/// it. `None` when `fd` is not claimed (the caller makes the plain call).
///
/// # Safety
/// `ev` as for epoll_ctl(2).
pub unsafe fn epoll_ctl(
    epfd: RawFd,
    op: libc::c_int,
    fd: RawFd,
    ev: *mut libc::epoll_event,
) -> Option<libc::c_int> {
    if !is_settling(fd) {
        return None;
    }
    let mut st = state();
    if !st.claims.contains_key(&fd) {
        return None;
    }
    // SAFETY: the caller's arguments, passed through.
    let rc = unsafe { (real().epoll_ctl)(epfd, op, fd, ev) };
    if rc == 0 {
        let v = st.regs.entry(fd).or_default();
        v.retain(|(e, _)| *e != epfd);
        if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
            // SAFETY: the caller's promise: `ev` is valid for reads.
            v.push((epfd, unsafe { std::ptr::read_unaligned(ev) }));
            set(&EPOLLS, epfd, true);
        }
    }
    Some(rc)
}

/// Replaces what number `d` refers to by `with` (a `dup2`), keeping its
/// close-on-exec flag and the program's epoll registrations of it.
pub(super) fn replace(st: &State, d: RawFd, with: impl FnOnce(RawFd) -> bool) {
    let r = real();
    let regs = st.regs.get(&d).cloned().unwrap_or_default();
    for (ep, _) in &regs {
        // SAFETY: plain descriptor call; DEL ignores the event.
        unsafe { (r.epoll_ctl)(*ep, libc::EPOLL_CTL_DEL, d, std::ptr::null_mut()) };
    }
    let cloexec = fd_flags(d).1;
    if with(d) && cloexec {
        // SAFETY: plain descriptor call on the number just replaced.
        unsafe { (r.fcntl)(d, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    }
    for (ep, ev) in &regs {
        let mut e = *ev;
        // SAFETY: `e` is a valid event for the duration of the call.
        unsafe { (r.epoll_ctl)(*ep, libc::EPOLL_CTL_ADD, d, &mut e) };
    }
}

/// `dup2(from, d)` for [`replace`].
pub(super) fn dup2_onto(from: RawFd) -> impl FnOnce(RawFd) -> bool {
    move |d| {
        // SAFETY: plain descriptor call onto a number a job claims.
        unsafe { (real().dup2)(from, d) >= 0 }
    }
}

/// A socket pair end that polls as neither readable nor writable (its
/// send buffer is filled) for as long as the other end is open; then it
/// polls as a closed connection.
pub(super) fn placeholder(nonblocking: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let r = real();
    let mut pair = [-1; 2];
    // SAFETY: `pair` has room for two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            pair.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two descriptors just made and owned by nobody else.
    let (app, ctl) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let one: libc::c_int = 1;
    let junk = [0u8; 512];
    // SAFETY: plain calls on our descriptors with valid buffers; the
    // kernel raises SO_SNDBUF to its minimum, a few writes fill it.
    unsafe {
        (r.setsockopt)(
            app.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        for _ in 0..256 {
            if (r.write)(app.as_raw_fd(), junk.as_ptr().cast(), junk.len()) < 0 {
                break;
            }
        }
        if !nonblocking {
            let fl = (r.fcntl)(app.as_raw_fd(), libc::F_GETFL, 0);
            (r.fcntl)(
                app.as_raw_fd(),
                libc::F_SETFL,
                (fl & !libc::O_NONBLOCK) as libc::c_ulong,
            );
        }
    }
    Ok((app, ctl))
}

/// Sets `SO_RCVLOWAT` (socket(7): `poll` reports the socket readable from
/// that many bytes, or at end of stream).
pub(super) fn set_lowat(fd: RawFd, n: usize) {
    let v = n.clamp(1, MPA_MAX_REQUEST) as libc::c_int;
    // SAFETY: a valid int option.
    unsafe {
        (real().setsockopt)(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Peeks (without waiting) at up to [`MPA_MAX_REQUEST`] bytes: `Some(n)`
/// (0: end of stream), `None` when nothing is there or on an error.
pub(super) fn peek(fd: RawFd, buf: &mut [u8; MPA_MAX_REQUEST]) -> Option<usize> {
    // SAFETY: `buf` is valid for its length.
    let n = unsafe {
        (real().recv)(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).ok()
}

/// What the first bytes of `fd` say now, without waiting (end of stream
/// and errors: [`FirstBytes::Plain`]: the program gets what TCP says).
pub fn first_bytes(fd: RawFd) -> FirstBytes {
    let mut buf = [0u8; MPA_MAX_REQUEST];
    // SAFETY: `buf` is valid for 16 bytes.
    let n = unsafe {
        (real().recv)(
            fd,
            buf.as_mut_ptr().cast(),
            16,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => FirstBytes::Plain,
        n if n > 0 => classify_first_bytes(&buf[..n as usize]),
        _ => match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => FirstBytes::NeedMore,
            _ => FirstBytes::Plain,
        },
    }
}

pub(super) fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&mut st as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `st` is valid for `len` bytes.
    if unsafe { (real().getpeername)(fd, p, &mut len) } != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes.
    unsafe { crate::ops::read_addr(p, len) }
}
