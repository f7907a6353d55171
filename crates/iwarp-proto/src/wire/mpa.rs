//! MPA: Marker PDU Aligned framing, RFC 5044, with the enhanced connection
//! setup of RFC 6581.
//!
//! # Request / Reply frames (RFC 5044 §7.1, RFC 6581 §5)
//!
//! ```text
//! 0..16  key: "MPA ID Req Frame" or "MPA ID Rep Frame"
//! 16     flags: M(0x80) C(0x40) R(0x20) E(0x10, RFC 6581) res(0x0f)
//! 17     revision (1: RFC 5044, 2: RFC 6581)
//! 18..20 private data length (BE, at most 512)
//! 20..   private data; with E set, its first 4 bytes are the RFC 6581
//!        IRD/ORD block:
//!          IRD word: P2P(0x8000) RTR-Send(0x4000) IRD(14 bits)
//!          ORD word: RTR-Write(0x8000) RTR-Read(0x4000) ORD(14 bits)
//! ```
//!
//! The E bit ("enhanced connection establishment") is siw's
//! `MPA_RR_FLAG_ENHANCED` and cxgb4's `MPA_ENHANCED_RDMA_CONN`; the 0x08
//! bit is siw's private GSO experiment and is treated as reserved here.
//! siw sends flags `0x10`, rev 2, private data `00 01 00 01` by default
//! (IRD = ORD = 1) and `80 01 c0 01` in peer-to-peer mode (P2P, IRD 1;
//! Write and Read RTR offered, ORD 1).
//!
//! # FPDUs (RFC 5044 §4)
//!
//! ```text
//! ULPDU length (2, BE) | ULPDU | pad (0..3, to a multiple of 4) | CRC (4)
//! ```
//!
//! The CRC field is **always** present: when CRC was not negotiated it is
//! sent as zero and not checked (RFC 5044 §4.4; siw receives "pad + 4"
//! trailer bytes in every case, and every FPDU of `siw-default.pcap`
//! ends in four zero bytes). [`fpdu_len`] and [`deframe`] therefore count
//! the 4 bytes whatever `crc` says.
//!
//! Pad bytes are not checked on receive: siw does not zero them (in all
//! three captures, perftest's 2-byte Send carries the pad `00 40`, covered
//! by a good CRC in `siw-crc.pcap`). [`emit_fpdu`] sends zeros.
//!
//! # Markers (RFC 5044 §4.3, §5)
//!
//! When a receiver asked for markers (M flag), the sender inserts a 4-byte
//! marker `[reserved(2) = 0, FPDUPTR(2)]` in front of the first FPDU of
//! full operation and then every 512 bytes of the TCP stream. Positions
//! are counted in the bytes the sender puts on the stream, markers
//! included, starting at 0 at the first byte of the first FPDU (which is
//! the first marker): a marker starts at every stream position `p` with
//! `p % 512 == 0` ([`is_marker_pos`]). Wireshark's `iwarp_mpa` dissector
//! locates them the same way, from the TCP sequence number of the first
//! FPDU in each direction.
//!
//! FPDUPTR is the distance, in stream bytes, from the start of the FPDU
//! that holds the marker back to the marker: `marker_pos - fpdu_start`. A
//! marker that falls exactly where an FPDU begins belongs to that FPDU and
//! has FPDUPTR 0 (the FPDU's length field follows the marker). Markers
//! inside an FPDU are covered by its CRC, and are not counted by the ULPDU
//! length or the pad. Linux siw rejects connections that ask for markers;
//! this module only provides the positions and the marker format.

use core::fmt;

use super::bytes::{be16, put16};
use super::crc;
use super::error::{Error, Result};

/// Key of an MPA Request frame.
pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame.
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Request/Reply header: key, flags, revision, private data length.
pub const HEADER_LEN: usize = 20;
/// RFC 5044 §7.1: at most 512 bytes of private data (including the RFC
/// 6581 IRD/ORD block). Linux siw accepts only 256 (`RDMA_MAX_PRIVATE_DATA`).
pub const MAX_PRIVATE_DATA_LEN: usize = 512;
/// Length of the RFC 6581 IRD/ORD block at the start of the private data.
pub const ENHANCED_BLOCK_LEN: usize = 4;
/// The FPDU's ULPDU length field.
pub const ULPDU_LEN_FIELD: usize = 2;
/// The FPDU's CRC field.
pub const CRC_LEN: usize = 4;
/// A marker.
pub const MARKER_LEN: usize = 4;
/// Markers come every 512 stream bytes (RFC 5044 §5).
pub const MARKER_PERIOD: u64 = 512;
/// Revision of RFC 5044.
pub const REVISION_1: u8 = 1;
/// Revision of RFC 6581.
pub const REVISION_2: u8 = 2;

