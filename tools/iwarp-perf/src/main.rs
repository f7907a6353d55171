//! `iwarp-perf`: perftest-style bandwidth and latency tests (`ib_write_bw`,
//! `ib_read_lat`, ...) for the user-space software iWARP stack, with an
//! honest raw-TCP baseline over the same sockets and message pattern.
//!
//! - [`params`] (in the library, `iwarp_perf::params`): test parameters
//!   and the blocks the two ends exchange (MPA private data, or the first
//!   bytes of a TCP connection).
//! - [`rdma`]: the iWARP client and server roles of the six tests.
//! - [`tcp`]: the same patterns over plain TCP.
//! - [`pattern`]: `--integrity` patterns and checksums.
//! - [`report`]: what a client measured, statistics, tables, JSON, RSS
//!   and CPU accounting.
//! - [`device`]: the device of this run (`--device`), opened by every role.

use iwarp_perf::params;
mod device;
mod pattern;
mod perftest;
mod rdma;
mod report;
mod tcp;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use iwarp::cm::Listener;

use device::open_context;
use params::{Params, Test};
use report::Measurement;

const LONG_ABOUT: &str = "\
perftest-style bandwidth and latency tests for the software iWARP stack
(RDMAP/DDP/MPA over TCP, wire-compatible with Linux siw), with a raw-TCP
baseline that uses the same socket setup and message pattern.

Bandwidth tests (write_bw, read_bw, send_bw) keep --tx-depth operations
outstanding per QP and signal every depth/4-th one, as perftest does; read_bw
is also bounded by the negotiated ORD (IRD/ORD = --tx-depth are requested).
send_bw runs on receive credits (iWARP has no receiver-not-ready retry).
Each run ends with a DONE/ACK handshake and the clock stops at the ACK, so
the last byte has been placed at the receiver.

Latency tests are ping-pongs: write_lat polls the last byte of its buffer
for the peer's RDMA Write (as perftest does), send_lat waits for the echo's
receive completion; both report half the round trip. read_lat does one
RDMA Read at a time and reports the full round trip. Latencies are in
microseconds; MB/s is 10^6 bytes per second.

Two processes: `iwarp-perf --server [-p PORT]` and `iwarp-perf TEST HOST
[-p PORT] [options]`; the server adopts the client's parameters (iWARP on
PORT, the TCP baseline on PORT+1). One process: `--loopback`.

Devices (--device NAME, or the environment variable IWARP_DEVICE): `soft`
(this crate's iWARP over TCP, the default), a kernel RDMA device through
rdma-core (`siw0`, `rxe0`, `mlx5_0`), or `auto` (a kernel device when one
is present, else soft). iwarp-perf's own protocol runs on every device
(it tells its control messages from data by their length); --crc and
--markers apply to soft only (siw sets them for the whole host: its
module parameters). --perftest talks to perftest itself.

--perftest: speak perftest's `-R` (rdma_cm) protocol instead of
iwarp-perf's own, so the other end can be perftest: `ib_write_bw -R`,
`ib_read_bw -R` or `ib_read_lat -R` (perftest 4.5, version 6.06, as
captured and tested on Linux siw), in either role, on any device, soft
included (our stack speaks iWARP on TCP like siw). As with perftest, give
both ends the same test, -s and port; the server names its test too
(`iwarp-perf --perftest --server write_bw -s 65536`). Bandwidths are
then in perftest's MB/s (2^20 bytes). perftest busy-polls its CQs; here
the data CQ sleeps on completion events unless --busy-poll (which was the
slower choice on siw in a 2-vCPU emulated guest: docs/BENCHMARKS.md). send_bw, write_lat and send_lat are
not perftest-compatible: send_bw's receiver-side flow control relies on
InfiniBand's RNR retry, which iWARP lacks (a Send finding no receive
terminates the connection, RFC 5040 5.3); the write/send ping-pongs are
not implemented against perftest's. They run with iwarp-perf on both ends.

The CRC32C implementation is chosen at start from the CPU; the environment
variable IWARP_CRC=auto|avx512|avx2|sse42|soft forces one (an unknown or
unavailable one is an error). The table header and --json (`crc_impl`)
name the one that ran.

