//! Pipelined GETs (`rhttp get --pipeline N`, the default with `-r`):
//! several requests in flight on one HTTP connection (RFC 9112 §9.3.2),
//! each with its slot of the receive buffer, server-writes bodies placed
//! there by the server, client-reads bodies read there as their answers
//! arrive (docs/MOD_RDMA.md, "Round trips").

use std::io::Write;
use std::time::{Duration, Instant};

use iwarp::wait::CqInterest;
use iwarp::{SendWr, SgList, WcStatus, WrOpcode};
use rhttp::ctrl::Kind;
use rhttp::header::{RdmaHeader, Scheme};
use rhttp::http::Url;

use crate::cli::{Args, GetScheme};
use crate::get::{
    discard_body, inline_body, is_html, job_sink, plain_get, rdma_error_of, rdma_get, GetHooks,
    GetOpts, Job, VIA_INLINE,
};
use crate::rdma::{http_set, wait_error, Rdma, CHUNK, HTTP, MAX_PIPELINE, RDMA};
use crate::session::{session_for, Session};
use crate::settings::{max_len, url_scheme, Res};
use crate::sink::{bar, copy_out, Sink};
use crate::stats::{report_get, Outcome};

/// A pipelined GET that has been sent and not answered yet.
pub(super) struct InFlight {
    pub(super) job: usize,
    pub(super) url: Url,
    /// Its part of the receive buffer: bytes `slot * max_len ..` of it.
    pub(super) slot: usize,
    pub(super) token: u64,
    pub(super) sent: Instant,
}

/// What became of a pipelined GET.
pub(super) enum Answer {
    Done(Outcome),
    /// The server refused RDMA for it (`RDMA-Error`): fetch it again over
    /// plain HTTP once the pipeline is empty.
    Refused,
    /// A client-reads answer: the caller posts its RDMA Reads into the
    /// request's slot ([`post_reads`]); they complete later
    /// ([`finish_reads`]).
    Reading {
        stag: u32,
        to: u64,
        len: u64,
        status: u16,
        html: bool,
    },
}

/// At most this many RDMA Reads posted at once (the send queue and CQ hold
/// 64 entries; the DONEs need room too).
pub(super) const MAX_POSTED_READS: usize = 32;

/// Post the Reads of a client-reads body of `len` bytes at the server's
/// `stag`/`to` into bytes `at..` of the buffer, in pieces of at most
/// [`CHUNK`]; returns how many completions they will make. A body that
/// needs more than [`MAX_POSTED_READS`] pieces is read here, piece by
/// piece, and makes none.
pub(super) fn post_reads(r: &Rdma, at: usize, stag: u32, to: u64, len: u64) -> Res<usize> {
    let pieces = len.div_ceil(CHUNK as u64) as usize;
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        let sgl = SgList::single(r.buf.as_ref().ok_or("no buffer")?.sge(at + off as usize, n));
        let opcode = WrOpcode::RdmaRead {
            remote_addr: to + off,
            rkey: stag,
        };
        if pieces > MAX_POSTED_READS {
            // The caller finished every earlier Read (`reading` is empty),
            // so the next send completion is this Read's.
            r.run(2, opcode, sgl)?;
        } else {
            r.qp()?
                .post_send(&SendWr {
                    wr_id: 2,
                    opcode,
                    sgl,
                    signaled: true,
                    solicited: false,
                })
                .map_err(|e| format!("posting the RDMA Read: {e}"))?;
        }
        off += n as u64;
    }
    Ok(if pieces > MAX_POSTED_READS { 0 } else { pieces })
}

/// A client-reads body being read: the Reads are posted, the DONE is not
/// sent yet.
pub(super) struct Reading {
    pub(super) p: InFlight,
    pub(super) sink: Sink,
    pub(super) stag: u32,
    pub(super) len: u64,
    pub(super) chunks: usize,
    pub(super) status: u16,
    pub(super) html: bool,
}

