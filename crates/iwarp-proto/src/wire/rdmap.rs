//! RDMAP header pieces, RFC 5040 §4.
//!
//! RDMAP has no header of its own in front of the DDP header: its control
//! byte is byte 1 of the DDP header (RFC 5040 §4.1, "RDMAP control field",
//! carried in the DDP RsvdULP bits), laid out as
//!
//! ```text
//! RV(2) rsvd(2) opcode(4)
//! ```
//!
//! The untagged RsvdULP word carries the Invalidate STag of a Send with
//! Invalidate (RFC 5040 §4.1). The RDMA Read Request adds a 28-byte header
//! after the 18-byte untagged DDP header (RFC 5040 §4.4, [`ReadRequest`]);
//! the Terminate message adds its own ([`super::terminate`]).
//!
//! Opcodes and queue numbers are those of RFC 5040 §4.2 and siw
//! `iwarp.h`:
//!
//! | opcode | message            | DDP model | QN |
//! |--------|--------------------|-----------|----|
//! | 0      | RDMA Write         | tagged    |    |
//! | 1      | RDMA Read Request  | untagged  | 1  |
//! | 2      | RDMA Read Response | tagged    |    |
//! | 3      | Send               | untagged  | 0  |
//! | 4      | Send with Invalidate | untagged | 0 |
//! | 5      | Send with SE       | untagged  | 0  |
//! | 6      | Send with SE and Invalidate | untagged | 0 |
//! | 7      | Terminate          | untagged  | 2  |

use super::bytes::{be32, be64, put32, put64};
use super::error::{Error, Result};

/// RDMAP version of RFC 5040 (RV field).
pub const RDMAP_VERSION: u8 = 1;

/// Untagged queue of Send messages (RFC 5040 §4.2).
pub const QN_SEND: u32 = 0;
/// Untagged queue of RDMA Read Requests (RFC 5040 §4.2).
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue of Terminate messages (RFC 5040 §4.2).
pub const QN_TERMINATE: u32 = 2;

/// Length of the RDMA Read Request header that follows the untagged DDP
/// header (RFC 5040 §4.4).
pub const READ_REQUEST_LEN: usize = 28;

/// RDMAP opcode (RFC 5040 §4.2). Values 8..=15 are kept as `Unknown`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    RdmaWrite,
    ReadRequest,
    ReadResponse,
    Send,
    SendInvalidate,
    SendSe,
    SendSeInvalidate,
    Terminate,
    /// An opcode RFC 5040 does not define (RFC 5040 §7: "unexpected
    /// opcode" Terminate).
    Unknown(u8),
}

impl From<u8> for Opcode {
    /// Reads the low 4 bits (the opcode field of the control byte).
    fn from(v: u8) -> Opcode {
        match v & 0x0f {
            0 => Opcode::RdmaWrite,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            x => Opcode::Unknown(x),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        match op {
            Opcode::RdmaWrite => 0,
            Opcode::ReadRequest => 1,
            Opcode::ReadResponse => 2,
            Opcode::Send => 3,
            Opcode::SendInvalidate => 4,
            Opcode::SendSe => 5,
            Opcode::SendSeInvalidate => 6,
            Opcode::Terminate => 7,
            Opcode::Unknown(x) => x & 0x0f,
        }
    }
}

impl Opcode {
    /// Whether RFC 5040 carries this message in tagged DDP segments
    /// (RDMA Write and Read Response); `None` for unknown opcodes.
    pub fn is_tagged(self) -> Option<bool> {
        match self {
            Opcode::RdmaWrite | Opcode::ReadResponse => Some(true),
            Opcode::Unknown(_) => None,
            _ => Some(false),
        }
    }

    /// The untagged queue number the message uses (RFC 5040 §4.2);
    /// `None` for tagged and unknown opcodes.
    pub fn queue_number(self) -> Option<u32> {
        match self {
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate => {
                Some(QN_SEND)
            }
            Opcode::ReadRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            _ => None,
        }
    }

    /// Whether the untagged RsvdULP word carries an STag to invalidate
    /// (RFC 5040 §4.1).
    pub fn has_invalidate_stag(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// Whether the message is a Send with Solicited Event.
    pub fn solicited(self) -> bool {
        matches!(self, Opcode::SendSe | Opcode::SendSeInvalidate)
    }

    // `ulp_header_len`, the per-opcode header-length table, is in
    // `wire/pktinfo.rs`: it reads `terminate::HDR_LEN`, and `terminate`
    // imports this module.
}

/// The RDMAP control byte for `op` at [`RDMAP_VERSION`] (reserved bits 0).
pub fn ctrl_byte(op: Opcode) -> u8 {
    (RDMAP_VERSION << 6) | u8::from(op)
}

/// The RV field of an RDMAP control byte.
pub fn ctrl_version(b: u8) -> u8 {
    b >> 6
}

/// The opcode of an RDMAP control byte.
pub fn ctrl_opcode(b: u8) -> Opcode {
    Opcode::from(b)
}

mod field {
    use crate::wire::bytes::Field;
    pub const SINK_STAG: Field = 0..4;
    pub const SINK_TO: Field = 4..12;
    pub const SIZE: Field = 12..16;
    pub const SRC_STAG: Field = 16..20;
    pub const SRC_TO: Field = 20..28;
}

/// View of the RDMA Read Request header (RFC 5040 §4.4), the 28 bytes
/// after the untagged DDP header:
///
/// ```text
/// 0..4   Data Sink STag      (the requester's buffer)
/// 4..12  Data Sink TO
/// 12..16 RDMA Read Message Size
/// 16..20 Data Source STag    (the responder's buffer)
/// 20..28 Data Source TO
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequest<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> ReadRequest<T> {
        ReadRequest { buffer }
    }

