//! Block sources and sinks: where the payload comes from and goes to.
//!
//! - [`FileReader`] / [`FileWriter`]: files, opened with `O_DIRECT` when the
//!   file system, the block size and the start offset allow it. Where
//!   `O_DIRECT` is refused (tmpfs answers `EINVAL` to `open`, some file
//!   systems only to the first read or write) they reopen the file buffered
//!   and carry on; the unaligned tail of a file is written buffered.
//! - [`ZeroSource`] / [`NullSink`]: memory-to-memory mode, to measure the
//!   network without disks.
//! - [`ReadSource`] / [`WriteSink`]: any `Read` / `Write`.
//!
//! Every block handed to a source or sink is page-aligned (it is a
//! registered memory region), which is what `O_DIRECT` needs.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Alignment `O_DIRECT` needs for offsets, lengths and buffers.
pub const DIRECT_ALIGN: u64 = 4096;

/// Where the source side reads blocks from.
pub trait BlockSource: Send {
    /// Fill `buf` completely, or less only at the end of the data; 0 means
    /// the end.
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Total bytes still to come, if known.
    fn len_hint(&self) -> Option<u64> {
        None
    }
}

/// Where the sink side writes blocks to, in order.
pub trait BlockSink: Send {
    /// Write all of `buf`.
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Everything was written: flush and sync what needs it.
    fn finish(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<T: BlockSource + ?Sized> BlockSource for Box<T> {
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_block(buf)
    }
    fn len_hint(&self) -> Option<u64> {
        (**self).len_hint()
    }
}

impl<T: BlockSink + ?Sized> BlockSink for Box<T> {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        (**self).write_block(buf)
    }
    fn finish(&mut self) -> io::Result<()> {
        (**self).finish()
    }
}

fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads a file from an offset, with `O_DIRECT` where possible.
#[derive(Debug)]
pub struct FileReader {
    path: PathBuf,
    file: File,
    pos: u64,
    remaining: u64,
    direct: bool,
}

impl FileReader {
    /// Open `path` and position it at `offset`. `direct` asks for
    /// `O_DIRECT`; it is used only if `offset` is aligned and the file
    /// system accepts it.
    pub fn open(path: &Path, offset: u64, direct: bool) -> io::Result<FileReader> {
        let mut direct = direct && offset & (DIRECT_ALIGN - 1) == 0;
        let file = if direct {
            match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => f,
                Err(e) if is_einval(&e) => {
                    tracing::debug!(path = %path.display(), "O_DIRECT refused; reading buffered");
                    direct = false;
                    File::open(path)?
                }
                Err(e) => return Err(e),
            }
        } else {
            File::open(path)?
        };
        let len = file.metadata()?.len();
        let mut r = FileReader {
            path: path.to_owned(),
            file,
            pos: offset,
            remaining: len.saturating_sub(offset),
            direct,
        };
        r.file.seek(SeekFrom::Start(offset))?;
        Ok(r)
    }

    /// True while reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn reopen_buffered(&mut self) -> io::Result<()> {
        tracing::debug!(path = %self.path.display(), "O_DIRECT read failed with EINVAL; reading buffered");
        self.file = File::open(&self.path)?;
        self.file.seek(SeekFrom::Start(self.pos))?;
        self.direct = false;
        Ok(())
    }
}

impl BlockSource for FileReader {
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.direct && ((buf.len() as u64 | buf.as_ptr() as u64) & (DIRECT_ALIGN - 1) != 0) {
            self.reopen_buffered()?;
        }
        let n = match fill(&mut self.file, buf) {
            Err(e) if self.direct && is_einval(&e) => {
                self.reopen_buffered()?;
                fill(&mut self.file, buf)?
            }
            r => r?,
        };
        self.pos += n as u64;
        self.remaining = self.remaining.saturating_sub(n as u64);
        Ok(n)
    }

    fn len_hint(&self) -> Option<u64> {
        Some(self.remaining)
    }
}

