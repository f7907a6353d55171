//! Documents sharded over application servers.
//!
//! Each shard is one application server (its HTTP backend) and its
//! application module (ccappd: RDMA, TCP and sockets version addresses).
//! A document lives on exactly one shard: the one an explicit `doc` line
//! names, or else shard `doc % shards`. ccproxy keeps one [`Proxy`] per
//! shard (its own cache, checkers and backend) and a [`Sharded`] front
//! sends each request to its document's shard; other paths go to shard 0.
//!
//! The shard map is a file (`ccproxy --shards FILE`), for real hosts or the
//! namespaces of `scripts/bench-cache.sh`:
//!
//! ```text
//! # shard N key=value...   (backend is required; the others per mode)
//! shard 0 backend=10.78.0.20:80 rdma=10.78.0.20:7471 tcp=10.78.0.20:7472 sockets=10.78.0.20:7473
//! shard 1 backend=10.78.0.21:80 rdma=10.78.0.21:7471 tcp=10.78.0.21:7472 sockets=10.78.0.21:7473
//! doc 7 1                  # document 7 lives on shard 1 (default: 7 % 2)
//! ```
//!
//! Every ccappd may have a table of all documents (slot = document
//! number); a shard only ever gets requests for its own documents.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::proxy::{Proxy, Route};

/// One application server and its module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardAddrs {
    /// The application server (HTTP).
    pub backend: SocketAddr,
    /// ccappd `--rdma-listen`.
    pub rdma: Option<SocketAddr>,
    /// ccappd `--version-listen`.
    pub tcp: Option<SocketAddr>,
    /// ccappd `--sockets-listen`.
    pub sockets: Option<SocketAddr>,
}

/// The shard map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardMap {
    /// Shards, by number.
    pub shards: Vec<ShardAddrs>,
    /// Explicit placements.
    pub docs: HashMap<u32, usize>,
}

impl ShardMap {
    /// Parse the file format above. Errors name the line and the fix.
    pub fn parse(text: &str) -> Result<ShardMap, String> {
        let mut shards: Vec<Option<ShardAddrs>> = Vec::new();
        let mut docs = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut w = line.split_whitespace();
            match w.next() {
                Some("shard") => {
                    let k: usize = w
                        .next()
                        .and_then(|x| x.parse().ok())
                        .filter(|&k| k < 4096)
                        .ok_or(format!(
                            "line {n}: `shard` needs a number below 4096: {raw:?}"
                        ))?;
                    let (mut backend, mut rdma, mut tcp, mut sockets) = (None, None, None, None);
                    for kv in w {
                        let (key, val) = kv.split_once('=').ok_or(format!(
                            "line {n}: {kv:?} is not key=value (keys: backend, rdma, tcp, sockets)"
                        ))?;
                        let addr: SocketAddr = val
                            .parse()
                            .map_err(|e| format!("line {n}: {key}={val}: {e} (want IP:PORT)"))?;
                        let slot = match key {
                            "backend" => &mut backend,
                            "rdma" => &mut rdma,
                            "tcp" => &mut tcp,
                            "sockets" => &mut sockets,
                            _ => {
                                return Err(format!(
                                "line {n}: unknown key {key:?} (keys: backend, rdma, tcp, sockets)"
                            ))
                            }
                        };
                        *slot = Some(addr);
                    }
                    let backend = backend.ok_or(format!("line {n}: shard {k} has no backend="))?;
                    if shards.len() <= k {
                        shards.resize(k + 1, None);
                    }
                    if shards[k].is_some() {
                        return Err(format!("line {n}: shard {k} is defined twice"));
                    }
                    shards[k] = Some(ShardAddrs {
                        backend,
                        rdma,
                        tcp,
                        sockets,
                    });
                }
                Some("doc") => {
                    let d: u32 = w
                        .next()
                        .and_then(|x| x.parse().ok())
                        .ok_or(format!("line {n}: `doc` needs a document number: {raw:?}"))?;
                    let k: usize = w
                        .next()
                        .and_then(|x| x.parse().ok())
                        .ok_or(format!("line {n}: `doc {d}` needs a shard number"))?;
                    if w.next().is_some() {
                        return Err(format!("line {n}: extra words after `doc {d} {k}`"));
                    }
                    if docs.insert(d, k).is_some() {
                        return Err(format!("line {n}: document {d} is placed twice"));
                    }
                }
                Some(other) => {
                    return Err(format!(
                        "line {n}: unknown directive {other:?} (want `shard` or `doc`)"
                    ))
                }
                None => {}
            }
        }
        let shards: Vec<ShardAddrs> = shards
            .into_iter()
            .enumerate()
            .map(|(k, s)| s.ok_or(format!("shard {k} is missing (shards are numbered 0..N)")))
            .collect::<Result<_, _>>()?;
        if shards.is_empty() {
            return Err("no `shard` line: the map needs at least one application server".into());
        }
        if let Some((d, k)) = docs.iter().find(|(_, &k)| k >= shards.len()) {
            return Err(format!(
                "document {d} is placed on shard {k}, but only {} shards are defined",
                shards.len()
            ));
        }
        Ok(ShardMap { shards, docs })
    }

    /// The shard of document `doc`.
    pub fn shard_of(&self, doc: u32) -> usize {
        self.docs
            .get(&doc)
            .copied()
            .unwrap_or(doc as usize % self.shards.len())
    }
}

