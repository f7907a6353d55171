//! The provider seam, queue-pair half: what the verbs types
//! ([`QueuePair`](crate::QueuePair), [`CompletionQueue`](crate::CompletionQueue))
//! and the connection manager (`iwarp::cm`) ask of the code that moves a
//! queue pair's bytes: the provider interface, implemented by the provider
//! crates (`iwarp-soft`, `iwarp-rdmacore`).
//!
//! A queue pair is a handle on a provider object ([`QpOps`], with its
//! connection-manager part [`QpCm`]); a completion queue knows the queue
//! pairs that complete into it only as [`CqSource`]s. The software
//! provider (`iwarp::soft`: the sans-IO engine plus TCP sockets and
//! driver threads) is one implementation; the rdma-core provider
//! (`iwarp::rdma` with the `rdma-core` feature: libibverbs / librdmacm)
//! is the second. Nothing in this module, in `qp.rs` or in `cq.rs` knows
//! which provider runs: `qp` → `cq` → `provider`. The device half (a
//! context's PD, MR registration, CQ creation, listening) is
//! `device_ops.rs`, one level up, because it names the verbs types.
//!
//! Also here: the data types every provider reports ([`QpEvent`],
//! [`ConnInfo`], [`QpStats`]).

use std::any::Any;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use iwarp_proto::engine::{PostError, QpState, RecvWr, SendWr, TermInfo};
use iwarp_proto::handshake::Negotiated;

use crate::cm_types::{CmError, CongestionControl, ConnParam};

/// The verbs of one queue pair, as a provider implements them (its
/// connection-manager part, [`QpCm`], lives in the provider's `cm.rs`).
pub trait QpOps: QpCm + Send + Sync + fmt::Debug {
    /// The QP number.
    fn qp_num(&self) -> u32;
    /// Post send-queue work requests (`bad_wr` semantics: those before the
    /// refused one are posted).
    fn post_send(&self, wrs: &[SendWr]) -> Result<(), PostError>;
    /// Post receive-queue work requests (same semantics).
    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostError>;
    /// Current state.
    fn state(&self) -> QpState;
    /// Disconnect and flush (idempotent, bounded).
    fn disconnect(&self);
    fn local_addr(&self) -> Option<SocketAddr>;
    fn peer_addr(&self) -> Option<SocketAddr>;
    fn conn_info(&self) -> Option<ConnInfo>;
    fn stats(&self) -> QpStats;
    /// Wait up to `timeout` for the next event.
    fn next_event(&self, timeout: Duration) -> Option<QpEvent>;
    /// A descriptor readable (level-triggered) while events wait for
    /// `next_event`; `None` if the provider has none.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }
    /// For the provider's own connection manager, which needs its concrete
    /// type back.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// The connection-manager verbs of one queue pair (`iwarp::cm`'s
/// functions that take a `QueuePair`), as a provider implements them.
pub trait QpCm {
    /// `rdma_connect`: connect to `addr`, return the peer's private data.
    fn connect(self: Arc<Self>, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError>;
    /// The TCP congestion control of the connection (for logs).
    fn tcp_congestion(&self) -> Result<String, CmError>;
    /// Change the congestion control of the live connection.
    fn set_tcp_congestion(&self, cc: &CongestionControl) -> Result<(), CmError>;
    /// The round-trip time of the connection's TCP path.
    fn path_rtt(&self) -> Result<Option<Duration>, CmError>;
}

/// What a completion queue needs from a queue pair that completes into it
/// (see [`ProgressMode`](crate::ProgressMode)).
pub trait CqSource: Send + Sync {
    /// Do pending receive (and transmit) work from the calling thread;
    /// never blocks, returns at once if another thread is doing it.
    fn progress(&self);
    /// The calling thread stops calling `progress` for now (it is about to
    /// sleep): a provider thread that stepped aside takes over again.
    fn stop_progress(&self);
    /// Application-driven mode on (`true`) or off: while on, only
    /// application threads (through `progress`) read the connection.
    fn set_app_driven(&self, on: bool);
    /// The descriptor that becomes readable when `progress` has work, while
    /// the QP is connected.
    fn wait_fd(&self) -> Option<RawFd>;
}

/// Something that happened to a queue pair (the QP-related subset of
/// `ibv_async_event` and `rdma_cm_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpEvent {
    /// The connection is established; the QP is in RTS
    /// (`RDMA_CM_EVENT_ESTABLISHED`).
    Established,
    /// The connection is gone (peer closed, error, or local disconnect);
    /// every outstanding work request has been flushed
    /// (`RDMA_CM_EVENT_DISCONNECTED`). Reported once.
    Disconnected,
    /// The peer sent a Terminate (RFC 5040 §4.8); the QP is in error
    /// (`IBV_EVENT_QP_FATAL` with the peer's reason).
    TerminateReceived(TermInfo),
    /// We found an error and sent the peer a Terminate; the QP is in error.
    TerminateSent(TermInfo),
    /// The peer stayed silent for
    /// `iwarp::cm::ConnParam::peer_timeout`
    /// while it owed an answer (our queued data unacknowledged, or RDMA
    /// Read Responses): the connection is given up, outstanding work is
    /// flushed, and [`QpEvent::Disconnected`] follows. The text says which
    /// rule fired (`IBV_EVENT_QP_FATAL` / `RDMA_CM_EVENT_DISCONNECTED` for
    /// a timeout).
    PeerTimeout(String),
}

/// What a connected QP runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// What the MPA handshake negotiated (CRC, markers, revision, IRD/ORD,
    /// the RFC 6581 RTR message).
    pub mpa: Negotiated,
    /// Largest DDP segment we send (from the TCP MSS).
    pub mulpdu: u32,
}

/// Byte counters of a connected QP's driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Bytes written to the socket.
    pub tx_bytes: u64,
    /// Bytes read from the socket through the driver's buffer.
    pub rx_buffered_bytes: u64,
    /// Tagged payload bytes read straight into registered memory
    /// (zero-copy placement).
    pub rx_direct_bytes: u64,
    /// Of the bytes above (buffered and direct), those read by application
    /// threads (in [`CompletionQueue::progress`](crate::CompletionQueue::progress),
    /// a busy-poll or application-driven `wait`) rather than by the
    /// driver's receive thread.
    pub rx_polled_bytes: u64,
    /// Of `tx_bytes`, those written by application threads doing progress
    /// work (pushing on a frame the socket could not take whole) rather
    /// than by the driver's transmit path.
    pub tx_polled_bytes: u64,
    /// Times the receive thread stepped aside (parked) because an
    /// application thread was doing the receive work.
    pub rx_steps_aside: u64,
}
