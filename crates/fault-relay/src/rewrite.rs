//! Address rewriting (an ALG): a peer's announcement of a second
//! connection (mod_rdma's `RDMA:` header, FTP's 227/229 replies) is
//! rewritten to a relay listener of its own, so that connection runs
//! through the relay too, as one more mapping.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::{Alg, Config};

/// How a new relay listener is served: the relay loop's `serve_counted`,
/// handed in by the loop so that this module does not import the loop
/// that uses it.
pub(crate) type ServeFn =
    fn(TcpListener, SocketAddr, usize, Arc<Config>, Arc<AtomicUsize>) -> JoinHandle<()>;

/// What a [`Rewriter`] rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rewrite {
    /// `RDMA: scheme, ip=A, port=P, ...` request headers (mod_rdma): the
    /// server connects back to A:P. The IP is kept (the server allows only
    /// the client's address), so the relay listener binds on A.
    RdmaHeader,
    /// `229 ... (|||P|)` and `227 ... (h1,h2,h3,h4,p1,p2)` replies (FTP
    /// passive mode): the client connects to P on the server. The relay
    /// listener binds on the address the client reached the relay at.
    FtpPassive,
}

/// Rewrites the addresses of [`Alg`] in one direction of a connection.
///
/// Only lines that start with the prefix (`RDMA:`, `229 `, `227 `) are
/// touched; bytes of such a line are held back until its end arrives (the
/// sender always completes the line, so nothing waits for ever). A body
/// that happens to hold such a line would be rewritten too.
pub(crate) struct Rewriter {
    what: Rewrite,
    pub(crate) alg: Alg,
    cfg: Arc<Config>,
    /// The relay's own address on the client side (FTP: where to listen).
    local: std::net::IpAddr,
    /// The target's address (FTP: where EPSV ports are).
    server: std::net::IpAddr,
    /// Announced address -> relay listener port.
    ports: std::collections::HashMap<SocketAddr, u16>,
    /// The previous byte ended a line.
    line_start: bool,
    /// An incomplete line that starts (or may start) with a prefix.
    pub(crate) held: Vec<u8>,
    /// Serves the listeners made for second connections.
    serve: ServeFn,
}

impl Rewriter {
    pub(crate) fn new(
        what: Rewrite,
        alg: Alg,
        cfg: Arc<Config>,
        local: std::net::IpAddr,
        server: std::net::IpAddr,
        serve: ServeFn,
    ) -> Rewriter {
        Rewriter {
            what,
            alg,
            cfg,
            local,
            server,
            serve,
            ports: Default::default(),
            line_start: true,
            held: Vec::new(),
        }
    }

