//! Stream calls and waiting: a call begins and ends ([`Call`]), and a
//! thread that must wait sleeps on the completion queue itself
//! (`CompletionQueue::wait_interruptible`: a futex, or in busy-poll mode
//! a spin that does the receive work), which a `shutdown` or `close` from
//! another thread interrupts (`CompletionQueue::interrupt_waiters`). No
//! slices: the wait ends at the caller's deadline or never.
//!
//! It waits on one thing, so it needs no `WaitSet`: a set of the CQ and a
//! wake descriptor cost every blocked call a descriptor armed for the
//! wait (an eventfd write by the receive thread, a read by the drain) and
//! a `poll(2)` over two descriptors, where the CQ's own wait is one futex
//! sleep and one wake (issue 28's last doubt, docs/WAITING.md).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use iwarp::CqWake;

use super::types::{Conn, State, Waited};

impl Conn {
    /// Waits for progress until `deadline` (None: forever); the lock is
    /// released meanwhile.
    pub(super) fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, Waited) {
        let left = match deadline {
            Some(d) => {
                let l = d.saturating_duration_since(Instant::now());
                if l.is_zero() {
                    return (st, Waited::TimedOut);
                }
                l
            }
            // `wait_interruptible` sleeps in bounded steps of its own;
            // this is "no deadline" to it (an hour, then it looks again).
            None => Duration::from_secs(3600),
        };
        // Wait on the completion queue itself, so that the receive thread
        // that queues the next completion wakes this thread directly (one
        // hand-over, as for a TCP reader); the progress thread keeps out
        // while anyone waits here (see `progress`). In busy-poll mode the
        // CQ's wait spins and does the receive work itself.
        //
        // The CQ's descriptor stays as it is: paused while a call is in
        // progress (`begin`), so neither the completion hook nor the
        // progress thread is woken for what this thread takes; `push`
        // wakes the CQ's sleepers whatever the descriptor does.
        //
        // No wake-up is lost to a `shutdown`/`close` (`wake_waiters`) or
        // to another waiter's drain: the mark is taken with the state
        // locked, after this thread looked at the state, and whoever
        // changes the state does so with it locked and interrupts after;
        // an interrupt after the mark ends the wait at once or wakes it.
        self.cq_waiters.fetch_add(1, Ordering::SeqCst);
        let mark = self.cq.interrupt_mark();
        drop(st);
        // An error of the wait itself (the AppDriven mode's epoll set,
        // which streams do not use) ends it like a spurious wake-up: the
        // caller looks at the stream and waits again.
        let woke = self.cq.wait_interruptible(left, mark);
        st = self.lock();
        self.cq_waiters.fetch_sub(1, Ordering::SeqCst);
        // Counted off before the drain, so this drain interrupts only the
        // other waiters (`drain` -> `wake_waiters`); the fence pairs with
        // the completion hook's (`on_completions`), which leaves what it
        // finds to a waiter it sees.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.drain(&mut st);
        if self.in_call.load(Ordering::SeqCst) == 0 {
            // `close` waits outside a call: completions the progress
            // thread left to this waiter go back to it.
            self.settle_parked();
        }
        let timed_out =
            matches!(woke, Ok(CqWake::TimedOut)) && deadline.is_some_and(|d| Instant::now() >= d);
        if timed_out {
            (st, Waited::TimedOut)
        } else {
            (st, Waited::Again)
        }
    }

    /// Wake every thread waiting in a call (`st` locked: the state they
    /// will look at has changed). A completion wakes every thread that
    /// sleeps on the CQ, but the first one to drain takes it, and the
    /// others would look at the queue, find it empty and sleep on, though
    /// the drain may have changed what they wait for (a reader's drain
    /// takes the credits a blocked writer waits for); so whoever changes
    /// the state while others wait calls this.
    pub(super) fn wake_waiters(&self, _st: &mut State) {
        if self.cq_waiters.load(Ordering::SeqCst) > 0 {
            self.cq.interrupt_waiters();
        }
    }

    /// The progress thread parked this stream (it stopped watching the
    /// CQ descriptor while a call waited on it): if completions are queued
    /// that no call will take now, hand the stream back to it.
    pub(super) fn settle_parked(&self) {
        if self.parked.load(Ordering::SeqCst) && !self.cq.is_empty() {
            self.unpark();
        }
    }

    /// Make the progress thread watch this stream's CQ again.
    pub(super) fn unpark(&self) {
        if self.parked.swap(false, Ordering::SeqCst) {
            crate::progress::resume();
        }
    }

    pub(super) fn check_broken(st: &State) -> io::Result<()> {
        match &st.broken {
            Some((k, why)) => Err(io::Error::new(*k, why.clone())),
            None => Ok(()),
        }
    }

    /// A thread starts a stream call: the first one pauses the CQ
    /// descriptor's updates (`CompletionQueue::set_fd_updates`), so the
    /// progress thread is not woken for completions this thread handles
    /// itself (on two cores those wake-ups cost a busy-polled ping-pong
    /// most of its time); the progress thread keeps out meanwhile. The
    /// returned [`Call`] keeps the state locked for the call's work and
    /// ends the call when dropped.
    pub(crate) fn begin(&self) -> Call<'_> {
        let st = self.lock();
        if self.in_call.fetch_add(1, Ordering::SeqCst) == 0 {
            self.cq.set_fd_updates(false);
        }
        Call {
            conn: self,
            st: Some(st),
        }
    }

    /// The call is over (`st` locked): handle what completed meanwhile,
    /// and the last one out resumes the descriptor (readable at once if
    /// completions arrived since), then runs due watermark callbacks.
    pub(super) fn end(&self, mut st: MutexGuard<'_, State>) {
        self.drain(&mut st);
        if self.in_call.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.cq.set_fd_updates(true);
            self.settle_parked();
        }
        self.unlock_and_notify(st);
    }
}

/// A stream call in progress, from [`Conn::begin`] to its drop
/// ([`Conn::end`]). It holds the state lock for the call's work, except
/// while the call waits or does receive work (then the lock is taken again
/// when next needed), and ends the call with the lock it holds: one lock
/// round trip for a call that neither waits nor polls, where separate
/// enter and leave steps took three.
pub(crate) struct Call<'a> {
    conn: &'a Conn,
    st: Option<MutexGuard<'a, State>>,
}

impl<'a> Call<'a> {
    /// The state, locked again if the call let it go.
    pub(super) fn st(&mut self) -> &mut MutexGuard<'a, State> {
        let conn = self.conn;
        self.st.get_or_insert_with(|| conn.lock())
    }

    /// Runs `f` with the state unlocked (it may lock it itself).
    pub(crate) fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.st = None;
        f()
    }

    /// [`Conn::wait`] for this call.
    pub(super) fn wait(&mut self, deadline: Option<Instant>) -> Waited {
        let conn = self.conn;
        let st = self.st.take().unwrap_or_else(|| conn.lock());
        let (st, waited) = conn.wait(st, deadline);
        self.st = Some(st);
        waited
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let conn = self.conn;
        let st = self.st.take().unwrap_or_else(|| conn.lock());
        conn.end(st);
    }
}
