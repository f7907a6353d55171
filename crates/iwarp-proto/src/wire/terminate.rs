//! The RDMAP Terminate message, RFC 5040 §4.8 (format) and §7 (error
//! codes), with the DDP error codes of RFC 5041 §7 and the LLP (MPA) codes
//! of RFC 5044 §8 / RFC 6581 §8 (as registered in RFC 6580).
//!
//! A Terminate is an untagged DDP segment on queue 2 ([`super::rdmap::QN_TERMINATE`],
//! MSN counting from 1, MO 0, L set, RDMAP opcode 7). [`Packet`] views the
//! body after that 18-byte DDP header:
//!
//! ```text
//! byte 0     Layer(4) | EType(4)
//! byte 1     Error Code
//! byte 2..4  M D R (bits 7, 6, 5 of byte 2), 13 reserved bits
//! if D:      DDP Segment Length (2 bytes, BE), then the DDP header of the
//!            offending segment: 14 bytes if its T bit is set, else 18
//! if R:      the RDMAP header of the offending message (28 bytes for an
//!            RDMA Read Request)
//! ```
//!
//! - **M** "DDP Segment Length valid": the 2-byte length field holds a
//!   meaningful value.
//! - **D** "DDP header included": the 2-byte length field and the copied
//!   DDP header are present. Wireshark's `iwarp_ddp_rdmap` dissector reads
//!   the length field and the DDP header only when D is set, and siw's
//!   receiver (`siw_proc_terminate`) reads them as the 2-byte MPA length
//!   and DDP header of an ordinary FPDU (`struct iwarp_ctrl` onwards).
//! - **R** "RDMAP header included": the Read Request header follows.
//!
//! What siw sends (`siw_send_terminate`): M and D always together; the
//! length field is the offending ULPDU length minus its DDP/RDMAP header
//! length (i.e. the payload bytes); for a DDP-layer error the copied DDP
//! header (14 or 18 bytes); for an RDMAP remote protection error M, D and R
//! with the 18-byte untagged header, plus the 28-byte Read Request header
//! when the offending message was a Read Request (for a Send, siw sets R but
//! copies no RDMAP bytes). For catastrophic errors, version and opcode
//! errors nothing follows the 4 control bytes.
//!
//! [`TerminateRepr::parse`] therefore reads up to 28 bytes after the DDP
//! header when R is set, and accepts fewer (siw's R-for-Send case).

use super::bytes::{be16, put16};
use super::ddp;
use super::error::{Error, Result};

/// Length of the Terminate control field (layer/etype, code, flags, reserved).
pub const HDR_LEN: usize = 4;
/// Length of the DDP Segment Length field (present when D is set).
pub const DDP_SEG_LEN_LEN: usize = 2;
/// Length of the copied RDMAP header when it is a Read Request.
pub const RDMAP_HDR_LEN: usize = super::rdmap::READ_REQUEST_LEN;

/// M flag: DDP Segment Length valid (byte 2).
pub const FLAG_M: u8 = 0x80;
/// D flag: DDP header included (byte 2).
pub const FLAG_D: u8 = 0x40;
/// R flag: RDMAP header included (byte 2).
pub const FLAG_R: u8 = 0x20;

/// Layer value of RDMAP errors.
pub const LAYER_RDMAP: u8 = 0;
/// Layer value of DDP errors.
pub const LAYER_DDP: u8 = 1;
/// Layer value of lower-layer-protocol (MPA) errors.
pub const LAYER_LLP: u8 = 2;

mod field {
    use crate::wire::bytes::Field;
    pub const LAYER_ETYPE: usize = 0;
    pub const ECODE: usize = 1;
    pub const FLAGS: usize = 2;
    pub const RESERVED: Field = 2..4;
    pub const DDP_SEG_LEN: Field = 4..6;
}

