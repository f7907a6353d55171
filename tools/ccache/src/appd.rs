//! The application module's servers (`ccappd`).
//!
//! - [`serve_rdma`]: accepts proxies' iWARP connections and replies with
//!   the version table's [`Advert`](ccache_proto::slot::Advert) as MPA
//!   private data. After that the proxies RDMA-Read slots on their own:
//!   no thread of ours runs for a version check (the provider's receive
//!   thread answers the Read Request).
//! - [`serve_versions`]: the two-sided path. A thread per connection
//!   answers `VERSION_REQUEST` with `VERSION_REPLY` from the table.
//! - [`serve_ipc`]: the Table 1 IPC server on a unix socket, for the
//!   application server (around each request) and the update thread.
//!   One lock guards the [`Mrsw`] state; the actions it returns are
//!   performed under it, in order (publish, then release).
//! - [`run_updater`]: the update thread: at a set rate it picks a
//!   document, takes it by `UPDATE_REQUEST`, rewrites the file in steps,
//!   and `UPDATE_DONE`s it; each commit is logged with its time.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use ccache_proto::mrsw::{Action, ClientId, Mrsw};
use iwarp::cm::Listener;
use iwarp::{CompletionQueue, ProtectionDomain};

use crate::msgio::{read_msg, write_msg, MsgError};
use crate::push::Pusher;
use crate::table::VersionTable;

/// The document body at a version: the line `doc D version V` repeated
/// and cut to `size` bytes. Every version of a document has the same
/// length, so an update rewrites the file in place.
pub fn doc_body(doc: u32, version: u64, size: usize) -> Vec<u8> {
    let line = format!("doc {doc:06} version {version:020}\n");
    line.bytes().cycle().take(size).collect()
}

/// The file of document `doc`.
pub fn doc_path(root: &Path, doc: u32) -> PathBuf {
    root.join(doc.to_string())
}

/// Write every document's file at `version`.
pub fn init_docs(root: &Path, docs: u32, version: u64, size: usize) -> io::Result<()> {
    std::fs::create_dir_all(root)?;
    for d in 0..docs {
        std::fs::write(doc_path(root, d), doc_body(d, version, size))?;
    }
    Ok(())
}

/// Accept proxies' iWARP connections until the listener fails. Each gets
/// its own QP on `pd`; closed QPs are dropped as new ones arrive.
pub fn serve_rdma(
    listener: Listener,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    table: Arc<VersionTable>,
) -> io::Result<()> {
    let advert = table.advert().emit().to_vec();
    crate::push::accept_rdma(listener, pd, cq, advert, "version table")
}

/// The version thread(s): answer `VERSION_REQUEST`s over TCP. A
/// connection idle for `idle` is closed.
pub fn serve_versions(listener: TcpListener, table: Arc<VersionTable>, idle: Duration) {
    for conn in listener.incoming() {
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "version listener accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let table = table.clone();
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(idle));
            let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
            loop {
                let reply = match read_msg(&mut s) {
                    Ok(m) if m.kind == Kind::VersionRequest => match table.get(m.doc) {
                        Some(Ok(v)) => Repr::with_value(Kind::VersionReply, m.doc, v),
                        Some(Err(_)) => error_msg(m.doc, ErrorCode::Busy),
                        None => error_msg(m.doc, ErrorCode::NoSuchDocument),
                    },
                    Ok(m) => error_msg(m.doc, ErrorCode::NotARequest),
                    Err(MsgError::Malformed(e)) => {
                        tracing::warn!(error = %e, "malformed version request; closing");
                        let _ = write_msg(&mut s, &error_msg(0, ErrorCode::Malformed));
                        return;
                    }
                    Err(_) => return,
                };
                if write_msg(&mut s, &reply).is_err() {
                    return;
                }
            }
        });
    }
}

fn error_msg(doc: u32, code: ErrorCode) -> Repr {
    Repr::with_value(Kind::Error, doc, code.into())
}

/// The Table 1 state and the IPC connections it answers.
#[derive(Debug)]
pub struct IpcState {
    core: Mutex<Core>,
    table: Arc<VersionTable>,
    next_id: AtomicU64,
    pusher: Option<Arc<Pusher>>,
}

