//! Byte ranges and big-endian accessors shared by the header views
//! (smoltcp's `wire::field` idea): a leaf that imports nothing, so the
//! header modules take these from a sibling and never from their parent.
//! RFC 5040 §4, RFC 5041 §4 and RFC 5044 §7 put every multi-byte field in
//! network byte order (big-endian).

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
