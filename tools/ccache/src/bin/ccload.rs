//! `ccload`: HTTP/1.1 load generator for the coherent cache, with HDR
//! histograms and the stale checker. See `docs/CACHE.md`.
#![deny(unsafe_code)]

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ccache::appd;
use ccache::load::{self, Rng, Trace, UpdateLog, Verdict, Wc98, Zipf};
use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use signal_hook::consts::{SIGINT, SIGTERM};

/// Load generator for the strongly coherent cache (issue 13): many
/// keep-alive HTTP/1.1 clients request documents (PREFIX plus a number) by a
/// workload, for a duration or a request count, and report throughput,
/// latency percentiles (HDR histogram), cache hits, ccproxy's stage times
/// and, given the update log, stale responses (which fail the run).
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a load.
    Run(RunArgs),
    /// Write a WorldCup-98-shaped access log (Common Log Format).
    GenLog(GenLogArgs),
    /// Write document files (ccappd's format) at one version, with the
    /// sizes of a workload (`--sizes` or from an access log).
    Mkdocs(MkdocsArgs),
    /// Parse an access log and print what a replay would do.
    LogStats(LogStatsArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum WorkloadArg {
    /// Every request is document 0 (the seed's single 8 KB document).
    Single,
    /// Documents 0..DOCS with Zipf popularity (--zipf).
    Zipf,
    /// Replay an access log (--log), in order, shared by all clients.
    Log,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Document URL prefix; the document number is appended
    /// (e.g. http://10.78.0.10:8080/docs/).
    #[arg(long)]
    url: String,
    /// Workload.
    #[arg(long, value_enum, default_value = "zipf")]
    workload: WorkloadArg,
    /// Documents (zipf), or the number of documents log URLs are mapped
    /// onto (log).
    #[arg(long, default_value_t = 20)]
    docs: u32,
    /// Zipf exponent (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Added to every document number (e.g. the single workload on
    /// document 20 while 0..19 hold the Zipf set).
    #[arg(long, default_value_t = 0)]
    first_doc: u32,
    /// Access log to replay (workload log): Common or Combined Log Format.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Concurrent clients (a thread and a keep-alive connection each).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Run this many seconds (after the warm-up). SIGINT or SIGTERM ends
    /// the run earlier: the clients stop and the report covers what ran.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Stop after this many requests instead of a duration.
    #[arg(long)]
    requests: Option<u64>,
    /// Seconds of load before measuring (fills the cache; not recorded).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Bound on each request, seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// The update log (`<unix ns> <doc> <version>`): check every 200 for
    /// staleness and its body for being that version of the document;
    /// any stale, unversioned or wrong body fails the run. Repeat it for
    /// documents sharded over several modules (doc % N; the N logs in
    /// shard order).
    #[arg(long)]
    update_log: Vec<PathBuf>,
    /// Statuses besides 200 that are not a failure (repeatable), e.g. 502
    /// during a fault test.
    #[arg(long)]
    allow_status: Vec<u16>,
    /// Fail if fewer than this fraction of requests got a 200.
    #[arg(long, default_value_t = 0.99)]
    min_ok: f64,
    /// Write the JSON summary here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write every response here: `t0_ns doc status version latency_us cache`.
    #[arg(long)]
    records: Option<PathBuf>,
    /// A label copied into the JSON.
    #[arg(long, default_value = "")]
    label: String,
    /// Seed of the workload's generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct GenLogArgs {
    /// Output file.
    #[arg(long)]
    out: PathBuf,
    /// Lines.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Distinct URLs.
    #[arg(long, default_value_t = 3000)]
    urls: u32,
    /// Zipf exponent of URL popularity.
    #[arg(long, default_value_t = 0.9)]
    zipf: f64,
    /// Mean requests per second outside bursts.
    #[arg(long, default_value_t = 200.0)]
    base_rate: f64,
    /// Rate multiplier in bursts.
    #[arg(long, default_value_t = 8.0)]
    burst: f64,
    /// Malformed lines to mix in (parser tests).
    #[arg(long, default_value_t = 0)]
    malformed: u64,
    /// Seed.
    #[arg(long, default_value_t = 1998)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct MkdocsArgs {
    /// Directory (ccappd's --docroot).
    #[arg(long)]
    docroot: PathBuf,
    /// Documents 0..DOCS.
    #[arg(long, default_value_t = 20)]
    docs: u32,
    /// Smallest size, bytes (sizes are spread geometrically, shuffled).
    #[arg(long, default_value_t = 200)]
    min_size: usize,
    /// Largest size, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_size: usize,
    /// Take sizes from this access log's response sizes instead (URLs
    /// mapped onto DOCS documents as a replay does).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Version written into the files (ccappd --initial-version).
    #[arg(long)]
    version: u64,
    /// Number the files from this document on (as `run --first-doc`).
    #[arg(long, default_value_t = 0)]
    first_doc: u32,
    /// Seed of the size shuffle.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct LogStatsArgs {
    /// Access log.
    #[arg(long)]
    log: PathBuf,
    /// Map URLs onto this many documents.
    #[arg(long)]
    docs: Option<u32>,
}

fn main() -> ExitCode {
    ccache::init_logging();
    let r = match Cli::parse().cmd {
        Cmd::Run(a) => run(a),
        Cmd::GenLog(a) => gen_log(a),
        Cmd::Mkdocs(a) => mkdocs(a),
        Cmd::LogStats(a) => log_stats(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}

fn read_trace(path: &PathBuf, docs: Option<u32>) -> Result<Trace, String> {
    let f = File::open(path).map_err(|e| format!("--log {}: {e}", path.display()))?;
    let t = Trace::from_log(BufReader::new(f), docs)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    if t.malformed > 0 {
        tracing::warn!(
            malformed = t.malformed,
            lines = t.lines,
            first = ?t.first_errors,
            "access log has malformed lines; skipped"
        );
    }
    if t.docs.is_empty() {
        return Err(format!(
            "{}: no GET answered 200/304 in {} lines ({} malformed): nothing to replay",
            path.display(),
            t.lines,
            t.malformed
        ));
    }
    Ok(t)
}

fn gen_log(a: GenLogArgs) -> Result<ExitCode, String> {
    let f = File::create(&a.out).map_err(|e| format!("--out {}: {e}", a.out.display()))?;
    let mut w = BufWriter::new(f);
    let cfg = Wc98 {
        requests: a.requests,
        urls: a.urls,
        zipf: a.zipf,
        base_rate: a.base_rate,
        burst: a.burst,
        malformed: a.malformed,
        seed: a.seed,
        ..Wc98::default()
    };
    load::gen_wc98(&mut w, &cfg)
        .and_then(|()| w.flush())
        .map_err(|e| format!("writing {}: {e}", a.out.display()))?;
    Ok(ExitCode::SUCCESS)
}

fn mkdocs(a: MkdocsArgs) -> Result<ExitCode, String> {
    let sizes: Vec<usize> = match &a.log {
        Some(p) => {
            let t = read_trace(p, Some(a.docs))?;
            (0..a.docs as usize)
                .map(|d| t.sizes.get(d).copied().unwrap_or(0).max(64) as usize)
                .collect()
        }
        None => load::doc_sizes(a.docs, a.min_size, a.max_size, a.seed),
    };
    std::fs::create_dir_all(&a.docroot).map_err(|e| format!("{}: {e}", a.docroot.display()))?;
    for (i, &size) in sizes.iter().enumerate() {
        let d = a.first_doc.saturating_add(i as u32);
        let p = appd::doc_path(&a.docroot, d);
        std::fs::write(&p, appd::doc_body(d, a.version, size))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        println!("{d} {size}");
    }
    Ok(ExitCode::SUCCESS)
}

fn log_stats(a: LogStatsArgs) -> Result<ExitCode, String> {
    let t = read_trace(&a.log, a.docs)?;
    println!(
        "{{\"lines\":{},\"malformed\":{},\"skipped\":{},\"replayed\":{},\"urls\":{},\"docs\":{},\"max_size\":{}}}",
        t.lines,
        t.malformed,
        t.skipped,
        t.docs.len(),
        t.urls,
        t.sizes.len(),
        t.sizes.iter().max().copied().unwrap_or(0)
    );
    Ok(ExitCode::SUCCESS)
}

// ---- the HTTP client ----------------------------------------------------

struct Resp {
    status: u16,
    version: Option<u64>,
    cache: Cache,
    timing: Option<String>,
    close: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cache {
    Hit,
    Miss,
    Other,
}

struct Client {
    addr: SocketAddr,
    host: String,
    timeout: Duration,
    conn: Option<(BufReader<TcpStream>, TcpStream)>,
    body: Vec<u8>,
}

fn bad(e: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.into())
}

impl Client {
    fn get(&mut self, path: &str) -> io::Result<Resp> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, self.timeout)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            s.set_write_timeout(Some(self.timeout))?;
            self.conn = Some((BufReader::with_capacity(64 * 1024, s.try_clone()?), s));
        }
        let r = self.exchange(path);
        if r.as_ref().map_or(true, |r| r.close) {
            self.conn = None;
        }
        r
    }

    fn exchange(&mut self, path: &str) -> io::Result<Resp> {
        let (r, w) = self.conn.as_mut().expect("connected");
        write!(
            w,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ccload\r\n\r\n",
            self.host
        )?;
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        let mut it = line.split_whitespace();
        let proto = it.next().unwrap_or("");
        if !proto.starts_with("HTTP/1.") {
            return Err(bad(format!("not an HTTP/1 status line: {line:?}")));
        }
        let http10 = proto == "HTTP/1.0";
        let status: u16 = it
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
        let (mut len, mut chunked, mut close, mut keep) = (None, false, http10, false);
        let mut resp = Resp {
            status,
            version: None,
            cache: Cache::Other,
            timing: None,
            close: false,
        };
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                return Err(bad("connection closed in the header"));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let Some((k, v)) = l.split_once(':') else {
                return Err(bad(format!("bad header line {l:?}")));
            };
            let v = v.trim();
            match k.to_ascii_lowercase().as_str() {
                "content-length" => {
                    len = Some(v.parse::<usize>().map_err(|_| bad("bad Content-Length"))?)
                }
                "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                "connection" => {
                    close |= v.eq_ignore_ascii_case("close");
                    keep |= v.eq_ignore_ascii_case("keep-alive");
                }
                "x-cc-version" => resp.version = v.parse().ok(),
                "x-cc-cache" => {
                    resp.cache = match v {
                        "hit" => Cache::Hit,
                        "miss" => Cache::Miss,
                        _ => Cache::Other,
                    }
                }
                "x-cc-timing" => resp.timing = Some(v.to_string()),
                _ => {}
            }
        }
        resp.close = close && !(http10 && keep);
        self.body.clear();
        if chunked {
            loop {
                line.clear();
                r.read_line(&mut line)?;
                let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| bad(format!("bad chunk size {line:?}")))?;
                if n == 0 {
                    // Trailers, then the empty line.
                    loop {
                        line.clear();
                        if r.read_line(&mut line)? == 0 || line.trim().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let at = self.body.len();
                self.body.resize(at + n, 0);
                r.read_exact(&mut self.body[at..])?;
                let mut crlf = [0u8; 2];
                r.read_exact(&mut crlf)?;
            }
        } else if let Some(n) = len {
            self.body.resize(n, 0);
            r.read_exact(&mut self.body)?;
        } else if status != 204 && status != 304 {
            r.read_to_end(&mut self.body)?;
            resp.close = true;
        }
        Ok(resp)
    }
}

