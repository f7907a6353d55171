//! XXH3-128 (seed 0, default secret) as a streaming hasher whose state can
//! be saved and restored, so a resumed download goes on from the state
//! kept beside `FILE.part` instead of reading the kept part again.
//!
//! The algorithm is the long-input path of the XXH3 specification
//! (`xxhash.h`, `XXH3_hashLong_128b`): 64-byte stripes accumulated into
//! eight 64-bit lanes, a scramble after every 1024-byte block (16 stripes
//! of the 192-byte default secret), the last stripe of the input taken
//! with the secret at `192 - 64 - 7`, and two `mergeAccs` for the low
//! and high halves. Inputs of at most 240 bytes use the short paths,
//! which `xxhash-rust` computes (it is the reference this file is tested
//! against, lengths 0 to 5000 and several MiB split at random points).
//! The `xxhash-rust` streaming hasher keeps its state private, which is
//! why this one exists. Whole blocks go through a copy of the plain code
//! compiled for AVX2 where the CPU has it (chosen at run time), else
//! through the same lanes vectorised for the baseline (SSE2).

use xxhash_rust::xxh3::xxh3_128;

const STRIPE: usize = 64;
const BLOCK: usize = 1024;
const STRIPES_PER_BLOCK: usize = 16;
const MID_SIZE_MAX: u64 = 240;
const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH3's default secret (`XXH3_kSecret`, xxhash.h).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const INITIAL_ACC: [u64; 8] = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];

fn rd64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `XXH3_accumulate_512`: one stripe with the secret at `key`.
#[inline(always)]
fn accumulate(acc: &mut [u64; 8], stripe: &[u8], key: usize) {
    let stripe: &[u8; STRIPE] = stripe[..STRIPE].try_into().expect("a stripe is 64 bytes");
    let secret: &[u8; STRIPE] = SECRET[key..key + STRIPE].try_into().expect("64 bytes");
    let (mut v, mut k) = ([0u64; 8], [0u64; 8]);
    for (i, (d, s)) in stripe
        .chunks_exact(8)
        .zip(secret.chunks_exact(8))
        .enumerate()
    {
        v[i] = u64::from_le_bytes(d.try_into().expect("8 bytes"));
        k[i] = v[i] ^ u64::from_le_bytes(s.try_into().expect("8 bytes"));
    }
    // acc[i ^ 1] += v[i], written as acc[i] += v[i ^ 1] so that every lane
    // is one independent operation (the form the compiler vectorises).
    for i in 0..8 {
        acc[i] = acc[i]
            .wrapping_add(v[i ^ 1])
            .wrapping_add((k[i] & 0xFFFF_FFFF).wrapping_mul(k[i] >> 32));
    }
}

/// `XXH3_scrambleAcc` with the last 64 bytes of the secret.
#[inline(always)]
fn scramble(acc: &mut [u64; 8]) {
    for (i, a) in acc.iter_mut().enumerate() {
        let k = rd64(&SECRET, SECRET.len() - STRIPE + 8 * i);
        *a = ((*a ^ (*a >> 47)) ^ k).wrapping_mul(PRIME32_1);
    }
}

/// A whole 1024-byte block: 16 stripes, then the scramble.
#[inline(always)]
fn block(acc: &mut [u64; 8], b: &[u8]) {
    for s in 0..STRIPES_PER_BLOCK {
        accumulate(acc, &b[s * STRIPE..], s * 8);
    }
    scramble(acc);
}

/// Every whole block of `data` (its length a multiple of [`BLOCK`]):
/// with AVX2 where the CPU has it (chosen at run time; 0.027 CPU-s per GiB
/// against 0.033 for the baseline on the AMD EPYC of docs/BENCHMARKS.md;
/// a hand-written intrinsics kernel reached 0.021 but needs `unsafe`
/// loads, which this project keeps to FFI and memory registration), else
/// the plain code, which the compiler vectorises for the baseline (SSE2).
fn blocks(acc: &mut [u64; 8], data: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            return x86::blocks_avx2(acc, data);
        }
    }
    blocks_baseline(acc, data)
}

