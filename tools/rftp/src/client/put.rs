//! Uploads: `put` / `put_with` (to a temporary name on the server,
//! renamed when complete), and `put_retrying` (reconnect with backoff
//! after a transient failure and resume at what the server holds and has
//! verified).

use std::fs;
use std::io::{self, Seek};
use std::net::Shutdown;
use std::path::Path;
use std::time::Instant;

use rdma_xfer::FileReader;

use super::ftp::{err, final_reply, AfterLoss, Ftp};
use super::options::{Options, Summary};
use super::retry::retrying;
use super::session::{session, via, XferSlot};
use super::transfer::{chosen_checksum, copy_plain, mem_transfer, verify, VerifyError};
use super::url::Url;
use crate::checksum::{self, HashRead, HashSource, Running};

/// Upload `file` to `url` (or, in memory mode, zeros to a null sink) on a
/// new control connection.
pub fn put(file: Option<&Path>, url: &Url, o: &Options) -> Result<Summary, String> {
    let mut f = session(url, o)?;
    let mut slot = XferSlot::default();
    let s = put_with(&mut f, &mut slot, file, &url.path, o)?;
    f.quit();
    if o.exit_after {
        slot.leave_to_exit();
    }
    Ok(s)
}

/// Upload `file` as `remote` on an open, logged-in control connection.
pub fn put_with(
    f: &mut Ftp,
    slot: &mut XferSlot,
    file: Option<&Path>,
    remote: &str,
    o: &Options,
) -> Result<Summary, String> {
    if let Some(len) = o.mem {
        return mem_transfer(f, slot, remote, len, false, o);
    }
    let file = file.ok_or("put needs a FILE (or --mem SIZE)")?;
    put_from(f, slot, file, remote, o, 0, None)
}

/// Upload `file` as `remote` from byte `offset` (`REST`, RFC 3659 §5; the
/// server continues the file it holds), with `prefix` the checksum of
/// the first `offset` bytes (so the whole file is verified at the end).
fn put_from(
    f: &mut Ftp,
    slot: &mut XferSlot,
    file: &Path,
    remote: &str,
    o: &Options,
    offset: u64,
    prefix: Option<Running>,
) -> Result<Summary, String> {
    let start = Instant::now();
    let algo = chosen_checksum(f, o)?;
    // Open before any command, so a missing file costs no round trip and
    // leaves the server's state alone.
    let r = FileReader::open(file, offset, true)
        .map_err(|e| format!("opening {}: {e}", file.display()))?;
    let len = fs::metadata(file).ok().map(|m| m.len());
    // The checksum runs over the blocks as they are read (after the
    // prefix a resume keeps).
    let run0 = match prefix {
        Some(p) if Some(p.algo()) == algo => Some(p),
        _ => algo.map(Running::new),
    };
    let mut r = HashSource {
        inner: r,
        run: run0.clone(),
    };
    let rest = |f: &mut Ftp| -> Result<(), String> {
        if offset > 0 {
            f.expect(&format!("REST {offset}"), |c| c == 350)?;
        }
        Ok(())
    };
    let run_out;
    let x = slot.get(f, o, len.map(|l| l.saturating_sub(offset)))?;
    let via_s;
    let bytes = if let Some(x) = x {
        via_s = via(&**x);
        rest(f)?;
        f.expect(&format!("RSTR {remote}"), |c| c / 100 == 1)?;
        let sent = x.send(&mut r);
        run_out = r.run;
        let st = match sent {
            Ok(st) => st,
            Err(e) => {
                slot.reset();
                // As for a download: a broken control connection is named
                // first (rftpd ends the session with it).
                return Err(match f.after_data_loss() {
                    AfterLoss::Reply((c, t)) => {
                        format!("upload failed: {e}: server replied {c} {t}")
                    }
                    AfterLoss::Broken(ce) => format!(
                        "upload failed: {}; the transfer session ended with it ({e})",
                        AfterLoss::broken(&ce)
                    ),
                    AfterLoss::Silent(_) => format!("upload failed: {e}"),
                });
            }
        };
        slot.note(&st);
        final_reply(f, "RSTR")?;
        st.bytes
    } else {
        drop(r);
        via_s = "ftp".to_string();
        let mut src =
            fs::File::open(file).map_err(|e| format!("opening {}: {e}", file.display()))?;
        src.seek(io::SeekFrom::Start(offset)).map_err(err)?;
        let total = src.metadata().map(|m| m.len()).ok();
        let mut src = HashRead {
            inner: src,
            run: run0,
        };
        // RFC 959 §4.1.3: REST immediately precedes STOR.
        let mut data = f.data()?;
        rest(f)?;
        f.expect(&format!("STOR {remote}"), |c| c / 100 == 1)?;
        let n = copy_plain(&mut src, &mut data, o, offset, total);
        run_out = src.run;
        let _ = data.shutdown(Shutdown::Write);
        drop(data);
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                return Err(match f.after_data_loss() {
                    AfterLoss::Reply((c, t)) => {
                        format!("upload failed: {e}: server replied {c} {t}")
                    }
                    AfterLoss::Broken(ce) => format!(
                        "upload failed: {}; the data connection ended with it ({e})",
                        AfterLoss::broken(&ce)
                    ),
                    AfterLoss::Silent(_) => format!("upload failed: {e}"),
                });
            }
        };
        final_reply(f, "STOR")?;
        n
    };
    let elapsed = start.elapsed();
    // An upload whose copy differs from the local file must not stay on
    // the server under its final name: delete it (DELE) and say so.
    let checksum = match run_out {
        Some(run) => match verify(f, remote, file, run) {
            Ok(c) => c,
            Err(VerifyError::Mismatch(e)) => {
                let what = match f.cmd(&format!("DELE {remote}")) {
                    Ok((c, _)) if c / 100 == 2 => format!("the server's copy {remote} was deleted"),
                    Ok((c, t)) => format!("deleting the server's copy {remote} failed: {c} {t}"),
                    Err(err) => format!("deleting the server's copy {remote} failed: {err}"),
                };
                return Err(format!("{e} ({what})"));
            }
            Err(e) => return Err(e.to_string()),
        },
        None => None,
    };
    Ok(Summary {
        bytes,
        resumed_from: offset,
        rehashed: None,
        elapsed,
        via: via_s,
        checksum,
        retries: 0,
    })
}