/// Take the completions of posted client-reads Reads (they complete in the
/// order they were posted, on the send CQ: the DONEs in between are
/// unsignaled) and finish each body whose Reads are all done: its DONE
/// (as a Send with Invalidate of the server's STag, so no Read of it can
/// follow, see [`Rdma::send_done`]), then its bytes to its sink.
///
/// Waits (bounded by `--timeout`) until at least one body is finished,
/// or, with `until_http`, until the next HTTP answer starts arriving,
/// whichever comes first; returns at once if nothing is being read. The
/// wait does the RDMA connection's receive work (the CQs are
/// application-driven). A server that still holds each answer until the
/// previous body's DONE (mod_rdma before grants outlived requests) is
/// served as well: its DONE goes out while we wait for its next answer.
pub(super) fn pump_reads(
    s: &mut Session,
    reading: &mut std::collections::VecDeque<Reading>,
    span: usize,
    until_http: bool,
) -> Res<bool> {
    let mut all_ok = true;
    if reading.is_empty() {
        return Ok(all_ok);
    }
    let r = s
        .rdma
        .as_mut()
        .ok_or("client-reads without an RDMA connection")?;
    let deadline = Instant::now() + r.timeout;
    let mut set = http_set(&s.http);
    set.add_cq(&r.send_cq, CqInterest::Completions, RDMA);
    let mut finished = 0;
    loop {
        while let Some(wc) = r.send_cq.poll_one() {
            if wc.status != WcStatus::Success {
                let why = r
                    .qp()?
                    .next_event(Duration::from_millis(200))
                    .map(|e| format!(" ({e:?})"))
                    .unwrap_or_default();
                return Err(format!("the RDMA Read failed: {:?}{why}", wc.status));
            }
            let x = reading
                .front_mut()
                .ok_or("a send completion with no RDMA Read posted")?;
            x.chunks = x.chunks.saturating_sub(1);
            while reading.front().is_some_and(|x| x.chunks == 0) {
                let mut x = reading.pop_front().expect("checked");
                r.send_done(x.stag, x.len, Some(x.p.slot))?;
                copy_out(
                    r.buf.as_ref().ok_or("no buffer")?,
                    x.p.slot * span,
                    x.len,
                    &mut x.sink,
                )?;
                x.sink
                    .flush()
                    .map_err(|e| format!("writing the body of {}: {e}", x.p.url.path))?;
                all_ok &= report_get(
                    &x.p.url,
                    &Outcome {
                        status: x.status,
                        bytes: x.len,
                        via: format!("RDMA ({})", Scheme::ClientReads),
                        html: x.html,
                    },
                    x.p.sent.elapsed().as_secs_f64(),
                );
                finished += 1;
            }
        }
        if reading.is_empty() || finished > 0 || (until_http && s.http.has_buffered()) {
            return Ok(all_ok);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the RDMA Reads of {} did not complete within {:?}",
                reading.front().map_or("", |x| x.p.url.path.as_str()),
                r.timeout
            ));
        }
        // Sleep on the send CQ (its completions and the RDMA connection's
        // socket) and the HTTP socket.
        let http_ready = set.wait(deadline).map_err(wait_error)?.is_ready(HTTP);
        if until_http && http_ready && s.http.answer_ready() {
            return Ok(all_ok);
        }
    }
}

