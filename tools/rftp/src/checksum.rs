//! File checksums for verified transfers, computed as the data flows.
//!
//! A transfer hashes its blocks in order as they pass (the sink as the
//! reorder stage releases them, the source as it reads), so the check
//! costs one pass over data already in cache instead of reading the file
//! again afterwards. rftpd keeps the digest of what it last sent or
//! received per file and answers `HASH` from it while the file is
//! unchanged (draft-bryan-ftpext-hash; `OPTS HASH` picks the algorithm).
//!
//! Algorithms, as bulk movers offer them (GridFTP's `-verify-checksum`):
//! - `SHA-256` (default): cryptographic; the `sha2` crate uses the CPU's
//!   SHA extensions (SHA-NI) where it has them.
//! - `CRC32C`: fast, not cryptographic (catches corruption, not an
//!   adversary); `crc-fast` uses the CRC32 instruction with carry-less
//!   multiplication (PCLMULQDQ / VPCLMULQDQ).

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::str::FromStr;

use crc_fast::{CrcAlgorithm, Digest as CrcDigest};
use rdma_xfer::{BlockSink, BlockSource};
use sha2::{Digest, Sha256};

use crate::util::hex;

/// A checksum algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algo {
    #[default]
    Sha256,
    Crc32c,
}

impl Algo {
    /// The name in FEAT, OPTS HASH and HASH replies.
    pub fn wire_name(self) -> &'static str {
        match self {
            Algo::Sha256 => "SHA-256",
            Algo::Crc32c => "CRC32C",
        }
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
        match s.to_ascii_lowercase().replace('-', "").as_str() {
            "sha256" => Ok(Algo::Sha256),
            "crc32c" => Ok(Algo::Crc32c),
            _ => Err(format!(
                "unknown checksum {s:?}: use sha256 (default) or crc32c (fast, not cryptographic)"
            )),
        }
    }
}

/// A checksum being computed.
pub struct Running {
    algo: Algo,
    sha: Sha256,
    crc: CrcDigest,
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
        Running {
            algo,
            sha: Sha256::new(),
            crc: CrcDigest::new(CrcAlgorithm::Crc32Iscsi),
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
        match self.algo {
            Algo::Sha256 => self.sha.update(data),
            Algo::Crc32c => self.crc.update(data),
        }
        self.bytes += data.len() as u64;
    }

    /// The digest in lowercase hex (CRC32C: 8 digits).
    pub fn finish(self) -> String {
        match self.algo {
            Algo::Sha256 => hex(&self.sha.finalize()),
            Algo::Crc32c => format!("{:08x}", self.crc.finalize() as u32),
        }
    }
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
/// `run` is set; `None` passes them on only).
pub struct HashSink<S> {
    pub inner: S,
    pub run: Option<Running>,
}

impl<S: BlockSink> BlockSink for HashSink<S> {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_block(buf)?;
        if let Some(r) = &mut self.run {
            r.update(buf);
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
/// `run` is set.
pub struct HashWrite<W> {
    pub inner: W,
    pub run: Option<Running>,
}

impl<W: Write> Write for HashWrite<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(r) = &mut self.run {
            r.update(&buf[..n]);
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn names() {
        assert_eq!("SHA-256".parse::<Algo>().unwrap(), Algo::Sha256);
        assert_eq!("sha256".parse::<Algo>().unwrap(), Algo::Sha256);
        assert_eq!("crc32c".parse::<Algo>().unwrap(), Algo::Crc32c);
        assert!("md5".parse::<Algo>().unwrap_err().contains("use sha256"));
        assert_eq!(Algo::Crc32c.to_string(), "CRC32C");
    }

    #[test]
    fn prefix_then_stream_equals_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for algo in [Algo::Sha256, Algo::Crc32c] {
            let mut run = hash_prefix(&p, 1_234_567, algo).unwrap();
            assert_eq!(run.bytes(), 1_234_567);
            run.update(&data[1_234_567..]);
            assert_eq!(run.finish(), file_digest(&p, algo).unwrap());
        }
    }
}
