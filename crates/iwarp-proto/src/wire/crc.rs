//! MPA FPDU CRC: CRC32C (Castagnoli), RFC 5044 §4.4 and Appendix B of
//! RFC 3720 (the same polynomial, 0x1EDC6F41, reflected, init and final
//! XOR 0xFFFFFFFF).
//!
//! # Implementations
//!
//! Four back ends, one chosen once per process ([`active`]) and named by
//! [`impl_name`] (`iwarp-perf --json` reports it as `crc_impl`):
//!
//! | `IWARP_CRC` | back end | needs |
//! | --- | --- | --- |
//! | `avx512` | the `crc-fast` crate: VPCLMULQDQ folding over 512-bit registers fused with the SSE4.2 `crc32` instruction (pieces under 256 bytes: the `crc32` instruction directly) | AVX-512VL, VPCLMULQDQ, SSE4.2 |
//! | `avx2` | this module's folding over 256-bit registers (4 x 32 bytes per step, VPCLMULQDQ on YMM), `crc32` instruction for the last 16 bytes and the tail | AVX2, VPCLMULQDQ, PCLMULQDQ, SSE4.2 |
//! | `sse42` | the `crc32c` crate's 3-way `crc32` instruction loop | SSE4.2 |
//! | `soft` | slicing-by-8 tables | nothing |
//!
//! `auto` (the default, and what an unset or empty `IWARP_CRC` means)
//! starts from the first available in that order, which on the machines
//! measured (see docs/BENCHMARKS.md) is also the order of speed, and once
//! per process times the available hardware back ends on 64 KiB: one at
//! least 15% faster than the first replaces it (see [`auto`]). In a
//! privileged process (setuid, file capabilities) `IWARP_CRC` reads as
//! unset ([`crate::env`]).
//!
//! `crc-fast` cannot be told which of its kernels to run, and without
//! AVX-512 it uses a 128-bit SSE kernel, so the `avx2` path is this
//! module's own: it is what an AVX2-only CPU with VPCLMULQDQ (AMD Zen 3)
//! gets, and `IWARP_CRC=avx2` runs exactly that code on an AVX-512 machine.
//!
//! A value that is not one of the above, or a back end this CPU cannot
//! run, is refused by [`select`] with an error; [`active`] (which cannot
//! fail) logs that error through `tracing` and falls back to `auto`.
//! Tools should call [`active_from_env`] at start-up to fail loudly instead.
//!
//! The CRC covers the whole FPDU before the CRC field: the 2-byte ULPDU
//! length, the ULPDU, the pad and, when markers are in use, the markers
//! inside the FPDU (RFC 5044 §4.4).
//!
//! # Byte order on the wire
//!
//! The 32-bit value computed here (as the `crc32c` crate returns it) goes
//! on the wire **least significant byte first**: [`crc_to_wire`] is
//! `to_le_bytes`. This was established from `siw-crc.pcap`: the first Send
//! FPDU of the rping stream has CRC32C `0xc2eb7372` over its 36 bytes and
//! carries the bytes `72 73 eb c2`, which Wireshark shows as
//! "0x7273ebc2 (Good CRC32)" (it prints the field big-endian). Linux siw
//! writes the Linux crypto API's little-endian `crc32c` digest unchanged,
//! which is the same thing.

use std::fmt;
use std::sync::OnceLock;

/// Name of the environment variable that forces a back end.
pub const ENV_VAR: &str = "IWARP_CRC";

/// One CRC32C back end (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrcImpl {
    /// `crc-fast`'s AVX-512 VPCLMULQDQ kernel.
    Avx512,
    /// This module's AVX2 + VPCLMULQDQ (256-bit) folding kernel.
    Avx2,
    /// The `crc32c` crate's 3-way SSE4.2 `crc32` loop.
    Sse42,
    /// Portable slicing-by-8.
    Soft,
}

impl CrcImpl {
    /// Every back end, in `auto`'s order of preference.
    pub const ALL: [CrcImpl; 4] = [
        CrcImpl::Avx512,
        CrcImpl::Avx2,
        CrcImpl::Sse42,
        CrcImpl::Soft,
    ];