/// GET `jobs` (all on `s`'s host) with up to `depth` requests in flight
/// on the HTTP connection (HTTP/1.1 pipelining, RFC 9112 §9.3.2: the
/// server answers in order) and the one RDMA connection reused by all.
///
/// A request that needs a new RDMA connection is sent alone: the server
/// connects back while it serves it, and we accept the connection only
/// while we wait for that answer (Apache holds the answers to pipelined
/// requests until its input is drained, so we could be waiting for an
/// earlier answer while the server waits in its connect). Each request
/// carries its own slot of `--max-len` bytes of the receive buffer
/// (server-writes) and its own token. The server's DONE for each
/// server-writes answer waits in the receive CQ, in order, until its
/// answer is read. If the server closes the connection (a 502, or
/// `MaxKeepAliveRequests`), the unanswered requests are sent again on a
/// new one; a request it refused RDMA for is fetched over plain HTTP at
/// the end.
pub(super) fn get_pipelined(
    a: &Args,
    s: &mut Session,
    jobs: &[Job],
    scheme: GetScheme,
    depth: usize,
    opts: &GetOpts,
) -> Res<bool> {
    let max_len = max_len(a);
    let depth = depth.clamp(1, MAX_PIPELINE);
    let span = usize::try_from(max_len).map_err(|_| "--max-len does not fit in memory")?;
    let total = span
        .checked_mul(depth)
        .ok_or("--max-len times --pipeline does not fit in memory")?;
    let mut queue: std::collections::VecDeque<usize> = (0..jobs.len()).collect();
    let mut inflight: std::collections::VecDeque<InFlight> = Default::default();
    // client-reads bodies whose Reads are posted (each still holds its slot).
    let mut reading: std::collections::VecDeque<Reading> = Default::default();
    let mut refused = Vec::new();
    let mut seq = 0usize;
    let mut all_ok = true;
    loop {
        // No answer is due: wait until a client-reads body is read, which
        // frees its slot for the next request.
        if inflight.is_empty() && !reading.is_empty() {
            all_ok &= pump_reads(s, &mut reading, span, false)?;
        }
        if queue.is_empty() && inflight.is_empty() && reading.is_empty() {
            break;
        }
        // Fill the pipeline.
        while inflight.len() + reading.len() < depth {
            let Some(&job) = queue.front() else { break };
            let r = s.rdma()?;
            if !inflight.is_empty() && !r.live() {
                break; // this one may need a connect-back: send it alone
            }
            queue.pop_front();
            let slot = seq % depth;
            seq += 1;
            let mut h = r.request_header(
                match scheme {
                    GetScheme::ServerWrites => Scheme::ServerWrites,
                    GetScheme::ClientReads => Scheme::ClientReads,
                },
                true,
            )?;
            h.maxlen = Some(max_len);
            // One slot of `span` bytes per request in flight, for both
            // schemes (client-reads bodies are read into their slots
            // side by side); allocated once, before any Read is posted.
            let b = r.buf(total as u64)?;
            if let GetScheme::ServerWrites = scheme {
                h.stag = Some(b.rkey());
                h.to = Some(b.addr() + (slot * span) as u64);
            }
            let token = h.token.expect("request_header sets a token");
            tracing::debug!(header = %h, slot, "GET {} (pipelined)", jobs[job].url.path);
            s.http
                .send_request("GET", &jobs[job].url, &[("RDMA", h.to_string())], None)
                .map_err(|e| format!("sending the request: {e}"))?;
            inflight.push_back(InFlight {
                job,
                url: jobs[job].url.clone(),
                slot,
                token,
                sent: Instant::now(),
            });
        }
        // Take the oldest answer; finish the client-reads bodies whose
        // Reads complete while it comes.
        if inflight.is_empty() {
            continue;
        }
        all_ok &= pump_reads(s, &mut reading, span, true)?;
        let p = inflight.pop_front().expect("the pipeline is not empty");
        let job = &jobs[p.job];
        let mut sink = job_sink(job, opts)?;
        let (answer, close) =
            pipelined_answer(s, &p, scheme, max_len, &mut sink, a, &job.url.file_name()).map_err(
                |e| format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path),
            )?;
        if let Some(r) = s.rdma.as_mut() {
            r.forget_token(p.token);
        }
        match answer {
            Answer::Done(o) => {
                sink.flush()
                    .map_err(|e| format!("writing {}: {e}", job.out.display()))?;
                all_ok &= report_get(&job.url, &o, p.sent.elapsed().as_secs_f64())
            }
            Answer::Refused => refused.push(p.job),
            Answer::Reading {
                stag,
                to,
                len,
                status,
                html,
            } => {
                // Post the Reads and go on to the next answer: the server
                // answered it without waiting for this body's DONE, so the
                // Reads of a whole window share one round trip.
                let need = len.div_ceil(CHUNK as u64) as usize;
                while !reading.is_empty()
                    && reading.iter().map(|x| x.chunks).sum::<usize>() + need > MAX_POSTED_READS
                {
                    all_ok &= pump_reads(s, &mut reading, span, false)?;
                }
                let r = s
                    .rdma
                    .as_mut()
                    .ok_or("client-reads without an RDMA connection")?;
                let chunks = post_reads(r, p.slot * span, stag, to, len).map_err(|e| {
                    format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path)
                })?;
                reading.push_back(Reading {
                    p,
                    sink,
                    stag,
                    len,
                    chunks,
                    status,
                    html,
                });
            }
        }
        if close {
            // The reads of this connection's bodies complete first.
            while !reading.is_empty() {
                all_ok &= pump_reads(s, &mut reading, span, false)?;
            }
            // The server closed the connection after this answer: the
            // rest were never answered. Send them again on a new one.
            tracing::debug!(
                unanswered = inflight.len(),
                "the server closed the connection"
            );
            while let Some(q) = inflight.pop_back() {
                queue.push_front(q.job);
            }
            s.reopen_if(true)?;
        }
    }
    for j in refused {
        let job = &jobs[j];
        let mut sink = job_sink(job, opts)?;
        let t = Instant::now();
        let o = plain_get(s, &job.url, &mut sink, a);
        sink.flush()
            .map_err(|e| format!("writing {}: {e}", job.out.display()))?;
        let o =
            o.map_err(|e| format!("GET http://{}{}: {e}", job.url.host_header(), job.url.path))?;
        all_ok &= report_get(&job.url, &o, t.elapsed().as_secs_f64());
    }
    Ok(all_ok)
}

