//! DDP segment header, RFC 5041 §4 (header formats) as used under MPA.
//!
//! The view starts at the first byte of the ULPDU, i.e. right after the
//! 2-byte MPA ULPDU length (RFC 5041 §4.1 draws the control field "offset by
//! 16 bits to accommodate the MPA header").
//!
//! ```text
//! byte 0: T L rsvd(4) DV(2)      RFC 5041 §4.1 (DDP control field)
//! byte 1: RsvdULP[0..8]          the RDMAP control byte, RFC 5040 §4.1
//! tagged (T=1), RFC 5041 §4.2, 14 bytes:
//!   2..6   STag
//!   6..14  TO (tagged offset)
//! untagged (T=0), RFC 5041 §4.3, 18 bytes:
//!   2..6   RsvdULP[8..40]        RDMAP: Invalidate STag (Send with Invalidate), else 0
//!   6..10  QN
//!   10..14 MSN
//!   14..18 MO
//! ```
//!
//! [`Repr::parse`] accepts any DDP version: RFC 5041 §7.2 makes a wrong
//! version a Terminate (tagged or untagged "invalid DDP version"), which the
//! engine reports; the parser only refuses what it cannot read.

use super::bytes::{be32, be64, put32, put64};
use super::error::{Error, Result};

/// Length of the tagged DDP header (control, RsvdULP byte, STag, TO).
pub const TAGGED_HDR_LEN: usize = 14;
/// Length of the untagged DDP header (control, RsvdULP, QN, MSN, MO).
pub const UNTAGGED_HDR_LEN: usize = 18;
/// DDP version of RFC 5041 (DV field).
pub const DDP_VERSION: u8 = 1;

/// Tagged flag (RFC 5041 §4.1).
pub const FLAG_TAGGED: u8 = 0x80;
/// Last flag (RFC 5041 §4.1).
pub const FLAG_LAST: u8 = 0x40;
/// Reserved bits of the control byte: sent as zero, not checked on
/// receive (RFC 5041 §4.1).
pub const MASK_RESERVED: u8 = 0x3c;
/// DDP version bits of the control byte.
pub const MASK_VERSION: u8 = 0x03;

mod field {
    use crate::wire::bytes::Field;
    pub const CTRL: usize = 0;
    pub const ULP_CTRL: usize = 1;
    // tagged
    pub const STAG: Field = 2..6;
    pub const TO: Field = 6..14;
    // untagged
    pub const RSVD_ULP: Field = 2..6;
    pub const QN: Field = 6..10;
    pub const MSN: Field = 10..14;
    pub const MO: Field = 14..18;
}