    /// The `IWARP_CRC` value that selects this back end.
    pub fn key(self) -> &'static str {
        match self {
            CrcImpl::Avx512 => "avx512",
            CrcImpl::Avx2 => "avx2",
            CrcImpl::Sse42 => "sse42",
            CrcImpl::Soft => "soft",
        }
    }

    /// What runs, for reports (`crc_impl` in `iwarp-perf --json`).
    pub fn name(self) -> &'static str {
        match self {
            CrcImpl::Avx512 => "avx512-vpclmulqdq",
            CrcImpl::Avx2 => "avx2-vpclmulqdq",
            CrcImpl::Sse42 => "sse42-crc32-3way",
            CrcImpl::Soft => "soft-slice8",
        }
    }

    /// Whether this CPU can run the back end.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                CrcImpl::Avx512 => {
                    std::is_x86_feature_detected!("avx512vl")
                        && std::is_x86_feature_detected!("vpclmulqdq")
                        && std::is_x86_feature_detected!("sse4.2")
                }
                CrcImpl::Avx2 => x86::avx2_available(),
                CrcImpl::Sse42 => std::is_x86_feature_detected!("sse4.2"),
                CrcImpl::Soft => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == CrcImpl::Soft
        }
    }

    /// Continue a finished CRC32C with this back end (the
    /// [`crc32c_append`] contract). A back end this CPU cannot run is not
    /// run: the portable code computes the same value instead.
    pub fn append(self, crc: u32, data: &[u8]) -> u32 {
        if self.available() {
            append_checked(self, crc, data)
        } else {
            !soft::append(!crc, data)
        }
    }
}

impl fmt::Display for CrcImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an `IWARP_CRC` value was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrcSelectError {
    /// Not `auto` or one of the back end keys.
    Unknown(String),
    /// A back end this CPU lacks the instructions for.
    Unavailable(CrcImpl),
}

impl fmt::Display for CrcSelectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrcSelectError::Unknown(v) => write!(
                f,
                "{ENV_VAR}={v:?} is not one of auto, avx512, avx2, sse42, soft"
            ),
            CrcSelectError::Unavailable(i) => write!(
                f,
                "{ENV_VAR}={}: this CPU cannot run the {} CRC32C back end",
                i.key(),
                i.name()
            ),
        }
    }
}

impl std::error::Error for CrcSelectError {}

/// The first available back end in order of preference (what `auto`
/// starts from, see [`auto`]).
pub fn preferred() -> CrcImpl {
    CrcImpl::ALL
        .into_iter()
        .find(|i| i.available())
        .unwrap_or(CrcImpl::Soft)
}

/// Another back end replaces the preferred one only when it is at least
/// this much faster in the calibration (a smaller gap is noise on a busy
/// machine, and the choice should not flip between runs for nothing).
const CALIBRATION_MARGIN: f64 = 1.15;

static AUTO: OnceLock<CrcImpl> = OnceLock::new();

/// What `auto` means on this CPU: the available hardware back ends are
/// timed once per process on a 64 KiB buffer (the size of a large FPDU;
/// the best of 5 interleaved rounds of 8 passes each, about 0.1 ms in all)
/// and the fastest is taken if it beats [`preferred`] by 15% or more;
/// otherwise the preferred one. The feature order alone is what was
/// measured on the machines we have; the timing covers CPUs where it is
/// wrong (a slow VPCLMULQDQ, say). `soft` is used only when nothing else
/// is available.
pub fn auto() -> CrcImpl {
    *AUTO.get_or_init(|| {
        let (chosen, times) = calibrate();
        tracing::debug!(
            crc_impl = chosen.name(),
            ?times,
            "CRC32C auto calibration (ns per 64 KiB)"
        );
        chosen
    })
}

