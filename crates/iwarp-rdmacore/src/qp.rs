//! Queue pairs of the rdma-core provider: an RC `ibv_qp`, moved to INIT at
//! creation (so receives can be posted before connecting, as with the
//! software provider) and connected by `cm.rs`, which hands it its
//! rdma_cm connection (`conn.rs`); its state as the verbs API reports it;
//! posting ([`QpOps`], through `wr.rs`); and the flush of work posted in
//! the error state, which the device would never complete.
//!
//! The pump thread of its send CQ (`cq.rs`) asks it once per tick whether
//! the peer disconnected ([`Watched`]), so a peer's disconnect flushes
//! the QP as it does on the software provider. Its events (`next_event`)
//! and their descriptor (`event_fd`, an eventfd readable while an event
//! waits) are `events.rs`.

use std::ffi::c_int;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use iwarp_proto::engine::{
    PostError, QpState, RecvWr, SendWr, WcOpcode, WcQueue, WcStatus, WorkCompletion,
};

use crate::conn::CmConn;
use crate::cq::{HwCq, Watched};
use crate::device::os_err;
use crate::events::QpEvents;
use crate::ffi;
use crate::mr::Pd;
use crate::wr::{flushed_opcode, post_chain, send_wr_fields, sges};
use iwarp_verbs::provider::{ConnInfo, CqSource, QpEvent, QpOps, QpStats};
use iwarp_verbs::CompletionQueue;
use iwarp_verbs::Error;
use iwarp_verbs::QueuePair;

/// What the device granted a queue pair at creation (`ibv_qp_init_attr.cap`
/// as `ibv_create_qp` wrote it back): the depths and SGE counts (the
/// requested ones capped at [`DeviceAttr`](super::DeviceAttr)'s limits, possibly rounded up)
/// and the inline data size, which `ibv_query_device` does not report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Largest inline send (this provider requests 0 and never sends
    /// inline; a device may grant more).
    pub max_inline_data: u32,
}

/// The capabilities of a queue pair of a kernel device; `None` for one of
/// the software provider.
pub fn qp_caps(qp: &QueuePair) -> Option<QpCaps> {
    let q = qp.ops.clone().into_any().downcast::<Qp>().ok()?;
    let c = q.cap;
    Some(QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    })
}

const ST_INIT: u8 = 0;
const ST_RTS: u8 = 1;
const ST_ERROR: u8 = 2;
const ST_CLOSED: u8 = 3;

/// An RC `ibv_qp`.
pub(crate) struct Qp {
    pub(crate) pd: Arc<Pd>,
    pub(crate) qp: *mut ffi::ibv_qp,
    qpn: u32,
    send_cq: Arc<HwCq>,
    recv_cq: Arc<HwCq>,
    send_q: CompletionQueue,
    recv_q: CompletionQueue,
    /// What `ibv_create_qp` granted.
    cap: ffi::ibv_qp_cap,
    state: AtomicU8,
    /// The rdma_cm connection, once connected.
    pub(crate) conn: Mutex<Option<CmConn>>,
    /// `next_event`'s queue and `event_fd`'s descriptor.
    events: QpEvents,
    disconnected: AtomicBool,
}

// SAFETY: see `Device`.
unsafe impl Send for Qp {}
// SAFETY: see `Device`.
unsafe impl Sync for Qp {}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaQp")
            .field("qpn", &self.qpn)
            .field("device", &self.pd.dev.attr.name)
            .field("state", &self.state())
            .finish()
    }
}

