//! The progress pool: a fixed set of threads that does the receive and
//! transmit work of every pooled connection of the process (issue 29,
//! item 2), instead of a receive and a transmit thread per connection.
//! Chosen per process with [`set_progress_engine`] or the environment
//! (`IWARP_PROGRESS=pool|threads`, `IWARP_PROGRESS_THREADS=N`); the
//! default is still [`ProgressEngine::Threads`].
//!
//! # Threads
//!
//! `N` pool threads (`min(cores, 4)` by default), started on the first
//! pooled connection and kept for the life of the process. Each owns an
//! epoll set, an eventfd (its queue's doorbell) and a table of its
//! connections; a new connection goes to the thread that serves the
//! fewest, except that the second end of a connection whose both ends are
//! in this process joins the thread of the first (see `register`). Its
//! socket is non-blocking.
//!
//! # Readiness: edge-triggered
//!
//! A socket is registered with `EPOLLET | EPOLLRDHUP`, plus `EPOLLIN`
//! unless its CQ is application-driven or the pool steps aside for a busy
//! poller (see below). `EPOLLOUT` joins the interest only when a write of
//! the connection first finds the socket full (and stays): a new socket
//! is writable, so registering it with `EPOLLOUT` raised an edge at once
//! and woke a pool thread for nothing on every connection set-up (two
//! context switches per connection, one per end; issue 29's set-up rate).
//! Adding `EPOLLOUT` with `EPOLL_CTL_MOD` re-polls the socket (epoll(7)),
//! so room made between the failed write and the `MOD` still raises the
//! edge that resumes it. Edge-triggered, so a pool thread is not
//! woken again and again for a socket another thread is reading; in
//! exchange every edge must lead to a read until the socket is empty
//! (`EAGAIN`, or a short read: with Linux TCP a `recv` that returns less
//! than it asked for has taken everything queued, and bytes that arrive
//! later raise a new edge, see epoll(7)). The rule that guarantees it is
//! `Conn::claim_rx`: a pool thread that gets an edge while an
//! application thread owns the receive work marks it `RX_AGAIN`, and the
//! owner runs one more pass before it lets go.
//!
//! # Work
//!
//! - **Readable** (an `EPOLLIN` edge, or `WORK_RX`): claim the receive
//!   work and run receive passes (`rx_pass`: deframe, CRC, place,
//!   complete), at most [`RX_BUDGET`] per turn so that one busy
//!   connection does not starve the others on its thread (the rest is
//!   queued as `WORK_RX`). Receive never writes: a Read Response or a
//!   Terminate it makes due is written by the transmit work right after,
//!   on the same thread.
//! - **Transmit** (`WORK_TX`, queued by `Conn::wake_tx`: a poster whose
//!   inline write hit `EAGAIN`, or found another writer): write what the
//!   engine has, non-blocking. On `EAGAIN` the thread notes it and
//!   resumes on the next `EPOLLOUT` edge; it never blocks on a write.
//! - **Liveness**, every `TICK` (100 ms) (sooner while a wake-up nudge is due):
//!   the transmit thread's duties for each connection (peer timeout,
//!   probes, nudges; `conn.rs`).
//! - **Close** (`WORK_CLOSE`, queued by `Conn::connection_lost`): the
//!   socket leaves the epoll set (`EPOLL_CTL_DEL`), then the table entry
//!   is dropped. The table holds the `Conn`, which owns the socket, so
//!   the descriptor cannot be closed (and its number reused) while it is
//!   still registered.
//!
//! Work arrives through a per-thread queue of connection tokens: a
//! connection is queued only by the caller that finds no work pending
//! (`Conn::schedule`), and the eventfd is written only when the queue
//! was empty and the caller is not the pool thread itself.
//!
//! # Application threads
//!
//! `BusyPoll` and `AppDriven` CQs keep working: an application thread in
//! `Conn::progress` takes the receive work when nobody owns it
//! (`Conn::claim_rx`, the one mechanism, one owner at a time). While an
//! application thread busy-polls (more than `SPINNING_POLLS` progress
//! calls between two edges) the pool thread steps aside: it drops
//! `EPOLLIN` from the socket's interest for `STEP_ASIDE` (1 ms) slices, so
//! arriving data does not wake it to compete for the CPU, and takes the
//! work back at once when the poller says it sleeps
//! (`Conn::stop_progress` queues `WORK_REARM`). An application-driven CQ
//! keeps `EPOLLIN` out of the interest until the mode is turned off.

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use iwarp_verbs::sys::EventFd;

use crate::rx::*;
use crate::state::*;
use crate::tx::*;

/// Who does the receive and transmit work of the software provider's
/// connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressEngine {
    /// One receive and one transmit thread per connection (the default).
    Threads,
    /// A fixed pool of progress threads for all connections of the process
    /// (epoll, edge-triggered; see the `soft::pool` docs).
    Pool,
}

/// The environment variable that chooses the engine (`pool` or `threads`).
pub const ENV_ENGINE: &str = "IWARP_PROGRESS";
/// The environment variable that sets the pool's thread count (1 to
/// [`MAX_THREADS`]).
pub const ENV_THREADS: &str = "IWARP_PROGRESS_THREADS";
/// Most pool threads one process may ask for.
pub const MAX_THREADS: usize = 64;
/// Receive passes (each one `recv` of at most 64 KiB) a pool thread runs
/// for one connection before it lets the others on its thread have a turn.
pub const RX_BUDGET: usize = 64;
/// Transmit rounds (each one batch of up to 64 KiB) per turn.
pub const TX_BUDGET: usize = 16;

