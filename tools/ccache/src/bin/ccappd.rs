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

use ccache::access::{Allow, Token};
use ccache::appd::{self, IpcCfg, IpcState, UpdaterCfg};
use ccache::listen::{Endpoint, ListenCfg, ListenStats};
use ccache::push::{PushCfg, Pusher, StateRead};
use ccache::table::VersionTable;
use ccache_proto::state::Policy as PushPolicy;
use clap::{CommandFactory, Parser, ValueEnum};
use iwarp::cm::{MpaConfig, Policy};
use iwarp::Context;

/// Application module (issue 13): owns the documents' version table in a
/// registered memory region that proxies RDMA-Read, answers two-sided
/// version requests, serves the Table 1 read/update IPC to the application
/// server, and optionally runs the update thread.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Read settings from FILE first: TOML whose keys are the long flags
    /// (e.g. `push_policy = "hybrid"`; docs/CACHE.md). CCAPPD_KEY=value variables
    /// override the file (e.g. CCAPPD_DOCS=1024), and the command line wins
    /// over both. The old `key = value` syntax with bare values is still
    /// read, with a warning.
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
    /// Its directory is created (mode 0750, group --ipc-group) if missing.
    #[arg(long, default_value = "/run/ccappd/ipc.sock")]
    ipc: PathBuf,
    /// Permission bits of the IPC socket, octal. Give the web server's
    /// group access with --ipc-group rather than a mode for everyone.
    #[arg(long, default_value = "660")]
    ipc_mode: String,
    /// Group of the IPC socket (and of its directory when ccappd creates
    /// it), e.g. www-data; its members are also allowed to connect.
    #[arg(long)]
    ipc_group: Option<String>,
    /// Users (names or uids, comma-separated, repeatable) whose processes
    /// may use the IPC socket, besides ccappd's own user and root; checked
    /// by SO_PEERCRED on every connection.
    #[arg(long, value_delimiter = ',')]
    ipc_allow_user: Vec<String>,
    /// Groups (names or gids) whose processes may use the IPC socket.
    #[arg(long, value_delimiter = ',')]
    ipc_allow_group: Vec<String>,
    /// Most IPC connections served at once; one more is answered
    /// ERROR(busy) and closed. Apache uses one per request in progress.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    ipc_max_conns: u64,
    /// Replies queued for one IPC client before it is dropped for not
    /// reading them.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    ipc_queue: u64,
    /// Bound on writing one reply to an IPC client, milliseconds; a client
    /// that does not take it in time is dropped.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    ipc_write_timeout_ms: u64,
    /// Longest an IPC client may hold a read or an update, seconds; then it
    /// is dropped (its read released, its update committed).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    ipc_hold_secs: u64,
    /// Most version-thread connections (TCP, and iWARP sockets) served at
    /// once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    version_max_conns: u64,
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
    /// The deployment's access token (64 hex digits, mode 0600; created,
    /// with its directory (0700), if missing). Proxies must prove it to
    /// read the version table (--rdma-listen) and to register for pushes;
    /// ccappd proves it to read their state regions. Copy the file to
    /// every proxy (their --token-file). [default: /var/lib/ccappd/token]
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// No access token: anyone who reaches --rdma-listen may read the
    /// version table, and anyone who reaches --push-listen may register
    /// for pushes. Only for a closed test network; logs a warning.
    #[arg(long, conflicts_with = "token_file")]
    insecure_no_token: bool,
    /// Most live RDMA connections to the version table; one more gets an
    /// MPA Reject ("busy"). Each proxy opens --check-conns (default 4).
    #[arg(long, default_value_t = ccache::listen::MAX_CONNS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    rdma_max_conns: u64,
    /// Most RDMA (MPA) handshakes in progress at once, on the version
    /// table's listener and (separately) on --sockets-listen; one more
    /// connection is closed at once.
    #[arg(long, default_value_t = ccache::listen::MAX_HANDSHAKES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    rdma_max_handshakes: u64,
    /// How long a connected peer has to send its MPA Request,
    /// milliseconds, on --rdma-listen and --sockets-listen (there also the
    /// bound on the stream's first message); a silent one is dropped then
    /// (it delays nobody else).
    #[arg(long, default_value_t = ccache::listen::HANDSHAKE_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    rdma_handshake_ms: u64,
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
    let a =
        match ccache::args_with_config(&Args::command(), "CCAPPD", std::env::args_os().collect()) {
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
    let rl = Endpoint::bind(&ctx, a.rdma_listen, mpa).map_err(|e| {
        format!(
            "--rdma-listen {}: {e} (port in use? pick another)",
            a.rdma_listen
        )
    })?;
    let token = if a.insecure_no_token {
        tracing::warn!("--insecure-no-token: the RDMA listeners and the push listener accept anyone who reaches them (a closed test network only; drop the flag to use the token file)");
        None
    } else {
        let p = a
            .token_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(ccache::access::APPD_TOKEN_FILE));
        Some(Token::load_or_create(&p)?)
    };
    let lcfg = ListenCfg {
        token: token.clone(),
        max_conns: a.rdma_max_conns as usize,
        max_handshakes: a.rdma_max_handshakes as usize,
        handshake_timeout: Duration::from_millis(a.rdma_handshake_ms),
        ..ListenCfg::new(
            "version table",
            ccache_proto::auth::LABEL_VERSION_TABLE,
            Vec::new(),
        )
    };
    let vl = TcpListener::bind(a.version_listen).map_err(|e| {
        format!(
            "--version-listen {}: {e} (port in use? pick another)",
            a.version_listen
        )
    })?;
    let il = bind_ipc(&a, mode)?;
    tracing::info!(
        docs = a.docs,
        rdma = %rl.local_addr().map_err(|e| e.to_string())?,
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
            token: token.clone(),
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
    let vmax = a.version_max_conns as usize;
    std::thread::spawn(move || appd::serve_versions_with(vl, t2, idle, vmax));
    if let Some(addr) = a.sockets_listen {
        let scfg = ccache::sockets::SocketsCfg {
            idle,
            max_conns: vmax,
            max_handshakes: a.rdma_max_handshakes as usize,
            handshake_timeout: Duration::from_millis(a.rdma_handshake_ms),
        };
        let stats = Arc::new(ccache::sockets::SocketsStats::default());
        let at = ccache::sockets::spawn_listener(&ctx, addr, table.clone(), scfg, stats)?;
        tracing::info!(sockets = %at, "version thread listening on iWARP sockets");
    }
    let mut allow = Allow::owner();
    allow.add_users(&a.ipc_allow_user)?;
    allow.add_groups(&a.ipc_allow_group)?;
    if let Some(g) = &a.ipc_group {
        allow.add_groups(std::slice::from_ref(g))?;
    }
    let icfg = IpcCfg {
        idle,
        max_conns: a.ipc_max_conns as usize,
        queue: a.ipc_queue as usize,
        write_timeout: Duration::from_millis(a.ipc_write_timeout_ms),
        hold: Duration::from_secs(a.ipc_hold_secs),
        allow,
    };
    tracing::info!(uids = ?icfg.allow.uids, gids = ?icfg.allow.gids, "IPC allowed peers (SO_PEERCRED)");
    std::thread::spawn(move || appd::serve_ipc_with(il, state, icfg));
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
    let stats = Arc::new(ListenStats::default());
    appd::serve_rdma(rl, pd, cq, table, lcfg, stats)
}

