//! The listening loop: one thread per control connection, admitted
//! against the connection limits (in all and per address).

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::ServerConfig;
use super::session::Session;
use super::state::{lock, Failures, MemUse, Server};
use crate::confine;

/// Serve forever on `listener` (bound by the caller to `cfg.listen`).
pub fn serve(listener: TcpListener, cfg: ServerConfig) -> io::Result<()> {
    let root = cfg
        .root
        .canonicalize()
        .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", cfg.root.display())))?;
    let confined = confine::Root::open(&root)
        .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", root.display())))?;
    tracing::info!(mode = ?confined.mode(), "paths are confined beneath the root by the kernel");
    let hashes = cfg
        .offered_hashes()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let srv = Arc::new(Server {
        hashes,
        cfg,
        root,
        conns: AtomicUsize::new(0),
        per_ip: Mutex::new(HashMap::new()),
        fails: Mutex::new(Failures::default()),
        session_mem: Mutex::new(MemUse::default()),
        confined,
    });
    tracing::info!(addr = %listener.local_addr()?, root = %srv.root.display(), "rftpd listening");
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let srv = srv.clone();
        let spawned = std::thread::Builder::new()
            .name("rftpd-session".into())
            .spawn(move || srv.admit(stream));
        if let Err(e) = spawned {
            tracing::error!(%e, "could not start a session thread");
        }
    }
    Ok(())
}

impl Server {
    pub(super) fn admit(self: &Arc<Self>, mut stream: TcpStream) {
        let Ok(peer) = stream.peer_addr() else { return };
        // A dual-stack listener shows IPv4 clients as ::ffff:a.b.c.d: count
        // them by their IPv4 address.
        let ip = peer.ip().to_canonical();
        let total = self.conns.fetch_add(1, Ordering::AcqRel) + 1;
        let mine = {
            let mut m = lock(&self.per_ip);
            let c = m.entry(ip).or_insert(0);
            *c += 1;
            *c
        };
        if total > self.cfg.max_connections || mine > self.cfg.max_per_ip {
            tracing::warn!(%peer, total, mine, "connection limit reached");
            let _ = stream.write_all(b"421 Too many connections; try again later.\r\n");
        } else {
            tracing::info!(%peer, "session start");
            let peer = SocketAddr::new(ip, peer.port());
            match Session::new(self.clone(), stream, peer) {
                Ok(mut s) => {
                    if let Err(e) = s.run() {
                        tracing::info!(%peer, %e, "session ended");
                    }
                }
                Err(e) => tracing::warn!(%peer, %e, "session setup failed"),
            }
        }
        self.conns.fetch_sub(1, Ordering::AcqRel);
        let mut m = lock(&self.per_ip);
        if let Some(c) = m.get_mut(&ip) {
            *c -= 1;
            if *c == 0 {
                m.remove(&ip);
            }
        }
    }
}
