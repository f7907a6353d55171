//! Completion queues (`struct ibv_cq`).
//!
//! A CQ is a FIFO of [`WorkCompletion`]s filled by the driver threads (and by
//! application threads that transmit in `post_send`) and drained by the
//! application.
//!
//! - **Busy polling.** [`CompletionQueue::poll`] first reads an atomic count;
//!   an empty CQ costs one atomic load and no lock. A busy-poll loop also
//!   calls [`CompletionQueue::progress`], which does the pending receive
//!   work of the CQ's QPs from the polling thread (non-blocking `recv`s,
//!   placement, completion), so it does not wait for a receive thread to
//!   be scheduled.
//! - **Blocking.** [`CompletionQueue::wait`] polls (yielding the CPU) for
//!   up to 50 µs, then sleeps on a condition variable until the CQ is
//!   non-empty or the timeout expires. The short poll saves the futex
//!   sleep/wake pair in request/response traffic, where the completion
//!   typically arrives within microseconds.
//! - **Who wakes.** By default a completion arriving in an empty CQ wakes
//!   every thread sleeping in `wait` ([`WakePolicy::All`]). With
//!   [`WakePolicy::Newest`] it wakes only the thread that started waiting
//!   last: a dedicated completion thread plus application threads that
//!   handle completions themselves while they wait then cost one wake-up
//!   per completion instead of two (the application thread gets them while
//!   it waits, the dedicated thread only while nobody else waits).
//! - **Event loops.** [`CompletionQueue::as_raw_fd`] is an `eventfd` that is
//!   readable exactly while the CQ holds completions (level-triggered, like a
//!   pipe with data in it). Register it with epoll/poll for `POLLIN`, then
//!   call `poll` until it returns 0. Do not `read` the fd yourself: the CQ
//!   clears it when it becomes empty. (This differs from
//!   `ibv_get_cq_event`, which is edge-triggered and needs re-arming; a
//!   level-triggered fd cannot lose a wake-up.)
//!
//! The eventfd's counter is changed only under the CQ mutex, on the
//! transitions empty → non-empty (write 1) and non-empty → empty (read),
//! so its readability always matches the queue.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use iwarp_proto::engine::WorkCompletion;

use crate::driver::Conn;
use crate::qp::QpShared;
use crate::sys::EventFd;
use crate::Error;

/// How long `wait` polls before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// Which sleeping threads a completion arriving in an empty CQ wakes (see
/// the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakePolicy {
    /// Every thread sleeping in [`CompletionQueue::wait`] (the default).
    All,
    /// Only the thread that started waiting most recently, except that
    /// threads in [`CompletionQueue::wait_background`] are woken only when
    /// no thread sleeps in [`wait`](CompletionQueue::wait). A thread woken
    /// this way must poll the CQ until it is empty (or wait again): the
    /// others are not woken for completions that arrive while the CQ is
    /// non-empty.
    Newest,
}

