//! Completion queues of the rdma-core provider: an `ibv_cq` with its
//! completion channel behind each [`CompletionQueue`], and the CQ's pump
//! thread, which moves the device's completions into the CQ's queue (so
//! `poll`, `wait` and the eventfd behave as with the software provider)
//! and, once per tick, has the CQ's queue pairs look for a peer's
//! disconnect ([`Watched`]).
//!
//! Who drains the device CQ: the pump thread after each channel event or
//! tick, and any thread in [`CompletionQueue::progress`] or posting to a
//! QP in the error state; `drain_lock` lets one of them at a time move
//! completions, so they reach the queue in the device's order.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::device::{os_err, Device};
use crate::ffi;
use crate::wr::map_wc;
use iwarp_verbs::Error;
use iwarp_verbs::{CompletionQueue, WeakCq};

/// What the pump asks, once per tick, of a queue pair on its CQ: read the
/// connection's rdma_cm events and, if the peer disconnected, flush (see
/// [`HwCq::watch`]). The queue pair implements it, so this module needs
/// no knowledge of queue pairs.
pub(super) trait Watched: Send + Sync {
    /// Never blocks; skips a connection another thread is reading.
    fn check_disconnect(&self);
}

/// An `ibv_cq` and its completion channel.
pub(crate) struct HwCq {
    dev: Arc<Device>,
    chan: *mut ffi::ibv_comp_channel,
    pub(crate) cq: *mut ffi::ibv_cq,
    /// The pump thread should exit.
    stop: AtomicBool,
    /// Serializes draining, so completions reach the queue in order.
    drain_lock: Mutex<()>,
    /// The QPs on this CQ, whose rdma_cm channels the pump reads for a
    /// peer's disconnect ([`HwCq::watch_disconnects`]).
    qps: Mutex<Vec<Weak<dyn Watched>>>,
    /// When the pump last read them.
    watched_at: Mutex<Option<std::time::Instant>>,
}

// SAFETY: see `Device`.
unsafe impl Send for HwCq {}
// SAFETY: see `Device`.
unsafe impl Sync for HwCq {}

impl fmt::Debug for HwCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HwCq")
    }
}

/// How long the pump thread sleeps in `poll(2)` before it checks whether
/// its CQ is still alive.
const PUMP_TICK_MS: c_int = 50;

