//! Control messages on the RDMA channel (RDMAP Send / Receive).
//!
//! Every message is exactly [`MSG_LEN`] = 32 bytes, big-endian:
//!
//! ```text
//!  0..4   magic  "RDMA"
//!  4      version 1
//!  5      type    1 = BUF, 2 = DONE, 3 = ABORT
//!  6..8   reserved, 0
//!  8..12  stag    the buffer's STag
//! 12..16  length  bytes
//! 16..24  to      the buffer's tagged offset (BUF), else 0
//! 24..32  offset  offset of this piece in the body
//! ```
//!
//! - BUF (server to client, client-writes): "write `length` bytes of the
//!   body, starting at body offset `offset`, to `stag`/`to`".
//! - DONE (client to server): "I finished with the buffer `stag`": after
//!   the RDMA Read of a client-reads GET (`length` = bytes read) and after
//!   the RDMA Write that answers a BUF (`length` = bytes written).
//! - ABORT (either way): "I give up on this transfer"; the receiver
//!   releases the buffer and fails the request.

use std::fmt;

/// Size of every control message.
pub const MSG_LEN: usize = 32;
/// Protocol version carried in byte 4.
pub const VERSION: u8 = 1;
const MAGIC: &[u8; 4] = b"RDMA";

/// Message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Buf,
    Done,
    Abort,
}

/// One control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlMsg {
    pub kind: Kind,
    pub stag: u32,
    pub length: u32,
    pub to: u64,
    pub offset: u64,
}

/// Why a received message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtrlError {
    Length(usize),
    Magic,
    Version(u8),
    Kind(u8),
}

impl fmt::Display for CtrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtrlError::Length(n) => write!(f, "control message of {n} bytes, expected {MSG_LEN}"),
            CtrlError::Magic => write!(f, "control message without the \"RDMA\" magic"),
            CtrlError::Version(v) => {
                write!(
                    f,
                    "control message version {v}, this client speaks {VERSION}"
                )
            }
            CtrlError::Kind(k) => write!(f, "unknown control message type {k}"),
        }
    }
}

impl std::error::Error for CtrlError {}

impl CtrlMsg {
    /// Encode into the 32-byte wire form.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = match self.kind {
            Kind::Buf => 1,
            Kind::Done => 2,
            Kind::Abort => 3,
        };
        b[8..12].copy_from_slice(&self.stag.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b[16..24].copy_from_slice(&self.to.to_be_bytes());
        b[24..32].copy_from_slice(&self.offset.to_be_bytes());
        b
    }

    /// Decode a received message (untrusted input).
    pub fn decode(b: &[u8]) -> Result<CtrlMsg, CtrlError> {
        if b.len() != MSG_LEN {
            return Err(CtrlError::Length(b.len()));
        }
        if &b[0..4] != MAGIC {
            return Err(CtrlError::Magic);
        }
        if b[4] != VERSION {
            return Err(CtrlError::Version(b[4]));
        }
        let kind = match b[5] {
            1 => Kind::Buf,
            2 => Kind::Done,
            3 => Kind::Abort,
            k => return Err(CtrlError::Kind(k)),
        };
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        Ok(CtrlMsg {
            kind,
            stag: u32_at(8),
            length: u32_at(12),
            to: u64_at(16),
            offset: u64_at(24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_literal_vector() {
        let m = CtrlMsg {
            kind: Kind::Buf,
            stag: 0x0102_0304,
            length: 0x0506_0708,
            to: 0x1112_1314_1516_1718,
            offset: 0x2122_2324_2526_2728,
        };
        let b = m.encode();
        assert_eq!(
            b,
            [
                b'R', b'D', b'M', b'A', 1, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14,
                0x15, 0x16, 0x17, 0x18, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28
            ]
        );
        assert_eq!(CtrlMsg::decode(&b), Ok(m));
    }

    #[test]
    fn rejects_bad_input() {
        let done = CtrlMsg {
            kind: Kind::Done,
            stag: 1,
            length: 2,
            to: 0,
            offset: 0,
        }
        .encode();
        assert_eq!(CtrlMsg::decode(&done[..31]), Err(CtrlError::Length(31)));
        let mut b = done;
        b[0] = b'X';
        assert_eq!(CtrlMsg::decode(&b), Err(CtrlError::Magic));
        let mut b = done;
        b[4] = 2;
        assert_eq!(CtrlMsg::decode(&b), Err(CtrlError::Version(2)));
        let mut b = done;
        b[5] = 9;
        assert_eq!(CtrlMsg::decode(&b), Err(CtrlError::Kind(9)));
        assert_eq!(CtrlMsg::decode(&done).unwrap().kind, Kind::Done);
    }

    /// The vectors shared with mod_rdma's C codec
    /// (testdata/rdma-vectors/ctrl.txt; format in its README.md).
    #[test]
    fn shared_vectors() {
        crate::vectors::run("ctrl.txt", |want, input| {
            let hex: Vec<u8> = input.bytes().filter(|&c| c != b' ').collect();
            let bytes: Vec<u8> = hex
                .chunks(2)
                .map(|d| u8::from_str_radix(std::str::from_utf8(d).unwrap(), 16).unwrap())
                .collect();
            check_vector(want, &bytes)
        });
    }

    fn vector_num(v: &str) -> u64 {
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => v.parse().unwrap(),
        }
    }

    fn check_vector(want: &str, bytes: &[u8]) -> Result<(), String> {
        let mut words = want.split(' ');
        let got = CtrlMsg::decode(bytes);
        match (words.next(), got) {
            (Some("ok"), Err(e)) => Err(format!("expected ok, refused: {e}")),
            (Some("ok"), Ok(m)) => {
                let kind = match words.next() {
                    Some("BUF") => Kind::Buf,
                    Some("DONE") => Kind::Done,
                    Some("ABORT") => Kind::Abort,
                    k => return Err(format!("bad vector type {k:?}")),
                };
                let mut expect = CtrlMsg {
                    kind,
                    stag: 0,
                    length: 0,
                    to: 0,
                    offset: 0,
                };
                for kv in words {
                    let (k, v) = kv.split_once('=').ok_or("bad vector field")?;
                    match k {
                        "stag" => expect.stag = vector_num(v) as u32,
                        "length" => expect.length = vector_num(v) as u32,
                        "to" => expect.to = vector_num(v),
                        "offset" => expect.offset = vector_num(v),
                        _ => return Err(format!("bad vector field {k}")),
                    }
                }
                if m != expect {
                    return Err(format!("decoded {m:?}, expected {expect:?}"));
                }
                let mut canonical = bytes.to_vec();
                canonical[6] = 0;
                canonical[7] = 0;
                if expect.encode()[..] != canonical[..] {
                    return Err("encoding the fields gives other bytes".into());
                }
                Ok(())
            }
            (Some("err"), Ok(m)) => Err(format!("expected an error, accepted: {m:?}")),
            (Some("err"), Err(e)) => {
                let kind = match e {
                    CtrlError::Length(_) => "length",
                    CtrlError::Magic => "magic",
                    CtrlError::Version(_) => "version",
                    CtrlError::Kind(_) => "type",
                };
                match words.next() {
                    Some(k) if k == kind => Ok(()),
                    k => Err(format!("expected {k:?}, got {kind}: {e}")),
                }
            }
            _ => Err(format!("bad verdict {want:?}")),
        }
    }
}