struct CqInner {
    depth: usize,
    len: AtomicUsize,
    queue: Mutex<VecDeque<WorkCompletion>>,
    cond: Condvar,
    efd: EventFd,
    /// `as_raw_fd` was called: keep the eventfd in step with the queue.
    /// Until then the eventfd is left alone, which saves two system calls
    /// per empty/non-empty transition for applications that only poll or
    /// wait.
    fd_armed: AtomicBool,
    /// Threads inside `wait`: `push` signals the condition variable only
    /// when someone sleeps on it.
    waiters: AtomicUsize,
    /// [`WakePolicy::Newest`] is set.
    wake_newest: AtomicBool,
    /// Under `WakePolicy::Newest`: the sleeping threads, background ones
    /// first, then the others oldest first; each with a number that tells
    /// them apart. Changed only while `queue` is
    /// locked (lock order `queue` → `sleepers`).
    sleepers: Mutex<Vec<(u64, Thread)>>,
    next_sleeper: AtomicU64,
    /// Live [`Attendance`] guards: background sleepers are not woken.
    attending: AtomicUsize,
    overrun_logged: AtomicBool,
    /// The QPs whose completions come here, for
    /// [`CompletionQueue::progress`].
    sources: Mutex<Vec<Weak<QpShared>>>,
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
    pub(crate) fn new(depth: usize) -> Result<CompletionQueue, Error> {
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
                fd_armed: AtomicBool::new(false),
                waiters: AtomicUsize::new(0),
                wake_newest: AtomicBool::new(false),
                sleepers: Mutex::new(Vec::new()),
                next_sleeper: AtomicU64::new(0),
                attending: AtomicUsize::new(0),
                overrun_logged: Default::default(),
                sources: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Under [`WakePolicy::Newest`], wake the newest sleeper; a background
    /// one only while nobody attends. Called with `queue` locked.
    fn wake_newest(&self) {
        let inner = &*self.inner;
        let mut sleepers = inner.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(&(id, _)) = sleepers.last() else {
            return;
        };
        if id & BACKGROUND != 0 && inner.attending.load(Ordering::SeqCst) > 0 {
            return;
        }
        if let Some((_, t)) = sleepers.pop() {
            t.unpark();
        }
    }

    /// Declare that the calling thread will poll this CQ soon (it handles
    /// completions between short pieces of work): until the guard is
    /// dropped, new completions do not wake threads in
    /// [`wait_background`](Self::wait_background). Dropping the guard wakes
    /// one if completions are waiting. Without [`WakePolicy::Newest`] this
    /// has no effect.
    pub fn attend(&self) -> Attendance<'_> {
        self.inner.attending.fetch_add(1, Ordering::SeqCst);
        Attendance(self)
    }

    /// Choose which sleeping threads a new completion wakes. Set it before
    /// threads wait; threads already asleep keep the policy they went to
    /// sleep under until they wake (at the latest when their timeout ends).
    pub fn set_wake_policy(&self, policy: WakePolicy) {
        self.inner
            .wake_newest
            .store(policy == WakePolicy::Newest, Ordering::Release);
    }

