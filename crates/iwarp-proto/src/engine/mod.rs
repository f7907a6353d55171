//! The queue-pair engine: a deterministic, sans-IO RDMAP/DDP/MPA endpoint.
//!
//! RFC 5040 (RDMAP), RFC 5041 (DDP) and the FPDU part of RFC 5044 (MPA) for
//! one established connection. The engine owns no socket, no thread and no
//! clock. The driver feeds it bytes and asks it for frames; the application
//! posts work requests and polls completions.
//!
//! # Call order
//!
//! 1. [`Engine::new`]; receives may be posted at once ([`Engine::post_recv`]).
//! 2. When the MPA handshake has finished, [`Engine::establish`] with the
//!    negotiated [`LinkParams`]. The engine is now in [`QpState::Rts`].
//! 3. Receive loop of the driver:
//!    - [`Engine::rx_hint`] says whether the next bytes are tagged payload
//!      that may be read straight into registered memory
//!      ([`RxHint::Direct`]) or should go through the driver's buffer;
//!    - buffered bytes go to [`Engine::handle_input`], which consumes as
//!      much as it can (it returns the count; unconsumed bytes are fed again);
//!    - bytes the driver read directly into the region are reported with
//!      [`Engine::handle_direct`].
//! 4. Transmit loop of the driver: while [`Engine::has_transmit`],
//!    [`Engine::poll_transmit`] fills a [`TxFrame`] (headers inline, payload
//!    as references into registered memory); the driver writes it with one
//!    vectored write and then calls [`Engine::confirm_transmit`], which
//!    releases the send completions of what was written.
//! 5. [`Engine::poll_completion`] and [`Engine::poll_event`] drain results.
//! 6. On EOF or a socket error, [`Engine::on_peer_closed`]; to tear down,
//!    [`Engine::close`]. When [`Engine::wants_close`] is true, the driver
//!    flushes the last frames (a Terminate) and closes the socket.
//!
//! Every protocol or access error moves the QP to [`QpState::Error`]: the
//! engine queues the RFC 5040 §4.8 Terminate message for the peer, reports a
//! [`EngineEvent`], completes the affected request with an error status and
//! flushes all outstanding work requests with [`WcStatus::WrFlushErr`].

pub mod wr;

pub use wr::*;

use crate::mem::{MemoryAccess, PdId};

/// Static configuration of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Protection domain of the QP: every STag it uses must belong to it.
    pub pd: PdId,
    /// Send-queue depth (`max_send_wr`).
    pub sq_depth: u32,
    /// Receive-queue depth (`max_recv_wr`).
    pub rq_depth: u32,
}

/// Parameters negotiated by the MPA handshake (RFC 5044 §7, RFC 6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkParams {
    /// CRC32C on every FPDU, both directions (RFC 5044 §7.1.2 C flag).
    pub crc: bool,
    /// Insert markers in the frames we send (the peer asked for them).
    pub markers_tx: bool,
    /// Expect markers in the frames we receive (we asked for them).
    pub markers_rx: bool,
    /// Largest ULPDU (DDP segment incl. its header) we send: MULPDU,
    /// derived from the TCP MSS (RFC 5044 §5.1 / §8.1).
    pub mulpdu: u32,
    /// Inbound RDMA Read Requests we serve at once (our IRD).
    pub ird: u32,
    /// Outbound RDMA Read Requests we may have outstanding (our ORD).
    pub ord: u32,
}

/// Queue-pair state (a subset of `enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created, not connected: receives may be posted.
    Init,
    /// Connected: ready to send and receive.
    Rts,
    /// Error: all work was flushed; a Terminate may still be queued.
    Error,
    /// Orderly close requested: nothing more is accepted.
    Closed,
}

/// Where the driver should put the next received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxHint {
    /// Read into the driver's buffer and call [`Engine::handle_input`].
    Buffered,
    /// The next `len` bytes of the stream are tagged payload for
    /// `[to, to + len)` of the region `stag`, already validated. The driver
    /// may read up to `len` bytes straight into that memory and report them
    /// with [`Engine::handle_direct`].
    Direct { stag: u32, to: u64, len: u32 },
}

