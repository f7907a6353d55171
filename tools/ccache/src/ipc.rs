//! ccappd's Table 1 IPC server on a unix socket.
//!
//! One lock guards the [`Mrsw`] state. The actions it returns are
//! performed under it, in order (publish, then release), but **no socket
//! is written under it**: a message for a client goes into that client's
//! own bounded output queue, and a task per client writes the queue to its
//! socket. So a client that stops reading delays nobody but itself:
//!
//! - its queue fills (`queue` replies), or one write of it takes longer
//!   than `write_timeout`: it is dropped, which releases its reads and
//!   commits an update it was running (as if it had closed);
//! - a client that holds a read or an update longer than `hold` is dropped
//!   the same way, so a client that stays busy (never idle) but never
//!   sends `READ_DONE`/`UPDATE_DONE` cannot keep a document from its
//!   updaters for ever;
//! - a client idle for `idle` is closed.
//!
//! Admission, before a connection is served:
//!
//! - the peer's credentials (`SO_PEERCRED`, unix(7)) must be in the
//!   [`Allow`] list, otherwise `ERROR(not permitted)` and close;
//! - at most `max_conns` connections are served at once, otherwise
//!   `ERROR(busy)` and close, so a flood of connections cannot exhaust
//!   ccappd's memory or descriptors.
//!
//! The server runs on a tokio runtime of [`WORKERS`] threads (plus at most
//! [`BLOCKING`] for `PICK_ACCESSED`, which reads proxies' states), whatever
//! the number of clients.

use std::collections::HashMap;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccache_proto::ipc::{ErrorCode, IpcError, Kind, Repr, MSG_LEN};
use ccache_proto::mrsw::{Action, ClientId, Mrsw};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::access::Allow;
use crate::push::Pusher;
use crate::table::VersionTable;

/// Event-loop threads of the IPC server.
pub const WORKERS: usize = 2;
/// Most threads that answer `PICK_ACCESSED` at once.
pub const BLOCKING: usize = 4;

/// The IPC server's limits and access rules.
#[derive(Debug, Clone)]
pub struct IpcCfg {
    /// Close a connection that sends nothing for this long.
    pub idle: Duration,
    /// Most connections served at once (`--ipc-max-conns`).
    pub max_conns: usize,
    /// Replies queued for one client before it is dropped for not reading
    /// them (`--ipc-queue`).
    pub queue: usize,
    /// Bound on writing one reply (`--ipc-write-timeout-ms`).
    pub write_timeout: Duration,
    /// Longest a client may hold a read or an update (`--ipc-hold-secs`).
    pub hold: Duration,
    /// Who may connect (`--ipc-allow-user`, `--ipc-allow-group`).
    pub allow: Allow,
}

impl IpcCfg {
    /// The defaults, with connections closed after `idle`.
    pub fn new(idle: Duration) -> IpcCfg {
        IpcCfg {
            idle,
            max_conns: 1024,
            queue: 64,
            write_timeout: Duration::from_secs(2),
            hold: Duration::from_secs(30),
            allow: Allow::owner(),
        }
    }
}

fn error_msg(doc: u32, code: ErrorCode) -> Repr {
    Repr::with_value(Kind::Error, doc, code.into())
}

#[derive(Debug)]
struct Client {
    out: mpsc::Sender<Repr>,
    stop: Arc<Notify>,
    /// Since when it holds a read or an update (got `*_PROCEED`, has not
    /// sent `*_DONE`).
    holding: Option<Instant>,
}

#[derive(Debug)]
struct Core {
    mrsw: Mrsw,
    clients: HashMap<ClientId, Client>,
}

