//! `--integrity`: per-message data patterns and their checksums.
//!
//! Message `i` of connection `q` carries the pattern [`fill`]`(seed(q, i))`
//! (a SplitMix64 stream, so every byte depends on the seed and its position
//! and a shifted, truncated, duplicated or stale segment is caught). The
//! sender checksums what it sent, the receiver checksums what arrived and
//! compares it with the checksum of the pattern it expected (CRC32C over
//! every byte). Both sides also fold the per-message checksums into a
//! running sum that is exchanged in the final handshake.

/// The seed of message `iter` on connection `qp`, for the data flowing in
/// `dir` (0: client to server, 1: server to client).
pub fn seed(qp: u32, dir: u32, iter: u64) -> u64 {
    iter ^ (u64::from(qp) << 48) ^ (u64::from(dir) << 40) ^ 0x5eed_0000_0000_0000
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fill `buf` with the pattern of `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let base = splitmix(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    let mut j = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&splitmix(base ^ j).to_le_bytes());
        j += 1;
    }
    let rest = chunks.into_remainder();
    let w = splitmix(base ^ j).to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&w[..n]);
}

/// CRC32C of a message.
pub fn checksum(buf: &[u8]) -> u32 {
    iwarp_proto::wire::crc::crc32c(buf)
}

/// The checksum a receiver expects for `len` bytes of pattern `seed`, with
/// the last byte replaced by `last` if given (write_bw stamps).
pub fn expected(len: usize, seed: u64, last: Option<u8>, scratch: &mut Vec<u8>) -> u32 {
    scratch.resize(len, 0);
    fill(scratch, seed);
    if let (Some(b), Some(l)) = (last, scratch.last_mut()) {
        *l = b;
    }
    checksum(scratch)
}

/// Receiver-side verification state of one connection.
#[derive(Debug)]
pub struct Verifier {
    /// Which message the self-test corrupts (`--inject-corruption`).
    corrupt_at: Option<u64>,
    /// Messages checked.
    pub checked: u64,
    /// Running sum of received checksums.
    pub sum: u64,
    scratch: Vec<u8>,
}

impl Verifier {
    pub fn new(corrupt: bool) -> Verifier {
        Verifier {
            // Not the first message: the failure must be found mid-stream.
            corrupt_at: corrupt.then_some(1),
            checked: 0,
            sum: 0,
            scratch: Vec::new(),
        }
    }

    /// Check received message `iter` (in `got`) against the pattern of
    /// `seed`. `got` may be modified (the corruption self-test flips a
    /// byte in it).
    pub fn check(
        &mut self,
        what: &str,
        iter: u64,
        got: &mut [u8],
        seed: u64,
        last: Option<u8>,
    ) -> Result<(), String> {
        if self.corrupt_at == Some(iter) {
            let mid = got.len() / 2;
            got[mid] ^= 0x20;
            eprintln!("iwarp-perf: self-test: flipped byte {mid} of {what} message {iter} at the receiver");
        }
        let have = checksum(got);
        let want = expected(got.len(), seed, last, &mut self.scratch);
        if have != want {
            let first_bad = self
                .scratch
                .iter()
                .zip(got.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "INTEGRITY FAILURE: {what} message {iter} ({} bytes): crc32c {have:#010x}, expected {want:#010x}; first differing byte at offset {first_bad} (got {:#04x}, expected {:#04x})",
                got.len(),
                got.get(first_bad).copied().unwrap_or(0),
                self.scratch.get(first_bad).copied().unwrap_or(0),
            ));
        }
        self.checked += 1;
        self.sum = self.sum.wrapping_add(u64::from(have));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_and_check() {
        let mut a = vec![0u8; 1001];
        let mut b = vec![0u8; 1001];
        fill(&mut a, seed(0, 0, 1));
        fill(&mut b, seed(0, 0, 2));
        assert_ne!(a, b);
        let mut v = Verifier::new(false);
        v.check("t", 0, &mut a, seed(0, 0, 1), None).unwrap();
        assert!(v.check("t", 1, &mut b, seed(0, 0, 1), None).is_err());
        let mut c = a.clone();
        *c.last_mut().unwrap() = 7;
        v.check("t", 2, &mut c, seed(0, 0, 1), Some(7)).unwrap();
        let mut v = Verifier::new(true);
        v.check("t", 0, &mut a.clone(), seed(0, 0, 1), None)
            .unwrap();
        let e = v.check("t", 1, &mut a, seed(0, 0, 1), None).unwrap_err();
        assert!(e.contains("INTEGRITY FAILURE"), "{e}");
    }
}
