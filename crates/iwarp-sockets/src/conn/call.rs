//! Stream calls and waiting: a call begins and ends ([`Call`]), and a
//! thread that must wait sleeps (or, in busy-poll mode, spins) in one
//! [`WaitSet`] over the completion queue and the stream's wake
//! descriptor, which a `shutdown` or `close` from another thread signals.
//! No slices: the wait ends at the caller's deadline or never.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Instant;

use iwarp::wait::{CqInterest, Interest, Token, Until, WaitSet};
use iwarp::ProgressMode;

use super::types::{Conn, State, Waited};

/// The members of a call's [`WaitSet`].
const CQ: Token = Token(0);
const WAKE: Token = Token(1);

impl Conn {
    /// Waits for progress until `deadline` (None: forever); the lock is
    /// released meanwhile.
    pub(super) fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, Waited) {
        let until = match deadline {
            Some(d) => {
                if Instant::now() >= d {
                    return (st, Waited::TimedOut);
                }
                Until::Deadline(d)
            }
            None => Until::Forever,
        };
        // Wait on the completion queue itself, so that the receive thread
        // that queues the next completion wakes this thread directly (one
        // hand-over, as for a TCP reader); the progress thread keeps out
        // while anyone waits here (see `progress`). In busy-poll mode the
        // set spins on the CQ and does the receive work itself. The wake
        // descriptor ends the wait when another thread shuts the stream
        // down or closes it (`wake_waiters`).
        //
        // The CQ's descriptor must follow the queue while this thread
        // sleeps on it: a call pauses its updates (`begin`), so the first
        // waiter resumes them and the last one pauses them again, all
        // under the state lock (the completion hook declines while anyone
        // waits, `on_completions`, so the descriptor wakes us). A busy-poll
        // wait spins on the queue's length and needs no descriptor.
        let sleeps = self.cq.progress_mode() != ProgressMode::BusyPoll;
        if self.cq_waiters.fetch_add(1, Ordering::SeqCst) == 0
            && sleeps
            && self.in_call.load(Ordering::SeqCst) > 0
        {
            self.cq.set_fd_updates(true);
        }
        let seen = st.wake_gen;
        drop(st);
        let mut set = WaitSet::new();
        set.add_cq(&self.cq, CqInterest::Completions, CQ);
        set.add_fd(self.wake.fd(), Interest::READABLE, WAKE);
        // An error of poll(2) itself (EINVAL, ENOMEM) ends the wait like a
        // spurious wake-up: the caller looks at the stream and waits again.
        let timed_out = matches!(set.wait(until), Ok(w) if w.is_timeout());
        drop(set);
        st = self.lock();
        if seen != st.wake_gen {
            // This thread slept through a signal: the last such thread
            // back makes the descriptor unreadable (those that came after
            // the signal see it readable until then, and only look again).
            st.wake_pending = st.wake_pending.saturating_sub(1);
            if st.wake_pending == 0 {
                self.wake.clear();
            }
        }
        if self.cq_waiters.fetch_sub(1, Ordering::SeqCst) == 1
            && sleeps
            && self.in_call.load(Ordering::SeqCst) > 0
        {
            self.cq.set_fd_updates(false);
        }
        self.drain(&mut st);
        if self.in_call.load(Ordering::SeqCst) == 0 {
            // `close` waits outside a call: completions the progress
            // thread left to this waiter go back to it.
            self.settle_parked();
        }
        if timed_out {
            (st, Waited::TimedOut)
        } else {
            (st, Waited::Again)
        }
    }

    /// Wake every thread waiting in a call (`st` locked: the state they
    /// will look at has changed). A completion wakes every thread that
    /// sleeps on the CQ's descriptor, but the first one to drain can make
    /// it unreadable again before another has looked (poll(2) checks the
    /// descriptor again when it wakes), so whoever changes the state while
    /// others wait calls this.
    pub(super) fn wake_waiters(&self, st: &mut State) {
        let waiters = self.cq_waiters.load(Ordering::SeqCst);
        if waiters > 0 {
            st.wake_gen += 1;
            st.wake_pending = waiters;
            self.wake.signal();
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
        if self.in_call.fetch_add(1, Ordering::SeqCst) == 0
            && self.cq_waiters.load(Ordering::SeqCst) == 0
        {
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
