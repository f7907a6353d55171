//! File checksums for verified transfers, computed as the data flows,
//! negotiated with the server, and resumable.
//!
//! A transfer hashes its blocks in order as they pass (the sink as the
//! reorder stage releases them, the source as it reads), so the check
//! costs one pass over data already in cache instead of reading the file
//! again afterwards. rftpd keeps the digest of what it last sent or
//! received per file and answers `HASH` from it while the file is
//! unchanged (draft-bryan-ftpext-hash).
//!
//! **Negotiation** (draft-bryan-ftpext-hash §3-4, rsync's choice of
//! checksum): the server lists the algorithms it offers in its FEAT
//! `HASH` line, the selected one marked with `*`
//! (`HASH XXH3-128;BLAKE3;SHA-256*;CRC32C`); the client takes the first
//! of its own preference ([`PREFERENCE`]) that the server offers and
//! selects it with `OPTS HASH NAME` (200 NAME; an algorithm the server
//! does not offer gets 501 naming those it does). A server whose FEAT has
//! no `HASH` line is taken to know SHA-256 only, as the draft's examples
//! and every rftpd before the negotiation did.
//!
//! Algorithms:
//! - `XXH3-128` (the default): a 128-bit non-cryptographic hash at memory
//!   speed (rsync's default `xxh128`); catches corruption, not an
//!   adversary. Computed by [`crate::hash_xxh3`] (resumable state), checked
//!   against `xxhash-rust`.
//! - `BLAKE3`: cryptographic, a tree hash: each 1 MiB of the file is a
//!   subtree hashed with rayon across the cores (`Hasher::update_rayon`),
//!   the subtrees merged as BLAKE3's own chaining-value stack does
//!   (`blake3::hazmat`), so the digest is the standard one (`b3sum`).
//! - `SHA-256`: cryptographic, FIPS 180-4; `sha2`'s compression function
//!   (SHA-NI where the CPU has it) under a buffer of our own so that the
//!   state can be saved.
//! - `CRC32C`: 32 bits, the CRC32 instruction with carry-less
//!   multiplication (`crc-fast`).
//!
//! **Resume.** Every algorithm's running state can be saved
//! ([`Running::save`]) and restored: a download keeps it beside its
//! `FILE.part` (`FILE.part.sums`, [`Journal`]), updated after every block,
//! so a resumed download goes on from the saved state and hashes only the
//! bytes of the part past it, instead of reading the whole kept part again.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use blake3::hazmat::{
    merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use crc_fast::{CrcAlgorithm, Digest as CrcDigest};
use rdma_xfer::{BlockSink, BlockSource};
use sha2::digest::generic_array::GenericArray;

use crate::hash_xxh3::Xxh3;

/// A checksum algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    Xxh3_128,
    Blake3,
    Sha256,
    Crc32c,
}

/// The client's preference, best first (rsync style: the client picks the
/// first of these the server offers). XXH3-128 first: integrity at memory
/// speed; then the cryptographic ones, the faster first; CRC32C last (32
/// bits).
pub const PREFERENCE: [Algo; 4] = [Algo::Xxh3_128, Algo::Blake3, Algo::Sha256, Algo::Crc32c];

/// What rftpd offers unless configured otherwise (`hash_algorithms`).
pub const OFFERED_DEFAULT: [Algo; 4] = PREFERENCE;

impl Algo {
    /// The name in FEAT, OPTS HASH and HASH replies.
    pub fn wire_name(self) -> &'static str {
        match self {
            Algo::Xxh3_128 => "XXH3-128",
            Algo::Blake3 => "BLAKE3",
            Algo::Sha256 => "SHA-256",
            Algo::Crc32c => "CRC32C",
        }
    }

    /// The first of [`PREFERENCE`] in `offered`.
    pub fn pick(offered: &[Algo]) -> Option<Algo> {
        PREFERENCE.into_iter().find(|a| offered.contains(a))
    }

    /// `A;B;C` as in a FEAT line or an error message.
    pub fn list(algos: &[Algo]) -> String {
        algos
            .iter()
            .map(|a| a.wire_name())
            .collect::<Vec<_>>()
            .join(";")
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire_name())
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Algo, String> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "xxh3128" | "xxh3" | "xxh128" => Ok(Algo::Xxh3_128),
            "blake3" | "b3" => Ok(Algo::Blake3),
            "sha256" => Ok(Algo::Sha256),
            "crc32c" => Ok(Algo::Crc32c),
            _ => Err(format!(
                "unknown checksum {s:?}: use auto (default: the best the server offers), xxh3 \
                 (XXH3-128), blake3, sha256 or crc32c"
            )),
        }
    }
}

