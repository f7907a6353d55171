//! The software provider's queue pair as the verbs layer sees it: creating
//! one (attached to its CQs), and the provider seam's queue-pair traits
//! (`QpOps`, `CqSource` of `iwarp_verbs::provider`) for [`SoftQp`]. Its
//! connection-manager part (`QpCm`) is `cm.rs`; the state it works on is
//! `state.rs`.

use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use iwarp_proto::engine::{Engine, EngineConfig, PostError, QpState, RecvWr, SendWr};
use iwarp_proto::mem::PdId;
use iwarp_verbs::provider::{ConnInfo, CqSource, QpEvent, QpOps, QpStats};
use iwarp_verbs::sys::EventFd;
use iwarp_verbs::{CompletionQueue, MrTable, QueuePair};

use crate::state::{pump, Counters, SoftQp};

/// Create a software queue pair in `Init` whose completions go to the two
/// CQs, and attach it to them.
pub(crate) fn create_qp(
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
        let efd = match EventFd::new() {
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