/// M: the sender of the frame wants markers on the FPDUs it receives.
pub const FLAG_MARKERS: u8 = 0x80;
/// C: CRC wanted.
pub const FLAG_CRC: u8 = 0x40;
/// R: connection rejected (reply only).
pub const FLAG_REJECT: u8 = 0x20;
/// E: the private data starts with the RFC 6581 IRD/ORD block.
pub const FLAG_ENHANCED: u8 = 0x10;
/// Reserved flag bits (sent as zero).
pub const MASK_RESERVED: u8 = 0x0f;

/// IRD word: peer-to-peer mode, an RTR message will be sent (RFC 6581).
pub const ENH_PEER_TO_PEER: u16 = 0x8000;
/// IRD word: a zero-length Send is an acceptable RTR message.
pub const ENH_RTR_SEND: u16 = 0x4000;
/// ORD word: a zero-length RDMA Write is an acceptable RTR message.
pub const ENH_RTR_WRITE: u16 = 0x8000;
/// ORD word: a zero-length RDMA Read is an acceptable RTR message.
pub const ENH_RTR_READ: u16 = 0x4000;
/// The 14-bit IRD / ORD value.
pub const ENH_IRD_ORD_MASK: u16 = 0x3fff;

/// Padding that makes `2 + ulpdu_len + pad` a multiple of 4 (RFC 5044 §4.1).
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ULPDU_LEN_FIELD + ulpdu_len) % 4) % 4
}

/// Length on the stream (without markers) of the FPDU carrying an ULPDU
/// of `ulpdu_len` bytes: `2 + ulpdu + pad + 4`.
///
/// The 4-byte CRC field is present whether or not CRC was negotiated
/// (RFC 5044 §4.4; what siw sends and expects), so `crc` does not change
/// the result; it is kept so call sites read as what they mean.
pub fn fpdu_len(ulpdu_len: usize, crc: bool) -> usize {
    let _ = crc;
    ULPDU_LEN_FIELD + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

mod field {
    use crate::wire::bytes::Field;
    pub const KEY: Field = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LEN: Field = 18..20;
    pub const PD: usize = 20;
}

/// Whether a frame is a Request or a Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Request,
    Reply,
}

impl FrameKind {
    /// The 16-byte key of this kind.
    pub fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        }
    }
}

