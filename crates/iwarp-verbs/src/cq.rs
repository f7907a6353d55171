//! Completion queues (`struct ibv_cq`), and the one way to wait for them.
//!
//! A CQ is a FIFO of [`WorkCompletion`]s filled by the provider (driver
//! threads, or application threads that transmit in `post_send` or do
//! progress work) and drained by the application with
//! [`poll`](CompletionQueue::poll) / [`poll_one`](CompletionQueue::poll_one),
//! which never block (an empty CQ costs one atomic load).
//!
//! # Waiting
//!
//! There is one call, [`CompletionQueue::wait`] (and
//! [`wait_one`](CompletionQueue::wait_one) on top of it), plus one
//! descriptor for event loops, [`CompletionQueue::as_raw_fd`]. What they
//! do is set once per CQ with [`CompletionQueue::set_progress`], which
//! decides who does the receive work of the CQ's queue pairs while the
//! application waits ([`ProgressMode`]):
//!
//! | mode | who reads the sockets | `wait` | `as_raw_fd` |
//! |---|---|---|---|
//! | [`Threaded`](ProgressMode::Threaded) (default) | the provider's receive threads | polls (yielding) for `spin`, then sleeps until a completion arrives | an eventfd, readable while the CQ is non-empty |
//! | [`BusyPoll`](ProgressMode::BusyPoll) | the waiting thread, in a loop (the receive threads step aside) | never sleeps: does the receive work until a completion arrives | the same eventfd |
//! | [`AppDriven`](ProgressMode::AppDriven) | only application threads (the receive threads stay parked) | does the receive work, then sleeps in `poll(2)` on the sockets and the eventfd | an epoll set of the eventfd and the sockets; `poll` does the receive work when the CQ is empty |
//!
//! Threaded suits most programs, and is the only mode in which one-sided
//! operations (a peer's RDMA Write or Read) progress while no application
//! thread waits or polls. BusyPoll gives the lowest latency at the cost of
//! a CPU. AppDriven suits an event loop that waits for several things at
//! once (a CQ and an HTTP socket): the data is read by the thread that
//! wakes anyway, instead of waking a receive thread first, which on a
//! loaded machine saves a scheduling delay per message; the application
//! must then call `wait`, `poll` or [`progress`](CompletionQueue::progress)
//! whenever the fd is readable.
//!
//! [`progress`](CompletionQueue::progress) does the pending receive and
//! transmit work of the CQ's queue pairs from the calling thread and
//! returns at once: for a busy loop that spins on memory (an RDMA Write's
//! last byte) rather than on the CQ, in BusyPoll or AppDriven mode.
//!
//! The fd is level-triggered: register it for `POLLIN`, then call `poll`
//! until it returns 0. Do not `read` it: the CQ clears its eventfd when it
//! becomes empty. (This differs from `ibv_get_cq_event`, which is
//! edge-triggered and needs re-arming; a level-triggered fd cannot lose a
//! wake-up.) The eventfd's counter is changed only under the CQ mutex, on
//! the transitions empty → non-empty (write 1) and non-empty → empty
//! (read), so its readability always matches the queue.
//!
//! # Several threads on one CQ
//!
//! A completion arriving in an empty CQ wakes every thread sleeping in
//! `wait`, and makes the descriptor readable for every event loop that
//! watches it. A program whose threads take turns at one CQ (one handles
//! the completions while the other does I/O) decides itself whom a
//! completion wakes, with the completion hook
//! ([`set_completion_hook`](CompletionQueue::set_completion_hook)): the
//! hook declines (the descriptor the active thread's
//! `iwarp::wait::WaitSet` sleeps on becomes readable) or rings the other
//! thread's own descriptor. rdma-xfer does so (its `rdma/handoff.rs`);
//! that replaced the `WakePolicy::Newest` / `Attendance` rules of earlier
//! versions.
//!
//! # Interrupting a wait
//!
//! A thread that waits on a CQ for something a completion will change
//! (a stream's data, its send space) may also have to stop waiting when
//! another thread changes that state itself (a `shutdown` or `close`).
//! [`interrupt_waiters`](CompletionQueue::interrupt_waiters) ends every
//! [`wait_interruptible`](CompletionQueue::wait_interruptible) on the CQ
//! at once; each returns so that its caller looks at its state again
//! (plain [`wait`](CompletionQueue::wait) is not interrupted). No wake-up is lost between the caller's look and its
//! sleep: the caller takes an [`InterruptMark`] before it looks
//! ([`interrupt_mark`](CompletionQueue::interrupt_mark)) and waits with
//! that mark, and the wait returns [`CqWake::Interrupted`] at once if an interrupt came after the
//! mark (store-then-check on both sides: the interrupting thread changes
//! the state, then counts the interrupt; the waiter takes the mark, then
//! looks at the state). It costs nothing while nobody interrupts: the
//! wait is the CQ's own (a futex in threaded mode), with no descriptor
//! beside it.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use iwarp_proto::engine::WorkCompletion;

