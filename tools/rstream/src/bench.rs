//! The test exchange, as rstream runs it, so that either end can be
//! rdma-core's `rstream`:
//!
//! 1. The server listens; both ends print the table header.
//! 2. **Custom test** (any of `-C`, `-I`, `-S N`): one connection, one
//!    test named `custom`. **Sweep** (otherwise): a connection for the
//!    latency tests (one per size, `iters = size_to_count(size)`,
//!    `xfers = 1`), then `rshutdown(SHUT_RDWR)` and close, then a second
//!    connection for the bandwidth tests (`iters = 1`,
//!    `xfers = size_to_count(size)`). The sizes are rstream's table: 64 B,
//!    4 KiB, 64 KiB and 1 MiB by default, all 33 with `-S all`.
//! 3. Each test: a 16-byte sync (client → server, then server → client),
//!    the clock starts, then per iteration the client sends `xfers`
//!    transfers that the server receives, and the server sends `xfers`
//!    back; the clock stops and both ends print the row. With `xfers = 1`
//!    that is a ping-pong.
//! 4. With `-T v` every transfer (the sync included) carries a byte
//!    counter that runs on across tests and connections, one for each
//!    direction (`format_buf` / `verify_buf` of common.c: byte `n` of
//!    everything a process sends is `n mod 256`); the receiver checks it.
//!
//! Where rstream ignores a failed test in the sweep and goes on, we stop
//! and fail: a benchmark that reports a number for a broken transfer is
//! worse than none.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::report::{self, Sample};
use crate::transport::{self, Acceptor, Endpoint, Kind, Mode, Setup};

/// Bytes of the sync message that opens every test.
pub const SYNC_LEN: usize = 16;

/// Which end this process is.
#[derive(Debug, Clone)]
pub enum Role {
    /// `-s ADDR`: connect to the server at this address.
    Client {
        /// The server.
        server: SocketAddr,
        /// `-b`: the local address to bind (TCP only; see the README).
        bind: Option<SocketAddr>,
    },
    /// No `-s`: listen on this address.
    Server {
        /// `-b` (default: any) and `-p`.
        listen: SocketAddr,
    },
}

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// `-C`, `-I` or `-S N`: one test named `custom`.
    Custom {
        /// Bytes per transfer (`-S`, default 1000).
        size: usize,
        /// Transfers per direction and iteration (`-C`, default 1000).
        count: u32,
        /// Iterations (`-I`, default 1).
        iterations: u32,
    },
    /// The latency and bandwidth sweep; `all` is `-S all`.
    Sweep {
        /// Every size of the table, not only the default four.
        all: bool,
    },
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Client or server.
    pub role: Role,
    /// Which tests.
    pub plan: Plan,
    /// The transports, in the order they run each phase: rsockets alone,
    /// TCP alone (`-T s`), or rsockets then TCP (`--tcp`).
    pub kinds: Vec<Kind>,
    /// `-T v`.
    pub verify: bool,
    /// How calls wait.
    pub mode: Mode,
    /// Socket options.
    pub setup: Setup,
    /// Bound on connecting and accepting.
    pub timeout: Duration,
    /// JSON lines instead of the table.
    pub json: bool,
    /// The design's name for the JSON output.
    pub design: &'static str,
}

/// `format_buf` / `verify_buf`: the running byte counter of one direction.
#[derive(Debug, Default, Clone)]
pub struct Pattern {
    next: u8,
    total: u64,
}

impl Pattern {
    /// Fills `buf` with the next bytes of the sequence.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next;
            self.next = self.next.wrapping_add(1);
        }
        // `total` counts checked bytes only; a sender has no use for it.
    }

    /// Checks `buf` against the next bytes of the sequence; on a mismatch
    /// returns the offset of the bad byte in the whole direction's stream.
    pub fn check(&mut self, buf: &[u8]) -> Result<(), u64> {
        for &b in buf {
            if b != self.next {
                return Err(self.total);
            }
            self.next = self.next.wrapping_add(1);
            self.total += 1;
        }
        Ok(())
    }
}

