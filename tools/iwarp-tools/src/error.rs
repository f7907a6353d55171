//! One error type for the tools, whose messages say what failed and what to
//! try next.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use iwarp::cm::CmError;
use iwarp::{PostError, WcOpcode, WcStatus};
use iwarp_proto::engine::TermInfo;

/// Why a tool run failed.
#[derive(Debug)]
pub enum ToolError {
    /// The TCP connection or the MPA handshake to `addr` failed.
    Connect {
        addr: SocketAddr,
        cause: String,
        refused: bool,
    },
    /// Binding or listening on `addr` failed.
    Listen { addr: SocketAddr, cause: String },
    /// Accepting an incoming connection failed.
    Accept { cause: String },
    /// A verbs call (reg_mr, create_cq, ...) failed.
    Verbs { what: &'static str, cause: String },
    /// `post_send` / `post_recv` refused a work request.
    Post { what: &'static str, err: PostError },
    /// A work request completed with an error status.
    Completion {
        what: &'static str,
        opcode: WcOpcode,
        status: WcStatus,
    },
    /// Nothing happened within the allowed time.
    Timeout { what: &'static str, after: Duration },
    /// The connection went away while `what` was outstanding.
    Disconnected { what: &'static str },
    /// The peer sent a Terminate.
    TerminateReceived { what: &'static str, info: TermInfo },
    /// We sent the peer a Terminate.
    TerminateSent { what: &'static str, info: TermInfo },
    /// The peer broke the rping protocol (e.g. a control message that is
    /// not 16 bytes).
    Protocol(String),
    /// Data did not arrive as sent.
    Mismatch(String),
    /// A local thread failed.
    Internal(String),
}

impl ToolError {
    /// A connect failure; `refused` is derived from the error (a
    /// [`CmError::Refused`], or an `io::Error` of kind `ConnectionRefused`
    /// anywhere in its source chain).
    pub fn connect(addr: SocketAddr, err: &(dyn std::error::Error + 'static)) -> ToolError {
        let refused = matches!(err.downcast_ref::<CmError>(), Some(CmError::Refused { .. }))
            || is_refused(err);
        ToolError::Connect {
            addr,
            cause: chain(err),
            refused,
        }
    }
}

/// The error and its sources, "a: b: c", without repeating a source whose
/// text is already part of the previous message.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let t = e.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = e.source();
    }
    s
}

fn is_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::Connect { addr, refused: true, .. } => write!(
                f,
                "connect to {addr} failed: connection refused; is `iwarp-ping -s` (or rping -s) running on port {}?",
                addr.port()
            ),
            ToolError::Connect { addr, cause, .. } => write!(f, "connect to {addr} failed: {cause}"),
            ToolError::Listen { addr, cause } => write!(
                f,
                "cannot listen on {addr}: {cause}; is another server using port {}? pick another with -p",
                addr.port()
            ),
            ToolError::Accept { cause } => write!(f, "accepting the connection failed: {cause}"),
            ToolError::Verbs { what, cause } => write!(f, "{what} failed: {cause}"),
            ToolError::Post { what, err } => write!(f, "posting the {what} failed: {err}"),
            ToolError::Completion { what, opcode, status } => {
                write!(f, "{what} failed: {opcode:?} completed with status \"{}\"", status.as_str())
            }
            ToolError::Timeout { what, after } => write!(
                f,
                "timed out after {:.1} s waiting for {what}; is the peer alive? (raise --timeout for slow links)",
                after.as_secs_f64()
            ),
            ToolError::Disconnected { what } => write!(f, "the connection closed while waiting for {what}"),
            ToolError::TerminateReceived { what, info } => {
                write!(f, "the peer terminated the connection during {what}: {info}")
            }
            ToolError::TerminateSent { what, info } => {
                write!(f, "we terminated the connection during {what}: {info}")
            }
            ToolError::Protocol(m) => write!(f, "protocol error: {m}"),
            ToolError::Mismatch(m) => write!(f, "data mismatch: {m}"),
            ToolError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrap(io::Error);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("tcp connect")
        }
    }
    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn refused_connect_names_the_server_to_start() {
        let addr: SocketAddr = "127.0.0.1:7174".parse().unwrap();
        let e = Wrap(io::Error::from(io::ErrorKind::ConnectionRefused));
        let msg = ToolError::connect(addr, &e).to_string();
        assert_eq!(
            msg,
            "connect to 127.0.0.1:7174 failed: connection refused; is `iwarp-ping -s` (or rping -s) running on port 7174?"
        );
    }

    #[test]
    fn cm_refused_is_recognised() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let msg = ToolError::connect(addr, &CmError::Refused { addr }).to_string();
        assert!(
            msg.starts_with(
                "connect to 127.0.0.1:9 failed: connection refused; is `iwarp-ping -s`"
            ),
            "{msg}"
        );
    }

    #[test]
    fn other_connect_errors_keep_their_cause() {
        let addr: SocketAddr = "10.0.0.1:7174".parse().unwrap();
        let e = Wrap(io::Error::from(io::ErrorKind::TimedOut));
        let msg = ToolError::connect(addr, &e).to_string();
        assert!(
            msg.starts_with("connect to 10.0.0.1:7174 failed: tcp connect: "),
            "{msg}"
        );
    }
}