/// The client's `--checksum`: `auto` (negotiated) or one algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    #[default]
    Auto,
    Only(Algo),
}

impl FromStr for Choice {
    type Err = String;
    fn from_str(s: &str) -> Result<Choice, String> {
        if s.eq_ignore_ascii_case("auto") {
            Ok(Choice::Auto)
        } else {
            s.parse().map(Choice::Only)
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Auto => f.write_str("auto"),
            Choice::Only(a) => a.fmt(f),
        }
    }
}

/// The algorithms of a FEAT reply's `HASH` line (`HASH SHA-256*;CRC32C`),
/// in the server's order; unknown names are left out. `None`: no HASH
/// line.
pub fn feat_hash(feat: &str) -> Option<Vec<Algo>> {
    let line = feat.lines().map(str::trim).find_map(|l| {
        let (verb, rest) = l.split_once(' ').unwrap_or((l, ""));
        verb.eq_ignore_ascii_case("HASH").then_some(rest)
    })?;
    Some(
        line.split(';')
            .filter_map(|n| n.trim().trim_end_matches('*').parse().ok())
            .collect(),
    )
}

/// Units of the BLAKE3 tree (1 MiB: 1024 chunks, a power of two, so each
/// is a whole subtree of the file's tree).
const B3_UNIT: u64 = 1 << 20;

/// BLAKE3 over a stream, a 1 MiB subtree at a time. The stack holds the
/// chaining values of the completed subtrees, merged as BLAKE3's own
/// hasher merges chunks (`add_chunk_chaining_value`, BLAKE3 paper §5.1.2):
/// a unit is pushed only when more input follows it, so the last one can
/// be the root.
#[derive(Clone)]
struct B3Tree {
    stack: Vec<ChainingValue>,
    /// Completed units pushed.
    units: u64,
    cur: blake3::Hasher,
    cur_len: u64,
}

impl B3Tree {
    fn new() -> B3Tree {
        B3Tree {
            stack: Vec::new(),
            units: 0,
            cur: blake3::Hasher::new(),
            cur_len: 0,
        }
    }

    fn push_current(&mut self) {
        let mut cv = self.cur.finalize_non_root();
        self.units += 1;
        let mut n = self.units;
        while n & 1 == 0 {
            let left = self.stack.pop().expect("the stack holds a left sibling");
            cv = merge_subtrees_non_root(&left, &cv, Mode::Hash);
            n >>= 1;
        }
        self.stack.push(cv);
        self.cur = blake3::Hasher::new();
        self.cur.set_input_offset(self.units * B3_UNIT);
        self.cur_len = 0;
    }

    fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.cur_len == B3_UNIT {
                self.push_current();
            }
            let take = ((B3_UNIT - self.cur_len) as usize).min(data.len());
            // rayon splits a large piece over the cores (a 1 MiB block
            // into 16 KiB-or-larger subtrees); small ones are not worth it.
            if take >= 128 << 10 {
                self.cur.update_rayon(&data[..take]);
            } else {
                self.cur.update(&data[..take]);
            }
            self.cur_len += take as u64;
            data = &data[take..];
        }
    }

    fn finish(&self) -> [u8; 32] {
        if self.stack.is_empty() {
            return *self.cur.finalize().as_bytes();
        }
        let mut cv = self.cur.finalize_non_root();
        for (i, left) in self.stack.iter().enumerate().rev() {
            if i == 0 {
                return *merge_subtrees_root(left, &cv, Mode::Hash).as_bytes();
            }
            cv = merge_subtrees_non_root(left, &cv, Mode::Hash);
        }
        unreachable!("the loop returns at i == 0")
    }

    /// Bytes of the units pushed, where a state can be saved (a unit is
    /// pushed only once input follows it: the last one may be the root,
    /// which its non-root chaining value cannot give).
    fn saved_len(&self) -> u64 {
        self.units * B3_UNIT
    }

    /// The stack as of [`B3Tree::saved_len`]: units (8) and the chaining
    /// values.
    fn save(&self) -> Vec<u8> {
        let mut v = self.units.to_le_bytes().to_vec();
        for cv in &self.stack {
            v.extend_from_slice(cv);
        }
        v
    }

    fn restore(b: &[u8]) -> Option<B3Tree> {
        let units = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let cvs = &b[8..];
        if !cvs.len().is_multiple_of(32) || cvs.len() / 32 != units.count_ones() as usize {
            return None;
        }
        let mut t = B3Tree::new();
        t.units = units;
        t.stack = cvs
            .chunks(32)
            .map(|c| c.try_into().expect("32 bytes"))
            .collect();
        t.cur.set_input_offset(units * B3_UNIT);
        Some(t)
    }
}

