//! The software provider's shared state: the types every other module of
//! the provider works on, and nothing that does work on the network.
//!
//! - [`SoftQp`], the provider's queue pair: the engine behind its mutex
//!   (locked only through [`EngineGuard`], which runs the CQs' completion
//!   hooks on release), the event queue, the connection once there is one;
//!   [`pump`], which drains the engine's completions and events into the
//!   CQs and the event queue;
//! - [`Conn`], a connected QP's connection: the socket, the receive and
//!   transmit state ([`RxState`], [`TxState`]) behind their locks, the
//!   flags and counters of who reads and who writes, the liveness clock;
//!   [`PoolLink`] and the [`Waker`] trait through which the progress pool
//!   reaches a connection;
//! - the constants the modules share (the internal `wr_id`s, the sizes of
//!   the buffers, the work bits of the pool).
//!
//! A leaf: it imports no sibling module, and every sibling imports from
//! it, so the modules that act on this state (`conn.rs`: liveness and
//! losing the connection; `rx.rs`, `tx.rs`, `progress.rs`, `pool.rs`;
//! `qp.rs`: the provider seam) form no circle.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_proto::engine::{Engine, EngineEvent, TxFrame, WcQueue, WcStatus, WorkCompletion};
use iwarp_verbs::provider::{ConnInfo, QpEvent};
use iwarp_verbs::sys::EventFd;
use iwarp_verbs::{CompletionQueue, MrInner, MrTable};
use socket2::Socket;

/// Lock `m`, taking the data of a poisoned mutex as it is (a panicking
/// driver thread must not take every other user of the QP down with it).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drain completions and events out of the engine (engine lock held).
pub(crate) fn pump(qp: &SoftQp, eng: &mut Engine) {
    while let Some(wc) = eng.poll_completion() {
        if wc.queue == WcQueue::Send && qp.take_rtr_completion(&wc) {
            continue;
        }
        match wc.queue {
            WcQueue::Send => qp.send_cq.push(wc),
            WcQueue::Recv => qp.recv_cq.push(wc),
        }
    }
    while let Some(ev) = eng.poll_event() {
        qp.push_engine_event(ev);
    }
}

/// The `wr_id` of the internal RTR work request (RFC 6581 zero-length
/// message); its completions never reach the CQ.
pub(crate) const RTR_WR_ID: u64 = u64::MAX;

/// The `wr_id` of the driver's liveness probe (a zero-length RDMA Read,
/// [`ConnParam::probe_interval`](cm::ConnParam::probe_interval))
/// and wake-up nudge; the engine keeps their completions out of the CQ.
pub(crate) const PROBE_WR_ID: u64 = u64::MAX - 1;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) tx_bytes: AtomicU64,
    pub(crate) rx_buffered_bytes: AtomicU64,
    pub(crate) rx_direct_bytes: AtomicU64,
    pub(crate) rx_polled_bytes: AtomicU64,
    pub(crate) rx_steps_aside: AtomicU64,
    pub(crate) tx_polled_bytes: AtomicU64,
}

/// The software provider's queue pair.
pub(crate) struct SoftQp {
    pub(crate) qpn: u32,
    pub(crate) engine: Mutex<Engine>,
    pub(crate) mem: Arc<MrTable>,
    pub(crate) send_cq: CompletionQueue,
    pub(crate) recv_cq: CompletionQueue,
    pub(crate) events: Mutex<VecDeque<QpEvent>>,
    pub(crate) events_cond: Condvar,
    /// Threads waiting on `events_cond` (changed and read with `events`
    /// locked), so that an event nobody waits for costs no futex call.
    pub(crate) event_waiters: AtomicU32,
    /// `QueuePair::event_fd`: made on first use, then readable while
    /// `events` is non-empty (set and cleared with `events` locked).
    pub(crate) event_fd: OnceLock<EventFd>,
    pub(crate) disconnected: AtomicBool,
    pub(crate) rtr_outstanding: AtomicBool,
    pub(crate) conn: OnceLock<Arc<Conn>>,
    pub(crate) info: OnceLock<ConnInfo>,
    /// Set by the CM while a connect/accept is in progress or done.
    pub(crate) claimed: AtomicBool,
    pub(crate) counters: Counters,
}

