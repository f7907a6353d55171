//! The jobs' shared state: the job table behind one lock, the claims on
//! descriptor numbers (lock-free bitmaps read by every intercepted call),
//! and the watcher's wake-up; a leaf the other parts import.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use iwarp_sockets::Options;

use crate::real::real;
use crate::table::{self};

/// Where a job is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    /// Undecided: waiting for the first bytes until then.
    Classify { until: Instant },
    /// An MPA client: waiting for the rest of its Request until then.
    Request { until: Instant },
    /// The Request is complete; the exchange runs (no more waiting).
    Exchange,
}

/// One accepted connection being made a stream.
pub(super) struct Job {
    pub(super) pid: u32,
    /// The first number (made the stream first; the others are copies).
    pub(super) first: RawFd,
    /// Private copy of the TCP socket for the exchange (taken by it).
    pub(super) tcp: Option<TcpStream>,
    /// Private copy for name and option calls meanwhile, and to give the
    /// numbers their socket back.
    pub(super) names: OwnedFd,
    /// Our end of the placeholder: writing to it or closing it wakes
    /// pollers of the other (see [`Kick`]).
    pub(super) ctl: Option<OwnedFd>,
    pub(super) base: Options,
    pub(super) phase: Phase,
    pub(super) peer: Option<SocketAddr>,
    pub(super) waiters: usize,
    /// Why this process could not accept MPA clients as streams when the
    /// job began (`attach::may_accept`), for an undecided job: its bytes
    /// still decide, and an MPA client is then refused. Taken at `begin`,
    /// not later: a job begun while this process could accept goes on (a
    /// child that learns of it since must not take its parent's stream).
    pub(super) refuse_mpa: Option<String>,
}

impl Job {
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Classify { until } | Phase::Request { until } => Some(until),
            Phase::Exchange => None,
        }
    }
}

/// A `poll`/`select` that was sleeping on a placeholder when its number
/// was replaced: the kernel looks the numbers up again at each wake-up,
/// but waits only on the files it saw in its first pass (fs/select.c
/// registers wait queues in the first pass only). So after a replacement
/// the placeholder is woken once at once (a byte written to our end:
/// pollers of `POLLOUT` see the new file writable), and again, by closing
/// our end, when the new file shows input (`watch`, a copy of it, polls
/// readable or hung up): pollers of `POLLIN` then see it readable.
pub(super) struct Kick {
    pub(super) number: RawFd,
    pub(super) _ctl: OwnedFd,
    pub(super) watch: OwnedFd,
}

#[derive(Default)]
pub(super) struct State {
    /// Descriptor number -> the job that claimed it.
    pub(super) claims: BTreeMap<RawFd, u64>,
    pub(super) jobs: BTreeMap<u64, Job>,
    /// Jobs that failed, for their waiters: why, and waiters still to read it.
    pub(super) failed: BTreeMap<u64, (String, usize)>,
    /// The program's epoll registrations of claimed (or deferred) numbers:
    /// number -> (epoll descriptor, event).
    pub(super) regs: BTreeMap<RawFd, Vec<(RawFd, libc::epoll_event)>>,
    pub(super) kicks: Vec<Kick>,
}

pub(super) static STATE: Mutex<State> = Mutex::new(State {
    claims: BTreeMap::new(),
    jobs: BTreeMap::new(),
    failed: BTreeMap::new(),
    regs: BTreeMap::new(),
    kicks: Vec::new(),
});

