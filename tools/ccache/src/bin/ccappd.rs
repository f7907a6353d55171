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
use ccache::table::VersionTable;
use clap::Parser;
use iwarp::cm::{Listener, MpaConfig, Policy};
use iwarp::Context;

/// Application module (issue 13): owns the documents' version table in a
/// registered memory region that proxies RDMA-Read, answers two-sided
/// version requests, serves the Table 1 read/update IPC to the application
/// server, and optionally runs the update thread.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
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
}

fn main() -> ExitCode {
    ccache::init_logging();
    let a = Args::parse();
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

    for _ in 0..a.compute_threads {
        std::thread::spawn(appd::compute_loop);
    }
    let state = Arc::new(IpcState::new(table.clone(), initial));
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
        };
        std::thread::spawn(move || {
            if let Err(e) = appd::run_updater(cfg) {
                tracing::error!("update thread stopped: {e}");
            }
        });
    }
    appd::serve_rdma(rl, pd, cq, table).map_err(|e| e.to_string())
}