/// The patterns of one transport (rsockets and the TCP baseline each run
/// their own, so the rsockets sequence is exactly rstream's whatever else
/// runs in between).
#[derive(Debug, Default)]
struct Patterns {
    send: Pattern,
    recv: Pattern,
}

/// A run's failure.
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

struct Runner<'a> {
    cfg: &'a Config,
    acceptor: Option<Acceptor>,
    buf: Vec<u8>,
    patterns: [Patterns; 2],
    results: Vec<(Kind, Sample)>,
}

fn idx(k: Kind) -> usize {
    match k {
        Kind::Rsockets => 0,
        Kind::Tcp => 1,
    }
}

impl Runner<'_> {
    fn is_client(&self) -> bool {
        matches!(self.cfg.role, Role::Client { .. })
    }

    fn open(&self, kind: Kind) -> Result<Endpoint, Failure> {
        let ep = match (&self.cfg.role, &self.acceptor) {
            (Role::Client { server, bind }, _) => {
                transport::connect(kind, *server, *bind, &self.cfg.setup, self.cfg.timeout)
                    .map_err(|e| Failure(format!("{} connect to {server}: {e}", kind.name())))?
            }
            (Role::Server { .. }, Some(a)) => a
                .accept(kind, &self.cfg.setup, self.cfg.timeout)
                .map_err(|e| Failure(format!("{} accept: {e}", kind.name())))?,
            (Role::Server { .. }, None) => unreachable!("a server always has its acceptor"),
        };
        ep.apply(&self.cfg.mode)
            .map_err(|e| Failure(format!("setting up the {} socket: {e}", kind.name())))?;
        Ok(ep)
    }

    fn send(&mut self, ep: &Endpoint, size: usize, what: &str) -> Result<(), Failure> {
        let buf = &mut self.buf[..size];
        if self.cfg.verify {
            self.patterns[idx(ep.kind())].send.fill(buf);
        }
        ep.send_all(buf, &self.cfg.mode).map_err(|e| {
            Failure(format!(
                "{} send ({what}, {size} bytes): {e}",
                ep.kind().name()
            ))
        })
    }

    fn recv(&mut self, ep: &Endpoint, size: usize, what: &str) -> Result<(), Failure> {
        let buf = &mut self.buf[..size];
        ep.recv_all(buf, &self.cfg.mode).map_err(|e| {
            Failure(format!(
                "{} recv ({what}, {size} bytes): {e}",
                ep.kind().name()
            ))
        })?;
        if self.cfg.verify {
            if let Err(at) = self.patterns[idx(ep.kind())].recv.check(buf) {
                return Err(Failure(format!(
                    "data verification failed byte {at} ({} connection)",
                    ep.kind().name()
                )));
            }
        }
        Ok(())
    }

    /// `run_test`: sync, then the timed exchange; prints the row.
    fn run_test(
        &mut self,
        ep: &Endpoint,
        name: &str,
        size: usize,
        count: u32,
        iterations: u32,
    ) -> Result<(), Failure> {
        let client = self.is_client();
        if client {
            self.send(ep, SYNC_LEN, "sync")?;
            self.recv(ep, SYNC_LEN, "sync")?;
        } else {
            self.recv(ep, SYNC_LEN, "sync")?;
            self.send(ep, SYNC_LEN, "sync")?;
        }
        let stats = |ep: &Endpoint| match ep {
            Endpoint::Rsockets(s) => Some(s.stats()),
            Endpoint::Tcp(_) => None,
        };
        let before = stats(ep);
        let start = Instant::now();
        for _ in 0..iterations {
            for _ in 0..count {
                if client {
                    self.send(ep, size, name)?;
                } else {
                    self.recv(ep, size, name)?;
                }
            }
            for _ in 0..count {
                if client {
                    self.recv(ep, size, name)?;
                } else {
                    self.send(ep, size, name)?;
                }
            }
        }
        let sample = Sample {
            name: name.to_string(),
            size,
            count,
            iterations,
            elapsed: start.elapsed(),
            msgs: before.zip(stats(ep)).map(|(b, a)| {
                (
                    a.writes.saturating_sub(b.writes),
                    a.data_msgs.saturating_sub(b.data_msgs),
                )
            }),
        };
        self.print(ep.kind(), &sample);
        self.results.push((ep.kind(), sample));
        Ok(())
    }

    fn print(&self, kind: Kind, s: &Sample) {
        if self.cfg.json {
            let role = if self.is_client() { "client" } else { "server" };
            let design = if kind == Kind::Tcp {
                "kernel"
            } else {
                self.cfg.design
            };
            println!("{}", s.json(kind.name(), design, role));
        } else if self.cfg.kinds.len() > 1 {
            // The baseline's rows carry the transport after the columns.
            println!("{}  [{}]", s.row(), kind.name());
        } else {
            println!("{}", s.row());
        }
    }

    fn close(ep: Endpoint) {
        ep.shutdown();
        drop(ep);
    }

    fn sweep(&mut self, all: bool, latency: bool) -> Result<(), Failure> {
        let sizes: Vec<usize> = report::SWEEP
            .iter()
            .filter(|(_, level)| all || *level == 0)
            .map(|(s, _)| *s)
            .collect();
        for kind in self.cfg.kinds.clone() {
            let ep = self.open(kind)?;
            for &size in &sizes {
                let name = report::sweep_name(size, latency);
                let n = report::size_to_count(size);
                let (count, iterations) = if latency { (1, n) } else { (n, 1) };
                let r = self.run_test(&ep, &name, size, count, iterations);
                if r.is_err() {
                    Self::close(ep);
                    return r;
                }
            }
            Self::close(ep);
        }
        Ok(())
    }
}