// ---- the run ---------------------------------------------------------------

enum Picker {
    Single,
    Zipf(Zipf),
    Trace(Arc<Vec<u32>>, Arc<AtomicU64>),
}

struct Rec {
    t0: u128,
    doc: u32,
    status: u16,
    version: Option<u64>,
    lat_us: u64,
    cache: Cache,
    body_ok: bool,
}

#[derive(Default)]
struct Stages {
    n: u64,
    sums: std::collections::BTreeMap<String, u64>,
}

struct Worker {
    hist: Histogram<u64>,
    recs: Vec<Rec>,
    stages: Stages,
    errors: u64,
    first_error: Option<String>,
    status: std::collections::BTreeMap<u16, u64>,
    hits: u64,
    misses: u64,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

struct Shared {
    addr: SocketAddr,
    host: String,
    path: String,
    timeout: Duration,
    check_bodies: bool,
    keep_recs: bool,
    first_doc: u32,
    measuring: AtomicBool,
    stop: AtomicBool,
    budget: Option<AtomicU64>,
}

fn client_loop(sh: Arc<Shared>, picker: Picker, seed: u64) -> Worker {
    let mut c = Client {
        addr: sh.addr,
        host: sh.host.clone(),
        timeout: sh.timeout,
        conn: None,
        body: Vec::new(),
    };
    let mut w = Worker {
        hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds"),
        recs: Vec::new(),
        stages: Stages::default(),
        errors: 0,
        first_error: None,
        status: Default::default(),
        hits: 0,
        misses: 0,
    };
    let mut rng = Rng::new(seed);
    let mut expect = Vec::new();
    while !sh.stop.load(Ordering::Relaxed) {
        let measuring = sh.measuring.load(Ordering::Relaxed);
        if measuring {
            if let Some(b) = &sh.budget {
                if b.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_err()
                {
                    break;
                }
            }
        }
        let doc = match &picker {
            Picker::Single => 0,
            Picker::Zipf(z) => z.sample(&mut rng),
            Picker::Trace(docs, next) => {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                docs[i % docs.len()]
            }
        };
        let doc = doc.saturating_add(sh.first_doc);
        let target = format!("{}{doc}", sh.path);
        let t0 = now_ns();
        let start = Instant::now();
        let r = c.get(&target);
        let lat_us = (start.elapsed().as_nanos() / 1000).max(1) as u64;
        if !measuring {
            continue;
        }
        match r {
            Ok(resp) => {
                // Latency and throughput count HTTP responses only; a
                // connection or protocol failure is an error, below.
                let _ = w.hist.record(lat_us.min(120_000_000));
                *w.status.entry(resp.status).or_default() += 1;
                w.hits += u64::from(resp.cache == Cache::Hit);
                w.misses += u64::from(resp.cache == Cache::Miss);
                let body_ok = if sh.check_bodies && resp.status == 200 {
                    match resp.version {
                        Some(v) => {
                            expect.clear();
                            expect.extend_from_slice(&appd::doc_body(doc, v, c.body.len()));
                            !c.body.is_empty() && expect == c.body
                        }
                        None => false,
                    }
                } else {
                    true
                };
                if let Some(t) = &resp.timing {
                    w.stages.n += 1;
                    for (k, v) in load::parse_timing(t) {
                        *w.stages.sums.entry(k.to_string()).or_default() += v;
                    }
                }
                if sh.keep_recs {
                    w.recs.push(Rec {
                        t0,
                        doc,
                        status: resp.status,
                        version: resp.version,
                        lat_us,
                        cache: resp.cache,
                        body_ok,
                    });
                }
            }
            Err(e) => {
                w.errors += 1;
                *w.status.entry(0).or_default() += 1;
                if w.first_error.is_none() {
                    w.first_error = Some(e.to_string());
                }
                if sh.keep_recs {
                    w.recs.push(Rec {
                        t0,
                        doc,
                        status: 0,
                        version: None,
                        lat_us,
                        cache: Cache::Other,
                        body_ok: true,
                    });
                }
                // Do not spin on a dead server.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    w
}

fn parse_url(url: &str) -> Result<(SocketAddr, String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--url {url}: only http:// URLs are supported"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let hp = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    let addr = hp
        .to_socket_addrs()
        .map_err(|e| format!("--url {url}: cannot resolve {hp}: {e}"))?
        .next()
        .ok_or_else(|| format!("--url {url}: {hp} has no address"))?;
    Ok((addr, hostport.to_string(), path.to_string()))
}

/// SIGINT and SIGTERM, caught for the run: each writes a byte into the
/// pair's other end (signal-hook's self-pipe), so that the timed wait of
/// a run ([`until_signal_or`]) ends on one without polling.
fn catch_stop_signals() -> Result<UnixStream, String> {
    let (rx, tx) = UnixStream::pair().map_err(|e| format!("a socket pair for the signals: {e}"))?;
    for sig in [SIGINT, SIGTERM] {
        let tx = tx
            .try_clone()
            .map_err(|e| format!("a socket pair for the signals: {e}"))?;
        signal_hook::low_level::pipe::register(sig, tx)
            .map_err(|e| format!("catching signal {sig}: {e}"))?;
    }
    Ok(rx)
}

/// Wait `d`, or less if SIGINT or SIGTERM arrives ([`catch_stop_signals`]).
fn until_signal_or(mut rx: &UnixStream, d: Duration) {
    let end = Instant::now() + d;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() || rx.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match rx.read(&mut [0u8; 1]) {
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            // A byte (a signal), or the pair gone (cannot be: `tx` lives
            // in the handler): the run ends now.
            _ => return,
        }
    }
}

fn run(a: RunArgs) -> Result<ExitCode, String> {
    let (addr, host, path) = parse_url(&a.url)?;
    if a.clients == 0 {
        return Err("--clients 0: need at least one client".into());
    }
    let trace = match a.workload {
        WorkloadArg::Log => {
            let p = a
                .log
                .as_ref()
                .ok_or("--workload log needs --log FILE (an access log)")?;
            Some(Arc::new(read_trace(p, Some(a.docs))?.docs))
        }
        _ => None,
    };
    let log = (!a.update_log.is_empty()).then(|| a.update_log.clone());
    let signals = catch_stop_signals()?;
    let sh = Arc::new(Shared {
        addr,
        host,
        path,
        timeout: Duration::from_secs_f64(a.timeout.max(0.001)),
        check_bodies: log.is_some(),
        keep_recs: log.is_some() || a.records.is_some(),
        first_doc: a.first_doc,
        measuring: AtomicBool::new(a.warmup <= 0.0),
        stop: AtomicBool::new(false),
        budget: a.requests.map(AtomicU64::new),
    });
    let next = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..a.clients)
        .map(|i| {
            let picker = match a.workload {
                WorkloadArg::Single => Picker::Single,
                WorkloadArg::Zipf => Picker::Zipf(Zipf::new(a.docs, a.zipf)),
                WorkloadArg::Log => Picker::Trace(trace.clone().expect("read above"), next.clone()),
            };
            let sh = sh.clone();
            let seed = a.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
            std::thread::spawn(move || client_loop(sh, picker, seed))
        })
        .collect();
    if a.warmup > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(a.warmup));
        sh.measuring.store(true, Ordering::Release);
    }
    let start = Instant::now();
    if a.requests.is_none() {
        until_signal_or(&signals, Duration::from_secs_f64(a.duration.max(0.0)));
        sh.stop.store(true, Ordering::Release);
    }
    let workers: Vec<Worker> = handles
        .into_iter()
        .map(|h| h.join().map_err(|_| "a client thread panicked".to_string()))
        .collect::<Result<_, _>>()?;
    let elapsed = start.elapsed().as_secs_f64();
    sh.stop.store(true, Ordering::Release);

