//! `ccproxy`: the caching reverse proxy with strong coherency.
//!
//! An HTTP/1.1 server and client on hyper, on a tokio event loop (by
//! default one worker thread per CPU). Per client connection: keep-alive,
//! pipelining, request bodies of any framing (hyper's). For a GET or HEAD
//! of a document (`<prefix><n>`, e.g. `/doc/7` → slot 7):
//!
//! 1. `none`: forward to the application server, always.
//! 2. `rdma` / `tcp` / `sockets`: learn the document's current version
//!    `v` at the application module **after the request arrived** (RDMA
//!    Read of its slot, or the version thread; [`crate::acheck`]). Cannot:
//!    502, never the cached copy. Cached at `v`: answer from cache.
//!    Otherwise fetch from the application server; its response says, in
//!    `X-CC-Doc-Version`, the version it was read under (inside
//!    `READ_PROCEED` … `READ_DONE`, so the document was whole and at that
//!    version); keep it if it is a 200, and answer with it.
//!
//! Every document response carries `X-CC-Version` (the version served)
//! and `X-CC-Cache` (`hit`, `miss`, `off`). Everything else (other paths,
//! document paths with a query string, other methods) is forwarded as it
//! is, body streamed both ways, without caching or validation
//! (`X-CC-Cache: bypass`).
//!
//! Backend connections are kept alive and pooled (hyper-util's client),
//! so a miss does not pay a TCP handshake.
//!
//! The cache is a [`CacheState`]: it may also be refreshed by pushes from
//! the application module (adaptive push-pull, [`crate::push`]), and its
//! counters are answered at [`STATS_PATH`].
//!
//! Version checks go through a pool of checkers (one connection each); a
//! request takes an idle one, so at most `--check-conns` checks are in
//! flight and the rest wait for a free checker.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use crate::acheck::AsyncCheck;
use crate::check::CheckError;
use crate::state::CacheState;

/// Default largest document body the proxy fetches (`--max-doc-bytes`).
pub const MAX_BODY: usize = 8 * 1024 * 1024;

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
    /// Bound on a backend fetch: the response head, then the whole body of
    /// a document (a forwarded body: each chunk).
    pub backend_timeout: Duration,
    /// A client connection idle this long is closed (no request head, or
    /// sent data not acknowledged).
    pub idle: Duration,
    /// Largest document body fetched (`--max-doc-bytes`); a larger one is
    /// a 502 naming this limit.
    pub max_doc_bytes: usize,
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

/// Errors of a body on its way through the proxy.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every request and response the proxy sends.
pub type Body = BoxBody<Bytes, BoxError>;

fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never| match never {}).boxed()
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// The version checkers: a request takes an idle one for one check.
struct CheckPool {
    idle: Mutex<Vec<AsyncCheck>>,
    free: Semaphore,
    total: usize,
}

/// Puts a checker back into the pool, also when the request is dropped
/// halfway (its client went away): then the check's connection is
/// dropped too, since an answer or completion may still be on its way.
struct Lease<'a> {
    pool: &'a CheckPool,
    c: Option<AsyncCheck>,
    done: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.c.take() {
            if !self.done {
                c = c.fresh();
            }
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(c);
        }
    }
}

impl CheckPool {
    fn new(checkers: Vec<AsyncCheck>) -> CheckPool {
        CheckPool {
            free: Semaphore::new(checkers.len()),
            total: checkers.len(),
            idle: Mutex::new(checkers),
        }
    }

    /// How many checkers the pool has (busy or not).
    fn len(&self) -> usize {
        self.total
    }

    async fn version(&self, doc: u32) -> Result<u64, CheckError> {
        let permit = self
            .free
            .acquire()
            .await
            .map_err(|_| CheckError::Protocol("no version checkers".into()))?;
        let c = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut lease = Lease {
            pool: self,
            c,
            done: false,
        };
        // The checker goes back before the permit is released (`lease` is
        // dropped first), so a permit always finds one.
        let r = match lease.c.as_mut() {
            Some(c) => c.version(doc).await,
            None => Err(CheckError::Protocol("no version checkers".into())),
        };
        lease.done = true;
        drop(lease);
        drop(permit);
        r
    }
}