/// The Table 1 state and the IPC connections it answers.
#[derive(Debug)]
pub struct IpcState {
    core: Mutex<Core>,
    table: Arc<VersionTable>,
    next_id: AtomicU64,
    pusher: Option<Arc<Pusher>>,
    /// Clients dropped for not reading, holding too long, or write errors.
    pub dropped: AtomicU64,
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
            dropped: AtomicU64::new(0),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Core> {
        // A panic elsewhere must not stop the module; the state itself is
        // only changed by `Mrsw`, which leaves it consistent on error.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `msg` for `to`; `false` if its queue is full or gone.
    fn enqueue(core: &mut Core, to: ClientId, msg: Repr) -> bool {
        let Some(c) = core.clients.get_mut(&to) else {
            return true; // already gone: nothing to deliver
        };
        if matches!(msg.kind, Kind::ReadProceed | Kind::UpdateProceed) {
            c.holding.get_or_insert_with(Instant::now);
        }
        c.out.try_send(msg).is_ok()
    }

    /// Perform `actions` under the lock: publish, and queue messages (no
    /// socket I/O here). Clients whose queue overflows are dropped, and the
    /// actions of their release performed in turn.
    fn perform(&self, core: &mut Core, actions: Vec<Action>) {
        let mut todo = actions;
        while !todo.is_empty() {
            let mut overflow = Vec::new();
            for a in todo.drain(..) {
                match a {
                    Action::Publish { doc, version } => {
                        self.table.publish(doc, version);
                        tracing::debug!(doc, version, "published");
                        if let Some(p) = &self.pusher {
                            p.notify(doc);
                        }
                    }
                    Action::Send { to, msg } => {
                        if !Self::enqueue(core, to, msg) {
                            overflow.push(to);
                        }
                    }
                }
            }
            for id in overflow {
                todo.extend(self.release(
                    core,
                    id,
                    "its output queue is full: it does not read its replies",
                ));
            }
        }
    }

    /// Forget `id` and release what it holds; the actions to perform.
    fn release(&self, core: &mut Core, id: ClientId, why: &str) -> Vec<Action> {
        let Some(c) = core.clients.remove(&id) else {
            return Vec::new();
        };
        tracing::warn!(
            client = id,
            why,
            "IPC client dropped; its reads are released and an update it ran is committed"
        );
        self.dropped.fetch_add(1, Ordering::Relaxed);
        c.stop.notify_one();
        core.mrsw.disconnect(id)
    }

    /// Drop client `id` (if still there): release, perform, stop its tasks.
    fn drop_client(&self, id: ClientId, why: &str) {
        let mut core = self.lock();
        let actions = self.release(&mut core, id, why);
        self.perform(&mut core, actions);
    }

    /// The end of a connection (closed, idle, malformed): like
    /// [`IpcState::drop_client`] but not counted as a drop.
    fn leave(&self, id: ClientId) {
        let mut core = self.lock();
        if core.clients.remove(&id).is_none() {
            return;
        }
        let actions = core.mrsw.disconnect(id);
        if !actions.is_empty() {
            tracing::warn!(client = id, "IPC client left with requests open; released");
        }
        self.perform(&mut core, actions);
    }

    /// One Table 1 message from `id`. `false`: the client was dropped.
    fn handle(&self, id: ClientId, m: Repr) -> bool {
        let mut core = self.lock();
        if !core.clients.contains_key(&id) {
            return false;
        }
        match core.mrsw.handle(id, m) {
            Ok(actions) => {
                if matches!(m.kind, Kind::ReadDone | Kind::UpdateDone) {
                    if let Some(c) = core.clients.get_mut(&id) {
                        c.holding = None;
                    }
                }
                self.perform(&mut core, actions);
            }
            Err(e) => {
                tracing::warn!(client = id, msg = %m, error = %e, "IPC request refused");
                let actions = vec![Action::Send {
                    to: id,
                    msg: error_msg(m.doc, e.code()),
                }];
                self.perform(&mut core, actions);
            }
        }
        core.clients.contains_key(&id)
    }

    /// Queue one reply that is not a Table 1 action (`PICKED`, refusals).
    fn reply(&self, id: ClientId, msg: Repr) {
        let mut core = self.lock();
        self.perform(&mut core, vec![Action::Send { to: id, msg }]);
    }

    /// Drop the clients that held a read or an update longer than `hold`.
    fn reap(&self, hold: Duration) {
        let late: Vec<ClientId> = self
            .lock()
            .clients
            .iter()
            .filter(|(_, c)| c.holding.is_some_and(|t| t.elapsed() > hold))
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.drop_client(
                id,
                "it held a read or an update longer than --ipc-hold-secs",
            );
        }
    }

    /// Serve one admitted connection until it closes, errs, idles, or is
    /// dropped.
    async fn serve_conn(self: Arc<Self>, s: UnixStream, cfg: Arc<IpcCfg>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let stop = Arc::new(Notify::new());
        self.lock().clients.insert(
            id,
            Client {
                out: tx,
                stop: stop.clone(),
                holding: None,
            },
        );
        let (r, w) = s.into_split();
        let writer = tokio::spawn(self.clone().write_loop(id, w, rx, cfg.write_timeout));
        tokio::select! {
            () = stop.notified() => {}
            () = self.clone().read_loop(id, r, cfg.idle) => {}
        }
        self.leave(id);
        // The queue's sender is gone: the writer flushes what is queued
        // (an `ERROR(malformed)`, say), bounded by the write timeout, and
        // ends; dropping its half shuts the socket down.
        let _ = writer.await;
    }