The TCP baseline's bandwidth reader reads 256 KiB (or the message size,
if larger) per call; IWARP_PERF_TCP_READ=BYTES sets it (for example
32768: two calls per 64 KiB message, as many receive calls as the
software provider makes per GB; docs/BENCHMARKS.md, issue 29).";

const EXAMPLES: &str = "\
Examples:
  iwarp-perf write_bw --loopback -s 1048576 --compare
  iwarp-perf --perftest --server write_bw --device siw0       (ib_write_bw -R -d siw0 HOST as client)
  iwarp-perf --perftest write_bw HOST --device siw0            (ib_write_bw -R -d siw0 as server)
  iwarp-perf --perftest read_lat HOST --device soft -s 2       (against ib_read_lat -R on siw)
  iwarp-perf send_lat --loopback -s 8 --compare --json
  iwarp-perf write_bw --loopback -a --crc off --json
  iwarp-perf read_bw --loopback -s 65537 -n 200 --integrity
  iwarp-perf --server -p 18515            (on host A)
  iwarp-perf write_bw hostA -p 18515 -q 4  (on host B)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

impl OnOff {
    fn on(self) -> bool {
        self == OnOff::On
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "iwarp-perf",
    version,
    about = "perftest-style bandwidth/latency tests for software iWARP, with a TCP baseline",
    long_about = LONG_ABOUT,
    after_help = EXAMPLES
)]
struct Cli {
    /// The test (required unless --server).
    #[arg(value_enum)]
    test: Option<Test>,
    /// Server to connect to (client mode).
    host: Option<String>,
    /// Device: soft, auto, or a kernel RDMA device (siw0, rxe0, mlx5_0) [default: $IWARP_DEVICE, else soft].
    #[arg(short = 'd', long, value_name = "NAME")]
    device: Option<String>,
    /// Speak perftest's -R protocol (ib_write_bw/ib_read_bw/ib_read_lat -R on the other end).
    #[arg(long, conflicts_with_all = ["loopback", "tcp", "compare", "integrity", "all", "duration"])]
    perftest: bool,
    /// Serve runs for clients: iWARP on PORT, the TCP baseline on PORT+1.
    #[arg(long)]
    server: bool,
    /// Address the server binds to.
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Port (iWARP; the TCP baseline uses PORT+1).
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Run both ends in this process over 127.0.0.1.
    #[arg(long, conflicts_with_all = ["server", "host"])]
    loopback: bool,
    /// Message size in bytes [default: 65536 for bandwidth tests, 8 for latency tests].
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Sweep message sizes 2 B .. 8 MiB (powers of two).
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    all: bool,
    /// Iterations per QP [default: 5000 (at most 4 GiB per QP) for bandwidth, 5000 (at most 1 GiB) for latency].
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Run for SECS seconds instead of a number of iterations.
    #[arg(short = 'D', long, value_name = "SECS", conflicts_with = "iters")]
    duration: Option<f64>,
    /// Outstanding operations per QP (queue depth) [default: 128]; latency tests always use 1.
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Number of QPs (1 to 1024), each on its own connection, driven round-robin by one thread (the TCP baseline: one thread per connection).
    #[arg(short = 'q', long, default_value_t = 1)]
    qps: u32,
    /// MPA CRC32C: `on` requires it, `off` refuses it [client default: on; server default: follow the client].
    #[arg(long, value_enum)]
    crc: Option<OnOff>,
    /// MPA markers: `on` requires them, `off` refuses them [client default: off; server default: follow the client].
    #[arg(long, value_enum)]
    markers: Option<OnOff>,
    /// Run the raw-TCP baseline instead of iWARP.
    #[arg(long, conflicts_with = "compare")]
    tcp: bool,
    /// Run iWARP, then TCP with the same parameters, and print the ratio.
    #[arg(long)]
    compare: bool,
    /// Machine-readable output: one JSON object per line.
    #[arg(long)]
    json: bool,
    /// Fill every message with a per-iteration pattern and verify a CRC32C
    /// of every received message; any mismatch fails the run.
    #[arg(long)]
    integrity: bool,
    /// Busy-poll: the CQs are in ProgressMode::BusyPoll, so cq.wait does the
    /// receive work itself and never sleeps; spins on polled memory do it
    /// too (cq.progress).
    #[arg(long, conflicts_with = "event")]
    busy_poll: bool,
    /// Receive threads do the receive work and cq.wait polls briefly, then
    /// sleeps (ProgressMode::Threaded, the default).
    #[arg(long)]
    event: bool,
    /// Bound on every single wait, in seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    timeout: f64,
    /// Server: exit if no client arrives within SECS seconds.
    #[arg(long, default_value_t = 600.0, value_name = "SECS")]
    idle_timeout: f64,
    /// Self-test of --integrity: the receiver flips one byte of one message.
    #[arg(long, hide = true)]
    inject_corruption: bool,
}

