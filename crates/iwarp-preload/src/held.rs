//! `accept` on a blocking listener in a process that makes no streams
//! (issue 26 item 1: `accept` never waits on one client).
//!
//! Such a process (a child forked after its parent made a stream, or a
//! parent whose children used inherited streams: `attach::may_accept`)
//! closes its MPA clients so that each falls back with a new TCP
//! connection, and that close must come before the program sees the
//! connection: a connection handed over and found to be MPA later could
//! only be reset under the program, and a one-shot server (a child that
//! serves one client) would lose its only client. So the first bytes
//! (RFC 5044 §7.1: an MPA client's first 16 bytes are the Request key)
//! decide before `accept` returns a connection. Without waiting on any one
//! client: a connection whose client has sent nothing yet is *held* here,
//! and `accept` waits for whichever comes first, a new connection on the
//! listener or the first bytes (or the peek time) of a held one, as a
//! blocking `accept` waits for the next connection anyway. A silent client
//! costs a slot in that poll, never the other clients their turn.
//!
//! Held connections belong to the thread that accepted them (the thread
//! that calls `accept` again watches them); a non-blocking listener never
//! gets here (its program waits for readiness of the listener, which a
//! held connection's bytes do not give: the preload hands such a
//! connection over undecided instead).

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use iwarp_rsocket::attach::{classify_first_bytes, FirstBytes};
use iwarp_rsocket::real::real;

/// A connection accepted on `lfd` whose client has not said enough yet.
struct Held {
    pid: u32,
    lfd: RawFd,
    fd: RawFd,
    since: Instant,
    /// Part of the key has arrived: the socket polls readable until the
    /// rest comes, so it is looked at on a short timer instead of polled.
    partial: bool,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    /// This thread's epoll set of its held connections, so that `accept`
    /// polls two descriptors (the listener and this set) however many
    /// clients are held.
    static SET: RefCell<Option<EpollSet>> = const { RefCell::new(None) };
}

/// An epoll descriptor and the process that made it: a forked child
/// shares its parent's epoll instance through the inherited descriptor,
/// so it closes its copy and makes its own.
struct EpollSet {
    pid: u32,
    fd: RawFd,
}

impl Drop for EpollSet {
    fn drop(&mut self) {
        close(self.fd);
    }
}

/// This thread's set (made on first use); `None` if epoll fails, and then
/// the held connections are polled one by one as before.
fn set_fd(me: u32) -> Option<RawFd> {
    SET.with(|s| {
        let mut s = s.borrow_mut();
        if s.as_ref().is_some_and(|e| e.pid != me) {
            *s = None; // closes this process's copy of the parent's set
        }
        if s.is_none() {
            // SAFETY: plain call.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd >= 0 {
                *s = Some(EpollSet { pid: me, fd });
            }
        }
        s.as_ref().map(|e| e.fd)
    })
}

/// Adds (`true`) or removes `fd` from the set `ep` (level-triggered
/// readability; the data is the descriptor).
fn set_ctl(ep: RawFd, fd: RawFd, add: bool) {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    let op = if add {
        libc::EPOLL_CTL_ADD
    } else {
        libc::EPOLL_CTL_DEL
    };
    // SAFETY: `ev` is a valid event for the call. The C library's
    // epoll_ctl, not the preload's own.
    unsafe { (real().epoll_ctl)(ep, op, fd, &mut ev) };
}

/// What decided a connection ([`next`] reports each one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Its first bytes are not an MPA Request: the program's.
    Plain,
    /// Nothing from the client within the peek time: the program's.
    Silent,
    /// An MPA Request: closed here (the client falls back).
    Mpa,
    /// Not a connection the preload takes over: the program's.
    NotWanted,
}

/// The first bytes of `fd` so far (never waits): the decision, and
/// whether some bytes of the key are there (then `fd` polls readable
/// while undecided).
fn look(fd: RawFd) -> (FirstBytes, bool) {
    let mut buf = [0u8; 16];
    // SAFETY: `buf` is valid for 16 bytes of writes.
    let n = unsafe {
        (real().recv)(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        // Closed before saying anything: the program sees the close.
        0 => (FirstBytes::Plain, false),
        n if n > 0 => (classify_first_bytes(&buf[..n as usize]), true),
        _ => match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => (FirstBytes::NeedMore, false),
            _ => (FirstBytes::Plain, false), // an error: the program's to see
        },
    }
}

fn close(fd: RawFd) {
    // SAFETY: a descriptor this module accepted and owns.
    unsafe { (real().close)(fd) };
}