/// The proxy's shared state.
pub struct Proxy {
    cfg: ProxyCfg,
    cache: Arc<CacheState>,
    checkers: CheckPool,
    be: Arc<Backend>,
}

/// The application server as the fetches see it; shared with the fetch
/// tasks (a fetch outlives the request that started it, see [`Flights`]).
struct Backend {
    cfg: ProxyCfg,
    cache: Arc<CacheState>,
    client: Client<HttpConnector, Body>,
    authority: HeaderValue,
    flights: Mutex<Flights>,
}

/// What a fetch gives every request that waits for it: the version the
/// body was read under, its content type and the body; or the error
/// answer.
type Fetch = Result<(u64, Option<String>, Arc<Vec<u8>>), Answer>;

/// Fetches in flight, one per document at most (single flight): a miss
/// joins the fetch in flight for its document if that fetch was started
/// after a check that returned at least the miss's own version (so what it
/// brings is at least as new as what the miss's check demands), and
/// starts a new one otherwise. 256 concurrent misses on one document make
/// one backend request.
#[derive(Default)]
struct Flights {
    next: u64,
    by_doc: std::collections::HashMap<u32, Flight>,
}

struct Flight {
    id: u64,
    /// The version the starter's check returned.
    checked: u64,
    done: tokio::sync::watch::Receiver<Option<Fetch>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("cfg", &self.cfg)
            .field("checkers", &self.checkers.len())
            .finish()
    }
}

/// A response built whole (documents, errors, the counters).
#[derive(Debug, Clone)]
pub struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

impl Answer {
    fn into_response(self) -> Response<Body> {
        let mut r = Response::new(full(self.body));
        *r.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let h = r.headers_mut();
        for (k, v) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.append(HeaderName::from_static(k), v);
            }
        }
        r
    }
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
        headers: vec![("content-type", "text/plain".into())],
        body: Bytes::from(format!("ccproxy: {why}\n")),
    }
}

/// A document fetched whole from the application server.
struct Fetched {
    status: u16,
    version: Option<String>,
    content_type: Option<String>,
    body: Bytes,
}

/// The cache's shared copy of a body, served without a copy.
struct Shared(Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Hop-by-hop fields (RFC 9110 §7.6.1): never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Drop the hop-by-hop fields, including those the Connection field names.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        h.remove(n);
    }
}