/// The name an upload with `--retry` goes to until it is complete (then
/// renamed, RNFR/RNTO): what the server keeps of a cut-off attempt waits
/// there for the next one, never under the final name.
pub fn remote_part(remote: &str) -> String {
    format!("{remote}.part")
}

/// [`put`] of `file`, tried again up to `retries` times (after
/// [`backoff`](super::retry::backoff)) when it fails for a
/// [`transient`](super::retry::transient) reason (the loop is
/// `retry::retrying`). Each attempt
/// asks rftpd to keep what arrives if it is cut off (`OPTS UPLOAD KEEP
/// ON`) and uploads to [`remote_part`]; a retry asks the server what it
/// holds (`SIZE`), compares the server's `HASH` of it with the checksum of
/// the same bytes of the local file, and on a match resumes there (`REST`)
/// without sending those bytes again; the whole file is verified at the
/// end and renamed into place. A server that cannot keep a partial upload
/// gets the whole file again on each attempt. `say` reports each failure
/// and retry (the progress line).
pub fn put_retrying(
    file: &Path,
    url: &Url,
    o: &Options,
    retries: u32,
    say: &dyn Fn(&str),
) -> Result<Summary, String> {
    if o.mem.is_some() || retries == 0 {
        return put(Some(file), url, o);
    }
    retrying(
        retries,
        |n| put_attempt(file, url, o, n > 0, say),
        |n, e, wait| {
            say(&format!(
                "rftp: transfer interrupted: {e}; retry {n} of {retries} in {} s, resuming at \
                 what the server holds of {} once its checksum matches",
                wait.as_secs(),
                remote_part(&url.path),
            ));
            tracing::info!(retry = n, retries, error = %e, "upload interrupted; retrying");
        },
        std::thread::sleep,
    )
}

/// One attempt of [`put_retrying`]; `resume`: look at what the server
/// kept of an earlier attempt.
fn put_attempt(
    file: &Path,
    url: &Url,
    o: &Options,
    resume: bool,
    say: &dyn Fn(&str),
) -> Result<Summary, String> {
    let mut f = session(url, o)?;
    let mut slot = XferSlot::default();
    let keeps = matches!(f.cmd("OPTS UPLOAD KEEP ON"), Ok((200, _)));
    if !keeps {
        tracing::info!(
            "the server cannot keep a cut-off upload; each attempt sends the whole file"
        );
        let s = put_with(&mut f, &mut slot, Some(file), &url.path, o)?;
        f.quit();
        return Ok(s);
    }
    let part = remote_part(&url.path);
    let len = fs::metadata(file)
        .map_err(|e| format!("opening {}: {e}", file.display()))?
        .len();
    let mut offset = 0;
    let mut prefix = None;
    if resume {
        let held = f.size(&part).filter(|&h| h > 0 && h <= len);
        let algo = chosen_checksum(&mut f, o)?;
        match (held, algo) {
            (Some(held), Some(a)) => {
                // Only bytes whose checksum matches are not sent again.
                let (run, _) = checksum::resume_prefix(file, held, a)
                    .map_err(|e| format!("opening {}: {e}", file.display()))?;
                let ours = run.clone().finish();
                match f.hash_with(&part, a)? {
                    Some(theirs) if theirs == ours => {
                        tracing::info!(held, %a, "the server's part verified; resuming");
                        offset = held;
                        prefix = Some(run);
                    }
                    theirs => say(&format!(
                        "rftp: the server's {part} ({held} bytes) does not match the local file \
                         ({a} {}, local {ours}); sending the whole file again",
                        theirs.as_deref().unwrap_or("not given")
                    )),
                }
            }
            (Some(held), None) => say(&format!(
                "rftp: the server holds {held} bytes of {part}, but without a checksum they \
                 cannot be verified; sending the whole file again"
            )),
            (None, _) => {}
        }
    }
    let s = put_from(&mut f, &mut slot, file, &part, o, offset, prefix)?;
    f.expect(&format!("RNFR {part}"), |c| c == 350)?;
    f.expect(&format!("RNTO {}", url.path), |c| c / 100 == 2)?;
    f.quit();
    Ok(s)
}