/// Bind the IPC socket: its directory made if missing (0750, group
/// --ipc-group), a socket left by an earlier run replaced (anything else
/// there is refused), then mode --ipc-mode and group --ipc-group.
fn bind_ipc(a: &Args, mode: u32) -> Result<UnixListener, String> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    let gid = match &a.ipc_group {
        Some(g) => Some(ccache::access::group_id(g).ok_or_else(|| {
            format!("--ipc-group {g}: no such group in /etc/group (give a name or a gid)")
        })?),
        None => None,
    };
    if mode & 0o002 != 0 {
        tracing::warn!(
            mode = format_args!("{mode:o}"),
            "--ipc-mode lets every local user connect to the IPC socket; only the SO_PEERCRED allow-list stands in their way (use --ipc-group and 660)"
        );
    }
    if let Some(dir) = a.ipc.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(|e| format!("--ipc {}: creating its directory: {e}", a.ipc.display()))?;
            // mkdir(2) applies the umask: under a service's UMask=0077 the
            // directory would be 0700 and the group could not reach the
            // socket. 0750 whatever the umask, as documented.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
                .map_err(|e| format!("chmod 750 {}: {e}", dir.display()))?;
            if gid.is_some() {
                std::os::unix::fs::chown(dir, None, gid)
                    .map_err(|e| format!("chgrp {} of {}: {e}", gid.unwrap_or(0), dir.display()))?;
            }
        }
    }
    if a.ipc.exists() {
        // A socket file left by an earlier run; refuse anything else.
        let meta = std::fs::symlink_metadata(&a.ipc).map_err(|e| e.to_string())?;
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
    if gid.is_some() {
        std::os::unix::fs::chown(&a.ipc, None, gid)
            .map_err(|e| format!("chgrp {} {}: {e}", gid.unwrap_or(0), a.ipc.display()))?;
    }
    Ok(il)
}
