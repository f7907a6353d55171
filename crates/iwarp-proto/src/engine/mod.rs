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
//! Work posted afterwards is not refused: it completes at once with
//! [`WcStatus::WrFlushErr`], as in Linux siw (`ib_drain_qp` waits for such a
//! flushed marker).

mod qp;
mod rx;
mod rx_state;
mod term;
mod tx;
mod tx_state;
mod types;
pub mod wr;

pub use qp::{term_code_for_read_source, term_code_for_tagged, Engine};
pub use types::{
    EngineConfig, EngineEvent, LinkParams, QpState, RxHint, TermInfo, TxFrame, TxPiece,
};
pub use wr::*;