/// A Terminate error: the (layer, etype, ecode) triple of RFC 5040 §7.
///
/// Values from siw `iwarp.h` and the RFCs; unknown triples are kept in
/// [`TermCode::Unknown`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TermCode {
    /// RDMAP remote protection error 0x00.
    RdmapInvalidStag,
    /// RDMAP remote protection error 0x01.
    RdmapBaseBounds,
    /// RDMAP remote protection error 0x02.
    RdmapAccessRights,
    /// RDMAP remote protection error 0x03.
    RdmapStagNotAssociated,
    /// RDMAP remote protection error 0x04.
    RdmapToWrap,
    /// RDMAP remote protection error 0x09 (siw uses it when the
    /// invalidation fails an access check).
    RdmapCannotInvalidate,
    /// RDMAP remote protection error 0xFF.
    RdmapProtectionUnspecified,
    /// RDMAP remote operation error 0x05.
    RdmapInvalidVersion,
    /// RDMAP remote operation error 0x06.
    RdmapUnexpectedOpcode,
    /// RDMAP remote operation error 0x07.
    RdmapCatastrophicStream,
    /// RDMAP remote operation error 0x08.
    RdmapCatastrophicGlobal,
    /// RDMAP remote operation error 0x09 (siw: invalidation failed for
    /// another reason than access rights).
    RdmapOperationCannotInvalidate,
    /// RDMAP remote operation error 0xFF.
    RdmapUnspecified,
    /// RDMAP local catastrophic error (etype 0; siw sends code 0xFF).
    RdmapLocalCatastrophic,
    /// RDMAP local catastrophic error with code 0x00, as this stack sends
    /// it (RFC 6580 registers "0x0/0x0/ALL": any code means the same).
    RdmapLocalCatastrophicZero,
    /// DDP local catastrophic error (etype 0, code 0).
    DdpCatastrophic,
    /// DDP tagged buffer error 0x00.
    DdpTaggedInvalidStag,
    /// DDP tagged buffer error 0x01.
    DdpTaggedBaseBounds,
    /// DDP tagged buffer error 0x02.
    DdpTaggedStagNotAssociated,
    /// DDP tagged buffer error 0x03.
    DdpTaggedToWrap,
    /// DDP tagged buffer error 0x04.
    DdpTaggedInvalidVersion,
    /// DDP untagged buffer error 0x01.
    DdpUntaggedInvalidQn,
    /// DDP untagged buffer error 0x02: invalid MSN, no buffer available.
    DdpUntaggedNoBuffer,
    /// DDP untagged buffer error 0x03: MSN out of range.
    DdpUntaggedInvalidMsnRange,
    /// DDP untagged buffer error 0x04.
    DdpUntaggedInvalidMo,
    /// DDP untagged buffer error 0x05: message too long for the buffer.
    DdpUntaggedTooLong,
    /// DDP untagged buffer error 0x06.
    DdpUntaggedInvalidVersion,
    /// MPA error 0x01: TCP connection closed, terminated or lost.
    MpaTcpStreamLost,
    /// MPA error 0x02: received FPDU failed its CRC.
    MpaCrcError,
    /// MPA error 0x03: a marker and the ULPDU length disagree on where an
    /// FPDU starts (siw: `LLP_ECODE_FPDU_START`). Also the code for a
    /// ULPDU length that cannot frame a DDP segment, see
    /// [`TermCode::MpaInvalidUlpduLen`].
    MpaMarkerError,
    /// MPA error 0x04: invalid MPA Request or Reply frame.
    MpaInvalidReqRep,
    /// MPA error 0x05 (RFC 6581): local catastrophic error.
    MpaLocalCatastrophic,
    /// MPA error 0x06 (RFC 6581): the initiator's IRD cannot satisfy the
    /// responder's ORD.
    MpaInsufficientIrd,
    /// MPA error 0x07 (RFC 6581): no RTR message type both sides support.
    MpaNoMatchingRtr,
    /// Any other triple, kept as received.
    Unknown { layer: u8, etype: u8, ecode: u8 },
}

impl TermCode {
    /// RFC 5044 §8 has no code of its own for a bad ULPDU length: the FPDU
    /// framing is lost, which is the "FPDU start" code 0x03 (siw's
    /// `LLP_ECODE_FPDU_START`). This alias keeps the engine's name for it.
    #[allow(non_upper_case_globals)]
    pub const MpaInvalidUlpduLen: TermCode = TermCode::MpaMarkerError;

