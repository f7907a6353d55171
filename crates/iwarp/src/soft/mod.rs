//! The software provider: the sans-IO engine of [`iwarp_proto`] driven over
//! a TCP socket, with a receive thread, a transmit thread, and the
//! opportunistic work done by application threads.
//!
//! # Modules
//!
//! - this file: the device and its protection domains (`SoftDevice`,
//!   `SoftPd`: `DeviceOps`, `PdOps` of `device_ops.rs`; memory regions
//!   need nothing beyond the context's region table), and `SoftQp`, the
//!   provider's queue pair (the engine behind its mutex, the event queue,
//!   the connection once there is one), with its implementation of the
//!   provider seam (`QpOps`, `CqSource` in `provider.rs`). Completion
//!   queues need no device object: a QP completes into the verbs
//!   `CompletionQueue` directly.
//! - [`cm`]: the connection manager (TCP connect/accept and the MPA
//!   handshake, RFC 5044 §7 and RFC 6581), which hands a handshaken socket
//!   to `conn`; the connection-manager parts of the seam (`DeviceCm`,
//!   `QpCm`, `ListenerOps`, `RequestOps`).
//! - `conn`: a connected QP's state (socket, receive and transmit state,
//!   liveness rules, losing the connection); it uses no sibling module.
//! - `rx`: one receive pass (buffered or straight into a region), on
//!   `conn`.
//! - `tx`: frames out of the engine and onto the socket, and the transmit
//!   thread, on `conn`.
//! - `progress`: **who reads this socket now** (the receive thread, a
//!   polling application thread, or only application threads), how the
//!   receive thread steps aside, and starting and tearing down a
//!   connection's threads; on `conn`, `rx` and `tx`.
//!
//! So the modules form a chain, `conn` ← `rx`, `tx` ← `progress`, with
//! no import loop.
//! - `link`: FPDU sizing from the TCP MSS and the socket options.
//! - [`pool`]: the progress pool, the other engine: a fixed set of
//!   threads (epoll, edge-triggered) that does the receive and transmit
//!   work of every connection of the process, chosen with
//!   `IWARP_PROGRESS=pool` or [`set_progress_engine`]; on `conn`, `rx`
//!   and `tx`, used by `progress` to start a connection. The default is
//!   still one receive and one transmit thread per connection, described
//!   below; on a pooled connection the pool thread plays both threads'
//!   parts (see the `pool` module docs), and the receive work is handed
//!   between it and application threads by `Conn::claim_rx` instead of
//!   the `rx` lock's `try_lock`.
//!
//! # Threads and locks
//!
//! Per connected QP there is one **receive thread** and one **transmit
//! thread**; application threads also do receive work when they call
//! `CompletionQueue::progress`, or wait in a busy-poll or application-driven CQ (`Conn::progress`). The state they share:
//!
//! | lock | guards | held across |
//! |------|--------|-------------|
//! | `rx` (`Mutex<RxState>`) | the receive buffer and the right to read the socket | non-blocking `recv` calls and engine calls, and the receive thread's blocking `recv` while no application thread polls (`rx_exclusive`, which returns once one does). The receive thread `lock`s it, application threads only `try_lock` it |
//! | `tx` (`Mutex<TxState>`) | the frame being written and how much of it is out | non-blocking `send`/`sendmsg` calls and engine calls; never a wait (the transmit thread waits for socket space holding nothing). Every thread but the transmit thread only `try_lock`s it |
//! | `engine` (`Mutex<Engine>`) | the sans-IO engine | engine calls only; never a system call on the socket |
//! | MR table (`RwLock`, read side) | region lookup | the lookup only (the region's `Arc` is cloned out) |
//! | CQ / event queue mutexes | the queues | a push or a pop |
//!
//! Lock order is `rx` → `tx` → `engine` → MR table / CQ / event queue;
//! nothing is ever acquired in the other direction, so the locks cannot
//! deadlock. (A CQ's list of attached QPs is taken only by a polling
//! thread, before any of these, and with `try_lock`.)
//!
//! **Receive work** (`rx_pass`), by whoever holds `rx`, never blocks:
//! lock the engine to ask [`Engine::rx_hint`], unlock, then read with a
//! non-blocking `recv`: large tagged payload (≥ [`DIRECT_MIN`]) goes
//! straight into the target region (zero-copy placement; the region is held
//! only for that copy), everything else into a reusable 256 KiB buffer.
//! Buffered reads from an empty buffer are kept short ([`RX_READ`], or
//! [`HDR_PEEK`] during bulk tagged traffic) so that segment payloads are
//! left in the socket for the direct path rather than copied twice. Then it
//! locks the engine, feeds the bytes ([`Engine::handle_input`] /
//! [`Engine::handle_direct`]), drains completions into the CQs and events
//! into the QP's event queue, unlocks, and if the engine has something to
//! send tries one *non-blocking* transmit pass (or wakes the transmit
//! thread). Nobody doing receive work ever blocks on a write, so two peers
//! that are both sending a lot cannot end up both blocked in `write` with
//! nobody reading.
//!
//! **Receive thread** (`rx_loop`): while no application thread calls
//! `progress`, it holds `rx` and blocks in `recv` (one system call per
//! wake-up); once one does, it waits for readability with `poll` holding
//! no lock, then takes `rx` and drains the socket. This is what
//! makes one-sided operations progress while the application computes
//! (RFC 5040 requires no help from the target's application). While an
//! application thread busy-polls, the receive thread steps aside (see
//! `rx_loop`) so that arriving data does not wake a second thread to
//! compete for the CPU: the polling thread reads its own socket, as a
//! spinning TCP reader does, which removes a thread hand-off from every
//! message's latency.
//!
//! **Transmit path.** Whoever holds `tx` loops: lock the engine,
//! [`Engine::poll_transmit`] into the shared [`TxFrame`](iwarp_proto::engine::TxFrame), unlock, write the
//! frame's pieces with one gather `sendmsg` (inline headers from the frame,
//! payload straight from registered memory; a frame of at most
//! [`SMALL_SEND`] bytes is copied and written with one `send`), handle
//! partial writes, and
//! once the whole frame is out lock the engine and
//! [`Engine::confirm_transmit`]. An application thread in `post_send` takes
//! `tx` only with `try_lock` and only writes non-blocking: on `EAGAIN` or
//! if `tx` is busy it wakes the transmit thread, which is the only one that
//! waits for socket space (with `poll`, in 100 ms slices so it notices a
//! stop request), and it waits *without* holding `tx`: an application
//! thread in `progress` (waiting for this very transfer) pushes a partly
//! written frame on itself whenever it finds `tx` free, so a large Write or
//! Read Response keeps moving while the transmit thread waits to be
//! scheduled. After releasing `tx`, every writer re-checks
//! [`Engine::has_transmit`] and wakes the transmit thread if work appeared
//! meanwhile; the wake flag is sticky, so no wake-up is lost.
//!
//! **Teardown.** EOF, a read error or a write error first confirms a frame
//! that is already entirely in the socket (the receive thread sets the stop
//! flag and takes `tx` with a bounded `try_lock` wait, so a Send the peer
//! read just before closing still completes successfully), then calls
//! [`Engine::on_peer_closed`] (every other outstanding work request is
//! flushed into the CQs at once), queues [`QpEvent::Disconnected`], sets the stop
//! flag and shuts the socket down, which wakes a thread blocked in `read`
//! or `poll`. When the engine [`wants_close`](Engine::wants_close) (after a
//! Terminate, or a local close) the transmit path writes what is left and
//! shuts down the write side, so the peer sees EOF. `disconnect` and `Drop`
//! give the last frames up to [`LINGER`] to leave, shut the socket down in
//! both directions and wait (bounded) for both threads to exit.

