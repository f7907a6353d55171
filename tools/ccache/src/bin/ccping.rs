//! `ccping`: time version checks against a ccappd, one at a time.
#![deny(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ccache::check::{RdmaCheck, TcpCheck, VersionCheck};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    /// RDMA Read of the version slot.
    Rdma,
    /// VERSION_REQUEST to the version thread over TCP.
    Tcp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Progress {
    /// The CQ's default: receive threads, the waiter spins briefly, then sleeps.
    Threaded,
    /// Receive threads; the waiter sleeps at once (no spin).
    Sleep,
    /// The waiting thread reads the socket itself in a loop.
    BusyPoll,
}

/// Time COUNT version checks of one document against ccappd (after WARMUP
/// untimed ones) and print one JSON line: mode, count, failed checks,
/// p50/p90/p99/max in microseconds. Exit status 1 if any check failed.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// How to check.
    #[arg(long, value_enum)]
    mode: Mode,
    /// ccappd's --rdma-listen address.
    #[arg(long, default_value = "127.0.0.1:7471")]
    appd_rdma: SocketAddr,
    /// ccappd's --version-listen address.
    #[arg(long, default_value = "127.0.0.1:7472")]
    appd_tcp: SocketAddr,
    /// Document to check.
    #[arg(long, default_value_t = 0)]
    doc: u32,
    /// Timed checks.
    #[arg(long, default_value_t = 10000)]
    count: usize,
    /// Untimed checks first.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Bound on each check, milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// How the RDMA check waits for its completion.
    #[arg(long, value_enum, default_value = "threaded")]
    progress: Progress,
    /// A label copied into the JSON line.
    #[arg(long, default_value = "")]
    label: String,
    /// ccappd's access token (a copy of its --token-file, mode 0600);
    /// required in mode rdma.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Mode rdma without a token, against a ccappd run with
    /// --insecure-no-token (a closed test network only).
    #[arg(long, conflicts_with = "token_file")]
    insecure_no_token: bool,
}

fn main() -> ExitCode {
    ccache::init_logging();
    let a = Args::parse();
    let t = Duration::from_millis(a.timeout_ms.max(1));
    let needs = matches!(a.mode, Mode::Rdma)
        .then_some("--mode rdma (it RDMA-Reads ccappd's version table)");
    let token = match ccache::access::client_token(
        "ccping",
        a.token_file.as_deref(),
        a.insecure_no_token,
        needs,
    ) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let mut c: Box<dyn VersionCheck> = match a.mode {
        Mode::Rdma => Box::new(
            RdmaCheck::new(a.appd_rdma, t)
                .with_progress(match a.progress {
                    Progress::Threaded => iwarp::ProgressMode::Threaded {
                        spin: iwarp::DEFAULT_SPIN,
                    },
                    Progress::Sleep => iwarp::ProgressMode::Threaded {
                        spin: Duration::ZERO,
                    },
                    Progress::BusyPoll => iwarp::ProgressMode::BusyPoll,
                })
                .with_token(token),
        ),
        Mode::Tcp => Box::new(TcpCheck::new(a.appd_tcp, t)),
    };
    for _ in 0..a.warmup {
        if let Err(e) = c.version(a.doc) {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    }
    let mut us = Vec::with_capacity(a.count);
    let mut errors = 0usize;
    for _ in 0..a.count {
        let t0 = Instant::now();
        match c.version(a.doc) {
            Ok(_) => us.push(t0.elapsed().as_secs_f64() * 1e6),
            Err(e) => {
                // Counted, not timed; the checker connects again next time.
                tracing::warn!("check failed: {e}");
                errors += 1;
            }
        }
    }
    us.sort_by(f64::total_cmp);
    let q = |p: f64| {
        us.get(((us.len() as f64 * p) as usize).min(us.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "{{\"label\": \"{}\", \"mode\": \"{:?}\", \"progress\": \"{:?}\", \"count\": {}, \"errors\": {}, \"p50_us\": {:.1}, \"p90_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}}}",
        a.label,
        a.mode,
        a.progress,
        us.len(),
        errors,
        q(0.5),
        q(0.9),
        q(0.99),
        us.last().copied().unwrap_or(0.0)
    );
    if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