impl Qp {
    pub(crate) fn create(
        pd: &Arc<Pd>,
        send: (&CompletionQueue, Arc<HwCq>),
        recv: (&CompletionQueue, Arc<HwCq>),
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Result<Arc<Qp>, Error> {
        let dev = &pd.dev;
        let lib = dev.lib;
        let sge = (iwarp_proto::engine::MAX_SGE as u32).min(dev.attr.max_sge.max(1));
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send.1.cq,
            recv_cq: recv.1.cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: max_send_wr.min(dev.attr.max_qp_wr),
                max_recv_wr: max_recv_wr.min(dev.attr.max_qp_wr),
                max_send_sge: sge,
                max_recv_sge: sge,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: pd and both CQs are live objects of this context; `init`
        // is a complete ibv_qp_init_attr (the device writes the granted
        // capabilities back into `init.cap`).
        let qp = unsafe { (lib.verbs.ibv_create_qp)(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(os_err("ibv_create_qp"));
        }
        // RESET -> INIT, as rdma_cm's ucma_init_conn_qp does (for IB and
        // RoCE with the P_Key index and port, which rdma_cm re-sets from the
        // route before RTR), so that receives can be posted at once.
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_INIT;
        a.qp_access_flags = ffi::IBV_ACCESS_LOCAL_WRITE
            | ffi::IBV_ACCESS_REMOTE_WRITE
            | ffi::IBV_ACCESS_REMOTE_READ;
        let mut mask = ffi::IBV_QP_STATE | ffi::IBV_QP_ACCESS_FLAGS;
        if !dev.attr.transport.is_iwarp() {
            a.pkey_index = 0;
            a.port_num = 1;
            mask |= ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT;
        }
        // SAFETY: `qp` was just created; `a` is a complete ibv_qp_attr.
        let rc = unsafe { (lib.verbs.ibv_modify_qp)(qp, &mut a, mask) };
        if rc != 0 {
            // SAFETY: created above, not shared.
            unsafe { (lib.verbs.ibv_destroy_qp)(qp) };
            return Err(Error::RdmaCore {
                op: "ibv_modify_qp(INIT)",
                why: std::io::Error::from_raw_os_error(rc).to_string(),
            });
        }
        // SAFETY: valid ibv_qp.
        let qpn = unsafe { (*qp).qp_num };
        let q = Arc::new(Qp {
            pd: pd.clone(),
            qp,
            qpn,
            send_cq: send.1,
            recv_cq: recv.1,
            send_q: send.0.clone(),
            recv_q: recv.0.clone(),
            cap: init.cap,
            state: AtomicU8::new(ST_INIT),
            conn: Mutex::new(None),
            events: QpEvents::default(),
            disconnected: AtomicBool::new(false),
        });
        let weak: Weak<dyn CqSource> = Arc::downgrade(&q) as _;
        send.0.attach(weak.clone());
        recv.0.attach(weak);
        let watched: Weak<dyn Watched> = Arc::downgrade(&q) as _;
        q.send_cq.watch(watched);
        tracing::debug!(qpn, device = %dev.attr.name, cap = ?(init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge, init.cap.max_inline_data), "rdma-core QP created");
        Ok(q)
    }

    pub(crate) fn established(&self) {
        self.state.store(ST_RTS, Ordering::Release);
        self.push_event(QpEvent::Established);
    }

    pub(crate) fn push_event(&self, ev: QpEvent) {
        tracing::debug!(qpn = self.qpn, event = ?ev, "QP event");
        self.events.push(ev);
    }

    /// The connection ended (peer or local): flush and report once.
    pub(crate) fn mark_disconnected(&self) {
        if self.state.load(Ordering::Acquire) != ST_CLOSED {
            self.state.store(ST_ERROR, Ordering::Release);
        }
        self.to_error();
        if !self.disconnected.swap(true, Ordering::AcqRel) {
            self.push_event(QpEvent::Disconnected);
        }
    }

    /// Move the QP to ERR: the device flushes every outstanding work
    /// request with IBV_WC_WR_FLUSH_ERR.
    fn to_error(&self) {
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_ERR;
        // SAFETY: valid QP; a complete attr with only the state used.
        unsafe { (self.pd.dev.lib.verbs.ibv_modify_qp)(self.qp, &mut a, ffi::IBV_QP_STATE) };
    }

    /// The device QP is in ERR (our error state, or closed after a
    /// disconnect, which moved it there).
    fn flushes_posts(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), ST_ERROR | ST_CLOSED)
    }

