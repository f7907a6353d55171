//! `ccproxy`: the caching reverse proxy with strong coherency.
//!
//! A thread per client connection (HTTP/1.1 keep-alive). For a document
//! (`<prefix><n>`, e.g. `/doc/7` → slot 7):
//!
//! 1. `none`: forward to the application server, always.
//! 2. `rdma` / `tcp`: learn the document's current version `v` at the
//!    application module **after the request arrived** (RDMA Read of its
//!    slot, or the version thread). Cannot: 502, never the cached copy.
//!    Cached at `v`: answer from cache. Otherwise fetch from the
//!    application server; its response says, in `X-CC-Doc-Version`, the
//!    version it was read under (inside `READ_PROCEED` … `READ_DONE`, so
//!    the document was whole and at that version); keep it if it is a
//!    200, and answer with it.
//!
//! Every document response carries `X-CC-Version` (the version served)
//! and `X-CC-Cache` (`hit`, `miss`, `off`). Other paths, and document
//! paths with a query string, are forwarded without caching or validation
//! (`X-CC-Cache: bypass`).
//!
//! The cache is a [`CacheState`]: it may also be refreshed by pushes from
//! the application module (adaptive push-pull, [`crate::push`]), and its
//! counters are answered at [`STATS_PATH`].
//!
//! Version checks go through a small pool of checkers (one connection
//! each), picked round-robin; a checker is busy for one check only.

use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::check::{CheckError, VersionCheck};
use crate::http::{self, HttpError, Request, Response};
use crate::state::CacheState;

/// How documents are validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No cache: always forward.
    None,
    /// RDMA Read of the version slot.
    Rdma,
    /// Ask the version thread over TCP.
    Tcp,
    /// Ask the version thread over iWARP sockets (`crate::sockets`).
    Sockets,
}

/// Settings.
#[derive(Debug, Clone)]
pub struct ProxyCfg {
    /// The application server (HTTP).
    pub backend: SocketAddr,
    /// Document path prefix; the rest of the path is the slot number.
    pub prefix: String,
    /// Validation mode.
    pub mode: Mode,
    /// Bound on each backend fetch step.
    pub backend_timeout: Duration,
    /// A client connection idle this long is closed.
    pub idle: Duration,
}

/// The path at which the proxy answers its cache counters as JSON
/// (hits, misses, pushes, wasted updates: [`CacheState::stats_json`]).
pub const STATS_PATH: &str = "/_ccproxy/stats";

/// The document number of a request target: `PREFIX` then a number in
/// canonical decimal (digits only, no leading zero, below 2^32), nothing
/// after it. A query string makes it not a document: the cache is keyed by
/// the number alone, so `?a=1` and `?a=2` must not share an entry (such
/// requests are forwarded uncached).
pub fn doc_number(target: &str, prefix: &str) -> Option<u32> {
    let n = target.strip_prefix(prefix)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    n.parse().ok()
}

/// The proxy's shared state.
pub struct Proxy {
    cfg: ProxyCfg,
    cache: Arc<CacheState>,
    checkers: Vec<Mutex<Box<dyn VersionCheck>>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("cfg", &self.cfg)
            .field("checkers", &self.checkers.len())
            .finish()
    }
}

/// A response, before it is written.
#[derive(Debug)]
pub struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Arc<Vec<u8>>,
}

/// Where a document request's time went (the response-time breakdown):
/// the version check and the fetch from the application server. The
/// rest of the time inside the proxy is the proxy module (cache lookup
/// and store). Sent as `X-CC-Timing: check=..;fetch=..;module=..;total=..`
/// in microseconds; `total` runs from the parsed request to the built
/// answer, so HTTP parsing and writing are outside it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stages {
    check: Duration,
    fetch: Duration,
}

pub(crate) fn error_answer(status: u16, why: String) -> Answer {
    Answer {
        status,
        headers: vec![("Content-Type", "text/plain".into())],
        body: Arc::new(format!("ccproxy: {why}\n").into_bytes()),
    }
}

impl Proxy {
    /// A proxy with these checkers (empty for mode `none`).
    pub fn new(cfg: ProxyCfg, checkers: Vec<Box<dyn VersionCheck>>) -> Proxy {
        Proxy::with_cache(cfg, checkers, Arc::new(CacheState::new(0, 1024)))
    }