/// Read the answer to the oldest pipelined GET `p` and move its body to
/// `sink`; also whether the server closes the connection after it.
pub(super) fn pipelined_answer(
    s: &mut Session,
    p: &InFlight,
    scheme: GetScheme,
    max_len: u64,
    sink: &mut Sink,
    a: &Args,
    name: &str,
) -> Res<(Answer, bool)> {
    let r = s.rdma.as_mut().expect("created when the request was sent");
    r.expect_conn(&s.http)?;
    r.wait_http(&s.http)?;
    let resp = s
        .http
        .read_head()
        .map_err(|e| format!("reading the response: {e}"))?;
    let Some(v) = resp.header("RDMA").map(str::to_string) else {
        if let Some(err) = rdma_error_of(&resp) {
            discard_body(s, &resp)?;
            eprintln!(
                "rhttp: server refused RDMA ({} {}: {err}); fetching it over plain HTTP",
                resp.status, resp.reason
            );
            return Ok((Answer::Refused, resp.close));
        }
        // Answered inline (a small file): the body is in the response, and
        // no DONE comes for it.
        if let Some(n) = inline_body(s, &resp, sink, &mut |_| {})? {
            return Ok((
                Answer::Done(Outcome {
                    status: resp.status,
                    bytes: n,
                    via: VIA_INLINE.into(),
                    html: is_html(&resp, &p.url),
                }),
                resp.close,
            ));
        }
        // The server ignored the header (a 404, RDMA Off): the body is in
        // the response, and no DONE comes for it.
        let n = s
            .http
            .read_body(&resp, false, sink, &mut |_| {})
            .map_err(|e| format!("reading the response body: {e}"))?;
        return Ok((
            Answer::Done(Outcome {
                status: resp.status,
                bytes: n,
                via: "plain HTTP (fallback)".into(),
                html: is_html(&resp, &p.url),
            }),
            resp.close,
        ));
    };
    let rh = RdmaHeader::parse(&v).map_err(|e| format!("bad RDMA header from the server: {e}"))?;
    discard_body(s, &resp)?;
    let len = rh.length.ok_or("the server's RDMA header has no length")?;
    if len > max_len {
        return Err(format!(
            "the server announced {len} bytes, more than maxlen {max_len}"
        ));
    }
    // The caller checked that max_len * depth fits in a usize and
    // allocated the buffer: each answer goes to its request's slot.
    let span = max_len as usize;
    let at = p.slot * span;
    let pb = bar(a.quiet, len, name);
    let r = s.rdma.as_mut().expect("created when the request was sent");
    match (rh.scheme, scheme) {
        (Scheme::ServerWrites, GetScheme::ServerWrites) => {
            // DONEs come in the order of the answers, each before its
            // HTTP answer on the server's side (RFC 5040 §5.5 orders it
            // behind the Writes): the oldest one in the CQ is this one's.
            match r.wait_ctrl(None)? {
                Some(m) if m.kind == Kind::Done => {}
                Some(m) => {
                    return Err(format!(
                        "expected DONE after the server's writes, got {m:?}"
                    ))
                }
                None => return Err("no DONE after the server's writes".into()),
            }
        }
        (Scheme::ClientReads, GetScheme::ClientReads) => {
            let (stag, to) = rh
                .stag
                .zip(rh.to)
                .ok_or("the server's client-reads answer lacks stag or to")?;
            pb.finish_and_clear();
            return Ok((
                Answer::Reading {
                    stag,
                    to,
                    len,
                    status: resp.status,
                    html: is_html(&resp, &p.url),
                },
                resp.close,
            ));
        }
        (got, _) => return Err(format!("the server answered with scheme {got}")),
    }
    copy_out(r.buf.as_ref().ok_or("no buffer")?, at, len, sink)?;
    pb.finish_and_clear();
    Ok((
        Answer::Done(Outcome {
            status: resp.status,
            bytes: len,
            via: format!("RDMA ({})", rh.scheme),
            html: is_html(&resp, &p.url),
        }),
        resp.close,
    ))
}

