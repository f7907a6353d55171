//! Downloads: `get` / `get_with`, resuming from a kept `.part`, and
//! `get_retrying` (reconnect with backoff after a transient failure).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rdma_xfer::FileWriter;

use super::ftp::{err, final_reply, AfterLoss, Ftp};
use super::options::{Options, Summary};
use super::retry::retrying;
use super::session::{session_with, via, XferSlot};
use super::transfer::{chosen_checksum, copy_plain, mem_transfer, verify, Throttle};
use super::url::Url;
use crate::checksum::{self, HashSink, HashWrite, Journal, Running};

/// The `.part` name a download is written to before it is complete.
pub fn part_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// Download `url` to `out` (or, in memory mode, to a null sink) on a new
/// control connection.
pub fn get(url: &Url, out: &Path, o: &Options) -> Result<Summary, String> {
    // SIZE rides with the login when the server pipelines.
    let then = match o.mem {
        None => vec![format!("SIZE {}", url.path)],
        Some(_) => Vec::new(),
    };
    // The RADR rides with the login too (rftpd, a file download).
    let mut slot = XferSlot::default();
    let early = (o.mem.is_none() && !o.tcp).then_some(&mut slot);
    let mut f = session_with(url, o, &then, early)?;
    let s = get_with(&mut f, &mut slot, &url.path, out, o)?;
    f.quit();
    if o.exit_after {
        slot.leave_to_exit();
    }
    Ok(s)
}

/// Download `remote` to `out` on an open, logged-in control connection,
/// over the slot's RDMA session (made if needed) or plain FTP.
pub fn get_with(
    f: &mut Ftp,
    slot: &mut XferSlot,
    remote: &str,
    out: &Path,
    o: &Options,
) -> Result<Summary, String> {
    if let Some(len) = o.mem {
        return mem_transfer(f, slot, remote, len, true, o);
    }
    let start = Instant::now();
    let total = f.size(remote);
    let part = part_path(out);
    let mut offset = if o.resume {
        fs::metadata(&part).map(|m| m.len()).unwrap_or(0)
    } else {
        0
    };
    if total.is_some_and(|t| offset > t) {
        offset = 0;
    }
    // Against rftpd the commands up to the first data byte go in one
    // batch: OPTS HASH, RADR (when a new session is needed), REST, RRTR,
    // and the HASH that follows the transfer (rftpd reads the next command
    // only when the transfer is over, and answers HASH from the digest it
    // computed while sending). The .part is created first, so a local
    // error costs no transfer.
    let mut early = None;
    if f.pipelining() && !o.tcp && slot.may_use_rdma() {
        let algo = if o.verify {
            f.pick_hash(o.checksum)?
        } else {
            None
        };
        let radr = slot.radr_ahead(f, o, total.map(|t| t.saturating_sub(offset)))?;
        early = Some(FileWriter::create(&part, offset, true).map_err(|e| {
            format!(
                "creating {}: {e}; check that its directory exists and is writable",
                part.display()
            )
        })?);
        let mut batch = Vec::new();
        if let Some(a) = algo.filter(|a| f.hash_algo != Some(*a)) {
            batch.push(format!("OPTS HASH {a}"));
        }
        batch.extend(radr);
        if offset > 0 {
            batch.push(format!("REST {offset}"));
        }
        batch.push(format!("RRTR {remote}"));
        if algo.is_some() {
            batch.push(format!("HASH {remote}"));
        }
        f.send_ahead(&batch)?;
    }
    // What is left to move sizes the session (a small file, few streams).
    // It connects before the OPTS HASH reply is read: when the RADR went
    // with the login, that reply is a round trip behind the RADR's.
    let x = slot.get(f, o, total.map(|t| t.saturating_sub(offset)))?;
    let algo = chosen_checksum(f, o)?;
    // The checksum runs over the part a resume keeps (from the state saved
    // beside it, FILE.part.sums, plus what the part holds past that state),
    // then over the blocks as they arrive, saving its state after each.
    let mut rehashed = None;
    let run = match algo {
        None => None,
        Some(a) if offset > 0 => {
            let (run, read) = checksum::resume_prefix(&part, offset, a)
                .map_err(|e| format!("hashing {}: {e}", part.display()))?;
            tracing::info!(offset, %a, hashed_again = read, "resuming: checksum of the kept part");
            rehashed = Some(read);
            Some(run)
        }
        Some(a) => {
            Journal::remove(&part);
            Some(Running::new(a))
        }
    };
    let journal = || algo.map(|_| Journal::new(&part));
    let run_out: Option<Running>;
    let rest = |f: &mut Ftp| -> Result<(), String> {
        if offset > 0 {
            tracing::info!(offset, "resuming download");
            f.expect(&format!("REST {offset}"), |c| c == 350)?;
        }
        Ok(())
    };
    let via_s;
    let bytes = if let Some(x) = x {
        via_s = via(&**x);
        // Create the .part before asking, so a local error costs no
        // transfer; an empty .part made here goes if the server refuses.
        let w = match early.take() {
            Some(w) => w,
            None => FileWriter::create(&part, offset, true).map_err(|e| {
                format!(
                    "creating {}: {e}; check that its directory exists and is writable",
                    part.display()
                )
            })?,
        };
        // The sink's blocks go out as soon as the session is up, before
        // the server's 150 and Begin: its first block then needs no grant
        // round trip (issue 27; rdma-xfer's PREGRANT, where the server has
        // it). Kept for the next receive if the server refuses this one.
        if let Err(e) = x.prepare_recv(total.map(|t| t.saturating_sub(offset))) {
            tracing::debug!(%e, "granting ahead failed; the receive will say why");
        }
        if let Err(e) = rest(f).and_then(|_| f.expect(&format!("RRTR {remote}"), |c| c / 100 == 1))
        {
            drop(w);
            if offset == 0 {
                let _ = fs::remove_file(&part);
            }
            return Err(e);
        }
        let mut w = Throttle {
            inner: HashSink {
                inner: w,
                run,
                journal: journal(),
            },
            rate: o.limit_rate,
            start: Instant::now(),
            bytes: 0,
        };
        let r = x.recv(&mut w);
        let HashSink {
            inner: w,
            run: hashed,
            ..
        } = w.inner;
        drop(w);
        run_out = hashed;
        let st = match r {
            Ok(st) => st,
            Err(e) => {
                slot.reset();
                // The server's reply says more than "peer aborted" if it
                // failed; a broken control connection is named first (it
                // may be why the session ended).
                let kept = format!("the partial file {} is kept for a resume", part.display());
                return Err(match f.after_data_loss() {
                    AfterLoss::Reply((c, t)) => {
                        format!("download failed: {e} (server: {c} {t}); {kept}")
                    }
                    AfterLoss::Broken(ce) => format!(
                        "download failed: {}; the transfer session ended with it ({e}); {kept}",
                        AfterLoss::broken(&ce)
                    ),
                    AfterLoss::Silent(_) => format!("download failed: {e}; {kept}"),
                });
            }
        };
        slot.note(&st);
        final_reply(f, "RRTR")?;
        st.bytes
    } else {
        drop(early);
        via_s = "ftp".to_string();
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(offset == 0)
            .open(&part)
            .map_err(|e| {
                format!(
                    "creating {}: {e}; check that its directory exists and is writable",
                    part.display()
                )
            })?;
        file.set_len(offset).map_err(err)?;
        use std::io::Seek;
        file.seek(io::SeekFrom::Start(offset)).map_err(err)?;
        // RFC 959 §4.1.3: REST immediately precedes RETR, so the data
        // connection is set up first.
        let started = f.data().and_then(|d| {
            rest(f)?;
            f.expect(&format!("RETR {remote}"), |c| c / 100 == 1)
                .map(|_| d)
        });
        let mut data = match started {
            Ok(d) => d,
            Err(e) => {
                drop(file);
                if offset == 0 {
                    let _ = fs::remove_file(&part);
                }
                return Err(e);
            }
        };
        let mut dst = HashWrite {
            inner: file,
            run,
            journal: journal(),
        };
        let n = copy_plain(&mut data, &mut dst, o, offset, total).map_err(|e| {
            format!(
                "download failed: {e}; the partial file {} is kept for a resume",
                part.display()
            )
        })?;
        run_out = dst.run;
        drop(data);
        if let Some(t) = total.filter(|t| offset + n < *t) {
            let ended = format!(
                "the data connection ended after {} of {t} bytes",
                offset + n
            );
            let kept = format!("the partial file {} is kept for a resume", part.display());
            return Err(match f.after_data_loss() {
                AfterLoss::Reply((c, t)) => {
                    format!("download failed: {ended} (server: {c} {t}); {kept}")
                }
                AfterLoss::Broken(ce) => format!(
                    "download failed: {}; {ended}; {kept}",
                    AfterLoss::broken(&ce)
                ),
                AfterLoss::Silent(se) => format!("download failed: {ended} ({se}); {kept}"),
            });
        }
        final_reply(f, "RETR")?;
        n
    };
    let elapsed = start.elapsed();
    // Verify before the rename: a copy that differs from the server's file
    // must not appear under the final name (nor stay as a part to resume).
    let checksum = match run_out {
        Some(run) => verify(f, remote, out, run).map_err(|e| {
            let _ = fs::remove_file(&part);
            Journal::remove(&part);
            format!("{e} ({} deleted)", part.display())
        })?,
        None => None,
    };
    fs::rename(&part, out)
        .map_err(|e| format!("renaming {} to {}: {e}", part.display(), out.display()))?;
    Journal::remove(&part);
    Ok(Summary {
        bytes,
        resumed_from: offset,
        rehashed,
        elapsed,
        via: via_s,
        checksum,
        retries: 0,
    })
}