/// View of an MPA Request or Reply frame (also used for a reject, which
/// is a Reply with R set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer and checks its length (see [`Frame::check_len`]).
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks the 20-byte header and the private data it announces are in
    /// the buffer. After `Ok`, no accessor panics. (Key and the 512-byte
    /// limit are checked by [`FrameRepr::parse`].)
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        // RFC 5044 §7.1.1: 20-byte header, then PD_Length bytes.
        if b.len() < HEADER_LEN || b.len() < HEADER_LEN + self.private_data_len() as usize {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16-byte key.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[field::KEY]
    }

    /// The key is "MPA ID Req Frame".
    pub fn is_request(&self) -> bool {
        self.key() == KEY_REQ
    }

    /// The key is "MPA ID Rep Frame".
    pub fn is_reply(&self) -> bool {
        self.key() == KEY_REP
    }

    /// The kind, if the key is one of the two.
    pub fn kind(&self) -> Option<FrameKind> {
        if self.is_request() {
            Some(FrameKind::Request)
        } else if self.is_reply() {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }

    /// The whole flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// M: the sender wants markers on the FPDUs it receives.
    pub fn markers(&self) -> bool {
        self.flags() & FLAG_MARKERS != 0
    }

    /// C: CRC.
    pub fn crc(&self) -> bool {
        self.flags() & FLAG_CRC != 0
    }

    /// R: rejected.
    pub fn reject(&self) -> bool {
        self.flags() & FLAG_REJECT != 0
    }

    /// E (RFC 6581): the private data starts with the IRD/ORD block.
    pub fn enhanced(&self) -> bool {
        self.flags() & FLAG_ENHANCED != 0
    }

    /// The reserved flag bits (0x0f).
    pub fn reserved_flags(&self) -> u8 {
        self.flags() & MASK_RESERVED
    }

    /// The revision byte.
    pub fn revision(&self) -> u8 {
        self.buffer.as_ref()[field::REV]
    }

    /// The private data length field.
    pub fn private_data_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PD_LEN.start)
    }

    /// All private data (including an RFC 6581 block).
    pub fn private_data(&self) -> &[u8] {
        let n = self.private_data_len() as usize;
        &self.buffer.as_ref()[field::PD..field::PD + n]
    }

    /// Total frame length: 20 + private data length.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.private_data_len() as usize
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Writes the key of `kind`.
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(kind.key());
    }

    /// Sets the whole flags byte.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }

    fn set_flag(&mut self, bit: u8, on: bool) {
        let f = self.flags();
        self.set_flags(if on { f | bit } else { f & !bit });
    }

    pub fn set_markers(&mut self, v: bool) {
        self.set_flag(FLAG_MARKERS, v)
    }

    pub fn set_crc(&mut self, v: bool) {
        self.set_flag(FLAG_CRC, v)
    }

    pub fn set_reject(&mut self, v: bool) {
        self.set_flag(FLAG_REJECT, v)
    }

    pub fn set_enhanced(&mut self, v: bool) {
        self.set_flag(FLAG_ENHANCED, v)
    }

    pub fn set_revision(&mut self, v: u8) {
        self.buffer.as_mut()[field::REV] = v;
    }

    pub fn set_private_data_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::PD_LEN.start, v)
    }

    /// The private data, writable (sized by the length field).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let n = self.private_data_len() as usize;
        &mut self.buffer.as_mut()[field::PD..field::PD + n]
    }
}

/// The RFC 6581 IRD/ORD block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct EnhancedParams {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// P2P: peer-to-peer mode, the initiator will send an RTR message.
    pub peer_to_peer: bool,
    /// A zero-length RDMA Write is (offered / chosen as) the RTR message.
    pub rtr_zero_write: bool,
    /// A zero-length RDMA Read is the RTR message.
    pub rtr_zero_read: bool,
    /// A zero-length Send is the RTR message.
    pub rtr_zero_send: bool,
}

impl EnhancedParams {
    /// Reads the 4-byte block.
    ///
    /// # Panics
    /// If `b` is shorter than 4 bytes.
    pub fn from_bytes(b: &[u8]) -> EnhancedParams {
        let ird = be16(b, 0);
        let ord = be16(b, 2);
        EnhancedParams {
            ird: ird & ENH_IRD_ORD_MASK,
            ord: ord & ENH_IRD_ORD_MASK,
            peer_to_peer: ird & ENH_PEER_TO_PEER != 0,
            rtr_zero_send: ird & ENH_RTR_SEND != 0,
            rtr_zero_write: ord & ENH_RTR_WRITE != 0,
            rtr_zero_read: ord & ENH_RTR_READ != 0,
        }
    }

    /// The 4-byte block (IRD and ORD masked to 14 bits).
    pub fn to_bytes(&self) -> [u8; 4] {
        let mut ird = self.ird & ENH_IRD_ORD_MASK;
        let mut ord = self.ord & ENH_IRD_ORD_MASK;
        if self.peer_to_peer {
            ird |= ENH_PEER_TO_PEER;
        }
        if self.rtr_zero_send {
            ird |= ENH_RTR_SEND;
        }
        if self.rtr_zero_write {
            ord |= ENH_RTR_WRITE;
        }
        if self.rtr_zero_read {
            ord |= ENH_RTR_READ;
        }
        let [a, b] = ird.to_be_bytes();
        let [c, d] = ord.to_be_bytes();
        [a, b, c, d]
    }
}

