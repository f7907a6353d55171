//! Queue pairs (`struct ibv_qp`): the verbs face of one RDMAP endpoint.
//!
//! A [`QueuePair`] is a handle on a provider's queue pair
//! ([`QpOps`](crate::provider::QpOps)) plus the two completion queues its
//! completions go to. It is created in [`QpState::Init`] by
//! `iwarp::ProtectionDomain::create_qp` and
//! connected by the provider's connection manager ([`crate::cm`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp_proto::engine::{
    PostError, QpState, RecvWr, SendWr, SgList, WcQueue, WcStatus, WorkCompletion, WrOpcode,
};

use crate::cq::CompletionQueue;
use crate::provider::QpOps;
pub use crate::provider::{ConnInfo, QpEvent, QpStats};

/// Attributes of a new queue pair (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    /// CQ for send-queue completions.
    pub send_cq: CompletionQueue,
    /// CQ for receive-queue completions.
    pub recv_cq: CompletionQueue,
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
}

/// A queue pair. Created in [`QpState::Init`] by
/// `iwarp::ProtectionDomain::create_qp`;
/// connected by `iwarp::cm::connect` or `iwarp::cm::ConnRequest::accept`.
///
/// Dropping it disconnects it (like `rdma_destroy_qp` after
/// `rdma_disconnect`): outstanding work requests are flushed into the CQs and
/// the provider's threads exit.
pub struct QueuePair {
    #[doc(hidden)]
    pub ops: Arc<dyn QpOps>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ops.fmt(f)
    }
}

impl QueuePair {
    #[doc(hidden)]
    pub fn new(
        ops: Arc<dyn QpOps>,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
    ) -> QueuePair {
        QueuePair {
            ops,
            send_cq,
            recv_cq,
        }
    }

    /// The QP number (unique within the process; for logs).
    pub fn qp_num(&self) -> u32 {
        self.ops.qp_num()
    }

