//! Digests of whole files a session just moved, kept so that `HASH` right
//! after a transfer costs nothing (draft-bryan-ftpext-hash).

use std::fs;
use std::path::{Path, PathBuf};

use crate::checksum::Algo;

/// A digest computed while a whole file went through a transfer, valid
/// while the file is the same (device, inode, size, modification time).
#[derive(Debug, Clone)]
pub(super) struct Served {
    pub(super) path: PathBuf,
    pub(super) algo: Algo,
    pub(super) id: FileId,
    pub(super) digest: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) size: u64,
    pub(super) mtime_ns: i128,
}

impl FileId {
    pub(super) fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// Digests kept per session.
pub(super) const SERVED_KEEP: usize = 8;