/// A parsed MPA Request/Reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    pub kind: FrameKind,
    /// M flag.
    pub markers: bool,
    /// C flag.
    pub crc: bool,
    /// R flag.
    pub reject: bool,
    /// Revision byte.
    pub revision: u8,
    /// `Some` iff the E flag is set: the IRD/ORD block.
    pub enhanced: Option<EnhancedParams>,
    /// ULP private data, excluding the 4-byte RFC 6581 block.
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// Parses a frame: the key must be one of the two (RFC 5044 §7.1), the
    /// private data at most 512 bytes (RFC 5044 §7.1) and, with E set, at
    /// least the 4-byte block (RFC 6581 §5). The revision is not judged
    /// here (the handshake does).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&'a T>) -> Result<FrameRepr<'a>> {
        frame.check_len()?;
        let buf: &'a [u8] = frame.buffer.as_ref();
        let f = Frame::new_unchecked(buf);
        let kind = f.kind().ok_or(Error::Malformed(
            "RFC 5044 §7.1: key is neither \"MPA ID Req Frame\" nor \"MPA ID Rep Frame\"",
        ))?;
        if f.private_data_len() as usize > MAX_PRIVATE_DATA_LEN {
            return Err(Error::Malformed(
                "RFC 5044 §7.1: private data length exceeds 512",
            ));
        }
        let pd: &'a [u8] = &buf[field::PD..field::PD + f.private_data_len() as usize];
        let (enhanced, private_data) = if f.enhanced() {
            if pd.len() < ENHANCED_BLOCK_LEN {
                return Err(Error::Malformed(
                    "RFC 6581 §5: enhanced flag set but private data shorter than the IRD/ORD block",
                ));
            }
            (
                Some(EnhancedParams::from_bytes(pd)),
                &pd[ENHANCED_BLOCK_LEN..],
            )
        } else {
            (None, pd)
        };
        Ok(FrameRepr {
            kind,
            markers: f.markers(),
            crc: f.crc(),
            reject: f.reject(),
            revision: f.revision(),
            enhanced,
            private_data,
        })
    }

    /// Value of the private data length field this frame gets.
    pub fn private_data_len(&self) -> usize {
        self.private_data.len() + self.enhanced.map_or(0, |_| ENHANCED_BLOCK_LEN)
    }

    /// Frame length: 20 + block + private data.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data_len()
    }

    /// Writes the frame (reserved flag bits zero).
    ///
    /// # Panics
    /// If the buffer is shorter than [`FrameRepr::buffer_len`] or the
    /// private data does not fit the 16-bit length field (callers keep it
    /// within [`MAX_PRIVATE_DATA_LEN`]).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, frame: &mut Frame<&mut T>) {
        let pd_len = u16::try_from(self.private_data_len())
            .expect("MPA private data longer than the 16-bit length field");
        frame.set_kind(self.kind);
        let flags = (if self.markers { FLAG_MARKERS } else { 0 })
            | (if self.crc { FLAG_CRC } else { 0 })
            | (if self.reject { FLAG_REJECT } else { 0 })
            | (if self.enhanced.is_some() {
                FLAG_ENHANCED
            } else {
                0
            });
        frame.set_flags(flags);
        frame.set_revision(self.revision);
        frame.set_private_data_len(pd_len);
        let pd = frame.private_data_mut();
        let mut at = 0;
        if let Some(e) = self.enhanced {
            pd[..ENHANCED_BLOCK_LEN].copy_from_slice(&e.to_bytes());
            at = ENHANCED_BLOCK_LEN;
        }
        pd[at..].copy_from_slice(self.private_data);
    }

    /// Convenience: the frame as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut Frame::new_unchecked(&mut v[..]));
        v
    }
}

/// Total frame length from the first 20 bytes of the stream: validates the
/// key (RFC 5044 §7.1) and the 512-byte private data limit, returns
/// `20 + private data length`. `Err(Truncated)` if fewer than 20 bytes.
pub fn frame_total_len(header: &[u8]) -> Result<usize> {
    if header.len() < HEADER_LEN {
        return Err(Error::Truncated);
    }
    let f = Frame::new_unchecked(header);
    if f.kind().is_none() {
        return Err(Error::Malformed(
            "RFC 5044 §7.1: key is neither \"MPA ID Req Frame\" nor \"MPA ID Rep Frame\"",
        ));
    }
    let n = f.private_data_len() as usize;
    if n > MAX_PRIVATE_DATA_LEN {
        return Err(Error::Malformed(
            "RFC 5044 §7.1: private data length exceeds 512",
        ));
    }
    Ok(HEADER_LEN + n)
}

/// An MPA marker (RFC 5044 §4.3): 2 reserved bytes then FPDUPTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Marker {
    /// Bytes from the start of the FPDU holding the marker back to the
    /// marker (0 when the marker sits in front of the FPDU's length field).
    pub fpdu_ptr: u16,
}