    /// The (layer, etype, ecode) wire triple.
    pub fn to_wire(self) -> (u8, u8, u8) {
        use TermCode::*;
        match self {
            RdmapInvalidStag => (0, 1, 0x00),
            RdmapBaseBounds => (0, 1, 0x01),
            RdmapAccessRights => (0, 1, 0x02),
            RdmapStagNotAssociated => (0, 1, 0x03),
            RdmapToWrap => (0, 1, 0x04),
            RdmapCannotInvalidate => (0, 1, 0x09),
            RdmapProtectionUnspecified => (0, 1, 0xff),
            RdmapInvalidVersion => (0, 2, 0x05),
            RdmapUnexpectedOpcode => (0, 2, 0x06),
            RdmapCatastrophicStream => (0, 2, 0x07),
            RdmapCatastrophicGlobal => (0, 2, 0x08),
            RdmapOperationCannotInvalidate => (0, 2, 0x09),
            RdmapUnspecified => (0, 2, 0xff),
            RdmapLocalCatastrophic => (0, 0, 0xff),
            RdmapLocalCatastrophicZero => (0, 0, 0x00),
            DdpCatastrophic => (1, 0, 0x00),
            DdpTaggedInvalidStag => (1, 1, 0x00),
            DdpTaggedBaseBounds => (1, 1, 0x01),
            DdpTaggedStagNotAssociated => (1, 1, 0x02),
            DdpTaggedToWrap => (1, 1, 0x03),
            DdpTaggedInvalidVersion => (1, 1, 0x04),
            DdpUntaggedInvalidQn => (1, 2, 0x01),
            DdpUntaggedNoBuffer => (1, 2, 0x02),
            DdpUntaggedInvalidMsnRange => (1, 2, 0x03),
            DdpUntaggedInvalidMo => (1, 2, 0x04),
            DdpUntaggedTooLong => (1, 2, 0x05),
            DdpUntaggedInvalidVersion => (1, 2, 0x06),
            MpaTcpStreamLost => (2, 0, 0x01),
            MpaCrcError => (2, 0, 0x02),
            MpaMarkerError => (2, 0, 0x03),
            MpaInvalidReqRep => (2, 0, 0x04),
            MpaLocalCatastrophic => (2, 0, 0x05),
            MpaInsufficientIrd => (2, 0, 0x06),
            MpaNoMatchingRtr => (2, 0, 0x07),
            Unknown {
                layer,
                etype,
                ecode,
            } => (layer, etype, ecode),
        }
    }

    /// The code for a wire triple; triples not listed above become
    /// [`TermCode::Unknown`]. `from_wire(c.to_wire()) == c` for every
    /// named code.
    pub fn from_wire(layer: u8, etype: u8, ecode: u8) -> TermCode {
        use TermCode::*;
        match (layer, etype, ecode) {
            (0, 1, 0x00) => RdmapInvalidStag,
            (0, 1, 0x01) => RdmapBaseBounds,
            (0, 1, 0x02) => RdmapAccessRights,
            (0, 1, 0x03) => RdmapStagNotAssociated,
            (0, 1, 0x04) => RdmapToWrap,
            (0, 1, 0x09) => RdmapCannotInvalidate,
            (0, 1, 0xff) => RdmapProtectionUnspecified,
            (0, 2, 0x05) => RdmapInvalidVersion,
            (0, 2, 0x06) => RdmapUnexpectedOpcode,
            (0, 2, 0x07) => RdmapCatastrophicStream,
            (0, 2, 0x08) => RdmapCatastrophicGlobal,
            (0, 2, 0x09) => RdmapOperationCannotInvalidate,
            (0, 2, 0xff) => RdmapUnspecified,
            (0, 0, 0xff) => RdmapLocalCatastrophic,
            (0, 0, 0x00) => RdmapLocalCatastrophicZero,
            (1, 0, 0x00) => DdpCatastrophic,
            (1, 1, 0x00) => DdpTaggedInvalidStag,
            (1, 1, 0x01) => DdpTaggedBaseBounds,
            (1, 1, 0x02) => DdpTaggedStagNotAssociated,
            (1, 1, 0x03) => DdpTaggedToWrap,
            (1, 1, 0x04) => DdpTaggedInvalidVersion,
            (1, 2, 0x01) => DdpUntaggedInvalidQn,
            (1, 2, 0x02) => DdpUntaggedNoBuffer,
            (1, 2, 0x03) => DdpUntaggedInvalidMsnRange,
            (1, 2, 0x04) => DdpUntaggedInvalidMo,
            (1, 2, 0x05) => DdpUntaggedTooLong,
            (1, 2, 0x06) => DdpUntaggedInvalidVersion,
            (2, 0, 0x01) => MpaTcpStreamLost,
            (2, 0, 0x02) => MpaCrcError,
            (2, 0, 0x03) => MpaMarkerError,
            (2, 0, 0x04) => MpaInvalidReqRep,
            (2, 0, 0x05) => MpaLocalCatastrophic,
            (2, 0, 0x06) => MpaInsufficientIrd,
            (2, 0, 0x07) => MpaNoMatchingRtr,
            (layer, etype, ecode) => Unknown {
                layer,
                etype,
                ecode,
            },
        }
    }

