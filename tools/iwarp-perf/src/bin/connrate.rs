//! `iwarp-connrate`: how many iWARP connections per second one process pair
//! sets up over loopback, against kernel TCP in the same run (issue 29,
//! item 2: "connection set-up rate (connections per second) against TCP").
//!
//! One run opens COUNT connections, CONCURRENCY at a time: as many client
//! threads each create a queue pair and connect it (TCP, then the MPA
//! Request and Reply, RFC 5044 §7.1), and as many acceptor threads each
//! take a request from one shared listener, create a queue pair and accept.
//! The connections stay up until the run ends (so the provider's per-
//! connection threads, if any, are all alive at the peak) and are torn
//! down after the clock stops. The same pattern then runs over plain TCP
//! (connect and accept, TCP_NODELAY on both ends), and over TCP with one
//! request/reply exchange of an MPA Request's size after the connect, the
//! fairer baseline: MPA is exactly that exchange on top of TCP's handshake.
//! The transports alternate PAIRS times; the medians are reported with the
//! ratios.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use iwarp::cm::{self, ConnParam, Listener};
use iwarp::{Context, QpInitAttr, QueuePair};
use iwarp_perf::proc_stats::{context_switches, cpu_seconds, ThreadPeak};
use iwarp_proto::handshake::MpaConfig;

const ABOUT: &str = "\
Connection set-up rate of the software iWARP stack against kernel TCP, in
one process over 127.0.0.1. COUNT connections, CONCURRENCY at a time (as
many connecting and as many accepting threads); each iWARP connection is a
new queue pair, the TCP connect and the MPA Request/Reply exchange. The
baselines: plain TCP connect/accept, and TCP plus one 64-byte request/reply
(the size of an MPA Request with a little private data), which is what MPA
adds. Transports alternate PAIRS times; medians and ratios are printed.
The progress engine is the provider's (IWARP_PROGRESS=threads|pool).";

#[derive(Debug, Parser)]
#[command(name = "iwarp-connrate", version, about = "Connection set-up rate: iWARP against kernel TCP", long_about = ABOUT)]
struct Cli {
    /// Connections per run.
    #[arg(short = 'n', long, default_value_t = 500)]
    count: u32,
    /// Connections set up at once (client threads; as many acceptor threads).
    #[arg(short = 'c', long, default_value_t = 4)]
    concurrency: u32,
    /// Runs of each transport, alternating; the medians are reported.
    #[arg(long, default_value_t = 3)]
    pairs: u32,
    /// Bound on each connect and accept, in seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    timeout: f64,
    /// One JSON object per transport (the medians) instead of the table.
    #[arg(long)]
    json: bool,
    /// Run only these transports (comma-separated: iwarp, tcp,
    /// tcp+exchange), e.g. `--transport iwarp` under perf or strace; the
    /// ratios need the baselines.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "iwarp,tcp,tcp+exchange", value_parser = parse_transport)]
    transport: Vec<Transport>,
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    [Transport::Iwarp, Transport::Tcp, Transport::TcpExchange]
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| format!("unknown transport `{s}`: use iwarp, tcp or tcp+exchange"))
}

/// One run of one transport.
#[derive(Debug, Clone, Copy)]
struct Run {
    wall: f64,
    cpu: f64,
    threads: u64,
    /// Context switches of the process in the run (both ends).
    switches: u64,
    /// Client-side connect time (median, 99th percentile), microseconds.
    p50_us: f64,
    p99_us: f64,
}

impl Run {
    fn rate(&self, n: u32) -> f64 {
        f64::from(n) / self.wall
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Iwarp,
    Tcp,
    TcpExchange,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Iwarp => "iwarp",
            Transport::Tcp => "tcp",
            Transport::TcpExchange => "tcp+exchange",
        }
    }
}