impl Marker {
    /// Reads a marker from the first 4 bytes (reserved bytes ignored).
    pub fn parse(b: &[u8]) -> Result<Marker> {
        if b.len() < MARKER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Marker {
            fpdu_ptr: be16(b, 2),
        })
    }

    /// Writes the 4 marker bytes.
    ///
    /// # Panics
    /// If `b` is shorter than 4 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = 0;
        b[1] = 0;
        put16(b, 2, self.fpdu_ptr);
    }
}

/// Whether a marker starts at `stream_pos` (bytes since the first byte of
/// the first FPDU in this direction, markers included): every multiple of
/// 512, starting with 0 (RFC 5044 §5).
pub fn is_marker_pos(stream_pos: u64) -> bool {
    // MARKER_PERIOD is a power of two.
    stream_pos & (MARKER_PERIOD - 1) == 0
}

/// The first marker position at or after `stream_pos`.
pub fn next_marker_pos(stream_pos: u64) -> u64 {
    stream_pos.div_ceil(MARKER_PERIOD) * MARKER_PERIOD
}

/// Result of [`deframe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deframe<'a> {
    /// The buffer does not hold a whole FPDU yet.
    NeedMore,
    /// One FPDU: its ULPDU and the stream bytes it took (length field,
    /// ULPDU, pad, CRC).
    Frame { ulpdu: &'a [u8], consumed: usize },
}

/// A fatal framing error; the engine turns it into a Terminate
/// ([`FpduError::term_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FpduError {
    /// The ULPDU length is below the smallest DDP segment (the 14-byte
    /// tagged header, RFC 5041 §4.2): the stream cannot be framed.
    LengthTooShort,
    /// The CRC field does not match the CRC32C of the FPDU (RFC 5044 §4.4).
    CrcMismatch { expected: u32, received: u32 },
}

impl FpduError {
    /// The cause, for the Terminate mapping ([`crate::fault::term_code`]).
    pub fn fault(&self) -> crate::fault::Fault {
        use crate::fault::Fault;
        match self {
            FpduError::LengthTooShort => Fault::UlpduLength,
            FpduError::CrcMismatch { .. } => Fault::FpduCrc,
        }
    }

    /// The Terminate code for this error: LLP CRC error, or the "FPDU
    /// start" code for a length that cannot frame a DDP segment.
    pub fn term_code(&self) -> super::terminate::TermCode {
        crate::fault::term_code(self.fault())
    }
}

impl fmt::Display for FpduError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FpduError::LengthTooShort => write!(
                f,
                "MPA ULPDU length shorter than the smallest DDP header ({} bytes): framing lost",
                super::ddp::TAGGED_HDR_LEN
            ),
            FpduError::CrcMismatch { expected, received } => write!(
                f,
                "MPA CRC mismatch: computed {expected:#010x}, FPDU carries {received:#010x}"
            ),
        }
    }
}

impl std::error::Error for FpduError {}

/// The FPDU CRC check of RFC 5044 §4.4, shared by [`deframe`] and the
/// engine's streaming receive path: `computed` is the CRC32C of the FPDU
/// (length field, ULPDU, pad; markers too when present), `field` the 4
/// bytes of its CRC field as received.
pub fn check_crc(computed: u32, field: [u8; CRC_LEN]) -> core::result::Result<(), FpduError> {
    let received = crc::crc_from_wire(field);
    if computed == received {
        Ok(())
    } else {
        Err(FpduError::CrcMismatch {
            expected: computed,
            received,
        })
    }
}

/// The FPDU receive state shared by [`deframe`] and the engine's streaming
/// receive path (RFC 5044 §4): the ULPDU length, the running CRC32C and the
/// trailer (pad and CRC field), collected across any split of the input.
///
/// Per FPDU: [`FpduRx::begin`] with the ULPDU length, [`FpduRx::fold`] every
/// byte the CRC covers as it arrives (length field, ULPDU; markers are the
/// caller's), then [`FpduRx::trailer`] with the bytes after the ULPDU until
/// it returns the verdict; [`FpduRx::reset`] before the next FPDU.
#[derive(Debug, Clone, Copy)]
pub struct FpduRx {
    crc_on: bool,
    crc: u32,
    ulpdu_len: usize,
    trailer: [u8; 3 + CRC_LEN],
    trailer_have: usize,
    trailer_need: usize,
}