/// SHA-256 (FIPS 180-4) with a state that can be saved: the eight words,
/// the bytes so far and the partial 64-byte block.
#[derive(Clone)]
struct Sha {
    h: [u32; 8],
    buf: [u8; 64],
    len: usize,
    total: u64,
}

const SHA256_H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

impl Sha {
    fn new() -> Sha {
        Sha {
            h: SHA256_H0,
            buf: [0; 64],
            len: 0,
            total: 0,
        }
    }

    fn blocks(h: &mut [u32; 8], data: &[u8]) {
        // sha2's compression function over whole blocks, SHA-NI where the
        // CPU has it; a few blocks per call.
        let mut batch = [GenericArray::<u8, sha2::digest::consts::U64>::default(); 16];
        for group in data.chunks(64 * 16) {
            let n = group.len() / 64;
            for (dst, src) in batch.iter_mut().zip(group.chunks_exact(64)) {
                dst.copy_from_slice(src);
            }
            sha2::compress256(h, &batch[..n]);
        }
    }

    fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.len > 0 {
            let take = (64 - self.len).min(data.len());
            self.buf[self.len..self.len + take].copy_from_slice(&data[..take]);
            self.len += take;
            data = &data[take..];
            if self.len < 64 {
                return;
            }
            let b = self.buf;
            Sha::blocks(&mut self.h, &b);
            self.len = 0;
        }
        let whole = data.len() / 64 * 64;
        Sha::blocks(&mut self.h, &data[..whole]);
        let rest = &data[whole..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.len = rest.len();
    }

    fn finish(&self) -> [u8; 32] {
        let mut h = self.h;
        let mut tail = self.buf[..self.len].to_vec();
        tail.push(0x80);
        while tail.len() % 64 != 56 {
            tail.push(0);
        }
        tail.extend_from_slice(&(self.total * 8).to_be_bytes());
        Sha::blocks(&mut h, &tail);
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_mut(4).zip(h) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    fn save(&self) -> Vec<u8> {
        let mut v = self.total.to_le_bytes().to_vec();
        for w in self.h {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&self.buf[..self.len]);
        v
    }

    fn restore(b: &[u8]) -> Option<Sha> {
        if b.len() < 40 || b.len() - 40 >= 64 {
            return None;
        }
        let total = u64::from_le_bytes(b[..8].try_into().ok()?);
        let mut s = Sha::new();
        for (i, w) in s.h.iter_mut().enumerate() {
            *w = u32::from_le_bytes(b[8 + 4 * i..12 + 4 * i].try_into().ok()?);
        }
        let rest = &b[40..];
        if total % 64 != rest.len() as u64 {
            return None;
        }
        s.buf[..rest.len()].copy_from_slice(rest);
        s.len = rest.len();
        s.total = total;
        Some(s)
    }
}

#[derive(Clone)]
enum State {
    Xxh3(Box<Xxh3>),
    Blake3(Box<B3Tree>),
    Sha256(Box<Sha>),
    Crc32c(Box<CrcDigest>),
}

/// A checksum being computed.
#[derive(Clone)]
pub struct Running {
    algo: Algo,
    state: State,
    bytes: u64,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("algo", &self.algo)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Running {
    pub fn new(algo: Algo) -> Running {
        let state = match algo {
            Algo::Xxh3_128 => State::Xxh3(Box::default()),
            Algo::Blake3 => State::Blake3(Box::new(B3Tree::new())),
            Algo::Sha256 => State::Sha256(Box::new(Sha::new())),
            Algo::Crc32c => State::Crc32c(Box::new(CrcDigest::new(CrcAlgorithm::Crc32Iscsi))),
        };
        Running {
            algo,
            state,
            bytes: 0,
        }
    }

    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// Bytes hashed so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            State::Xxh3(x) => x.update(data),
            State::Blake3(t) => t.update(data),
            State::Sha256(s) => s.update(data),
            State::Crc32c(c) => c.update(data),
        }
        self.bytes += data.len() as u64;
    }

