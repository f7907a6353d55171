//! The [`Error`] of a session or a transfer: a leaf every module of the
//! crate imports; re-exported at the crate root.

use std::fmt;
use std::time::Duration;

/// Errors of a session or a transfer. `Display` names the cause.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Bad parameters.
    Config(String),
    /// Setting up the session failed (connect, accept, negotiation).
    Setup(String),
    /// The peer broke the protocol.
    Protocol(String),
    /// Reading the source or writing the sink failed here.
    Local(std::io::Error),
    /// The peer aborted the transfer, with its reason.
    PeerAborted(String),
    /// The connection to the peer is gone.
    Disconnected(String),
    /// Nothing happened for this long.
    Timeout {
        waiting_for: &'static str,
        after: Duration,
    },
    /// An earlier error left the session unusable.
    Broken(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(s) => write!(f, "invalid transfer configuration: {s}"),
            Error::Setup(s) => write!(f, "transfer session setup failed: {s}"),
            Error::Protocol(s) => write!(f, "transfer protocol violation by the peer: {s}"),
            Error::Local(e) => write!(f, "local I/O error: {e}"),
            Error::PeerAborted(s) => write!(f, "the peer aborted the transfer: {s}"),
            Error::Disconnected(s) => write!(f, "connection to the peer lost: {s}"),
            Error::Timeout { waiting_for, after } => write!(
                f,
                "timed out after {:.1} s waiting for {waiting_for}: the peer stopped responding",
                after.as_secs_f64()
            ),
            Error::Broken(s) => write!(
                f,
                "the transfer session is unusable after an earlier error ({s}): open a new one"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Local(e) => Some(e),
            _ => None,
        }
    }
}
