//! Queue pairs (`struct ibv_qp`): the verbs face of one RDMAP endpoint.
//!
//! A [`QueuePair`] wraps the sans-IO [`Engine`] behind a mutex, the two
//! completion queues its completions go to, an event queue, and, once
//! connected by [`crate::cm`], the driver ([`crate::driver`]) that moves
//! its bytes.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use iwarp_proto::engine::{
    Engine, EngineEvent, PostError, QpState, RecvWr, SendWr, TermInfo, WcStatus, WorkCompletion,
};
use iwarp_proto::handshake::Rtr;
use iwarp_proto::mem::PdId;

use crate::cq::CompletionQueue;
pub use crate::provider::{ConnInfo, QpEvent, QpStats};
use crate::provider::CqSource;
use crate::driver::Conn;
use crate::mr::MrTable;

/// Attributes of a new queue pair (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    /// CQ for send-queue completions.
    pub send_cq: CompletionQueue,
    /// CQ for receive-queue completions.
    pub recv_cq: CompletionQueue,
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) tx_bytes: AtomicU64,
    pub(crate) rx_buffered_bytes: AtomicU64,
    pub(crate) rx_direct_bytes: AtomicU64,
    pub(crate) rx_polled_bytes: AtomicU64,
    pub(crate) rx_steps_aside: AtomicU64,
    pub(crate) tx_polled_bytes: AtomicU64,
}

/// The `wr_id` of the internal RTR work request (RFC 6581 zero-length
/// message); its completions never reach the CQ.
pub(crate) const RTR_WR_ID: u64 = u64::MAX;

/// The `wr_id` of the driver's liveness probe (a zero-length RDMA Read,
/// [`ConnParam::probe_interval`](crate::cm::ConnParam::probe_interval));
/// the engine keeps its completions out of the CQ.
pub(crate) const PROBE_WR_ID: u64 = u64::MAX - 1;

pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) pd: PdId,
    pub(crate) engine: Mutex<Engine>,
    pub(crate) mem: Arc<MrTable>,
    pub(crate) send_cq: CompletionQueue,
    pub(crate) recv_cq: CompletionQueue,
    events: Mutex<VecDeque<QpEvent>>,
    events_cond: Condvar,
    disconnected: AtomicBool,
    rtr_outstanding: AtomicBool,
    pub(crate) conn: OnceLock<Arc<Conn>>,
    pub(crate) info: OnceLock<ConnInfo>,
    /// Set by the CM while a connect/accept is in progress or done.
    pub(crate) claimed: AtomicBool,
    pub(crate) counters: Counters,
}

impl fmt::Debug for QpShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.qpn)
            .field("pd", &self.pd)
            .field("conn", &self.conn.get())
            .field("info", &self.info.get())
            .finish()
    }
}

