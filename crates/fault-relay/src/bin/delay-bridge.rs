//! `delay-bridge`: a user-space TCP relay that adds a fixed one-way delay
//! in each direction, for RTT experiments where the kernel has no netem,
//! and injects faults (drop, stall, truncate, reseg, blackhole, corrupt)
//! for tests. The relay itself is the [`fault_relay`] library.
//!
//! `delay-bridge --listen 127.0.0.1:7000=10.213.0.2:2121 --listen
//! 127.0.0.1:7001=10.213.0.2:2122 --delay-ms 1.8` relays every connection
//! on each listen address to its target; bytes read at time t are written
//! at t + delay, so the round trip grows by twice the delay. The relay
//! keeps up to `--max-inflight` bytes per direction queued, far above the
//! bandwidth-delay product of a loopback link at a few ms, so it delays
//! without limiting the window.
//!
//! `--fault 'drop:at=4M,dir=down,map=1,conn=2'` then aborts the second
//! connection on the second mapping once 4 MiB went towards the client.

use std::io::{self, Write};
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fault_relay::{self as relay, FaultSpec};

/// TCP relay adding a fixed one-way delay in each direction, and faults.
///
/// Fault specs (--fault, repeatable) are KIND[:KEY=VALUE,...]:
///
///   drop       close both connections: how=rst (default, RST via
///              SO_LINGER 0) or how=fin (graceful)
///   stall      stop forwarding for=MS (default 1000; also for=3s), then
///              resume
///   truncate   stop forwarding, half-close the direction and swallow the
///              rest (how=half, default) or close both gracefully
///              (how=close)
///   blackhole  swallow every later byte, end of stream included; keep
///              both connections open
///   corrupt    flip the byte at offset at=N (XOR 0xFF)
///   reseg      write the stream in random pieces of 1..max bytes
///              (max=65536 default), log-uniform, spanning read boundaries;
///              seed=N (default --seed)
///
/// Keys for every kind: at=N|Nms|Ns (alias after=; a byte offset of the
/// direction, 64K, 1M, or a time since the connection was accepted;
/// default 0), dir=up|down|both (up: towards the target; default both,
/// each direction counting its own bytes), map=I (0-based index of the
/// --listen mapping; default all), conn=N|N-M|N- (1-based connection
/// number on the mapping; default all). Each fault fires once per
/// connection and direction.
///
/// Example: --fault 'drop:at=4M,dir=down,map=1,conn=2,how=rst'
#[derive(Parser, Debug)]
#[command(version, verbatim_doc_comment)]
struct Args {
    /// LISTEN=TARGET pairs, e.g. 127.0.0.1:7000=10.213.0.2:2121
    /// (repeatable; port 0 picks a free port, printed on stdout).
    #[arg(short, long, required = true, value_name = "LISTEN=TARGET")]
    listen: Vec<String>,
    /// One-way delay added in each direction, milliseconds (RTT grows by
    /// twice this).
    #[arg(short, long, default_value_t = 1.8)]
    delay_ms: f64,
    /// Bytes queued per direction at most before the reader waits.
    #[arg(long, default_value_t = 64 << 20)]
    max_inflight: usize,
    /// Seconds to wait when connecting to a target.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    /// A fault to inject, KIND[:KEY=VALUE,...] (repeatable; see above).
    #[arg(short, long, value_name = "SPEC")]
    fault: Vec<String>,
    /// Seed of reseg faults that give none.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// mod_rdma: rewrite port= in the RDMA: request headers so the
    /// server's connect-back also runs through the relay (on a new
    /// listener on the header's ip=); those connections are mapping number
    /// N for map= (N = the number of --listen mappings).
    #[arg(long)]
    rdma_connect_back: bool,
    /// FTP: rewrite the port of 229 (EPSV) and 227 (PASV) replies so plain
    /// FTP data connections also run through the relay; they are mapping
    /// number N for map= (as with --rdma-connect-back), numbered across
    /// transfers.
    #[arg(long)]
    ftp_passive: bool,
}

fn main() -> ExitCode {
    // tracing to stderr, filtered by RUST_LOG (default info).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    if !(0.0..=10_000.0).contains(&a.delay_ms) {
        eprintln!("delay-bridge: --delay-ms must be between 0 and 10000");
        return ExitCode::from(2);
    }
    let mut faults = Vec::new();
    for f in &a.fault {
        match f.parse::<FaultSpec>() {
            Ok(s) if s.wait_signal => {
                eprintln!(
                    "delay-bridge: --fault {f}: wait=signal is for tests that use the relay as a \
                     library (fault_relay::Signal); this binary has nothing to raise it: drop the key"
                );
                return ExitCode::from(2);
            }
            Ok(s) => {
                let dynamic = a.rdma_connect_back || a.ftp_passive;
                let maps = a.listen.len() + usize::from(dynamic);
                if s.map.is_some_and(|m| m >= maps) {
                    eprintln!(
                        "delay-bridge: --fault {f}: map= must be below the number of mappings ({maps}: the --listen ones{})",
                        if dynamic { " and the relayed second connections" } else { "" }
                    );
                    return ExitCode::from(2);
                }
                faults.push(s);
            }
            Err(e) => {
                eprintln!("delay-bridge: --fault {e}");
                return ExitCode::from(2);
            }
        }
    }
    let mut listeners = Vec::new();
    for s in &a.listen {
        let (l, t) = match relay::parse_mapping(s) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("delay-bridge: {e}");
                return ExitCode::from(2);
            }
        };
        match TcpListener::bind(l) {
            Ok(sock) => {
                let local = sock.local_addr().unwrap_or(l);
                println!("delay-bridge {local} -> {t} delay {} ms", a.delay_ms);
                listeners.push((sock, t));
            }
            Err(e) => {
                eprintln!("delay-bridge: cannot listen on {l}: {e}; pick a free port");
                return ExitCode::from(1);
            }
        }
    }
    let _ = io::stdout().flush();
    for f in &faults {
        tracing::info!(fault = ?f, "fault armed");
    }
    let cfg = Arc::new(relay::Config {
        delay: Duration::from_secs_f64(a.delay_ms / 1e3),
        max_inflight: a.max_inflight,
        connect_timeout: Duration::from_secs(a.connect_timeout),
        faults,
        seed: a.seed,
        alg: (a.rdma_connect_back || a.ftp_passive).then(|| relay::Alg {
            rdma_header: a.rdma_connect_back,
            ftp_passive: a.ftp_passive,
            map: a.listen.len(),
            ..relay::Alg::default()
        }),
        // Never raised here (wait=signal is refused above).
        signal: relay::Signal::default(),
    });
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, (sock, t))| relay::serve(sock, t, i, cfg.clone()))
        .collect();
    for h in handles {
        let _ = h.join();
    }
    ExitCode::SUCCESS
}
