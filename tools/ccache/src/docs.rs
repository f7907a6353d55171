//! The test documents ccappd serves and updates: one file per document
//! under the document root, named by its number, whose body says its
//! version. A leaf module (std only): [`crate::appd`] writes these files
//! and [`crate::push`] reads them, without either importing the other.

use std::io;
use std::path::{Path, PathBuf};

/// The document body at a version: the line `doc D version V` repeated
/// and cut to `size` bytes. Every version of a document has the same
/// length, so an update rewrites the file in place.
pub fn doc_body(doc: u32, version: u64, size: usize) -> Vec<u8> {
    let line = format!("doc {doc:06} version {version:020}\n");
    line.bytes().cycle().take(size).collect()
}

/// The file of document `doc`.
pub fn doc_path(root: &Path, doc: u32) -> PathBuf {
    root.join(doc.to_string())
}

/// Write every document's file at `version`.
pub fn init_docs(root: &Path, docs: u32, version: u64, size: usize) -> io::Result<()> {
    std::fs::create_dir_all(root)?;
    for d in 0..docs {
        std::fs::write(doc_path(root, d), doc_body(d, version, size))?;
    }
    Ok(())
}