/// Writes a file from an offset (truncating it there), with `O_DIRECT`
/// for aligned blocks where possible.
#[derive(Debug)]
pub struct FileWriter {
    path: PathBuf,
    file: File,
    pos: u64,
    direct: bool,
}

impl FileWriter {
    /// Create (or open) `path`, truncate it to `offset` and write from
    /// there. `direct` asks for `O_DIRECT` (used only where possible).
    pub fn create(path: &Path, offset: u64, direct: bool) -> io::Result<FileWriter> {
        let mut direct = direct && offset & (DIRECT_ALIGN - 1) == 0;
        let mut opts = OpenOptions::new();
        opts.write(true).create(true).truncate(offset == 0);
        let file = if direct {
            match opts.clone().custom_flags(libc::O_DIRECT).open(path) {
                Ok(f) => f,
                Err(e) if is_einval(&e) => {
                    tracing::debug!(path = %path.display(), "O_DIRECT refused; writing buffered");
                    direct = false;
                    opts.open(path)?
                }
                Err(e) => return Err(e),
            }
        } else {
            opts.open(path)?
        };
        if offset > 0 {
            file.set_len(offset)?;
        }
        let mut w = FileWriter {
            path: path.to_owned(),
            file,
            pos: offset,
            direct,
        };
        w.file.seek(SeekFrom::Start(offset))?;
        Ok(w)
    }

    /// True while writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn reopen_buffered(&mut self) -> io::Result<()> {
        self.file = OpenOptions::new().write(true).open(&self.path)?;
        self.file.seek(SeekFrom::Start(self.pos))?;
        self.direct = false;
        Ok(())
    }
}

impl BlockSink for FileWriter {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.direct && ((buf.len() as u64 | buf.as_ptr() as u64) & (DIRECT_ALIGN - 1) != 0) {
            // The unaligned tail (or an unaligned buffer): buffered from here.
            self.reopen_buffered()?;
        }
        match self.file.write_all(buf) {
            Err(e) if self.direct && is_einval(&e) => {
                tracing::debug!(path = %self.path.display(), "O_DIRECT write failed with EINVAL; writing buffered");
                self.reopen_buffered()?;
                self.file.write_all(buf)?;
            }
            r => r?,
        }
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// `len` zero bytes (memory-to-memory mode).
///
/// Clearing every block before every send would cost a full pass over the
/// memory (it was 5-6% of all CPU time in a 4 GiB `rftp get --mem`), so
/// the source remembers which buffers it has already cleared in this
/// transfer and clears only those it has not seen. That relies on nobody
/// else writing a block between two reads, which holds for rdma-xfer's
/// pools: a source block is written only by its source and is registered
/// without remote access (and TCP mode sends from one private buffer). As
/// a guard against other callers, the first and last bytes of a remembered
/// buffer are checked and the whole buffer is cleared again if they are
/// not zero.
#[derive(Debug, Clone)]
pub struct ZeroSource {
    remaining: u64,
    /// (address, length) of the buffers cleared so far in this transfer.
    cleared: Vec<(usize, usize)>,
}

/// Bytes at each end of a remembered buffer that are checked to be zero.
const ZERO_GUARD: usize = 64;

impl ZeroSource {
    /// A source of `len` zero bytes.
    pub fn new(len: u64) -> ZeroSource {
        ZeroSource {
            remaining: len,
            cleared: Vec::new(),
        }
    }

    fn still_zero(&self, buf: &[u8]) -> bool {
        let addr = buf.as_ptr() as usize;
        let known = self
            .cleared
            .iter()
            .any(|&(a, l)| a == addr && l >= buf.len());
        let g = ZERO_GUARD.min(buf.len());
        known && buf[..g].iter().all(|&b| b == 0) && buf[buf.len() - g..].iter().all(|&b| b == 0)
    }
}

impl BlockSource for ZeroSource {
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.remaining) as usize;
        let block = &mut buf[..n];
        if !self.still_zero(block) {
            // A pool block not seen yet in this transfer may hold what a
            // previous transfer left: clear it once.
            block.fill(0);
            let addr = block.as_ptr() as usize;
            self.cleared.retain(|&(a, _)| a != addr);
            // The pool is small (streams x depth); bound the memory anyway.
            if self.cleared.len() < 4096 {
                self.cleared.push((addr, n));
            }
        }
        self.remaining -= n as u64;
        Ok(n)
    }
    fn len_hint(&self) -> Option<u64> {
        Some(self.remaining)
    }
}