    async fn write_loop(
        self: Arc<Self>,
        id: ClientId,
        mut w: OwnedWriteHalf,
        mut rx: mpsc::Receiver<Repr>,
        limit: Duration,
    ) {
        while let Some(m) = rx.recv().await {
            match tokio::time::timeout(limit, w.write_all(&m.to_bytes())).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::info!(client = id, error = %e, "IPC client unreachable");
                    self.drop_client(id, "writing to it failed");
                    return;
                }
                Err(_) => {
                    self.drop_client(
                        id,
                        "a reply could not be written within --ipc-write-timeout-ms",
                    );
                    return;
                }
            }
        }
    }

    async fn read_loop(self: Arc<Self>, id: ClientId, mut r: OwnedReadHalf, idle: Duration) {
        loop {
            let mut b = [0u8; MSG_LEN];
            let mut got = 0;
            while got < MSG_LEN {
                match tokio::time::timeout(idle, r.read(&mut b[got..])).await {
                    Err(_) => {
                        tracing::info!(client = id, "IPC connection idle; closing");
                        return;
                    }
                    Ok(Ok(0)) if got == 0 => return,
                    Ok(Ok(0)) => {
                        self.malformed(id, IpcError::Truncated { len: got });
                        return;
                    }
                    Ok(Ok(n)) => got += n,
                    Ok(Err(e)) => {
                        tracing::info!(client = id, error = %e, "IPC connection ended (reset)");
                        return;
                    }
                }
            }
            let m = match Repr::from_bytes(&b) {
                Ok(m) => m,
                Err(e) => {
                    self.malformed(id, e);
                    return;
                }
            };
            if m.kind == Kind::PickAccessed {
                // Not a Table 1 message: answered without the lock, on a
                // blocking thread (it reads the proxies' states).
                let st = self.clone();
                let reply = tokio::task::spawn_blocking(move || st.pick(&m)).await;
                match reply {
                    Ok(reply) => self.reply(id, reply),
                    Err(e) => {
                        tracing::error!(client = id, error = %e, "PICK_ACCESSED failed");
                        return;
                    }
                }
            } else if !self.handle(id, m) {
                return;
            }
        }
    }

    fn malformed(&self, id: ClientId, e: IpcError) {
        // The stream's framing is lost: answer and close.
        tracing::warn!(client = id, error = %e, "malformed IPC message; closing the connection");
        self.reply(id, error_msg(0, ErrorCode::Malformed));
    }
}

/// Answer `msg` to a connection that is not admitted, and close it.
fn refuse(s: UnixStream, msg: Repr) {
    // 16 bytes into a fresh socket's empty buffer: never blocks.
    let _ = s.try_write(&msg.to_bytes());
}

/// Accept IPC connections on `listener` and serve them (see the module
/// documentation), for ever. Blocks; returns only if the runtime cannot
/// be built or the listener cannot be used.
pub fn serve_ipc_with(listener: StdUnixListener, state: Arc<IpcState>, cfg: IpcCfg) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .max_blocking_threads(BLOCKING)
        .thread_name("ccappd-ipc")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the IPC server's runtime");
            return;
        }
    };
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "IPC listener unusable");
        return;
    }
    rt.block_on(async move {
        let l = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "IPC listener unusable");
                return;
            }
        };
        let cfg = Arc::new(cfg);
        let slots = Arc::new(Semaphore::new(cfg.max_conns.max(1)));
        let reaper = state.clone();
        let hold = cfg.hold;
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_millis(250));
            loop {
                t.tick().await;
                reaper.reap(hold);
            }
        });
        loop {
            let s = match l.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "IPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (uid, gid, pid) = match s.peer_cred() {
                Ok(c) => (c.uid(), c.gid(), c.pid()),
                Err(e) => {
                    tracing::warn!(error = %e, "SO_PEERCRED failed; refusing the IPC connection");
                    continue;
                }
            };
            if !cfg.allow.permits(uid, gid) {
                tracing::warn!(
                    uid,
                    gid,
                    ?pid,
                    "IPC connection refused: its uid/gid is not allowed (add --ipc-allow-user or --ipc-allow-group to ccappd)"
                );
                refuse(s, error_msg(0, ErrorCode::NotPermitted));
                continue;
            }
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(
                    max = cfg.max_conns,
                    uid,
                    ?pid,
                    "IPC connection refused: --ipc-max-conns connections are open (raise it, or find the client that leaks them)"
                );
                refuse(s, error_msg(0, ErrorCode::Busy));
                continue;
            };
            let st = state.clone();
            let c = cfg.clone();
            tokio::spawn(async move {
                let _slot = slot;
                st.serve_conn(s, c).await;
            });
        }
    });
}

/// [`serve_ipc_with`] with the default limits and connections closed after
/// `idle`.
pub fn serve_ipc(listener: StdUnixListener, state: Arc<IpcState>, idle: Duration) {
    serve_ipc_with(listener, state, IpcCfg::new(idle));
}