impl fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.qpn)
            .field("conn", &self.conn.get())
            .field("info", &self.info.get())
            .finish()
    }
}

/// The engine, locked; on release, the CQs' completion hooks run for what
/// [`pump`] queued meanwhile (see [`CompletionQueue::set_completion_hook`]),
/// on whichever thread let go, with the engine unlocked. Every lock of the
/// engine goes through this guard, so no completion misses its hook.
pub(crate) struct EngineGuard<'a> {
    qp: &'a SoftQp,
    guard: Option<MutexGuard<'a, Engine>>,
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        self.guard
            .as_ref()
            .expect("engine guard is live until dropped")
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        self.guard
            .as_mut()
            .expect("engine guard is live until dropped")
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.qp.send_cq.run_hook();
        if !self.qp.recv_cq.same_as(&self.qp.send_cq) {
            self.qp.recv_cq.run_hook();
        }
    }
}

impl SoftQp {
    pub(crate) fn lock_engine(&self) -> EngineGuard<'_> {
        EngineGuard {
            qp: self,
            guard: Some(self.engine.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    pub(crate) fn push_event(&self, ev: QpEvent) {
        if ev == QpEvent::Disconnected && self.disconnected.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(qpn = self.qpn, event = ?ev, "QP event");
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(ev);
        if let Some(efd) = self.event_fd.get() {
            efd.set();
        }
        // Read under the lock: a waiter counts itself in under it before
        // it waits, so it is either counted here or finds the event.
        let waiters = self.event_waiters.load(Ordering::Relaxed);
        drop(q);
        if waiters > 0 {
            self.events_cond.notify_all();
        }
    }

    pub(crate) fn push_engine_event(&self, ev: EngineEvent) {
        self.push_event(match ev {
            EngineEvent::TerminateReceived(t) => QpEvent::TerminateReceived(t),
            EngineEvent::TerminateSent(t) => QpEvent::TerminateSent(t),
            EngineEvent::PeerClosed => QpEvent::Disconnected,
        });
    }

    pub(crate) fn report_disconnected(&self) {
        self.push_event(QpEvent::Disconnected);
    }

    pub(crate) fn set_rtr_outstanding(&self) {
        self.rtr_outstanding.store(true, Ordering::Release);
    }

    /// True (and swallowed) if `wc` completes the internal RTR request.
    pub(crate) fn take_rtr_completion(&self, wc: &WorkCompletion) -> bool {
        if wc.wr_id != RTR_WR_ID || !self.rtr_outstanding.swap(false, Ordering::AcqRel) {
            return false;
        }
        if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
            tracing::warn!(
                qpn = self.qpn,
                status = wc.status.as_str(),
                "RFC 6581 RTR message failed"
            );
        }
        true
    }
}

/// Slice of the transmit thread's waits, so that it notices `stop`.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// Application `progress` calls between two looks of the receive thread
/// (or pool thread) above which it considers the application to be busy
/// polling.
pub(super) const SPINNING_POLLS: u64 = 64;
/// How long the receive thread (or pool thread) steps aside while an
/// application thread busy-polls.
pub(super) const STEP_ASIDE: Duration = Duration::from_millis(1);

/// `Conn::quiet_since_ms` when the peer owes nothing.
pub(super) const NOT_OWED: u64 = u64::MAX;
/// Wake-up nudges (see `Conn::maybe_nudge`): the silence after our last
/// bytes before the first one, doubled for each next one.
pub(super) const NUDGE_FIRST_GAP_MS: u64 = 20;
/// At most this many nudges per connection...
pub(super) const NUDGE_MAX: u32 = 6;
/// ...and only this long after the connection went live: the race they
/// repair is with the peer's connection setup.
pub(super) const NUDGE_WINDOW_MS: u64 = 2_000;

/// The connection of a QP: its socket and the driver's shared state.
pub(crate) struct Conn {
    pub(super) sock: Socket,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    pub(super) tx: Mutex<TxState>,
    pub(super) rx: Mutex<RxState>,
    /// Calls of [`Conn::progress`] by application threads (busy polling).
    pub(super) app_polls: AtomicU64,
    /// Bumped by [`Conn::stop_progress`]: an application thread that
    /// polled is about to sleep, so the receive thread must not step aside.
    pub(super) handbacks: AtomicU64,
    /// The receive thread is stepping aside (parked for up to
    /// [`STEP_ASIDE`], or while `app_driven` is set); `stop_progress`
    /// unparks it.
    pub(super) aside: AtomicBool,
    /// One of the QP's CQs is in `ProgressMode::AppDriven`: application
    /// threads wait on the socket themselves and do the receive work, so
    /// the receive thread stays parked.
    pub(super) app_driven: AtomicBool,
    /// The receive thread, for `unpark` (set by the thread itself).
    pub(super) rx_thread: std::sync::OnceLock<std::thread::Thread>,
    pub(super) wake: Mutex<bool>,
    pub(super) wake_cond: Condvar,
    /// Set when the connection is over: threads exit.
    pub(super) stop: AtomicBool,
    /// The engine was told the peer is gone.
    pub(super) down: AtomicBool,
    /// [`ConnParam::peer_timeout`](crate::cm::ConnParam::peer_timeout).
    pub(super) peer_timeout: Duration,
    /// [`ConnParam::probe_interval`](crate::cm::ConnParam::probe_interval).
    pub(super) probe_interval: Duration,
    /// Milliseconds since `epoch` when the last probe was queued.
    pub(super) last_probe_ms: AtomicU64,
    /// Wake-up nudges still allowed (0: off, or done); see
    /// [`Conn::maybe_nudge`].
    pub(super) nudges_left: AtomicU32,
    /// Milliseconds since `epoch` when we last wrote bytes (kept only
    /// while `nudges_left > 0`; `NOT_OWED`: nothing written yet).
    pub(super) last_tx_ms: AtomicU64,
    /// Milliseconds since `epoch` when the last nudge was queued.
    pub(super) last_nudge_ms: AtomicU64,
    /// When the connection started (the clock of the fields below).
    pub(super) epoch: Instant,
    /// Milliseconds since `epoch` when bytes last arrived, as of the last
    /// [`Conn::last_rx_ms`] (read it through that).
    pub(super) last_rx_ms: AtomicU64,
    /// Bytes arrived since `last_rx_ms` was last brought up to date.
    pub(super) rx_unstamped: AtomicBool,
    /// Milliseconds since `epoch` since when the peer owes Read Responses
    /// with all our data acknowledged (`NOT_OWED`: it owes nothing).
    pub(super) quiet_since_ms: AtomicU64,
    /// Bytes of ours the peer had acknowledged at the last look
    /// (`tx_bytes - SIOCOUTQ`; only its changes matter).
    pub(super) acked_mark: AtomicU64,
    /// Milliseconds since `epoch` since when data of ours sits in the
    /// socket and the peer acknowledges none of it (`NOT_OWED`: no such
    /// stall).
    pub(super) stalled_since_ms: AtomicU64,
    /// `shutdown` waits for the last frames to leave: writers notify
    /// `linger_cond` (under `linger_lock`) when they release `tx`.
    pub(super) lingering: AtomicBool,
    pub(super) linger_lock: Mutex<()>,
    pub(super) linger_cond: Condvar,
    /// We send markers (RFC 5044 §5): one FPDU per write, each written
    /// with `MSG_EOR`, so that every FPDU is alone in its TCP segment.
    pub(super) fpdu_per_segment: bool,
    /// We shut down our write side.
    pub(super) write_shut: AtomicBool,
    pub(super) live: Mutex<usize>,
    pub(super) live_cond: Condvar,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Set when the connection is served by the progress pool (`pool.rs`)
    /// instead of its own two threads; never changes afterwards.
    pub(super) pool: std::sync::OnceLock<PoolLink>,
    /// Pool work due for this connection (`WORK_*` bits); see
    /// [`Conn::schedule`].
    pub(super) pending: AtomicU8,
    /// Pooled connections only: who does the receive work now
    /// (`RX_FREE`, `RX_HELD`, `RX_AGAIN`); see [`Conn::claim_rx`].
    pub(super) rx_owner: AtomicU8,
    /// Pooled connections only: a pool thread found `tx` held and left the
    /// transmit work to the holder, which queues it (`WORK_TX`) when it
    /// lets go ([`Conn::tx_released`]): a pool thread never sleeps on one
    /// connection's lock while its other connections wait.
    pub(super) tx_wanted: AtomicBool,
    /// `tx` holds a frame the socket did not take whole: the last `flush`
    /// returned `WouldBlock` (written under `tx`; see `tx.rs`). Lets
    /// [`Conn::progress`]'s transmit half skip the `tx` lock (two atomic
    /// read-modify-writes and a fence per busy-poll round) when there is
    /// nothing to push on. A stale `false` only defers the push to the
    /// writer that saw `WouldBlock`, which woke the transmit side.
    pub(super) tx_partial: AtomicBool,
}

/// Pool work bits (see [`Conn::schedule`]): read what the socket holds...
pub(super) const WORK_RX: u8 = 1;
/// ...write what the engine has...
pub(super) const WORK_TX: u8 = 2;
/// ...recompute the epoll interest (application-driven mode or stepping
/// aside changed)...
pub(super) const WORK_REARM: u8 = 4;
/// ...the connection is over: leave the pool.
pub(super) const WORK_CLOSE: u8 = 8;

/// `Conn::rx_owner`: nobody does the receive work.
pub(super) const RX_FREE: u8 = 0;
/// One thread does it.
pub(super) const RX_HELD: u8 = 1;
/// One thread does it, and the pool was told the socket became readable
/// meanwhile: the holder runs one more pass before it lets go.
pub(super) const RX_AGAIN: u8 = 2;

/// Where a pooled connection's work is queued.
pub(super) trait Waker: Send + Sync {
    /// Queue `token` for the pool thread serving it (and wake it).
    fn wake(&self, token: u64);
}

/// A pooled connection's place in the pool: its pool thread and its key
/// in that thread's table.
pub(super) struct PoolLink {
    pub(super) token: u64,
    pub(super) worker: Arc<dyn Waker>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("stop", &self.stop.load(Ordering::Relaxed))
            .finish()
    }
}