/// `println!` for the report: when the reader has gone (`iwarp-perf ... |
/// head`), stop quietly with status 0, as a C tool ended by SIGPIPE
/// would, instead of panicking on the broken pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("iwarp-perf: writing the report to stdout: {e}");
            std::process::exit(1);
        }
    }};
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    // For investigations of the progress pool's wake-ups: each stall it
    // finds is logged at debug (RUST_LOG=iwarp_soft::pool=debug), see
    // `iwarp::soft::pool::audit`.
    if std::env::var("IWARP_POOL_AUDIT").as_deref() == Ok("1") {
        iwarp::soft::pool::audit::set_enabled(true);
    }
    // A bad IWARP_CRC is refused here rather than logged and replaced.
    if let Err(e) = iwarp_proto::wire::crc::active_from_env() {
        eprintln!("iwarp-perf: error: {e}");
        return ExitCode::FAILURE;
    }
    // So is a bad IWARP_PERF_TCP_READ (else only the serving side sees it).
    if let Err(e) = tcp::read_chunk(0) {
        eprintln!("iwarp-perf: error: {e}");
        return ExitCode::FAILURE;
    }
    let device = cli
        .device
        .clone()
        .or_else(|| {
            std::env::var(iwarp::DEVICE_ENV)
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "soft".into());
    device::choose(device);
    raise_fd_limit(cli.qps);
    let r = match (cli.server, cli.perftest) {
        (true, true) => serve_perftest(&cli),
        (false, true) => run_perftest(&cli),
        (true, false) => serve(&cli),
        (false, false) => run(&cli),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp-perf: error: {e}");
            if e.contains("INTEGRITY FAILURE") {
                ExitCode::from(3)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `--crc` / `--markers` choose what the soft device negotiates; a kernel
/// device's MPA settings belong to its driver, so asking for them there is
/// refused rather than silently ignored.
fn mpa_options_refused(ctx: &iwarp::Context, cli: &Cli) -> Result<(), String> {
    if ctx.device_name() == "soft" || (cli.crc.is_none() && cli.markers.is_none()) {
        return Ok(());
    }
    Err(format!(
        "--crc and --markers set the MPA options of the soft device; on {} the kernel \
         driver negotiates MPA (for siw: its mpa_crc_required / mpa_crc_strict module \
         parameters). Drop them, or use --device soft",
        ctx.device_name()
    ))
}

fn secs(v: f64, what: &str) -> Result<Duration, String> {
    if v.is_finite() && v > 0.0 && v < 1e7 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(format!(
            "{what} must be a positive number of seconds, got {v}"
        ))
    }
}

/// Default iterations for `size` bytes (per QP).
fn default_iters(test: Test, size: usize) -> u64 {
    let cap: u64 = if test.is_bw() { 4 << 30 } else { 1 << 30 };
    (cap / size as u64).clamp(100, 5000)
}

fn params_for(cli: &Cli, test: Test, size: usize) -> Result<Params, String> {
    let depth = if test.is_bw() {
        cli.tx_depth.unwrap_or(128)
    } else {
        1
    };
    if depth == 0 || depth > 4096 {
        return Err(format!("--tx-depth must be 1..=4096, got {depth}"));
    }
    if cli.qps == 0 || cli.qps > params::MAX_QPS {
        return Err(format!(
            "--qps must be 1..={}, got {}",
            params::MAX_QPS,
            cli.qps
        ));
    }
    if !test.is_bw() && cli.qps != 1 {
        return Err(format!(
            "{test} measures one ping-pong: run it with one QP (-q 1)"
        ));
    }
    if size == 0 || size > 1 << 30 {
        return Err(format!("--size must be 1..=1073741824 bytes, got {size}"));
    }
    let duration = cli.duration.map(|d| secs(d, "--duration")).transpose()?;
    let iters = cli.iters.unwrap_or_else(|| default_iters(test, size));
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let p = Params {
        test,
        size,
        iters,
        duration,
        depth,
        qps: cli.qps,
        integrity: cli.integrity,
        busy_poll: cli.busy_poll,
        corrupt: cli.inject_corruption,
        timeout: secs(cli.timeout, "--timeout")?,
    };
    p.check_wire()
        .map_err(|e| format!("{e} (--iters, --tx-depth, --qps, --size)"))?;
    Ok(p)
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))
}

