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

mod bytes;
pub mod crc;
pub mod ddp;
mod error;
pub mod mpa;
mod pktinfo;
pub mod rdmap;
pub mod terminate;

pub use error::{Error, Result};
