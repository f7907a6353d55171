//! `rhttp put` (PUT/POST bodies by server-reads or client-writes, or
//! plain HTTP) and the hidden `probe-stag` test command (docs/MOD_RDMA.md,
//! "The four schemes", "STag scope").

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use iwarp::{MemoryRegion, SgList, WrOpcode};
use rhttp::ctrl::{CtrlMsg, Kind};
use rhttp::header::{RdmaHeader, Scheme};
use rhttp::http::{Response, Url};

use crate::cli::{Args, PutScheme};
use crate::get::{discard_body, rdma_error_of, save_body};
use crate::session::Session;
use crate::settings::Res;
use crate::sink::{bar, open_sink};
use crate::stats::report;

pub(super) fn read_file_at(f: &mut File, off: u64, buf: &mut [u8]) -> Res<()> {
    f.seek(SeekFrom::Start(off)).map_err(|e| e.to_string())?;
    f.read_exact(buf)
        .map_err(|e| format!("reading the file: {e}"))
}

/// Bytes copied into the registered buffer per step (uploads): small
/// enough to stay in the L2 cache between the read and the copy.
const COPY_CHUNK: usize = 256 << 10;

thread_local! {
    /// The upload scratch buffer, allocated once per thread: a fresh
    /// megabyte per request costs page faults, zeroing and, when it is
    /// unmapped again, TLB shoot-downs.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; COPY_CHUNK]);
}

/// Read the first `len` bytes of `f` into the registered buffer, through
/// the scratch buffer.
pub(super) fn copy_in(f: &mut File, buf: &MemoryRegion, len: u64) -> Res<()> {
    SCRATCH.with(|scratch| {
        let tmp = &mut scratch.borrow_mut()[..];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(tmp.len() as u64) as usize;
            read_file_at(f, off, &mut tmp[..n])?;
            buf.write_at(off as usize, &tmp[..n]);
            off += n as u64;
        }
        Ok(())
    })
}

/// Fault injection for the test command (hidden options).
#[derive(Debug, Clone, Copy)]
pub(super) struct PutHooks {
    pub(super) abort_at_buf: Option<u32>,
    pub(super) bad_stag: bool,
}

pub(super) fn plain_put(
    method: &str,
    s: &mut Session,
    url: &Url,
    path: &PathBuf,
    a: &Args,
    out: &mut dyn Write,
) -> Res<Response> {
    let mut f = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    s.http
        .send_request(method, url, &[("Content-Length", size.to_string())], None)
        .map_err(|e| format!("sending the request: {e}"))?;
    let pb = bar(a.quiet, size, &url.file_name());
    let mut buf = vec![0u8; 256 << 10];
    let mut sent = 0u64;
    while sent < size {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("{} shrank while uploading", path.display()));
        }
        s.http
            .write_body(&buf[..n])
            .map_err(|e| format!("sending the body: {e}"))?;
        sent += n as u64;
        pb.set_position(sent);
    }
    pb.finish_and_clear();
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    save_body(s, &resp, out)?;
    Ok(resp)
}

pub(super) fn cmd_put(
    method: &str,
    a: &Args,
    path: &PathBuf,
    u: &str,
    scheme: PutScheme,
    output: Option<&PathBuf>,
    hooks: PutHooks,
) -> Res<bool> {
    let abort_at_buf = hooks.abort_at_buf;
    let mut out: Box<dyn Write> = match output {
        Some(p) => Box::new(open_sink(p)?),
        None => Box::new(io::sink()),
    };
    let timeout = Duration::from_secs(a.timeout);
    let url = Url::parse(u)?;
    let mut s = Session::open(&url, timeout, a.crc.into())?;
    let t = Instant::now();
    let mut f = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let (resp, via) = if a.plain {
        (
            plain_put(method, &mut s, &url, path, a, &mut *out)?,
            "plain HTTP".to_string(),
        )
    } else {
        let r = s.rdma()?;
        let mut h = r.request_header(
            match scheme {
                PutScheme::ServerReads => Scheme::ServerReads,
                PutScheme::ClientWrites => Scheme::ClientWrites,
            },
            false,
        )?;
        h.length = Some(size);
        let pb = bar(a.quiet, size, &url.file_name());
        if let PutScheme::ServerReads = scheme {
            let b = r.buf(size)?;
            copy_in(&mut f, b, size)?;
            h.stag = Some(if hooks.bad_stag {
                b.rkey() ^ 0x5a5a_5a00
            } else {
                b.rkey()
            });
            h.to = Some(b.addr());
        }
        s.http
            .send_request(
                method,
                &url,
                &[("RDMA", h.to_string()), ("Content-Length", "0".into())],
                None,
            )
            .map_err(|e| format!("sending the request: {e}"))?;
        let r = s.rdma.as_mut().expect("created above");
        r.expect_conn(&s.http)?;
        if let PutScheme::ClientWrites = scheme {
            if r.live() {
                let mut tmp = Vec::new();
                let mut bufs = 0u32;
                while let Some(m) = r.wait_ctrl(Some(&s.http))? {
                    bufs += 1;
                    if abort_at_buf == Some(bufs) && m.kind == Kind::Buf {
                        eprintln!("rhttp-test: answering BUF {bufs} with ABORT");
                        r.send_ctrl(&CtrlMsg {
                            kind: Kind::Abort,
                            stag: m.stag,
                            length: 0,
                            to: 0,
                            offset: m.offset,
                        })?;
                        break;
                    }
                    match m.kind {
                        Kind::Buf => {}
                        Kind::Abort => {
                            tracing::warn!("the server aborted the upload");
                            break;
                        }
                        Kind::Done => return Err("unexpected DONE from the server".into()),
                    }
                    let n = m.length as usize;
                    if m.offset + n as u64 > size {
                        return Err(format!(
                            "the server asked for bytes {}..{} of a {size}-byte body",
                            m.offset,
                            m.offset + n as u64
                        ));
                    }
                    tmp.resize(n, 0);
                    read_file_at(&mut f, m.offset, &mut tmp)?;
                    let b = r.buf(n as u64)?;
                    b.write_at(0, &tmp);
                    let sge = b.sge(0, n);
                    r.run(
                        3,
                        WrOpcode::RdmaWrite {
                            remote_addr: m.to,
                            rkey: m.stag,
                        },
                        SgList::single(sge),
                    )?;
                    r.send_ctrl(&CtrlMsg {
                        kind: Kind::Done,
                        stag: m.stag,
                        length: m.length,
                        to: 0,
                        offset: m.offset,
                    })?;
                    pb.set_position(m.offset + n as u64);
                    if m.offset + n as u64 == size {
                        break; // all written: the HTTP answer comes next
                    }
                }
            }
        }
        r.wait_http(&s.http)?;
        let resp = s
            .http
            .read_head()
            .map_err(|e| format!("reading the response: {e}"))?;
        pb.finish_and_clear();
        if resp.header("RDMA").is_some() {
            save_body(&mut s, &resp, &mut *out)?;
            (resp, format!("RDMA ({})", h.scheme))
        } else {
            let why = rdma_error_of(&resp)
                .map(|e| format!("{} {}: {e}", resp.status, resp.reason))
                .unwrap_or_else(|| "the server did not answer with RDMA".into());
            discard_body(&mut s, &resp)?;
            eprintln!("rhttp: {method} {u}: {why}; retrying over plain HTTP");
            s.reopen_if(resp.close)?;
            (
                plain_put(method, &mut s, &url, path, a, &mut *out)?,
                "plain HTTP (fallback)".into(),
            )
        }
    };
    out.flush()
        .map_err(|e| format!("writing the response body: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    report(format_args!(
        "{method} {u}: {} {size} bytes via {via} in {:.3} ms ({:.1} MB/s)",
        resp.status,
        secs * 1e3,
        size as f64 / secs.max(1e-9) / 1e6
    ));
    Ok(resp.status < 400)
}

