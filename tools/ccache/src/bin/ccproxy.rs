//! `ccproxy`: the strongly coherent caching reverse proxy. See
//! `docs/CACHE.md`.
#![deny(unsafe_code)]

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ccache::access::Token;
use ccache::acheck::{AsyncCheck, RdmaWait};
use ccache::listen::{Endpoint, ListenCfg, ListenStats};
use ccache::proxy::{self, Mode, Proxy, ProxyCfg};
use ccache::push;
use ccache::shard::{ShardMap, Sharded};
use ccache::state::CacheState;
use ccache_proto::push::Registration;
use clap::{CommandFactory, Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    /// No cache: forward every request.
    None,
    /// Validate every request by an RDMA Read of the version slot.
    Rdma,
    /// Validate every request by asking ccappd's version thread over TCP.
    Tcp,
    /// The same request as tcp, over Sockets over iWARP (iwarp-sockets).
    Sockets,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum WaitArg {
    /// The event loop thread reads the Read Response from the socket
    /// itself (application-driven progress): no provider thread.
    EventLoop,
    /// The provider's receive thread reads it and wakes the event loop
    /// through the CQ's eventfd.
    ProviderThread,
}

/// HTTP/1.1 caching reverse proxy with strong coherency (issue 13): every
/// request for a document (PREFIX plus a number) is validated at the application
/// module before it is answered from cache; responses carry X-CC-Version.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Read settings from FILE first: TOML whose keys are the long flags
    /// (e.g. `mode = "tcp"`; docs/CACHE.md). CCPROXY_KEY=value variables
    /// override the file (e.g. CCPROXY_MODE=tcp), and the command line wins
    /// over both. The old `key = value` syntax with bare values is still
    /// read, with a warning.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Listen address for clients.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The application server (HTTP).
    #[arg(long, required_unless_present = "shards")]
    backend: Option<SocketAddr>,
    /// Validation mode.
    #[arg(long, value_enum, default_value = "rdma")]
    mode: ModeArg,
    /// ccappd's --rdma-listen address (mode rdma).
    #[arg(long, default_value = "127.0.0.1:7471")]
    appd_rdma: SocketAddr,
    /// ccappd's --version-listen address (mode tcp).
    #[arg(long, default_value = "127.0.0.1:7472")]
    appd_tcp: SocketAddr,
    /// ccappd's --sockets-listen address (mode sockets).
    #[arg(long, default_value = "127.0.0.1:7473")]
    appd_sockets: SocketAddr,
    /// Shard map file: documents spread over several application servers
    /// (see docs/CACHE.md); replaces --backend and --appd-*.
    #[arg(long, conflicts_with = "backend")]
    shards: Option<std::path::PathBuf>,
    /// Path prefix of documents; the rest of the path is the document number.
    #[arg(long, default_value = "/cgi-bin/doc.cgi/")]
    prefix: String,
    /// How an RDMA check learns that its Read completed (see docs/CACHE.md).
    #[arg(long, value_enum, default_value = "event-loop")]
    rdma_wait: WaitArg,
    /// Event loop (tokio worker) threads; 0: one per CPU this process may
    /// run on.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Version-check connections (each serves one check at a time; more
    /// concurrent checks wait for a free one).
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
    /// Most documents cached; the least recently accessed is evicted
    /// (0: no limit; --cache-bytes bounds the memory anyway).
    #[arg(long, default_value_t = 0)]
    cache_docs: usize,
    /// Most bytes of document bodies cached; the least recently accessed
    /// are evicted to make room (0: no limit, not recommended).
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    cache_bytes: usize,
    /// Largest document fetched from the application server, bytes; a
    /// larger one is answered 502 naming this flag. Concurrent misses on
    /// one document share one fetch, so fetch buffers take at most
    /// --max-conns times this.
    #[arg(long, default_value_t = proxy::MAX_BODY as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_doc_bytes: u64,
    /// Register for pushes with ccappd's --push-listen at this address
    /// (adaptive push-pull; see docs/CACHE.md).
    #[arg(long)]
    push_appd: Option<SocketAddr>,
    /// iWARP listen address from which ccappd RDMA-Reads this proxy's
    /// cache state region (default: none; ccappd then asks over the push
    /// channel).
    #[arg(long, requires = "push_appd")]
    state_rdma_listen: Option<SocketAddr>,
    /// Entries of the most-recently-accessed list in the state region.
    #[arg(long, default_value_t = 1024)]
    state_entries: u32,
    /// Publish the cache state this often, milliseconds.
    #[arg(long, default_value_t = 10)]
    state_interval_ms: u64,
    /// The deployment's access token: a copy of ccappd's --token-file
    /// (by default /var/lib/ccappd/token on ccappd's host; mode 0600 here
    /// too). Proven to ccappd's version table and push listener; ccappd
    /// must prove it to read the state region (--state-rdma-listen) and to
    /// push. Required in mode rdma and with --push-appd.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Run without an access token in mode rdma or with --push-appd
    /// (ccappd must run with --insecure-no-token too): anyone who reaches
    /// --state-rdma-listen may read the state region, and a push channel
    /// is not authenticated. Only for a closed test network.
    #[arg(long, conflicts_with = "token_file")]
    insecure_no_token: bool,
    /// Most live RDMA connections to the state region (ccappd opens one);
    /// one more gets an MPA Reject ("busy").
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    state_rdma_max_conns: u64,
}

