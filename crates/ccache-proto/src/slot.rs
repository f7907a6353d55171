//! The version table's layout in the registered region, and its
//! advertisement.
//!
//! ## A slot
//!
//! Document `n`'s version lives at byte `n * SLOT_LEN` of the region:
//!
//! ```text
//!  0                     8                     16
//! +---------------------+---------------------+
//! |   version (BE u64)  |  check (BE u64)     |
//! +---------------------+---------------------+
//! ```
//!
//! `check = mix(version, n)`, a 64-bit finalizer (SplitMix64's) of the
//! version and the slot number. The check is there because an RDMA Read of
//! an aligned 8-byte slot **can** tear in this stack: the software provider
//! sends a Read Response from the registered memory with `sendmsg` (or a
//! byte copy for a short frame), i.e. `memcpy` semantics, with no 8-byte
//! atomicity promised, while the module's store may land in the middle;
//! and the MPA CRC is computed when the frame is built, not when the bytes
//! are copied, so a store in between also makes the CRC wrong (the QPs
//! run with CRC off for that reason; see `docs/CACHE.md`). A reader that
//! gets a version whose check does not match retries; a torn mix of two
//! values passes only if it happens to be a consistent (version, check)
//! pair, which for the mixed halves of two different writes is a 2^-64
//! coincidence. The slot number in the check catches a read of the wrong
//! slot.
//!
//! ## The advertisement
//!
//! The module tells a proxy where the table is in the MPA private data of
//! its connection reply (24 bytes, big endian):
//!
//! ```text
//!  0       4        8                 16       20        24
//! +-------+--------+-----------------+--------+---------+
//! | "CCV1"| slots  | address (u64)   | rkey   | slot_len|
//! +-------+--------+-----------------+--------+---------+
//! ```

use std::fmt;

/// Bytes per slot.
pub const SLOT_LEN: usize = 16;
/// Length of the advertisement.
pub const ADVERT_LEN: usize = 24;
/// Magic of the advertisement.
pub const ADVERT_MAGIC: [u8; 4] = *b"CCV1";

/// The check word of `version` in slot `slot`.
pub fn check_word(version: u64, slot: u32) -> u64 {
    // SplitMix64's output function over the version, offset so that an
    // all-zero slot is not valid, xor a spread slot number: every input
    // bit affects every output bit.
    let mut z = version.wrapping_add(0x6A09_E667_F3BC_C909)
        ^ u64::from(slot).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 16 bytes of slot `slot` holding `version`.
pub fn encode(slot: u32, version: u64) -> [u8; SLOT_LEN] {
    let mut b = [0u8; SLOT_LEN];
    b[..8].copy_from_slice(&version.to_be_bytes());
    b[8..].copy_from_slice(&check_word(version, slot).to_be_bytes());
    b
}

/// A slot's bytes did not hold a consistent version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotError {
    /// Fewer than [`SLOT_LEN`] bytes.
    Truncated(usize),
    /// The check word does not match: a read that overlapped a store (read
    /// again), or not a version slot at all.
    Torn {
        /// The slot read.
        slot: u32,
    },
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotError::Truncated(n) => write!(f, "version slot of {n} bytes, need {SLOT_LEN}"),
            SlotError::Torn { slot } => write!(
                f,
                "version slot {slot}: check word mismatch (read overlapped an update; read again)"
            ),
        }
    }
}

impl std::error::Error for SlotError {}

/// The version in slot `slot`'s bytes, if they are consistent.
pub fn decode(slot: u32, b: &[u8]) -> Result<u64, SlotError> {
    let b: &[u8; SLOT_LEN] = b
        .get(..SLOT_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(SlotError::Truncated(b.len()))?;
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[..8]);
    let mut c = [0u8; 8];
    c.copy_from_slice(&b[8..]);
    let version = u64::from_be_bytes(v);
    if u64::from_be_bytes(c) != check_word(version, slot) {
        return Err(SlotError::Torn { slot });
    }
    Ok(version)
}

/// Where the version table is: the MPA private data of the module's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advert {
    /// Number of slots (documents).
    pub slots: u32,
    /// Address (tagged offset) of slot 0.
    pub addr: u64,
    /// The region's rkey.
    pub rkey: u32,
    /// Bytes per slot (always [`SLOT_LEN`] in this version).
    pub slot_len: u32,
}