fn test_title(t: Test) -> &'static str {
    match t {
        Test::WriteBw => "RDMA Write BW test",
        Test::ReadBw => "RDMA Read BW test",
        Test::SendBw => "Send BW test",
        Test::WriteLat => "RDMA Write latency test",
        Test::ReadLat => "RDMA Read latency test",
        Test::SendLat => "Send latency test",
    }
}

/// Raise the soft limit on open descriptors to the hard limit, as servers
/// that hold many connections do: a thousand QPs in loopback hold a few
/// descriptors each on both ends, more than the usual soft limit of 1024.
/// A limit that cannot be raised is only logged: a run that then runs out
/// of descriptors fails with the OS's error naming it.
fn raise_fd_limit(qps: u32) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read or write one `struct rlimit` that we
    // own; RLIMIT_NOFILE is a valid resource.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if rc != 0 || lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let want = lim.rlim_max;
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        tracing::warn!(
            qps,
            soft = lim.rlim_cur,
            hard = lim.rlim_max,
            "could not raise the open-descriptor limit; many QPs may fail with EMFILE (raise it with ulimit -n)"
        );
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let test = cli.test.ok_or(
        "name a test: write_bw, read_bw, send_bw, write_lat, read_lat or send_lat (see --help)",
    )?;
    if !cli.loopback && cli.host.is_none() {
        return Err(
            "give the server's HOST, or --loopback to run both ends here, or --server".into(),
        );
    }
    if !cli.tcp {
        mpa_options_refused(&open_context()?, cli)?;
    }
    let sizes: Vec<usize> = if cli.all {
        (1..=23).map(|k| 1usize << k).collect()
    } else {
        vec![cli.size.unwrap_or(if test.is_bw() { 65536 } else { 8 })]
    };
    let run_iwarp = !cli.tcp;
    let run_tcp = cli.tcp || cli.compare;
    let crc = cli.crc.unwrap_or(OnOff::On).on();
    let markers = cli.markers.unwrap_or(OnOff::Off).on();
    let remote = match &cli.host {
        Some(h) => Some((resolve(h, cli.port)?, resolve(h, cli.port.wrapping_add(1))?)),
        None => None,
    };
    let first = params_for(cli, test, sizes[0])?;
    if !cli.json {
        out!("{}", "-".repeat(96));
        out!(
            " {} (iwarp-perf: software iWARP over TCP{})",
            test_title(test),
            if cli.loopback { ", loopback" } else { "" }
        );
        out!(
            " QPs: {}   depth: {}   CRC: {}   markers: {}   mode: {}   integrity: {}   {}",
            first.qps,
            first.depth,
            if crc {
                format!("on ({})", iwarp_proto::wire::crc::impl_name())
            } else {
                "off".into()
            },
            if markers { "on" } else { "off" },
            if first.busy_poll {
                "busy-poll"
            } else {
                "event"
            },
            if first.integrity { "on" } else { "off" },
            match first.duration {
                Some(d) => format!("duration: {:.1} s", d.as_secs_f64()),
                None => "iterations: per size".into(),
            }
        );
        if test == Test::ReadBw && run_iwarp {
            out!(" (read_bw outstanding Reads are also bounded by the negotiated ORD)");
        }
        out!("{}", "-".repeat(96));
        out!("{}", report::header(test, cli.compare));
    }
    let mut failed = None;
    for (k, &size) in sizes.iter().enumerate() {
        let p = params_for(cli, test, size)?;
        let final_size = k + 1 == sizes.len();
        let iw = if run_iwarp {
            Some(measure_iwarp(
                &p,
                crc,
                markers,
                remote.map(|r| r.0),
                final_size && !run_tcp,
            )?)
        } else {
            None
        };
        let tc = if run_tcp {
            Some(measure_tcp(&p, remote.map(|r| r.1), final_size)?)
        } else {
            None
        };
        // A harness that reports the impossible must say so, not print it.
        for m in iw.iter().chain(tc.iter()) {
            m.check_plausible(report::cores())?;
        }
        match (&iw, &tc) {
            (Some(a), Some(b)) if cli.compare => {
                if cli.json {
                    out!("{}", report::json_compare(a, b));
                } else {
                    out!("{}", report::row(a, true));
                    out!("{}", report::row(b, true));
                    out!("{}", report::ratio_row(a, b));
                }
            }
            _ => {
                for m in iw.iter().chain(tc.iter()) {
                    if cli.json {
                        out!("{}", report::json_one(m));
                    } else {
                        out!("{}", report::row(m, false));
                    }
                }
            }
        }
        if p.integrity {
            for m in iw.iter().chain(tc.iter()) {
                if m.verified == 0 && failed.is_none() {
                    failed = Some(format!(
                        "{} {}: --integrity verified no message",
                        m.transport, size
                    ));
                }
                if !cli.json {
                    eprintln!(
                        " integrity: {} {} bytes: {} messages verified",
                        m.transport, size, m.verified
                    );
                }
            }
        }
    }
    if !cli.json {
        out!("{}", "-".repeat(96));
    }
    failed.map_or(Ok(()), Err)
}

