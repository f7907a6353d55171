//! `ccappd`: the application module of the strongly coherent cache. See
//! `docs/CACHE.md`.
#![deny(unsafe_code)]

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ccache::appd::{self, IpcState, UpdaterCfg};
use ccache::push::{PushCfg, Pusher, StateRead};
use ccache::table::VersionTable;
use ccache_proto::state::Policy as PushPolicy;
use clap::{Parser, ValueEnum};
use iwarp::cm::{Listener, MpaConfig, Policy};
use iwarp::Context;

/// Application module (issue 13): owns the documents' version table in a
/// registered memory region that proxies RDMA-Read, answers two-sided
/// version requests, serves the Table 1 read/update IPC to the application
/// server, and optionally runs the update thread.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Read settings from FILE first: lines `key = value`, keys are the
    /// long flags (e.g. `push-policy = hybrid`); the command line wins.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Number of documents (version slots); documents are 0..DOCS.
    #[arg(long, default_value_t = 64)]
    docs: u32,
    /// Initial version of every document. Default: the start time in
    /// nanoseconds since 1970, so versions never repeat across restarts (a
    /// proxy's cached copy of an old run can never match a new version).
    #[arg(long)]
    initial_version: Option<u64>,
    /// iWARP listen address for proxies' RDMA version reads.
    #[arg(long, default_value = "127.0.0.1:7471")]
    rdma_listen: SocketAddr,
    /// TCP listen address of the version thread (two-sided checks).
    #[arg(long, default_value = "127.0.0.1:7472")]
    version_listen: SocketAddr,
    /// Listen address of the version thread over iWARP sockets (mode
    /// sockets of ccproxy); off unless given.
    #[arg(long)]
    sockets_listen: Option<SocketAddr>,
    /// Unix socket of the Table 1 IPC (application server, update thread).
    #[arg(long, default_value = "/tmp/ccappd.sock")]
    ipc: PathBuf,
    /// Permission bits of the IPC socket, octal (e.g. 666 so that Apache's
    /// CGI user can connect).
    #[arg(long, default_value = "600")]
    ipc_mode: String,
    /// Close an IPC or version connection idle this many seconds (a reader
    /// that never sends READ_DONE is released then).
    #[arg(long, default_value_t = 60)]
    idle_secs: u64,
    /// Directory of the documents' files (named 0, 1, ...).
    #[arg(long)]
    docroot: Option<PathBuf>,
    /// Write every document's file at the initial version on start.
    #[arg(long, requires = "docroot")]
    init_docs: bool,
    /// Bytes per document file.
    #[arg(long, default_value_t = 8192)]
    doc_size: usize,
    /// Run the update thread at this many updates per second (0: off).
    #[arg(long, default_value_t = 0.0, requires = "docroot")]
    update_rate: f64,
    /// Pieces each update writes the file in (with a pause between).
    #[arg(long, default_value_t = 4)]
    update_steps: usize,
    /// Append `<unix ns> <doc> <version>` here for every committed update.
    #[arg(long)]
    update_log: Option<PathBuf>,
    /// Busy-loop threads that load this host's CPUs, standing in for a
    /// busy application server (the seed's "compute threads").
    #[arg(long, default_value_t = 0)]
    compute_threads: usize,
    /// Make each compute thread sleep this long (µs) after every
    /// --compute-slice-us of work, as request handlers that block on I/O
    /// do (0: pure busy loops, the seed's).
    #[arg(long, default_value_t = 0)]
    compute_sleep_us: u64,
    /// Work between two sleeps of a compute thread (µs; used only with
    /// --compute-sleep-us).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    compute_slice_us: u64,
    /// TCP listen address where proxies register for pushes (and through
    /// which the update thread learns which documents are accessed).
    /// Needs --docroot.
    #[arg(long, requires = "docroot")]
    push_listen: Option<SocketAddr>,
    /// When to push an updated document to registered proxies.
    #[arg(long, value_enum, default_value = "pull")]
    push_policy: PolicyArg,
    /// Hybrid: push only if the document is in the top PERCENT of the
    /// proxy's most-recently-accessed list.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u8).range(0..=100))]
    hybrid_percent: u8,
    /// How proxies' cache states are read.
    #[arg(long, value_enum, default_value = "rdma")]
    state_read: StateReadArg,
    /// Which document the update thread updates.
    #[arg(long, value_enum, default_value = "uniform")]
    update_select: SelectArg,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PolicyArg {
    /// Never push: proxies fetch on a miss or a stale copy.
    Pull,
    /// Push to every proxy that has the document cached.
    Push,
    /// Push only to proxies where it is in the top --hybrid-percent of the
    /// recently accessed.
    Hybrid,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StateReadArg {
    /// RDMA Read of the proxy's state region (if it registered an iWARP
    /// listener; else, or if the Read fails, over the push channel).
    Rdma,
    /// Always ask over the push channel.
    Tcp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SelectArg {
    /// Any document, uniformly.
    Uniform,
    /// A random document that a registered proxy accessed recently (the
    /// seed's update server); needs --push-listen.
    Accessed,
}

fn main() -> ExitCode {
    ccache::init_logging();
    let a = match ccache::args_with_config(std::env::args_os().collect()) {
        Ok(args) => Args::parse_from(args),
        Err(e) => {
            eprintln!("ccappd: {e}");
            return ExitCode::from(2);
        }
    };
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<(), String> {
    if a.docs == 0 {
        return Err("--docs 0: the version table needs at least one document".into());
    }
    let mode = u32::from_str_radix(&a.ipc_mode, 8).map_err(|e| {
        format!(
            "--ipc-mode {}: not octal ({e}); e.g. 600 or 666",
            a.ipc_mode
        )
    })?;
    let initial = a.initial_version.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    if let (true, Some(root)) = (a.init_docs, &a.docroot) {
        appd::init_docs(root, a.docs, initial, a.doc_size)
            .map_err(|e| format!("writing documents under {}: {e}", root.display()))?;
    }
    let ctx = Context::open().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).map_err(|e| e.to_string())?;
    let table = Arc::new(
        VersionTable::new(&pd, a.docs, initial)
            .map_err(|e| format!("registering the version table: {e}"))?,
    );
    let idle = Duration::from_secs(a.idle_secs.max(1));
    if let Some(p) = &a.update_log {
        appd::log_initial(p, a.docs, initial)
            .map_err(|e| format!("--update-log {}: {e}", p.display()))?;
    }

    // MPA CRC off: a slot may change between the CRC and the copy of a
    // Read Response (docs/CACHE.md); the slots carry their own check.
    let mpa = MpaConfig {
        crc: Policy::Off,
        ..MpaConfig::default()
    };
    let rl = Listener::bind(a.rdma_listen, mpa)
        .map_err(|e| format!("--rdma-listen {}: {e}", a.rdma_listen))?;
    let vl = TcpListener::bind(a.version_listen).map_err(|e| {
        format!(
            "--version-listen {}: {e} (port in use? pick another)",
            a.version_listen
        )
    })?;
    if a.ipc.exists() {
        // A socket file left by an earlier run; refuse anything else.
        let meta = std::fs::symlink_metadata(&a.ipc).map_err(|e| e.to_string())?;
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(format!(
                "--ipc {} exists and is not a socket: remove it or pick another path",
                a.ipc.display()
            ));
        }
        std::fs::remove_file(&a.ipc)
            .map_err(|e| format!("removing stale {}: {e}", a.ipc.display()))?;
    }
    let il = UnixListener::bind(&a.ipc).map_err(|e| format!("--ipc {}: {e}", a.ipc.display()))?;
    std::fs::set_permissions(&a.ipc, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {:o} {}: {e}", mode, a.ipc.display()))?;
    tracing::info!(
        docs = a.docs,
        rdma = %rl.local_addr(),
        version = %a.version_listen,
        ipc = %a.ipc.display(),
        rkey = format_args!("{:#010x}", table.advert().rkey),
        "ccappd ready"
    );

    let slice = std::time::Duration::from_micros(a.compute_slice_us);
    let sleep = std::time::Duration::from_micros(a.compute_sleep_us);
    for _ in 0..a.compute_threads {
        std::thread::spawn(move || appd::compute_loop(slice, sleep));
    }
    let mut state = IpcState::new(table.clone(), initial);
    if let Some(addr) = a.push_listen {
        let pl = TcpListener::bind(addr)
            .map_err(|e| format!("--push-listen {addr}: {e} (port in use? pick another)"))?;
        let policy = match a.push_policy {
            PolicyArg::Pull => PushPolicy::Pull,
            PolicyArg::Push => PushPolicy::Push,
            PolicyArg::Hybrid => PushPolicy::Hybrid {
                percent: a.hybrid_percent,
            },
        };
        let pusher = Arc::new(Pusher::new(PushCfg {
            policy,
            ipc: a.ipc.clone(),
            docroot: a.docroot.clone().expect("clap requires --docroot"),
            state_read: match a.state_read {
                StateReadArg::Rdma => StateRead::Rdma,
                StateReadArg::Tcp => StateRead::Tcp,
            },
            timeout: Duration::from_secs(5),
        }));
        tracing::info!(listen = %addr, %policy, "push listener ready");
        let p = pusher.clone();
        std::thread::spawn(move || p.serve_registrations(pl));
        let p = pusher.clone();
        std::thread::spawn(move || p.run());
        state = state.with_pusher(pusher);
    } else if matches!(a.update_select, SelectArg::Accessed) {
        return Err("--update-select accessed needs --push-listen (proxies register there, and their states say what was accessed)".into());
    }
    let state = Arc::new(state);
    let t2 = table.clone();
    std::thread::spawn(move || appd::serve_versions(vl, t2, idle));
    if let Some(addr) = a.sockets_listen {
        let at = ccache::sockets::spawn_listener(addr, table.clone(), idle)?;
        tracing::info!(sockets = %at, "version thread listening on iWARP sockets");
    }
    std::thread::spawn(move || appd::serve_ipc(il, state, idle));
    if a.update_rate > 0.0 {
        let cfg = UpdaterCfg {
            ipc: a.ipc.clone(),
            docroot: a.docroot.clone().expect("clap requires --docroot"),
            docs: a.docs,
            doc_size: a.doc_size,
            rate: a.update_rate,
            steps: a.update_steps,
            log: a.update_log.clone(),
            timeout: Duration::from_secs(10),
            count: None,
            select: match a.update_select {
                SelectArg::Uniform => appd::Select::Uniform,
                SelectArg::Accessed => appd::Select::Accessed,
            },
        };
        std::thread::spawn(move || {
            if let Err(e) = appd::run_updater(cfg) {
                tracing::error!("update thread stopped: {e}");
            }
        });
    }
    appd::serve_rdma(rl, pd, cq, table).map_err(|e| e.to_string())
}