const UNSET: u8 = 0;
const THREADS: u8 = 1;
const POOL: u8 = 2;
static ENGINE: AtomicU8 = AtomicU8::new(UNSET);

/// Choose the engine for connections established from now on (existing
/// connections keep theirs). Overrides [`ENV_ENGINE`].
pub fn set_progress_engine(engine: ProgressEngine) {
    ENGINE.store(
        match engine {
            ProgressEngine::Threads => THREADS,
            ProgressEngine::Pool => POOL,
        },
        Ordering::Release,
    );
}

/// The engine new connections get: [`set_progress_engine`]'s, else
/// [`ENV_ENGINE`]'s (read once), else [`ProgressEngine::Threads`].
pub fn progress_engine() -> ProgressEngine {
    let mut v = ENGINE.load(Ordering::Acquire);
    if v == UNSET {
        // Unset in a privileged process (iwarp_proto::env).
        v = match iwarp_proto::env::var(ENV_ENGINE).as_deref() {
            Ok("pool") => POOL,
            Ok("threads") | Ok("") | Err(_) => THREADS,
            Ok(other) => {
                tracing::warn!(
                    value = other,
                    "{ENV_ENGINE} must be `pool` or `threads`; using `threads`"
                );
                THREADS
            }
        };
        // A concurrent `set_progress_engine` wins.
        v = match ENGINE.compare_exchange(UNSET, v, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => v,
            Err(set) => set,
        };
    }
    if v == POOL {
        ProgressEngine::Pool
    } else {
        ProgressEngine::Threads
    }
}

/// The pool's thread count: [`ENV_THREADS`], else `min(cores, 4)`.
fn thread_count() -> usize {
    let default = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4);
    // Unset in a privileged process (iwarp_proto::env).
    match iwarp_proto::env::var(ENV_THREADS) {
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => n,
            _ => {
                tracing::warn!(
                    value = %s,
                    "{ENV_THREADS} must be a number from 1 to {MAX_THREADS}; using {default}"
                );
                default
            }
        },
        Err(_) => default,
    }
}

/// What the pool serves now (for tests and monitoring).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Pool threads running (0 before the first pooled connection).
    pub threads: usize,
    /// Connections registered with them.
    pub connections: usize,
    /// Readiness events the pool threads have taken for connections so
    /// far (each `epoll_wait` entry; the eventfd's excluded): with nothing
    /// to read or write, an idle connection costs none.
    pub events: u64,
}

/// For tests: each pooled connection end as (local, peer, pool thread
/// index), of the thread-placement rule in `register`.
#[doc(hidden)]
pub fn placement() -> Vec<(SocketAddr, SocketAddr, usize)> {
    let Some(Ok(p)) = POOL_INSTANCE.get() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, w) in p.workers.iter().enumerate() {
        for (_, _, conn, _) in w.entries() {
            out.push((conn.local, conn.peer, i));
        }
    }
    out
}

/// The pool's current size; threads 0 if it has not started.
pub fn pool_stats() -> PoolStats {
    match POOL_INSTANCE.get() {
        Some(Ok(p)) => PoolStats {
            threads: p.workers.len(),
            connections: p
                .workers
                .iter()
                .map(|w| w.registered.load(Ordering::Relaxed))
                .sum(),
            events: p
                .workers
                .iter()
                .map(|w| w.events.load(Ordering::Relaxed))
                .sum(),
        },
        _ => PoolStats {
            threads: 0,
            connections: 0,
            events: 0,
        },
    }
}

/// Checks of the pool's wake-ups, for tests and investigations (not for
/// applications).
///
/// When on ([`set_enabled`](audit::set_enabled); `iwarp-perf` turns it on
/// with `IWARP_POOL_AUDIT=1`), a pool thread whose `epoll_wait` ended by its
/// timeout or lasted at least [`LONG_WAIT`](audit::LONG_WAIT) looks at
/// each of its connections that got no event and had no work queued, and
/// counts those whose work was there through the whole wait: bytes unread
/// in a socket the pool reads although no data arrived during the wait
/// (`tcpi_last_data_recv`), or transmit work with a writable socket
/// although no ACK arrived during it (`tcpi_last_ack_recv`). Each is a
/// wake-up the pool missed; only a timer (the pool's, or TCP's
/// retransmission, loss-probe and delayed-ACK timers, which make new
/// edges) ends such a stall. The kernel keeps those ages in jiffies, so a
/// stall counts only once it is [`JIFFY_MARGIN_MS`](audit::JIFFY_MARGIN_MS)
/// longer than the wait. Costs a few system calls per connection per
/// audited wait.
///
/// Also counted always: `tx_left`, how often a pool thread found a
/// connection's transmit lock held by another thread and left the work to
/// it (the holder queues it when it lets go) instead of waiting.
#[doc(hidden)]
pub mod audit {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    static ON: AtomicBool = AtomicBool::new(false);
    pub(super) static WAITS: AtomicU64 = AtomicU64::new(0);
    pub(super) static RX_UNREAD: AtomicU64 = AtomicU64::new(0);
    pub(super) static TX_WRITABLE: AtomicU64 = AtomicU64::new(0);
    pub(super) static TX_LEFT: AtomicU64 = AtomicU64::new(0);
    /// A wait at least this long is audited even if an event ended it.
    pub const LONG_WAIT: Duration = Duration::from_millis(5);
    /// Two jiffies at HZ=100, the coarsest Linux clock tick.
    pub const JIFFY_MARGIN_MS: u128 = 20;

