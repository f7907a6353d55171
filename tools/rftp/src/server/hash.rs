//! `HASH` (draft-bryan-ftpext-hash) and the digests transfers compute on
//! the way.

use std::fs;
use std::path::Path;

use super::served::{FileId, Served, SERVED_KEEP};
use super::session::{io_reply, r, Reply, Session};
use crate::checksum::{self, Algo, Running};

impl Session {
    pub(super) fn hash(&mut self, arg: &str) -> Reply {
        match self.path(arg) {
            Ok((_, p)) => match self
                .find(&p)
                .and_then(|f| fs::metadata(f.path()).map(|m| (f, m)))
            {
                Ok((f, m)) if m.is_file() => {
                    let algo = self.hash_algo;
                    let range = format!("0-{}", m.len().saturating_sub(1));
                    if let Some(d) = self.served_digest(&p, algo) {
                        tracing::debug!(peer = %self.peer, file = %arg, "HASH from the transfer's running digest");
                        return r(213, format!("{algo} {range} {d} {arg}"));
                    }
                    match checksum::file_digest(&f.path(), algo) {
                        Ok(h) => r(213, format!("{algo} {range} {h} {arg}")),
                        Err(e) => io_reply(&e, arg),
                    }
                }
                Ok(_) => r(553, format!("{arg}: not a plain file.")),
                Err(e) => io_reply(&e, arg),
            },
            Err(e) => e,
        }
    }

    /// The digest a transfer computed of `path`, if the file is unchanged.
    pub(super) fn served_digest(&self, path: &Path, algo: Algo) -> Option<String> {
        let id = FileId::of(path)?;
        self.served
            .iter()
            .rev()
            .find(|s| s.path == path && s.algo == algo && s.id == id)
            .map(|s| s.digest.clone())
    }

    /// Remember the digest of the whole file `path`, computed by a
    /// transfer that covered all `bytes` of it; `before` is the file's
    /// identity when the transfer began (None: a new file).
    pub(super) fn record_digest(
        &mut self,
        path: &Path,
        run: Option<Running>,
        before: Option<FileId>,
    ) {
        let Some(run) = run else { return };
        let Some(id) = FileId::of(path) else { return };
        if run.bytes() != id.size || before.is_some_and(|b| b != id) {
            return; // partial, or the file changed meanwhile
        }
        let algo = run.algo();
        self.served.retain(|s| s.path != path);
        if self.served.len() >= SERVED_KEEP {
            self.served.remove(0);
        }
        self.served.push(Served {
            path: path.to_path_buf(),
            algo,
            id,
            digest: run.finish(),
        });
    }
}
