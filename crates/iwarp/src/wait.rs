//! One way for an application to wait: completion queues plus outside
//! descriptors (an HTTP socket, a listener, a pipe), with a deadline.
//!
//! A [`WaitSet`] holds completion queues and file descriptors, each with a
//! [`Token`] the caller chooses. [`WaitSet::wait`] sleeps (or spins) until
//! at least one of them is ready or the deadline ([`Until`]) passes, and
//! reports which are ready ([`Wake::Ready`]) or that the deadline passed
//! ([`Wake::Timeout`]). It removes nothing: the caller then polls the CQs
//! ([`CompletionQueue::poll_one`]) and reads the descriptors itself.
//!
//! How it waits follows each CQ's [`ProgressMode`], so that the right
//! thread does the receive work (see the [`CompletionQueue`] module docs
//! for the modes themselves):
//!
//! | CQ mode | what `wait` does for it |
//! |---|---|
//! | [`Threaded`](ProgressMode::Threaded) | polls its length for up to its `spin`, then sleeps in `poll(2)` on its eventfd ([`CompletionQueue::as_raw_fd`], readable while it holds completions) |
//! | [`AppDriven`](ProgressMode::AppDriven) | calls [`CompletionQueue::progress`] first and on every wake-up, so the waiting thread reads the queue pairs' sockets; sleeps in `poll(2)` on the CQ's descriptor, an epoll set of its eventfd and those sockets |
//! | [`BusyPoll`](ProgressMode::BusyPoll) | never sleeps: spins on `progress` and the CQ's length up to the deadline, checking the other members with a zero-timeout `poll(2)` every few rounds, as the CQ's own busy wait does |
//!
//! A CQ that already holds a completion (or a descriptor already ready)
//! makes `wait` return at once, without sleeping. Every wait is bounded by
//! its [`Until`]: a deadline, or an explicit [`Until::Forever`]. There are
//! no slices the caller sees; internally a sleep on an application-driven
//! CQ is re-armed every 100 ms (a socket that joined its epoll set late
//! is noticed then, as in [`CompletionQueue::wait`]), and a
//! progress-only application-driven CQ that holds completions (its
//! descriptor is readable for them) is serviced every millisecond.
//!
//! A CQ joins either for its completions ([`CqInterest::Completions`]:
//! ready when it holds one) or only for its receive work
//! ([`CqInterest::Progress`]: the waiting thread reads its sockets, but its
//! completions do not end the wait, for a caller that waits for something
//! else, such as an HTTP answer, while a peer's RDMA Reads of its memory
//! must progress). The progress-only CQs of one set are expected to serve
//! the same queue pairs (a queue pair's send and receive CQs): while one
//! of them is empty, its descriptor covers their sockets.
//!
//! The descriptor of a CQ is level-triggered, and the set never reads or
//! closes any descriptor. It works against the public [`CompletionQueue`]
//! API only, and uses `poll(2)` (a set holds a handful of descriptors).
//!
//! # Example
//!
//! Wait for a Send to arrive on a loopback connection, or for a pipe to
//! become readable, whichever comes first:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use std::os::fd::AsRawFd;
//! use iwarp::cm::{self, ConnParam, Listener};
//! use iwarp::wait::{CqInterest, Interest, Token, Until, WaitSet, Wake};
//! use iwarp::{Access, Context, QpInitAttr, RecvWr, SendWr, SgList, WrOpcode};
//!
//! let t = Duration::from_secs(5);
//! let ctx = Context::open().unwrap();
//! let pd = ctx.alloc_pd();
//! let qp = |cq: &iwarp::CompletionQueue| {
//!     pd.create_qp(&QpInitAttr {
//!         send_cq: cq.clone(),
//!         recv_cq: cq.clone(),
//!         max_send_wr: 4,
//!         max_recv_wr: 4,
//!     })
//!     .unwrap()
//! };
//! let (ccq, scq) = (ctx.create_cq(8).unwrap(), ctx.create_cq(8).unwrap());
//! let (client, server) = (qp(&ccq), qp(&scq));
//! let mr = pd.reg_mr(64, Access::ALL).unwrap();
//! server
//!     .post_recv(&RecvWr { wr_id: 7, sgl: SgList::single(mr.sge(32, 32)) })
//!     .unwrap();
//! let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), Default::default()).unwrap();
//! let addr = listener.local_addr();
//! std::thread::scope(|s| {
//!     s.spawn(|| {
//!         let param = ConnParam { timeout: t, ..Default::default() };
//!         listener.get_request(Some(t)).unwrap().accept(&server, &param).unwrap();
//!     });
//!     let param = ConnParam { timeout: t, ..Default::default() };
//!     cm::connect(&client, addr, &param).unwrap();
//! });
//!
//! // An outside descriptor: the read end of a pipe nobody writes to yet.
//! let (pipe_r, _pipe_w) = std::io::pipe().unwrap();
//! let mut set = WaitSet::new();
//! set.add_cq(&scq, CqInterest::Completions, Token(1));
//! set.add_fd(pipe_r.as_raw_fd(), Interest::READABLE, Token(2));
//!
//! mr.write_at(0, b"hello");
//! let send = SendWr {
//!     wr_id: 1,
//!     opcode: WrOpcode::Send,
//!     sgl: SgList::single(mr.sge(0, 5)),
//!     signaled: false,
//!     solicited: false,
//! };
//! client.post_send(&send).unwrap();
//! match set.wait(Until::Deadline(Instant::now() + t)).unwrap() {
//!     Wake::Ready(events) => {
//!         assert!(events.iter().any(|e| e.token == Token(1)));
//!         assert_eq!(scq.poll_one().unwrap().wr_id, 7);
//!     }
//!     Wake::Timeout => panic!("no completion within {t:?}"),
//! }
//! ```

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::{CompletionQueue, ProgressMode};