    /// What the audit found so far (process-wide, since it started).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Counts {
        /// Waits audited.
        pub waits: u64,
        /// Connections found with bytes unread and nothing to start a read.
        pub rx_unread: u64,
        /// Connections found with transmit work, a writable socket and
        /// nothing to start a write.
        pub tx_writable: u64,
        /// Transmit work left to the thread holding the connection's
        /// transmit lock (counted whether or not the audit is on).
        pub tx_left: u64,
    }

    /// Turn the audit on or off (process-wide).
    pub fn set_enabled(on: bool) {
        ON.store(on, Ordering::Relaxed);
    }

    pub(super) fn enabled() -> bool {
        ON.load(Ordering::Relaxed)
    }

    /// The counts so far.
    pub fn counts() -> Counts {
        Counts {
            waits: WAITS.load(Ordering::Relaxed),
            rx_unread: RX_UNREAD.load(Ordering::Relaxed),
            tx_writable: TX_WRITABLE.load(Ordering::Relaxed),
            tx_left: TX_LEFT.load(Ordering::Relaxed),
        }
    }
}

static POOL_INSTANCE: OnceLock<Result<Pool, String>> = OnceLock::new();

struct Pool {
    workers: Vec<Arc<Worker>>,
    /// Pooled ends with a peer on this host, by (local, peer): the worker
    /// that serves them, so the other end, if it is in this process too,
    /// joins the same one (see [`register`]). Removed when the end leaves.
    local_ends: Mutex<HashMap<(SocketAddr, SocketAddr), usize>>,
}

/// Both ends of a loopback or same-host connection may be in this process.
fn same_host(conn: &Conn) -> bool {
    conn.peer.ip() == conn.local.ip() || conn.peer.ip().is_loopback()
}

fn pool() -> io::Result<&'static Pool> {
    POOL_INSTANCE
        .get_or_init(Pool::start)
        .as_ref()
        .map_err(|e| io::Error::other(e.clone()))
}

impl Pool {
    fn start() -> Result<Pool, String> {
        let n = thread_count();
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let w = Arc::new(Worker::new().map_err(|e| {
                format!("progress pool: cannot create an epoll set or eventfd ({e}); raise the descriptor limit (ulimit -n) or set {ENV_ENGINE}=threads")
            })?);
            let w2 = w.clone();
            std::thread::Builder::new()
                .name(format!("iwarp-pool-{i}"))
                .spawn(move || w2.run())
                .map_err(|e| {
                    format!("progress pool: cannot start thread {i} ({e}); lower {ENV_THREADS} or set {ENV_ENGINE}=threads")
                })?;
            workers.push(w);
        }
        tracing::debug!(threads = n, "progress pool started");
        Ok(Pool {
            workers,
            local_ends: Mutex::new(HashMap::new()),
        })
    }
}

/// Serve `conn` from the pool: its socket becomes non-blocking and joins
/// the epoll set of the pool thread that serves the fewest connections,
/// or, when the other end of the connection is already pooled in this
/// process, that end's thread.
///
/// Why both ends together: with the fewest-first rule alone, a process
/// that holds both ends of its connections (a loopback benchmark, a
/// server and its clients in one program) registers them alternately, so
/// with two threads every sending end landed on one thread and every
/// receiving end on the other. Sending costs more (the copy into the
/// socket, the CRC, and on loopback the whole TCP receive path, which the
/// kernel runs in the sender's context), so that thread was busy and the
/// other half idle while work waited (issue 29: the pool used 2.7-3.0 of
/// 4 CPU-seconds at 16 connections, the thread of the senders 92 % of a
/// core, the other 52 %). Pairs kept together spread sends and receives
/// alike over the threads.
pub(super) fn register(qp: &Arc<SoftQp>, conn: &Arc<Conn>) -> io::Result<()> {
    let pool = pool()?;
    let fewest = pool
        .workers
        .iter()
        .enumerate()
        .min_by_key(|(_, w)| w.registered.load(Ordering::Relaxed))
        .map(|(i, _)| i)
        .ok_or_else(|| io::Error::other("progress pool has no threads"))?;
    let idx = if same_host(conn) {
        let mut ends = lock(&pool.local_ends);
        let i = match ends.get(&(conn.peer, conn.local)) {
            Some(&i) if i < pool.workers.len() => i,
            _ => fewest,
        };
        ends.insert((conn.local, conn.peer), i);
        i
    } else {
        fewest
    };
    let w = &pool.workers[idx];
    let fd = conn.sock.as_raw_fd();
    let ev = interest(conn, false);
    if ev & libc::EPOLLIN as u32 == 0 {
        // Application-driven from the start: the pool leaves the socket
        // to the application (see `Worker::set_interest`).
        qp.counters.rx_steps_aside.fetch_add(1, Ordering::Relaxed);
    }
    let token = lock(&w.slab).insert(Entry {
        qp: qp.clone(),
        conn: conn.clone(),
        interest: ev,
    });
    if w.registered.fetch_add(1, Ordering::Relaxed) == 0 {
        // A thread that served nothing sleeps in epoll_wait without a
        // timeout: ring its doorbell so that it starts its liveness walk
        // (peer timeout, probes, wake-up nudges; every `TICK`). The
        // registration itself raises no event (no `EPOLLOUT` in the
        // interest), so nothing else would wake it.
        w.efd.set();
    }
    let _ = conn.pool.set(PoolLink {
        token,
        worker: w.clone(),
    });
    if let Err(e) = epoll_ctl(w.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, ev, token) {
        w.remove(token, fd);
        return Err(io::Error::new(
            e.kind(),
            format!("progress pool: epoll_ctl(ADD) of the connection's socket failed: {e}"),
        ));
    }
    Ok(())
}