impl FpduRx {
    /// A receiver that checks the CRC field when `crc_on` (RFC 5044 §7.1.2
    /// C flag) and skips it unchecked otherwise.
    pub const fn new(crc_on: bool) -> FpduRx {
        FpduRx {
            crc_on,
            crc: 0,
            ulpdu_len: 0,
            trailer: [0; 3 + CRC_LEN],
            trailer_have: 0,
            trailer_need: CRC_LEN,
        }
    }

    /// Ready for the next FPDU.
    #[inline]
    pub fn reset(&mut self) {
        self.crc = 0;
        self.trailer_have = 0;
    }

    /// The FPDU's ULPDU length field has been read: sizes its trailer.
    #[inline]
    pub fn begin(&mut self, ulpdu_len: usize) {
        self.ulpdu_len = ulpdu_len;
        self.trailer_need = pad_len(ulpdu_len) + CRC_LEN;
    }

    /// The ULPDU length given to [`FpduRx::begin`].
    #[inline]
    pub fn ulpdu_len(&self) -> usize {
        self.ulpdu_len
    }

    /// Whether the CRC is checked.
    #[inline]
    pub fn crc_on(&self) -> bool {
        self.crc_on
    }

    /// Adds bytes the CRC covers (a no-op without CRC).
    #[inline]
    pub fn fold(&mut self, bytes: &[u8]) {
        if self.crc_on {
            self.crc = crc::crc32c_append(self.crc, bytes);
        }
    }

    /// The running CRC, for a caller that folds bytes it visits elsewhere
    /// (see [`FpduRx::set_running_crc`]).
    #[inline]
    pub fn running_crc(&self) -> u32 {
        self.crc
    }

    /// Replaces the running CRC (after folding bytes outside [`FpduRx::fold`]).
    #[inline]
    pub fn set_running_crc(&mut self, crc: u32) {
        self.crc = crc;
    }

    /// True while the next trailer byte belongs to the CRC field (a marker
    /// there is not covered by the CRC, RFC 5044 §4.4).
    #[inline]
    pub fn in_crc_field(&self) -> bool {
        self.trailer_have > self.trailer_need - CRC_LEN
    }

    /// Takes trailer bytes (pad, then CRC field) from the front of `chunk`,
    /// folding the pad into the CRC as it goes. Returns the bytes taken and,
    /// once the CRC field is complete, the verdict of [`check_crc`].
    #[inline]
    pub fn trailer(
        &mut self,
        chunk: &[u8],
    ) -> (usize, Option<core::result::Result<(), FpduError>>) {
        let have = self.trailer_have;
        let n = (self.trailer_need - have).min(chunk.len());
        self.trailer[have..have + n].copy_from_slice(&chunk[..n]);
        // Pad bytes are covered by the CRC (RFC 5044 §4.4); fold them now
        // so a marker inside the trailer keeps its order.
        let pad = self.trailer_need - CRC_LEN;
        if have < pad {
            let k = (pad - have).min(n);
            self.fold(&chunk[..k]);
        }
        self.trailer_have += n;
        if self.trailer_have < self.trailer_need {
            return (n, None);
        }
        if !self.crc_on {
            return (n, Some(Ok(())));
        }
        let mut field = [0u8; CRC_LEN];
        field.copy_from_slice(&self.trailer[pad..pad + CRC_LEN]);
        (n, Some(check_crc(self.crc, field)))
    }
}

/// Smallest ULPDU [`deframe`] accepts: a tagged DDP header.
pub const MIN_ULPDU_LEN: usize = super::ddp::TAGGED_HDR_LEN;