    /// The digest in lowercase hex (CRC32C: 8 digits; XXH3-128 the
    /// canonical big-endian form `xxhsum -H2` prints).
    pub fn finish(self) -> String {
        self.peek()
    }

    /// The digest so far, without ending the computation.
    pub fn peek(&self) -> String {
        match &self.state {
            State::Xxh3(x) => format!("{:032x}", x.digest128()),
            State::Blake3(t) => hex(&t.finish()),
            State::Sha256(s) => hex(&s.finish()),
            State::Crc32c(c) => format!("{:08x}", c.finalize() as u32),
        }
    }

    /// The state, saved at the latest point it can be: (bytes covered, the
    /// state). Every byte for XXH3-128, SHA-256 and CRC32C; for BLAKE3 the
    /// last 1 MiB boundary (a resume hashes the rest of the part again).
    pub fn save(&self) -> (u64, Vec<u8>) {
        match &self.state {
            State::Xxh3(x) => (self.bytes, x.save()),
            State::Blake3(t) => (t.saved_len(), t.save()),
            State::Sha256(s) => (self.bytes, s.save()),
            State::Crc32c(c) => (self.bytes, c.get_state().to_le_bytes().to_vec()),
        }
    }

    /// The computation [`Running::save`] saved after `bytes` bytes, or
    /// `None` if `state` is not one of `algo`.
    pub fn restore(algo: Algo, bytes: u64, state: &[u8]) -> Option<Running> {
        let state = match algo {
            Algo::Xxh3_128 => {
                let x = Xxh3::restore(state)?;
                if x.total() != bytes {
                    return None;
                }
                State::Xxh3(Box::new(x))
            }
            Algo::Blake3 => {
                let t = B3Tree::restore(state)?;
                if t.units * B3_UNIT != bytes {
                    return None;
                }
                State::Blake3(Box::new(t))
            }
            Algo::Sha256 => {
                let s = Sha::restore(state)?;
                if s.total != bytes {
                    return None;
                }
                State::Sha256(Box::new(s))
            }
            Algo::Crc32c => State::Crc32c(Box::new(CrcDigest::new_with_init_state(
                CrcAlgorithm::Crc32Iscsi,
                u64::from_le_bytes(state.try_into().ok()?),
            ))),
        };
        Some(Running { algo, state, bytes })
    }
}

/// The resume state of a download beside its part: `FILE.part.sums`,
/// rewritten in place after every block. One record:
/// `rftp-sums 1 ALGO BYTES HEX-STATE CRC32C-OF-THE-REST\n`; a torn or
/// stale record (checked by its CRC, its algorithm and the part's length)
/// is ignored and the part is hashed from its start, as before.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Option<File>,
    /// Bytes covered by the last record written.
    saved: u64,
    /// Length of the last record written (the file's length).
    written: usize,
}

impl Journal {
    /// The sidecar of `part`.
    pub fn path_for(part: &Path) -> PathBuf {
        let mut s = part.as_os_str().to_owned();
        s.push(".sums");
        PathBuf::from(s)
    }

    /// A journal for `part`, written from now on (the file is created at
    /// the first record).
    pub fn new(part: &Path) -> Journal {
        Journal {
            path: Journal::path_for(part),
            file: None,
            saved: 0,
            written: 0,
        }
    }