/// The epoll interest of a pooled socket now (see the module docs);
/// `out`: a write of the connection has found the socket full before.
fn interest(conn: &Conn, out: bool) -> u32 {
    let mut ev = (libc::EPOLLET | libc::EPOLLRDHUP) as u32;
    if out {
        ev |= libc::EPOLLOUT as u32;
    }
    if !conn.app_driven.load(Ordering::SeqCst) && !conn.aside.load(Ordering::SeqCst) {
        ev |= libc::EPOLLIN as u32;
    }
    ev
}

fn epoll_ctl(epfd: RawFd, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: `ev` is a live local epoll_event; the kernel copies it (and
    // ignores it for EPOLL_CTL_DEL, where old kernels still want it
    // non-null).
    let rc = unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The eventfd's token in the epoll set (no connection has it: a
/// connection token's low half is a table index below `u32::MAX`).
const EFD_TOKEN: u64 = u64::MAX;

thread_local! {
    /// The worker this thread is (its address), 0 for other threads.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

struct Entry {
    qp: Arc<SoftQp>,
    conn: Arc<Conn>,
    /// The interest it was registered with.
    interest: u32,
}

#[derive(Default)]
struct Slab {
    slots: Vec<(u32, Option<Entry>)>,
    free: Vec<u32>,
}

impl Slab {
    /// Store `e`; returns its token: generation << 32 | index, so an event
    /// or queued work for a removed connection never reaches a new one in
    /// the same slot.
    fn insert(&mut self, e: Entry) -> u64 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[idx as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(e);
        (u64::from(slot.0) << 32) | u64::from(idx)
    }

    fn get(&self, token: u64) -> Option<&Entry> {
        let (gen, idx) = ((token >> 32) as u32, token as u32);
        match self.slots.get(idx as usize) {
            Some((g, Some(e))) if *g == gen => Some(e),
            _ => None,
        }
    }

    fn remove(&mut self, token: u64) -> Option<Entry> {
        let (gen, idx) = ((token >> 32) as u32, token as u32);
        match self.slots.get_mut(idx as usize) {
            Some((g, e @ Some(_))) if *g == gen => {
                self.free.push(idx);
                e.take()
            }
            _ => None,
        }
    }
}

/// A pool thread's per-connection state, touched only by that thread.
#[derive(Default, Clone, Copy)]
struct Local {
    /// The token this state belongs to (a reused slot starts afresh).
    token: u64,
    /// The epoll interest in force.
    interest: u32,
    /// A write of ours hit `EAGAIN`: the next `EPOLLOUT` edge resumes it.
    tx_blocked: bool,
    /// `Conn::app_polls` and `Conn::handbacks` at the last look.
    polls_seen: u64,
    handbacks_seen: u64,
    /// Stepping aside until then.
    aside_until: Option<Instant>,
}

struct Worker {
    epfd: OwnedFd,
    efd: EventFd,
    queue: Mutex<Vec<u64>>,
    slab: Mutex<Slab>,
    registered: AtomicUsize,
    /// Connection readiness events taken (`PoolStats::events`).
    events: AtomicU64,
}

impl Waker for Worker {
    fn wake(&self, token: u64) {
        let mut q = lock(&self.queue);
        let was_empty = q.is_empty();
        q.push(token);
        drop(q);
        // The pool thread looks at its queue after every batch of events,
        // so it need not ring its own doorbell.
        if was_empty && CURRENT.with(|c| c.get()) != self as *const Worker as usize {
            self.efd.set();
        }
    }
}

/// What one connection's turn did.
struct Turn {
    /// The receive work made a transmit due (a Read Response, a Terminate).
    tx_due: bool,
}

impl Worker {
    fn new() -> io::Result<Worker> {
        // SAFETY: plain FFI call without pointer arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor owned by nothing else.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let efd = EventFd::new()?;
        epoll_ctl(
            epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            efd.as_raw_fd(),
            libc::EPOLLIN as u32,
            EFD_TOKEN,
        )?;
        Ok(Worker {
            epfd,
            efd,
            queue: Mutex::new(Vec::new()),
            slab: Mutex::new(Slab::default()),
            registered: AtomicUsize::new(0),
            events: AtomicU64::new(0),
        })
    }

    fn lookup(&self, token: u64) -> Option<(Arc<SoftQp>, Arc<Conn>, u32)> {
        lock(&self.slab)
            .get(token)
            .map(|e| (e.qp.clone(), e.conn.clone(), e.interest))
    }

    /// Out of the epoll set, then out of the table (which drops the
    /// pool's hold on the `Conn` and so, eventually, closes the socket).
    fn remove(&self, token: u64, fd: RawFd) {
        // ENOENT (never added, or already removed) is fine.
        let _ = epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, token);
        let e = lock(&self.slab).remove(token);
        if let Some(e) = e {
            self.registered.fetch_sub(1, Ordering::Relaxed);
            let conn = e.conn.clone();
            drop(e);
            if same_host(&conn) {
                if let Some(Ok(p)) = POOL_INSTANCE.get() {
                    lock(&p.local_ends).remove(&(conn.local, conn.peer));
                }
            }
            // The pool's share of `live` (see `Conn::shutdown`).
            let mut n = lock(&conn.live);
            *n = n.saturating_sub(1);
            conn.live_cond.notify_all();
            tracing::trace!(peer = %conn.peer, "connection left the progress pool");
        }
    }

    fn run(self: Arc<Worker>) {
        CURRENT.with(|c| c.set(Arc::as_ptr(&self) as usize));
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut local: Vec<Local> = Vec::new();
        let mut work: Vec<u64> = Vec::new();
        let mut aside: Vec<u64> = Vec::new();
        let mut next_walk = Instant::now() + TICK;
        let mut nudge_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let timeout_ms: i32 = if !lock(&self.queue).is_empty() {
                0
            } else if self.registered.load(Ordering::Relaxed) == 0 && aside.is_empty() {
                -1
            } else {
                let mut until = next_walk;
                if let Some(t) = nudge_at {
                    until = until.min(t);
                }
                for &t in &aside {
                    if let Some(d) = self.local_of(&local, t).and_then(|l| l.aside_until) {
                        until = until.min(d);
                    }
                }
                let d = until.saturating_duration_since(now);
                // Round up: waking early would only spin.
                d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            };
            let waited = Instant::now();
            // SAFETY: `events` is a live buffer of `events.len()` entries,
            // which the kernel fills (at most that many).
            let n = unsafe {
                libc::epoll_wait(
                    self.epfd.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout_ms,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "progress pool: epoll_wait failed; retrying in 10 ms");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            if audit::enabled() {
                let waited = waited.elapsed();
                if (n == 0 && timeout_ms != 0) || waited >= audit::LONG_WAIT {
                    self.audit(&events[..n as usize], &local, waited);
                }
            }
            let mut conn_events = 0;
            for ev in &events[..n as usize] {
                let (token, flags) = (ev.u64, ev.events);
                if token == EFD_TOKEN {
                    // Cleared before the queue is taken below: a wake after
                    // this point rings again or finds its token taken.
                    self.efd.clear();
                    continue;
                }
                conn_events += 1;
                self.guarded(token, |w| w.on_event(token, flags, &mut local, &mut aside));
            }
            if conn_events > 0 {
                self.events.fetch_add(conn_events, Ordering::Relaxed);
            }
            std::mem::swap(&mut work, &mut *lock(&self.queue));
            for token in work.drain(..) {
                self.guarded(token, |w| w.on_work(token, &mut local));
            }
            let now = Instant::now();
            if !aside.is_empty() {
                self.aside_timers(now, &mut local, &mut aside);
            }
            if now >= next_walk || nudge_at.is_some_and(|t| now >= t) {
                nudge_at = self.walk(&mut local);
                next_walk = now + TICK;
            }
        }
    }

    /// After a wait that ended by its timeout or lasted at least
    /// [`audit::LONG_WAIT`]: count this thread's connections that had work
    /// all along and nothing to start it (see [`audit`]).
    fn audit(&self, events: &[libc::epoll_event], local: &[Local], waited: Duration) {
        audit::WAITS.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(
            ?waited,
            events = events.len(),
            "progress pool audit: a long or timed-out wait"
        );
        let all = self.entries();
        let queued: Vec<u64> = lock(&self.queue).clone();
        // The kernel's "last data / ACK received" ages are in jiffies.
        let before_wait = |ms: u32| u128::from(ms) > waited.as_millis() + audit::JIFFY_MARGIN_MS;
        for (token, qp, conn, i0) in all {
            let idle = |c: &Conn| c.pending.load(Ordering::SeqCst) == 0 && !queued.contains(&token);
            if conn.stop.load(Ordering::Acquire)
                || events.iter().any(|e| e.u64 == token)
                || !idle(&conn)
            {
                continue;
            }
            let interest = self.local_of(local, token).map_or(i0, |l| l.interest);
            let fd = conn.sock.as_raw_fd();
            let Some(info) = crate::sys::tcp_info(fd) else {
                continue;
            };
            if interest & libc::EPOLLIN as u32 != 0
                && !pool_must_not_read(&conn)
                && conn.rx_owner.load(Ordering::SeqCst) == RX_FREE
                && before_wait(info.tcpi_last_data_recv)
            {
                let mut unread: libc::c_int = 0;
                // SAFETY: FIONREAD writes one int to the live local.
                let rc =
                    unsafe { libc::ioctl(fd, libc::FIONREAD, &mut unread as *mut libc::c_int) };
                if rc == 0 && unread > 0 {
                    audit::RX_UNREAD.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        qpn = qp.qpn,
                        unread,
                        ?waited,
                        "progress pool audit: bytes unread through a whole wait, no event"
                    );
                }
            }
            let queued_tx = match conn.tx.try_lock() {
                Ok(tx) => tx.off < tx.frame_len || qp.lock_engine().has_transmit(),
                Err(_) => false,
            };
            // Looked at again after the look at `tx`: a poster that found
            // `tx` held by this audit has queued the work meanwhile.
            if queued_tx && before_wait(info.tcpi_last_ack_recv) && idle(&conn) {
                let w = iwarp_verbs::sys::poll_one(fd, libc::POLLOUT, Duration::ZERO).unwrap_or(0);
                if w & libc::POLLOUT != 0 {
                    audit::TX_WRITABLE.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(qpn = qp.qpn, ?waited, "progress pool audit: transmit work and a writable socket through a whole wait, nothing queued");
                }
            }
        }
    }

    /// Every connection of this thread: token, QP, connection, interest.
    fn entries(&self) -> Vec<(u64, Arc<SoftQp>, Arc<Conn>, u32)> {
        let slab = lock(&self.slab);
        slab.slots
            .iter()
            .enumerate()
            .filter_map(|(i, (g, e))| {
                e.as_ref().map(|e| {
                    (
                        (u64::from(*g) << 32) | i as u64,
                        e.qp.clone(),
                        e.conn.clone(),
                        e.interest,
                    )
                })
            })
            .collect()
    }

    /// Run one connection's turn; a panic in it (a bug) ends that
    /// connection, as it would end its own receive thread, instead of the
    /// pool thread and every other connection it serves.
    fn guarded(&self, token: u64, f: impl FnOnce(&Worker)) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        if r.is_err() {
            if let Some((qp, conn, _)) = self.lookup(token) {
                tracing::error!(qpn = qp.qpn, peer = %conn.peer, "progress pool: a connection's work panicked; closing that connection");
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    conn.connection_lost(
                        &qp,
                        "internal error in the progress pool (a panic; see the log)",
                        None,
                    )
                }));
                self.remove(token, conn.sock.as_raw_fd());
            }
        }
    }

    fn local_of<'a>(&self, local: &'a [Local], token: u64) -> Option<&'a Local> {
        local
            .get(token as u32 as usize)
            .filter(|l| l.token == token)
    }

    /// This thread's state for `token`, fresh if the slot was reused.
    fn local_mut(local: &mut Vec<Local>, token: u64, interest: u32) -> &mut Local {
        let idx = token as u32 as usize;
        if local.len() <= idx {
            local.resize(idx + 1, Local::default());
        }
        let l = &mut local[idx];
        if l.token != token {
            *l = Local {
                token,
                interest,
                ..Local::default()
            };
        }
        l
    }

    /// Bring the socket's epoll interest in line with the connection
    /// ([`interest`]). Leaving `EPOLLIN` out counts as stepping aside in
    /// the QP's statistics (`rx_steps_aside`), as a receive thread parking
    /// for the application does.
    fn set_interest(&self, qp: &SoftQp, conn: &Conn, l: &mut Local) {
        let out = l.tx_blocked || l.interest & libc::EPOLLOUT as u32 != 0;
        let ev = interest(conn, out);
        if ev != l.interest {
            let inn = libc::EPOLLIN as u32;
            if l.interest & inn != 0 && ev & inn == 0 {
                qp.counters.rx_steps_aside.fetch_add(1, Ordering::Relaxed);
            }
            let fd = conn.sock.as_raw_fd();
            match epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, ev, l.token) {
                Ok(()) => l.interest = ev,
                Err(e) => {
                    tracing::warn!(error = %e, peer = %conn.peer, "progress pool: epoll_ctl(MOD) failed")
                }
            }
        }
    }

    /// Transmit work for a connection from this thread; if the socket is
    /// full, `EPOLLOUT` joins its interest (once: it stays), so the edge
    /// of the room the peer makes resumes the write.
    fn transmit(&self, qp: &SoftQp, conn: &Conn, l: &mut Local) {
        l.tx_blocked |= tx_work(qp, conn);
        if l.tx_blocked && l.interest & libc::EPOLLOUT as u32 == 0 {
            self.set_interest(qp, conn, l);
        }
    }

    /// An epoll event for a connection.
    fn on_event(&self, token: u64, flags: u32, local: &mut Vec<Local>, aside: &mut Vec<u64>) {
        let Some((qp, conn, i0)) = self.lookup(token) else {
            return;
        };
        let l = Self::local_mut(local, token, i0);
        if conn.stop.load(Ordering::Acquire) {
            self.remove(token, conn.sock.as_raw_fd());
            return;
        }
        let mut tx = false;
        if flags & libc::EPOLLOUT as u32 != 0 && l.tx_blocked {
            l.tx_blocked = false;
            tx = true;
        }
        let readable = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
        if flags & readable != 0 && l.interest & libc::EPOLLIN as u32 != 0 {
            if self.step_aside(&qp, &conn, l) {
                aside.push(token);
            } else {
                tx |= rx_work(&qp, &conn).tx_due;
            }
        }
        if tx {
            self.transmit(&qp, &conn, l);
        }
    }

    /// Queued work for a connection (`Conn::schedule`).
    fn on_work(&self, token: u64, local: &mut Vec<Local>) {
        let Some((qp, conn, i0)) = self.lookup(token) else {
            return;
        };
        let l = Self::local_mut(local, token, i0);
        let bits = conn.pending.swap(0, Ordering::SeqCst);
        if bits & WORK_CLOSE != 0 || conn.stop.load(Ordering::Acquire) {
            self.remove(token, conn.sock.as_raw_fd());
            return;
        }
        if bits & WORK_REARM != 0 {
            if conn.aside.swap(false, Ordering::SeqCst) {
                // The poller handed back: the polls it made before do not
                // count at the next look (or this thread would step aside
                // again for a poller that sleeps now).
                l.aside_until = None;
                l.handbacks_seen = conn.handbacks.load(Ordering::SeqCst);
                l.polls_seen = conn.app_polls.load(Ordering::Relaxed);
            }
            // Turning EPOLLIN back on raises an edge if bytes are queued
            // (EPOLL_CTL_MOD polls the socket), so nothing is missed.
            self.set_interest(&qp, &conn, l);
        }
        let mut tx = bits & WORK_TX != 0;
        // A mode that went on and off again before this thread looked
        // leaves the interest as it was, so no MOD and no new edge: but a
        // turn cut short by the mode (`pool_must_not_read`) may have left
        // bytes in the socket. One pass finds them (or `EAGAIN`).
        let rearmed = bits & WORK_REARM != 0 && l.interest & libc::EPOLLIN as u32 != 0;
        if bits & WORK_RX != 0 || rearmed {
            tx |= rx_work(&qp, &conn).tx_due;
        }
        if tx {
            self.transmit(&qp, &conn, l);
        }
        if conn.stop.load(Ordering::Acquire) {
            self.remove(token, conn.sock.as_raw_fd());
        }
    }

    /// On a readable edge: if an application thread busy-polls this
    /// connection (more than [`SPINNING_POLLS`] `progress` calls since the
    /// last look, and it has not said it sleeps since), step aside: no
    /// `EPOLLIN` for [`STEP_ASIDE`], and no read now (the poller reads).
    /// Race-free with `Conn::stop_progress` as in `progress.rs`: this sets
    /// `aside` then reads `handbacks`; the poller bumps `handbacks` then
    /// reads `aside` and, seeing it, queues `WORK_REARM`.
    fn step_aside(&self, qp: &SoftQp, conn: &Conn, l: &mut Local) -> bool {
        let polls = conn.app_polls.load(Ordering::Relaxed);
        let mut calls = polls.wrapping_sub(l.polls_seen);
        l.polls_seen = polls;
        let hb = conn.handbacks.load(Ordering::SeqCst);
        if hb != l.handbacks_seen {
            l.handbacks_seen = hb;
            calls = 0;
        }
        if calls <= SPINNING_POLLS || conn.app_driven.load(Ordering::Acquire) {
            return false;
        }
        conn.aside.store(true, Ordering::SeqCst);
        if conn.handbacks.load(Ordering::SeqCst) != l.handbacks_seen {
            conn.aside.store(false, Ordering::SeqCst);
            return false;
        }
        l.aside_until = Some(Instant::now() + STEP_ASIDE);
        self.set_interest(qp, conn, l);
        true
    }

    /// Connections whose step-aside slice ended: another slice if the
    /// application still busy-polls, else `EPOLLIN` back on.
    fn aside_timers(&self, now: Instant, local: &mut Vec<Local>, aside: &mut Vec<u64>) {
        aside.retain(|&token| {
            let Some((qp, conn, i0)) = self.lookup(token) else {
                return false;
            };
            let l = Self::local_mut(local, token, i0);
            let Some(until) = l.aside_until else {
                return false;
            };
            if !conn.aside.load(Ordering::SeqCst) {
                // Taken back by `WORK_REARM` already.
                l.aside_until = None;
                return false;
            }
            if now < until {
                return true;
            }
            let polls = conn.app_polls.load(Ordering::Relaxed);
            let calls = polls.wrapping_sub(l.polls_seen);
            l.polls_seen = polls;
            if calls > SPINNING_POLLS
                && conn.handbacks.load(Ordering::SeqCst) == l.handbacks_seen
                && !conn.stop.load(Ordering::Acquire)
            {
                qp.counters.rx_steps_aside.fetch_add(1, Ordering::Relaxed);
                l.aside_until = Some(now + STEP_ASIDE);
                return true;
            }
            l.aside_until = None;
            conn.aside.store(false, Ordering::SeqCst);
            self.set_interest(&qp, &conn, l);
            false
        });
    }

    /// The transmit thread's periodic duties for every connection of this
    /// thread (peer timeout, probe, nudge); returns when the next nudge
    /// falls due, if one may.
    fn walk(&self, local: &mut Vec<Local>) -> Option<Instant> {
        let all = self.entries();
        let now = Instant::now();
        let mut nudge_at: Option<Instant> = None;
        for (token, qp, conn, i0) in all {
            if conn.stop.load(Ordering::Acquire) {
                self.remove(token, conn.sock.as_raw_fd());
                continue;
            }
            if conn.give_up_if_silent(&qp) {
                continue;
            }
            let due = conn.maybe_probe(&qp) | conn.maybe_nudge(&qp);
            if due {
                let l = Self::local_mut(local, token, i0);
                self.transmit(&qp, &conn, l);
            }
            if conn.nudges_left.load(Ordering::Relaxed) > 0 {
                let t = now + conn.tx_sleep();
                nudge_at = Some(nudge_at.map_or(t, |n| n.min(t)));
            }
        }
        nudge_at
    }
}