    /// The layer nibble (0 RDMAP, 1 DDP, 2 LLP).
    pub fn layer(self) -> u8 {
        self.to_wire().0
    }

    /// A sentence naming the cause.
    pub fn description(self) -> &'static str {
        use TermCode::*;
        match self {
            RdmapInvalidStag => "RDMAP: the STag of the request is not valid",
            RdmapBaseBounds => "RDMAP: the access falls outside the memory region's base and bounds",
            RdmapAccessRights => "RDMAP: the memory region does not grant the requested access rights",
            RdmapStagNotAssociated => "RDMAP: the STag is not associated with this RDMAP stream (protection domain mismatch)",
            RdmapToWrap => "RDMAP: the tagged offset plus length wraps around 2^64",
            RdmapCannotInvalidate => "RDMAP: the STag cannot be invalidated (access check failed)",
            RdmapProtectionUnspecified => "RDMAP: unspecified remote protection error",
            RdmapInvalidVersion => "RDMAP: the message carries an RDMAP version other than 1",
            RdmapUnexpectedOpcode => "RDMAP: the message carries an unknown or unexpected opcode",
            RdmapCatastrophicStream => "RDMAP: catastrophic error, localized to this RDMAP stream",
            RdmapCatastrophicGlobal => "RDMAP: catastrophic error, global to the RNIC",
            RdmapOperationCannotInvalidate => "RDMAP: the STag cannot be invalidated",
            RdmapUnspecified => "RDMAP: unspecified remote operation error",
            RdmapLocalCatastrophic | RdmapLocalCatastrophicZero => {
                "RDMAP: the peer hit a local catastrophic error"
            }
            DdpCatastrophic => "DDP: the peer hit a local catastrophic error",
            DdpTaggedInvalidStag => "DDP: the tagged segment names an invalid STag",
            DdpTaggedBaseBounds => "DDP: the tagged segment falls outside the buffer's base and bounds",
            DdpTaggedStagNotAssociated => "DDP: the STag is not associated with this DDP stream",
            DdpTaggedToWrap => "DDP: the tagged offset plus length wraps around 2^64",
            DdpTaggedInvalidVersion => "DDP: the tagged segment carries a DDP version other than 1",
            DdpUntaggedInvalidQn => "DDP: the untagged segment names an invalid queue number",
            DdpUntaggedNoBuffer => "DDP: no receive buffer is posted for the untagged message (invalid MSN)",
            DdpUntaggedInvalidMsnRange => "DDP: the untagged segment's MSN is out of the valid range",
            DdpUntaggedInvalidMo => "DDP: the untagged segment's message offset is invalid",
            DdpUntaggedTooLong => "DDP: the untagged message is too long for the posted buffer",
            DdpUntaggedInvalidVersion => "DDP: the untagged segment carries a DDP version other than 1",
            MpaTcpStreamLost => "MPA: the TCP connection was closed, terminated or lost",
            MpaCrcError => "MPA: a received FPDU failed its CRC32C check",
            MpaMarkerError => "MPA: the FPDU framing is lost (marker or ULPDU length do not point to an FPDU start)",
            MpaInvalidReqRep => "MPA: the MPA Request or Reply frame is invalid",
            MpaLocalCatastrophic => "MPA: the peer hit a local catastrophic error during connection setup",
            MpaInsufficientIrd => "MPA: the initiator's IRD is too small for the responder's ORD",
            MpaNoMatchingRtr => "MPA: the peers support no common ready-to-receive (RTR) message type",
            Unknown { .. } => "an error code this implementation does not know",
        }
    }
}