    /// Write `run`'s state if it covers more than the last record.
    pub fn record(&mut self, run: &Running) {
        let (bytes, state) = run.save();
        if bytes <= self.saved && self.file.is_some() {
            return;
        }
        let mut line = format!("rftp-sums 1 {} {bytes} {}", run.algo(), hex(&state));
        let crc = crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, line.as_bytes()) as u32;
        line.push_str(&format!(" {crc:08x}\n"));
        if self.file.is_none() {
            match File::create(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    tracing::debug!(path = %self.path.display(), %e, "no resume journal");
                    return;
                }
            }
        }
        if let Some(f) = &self.file {
            use std::os::unix::fs::FileExt;
            // Longer records overwrite shorter ones; the length is set after.
            if f.write_all_at(line.as_bytes(), 0).is_ok() {
                // A shorter record leaves the end of the last one behind:
                // cut it (the state of a given algorithm is mostly the
                // same length, so mostly no truncate per block).
                if line.len() < self.written {
                    let _ = f.set_len(line.len() as u64);
                }
                self.written = line.len();
                self.saved = bytes;
            }
        }
    }

    /// The state saved beside `part` for `algo`, if there is a sound one
    /// that the part still covers.
    pub fn load(part: &Path, algo: Algo, part_len: u64) -> Option<Running> {
        let text = std::fs::read_to_string(Journal::path_for(part)).ok()?;
        let line = text.lines().next()?;
        let (body, crc) = line.rsplit_once(' ')?;
        let want = crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, body.as_bytes()) as u32;
        if u32::from_str_radix(crc, 16).ok()? != want {
            return None;
        }
        let f: Vec<&str> = body.split(' ').collect();
        if f.len() != 5 || f[0] != "rftp-sums" || f[1] != "1" || f[2] != algo.wire_name() {
            return None;
        }
        let bytes: u64 = f[3].parse().ok()?;
        // A BLAKE3 state after whole units needs input after it (the part
        // has it when the state is sound: units are saved once more came).
        if bytes > part_len || (algo == Algo::Blake3 && bytes > 0 && bytes == part_len) {
            return None;
        }
        let state = unhex(f[4])?;
        Running::restore(algo, bytes, &state)
    }

    /// Remove the sidecar of `part`, if any.
    pub fn remove(part: &Path) {
        let _ = std::fs::remove_file(Journal::path_for(part));
    }
}

/// Lowercase hex (digests, saved states, password hashes). The journal
/// writes a state of about 1.1 KiB after every block, so this is a table
/// lookup rather than a `format!` per byte.
pub fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for &x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The checksum of the first `part_len` bytes of `part` for a resumed
/// download: from the journal's saved state plus the bytes past it, or
/// from the start of the part when there is no usable state. Returns the
/// computation and how many bytes of the part were read.
pub fn resume_prefix(part: &Path, part_len: u64, algo: Algo) -> io::Result<(Running, u64)> {
    let (mut run, from) = match Journal::load(part, algo, part_len) {
        Some(r) => {
            let b = r.bytes();
            (r, b)
        }
        None => (Running::new(algo), 0),
    };
    let mut f = File::open(part)?;
    use std::io::Seek;
    f.seek(io::SeekFrom::Start(from))?;
    let mut f = f.take(part_len - from);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        run.update(&buf[..n]);
    }
    if run.bytes() != part_len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the part ended at {} of {part_len} bytes", run.bytes()),
        ));
    }
    Ok((run, part_len - from))
}

/// Hash the first `len` bytes of `path` (all of it for `u64::MAX`) into a
/// fresh [`Running`], e.g. the part of a file a resumed transfer keeps.
pub fn hash_prefix(path: &Path, len: u64, algo: Algo) -> io::Result<Running> {
    let mut run = Running::new(algo);
    let mut f = File::open(path)?.take(len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        run.update(&buf[..n]);
    }
    Ok(run)
}

/// The checksum of a whole file.
pub fn file_digest(path: &Path, algo: Algo) -> io::Result<String> {
    hash_prefix(path, u64::MAX, algo).map(Running::finish)
}

/// A [`BlockSink`] that hashes the blocks it passes on, in order (when
/// `run` is set; `None` passes them on only), and records the state in
/// `journal` after each block (downloads, for a resume).
pub struct HashSink<S> {
    pub inner: S,
    pub run: Option<Running>,
    pub journal: Option<Journal>,
}

impl<S: BlockSink> BlockSink for HashSink<S> {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_block(buf)?;
        if let Some(r) = &mut self.run {
            r.update(buf);
            if let Some(j) = &mut self.journal {
                j.record(r);
            }
        }
        Ok(())
    }
    fn finish(&mut self) -> io::Result<()> {
        self.inner.finish()
    }
}

/// A [`BlockSource`] that hashes the blocks it reads, in order (when
/// `run` is set).
pub struct HashSource<S> {
    pub inner: S,
    pub run: Option<Running>,
}