/// Run one iWARP measurement: against `remote`, or in loopback with a
/// server thread.
fn measure_iwarp(
    p: &Params,
    crc: bool,
    markers: bool,
    remote: Option<SocketAddr>,
    last: bool,
) -> Result<Measurement, String> {
    let mpa = rdma::mpa_config(Some(crc), Some(markers), p.depth.max(16));
    report::reset_peak_rss();
    let (cpu0, wall0, peak) = (
        report::cpu_seconds(),
        Instant::now(),
        report::ThreadPeak::start(),
    );
    let client = |addr: SocketAddr| -> Result<(report::ClientResult, (bool, bool)), String> {
        let mut side = rdma::connect(addr, p, &mpa, last)?;
        let cm = side.crc_markers();
        let r = rdma::run_client(&mut side)?;
        Ok((r, cm))
    };
    let (r, (crc_neg, markers_neg)) = match remote {
        Some(addr) => client(addr)?,
        None => {
            let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
            let ctx = open_context()?;
            let listener = Listener::bind_on(&ctx, loopback, mpa.clone())
                .map_err(|e| format!("loopback listener ({}): {e}", ctx.device_name()))?;
            let addr = listener.local_addr();
            std::thread::scope(|s| {
                let srv = s.spawn(|| -> Result<u64, String> {
                    let (mut side, _) = rdma::accept(&listener, p.timeout)?;
                    rdma::run_server(&mut side)
                });
                let c = client(addr);
                let sr = srv
                    .join()
                    .unwrap_or_else(|_| Err("the server thread panicked".into()));
                match (c, sr) {
                    (_, Err(e)) if e.contains("INTEGRITY") => Err(format!("server: {e}")),
                    (Err(e), _) if e.contains("INTEGRITY") => Err(e),
                    (Err(e), Err(se)) => Err(format!("{e}\n  server: {se}")),
                    (Err(e), Ok(_)) => Err(e),
                    (Ok(_), Err(se)) => Err(format!("server: {se}")),
                    // The client's count already includes what the server
                    // verified (reported in its ACK).
                    (Ok(c), Ok(_)) => Ok(c),
                }
            })?
        }
    };
    Ok(Measurement {
        transport: "iwarp",
        params: *p,
        msgs: r.msgs,
        elapsed: r.elapsed,
        crc: crc_neg,
        markers: markers_neg,
        lat: r.lat,
        peak_rss_kib: report::peak_rss_kib(),
        cpu_s: r.span_cpu_s.unwrap_or(report::cpu_seconds() - cpu0),
        cpu_over_span: r.span_cpu_s.is_some(),
        wall: wall0.elapsed(),
        threads: peak.finish(),
        verified: r.verified,
    })
}

