//! ccproxy end to end in one process, without Apache: the module's servers,
//! a small backend that serves files inside the Table 1 read protocol (as
//! mod_ccache does), the update thread at 100 updates/s, and the proxy in
//! rdma (both ways of waiting), tcp and sockets mode. Every response must
//! carry a version at least as new as the one published before the request
//! was sent, and be exactly that version's document. Then the HTTP side:
//! keep-alive and pipelining, HEAD, bypass forwarding with request and
//! chunked response bodies, malformed requests, the idle limit, a backend
//! that stalls, and a client that leaves while its check is in flight.

mod common;
use common::http;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ccache::acheck::{AsyncCheck, RdmaWait};
use ccache::appd::{self, IpcState, UpdaterCfg};
use ccache::listen::{Endpoint, ListenCfg};
use ccache::msgio::{read_msg, write_msg};
use ccache::proxy::{self, Mode, Proxy, ProxyCfg};
use ccache::table::VersionTable;
use ccache_proto::auth::LABEL_VERSION_TABLE;
use ccache_proto::ipc::{Kind, Repr};
use iwarp::cm::{MpaConfig, Policy};
use iwarp::Context;

const T: Duration = Duration::from_secs(5);
const DOCS: u32 = 4;
const SIZE: usize = 300;

struct World {
    table: Arc<VersionTable>,
    rdma: SocketAddr,
    tcp: SocketAddr,
    sockets: SocketAddr,
    backend: SocketAddr,
    dir: PathBuf,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The backend: GET /docs/<n> → READ_REQUEST, file, READ_DONE.
fn backend_conn(s: TcpStream, ipc: &Path, root: &Path) {
    let _ = s.set_read_timeout(Some(T));
    let mut w = s.try_clone().unwrap();
    let Ok(Some(req)) = http::read_request(&mut BufReader::new(s)) else {
        return;
    };
    let doc: u32 = req.target.trim_start_matches("/docs/").parse().unwrap();
    let mut u = UnixStream::connect(ipc).unwrap();
    u.set_read_timeout(Some(T)).unwrap();
    write_msg(&mut u, &Repr::new(Kind::ReadRequest, doc)).unwrap();
    let m = read_msg(&mut u).unwrap();
    if m.kind != Kind::ReadProceed {
        let _ = write!(w, "HTTP/1.0 404 Not Found\r\n\r\n");
        return;
    }
    let body = std::fs::read(appd::doc_path(root, doc)).unwrap();
    let _ = write!(
        w,
        "HTTP/1.0 200 OK\r\nX-CC-Doc-Version: {}\r\nContent-Length: {}\r\n\r\n",
        m.value,
        body.len()
    );
    let _ = w.write_all(&body);
    write_msg(&mut u, &Repr::new(Kind::ReadDone, doc)).unwrap();
}

fn start(tag: &str) -> World {
    let dir = std::env::temp_dir().join(format!("ccache-proxy-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.join("docs");
    appd::init_docs(&root, DOCS, 1, SIZE).unwrap();
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let table = Arc::new(VersionTable::new(&pd, DOCS, 1).unwrap());
    let mpa = MpaConfig {
        crc: Policy::Off,
        ..MpaConfig::default()
    };
    let rl = Endpoint::bind(&ctx, "127.0.0.1:0".parse().unwrap(), mpa).unwrap();
    let rdma = rl.local_addr().unwrap();
    let t = table.clone();
    let cfg = ListenCfg::new("version table", LABEL_VERSION_TABLE, Vec::new());
    std::thread::spawn(move || appd::serve_rdma(rl, pd, cq, t, cfg, Default::default()));
    let vl = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = vl.local_addr().unwrap();
    let t = table.clone();
    std::thread::spawn(move || appd::serve_versions(vl, t, T));
    let sockets = ccache::sockets::spawn_listener(
        &ctx,
        "127.0.0.1:0".parse().unwrap(),
        table.clone(),
        ccache::sockets::SocketsCfg::new(T, 64),
        Default::default(),
    )
    .unwrap();
    let ipc = dir.join("ipc.sock");
    let il = UnixListener::bind(&ipc).unwrap();
    let st = Arc::new(IpcState::new(table.clone(), 1));
    std::thread::spawn(move || appd::serve_ipc(il, st, T));

    let bl = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = bl.local_addr().unwrap();
    let (i2, r2) = (ipc.clone(), root.clone());
    std::thread::spawn(move || {
        for s in bl.incoming().flatten() {
            let (i, r) = (i2.clone(), r2.clone());
            std::thread::spawn(move || backend_conn(s, &i, &r));
        }
    });
    let cfg = UpdaterCfg {
        ipc,
        docroot: root,
        docs: DOCS,
        doc_size: SIZE,
        rate: 100.0,
        steps: 3,
        log: None,
        timeout: T,
        count: None,
        select: ccache::appd::Select::Uniform,
    };
    std::thread::spawn(move || appd::run_updater(cfg));
    World {
        table,
        rdma,
        tcp,
        sockets,
        backend,
        dir,
    }
}

#[derive(Clone, Copy)]
enum Check {
    None,
    Rdma(RdmaWait),
    Tcp,
    Sockets,
}

fn proxy_at(backend: SocketAddr, w: &World, check: Check, idle: Duration) -> SocketAddr {
    let (mode, checkers): (Mode, Vec<AsyncCheck>) = match check {
        Check::None => (Mode::None, Vec::new()),
        Check::Rdma(wait) => (
            Mode::Rdma,
            (0..2).map(|_| AsyncCheck::rdma(w.rdma, T, wait)).collect(),
        ),
        Check::Tcp => (
            Mode::Tcp,
            (0..2).map(|_| AsyncCheck::tcp(w.tcp, T)).collect(),
        ),
        Check::Sockets => (
            Mode::Sockets,
            (0..2).map(|_| AsyncCheck::sockets(w.sockets, T)).collect(),
        ),
    };
    let cfg = ProxyCfg {
        backend,
        prefix: "/docs/".into(),
        mode,
        backend_timeout: Duration::from_secs(2),
        idle,
        max_doc_bytes: proxy::MAX_BODY,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let p = Arc::new(Proxy::new(cfg, checkers));
    std::thread::spawn(move || proxy::serve(l, p, 16, 2));
    addr
}

fn start_proxy(w: &World, check: Check) -> SocketAddr {
    proxy_at(w.backend, w, check, T)
}

fn coherent(check: Check, tag: &str) {
    let w = start(tag);
    let px = start_proxy(&w, check);
    let mut hits = 0;
    for i in 0..600u32 {
        let doc = i % DOCS;
        let before = w.table.get(doc).unwrap().unwrap();
        let r = http::fetch(px, &format!("/docs/{doc}"), T).unwrap();
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        let v: u64 = r.header("x-cc-version").unwrap().parse().unwrap();
        assert!(
            v >= before,
            "stale: served {v}, {before} was published before the request"
        );
        assert_eq!(
            r.body,
            appd::doc_body(doc, v, SIZE),
            "body is not version {v}"
        );
        if r.header("x-cc-cache") == Some("hit") {
            hits += 1;
        }
    }
    assert!(hits > 0, "no cache hit in 600 requests");
    let total: u64 = (0..DOCS).map(|d| w.table.get(d).unwrap().unwrap()).sum();
    assert!(total > u64::from(DOCS), "no update ran");
    let r = http::fetch(px, "/docs/99", T).unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn rdma_mode_is_coherent_under_updates() {
    coherent(Check::Rdma(RdmaWait::EventLoop), "rdma");
}

#[test]
fn rdma_mode_waiting_on_the_provider_thread_is_coherent_under_updates() {
    coherent(Check::Rdma(RdmaWait::ProviderThread), "rdma-thread");
}

#[test]
fn tcp_mode_is_coherent_under_updates() {
    coherent(Check::Tcp, "tcp");
}

#[test]
fn sockets_mode_is_coherent_under_updates() {
    coherent(Check::Sockets, "sockets");
}

#[test]
fn unreachable_module_is_502() {
    let w = start("dead");
    // A proxy pointed at a port nobody listens on.
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dead = World {
        rdma: free,
        tcp: free,
        sockets: free,
        table: w.table.clone(),
        backend: w.backend,
        dir: w.dir.join("unused"),
    };
    for check in [Check::Rdma(RdmaWait::EventLoop), Check::Tcp, Check::Sockets] {
        let px = start_proxy(&dead, check);
        let r = http::fetch(px, "/docs/1", T).unwrap();
        assert_eq!(r.status, 502);
        assert!(r.header("x-cc-version").is_none());
    }
}

// ---- The HTTP side (hyper): raw requests on a socket, responses parsed here.

/// Read one response: (head lines, body). The body follows Content-Length
/// or chunked framing; none for a HEAD (`head_only`).
fn read_response(r: &mut BufReader<TcpStream>, head_only: bool) -> (Vec<String>, Vec<u8>) {
    use std::io::{BufRead, Read};
    let mut head = Vec::new();
    loop {
        let mut l = String::new();
        assert!(r.read_line(&mut l).unwrap() > 0, "closed inside a head");
        let l = l.trim_end().to_string();
        if l.is_empty() {
            break;
        }
        head.push(l);
    }
    let field = |n: &str| {
        head.iter()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(n)))
            .map(|(_, v)| v.trim().to_string())
    };
    let mut body = Vec::new();
    if head_only {
        return (head, body);
    }
    if field("transfer-encoding").as_deref() == Some("chunked") {
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            let n = usize::from_str_radix(l.trim(), 16).unwrap();
            let mut c = vec![0u8; n + 2];
            r.read_exact(&mut c).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&c[..n]);
        }
    } else {
        let n: usize = field("content-length").unwrap().parse().unwrap();
        body.resize(n, 0);
        r.read_exact(&mut body).unwrap();
    }
    (head, body)
}

fn field<'a>(head: &'a [String], name: &str) -> Option<&'a str> {
    head.iter()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        })
        .map(|(_, v)| v.trim())
}