impl<S: BlockSource> BlockSource for HashSource<S> {
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read_block(buf)?;
        if let Some(r) = &mut self.run {
            r.update(&buf[..n]);
        }
        Ok(n)
    }
    fn len_hint(&self) -> Option<u64> {
        self.inner.len_hint()
    }
}

/// A reader that hashes what it reads (plain FTP data connections), when
/// `run` is set.
pub struct HashRead<R> {
    pub inner: R,
    pub run: Option<Running>,
}

impl<R: Read> Read for HashRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(r) = &mut self.run {
            r.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// A writer that hashes what it writes (plain FTP data connections), when
/// `run` is set, and records the state in `journal` about every MiB.
pub struct HashWrite<W> {
    pub inner: W,
    pub run: Option<Running>,
    pub journal: Option<Journal>,
}

impl<W: Write> Write for HashWrite<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(r) = &mut self.run {
            let before = r.bytes();
            r.update(&buf[..n]);
            if let Some(j) = &mut self.journal {
                if before >> 20 != r.bytes() >> 20 {
                    j.record(r);
                }
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `n` pseudo-random bytes (xorshift64 from `seed`), for this crate's
/// hash tests.
#[cfg(test)]
pub(crate) fn test_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        test_bytes(n, 0x9e37_79b9_7f4a_7c15)
    }

    fn reference(algo: Algo, d: &[u8]) -> String {
        use sha2::Digest;
        match algo {
            Algo::Xxh3_128 => format!("{:032x}", xxhash_rust::xxh3::xxh3_128(d)),
            Algo::Blake3 => blake3::hash(d).to_hex().to_string(),
            Algo::Sha256 => hex(&sha2::Sha256::digest(d)),
            Algo::Crc32c => format!(
                "{:08x}",
                crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, d) as u32
            ),
        }
    }