pub(super) fn cmd_probe(
    a: &Args,
    u: &str,
    stag: Option<u64>,
    to: Option<u64>,
    len: u32,
    beyond: bool,
) -> Res<bool> {
    let url = Url::parse(u)?;
    let mut s = Session::open(&url, Duration::from_secs(a.timeout), a.crc.into())?;
    let h = s.rdma()?.request_header(Scheme::ClientReads, false)?;
    s.http
        .send_request("GET", &url, &[("RDMA", h.to_string())], None)
        .map_err(|e| e.to_string())?;
    let r = s.rdma.as_mut().expect("created");
    r.expect_conn(&s.http)?;
    let resp = s.http.read_head().map_err(|e| e.to_string())?;
    let rh = RdmaHeader::parse(
        resp.header("RDMA")
            .ok_or("no RDMA answer to the probe's GET")?,
    )
    .map_err(|e| e.to_string())?;
    discard_body(&mut s, &resp)?;
    let own = (
        rh.stag.unwrap_or(0),
        rh.to.unwrap_or(0),
        rh.length.unwrap_or(0),
    );
    let r = s.rdma.as_mut().expect("created");
    r.buf(own.2.max(len as u64) + 1)?;
    let b = r.buf.as_ref().expect("allocated");
    if beyond {
        // One byte more than granted, before DONE: the base and bounds
        // check of the Read's source (RFC 5040 §7.2, base or bounds
        // violation) must refuse it.
        let n = own.2 as usize + 1;
        eprintln!(
            "rhttp-test: probing stag={:#x} to={:#x} len={n} (granted {})",
            own.0, own.1, own.2
        );
        return Ok(probe_verdict(
            own.0,
            r.run(
                4,
                WrOpcode::RdmaRead {
                    remote_addr: own.1,
                    rkey: own.0,
                },
                SgList::single(b.sge(0, n)),
            ),
        ));
    }
    r.run(
        2,
        WrOpcode::RdmaRead {
            remote_addr: own.1,
            rkey: own.0,
        },
        SgList::single(b.sge(0, own.2 as usize)),
    )?;
    // DONE invalidates the STag on arrival (Send with Invalidate), so the
    // Read that follows it on the same stream must be refused at once,
    // whenever the server's worker releases the body.
    r.send_done(own.0, own.2, None)?;
    let (ps, pt) = (stag.unwrap_or(own.0 as u64) as u32, to.unwrap_or(own.1));
    eprintln!("rhttp-test: probing stag={ps:#x} to={pt:#x} len={len}");
    Ok(probe_verdict(
        ps,
        r.run(
            4,
            WrOpcode::RdmaRead {
                remote_addr: pt,
                rkey: ps,
            },
            SgList::single(b.sge(0, len as usize)),
        ),
    ))
}

/// Print what became of a probing Read; true if the server refused it.
pub(super) fn probe_verdict(stag: u32, res: Res<()>) -> bool {
    match res {
        Ok(()) => {
            eprintln!("rhttp-test: the server ALLOWED the RDMA Read of stag {stag:#x}");
            false
        }
        Err(e) => {
            eprintln!("rhttp-test: the server refused the RDMA Read of stag {stag:#x}: {e}");
            true
        }
    }
}