impl core::fmt::Display for TermCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (l, e, c) = self.to_wire();
        write!(
            f,
            "{} (layer {l}, etype {e}, code {c:#04x})",
            self.description()
        )
    }
}

/// A view of the Terminate message body (after the untagged DDP header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks its lengths (see [`Packet::check_len`]).
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the 4 control bytes are there and, when D is set, the DDP
    /// Segment Length and the whole copied DDP header (its length taken
    /// from its T bit). The R part is read leniently (up to 28 bytes,
    /// whatever is present). After `Ok`, no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HDR_LEN {
            return Err(Error::Truncated);
        }
        if self.flag_d() {
            let start = field::DDP_SEG_LEN.end;
            // RFC 5040 §4.8: with D set, the DDP header of the offending
            // segment follows the segment length; its T bit sizes it.
            if b.len() <= start || b.len() < start + self.ddp_hdr_len() {
                return Err(Error::Truncated);
            }
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The layer nibble.
    pub fn layer(&self) -> u8 {
        self.buffer.as_ref()[field::LAYER_ETYPE] >> 4
    }

    /// The error type nibble.
    pub fn etype(&self) -> u8 {
        self.buffer.as_ref()[field::LAYER_ETYPE] & 0x0f
    }

    /// The error code byte.
    pub fn ecode(&self) -> u8 {
        self.buffer.as_ref()[field::ECODE]
    }

    /// The decoded error.
    pub fn code(&self) -> TermCode {
        TermCode::from_wire(self.layer(), self.etype(), self.ecode())
    }

    /// M: the DDP Segment Length field is valid.
    pub fn flag_m(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_M != 0
    }

    /// D: the DDP Segment Length and DDP header are included.
    pub fn flag_d(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_D != 0
    }

    /// R: the RDMAP header is included.
    pub fn flag_r(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_R != 0
    }

    /// The 13 reserved bits.
    pub fn reserved(&self) -> u16 {
        be16(self.buffer.as_ref(), field::RESERVED.start) & 0x1fff
    }

    /// Length of the copied DDP header: 14 if its T bit is set, else 18.
    /// Only meaningful when D is set and the buffer holds its first byte.
    fn ddp_hdr_len(&self) -> usize {
        match self.buffer.as_ref().get(field::DDP_SEG_LEN.end) {
            Some(b) if b & ddp::FLAG_TAGGED != 0 => ddp::TAGGED_HDR_LEN,
            _ => ddp::UNTAGGED_HDR_LEN,
        }
    }

    /// The DDP Segment Length field, present when D is set (whether M
    /// says it is valid or not).
    pub fn ddp_seg_len_field(&self) -> Option<u16> {
        if self.flag_d() {
            Some(be16(self.buffer.as_ref(), field::DDP_SEG_LEN.start))
        } else {
            None
        }
    }

    /// The copied DDP header, when D is set.
    pub fn ddp_hdr(&self) -> Option<&[u8]> {
        if self.flag_d() {
            let s = field::DDP_SEG_LEN.end;
            Some(&self.buffer.as_ref()[s..s + self.ddp_hdr_len()])
        } else {
            None
        }
    }

    fn rdmap_start(&self) -> usize {
        if self.flag_d() {
            field::DDP_SEG_LEN.end + self.ddp_hdr_len()
        } else {
            HDR_LEN
        }
    }

    /// The copied RDMAP header when R is set: the (up to 28) bytes after
    /// the DDP part. siw sets R for a Send and copies no RDMAP bytes, so
    /// this can be empty.
    pub fn rdmap_hdr(&self) -> Option<&[u8]> {
        if self.flag_r() {
            let b = self.buffer.as_ref();
            let s = self.rdmap_start().min(b.len());
            let e = (s + RDMAP_HDR_LEN).min(b.len());
            Some(&b[s..e])
        } else {
            None
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the layer, etype and code bytes.
    pub fn set_code(&mut self, code: TermCode) {
        let (l, e, c) = code.to_wire();
        let b = self.buffer.as_mut();
        b[field::LAYER_ETYPE] = (l << 4) | (e & 0x0f);
        b[field::ECODE] = c;
    }

    /// Sets the M, D and R flags and clears the reserved bits.
    pub fn set_flags(&mut self, m: bool, d: bool, r: bool) {
        let b = self.buffer.as_mut();
        b[field::FLAGS] = (if m { FLAG_M } else { 0 })
            | (if d { FLAG_D } else { 0 })
            | (if r { FLAG_R } else { 0 });
        b[field::FLAGS + 1] = 0;
    }

    /// Sets the DDP Segment Length field (needs the D part in the buffer).
    pub fn set_ddp_seg_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::DDP_SEG_LEN.start, v)
    }
}