    /// Post a send-queue work request (`ibv_post_send`). On a connected QP
    /// the calling thread writes the frames itself when the socket has room
    /// (lowest latency), otherwise the provider's transmit thread does; this
    /// call never blocks on the network.
    ///
    /// By state:
    /// - [`QpState::Rts`]: queued and executed; failures after posting
    ///   arrive as error completions.
    /// - [`QpState::Error`] and [`QpState::Closed`] (after
    ///   [`disconnect`](QueuePair::disconnect)): accepted and completed at
    ///   once with [`WcStatus::WrFlushErr`], signaled or not, with the
    ///   request's own opcode and a byte count of 0, after the completions
    ///   of the requests posted before it; nothing is sent. This is what
    ///   Linux siw does for kernel consumers (`siw_post_send` →
    ///   `siw_sq_flush_wr`) and what `ib_drain_qp` relies on (see
    ///   [`QueuePair::drain`]); the rdma-core provider completes such a
    ///   request itself, since a device's user-space queue is no longer
    ///   read in ERR (see docs/RDMA_CORE.md). If the send CQ already holds
    ///   its depth, the request is refused with [`PostError::CqFull`]
    ///   (siw: `ENOMEM`).
    /// - [`QpState::Init`]: the software provider queues the request until
    ///   the connection is established; an rdma-core device refuses it
    ///   ([`PostError::QpError`]: siw answers `ENOTCONN` before RTS), so
    ///   portable code posts sends once connected.
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        self.ops.post_send(std::slice::from_ref(wr))
    }

    /// Post several send-queue work requests at once (`ibv_post_send` with a
    /// chained list): they are queued under one lock and transmitted
    /// together. On `Err`, the error names the first refused request; the
    /// ones before it were posted, the ones after it were not (the
    /// `bad_wr` semantics of ibverbs).
    pub fn post_send_list(&self, wrs: &[SendWr]) -> Result<(), PostError> {
        self.ops.post_send(wrs)
    }

    /// Post several receives at once (`ibv_post_recv` with a chained list);
    /// `bad_wr` semantics as in [`QueuePair::post_send_list`].
    pub fn post_recv_list(&self, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.ops.post_recv(wrs)
    }

    /// Post a receive (`ibv_post_recv`); allowed from [`QpState::Init`] on,
    /// so buffers can be in place before the connection exists.
    ///
    /// In [`QpState::Error`] and [`QpState::Closed`] the receive is accepted
    /// and completed at once with [`WcStatus::WrFlushErr`] and a byte count
    /// of 0 (siw `siw_post_receive` → `siw_rq_flush_wr`, which
    /// `ib_drain_rq` relies on), or refused with [`PostError::CqFull`] if
    /// the receive CQ already holds its depth, as for
    /// [`QueuePair::post_send`].
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.ops.post_recv(std::slice::from_ref(wr))
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.ops.state()
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.recv_cq
    }

    /// Local address of the connection, once connected.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.ops.local_addr()
    }

    /// Peer address of the connection, once connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.ops.peer_addr()
    }

    /// What the MPA handshake negotiated, once connected.
    pub fn conn_info(&self) -> Option<ConnInfo> {
        self.ops.conn_info()
    }

    /// Byte counters of the provider's driver.
    pub fn stats(&self) -> QpStats {
        self.ops.stats()
    }

    /// Wait up to `timeout` for the next [`QpEvent`].
    pub fn next_event(&self, timeout: Duration) -> Option<QpEvent> {
        self.ops.next_event(timeout)
    }

    /// A descriptor that is readable (`POLLIN`, level-triggered) while
    /// [`QpEvent`]s wait for [`next_event`](Self::next_event), for an
    /// event loop or an `iwarp::wait::WaitSet`
    /// that must notice a queue pair failing (a Terminate, the peer
    /// closing) while nothing is outstanding to be flushed. Owned by the
    /// queue pair: do not read or close it. `None` for a provider without
    /// one (the rdma-core provider).
    pub fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.ops.event_fd()
    }

    /// Disconnect (`rdma_disconnect`): the QP stops accepting work, every
    /// outstanding work request is flushed with
    /// [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr), queued frames
    /// get up to `iwarp::soft::LINGER` to leave, the socket is shut down
    /// and the provider's threads are joined (bounded wait). Idempotent.
    pub fn disconnect(&self) {
        self.ops.disconnect();
    }

    /// Drain the queue pair, as the kernel's `ib_drain_qp` does: move it to
    /// the error state ([`disconnect`](QueuePair::disconnect), which for
    /// iWARP is what `rdma_disconnect` does), post a marker on each queue
    /// (a zero-length RDMA Write and a receive without buffers, both with
    /// `wr_id` [`DRAIN_WR_ID`]), and wait until both come back flushed.
    /// Work requests complete in order per queue, so once the markers are
    /// back every request posted before has completed, and its buffers may
    /// be reused or freed, on every device (rdma-core's soft-RoCE flushes
    /// asynchronously, after `disconnect` returns).
    ///
    /// Returns every completion taken from the QP's CQs on the way, oldest
    /// first, without the two markers; a CQ shared with another QP gives
    /// that QP's completions too. Call it while no other thread polls these
    /// CQs (a marker another thread takes is missed, and the drain times
    /// out), and do not use [`DRAIN_WR_ID`] for your own requests. As with
    /// any error completion from an rdma-core device, only `wr_id` and
    /// `status` of a flush the device made are meaningful (ibv_poll_cq(3):
    /// rxe leaves the opcode unset); the software provider fills in the
    /// request's opcode too.
    pub fn drain(&self, timeout: Duration) -> Result<Vec<WorkCompletion>, DrainError> {
        let deadline = Instant::now() + timeout;
        self.disconnect();
        let mut taken = Vec::new();
        let (mut sq_done, mut rq_done) = (false, false);
        // A flushed post into a full CQ is refused (PostError::CqFull):
        // empty the CQs first.
        self.take_completions(&mut taken, &mut sq_done, &mut rq_done);
        // ib_drain_sq / ib_drain_rq: a zero-length RDMA Write (siw flushes
        // it without looking at it) and a receive without buffers.
        self.post_send(&SendWr {
            wr_id: DRAIN_WR_ID,
            opcode: WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            sgl: SgList::new(),
            signaled: true,
            solicited: false,
        })
        .map_err(DrainError::Post)?;
        self.post_recv(&RecvWr {
            wr_id: DRAIN_WR_ID,
            sgl: SgList::new(),
        })
        .map_err(DrainError::Post)?;
        loop {
            self.take_completions(&mut taken, &mut sq_done, &mut rq_done);
            if sq_done && rq_done {
                return Ok(taken);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DrainError::Timeout {
                    timeout,
                    send_queue: sq_done,
                    recv_queue: rq_done,
                    taken,
                });
            }
            let cq = if sq_done {
                &self.recv_cq
            } else {
                &self.send_cq
            };
            cq.wait(left).map_err(DrainError::Wait)?;
        }
    }

    /// Everything the QP's CQs hold, into `taken`; the drain markers set
    /// their queue's flag instead.
    fn take_completions(
        &self,
        taken: &mut Vec<WorkCompletion>,
        sq_done: &mut bool,
        rq_done: &mut bool,
    ) {
        let cqs: &[&CompletionQueue] = if self.recv_cq.same_as(&self.send_cq) {
            &[&self.send_cq]
        } else {
            &[&self.send_cq, &self.recv_cq]
        };
        for cq in cqs {
            while let Some(wc) = cq.poll_one() {
                if wc.wr_id == DRAIN_WR_ID && wc.status == WcStatus::WrFlushErr {
                    match wc.queue {
                        WcQueue::Send => *sq_done = true,
                        WcQueue::Recv => *rq_done = true,
                    }
                } else {
                    taken.push(wc);
                }
            }
        }
    }
}

/// The `wr_id` of the two markers [`QueuePair::drain`] posts. The software
/// provider also keeps `u64::MAX` and `u64::MAX - 1` for requests of its
/// own; use none of the three.
pub const DRAIN_WR_ID: u64 = u64::MAX - 2;

/// Why [`QueuePair::drain`] did not finish. `Display` names the cause and
/// the fix.
#[derive(Debug)]
#[non_exhaustive]
pub enum DrainError {
    /// Posting a marker was refused.
    Post(PostError),
    /// Waiting on a CQ failed.
    Wait(crate::error::Error),
    /// A marker did not come back within `timeout`; the flags say which
    /// came back, `taken` holds the completions taken meanwhile.
    Timeout {
        timeout: Duration,
        send_queue: bool,
        recv_queue: bool,
        taken: Vec<WorkCompletion>,
    },
}

impl fmt::Display for DrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainError::Post(e) => write!(f, "draining the queue pair: posting a marker: {e}"),
            DrainError::Wait(e) => write!(f, "draining the queue pair: {e}"),
            DrainError::Timeout {
                timeout,
                send_queue,
                recv_queue,
                ..
            } => {
                let missing = match (send_queue, recv_queue) {
                    (false, false) => "neither marker came back",
                    (false, true) => "the send-queue marker did not come back",
                    _ => "the receive-queue marker did not come back",
                };
                write!(
                    f,
                    "draining the queue pair: {missing} flushed within {timeout:?}; make sure \
                     no other thread polls its CQs during the drain, or allow more time"
                )
            }
        }
    }
}

impl std::error::Error for DrainError {}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.disconnect();
    }
}
