//! What the engine's callers see besides [`Engine`] itself: its
//! configuration, the negotiated link parameters, the QP state, the
//! receive hint, the transmit frame and the events. A leaf: the engine's
//! files import it, it imports none of them.

use crate::mem::PdId;

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
    /// Error: all work was flushed; a Terminate may still be queued. Work
    /// posted now completes at once with [`WcStatus::WrFlushErr`](super::WcStatus::WrFlushErr).
    Error,
    /// Orderly close requested (`rdma_disconnect`, which moves an iWARP QP
    /// to the error state): like [`QpState::Error`], work posted now
    /// completes at once with [`WcStatus::WrFlushErr`](super::WcStatus::WrFlushErr).
    Closed,
}

/// Where the driver should put the next received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxHint {
    /// Read into the driver's buffer and call [`Engine::handle_input`](super::Engine::handle_input).
    Buffered,
    /// The next `len` bytes of the stream are tagged payload for
    /// `[to, to + len)` of the region `stag`, already validated. The driver
    /// may read up to `len` bytes straight into that memory and report them
    /// with [`Engine::handle_direct`](super::Engine::handle_direct).
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

/// A batch of bytes to write, built by [`Engine::poll_transmit`](super::Engine::poll_transmit). Reuse it:
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