/// Takes one FPDU from the front of `buf` (no markers; `buf` starts at an
/// FPDU boundary), with the [`FpduRx`] state machine the engine's
/// streaming receive path uses.
///
/// Returns `NeedMore` until the whole FPDU, CRC field included, is in
/// `buf`: siw often sends the 4 CRC bytes in a segment of their own. With
/// `crc` the CRC is checked (RFC 5044 §4.4); without it the field is
/// skipped unchecked.
pub fn deframe(buf: &[u8], crc: bool) -> core::result::Result<Deframe<'_>, FpduError> {
    if buf.len() < ULPDU_LEN_FIELD {
        return Ok(Deframe::NeedMore);
    }
    let ulpdu_len = be16(buf, 0) as usize;
    if ulpdu_len < MIN_ULPDU_LEN {
        return Err(FpduError::LengthTooShort);
    }
    let total = fpdu_len(ulpdu_len, crc);
    if buf.len() < total {
        return Ok(Deframe::NeedMore);
    }
    // The same FPDU state machine as the engine's receive path.
    let mut rx = FpduRx::new(crc);
    rx.begin(ulpdu_len);
    let body_end = ULPDU_LEN_FIELD + ulpdu_len;
    rx.fold(&buf[..body_end]);
    match rx.trailer(&buf[body_end..total]) {
        (_, Some(verdict)) => verdict?,
        (_, None) => unreachable!("the whole trailer is in the buffer"),
    }
    Ok(Deframe::Frame {
        ulpdu: &buf[ULPDU_LEN_FIELD..ULPDU_LEN_FIELD + ulpdu_len],
        consumed: total,
    })
}