/// After number `d` was given its final file: wakes pollers of the
/// placeholder `ctl` now, and keeps it to wake them again once `d`'s
/// file shows input ([`Kick`]).
pub(super) fn kick(st: &mut State, d: RawFd, ctl: Option<OwnedFd>) {
    let Some(ctl) = ctl else { return };
    let r = real();
    // `send` with MSG_NOSIGNAL, not `write`: the placeholder's other end
    // may have no copy left (it was only on `d`, which now has its final
    // file), and a write to a socket whose peer is gone raises SIGPIPE
    // (send(2): "EPIPE ... unless MSG_NOSIGNAL is set"), which killed a C
    // server that does not ignore SIGPIPE at its first iWARP accept
    // (Python ignores it, so the Python tests never saw it). Nobody to
    // wake then, so EPIPE is fine.
    // SAFETY: plain descriptor calls on our descriptors.
    unsafe {
        (r.send)(
            ctl.as_raw_fd(),
            [1u8].as_ptr().cast(),
            1,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    // SAFETY: plain descriptor call; the copy is ours.
    let w = unsafe { (r.fcntl)(d, libc::F_DUPFD_CLOEXEC, 0) };
    if w < 0 {
        return; // dropping `ctl` wakes them once more
    }
    // SAFETY: a descriptor we just made.
    let watch = unsafe { OwnedFd::from_raw_fd(w) };
    if st.kicks.len() >= 4096 {
        st.kicks.remove(0);
    }
    set(&KICKED, d, true);
    st.kicks.push(Kick {
        number: d,
        _ctl: ctl,
        watch,
    });
}
/// Signalled when a job ends.
pub(super) static SETTLED: Condvar = Condvar::new();
pub(super) static NEXT_JOB: AtomicU64 = AtomicU64::new(1);

/// One bit per number: claimed (a copy of the claims' keys, so that
/// [`is_settling`] is one atomic load and never waits for the lock: it is
/// asked on every call on every descriptor, by the socket library's own
/// threads too, which hold their connection's lock then).
pub(super) static CLAIMED: [AtomicU64; table::MAX_FD / 64] =
    [const { AtomicU64::new(0) }; table::MAX_FD / 64];
/// One bit per number: an epoll descriptor holding recorded registrations
/// (so that closing it forgets them).
pub(super) static EPOLLS: [AtomicU64; table::MAX_FD / 64] =
    [const { AtomicU64::new(0) }; table::MAX_FD / 64];
/// One bit per number with a [`Kick`] (so that closing it drops the kick).
pub(super) static KICKED: [AtomicU64; table::MAX_FD / 64] =
    [const { AtomicU64::new(0) }; table::MAX_FD / 64];

pub(super) fn bit(map: &'static [AtomicU64], fd: RawFd) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < table::MAX_FD)?;
    Some((&map[i / 64], 1u64 << (i % 64)))
}

pub(super) fn test(map: &'static [AtomicU64], fd: RawFd) -> bool {
    bit(map, fd).is_some_and(|(w, b)| w.load(Ordering::Acquire) & b != 0)
}

pub(super) fn set(map: &'static [AtomicU64], fd: RawFd, on: bool) {
    if let Some((w, b)) = bit(map, fd) {
        if on {
            w.fetch_or(b, Ordering::AcqRel);
        } else {
            w.fetch_and(!b, Ordering::AcqRel);
        }
    }
}

pub(super) fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn claim(st: &mut State, fd: RawFd, id: u64) {
    st.claims.insert(fd, id);
    set(&CLAIMED, fd, true);
}

pub(super) fn unclaim(st: &mut State, fd: RawFd) {
    st.claims.remove(&fd);
    set(&CLAIMED, fd, false);
}

pub(super) fn numbers_of(st: &State, id: u64) -> Vec<RawFd> {
    st.claims
        .iter()
        .filter(|&(_, &i)| i == id)
        .map(|(&d, _)| d)
        .collect()
}

pub(super) fn pid() -> u32 {
    std::process::id()
}

/// The pid whose watcher runs (0: none); a child inherits the value, not
/// the thread.
pub(super) static WATCHER: AtomicI32 = AtomicI32::new(0);
/// The watcher's wake-up eventfd (-1: none).
pub(super) static WAKE: AtomicI32 = AtomicI32::new(-1);

pub(super) fn wake() {
    let fd = WAKE.load(Ordering::Acquire);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 valid bytes to our eventfd.
        unsafe { (real().write)(fd, one.as_ptr().cast(), one.len()) };
    }
}
