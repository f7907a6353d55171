//! What downloads and uploads share: the plain data copy with progress
//! and a rate limit, the final reply, the checksum chosen and the
//! verification against the server's HASH, and memory-to-memory transfers.

use std::io::{self, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use rdma_xfer::{BlockSink, NullSink, ZeroSource};

use super::ftp::{err, final_reply, Ftp};
use super::options::{Options, Summary};
use super::session::{via, XferSlot};
use crate::checksum::{Algo, Running};

/// Sleeps to keep a sink at `rate` bytes per second.
pub(super) struct Throttle<S> {
    pub(super) inner: S,
    /// Bytes per second at most; `None`: no limit.
    pub(super) rate: Option<u64>,
    pub(super) start: Instant,
    pub(super) bytes: u64,
}

impl<S: BlockSink> BlockSink for Throttle<S> {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_block(buf)?;
        let Some(rate) = self.rate else {
            return Ok(());
        };
        self.bytes += buf.len() as u64;
        let due = Duration::from_secs_f64(self.bytes as f64 / rate.max(1) as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            std::thread::sleep(wait);
        }
        Ok(())
    }
    fn finish(&mut self) -> io::Result<()> {
        self.inner.finish()
    }
}

/// Copy the TCP data connection into `dst` from `offset`, reporting
/// progress.
pub(super) fn copy_plain(
    src: &mut impl Read,
    dst: &mut impl Write,
    o: &Options,
    done0: u64,
    total: Option<u64>,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    let start = Instant::now();
    // The data connection's timeouts show as EAGAIN ("Resource temporarily
    // unavailable"); files never time out.
    let silent = |e: io::Error, what: &str| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the data connection {what} for {} s (the path or the server went silent)",
                o.timeout.as_secs()
            ),
        ),
        _ => e,
    };
    loop {
        let k = match src.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(silent(e, "brought no data")),
        };
        dst.write_all(&buf[..k])
            .map_err(|e| silent(e, "took no data"))?;
        n += k as u64;
        if let Some(p) = &o.plain_progress {
            p(done0 + n, total);
        }
        if let Some(rate) = o.limit_rate {
            let due = Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
            if let Some(w) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(w);
            }
        }
    }
}

/// The checksum of a transfer under `o`: negotiated with the server when
/// verifying (`None` when not verifying or the server has no HASH), and
/// told to `o.checksum_note`.
pub(super) fn chosen_checksum(f: &mut Ftp, o: &Options) -> Result<Option<Algo>, String> {
    if !o.verify {
        return Ok(None);
    }
    let algo = f.negotiate_hash(o.checksum)?;
    match algo {
        Some(a) => {
            if let Some(n) = &o.checksum_note {
                n(a);
            }
        }
        None => eprintln!("rftp: the server offers no HASH; the transfer is not verified"),
    }
    Ok(algo)
}

/// Why [`verify`] failed: the digests differ, or the server could not be
/// asked.
pub(super) enum VerifyError {
    Mismatch(String),
    Other(String),
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerifyError::Mismatch(e) | VerifyError::Other(e) => f.write_str(e),
        }
    }
}

/// Compare `ours` (the checksum computed as the data flowed) with the
/// server's for `remote`.
pub(super) fn verify(
    f: &mut Ftp,
    remote: &str,
    local: &Path,
    ours: Running,
) -> Result<Option<(Algo, String)>, VerifyError> {
    let algo = ours.algo();
    let ours = ours.finish();
    let Some(theirs) = f.hash_with(remote, algo).map_err(VerifyError::Other)? else {
        eprintln!("rftp: server offers no {algo} HASH; not verified");
        return Ok(None);
    };
    if ours != theirs {
        return Err(VerifyError::Mismatch(format!(
            "{algo} mismatch for {}: local {ours}, server {theirs}; the copy differs from the \
             server's file: transfer it again",
            local.display()
        )));
    }
    Ok(Some((algo, ours)))
}

/// Memory-to-memory: `len` bytes from a zero source to a null sink, in the
/// direction `download` says. `OPTS RDMA MEM` is switched off afterwards so
/// the control connection can go on with file transfers.
pub(super) fn mem_transfer(
    f: &mut Ftp,
    slot: &mut XferSlot,
    remote: &str,
    len: u64,
    download: bool,
    o: &Options,
) -> Result<Summary, String> {
    let x = slot
        .get(f, o, Some(len))?
        .ok_or("memory-to-memory mode needs the server's RDMA extension (RADR); drop --tcp")?;
    let via_s = via(&**x);
    f.expect("OPTS RDMA MEM ON", |c| c == 200)?;
    let res = if download {
        // The sink's blocks go out now, so the server's first block needs
        // no grant round trip after its Begin (issue 27).
        if let Err(e) = x.prepare_recv(Some(len)) {
            tracing::debug!(%e, "granting ahead failed; the receive will say why");
        }
        f.expect(&format!("RRTR {len}"), |c| c / 100 == 1)
            .and_then(|_| x.recv(&mut NullSink::default()).map_err(err))
    } else {
        f.expect(&format!("RSTR {remote}"), |c| c / 100 == 1)
            .and_then(|_| x.send(&mut ZeroSource::new(len)).map_err(err))
    };
    let st = match res {
        Ok(st) => st,
        Err(e) => {
            slot.reset();
            let _ = f.cmd("OPTS RDMA MEM OFF");
            return Err(e);
        }
    };
    slot.note(&st);
    let what = if download { "RRTR" } else { "RSTR" };
    let done = final_reply(f, what);
    let _ = f.cmd("OPTS RDMA MEM OFF");
    done?;
    Ok(Summary {
        bytes: st.bytes,
        resumed_from: 0,
        rehashed: None,
        elapsed: st.elapsed,
        via: via_s,
        checksum: None,
        retries: 0,
    })
}