fn checkers(
    a: &Args,
    token: &Option<Token>,
    rdma: Option<SocketAddr>,
    tcp: Option<SocketAddr>,
    sockets: Option<SocketAddr>,
) -> Result<(Mode, Vec<AsyncCheck>), String> {
    let t = Duration::from_millis(a.check_timeout_ms.max(1));
    let n = a.check_conns.max(1);
    let need = |x: Option<SocketAddr>, what: &str| {
        x.ok_or(format!(
            "mode {:?} needs the module's {what} address (rdma=/tcp=/sockets= in the shard map)",
            a.mode
        ))
    };
    Ok(match a.mode {
        ModeArg::None => (Mode::None, Vec::new()),
        ModeArg::Rdma => {
            let addr = need(rdma, "RDMA")?;
            let wait = match a.rdma_wait {
                WaitArg::EventLoop => RdmaWait::EventLoop,
                WaitArg::ProviderThread => RdmaWait::ProviderThread,
            };
            (
                Mode::Rdma,
                (0..n)
                    .map(|_| AsyncCheck::rdma(addr, t, wait).with_token(token.clone()))
                    .collect(),
            )
        }
        ModeArg::Tcp => {
            let addr = need(tcp, "TCP version")?;
            (
                Mode::Tcp,
                (0..n).map(|_| AsyncCheck::tcp(addr, t)).collect(),
            )
        }
        ModeArg::Sockets => {
            let addr = need(sockets, "sockets version")?;
            (
                Mode::Sockets,
                (0..n).map(|_| AsyncCheck::sockets(addr, t)).collect(),
            )
        }
    })
}

