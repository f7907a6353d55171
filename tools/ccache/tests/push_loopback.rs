//! Adaptive push-pull end to end in one process: ccappd's servers with the
//! pusher, a backend serving files inside the Table 1 read protocol, and a
//! proxy that registers its cache state region (read by RDMA Read, with
//! the deployment's access token, or over the push channel). Then the push channel's faults against a fake
//! ccappd: a malformed frame, a push for a document the proxy does not
//! have, an older push after a newer copy, a push cut short by a dead
//! ccappd.

mod common;
use common::http;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccache::access::Token;
use ccache::acheck::AsyncCheck;
use ccache::appd::{self, IpcState, Select, UpdaterCfg};
use ccache::listen::{self, Endpoint, ListenCfg, ListenStats};
use ccache::msgio::{read_msg, write_msg};
use ccache::proxy::{self, Mode, Proxy, ProxyCfg};
use ccache::push::{self, read_frame, write_frame, PushCfg, Pusher, RdmaStateReader, StateRead};
use ccache::state::CacheState;
use ccache::table::VersionTable;
use ccache_proto::auth::LABEL_STATE_REGION;
use ccache_proto::ipc::{Kind as IpcKind, Repr};
use ccache_proto::push::{Header, Kind, PushStatus, Registration};
use ccache_proto::state::{Policy, Snapshot};
use iwarp::cm::{MpaConfig, Policy as Crc};
use iwarp::{Access, Context};