    /// A proxy over this cache (shared with the push agent and the state
    /// publisher; see [`crate::state`]).
    pub fn with_cache(
        cfg: ProxyCfg,
        checkers: Vec<Box<dyn VersionCheck>>,
        cache: Arc<CacheState>,
    ) -> Proxy {
        Proxy {
            cfg,
            cache,
            checkers: checkers.into_iter().map(Mutex::new).collect(),
            next: AtomicUsize::new(0),
        }
    }

    fn doc_of(&self, target: &str) -> Option<u32> {
        doc_number(target, &self.cfg.prefix)
    }

    fn check(&self, doc: u32) -> Result<u64, CheckError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.checkers.len();
        let mut c = self.checkers[i].lock().unwrap_or_else(|p| p.into_inner());
        c.version(doc)
    }

    fn fetch(&self, target: &str) -> Result<Response, Answer> {
        http::fetch(self.cfg.backend, target, self.cfg.backend_timeout).map_err(|e| {
            tracing::warn!(error = %e, backend = %self.cfg.backend, "backend fetch failed");
            error_answer(
                502,
                format!("application server {} failed: {e}", self.cfg.backend),
            )
        })
    }

    fn forward(&self, target: &str, cache_tag: &'static str) -> Answer {
        match self.fetch(target) {
            Ok(r) => {
                let mut headers = vec![("X-CC-Cache", cache_tag.to_string())];
                if let Some(v) = r.header("x-cc-doc-version") {
                    headers.push(("X-CC-Version", v.to_string()));
                }
                if let Some(ct) = r.header("content-type") {
                    headers.push(("Content-Type", ct.to_string()));
                }
                Answer {
                    status: r.status,
                    headers,
                    body: Arc::new(r.body),
                }
            }
            Err(a) => a,
        }
    }

    fn answer_doc(&self, doc: u32, target: &str, st: &mut Stages) -> Answer {
        if self.cfg.mode == Mode::None {
            let t = Instant::now();
            let a = self.forward(target, "off");
            st.fetch = t.elapsed();
            return a;
        }
        let t = Instant::now();
        let checked = self.check(doc);
        st.check = t.elapsed();
        let v = match checked {
            Ok(v) => v,
            Err(CheckError::NoSuchDocument { doc }) => {
                return error_answer(404, format!("document {doc} is not in the version table"))
            }
            Err(e) => {
                tracing::warn!(doc, error = %e, "version check failed; answering 502");
                return error_answer(502, format!("cannot validate document {doc}: {e}"));
            }
        };
        let hit = self.cache.lookup(doc, v);
        if let Some((body, ct)) = hit {
            let mut headers = vec![
                ("X-CC-Version", v.to_string()),
                ("X-CC-Cache", "hit".into()),
            ];
            if let Some(ct) = ct {
                headers.push(("Content-Type", ct));
            }
            return Answer {
                status: 200,
                headers,
                body,
            };
        }
        let t = Instant::now();
        let fetched = self.fetch(target);
        st.fetch = t.elapsed();
        let r = match fetched {
            Ok(r) => r,
            Err(a) => return a,
        };
        if r.status != 200 {
            return Answer {
                status: 502,
                headers: vec![("Content-Type", "text/plain".into())],
                body: Arc::new(
                    format!(
                        "ccproxy: application server answered {} for document {doc}\n",
                        r.status
                    )
                    .into_bytes(),
                ),
            };
        }
        let Some(w) = r
            .header("x-cc-doc-version")
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return error_answer(502, format!(
                "application server sent document {doc} without X-CC-Doc-Version (is the IPC hook in front of it?)"
            ));
        };
        if w < v {
            // The server read it under an older version than the one
            // current before the fetch: it is not behind the module's
            // read/update protocol. Never serve that.
            tracing::error!(
                doc,
                read_under = w,
                current = v,
                "application server is not coherent"
            );
            return error_answer(
                502,
                format!("application server read document {doc} at version {w}, older than {v}"),
            );
        }
        let ct = r.header("content-type").map(str::to_string);
        let body = Arc::new(r.body);
        self.cache.store_fetched(doc, w, ct.clone(), body.clone());
        let mut headers = vec![
            ("X-CC-Version", w.to_string()),
            ("X-CC-Cache", "miss".into()),
        ];
        if let Some(ct) = ct {
            headers.push(("Content-Type", ct));
        }
        Answer {
            status: 200,
            headers,
            body,
        }
    }

    /// The answer to one request, with `X-CC-Timing` on document requests.
    pub fn answer(&self, req: &Request) -> Answer {
        let start = Instant::now();
        let mut st = Stages::default();
        let mut a = self.answer_untimed(req, &mut st);
        if self.doc_of(&req.target).is_some() {
            let total = start.elapsed();
            let module = total.saturating_sub(st.check + st.fetch);
            a.headers.push((
                "X-CC-Timing",
                format!(
                    "check={};fetch={};module={};total={}",
                    st.check.as_micros(),
                    st.fetch.as_micros(),
                    module.as_micros(),
                    total.as_micros()
                ),
            ));
        }
        a
    }

    /// The document number of a request target, if it is a document.
    pub fn doc_of_target(&self, target: &str) -> Option<u32> {
        self.doc_of(target)
    }

    /// Connections idle this long are closed.
    pub fn idle(&self) -> Duration {
        self.cfg.idle
    }

    fn answer_untimed(&self, req: &Request, st: &mut Stages) -> Answer {
        if req.method != "GET" && req.method != "HEAD" {
            return error_answer(
                501,
                format!("method {} is not proxied (GET and HEAD only)", req.method),
            );
        }
        if req.target == STATS_PATH {
            return Answer {
                status: 200,
                headers: vec![("Content-Type", "application/json".into())],
                body: Arc::new(format!("{}\n", self.cache.stats_json()).into_bytes()),
            };
        }
        match self.doc_of(&req.target) {
            Some(doc) => self.answer_doc(doc, &req.target, st),
            None => self.forward(&req.target, "bypass"),
        }
    }

    /// Serve one client connection until it closes or idles.
    pub fn serve_conn(&self, s: TcpStream) {
        serve_client(s, self.cfg.idle, |req| self.answer(req));
    }
}