/// A read/write view of a DDP segment (header and payload).
///
/// After [`Packet::check_len`] every accessor is safe, including those of
/// the other buffer model: the untagged ones read bytes of a tagged
/// header's TO (and [`Packet::mo`] reads 0 past its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer and checks it holds the whole header its T bit asks
    /// for.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the control bytes and then the 14 (tagged)
    /// or 18 (untagged) header bytes. After `Ok`, no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        // RFC 5041 §4.1: the control byte (and the ULP byte) come first;
        // its T bit selects the 14-byte tagged (§4.2) or 18-byte untagged
        // (§4.3) header.
        if b.len() < 2 {
            return Err(Error::Truncated);
        }
        if b.len() < self.header_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The T flag: the segment targets a tagged buffer.
    pub fn tagged(&self) -> bool {
        self.buffer.as_ref()[field::CTRL] & FLAG_TAGGED != 0
    }

    /// The L flag: last segment of a DDP message.
    pub fn last(&self) -> bool {
        self.buffer.as_ref()[field::CTRL] & FLAG_LAST != 0
    }

    /// The reserved bits of the control byte (bits 2..5).
    pub fn reserved(&self) -> u8 {
        (self.buffer.as_ref()[field::CTRL] & MASK_RESERVED) >> 2
    }

    /// The DDP version (DV).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::CTRL] & MASK_VERSION
    }

    /// Byte 1, reserved for the ULP: the RDMAP control byte.
    pub fn ulp_ctrl(&self) -> u8 {
        self.buffer.as_ref()[field::ULP_CTRL]
    }

    /// Header length as the T bit selects it.
    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }

    /// Tagged: the Data Sink STag. Meaningless when untagged.
    pub fn stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::STAG.start)
    }

    /// Tagged: the tagged offset. Meaningless when untagged.
    pub fn to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::TO.start)
    }

    /// Untagged: the 32-bit RsvdULP word (RDMAP: the Invalidate STag of a
    /// Send with Invalidate, RFC 5040 §4.1). Meaningless when tagged.
    pub fn ulp_word(&self) -> u32 {
        be32(self.buffer.as_ref(), field::RSVD_ULP.start)
    }

    /// Untagged: queue number.
    pub fn qn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::QN.start)
    }

    /// Untagged: message sequence number.
    pub fn msn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::MSN.start)
    }

    /// Untagged: message offset. Reads 0 when the buffer ends before the
    /// field (a checked tagged header is only 14 bytes long).
    pub fn mo(&self) -> u32 {
        self.buffer
            .as_ref()
            .get(field::MO)
            .map_or(0, |b| be32(b, 0))
    }

    /// The bytes after the header: the RDMAP header (if any) and payload.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_ctrl_bit(&mut self, bit: u8, on: bool) {
        let b = &mut self.buffer.as_mut()[field::CTRL];
        if on {
            *b |= bit;
        } else {
            *b &= !bit;
        }
    }

    /// Sets the T flag (this changes the header length).
    pub fn set_tagged(&mut self, v: bool) {
        self.set_ctrl_bit(FLAG_TAGGED, v)
    }

    /// Sets the L flag.
    pub fn set_last(&mut self, v: bool) {
        self.set_ctrl_bit(FLAG_LAST, v)
    }

    /// Sets the DDP version (2 bits) and clears the reserved bits.
    pub fn set_version(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::CTRL];
        *b = (*b & (FLAG_TAGGED | FLAG_LAST)) | (v & MASK_VERSION);
    }

    /// Sets byte 1 (the RDMAP control byte).
    pub fn set_ulp_ctrl(&mut self, v: u8) {
        self.buffer.as_mut()[field::ULP_CTRL] = v;
    }

    /// Sets the STag (tagged).
    pub fn set_stag(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::STAG.start, v)
    }

    /// Sets the tagged offset (tagged).
    pub fn set_to(&mut self, v: u64) {
        put64(self.buffer.as_mut(), field::TO.start, v)
    }

    /// Sets the RsvdULP word (untagged).
    pub fn set_ulp_word(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::RSVD_ULP.start, v)
    }

    /// Sets the queue number (untagged).
    pub fn set_qn(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::QN.start, v)
    }

    /// Sets the message sequence number (untagged).
    pub fn set_msn(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::MSN.start, v)
    }

    /// Sets the message offset (untagged).
    pub fn set_mo(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::MO.start, v)
    }

    /// The bytes after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let h = self.header_len();
        &mut self.buffer.as_mut()[h..]
    }
}

/// Where a segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Tagged buffer model (RFC 5041 §4.2): STag and tagged offset.
    Tagged { stag: u32, to: u64 },
    /// Untagged buffer model (RFC 5041 §4.3): queue, message sequence
    /// number and message offset.
    Untagged { qn: u32, msn: u32, mo: u32 },
}

/// A parsed DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// L flag.
    pub last: bool,
    /// DDP version (2 bits; [`DDP_VERSION`] in valid traffic).
    pub version: u8,
    /// Byte 1: the RDMAP control byte.
    pub ulp_ctrl: u8,
    /// Untagged RsvdULP word (Invalidate STag); always 0 for tagged.
    pub ulp_word: u32,
    /// Tagged or untagged fields.
    pub placement: Placement,
}