/// Discards everything, counting it (memory-to-memory mode).
#[derive(Debug, Clone, Default)]
pub struct NullSink {
    /// Bytes discarded.
    pub bytes: u64,
}

impl BlockSink for NullSink {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.bytes += buf.len() as u64;
        Ok(())
    }
}

/// Any reader as a source.
#[derive(Debug)]
pub struct ReadSource<R>(pub R);

impl<R: Read + Send> BlockSource for ReadSource<R> {
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        fill(&mut self.0, buf)
    }
}

/// Any writer as a sink.
#[derive(Debug)]
pub struct WriteSink<W>(pub W);

impl<W: Write + Send> BlockSink for WriteSink<W> {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }
    fn finish(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page-aligned buffer, as the pool's blocks are.
    fn aligned(len: usize) -> (Vec<u8>, usize) {
        let v = vec![0u8; len + 4096];
        let off = (4096 - v.as_ptr() as usize % 4096) % 4096;
        (v, off)
    }

    #[test]
    fn file_roundtrip_with_and_without_direct_and_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        for direct in [false, true] {
            for offset in [0u64, 4096, 5] {
                let mut r = FileReader::open(&src, offset, direct).unwrap();
                assert_eq!(r.len_hint(), Some(20_000 - offset));
                let dst = dir.path().join(format!("dst-{direct}-{offset}"));
                std::fs::write(&dst, &data[..offset as usize]).unwrap();
                let mut w = FileWriter::create(&dst, offset, direct).unwrap();
                let (mut v, o) = aligned(8192);
                loop {
                    let n = r.read_block(&mut v[o..o + 8192]).unwrap();
                    if n == 0 {
                        break;
                    }
                    w.write_block(&v[o..o + n]).unwrap();
                }
                w.finish().unwrap();
                assert_eq!(
                    std::fs::read(&dst).unwrap(),
                    data,
                    "direct={direct} offset={offset}"
                );
            }
        }
    }

    #[test]
    fn zero_source_clears_new_and_dirtied_buffers() {
        let mut z = ZeroSource::new(1 << 20);
        let mut a = vec![7u8; 8192];
        let mut b = vec![9u8; 8192];
        assert_eq!(z.read_block(&mut a).unwrap(), 8192);
        assert!(
            a.iter().all(|&x| x == 0),
            "first sight of a buffer clears it"
        );
        assert_eq!(z.read_block(&mut b).unwrap(), 8192);
        assert!(b.iter().all(|&x| x == 0), "another buffer is cleared too");
        // A caller that writes into a remembered buffer at its ends is
        // caught by the guard and the buffer is cleared again.
        a[0] = 1;
        a[8191] = 2;
        assert_eq!(z.read_block(&mut a).unwrap(), 8192);
        assert!(a.iter().all(|&x| x == 0));
        // A longer buffer at a remembered address is cleared in full.
        let mut c = vec![5u8; 16384];
        assert_eq!(z.read_block(&mut c).unwrap(), 16384);
        assert!(c.iter().all(|&x| x == 0));
    }

    #[test]
    fn zero_source_and_null_sink() {
        let mut z = ZeroSource::new(10_000);
        let mut n = NullSink::default();
        let mut buf = vec![1u8; 4096];
        loop {
            let k = z.read_block(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            assert!(buf[..k].iter().all(|&b| b == 0));
            n.write_block(&buf[..k]).unwrap();
        }
        assert_eq!(n.bytes, 10_000);
    }
}