#[inline(always)]
fn blocks_baseline(acc: &mut [u64; 8], data: &[u8]) {
    for b in data.chunks_exact(BLOCK) {
        block(acc, b);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // the one call into the `target_feature` copy of the plain code
mod x86 {
    /// The plain code compiled with AVX2 enabled: LLVM keeps the eight
    /// lanes in two 256-bit registers (`vpmuludq`, `vpshufd`, `vpaddq`), as
    /// `xxhash.h`'s `XXH3_accumulate_512_avx2` does by hand; no intrinsic
    /// and no pointer is needed.
    #[target_feature(enable = "avx2")]
    fn avx2(acc: &mut [u64; 8], data: &[u8]) {
        super::blocks_baseline(acc, data)
    }

    pub(super) fn blocks_avx2(acc: &mut [u64; 8], data: &[u8]) {
        assert!(std::is_x86_feature_detected!("avx2"));
        // SAFETY: a `target_feature` function may run only where the CPU
        // has the feature; AVX2 was detected just above.
        unsafe { avx2(acc, data) }
    }
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

fn merge(acc: &[u64; 8], key: usize, start: u64) -> u64 {
    let mut r = start;
    for i in 0..4 {
        let a = acc[2 * i] ^ rd64(&SECRET, key + 16 * i);
        let b = acc[2 * i + 1] ^ rd64(&SECRET, key + 16 * i + 8);
        let m = u128::from(a) * u128::from(b);
        r = r.wrapping_add((m as u64) ^ ((m >> 64) as u64));
    }
    avalanche(r)
}

/// Streaming XXH3-128. Invariant: every whole block before the last
/// (partial or whole) one is folded into `acc`; the last one stays in
/// `buf` (1 to 1024 bytes once anything was hashed), because the last
/// block is finished differently; `prev` holds the 64 bytes before `buf`
/// for a last stripe that reaches back into the previous block.
#[derive(Clone)]
pub struct Xxh3 {
    acc: [u64; 8],
    buf: Box<[u8; BLOCK]>,
    len: usize,
    prev: [u8; STRIPE],
    total: u64,
}

impl Default for Xxh3 {
    fn default() -> Xxh3 {
        Xxh3 {
            acc: INITIAL_ACC,
            buf: Box::new([0; BLOCK]),
            len: 0,
            prev: [0; STRIPE],
            total: 0,
        }
    }
}

impl Xxh3 {
    pub fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        while !data.is_empty() {
            if self.len == BLOCK {
                // More input follows: the buffered block is not the last.
                block(&mut self.acc, &self.buf[..]);
                self.prev.copy_from_slice(&self.buf[BLOCK - STRIPE..]);
                self.len = 0;
            }
            if self.len == 0 && data.len() > BLOCK {
                // Whole blocks straight from the input, in one call,
                // keeping at least one byte back for the buffer.
                let n = (data.len() - 1) / BLOCK * BLOCK;
                blocks(&mut self.acc, &data[..n]);
                self.prev.copy_from_slice(&data[n - STRIPE..n]);
                data = &data[n..];
            }
            let take = (BLOCK - self.len).min(data.len());
            self.buf[self.len..self.len + take].copy_from_slice(&data[..take]);
            self.len += take;
            data = &data[take..];
        }
    }

    /// The 128-bit digest (does not consume the state).
    pub fn digest128(&self) -> u128 {
        if self.total <= MID_SIZE_MAX {
            // Short inputs: all of it is in the buffer.
            return xxh3_128(&self.buf[..self.len]);
        }
        let mut acc = self.acc;
        let b = &self.buf[..self.len];
        // The last block: its whole stripes but the last one...
        let stripes = (self.len - 1) / STRIPE;
        for s in 0..stripes {
            accumulate(&mut acc, &b[s * STRIPE..], s * 8);
        }
        // ...and the input's last 64 bytes with the last-stripe secret.
        let mut last = [0u8; STRIPE];
        if self.len >= STRIPE {
            last.copy_from_slice(&b[self.len - STRIPE..]);
        } else {
            let from_prev = STRIPE - self.len;
            last[..from_prev].copy_from_slice(&self.prev[self.len..]);
            last[from_prev..].copy_from_slice(b);
        }
        accumulate(&mut acc, &last, SECRET.len() - STRIPE - 7);
        let lo = merge(&acc, 11, self.total.wrapping_mul(PRIME64_1));
        let hi = merge(
            &acc,
            SECRET.len() - 64 - 11,
            !self.total.wrapping_mul(PRIME64_2),
        );
        u128::from(lo) | (u128::from(hi) << 64)
    }

    /// Bytes hashed so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The state as bytes: total (8), lanes (64), the 64 bytes before the
    /// buffer, the buffered length (2) and bytes.
    pub fn save(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + 64 + 64 + 2 + self.len);
        v.extend_from_slice(&self.total.to_le_bytes());
        for a in self.acc {
            v.extend_from_slice(&a.to_le_bytes());
        }
        v.extend_from_slice(&self.prev);
        v.extend_from_slice(&(self.len as u16).to_le_bytes());
        v.extend_from_slice(&self.buf[..self.len]);
        v
    }

    /// The state [`Xxh3::save`] wrote, or `None` if `b` is not one.
    pub fn restore(b: &[u8]) -> Option<Xxh3> {
        if b.len() < 8 + 64 + 64 + 2 {
            return None;
        }
        let mut x = Xxh3 {
            total: rd64(b, 0),
            ..Xxh3::default()
        };
        for i in 0..8 {
            x.acc[i] = rd64(b, 8 + 8 * i);
        }
        x.prev.copy_from_slice(&b[72..136]);
        let len = usize::from(u16::from_le_bytes([b[136], b[137]]));
        let rest = &b[138..];
        if len > BLOCK
            || rest.len() != len
            || (x.total > 0 && len == 0)
            || (x.total <= MID_SIZE_MAX && x.total != len as u64)
        {
            return None;
        }
        x.buf[..len].copy_from_slice(rest);
        x.len = len;
        Some(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        crate::checksum::test_bytes(n, 0x243F_6A88_85A3_08D3)
    }

    #[test]
    fn equals_the_reference_at_every_length_and_split() {
        let d = data(5000);
        for n in 0..=d.len() {
            let mut h = Xxh3::default();
            let cut = (n * 7919) % (n + 1);
            h.update(&d[..cut]);
            h.update(&d[cut..n]);
            assert_eq!(h.digest128(), xxh3_128(&d[..n]), "length {n}, cut {cut}");
        }
    }

    /// The AVX2 kernel and the plain code agree, lane for lane, from any
    /// state (the reference tests above run whichever this CPU picks).
    #[test]
    fn the_avx2_kernel_equals_the_plain_code() {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            let d = data(37 * BLOCK);
            for n in [1, 2, 16, 37] {
                let mut plain = INITIAL_ACC;
                plain[3] ^= 0x0123_4567_89ab_cdef;
                let mut avx2 = plain;
                blocks_baseline(&mut plain, &d[..n * BLOCK]);
                x86::blocks_avx2(&mut avx2, &d[..n * BLOCK]);
                assert_eq!(avx2, plain, "{n} blocks");
            }
        }
    }

    #[test]
    fn large_input_in_odd_pieces_and_saved_midway() {
        let d = data((3 << 20) + 12345);
        let want = xxh3_128(&d);
        let mut h = Xxh3::default();
        let mut at = 0;
        let mut step = 1;
        while at < d.len() {
            let n = step.min(d.len() - at);
            h.update(&d[at..at + n]);
            at += n;
            step = step * 3 + 1;
            if step > 700_000 {
                step = 5;
            }
            // Save and restore after every piece: the digest does not move.
            h = Xxh3::restore(&h.save()).expect("a saved state restores");
        }
        assert_eq!(h.digest128(), want);
        assert!(Xxh3::restore(&[0u8; 10]).is_none());
    }
}