/// A malformed advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvertError {
    /// Fewer than [`ADVERT_LEN`] bytes.
    Truncated(usize),
    /// Not "CCV1": the peer is not a ccappd.
    BadMagic([u8; 4]),
    /// A slot length this version does not read.
    BadSlotLen(u32),
}

impl fmt::Display for AdvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdvertError::Truncated(n) => write!(
                f,
                "version-table advertisement of {n} bytes, need {ADVERT_LEN}: the peer is not a ccappd"
            ),
            AdvertError::BadMagic(m) => write!(
                f,
                "version-table advertisement starts {m:02x?}, not \"CCV1\": the peer is not a ccappd"
            ),
            AdvertError::BadSlotLen(n) => write!(
                f,
                "version slots of {n} bytes, this build reads {SLOT_LEN}: run matching ccappd and ccproxy"
            ),
        }
    }
}

impl std::error::Error for AdvertError {}

impl Advert {
    /// Parse untrusted private data.
    pub fn parse(b: &[u8]) -> Result<Advert, AdvertError> {
        if b.len() < ADVERT_LEN {
            return Err(AdvertError::Truncated(b.len()));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != ADVERT_MAGIC {
            return Err(AdvertError::BadMagic(magic));
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[8..16]);
        let slot_len = u32_at(20);
        if slot_len as usize != SLOT_LEN {
            return Err(AdvertError::BadSlotLen(slot_len));
        }
        Ok(Advert {
            slots: u32_at(4),
            addr: u64::from_be_bytes(a),
            rkey: u32_at(16),
            slot_len,
        })
    }

    /// The private data bytes.
    pub fn emit(&self) -> [u8; ADVERT_LEN] {
        let mut b = [0u8; ADVERT_LEN];
        b[..4].copy_from_slice(&ADVERT_MAGIC);
        b[4..8].copy_from_slice(&self.slots.to_be_bytes());
        b[8..16].copy_from_slice(&self.addr.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[20..24].copy_from_slice(&self.slot_len.to_be_bytes());
        b
    }

    /// Remote address of slot `slot` (no bounds check: a slot outside the
    /// table is the caller's to refuse, or the remote's to fault).
    pub fn slot_addr(&self, slot: u32) -> u64 {
        self.addr
            .wrapping_add(u64::from(slot) * u64::from(self.slot_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_round_trip_and_vector() {
        let b = encode(3, 0x0102_0304_0506_0708);
        assert_eq!(&b[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(decode(3, &b), Ok(0x0102_0304_0506_0708));
        // Wrong slot: the check catches it.
        assert_eq!(decode(4, &b), Err(SlotError::Torn { slot: 4 }));
        assert_eq!(decode(3, &b[..15]), Err(SlotError::Truncated(15)));
        // All zero (never published) is not a valid version 0.
        assert_eq!(decode(0, &[0; 16]), Err(SlotError::Torn { slot: 0 }));
    }

    #[test]
    fn torn_mixes_are_detected() {
        // Every byte-wise mix of two versions' slots, except the two
        // originals, fails the check.
        let (a, b) = (
            encode(1, 0x00ff_00ff_1234_5678),
            encode(1, 0x0100_0100_1234_5679),
        );
        for mask in 0u32..(1 << 16) {
            let mut m = [0u8; SLOT_LEN];
            for i in 0..SLOT_LEN {
                m[i] = if mask & (1 << i) != 0 { b[i] } else { a[i] };
            }
            if m != a && m != b {
                assert!(decode(1, &m).is_err(), "mask {mask:#x} passed");
            }
        }
    }

    #[test]
    fn advert_vector() {
        let a = Advert {
            slots: 2,
            addr: 0x1122_3344_5566_7788,
            rkey: 0xaabb_ccdd,
            slot_len: 16,
        };
        let bytes: [u8; 24] = [
            b'C', b'C', b'V', b'1', 0, 0, 0, 2, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
            0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 16,
        ];
        assert_eq!(a.emit(), bytes);
        assert_eq!(Advert::parse(&bytes), Ok(a));
        assert_eq!(a.slot_addr(1), 0x1122_3344_5566_7798);
        assert_eq!(Advert::parse(&bytes[..23]), Err(AdvertError::Truncated(23)));
        let mut bad = bytes;
        bad[0] = b'X';
        assert_eq!(Advert::parse(&bad), Err(AdvertError::BadMagic(*b"XCV1")));
        let mut bad = bytes;
        bad[23] = 8;
        assert_eq!(Advert::parse(&bad), Err(AdvertError::BadSlotLen(8)));
    }
}