/// Time the available hardware back ends; the choice and each one's best
/// time in nanoseconds per 64 KiB pass.
fn calibrate() -> (CrcImpl, Vec<(CrcImpl, u64)>) {
    let pref = preferred();
    let cands: Vec<CrcImpl> = CrcImpl::ALL
        .into_iter()
        .filter(|i| *i != CrcImpl::Soft && i.available())
        .collect();
    if cands.len() < 2 {
        return (pref, Vec::new());
    }
    let buf: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let mut best = vec![u64::MAX; cands.len()];
    let mut sink = 0u32;
    for round in 0..6 {
        for (k, imp) in cands.iter().enumerate() {
            let t = std::time::Instant::now();
            for _ in 0..8 {
                sink = append_checked(*imp, sink, std::hint::black_box(&buf));
            }
            let ns = (t.elapsed().as_nanos() / 8) as u64;
            // Round 0 warms caches and clocks up.
            if round > 0 {
                best[k] = best[k].min(ns.max(1));
            }
        }
    }
    std::hint::black_box(sink);
    let times: Vec<(CrcImpl, u64)> = cands.iter().copied().zip(best.iter().copied()).collect();
    let fastest = times
        .iter()
        .min_by_key(|(_, ns)| *ns)
        .copied()
        .expect("two candidates");
    let pref_ns = times
        .iter()
        .find(|(i, _)| *i == pref)
        .map_or(u64::MAX, |(_, ns)| *ns);
    let chosen = if fastest.0 != pref && (fastest.1 as f64) * CALIBRATION_MARGIN <= pref_ns as f64 {
        fastest.0
    } else {
        pref
    };
    (chosen, times)
}

/// The back end an `IWARP_CRC` value asks for: `auto` (or empty) or a key
/// of [`CrcImpl`], which must be available on this CPU.
pub fn select(value: &str) -> Result<CrcImpl, CrcSelectError> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("auto") {
        return Ok(auto());
    }
    let Some(i) = CrcImpl::ALL
        .into_iter()
        .find(|i| i.key().eq_ignore_ascii_case(v))
    else {
        return Err(CrcSelectError::Unknown(v.to_string()));
    };
    if i.available() {
        Ok(i)
    } else {
        Err(CrcSelectError::Unavailable(i))
    }
}

/// The back end `IWARP_CRC` asks for (unset: `auto`), or the reason it
/// cannot be had. For tools that want to refuse a bad setting at start-up.
pub fn active_from_env() -> Result<CrcImpl, CrcSelectError> {
    // Unset in a privileged process (`crate::env`).
    match crate::env::var(ENV_VAR) {
        Ok(v) => select(&v),
        Err(std::env::VarError::NotPresent) => Ok(auto()),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(CrcSelectError::Unknown(v.to_string_lossy().into_owned()))
        }
    }
}

static ACTIVE: OnceLock<CrcImpl> = OnceLock::new();

/// The back end [`crc32c`](fn@crc32c) and [`crc32c_append`] use: chosen on first use
/// from `IWARP_CRC` and the CPU, then fixed for the process. A refused
/// `IWARP_CRC` is logged and `auto` is used.
pub fn active() -> CrcImpl {
    *ACTIVE.get_or_init(|| {
        let chosen = active_from_env().unwrap_or_else(|e| {
            let a = auto();
            tracing::error!("{e}; using {} instead", a.name());
            a
        });
        tracing::debug!(crc_impl = chosen.name(), "CRC32C back end");
        chosen
    })
}

/// Name of the back end in use (for reports).
pub fn impl_name() -> &'static str {
    active().name()
}

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continues a CRC32C: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
///
/// The running value is the finished CRC of what came before (final XOR
/// applied), so it can be stored between calls and put on the wire as is;
/// undoing the final XOR gives the register state to continue from.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    append_checked(active(), crc, data)
}