impl Repr {
    /// Parses a DDP header. Does not reject a version other than
    /// [`DDP_VERSION`] (RFC 5041 §7.2: that is a Terminate, raised by the
    /// engine) nor non-zero reserved bits (RFC 5041 §4.1: not checked on
    /// receive).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        let placement = if packet.tagged() {
            Placement::Tagged {
                stag: packet.stag(),
                to: packet.to(),
            }
        } else {
            Placement::Untagged {
                qn: packet.qn(),
                msn: packet.msn(),
                mo: packet.mo(),
            }
        };
        Ok(Repr {
            last: packet.last(),
            version: packet.version(),
            ulp_ctrl: packet.ulp_ctrl(),
            ulp_word: match placement {
                Placement::Tagged { .. } => 0,
                Placement::Untagged { .. } => packet.ulp_word(),
            },
            placement,
        })
    }

    /// Whether this is a tagged header.
    pub fn is_tagged(&self) -> bool {
        matches!(self.placement, Placement::Tagged { .. })
    }

    /// Header length: 14 tagged, 18 untagged.
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }

    /// Same as [`Repr::header_len`] (smoltcp naming).
    pub fn buffer_len(&self) -> usize {
        self.header_len()
    }

    /// Writes the header into the first [`Repr::header_len`] bytes of the
    /// packet (reserved bits zero; `ulp_word` ignored when tagged).
    ///
    /// # Panics
    /// If the buffer is shorter than [`Repr::header_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.buffer.as_mut()[field::CTRL] = 0;
        packet.set_tagged(self.is_tagged());
        packet.set_last(self.last);
        packet.set_version(self.version);
        packet.set_ulp_ctrl(self.ulp_ctrl);
        match self.placement {
            Placement::Tagged { stag, to } => {
                packet.set_stag(stag);
                packet.set_to(to);
            }
            Placement::Untagged { qn, msn, mo } => {
                packet.set_ulp_word(self.ulp_word);
                packet.set_qn(qn);
                packet.set_msn(msn);
                packet.set_mo(mo);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An RDMA Write header shaped like rping's (siw-default.pcap): tagged,
    // last, DDP v1, RDMAP v1 opcode Write; STag and TO are made up.
    static TAGGED: [u8; 14] = [
        0xc1, 0x40, 0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x7f, 0xfe, 0xaa, 0xbb, 0xcc, 0xd0,
    ];

    // A Send: untagged, last, QN 0, MSN 2, MO 0 (the header of
    // siw-default.pcap frame 46, a perftest Send).
    static UNTAGGED: [u8; 18] = [
        0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
        0x00, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct_tagged() {
        let p = Packet::new_checked(&TAGGED[..]).unwrap();
        assert!(p.tagged());
        assert!(p.last());
        assert_eq!(p.version(), 1);
        assert_eq!(p.ulp_ctrl(), 0x40);
        assert_eq!(p.stag(), 0x1234_5678);
        assert_eq!(p.to(), 0x0000_7ffe_aabb_ccd0);
        assert_eq!(p.header_len(), 14);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn deconstruct_untagged() {
        let p = Packet::new_checked(&UNTAGGED[..]).unwrap();
        assert!(!p.tagged());
        assert!(p.last());
        assert_eq!(p.ulp_ctrl(), 0x43);
        assert_eq!((p.qn(), p.msn(), p.mo()), (0, 2, 0));
        let r = Repr::parse(&p).unwrap();
        assert_eq!(
            r,
            Repr {
                last: true,
                version: 1,
                ulp_ctrl: 0x43,
                ulp_word: 0,
                placement: Placement::Untagged {
                    qn: 0,
                    msn: 2,
                    mo: 0
                }
            }
        );
    }

    #[test]
    fn construct_both() {
        for bytes in [&TAGGED[..], &UNTAGGED[..]] {
            let r = Repr::parse(&Packet::new_checked(bytes).unwrap()).unwrap();
            let mut out = vec![0xffu8; r.buffer_len()];
            r.emit(&mut Packet::new_unchecked(&mut out[..]));
            assert_eq!(&out[..], bytes);
        }
    }

    #[test]
    fn truncated() {
        assert_eq!(Packet::new_checked(&[][..]), Err(Error::Truncated));
        assert_eq!(Packet::new_checked(&[0x41][..]), Err(Error::Truncated));
        // T=1 needs 14 bytes, T=0 18.
        assert_eq!(Packet::new_checked(&TAGGED[..13]), Err(Error::Truncated));
        assert_eq!(Packet::new_checked(&UNTAGGED[..17]), Err(Error::Truncated));
        // An untagged header whose T bit is set is only 14 bytes long: 14 ok.
        let mut t = UNTAGGED;
        t[0] |= FLAG_TAGGED;
        assert!(Packet::new_checked(&t[..14]).is_ok());
    }

    #[test]
    fn untagged_accessors_on_short_tagged_header() {
        let p = Packet::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(p.mo(), 0);
        assert_eq!(p.qn(), 0x0000_7ffe);
        let _ = (p.msn(), p.ulp_word());
    }

    #[test]
    fn version_not_rejected() {
        let mut b = UNTAGGED;
        b[0] = 0x43; // L, version 3
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.version, 3);
    }
}