/// Fetch `jobs` in order, one session per run of URLs on the same host:
/// one request at a time (`depth` 1, `--plain`) or pipelined.
pub(super) fn fetch(
    a: &Args,
    session: &mut Option<Session>,
    jobs: &[Job],
    scheme: GetScheme,
    hooks: &GetHooks,
    depth: usize,
    opts: &GetOpts,
) -> Res<bool> {
    let mut all_ok = true;
    let mut i = 0;
    while i < jobs.len() {
        let s = session_for(session, &jobs[i].url, a)?;
        let run = jobs[i..]
            .iter()
            .take_while(|j| j.url.host == s.url0.host && j.url.port == s.url0.port)
            .count();
        if depth > 1 && !a.plain {
            all_ok &= get_pipelined(a, s, &jobs[i..i + run], scheme, depth, opts)?;
            i += run;
            continue;
        }
        for (k, job) in jobs[i..i + run].iter().enumerate() {
            let mut sink = job_sink(job, opts)?;
            let t = Instant::now();
            let o = if a.plain {
                plain_get(s, &job.url, &mut sink, a)
            } else {
                rdma_get(s, &job.url, scheme, &mut sink, a, hooks)
            };
            sink.flush()
                .map_err(|e| format!("writing {}: {e}", job.out.display()))?;
            let o = o.map_err(|e| {
                format!(
                    "GET {}://{}{}: {e}",
                    url_scheme(),
                    job.url.host_header(),
                    job.url.path
                )
            })?;
            all_ok &= report_get(&job.url, &o, t.elapsed().as_secs_f64());
            if hooks.drop_rdma_after == Some(i + k + 1) {
                if let Some(r) = s.rdma.as_mut() {
                    eprintln!("rhttp-test: closing the RDMA connection");
                    r.close_connection();
                }
            }
        }
        i += run;
    }
    Ok(all_ok)
}