/// Receive work for a pooled connection from its pool thread: claim it
/// (or tell the owner to look again) and run passes until the socket is
/// drained or the budget is spent (the rest is queued as `WORK_RX`).
fn rx_work(qp: &SoftQp, conn: &Conn) -> Turn {
    let mut turn = Turn { tx_due: false };
    if !conn.claim_rx(true) {
        return turn;
    }
    loop {
        let r = {
            let mut rx = lock(&conn.rx);
            drain(qp, conn, &mut rx, &mut turn.tx_due)
        };
        match r {
            Ok(true) => {
                conn.schedule(WORK_RX);
            }
            Ok(false) => {}
            Err(why) => {
                while !conn.release_rx() {}
                conn.connection_lost(qp, &why, None);
                turn.tx_due = false;
                return turn;
            }
        }
        if conn.release_rx() {
            return turn;
        }
    }
}

/// Receive passes, never blocking, at most [`RX_BUDGET`]: `Ok(true)` if
/// the budget ran out with bytes still coming, `Ok(false)` when drained,
/// `Err` with the reason when the connection is over. A transmit made due
/// is reported in `tx_due`, not done here: receive never writes.
pub(super) fn drain(
    qp: &SoftQp,
    conn: &Conn,
    rx: &mut RxState,
    tx_due: &mut bool,
) -> Result<bool, String> {
    for _ in 0..RX_BUDGET {
        if conn.stop.load(Ordering::Acquire) {
            return Err("stopped".into());
        }
        // An application-driven CQ: the socket is the application's from
        // the next pass on (`Conn::set_app_driven`). Without this check a
        // pool thread in the middle of a turn read on for its whole budget
        // (4 MiB) after the mode changed. What this turn already buffered
        // stays in `rx` for the application's next pass; the socket keeps
        // the rest, and the application waits on it level-triggered.
        if pool_must_not_read(conn) {
            return Ok(false);
        }
        let p = rx_pass(qp, conn, rx);
        *tx_due |= std::mem::take(&mut rx.tx_due);
        match p {
            Pass::Progress => {}
            Pass::Idle | Pass::Drained => return Ok(false),
            Pass::Closed(why) => return Err(why),
        }
    }
    Ok(true)
}

