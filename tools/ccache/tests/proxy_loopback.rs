//! ccproxy end to end in one process, without Apache: the module's servers,
//! a small backend that serves files inside the Table 1 read protocol (as
//! mod_ccache does), the update thread at 100 updates/s, and the proxy in
//! rdma and tcp mode. Every response must carry a version at least as new
//! as the one published before the request was sent, and be exactly that
//! version's document.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ccache::appd::{self, IpcState, UpdaterCfg};
use ccache::check::{RdmaCheck, TcpCheck, VersionCheck};
use ccache::http;
use ccache::msgio::{read_msg, write_msg};
use ccache::proxy::{self, Mode, Proxy, ProxyCfg};
use ccache::table::VersionTable;
use ccache_proto::ipc::{Kind, Repr};
use iwarp::cm::{Listener, MpaConfig, Policy};
use iwarp::Context;

const T: Duration = Duration::from_secs(5);
const DOCS: u32 = 4;
const SIZE: usize = 300;

struct World {
    table: Arc<VersionTable>,
    rdma: SocketAddr,
    tcp: SocketAddr,
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
    let rl = Listener::bind("127.0.0.1:0".parse().unwrap(), mpa).unwrap();
    let rdma = rl.local_addr();
    let t = table.clone();
    std::thread::spawn(move || appd::serve_rdma(rl, pd, cq, t));
    let vl = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = vl.local_addr().unwrap();
    let t = table.clone();
    std::thread::spawn(move || appd::serve_versions(vl, t, T));
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
        backend,
        dir,
    }
}

fn start_proxy(w: &World, mode: Mode) -> SocketAddr {
    let checkers: Vec<Box<dyn VersionCheck>> = (0..2)
        .map(|_| match mode {
            Mode::Rdma => Box::new(RdmaCheck::new(w.rdma, T)) as Box<dyn VersionCheck>,
            _ => Box::new(TcpCheck::new(w.tcp, T)) as Box<dyn VersionCheck>,
        })
        .collect();
    let cfg = ProxyCfg {
        backend: w.backend,
        prefix: "/docs/".into(),
        mode,
        backend_timeout: T,
        idle: T,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let p = Arc::new(Proxy::new(cfg, checkers));
    std::thread::spawn(move || proxy::serve(l, p, 16));
    addr
}

fn coherent(mode: Mode, tag: &str) {
    let w = start(tag);
    let px = start_proxy(&w, mode);
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
    coherent(Mode::Rdma, "rdma");
}

#[test]
fn tcp_mode_is_coherent_under_updates() {
    coherent(Mode::Tcp, "tcp");
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
        table: w.table.clone(),
        backend: w.backend,
        dir: w.dir.join("unused"),
    };
    for mode in [Mode::Rdma, Mode::Tcp] {
        let px = start_proxy(&dead, mode);
        let r = http::fetch(px, "/docs/1", T).unwrap();
        assert_eq!(r.status, 502);
        assert!(r.header("x-cc-version").is_none());
    }
}