/// The next connection on the blocking listener `lfd` that is not an MPA
/// client (see the module doc), accepted close-on-exec and blocking (the
/// caller sets the program's flags). `wanted` says whether a connection
/// is one the preload takes over; `report` hears each decision (an
/// `Seen::Mpa` connection is closed after it). Waits as a blocking
/// `accept` does; `Err` as `accept(2)` fails (`EINTR` on a signal).
pub fn next(
    lfd: RawFd,
    peek: Duration,
    mut wanted: impl FnMut(RawFd) -> bool,
    mut report: impl FnMut(RawFd, Seen),
) -> io::Result<RawFd> {
    let me = std::process::id();
    let r = real();
    let ep = set_fd(me);
    let mut watch: Vec<libc::pollfd> = Vec::new();
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    // The held connections the last wait saw readable. A held connection
    // is looked at (a `recv` with MSG_PEEK) only when it is due: readable,
    // partly keyed or past its peek time. Looking at every held one on
    // every call, and polling each, cost every new client a `recv` and a
    // poll entry per silent client held (0.85x of the accept rate with 10
    // silent clients a second).
    let mut ready: Vec<RawFd> = Vec::new();
    loop {
        // The held connections of this listener that are due, decided.
        let found = HELD.with(|h| -> Option<RawFd> {
            let mut h = h.borrow_mut();
            // Inherited through fork: the parent's thread watches them.
            h.retain(|c| {
                c.pid == me || {
                    close(c.fd);
                    false
                }
            });
            let mut i = 0;
            while i < h.len() {
                let age = h[i].since.elapsed();
                let readable = ready.contains(&h[i].fd);
                if h[i].lfd != lfd {
                    if readable && !h[i].partial {
                        // Another listener's: out of the set (it would keep
                        // the set readable), looked at when that listener
                        // accepts again.
                        if let Some(ep) = ep {
                            set_ctl(ep, h[i].fd, false);
                        }
                        h[i].partial = true;
                    }
                    i += 1;
                    continue;
                }
                if !(h[i].partial || age >= peek || readable || ep.is_none()) {
                    i += 1;
                    continue;
                }
                let (seen, partial) = look(h[i].fd);
                let decided = !matches!(seen, FirstBytes::NeedMore) || age >= peek;
                if let Some(ep) = ep {
                    if !h[i].partial && (decided || partial) {
                        set_ctl(ep, h[i].fd, false);
                    }
                }
                match seen {
                    FirstBytes::Plain => {
                        let c = h.remove(i);
                        report(c.fd, Seen::Plain);
                        return Some(c.fd);
                    }
                    FirstBytes::Mpa => {
                        let c = h.remove(i);
                        report(c.fd, Seen::Mpa);
                        close(c.fd);
                    }
                    FirstBytes::NeedMore if age >= peek => {
                        let c = h.remove(i);
                        report(c.fd, Seen::Silent);
                        return Some(c.fd);
                    }
                    FirstBytes::NeedMore => {
                        h[i].partial |= partial;
                        i += 1;
                    }
                }
            }
            None
        });
        if let Some(fd) = found {
            return Ok(fd);
        }
        // Wait for a new connection on the listener, or for a held one to
        // speak (or its time to pass).
        watch.clear();
        watch.push(libc::pollfd {
            fd: lfd,
            events: libc::POLLIN,
            revents: 0,
        });
        if let Some(ep) = ep {
            watch.push(libc::pollfd {
                fd: ep,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let mut wait_ms: libc::c_int = -1;
        HELD.with(|h| {
            for c in h.borrow().iter().filter(|c| c.lfd == lfd) {
                let left = peek
                    .saturating_sub(c.since.elapsed())
                    .as_millis()
                    .clamp(1, 1000) as libc::c_int;
                let left = if c.partial { left.min(5) } else { left };
                wait_ms = if wait_ms < 0 { left } else { wait_ms.min(left) };
                if ep.is_none() && !c.partial {
                    watch.push(libc::pollfd {
                        fd: c.fd,
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
            }
        });
        // SAFETY: `watch` is a valid array of its length for the call.
        let n = unsafe { (r.poll)(watch.as_mut_ptr(), watch.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            return Err(io::Error::last_os_error()); // EINTR: as accept(2)
        }
        ready.clear();
        match ep {
            Some(ep) if watch[1].revents != 0 => {
                // Which held connections the poll saw: a zero timeout, so
                // no wait of its own (the one wait here is the poll above,
                // the interposed accept(2)'s own blocking, done through the
                // C library's functions like every call of this module).
                // SAFETY: `events` is valid for its length.
                let k = unsafe { (r.epoll_wait)(ep, events.as_mut_ptr(), events.len() as i32, 0) };
                ready.extend(
                    events
                        .iter()
                        .take(k.max(0) as usize)
                        .map(|e| e.u64 as RawFd),
                );
            }
            Some(_) => {}
            None => ready.extend(watch[1..].iter().filter(|p| p.revents != 0).map(|p| p.fd)),
        }
        if watch[0].revents == 0 {
            continue; // a held connection spoke, or its time passed
        }
        // SAFETY: plain call; null address arguments are allowed.
        let nfd = unsafe {
            (r.accept4)(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if nfd < 0 {
            return Err(io::Error::last_os_error());
        }
        if !wanted(nfd) {
            report(nfd, Seen::NotWanted);
            return Ok(nfd);
        }
        match look(nfd).0 {
            FirstBytes::Plain => {
                report(nfd, Seen::Plain);
                return Ok(nfd);
            }
            FirstBytes::Mpa => {
                report(nfd, Seen::Mpa);
                close(nfd);
            }
            FirstBytes::NeedMore => HELD.with(|h| {
                if let Some(ep) = ep {
                    set_ctl(ep, nfd, true);
                }
                h.borrow_mut().push(Held {
                    pid: me,
                    lfd,
                    fd: nfd,
                    since: Instant::now(),
                    partial: false,
                })
            }),
        }
    }
}
