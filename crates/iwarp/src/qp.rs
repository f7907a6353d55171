//! Queue pairs (`struct ibv_qp`): the verbs face of one RDMAP endpoint.
//!
//! A [`QueuePair`] is a handle on a provider's queue pair
//! ([`QpOps`](crate::provider::QpOps)) plus the two completion queues its
//! completions go to. It is created in [`QpState::Init`] by
//! [`ProtectionDomain::create_qp`](crate::ProtectionDomain::create_qp) and
//! connected by the provider's connection manager ([`crate::cm`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iwarp_proto::engine::{PostError, QpState, RecvWr, SendWr};

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
/// [`ProtectionDomain::create_qp`](crate::ProtectionDomain::create_qp);
/// connected by [`crate::cm::connect`] or [`crate::cm::ConnRequest::accept`].
///
/// Dropping it disconnects it (like `rdma_destroy_qp` after
/// `rdma_disconnect`): outstanding work requests are flushed into the CQs and
/// the provider's threads exit.
pub struct QueuePair {
    pub(crate) ops: Arc<dyn QpOps>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ops.fmt(f)
    }
}

impl QueuePair {
    pub(crate) fn new(
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

    /// Disconnect (`rdma_disconnect`): the QP stops accepting work, every
    /// outstanding work request is flushed with
    /// [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr), queued frames
    /// get up to [`crate::soft::LINGER`] to leave, the socket is shut down
    /// and the provider's threads are joined (bounded wait). Idempotent.
    pub fn disconnect(&self) {
        self.ops.disconnect();
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.disconnect();
    }
}