/// A forwarded body whose next chunk must come within `limit` (a stalled
/// application server ends the response instead of holding the client).
struct StallLimit<B> {
    inner: B,
    limit: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<B> StallLimit<B> {
    fn new(inner: B, limit: Duration) -> StallLimit<B> {
        StallLimit {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl<B> hyper::body::Body for StallLimit<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(f) => {
                let deadline = tokio::time::Instant::now() + this.limit;
                this.timer.as_mut().reset(deadline);
                Poll::Ready(f.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "application server sent nothing for {:?} inside a body",
                    this.limit
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Proxy {
    /// A proxy with these checkers (empty for mode `none`).
    pub fn new(cfg: ProxyCfg, checkers: Vec<AsyncCheck>) -> Proxy {
        Proxy::with_cache(cfg, checkers, Arc::new(CacheState::new(0, 1024)))
    }

    /// A proxy over this cache (shared with the push agent and the state
    /// publisher; see [`crate::state`]).
    pub fn with_cache(cfg: ProxyCfg, checkers: Vec<AsyncCheck>, cache: Arc<CacheState>) -> Proxy {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(cfg.backend_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            // Below Apache's default KeepAliveTimeout (5 s), so the pool
            // drops a connection before the server does.
            .pool_idle_timeout(Duration::from_secs(4))
            .build(conn);
        let authority = HeaderValue::from_str(&cfg.backend.to_string())
            .expect("a socket address is a valid header value");
        Proxy {
            be: Arc::new(Backend {
                cfg: cfg.clone(),
                cache: cache.clone(),
                client,
                authority,
                flights: Mutex::new(Flights::default()),
            }),
            cfg,
            cache,
            checkers: CheckPool::new(checkers),
        }
    }

    fn doc_of(&self, target: &str) -> Option<u32> {
        doc_number(target, &self.cfg.prefix)
    }

    fn backend_uri(&self, target: &str) -> Result<Uri, Answer> {
        self.be.backend_uri(target)
    }

    fn backend_failed(&self, e: impl std::fmt::Display) -> Answer {
        self.be.backend_failed(e)
    }

    async fn fetch(&self, target: &str) -> Result<Fetched, Answer> {
        self.be.fetch(target).await
    }

    /// The document at a version of at least `v`: joins the fetch in
    /// flight for `doc` if it can serve this request, else starts one
    /// (run as a task of its own, so that it completes, and serves the
    /// requests that joined it, even if its starter's client goes away).
    async fn fetch_shared(&self, doc: u32, target: &str, v: u64) -> Fetch {
        let mut rx = {
            let mut f = self.be.flights.lock().unwrap_or_else(|p| p.into_inner());
            match f.by_doc.get(&doc) {
                Some(fl) if fl.checked >= v => {
                    self.cache
                        .stats
                        .fetches_joined
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    fl.done.clone()
                }
                _ => {
                    f.next += 1;
                    let id = f.next;
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    f.by_doc.insert(
                        doc,
                        Flight {
                            id,
                            checked: v,
                            done: rx.clone(),
                        },
                    );
                    self.cache
                        .stats
                        .fetches
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let be = self.be.clone();
                    let target = target.to_string();
                    tokio::spawn(async move {
                        let r = be.fetch_and_store(doc, &target, v).await;
                        let mut f = be.flights.lock().unwrap_or_else(|p| p.into_inner());
                        if f.by_doc.get(&doc).is_some_and(|fl| fl.id == id) {
                            f.by_doc.remove(&doc);
                        }
                        drop(f);
                        let _ = tx.send(Some(r));
                    });
                    rx
                }
            }
        };
        let r = match rx.wait_for(Option::is_some).await {
            Ok(r) => r.clone().expect("waited for Some"),
            Err(_) => Err(error_answer(
                502,
                format!("the fetch of document {doc} ended without an answer"),
            )),
        };
        r
    }
}

impl Backend {
    fn backend_uri(&self, target: &str) -> Result<Uri, Answer> {
        format!("http://{}{target}", self.cfg.backend)
            .parse()
            .map_err(|e| error_answer(400, format!("request target {target:?}: {e}")))
    }

    fn backend_failed(&self, e: impl std::fmt::Display) -> Answer {
        tracing::warn!(error = %e, backend = %self.cfg.backend, "backend fetch failed");
        error_answer(
            502,
            format!("application server {} failed: {e}", self.cfg.backend),
        )
    }

    /// GET a document whole from the application server.
    async fn fetch(&self, target: &str) -> Result<Fetched, Answer> {
        let t = self.cfg.backend_timeout;
        let mut req = Request::new(empty());
        *req.uri_mut() = self.backend_uri(target)?;
        let h = req.headers_mut();
        h.insert(header::HOST, self.authority.clone());
        h.insert(header::USER_AGENT, HeaderValue::from_static("ccproxy"));
        let resp = match tokio::time::timeout(t, self.client.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(self.backend_failed(e)),
            Err(_) => return Err(self.backend_failed(format!("no response within {t:?}"))),
        };
        let (parts, body) = resp.into_parts();
        let body =
            match tokio::time::timeout(t, Limited::new(body, self.cfg.max_doc_bytes).collect())
                .await
            {
                Ok(Ok(b)) => b.to_bytes(),
                Ok(Err(e)) => {
                    return Err(self.backend_failed(format!(
                    "reading the body: {e} (a document may be at most --max-doc-bytes {} bytes)",
                    self.cfg.max_doc_bytes
                )))
                }
                Err(_) => {
                    return Err(self.backend_failed(format!("body not complete within {t:?}")))
                }
            };
        let text = |n: &str| {
            parts
                .headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        Ok(Fetched {
            status: parts.status.as_u16(),
            version: text("x-cc-doc-version"),
            content_type: text("content-type"),
            body,
        })
    }

    /// Fetch `doc` (whose check returned `v`), validate the answer, keep it
    /// in the cache.
    async fn fetch_and_store(&self, doc: u32, target: &str, v: u64) -> Fetch {
        let r = self.fetch(target).await?;
        if r.status != 200 {
            return Err(error_answer(
                502,
                format!(
                    "application server answered {} for document {doc}",
                    r.status
                ),
            ));
        }
        let Some(w) = r.version.as_deref().and_then(|s| s.parse::<u64>().ok()) else {
            return Err(error_answer(502, format!(
                "application server sent document {doc} without X-CC-Doc-Version (is the IPC hook in front of it?)"
            )));
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
            return Err(error_answer(
                502,
                format!("application server read document {doc} at version {w}, older than {v}"),
            ));
        }
        // The cache keeps its own `Arc<Vec<u8>>` (shared with pushes); the
        // answers share the same allocation.
        let body = Arc::new(Vec::from(r.body));
        self.cache
            .store_fetched(doc, w, r.content_type.clone(), body.clone());
        Ok((w, r.content_type, body))
    }
}

impl Proxy {
    /// Mode `none`: the application server's answer, passed through.
    async fn forward_doc(&self, target: &str) -> Answer {
        match self.fetch(target).await {
            Ok(r) => {
                let mut headers = vec![("x-cc-cache", "off".to_string())];
                if let Some(v) = r.version {
                    headers.push(("x-cc-version", v));
                }
                if let Some(ct) = r.content_type {
                    headers.push(("content-type", ct));
                }
                Answer {
                    status: r.status,
                    headers,
                    body: r.body,
                }
            }
            Err(a) => a,
        }
    }

    async fn answer_doc(&self, doc: u32, target: &str, st: &mut Stages) -> Answer {
        if self.cfg.mode == Mode::None {
            let t = Instant::now();
            let a = self.forward_doc(target).await;
            st.fetch = t.elapsed();
            return a;
        }
        let t = Instant::now();
        let checked = self.checkers.version(doc).await;
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
        if let Some((body, ct)) = self.cache.lookup(doc, v) {
            let mut headers = vec![
                ("x-cc-version", v.to_string()),
                ("x-cc-cache", "hit".into()),
            ];
            if let Some(ct) = ct {
                headers.push(("content-type", ct));
            }
            return Answer {
                status: 200,
                headers,
                body: Bytes::from_owner(Shared(body)),
            };
        }
        let t = Instant::now();
        let fetched = self.fetch_shared(doc, target, v).await;
        st.fetch = t.elapsed();
        let (w, content_type, body) = match fetched {
            Ok(x) => x,
            Err(a) => return a,
        };
        let mut headers = vec![
            ("x-cc-version", w.to_string()),
            ("x-cc-cache", "miss".into()),
        ];
        if let Some(ct) = content_type {
            headers.push(("content-type", ct));
        }
        Answer {
            status: 200,
            headers,
            body: Bytes::from_owner(Shared(body)),
        }
    }

    /// A document's answer with `X-CC-Timing`.
    async fn answer_doc_timed(&self, doc: u32, target: &str) -> Answer {
        let start = Instant::now();
        let mut st = Stages::default();
        let mut a = self.answer_doc(doc, target, &mut st).await;
        let total = start.elapsed();
        let module = total.saturating_sub(st.check + st.fetch);
        a.headers.push((
            "x-cc-timing",
            format!(
                "check={};fetch={};module={};total={}",
                st.check.as_micros(),
                st.fetch.as_micros(),
                module.as_micros(),
                total.as_micros()
            ),
        ));
        a
    }

    /// Forward a request as it is (uncached, unvalidated), streaming both
    /// bodies.
    async fn bypass(&self, req: Request<Incoming>) -> Response<Body> {
        let t = self.cfg.backend_timeout;
        let (mut parts, body) = req.into_parts();
        let target = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        parts.uri = match self.backend_uri(&target) {
            Ok(u) => u,
            Err(a) => return a.into_response(),
        };
        parts.version = hyper::Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(header::HOST, self.be.authority.clone());
        parts
            .headers
            .append(header::VIA, HeaderValue::from_static("1.1 ccproxy"));
        let req = Request::from_parts(parts, StallLimit::new(body, t).boxed());
        let resp = match tokio::time::timeout(t, self.be.client.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return self.backend_failed(e).into_response(),
            Err(_) => {
                let mut a = self.backend_failed(format!("no response within {t:?}"));
                a.status = 504;
                return a.into_response();
            }
        };
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(v) = parts.headers.get("x-cc-doc-version").cloned() {
            parts.headers.insert("x-cc-version", v);
        }
        parts
            .headers
            .insert("x-cc-cache", HeaderValue::from_static("bypass"));
        Response::from_parts(parts, StallLimit::new(body, t).boxed())
    }

    /// The answer to one request.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let cacheable = matches!(*req.method(), Method::GET | Method::HEAD);
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if cacheable && target == STATS_PATH {
            return Answer {
                status: 200,
                headers: vec![("content-type", "application/json".into())],
                body: Bytes::from(format!("{}\n", self.cache.stats_json())),
            }
            .into_response();
        }
        match self.doc_of(target) {
            Some(doc) if cacheable => {
                let target = target.to_string();
                // A GET's body (if any) is not forwarded: the document
                // request is the path alone.
                drop(req);
                self.answer_doc_timed(doc, &target).await.into_response()
            }
            _ => self.bypass(req).await,
        }
    }

    /// The document number of a request target, if it is a document.
    pub fn doc_of_target(&self, target: &str) -> Option<u32> {
        self.doc_of(target)
    }

    /// Connections idle this long are closed.
    pub fn idle(&self) -> Duration {
        self.cfg.idle
    }
}

/// What the server loop serves: one proxy, or a front that picks one per
/// request (`crate::shard`).
pub trait Route: Send + Sync + 'static {
    /// The proxy that answers requests for `target`.
    fn route(&self, target: &str) -> &Proxy;
    /// Connections idle this long are closed.
    fn idle(&self) -> Duration;
}

impl Route for Proxy {
    fn route(&self, _target: &str) -> &Proxy {
        self
    }

    fn idle(&self) -> Duration {
        self.cfg.idle
    }
}

/// Serve clients on the current tokio runtime, at most `max_conns`
/// connections at once (more wait in the listen backlog). Runs until the
/// runtime stops.
pub async fn serve_async<R: Route>(
    listener: tokio::net::TcpListener,
    front: Arc<R>,
    max_conns: usize,
) -> io::Error {
    let slots = Arc::new(Semaphore::new(max_conns.max(1)));
    let idle = front.idle();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return io::Error::other("connection limit closed");
        };
        let (s, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = s.set_nodelay(true);
        // A client that stops reading: the kernel aborts the connection
        // once sent data stays unacknowledged this long (hyper has no
        // write timeout).
        let _ = socket2::SockRef::from(&s).set_tcp_user_timeout(Some(idle));
        let f = front.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let f = f.clone();
                async move {
                    let target = req.uri().path().to_string();
                    Ok::<_, Infallible>(f.route(&target).handle(req).await)
                }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            // The header read timeout also runs while a keep-alive
            // connection waits for its next request: it is the idle limit.
            b.timer(TokioTimer::new())
                .header_read_timeout(idle)
                .keep_alive(true)
                .max_header_size(64 * 1024);
            if let Err(e) = b.serve_connection(TokioIo::new(s), svc).await {
                tracing::debug!(%peer, error = %e, "client connection ended with an error");
            }
        });
    }
}

/// Serve clients on a tokio runtime of `threads` worker threads (0: one per
/// CPU this process may run on); blocks. Returns only if the listener
/// cannot be used.
pub fn serve<R: Route>(
    listener: TcpListener,
    front: Arc<R>,
    max_conns: usize,
    threads: usize,
) -> io::Error {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        rt.worker_threads(threads);
    }
    let rt = match rt.enable_all().thread_name("ccproxy-io").build() {
        Ok(rt) => rt,
        Err(e) => return e,
    };
    if let Err(e) = listener.set_nonblocking(true) {
        return e;
    }
    rt.block_on(async move {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => serve_async(l, front, max_conns).await,
            Err(e) => e,
        }
    })
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