    /// True if both handles are the same CQ.
    pub fn same_as(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The depth the CQ was created with (`cqe`).
    pub fn depth(&self) -> usize {
        self.inner.depth
    }

    /// Number of completions waiting.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// True if no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn push(&self, wc: WorkCompletion) {
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
            if inner.fd_armed.load(Ordering::Acquire) {
                inner.efd.set();
            }
            // Read under the queue lock: a waiter registers itself before it
            // takes the lock to check the queue, so none is missed.
            if inner.wake_newest.load(Ordering::Acquire) {
                self.wake_newest();
            } else if inner.waiters.load(Ordering::SeqCst) > 0 {
                inner.cond.notify_all();
            }
        }
    }

    /// A QP whose completions go to this CQ (called once per CQ at QP
    /// creation).
    pub(crate) fn attach(&self, qp: &Arc<QpShared>) {
        let mut v = self.inner.sources.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(qp));
    }

    /// Do the receive work of the connected QPs attached to this CQ from
    /// the calling thread: whatever their sockets hold now is read, placed
    /// into memory and completed, without waiting for the stack's receive
    /// threads to be scheduled. Returns at once (a QP whose receive thread
    /// is busy is skipped). Call it in a busy-poll loop, whether the loop
    /// spins on [`poll`](Self::poll) or on memory (an RDMA Write's last
    /// byte). Progress never depends on it: the receive threads do the same
    /// work when nobody polls (RFC 5040 one-sided operations complete
    /// without the target application).
    ///
    /// It costs a non-blocking `recv` per connected QP of the CQ, which is
    /// why `poll`, `poll_one` and `wait` do not call it: an event-driven or
    /// bulk-transfer application that polls until empty and then sleeps
    /// would pay those system calls for nothing.
    ///
    /// Calling `progress` in a loop also marks the caller as a busy poller:
    /// the QPs' receive threads then step aside (sleep in 1 ms slices
    /// instead of waking for every arriving segment), leaving the CPU to the
    /// thread that is already reading, and take over again at once when the
    /// caller sleeps in [`wait`](Self::wait) or calls
    /// [`stop_progress`](Self::stop_progress) (within about a millisecond
    /// if it just stops calling).
    ///
    /// It also does transmit work: a frame that the socket could not take
    /// whole (a large Write or Read Response) is pushed on from the calling
    /// thread as the peer makes room.
    pub fn progress(&self) {
        self.each_conn(|qp, conn| conn.progress(qp));
    }

    /// Tell the receive threads of this CQ's QPs that the calling thread
    /// stops calling [`progress`](Self::progress) for now (it is about to
    /// sleep): a receive thread that stepped aside for the poller takes the
    /// receive work back at once instead of up to two milliseconds later.
    /// [`wait`](Self::wait) does this itself before it sleeps; call it
    /// before sleeping elsewhere, e.g. in `poll(2)` on
    /// [`as_raw_fd`](Self::as_raw_fd). Cheap (an atomic add per QP) and
    /// harmless when nobody polled.
    pub fn stop_progress(&self) {
        // Skipped while another thread is in `progress`: someone still
        // polls, so the receive threads may go on stepping aside (and that
        // thread hands back itself when it sleeps).
        self.each_conn(|_, conn| conn.stop_progress());
    }

    /// `f` on every connected QP of this CQ, unless another thread is
    /// walking the list right now (the list is only ever `try_lock`ed).
    fn each_conn(&self, f: impl Fn(&QpShared, &Conn)) {
        let Ok(v) = self.inner.sources.try_lock() else {
            return;
        };
        for w in v.iter() {
            if let Some(qp) = w.upgrade() {
                if let Some(conn) = qp.conn.get() {
                    f(&qp, conn);
                }
            }
        }
    }

    /// Move up to `out.len()` completions into `out`, oldest first; returns
    /// how many (`ibv_poll_cq`). Never blocks; an empty CQ costs one atomic
    /// load.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if out.is_empty() || self.inner.len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        self.inner.len.store(q.len(), Ordering::Release);
        if n > 0 && q.is_empty() && self.inner.fd_armed.load(Ordering::Acquire) {
            self.inner.efd.clear();
        }
        n
    }

    /// The oldest completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        if self.inner.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let wc = q.pop_front();
        self.inner.len.store(q.len(), Ordering::Release);
        if wc.is_some() && q.is_empty() && self.inner.fd_armed.load(Ordering::Acquire) {
            self.inner.efd.clear();
        }
        wc
    }

    /// Block until the CQ is non-empty (`Ok(true)`) or `timeout` passes
    /// (`Ok(false)`). Does not remove anything.
    pub fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        self.wait_spin(timeout, SPIN)
    }

    /// [`wait`](Self::wait) with the polling phase set by the caller: poll
    /// (yielding the CPU) for up to `spin`, then sleep. `Duration::ZERO`
    /// sleeps at once, which suits a thread that waits for completions
    /// spaced further apart than a futex wake-up (a bulk transfer's
    /// per-block completions): polling there burns CPU for every wait and
    /// rarely saves a sleep.
    pub fn wait_spin(&self, timeout: Duration, spin: Duration) -> Result<bool, Error> {
        if self.inner.len.load(Ordering::Acquire) > 0 {
            return Ok(true);
        }
        // Spin briefly before sleeping: a completion usually follows within
        // a few microseconds of a request in a ping-pong, and a futex
        // sleep/wake pair costs more than that. Yielding keeps the driver
        // threads running on a busy machine.
        if !spin.is_zero() {
            let spin_until = Instant::now() + spin.min(timeout);
            while Instant::now() < spin_until {
                if self.inner.len.load(Ordering::Acquire) > 0 {
                    return Ok(true);
                }
                std::thread::yield_now();
            }
        }
        // This thread may have been doing the receive work (`progress`);
        // hand it back before sleeping.
        self.stop_progress();
        let deadline = Instant::now().checked_add(timeout);
        if self.inner.wake_newest.load(Ordering::Acquire) {
            return Ok(self.sleep_newest(deadline, false));
        }
        self.inner.waiters.fetch_add(1, Ordering::SeqCst);
        let _registered = WaiterGuard(&self.inner.waiters);
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if !q.is_empty() {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Ok(false);
            }
            q = self
                .inner
                .cond
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// [`wait_spin`](Self::wait_spin) with no polling phase, for a thread
    /// that handles completions only while no other thread waits for them:
    /// under [`WakePolicy::Newest`] a new completion wakes it only if no
    /// thread sleeps in [`wait`](Self::wait) or `wait_spin`. Under
    /// [`WakePolicy::All`] it is `wait_spin(timeout, Duration::ZERO)`.
    pub fn wait_background(&self, timeout: Duration) -> Result<bool, Error> {
        if !self.inner.wake_newest.load(Ordering::Acquire) {
            return self.wait_spin(timeout, Duration::ZERO);
        }
        if self.inner.len.load(Ordering::Acquire) > 0 {
            return Ok(true);
        }
        self.stop_progress();
        Ok(self.sleep_newest(Instant::now().checked_add(timeout), true))
    }

    /// Sleep until the CQ is non-empty or `deadline`, on the stack of
    /// sleepers that `push` wakes from the top ([`WakePolicy::Newest`]).
    fn sleep_newest(&self, deadline: Option<Instant>, background: bool) -> bool {
        let inner = &*self.inner;
        let me = inner.next_sleeper.fetch_add(1, Ordering::Relaxed)
            | if background { BACKGROUND } else { 0 };
        loop {
            let left = {
                let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                let mut sleepers = inner.sleepers.lock().unwrap_or_else(|e| e.into_inner());
                // A wake-up pops its sleeper, so after one this thread is no
                // longer listed; after a timeout or a spurious return it
                // still is.
                sleepers.retain(|(id, _)| *id != me);
                if !q.is_empty() {
                    return true;
                }
                let left = match deadline {
                    Some(d) => d.saturating_duration_since(Instant::now()),
                    None => Duration::from_secs(3600),
                };
                if left.is_zero() {
                    return false;
                }
                // Registered under the queue lock, so a `push` after this
                // point sees this thread; an `unpark` that comes before the
                // `park` below makes it return at once.
                if background {
                    sleepers.insert(0, (me, std::thread::current()));
                } else {
                    sleepers.push((me, std::thread::current()));
                }
                left
            };
            std::thread::park_timeout(left);
        }
    }

    /// An eventfd that is readable (`POLLIN`) exactly while the CQ is
    /// non-empty (level-triggered); see the module docs. Owned by the CQ:
    /// do not read from or close it.
    pub fn as_raw_fd(&self) -> RawFd {
        let inner = &*self.inner;
        if !inner.fd_armed.load(Ordering::Acquire) {
            // Arm under the queue lock so the fd matches the queue from now on.
            let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if !inner.fd_armed.swap(true, Ordering::AcqRel) && !q.is_empty() {
                inner.efd.set();
            }
        }
        inner.efd.as_raw_fd()
    }

    /// Wait up to `timeout` for one completion and return it.
    pub fn wait_one(&self, timeout: Duration) -> Result<Option<WorkCompletion>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.poll_one() {
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
/// Marks a background sleeper's number (see `CqInner::sleepers`).
const BACKGROUND: u64 = 1 << 63;

/// See [`CompletionQueue::attend`].
#[must_use = "attendance ends when the guard is dropped"]
#[derive(Debug)]
pub struct Attendance<'a>(&'a CompletionQueue);

impl Drop for Attendance<'_> {
    fn drop(&mut self) {
        let cq = self.0;
        if cq.inner.attending.fetch_sub(1, Ordering::SeqCst) == 1
            && cq.inner.wake_newest.load(Ordering::Acquire)
        {
            // A completion that came while attended woke nobody: hand it to
            // a background sleeper now.
            let q = cq.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if !q.is_empty() {
                cq.wake_newest();
            }
        }
    }
}

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