    /// Complete requests posted in the error state here, with `WrFlushErr`,
    /// as Linux siw does for a kernel consumer (`siw_post_send` →
    /// `siw_sq_flush_wr`, `siw_post_receive` → `siw_rq_flush_wr`; what
    /// `ib_drain_qp` relies on). Handed to the device they would never
    /// complete: rdma-core's siw provider writes a request into the queue
    /// it shares with the kernel (`providers/siw/siw.c`), and the kernel
    /// flushes that queue only when the QP enters ERR; the doorbell of a
    /// later post carries no request, so `siw_sq_flush_wr` has nothing to
    /// flush, and a receive rings no doorbell at all. The device's
    /// completions go to `cq` first, so these follow the flushes of the
    /// requests posted before (siw flushes its queues inside
    /// `ibv_modify_qp(ERR)`, `siw_qp_nextstate_from_rts`; soft-RoCE flushes
    /// from a task a moment later). A full CQ refuses the request
    /// (`PostError::CqFull`, siw: `ENOMEM`).
    fn post_flushed(
        &self,
        wrs: impl Iterator<Item = (u64, WcOpcode)>,
        queue: WcQueue,
        cq: &CompletionQueue,
        hw: &HwCq,
    ) -> Result<(), PostError> {
        hw.drain_all(cq);
        let mut r = Ok(());
        for (wr_id, opcode) in wrs {
            if cq.len() >= cq.depth() {
                r = Err(PostError::CqFull { wr_id });
                break;
            }
            cq.push(WorkCompletion {
                wr_id,
                status: WcStatus::WrFlushErr,
                opcode,
                queue,
                byte_len: 0,
                invalidated_rkey: None,
                solicited: false,
            });
        }
        cq.run_hook();
        r
    }

    fn drain_both(&self) {
        self.send_cq.drain(&self.send_q);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.drain(&self.recv_q);
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Some(c) = self
            .conn
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            c.destroy();
        }
        // SAFETY: the QP is ours, no rdma_cm id refers to it any more
        // (destroy() cleared id->qp), and nothing posts to it (the last
        // handle is being dropped).
        unsafe { (self.pd.dev.lib.verbs.ibv_destroy_qp)(self.qp) };
    }
}