fn main() -> ExitCode {
    ccache::init_logging();
    let a = match ccache::args_with_config(
        &Args::command(),
        "CCPROXY",
        std::env::args_os().collect(),
    ) {
        Ok(args) => Args::parse_from(args),
        Err(e) => {
            eprintln!("ccproxy: {e}");
            return ExitCode::from(2);
        }
    };
    match run(a) {
        // `serve` returns only if the listener fails.
        Ok(()) => ExitCode::FAILURE,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<(), String> {
    // First: a proxy that ccappd would refuse at every check must not
    // start and answer 502s.
    let needs = if matches!(a.mode, ModeArg::Rdma) {
        Some("--mode rdma (its checks RDMA-Read ccappd's version table)")
    } else if a.push_appd.is_some() {
        Some("--push-appd (registering with ccappd for pushes)")
    } else {
        None
    };
    let token = ccache::access::client_token(
        "ccproxy",
        a.token_file.as_deref(),
        a.insecure_no_token,
        needs,
    )?;
    let cfg_for = |backend: SocketAddr, mode: Mode| ProxyCfg {
        backend,
        prefix: a.prefix.clone(),
        mode,
        backend_timeout: Duration::from_millis(a.backend_timeout_ms.max(1)),
        idle: Duration::from_secs(a.idle_secs.max(1)),
        max_doc_bytes: usize::try_from(a.max_doc_bytes).unwrap_or(usize::MAX),
    };
    let listener = TcpListener::bind(a.listen)
        .map_err(|e| format!("--listen {}: {e} (port in use? pick another)", a.listen))?;
    // One cache (and one cache state region) for every shard.
    let cache = Arc::new(CacheState::with_limits(
        a.cache_docs,
        a.cache_bytes,
        a.state_entries,
    ));
    cache.spawn_publisher(Duration::from_millis(a.state_interval_ms.max(1)));
    if let Some(appd) = a.push_appd {
        let reg = push_setup(&cache, a.state_rdma_listen, &token, a.state_rdma_max_conns)?;
        let c = cache.clone();
        let cfg = push::AgentCfg {
            timeout: Duration::from_secs(5),
            retry: Duration::from_secs(1),
            token: token.clone(),
            max_doc: u32::try_from(a.max_doc_bytes).unwrap_or(u32::MAX),
        };
        std::thread::spawn(move || push::run_agent(appd, reg, c, cfg));
    }
    if let Some(path) = &a.shards {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--shards {}: {e}", path.display()))?;
        let map =
            ShardMap::parse(&text).map_err(|e| format!("--shards {}: {e}", path.display()))?;
        let mut proxies = Vec::new();
        for s in &map.shards {
            let (mode, c) = checkers(&a, &token, s.rdma, s.tcp, s.sockets)?;
            proxies.push(Proxy::with_cache(
                cfg_for(s.backend, mode),
                c,
                cache.clone(),
            ));
        }
        tracing::info!(listen = %a.listen, shards = map.shards.len(), mode = ?a.mode, "ccproxy ready (sharded)");
        let e = proxy::serve(
            listener,
            Arc::new(Sharded::new(map, proxies)),
            a.max_conns.max(1),
            a.threads,
        );
        return Err(format!("serving clients: {e}"));
    }
    let backend = a.backend.ok_or("--backend or --shards is required")?;
    let (mode, c) = checkers(
        &a,
        &token,
        Some(a.appd_rdma),
        Some(a.appd_tcp),
        Some(a.appd_sockets),
    )?;
    tracing::info!(listen = %a.listen, %backend, mode = ?a.mode, "ccproxy ready");
    let e = proxy::serve(
        listener,
        Arc::new(Proxy::with_cache(cfg_for(backend, mode), c, cache)),
        a.max_conns.max(1),
        a.threads,
    );
    Err(format!("serving clients: {e}"))
}

/// Register the state region (and, with `rdma`, listen for ccappd's RDMA
/// Reads of it); the registration to send.
fn push_setup(
    cache: &Arc<CacheState>,
    rdma: Option<SocketAddr>,
    token: &Option<Token>,
    max_conns: u64,
) -> Result<Registration, String> {
    let len = cache.region_len();
    let Some(addr) = rdma else {
        return Ok(Registration {
            rdma: None,
            addr: 0,
            rkey: 0,
            len: len as u32,
        });
    };
    let ctx = iwarp::Context::open().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).map_err(|e| e.to_string())?;
    let mr = pd
        .reg_mr(len, iwarp::Access::LOCAL_WRITE | iwarp::Access::REMOTE_READ)
        .map_err(|e| format!("registering the cache state region: {e}"))?;
    let reg = Registration {
        rdma: Some(addr),
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: len as u32,
    };
    cache.attach_region(mr);
    // CRC off: the region changes while a Read Response may carry it
    // (docs/CACHE.md); the region's check words cover it.
    let mpa = iwarp::cm::MpaConfig {
        crc: iwarp::cm::Policy::Off,
        ..iwarp::cm::MpaConfig::default()
    };
    let l = Endpoint::bind(&ctx, addr, mpa)
        .map_err(|e| format!("--state-rdma-listen {addr}: {e} (port in use? pick another)"))?;
    let local = l.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %local, len, "cache state region readable by RDMA");
    let cfg = ListenCfg {
        token: token.clone(),
        max_conns: max_conns as usize,
        ..ListenCfg::new(
            "cache state",
            ccache_proto::auth::LABEL_STATE_REGION,
            Vec::new(),
        )
    };
    std::thread::spawn(move || {
        let _ctx = ctx;
        ccache::listen::serve(l, pd, cq, cfg, Arc::new(ListenStats::default()))
    });
    Ok(reg)
}