pub mod cm;
mod conn;
pub(crate) mod link;
pub mod pool;
mod progress;
mod rx;
mod tx;

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use iwarp_proto::engine::{
    Engine, EngineConfig, EngineEvent, PostError, QpState, RecvWr, SendWr, WcQueue, WcStatus,
    WorkCompletion,
};
use iwarp_proto::mem::{Access, PdId};

use crate::cq::CompletionQueue;
use crate::device_info::{DeviceAttr, Transport};
use crate::device_ops::{DeviceOps, PdOps};
use crate::error::Error;
use crate::mr::{MemoryRegion, MrTable};
use crate::provider::{ConnInfo, CqSource, QpEvent, QpOps, QpStats};
use crate::qp::{QpInitAttr, QueuePair};

pub use conn::RX_BUF;
pub(crate) use conn::{Conn, Liveness, SockState};
pub(crate) use link::tune_socket;
pub use link::{mulpdu_for_mss, mulpdu_for_path, MULPDU_CAP};
pub use pool::{
    pool_stats, progress_engine, set_progress_engine, PoolStats, ProgressEngine, ENV_ENGINE,
    ENV_THREADS,
};
pub use progress::LINGER;
pub use rx::{DIRECT_MIN, DIRECT_TAIL, HDR_PEEK, RX_READ};
pub use tx::{fault, SMALL_SEND, TX_BATCH};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
    events: Mutex<VecDeque<QpEvent>>,
    events_cond: Condvar,
    /// Threads waiting on `events_cond` (changed and read with `events`
    /// locked), so that an event nobody waits for costs no futex call.
    event_waiters: AtomicU32,
    /// `QueuePair::event_fd`: made on first use, then readable while
    /// `events` is non-empty (set and cleared with `events` locked).
    event_fd: OnceLock<crate::sys::EventFd>,
    disconnected: AtomicBool,
    rtr_outstanding: AtomicBool,
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

