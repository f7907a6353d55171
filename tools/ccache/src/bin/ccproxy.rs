//! `ccproxy`: the strongly coherent caching reverse proxy. See
//! `docs/CACHE.md`.
#![deny(unsafe_code)]

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ccache::check::{RdmaCheck, TcpCheck, VersionCheck};
use ccache::proxy::{self, Mode, Proxy, ProxyCfg};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    /// No cache: forward every request.
    None,
    /// Validate every request by an RDMA Read of the version slot.
    Rdma,
    /// Validate every request by asking ccappd's version thread over TCP.
    Tcp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum WaitArg {
    /// Sleep until the Read completes (no spin): flat tails on a busy host.
    Sleep,
    /// The CQ's default: spin (yielding) for 50 us, then sleep.
    Threaded,
    /// The waiting thread reads the socket itself in a loop.
    BusyPoll,
}

/// HTTP/1.1 caching reverse proxy with strong coherency (issue 13): every
/// request for a document (PREFIX<n>) is validated at the application
/// module before it is answered from cache; responses carry X-CC-Version.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Listen address for clients.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The application server (HTTP).
    #[arg(long)]
    backend: SocketAddr,
    /// Validation mode.
    #[arg(long, value_enum, default_value = "rdma")]
    mode: ModeArg,
    /// ccappd's --rdma-listen address (mode rdma).
    #[arg(long, default_value = "127.0.0.1:7471")]
    appd_rdma: SocketAddr,
    /// ccappd's --version-listen address (mode tcp).
    #[arg(long, default_value = "127.0.0.1:7472")]
    appd_tcp: SocketAddr,
    /// Path prefix of documents; the rest of the path is the document number.
    #[arg(long, default_value = "/cgi-bin/doc.cgi/")]
    prefix: String,
    /// How an RDMA check waits for its Read (see docs/CACHE.md: the
    /// spinning default had p90 in milliseconds under CPU contention).
    #[arg(long, value_enum, default_value = "sleep")]
    rdma_wait: WaitArg,
    /// Version-check connections (each serves one check at a time).
    #[arg(long, default_value_t = 4)]
    check_conns: usize,
    /// Bound on a version check, milliseconds.
    #[arg(long, default_value_t = 2000)]
    check_timeout_ms: u64,
    /// Bound on each step of a backend fetch, milliseconds.
    #[arg(long, default_value_t = 10000)]
    backend_timeout_ms: u64,
    /// Close a client connection idle this many seconds.
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,
    /// Most client connections served at once.
    #[arg(long, default_value_t = 256)]
    max_conns: usize,
}

fn main() -> ExitCode {
    ccache::init_logging();
    let a = Args::parse();
    let t = Duration::from_millis(a.check_timeout_ms.max(1));
    let n = a.check_conns.max(1);
    let (mode, checkers): (Mode, Vec<Box<dyn VersionCheck>>) = match a.mode {
        ModeArg::None => (Mode::None, Vec::new()),
        ModeArg::Rdma => (
            Mode::Rdma,
            (0..n)
                .map(|_| {
                    let mode = match a.rdma_wait {
                        WaitArg::Sleep => iwarp::ProgressMode::Threaded {
                            spin: Duration::ZERO,
                        },
                        WaitArg::Threaded => iwarp::ProgressMode::Threaded {
                            spin: iwarp::DEFAULT_SPIN,
                        },
                        WaitArg::BusyPoll => iwarp::ProgressMode::BusyPoll,
                    };
                    Box::new(RdmaCheck::new(a.appd_rdma, t).with_progress(mode))
                        as Box<dyn VersionCheck>
                })
                .collect(),
        ),
        ModeArg::Tcp => (
            Mode::Tcp,
            (0..n)
                .map(|_| Box::new(TcpCheck::new(a.appd_tcp, t)) as Box<dyn VersionCheck>)
                .collect(),
        ),
    };
    let listener = match TcpListener::bind(a.listen) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("--listen {}: {e} (port in use? pick another)", a.listen);
            return ExitCode::FAILURE;
        }
    };
    let cfg = ProxyCfg {
        backend: a.backend,
        prefix: a.prefix,
        mode,
        backend_timeout: Duration::from_millis(a.backend_timeout_ms.max(1)),
        idle: Duration::from_secs(a.idle_secs.max(1)),
    };
    tracing::info!(listen = %a.listen, backend = %a.backend, mode = ?a.mode, "ccproxy ready");
    proxy::serve(
        listener,
        Arc::new(Proxy::new(cfg, checkers)),
        a.max_conns.max(1),
    );
    ExitCode::FAILURE
}
