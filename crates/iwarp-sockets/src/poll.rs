//! `rpoll` for Rust programs: wait for readiness of streams, listeners
//! and plain descriptors together, through the verbs crate's one waiting
//! API ([`iwarp::wait::WaitSet`], docs/WAITING.md).
//!
//! librdmacm's rsocket(7) defines `rpoll` as `poll(2)` over rsockets and
//! ordinary descriptors alike; [`poll`] keeps `poll(2)`'s terms:
//!
//! - the timeout is `poll(2)`'s: `None` waits until something is ready
//!   (`-1`), `Some(Duration::ZERO)` only checks (`0`), anything else waits
//!   at most that long (rounded up to the millisecond, as `poll(2)` does);
//! - it returns how many entries have a non-zero `revents` (0: the
//!   timeout passed), and sets every `revents`;
//! - a signal that interrupts the sleep returns an error of kind
//!   [`io::ErrorKind::Interrupted`] (`EINTR`);
//! - an entry whose descriptor is negative is ignored (`revents` 0);
//! - a stream reports `POLLIN` when a read would not block (data, end of
//!   stream, or an error to report), `POLLOUT` when a write would not,
//!   and `POLLERR` once it is broken (reset, or closed), whatever was
//!   asked, as `rs_poll_rs` in rsocket.c does.
//!
//! Where it differs from `poll(2)`: a plain descriptor's `POLLHUP`,
//! `POLLERR` and `POLLNVAL` are reported as the events the entry asked
//! for (the `WaitSet` reports a hang-up as "readable and writable"; the
//! next read or write on it says what happened), and a plain descriptor
//! that asks for neither `POLLIN` nor `POLLOUT` is not watched. With no
//! descriptor at all, a timeout is slept out (as `poll(2)` does) and no
//! timeout is refused (`InvalidInput`) rather than sleeping forever.
//!
//! How it waits: a stream is watched through its readiness descriptor,
//! which the completion hook and the progress thread keep in step; a
//! stream in busy-poll mode also puts its completion queue in the set
//! for its receive work ([`CqInterest::Progress`]), so the waiting thread
//! spins on its sockets as rsocket.c's `rpoll` does for `polling_time`
//! before it sleeps. A stream's `revents` are then read from its state
//! itself (`Stream::poll_read_ready` / `poll_write_ready`), not from the
//! descriptor.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use iwarp::wait::{CqInterest, Interest, Token, Until, WaitSet, Wake};

use crate::net::{Listener, Stream};

/// What a [`PollFd`] watches.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// An rsockets stream.
    Stream(&'a Stream),
    /// A listener: `POLLIN` when a connection waits to be accepted.
    Listener(&'a Listener),
    /// Any other descriptor (a TCP socket, a pipe); negative: ignored.
    Fd(RawFd),
}

/// One entry of [`poll`], as `struct pollfd`: what to watch, the events
/// asked for (`libc::POLLIN`, `libc::POLLOUT`), and the events found.
#[derive(Debug, Clone, Copy)]
pub struct PollFd<'a> {
    /// What is watched.
    pub source: Source<'a>,
    /// The events asked for.
    pub events: i16,
    /// The events found (set by [`poll`]).
    pub revents: i16,
}

impl<'a> PollFd<'a> {
    /// A stream, for `events`.
    pub fn stream(s: &'a Stream, events: i16) -> PollFd<'a> {
        PollFd {
            source: Source::Stream(s),
            events,
            revents: 0,
        }
    }

    /// A listener, for `events` (`POLLIN`).
    pub fn listener(l: &'a Listener, events: i16) -> PollFd<'a> {
        PollFd {
            source: Source::Listener(l),
            events,
            revents: 0,
        }
    }

    /// A plain descriptor, for `events`.
    pub fn fd(fd: RawFd, events: i16) -> PollFd<'a> {
        PollFd {
            source: Source::Fd(fd),
            events,
            revents: 0,
        }
    }
}

fn interest(events: i16) -> Option<Interest> {
    match (events & libc::POLLIN != 0, events & libc::POLLOUT != 0) {
        (true, true) => Some(Interest::BOTH),
        (true, false) => Some(Interest::READABLE),
        (false, true) => Some(Interest::WRITABLE),
        (false, false) => None,
    }
}

/// The events of a stream now, from its state.
fn stream_revents(s: &Stream, events: i16) -> i16 {
    let (readable, writable, broken) = s.poll_state();
    let mut r = 0;
    if readable && events & libc::POLLIN != 0 {
        r |= libc::POLLIN;
    }
    if writable && events & libc::POLLOUT != 0 {
        r |= libc::POLLOUT;
    }
    if broken {
        r |= libc::POLLERR;
    }
    r
}

/// `rpoll(fds, nfds, timeout)`: see the module docs.
pub fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> io::Result<usize> {
    let until = match timeout {
        None => Until::Forever,
        Some(t) => Until::Deadline(
            Instant::now()
                .checked_add(t)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365)),
        ),
    };
    let mut set = WaitSet::new();
    set.set_interruptible(true);
    // Sleep at once on the descriptors, unless a busy-poll stream spins.
    set.set_spin(Some(Duration::ZERO));
    for (i, p) in fds.iter_mut().enumerate() {
        p.revents = 0;
        let fd = match p.source {
            Source::Stream(s) => {
                if let Some(cq) = s.busy_poll_cq() {
                    set.add_cq(cq, CqInterest::Progress, Token(i));
                }
                s.as_raw_fd()
            }
            Source::Listener(l) => l.as_raw_fd(),
            Source::Fd(fd) => fd,
        };
        if let (true, Some(want)) = (fd >= 0, interest(p.events)) {
            set.add_fd(fd, want, Token(i));
        }
    }
    loop {
        // The streams first, from their state: the descriptor of one that
        // is ready may not show it yet (its completions not handled).
        let mut n = 0;
        for p in fds.iter_mut() {
            if let Source::Stream(s) = p.source {
                p.revents = stream_revents(s, p.events);
                n += usize::from(p.revents != 0);
            }
        }
        let check_only = n > 0;
        let wake = if check_only {
            // Something is ready: only look at the others once.
            set.wait(Until::Deadline(Instant::now()))?
        } else {
            // An empty set sleeps out a deadline, as poll(2) with no
            // descriptors does, and refuses to wait forever.
            set.wait(until)?
        };
        let events = match wake {
            Wake::Ready(ev) => ev,
            Wake::Timeout if check_only => &[][..],
            Wake::Timeout => return Ok(0),
        };
        for e in events {
            let p = &mut fds[e.token.0];
            if let Source::Stream(_) = p.source {
                continue;
            }
            let mut r = 0;
            if e.readable && p.events & libc::POLLIN != 0 {
                r |= libc::POLLIN;
            }
            if e.writable && p.events & libc::POLLOUT != 0 {
                r |= libc::POLLOUT;
            }
            if r == 0 {
                // Woken by a hang-up or an error no asked event covers.
                r = libc::POLLERR;
            }
            p.revents = r;
            n += 1;
        }
        if n > 0 {
            return Ok(n);
        }
        // Only a stream's descriptor woke the wait and its state says no
        // (a credit update, not data): wait again, to the same deadline.
        if matches!(until, Until::Deadline(d) if Instant::now() >= d) {
            return Ok(0);
        }
    }
}