/// What the connection manager knows about a handshaken socket when it
/// hands it to the driver (`Conn::start`), so that nobody asks the
/// kernel twice.
pub(crate) struct SockState {
    /// Our address, if known without `getsockname` (the listener's, when
    /// it is bound to a specific address).
    pub(crate) local: Option<SocketAddr>,
    /// The peer's address.
    pub(crate) peer: SocketAddr,
    /// The socket is in non-blocking mode (`O_NONBLOCK`).
    pub(crate) nonblocking: bool,
    /// `TCP_NODELAY` and keepalive are in force (set on our listener,
    /// which the accepted socket inherits).
    pub(crate) tuned: bool,
}

/// The connection's liveness settings, from
/// [`ConnParam`](crate::cm::ConnParam).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    pub(crate) peer_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) wake_nudge: bool,
    /// Markers are negotiated for what we send: one FPDU per TCP segment
    /// (see [`Conn::fpdu_per_segment`]).
    pub(crate) fpdu_per_segment: bool,
}

#[derive(Default)]
pub(crate) struct TxState {
    pub(super) frame: TxFrame,
    pub(super) frame_len: usize,
    pub(super) off: usize,
    /// Regions held alive during one `sendmsg` (kept for its capacity).
    pub(super) hold: Vec<Arc<MrInner>>,
    /// The iovecs of one `sendmsg` (kept for its capacity).
    pub(super) iov: IovBuf,
    /// Where a small frame is gathered for one `send` (see `write_some`).
    pub(super) small: SmallBuf,
}