const T: Duration = Duration::from_secs(5);
const DOCS: u32 = 10;
const SIZE: usize = 300;

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct World {
    table: Arc<VersionTable>,
    pusher: Arc<Pusher>,
    push_addr: SocketAddr,
    backend: SocketAddr,
    tcp: SocketAddr,
    ipc: PathBuf,
    root: PathBuf,
    dir: PathBuf,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn backend_conn(s: TcpStream, ipc: &Path, root: &Path) {
    let _ = s.set_read_timeout(Some(T));
    let mut w = s.try_clone().unwrap();
    let Ok(Some(req)) = http::read_request(&mut BufReader::new(s)) else {
        return;
    };
    let doc: u32 = req.target.trim_start_matches("/docs/").parse().unwrap();
    let mut u = UnixStream::connect(ipc).unwrap();
    u.set_read_timeout(Some(T)).unwrap();
    write_msg(&mut u, &Repr::new(IpcKind::ReadRequest, doc)).unwrap();
    let m = read_msg(&mut u).unwrap();
    if m.kind != IpcKind::ReadProceed {
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
    write_msg(&mut u, &Repr::new(IpcKind::ReadDone, doc)).unwrap();
}

fn start(tag: &str, policy: Policy, state_read: StateRead) -> World {
    start_with(tag, policy, state_read, None)
}

/// ccappd's side; with `token`, registrations must prove it and the
/// pusher proves it to the proxies' state regions (`--token-file`).
fn start_with(tag: &str, policy: Policy, state_read: StateRead, token: Option<Token>) -> World {
    let dir = std::env::temp_dir().join(format!("ccache-push-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.join("docs");
    appd::init_docs(&root, DOCS, 1, SIZE).unwrap();
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let table = Arc::new(VersionTable::new(&pd, DOCS, 1).unwrap());
    let vl = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = vl.local_addr().unwrap();
    let t = table.clone();
    std::thread::spawn(move || appd::serve_versions(vl, t, T));
    let ipc = dir.join("ipc.sock");
    let pusher = Arc::new(Pusher::new(PushCfg {
        policy,
        ipc: ipc.clone(),
        docroot: root.clone(),
        state_read,
        timeout: T,
        token,
    }));
    let pl = TcpListener::bind("127.0.0.1:0").unwrap();
    let push_addr = pl.local_addr().unwrap();
    let p = pusher.clone();
    std::thread::spawn(move || p.serve_registrations(pl));
    let p = pusher.clone();
    std::thread::spawn(move || p.run());
    let il = UnixListener::bind(&ipc).unwrap();
    let st = Arc::new(IpcState::new(table.clone(), 1).with_pusher(pusher.clone()));
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
    World {
        table,
        pusher,
        push_addr,
        backend,
        tcp,
        ipc,
        root,
        dir,
    }
}

/// A proxy (tcp checks) whose cache registers with the pusher; with
/// `rdma`, its state region is a registered MR behind an iWARP listener.
fn start_proxy(w: &World, rdma: bool) -> (SocketAddr, Arc<CacheState>) {
    let p = start_proxy_with(w, rdma, None);
    (p.addr, p.cache)
}

/// A proxy started by [`start_proxy_with`].
struct ProxyUnderTest {
    addr: SocketAddr,
    cache: Arc<CacheState>,
    /// The registration it sent (its state region's listener, address and
    /// STag, unmasked).
    reg: Registration,
    /// Its state region listener's counters.
    state_stats: Arc<ListenStats>,
}

/// [`start_proxy`], with `token` (the proxy's `--token-file`): its
/// registration proves it, and its state region's listener admits only
/// Requests that prove it (issue 26 item 4).
fn start_proxy_with(w: &World, rdma: bool, token: Option<Token>) -> ProxyUnderTest {
    let cache = Arc::new(CacheState::new(0, 64));
    let state_stats = Arc::new(ListenStats::default());
    cache.spawn_publisher(Duration::from_millis(2));
    let len = cache.region_len();
    let reg = if rdma {
        let ctx = Context::open().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16).unwrap();
        let mr = pd
            .reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let reg = Registration {
            rdma: None,
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: len as u32,
        };
        cache.attach_region(mr);
        let mpa = MpaConfig {
            crc: Crc::Off,
            ..MpaConfig::default()
        };
        let l = Endpoint::bind(&ctx, "127.0.0.1:0".parse().unwrap(), mpa).unwrap();
        let at = l.local_addr().unwrap();
        let cfg = ListenCfg {
            token: token.clone(),
            ..ListenCfg::new("cache state", LABEL_STATE_REGION, Vec::new())
        };
        let stats = state_stats.clone();
        std::thread::spawn(move || {
            let _ctx = ctx;
            listen::serve(l, pd, cq, cfg, stats)
        });
        Registration {
            rdma: Some(at),
            ..reg
        }
    } else {
        Registration {
            rdma: None,
            addr: 0,
            rkey: 0,
            len: len as u32,
        }
    };
    let (c, pa) = (cache.clone(), w.push_addr);
    let acfg = push::AgentCfg {
        token,
        ..agent_cfg(Duration::from_millis(50))
    };
    std::thread::spawn(move || push::run_agent(pa, reg, c, acfg));
    let checkers: Vec<AsyncCheck> = (0..2).map(|_| AsyncCheck::tcp(w.tcp, T)).collect();
    let cfg = ProxyCfg {
        backend: w.backend,
        prefix: "/docs/".into(),
        mode: Mode::Tcp,
        backend_timeout: T,
        idle: T,
        max_doc_bytes: proxy::MAX_BODY,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let p = Arc::new(Proxy::with_cache(cfg, checkers, cache.clone()));
    std::thread::spawn(move || proxy::serve(l, p, 16, 1));
    let pu = w.pusher.clone();
    wait_until("the proxy's registration", || pu.proxies() >= 1);
    ProxyUnderTest {
        addr,
        cache,
        reg,
        state_stats,
    }
}

fn updater(w: &World) -> (UnixStream, UpdaterCfg) {
    let cfg = UpdaterCfg {
        ipc: w.ipc.clone(),
        docroot: w.root.clone(),
        docs: DOCS,
        doc_size: SIZE,
        rate: 100.0,
        steps: 3,
        log: None,
        timeout: T,
        count: None,
        select: Select::Uniform,
    };
    let s = UnixStream::connect(&w.ipc).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    (s, cfg)
}

/// GET a document: (version served, cache tag); the body must be that
/// version and at least as new as `w`'s table before the request.
fn get(w: &World, px: SocketAddr, doc: u32) -> (u64, String) {
    let before = w.table.get(doc).unwrap().unwrap();
    let r = http::fetch(px, &format!("/docs/{doc}"), T).unwrap();
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let v: u64 = r.header("x-cc-version").unwrap().parse().unwrap();
    assert!(
        v >= before,
        "stale: served {v}, {before} was published before"
    );
    assert_eq!(
        r.body,
        appd::doc_body(doc, v, SIZE),
        "body is not version {v}"
    );
    (v, r.header("x-cc-cache").unwrap_or("").to_string())
}

/// The pusher's counters, for a failure message.
fn push_stats(p: &Pusher) -> String {
    let s = &p.stats;
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    format!(
        "updates {} sent {} stored {} ignored {} skipped {} state_rdma {} state_tcp {} dropped {}",
        l(&s.updates),
        l(&s.sent),
        l(&s.stored),
        l(&s.ignored),
        l(&s.skipped),
        l(&s.state_rdma),
        l(&s.state_tcp),
        l(&s.dropped)
    )
}

/// Push end to end; with `token`, both sides hold the deployment's access
/// token (the registration and the state region's Requests prove it).
fn push_end_to_end(rdma: bool, tag: &str, token: Option<Token>) -> (World, ProxyUnderTest) {
    let w = start_with(tag, Policy::Push, StateRead::Rdma, token.clone());
    let proxy = start_proxy_with(&w, rdma, token);
    let (px, cache) = (proxy.addr, proxy.cache.clone());
    for d in 0..DOCS {
        get(&w, px, d);
    }
    // The state the pusher reads is the last one published: without this,
    // an update that comes before the publisher thread's next round (2 ms,
    // later on a loaded host) finds the document "not cached" and is
    // rightly not pushed, and the wait below times out ("skipped 1").
    cache.publish();
    let (mut s, cfg) = updater(&w);
    // Each update is pushed: the proxy's copy moves to the new version
    // without a request, and the next request is a hit on it.
    for d in [3u32, 7, 3] {
        let v = appd::update_once(&mut s, &cfg, d).unwrap();
        let c = cache.clone();
        let end = Instant::now() + Duration::from_secs(10);
        while c.cached_version(d) != Some(v) {
            // On a timeout, say which way the push went (not decided, not
            // pushed, ignored by the proxy, or the proxy dropped).
            assert!(
                Instant::now() < end,
                "timed out waiting for the push of document {d} version {v}: cached {:?}, \
                 pusher {}, proxies {}, proxy {}",
                c.cached_version(d),
                push_stats(&w.pusher),
                w.pusher.proxies(),
                cache.stats_json()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(get(&w, px, d), (v, "hit".to_string()));
    }
    assert_eq!(cache.stats.pushed_hits.load(Ordering::Relaxed), 3);
    assert_eq!(w.pusher.stats.stored.load(Ordering::Relaxed), 3);
    if rdma {
        assert!(w.pusher.stats.state_rdma.load(Ordering::Relaxed) >= 3);
        assert_eq!(w.pusher.stats.state_tcp.load(Ordering::Relaxed), 0);
    } else {
        assert!(w.pusher.stats.state_tcp.load(Ordering::Relaxed) >= 3);
    }
    // Under updates at 100/s with pushes racing requests: never stale,
    // never a body of another version.
    let cfg2 = UpdaterCfg {
        count: Some(150),
        ..cfg.clone()
    };
    let h = std::thread::spawn(move || appd::run_updater(cfg2));
    let mut n = 0;
    while !h.is_finished() {
        get(&w, px, n % DOCS);
        n += 1;
    }
    h.join().unwrap().unwrap();
    assert!(n > 100, "only {n} requests ran during the updates");
    let stored = cache.stats.pushes_stored.load(Ordering::Relaxed);
    assert!(stored > 10, "only {stored} pushes stored under load");
    (w, proxy)
}

/// The cache state region read by RDMA Read with the deployment's access
/// token (issue 26 item 4): every state read of the pushes above went by
/// RDMA (a refused Request would have fallen back to the channel:
/// `state_tcp`), and the same listener refuses a reader that knows the
/// region's address and STag but not the token, before any QP exists.
#[test]
fn push_with_state_read_by_rdma() {
    let token = Token::generate().unwrap();
    let (w, proxy) = push_end_to_end(true, "rdma", Some(token.clone()));
    let rdma_reads = w.pusher.stats.state_rdma.load(Ordering::Relaxed);
    let accepted = proxy.state_stats.accepted.load(Ordering::Relaxed);
    assert!(
        accepted >= 1,
        "the pusher's state reads were not RDMA connections: {}",
        push_stats(&w.pusher)
    );
    assert_eq!(proxy.state_stats.denied.load(Ordering::Relaxed), 0);
    let at = proxy.reg.rdma.unwrap();
    for (who, t) in [
        ("no token", None),
        ("another token", Some(Token::generate().unwrap())),
    ] {
        match RdmaStateReader::new(at, proxy.reg, T).with_token(t).read() {
            Err(e) => assert!(e.contains("access denied"), "{who}: {e}"),
            Ok(s) => panic!(
                "a reader with {who} read the state region ({} entries): the token is not checked",
                s.entries.len()
            ),
        }
    }
    assert_eq!(proxy.state_stats.denied.load(Ordering::Relaxed), 2);
    // The pusher's token still reads it.
    let snap = RdmaStateReader::new(at, proxy.reg, T)
        .with_token(Some(token))
        .read()
        .unwrap();
    assert!(snap.entries.iter().any(|e| e.doc == 3), "{snap:?}");
    assert!(rdma_reads >= 3);
}

#[test]
fn push_with_state_read_over_the_channel() {
    push_end_to_end(false, "tcp", None);
}

#[test]
fn pull_never_pushes() {
    let w = start("pull", Policy::Pull, StateRead::Tcp);
    let (px, cache) = start_proxy(&w, false);
    get(&w, px, 2);
    let (mut s, cfg) = updater(&w);
    let v = appd::update_once(&mut s, &cfg, 2).unwrap();
    let p = w.pusher.clone();
    wait_until("the update seen by the pusher", || {
        p.stats.updates.load(Ordering::Relaxed) >= 1
    });
    assert_eq!(cache.cached_version(2), Some(v - 1), "pull pushed");
    assert_eq!(get(&w, px, 2), (v, "miss".to_string()));
    assert_eq!(cache.stats.misses_stale.load(Ordering::Relaxed), 1);
    assert_eq!(cache.stats.pushes.load(Ordering::Relaxed), 0);
}

#[test]
fn hybrid_pushes_only_the_hot() {
    let w = start("hybrid", Policy::Hybrid { percent: 10 }, StateRead::Tcp);
    let (px, cache) = start_proxy(&w, false);
    // Access 9 .. 0, so 0 is the most recent; a tenth of 10 is the first.
    for d in (0..DOCS).rev() {
        get(&w, px, d);
        std::thread::sleep(Duration::from_millis(2));
    }
    cache.publish(); // (the publisher thread may be late on a loaded host)
    let (mut s, cfg) = updater(&w);
    let v9 = appd::update_once(&mut s, &cfg, 9).unwrap();
    let v0 = appd::update_once(&mut s, &cfg, 0).unwrap();
    let c = cache.clone();
    wait_until("the push of the hot document", || {
        c.cached_version(0) == Some(v0)
    });
    // Wait for both decisions, not for `updates`: the push thread counts
    // an update when it takes it, before it reads the state and decides;
    // it takes the lower document first when both are pending, so doc 9
    // may still be undecided after doc 0's push (seen under load).
    let p = w.pusher.clone();
    wait_until("both updates decided", || {
        p.stats.skipped.load(Ordering::Relaxed) + p.stats.sent.load(Ordering::Relaxed) >= 2
    });
    assert_eq!(
        cache.cached_version(9),
        Some(v9 - 1),
        "a cold document was pushed"
    );
    assert_eq!(w.pusher.stats.skipped.load(Ordering::Relaxed), 1);
    assert_eq!(w.pusher.stats.sent.load(Ordering::Relaxed), 1);
}

#[test]
fn update_server_picks_accessed_documents() {
    let w = start("pick", Policy::Pull, StateRead::Tcp);
    let mut s = UnixStream::connect(&w.ipc).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    // No proxy: nothing to pick from.
    assert_eq!(appd::pick_accessed(&mut s, 1).unwrap(), None);
    let (px, cache) = start_proxy(&w, false);
    assert_eq!(
        appd::pick_accessed(&mut s, 1).unwrap(),
        None,
        "nothing accessed yet"
    );
    get(&w, px, 4);
    get(&w, px, 6);
    cache.publish();
    let mut seen = std::collections::BTreeSet::new();
    for r in 0..20 {
        seen.insert(appd::pick_accessed(&mut s, r).unwrap().unwrap());
    }
    assert_eq!(seen, [4, 6].into());
    // The update thread with `accessed` updates only those.
    let (_, cfg) = updater(&w);
    let before: Vec<u64> = (0..DOCS)
        .map(|d| w.table.get(d).unwrap().unwrap())
        .collect();
    appd::run_updater(UpdaterCfg {
        count: Some(10),
        select: Select::Accessed,
        rate: 1000.0,
        ..cfg
    })
    .unwrap();
    let after: Vec<u64> = (0..DOCS)
        .map(|d| w.table.get(d).unwrap().unwrap())
        .collect();
    let changed: Vec<u32> = (0..DOCS)
        .filter(|&d| after[d as usize] != before[d as usize])
        .collect();
    assert!(!changed.is_empty());
    assert!(
        changed.iter().all(|d| [4, 6].contains(d)),
        "updated {changed:?}"
    );
    let total: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert_eq!(total, 10);
}

fn agent_cfg(retry: Duration) -> push::AgentCfg {
    push::AgentCfg {
        timeout: T,
        retry,
        token: None,
        max_doc: ccache_proto::push::MAX_BODY,
    }
}

/// A fake ccappd push listener: the proxy's agent registers with it.
struct Fake {
    l: TcpListener,
    cache: Arc<CacheState>,
}

impl Fake {
    fn new() -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let cache = Arc::new(CacheState::new(0, 16));
        let reg = Registration {
            rdma: None,
            addr: 0,
            rkey: 0,
            len: cache.region_len() as u32,
        };
        let (c, a) = (cache.clone(), l.local_addr().unwrap());
        std::thread::spawn(move || {
            push::run_agent(a, reg, c, agent_cfg(Duration::from_millis(20)))
        });
        Fake { l, cache }
    }

    /// Accept the agent's next registration (bounded).
    fn accept(&self) -> TcpStream {
        self.l.set_nonblocking(true).unwrap();
        let end = Instant::now() + T;
        let mut s = loop {
            match self.l.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("the proxy did not register: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let (h, b) = read_frame(&mut s, false).unwrap();
        assert_eq!(h.kind, Kind::Register);
        assert!(Registration::parse(&b).is_ok());
        write_frame(&mut s, Header::new(Kind::Registered, 0), &[]).unwrap();
        s
    }
}

fn push_frame(doc: u32, version: u64) -> Header {
    Header {
        version,
        ..Header::new(Kind::Push, doc)
    }
}

#[test]
fn push_for_an_unknown_document_and_older_pushes_are_ignored() {
    let f = Fake::new();
    let mut s = f.accept();
    let ack = |s: &mut TcpStream, doc, v, body: &[u8]| {
        write_frame(s, push_frame(doc, v), body).unwrap();
        let (h, _) = read_frame(s, false).unwrap();
        assert_eq!((h.kind, h.doc), (Kind::PushAck, doc));
        PushStatus::from(h.status)
    };
    assert_eq!(ack(&mut s, 5, 9, b"x"), PushStatus::NotCached);
    assert_eq!(
        f.cache.cached_version(5),
        None,
        "an unknown document was cached"
    );
    f.cache
        .store_fetched(5, 10, None, Arc::new(b"v10".to_vec()));
    assert_eq!(ack(&mut s, 5, 9, b"v9"), PushStatus::NotNewer);
    assert_eq!(ack(&mut s, 5, 10, b"v10'"), PushStatus::NotNewer);
    assert_eq!(f.cache.lookup(5, 10).unwrap().0.as_slice(), b"v10");
    assert_eq!(ack(&mut s, 5, 11, b"v11"), PushStatus::Stored);
    assert_eq!(f.cache.lookup(5, 11).unwrap().0.as_slice(), b"v11");
    // The state over the channel lists it.
    f.cache.publish();
    write_frame(&mut s, Header::new(Kind::StateRequest, 0), &[]).unwrap();
    let (h, b) = read_frame(&mut s, false).unwrap();
    assert_eq!(h.kind, Kind::StateReply);
    let snap = Snapshot::parse(&b).unwrap();
    let listed: Vec<(u32, u64)> = snap.entries.iter().map(|e| (e.doc, e.version)).collect();
    assert_eq!(listed, vec![(5, 11)]);
}

#[test]
fn malformed_push_closes_the_channel_and_stores_nothing() {
    let f = Fake::new();
    f.cache.store_fetched(1, 1, None, Arc::new(b"v1".to_vec()));
    let mut s = f.accept();
    // Wrong magic.
    let mut bad = push_frame(1, 2).emit();
    bad[0] = b'X';
    s.write_all(&bad).unwrap();
    s.write_all(b"v2").unwrap();
    let (h, _) = read_frame(&mut s, false).unwrap();
    assert_eq!(
        (h.kind, PushStatus::from(h.status)),
        (Kind::Error, PushStatus::Malformed)
    );
    // An oversized body.
    let mut s = f.accept();
    let mut big = push_frame(1, 2).emit();
    big[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&big).unwrap();
    let (h, _) = read_frame(&mut s, false).unwrap();
    assert_eq!(h.kind, Kind::Error);
    // A frame the proxy does not take (REGISTERED again).
    let mut s = f.accept();
    write_frame(&mut s, Header::new(Kind::Registered, 0), &[]).unwrap();
    let (h, _) = read_frame(&mut s, false).unwrap();
    assert_eq!(h.kind, Kind::Error);
    assert_eq!(f.cache.cached_version(1), Some(1));
    assert_eq!(f.cache.lookup(1, 1).unwrap().0.as_slice(), b"v1");
    // And it registers again and takes good pushes.
    let mut s = f.accept();
    write_frame(&mut s, push_frame(1, 2), b"v2").unwrap();
    let (h, _) = read_frame(&mut s, false).unwrap();
    assert_eq!(PushStatus::from(h.status), PushStatus::Stored);
}

#[test]
fn ccappd_killed_during_a_push_stores_nothing() {
    let f = Fake::new();
    f.cache.store_fetched(1, 1, None, Arc::new(b"v1".to_vec()));
    let mut s = f.accept();
    // Half a PUSH, then the connection dies.
    let mut h = push_frame(1, 2);
    h.body_len = 100;
    s.write_all(&h.emit()).unwrap();
    s.write_all(&[b'x'; 50]).unwrap();
    drop(s);
    // The agent comes back; nothing of the half push was stored.
    let mut s = f.accept();
    assert_eq!(f.cache.cached_version(1), Some(1));
    assert_eq!(f.cache.stats.pushes.load(Ordering::Relaxed), 0);
    write_frame(&mut s, push_frame(1, 3), b"v3").unwrap();
    let (h, _) = read_frame(&mut s, false).unwrap();
    assert_eq!(PushStatus::from(h.status), PushStatus::Stored);
    assert_eq!(f.cache.lookup(1, 3).unwrap().0.as_slice(), b"v3");
}

#[test]
fn pusher_refuses_a_bad_registration_and_forgets_a_dead_proxy() {
    let w = start("reg", Policy::Push, StateRead::Tcp);
    let mut s = TcpStream::connect(w.push_addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write_frame(&mut s, Header::new(Kind::Register, 0), &[0u8; 10]).unwrap();
    let (h, _) = read_frame(&mut s, false).unwrap();
    assert_eq!(h.kind, Kind::Error);
    assert_eq!(w.pusher.proxies(), 0);
    // A registration whose region length could not be a state region
    // (here 4 GiB - 1: the pusher would allocate it for its Reads).
    for len in [u32::MAX, 3] {
        let mut s = TcpStream::connect(w.push_addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let r = Registration {
            rdma: None,
            addr: 0,
            rkey: 0,
            len,
        };
        write_frame(&mut s, Header::new(Kind::Register, 0), &r.emit()).unwrap();
        let (h, _) = read_frame(&mut s, false).unwrap();
        assert_eq!(h.kind, Kind::Error, "len {len}");
    }
    assert_eq!(w.pusher.proxies(), 0);
    // A proxy that registers and then dies: the next push drops it, and
    // updates go on.
    let reg = Registration {
        rdma: None,
        addr: 0,
        rkey: 0,
        len: 100,
    };
    let s = push::register(w.push_addr, &reg, T).unwrap();
    let p = w.pusher.clone();
    wait_until("registration", || p.proxies() == 1);
    drop(s);
    let (mut u, cfg) = updater(&w);
    appd::update_once(&mut u, &cfg, 1).unwrap();
    wait_until("the dead proxy dropped", || p.proxies() == 0);
    assert_eq!(w.pusher.stats.dropped.load(Ordering::Relaxed), 1);
    appd::update_once(&mut u, &cfg, 1).unwrap();
}

#[test]
fn rdma_reads_of_the_state_region_during_publishes_are_consistent() {
    // The writer keeps every listed document at one version and bumps
    // them all before each publish; a snapshot mixing two publishes would
    // list two versions. 2000 RDMA Reads race the publishes.
    let cache = Arc::new(CacheState::new(0, 48));
    for d in 0..48 {
        cache.store_fetched(d, 1, None, Arc::new(vec![0; 10]));
    }
    cache.publish();
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let len = cache.region_len();
    let mr = pd
        .reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let reg = Registration {
        rdma: None,
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: len as u32,
    };
    cache.attach_region(mr);
    let mpa = MpaConfig {
        crc: Crc::Off,
        ..MpaConfig::default()
    };
    let l = Endpoint::bind(&ctx, "127.0.0.1:0".parse().unwrap(), mpa).unwrap();
    let at = l.local_addr().unwrap();
    let cfg = ListenCfg::new("cache state", LABEL_STATE_REGION, Vec::new());
    std::thread::spawn(move || listen::serve(l, pd, cq, cfg, Default::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c, st) = (cache.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let mut v = 1u64;
        while !st.load(Ordering::Relaxed) {
            v += 1;
            for d in 0..48 {
                c.store_fetched(d, v, None, Arc::new(vec![0; 10]));
                if v.is_multiple_of(3) {
                    c.lookup(d, v); // reorder the list now and then
                }
            }
            c.publish();
            // Far more often than ccproxy's 10 ms, but not back to back
            // (a Read that overlaps every publish would be retried away).
            std::thread::sleep(Duration::from_micros(200));
        }
        v
    });
    let mut r = RdmaStateReader::new(at, reg, T);
    let mut last = 0;
    for _ in 0..2000 {
        let s = r.read().expect("a consistent snapshot");
        assert_eq!(s.entries.len(), 48);
        let v = s.entries[0].version;
        assert!(
            s.entries.iter().all(|e| e.version == v),
            "a snapshot mixes publishes: {:?}",
            s.entries.iter().map(|e| e.version).collect::<Vec<_>>()
        );
        assert!(s.generation >= last, "generation went back");
        last = s.generation;
    }
    stop.store(true, Ordering::Relaxed);
    let published = writer.join().unwrap();
    assert!(
        published > 10,
        "the writer published only {published} times"
    );
    drop(ctx);
}