fn connect(px: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(px).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

#[test]
fn keep_alive_pipelining_and_head() {
    let w = start("pipeline");
    let px = start_proxy(&w, Check::Rdma(RdmaWait::EventLoop));
    let (mut s, mut r) = connect(px);
    // Three requests in one write, a HEAD in the middle.
    s.write_all(
        b"GET /docs/1 HTTP/1.1\r\nHost: p\r\n\r\n\
          HEAD /docs/2 HTTP/1.1\r\nHost: p\r\n\r\n\
          GET /docs/3 HTTP/1.1\r\nHost: p\r\n\r\n",
    )
    .unwrap();
    for (doc, head_only) in [(1, false), (2, true), (3, false)] {
        let (h, body) = read_response(&mut r, head_only);
        assert!(h[0].starts_with("HTTP/1.1 200"), "{h:?}");
        let v: u64 = field(&h, "x-cc-version").unwrap().parse().unwrap();
        let len: usize = field(&h, "content-length").unwrap().parse().unwrap();
        assert_eq!(len, SIZE, "{h:?}");
        if head_only {
            assert!(body.is_empty());
        } else {
            assert_eq!(body, appd::doc_body(doc, v, SIZE));
        }
    }
    // The connection is still usable after the pipeline.
    s.write_all(b"GET /_ccproxy/stats HTTP/1.1\r\nHost: p\r\n\r\n")
        .unwrap();
    let (h, body) = read_response(&mut r, false);
    assert!(h[0].starts_with("HTTP/1.1 200"), "{h:?}");
    assert!(String::from_utf8_lossy(&body).contains("hits"), "{body:?}");
}

#[test]
fn malformed_requests_get_400_and_idle_connections_close() {
    use std::io::Read;
    let w = start("malformed");
    let px = proxy_at(w.backend, &w, Check::Tcp, Duration::from_millis(400));
    let (mut s, mut r) = connect(px);
    s.write_all(b"NOT HTTP AT ALL\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = r.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 400"), "{out:?}");
    // A head over the 64 KiB limit.
    let (mut s, mut r) = connect(px);
    let big = format!(
        "GET /docs/1 HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let _ = s.write_all(big.as_bytes());
    let mut out = String::new();
    let _ = r.read_to_string(&mut out);
    assert!(
        out.starts_with("HTTP/1.1 431"),
        "{:?}",
        &out[..out.len().min(80)]
    );
    // Idle: closed by the proxy after its 400 ms limit, well before T.
    let (_s, mut r) = connect(px);
    let t = std::time::Instant::now();
    let mut b = [0u8; 64];
    let n = r.read(&mut b).unwrap_or(0);
    let _ = n;
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "idle connection open for {:?}",
        t.elapsed()
    );
}

