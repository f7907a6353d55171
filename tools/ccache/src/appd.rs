//! The application module's servers (`ccappd`).
//!
//! - [`serve_rdma`]: accepts proxies' iWARP connections ([`crate::listen`])
//!   and replies with the version table's
//!   [`Advert`](ccache_proto::slot::Advert) as MPA private data. After that the proxies RDMA-Read slots on their own:
//!   no thread of ours runs for a version check (the provider's receive
//!   thread answers the Read Request).
//! - [`serve_versions`]: the two-sided path. A task per connection (at
//!   most `--version-max-conns`) answers `VERSION_REQUEST` with
//!   `VERSION_REPLY` from the table.
//! - [`serve_ipc`]: the Table 1 IPC server on a unix socket, for the
//!   application server (around each request) and the update thread
//!   ([`crate::ipc`]).
//! - [`run_updater`]: the update thread: at a set rate it picks a
//!   document, takes it by `UPDATE_REQUEST`, rewrites the file in steps,
//!   and `UPDATE_DONE`s it; each commit is logged with its time.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use iwarp::{CompletionQueue, ProtectionDomain};

// The document files live in a leaf module (push reads them too); their
// functions stay reachable as `appd::doc_body` etc. for the binaries.
pub use crate::docs::{doc_body, doc_path, init_docs};
use crate::listen::{Endpoint, ListenCfg, ListenStats};
use crate::msgio::{read_msg, write_msg};
use crate::table::VersionTable;

/// The version table listener's settings: `cfg` with the table's
/// advertisement as the accepted Reply's private data and the version
/// table's proof label.
pub fn rdma_cfg(table: &VersionTable, mut cfg: ListenCfg) -> ListenCfg {
    cfg.what = "version table";
    cfg.label = ccache_proto::auth::LABEL_VERSION_TABLE;
    cfg.private_data = table.advert().emit().to_vec();
    cfg
}

/// Accept proxies' iWARP connections for ever ([`crate::listen`]: the
/// handshakes off the accept path, the live-connection limit, the token).
/// Each gets its own QP on `pd`; the advertisement goes only into an
/// accepted Reply.
pub fn serve_rdma(
    ep: Endpoint,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    table: Arc<VersionTable>,
    cfg: ListenCfg,
    stats: Arc<ListenStats>,
) -> ! {
    let cfg = rdma_cfg(&table, cfg);
    crate::listen::serve(ep, pd, cq, cfg, stats)
}

/// The version thread(s): answer `VERSION_REQUEST`s over TCP, with the
/// default connection limit ([`VERSION_MAX_CONNS`]). A connection idle for
/// `idle` is closed.
pub fn serve_versions(listener: TcpListener, table: Arc<VersionTable>, idle: Duration) {
    serve_versions_with(listener, table, idle, VERSION_MAX_CONNS)
}

/// Default of `ccappd --version-max-conns`.
pub const VERSION_MAX_CONNS: usize = 256;

/// The version server: answer `VERSION_REQUEST`s over TCP on a tokio
/// runtime of two threads, at most `max_conns` connections at once (one
/// more is answered `ERROR(busy)` and closed), each closed when idle for
/// `idle` or when a reply cannot be written within 2 s. Blocks.
pub fn serve_versions_with(
    listener: TcpListener,
    table: Arc<VersionTable>,
    idle: Duration,
    max_conns: usize,
) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ccappd-version")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the version server's runtime");
            return;
        }
    };
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "version listener unusable");
        return;
    }
    rt.block_on(async move {
        let l = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "version listener unusable");
                return;
            }
        };
        let slots = Arc::new(tokio::sync::Semaphore::new(max_conns.max(1)));
        loop {
            let (s, peer) = match l.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "version listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%peer, max = max_conns, "version connection refused: --version-max-conns connections are open (raise it if the proxies need more)");
                let _ = s.try_write(&error_msg(0, ErrorCode::Busy).to_bytes());
                continue;
            };
            let table = table.clone();
            tokio::spawn(async move {
                let _slot = slot;
                answer_versions_async(s, &table, idle).await;
            });
        }
    });
}