impl QpOps for Qp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if self.flushes_posts() {
            return self.post_flushed(
                wrs.iter().map(|w| (w.wr_id, flushed_opcode(&w.opcode))),
                WcQueue::Send,
                &self.send_q,
                &self.send_cq,
            );
        }
        // Before RTS the device refuses (siw: `ENOTCONN`, `QpError`).
        let mut lists: Vec<_> = wrs.iter().map(|w| sges(&w.sgl)).collect();
        let mut chain: Vec<ffi::ibv_send_wr> = wrs
            .iter()
            .zip(lists.iter_mut())
            .map(|(w, (sg, n))| {
                let (opcode, send_flags, inv, remote_addr, rkey) = send_wr_fields(w);
                ffi::ibv_send_wr {
                    wr_id: w.wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: sg.as_mut_ptr(),
                    num_sge: *n as c_int,
                    opcode,
                    send_flags,
                    invalidate_rkey: inv,
                    rdma: ffi::ibv_send_wr_rdma {
                        remote_addr,
                        rkey,
                        ..Default::default()
                    },
                    qp_type_xrc: 0,
                    _pad: 0,
                    _bind_mw_tso: [0; 6],
                }
            })
            .collect();
        let ctx = self.pd.dev.ctx;
        let qp = self.qp;
        post_chain(
            &mut chain,
            |i| wrs[i].wr_id,
            |head, bad| {
                // SAFETY: the QP is valid; the chain and its SGE arrays live
                // until the call returns (the device copies them); post_send is
                // the ops call verbs.h's inline ibv_post_send makes.
                unsafe {
                    match (*ctx).ops.post_send {
                        Some(f) => f(qp, head, bad),
                        None => libc::ENOSYS,
                    }
                }
            },
        )
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if self.flushes_posts() {
            return self.post_flushed(
                wrs.iter().map(|w| (w.wr_id, WcOpcode::Recv)),
                WcQueue::Recv,
                &self.recv_q,
                &self.recv_cq,
            );
        }
        let mut lists: Vec<_> = wrs.iter().map(|w| sges(&w.sgl)).collect();
        let mut chain: Vec<ffi::ibv_recv_wr> = wrs
            .iter()
            .zip(lists.iter_mut())
            .map(|(w, (sg, n))| ffi::ibv_recv_wr {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: sg.as_mut_ptr(),
                num_sge: *n as c_int,
            })
            .collect();
        let ctx = self.pd.dev.ctx;
        let qp = self.qp;
        post_chain(
            &mut chain,
            |i| wrs[i].wr_id,
            |head, bad| {
                // SAFETY: as in post_send, for the ops table's post_recv.
                unsafe {
                    match (*ctx).ops.post_recv {
                        Some(f) => f(qp, head, bad),
                        None => libc::ENOSYS,
                    }
                }
            },
        )
    }

    fn state(&self) -> QpState {
        match self.state.load(Ordering::Acquire) {
            ST_INIT => QpState::Init,
            ST_RTS => QpState::Rts,
            ST_ERROR => QpState::Error,
            _ => QpState::Closed,
        }
    }

    fn disconnect(&self) {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = conn.as_ref() {
            c.disconnect(Duration::from_secs(2));
        }
        drop(conn);
        if self.state.load(Ordering::Acquire) != ST_INIT
            || self.disconnected.load(Ordering::Acquire)
        {
            self.state.store(ST_CLOSED, Ordering::Release);
            self.mark_disconnected();
        } else {
            // Never connected: move to ERR so that posted receives
            // complete (flushed) instead of vanishing with the QP.
            self.state.store(ST_CLOSED, Ordering::Release);
            self.to_error();
        }
        self.drain_both();
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.conn.lock().ok()?.as_ref()?.local_addr()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.conn.lock().ok()?.as_ref()?.peer_addr()
    }

    fn conn_info(&self) -> Option<ConnInfo> {
        // The kernel negotiates MPA (iWARP) or the IB CM exchange; the
        // result is not visible through librdmacm.
        None
    }

    fn stats(&self) -> QpStats {
        QpStats::default()
    }

    fn next_event(&self, timeout: Duration) -> Option<QpEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(ev) = self.events.pop() {
                return Some(ev);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return None;
            }
            // Read rdma_cm events in slices so a concurrent disconnect()
            // can take the connection lock.
            let slice = (deadline - now).min(Duration::from_millis(50));
            let ended = {
                let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
                match conn.as_ref() {
                    Some(c) => c.poll_disconnected(slice),
                    None => {
                        drop(conn);
                        self.events.wait(slice);
                        false
                    }
                }
            };
            if ended {
                self.mark_disconnected();
                self.drain_both();
            }
        }
    }

    /// An eventfd readable while an event waits for `next_event`
    /// (`events.rs` says why not the completion channel's descriptor or
    /// the rdma_cm channel's). A peer's disconnect is queued by the send
    /// CQ's pump within one tick (50 ms) of the rdma_cm event, so a waiter
    /// that only sleeps on this descriptor learns of it without calling
    /// `next_event`.
    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.events.fd(self.qpn)
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl CqSource for Qp {
    fn progress(&self) {
        self.drain_both();
    }
    fn stop_progress(&self) {}
    fn set_app_driven(&self, _on: bool) {}
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

impl Watched for Qp {
    /// For the pump: if the peer disconnected (an rdma_cm event waiting on
    /// the connection's channel), end the connection here as
    /// [`QpOps::next_event`] would. Never blocks: skips a connection whose
    /// lock another thread holds (it is reading the events itself).
    fn check_disconnect(&self) {
        if self.disconnected.load(Ordering::Acquire) {
            return;
        }
        let ended = match self.conn.try_lock() {
            Ok(g) => g
                .as_ref()
                .is_some_and(|c| c.poll_disconnected(Duration::ZERO)),
            Err(_) => false,
        };
        if ended {
            self.mark_disconnected();
            self.drain_both();
        }
    }
}
