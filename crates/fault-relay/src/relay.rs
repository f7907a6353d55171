//! The relay loop: accept on each mapping, connect to its target, and
//! start a reader and a writer per direction.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::config::Config;
use crate::conn::{reader, Conn, CHUNK, TICK};
use crate::rewrite::{Rewrite, Rewriter};
use crate::spec::Dir;
use crate::writer::{Fault, Writer};

/// Relay one accepted connection (the `n`th on mapping `map`) to `target`.
pub(crate) fn relay(
    client: TcpStream,
    target: SocketAddr,
    map: usize,
    n: usize,
    cfg: &Arc<Config>,
) -> io::Result<()> {
    let server = TcpStream::connect_timeout(&target, cfg.connect_timeout)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(TICK))?;
        s.set_write_timeout(Some(TICK))?;
    }
    let conn = Arc::new(Conn {
        id: format!("{map}/{n}"),
        client,
        server,
        dead: AtomicBool::new(false),
        done: AtomicUsize::new(0),
    });
    let start = Instant::now();
    let depth = (cfg.max_inflight / CHUNK).max(1);
    for d in [Dir::Up, Dir::Down] {
        let faults: Vec<Fault> = cfg
            .faults
            .iter()
            .filter(|f| f.dir.covers(d) && f.map.is_none_or(|m| m == map) && f.conn.contains(n))
            .map(|f| Fault {
                spec: f.clone(),
                fired: false,
            })
            .collect();
        let w = Writer {
            conn: conn.clone(),
            d,
            start,
            faults,
            off: 0,
            swallow: false,
            keep_open: false,
            reseg: None,
            signal: cfg.signal.clone(),
            seed: cfg.seed ^ ((n as u64) << 32) ^ ((map as u64) << 48) ^ u64::from(d == Dir::Up),
            alg: cfg.alg.as_ref().filter(|a| a.map != map).and_then(|a| {
                let what = match d {
                    Dir::Up if a.rdma_header => Rewrite::RdmaHeader,
                    Dir::Down if a.ftp_passive => Rewrite::FtpPassive,
                    _ => return None,
                };
                let local = conn.client.local_addr().ok()?.ip();
                Some(Rewriter::new(
                    what,
                    a.clone(),
                    cfg.clone(),
                    local,
                    target.ip(),
                    serve_counted,
                ))
            }),
        };
        let (tx, rx) = sync_channel(depth);
        let c = conn.clone();
        let delay = cfg.delay;
        std::thread::spawn(move || reader(c, d, tx));
        std::thread::spawn(move || w.run(rx, delay));
    }
    Ok(())
}

/// Accept connections on `sock` (mapping number `map`) forever and relay
/// each to `target`.
pub fn serve(
    sock: TcpListener,
    target: SocketAddr,
    map: usize,
    cfg: Arc<Config>,
) -> JoinHandle<()> {
    serve_counted(sock, target, map, cfg, Arc::new(AtomicUsize::new(0)))
}

/// [`serve`], numbering connections with `count` (shared by the
/// listeners of one mapping).
pub(crate) fn serve_counted(
    sock: TcpListener,
    target: SocketAddr,
    map: usize,
    cfg: Arc<Config>,
    count: Arc<AtomicUsize>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for c in sock.incoming() {
            match c {
                Ok(c) => {
                    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                    let peer = c.peer_addr().ok();
                    tracing::debug!(map, conn = n, ?peer, "accepted");
                    if let Err(e) = relay(c, target, map, n, &cfg) {
                        tracing::warn!(?peer, %target, %e, "cannot reach the target");
                    }
                }
                Err(e) => tracing::warn!(%e, "accept failed"),
            }
        }
    })
}

/// Bind every mapping and serve it; returns the bound addresses in order.
pub fn start(maps: &[(SocketAddr, SocketAddr)], cfg: Config) -> io::Result<Vec<SocketAddr>> {
    let cfg = Arc::new(cfg);
    let mut socks = Vec::new();
    for (l, t) in maps {
        let s = TcpListener::bind(l)?;
        socks.push((s.local_addr()?, s, *t));
    }
    let mut addrs = Vec::new();
    for (i, (a, s, t)) in socks.into_iter().enumerate() {
        serve(s, t, i, cfg.clone());
        addrs.push(a);
    }
    Ok(addrs)
}