/// `crc32c_append` with `imp`, which must be available (checked by the
/// callers: [`active`] only returns available back ends).
#[inline]
fn append_checked(imp: CrcImpl, crc: u32, data: &[u8]) -> u32 {
    match imp {
        // Header-sized pieces: the `crc32` instruction without building a
        // `crc_fast::Digest` (about 4 ns less per call).
        #[cfg(target_arch = "x86_64")]
        CrcImpl::Avx512 if data.len() < x86::MIN_FOLD => !x86::sse42_append(!crc, data),
        CrcImpl::Avx512 => {
            let mut d = crc_fast::Digest::new_with_init_state(
                crc_fast::CrcAlgorithm::Crc32Iscsi,
                u64::from(!crc),
            );
            d.update(data);
            d.finalize() as u32
        }
        #[cfg(target_arch = "x86_64")]
        CrcImpl::Avx2 => !x86::avx2_append(!crc, data),
        #[cfg(not(target_arch = "x86_64"))]
        CrcImpl::Avx2 => !soft::append(!crc, data),
        CrcImpl::Sse42 => crc32c::crc32c_append(crc, data),
        CrcImpl::Soft => !soft::append(!crc, data),
    }
}

/// Reflected CRC32C polynomial (0x1EDC6F41 bit-reversed).
const POLY: u32 = 0x82f6_3b78;

/// Slicing-by-8 over the CRC register (not inverted).
mod soft {
    use super::POLY;

    const fn tables() -> [[u32; 256]; 8] {
        let mut t = [[0u32; 256]; 8];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut b = 0;
            while b < 8 {
                c = (c >> 1) ^ if c & 1 != 0 { POLY } else { 0 };
                b += 1;
            }
            t[0][i] = c;
            i += 1;
        }
        let mut k = 1;
        while k < 8 {
            let mut i = 0;
            while i < 256 {
                let p = t[k - 1][i];
                t[k][i] = (p >> 8) ^ t[0][(p & 0xff) as usize];
                i += 1;
            }
            k += 1;
        }
        t
    }

    static T: [[u32; 256]; 8] = tables();

    pub(super) fn append(mut crc: u32, data: &[u8]) -> u32 {
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
            crc = T[7][(lo & 0xff) as usize]
                ^ T[6][((lo >> 8) & 0xff) as usize]
                ^ T[5][((lo >> 16) & 0xff) as usize]
                ^ T[4][(lo >> 24) as usize]
                ^ T[3][(hi & 0xff) as usize]
                ^ T[2][((hi >> 8) & 0xff) as usize]
                ^ T[1][((hi >> 16) & 0xff) as usize]
                ^ T[0][(hi >> 24) as usize];
        }
        for &b in chunks.remainder() {
            crc = (crc >> 8) ^ T[0][((crc ^ u32::from(b)) & 0xff) as usize];
        }
        crc
    }
}

/// The AVX2 + VPCLMULQDQ kernel: folding by carry-less multiplication
/// (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
/// Instruction", 2009) in 256-bit registers, with the final 128 bits and
/// the tail reduced by the SSE4.2 `crc32` instruction, as in corsix's
/// fast-crc32 kernels. Works on the CRC register (not inverted).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // the one call into the `target_feature` kernel
mod x86 {
    use super::POLY;
    use core::arch::x86_64::*;

    /// x^n mod P, bit-reflected (bit 31 is x^0).
    const fn xnmodp(n: u32) -> u64 {
        let mut a: u32 = 0x8000_0000;
        let mut i = 0;
        while i < n {
            a = (a >> 1) ^ if a & 1 != 0 { POLY } else { 0 };
            i += 1;
        }
        a as u64
    }

    /// Constants that move a 128-bit chunk `d` bytes further down the
    /// message: the low 64 bits (earlier bytes, higher powers) are
    /// multiplied by x^(8d+32) mod P, the high 64 bits by x^(8d-32) mod P,
    /// each one power lower for the reflected product's 1-bit shift.
    const fn fold_k(d: u32) -> (i64, i64) {
        (xnmodp(8 * d + 31) as i64, xnmodp(8 * d - 33) as i64)
    }

    #[cfg(test)]
    pub(super) fn fold_k_for_test(d: u32) -> (i64, i64) {
        fold_k(d)
    }

    const K128: (i64, i64) = fold_k(128);
    const K32: (i64, i64) = fold_k(32);
    const K16: (i64, i64) = fold_k(16);

    /// Below this the `crc32` instruction alone is as fast.
    pub(super) const MIN_FOLD: usize = 256;