/// The software device (`soft`), one per [`Context`](crate::Context): it
/// numbers the context's queue pairs.
#[derive(Debug, Default)]
pub(crate) struct SoftDevice {
    next_qpn: Arc<AtomicU32>,
}

impl SoftDevice {
    pub(crate) fn open() -> Arc<SoftDevice> {
        Arc::new(SoftDevice {
            next_qpn: Arc::new(AtomicU32::new(1)),
        })
    }
}

impl DeviceOps for SoftDevice {
    fn name(&self) -> &str {
        "soft"
    }
    fn transport(&self) -> Transport {
        Transport::SoftIwarp
    }
    fn attr(&self) -> Option<&DeviceAttr> {
        None
    }
    fn alloc_pd(&self, id: PdId, mrs: &Arc<MrTable>) -> Arc<dyn PdOps> {
        Arc::new(SoftPd {
            id,
            mrs: mrs.clone(),
            next_qpn: self.next_qpn.clone(),
        })
    }
    fn create_cq(&self, _cq: &CompletionQueue, _depth: usize) -> Result<(), Error> {
        Ok(())
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// A protection domain of the software device: its identifier scopes the
/// regions and queue pairs of the context's table (RFC 5040 §2.1 PD check,
/// done by the engine through `MrTable`).
struct SoftPd {
    id: PdId,
    mrs: Arc<MrTable>,
    next_qpn: Arc<AtomicU32>,
}

impl PdOps for SoftPd {
    fn register_mr(&self, _mr: &mut MemoryRegion, _access: Access) -> Result<(), Error> {
        // The context's table is the whole registration here.
        Ok(())
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>, Error> {
        if attr.send_cq.hw().is_some() || attr.recv_cq.hw().is_some() {
            return Err(Error::WrongDevice("a completion queue of a kernel device"));
        }
        let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed);
        Ok(create_qp(
            qpn,
            self.id,
            attr.max_send_wr,
            attr.max_recv_wr,
            self.mrs.clone(),
            attr.send_cq.clone(),
            attr.recv_cq.clone(),
        ))
    }
}

/// Create a software queue pair in `Init` whose completions go to the two
/// CQs, and attach it to them.
fn create_qp(
    qpn: u32,
    pd: PdId,
    sq_depth: u32,
    rq_depth: u32,
    mem: Arc<MrTable>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
) -> Arc<SoftQp> {
    let engine = Engine::new(EngineConfig {
        pd,
        sq_depth,
        rq_depth,
    });
    let qp = Arc::new(SoftQp {
        qpn,
        engine: Mutex::new(engine),
        mem,
        send_cq,
        recv_cq,
        events: Mutex::new(VecDeque::new()),
        events_cond: Condvar::new(),
        event_waiters: AtomicU32::new(0),
        event_fd: OnceLock::new(),
        disconnected: AtomicBool::new(false),
        rtr_outstanding: AtomicBool::new(false),
        conn: OnceLock::new(),
        info: OnceLock::new(),
        claimed: AtomicBool::new(false),
        counters: Counters::default(),
    });
    let weak: std::sync::Weak<dyn CqSource> = Arc::downgrade(&qp) as _;
    qp.send_cq.attach(weak.clone());
    if !qp.recv_cq.same_as(&qp.send_cq) {
        qp.recv_cq.attach(weak);
    }
    qp
}

/// The software queue pair behind `qp`, for this provider's connection
/// manager; `None` if another provider made it.
pub(crate) fn of(qp: &QueuePair) -> Option<Arc<SoftQp>> {
    qp.ops.clone().into_any().downcast::<SoftQp>().ok()
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

/// The engine completes work posted in these states at once with
/// `WrFlushErr` (Linux siw `siw_post_send` / `siw_post_receive` in the
/// ERROR state; our `Closed` follows `rdma_disconnect`, which moves an
/// iWARP QP to ERROR).
fn flushes_posts(state: QpState) -> bool {
    matches!(state, QpState::Error | QpState::Closed)
}

impl SoftQp {
    /// Post one request that the engine flushes (the QP is in the error
    /// state), unless `cq`, which takes its completion, is full: Linux siw
    /// `siw_sqe_complete` / `siw_rqe_complete` fail with `-ENOMEM` when the
    /// CQ has no free entry, and the post fails naming that request. Every
    /// other completion is kept past the depth (see `CompletionQueue::push`)
    /// because the stack produced it; this one the application asks for,
    /// and a loop that posts until the queue refuses must end. The
    /// completion goes to the CQ at once, so the next request of a list
    /// sees it.
    fn post_flushed(
        &self,
        eng: &mut Engine,
        cq: &CompletionQueue,
        wr_id: u64,
        post: impl FnOnce(&mut Engine) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        if cq.len() >= cq.depth() {
            return Err(PostError::CqFull { wr_id });
        }
        post(eng)?;
        pump(self, eng);
        Ok(())
    }
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// On a connected QP the calling thread writes the frames itself when
    /// the socket has room (lowest latency), otherwise the transmit thread
    /// does; never blocks on the network.
    fn post_send(&self, wrs: &[SendWr]) -> Result<(), PostError> {
        let (r, tx) = {
            let mut eng = self.lock_engine();
            let r = wrs.iter().try_for_each(|wr| {
                if !flushes_posts(eng.state()) {
                    return eng.post_send(*wr);
                }
                self.post_flushed(&mut eng, &self.send_cq, wr.wr_id, |e| e.post_send(*wr))
            });
            pump(self, &mut eng);
            (r, eng.has_transmit())
        };
        if tx {
            if let Some(conn) = self.conn.get() {
                conn.kick(self);
            }
        }
        r
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostError> {
        let mut eng = self.lock_engine();
        let r = wrs.iter().try_for_each(|wr| {
            if !flushes_posts(eng.state()) {
                return eng.post_recv(*wr);
            }
            self.post_flushed(&mut eng, &self.recv_cq, wr.wr_id, |e| e.post_recv(*wr))
        });
        pump(self, &mut eng);
        r
    }

    fn state(&self) -> QpState {
        self.lock_engine().state()
    }

    fn disconnect(&self) {
        {
            let mut eng = self.lock_engine();
            if eng.state() != QpState::Closed {
                eng.close();
            }
            pump(self, &mut eng);
        }
        if let Some(conn) = self.conn.get() {
            conn.shutdown(self);
        }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.conn.get().map(|c| c.local)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.conn.get().map(|c| c.peer)
    }

    fn conn_info(&self) -> Option<ConnInfo> {
        self.info.get().copied()
    }

    fn stats(&self) -> QpStats {
        let c = &self.counters;
        QpStats {
            tx_bytes: c.tx_bytes.load(Ordering::Relaxed),
            rx_buffered_bytes: c.rx_buffered_bytes.load(Ordering::Relaxed),
            rx_direct_bytes: c.rx_direct_bytes.load(Ordering::Relaxed),
            rx_polled_bytes: c.rx_polled_bytes.load(Ordering::Relaxed),
            rx_steps_aside: c.rx_steps_aside.load(Ordering::Relaxed),
            tx_polled_bytes: c.tx_polled_bytes.load(Ordering::Relaxed),
        }
    }

    fn next_event(&self, timeout: Duration) -> Option<QpEvent> {
        let deadline = Instant::now().checked_add(timeout);
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ev) = q.pop_front() {
                if q.is_empty() {
                    if let Some(efd) = self.event_fd.get() {
                        efd.clear();
                    }
                }
                return Some(ev);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return None;
            }
            self.event_waiters.fetch_add(1, Ordering::Relaxed);
            q = self
                .events_cond
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            self.event_waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if let Some(efd) = self.event_fd.get() {
            return Some(efd.as_raw_fd());
        }
        let efd = match crate::sys::EventFd::new() {
            Ok(efd) => efd,
            Err(e) => {
                tracing::warn!(qpn = self.qpn, error = %e, "no eventfd for the QP's events (raise the open-file limit, ulimit -n); waiters fall back to their deadlines");
                return None;
            }
        };
        // Made under the events lock, so it matches the queue from now on.
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let efd = self.event_fd.get_or_init(|| efd);
        if !q.is_empty() {
            efd.set();
        }
        Some(efd.as_raw_fd())
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl CqSource for SoftQp {
    fn progress(&self) {
        if let Some(conn) = self.conn.get() {
            conn.progress(self);
        }
    }

    fn stop_progress(&self) {
        if let Some(conn) = self.conn.get() {
            conn.stop_progress();
        }
    }

    fn set_app_driven(&self, on: bool) {
        if let Some(conn) = self.conn.get() {
            conn.set_app_driven(on);
        }
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.conn.get().map(|c| c.raw_fd())
    }
}
