//! `rhttp get` one request at a time: plain HTTP, or the body by RDMA
//! (server-writes or client-reads, sealed under the TLS session over
//! HTTPS), falling back to plain HTTP when the server refuses RDMA; and
//! the options of `get` ([`GetOpts`], [`GetHooks`], [`CrawlOpts`]) that
//! the pipeline and the crawl share.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use iwarp::{SgList, WrOpcode};
use rhttp::ctrl::Kind;
use rhttp::header::{RdmaHeader, Scheme};
use rhttp::http::{Response, Url};

use crate::cli::{Args, GetScheme};
use crate::rdma::{self, CHUNK};
use crate::session::Session;
use crate::settings::{max_len, Res};
use crate::sink::{bar, copy_out, open_sink, Sink};
use crate::stats::Outcome;

/// Whether a response's body is an HTML page whose links -r follows:
/// `Content-Type` `text/html` or `application/xhtml+xml` (as wget); a
/// response without one is taken as HTML when the path looks like a
/// page (ends in '/', `.html` or `.htm`).
pub(crate) fn is_html(resp: &Response, url: &Url) -> bool {
    match resp.header("Content-Type") {
        Some(t) => {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("text/html") || t.eq_ignore_ascii_case("application/xhtml+xml")
        }
        None => {
            let p = url.path.split('?').next().unwrap_or("");
            p.ends_with('/') || p.ends_with(".html") || p.ends_with(".htm")
        }
    }
}

pub(crate) fn rdma_error_of(resp: &Response) -> Option<String> {
    resp.header("RDMA-Error").map(str::to_string)
}

/// How an answer that came inline (`RDMA-Inline`) is logged: the body
/// came in the HTTP response, as over plain HTTP, because the server
/// judged it small (docs/MOD_RDMA.md, "Small objects").
pub(crate) const VIA_INLINE: &str = "plain HTTP (RDMA-Inline)";