/// The front of a sharded proxy.
#[derive(Debug)]
pub struct Sharded {
    map: ShardMap,
    proxies: Vec<Proxy>,
}

impl Sharded {
    /// One proxy per shard, in the map's order.
    pub fn new(map: ShardMap, proxies: Vec<Proxy>) -> Sharded {
        assert_eq!(map.shards.len(), proxies.len(), "a proxy per shard");
        Sharded { map, proxies }
    }
}

impl Route for Sharded {
    /// A request goes to its document's shard (other paths: shard 0).
    fn route(&self, target: &str) -> &Proxy {
        let k = self.proxies[0]
            .doc_of_target(target)
            .map_or(0, |d| self.map.shard_of(d));
        &self.proxies[k]
    }

    fn idle(&self) -> Duration {
        self.proxies[0].idle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_map() {
        let m = ShardMap::parse(
            "# two application servers\n\
             shard 1 backend=10.0.0.2:80 tcp=10.0.0.2:7472\n\
             shard 0 backend=10.0.0.1:80 rdma=10.0.0.1:7471 sockets=10.0.0.1:7473  # first\n\
             \n\
             doc 7 0\n",
        )
        .unwrap();
        assert_eq!(m.shards.len(), 2);
        assert_eq!(m.shards[0].backend, "10.0.0.1:80".parse().unwrap());
        assert_eq!(m.shards[0].rdma, Some("10.0.0.1:7471".parse().unwrap()));
        assert_eq!(m.shards[0].tcp, None);
        assert_eq!(m.shards[1].tcp, Some("10.0.0.2:7472".parse().unwrap()));
        assert_eq!(m.shard_of(7), 0);
        assert_eq!(m.shard_of(5), 1);
        assert_eq!(m.shard_of(4), 0);
    }

    #[test]
    fn refuses_bad_maps() {
        for (text, want) in [
            ("", "no `shard` line"),
            ("shard x backend=1.2.3.4:5", "needs a number"),
            ("shard 0 rdma=1.2.3.4:5", "has no backend"),
            ("shard 0 backend=1.2.3.4", "want IP:PORT"),
            ("shard 0 backend=1.2.3.4:5 color=1.2.3.4:5", "unknown key"),
            ("shard 0 backend=1.2.3.4:5 rdma", "not key=value"),
            (
                "shard 0 backend=1.2.3.4:5\nshard 0 backend=1.2.3.4:6",
                "defined twice",
            ),
            ("shard 1 backend=1.2.3.4:5", "shard 0 is missing"),
            ("shard 0 backend=1.2.3.4:5\ndoc 3 1", "only 1 shards"),
            ("shard 0 backend=1.2.3.4:5\ndoc 3", "needs a shard"),
            ("shard 0 backend=1.2.3.4:5\ndoc 3 0 0", "extra words"),
            (
                "shard 0 backend=1.2.3.4:5\ndoc 3 0\ndoc 3 0",
                "placed twice",
            ),
            ("proxy 0", "unknown directive"),
        ] {
            let e = ShardMap::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