/// The caller's name for a member of a [`WaitSet`], reported back when it
/// is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub usize);

/// Which readiness of an outside descriptor ends a wait (`poll(2)`
/// `POLLIN` / `POLLOUT`). Errors and hang-ups (`POLLERR`, `POLLHUP`) always
/// do, and are reported as both readable and writable, since the next read
/// or write will tell the caller what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    read: bool,
    write: bool,
}

impl Interest {
    /// Readable (`POLLIN`).
    pub const READABLE: Interest = Interest {
        read: true,
        write: false,
    };
    /// Writable (`POLLOUT`).
    pub const WRITABLE: Interest = Interest {
        read: false,
        write: true,
    };
    /// Either.
    pub const BOTH: Interest = Interest {
        read: true,
        write: true,
    };

    fn events(self) -> i16 {
        (if self.read { libc::POLLIN } else { 0 }) | (if self.write { libc::POLLOUT } else { 0 })
    }
}

/// What a completion queue is in a [`WaitSet`] for (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqInterest {
    /// The wait ends when the CQ holds a completion; its receive work is
    /// done meanwhile as its [`ProgressMode`] says.
    Completions,
    /// Only its receive work is done while the set waits (application-
    /// driven or busy-poll CQs; a threaded CQ's receive threads do it
    /// anyway); its completions do not end the wait and stay queued.
    Progress,
}

/// When a wait gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// At this instant ([`Wake::Timeout`]).
    Deadline(Instant),
    /// Never: only a ready member ends the wait.
    Forever,
}

impl Until {
    /// `timeout` from now (forever if that overflows the clock).
    pub fn after(timeout: Duration) -> Until {
        Instant::now()
            .checked_add(timeout)
            .map_or(Until::Forever, Until::Deadline)
    }

    fn left(self, now: Instant) -> Option<Duration> {
        match self {
            Until::Deadline(d) => Some(d.saturating_duration_since(now)),
            Until::Forever => None,
        }
    }

    fn passed(self, now: Instant) -> bool {
        matches!(self, Until::Deadline(d) if now >= d)
    }
}

impl From<Instant> for Until {
    fn from(d: Instant) -> Until {
        Until::Deadline(d)
    }
}

/// A ready member of a [`WaitSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The member's token.
    pub token: Token,
    /// A CQ holds completions; a descriptor is readable (or hung up).
    pub readable: bool,
    /// A descriptor is writable (or hung up); never set for a CQ.
    pub writable: bool,
}

/// The outcome of [`WaitSet::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake<'a> {
    /// These members are ready (at least one).
    Ready(&'a [Event]),
    /// The deadline passed and nothing was ready.
    Timeout,
}

impl Wake<'_> {
    /// True if the member with `token` is ready.
    pub fn is_ready(&self, token: Token) -> bool {
        match self {
            Wake::Ready(ev) => ev.iter().any(|e| e.token == token),
            Wake::Timeout => false,
        }
    }

    /// True if the deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Wake::Timeout)
    }
}

struct CqMember {
    cq: CompletionQueue,
    interest: CqInterest,
    token: Token,
}

struct FdMember {
    fd: RawFd,
    interest: Interest,
    token: Token,
}