impl HwCq {
    /// Create the device CQ behind `cq` and start its pump thread.
    pub(crate) fn create(
        dev: &Arc<Device>,
        cq: &CompletionQueue,
        depth: usize,
    ) -> Result<Arc<HwCq>, Error> {
        let lib = dev.lib;
        let cqe =
            c_int::try_from(depth.min(dev.attr.max_cqe.max(1) as usize)).unwrap_or(c_int::MAX);
        // SAFETY: the context is open.
        let chan = unsafe { (lib.verbs.ibv_create_comp_channel)(dev.ctx) };
        if chan.is_null() {
            return Err(os_err("ibv_create_comp_channel"));
        }
        // SAFETY: context open, channel just created on it.
        let hw = unsafe { (lib.verbs.ibv_create_cq)(dev.ctx, cqe, std::ptr::null_mut(), chan, 0) };
        if hw.is_null() {
            let e = os_err("ibv_create_cq");
            // SAFETY: created above, unused.
            unsafe { (lib.verbs.ibv_destroy_comp_channel)(chan) };
            return Err(e);
        }
        // SAFETY: `chan` is valid; make its fd non-blocking so the pump
        // never blocks in ibv_get_cq_event.
        unsafe {
            let fd = (*chan).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let hwcq = Arc::new(HwCq {
            dev: dev.clone(),
            chan,
            cq: hw,
            stop: AtomicBool::new(false),
            drain_lock: Mutex::new(()),
            qps: Mutex::new(Vec::new()),
            watched_at: Mutex::new(None),
        });
        hwcq.arm();
        let weak = cq.downgrade();
        let h = hwcq.clone();
        std::thread::Builder::new()
            .name(format!("rdma-cq-{}", dev.attr.name))
            .spawn(move || h.pump(weak))
            .map_err(|e| Error::RdmaCore {
                op: "spawn CQ thread",
                why: e.to_string(),
            })?;
        Ok(hwcq)
    }

    fn arm(&self) {
        // SAFETY: `cq` is valid; req_notify_cq is in the context's ops
        // table (verbs.h `ibv_req_notify_cq` is this inline call).
        unsafe {
            if let Some(f) = (*self.dev.ctx).ops.req_notify_cq {
                f(self.cq, 0);
            }
        }
    }

    fn pump(self: Arc<HwCq>, weak: WeakCq) {
        loop {
            let Some(cq) = weak.upgrade() else { break };
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            // SAFETY: `chan` is valid while `self` lives.
            let fd = unsafe { (*self.chan).fd };
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            drop(cq);
            // SAFETY: one valid pollfd; bounded wait.
            let n = unsafe { libc::poll(&mut pfd, 1, PUMP_TICK_MS) };
            let Some(cq) = weak.upgrade() else { break };
            if n > 0 {
                let mut ev_cq: *mut ffi::ibv_cq = std::ptr::null_mut();
                let mut ev_ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: the fd is readable and non-blocking; the outputs
                // are writable.
                let rc = unsafe {
                    (self.dev.lib.verbs.ibv_get_cq_event)(self.chan, &mut ev_cq, &mut ev_ctx)
                };
                if rc == 0 {
                    // SAFETY: one event of this CQ was taken above.
                    unsafe { (self.dev.lib.verbs.ibv_ack_cq_events)(ev_cq, 1) };
                    self.arm();
                }
            }
            self.drain(&cq);
            drop(cq);
            self.watch_disconnects();
        }
    }

    /// Once per pump tick: read the rdma_cm events of this CQ's connected
    /// QPs and move a QP whose peer disconnected to the error state, so
    /// its outstanding work requests flush without the application reading
    /// QP events. iWARP's connection manager does that in the kernel (the
    /// TCP connection is gone); InfiniBand's and RoCE's leave it to the
    /// consumer (librdmacm's examples call `rdma_disconnect` on
    /// RDMA_CM_EVENT_DISCONNECTED), and the soft provider flushes at once,
    /// so without this a receive posted on rxe0 waited forever.
    fn watch_disconnects(&self) {
        let now = std::time::Instant::now();
        {
            let mut at = self.watched_at.lock().unwrap_or_else(|e| e.into_inner());
            if at.is_some_and(|t| {
                now.duration_since(t) < std::time::Duration::from_millis(PUMP_TICK_MS as u64)
            }) {
                return;
            }
            *at = Some(now);
        }
        let qps: Vec<Arc<dyn Watched>> = {
            let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(Weak::upgrade).collect()
        };
        for qp in qps {
            qp.check_disconnect();
        }
    }

    /// Have the pump watch `qp`'s connection (see [`Self::watch_disconnects`]).
    pub(super) fn watch(&self, qp: Weak<dyn Watched>) {
        self.qps.lock().unwrap_or_else(|e| e.into_inner()).push(qp);
    }

    /// Move every completion the device holds into `cq`; returns at once if
    /// another thread is doing it.
    pub(crate) fn drain(&self, cq: &CompletionQueue) {
        let Ok(g) = self.drain_lock.try_lock() else {
            return;
        };
        self.drain_locked(cq, g);
    }

    /// Move every completion the device holds into `cq`, waiting for a
    /// thread that is doing it: on return, what the device held when the
    /// call began is in `cq`.
    pub(crate) fn drain_all(&self, cq: &CompletionQueue) {
        let g = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.drain_locked(cq, g);
    }

    fn drain_locked(&self, cq: &CompletionQueue, g: std::sync::MutexGuard<'_, ()>) {
        let mut wcs = [ffi::ibv_wc::default(); 16];
        loop {
            // SAFETY: `cq` is valid; `wcs` has room for 16 entries;
            // poll_cq is the ops-table call verbs.h's ibv_poll_cq makes.
            let n = unsafe {
                match (*self.dev.ctx).ops.poll_cq {
                    Some(f) => f(self.cq, wcs.len() as c_int, wcs.as_mut_ptr()),
                    None => -1,
                }
            };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                cq.push(map_wc(wc));
            }
        }
        drop(g);
        cq.run_hook();
    }
}

impl Drop for HwCq {
    fn drop(&mut self) {
        let lib = self.dev.lib;
        // SAFETY: no QP uses the CQ any more (each holds an Arc to it) and
        // the pump thread (which held one too) has exited; unacknowledged
        // events were acknowledged as they came.
        unsafe {
            (lib.verbs.ibv_destroy_cq)(self.cq);
            (lib.verbs.ibv_destroy_comp_channel)(self.chan);
        }
    }
}