    /// Wraps a buffer and checks it holds [`READ_REQUEST_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<ReadRequest<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the 28-byte header.
    pub fn check_len(&self) -> Result<()> {
        // RFC 5040 §4.4: the Read Request header is 28 bytes.
        if self.buffer.as_ref().len() < READ_REQUEST_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn sink_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SINK_STAG.start)
    }

    pub fn sink_to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SINK_TO.start)
    }

    /// RDMA Read Message Size in bytes.
    pub fn size(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SIZE.start)
    }

    pub fn src_stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SRC_STAG.start)
    }

    pub fn src_to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::SRC_TO.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequest<T> {
    pub fn set_sink_stag(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::SINK_STAG.start, v)
    }

    pub fn set_sink_to(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::SINK_TO.start, v)
    }

    pub fn set_size(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::SIZE.start, v)
    }

    pub fn set_src_stag(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::SRC_STAG.start, v)
    }

    pub fn set_src_to(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::SRC_TO.start, v)
    }
}

/// A parsed RDMA Read Request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequestRepr {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Parses the header; only its length is checked.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &ReadRequest<&T>) -> Result<ReadRequestRepr> {
        p.check_len()?;
        Ok(ReadRequestRepr {
            sink_stag: p.sink_stag(),
            sink_to: p.sink_to(),
            size: p.size(),
            src_stag: p.src_stag(),
            src_to: p.src_to(),
        })
    }

    /// Always [`READ_REQUEST_LEN`].
    pub fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`READ_REQUEST_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut ReadRequest<&mut T>) {
        p.set_sink_stag(self.sink_stag);
        p.set_sink_to(self.sink_to);
        p.set_size(self.size);
        p.set_src_stag(self.src_stag);
        p.set_src_to(self.src_to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_round_trip() {
        for v in 0u8..16 {
            let op = Opcode::from(v);
            assert_eq!(u8::from(op), v);
            if v > 7 {
                assert_eq!(op, Opcode::Unknown(v));
            }
        }
        // High bits (RV, reserved) are ignored.
        assert_eq!(Opcode::from(0x43), Opcode::Send);
        assert_eq!(ctrl_byte(Opcode::Send), 0x43);
        assert_eq!(ctrl_byte(Opcode::RdmaWrite), 0x40);
        assert_eq!(ctrl_byte(Opcode::Terminate), 0x47);
        assert_eq!(ctrl_version(0x41), 1);
        assert_eq!(ctrl_opcode(0x41), Opcode::ReadRequest);
    }

    #[test]
    fn opcode_properties() {
        assert_eq!(Opcode::RdmaWrite.is_tagged(), Some(true));
        assert_eq!(Opcode::Send.is_tagged(), Some(false));
        assert_eq!(Opcode::Unknown(9).is_tagged(), None);
        assert_eq!(Opcode::SendSeInvalidate.queue_number(), Some(QN_SEND));
        assert_eq!(Opcode::ReadRequest.queue_number(), Some(QN_READ_REQUEST));
        assert_eq!(Opcode::Terminate.queue_number(), Some(QN_TERMINATE));
        assert_eq!(Opcode::ReadResponse.queue_number(), None);
        assert_eq!(Opcode::ReadRequest.ulp_header_len(), Some(46));
        assert_eq!(Opcode::Terminate.ulp_header_len(), Some(22));
        assert!(Opcode::SendInvalidate.has_invalidate_stag());
        assert!(Opcode::SendSe.solicited());
    }

    // A Read Request header of rping's shape (64 bytes); the STags and
    // TOs are made up but distinct.
    static RREQ: [u8; 28] = [
        0x00, 0x00, 0x05, 0x01, // sink stag
        0x00, 0x00, 0x55, 0x83, 0xee, 0xf0, 0xdd, 0x50, // sink to
        0x00, 0x00, 0x00, 0x40, // size 64
        0x00, 0x00, 0x06, 0x02, // src stag
        0x00, 0x00, 0x56, 0x4f, 0xef, 0x63, 0x3d, 0x50, // src to
    ];

    #[test]
    fn read_request_vectors() {
        let p = ReadRequest::new_checked(&RREQ[..]).unwrap();
        let r = ReadRequestRepr::parse(&p).unwrap();
        assert_eq!(
            r,
            ReadRequestRepr {
                sink_stag: 0x501,
                sink_to: 0x5583_eef0_dd50,
                size: 64,
                src_stag: 0x602,
                src_to: 0x564f_ef63_3d50,
            }
        );
        let mut out = [0u8; READ_REQUEST_LEN];
        r.emit(&mut ReadRequest::new_unchecked(&mut out[..]));
        assert_eq!(out, RREQ);
        assert_eq!(
            ReadRequest::new_checked(&RREQ[..27]).unwrap_err(),
            Error::Truncated
        );
    }
}