/// If `resp` answers an RDMA request inline (`RDMA-Inline: length=N`):
/// read its body into `sink` and check it is the N bytes announced;
/// `Ok(None)` for any other answer (nothing read).
pub(crate) fn inline_body(
    s: &mut Session,
    resp: &Response,
    sink: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Res<Option<u64>> {
    let Some(v) = resp.header("RDMA-Inline") else {
        return Ok(None);
    };
    let want =
        rhttp::header::parse_inline(v).map_err(|e| format!("bad answer from the server: {e}"))?;
    let n = s
        .http
        .read_body(resp, false, sink, progress)
        .map_err(|e| format!("reading the response body: {e}"))?;
    if n != want {
        return Err(format!(
            "the server announced an inline body of {want} bytes (RDMA-Inline) but sent {n}"
        ));
    }
    Ok(Some(n))
}

pub(crate) fn discard_body(s: &mut Session, resp: &Response) -> Res<()> {
    save_body(s, resp, &mut io::sink())
}

pub(crate) fn save_body(s: &mut Session, resp: &Response, sink: &mut dyn Write) -> Res<()> {
    s.http
        .read_body(resp, false, sink, &mut |_| {})
        .map_err(|e| format!("reading the response: {e}"))?;
    Ok(())
}

pub(crate) fn plain_get(
    s: &mut Session,
    url: &Url,
    sink: &mut dyn Write,
    a: &Args,
) -> Res<Outcome> {
    s.http
        .send_request("GET", url, &[], None)
        .map_err(|e| format!("sending the request: {e}"))?;
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    let len = resp
        .header("Content-Length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let pb = bar(a.quiet, len, &url.file_name());
    let n = s
        .http
        .read_body(&resp, false, sink, &mut |n| pb.set_position(n))
        .map_err(|e| format!("reading the response body: {e}"))?;
    pb.finish_and_clear();
    s.reopen_if(resp.close)?;
    Ok(Outcome {
        status: resp.status,
        bytes: n,
        via: "plain HTTP".into(),
        html: is_html(&resp, url),
    })
}

pub(crate) fn rdma_get(
    s: &mut Session,
    url: &Url,
    scheme: GetScheme,
    sink: &mut Sink,
    a: &Args,
    hooks: &GetHooks,
) -> Res<Outcome> {
    let (hold_ms, hold_accept) = (hooks.hold, hooks.hold_accept);
    let max_len = max_len(a);
    let r = s.rdma()?;
    let mut h = r.request_header(
        match scheme {
            GetScheme::ServerWrites => Scheme::ServerWrites,
            GetScheme::ClientReads => Scheme::ClientReads,
        },
        false,
    )?;
    h.maxlen = Some(max_len);
    if let GetScheme::ServerWrites = scheme {
        let b = r.buf(max_len)?;
        h.stag = Some(b.rkey());
        h.to = Some(b.addr());
    }
    tracing::debug!(header = %h, "GET {}", url.path);
    if hooks.pause_before_request {
        eprintln!(
            "rhttp-test: RDMA listener {} waiting for a line on stdin",
            r.listener.local_addr()
        );
        let mut line = String::new();
        io::stdin()
            .read_line(&mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
    }
    // Over TLS: name this transfer; the body will be sealed under a key
    // the TLS exporter derives for it (docs/MOD_RDMA.md, "HTTPS").
    let seal_id = if s.http.is_tls() {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&rdma::new_token()?.to_be_bytes());
        id[8..].copy_from_slice(&rdma::new_token()?.to_be_bytes());
        Some(id)
    } else {
        None
    };
    let mut extra = vec![("RDMA", h.to_string())];
    if let Some(id) = &seal_id {
        extra.push(("RDMA-Seal", rhttp::seal::request_header(id)));
    }
    s.http
        .send_request("GET", url, &extra, None)
        .map_err(|e| format!("sending the request: {e}"))?;
    let r = s.rdma.as_mut().expect("created above");
    if hold_accept && !r.live() {
        // An event for the test to act on, not a guess at timing: the
        // server has stat'ed the file and waits in its connect; it reads
        // the file only after we accept.
        r.wait_pending()?;
        eprintln!(
            "rhttp-test: the server's RDMA connection waits in the listener; accepting it after a line on stdin or its end"
        );
        let mut line = String::new();
        io::stdin()
            .read_line(&mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
    }
    r.expect_conn(&s.http)?;
    // Server-writes: the body is being placed and the server's DONE comes
    // before its HTTP answer; wait for either, reading the RDMA connection
    // from this thread meanwhile.
    let early = if matches!(scheme, GetScheme::ServerWrites) && r.live() {
        r.wait_ctrl(Some(&s.http))?
    } else {
        None
    };
    r.wait_http(&s.http)?;
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    let Some(v) = resp.header("RDMA").map(str::to_string) else {
        if let Some(err) = rdma_error_of(&resp) {
            discard_body(s, &resp)?;
            s.reopen_if(resp.close)?;
            eprintln!(
                "rhttp: {}: server refused RDMA ({} {}: {err}); retrying over plain HTTP",
                url.path, resp.status, resp.reason
            );
            return plain_get(s, url, sink, a);
        }
        // Answered inline (a small file): the body is in the response, as
        // the server announced; nothing to say about it.
        let pb = bar(a.quiet, 0, &url.file_name());
        if let Some(n) = inline_body(s, &resp, sink, &mut |n| pb.set_position(n))? {
            pb.finish_and_clear();
            s.reopen_if(resp.close)?;
            return Ok(Outcome {
                status: resp.status,
                bytes: n,
                via: VIA_INLINE.into(),
                html: is_html(&resp, url),
            });
        }
        // The server ignored the header: the body is in the response.
        let n = s
            .http
            .read_body(&resp, false, sink, &mut |n| pb.set_position(n))
            .map_err(|e| format!("reading the response body: {e}"))?;
        pb.finish_and_clear();
        s.reopen_if(resp.close)?;
        if resp.status < 300 && resp.header("RDMA-TLS") == Some("off") {
            eprintln!(
                "rhttp: {}: the server moves no bodies by RDMA over TLS (RDMATLS off); got the \
                 body in the HTTPS response",
                url.path
            );
        } else if resp.status < 300 {
            eprintln!(
                "rhttp: {}: the server did not answer with RDMA; got the body over plain HTTP",
                url.path
            );
        }
        return Ok(Outcome {
            status: resp.status,
            bytes: n,
            via: "plain HTTP (fallback)".into(),
            html: is_html(&resp, url),
        });
    };
    let rh = RdmaHeader::parse(&v).map_err(|e| format!("bad RDMA header from the server: {e}"))?;
    discard_body(s, &resp)?;
    let len = rh.length.ok_or("the server's RDMA header has no length")?;
    // Over TLS the body must come sealed for this transfer: its key from
    // the session's exporter with our id as the context.
    let sealed = match &seal_id {
        None => None,
        Some(id) => {
            let v = resp.header("RDMA-Seal").ok_or(
                "the server moved the body by RDMA over TLS without sealing it (no RDMA-Seal \
                 in its answer): it travelled in clear, so it is refused. Fix: update mod_rdma \
                 on the server, or set RDMATLS off there",
            )?;
            let ans = rhttp::seal::parse_answer(v)
                .map_err(|e| format!("bad RDMA-Seal header from the server: {e}"))?;
            if ans.id != *id {
                return Err("the server's RDMA-Seal names another transfer".into());
            }
            let mut key = [0u8; 32];
            s.http
                .export_keying_material(&mut key, rhttp::seal::LABEL, id)
                .map_err(|e| format!("the TLS exporter failed: {e}"))?;
            Some((key, ans.length))
        }
    };
    if len > max_len {
        return Err(format!(
            "the server announced {len} bytes, more than maxlen {max_len}"
        ));
    }
    let pb = bar(a.quiet, len, &url.file_name());
    let r = s.rdma.as_mut().expect("created above");
    match rh.scheme {
        Scheme::ServerWrites => {
            // The server's DONE follows its Writes on the RDMA stream: once
            // it is here, the whole body is placed in our buffer.
            let done = match early {
                Some(m) => Some(m),
                None => r.wait_ctrl(None)?,
            };
            match done {
                Some(m) if m.kind == Kind::Done => {}
                Some(m) => {
                    return Err(format!(
                        "expected DONE after the server's writes, got {m:?}"
                    ))
                }
                None => return Err("no DONE after the server's writes".into()),
            }
        }
        Scheme::ClientReads => {
            let (stag, to) = rh
                .stag
                .zip(rh.to)
                .ok_or("the server's client-reads answer lacks stag or to")?;
            if hold_ms > 0 {
                eprintln!("rhttp-test: stag={stag:#x} to={to:#x} length={len}");
                std::thread::sleep(Duration::from_millis(hold_ms));
            }
            r.buf(len)?;
            let b = r.buf.as_ref().expect("allocated");
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(CHUNK as u64) as usize;
                r.run(
                    2,
                    WrOpcode::RdmaRead {
                        remote_addr: to + off,
                        rkey: stag,
                    },
                    SgList::single(b.sge(off as usize, n)),
                )?;
                off += n as u64;
                pb.set_position(off);
            }
            r.send_done(stag, len, None)?;
        }
        other => return Err(format!("the server answered a GET with scheme {other}")),
    }
    let buf = r.buf.as_ref().ok_or("no buffer")?;
    let (bytes, via) = match sealed {
        None => {
            copy_out(buf, 0, len, sink)?;
            (len, format!("RDMA ({})", rh.scheme))
        }
        Some((key, plain)) => {
            // Check every record in a private copy (the server could still
            // write into the registered buffer), then release the body.
            let mut body = vec![0u8; usize::try_from(len).map_err(|_| "body too large")?];
            buf.read_at(0, &mut body);
            if hooks.tamper_sealed {
                let at = body.len() / 2;
                body[at] ^= 1;
                eprintln!("rhttp-test: flipped byte {at} of the sealed body");
            }
            let id = seal_id.as_ref().expect("sealed only with an id");
            let n = rhttp::seal::open_in_place(&key, id, plain, &mut body)
                .map_err(|e| format!("refusing the RDMA body: {e}"))?;
            sink.write_all(&body[..n])
                .map_err(|e| format!("writing the body: {e}"))?;
            (n as u64, format!("RDMA ({}, sealed)", rh.scheme))
        }
    };
    pb.finish_and_clear();
    s.reopen_if(resp.close)?;
    Ok(Outcome {
        status: resp.status,
        bytes,
        via,
        html: is_html(&resp, url),
    })
}

/// Test hooks of `rhttp get` (hidden options).
pub(crate) struct GetHooks {
    pub(crate) hold: u64,
    pub(crate) hold_accept: bool,
    pub(crate) drop_rdma_after: Option<usize>,
    pub(crate) pause_before_request: bool,
    pub(crate) tamper_sealed: bool,
}

impl GetHooks {
    /// Whether a test hook is set: hooks act on one request at a time, so
    /// they turn pipelining off.
    pub(crate) fn any(&self) -> bool {
        self.hold > 0
            || self.hold_accept
            || self.drop_rdma_after.is_some()
            || self.pause_before_request
    }
}

/// Options of `rhttp get` beyond the URLs.
pub(crate) struct GetOpts {
    pub(crate) recursive: bool,
    pub(crate) dir: PathBuf,
    pub(crate) depth: usize,
    pub(crate) stats: bool,
    /// -r and -p: the crawl's settings.
    pub(crate) crawl: CrawlOpts,
}

impl GetOpts {
    /// -r or -p: objects saved in a tree under -P DIR.
    pub(crate) fn tree(&self) -> bool {
        self.recursive || self.crawl.page_requisites
    }
}

/// One URL to fetch and where its body goes.
pub(crate) struct Job {
    pub(crate) url: Url,
    pub(crate) out: PathBuf,
}

/// -r and -p settings.
pub(crate) struct CrawlOpts {
    /// `-l`: `None` for `inf`.
    pub(crate) level: Option<u32>,
    pub(crate) page_requisites: bool,
    pub(crate) no_parent: bool,
    /// Without `-nH`: the `HOST[:PORT]` directory under -P.
    pub(crate) host_dirs: bool,
    /// robots.txt read and honoured (not `-e robots=off`).
    pub(crate) robots: bool,
    pub(crate) max_files: usize,
}

/// The sink for a job, its directories made with -r and -p.
pub(crate) fn job_sink(job: &Job, opts: &GetOpts) -> Res<Sink> {
    if opts.tree() {
        if let Some(d) = job.out.parent() {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("creating the directory {}: {e}", d.display()))?;
        }
    }
    open_sink(&job.out)
}