/// The pool thread leaves the socket alone: the application reads it (an
/// application-driven CQ) or busy-polls it (stepping aside).
fn pool_must_not_read(conn: &Conn) -> bool {
    conn.app_driven.load(Ordering::SeqCst) || conn.aside.load(Ordering::SeqCst)
}

/// `tx` for a pool thread, without waiting: `None` if another thread holds
/// it, which then queues `WORK_TX` when it lets go (`Conn::tx_released`).
fn take_tx(conn: &Conn) -> Option<std::sync::MutexGuard<'_, TxState>> {
    match conn.tx.try_lock() {
        Ok(g) => return Some(g),
        Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => {}
    }
    conn.tx_wanted.store(true, Ordering::SeqCst);
    // Pairs with the fence in `Conn::tx_released` (see there).
    std::sync::atomic::fence(Ordering::SeqCst);
    match conn.tx.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => {
            audit::TX_LEFT.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Transmit work for a pooled connection from its pool thread: write what
/// the engine has, non-blocking, at most [`TX_BUDGET`] rounds (the rest is
/// queued as `WORK_TX`). Returns true if the socket was full (the next
/// `EPOLLOUT` edge resumes).
fn tx_work(qp: &SoftQp, conn: &Conn) -> bool {
    for _ in 0..TX_BUDGET {
        if conn.stop.load(Ordering::Acquire) {
            return false;
        }
        // Never wait for `tx`: its holder is an application thread
        // (`post_send`'s inline write, `progress`) that may be preempted
        // while it holds it, and this thread serves every other connection
        // of its set meanwhile. Under CPU contention a plain `lock` here
        // slept up to 17 ms (perf trace: futex in `Worker::transmit`), a
        // stall of all of them. Instead leave the work to the holder:
        // `tx_wanted`, then one more look, since the holder may have let
        // go before it could see the flag (`Conn::tx_released`).
        let mut tx = match take_tx(conn) {
            Some(tx) => tx,
            None => return false,
        };
        let r = flush(qp, conn, &mut tx);
        drop(tx);
        conn.tx_released();
        match r {
            Flush::Done => {
                if !qp.lock_engine().has_transmit() {
                    return false;
                }
            }
            Flush::WouldBlock => return true,
            Flush::Closed => return false,
        }
    }
    conn.schedule(WORK_TX);
    false
}
