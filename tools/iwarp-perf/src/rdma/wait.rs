//! Bounded waiting, the CQs' progress mode and completion checks.

use std::time::{Duration, Instant};

use iwarp::wait::{CqInterest, Token, WaitSet, Wake};
use iwarp::{CompletionQueue, ProgressMode, WcOpcode, WcQueue, WcStatus, WorkCompletion};

use crate::params::Params;

use super::layout::{split_wrid, K_CREDIT, K_CTRL, K_DATA, K_RECV};

/// Bounded waiting, through [`iwarp::wait::WaitSet`]. Waiting for a
/// completion is the set's wait on that CQ, which does what the CQs'
/// progress mode says (set in `Side::new`: busy-poll or threaded, see
/// [`progress_mode`]); waiting for memory (an RDMA Write's last byte, a
/// credit word) spins here, with the set's busy round
/// ([`WaitSet::progress`]) between looks in busy-poll mode. Both give up
/// after `timeout` without progress.
pub(super) struct Waiter {
    /// Busy-poll mode: spinning on memory drives the receive work of this
    /// CQ's QPs from this thread ([`WaitSet::progress`]), as a wait does
    /// in `ProgressMode::BusyPoll` and as a spinning TCP reader reads its
    /// own socket. Every QP of a side reports to both of its CQs, so
    /// progressing one of them covers them all (each call is a `recv` per
    /// QP). `None`: the receive threads do it.
    busy: Option<WaitSet>,
    /// The set [`Waiter::wait_cq`] waits on, and the CQ in it.
    set: WaitSet,
    set_cq: Option<CompletionQueue>,
    pub(super) timeout: Duration,
    pub(super) last_progress: Instant,
    pub(super) spins: u32,
}

impl Waiter {
    pub(super) fn new(p: &Params, cq: &CompletionQueue) -> Waiter {
        Waiter {
            busy: p.busy_poll.then(|| {
                let mut set = WaitSet::new();
                set.add_cq(cq, CqInterest::Progress, Token(0));
                set
            }),
            set: WaitSet::new(),
            set_cq: None,
            timeout: p.timeout,
            last_progress: Instant::now(),
            spins: 0,
        }
    }

    pub(super) fn progress(&mut self) {
        self.spins = 0;
        self.last_progress = Instant::now();
    }

    /// Nothing happened while spinning on memory: do the receive work once
    /// (busy-poll) or spin / yield once; `Err` after `timeout` without
    /// progress.
    pub(super) fn idle(&mut self, what: &str) -> Result<(), String> {
        self.spins += 1;
        if self.spins & 1023 == 0 && self.last_progress.elapsed() > self.timeout {
            return Err(format!(
                "timed out after {:?} {what}: the peer stopped making progress (raise --timeout for slow links)",
                self.timeout
            ));
        }
        if let Some(set) = &self.busy {
            set.progress();
        } else if self.spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Wait until `cq` holds a completion (bounded by `timeout` since the
    /// last progress), as the CQ's progress mode says.
    pub(super) fn wait_cq(&mut self, cq: &CompletionQueue, what: &str) -> Result<(), String> {
        if !cq.is_empty() {
            return Ok(());
        }
        if !self.set_cq.as_ref().is_some_and(|c| c.same_as(cq)) {
            self.set.clear();
            self.set.add_cq(cq, CqInterest::Completions, Token(0));
            self.set_cq = Some(cq.clone());
        }
        let deadline = self.last_progress + self.timeout;
        match self.set.wait(deadline) {
            Ok(Wake::Ready(_)) => Ok(()),
            Ok(Wake::Timeout) => Err(format!(
                "timed out after {:?} {what}: no completion arrived (raise --timeout for slow links)",
                self.timeout
            )),
            Err(e) => Err(format!("waiting for a completion: {e}")),
        }
    }
}

/// The progress mode of a side's CQs: with `--busy-poll` the waiting
/// thread does the receive work itself and never sleeps; otherwise the
/// receive threads do it and `cq.wait` polls for
/// [`iwarp::DEFAULT_SPIN`] before it sleeps.
pub(super) fn progress_mode(p: &Params) -> ProgressMode {
    if p.busy_poll {
        ProgressMode::BusyPoll
    } else {
        ProgressMode::Threaded {
            spin: iwarp::DEFAULT_SPIN,
        }
    }
}

pub(super) fn empty_wc() -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        queue: WcQueue::Send,
        byte_len: 0,
        invalidated_rkey: None,
        solicited: false,
    }
}

pub(super) fn check_wc(wc: &WorkCompletion) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        return Ok(());
    }
    let (kind, qp, seq) = split_wrid(wc.wr_id);
    let what = match kind {
        K_DATA => "data operation",
        K_CTRL => "control message",
        K_CREDIT => "credit Write",
        K_RECV => "receive",
        _ => "work request",
    };
    Err(format!(
        "QP {qp}: {what} {seq} ({:?}) completed with status '{}'{}",
        wc.opcode,
        wc.status.as_str(),
        if wc.status == WcStatus::WrFlushErr {
            " (the connection went down: see the peer's error)"
        } else {
            ""
        }
    ))
}
