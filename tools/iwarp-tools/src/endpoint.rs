//! One side of a connection: the verbs objects a tool needs (context, PD,
//! one CQ shared by both queues as rping does, QP) plus bounded waits for
//! completions.
//!
//! Every wait has a deadline ([`Endpoint::timeout`]). Completions that
//! arrive while the tool waits for something else are kept and handed out
//! by a later [`Endpoint::wait_for`], so the order in which the CQ reports
//! a Send completion and a receive does not matter.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use iwarp::wait::{CqInterest, Interest, Token, WaitSet};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpEvent, QpInitAttr,
    QueuePair, RecvWr, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

use crate::error::ToolError;

/// Tokens of [`Endpoint::wait_for`]'s wait set.
const CQ: Token = Token(0);
const EVENTS: Token = Token(1);

/// Verbs objects of one connection.
pub struct Endpoint {
    // Field order is drop order: the QP disconnects before its CQ goes.
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub pd: ProtectionDomain,
    pub ctx: Context,
    /// Longest wait for any single completion or event.
    pub timeout: Duration,
    pending: RefCell<VecDeque<WorkCompletion>>,
    ignore_sends: Cell<bool>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("qp", &self.qp)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn verbs<T, E: std::fmt::Display>(what: &'static str, r: Result<T, E>) -> Result<T, ToolError> {
    r.map_err(|e| ToolError::Verbs {
        what,
        cause: e.to_string(),
    })
}

impl Endpoint {
    /// Open a context and create a PD, a CQ of `sq + rq` entries and a QP.
    pub fn new(
        max_send_wr: u32,
        max_recv_wr: u32,
        timeout: Duration,
    ) -> Result<Endpoint, ToolError> {
        let ctx = verbs("opening the RDMA device", crate::cli::open_context())?;
        let pd = ctx.alloc_pd();
        let cq = verbs(
            "create_cq",
            ctx.create_cq((max_send_wr + max_recv_wr) as usize * 2),
        )?;
        let qp = verbs(
            "create_qp",
            pd.create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr,
                max_recv_wr,
            }),
        )?;
        Ok(Endpoint {
            qp,
            cq,
            pd,
            ctx,
            timeout,
            pending: RefCell::new(VecDeque::new()),
            ignore_sends: Cell::new(false),
        })
    }

    /// Drop successful Send completions instead of keeping them (for a
    /// ping loop that never waits for them, as rping does not).
    pub fn ignore_send_completions(&self, ignore: bool) {
        self.ignore_sends.set(ignore);
    }

    /// Register a zeroed region of `len` bytes.
    pub fn reg(&self, len: usize, access: Access) -> Result<MemoryRegion, ToolError> {
        verbs("reg_mr", self.pd.reg_mr(len, access))
    }

    /// `ibv_post_send`.
    pub fn post_send(&self, what: &'static str, wr: &SendWr) -> Result<(), ToolError> {
        self.qp
            .post_send(wr)
            .map_err(|err| ToolError::Post { what, err })
    }

    /// `ibv_post_recv` of the whole of `[off, off + len)` of `mr`.
    pub fn post_recv(
        &self,
        what: &'static str,
        wr_id: u64,
        mr: &MemoryRegion,
        off: usize,
        len: usize,
    ) -> Result<(), ToolError> {
        let wr = RecvWr {
            wr_id,
            sgl: SgList::single(mr.sge(off, len)),
        };
        self.qp
            .post_recv(&wr)
            .map_err(|err| ToolError::Post { what, err })
    }

    /// Wait for the next successful completion of kind `opcode`.
    ///
    /// Other successful completions are kept for later calls. An error
    /// completion ends the wait: a flush means the connection is gone (the
    /// QP's events say why: a Terminate, or the peer closing).
    pub fn wait_for(
        &self,
        what: &'static str,
        opcode: WcOpcode,
    ) -> Result<WorkCompletion, ToolError> {
        {
            let mut pending = self.pending.borrow_mut();
            if let Some(i) = pending.iter().position(|wc| wc.opcode == opcode) {
                return Ok(pending.remove(i).expect("index from position"));
            }
        }
        let deadline = Instant::now() + self.timeout;
        // The CQ, and the QP's event descriptor: a QP that fails without
        // flushing anything (nothing outstanding) is noticed through its
        // event (a Terminate, the peer closing), not by a timeout.
        let mut set = WaitSet::new();
        set.add_cq(&self.cq, CqInterest::Completions, CQ);
        if let Some(fd) = self.qp.event_fd() {
            set.add_fd(fd, Interest::READABLE, EVENTS);
        }
        loop {
            while let Some(wc) = self.cq.poll_one() {
                tracing::trace!(?wc, "completion");
                if wc.status != WcStatus::Success {
                    return Err(self.completion_error(what, &wc));
                }
                if wc.opcode == opcode {
                    return Ok(wc);
                }
                if wc.opcode == WcOpcode::Send && self.ignore_sends.get() {
                    continue;
                }
                self.pending.borrow_mut().push_back(wc);
            }
            let wake = set.wait(deadline).map_err(|e| ToolError::Verbs {
                what: "waiting on the completion queue",
                cause: e.to_string(),
            })?;
            let (timeout, event) = (wake.is_timeout(), wake.is_ready(EVENTS));
            if event || timeout {
                // Events other than a failure (Established) are dropped.
                if let Some(err) = self.fatal_event(what) {
                    return Err(err);
                }
            }
            if timeout {
                return Err(ToolError::Timeout {
                    what,
                    after: self.timeout,
                });
            }
        }
    }

    /// Turn an error completion into the most precise error available.
    fn completion_error(&self, what: &'static str, wc: &WorkCompletion) -> ToolError {
        if wc.status == WcStatus::WrFlushErr {
            // Give the driver a moment to report why the QP flushed.
            let deadline = Instant::now() + Duration::from_millis(200);
            while let Some(ev) = self
                .qp
                .next_event(deadline.saturating_duration_since(Instant::now()))
            {
                match ev {
                    QpEvent::TerminateReceived(info) => {
                        return ToolError::TerminateReceived { what, info }
                    }
                    QpEvent::TerminateSent(info) => return ToolError::TerminateSent { what, info },
                    QpEvent::Disconnected => return ToolError::Disconnected { what },
                    _ => {}
                }
            }
            return ToolError::Disconnected { what };
        }
        ToolError::Completion {
            what,
            opcode: wc.opcode,
            status: wc.status,
        }
    }

    /// A Terminate or disconnect reported without any completion.
    fn fatal_event(&self, what: &'static str) -> Option<ToolError> {
        while let Some(ev) = self.qp.next_event(Duration::ZERO) {
            match ev {
                QpEvent::TerminateReceived(info) => {
                    return Some(ToolError::TerminateReceived { what, info })
                }
                QpEvent::TerminateSent(info) => {
                    return Some(ToolError::TerminateSent { what, info })
                }
                QpEvent::Disconnected => return Some(ToolError::Disconnected { what }),
                _ => {}
            }
        }
        None
    }

    /// Wait for a QP event that `accept` selects; other events are dropped.
    pub fn wait_event<T>(
        &self,
        what: &'static str,
        mut accept: impl FnMut(&QpEvent) -> Option<T>,
    ) -> Result<T, ToolError> {
        let start = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(ToolError::Timeout {
                    what,
                    after: self.timeout,
                });
            }
            if let Some(ev) = self.qp.next_event(left) {
                tracing::debug!(?ev, "QP event");
                if let Some(t) = accept(&ev) {
                    return Ok(t);
                }
            }
        }
    }
}
