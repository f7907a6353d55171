//! Stream calls and waiting: a call begins and ends ([`Call`]), and a
//! thread that must wait sleeps on (or busy-polls) the completion queue in
//! slices so that a close or shutdown from another thread is seen.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::types::{Conn, State, Waited, WAIT_SLICE};

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
            None => Duration::from_secs(3600),
        };
        // Wait on the completion queue itself, so that the receive thread
        // that queues the next completion wakes this thread directly (one
        // hand-over, as for a TCP reader); the progress thread keeps out
        // while anyone waits here (see `progress`). In busy-poll mode the
        // CQ's `wait` does the receive work itself. The wait is sliced so
        // that a local close or shutdown from another thread is seen too.
        self.cq_waiters.fetch_add(1, Ordering::AcqRel);
        drop(st);
        let _ = self.cq.wait(left.min(WAIT_SLICE));
        st = self.lock();
        self.cq_waiters.fetch_sub(1, Ordering::AcqRel);
        self.drain(&mut st);
        (st, Waited::Again)
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
        if self.in_call.fetch_add(1, Ordering::AcqRel) == 0 {
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
        if self.in_call.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.cq.set_fd_updates(true);
        }
        self.unlock_and_notify(st);
    }
}

/// Connects to an rsockets listener at `addr`.
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
