//! Wire formats of the iWARP stack: RFC 5044 MPA (with RFC 6581 enhanced
//! connection setup), RFC 5041 DDP and RFC 5040 RDMAP.
//!
//! # Layers
//!
//! An iWARP connection is a plain TCP byte stream. After the MPA
//! connection setup ([`mpa::Frame`], the "MPA ID Req Frame" / "MPA ID Rep
//! Frame" exchange, driven by [`crate::handshake`]), both directions carry
//! a sequence of FPDUs (framed PDUs):
//!
//! ```text
//! +---------------+------------------------------+-----+---------+
//! | ULPDU length  | ULPDU = DDP segment          | pad | CRC32C  |
//! | (2, BE)       | (DDP header, RDMAP header,   | 0-3 | (4)     |
//! |               |  payload)                    |     |         |
//! +---------------+------------------------------+-----+---------+
//! ```
//!
//! - [`mpa`] frames ULPDUs on the stream ([`mpa::deframe`],
//!   [`mpa::emit_fpdu`]), pads them to 4 bytes and protects them with a
//!   CRC32C ([`crc`]). Markers (a 4-byte pointer every 512 stream bytes)
//!   are described by [`mpa::Marker`] and the position helpers; Linux siw
//!   never negotiates them.
//! - [`ddp`] is the first header inside the ULPDU: a control byte (T, L,
//!   version), one byte reserved for the ULP (the RDMAP control byte), then
//!   either the tagged fields (STag, TO; 14 bytes in all) or the untagged
//!   fields (RsvdULP word, QN, MSN, MO; 18 bytes).
//! - [`rdmap`] lives in the DDP "reserved for ULP" bytes: its control byte
//!   (version, opcode) is byte 1 of the DDP header, and the untagged RsvdULP
//!   word carries the STag to invalidate. RDMA Read Requests carry an extra
//!   28-byte header ([`rdmap::ReadRequest`]), Terminate messages a
//!   variable one ([`terminate::Packet`]).
//!
//! # Conventions (after smoltcp's `wire`)
//!
//! Every header is a triplet:
//! - a zero-copy view `Packet<T: AsRef<[u8]>>` (or `Frame`, `ReadRequest`)
//!   with big-endian accessors; the byte ranges live in a private
//!   `mod field`;
//! - `new_checked` / `check_len` for untrusted input: once it has returned
//!   `Ok`, no accessor panics;
//! - a `Repr` with `parse`, `buffer_len` and `emit`. `parse` validates what
//!   the RFC makes a framing error; semantic checks that map to a Terminate
//!   (version numbers, QNs, MSNs) are left to the engine, which owns the
//!   mapping to [`terminate::TermCode`].
//!
//! Wire codes that this stack does not know are kept (`Opcode::Unknown`,
//! `TermCode::Unknown`) rather than rejected, so the engine decides what an
//! unknown value means and the fuzzers can round-trip anything.

use core::fmt;

pub mod crc;
pub mod ddp;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

/// A parse error of a wire header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the header (or than the lengths it
    /// announces).
    Truncated,
    /// The bytes are present but violate the format; the string names the
    /// rule.
    Malformed(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "buffer too short for the header it should contain"),
            Error::Malformed(why) => write!(f, "malformed header: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of a wire parse.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range inside a header (smoltcp's `Field`).
pub(crate) type Field = core::ops::Range<usize>;

/// Big-endian helpers shared by the views. Callers guarantee the range is
/// in bounds (the views' `check_len` does).
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