#[derive(Debug)]
struct Core {
    mrsw: Mrsw,
    clients: HashMap<ClientId, UnixStream>,
}

impl IpcState {
    /// Table 1 state over `table` (its slots are the documents).
    pub fn new(table: Arc<VersionTable>, initial: u64) -> IpcState {
        IpcState {
            core: Mutex::new(Core {
                mrsw: Mrsw::new(table.slots(), initial),
                clients: HashMap::new(),
            }),
            table,
            next_id: AtomicU64::new(1),
            pusher: None,
        }
    }

    /// Tell `pusher` about every committed update (it pushes the new
    /// version to proxies), and let it answer `PICK_ACCESSED`.
    pub fn with_pusher(mut self, pusher: Arc<Pusher>) -> IpcState {
        self.pusher = Some(pusher);
        self
    }

    /// `PICK_ACCESSED`: a document some registered proxy has accessed.
    fn pick(&self, m: &Repr) -> Repr {
        match self.pusher.as_ref().and_then(|p| p.pick_accessed(m.value)) {
            Some((doc, n)) => Repr::with_value(Kind::Picked, doc, n as u64),
            None => {
                tracing::debug!("PICK_ACCESSED: no registered proxy has accessed a document");
                error_msg(m.doc, ErrorCode::NoSuchDocument)
            }
        }
    }

    fn perform(&self, core: &mut Core, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Publish { doc, version } => {
                    self.table.publish(doc, version);
                    tracing::debug!(doc, version, "published");
                    if let Some(p) = &self.pusher {
                        p.notify(doc);
                    }
                }
                Action::Send { to, msg } => {
                    if let Some(s) = core.clients.get_mut(&to) {
                        if let Err(e) = write_msg(s, &msg) {
                            // Its own thread sees the dead socket and
                            // disconnects it, releasing what it holds.
                            tracing::warn!(client = to, error = %e, "IPC client unreachable");
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        }
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Core> {
        // A panic elsewhere must not stop the module; the state itself is
        // only changed by `Mrsw`, which leaves it consistent on error.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serve one IPC connection until it closes, errs, or idles for `idle`.
    pub fn serve_conn(&self, mut s: UnixStream, idle: Duration) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_read_timeout(Some(idle));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        match s.try_clone() {
            Ok(w) => {
                self.lock().clients.insert(id, w);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot clone an IPC socket; dropping the client");
                return;
            }
        }
        loop {
            match read_msg(&mut s) {
                Ok(m) if m.kind == Kind::PickAccessed => {
                    // Not a Table 1 message: answered without the lock (it
                    // reads the proxies' states).
                    let reply = self.pick(&m);
                    let _core = self.lock(); // replies to one client are sent under the lock
                    if write_msg(&mut s, &reply).is_err() {
                        break;
                    }
                }
                Ok(m) => {
                    let mut core = self.lock();
                    match core.mrsw.handle(id, m) {
                        Ok(actions) => self.perform(&mut core, actions),
                        Err(e) => {
                            tracing::warn!(client = id, msg = %m, error = %e, "IPC request refused");
                            let _ = write_msg(&mut s, &error_msg(m.doc, e.code()));
                        }
                    }
                }
                Err(MsgError::Closed) => break,
                Err(MsgError::Malformed(e)) => {
                    // The stream's framing is lost: answer and close.
                    tracing::warn!(client = id, error = %e, "malformed IPC message; closing the connection");
                    let _ = write_msg(&mut s, &error_msg(0, ErrorCode::Malformed));
                    break;
                }
                Err(MsgError::Io(e)) => {
                    tracing::info!(client = id, error = %e, "IPC connection ended (idle or reset)");
                    break;
                }
            }
        }
        let mut core = self.lock();
        core.clients.remove(&id);
        let actions = core.mrsw.disconnect(id);
        if !actions.is_empty() {
            tracing::warn!(client = id, "IPC client left with requests open; released");
        }
        self.perform(&mut core, actions);
    }
}

/// Accept IPC connections, a thread each.
pub fn serve_ipc(listener: UnixListener, state: Arc<IpcState>, idle: Duration) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let st = state.clone();
                std::thread::spawn(move || st.serve_conn(s, idle));
            }
            Err(e) => {
                tracing::warn!(error = %e, "IPC accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

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