/// Appends the FPDU of `ulpdu` to `out`: length, ULPDU, zero pad, and the
/// CRC (or four zero bytes without CRC).
///
/// # Panics
/// If `ulpdu` is longer than 65535 bytes.
pub fn emit_fpdu(ulpdu: &[u8], crc: bool, out: &mut Vec<u8>) {
    let len = u16::try_from(ulpdu.len()).expect("ULPDU longer than 65535 bytes");
    let start = out.len();
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(ulpdu);
    out.resize(out.len() + pad_len(ulpdu.len()), 0);
    let c = if crc { crc::crc32c(&out[start..]) } else { 0 };
    out.extend_from_slice(&crc::crc_to_wire(c));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// siw-default.pcap frame 4, the rping MPA Request.
    const SIW_DEFAULT_REQ: [u8; 24] = *b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01";
    /// siw-p2p.pcap, the peer-to-peer MPA Request.
    const SIW_P2P_REQ: [u8; 24] = *b"MPA ID Req Frame\x10\x02\x00\x04\x80\x01\xc0\x01";

    /// `FpduRx` fed an FPDU in any two pieces gives `deframe`'s verdict.
    #[test]
    fn fpdu_rx_resumes_across_any_split() {
        for ulen in [14usize, 15, 17, 22, 40] {
            let ulpdu: Vec<u8> = (0..ulen as u8).collect();
            for crc in [false, true] {
                let mut good = Vec::new();
                emit_fpdu(&ulpdu, crc, &mut good);
                let mut bad = good.clone();
                *bad.last_mut().unwrap() ^= 1;
                for (fpdu, ok) in [(&good, true), (&bad, !crc)] {
                    assert_eq!(deframe(fpdu, crc).is_ok(), ok);
                    let body = ULPDU_LEN_FIELD + ulen;
                    for cut in body..=fpdu.len() {
                        let mut rx = FpduRx::new(crc);
                        rx.begin(ulen);
                        rx.fold(&fpdu[..body]);
                        let (n, v) = rx.trailer(&fpdu[body..cut]);
                        assert_eq!(n, cut - body);
                        let v = match v {
                            Some(v) => v,
                            None => {
                                let (m, v) = rx.trailer(&fpdu[cut..]);
                                assert_eq!(m, fpdu.len() - cut);
                                v.expect("trailer complete")
                            }
                        };
                        assert_eq!(v.is_ok(), ok, "ulen {ulen} crc {crc} cut {cut}");
                    }
                }
            }
        }
    }

    #[test]
    fn pad_and_len() {
        assert_eq!(pad_len(22), 0);
        assert_eq!(pad_len(34), 0);
        assert_eq!(pad_len(14), 0);
        assert_eq!(pad_len(15), 3);
        assert_eq!(pad_len(16), 2);
        assert_eq!(pad_len(17), 1);
        assert_eq!(fpdu_len(22, false), 28);
        assert_eq!(fpdu_len(22, true), 28);
        assert_eq!(fpdu_len(15, true), 24);
    }

    #[test]
    fn deconstruct_request() {
        let f = Frame::new_checked(&SIW_DEFAULT_REQ[..]).unwrap();
        assert!(f.is_request() && !f.is_reply());
        assert!(!f.markers() && !f.crc() && !f.reject() && f.enhanced());
        assert_eq!(f.revision(), 2);
        assert_eq!(f.private_data_len(), 4);
        let r = FrameRepr::parse(&f).unwrap();
        assert_eq!(
            r.enhanced,
            Some(EnhancedParams {
                ird: 1,
                ord: 1,
                ..Default::default()
            })
        );
        assert!(r.private_data.is_empty());
        assert_eq!(r.to_vec(), SIW_DEFAULT_REQ);
    }

    #[test]
    fn p2p_bits() {
        let r = FrameRepr::parse(&Frame::new_checked(&SIW_P2P_REQ[..]).unwrap()).unwrap();
        assert_eq!(
            r.enhanced,
            Some(EnhancedParams {
                ird: 1,
                ord: 1,
                peer_to_peer: true,
                rtr_zero_write: true,
                rtr_zero_read: true,
                rtr_zero_send: false,
            })
        );
        assert_eq!(r.to_vec(), SIW_P2P_REQ);
    }

    #[test]
    fn bad_frames() {
        assert_eq!(
            Frame::new_checked(&SIW_DEFAULT_REQ[..19]),
            Err(Error::Truncated)
        );
        assert_eq!(
            Frame::new_checked(&SIW_DEFAULT_REQ[..23]),
            Err(Error::Truncated)
        );
        let mut k = SIW_DEFAULT_REQ;
        k[4] = b'X';
        assert!(matches!(
            FrameRepr::parse(&Frame::new_checked(&k[..]).unwrap()),
            Err(Error::Malformed(_))
        ));
        assert!(matches!(frame_total_len(&k), Err(Error::Malformed(_))));
        // E set with fewer than 4 bytes of private data.
        let mut e = SIW_DEFAULT_REQ;
        e[19] = 2;
        assert!(matches!(
            FrameRepr::parse(&Frame::new_checked(&e[..22]).unwrap()),
            Err(Error::Malformed(_))
        ));
        // 513 bytes of private data.
        let mut big = SIW_DEFAULT_REQ.to_vec();
        big[18..20].copy_from_slice(&513u16.to_be_bytes());
        big.resize(20 + 513, 0);
        assert!(matches!(frame_total_len(&big), Err(Error::Malformed(_))));
        assert!(matches!(
            FrameRepr::parse(&Frame::new_checked(&big[..]).unwrap()),
            Err(Error::Malformed(_))
        ));
        big[18..20].copy_from_slice(&512u16.to_be_bytes());
        assert_eq!(frame_total_len(&big), Ok(532));
        assert_eq!(frame_total_len(&big[..19]), Err(Error::Truncated));
    }

    #[test]
    fn markers() {
        assert!(is_marker_pos(0));
        assert!(is_marker_pos(512));
        assert!(!is_marker_pos(511));
        assert_eq!(next_marker_pos(0), 0);
        assert_eq!(next_marker_pos(1), 512);
        assert_eq!(next_marker_pos(512), 512);
        assert_eq!(next_marker_pos(1025), 1536);
        let m = Marker { fpdu_ptr: 0x1234 };
        let mut b = [0xffu8; 4];
        m.emit(&mut b);
        assert_eq!(b, [0, 0, 0x12, 0x34]);
        assert_eq!(Marker::parse(&b), Ok(m));
        assert_eq!(Marker::parse(&b[..3]), Err(Error::Truncated));
    }

    #[test]
    fn deframe_basic() {
        let ulpdu: Vec<u8> = (0..15u8).collect();
        for crc in [false, true] {
            let mut s = Vec::new();
            emit_fpdu(&ulpdu, crc, &mut s);
            assert_eq!(s.len(), 24);
            for cut in 0..s.len() {
                assert_eq!(deframe(&s[..cut], crc), Ok(Deframe::NeedMore));
            }
            assert_eq!(
                deframe(&s, crc),
                Ok(Deframe::Frame {
                    ulpdu: &ulpdu,
                    consumed: 24
                })
            );
            if crc {
                s[5] ^= 1;
                assert!(matches!(
                    deframe(&s, true),
                    Err(FpduError::CrcMismatch { .. })
                ));
            } else {
                assert_eq!(&s[20..], &[0, 0, 0, 0]);
            }
        }
        assert_eq!(deframe(&[0, 13], false), Err(FpduError::LengthTooShort));
    }
}