/// A response body fed by a channel (chunked on the wire).
struct Chunks(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

type Req = hyper::Request<hyper::body::Incoming>;

/// The forwarded-request backend's answer: `/echo` answers 201 with a
/// chunked body `METHOD\n` + the request body and says which request
/// fields it saw; `/silent` sends nothing for 30 s; anything else sends
/// its head and one chunk, then nothing for 30 s.
async fn backend_answer(req: Req) -> Result<hyper::Response<Chunks>, std::convert::Infallible> {
    use bytes::Bytes;
    use http_body_util::BodyExt;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut resp = hyper::Response::builder();
    if req.uri().path() == "/silent" {
        // No response head for 30 s.
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    if req.uri().path() == "/echo" {
        let method = req.method().to_string();
        let saw_hop = req.headers().contains_key("x-hop");
        let via = req
            .headers()
            .get("via")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        resp = resp
            .status(201)
            .header("x-saw-hop", saw_hop.to_string())
            .header("x-saw-via", via)
            .header("x-cc-doc-version", "77");
        tokio::spawn(async move {
            let _ = tx.send(Bytes::from(format!("{method}\n"))).await;
            for c in body.chunks(1000) {
                let _ = tx.send(Bytes::copy_from_slice(c)).await;
            }
        });
    } else {
        tokio::spawn(async move {
            let _ = tx.send(Bytes::from_static(b"part")).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(tx);
        });
    }
    Ok(resp.body(Chunks(rx)).unwrap())
}

/// A hyper backend for forwarded requests ([`backend_answer`]).
fn bypass_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(backend_answer);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    });
    addr
}