/// Bytes of the baseline's request and reply: an MPA Request frame is a
/// 20-byte header plus private data; 64 covers a typical one.
const EXCHANGE: usize = 64;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    if cli.count == 0 || cli.concurrency == 0 || cli.pairs == 0 {
        eprintln!("iwarp-connrate: --count, --concurrency and --pairs must be at least 1");
        return ExitCode::from(2);
    }
    raise_fd_limit(u64::from(cli.count) * 4 + 64);
    let timeout = Duration::from_secs_f64(cli.timeout);
    let mut runs: Vec<(Transport, Vec<Run>)> =
        [Transport::Iwarp, Transport::Tcp, Transport::TcpExchange]
            .into_iter()
            .filter(|t| cli.transport.contains(t))
            .map(|t| (t, Vec::new()))
            .collect();
    for _ in 0..cli.pairs {
        for (t, v) in runs.iter_mut() {
            let r = match t {
                Transport::Iwarp => run_iwarp(cli.count, cli.concurrency, timeout),
                _ => run_tcp(cli.count, cli.concurrency, timeout, *t),
            };
            match r {
                Ok(r) => v.push(r),
                Err(e) => {
                    eprintln!("iwarp-connrate: {} run failed: {e}", t.name());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let med: Vec<(Transport, Run)> = runs.iter().map(|(t, v)| (*t, median_run(v))).collect();
    let rate = |t: Transport| {
        med.iter()
            .find(|(x, _)| *x == t)
            .map_or(f64::NAN, |(_, r)| r.rate(cli.count))
    };
    let engine = std::env::var("IWARP_PROGRESS").unwrap_or_else(|_| "threads".into());
    if cli.json {
        for (t, r) in &med {
            println!(
                "{{\"transport\":\"{}\",\"engine\":\"{}\",\"count\":{},\"concurrency\":{},\"pairs\":{},\"wall_s\":{:.4},\"conn_per_s\":{:.1},\"connect_p50_us\":{:.1},\"connect_p99_us\":{:.1},\"cpu_s\":{:.4},\"switches_per_conn\":{:.2},\"threads_peak\":{},\"ratio_to_tcp\":{:.3},\"ratio_to_tcp_exchange\":{:.3}}}",
                t.name(),
                engine,
                cli.count,
                cli.concurrency,
                cli.pairs,
                r.wall,
                r.rate(cli.count),
                r.p50_us,
                r.p99_us,
                r.cpu,
                r.switches as f64 / f64::from(cli.count),
                r.threads,
                r.rate(cli.count) / rate(Transport::Tcp),
                r.rate(cli.count) / rate(Transport::TcpExchange),
            );
        }
        return ExitCode::SUCCESS;
    }
    println!(
        "{} connections, {} at a time, median of {} runs per transport (iWARP engine: {engine})",
        cli.count, cli.concurrency, cli.pairs
    );
    println!(
        "{:<14} {:>10} {:>12} {:>12} {:>8} {:>9} {:>9} {:>10}",
        "transport",
        "conn/s",
        "connect p50",
        "connect p99",
        "CPU[s]",
        "csw/conn",
        "threads",
        "vs TCP"
    );
    for (t, r) in &med {
        println!(
            "{:<14} {:>10.0} {:>10.0}us {:>10.0}us {:>8.3} {:>9.1} {:>9} {:>9.2}x",
            t.name(),
            r.rate(cli.count),
            r.p50_us,
            r.p99_us,
            r.cpu,
            r.switches as f64 / f64::from(cli.count),
            r.threads,
            r.rate(cli.count) / rate(Transport::Tcp),
        );
    }
    println!(
        "iWARP set-up rate: {:.2}x plain TCP, {:.2}x TCP with one request/reply",
        rate(Transport::Iwarp) / rate(Transport::Tcp),
        rate(Transport::Iwarp) / rate(Transport::TcpExchange)
    );
    ExitCode::SUCCESS
}

/// The run with the median set-up rate.
fn median_run(v: &[Run]) -> Run {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.wall.total_cmp(&b.wall));
    s[s.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Ask for enough descriptors: each connection holds two sockets, plus
/// the provider's eventfds.
fn raise_fd_limit(want: u64) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read or write the one `rlimit` we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < want {
            rl.rlim_cur = want.min(rl.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

/// Collects what a run's threads measured and keep alive.
struct Shared<T> {
    next: AtomicU32,
    accepted: AtomicU32,
    keep: Mutex<Vec<T>>,
    lat_us: Mutex<Vec<f64>>,
    error: Mutex<Option<String>>,
}

impl<T> Shared<T> {
    fn new() -> Shared<T> {
        Shared {
            next: AtomicU32::new(0),
            accepted: AtomicU32::new(0),
            keep: Mutex::new(Vec::new()),
            lat_us: Mutex::new(Vec::new()),
            error: Mutex::new(None),
        }
    }

    fn fail(&self, e: String) {
        self.error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e);
    }

    fn failed(&self) -> bool {
        self.error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn keep(&self, t: T) {
        self.keep.lock().unwrap_or_else(|e| e.into_inner()).push(t);
    }
}

/// Run `clients` and `acceptors` threads (`conc` each) from one barrier;
/// returns the wall time from the barrier to the last thread's end, the
/// CPU seconds, the context switches and the peak thread count over that
/// window.
fn timed<T: Send + 'static>(
    conc: u32,
    shared: &Arc<Shared<T>>,
    client: impl Fn(&Shared<T>) + Send + Sync + 'static,
    acceptor: impl Fn(&Shared<T>) + Send + Sync + 'static,
) -> (f64, f64, u64, u64) {
    let client = Arc::new(client);
    let acceptor = Arc::new(acceptor);
    let start = Arc::new(Barrier::new(2 * conc as usize + 1));
    let mut handles = Vec::new();
    for i in 0..2 * conc {
        let (s, b) = (shared.clone(), start.clone());
        let (c, a) = (client.clone(), acceptor.clone());
        handles.push(std::thread::spawn(move || {
            b.wait();
            if i < conc {
                c(&s)
            } else {
                a(&s)
            }
        }));
    }
    let peak = ThreadPeak::start();
    let cpu0 = cpu_seconds();
    let csw0 = context_switches();
    start.wait();
    let t0 = Instant::now();
    for h in handles {
        if h.join().is_err() {
            shared.fail("a connecting or accepting thread panicked".into());
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let csw = context_switches().saturating_sub(csw0);
    (wall, cpu_seconds() - cpu0, csw, peak.finish())
}

fn finish<T>(
    shared: &Shared<T>,
    n: u32,
    (wall, cpu, switches, threads): (f64, f64, u64, u64),
) -> Result<Run, String> {
    if let Some(e) = shared
        .error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        return Err(e);
    }
    let mut lat = std::mem::take(&mut *shared.lat_us.lock().unwrap_or_else(|e| e.into_inner()));
    if lat.len() != n as usize {
        return Err(format!("{} of {n} connections were set up", lat.len()));
    }
    lat.sort_by(f64::total_cmp);
    Ok(Run {
        wall,
        cpu,
        threads,
        switches,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
    })
}

fn run_iwarp(n: u32, conc: u32, timeout: Duration) -> Result<Run, String> {
    let server = Context::open().map_err(|e| format!("opening the server's device: {e}"))?;
    let client = Context::open().map_err(|e| format!("opening the client's device: {e}"))?;
    let (spd, cpd) = (server.alloc_pd(), client.alloc_pd());
    let scq = server
        .create_cq(16)
        .map_err(|e| format!("server CQ: {e}"))?;
    let ccq = client
        .create_cq(16)
        .map_err(|e| format!("client CQ: {e}"))?;
    let listener = Listener::bind_on(&server, ([127, 0, 0, 1], 0).into(), MpaConfig::default())
        .map_err(|e| format!("listening on 127.0.0.1: {e}"))?;
    let addr: SocketAddr = listener.local_addr();
    let listener = Arc::new(listener);
    let param = ConnParam {
        timeout,
        ..Default::default()
    };
    let attr = |cq: &iwarp::CompletionQueue| QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        max_send_wr: 4,
        max_recv_wr: 4,
    };
    let (cattr, sattr) = (attr(&ccq), attr(&scq));
    let shared: Arc<Shared<QueuePair>> = Arc::new(Shared::new());
    let cp = param.clone();
    let measured = timed(
        conc,
        &shared,
        move |s| {
            while !s.failed() && s.next.fetch_add(1, Ordering::Relaxed) < n {
                let qp = match cpd.create_qp(&cattr) {
                    Ok(q) => q,
                    Err(e) => return s.fail(format!("client create_qp: {e}")),
                };
                let t = Instant::now();
                if let Err(e) = cm::connect(&qp, addr, &cp) {
                    return s.fail(format!("connect: {e}"));
                }
                let us = t.elapsed().as_secs_f64() * 1e6;
                s.lat_us.lock().unwrap_or_else(|e| e.into_inner()).push(us);
                s.keep(qp);
            }
        },
        move |s| {
            while !s.failed() && s.accepted.fetch_add(1, Ordering::Relaxed) < n {
                let req = match listener.get_request(Some(timeout)) {
                    Ok(r) => r,
                    Err(e) => return s.fail(format!("accepting: {e}")),
                };
                let qp = match spd.create_qp(&sattr) {
                    Ok(q) => q,
                    Err(e) => return s.fail(format!("server create_qp: {e}")),
                };
                if let Err(e) = req.accept(&qp, &param) {
                    return s.fail(format!("accept: {e}"));
                }
                s.keep(qp);
            }
        },
    );
    let r = finish(&shared, n, measured);
    teardown(std::mem::take(
        &mut *shared.keep.lock().unwrap_or_else(|e| e.into_inner()),
    ));
    r
}

/// Drop the run's queue pairs (each a graceful close) on a few threads,
/// after the clock stopped.
fn teardown(qps: Vec<QueuePair>) {
    let chunks: Vec<Vec<QueuePair>> = {
        let mut v: Vec<Vec<QueuePair>> = (0..8).map(|_| Vec::new()).collect();
        for (i, q) in qps.into_iter().enumerate() {
            v[i % 8].push(q);
        }
        v
    };
    let hs: Vec<_> = chunks
        .into_iter()
        .map(|c| std::thread::spawn(move || drop(c)))
        .collect();
    for h in hs {
        let _ = h.join();
    }
}

/// A TCP listener with a deep accept queue. std's `bind` asks for 128: a
/// plain TCP connect completes in the kernel without waiting for
/// `accept`, so the clients overran that queue, the kernel dropped SYNs
/// and a connect took the 1 s SYN retransmission (the p99 was 1 s).
fn tcp_listener() -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())?;
    s.listen(4096)?;
    Ok(s.into())
}

fn run_tcp(n: u32, conc: u32, timeout: Duration, t: Transport) -> Result<Run, String> {
    use std::io::{Read, Write};
    let listener = tcp_listener().map_err(|e| format!("TCP listener on 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let listener = Arc::new(listener);
    let exchange = t == Transport::TcpExchange;
    let shared: Arc<Shared<TcpStream>> = Arc::new(Shared::new());
    let measured = timed(
        conc,
        &shared,
        move |s| {
            while !s.failed() && s.next.fetch_add(1, Ordering::Relaxed) < n {
                let t = Instant::now();
                let r = (|| -> std::io::Result<TcpStream> {
                    let mut c = TcpStream::connect_timeout(&addr, timeout)?;
                    c.set_nodelay(true)?;
                    if exchange {
                        c.set_read_timeout(Some(timeout))?;
                        c.write_all(&[1u8; EXCHANGE])?;
                        let mut b = [0u8; EXCHANGE];
                        c.read_exact(&mut b)?;
                    }
                    Ok(c)
                })();
                match r {
                    Ok(c) => {
                        let us = t.elapsed().as_secs_f64() * 1e6;
                        s.lat_us.lock().unwrap_or_else(|e| e.into_inner()).push(us);
                        s.keep(c);
                    }
                    Err(e) => return s.fail(format!("TCP connect to {addr}: {e}")),
                }
            }
        },
        move |s| {
            while !s.failed() && s.accepted.fetch_add(1, Ordering::Relaxed) < n {
                let r = (|| -> std::io::Result<TcpStream> {
                    let (mut c, _) = listener.accept()?;
                    c.set_nodelay(true)?;
                    if exchange {
                        c.set_read_timeout(Some(timeout))?;
                        let mut b = [0u8; EXCHANGE];
                        c.read_exact(&mut b)?;
                        c.write_all(&b)?;
                    }
                    Ok(c)
                })();
                match r {
                    Ok(c) => s.keep(c),
                    Err(e) => return s.fail(format!("TCP accept: {e}")),
                }
            }
        },
    );
    let r = finish(&shared, n, measured);
    drop(std::mem::take(
        &mut *shared.keep.lock().unwrap_or_else(|e| e.into_inner()),
    ));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few connections of each transport: every one is set up and
    /// counted, the figures are plausible (CPU within cores x wall).
    #[test]
    fn small_runs_of_each_transport() {
        let t = Duration::from_secs(10);
        for (name, r) in [
            ("iwarp", run_iwarp(8, 2, t)),
            ("tcp", run_tcp(8, 2, t, Transport::Tcp)),
            ("tcp+exchange", run_tcp(8, 2, t, Transport::TcpExchange)),
        ] {
            let r = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.wall > 0.0 && r.rate(8) > 0.0, "{name}: {r:?}");
            assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{name}: {r:?}");
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            assert!(r.cpu <= cores * r.wall + 0.05, "{name}: {r:?}");
        }
    }

    /// Nobody accepts: the connects fail within the bound and the run says
    /// so instead of hanging.
    #[test]
    fn a_run_that_cannot_connect_fails_with_the_cause() {
        let shared: Arc<Shared<u32>> = Arc::new(Shared::new());
        shared.fail("connect: refused".into());
        shared.fail("a second error is not kept".into());
        let e = finish(&shared, 1, (1.0, 0.0, 0, 1)).unwrap_err();
        assert_eq!(e, "connect: refused");
        let shared: Arc<Shared<u32>> = Arc::new(Shared::new());
        shared.lat_us.lock().unwrap().push(5.0);
        let e = finish(&shared, 2, (1.0, 0.0, 0, 1)).unwrap_err();
        assert!(e.contains("1 of 2"), "{e}");
    }
}
