//! How a flow call fails ([`FlowError`]) and how a peer breaks the
//! protocol ([`ProtocolError`]), each naming the rule it broke.

use std::fmt;

use super::types::SendTag;
use crate::wire::{Op, WireError};

/// A peer that broke the protocol; the connection ends (ECONNRESET).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The message word could not be read.
    Malformed(WireError),
    /// A data message beyond the credits we granted.
    CreditsExceeded {
        /// Data messages received before this one (mod 2^16).
        received: u16,
        /// The limit we last granted (mod 2^16).
        limit: u16,
    },
    /// A data message claims more bytes than the ring space we advertised.
    RingOverrun {
        /// Bytes claimed.
        len: u32,
        /// Bytes advertised and not yet filled.
        window: u64,
    },
    /// An `RS_OP_SGL` limit outside `sent ..= sent + peer rq_size` (mod
    /// 2^16): below what we already sent, or more than the peer's receive
    /// queue (its conn data `credits`) can hold.
    CreditLimitOutOfRange {
        /// The new limit.
        limit: u16,
        /// Our data messages sent.
        sent: u16,
        /// The peer's `rq_size` (its conn data `credits`).
        peer_rq: u16,
    },
    /// A data message after the peer's SHUTDOWN or DISCONNECT.
    DataAfterShutdown,
    /// A word rsocket.c never sends to us (`RS_OP_WRITE`, or
    /// `RS_OP_IOMAP_SGL` although we advertised no iomap).
    Unexpected(Op),
    /// An `RS_OP_IOMAP_SGL` for an entry beyond the iomap table we
    /// advertised.
    IomapIndex {
        /// The index in the word.
        index: u16,
        /// Entries we advertised.
        size: u16,
    },
}

/// Why a [`Flow`](crate::flow::Flow) call did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlowError {
    /// Not now: no credits, send queue, send buffer, ring space, or data
    /// yet (EAGAIN). Retry after the next completion.
    WouldBlock,
    /// Called before [`Flow::establish`](crate::flow::Flow::establish).
    NotConnected,
    /// Sending after our `shutdown(Write)` or the peer's disconnect (EPIPE
    /// / ECONNRESET).
    NotWritable,
    /// A bad [`Config`](crate::flow::Config) or region.
    Config(&'static str),
    /// The peer's conn data cannot be used.
    BadConnData(&'static str),
    /// The peer broke the protocol; the connection is over.
    Protocol(ProtocolError),
    /// A send work request completed with an error (rsocket.c: `EIO`).
    SendFailed,
    /// A completion for a work request this machine did not issue: a
    /// driver bug.
    UnexpectedCompletion(SendTag),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProtocolError::Malformed(e) => write!(f, "malformed message word: {e}"),
            ProtocolError::CreditsExceeded { received, limit } => write!(
                f,
                "peer sent a data message beyond its credits ({received} received, limit {limit}); \
                 its flow control is broken: the connection is reset"
            ),
            ProtocolError::RingOverrun { len, window } => write!(
                f,
                "peer claims {len} bytes written but only {window} bytes of receive ring were \
                 advertised; it wrote outside the ring: the connection is reset"
            ),
            ProtocolError::CreditLimitOutOfRange {
                limit,
                sent,
                peer_rq,
            } => write!(
                f,
                "peer set its credit limit to {limit}, outside {sent}..={sent}+{peer_rq} (data \
                 messages sent .. plus its receive queue); its credit accounting is broken: the \
                 connection is reset"
            ),
            ProtocolError::DataAfterShutdown => write!(
                f,
                "peer sent data after its shutdown/disconnect message: the connection is reset"
            ),
            ProtocolError::Unexpected(op) => write!(
                f,
                "peer sent op {op:?}, which this rsocket never asked for (RS_OP_WRITE is never \
                 transmitted; RS_OP_IOMAP_SGL only toward an advertised iomap table, none was): \
                 the connection is reset"
            ),
            ProtocolError::IomapIndex { index, size } => write!(
                f,
                "peer announced iomap entry {index}, but our table has {size} entries; it wrote \
                 outside the table: the connection is reset"
            ),
        }
    }
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowError::WouldBlock => write!(
                f,
                "no credits, send queue entries, buffer space or data right now; retry after the \
                 next completion (EAGAIN)"
            ),
            FlowError::NotConnected => {
                write!(
                    f,
                    "the connection is not established; exchange conn data first (establish)"
                )
            }
            FlowError::NotWritable => write!(
                f,
                "the sending side is shut down (by shutdown(Write) or the peer's disconnect); \
                 open a new connection to send more"
            ),
            FlowError::Config(why) => write!(f, "bad rsocket configuration: {why}"),
            FlowError::BadConnData(why) => write!(
                f,
                "the peer's rs_conn_data is unusable: {why}; the peer is not a working rsocket"
            ),
            FlowError::Protocol(p) => write!(f, "{p}"),
            FlowError::SendFailed => write!(
                f,
                "a send work request completed with an error (rsocket.c reports EIO); the queue \
                 pair is in error: close the socket"
            ),
            FlowError::UnexpectedCompletion(t) => write!(
                f,
                "completion for {t:?}, which has no outstanding work request; the driver handed \
                 back a tag twice or invented one"
            ),
        }
    }
}

impl std::error::Error for FlowError {}

impl FlowError {
    /// The `std::io` kind a socket API reports for this error. A broken
    /// protocol is `ConnectionReset` (ECONNRESET), as the issue asks.
    pub fn kind(&self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            FlowError::WouldBlock => K::WouldBlock,
            FlowError::NotConnected => K::NotConnected,
            FlowError::NotWritable => K::BrokenPipe,
            FlowError::Config(_) => K::InvalidInput,
            FlowError::BadConnData(_) => K::InvalidData,
            FlowError::Protocol(_) => K::ConnectionReset,
            FlowError::SendFailed | FlowError::UnexpectedCompletion(_) => K::Other,
        }
    }
}

impl From<FlowError> for std::io::Error {
    fn from(e: FlowError) -> std::io::Error {
        std::io::Error::new(e.kind(), e)
    }
}