#[test]
fn other_methods_and_paths_are_forwarded_with_their_bodies() {
    let w = start("bypass");
    let px = proxy_at(bypass_backend(), &w, Check::Tcp, T);
    let (mut s, mut r) = connect(px);
    // A POST with a Content-Length body, a hop-by-hop field named in
    // Connection (must not reach the backend), on a document path: it is
    // forwarded, not answered from the cache.
    let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let mut req = format!(
        "POST /echo HTTP/1.1\r\nHost: p\r\nConnection: x-hop\r\nX-Hop: 1\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    req.extend_from_slice(&big);
    s.write_all(&req).unwrap();
    let (h, body) = read_response(&mut r, false);
    assert!(h[0].starts_with("HTTP/1.1 201"), "{h:?}");
    assert_eq!(field(&h, "x-cc-cache"), Some("bypass"));
    assert_eq!(field(&h, "x-saw-hop"), Some("false"), "{h:?}");
    assert_eq!(field(&h, "x-saw-via"), Some("1.1 ccproxy"), "{h:?}");
    assert_eq!(field(&h, "x-cc-version"), Some("77"), "{h:?}");
    assert_eq!(&body[..5], b"POST\n");
    assert_eq!(&body[5..], &big[..]);
    // A chunked request body on the same connection.
    s.write_all(
        b"PUT /echo HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .unwrap();
    let (h, body) = read_response(&mut r, false);
    assert!(h[0].starts_with("HTTP/1.1 201"), "{h:?}");
    assert_eq!(body, b"PUT\nhello world");
}

#[test]
fn a_backend_that_stalls_ends_the_response_or_gets_504() {
    use std::io::Read;
    let w = start("stall");
    // backend_timeout is 2 s (proxy_at).
    let px = proxy_at(bypass_backend(), &w, Check::Tcp, T);
    let (mut s, mut r) = connect(px);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = std::time::Instant::now();
    s.write_all(b"GET /stall HTTP/1.1\r\nHost: p\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = r.read_to_end(&mut out);
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert!(text.contains("part"), "{text:?}");
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "a stalled body looked complete: {text:?}"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(6),
        "the stalled response ended after {took:?}"
    );
    // No head at all within the backend timeout: 504.
    let (mut s, mut r) = connect(px);
    let t = std::time::Instant::now();
    s.write_all(b"GET /silent HTTP/1.1\r\nHost: p\r\n\r\n")
        .unwrap();
    let (h, _) = read_response(&mut r, false);
    assert!(h[0].starts_with("HTTP/1.1 504"), "{h:?}");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
}

/// What a [`slow_version_thread`] has seen.
struct SlowVersions {
    addr: SocketAddr,
    /// Connections accepted.
    conns: Arc<std::sync::atomic::AtomicUsize>,
    /// Requests received (counted before the answer's delay).
    asked: Arc<std::sync::atomic::AtomicUsize>,
    /// Requests received on each connection, in the order of accepting.
    per_conn: Arc<std::sync::Mutex<Vec<usize>>>,
}

/// A version thread that answers every request with version 1, the
/// first `held` requests after `hold`, the others after `delay`,
/// counting its connections and the requests it received (on each
/// connection too).
fn slow_version_thread(held: usize, hold: Duration, delay: Duration) -> SlowVersions {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let asked = Arc::new(AtomicUsize::new(0));
    let per_conn = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, a, pc) = (conns.clone(), asked.clone(), per_conn.clone());
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let i = c.fetch_add(1, SeqCst);
            pc.lock().unwrap().push(0);
            let (a, pc) = (a.clone(), pc.clone());
            std::thread::spawn(move || {
                while let Ok(m) = read_msg(&mut s) {
                    pc.lock().unwrap()[i] += 1;
                    let n = a.fetch_add(1, SeqCst);
                    std::thread::sleep(if n < held { hold } else { delay });
                    if write_msg(&mut s, &Repr::with_value(Kind::VersionReply, m.doc, 1)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    SlowVersions {
        addr,
        conns,
        asked,
        per_conn,
    }
}

#[test]
fn clients_that_leave_during_their_check_do_not_lose_checkers() {
    use std::sync::atomic::Ordering::SeqCst;
    let w = start("leave");
    // The two abandoned checks are answered long after their clients
    // left (the proxy must not wait for those answers); later checks
    // after 300 ms.
    let v = slow_version_thread(2, Duration::from_secs(3), Duration::from_millis(300));
    let slow = World {
        tcp: v.addr,
        rdma: w.rdma,
        sockets: w.sockets,
        table: w.table.clone(),
        backend: w.backend,
        dir: w.dir.join("unused"),
    };
    let px = start_proxy(&slow, Check::Tcp);
    // Both checkers busy with clients that close at once: the clients
    // leave only once the version thread has both checks, so each checker
    // has a connection with an answer still due.
    let clients: Vec<_> = [1, 2]
        .into_iter()
        .map(|doc| {
            let (mut s, r) = connect(px);
            s.write_all(format!("GET /docs/{doc} HTTP/1.1\r\nHost: p\r\n\r\n").as_bytes())
                .unwrap();
            (s, r)
        })
        .collect();
    let t0 = std::time::Instant::now();
    while v.asked.load(SeqCst) < 2 {
        assert!(
            t0.elapsed() < T,
            "the version thread received {} of the 2 checks",
            v.asked.load(SeqCst)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(v.conns.load(SeqCst), 2, "both checkers connected");
    drop(clients);
    // Every later request is still answered (the pool has its checkers).
    for doc in [1, 2, 3, 1, 2] {
        let r = http::fetch(px, &format!("/docs/{doc}"), T).unwrap();
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    }
    // The abandoned checks' connections were dropped, not reused with an
    // answer still due: no later check went over them, and the checkers
    // connected again.
    let per_conn = v.per_conn.lock().unwrap().clone();
    assert_eq!(
        per_conn[..2],
        [1, 1],
        "requests on each version connection: {per_conn:?}"
    );
    assert!(
        v.conns.load(SeqCst) >= 3,
        "{} version connections",
        v.conns.load(SeqCst)
    );
}

#[test]
fn none_mode_forwards_every_request() {
    let w = start("none");
    let px = start_proxy(&w, Check::None);
    for i in 0..40u32 {
        let doc = i % DOCS;
        let before = w.table.get(doc).unwrap().unwrap();
        let r = http::fetch(px, &format!("/docs/{doc}"), T).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-cc-cache"), Some("off"));
        let v: u64 = r.header("x-cc-version").unwrap().parse().unwrap();
        assert!(v >= before);
        assert_eq!(r.body, appd::doc_body(doc, v, SIZE));
        let timing = r.header("x-cc-timing").unwrap();
        assert!(timing.starts_with("check=0;"), "{timing}");
    }
}