    pub(super) fn avx2_available() -> bool {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("vpclmulqdq")
            && std::is_x86_feature_detected!("pclmulqdq")
            && std::is_x86_feature_detected!("sse4.2")
    }

    pub(super) fn sse42_append(crc: u32, data: &[u8]) -> u32 {
        debug_assert!(std::is_x86_feature_detected!("sse4.2"));
        // SAFETY: reached only through `append_checked` with
        // `CrcImpl::Avx512`, whose `available()` (checked before any
        // back end is used) includes SSE4.2.
        unsafe { crc_tail(crc, data) }
    }

    pub(super) fn avx2_append(crc: u32, data: &[u8]) -> u32 {
        debug_assert!(avx2_available());
        // SAFETY: `avx2_append` is only reached through `append_checked`
        // with `CrcImpl::Avx2`, which `active()` returns and
        // `CrcImpl::append` passes only after `avx2_available()` saw every
        // feature the kernel is compiled for on this CPU.
        unsafe { fold256(crc, data) }
    }

    #[inline]
    #[target_feature(enable = "sse4.2")]
    fn crc_tail(mut crc: u32, data: &[u8]) -> u32 {
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            crc = _mm_crc32_u64(u64::from(crc), v) as u32;
        }
        for &b in words.remainder() {
            crc = _mm_crc32_u8(crc, b);
        }
        crc
    }

    /// The first 32 bytes of `chunk` as a vector (built from four
    /// little-endian words: the compiler merges them into one unaligned
    /// load, and no `unsafe` pointer read is needed).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(chunk: &[u8]) -> __m256i {
        let w = |i: usize| {
            let b: [u8; 8] = chunk[i..i + 8].try_into().expect("8 bytes");
            i64::from_le_bytes(b)
        };
        _mm256_set_epi64x(w(24), w(16), w(8), w(0))
    }

    /// `x` moved forward by the distance `k` encodes, plus `next`.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn fold(x: __m256i, k: __m256i, next: __m256i) -> __m256i {
        let lo = _mm256_clmulepi64_epi128::<0x00>(x, k);
        let hi = _mm256_clmulepi64_epi128::<0x11>(x, k);
        _mm256_xor_si256(_mm256_xor_si256(lo, hi), next)
    }

    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
    fn fold256(crc: u32, data: &[u8]) -> u32 {
        if data.len() < MIN_FOLD {
            return crc_tail(crc, data);
        }
        let mut blocks = data.chunks_exact(128);
        let Some(first) = blocks.next() else {
            return crc_tail(crc, data);
        };
        let mut x = [
            load(&first[0..]),
            load(&first[32..]),
            load(&first[64..]),
            load(&first[96..]),
        ];
        // The register enters as the XOR of the first 4 bytes.
        x[0] = _mm256_xor_si256(x[0], _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, crc as i32));
        let k128 = _mm256_set_epi64x(K128.1, K128.0, K128.1, K128.0);
        for b in &mut blocks {
            x[0] = fold(x[0], k128, load(&b[0..]));
            x[1] = fold(x[1], k128, load(&b[32..]));
            x[2] = fold(x[2], k128, load(&b[64..]));
            x[3] = fold(x[3], k128, load(&b[96..]));
        }
        let k32 = _mm256_set_epi64x(K32.1, K32.0, K32.1, K32.0);
        let mut acc = fold(x[0], k32, x[1]);
        acc = fold(acc, k32, x[2]);
        acc = fold(acc, k32, x[3]);
        let mut rest = blocks.remainder().chunks_exact(32);
        for c in &mut rest {
            acc = fold(acc, k32, load(c));
        }
        // Two 128-bit lanes to one.
        let k16 = _mm_set_epi64x(K16.1, K16.0);
        let lo = _mm256_castsi256_si128(acc);
        let hi = _mm256_extracti128_si256::<1>(acc);
        let r = _mm_xor_si128(
            _mm_xor_si128(
                _mm_clmulepi64_si128::<0x00>(lo, k16),
                _mm_clmulepi64_si128::<0x11>(lo, k16),
            ),
            hi,
        );
        // The 16 bytes left are congruent to everything folded so far:
        // their CRC from a zero register is the register after it.
        let mut c = _mm_crc32_u64(0, _mm_extract_epi64::<0>(r) as u64);
        c = _mm_crc32_u64(c, _mm_extract_epi64::<1>(r) as u64);
        crc_tail(c as u32, rest.remainder())
    }
}