/// Run one TCP-baseline measurement.
fn measure_tcp(p: &Params, remote: Option<SocketAddr>, last: bool) -> Result<Measurement, String> {
    report::reset_peak_rss();
    let (cpu0, wall0, peak) = (
        report::cpu_seconds(),
        Instant::now(),
        report::ThreadPeak::start(),
    );
    let r = match remote {
        Some(addr) => tcp::run_client(addr, p, last)?,
        None => {
            let listener = TcpListener::bind(("127.0.0.1", 0))
                .map_err(|e| format!("TCP loopback listener: {e}"))?;
            let addr = listener
                .local_addr()
                .map_err(|e| format!("TCP loopback listener: {e}"))?;
            std::thread::scope(|s| {
                let srv = s.spawn(|| tcp::serve(&listener, p.timeout));
                let c = tcp::run_client(addr, p, last);
                let sr = srv
                    .join()
                    .unwrap_or_else(|_| Err("the TCP server thread panicked".into()));
                match (c, sr) {
                    (_, Err(e)) if e.contains("INTEGRITY") => Err(format!("server: {e}")),
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(se)) => Err(format!("server: {se}")),
                    (Ok(c), Ok(_)) => Ok(c),
                }
            })?
        }
    };
    Ok(Measurement {
        transport: "tcp",
        params: *p,
        msgs: r.msgs,
        elapsed: r.elapsed,
        crc: false,
        markers: false,
        lat: r.lat,
        peak_rss_kib: report::peak_rss_kib(),
        cpu_s: r.span_cpu_s.unwrap_or(report::cpu_seconds() - cpu0),
        cpu_over_span: r.span_cpu_s.is_some(),
        wall: wall0.elapsed(),
        threads: peak.finish(),
        verified: r.verified,
    })
}

/// `--server`: serve iWARP runs on PORT and TCP-baseline runs on PORT+1
/// until a client's last run (or the idle timeout).
fn serve(cli: &Cli) -> Result<(), String> {
    let idle = secs(cli.idle_timeout, "--idle-timeout")?;
    let ctx = open_context()?;
    mpa_options_refused(&ctx, cli)?;
    let ip: std::net::IpAddr = cli
        .bind
        .parse()
        .map_err(|e| format!("--bind {}: {e}", cli.bind))?;
    let mpa = rdma::mpa_config(cli.crc.map(OnOff::on), cli.markers.map(OnOff::on), 1024);
    let listener = Listener::bind_on(&ctx, SocketAddr::new(ip, cli.port), mpa).map_err(|e| {
        format!(
            "listening on port {} ({}): {e}",
            cli.port,
            ctx.device_name()
        )
    })?;
    let tport = cli.port.wrapping_add(1);
    let tlistener = TcpListener::bind(SocketAddr::new(ip, tport))
        .map_err(|e| format!("listening on TCP port {tport}: {e}"))?;
    eprintln!(
        "iwarp-perf: serving iWARP on {} and the TCP baseline on {}:{tport}",
        listener.local_addr(),
        ip
    );
    std::thread::spawn(move || loop {
        match tcp::serve(&tlistener, idle) {
            Ok(req) => {
                eprintln!("iwarp-perf: TCP {} run done", req.params.test);
                if req.last {
                    std::process::exit(0);
                }
            }
            Err(e) => {
                eprintln!("iwarp-perf: TCP run failed: {e}");
                if e.contains("no client connected") {
                    std::process::exit(1);
                }
            }
        }
    });
    loop {
        match rdma::accept(&listener, idle) {
            Ok((mut side, req)) => {
                let r = rdma::run_server(&mut side);
                drop(side);
                match r {
                    Ok(v) => eprintln!(
                        "iwarp-perf: iWARP {} run done ({} bytes{})",
                        req.params.test,
                        req.params.size,
                        if req.params.integrity {
                            format!(", {v} messages verified")
                        } else {
                            String::new()
                        }
                    ),
                    Err(e) => eprintln!("iwarp-perf: iWARP run failed: {e}"),
                }
                if req.last {
                    return Ok(());
                }
            }
            Err(e) if e.contains("waiting for a client") && e.contains("timed out") => {
                return Err(format!("no client within --idle-timeout: {e}"))
            }
            Err(e) => eprintln!("iwarp-perf: {e}"),
        }
    }
}