impl QpShared {
    pub(crate) fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push_event(&self, ev: QpEvent) {
        if ev == QpEvent::Disconnected && self.disconnected.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(qpn = self.qpn, event = ?ev, "QP event");
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(ev);
        self.events_cond.notify_all();
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

impl CqSource for QpShared {
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

/// A queue pair. Created in [`QpState::Init`] by
/// [`ProtectionDomain::create_qp`](crate::ProtectionDomain::create_qp);
/// connected by [`crate::cm::connect`] or [`crate::cm::ConnRequest::accept`].
///
/// Dropping it disconnects it (like `rdma_destroy_qp` after
/// `rdma_disconnect`): outstanding work requests are flushed into the CQs and
/// the driver threads exit.
pub struct QueuePair {
    pub(crate) shared: Arc<QpShared>,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

/// See [`QueuePair::drive`].
#[derive(Debug)]
pub struct Drive {
    qp: Arc<QpShared>,
    conn: Arc<Conn>,
}

impl Drive {
    /// The QP's socket: wait for `POLLIN` on it, then call
    /// [`progress`](Self::progress). Do not read, write or close it.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.conn.raw_fd()
    }

    /// Do the pending receive (and transmit) work from this thread; never
    /// blocks.
    pub fn progress(&self) {
        self.conn.progress(&self.qp);
    }
}

impl Drop for Drive {
    fn drop(&mut self) {
        self.conn.stop_driving();
    }
}

impl QueuePair {
    pub(crate) fn build(
        qpn: u32,
        pd: PdId,
        engine: Engine,
        mem: Arc<MrTable>,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
    ) -> QueuePair {
        let shared = QpShared {
            qpn,
            pd,
            engine: Mutex::new(engine),
            mem,
            send_cq,
            recv_cq,
            events: Mutex::new(VecDeque::new()),
            events_cond: Condvar::new(),
            disconnected: AtomicBool::new(false),
            rtr_outstanding: AtomicBool::new(false),
            conn: OnceLock::new(),
            info: OnceLock::new(),
            claimed: AtomicBool::new(false),
            counters: Counters::default(),
        };
        let shared = Arc::new(shared);
        let weak: std::sync::Weak<dyn CqSource> = Arc::downgrade(&shared) as _;
        shared.send_cq.attach(weak.clone());
        if !shared.recv_cq.same_as(&shared.send_cq) {
            shared.recv_cq.attach(weak);
        }
        QueuePair { shared }
    }

    /// The QP number (unique within the process; for logs).
    pub fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    /// Post a send-queue work request (`ibv_post_send`). On a connected QP
    /// the calling thread writes the frames itself when the socket has room
    /// (lowest latency), otherwise the driver's transmit thread does; this
    /// call never blocks on the network.
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        let qp = &*self.shared;
        let tx = {
            let mut eng = qp.lock_engine();
            eng.post_send(*wr)?;
            crate::driver::pump(qp, &mut eng);
            eng.has_transmit()
        };
        if tx {
            if let Some(conn) = qp.conn.get() {
                conn.kick(qp);
            }
        }
        Ok(())
    }

    /// Post several send-queue work requests at once (`ibv_post_send` with a
    /// chained list): they are queued under one lock and transmitted
    /// together. On `Err`, the error names the first refused request; the
    /// ones before it were posted, the ones after it were not (the
    /// `bad_wr` semantics of ibverbs).
    pub fn post_send_list(&self, wrs: &[SendWr]) -> Result<(), PostError> {
        let qp = &*self.shared;
        let (r, tx) = {
            let mut eng = qp.lock_engine();
            let r = wrs.iter().try_for_each(|wr| eng.post_send(*wr));
            crate::driver::pump(qp, &mut eng);
            (r, eng.has_transmit())
        };
        if tx {
            if let Some(conn) = qp.conn.get() {
                conn.kick(qp);
            }
        }
        r
    }

    /// Post several receives at once (`ibv_post_recv` with a chained list);
    /// `bad_wr` semantics as in [`QueuePair::post_send_list`].
    pub fn post_recv_list(&self, wrs: &[RecvWr]) -> Result<(), PostError> {
        let mut eng = self.shared.lock_engine();
        let r = wrs.iter().try_for_each(|wr| eng.post_recv(*wr));
        crate::driver::pump(&self.shared, &mut eng);
        r
    }

    /// Post a receive (`ibv_post_recv`); allowed from [`QpState::Init`] on,
    /// so buffers can be in place before the connection exists.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        let mut eng = self.shared.lock_engine();
        eng.post_recv(*wr)?;
        crate::driver::pump(&self.shared, &mut eng);
        Ok(())
    }

    /// Do this QP's pending receive work from the calling thread (see
    /// [`CompletionQueue::progress`]); returns at once. For busy-poll loops
    /// that spin on memory rather than on a CQ.
    pub fn progress(&self) {
        if let Some(conn) = self.shared.conn.get() {
            conn.progress(&self.shared);
        }
    }

    /// Take over this QP's receive work until the guard is dropped: the
    /// stack's receive thread stops reading the socket (after the `recv`
    /// it may be blocked in), and the calling thread waits for
    /// [`Drive::fd`] to be readable (with `poll(2)`, together with its
    /// other file descriptors) and calls [`Drive::progress`]. Nothing is
    /// received while the guard lives and nobody calls `progress`, so do
    /// not sleep on a CQ meanwhile; the peer's close or Terminate, too, is
    /// seen only at the next `progress` (call it before trusting
    /// [`state`](Self::state) after a pause). For a thread that waits for several
    /// things at once: the data is read by the thread that wakes anyway,
    /// instead of waking the receive thread first. `None` before the QP is
    /// connected.
    pub fn drive(&self) -> Option<Drive> {
        let conn = self.shared.conn.get()?.clone();
        conn.start_driving();
        Some(Drive {
            qp: self.shared.clone(),
            conn,
        })
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.shared.lock_engine().state()
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.shared.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.shared.recv_cq
    }

    /// Local address of the connection, once connected.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.conn.get().map(|c| c.local)
    }

    /// Peer address of the connection, once connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.shared.conn.get().map(|c| c.peer)
    }

    /// What the MPA handshake negotiated, once connected.
    pub fn conn_info(&self) -> Option<ConnInfo> {
        self.shared.info.get().copied()
    }

    /// Byte counters of the driver.
    pub fn stats(&self) -> QpStats {
        let c = &self.shared.counters;
        QpStats {
            tx_bytes: c.tx_bytes.load(Ordering::Relaxed),
            rx_buffered_bytes: c.rx_buffered_bytes.load(Ordering::Relaxed),
            rx_direct_bytes: c.rx_direct_bytes.load(Ordering::Relaxed),
            rx_polled_bytes: c.rx_polled_bytes.load(Ordering::Relaxed),
            rx_steps_aside: c.rx_steps_aside.load(Ordering::Relaxed),
            tx_polled_bytes: c.tx_polled_bytes.load(Ordering::Relaxed),
        }
    }

    /// Wait up to `timeout` for the next [`QpEvent`].
    pub fn next_event(&self, timeout: Duration) -> Option<QpEvent> {
        let qp = &*self.shared;
        let deadline = Instant::now().checked_add(timeout);
        let mut q = qp.events.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ev) = q.pop_front() {
                return Some(ev);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return None;
            }
            q = qp
                .events_cond
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Disconnect (`rdma_disconnect`): the QP stops accepting work, every
    /// outstanding work request is flushed with [`WcStatus::WrFlushErr`],
    /// queued frames get up to [`crate::driver::LINGER`] to leave, the
    /// socket is shut down and the driver threads are joined (bounded wait).
    /// Idempotent.
    pub fn disconnect(&self) {
        let qp = &*self.shared;
        {
            let mut eng = qp.lock_engine();
            if eng.state() != QpState::Closed {
                eng.close();
            }
            crate::driver::pump(qp, &mut eng);
        }
        if let Some(conn) = qp.conn.get() {
            conn.shutdown(qp);
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.disconnect();
    }
}