/// The 4 CRC bytes as they go on the wire (RFC 5044 §4.4 as siw and
/// Wireshark read it): least significant byte first.
pub fn crc_to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Inverse of [`crc_to_wire`].
pub fn crc_from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 3720 Appendix B.4 gives the CRC as the bytes of the iSCSI CRC
    // field, which is also little-endian: "aa 36 91 8a" is 0x8a9136aa.
    #[test]
    fn rfc3720_b4_vectors() {
        assert_eq!(crc_to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113f_db5c);
    }

    #[test]
    fn rfc3720_b4_iscsi_read_pdu() {
        // 48-byte SCSI Read (10) command PDU.
        let mut pdu = [0u8; 48];
        pdu[0] = 0x01;
        pdu[1] = 0xc0;
        pdu[16] = 0x14;
        pdu[22] = 0x04;
        pdu[27] = 0x14;
        pdu[31] = 0x18;
        pdu[32] = 0x28;
        pdu[40] = 0x02;
        assert_eq!(crc32c(&pdu), 0xd996_3a56);
        assert_eq!(crc_to_wire(crc32c(&pdu)), [0x56, 0x3a, 0x96, 0xd9]);
    }

    #[test]
    fn append_matches_oneshot() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let (a, b) = data.split_at(77);
        assert_eq!(crc32c_append(crc32c(a), b), crc32c(&data));
    }

    /// The first Send FPDU of the rping connection in siw-crc.pcap
    /// (frame 8): 36 bytes followed by the CRC bytes `72 73 eb c2`.
    #[test]
    fn siw_crc_capture_fpdu() {
        let fpdu: [u8; 40] = [
            0x00, 0x22, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x4f, 0xef, 0x63, 0x3d, 0x50,
            0xbe, 0x4d, 0xff, 0x00, 0x00, 0x00, 0x00, 0x40, 0x72, 0x73, 0xeb, 0xc2,
        ];
        let crc = crc32c(&fpdu[..36]);
        assert_eq!(crc, 0xc2eb_7372);
        assert_eq!(crc_to_wire(crc), [0x72, 0x73, 0xeb, 0xc2]);
        assert_eq!(crc_from_wire([0x72, 0x73, 0xeb, 0xc2]), crc);
    }

    /// Bit-at-a-time CRC32C register update: the definition, sharing no
    /// code with any back end.
    fn reference(crc: u32, data: &[u8]) -> u32 {
        let mut r = !crc;
        for &b in data {
            r ^= u32::from(b);
            for _ in 0..8 {
                r = (r >> 1) ^ if r & 1 != 0 { 0x82f6_3b78 } else { 0 };
            }
        }
        !r
    }

    #[test]
    fn reference_matches_rfc3720_vector() {
        assert_eq!(reference(0, &[0u8; 32]), 0x8a91_36aa);
        assert_eq!(reference(0, b"123456789"), 0xe306_9283);
    }

    #[test]
    fn every_back_end_on_every_length_up_to_1k() {
        let data: Vec<u8> = (0..1100u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        // Under Miri (interpreted, hours for the full sweep) every length
        // up to 80 and each block size of the kernels +-1: what Miri checks
        // is the pointer arithmetic and unaligned loads at the blocks'
        // boundaries and tails, which those lengths reach. Natively: all.
        let lens: Vec<usize> = if cfg!(miri) {
            (0..=80)
                .chain(
                    [128usize, 256, 512, 1024]
                        .iter()
                        .flat_map(|&n| [n - 1, n, n + 1]),
                )
                .collect()
        } else {
            (0..=1030).collect()
        };
        for imp in CrcImpl::ALL.into_iter().filter(|i| i.available()) {
            for &len in &lens {
                for off in [0usize, 1, 7, 13] {
                    let d = &data[off..off + len.min(data.len() - off)];
                    assert_eq!(
                        imp.append(0, d),
                        reference(0, d),
                        "{imp} len {} off {off}",
                        d.len()
                    );
                }
            }
        }
    }

    /// The folding constants are the published ones for CRC32C (Intel's
    /// 512-bit and 128-bit fold constants, as in Linux and corsix).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fold_constants_are_the_published_ones() {
        assert_eq!(x86::fold_k_for_test(64), (0x740e_ef02, 0x9e4a_ddf8));
        assert_eq!(x86::fold_k_for_test(16), (0xf20c_0dfe, 0x493c_7d27));
    }

    #[test]
    fn select_refuses_unknown_and_unavailable() {
        assert_eq!(select("auto"), Ok(auto()));
        assert!(preferred().available());
        assert_eq!(select(""), Ok(auto()));
        assert!(auto().available());
        assert_eq!(select("SOFT"), Ok(CrcImpl::Soft));
        assert_eq!(
            select("avx1024"),
            Err(CrcSelectError::Unknown("avx1024".into()))
        );
        assert!(select("avx1024")
            .unwrap_err()
            .to_string()
            .contains("IWARP_CRC"));
        for imp in CrcImpl::ALL {
            match select(imp.key()) {
                Ok(got) => {
                    assert_eq!(got, imp);
                    assert!(imp.available());
                }
                Err(e) => {
                    assert_eq!(e, CrcSelectError::Unavailable(imp));
                    assert!(!imp.available());
                }
            }
        }
    }

    /// The calibration times every available hardware back end and
    /// returns one of them (or the preferred one), never `soft` while
    /// hardware ones exist.
    #[test]
    fn calibration_times_the_hardware_back_ends() {
        let (chosen, times) = calibrate();
        assert!(chosen.available());
        let hw: Vec<CrcImpl> = CrcImpl::ALL
            .into_iter()
            .filter(|i| *i != CrcImpl::Soft && i.available())
            .collect();
        if hw.len() >= 2 {
            assert_eq!(times.iter().map(|t| t.0).collect::<Vec<_>>(), hw);
            assert!(times.iter().all(|t| t.1 > 0 && t.1 < u64::MAX), "{times:?}");
            assert!(hw.contains(&chosen));
            // Not chosen over the preferred one without the margin.
            let ns = |i: CrcImpl| times.iter().find(|t| t.0 == i).unwrap().1 as f64;
            if chosen != preferred() {
                assert!(
                    ns(chosen) * CALIBRATION_MARGIN <= ns(preferred()),
                    "{times:?}"
                );
            }
        } else {
            assert_eq!(chosen, preferred());
        }
    }

    #[test]
    fn active_back_end_is_available_and_named() {
        assert!(active().available());
        assert_eq!(impl_name(), active().name());
    }

    /// The longest random vector: 70,000 bytes natively (past every
    /// kernel's blocks many times); 4 KiB under Miri, where proptest builds
    /// a vector one interpreted element at a time and 70,000 bytes took
    /// longer than the long sanitizer run's hour for two cases.
    const MAX_RANDOM_LEN: usize = if cfg!(miri) { 4096 } else { 70_000 };

    proptest::proptest! {
        /// Every back end, on random data at random alignments, split at a
        /// random point (the continuation form), equals the reference.
        #[test]
        fn back_ends_agree_with_reference(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..MAX_RANDOM_LEN),
            off in 0usize..64,
            cut in 0.0f64..1.0,
            seed in proptest::prelude::any::<u32>(),
        ) {
            let d = &data[off.min(data.len())..];
            let cut = ((d.len() as f64) * cut) as usize;
            let (a, b) = d.split_at(cut);
            let whole = reference(seed, d);
            for imp in CrcImpl::ALL.into_iter().filter(|i| i.available()) {
                proptest::prop_assert_eq!(imp.append(seed, d), whole, "{} one shot", imp);
                proptest::prop_assert_eq!(imp.append(imp.append(seed, a), b), whole, "{} split at {}", imp, cut);
            }
            proptest::prop_assert_eq!(crc32c_append(seed, d), whole);
        }
    }
}