/// Serve one client connection with `answer` until it closes or idles
/// (shared by [`Proxy`] and the sharded front, `crate::shard`).
pub fn serve_client(s: TcpStream, idle: Duration, answer: impl Fn(&Request) -> Answer) {
    {
        let peer = s.peer_addr().ok();
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(idle));
        let _ = s.set_write_timeout(Some(idle));
        let Ok(w) = s.try_clone() else { return };
        let mut r = BufReader::new(s);
        let mut w = BufWriter::new(w);
        loop {
            let req = match http::read_request(&mut r) {
                Ok(Some(req)) => req,
                Ok(None) => return,
                Err(HttpError::Io(_)) => return,
                Err(e) => {
                    let status = if matches!(e, HttpError::Unsupported(_)) {
                        501
                    } else {
                        400
                    };
                    tracing::info!(?peer, error = %e, "bad request");
                    let a = error_answer(status, e.to_string());
                    let _ =
                        http::write_response(&mut w, a.status, &a.headers, &a.body, false, false);
                    return;
                }
            };
            let a = answer(&req);
            let keep = req.keep_alive();
            if http::write_response(
                &mut w,
                a.status,
                &a.headers,
                &a.body,
                req.method == "HEAD",
                keep,
            )
            .is_err()
                || !keep
            {
                return;
            }
        }
    }
}

/// Accept clients, a thread each, at most `max_conns` at once (more wait
/// in the listen backlog).
pub fn serve(listener: TcpListener, proxy: Arc<Proxy>, max_conns: usize) {
    let live = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        while live.load(Ordering::Acquire) >= max_conns {
            std::thread::sleep(Duration::from_millis(1));
        }
        live.fetch_add(1, Ordering::AcqRel);
        let (p, l) = (proxy.clone(), live.clone());
        std::thread::spawn(move || {
            p.serve_conn(s);
            l.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::doc_number;

    #[test]
    fn document_numbers() {
        assert_eq!(doc_number("/docs/7", "/docs/"), Some(7));
        assert_eq!(doc_number("/docs/0", "/docs/"), Some(0));
        assert_eq!(doc_number("/docs/4294967295", "/docs/"), Some(u32::MAX));
        for t in [
            "/docs/",
            "/docs/07",
            "/docs/+7",
            "/docs/-1",
            "/docs/7?x=1",
            "/docs/7/",
            "/docs/4294967296",
            "/other/7",
            "/docs/7a",
        ] {
            assert_eq!(doc_number(t, "/docs/"), None, "{t}");
        }
    }
}