use crate::error::Error;
use crate::provider::CqSource;
use crate::sys::{Epoll, EventFd};

/// Where a CQ's interrupts stood ([`CompletionQueue::interrupt_mark`]):
/// a wait given a mark ends at once if
/// [`interrupt_waiters`](CompletionQueue::interrupt_waiters) was called
/// since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterruptMark(u64);

/// How [`CompletionQueue::wait_interruptible`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqWake {
    /// The CQ holds a completion.
    Completions,
    /// [`CompletionQueue::interrupt_waiters`] was called after the mark.
    Interrupted,
    /// The timeout passed.
    TimedOut,
}

/// How long `wait` polls before it sleeps, by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Who does the receive work of a CQ's queue pairs while the application
/// waits, and so what [`CompletionQueue::wait`] does (see the module docs
/// for a table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// The provider's receive threads read the sockets. `wait` polls the
    /// CQ (yielding the CPU) for up to `spin`, then sleeps until a
    /// completion arrives. The short poll saves the futex sleep/wake pair
    /// in request/response traffic, where a completion typically follows
    /// within microseconds; `Duration::ZERO` sleeps at once, which suits
    /// completions spaced further apart than a wake-up (a bulk transfer's
    /// per-block completions).
    Threaded {
        /// How long `wait` polls before it sleeps.
        spin: Duration,
    },
    /// `wait` does the receive work itself in a loop and never sleeps
    /// (until its timeout); while a thread does, the receive threads step
    /// aside (sleep in 1 ms slices) so that arriving data does not wake a
    /// second thread to compete for the CPU. They take over again at once
    /// when the CQ is switched to another mode, and within about two
    /// milliseconds when the application simply stops waiting.
    BusyPoll,
    /// Only application threads read the sockets; the provider's receive
    /// threads stay parked. `wait` does the receive work, polls for up to
    /// `spin`, then sleeps in `poll(2)` on [`CompletionQueue::as_raw_fd`],
    /// an epoll set of the CQ's eventfd and its connected queue pairs'
    /// sockets; `poll` and `poll_one` do the receive work when the CQ is
    /// empty. Nothing is received (not even a peer's one-sided RDMA Write,
    /// close or Terminate) until an application thread calls one of them.
    AppDriven {
        /// How long `wait` polls (doing the receive work) before it sleeps.
        spin: Duration,
    },
}

impl Default for ProgressMode {
    fn default() -> ProgressMode {
        ProgressMode::Threaded { spin: DEFAULT_SPIN }
    }
}

const MODE_THREADED: u8 = 0;
const MODE_BUSY: u8 = 1;
const MODE_DRIVEN: u8 = 2;

struct CqInner {
    depth: usize,
    len: AtomicUsize,
    queue: Mutex<VecDeque<WorkCompletion>>,
    cond: Condvar,
    efd: EventFd,
    /// Whether `efd` is readable now (changed only under `queue`), so that
    /// clearing an already clear descriptor costs no system call.
    efd_readable: AtomicBool,
    /// `as_raw_fd` was called: keep the eventfd in step with the queue.
    /// Until then the eventfd is left alone, which saves two system calls
    /// per empty/non-empty transition for applications that only poll or
    /// wait.
    fd_armed: AtomicBool,
    /// `set_fd_updates(false)` is in force: a consumer takes the
    /// completions itself, so the completion hook is not run for them.
    fd_paused: AtomicBool,
    /// Threads inside `wait`: `push` signals the condition variable only
    /// when someone sleeps on it.
    waiters: AtomicUsize,
    /// Calls of `interrupt_waiters` so far (changed only under `queue`,
    /// so that a waiter that checks it under `queue` and then sleeps on
    /// `cond` cannot miss one).
    interrupts: AtomicU64,
    /// [`ProgressMode`] as `MODE_*`, and its `spin` in nanoseconds.
    mode: AtomicU8,
    spin_ns: AtomicU64,
    /// The epoll set of application-driven mode (created on first use).
    epoll: OnceLock<Epoll>,
    overrun_logged: AtomicBool,
    /// The QPs whose completions come here, for
    /// [`CompletionQueue::progress`].
    sources: Mutex<Vec<Weak<dyn CqSource>>>,
    /// `attach` prunes `sources` of destroyed QPs when it reaches this
    /// length (twice what survived the last pruning, at least 16).
    sources_prune_at: AtomicUsize,
    /// The device CQ behind this one, for a provider that has one (the
    /// rdma-core provider's `ibv_cq`); set once at creation.
    hw: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    /// [`CompletionQueue::set_completion_hook`].
    hook: RwLock<Option<CompletionHook>>,
    /// Completions arrived in the empty queue and the hook has not run for
    /// them yet (only while a hook is set).
    hook_due: AtomicBool,
    /// A hook is set (checked by `push` without taking `hook`).
    hook_set: AtomicBool,
}