/// A parsed Terminate body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminateRepr<'a> {
    /// The error.
    pub code: TermCode,
    /// The DDP Segment Length, when M (valid) and D (present) are set.
    /// Emitting `Some` without `ddp_hdr` is not representable and is
    /// dropped.
    pub ddp_seg_len: Option<u16>,
    /// The copied DDP header (14 or 18 bytes, per its T bit); sets D.
    pub ddp_hdr: Option<&'a [u8]>,
    /// The copied RDMAP header (28 bytes for a Read Request, possibly
    /// empty as siw sends it for a Send); sets R.
    pub rdmap_hdr: Option<&'a [u8]>,
}

impl<'a> TerminateRepr<'a> {
    /// Parses a Terminate body. Bytes after the parts the flags announce
    /// are ignored.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&'a T>) -> Result<TerminateRepr<'a>> {
        p.check_len()?;
        let buf: &'a [u8] = p.buffer.as_ref();
        let view = Packet::new_unchecked(buf);
        let ddp_hdr = if view.flag_d() {
            let s = field::DDP_SEG_LEN.end;
            Some(&buf[s..s + view.ddp_hdr_len()])
        } else {
            None
        };
        let rdmap_hdr = if view.flag_r() {
            let s = view.rdmap_start().min(buf.len());
            let e = (s + RDMAP_HDR_LEN).min(buf.len());
            Some(&buf[s..e])
        } else {
            None
        };
        Ok(TerminateRepr {
            code: view.code(),
            ddp_seg_len: if view.flag_m() {
                view.ddp_seg_len_field()
            } else {
                None
            },
            ddp_hdr,
            rdmap_hdr,
        })
    }

    /// Bytes [`TerminateRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HDR_LEN
            + self.ddp_hdr.map_or(0, |h| DDP_SEG_LEN_LEN + h.len())
            + self.rdmap_hdr.map_or(0, |h| h.len())
    }

    /// Writes the body: control bytes, then (D) the segment length (0 when
    /// `ddp_seg_len` is `None`) and DDP header, then (R) the RDMAP header.
    ///
    /// # Panics
    /// If the buffer is shorter than [`TerminateRepr::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Packet<&mut T>) {
        let m = self.ddp_seg_len.is_some() && self.ddp_hdr.is_some();
        p.set_code(self.code);
        p.set_flags(m, self.ddp_hdr.is_some(), self.rdmap_hdr.is_some());
        let b = p.buffer.as_mut();
        let mut at = HDR_LEN;
        if let Some(h) = self.ddp_hdr {
            put16(b, at, self.ddp_seg_len.unwrap_or(0));
            at += DDP_SEG_LEN_LEN;
            b[at..at + h.len()].copy_from_slice(h);
            at += h.len();
        }
        if let Some(h) = self.rdmap_hdr {
            b[at..at + h.len()].copy_from_slice(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_siw() {
        // Spot checks against siw iwarp.h values.
        assert_eq!(TermCode::DdpUntaggedNoBuffer.to_wire(), (1, 2, 2));
        assert_eq!(TermCode::RdmapUnexpectedOpcode.to_wire(), (0, 2, 6));
        assert_eq!(TermCode::MpaCrcError.to_wire(), (2, 0, 2));
        assert_eq!(TermCode::MpaInsufficientIrd.to_wire(), (2, 0, 6));
        assert_eq!(TermCode::MpaInvalidUlpduLen, TermCode::MpaMarkerError);
        for l in 0..4u8 {
            for e in 0..4u8 {
                for c in 0..=255u8 {
                    let t = TermCode::from_wire(l, e, c);
                    assert_eq!(t.to_wire(), (l, e, c));
                    assert!(!t.description().is_empty());
                }
            }
        }
    }

    // A DDP-layer Terminate as siw builds it for an untagged "no buffer"
    // error on a 64-byte Send: M D, length 64, the Send's DDP header.
    static DDP_TERM: [u8; 24] = [
        0x12, 0x02, 0xc0, 0x00, // layer 1 etype 2 code 2, M D
        0x00, 0x40, // DDP segment length
        0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x00,
        0x00, 0x00, 0x00, // untagged DDP header, MSN 7
    ];

    #[test]
    fn deconstruct_construct_ddp_error() {
        let p = Packet::new_checked(&DDP_TERM[..]).unwrap();
        assert_eq!((p.layer(), p.etype(), p.ecode()), (1, 2, 2));
        assert!(p.flag_m() && p.flag_d() && !p.flag_r());
        let r = TerminateRepr::parse(&p).unwrap();
        assert_eq!(r.code, TermCode::DdpUntaggedNoBuffer);
        assert_eq!(r.ddp_seg_len, Some(64));
        assert_eq!(r.ddp_hdr, Some(&DDP_TERM[6..]));
        assert_eq!(r.rdmap_hdr, None);
        assert_eq!(r.buffer_len(), DDP_TERM.len());
        let mut out = vec![0xaa; r.buffer_len()];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, DDP_TERM);
    }

    #[test]
    fn rdmap_protection_read_request() {
        let mut b = vec![0x01, 0x00, 0xe0, 0x00, 0x00, 0x00];
        b.extend_from_slice(&[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
        b.extend((0u8..28).map(|i| i + 1));
        let r = TerminateRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.code, TermCode::RdmapInvalidStag);
        assert_eq!(r.ddp_hdr.unwrap().len(), 18);
        assert_eq!(r.rdmap_hdr.unwrap().len(), 28);
        let mut out = vec![0; r.buffer_len()];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn siw_r_flag_for_send_has_no_rdmap_bytes() {
        let mut b = vec![0x01, 0x02, 0xe0, 0x00, 0x00, 0x10];
        b.extend_from_slice(&[0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        let r = TerminateRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.code, TermCode::RdmapAccessRights);
        assert_eq!(r.rdmap_hdr, Some(&[][..]));
    }

    #[test]
    fn catastrophic_only_header() {
        let b = [0x00, 0xff, 0x00, 0x00];
        let r = TerminateRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            TerminateRepr {
                code: TermCode::RdmapLocalCatastrophic,
                ddp_seg_len: None,
                ddp_hdr: None,
                rdmap_hdr: None
            }
        );
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&[0x12, 0x02, 0xc0][..]),
            Err(Error::Truncated)
        );
        // D set but no DDP header.
        assert_eq!(Packet::new_checked(&DDP_TERM[..6]), Err(Error::Truncated));
        assert_eq!(Packet::new_checked(&DDP_TERM[..23]), Err(Error::Truncated));
        // Tagged copied header: 14 bytes are enough.
        let mut t = DDP_TERM;
        t[6] = 0xc1;
        assert_eq!(
            Packet::new_checked(&t[..20])
                .unwrap()
                .ddp_hdr()
                .unwrap()
                .len(),
            14
        );
    }
}