/// Completion queues and descriptors to wait on together (see the module
/// docs). Reusable: members stay until removed.
#[derive(Default)]
pub struct WaitSet {
    cqs: Vec<CqMember>,
    fds: Vec<FdMember>,
    /// Scratch for `poll(2)`: the outside descriptors first, then the CQs'.
    pollfds: Vec<libc::pollfd>,
    ready: Vec<Event>,
    /// [`WaitSet::set_spin`].
    spin: Option<Duration>,
    /// [`WaitSet::set_interruptible`].
    interruptible: bool,
}

impl std::fmt::Debug for WaitSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitSet")
            .field("cqs", &self.cqs.iter().map(|m| m.token).collect::<Vec<_>>())
            .field(
                "fds",
                &self.fds.iter().map(|m| (m.fd, m.token)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// How many busy-poll rounds pass between zero-timeout checks of the
/// other members (a round is a non-blocking `recv` per queue pair; a
/// check is one `poll(2)`).
const BUSY_CHECK_EVERY: u32 = 16;

/// Longest sleep on an application-driven CQ's epoll set before it is
/// looked at again (a socket that joined the set late), as the CQ's own
/// `wait` does.
const DRIVEN_REARM: Duration = Duration::from_millis(100);

/// Longest sleep while a progress-only application-driven CQ holds
/// completions, so that its descriptor cannot be slept on and its
/// sockets still need reading.
const PROGRESS_ONLY_SERVICE: Duration = Duration::from_millis(1);

impl WaitSet {
    /// An empty set.
    pub fn new() -> WaitSet {
        WaitSet::default()
    }

    /// Add a completion queue. Set its [`ProgressMode`] first
    /// ([`CompletionQueue::set_progress`]); the set reads it at every
    /// wait. The CQ's descriptor ([`CompletionQueue::as_raw_fd`]) is armed
    /// the first time a wait sleeps on it (an armed eventfd costs a system
    /// call per empty/non-empty change of the queue, which a set that
    /// only spins or only does receive work does not need).
    pub fn add_cq(&mut self, cq: &CompletionQueue, interest: CqInterest, token: Token) {
        self.cqs.push(CqMember {
            cq: cq.clone(),
            interest,
            token,
        });
    }

    /// Add an outside descriptor. The set only `poll(2)`s it: the caller
    /// keeps it open while it is a member, and reads or writes it itself.
    pub fn add_fd(&mut self, fd: RawFd, interest: Interest, token: Token) {
        self.fds.push(FdMember {
            fd,
            interest,
            token,
        });
    }

    /// Remove every member with `token`.
    pub fn remove(&mut self, token: Token) {
        self.cqs.retain(|m| m.token != token);
        self.fds.retain(|m| m.token != token);
    }

    /// Remove every member.
    pub fn clear(&mut self) {
        self.cqs.clear();
        self.fds.clear();
    }

    /// How long a wait polls before it sleeps: `None` (the default) uses
    /// the longest `spin` of the member CQs' [`ProgressMode`]s;
    /// `Some(Duration::ZERO)` sleeps at once, for a caller whose wait is
    /// often ended by an outside descriptor (an answer that may not come
    /// through the CQ at all). Busy-poll CQs spin regardless.
    pub fn set_spin(&mut self, spin: Option<Duration>) {
        self.spin = spin;
    }

    /// Whether a signal that interrupts the sleep ends the wait with an
    /// error of kind [`io::ErrorKind::Interrupted`] (poll(2)'s `EINTR`),
    /// for a caller that implements `poll` itself (the sockets crate's
    /// `rpoll`); by default (`false`) it is taken for a spurious wake-up
    /// and the wait goes on until a member is ready or the deadline.
    pub fn set_interruptible(&mut self, on: bool) {
        self.interruptible = on;
    }

    /// True if the set has no member.
    pub fn is_empty(&self) -> bool {
        self.cqs.is_empty() && self.fds.is_empty()
    }

    /// Wait until a member is ready or `until` passes; see the module docs
    /// for what is done meanwhile for each CQ. A set without members
    /// sleeps until the deadline (forever is refused: it could never end).
    pub fn wait(&mut self, until: impl Into<Until>) -> io::Result<Wake<'_>> {
        let until = until.into();
        if self.is_empty() && until == Until::Forever {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "waiting forever on an empty WaitSet would never return; add a CQ or a descriptor, or give a deadline",
            ));
        }
        let ready = match self.only_cq() {
            Some(cq) => {
                // One CQ and nothing else: its own wait is the mechanism
                // its mode calls for (no descriptor to poll beside it).
                let left = until.left(Instant::now()).unwrap_or(Duration::MAX);
                let ready = cq
                    .wait(left)
                    .map_err(|e| io::Error::other(format!("waiting on a CQ: {e}")))?;
                self.ready.clear();
                if ready {
                    self.collect_cqs();
                }
                !self.ready.is_empty()
            }
            None => self.wait_inner(until)?,
        };
        Ok(if ready {
            Wake::Ready(&self.ready)
        } else {
            Wake::Timeout
        })
    }

    /// [`wait`](Self::wait) for `timeout` from now.
    pub fn wait_timeout(&mut self, timeout: Duration) -> io::Result<Wake<'_>> {
        self.wait(Until::after(timeout))
    }

    fn wait_inner(&mut self, until: Until) -> io::Result<bool> {
        let busy = self
            .cqs
            .iter()
            .any(|m| m.cq.progress_mode() == ProgressMode::BusyPoll);
        // The longest `spin` among the CQs that have one: poll before sleeping.
        let spin = self.spin.unwrap_or_else(|| self.spin_of_cqs());
        let start = Instant::now();
        let mut round = 0u32;
        loop {
            // Receive work of the CQs whose sockets the application reads,
            // then their lengths: a CQ that holds completions is ready
            // without sleeping.
            self.ready.clear();
            self.progress_cqs(busy);
            self.collect_cqs();
            if !self.ready.is_empty() {
                // Report the descriptors that are ready too (one
                // zero-timeout poll), so none is starved by a busy CQ.
                if !self.fds.is_empty() {
                    self.poll_fds(Some(Duration::ZERO), false)?;
                }
                return Ok(true);
            }
            let now = Instant::now();
            if busy || now.duration_since(start) < spin {
                // Spin: check the others with a zero-timeout poll every few
                // rounds (and on the first), the clock every round that polls.
                if round.is_multiple_of(BUSY_CHECK_EVERY) {
                    if self.poll_fds(Some(Duration::ZERO), true)? {
                        // An application-driven CQ's socket may have woken
                        // the poll without a completion yet: only a member
                        // in `ready` ends the wait.
                        self.collect_cqs();
                        if !self.ready.is_empty() {
                            return Ok(true);
                        }
                    }
                    if until.passed(Instant::now()) {
                        return Ok(false);
                    }
                }
                round = round.wrapping_add(1);
                if busy {
                    std::hint::spin_loop();
                } else {
                    // Threaded spin: leave the CPU to the receive threads.
                    std::thread::yield_now();
                }
                continue;
            }
            if until.passed(now) {
                // A descriptor already ready ends even a wait whose
                // deadline has passed (a zero timeout is a check, as
                // poll(2)'s is).
                if !self.fds.is_empty() {
                    self.poll_fds(Some(Duration::ZERO), false)?;
                }
                return Ok(!self.ready.is_empty());
            }
            let mut left = until.left(now);
            if let Some(cap) = self.sleep_cap() {
                left = Some(left.map_or(cap, |l| l.min(cap)));
            }
            if self.poll_fds(left, true)? {
                if self.cqs.is_empty() {
                    // Only descriptors: the poll that woke us reported
                    // every one that is ready (one system call per wake,
                    // not two).
                    if !self.ready.is_empty() {
                        return Ok(true);
                    }
                    continue;
                }
                // Woken: go round once more, so that an application-driven
                // CQ gets its receive work done and its length read.
                self.ready.clear();
                self.progress_cqs(false);
                self.collect_cqs();
                self.poll_fds(Some(Duration::ZERO), false)?;
                if !self.ready.is_empty() {
                    return Ok(true);
                }
            }
        }
    }

    /// The set's only member, if it is a CQ waited on for its completions
    /// with the CQ's own spin.
    fn only_cq(&self) -> Option<&CompletionQueue> {
        match (&self.cqs[..], &self.fds[..], self.spin) {
            ([m], [], None) if m.interest == CqInterest::Completions => Some(&m.cq),
            _ => None,
        }
    }

    /// One round of a busy wait without its checks: the receive work of
    /// the member CQs whose sockets the application reads (busy-poll and
    /// application-driven ones; [`CompletionQueue::progress`]). For a loop
    /// that spins on memory (an RDMA Write's last byte) rather than on a
    /// CQ, between its own checks; it returns at once.
    pub fn progress(&self) {
        self.progress_cqs(true);
    }

    /// The longest `spin` among the CQs that wait for completions.
    fn spin_of_cqs(&self) -> Duration {
        self.cqs
            .iter()
            .filter(|m| m.interest == CqInterest::Completions)
            .map(|m| match m.cq.progress_mode() {
                ProgressMode::Threaded { spin } | ProgressMode::AppDriven { spin } => spin,
                ProgressMode::BusyPoll => Duration::ZERO,
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Do the receive work of the application-driven and busy-poll CQs
    /// (`busy`: only while spinning is it done for busy-poll CQs every
    /// round; it always is for the application-driven ones).
    fn progress_cqs(&self, busy: bool) {
        for m in &self.cqs {
            match m.cq.progress_mode() {
                ProgressMode::AppDriven { .. } => m.cq.progress(),
                ProgressMode::BusyPoll if busy => m.cq.progress(),
                _ => {}
            }
        }
    }

    /// Add the CQs that hold completions (and are there for them) to `ready`.
    fn collect_cqs(&mut self) {
        for m in &self.cqs {
            if m.interest == CqInterest::Completions
                && !m.cq.is_empty()
                && !self.ready.iter().any(|e| e.token == m.token)
            {
                self.ready.push(Event {
                    token: m.token,
                    readable: true,
                    writable: false,
                });
            }
        }
    }

    /// The longest the next sleep may last, for the application-driven CQs.
    fn sleep_cap(&self) -> Option<Duration> {
        let mut cap = None::<Duration>;
        let mut progress_empty = false;
        let mut progress_full = false;
        for m in &self.cqs {
            if !matches!(m.cq.progress_mode(), ProgressMode::AppDriven { .. }) {
                continue;
            }
            cap = Some(cap.map_or(DRIVEN_REARM, |c| c.min(DRIVEN_REARM)));
            if m.interest == CqInterest::Progress {
                if m.cq.is_empty() {
                    progress_empty = true;
                } else {
                    progress_full = true;
                }
            }
        }
        if progress_full && !progress_empty {
            cap = Some(PROGRESS_ONLY_SERVICE);
        }
        cap
    }

    /// `poll(2)` the outside descriptors (and, with `with_cqs`, the CQs'
    /// descriptors) for up to `timeout` (`None`: no limit); record the
    /// ready descriptors in `ready`. True if any member woke the poll.
    fn poll_fds(&mut self, timeout: Option<Duration>, with_cqs: bool) -> io::Result<bool> {
        self.pollfds.clear();
        for m in &self.fds {
            self.pollfds.push(libc::pollfd {
                fd: m.fd,
                events: m.interest.events(),
                revents: 0,
            });
        }
        // The CQs' descriptors are needed only to sleep: a zero-timeout
        // check reads their lengths directly instead (`collect_cqs`).
        if with_cqs && timeout != Some(Duration::ZERO) {
            // A progress-only CQ is slept on only while it is empty (its
            // descriptor is readable for completions, which do not end the
            // wait); a busy-poll CQ's progress is done by spinning, but its
            // descriptor still says when a completion arrived.
            for m in &self.cqs {
                let driven = matches!(m.cq.progress_mode(), ProgressMode::AppDriven { .. });
                let fd = match m.interest {
                    CqInterest::Completions => m.cq.as_raw_fd(),
                    CqInterest::Progress if driven && m.cq.is_empty() => m.cq.as_raw_fd(),
                    // Threaded or busy-poll progress-only CQs need no
                    // sleep on them; a full application-driven one is
                    // covered by an empty one or by `sleep_cap`.
                    CqInterest::Progress => continue,
                };
                self.pollfds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        if self.pollfds.is_empty() {
            // Nothing to sleep on (only progress-only CQs that need none):
            // sleep out the time, bounded by the caller's deadline.
            if let Some(t) = timeout {
                std::thread::sleep(t);
            }
            return Ok(false);
        }
        let ms = match timeout {
            // Round up: a sub-millisecond remainder must not become a
            // zero-timeout poll repeated until the deadline.
            Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
            None => -1,
        };
        // SAFETY: `pollfds` is a live Vec of initialized pollfd structs and
        // its length is what we pass; poll(2) writes only their `revents`.
        let rc = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                ms,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            // poll(2): EINTR, a signal arrived; count it as a wake-up that
            // found nothing, the caller's loop looks again (unless the
            // caller asked to see it, `set_interruptible`).
            if e.kind() == io::ErrorKind::Interrupted && !self.interruptible {
                return Ok(false);
            }
            return Err(e);
        }
        if rc == 0 {
            return Ok(false);
        }
        for (m, p) in self.fds.iter().zip(&self.pollfds) {
            let hup = p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
            let readable = hup || p.revents & libc::POLLIN != 0;
            let writable = hup || p.revents & libc::POLLOUT != 0;
            if (readable || writable) && !self.ready.iter().any(|e| e.token == m.token) {
                self.ready.push(Event {
                    token: m.token,
                    readable,
                    writable,
                });
            }
        }
        Ok(true)
    }
}