/// See [`CompletionQueue::set_completion_hook`].
pub type CompletionHook = Arc<dyn Fn() -> bool + Send + Sync>;

/// A handle that does not keep a [`CompletionQueue`] alive (for a
/// provider's thread that fills it).
#[derive(Clone)]
#[doc(hidden)]
pub struct WeakCq(Weak<CqInner>);

impl fmt::Debug for WeakCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakCq")
            .field("live", &(self.0.strong_count() > 0))
            .finish()
    }
}

impl WeakCq {
    #[doc(hidden)]
    pub fn upgrade(&self) -> Option<CompletionQueue> {
        self.0.upgrade().map(|inner| CompletionQueue { inner })
    }
}

impl CqInner {
    /// Make the eventfd readable (call with `queue` locked).
    fn efd_set(&self) {
        self.efd.set();
        self.efd_readable.store(true, Ordering::Relaxed);
    }

    /// Make the eventfd unreadable if it is readable (call with `queue`
    /// locked).
    fn efd_clear(&self) {
        if self.efd_readable.swap(false, Ordering::Relaxed) {
            self.efd.clear();
        }
    }
}

/// A completion queue. Cloning yields another handle to the same CQ.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.inner.depth)
            .field("len", &self.inner.len.load(Ordering::Relaxed))
            .field("fd", &self.inner.efd.as_raw_fd())
            .finish()
    }
}

