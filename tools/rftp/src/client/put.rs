//! Uploads: `put` / `put_with` (to a temporary name on the server,
//! renamed when complete).

use std::fs;
use std::net::Shutdown;
use std::path::Path;
use std::time::Instant;

use rdma_xfer::FileReader;

use super::ftp::{final_reply, Ftp};
use super::options::{Options, Summary};
use super::session::{session, via, XferSlot};
use super::transfer::{chosen_checksum, copy_plain, mem_transfer, verify, VerifyError};
use super::url::Url;
use crate::checksum::{HashRead, HashSource, Running};

/// Upload `file` to `url` (or, in memory mode, zeros to a null sink) on a
/// new control connection.
pub fn put(file: Option<&Path>, url: &Url, o: &Options) -> Result<Summary, String> {
    let mut f = session(url, o)?;
    let mut slot = XferSlot::default();
    let s = put_with(&mut f, &mut slot, file, &url.path, o)?;
    f.quit();
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
    let start = Instant::now();
    let file = file.ok_or("put needs a FILE (or --mem SIZE)")?;
    let algo = chosen_checksum(f, o)?;
    // Open before any command, so a missing file costs no round trip and
    // leaves the server's state alone.
    let r =
        FileReader::open(file, 0, true).map_err(|e| format!("opening {}: {e}", file.display()))?;
    // The checksum runs over the blocks as they are read.
    let mut r = HashSource {
        inner: r,
        run: algo.map(Running::new),
    };
    let run_out;
    let x = slot.get(f, o, fs::metadata(file).ok().map(|m| m.len()))?;
    let via_s;
    let bytes = if let Some(x) = x {
        via_s = via(&**x);
        f.expect(&format!("RSTR {remote}"), |c| c / 100 == 1)?;
        let sent = x.send(&mut r);
        run_out = r.run;
        let st = match sent {
            Ok(st) => st,
            Err(e) => {
                slot.reset();
                let srv = f
                    .read_reply()
                    .map(|(c, t)| format!(": server replied {c} {t}"))
                    .unwrap_or_default();
                return Err(format!("upload failed: {e}{srv}"));
            }
        };
        slot.note(&st);
        final_reply(f, "RSTR")?;
        st.bytes
    } else {
        drop(r);
        via_s = "ftp".to_string();
        let src = fs::File::open(file).map_err(|e| format!("opening {}: {e}", file.display()))?;
        let total = src.metadata().map(|m| m.len()).ok();
        let mut src = HashRead {
            inner: src,
            run: algo.map(Running::new),
        };
        let mut data = f.data()?;
        f.expect(&format!("STOR {remote}"), |c| c / 100 == 1)?;
        let n = copy_plain(&mut src, &mut data, o, 0, total);
        run_out = src.run;
        let _ = data.shutdown(Shutdown::Write);
        drop(data);
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                let srv = f
                    .read_reply()
                    .map(|(c, t)| format!(": server replied {c} {t}"))
                    .unwrap_or_default();
                return Err(format!("upload failed: {e}{srv}"));
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
        resumed_from: 0,
        rehashed: None,
        elapsed,
        via: via_s,
        checksum,
        retries: 0,
    })
}
