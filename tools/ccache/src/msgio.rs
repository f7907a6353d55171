//! The 16-byte IPC message on a byte stream (unix or TCP socket). The
//! caller sets the socket's read/write timeouts; every call here is
//! bounded by them.

use std::fmt;
use std::io::{self, Read, Write};

use ccache_proto::ipc::{IpcError, Repr, MSG_LEN};

/// Reading a message failed.
#[derive(Debug)]
pub enum MsgError {
    /// The peer closed the connection cleanly between messages.
    Closed,
    /// A socket error (a timeout shows as `WouldBlock`/`TimedOut`).
    Io(io::Error),
    /// The bytes are not a valid message.
    Malformed(IpcError),
}

impl fmt::Display for MsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgError::Closed => f.write_str("the peer closed the connection"),
            MsgError::Io(e) => write!(f, "IPC socket error: {e}"),
            MsgError::Malformed(e) => write!(f, "malformed IPC message: {e}"),
        }
    }
}

impl std::error::Error for MsgError {}

/// Read one message.
pub fn read_msg(r: &mut impl Read) -> Result<Repr, MsgError> {
    let mut b = [0u8; MSG_LEN];
    let mut got = 0;
    while got < MSG_LEN {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Err(MsgError::Closed),
            Ok(0) => return Err(MsgError::Malformed(IpcError::Truncated { len: got })),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(MsgError::Io(e)),
        }
    }
    Repr::from_bytes(&b).map_err(MsgError::Malformed)
}

/// Write one message.
pub fn write_msg(w: &mut impl Write, m: &Repr) -> io::Result<()> {
    w.write_all(&m.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccache_proto::ipc::Kind;

    #[test]
    fn round_trip_and_errors() {
        let m = Repr::with_value(Kind::VersionReply, 3, 9);
        let mut buf = Vec::new();
        write_msg(&mut buf, &m).unwrap();
        assert_eq!(read_msg(&mut &buf[..]).unwrap(), m);
        assert!(matches!(read_msg(&mut &[][..]), Err(MsgError::Closed)));
        assert!(matches!(
            read_msg(&mut &buf[..5]),
            Err(MsgError::Malformed(IpcError::Truncated { len: 5 }))
        ));
        assert!(matches!(
            read_msg(&mut &b"GET / HTTP/1.1\r\n"[..]),
            Err(MsgError::Malformed(IpcError::BadMagic(_)))
        ));
    }
}
