//! ccproxy's memory under hostile load (issue 26, item 5): concurrent
//! misses on one document share one backend fetch (single flight), and the
//! cache stays within its byte bound.

mod common;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use ccache::acheck::AsyncCheck;
use ccache::appd;
use ccache::proxy::{self, Mode, Proxy, ProxyCfg};
use ccache::state::CacheState;
use ccache::table::VersionTable;
use common::http;
use iwarp::Context;

const T: Duration = Duration::from_secs(30);

/// A backend that answers `/docs/N` with `size` bytes at the table's
/// current version, after `delay` (so that concurrent misses overlap),
/// counting its document requests.
fn backend(table: Arc<VersionTable>, size: usize, delay: Duration) -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let (t, c) = (table.clone(), c.clone());
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                while let Ok(Some(req)) = http::read_request(&mut r) {
                    let doc: u32 = req.target.rsplit('/').next().unwrap().parse().unwrap();
                    c.fetch_add(1, Ordering::SeqCst);
                    let v = t.get(doc).unwrap().unwrap();
                    std::thread::sleep(delay);
                    let body = appd::doc_body(doc, v, size);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nX-CC-Doc-Version: {v}\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if w.write_all(head.as_bytes()).is_err() || w.write_all(&body).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

struct World {
    table: Arc<VersionTable>,
    proxy: SocketAddr,
    fetches: Arc<AtomicU64>,
    cache: Arc<CacheState>,
}

fn world(docs: u32, size: usize, delay: Duration, cache: CacheState) -> World {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let table = Arc::new(VersionTable::new(&pd, docs, 1).unwrap());
    std::mem::forget(pd);
    let vl = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = vl.local_addr().unwrap();
    let t = table.clone();
    std::thread::spawn(move || appd::serve_versions(vl, t, T));
    let (backend, fetches) = backend(table.clone(), size, delay);
    let cfg = ProxyCfg {
        backend,
        prefix: "/docs/".into(),
        mode: Mode::Tcp,
        backend_timeout: T,
        idle: T,
        max_doc_bytes: proxy::MAX_BODY,
    };
    let checkers: Vec<AsyncCheck> = (0..4).map(|_| AsyncCheck::tcp(tcp, T)).collect();
    let cache = Arc::new(cache);
    let p = Arc::new(Proxy::with_cache(cfg, checkers, cache.clone()));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || proxy::serve(l, p, 512, 2));
    World {
        table,
        proxy: addr,
        fetches,
        cache,
    }
}

/// 256 concurrent requests for one stale 1 MiB document: one backend
/// fetch, and every answer is the new version, whole. Before single
/// flight each miss fetched on its own (256 fetches, 256 MiB of buffers).
#[test]
fn concurrent_misses_on_a_stale_document_make_one_fetch() {
    const SIZE: usize = 1024 * 1024;
    let w = world(4, SIZE, Duration::from_millis(300), CacheState::new(0, 64));
    let r = http::fetch(w.proxy, "/docs/2", T).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(w.fetches.load(Ordering::SeqCst), 1);
    // The cached copy goes stale.
    w.table.publish(2, 7);
    let n = 256;
    let go = Arc::new(Barrier::new(n));
    let clients: Vec<_> = (0..n)
        .map(|_| {
            let (go, px) = (go.clone(), w.proxy);
            std::thread::spawn(move || {
                go.wait();
                http::fetch(px, "/docs/2", T).unwrap()
            })
        })
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("x-cc-version"), Some("7"));
        assert!(
            r.body == appd::doc_body(2, 7, SIZE),
            "body is not version 7"
        );
    }
    let fetched = w.fetches.load(Ordering::SeqCst) - 1;
    eprintln!("256 concurrent misses: {fetched} backend fetches");
    assert_eq!(
        fetched, 1,
        "256 concurrent misses made {fetched} backend fetches"
    );
    assert_eq!(w.cache.cached_version(2), Some(7));
}

/// The cache never holds more than its byte bound, whatever is asked;
/// the least recently accessed documents go first, and a document larger
/// than the bound is served but not kept.
#[test]
fn the_cache_stays_within_its_byte_bound() {
    const SIZE: usize = 100 * 1024;
    let bound = 350 * 1024;
    let w = world(
        40,
        SIZE,
        Duration::ZERO,
        CacheState::with_limits(0, bound, 64),
    );
    for round in 0..2 {
        for doc in 0..40u32 {
            let r = http::fetch(w.proxy, &format!("/docs/{doc}"), T).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.body.len(), SIZE);
            let held = w.cache.cached_bytes();
            assert!(
                held <= bound,
                "round {round}, doc {doc}: {held} bytes cached, bound {bound}"
            );
        }
    }
    // The last three requested are the ones kept (3 x 100 KiB fit).
    for doc in 37..40 {
        assert!(w.cache.cached_version(doc).is_some(), "doc {doc} evicted");
    }
    assert!(w.cache.cached_version(0).is_none());
    let stats = w.cache.stats_json();
    assert!(stats.contains("\"cached_docs\":3"), "{stats}");
}

/// A document larger than the whole bound is served and not kept.
#[test]
fn a_document_larger_than_the_bound_is_served_uncached() {
    let w = world(
        2,
        64 * 1024,
        Duration::ZERO,
        CacheState::with_limits(0, 32 * 1024, 8),
    );
    for _ in 0..2 {
        let r = http::fetch(w.proxy, "/docs/1", T).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), 64 * 1024);
        assert_eq!(r.header("x-cc-cache"), Some("miss"));
    }
    assert_eq!(w.cache.cached_bytes(), 0);
}