    pub(crate) fn prefixes(&self) -> &'static [&'static [u8]] {
        match self.what {
            Rewrite::RdmaHeader => &[b"RDMA:"],
            Rewrite::FtpPassive => &[b"229 ", b"227 "],
        }
    }

    /// The bytes to forward for `data`, rewritten; some may be held back.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(data);
        let mut out = Vec::with_capacity(buf.len() + 8);
        let mut i = 0;
        while i < buf.len() {
            if self.line_start {
                let rest = &buf[i..];
                let mut whole = false;
                let mut partial = false;
                for p in self.prefixes() {
                    let n = rest.len().min(p.len());
                    if rest[..n].eq_ignore_ascii_case(&p[..n]) {
                        whole |= n == p.len();
                        partial = true;
                    }
                }
                if partial {
                    match rest.iter().position(|&b| b == b'\n') {
                        Some(e) => {
                            let line = &rest[..=e];
                            if whole {
                                let l = self.rewrite(line);
                                out.extend_from_slice(&l);
                            } else {
                                out.extend_from_slice(line);
                            }
                            i += e + 1;
                            continue;
                        }
                        None if rest.len() <= 4096 => {
                            self.held = rest.to_vec();
                            return out;
                        }
                        None => {}
                    }
                }
            }
            // Forward up to and including the next line end.
            match buf[i..].iter().position(|&b| b == b'\n') {
                Some(e) => {
                    out.extend_from_slice(&buf[i..=i + e]);
                    i += e + 1;
                    self.line_start = true;
                }
                None => {
                    out.extend_from_slice(&buf[i..]);
                    self.line_start = false;
                    break;
                }
            }
        }
        out
    }

    /// A relay listener on `bind` forwarding to `target` (one per target).
    pub(crate) fn listener(&mut self, bind: std::net::IpAddr, target: SocketAddr) -> Option<u16> {
        if let Some(&o) = self.ports.get(&target) {
            return Some(o);
        }
        match TcpListener::bind(SocketAddr::new(bind, 0))
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
        {
            Ok((o, l)) => {
                tracing::info!(%target, relay_port = o, map = self.alg.map, what = ?self.what, "second connection relayed");
                (self.serve)(
                    l,
                    target,
                    self.alg.map,
                    self.cfg.clone(),
                    self.alg.count.clone(),
                );
                self.ports.insert(target, o);
                Some(o)
            }
            Err(e) => {
                tracing::warn!(%target, %e, "cannot relay the second connection; line left alone");
                None
            }
        }
    }

    pub(crate) fn rewrite(&mut self, line: &[u8]) -> Vec<u8> {
        let Ok(text) = std::str::from_utf8(line) else {
            return line.to_vec();
        };
        let new = match self.what {
            Rewrite::RdmaHeader => self.rewrite_rdma(text),
            Rewrite::FtpPassive => self.rewrite_ftp(text),
        };
        new.map_or_else(|| line.to_vec(), String::into_bytes)
    }

    /// `RDMA: scheme, ip=A, port=P, ...` with P replaced by the port of a
    /// relay listener on A that forwards to A:P.
    pub(crate) fn rewrite_rdma(&mut self, text: &str) -> Option<String> {
        let param = |k: &str| {
            text.split([',', ':'])
                .map(str::trim)
                .find_map(|p| p.strip_prefix(k))
                .map(|v| v.trim_end_matches(['\r', '\n']).to_string())
        };
        let (ip, port) = (param("ip=")?, param("port=")?);
        let ip: std::net::IpAddr = ip.parse().ok()?;
        let p: u16 = port.parse().ok()?;
        let ours = self.listener(ip, SocketAddr::new(ip, p))?;
        Some(text.replacen(&format!("port={port}"), &format!("port={ours}"), 1))
    }

    /// `229 Entering Extended Passive Mode (|||P|)` or `227 Entering
    /// Passive Mode (h1,h2,h3,h4,p1,p2)`: P on the server becomes a relay
    /// listener's port (and, for 227, the address the relay's).
    pub(crate) fn rewrite_ftp(&mut self, text: &str) -> Option<String> {
        let open = text.find('(')?;
        let close = open + text[open..].find(')')?;
        let inner = &text[open + 1..close];
        let server = self.server;
        let repl = if let Some(p) = inner.strip_prefix("|||").and_then(|r| r.strip_suffix('|')) {
            let p: u16 = p.parse().ok()?;
            let ours = self.listener(self.local, SocketAddr::new(server, p))?;
            format!("|||{ours}|")
        } else {
            let n: Vec<u16> = inner
                .split(',')
                .map(|x| x.trim().parse().ok())
                .collect::<Option<_>>()?;
            if n.len() != 6 || n.iter().any(|&x| x > 255) {
                return None;
            }
            let ip = std::net::Ipv4Addr::new(n[0] as u8, n[1] as u8, n[2] as u8, n[3] as u8);
            let ours = self.listener(self.local, SocketAddr::new(ip.into(), n[4] * 256 + n[5]))?;
            let std::net::IpAddr::V4(me) = self.local else {
                return None;
            };
            let o = me.octets();
            format!(
                "{},{},{},{},{},{}",
                o[0],
                o[1],
                o[2],
                o[3],
                ours / 256,
                ours % 256
            )
        };
        Some(format!("{}({repl}){}", &text[..open], &text[close + 1..]))
    }
}