    #[test]
    fn known_answers() {
        let mut s = Running::new(Algo::Sha256);
        s.update(b"ab");
        s.update(b"c");
        assert_eq!(
            s.finish(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // CRC-32C check value (RFC 3720 B.4 / the CRC catalogue).
        let mut c = Running::new(Algo::Crc32c);
        c.update(b"12345");
        c.update(b"6789");
        assert_eq!(c.bytes(), 9);
        assert_eq!(c.finish(), "e3069283");
        // BLAKE3 of the empty input (the BLAKE3 test vectors).
        assert_eq!(
            Running::new(Algo::Blake3).finish(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        // XXH3-128 of the empty input (xxhsum -H2 of an empty file).
        assert_eq!(
            Running::new(Algo::Xxh3_128).finish(),
            "99aa06d3014798d86001c324468d497f"
        );
    }

    /// Every algorithm equals its reference implementation at sizes around
    /// the block and unit boundaries, fed in pieces, and after a save and
    /// restore at every piece.
    #[test]
    fn streamed_saved_and_restored_equals_the_reference() {
        let d = data((3 << 20) + 777);
        for algo in PREFERENCE {
            for n in [
                0,
                1,
                63,
                64,
                65,
                240,
                241,
                1024,
                1025,
                1 << 20,
                (1 << 20) + 1,
                2 << 20,
                d.len(),
            ] {
                let mut r = Running::new(algo);
                let mut saved = Running::new(algo);
                for piece in d[..n].chunks(300_001) {
                    r.update(piece);
                    // Restore from the save and hash what it does not cover.
                    let (at, st) = r.save();
                    let mut back = Running::restore(algo, at, &st)
                        .unwrap_or_else(|| panic!("{algo} restores at {at}"));
                    back.update(&d[at as usize..r.bytes() as usize]);
                    saved = back;
                }
                let want = reference(algo, &d[..n]);
                assert_eq!(r.peek(), want, "{algo} at {n}");
                if n > 0 {
                    assert_eq!(saved.finish(), want, "{algo} restored at {n}");
                }
            }
        }
    }

    #[test]
    fn names_and_negotiation() {
        assert_eq!("SHA-256".parse::<Algo>().unwrap(), Algo::Sha256);
        assert_eq!("sha256".parse::<Algo>().unwrap(), Algo::Sha256);
        assert_eq!("crc32c".parse::<Algo>().unwrap(), Algo::Crc32c);
        assert_eq!("xxh3".parse::<Algo>().unwrap(), Algo::Xxh3_128);
        assert_eq!("XXH3-128".parse::<Algo>().unwrap(), Algo::Xxh3_128);
        assert_eq!("BLAKE3".parse::<Algo>().unwrap(), Algo::Blake3);
        assert!("md5".parse::<Algo>().unwrap_err().contains("use auto"));
        assert_eq!("auto".parse::<Choice>().unwrap(), Choice::Auto);
        assert_eq!(Algo::Crc32c.to_string(), "CRC32C");
        let feat = "Extensions supported:\nSIZE\nHASH XXH3-128;BLAKE3;SHA-256*;CRC32C;MD5\nEnd";
        let offered = feat_hash(feat).unwrap();
        assert_eq!(offered, PREFERENCE.to_vec(), "MD5 (unknown) left out");
        assert_eq!(Algo::pick(&offered), Some(Algo::Xxh3_128));
        // An old rftpd (SHA-256 and CRC32C): SHA-256, the better of them.
        let old = feat_hash(" HASH SHA-256*;CRC32C").unwrap();
        assert_eq!(Algo::pick(&old), Some(Algo::Sha256));
        assert_eq!(Algo::pick(&[Algo::Crc32c]), Some(Algo::Crc32c));
        assert_eq!(Algo::pick(&[]), None);
        assert_eq!(feat_hash("Extensions supported:\nSIZE\nEnd"), None);
    }

    #[test]
    fn journal_resumes_without_reading_the_covered_part() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("f.part");
        let d = data((5 << 20) + 4321);
        std::fs::write(&part, &d[..(3 << 20) + 99]).unwrap();
        for algo in PREFERENCE {
            Journal::remove(&part);
            let mut j = Journal::new(&part);
            let mut r = Running::new(algo);
            for block in d[..(3 << 20) + 99].chunks(1 << 20) {
                r.update(block);
                j.record(&r);
            }
            drop(j);
            let (mut run, read) = resume_prefix(&part, (3 << 20) + 99, algo).unwrap();
            // BLAKE3 saves at its last 1 MiB boundary, the others at the end.
            let want_read = if algo == Algo::Blake3 { 99 } else { 0 };
            assert_eq!(read, want_read, "{algo}");
            run.update(&d[(3 << 20) + 99..]);
            assert_eq!(run.finish(), reference(algo, &d), "{algo}");
            // Another algorithm's journal, or a torn record: start over.
            let other = if algo == Algo::Sha256 {
                Algo::Crc32c
            } else {
                Algo::Sha256
            };
            let (_, read) = resume_prefix(&part, (3 << 20) + 99, other).unwrap();
            assert_eq!(read, (3 << 20) + 99);
            let p = Journal::path_for(&part);
            let mut t = std::fs::read(&p).unwrap();
            let mid = t.len() / 2;
            t[mid] ^= 1;
            std::fs::write(&p, &t).unwrap();
            assert!(
                Journal::load(&part, algo, (3 << 20) + 99).is_none(),
                "{algo}"
            );
        }
    }

    #[test]
    fn hex_digits() {
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff, 0x10]), "000fa5ff10");
        let all: Vec<u8> = (0..=255).collect();
        let want: String = all.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex(&all), want);
        assert_eq!(unhex(&hex(&all)).unwrap(), all);
    }

    /// A record shorter than the last one replaces it whole (the file is
    /// cut to the new record, not left with the old one's tail).
    #[test]
    fn journal_shorter_record_replaces_a_longer_one() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("f.part");
        let d = data(4096);
        std::fs::write(&part, &d).unwrap();
        let mut j = Journal::new(&part);
        let mut r = Running::new(Algo::Sha256);
        r.update(&d[..100]); // 36 bytes of partial block in the state
        j.record(&r);
        r.update(&d[100..128]); // none: a shorter record
        j.record(&r);
        let text = std::fs::read_to_string(Journal::path_for(&part)).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(text.ends_with('\n'));
        let back = Journal::load(&part, Algo::Sha256, 4096).expect("the record loads");
        assert_eq!(back.bytes(), 128);
    }

    #[test]
    fn prefix_then_stream_equals_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for algo in PREFERENCE {
            let mut run = hash_prefix(&p, 1_234_567, algo).unwrap();
            assert_eq!(run.bytes(), 1_234_567);
            run.update(&data[1_234_567..]);
            assert_eq!(run.finish(), file_digest(&p, algo).unwrap());
        }
    }
}