/// Frames (or remainders) up to this size are copied and written with one
/// `send` instead of a gather `sendmsg` (see `tx.rs`'s `write_some`).
pub const SMALL_SEND: usize = 512;

/// The gather buffer of a small frame, allocated once per connection
/// rather than zeroed on the stack at every write.
pub(super) struct SmallBuf(pub(super) Box<[u8; SMALL_SEND]>);

impl Default for SmallBuf {
    fn default() -> SmallBuf {
        SmallBuf(Box::new([0; SMALL_SEND]))
    }
}

/// Reusable iovec storage, so a write allocates nothing.
#[derive(Default)]
pub(super) struct IovBuf(pub(super) Vec<libc::iovec>);

// SAFETY: `IovBuf` is empty between calls of `write_some`, which clears it
// on every exit (errors included), so the raw pointers it holds never
// outlive the borrow they were taken under and are never seen by another
// thread; only the capacity moves between threads.
unsafe impl Send for IovBuf {}

/// Size of the receive buffer (room for any partial FPDU), allocated at a
/// connection's first receive pass.
pub const RX_BUF: usize = 256 * 1024;

/// The receive side of a connection: the buffer of bytes read but not yet
/// consumed by the engine, and the bulk-mode heuristics. Behind
/// `Conn::rx`: whoever holds it may read the socket (the receive thread,
/// or an application thread in [`Conn::progress`]).
pub(crate) struct RxState {
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Bulk tagged traffic: keep buffered reads header-sized so that each
    /// segment's payload goes through the direct path.
    pub(super) bulk: bool,
    /// The last read was a header-sized peek.
    pub(super) peeked: bool,
    /// The last read returned less than it asked for: the socket is
    /// probably empty, so once its bytes are consumed the pass reports
    /// `Idle` instead of paying for a `recv` that would find nothing (on
    /// the latency path of a busy poller, that `recv` is a socket lock
    /// round trip before the application sees its data).
    pub(super) short: bool,
    /// Buffered reads block (the receive thread alone reads; see
    /// `rx_exclusive`).
    pub(super) block: bool,
    /// The engine has something to send after this pass (a Read Response,
    /// a Terminate): the caller transmits (`progress.rs`).
    pub(super) tx_due: bool,
    /// The engine's receive hint was `Buffered` after the last input this
    /// state fed it, so the next read goes into the buffer without asking
    /// the engine again (an engine lock per busy-poll round). Only input
    /// moves the hint from `Buffered` to `Direct`: `Direct` needs the
    /// engine in RTS (never re-entered) inside a segment's payload, which
    /// only a parsed header starts, and headers arrive only through this
    /// state. Cleared whenever bytes are fed (`rx.rs`).
    pub(super) hint_buffered: bool,
}

impl RxState {
    /// The buffer, allocated ([`RX_BUF`] bytes) on first use.
    pub(super) fn ready(&mut self) {
        if self.buf.is_empty() {
            self.buf = vec![0u8; RX_BUF];
        }
    }

    pub(crate) fn new() -> RxState {
        RxState {
            // Allocated by the first receive pass (`RxState::ready`): a
            // connection that is set up and never receives costs no
            // 256 KiB mapping (an mmap and a munmap per connection).
            buf: Vec::new(),
            start: 0,
            end: 0,
            bulk: false,
            peeked: false,
            short: false,
            block: false,
            tx_due: false,
            hint_buffered: false,
        }
    }
}