/// One piece of an outgoing frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxPiece {
    /// `len` bytes at `start` of [`TxFrame::inline`].
    Inline { start: u32, len: u32 },
    /// `len` bytes of registered memory at `to` in the region `stag`.
    Mem { stag: u32, to: u64, len: u32 },
}

/// A batch of bytes to write, built by [`Engine::poll_transmit`]. Reuse it:
/// [`TxFrame::clear`] keeps the allocations.
#[derive(Debug, Default, Clone)]
pub struct TxFrame {
    /// Headers, pads, markers and CRCs.
    pub inline: Vec<u8>,
    /// The frame in order.
    pub pieces: Vec<TxPiece>,
}

impl TxFrame {
    /// Empty the frame, keeping its capacity.
    pub fn clear(&mut self) {
        self.inline.clear();
        self.pieces.clear();
    }
    /// True if the frame holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
    /// Total bytes in the frame.
    pub fn len(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match *p {
                TxPiece::Inline { len, .. } | TxPiece::Mem { len, .. } => len as usize,
            })
            .sum()
    }
}

/// Something the QP reports besides completions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// The peer sent a Terminate (RFC 5040 §4.8); the QP is in error.
    TerminateReceived(TermInfo),
    /// We detected an error and queued a Terminate for the peer.
    TerminateSent(TermInfo),
    /// The peer closed the stream or the connection broke.
    PeerClosed,
}

/// A Terminate's error code, decoded, with a sentence naming the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermInfo {
    pub layer: u8,
    pub etype: u8,
    pub ecode: u8,
    pub reason: String,
}

impl core::fmt::Display for TermInfo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} (layer {}, etype {:#x}, ecode {:#04x})",
            self.reason, self.layer, self.etype, self.ecode
        )
    }
}

/// The queue-pair engine. See the module documentation for the call order.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
}

#[allow(unused_variables)]
impl Engine {
    /// A QP in [`QpState::Init`].
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine { cfg }
    }
    /// The static configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    /// Enter RTS with the negotiated link parameters.
    pub fn establish(&mut self, link: LinkParams) {
        unimplemented!()
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        unimplemented!()
    }
    /// Queue a send-queue work request (`ibv_post_send`).
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        unimplemented!()
    }
    /// Queue a receive (`ibv_post_recv`).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        unimplemented!()
    }
    /// Where the next received bytes should go.
    pub fn rx_hint(&self) -> RxHint {
        unimplemented!()
    }
    /// Consume received bytes; returns how many were consumed.
    pub fn handle_input(&mut self, data: &[u8], mem: &dyn MemoryAccess) -> usize {
        unimplemented!()
    }
    /// Report `len` bytes the driver placed at the current [`RxHint::Direct`] target.
    pub fn handle_direct(&mut self, len: usize, mem: &dyn MemoryAccess) {
        unimplemented!()
    }
    /// True if [`Engine::poll_transmit`] would produce bytes.
    pub fn has_transmit(&self) -> bool {
        unimplemented!()
    }
    /// Append frames (up to about `max_bytes`) to `frame`. Returns true if anything was added.
    pub fn poll_transmit(&mut self, frame: &mut TxFrame, max_bytes: usize, mem: &dyn MemoryAccess) -> bool {
        unimplemented!()
    }
    /// Everything handed out by `poll_transmit` so far was written to the socket.
    pub fn confirm_transmit(&mut self) {
        unimplemented!()
    }
    /// Next work completion.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        unimplemented!()
    }
    /// Next event.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        unimplemented!()
    }
    /// The peer closed the connection or it broke: flush everything.
    pub fn on_peer_closed(&mut self) {
        unimplemented!()
    }
    /// Local close: flush everything, accept nothing more.
    pub fn close(&mut self) {
        unimplemented!()
    }
    /// True once the driver should flush the remaining frames and close the socket.
    pub fn wants_close(&self) -> bool {
        unimplemented!()
    }
}