/// Runs the configured tests; returns every sample (also printed as it
/// comes).
pub fn run(cfg: &Config) -> Result<Vec<(Kind, Sample)>, Failure> {
    let max = match cfg.plan {
        Plan::Custom { size, .. } => size.max(SYNC_LEN),
        Plan::Sweep { .. } => report::SWEEP[report::SWEEP.len() - 1].0,
    };
    let acceptor = match &cfg.role {
        Role::Server { listen } => {
            let a = Acceptor::bind(*listen, &cfg.kinds, &cfg.setup)
                .map_err(|e| Failure(format!("listen on {listen}: {e}")))?;
            if let Ok(at) = a.local_addr() {
                eprintln!("iwarp-rstream: listening on {at}");
            }
            Some(a)
        }
        Role::Client { .. } => None,
    };
    let mut r = Runner {
        cfg,
        acceptor,
        buf: vec![0u8; max],
        patterns: Default::default(),
        results: Vec::new(),
    };
    if !cfg.json {
        println!("{}", report::header());
    }
    match cfg.plan {
        Plan::Custom {
            size,
            count,
            iterations,
        } => {
            for kind in cfg.kinds.clone() {
                let ep = r.open(kind)?;
                let res = r.run_test(&ep, "custom", size, count, iterations);
                Runner::close(ep);
                res?;
            }
        }
        Plan::Sweep { all } => {
            r.sweep(all, true)?;
            r.sweep(all, false)?;
        }
    }
    Ok(r.results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_runs_on_across_calls_and_wraps() {
        let mut tx = Pattern::default();
        let mut rx = Pattern::default();
        let mut a = [0u8; 200];
        let mut b = [0u8; 100];
        tx.fill(&mut a);
        tx.fill(&mut b);
        assert_eq!(a[0], 0);
        assert_eq!(a[199], 199);
        assert_eq!(b[55], 255);
        assert_eq!(b[56], 0);
        assert!(rx.check(&a).is_ok());
        let mut bad = b;
        bad[70] ^= 1;
        assert_eq!(rx.check(&bad), Err(270));
    }
}