    let mut hist = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("valid bounds");
    let mut stages = Stages::default();
    let mut errors = 0;
    let mut first_error = None;
    let mut recs = Vec::new();
    let mut status: std::collections::BTreeMap<u16, u64> = Default::default();
    let (mut hits, mut misses) = (0u64, 0u64);
    for w in workers {
        for (k, v) in &w.status {
            *status.entry(*k).or_default() += v;
        }
        hits += w.hits;
        misses += w.misses;
        hist.add(&w.hist)
            .map_err(|e| format!("merging histograms: {e}"))?;
        stages.n += w.stages.n;
        for (k, v) in w.stages.sums {
            *stages.sums.entry(k).or_default() += v;
        }
        errors += w.errors;
        first_error = first_error.or(w.first_error);
        recs.extend(w.recs);
    }
    recs.sort_by_key(|r| r.t0);
    let total = hist.len();
    if let Some(e) = &first_error {
        tracing::warn!(errors, first = %e, "requests failed (connection or protocol errors)");
    }

    // The stale check.
    let mut verdict = String::new();
    let ok200 = status.get(&200).copied().unwrap_or(0);
    let mut pass = (ok200 as f64) >= a.min_ok * (total + errors) as f64;
    if let Some(ps) = &log {
        let mut files = Vec::new();
        for p in ps {
            let f = File::open(p).map_err(|e| format!("--update-log {}: {e}", p.display()))?;
            files.push(BufReader::new(f));
        }
        let ul =
            UpdateLog::read_sharded(files).map_err(|e| format!("reading the update logs: {e}"))?;
        let (mut stale, mut unversioned, mut nolog, mut bad_body) = (0u64, 0u64, 0u64, 0u64);
        let mut shown = 0;
        for r in recs.iter().filter(|r| r.status == 200) {
            if !r.body_ok {
                bad_body += 1;
            }
            match load::judge(&ul, r.doc, r.t0, r.version) {
                Verdict::Fresh => {}
                Verdict::Stale { served, required } => {
                    stale += 1;
                    if shown < 5 {
                        shown += 1;
                        eprintln!(
                            "STALE: doc {} sent at {} ns served version {served}, {required} was committed before",
                            r.doc, r.t0
                        );
                    }
                }
                Verdict::Unversioned => unversioned += 1,
                Verdict::NoLogEntry => nolog += 1,
            }
        }
        let ok = status.get(&200).copied().unwrap_or(0);
        let unexpected = recs
            .iter()
            .filter(|r| r.status != 200 && !a.allow_status.contains(&r.status))
            .count();
        pass &= stale == 0
            && unversioned == 0
            && nolog == 0
            && bad_body == 0
            && ul.bad_lines == 0
            && unexpected == 0
            && (ok as f64) >= a.min_ok * recs.len() as f64;
        verdict = format!(
            ",\"stale\":{stale},\"unversioned\":{unversioned},\"no_log_entry\":{nolog},\"bad_body\":{bad_body},\"unexpected_status\":{unexpected},\"updates_logged\":{},\"bad_log_lines\":{},\"pass\":{pass}",
            ul.commits(),
            ul.bad_lines
        );
    }