async fn answer_versions_async(mut s: tokio::net::TcpStream, table: &VersionTable, idle: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = s.set_nodelay(true);
    let write_limit = Duration::from_secs(2);
    loop {
        let mut b = [0u8; ccache_proto::ipc::MSG_LEN];
        let reply = match tokio::time::timeout(idle, s.read_exact(&mut b)).await {
            Ok(Ok(_)) => match Repr::from_bytes(&b) {
                Ok(m) if m.kind == Kind::VersionRequest => match table.get(m.doc) {
                    Some(Ok(v)) => Repr::with_value(Kind::VersionReply, m.doc, v),
                    Some(Err(_)) => error_msg(m.doc, ErrorCode::Busy),
                    None => error_msg(m.doc, ErrorCode::NoSuchDocument),
                },
                Ok(m) => error_msg(m.doc, ErrorCode::NotARequest),
                Err(e) => {
                    tracing::warn!(error = %e, "malformed version request; closing");
                    let _ = tokio::time::timeout(
                        write_limit,
                        s.write_all(&error_msg(0, ErrorCode::Malformed).to_bytes()),
                    )
                    .await;
                    return;
                }
            },
            // A request cut short is malformed too, but its sender is gone.
            Ok(Err(_)) | Err(_) => return,
        };
        match tokio::time::timeout(write_limit, s.write_all(&reply.to_bytes())).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

fn error_msg(doc: u32, code: ErrorCode) -> Repr {
    Repr::with_value(Kind::Error, doc, code.into())
}

pub use crate::ipc::{serve_ipc, serve_ipc_with, IpcCfg, IpcState};

/// The update thread's settings.
#[derive(Debug, Clone)]
pub struct UpdaterCfg {
    /// The IPC socket.
    pub ipc: PathBuf,
    /// Where the documents' files are.
    pub docroot: PathBuf,
    /// Documents 0..docs are updated.
    pub docs: u32,
    /// Bytes per document.
    pub doc_size: usize,
    /// Updates per second.
    pub rate: f64,
    /// Pieces each file is rewritten in (a pause between them, so a reader
    /// that did not wait would see a half-written document).
    pub steps: usize,
    /// Appended per commit: `<unix time ns> <doc> <new version>`.
    pub log: Option<PathBuf>,
    /// Answer timeout for each IPC reply.
    pub timeout: Duration,
    /// Stop after this many updates (`None`: run until an error).
    pub count: Option<u64>,
    /// Which document each update picks.
    pub select: Select,
}

/// How the update server picks a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    /// Uniformly among all documents.
    Uniform,
    /// Uniformly among the documents registered proxies have accessed
    /// recently (the seed's "a random accessed document"), asked of ccappd
    /// with `PICK_ACCESSED`. While none has been accessed, the tick passes
    /// without an update.
    Accessed,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn expect(s: &mut UnixStream, kind: Kind, doc: u32) -> io::Result<u64> {
    match read_msg(s) {
        Ok(m) if m.kind == kind && m.doc == doc => Ok(m.value),
        Ok(m) => Err(io::Error::other(format!(
            "ccappd answered {m} where {} was due",
            kind.name()
        ))),
        Err(e) => Err(io::Error::other(format!(
            "waiting for {} of document {doc}: {e}",
            kind.name()
        ))),
    }
}

/// A compute thread: arithmetic the optimizer cannot remove, forever.
///
/// With `sleep` zero it never blocks (the seed's busy loops). Otherwise it
/// computes for `slice`, then sleeps for `sleep`, again and again, as a
/// request handler that blocks on I/O between bursts of work does. Linux's
/// EEVDF runs a thread that wakes after sleeping ahead of threads that
/// never sleep, so among pure busy loops a version thread that sleeps in
/// `read` is served at once. Sleeping compute threads were expected to
/// change that; measured, they did not (docs/BENCHMARKS.md, Figures 9-11).
pub fn compute_loop(slice: std::time::Duration, sleep: std::time::Duration) {
    let mut x = 1u64;
    loop {
        let start = std::time::Instant::now();
        loop {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            if !sleep.is_zero() && start.elapsed() >= slice {
                break;
            }
        }
        std::thread::sleep(sleep);
    }
}

/// Append the initial version of every document to the update log (so a
/// checker knows the versions current from the start of this run).
pub fn log_initial(log: &Path, docs: u32, version: u64) -> io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(log)?;
    let t = now_ns();
    let mut s = String::new();
    for d in 0..docs {
        s.push_str(&format!("{t} {d} {version}\n"));
    }
    f.write_all(s.as_bytes())
}

/// Ask ccappd for a recently accessed document (`PICK_ACCESSED`).
pub fn pick_accessed(s: &mut UnixStream, rnd: u64) -> io::Result<Option<u32>> {
    write_msg(s, &Repr::with_value(Kind::PickAccessed, 0, rnd))?;
    match read_msg(s) {
        Ok(m) if m.kind == Kind::Picked => Ok(Some(m.doc)),
        Ok(m) if m.kind == Kind::Error && ErrorCode::from(m.value) == ErrorCode::NoSuchDocument => {
            Ok(None)
        }
        Ok(m) => Err(io::Error::other(format!(
            "ccappd answered {m} to PICK_ACCESSED (is it run with --push-listen?)"
        ))),
        Err(e) => Err(io::Error::other(format!("waiting for PICKED: {e}"))),
    }
}

/// One update of `doc` through the IPC: returns the new version.
pub fn update_once(s: &mut UnixStream, cfg: &UpdaterCfg, doc: u32) -> io::Result<u64> {
    write_msg(s, &Repr::new(Kind::UpdateRequest, doc))?;
    let old = expect(s, Kind::UpdateProceed, doc)?;
    let f = OpenOptions::new()
        .write(true)
        .open(doc_path(&cfg.docroot, doc))?;
    // The document keeps its own size (documents of a workload differ:
    // 200 B - 1 MB); `doc_size` only for an empty file. Writing a shorter
    // body over a longer file would leave the old version's tail in it.
    let size = match f.metadata()?.len() {
        0 => cfg.doc_size,
        n => usize::try_from(n).map_err(io::Error::other)?,
    };
    let body = doc_body(doc, old.wrapping_add(1), size);
    let step = body.len().div_ceil(cfg.steps.max(1)).max(1);
    for (i, chunk) in body.chunks(step).enumerate() {
        f.write_all_at(chunk, (i * step) as u64)?;
        std::thread::sleep(Duration::from_micros(500));
    }
    write_msg(s, &Repr::new(Kind::UpdateDone, doc))?;
    let new = expect(s, Kind::UpdateCommitted, doc)?;
    if new != old.wrapping_add(1) {
        return Err(io::Error::other(format!(
            "document {doc} went from version {old} to {new}, expected {}",
            old.wrapping_add(1)
        )));
    }
    Ok(new)
}

/// Run updates at `cfg.rate` until an error (or `cfg.count` updates);
/// documents are picked by a xorshift generator seeded from the clock.
pub fn run_updater(cfg: UpdaterCfg) -> io::Result<()> {
    let mut s = UnixStream::connect(&cfg.ipc).map_err(|e| {
        io::Error::other(format!(
            "update thread cannot connect to {}: {e} (is the IPC server up?)",
            cfg.ipc.display()
        ))
    })?;
    s.set_read_timeout(Some(cfg.timeout))?;
    s.set_write_timeout(Some(cfg.timeout))?;
    let mut log = match &cfg.log {
        Some(p) => Some(OpenOptions::new().create(true).append(true).open(p)?),
        None => None,
    };
    let period = Duration::from_secs_f64(1.0 / cfg.rate.max(0.001));
    let mut x = (now_ns() as u64) | 1;
    let mut next = std::time::Instant::now() + period;
    let mut done = 0u64;
    while cfg.count.is_none_or(|c| done < c) {
        done += 1;
        let now = std::time::Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += period;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let doc = match cfg.select {
            Select::Uniform => (x % u64::from(cfg.docs.max(1))) as u32,
            Select::Accessed => match pick_accessed(&mut s, x)? {
                Some(d) if d < cfg.docs => d,
                Some(d) => {
                    tracing::warn!(
                        doc = d,
                        docs = cfg.docs,
                        "picked document outside --docs; skipped"
                    );
                    continue;
                }
                None => {
                    tracing::debug!("no accessed document yet; this tick has no update");
                    continue;
                }
            },
        };
        let v = update_once(&mut s, &cfg, doc)?;
        let t = now_ns();
        tracing::debug!(doc, version = v, "update committed");
        if let Some(f) = log.as_mut() {
            // One write(2) per line: with O_APPEND, lines of several
            // updaters sharing the log do not interleave (`writeln!` may
            // write a line in pieces).
            f.write_all(format!("{t} {doc} {v}\n").as_bytes())?;
        }
    }
    Ok(())
}