impl CompletionQueue {
    #[doc(hidden)]
    pub fn new(depth: usize) -> Result<CompletionQueue, Error> {
        if depth == 0 {
            return Err(Error::ZeroDepth);
        }
        let efd = EventFd::new().map_err(Error::EventFd)?;
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                depth,
                len: AtomicUsize::new(0),
                queue: Mutex::new(VecDeque::with_capacity(depth)),
                cond: Condvar::new(),
                efd,
                efd_readable: AtomicBool::new(false),
                fd_armed: AtomicBool::new(false),
                fd_paused: AtomicBool::new(false),
                waiters: AtomicUsize::new(0),
                interrupts: AtomicU64::new(0),
                mode: AtomicU8::new(MODE_THREADED),
                spin_ns: AtomicU64::new(DEFAULT_SPIN.as_nanos() as u64),
                epoll: OnceLock::new(),
                overrun_logged: Default::default(),
                sources: Mutex::new(Vec::new()),
                sources_prune_at: AtomicUsize::new(16),
                hw: OnceLock::new(),
                hook: RwLock::new(None),
                hook_due: AtomicBool::new(false),
                hook_set: AtomicBool::new(false),
            }),
        })
    }

    /// Choose who does the receive work of this CQ's queue pairs while the
    /// application waits, and so what [`wait`](Self::wait),
    /// [`poll`](Self::poll) and [`as_raw_fd`](Self::as_raw_fd) do (see
    /// [`ProgressMode`] and the module docs). Set it before the queue pairs
    /// connect and before threads wait; it applies to queue pairs already
    /// connected too. A queue pair whose send and receive CQs differ is
    /// application-driven if either of them is.
    pub fn set_progress(&self, mode: ProgressMode) -> Result<(), Error> {
        let inner = &*self.inner;
        let (code, spin) = match mode {
            ProgressMode::Threaded { spin } => (MODE_THREADED, spin),
            ProgressMode::BusyPoll => (MODE_BUSY, Duration::ZERO),
            ProgressMode::AppDriven { spin } => (MODE_DRIVEN, spin),
        };
        if code == MODE_DRIVEN {
            let ep = self.epoll()?;
            // The eventfd must follow the queue from now on: it is in the
            // set that `wait` and event loops sleep on.
            self.as_raw_eventfd();
            ep.add(inner.efd.as_raw_fd()).map_err(Error::EventFd)?;
        }
        inner.spin_ns.store(
            spin.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        let old = inner.mode.swap(code, Ordering::AcqRel);
        if old != code {
            let driven = code == MODE_DRIVEN;
            let v = inner.sources.lock().unwrap_or_else(|e| e.into_inner());
            for s in v.iter().filter_map(Weak::upgrade) {
                if driven {
                    if let Some(fd) = s.wait_fd() {
                        self.watch(fd);
                    }
                }
                if driven || old == MODE_DRIVEN {
                    s.set_app_driven(driven);
                }
                if old == MODE_BUSY {
                    s.stop_progress();
                }
            }
        }
        Ok(())
    }

    /// The CQ's current [`ProgressMode`].
    pub fn progress_mode(&self) -> ProgressMode {
        let spin = Duration::from_nanos(self.inner.spin_ns.load(Ordering::Relaxed));
        match self.inner.mode.load(Ordering::Acquire) {
            MODE_BUSY => ProgressMode::BusyPoll,
            MODE_DRIVEN => ProgressMode::AppDriven { spin },
            _ => ProgressMode::Threaded { spin },
        }
    }

    /// True in [`ProgressMode::AppDriven`] (for the provider: a queue pair
    /// connecting to this CQ starts application-driven).
    #[doc(hidden)]
    #[inline]
    pub fn app_driven(&self) -> bool {
        self.inner.mode.load(Ordering::Acquire) == MODE_DRIVEN
    }

    fn epoll(&self) -> Result<&Epoll, Error> {
        if let Some(ep) = self.inner.epoll.get() {
            return Ok(ep);
        }
        let ep = Epoll::new().map_err(Error::EventFd)?;
        Ok(self.inner.epoll.get_or_init(|| ep))
    }

    /// A connected queue pair's descriptor joins the application-driven
    /// wait set (the provider calls this when the queue pair goes live).
    #[doc(hidden)]
    pub fn watch(&self, fd: RawFd) {
        if let Some(ep) = self.inner.epoll.get() {
            if let Err(e) = ep.add(fd) {
                tracing::warn!(fd, error = %e, "could not add a socket to the CQ's epoll set; waits on it rely on the eventfd and their timeouts");
            }
        }
    }

    /// The descriptor leaves the wait set (before it is closed: the
    /// provider calls this when the connection ends).
    #[doc(hidden)]
    pub fn unwatch(&self, fd: RawFd) {
        if let Some(ep) = self.inner.epoll.get() {
            ep.remove(fd);
        }
    }

    /// True if both handles are the same CQ.
    #[inline]
    pub fn same_as(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The depth the CQ was created with (`cqe`).
    #[inline]
    pub fn depth(&self) -> usize {
        self.inner.depth
    }

    /// Number of completions waiting.
    #[inline]
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// True if no completion is waiting.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[doc(hidden)]
    pub fn downgrade(&self) -> WeakCq {
        WeakCq(Arc::downgrade(&self.inner))
    }

    /// Attach the provider's device CQ (once).
    #[doc(hidden)]
    pub fn set_hw(&self, hw: Arc<dyn std::any::Any + Send + Sync>) {
        let _ = self.inner.hw.set(hw);
    }

    /// The provider's device CQ, if any.
    #[doc(hidden)]
    #[inline]
    pub fn hw(&self) -> Option<&Arc<dyn std::any::Any + Send + Sync>> {
        self.inner.hw.get()
    }

    #[doc(hidden)]
    pub fn push(&self, wc: WorkCompletion) {
        let inner = &*self.inner;
        let mut q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= inner.depth && !inner.overrun_logged.swap(true, Ordering::Relaxed) {
            // ibverbs would raise IBV_EVENT_CQ_ERR; we keep the completion
            // (losing it would hang the application) and say how to fix it.
            tracing::error!(
                depth = inner.depth,
                "CQ overrun: more completions than the CQ depth; create the CQ with a depth of at least the sum of the queue depths of its QPs"
            );
        }
        let was_empty = q.is_empty();
        q.push_back(wc);
        inner.len.store(q.len(), Ordering::Release);
        if was_empty {
            if inner.hook_set.load(Ordering::Acquire) {
                // The provider runs the hook once its locks are released
                // (`run_hook`); the descriptor is the hook's fallback.
                inner.hook_due.store(true, Ordering::Release);
            } else if inner.fd_armed.load(Ordering::Acquire) {
                inner.efd_set();
            }
            // Read under the queue lock: a waiter registers itself before it
            // takes the lock to check the queue, so none is missed.
            if inner.waiters.load(Ordering::SeqCst) > 0 {
                inner.cond.notify_all();
            }
        }
    }

    /// A QP whose completions go to this CQ (called once per CQ at QP
    /// creation). Entries of destroyed QPs are pruned when the list has
    /// doubled since the last pruning, so creating N queue pairs on one CQ
    /// costs O(N), not O(N^2) (a CQ shared by thousands of connections
    /// spent 6.6 % of a set-up benchmark's samples pruning at every
    /// attach: iwarp-connrate, 2,000 connections), and the list stays
    /// shorter than twice what survived the last pruning (at least 16).
    #[doc(hidden)]
    pub fn attach(&self, qp: Weak<dyn CqSource>) {
        let inner = &*self.inner;
        let mut v = inner.sources.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() >= inner.sources_prune_at.load(Ordering::Relaxed) {
            v.retain(|w| w.strong_count() > 0);
            inner
                .sources_prune_at
                .store((2 * v.len()).max(16), Ordering::Relaxed);
        }
        v.push(qp);
    }

    /// Do the pending receive and transmit work of this CQ's connected
    /// queue pairs from the calling thread: whatever their sockets hold now
    /// is read, placed into memory and completed, and a frame the socket
    /// could not take whole is pushed on. Returns at once (a queue pair
    /// another thread is reading is skipped). For loops that spin on memory
    /// rather than on the CQ, and for event loops that must let the peer's
    /// one-sided operations progress without taking completions, in
    /// [`ProgressMode::BusyPoll`] or [`ProgressMode::AppDriven`]. It costs
    /// a non-blocking `recv` per connected queue pair.
    pub fn progress(&self) {
        self.each_source(|s| s.progress());
    }

    /// Tell the receive threads of this CQ's QPs that the calling thread
    /// stops doing their work for now (it is about to sleep).
    fn stop_progress(&self) {
        self.each_source(|s| s.stop_progress());
    }

    /// `f` on every live QP of this CQ, unless another thread is walking
    /// the list right now (the list is only ever `try_lock`ed here).
    fn each_source(&self, f: impl Fn(&dyn CqSource)) {
        let Ok(v) = self.inner.sources.try_lock() else {
            return;
        };
        for w in v.iter() {
            if let Some(s) = w.upgrade() {
                f(&*s);
            }
        }
    }

    /// Move up to `out.len()` completions into `out`, oldest first; returns
    /// how many (`ibv_poll_cq`). Never blocks; an empty CQ costs one atomic
    /// load.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if out.is_empty() || !self.ready() {
            return 0;
        }
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        self.inner.len.store(q.len(), Ordering::Release);
        if n > 0 && q.is_empty() && self.inner.fd_armed.load(Ordering::Acquire) {
            self.inner.efd_clear();
        }
        n
    }

    /// The oldest completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        if !self.ready() {
            return None;
        }
        self.pop()
    }

    /// The oldest completion, if any, without doing receive work.
    fn pop(&self) -> Option<WorkCompletion> {
        if self.inner.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let wc = q.pop_front();
        self.inner.len.store(q.len(), Ordering::Release);
        if wc.is_some() && q.is_empty() && self.inner.fd_armed.load(Ordering::Acquire) {
            self.inner.efd_clear();
        }
        wc
    }

    /// True if the CQ holds a completion; in application-driven mode an
    /// empty CQ first gets the receive work done.
    fn ready(&self) -> bool {
        let inner = &*self.inner;
        if inner.len.load(Ordering::Acquire) > 0 {
            return true;
        }
        if inner.mode.load(Ordering::Relaxed) != MODE_DRIVEN {
            return false;
        }
        self.progress();
        inner.len.load(Ordering::Acquire) > 0
    }

    /// Block until the CQ is non-empty (`Ok(true)`) or `timeout` passes
    /// (`Ok(false)`); removes nothing. How it waits, and who does the
    /// receive work meanwhile, is the CQ's [`ProgressMode`].
    /// [`interrupt_waiters`](Self::interrupt_waiters) does not end this
    /// wait (it goes on to its timeout); a caller that must stop waiting
    /// when another thread changes its state uses
    /// [`wait_interruptible`](Self::wait_interruptible).
    pub fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
            match self.wait_interruptible(left, self.interrupt_mark())? {
                CqWake::Completions => return Ok(true),
                CqWake::TimedOut => return Ok(false),
                // Someone else's interrupt: wait on.
                CqWake::Interrupted => {}
            }
        }
    }

    /// Where this CQ's interrupts stand now, for
    /// [`wait_interruptible`](Self::wait_interruptible): take it before
    /// looking at the state that an interrupting thread changes (see the
    /// module docs, "Interrupting a wait").
    #[inline]
    pub fn interrupt_mark(&self) -> InterruptMark {
        InterruptMark(self.inner.interrupts.load(Ordering::SeqCst))
    }

    /// [`wait`](Self::wait), which also ends, with
    /// [`CqWake::Interrupted`], when
    /// [`interrupt_waiters`](Self::interrupt_waiters) has been called
    /// since `since` was taken, at once if that happened before this call.
    /// Completions take precedence over an interrupt, an interrupt over
    /// the timeout. In [`ProgressMode::AppDriven`] a wait asleep in
    /// `poll(2)` notices an interrupt within 100 ms (the re-arm slice of
    /// that mode); in the other modes at once.
    pub fn wait_interruptible(
        &self,
        timeout: Duration,
        since: InterruptMark,
    ) -> Result<CqWake, Error> {
        if self.inner.len.load(Ordering::Acquire) > 0 {
            return Ok(CqWake::Completions);
        }
        if self.interrupted(since) {
            return Ok(CqWake::Interrupted);
        }
        let deadline = Instant::now().checked_add(timeout);
        let spin = Duration::from_nanos(self.inner.spin_ns.load(Ordering::Relaxed));
        match self.inner.mode.load(Ordering::Acquire) {
            MODE_BUSY => Ok(self.wait_busy(deadline, since)),
            MODE_DRIVEN => self.wait_driven(deadline, spin, since),
            _ => Ok(self.wait_threaded(deadline, spin, since)),
        }
    }

    /// End every [`wait_interruptible`](Self::wait_interruptible) on this
    /// CQ, the ones asleep now and any given a mark taken before this
    /// call: each returns [`CqWake::Interrupted`] so that its caller looks
    /// at its own state again (plain [`wait`](Self::wait) goes on). Change
    /// that state first, then call this (see the module docs). Nothing is
    /// queued or removed; the descriptor is left alone. Costs the queue
    /// lock, and a futex wake when a thread sleeps in threaded mode.
    pub fn interrupt_waiters(&self) {
        let inner = &*self.inner;
        let _q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        inner.interrupts.fetch_add(1, Ordering::SeqCst);
        // Under the queue lock, as in `push`: a waiter registers before it
        // takes the lock to check, so a sleeper is never missed.
        if inner.waiters.load(Ordering::SeqCst) > 0 {
            inner.cond.notify_all();
        }
    }

    /// True if `interrupt_waiters` was called after `since` was taken.
    #[inline]
    fn interrupted(&self, since: InterruptMark) -> bool {
        self.inner.interrupts.load(Ordering::SeqCst) != since.0
    }

    /// Threads inside [`wait`](Self::wait) or
    /// [`wait_interruptible`](Self::wait_interruptible) in threaded mode
    /// that have registered to be woken (for tests: a thread counted here
    /// is asleep on the CQ or about to look at it under its lock).
    #[doc(hidden)]
    pub fn sleepers(&self) -> usize {
        self.inner.waiters.load(Ordering::SeqCst)
    }

    /// [`ProgressMode::BusyPoll`]: do the receive work until a completion
    /// arrives or an interrupt.
    fn wait_busy(&self, deadline: Option<Instant>, since: InterruptMark) -> CqWake {
        let mut spins = 0u32;
        let idle = self
            .inner
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .all(|w| w.strong_count() == 0);
        loop {
            self.progress();
            if self.inner.len.load(Ordering::Acquire) > 0 {
                return CqWake::Completions;
            }
            if self.interrupted(since) {
                return CqWake::Interrupted;
            }
            spins = spins.wrapping_add(1);
            // The clock is read every 64 rounds: a round is a `recv`.
            if spins.is_multiple_of(64) && deadline.is_some_and(|d| Instant::now() >= d) {
                return CqWake::TimedOut;
            }
            if idle {
                // No queue pair to progress: do not starve the threads
                // that will complete something.
                std::thread::yield_now();
            }
        }
    }

    /// [`ProgressMode::AppDriven`]: do the receive work, poll for `spin`,
    /// then sleep on the epoll set until something arrives.
    fn wait_driven(
        &self,
        deadline: Option<Instant>,
        spin: Duration,
        since: InterruptMark,
    ) -> Result<CqWake, Error> {
        let start = Instant::now();
        let ep = self.epoll()?.as_raw_fd();
        loop {
            self.progress();
            if self.inner.len.load(Ordering::Acquire) > 0 {
                return Ok(CqWake::Completions);
            }
            if self.interrupted(since) {
                return Ok(CqWake::Interrupted);
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) => d.saturating_duration_since(now),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Ok(CqWake::TimedOut);
            }
            if now.duration_since(start) < spin {
                std::hint::spin_loop();
                continue;
            }
            // Level-triggered: readable while a socket holds unread bytes
            // or the eventfd is set. The slice bounds a wait on a socket
            // that joined the set late, and the time an interrupt goes
            // unnoticed (nothing in the set is made readable for it).
            crate::sys::poll_one(ep, libc::POLLIN, left.min(Duration::from_millis(100)))
                .map_err(Error::EventFd)?;
        }
    }

    /// [`ProgressMode::Threaded`]: poll (yielding the CPU) for up to
    /// `spin`, then sleep on the condition variable until a completion, an
    /// interrupt after `since`, or the deadline.
    fn wait_threaded(
        &self,
        deadline: Option<Instant>,
        spin: Duration,
        since: InterruptMark,
    ) -> CqWake {
        // Spin briefly before sleeping: a completion usually follows within
        // a few microseconds of a request in a ping-pong, and a futex
        // sleep/wake pair costs more than that. Yielding keeps the driver
        // threads running on a busy machine.
        if !spin.is_zero() {
            let spin_until = Instant::now() + spin;
            while Instant::now() < spin_until && deadline.is_none_or(|d| Instant::now() < d) {
                if self.inner.len.load(Ordering::Acquire) > 0 {
                    return CqWake::Completions;
                }
                if self.interrupted(since) {
                    return CqWake::Interrupted;
                }
                std::thread::yield_now();
            }
        }
        // This thread may have been doing the receive work (`progress`);
        // hand it back before sleeping.
        self.stop_progress();
        self.inner.waiters.fetch_add(1, Ordering::SeqCst);
        let _registered = WaiterGuard(&self.inner.waiters);
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if !q.is_empty() {
                return CqWake::Completions;
            }
            // Under the queue lock, where `interrupt_waiters` counts: an
            // interrupt either is seen here or finds this thread asleep
            // on `cond` (registered in `waiters`) and wakes it.
            if self.interrupted(since) {
                return CqWake::Interrupted;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return CqWake::TimedOut;
            }
            q = self
                .inner
                .cond
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The descriptor to wait on in an event loop: readable (`POLLIN`,
    /// level-triggered) while the CQ is non-empty, and in
    /// [`ProgressMode::AppDriven`] also while a queue pair's socket has
    /// bytes for [`poll`](Self::poll) to process (an epoll set). Call
    /// `poll` until it returns 0 when it is readable; see the module docs.
    /// Set the progress mode first. Owned by the CQ: do not read from or
    /// close it.
    pub fn as_raw_fd(&self) -> RawFd {
        let efd = self.as_raw_eventfd();
        match self.inner.epoll.get() {
            Some(ep) if self.app_driven() => ep.as_raw_fd(),
            _ => efd,
        }
    }

    /// Have the provider's own threads (receive, transmit, device pump) call
    /// `hook` after they queued completions into this empty queue, once they
    /// hold none of the provider's locks, instead of making the descriptor
    /// ([`as_raw_fd`](Self::as_raw_fd)) readable. The hook returns whether it
    /// took care of the completions (polled them); when it returns false the
    /// descriptor is made readable as without a hook, so a thread that
    /// sleeps on it still wakes. Threads sleeping in [`wait`](Self::wait)
    /// are woken as before.
    ///
    /// This saves a thread hand-off per batch of completions for a consumer
    /// that can handle them on whatever thread produced them (the socket
    /// library updates a stream's state and readiness from the receive
    /// thread instead of waking its progress thread to do it). The hook
    /// runs on threads the application does not own, possibly while the
    /// provider's receive or transmit path waits for it: it must not block
    /// (take its own locks with `try_lock` and return false when busy) and
    /// may post work requests. It is not run while descriptor updates are
    /// paused ([`set_fd_updates`](Self::set_fd_updates)): the consumer that
    /// paused them takes the completions itself. `None` removes it.
    pub fn set_completion_hook(&self, hook: Option<CompletionHook>) {
        let inner = &*self.inner;
        let on = hook.is_some();
        *inner.hook.write().unwrap_or_else(|e| e.into_inner()) = hook;
        inner.hook_set.store(on, Ordering::Release);
        if !on {
            // Completions that were left for a hook now go to the descriptor.
            let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if inner.hook_due.swap(false, Ordering::AcqRel)
                && !q.is_empty()
                && inner.fd_armed.load(Ordering::Acquire)
            {
                inner.efd_set();
            }
        }
    }

    /// For the provider, holding none of its locks: run the hook if
    /// completions arrived for it; if it declines, make the descriptor
    /// readable. One relaxed load when nothing is due.
    #[doc(hidden)]
    #[inline]
    pub fn run_hook(&self) {
        // The common case, no hook due, is one relaxed load, inlined into
        // the provider's engine guard (another crate).
        if self.inner.hook_due.load(Ordering::Relaxed) {
            self.run_due_hook();
        }
    }

    #[cold]
    fn run_due_hook(&self) {
        let inner = &*self.inner;
        if !inner.hook_due.swap(false, Ordering::AcqRel) {
            return;
        }
        if inner.fd_paused.load(Ordering::Acquire) {
            // The consumer that paused the descriptor takes these itself
            // (see `set_fd_updates`); the socket library's hook would only
            // find it in a call and decline to act, after an upgrade and
            // a few more atomic operations, on every message's path.
            return;
        }
        let hook = inner.hook.read().unwrap_or_else(|e| e.into_inner()).clone();
        let handled = hook.is_some_and(|h| h());
        if !handled {
            let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if !q.is_empty() && inner.fd_armed.load(Ordering::Acquire) {
                inner.efd_set();
            }
        }
    }

    /// Pause (`false`) or resume (`true`) keeping the descriptor of
    /// [`as_raw_fd`](Self::as_raw_fd) in step with the queue (Threaded and
    /// BusyPoll modes). While paused, arriving completions do not make it
    /// readable, so an event loop that watches it (another thread) is not
    /// woken for completions that the caller, about to wait on the CQ
    /// itself, will take: on two cores the wake-up of that thread was most
    /// of a busy-polled ping-pong's time. The completion hook
    /// ([`set_completion_hook`](Self::set_completion_hook)) is not run for
    /// them either. Resuming brings the descriptor in step again at once
    /// (readable if completions are queued, a fresh edge for
    /// edge-triggered watchers). The descriptor part is only meaningful
    /// after `as_raw_fd`.
    pub fn set_fd_updates(&self, on: bool) {
        let inner = &*self.inner;
        let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        inner.fd_armed.store(on, Ordering::Release);
        inner.fd_paused.store(!on, Ordering::Release);
        if on {
            if q.is_empty() {
                inner.efd_clear();
            } else {
                inner.efd_set();
            }
        }
    }

    /// The eventfd, armed so that it follows the queue from now on.
    fn as_raw_eventfd(&self) -> RawFd {
        let inner = &*self.inner;
        if !inner.fd_armed.load(Ordering::Acquire) {
            // Arm under the queue lock so the fd matches the queue from now on.
            let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if !inner.fd_armed.swap(true, Ordering::AcqRel) && !q.is_empty() {
                inner.efd_set();
            }
        }
        inner.efd.as_raw_fd()
    }

    /// Wait up to `timeout` for one completion and return it.
    pub fn wait_one(&self, timeout: Duration) -> Result<Option<WorkCompletion>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            // `pop`, not `poll_one`: in application-driven mode `wait`
            // does the receive work first thing, so doing it here too
            // would cost a second `recv` per wait.
            if let Some(wc) = self.pop() {
                return Ok(Some(wc));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.wait(left)? {
                return Ok(self.poll_one());
            }
        }
    }
}

/// Unregisters a waiter when `wait` returns.
struct WaiterGuard<'a>(&'a AtomicUsize);

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AsRawFd for CompletionQueue {
    /// See [`CompletionQueue::as_raw_fd`].
    fn as_raw_fd(&self) -> RawFd {
        CompletionQueue::as_raw_fd(self)
    }
}