    if let Some(p) = &a.records {
        let f = File::create(p).map_err(|e| format!("--records {}: {e}", p.display()))?;
        let mut w = BufWriter::new(f);
        for r in &recs {
            let v = r.version.map_or("-".to_string(), |v| v.to_string());
            let c = match r.cache {
                Cache::Hit => "hit",
                Cache::Miss => "miss",
                Cache::Other => "-",
            };
            writeln!(w, "{} {} {} {v} {} {c}", r.t0, r.doc, r.status, r.lat_us)
                .map_err(|e| e.to_string())?;
        }
        w.flush().map_err(|e| e.to_string())?;
    }

    let rps = total as f64 / elapsed.max(1e-9);
    let q = |p: f64| hist.value_at_quantile(p);
    let mean_stage = |k: &str| {
        stages
            .sums
            .get(k)
            .map_or(0.0, |&s| s as f64 / stages.n.max(1) as f64)
    };
    let stage_json: Vec<String> = stages
        .sums
        .keys()
        .map(|k| format!("\"{k}\":{:.1}", mean_stage(k)))
        .collect();
    let status_json: Vec<String> = status.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    let json = format!(
        "{{\"label\":\"{}\",\"workload\":\"{:?}\",\"clients\":{},\"seconds\":{elapsed:.3},\"requests\":{total},\"errors\":{errors},\"req_per_s\":{rps:.1},\"mean_us\":{:.1},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"max_us\":{},\"status\":{{{}}},\"hits\":{hits},\"misses\":{misses},\"stage_mean_us\":{{{}}}{verdict}}}",
        a.label.replace('"', "'"),
        a.workload,
        a.clients,
        hist.mean(),
        q(0.5),
        q(0.9),
        q(0.99),
        hist.max(),
        status_json.join(","),
        stage_json.join(","),
    );
    eprintln!(
        "{total} requests in {elapsed:.2} s: {rps:.0} req/s; latency us p50 {} p90 {} p99 {} max {} (mean {:.0}); errors {errors}",
        q(0.5),
        q(0.9),
        q(0.99),
        hist.max(),
        hist.mean()
    );
    if stages.n > 0 {
        let s: Vec<String> = stages
            .sums
            .keys()
            .map(|k| format!("{k} {:.0}", mean_stage(k)))
            .collect();
        eprintln!("ccproxy stage means (us): {}", s.join(", "));
    }
    println!("{json}");
    if let Some(p) = &a.json {
        std::fs::write(p, format!("{json}\n"))
            .map_err(|e| format!("--json {}: {e}", p.display()))?;
    }
    if total == 0 {
        return Err(format!(
            "no request got a response ({errors} failed; first: {})",
            first_error.as_deref().unwrap_or("none")
        ));
    }
    if !pass && log.is_none() {
        eprintln!(
            "FAIL: {ok200} of {} requests got a 200, below --min-ok {}",
            total + errors,
            a.min_ok
        );
    }
    Ok(if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