/// [`get`], tried again up to `retries` times (after
/// [`backoff`](super::retry::backoff)) when it fails for a
/// [`transient`](super::retry::transient) reason (the loop is
/// `retry::retrying`): each retry opens a new control
/// connection and transfer session and resumes at the end of `FILE.part`
/// (`REST`), the first byte not yet written in order, so nothing already
/// received is sent again; the checksum of the kept part is taken before
/// the rest arrives, and the whole file is verified at the end as usual.
/// `say` reports each failure and retry (the progress line). Returns the
/// last attempt's summary, with `retries` and `first_offset` telling what
/// happened.
pub fn get_retrying(
    url: &Url,
    out: &Path,
    o: &Options,
    retries: u32,
    say: &dyn Fn(&str),
) -> Result<Summary, String> {
    let mut o = o.clone();
    retrying(
        retries,
        |n| {
            if n > 0 {
                // Resume from what this run kept, even under --no-resume
                // (which is about a part left by an earlier run).
                o.resume = true;
            }
            get(url, out, &o)
        },
        |n, e, wait| {
            let kept = fs::metadata(part_path(out)).map(|m| m.len()).unwrap_or(0);
            say(&format!(
                "rftp: transfer interrupted: {e}; retry {n} of {retries} in {} s, resuming at \
                 byte {kept} (kept in {})",
                wait.as_secs(),
                part_path(out).display(),
            ));
            tracing::info!(retry = n, retries, kept, error = %e, "download interrupted; retrying");
        },
        std::thread::sleep,
    )
}