fn perftest_opts(cli: &Cli) -> Result<perftest::Opts, String> {
    let test = cli.test.ok_or(
        "--perftest needs the test on both ends: write_bw, read_bw or read_lat (see --help)",
    )?;
    if let Some(why) = perftest::unsupported(test) {
        return Err(why.into());
    }
    if cli.qps != 1 {
        return Err("--perftest runs one QP (perftest's -q is not supported)".into());
    }
    let size = cli.size.unwrap_or_else(|| perftest::default_size(test));
    if size == 0 || size > 1 << 30 {
        return Err(format!("--size must be 1..=1073741824 bytes, got {size}"));
    }
    let iters = cli.iters.unwrap_or_else(|| perftest::default_iters(test));
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let depth = if test.is_bw() {
        cli.tx_depth.unwrap_or(128)
    } else {
        1
    };
    if depth == 0 || depth > 4096 {
        return Err(format!("--tx-depth must be 1..=4096, got {depth}"));
    }
    Ok(perftest::Opts {
        test,
        size,
        iters,
        depth,
        timeout: secs(cli.timeout, "--timeout")?,
        idle: secs(cli.idle_timeout, "--idle-timeout")?,
        busy_poll: cli.busy_poll,
    })
}

fn print_perftest(cli: &Cli, role: &str, o: &perftest::Opts, r: &perftest::Outcome) {
    if cli.json {
        let mut j = format!(
            "{{\"mode\":\"perftest\",\"role\":\"{role}\",\"test\":\"{}\",\"device\":\"{}\",\"peer_version\":\"{}\",\"size\":{},\"iters\":{},\"elapsed_s\":{:.6}",
            o.test,
            r.device,
            r.peer_version,
            o.size,
            o.iters,
            r.elapsed.as_secs_f64()
        );
        if let Some(b) = &r.bw {
            j.push_str(&format!(
                ",\"report_size\":{},\"report_iters\":{},\"bw_mib_s\":{:.3},\"msg_rate_mpps\":{:.6}",
                b.size, b.iters, b.bw_avg, b.msg_rate
            ));
        }
        if let Some(l) = &r.lat {
            j.push_str(&format!(
                ",\"lat_min_us\":{:.3},\"lat_median_us\":{:.3},\"lat_avg_us\":{:.3},\"lat_p99_us\":{:.3},\"lat_max_us\":{:.3}",
                l.min, l.median, l.avg, l.p99, l.max
            ));
        }
        j.push('}');
        out!("{j}");
        return;
    }
    out!("{}", "-".repeat(87));
    out!(
        " {} (iwarp-perf --perftest, {role}, device {}, peer version {})",
        test_title(o.test),
        r.device,
        r.peer_version
    );
    out!("{}", "-".repeat(87));
    if let Some(b) = &r.bw {
        if role == "server" {
            out!(" the client's report:");
        }
        out!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
        out!(
            " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
            b.size,
            b.iters,
            b.bw_peak,
            b.bw_avg,
            b.msg_rate
        );
    }
    if let Some(l) = &r.lat {
        out!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    99% percentile[usec]");
        out!(
            " {:<6} {:<14} {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:.2}",
            o.size,
            o.iters,
            l.min,
            l.max,
            l.median,
            l.avg,
            l.p99
        );
    }
    if r.bw.is_none() && r.lat.is_none() {
        out!(" {} run served", o.test);
    }
    out!("{}", "-".repeat(87));
}

/// `--perftest` client: against `ib_*_bw -R` / `ib_read_lat -R` (or our server).
fn run_perftest(cli: &Cli) -> Result<(), String> {
    let o = perftest_opts(cli)?;
    let host = cli
        .host
        .as_deref()
        .ok_or("give the server's HOST, or --server")?;
    let addr = resolve(host, cli.port)?;
    let ctx = open_context()?;
    let r = perftest::client(&ctx, addr, &o)?;
    print_perftest(cli, "client", &o, &r);
    Ok(())
}

/// `--perftest --server`: serve one run of a perftest client.
fn serve_perftest(cli: &Cli) -> Result<(), String> {
    let o = perftest_opts(cli)?;
    let ip: std::net::IpAddr = cli
        .bind
        .parse()
        .map_err(|e| format!("--bind {}: {e}", cli.bind))?;
    let ctx = open_context()?;
    let r = perftest::server(&ctx, SocketAddr::new(ip, cli.port), &o)?;
    print_perftest(cli, "server", &o, &r);
    Ok(())
}
