//! The rdma-core provider: the verbs API over a kernel RDMA device
//! (siw, rxe, an RNIC) through libibverbs and librdmacm (cargo feature
//! `rdma-core`; the libraries are loaded at run time, see `ffi.rs`).
//!
//! What maps to what:
//!
//! - [`Context`](crate::Context): one `ibv_context` of librdmacm's device
//!   list (`rdma_get_devices`), so that queue pairs created on it can be
//!   connected by rdma_cm (which refuses a QP of another context).
//! - [`ProtectionDomain`](crate::ProtectionDomain): an `ibv_pd`, allocated
//!   on first use (`alloc_pd` cannot fail in this API).
//! - [`MemoryRegion`](crate::MemoryRegion): the crate's buffer, also
//!   registered with `ibv_reg_mr`; `lkey`/`rkey` are the device's.
//! - [`CompletionQueue`]: an `ibv_cq` with a
//!   completion channel, drained into the CQ's queue by a pump thread
//!   (so `poll`, `wait`, and the eventfd behave as with the software
//!   provider) and by [`CompletionQueue::progress`].
//! - [`QueuePair`](crate::QueuePair): an RC `ibv_qp`, moved to INIT at
//!   creation (so receives can be posted before connecting, as with the
//!   software provider); connected by [`cm`] (rdma_cm), which moves it on.
//!
//! Work requests, completions and statuses map one to one where the
//! verbs types have a variant ([`map_status`]); `ibv_wc_status` values with
//! no counterpart in [`WcStatus`] (InfiniBand's retry and RNR errors, EEC
//! errors) become [`WcStatus::GeneralErr`] and are logged with their name.
//!
//! `unsafe` is confined to this module and `ffi.rs`; each use says why it
//! holds. libibverbs objects are thread-safe (verbs may be called from any
//! thread), which is what the `Send`/`Sync` impls rely on.

pub mod cm;
pub(crate) mod ffi;

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use iwarp_proto::engine::{
    PostError, QpState, RecvWr, SendWr, WcOpcode, WcQueue, WcStatus, WorkCompletion, WrOpcode,
};
use iwarp_proto::mem::Access;

use crate::cq::{CompletionQueue, WeakCq};
use crate::device_info::{no_device_reason, DeviceError, DeviceInfo, Transport};
use crate::provider::{ConnInfo, CqSource, QpEvent, QpOps, QpStats};
use crate::Error;
use ffi::Lib;

/// What the device granted a queue pair at creation (`ibv_qp_init_attr.cap`
/// as `ibv_create_qp` wrote it back): the depths and SGE counts (the
/// requested ones capped at [`DeviceAttr`]'s limits, possibly rounded up)
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
pub fn qp_caps(qp: &crate::QueuePair) -> Option<QpCaps> {
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

/// Whether `qp` was made by this provider.
pub(crate) fn owns(qp: &crate::QueuePair) -> bool {
    qp.ops.clone().into_any().downcast::<Qp>().is_ok()
}

/// The kernel devices librdmacm knows (name and transport).
pub(crate) fn list() -> Result<Vec<DeviceInfo>, String> {
    let lib = ffi::lib().map_err(str::to_string)?;
    let mut n: c_int = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a
    // NULL-terminated array (or NULL with errno set), freed below.
    let list = unsafe { (lib.verbs.ibv_get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!(
            "ibv_get_device_list failed ({}): {}",
            std::io::Error::last_os_error(),
            no_device_reason()
        ));
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `i < n`, the entries are valid device pointers until
        // ibv_free_device_list.
        let dev = unsafe { &**list.add(i) };
        out.push(DeviceInfo {
            name: ffi::cstr_field(&dev.name),
            transport: transport_of(dev.transport_type, None),
            provider: "rdma-core",
        });
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { (lib.verbs.ibv_free_device_list)(list) };
    Ok(out)
}

fn transport_of(transport_type: c_int, link_layer: Option<u8>) -> Transport {
    match (transport_type, link_layer) {
        (ffi::IBV_TRANSPORT_IWARP, _) => Transport::Iwarp,
        (ffi::IBV_TRANSPORT_IB, Some(ffi::IBV_LINK_LAYER_ETHERNET)) => Transport::Roce,
        (ffi::IBV_TRANSPORT_IB, _) => Transport::InfiniBand,
        (t, _) => Transport::Other(t),
    }
}

/// What the device says it can do (`ibv_query_device` and port 1 of
/// `ibv_query_port`): the numbers that differ between transports and
/// devices and that this provider uses instead of assuming them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// The kernel device name.
    pub name: String,
    /// iWARP, InfiniBand or RoCE (from the transport type and the link
    /// layer of port 1).
    pub transport: Transport,
    /// Firmware version string.
    pub fw_ver: String,
    /// Largest queue depth.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list of a send or receive.
    pub max_sge: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// RDMA Reads a QP can serve at once (IRD).
    pub max_qp_rd_atom: u32,
    /// RDMA Reads a QP can have outstanding (ORD).
    pub max_qp_init_rd_atom: u32,
    /// Port 1's active MTU in bytes (IB/RoCE; iWARP reports the netdev's).
    pub active_mtu: u32,
    /// Port 1 is ACTIVE.
    pub port_active: bool,
    /// The transport has Write with Immediate and RNR retry (IB, RoCE);
    /// iWARP has neither.
    pub has_write_imm_and_rnr: bool,
}

/// An open kernel device.
pub(crate) struct Device {
    pub(crate) lib: &'static Lib,
    pub(crate) ctx: *mut ffi::ibv_context,
    pub(crate) attr: DeviceAttr,
}

// SAFETY: `ctx` is owned by librdmacm for the life of the process (never
// closed) and libibverbs verbs are thread-safe.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("attr", &self.attr).finish()
    }
}

fn mtu_bytes(ibv_mtu: c_int) -> u32 {
    match ibv_mtu {
        1..=5 => 128 << ibv_mtu,
        _ => 0,
    }
}

impl Device {
    /// Open `name` among librdmacm's devices.
    pub(crate) fn open(name: &str) -> Result<Arc<Device>, DeviceError> {
        let lib = ffi::lib().map_err(|why| DeviceError::NoRdma {
            name: name.to_string(),
            why: why.to_string(),
        })?;
        let mut n: c_int = 0;
        // SAFETY: rdma_get_devices returns librdmacm's NULL-terminated
        // array of open contexts; the contexts stay open (librdmacm owns
        // them) after the array is freed.
        let list = unsafe { (lib.cm.rdma_get_devices)(&mut n) };
        if list.is_null() {
            return Err(DeviceError::NoRdma {
                name: name.to_string(),
                why: no_device_reason(),
            });
        }
        let mut found = None;
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: `i < n`; each entry is an open context whose
            // `device` points at its ibv_device.
            let ctx = unsafe { *list.add(i) };
            // SAFETY: as above.
            let dname = ffi::cstr_field(unsafe { &(*(*ctx).device).name });
            if dname == name {
                found = Some(ctx);
            }
            names.push(dname);
        }
        // SAFETY: the array came from rdma_get_devices; freed once.
        unsafe { (lib.cm.rdma_free_devices)(list) };
        let ctx = match found {
            Some(c) => c,
            None if names.is_empty() => {
                return Err(DeviceError::NoRdma {
                    name: name.to_string(),
                    why: no_device_reason(),
                })
            }
            None => {
                return Err(DeviceError::NoSuchDevice {
                    name: name.to_string(),
                    available: names,
                })
            }
        };
        let attr = query(lib, ctx, name).map_err(|why| DeviceError::Open {
            name: name.to_string(),
            why,
        })?;
        tracing::info!(?attr, "opened rdma-core device");
        Ok(Arc::new(Device { lib, ctx, attr }))
    }
}

fn query(lib: &Lib, ctx: *mut ffi::ibv_context, name: &str) -> Result<DeviceAttr, String> {
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut da: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is open; `da` is a writable ibv_device_attr.
    let rc = unsafe { (lib.verbs.ibv_query_device)(ctx, &mut da) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_device: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    // SAFETY: as above.
    let mut pa: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is open; `pa` has room for the whole struct and more.
    let rc = unsafe { (lib.verbs.ibv_query_port)(ctx, 1, &mut pa) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_port(1): {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    // SAFETY: `ctx` is open, its device pointer is valid.
    let tt = unsafe { (*(*ctx).device).transport_type };
    let transport = transport_of(tt, Some(pa.link_layer));
    Ok(DeviceAttr {
        name: name.to_string(),
        transport,
        fw_ver: ffi::cstr_field(&da.fw_ver),
        max_qp_wr: da.max_qp_wr.max(0) as u32,
        max_sge: da.max_sge.max(0) as u32,
        max_cqe: da.max_cqe.max(0) as u32,
        max_mr_size: da.max_mr_size,
        max_qp_rd_atom: da.max_qp_rd_atom.max(0) as u32,
        max_qp_init_rd_atom: da.max_qp_init_rd_atom.max(0) as u32,
        active_mtu: mtu_bytes(pa.active_mtu),
        port_active: pa.state == 4,
        has_write_imm_and_rnr: !transport.is_iwarp(),
    })
}

fn os_err(op: &'static str) -> Error {
    Error::RdmaCore {
        op,
        why: std::io::Error::last_os_error().to_string(),
    }
}

/// An `ibv_reg_mr` failure; for ENOMEM, which is what a device's check of
/// the locked-memory limit gives (siw counts registered pages against
/// RLIMIT_MEMLOCK even for root), the limit and the fix.
fn reg_mr_err(len: usize, e: std::io::Error) -> Error {
    let mut why = e.to_string();
    if e.raw_os_error() == Some(libc::ENOMEM) {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit.
        let known = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0;
        why.push_str(&memlock_hint(len, known.then_some(lim.rlim_cur)));
    }
    Error::RdmaCore {
        op: "ibv_reg_mr",
        why,
    }
}

/// The fix for an ENOMEM of `ibv_reg_mr` of `len` bytes under the
/// locked-memory limit `limit` (None: unknown; `RLIM_INFINITY`: none).
fn memlock_hint(len: usize, limit: Option<libc::rlim_t>) -> String {
    match limit {
        Some(l) if l != libc::RLIM_INFINITY => format!(
            " registering {len} bytes; the locked-memory limit (RLIMIT_MEMLOCK) is {l} bytes, \
             and the kernel device pins registered memory against it: raise it (`ulimit -l \
             unlimited`, systemd LimitMEMLOCK=, /etc/security/limits.conf memlock) or register \
             less"
        ),
        _ => format!(
            " registering {len} bytes: the host is short of memory it can pin; register less"
        ),
    }
}

/// An `ibv_pd`.
pub(crate) struct Pd {
    pub(crate) dev: Arc<Device>,
    pub(crate) pd: *mut ffi::ibv_pd,
}

// SAFETY: see `Device`.
unsafe impl Send for Pd {}
// SAFETY: see `Device`.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn alloc(dev: &Arc<Device>) -> Result<Arc<Pd>, Error> {
        // SAFETY: the context is open.
        let pd = unsafe { (dev.lib.verbs.ibv_alloc_pd)(dev.ctx) };
        if pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd {
            dev: dev.clone(),
            pd,
        }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; every MR and QP holds an Arc
        // to this Pd, so none is left.
        unsafe { (self.dev.lib.verbs.ibv_dealloc_pd)(self.pd) };
    }
}

/// The `ibv_mr` of a [`MemoryRegion`](crate::MemoryRegion).
pub(crate) struct HwMr {
    pd: Arc<Pd>,
    mr: *mut ffi::ibv_mr,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

// SAFETY: see `Device`.
unsafe impl Send for HwMr {}
// SAFETY: see `Device`.
unsafe impl Sync for HwMr {}

impl fmt::Debug for HwMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HwMr(lkey {:#x}, rkey {:#x})", self.lkey, self.rkey)
    }
}

/// `ibv_access_flags` of an [`Access`]. iWARP devices require
/// `REMOTE_WRITE` on the sink of an RDMA Read (the Read Response is a
/// tagged write into it); the caller's flags are passed as given.
pub(crate) fn access_flags(a: Access) -> c_int {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= ffi::IBV_ACCESS_LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= ffi::IBV_ACCESS_REMOTE_WRITE;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= ffi::IBV_ACCESS_REMOTE_READ;
    }
    f
}

impl HwMr {
    /// Register `ptr..ptr + len`, which the caller keeps valid until the
    /// returned value is dropped (the [`MemoryRegion`](crate::MemoryRegion)
    /// owns both).
    pub(crate) fn register(
        pd: &Arc<Pd>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<HwMr, Error> {
        // SAFETY: `pd` is allocated; the memory is valid for `len` bytes
        // while this registration lives (the caller's contract above).
        let mr =
            unsafe { (pd.dev.lib.verbs.ibv_reg_mr)(pd.pd, ptr.cast(), len, access_flags(access)) };
        if mr.is_null() {
            return Err(reg_mr_err(len, std::io::Error::last_os_error()));
        }
        // SAFETY: a non-null result of ibv_reg_mr is a valid ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(HwMr {
            pd: pd.clone(),
            mr,
            lkey,
            rkey,
        })
    }
}

impl Drop for HwMr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once, before the
        // memory is freed (the MemoryRegion drops this first).
        unsafe { (self.pd.dev.lib.verbs.ibv_dereg_mr)(self.mr) };
    }
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
    qps: Mutex<Vec<std::sync::Weak<Qp>>>,
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
        let qps: Vec<Arc<Qp>> = {
            let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for qp in qps {
            qp.check_disconnect();
        }
    }

    /// Have the pump watch `qp`'s connection (see [`Self::watch_disconnects`]).
    fn watch(&self, qp: &Arc<Qp>) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(qp));
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

/// The completion opcode of a flushed send-queue request: its own, as siw
/// reports it (`siw_sq_flush_wr` keeps the request's opcode).
fn flushed_opcode(op: &WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::Send | WrOpcode::SendWithInv { .. } => WcOpcode::Send,
        WrOpcode::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
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

/// `ibv_wc_status` → [`WcStatus`] (one to one where a variant exists).
pub fn map_status(status: i32) -> WcStatus {
    match status {
        ffi::IBV_WC_SUCCESS => WcStatus::Success,
        ffi::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        ffi::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        ffi::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        ffi::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        ffi::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        ffi::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        ffi::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        ffi::IBV_WC_GENERAL_ERR => WcStatus::GeneralErr,
        _ => WcStatus::GeneralErr,
    }
}

/// The `ibv_wc_status` names, for logs (`ibv_wc_status_str`).
pub fn status_name(status: i32) -> &'static str {
    const NAMES: [&str; 22] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("unknown")
}

fn map_wc(wc: &ffi::ibv_wc) -> WorkCompletion {
    let status = map_status(wc.status);
    if status == WcStatus::GeneralErr && wc.status != ffi::IBV_WC_GENERAL_ERR {
        tracing::warn!(
            status = wc.status,
            name = status_name(wc.status),
            vendor_err = wc.vendor_err,
            "completion status with no WcStatus variant, reported as GeneralErr"
        );
    }
    // On an error completion only wr_id, status, qp_num and vendor_err are
    // valid (verbs.h); ibverbs marks the queue through the opcode of a
    // successful one. Flushed receives report IBV_WC_RECV on siw and rxe.
    let (opcode, queue) = match wc.opcode {
        ffi::IBV_WC_SEND => (WcOpcode::Send, WcQueue::Send),
        ffi::IBV_WC_RDMA_WRITE => (WcOpcode::RdmaWrite, WcQueue::Send),
        ffi::IBV_WC_RDMA_READ => (WcOpcode::RdmaRead, WcQueue::Send),
        ffi::IBV_WC_RECV | ffi::IBV_WC_RECV_RDMA_WITH_IMM => (WcOpcode::Recv, WcQueue::Recv),
        _ => (WcOpcode::Send, WcQueue::Send),
    };
    WorkCompletion {
        wr_id: wc.wr_id,
        status,
        opcode,
        queue,
        byte_len: wc.byte_len,
        invalidated_rkey: (status == WcStatus::Success && wc.wc_flags & ffi::IBV_WC_WITH_INV != 0)
            .then_some(wc.invalidated_rkey),
        solicited: false,
    }
}

/// The `ibv_send_wr` opcode, flags, and remote fields of a [`SendWr`].
pub fn send_wr_fields(wr: &SendWr) -> (c_int, u32, u32, u64, u32) {
    let mut flags = 0;
    if wr.signaled {
        flags |= ffi::IBV_SEND_SIGNALED;
    }
    let (op, inv, addr, rkey) = match wr.opcode {
        WrOpcode::Send => (ffi::IBV_WR_SEND, 0, 0, 0),
        WrOpcode::SendWithInv { invalidate_rkey } => {
            (ffi::IBV_WR_SEND_WITH_INV, invalidate_rkey, 0, 0)
        }
        WrOpcode::RdmaWrite { remote_addr, rkey } => (ffi::IBV_WR_RDMA_WRITE, 0, remote_addr, rkey),
        WrOpcode::RdmaRead { remote_addr, rkey } => (ffi::IBV_WR_RDMA_READ, 0, remote_addr, rkey),
    };
    if wr.solicited && matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithInv { .. }) {
        flags |= ffi::IBV_SEND_SOLICITED;
    }
    (op, flags, inv, addr, rkey)
}

/// A work request structure of verbs' singly linked lists.
trait Chained: Sized {
    fn set_next(&mut self, next: *mut Self);
}

impl Chained for ffi::ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Chained for ffi::ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Links `chain` (non-empty) into the list verbs takes, hands its head and
/// the bad-request out pointer to `post` (the provider's post call), and
/// maps a failure to the `wr_id` (`id(index)`) of the request it names.
fn post_chain<T: Chained>(
    chain: &mut [T],
    id: impl Fn(usize) -> u64,
    post: impl FnOnce(*mut T, *mut *mut T) -> c_int,
) -> Result<(), PostError> {
    let n = chain.len();
    let base = chain.as_mut_ptr();
    for i in 1..n {
        // SAFETY: `i` and `i - 1` are in bounds of `chain`, which is not
        // moved again before `post` returns.
        unsafe { (*base.add(i - 1)).set_next(base.add(i)) };
    }
    let mut bad: *mut T = std::ptr::null_mut();
    let rc = post(base, &mut bad);
    if rc == 0 {
        return Ok(());
    }
    let idx = if bad.is_null() {
        0
    } else {
        // SAFETY: `bad` points into `chain` (verbs.h contract).
        unsafe { bad.offset_from(base) }.max(0) as usize
    };
    Err(map_post_errno(rc, id(idx.min(n - 1))))
}

/// `ibv_post_*` error numbers → [`PostError`]. (A QP in the error state
/// never reaches the device: `Qp::post_flushed`.)
pub fn map_post_errno(errno: i32, wr_id: u64) -> PostError {
    match errno {
        libc::ENOMEM => PostError::QueueFull { wr_id },
        libc::EINVAL => PostError::InvalidWr {
            wr_id,
            why: "refused by the device (opcode, SGE count or length beyond its limits)",
        },
        _ => PostError::QpError { wr_id },
    }
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
    pub(crate) conn: Mutex<Option<cm::CmConn>>,
    events: Mutex<VecDeque<QpEvent>>,
    events_cond: Condvar,
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
            events: Mutex::new(VecDeque::new()),
            events_cond: Condvar::new(),
            disconnected: AtomicBool::new(false),
        });
        let weak: std::sync::Weak<dyn CqSource> = Arc::downgrade(&q) as _;
        send.0.attach(weak.clone());
        recv.0.attach(weak);
        q.send_cq.watch(&q);
        tracing::debug!(qpn, device = %dev.attr.name, cap = ?(init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge, init.cap.max_inline_data), "rdma-core QP created");
        Ok(q)
    }

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

    pub(crate) fn established(&self) {
        self.state.store(ST_RTS, Ordering::Release);
        self.push_event(QpEvent::Established);
    }

    pub(crate) fn push_event(&self, ev: QpEvent) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(ev);
        self.events_cond.notify_all();
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

fn sges(
    sgl: &iwarp_proto::engine::SgList,
) -> ([ffi::ibv_sge; iwarp_proto::engine::MAX_SGE], usize) {
    let mut out = [ffi::ibv_sge::default(); iwarp_proto::engine::MAX_SGE];
    let s = sgl.as_slice();
    for (o, i) in out.iter_mut().zip(s) {
        *o = ffi::ibv_sge {
            addr: i.addr,
            length: i.length,
            lkey: i.lkey,
        };
    }
    (out, s.len())
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
            if let Some(ev) = self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            {
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
                        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
                        let _ = self.events_cond.wait_timeout(q, slice);
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

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_proto::engine::{SgList, Sge};

    #[test]
    fn reg_mr_enomem_names_the_memlock_limit_and_the_fix() {
        let e = reg_mr_err(33_554_432, std::io::Error::from_raw_os_error(libc::ENOMEM)).to_string();
        assert!(e.contains("ibv_reg_mr"), "{e}");
        assert!(e.contains("33554432 bytes"), "{e}");
        let h = memlock_hint(1 << 25, Some(8 << 20));
        assert!(
            h.contains("8388608 bytes") && h.contains("ulimit -l"),
            "{h}"
        );
        let h = memlock_hint(1 << 25, Some(libc::RLIM_INFINITY));
        assert!(!h.contains("ulimit") && h.contains("register less"), "{h}");
        // Other errors are passed through as they are.
        let e = reg_mr_err(4096, std::io::Error::from_raw_os_error(libc::EINVAL)).to_string();
        assert!(!e.contains("RLIMIT_MEMLOCK"), "{e}");
    }

    #[test]
    fn statuses_map_one_to_one_where_a_variant_exists() {
        let pairs = [
            (ffi::IBV_WC_SUCCESS, WcStatus::Success),
            (ffi::IBV_WC_LOC_LEN_ERR, WcStatus::LocLenErr),
            (ffi::IBV_WC_LOC_QP_OP_ERR, WcStatus::LocQpOpErr),
            (ffi::IBV_WC_LOC_PROT_ERR, WcStatus::LocProtErr),
            (ffi::IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlushErr),
            (ffi::IBV_WC_REM_ACCESS_ERR, WcStatus::RemAccessErr),
            (ffi::IBV_WC_REM_OP_ERR, WcStatus::RemOpErr),
            (ffi::IBV_WC_REM_INV_REQ_ERR, WcStatus::RemInvReqErr),
            (ffi::IBV_WC_GENERAL_ERR, WcStatus::GeneralErr),
        ];
        for (ibv, ours) in pairs {
            assert_eq!(map_status(ibv), ours, "{}", status_name(ibv));
        }
        for other in [
            ffi::IBV_WC_LOC_EEC_OP_ERR,
            ffi::IBV_WC_MW_BIND_ERR,
            ffi::IBV_WC_BAD_RESP_ERR,
            ffi::IBV_WC_LOC_ACCESS_ERR,
            ffi::IBV_WC_RETRY_EXC_ERR,
            ffi::IBV_WC_RNR_RETRY_EXC_ERR,
            ffi::IBV_WC_LOC_RDD_VIOL_ERR,
            ffi::IBV_WC_REM_INV_RD_REQ_ERR,
            ffi::IBV_WC_REM_ABORT_ERR,
            ffi::IBV_WC_INV_EECN_ERR,
            ffi::IBV_WC_INV_EEC_STATE_ERR,
            ffi::IBV_WC_FATAL_ERR,
            ffi::IBV_WC_RESP_TIMEOUT_ERR,
            99,
        ] {
            assert_eq!(map_status(other), WcStatus::GeneralErr);
        }
        assert_eq!(
            status_name(ffi::IBV_WC_RNR_RETRY_EXC_ERR),
            "RNR retry counter exceeded"
        );
        assert_eq!(status_name(-1), "unknown");
    }

    #[test]
    fn completions_map_opcode_queue_and_invalidate() {
        let mut wc = ffi::ibv_wc {
            wr_id: 7,
            opcode: ffi::IBV_WC_RECV,
            byte_len: 13,
            wc_flags: ffi::IBV_WC_WITH_INV,
            invalidated_rkey: 0x1234,
            ..Default::default()
        };
        let w = map_wc(&wc);
        assert_eq!(
            (w.wr_id, w.opcode, w.queue, w.byte_len),
            (7, WcOpcode::Recv, WcQueue::Recv, 13)
        );
        assert_eq!(w.invalidated_rkey, Some(0x1234));
        wc.opcode = ffi::IBV_WC_RDMA_READ;
        wc.wc_flags = 0;
        let w = map_wc(&wc);
        assert_eq!(
            (w.opcode, w.queue, w.invalidated_rkey),
            (WcOpcode::RdmaRead, WcQueue::Send, None)
        );
        wc.status = ffi::IBV_WC_WR_FLUSH_ERR;
        assert_eq!(map_wc(&wc).status, WcStatus::WrFlushErr);
    }

    #[test]
    fn work_requests_map_to_ibv_fields() {
        let sgl = SgList::single(Sge {
            addr: 0x1000,
            length: 8,
            lkey: 5,
        });
        let mut wr = SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaRead {
                remote_addr: 0x2000,
                rkey: 9,
            },
            sgl,
            signaled: true,
            solicited: true,
        };
        assert_eq!(
            send_wr_fields(&wr),
            (ffi::IBV_WR_RDMA_READ, ffi::IBV_SEND_SIGNALED, 0, 0x2000, 9)
        );
        wr.opcode = WrOpcode::SendWithInv {
            invalidate_rkey: 0x77,
        };
        assert_eq!(
            send_wr_fields(&wr),
            (
                ffi::IBV_WR_SEND_WITH_INV,
                ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_SOLICITED,
                0x77,
                0,
                0
            )
        );
        wr.opcode = WrOpcode::RdmaWrite {
            remote_addr: 1,
            rkey: 2,
        };
        wr.signaled = false;
        assert_eq!(send_wr_fields(&wr), (ffi::IBV_WR_RDMA_WRITE, 0, 0, 1, 2));
        let (s, n) = sges(&sgl);
        assert_eq!((n, s[0].addr, s[0].length, s[0].lkey), (1, 0x1000, 8, 5));
        assert_eq!(
            map_post_errno(libc::ENOMEM, 3),
            PostError::QueueFull { wr_id: 3 }
        );
        assert!(matches!(
            map_post_errno(libc::EINVAL, 3),
            PostError::InvalidWr { wr_id: 3, .. }
        ));
        assert_eq!(
            map_post_errno(libc::EIO, 3),
            PostError::QpError { wr_id: 3 }
        );
        assert_eq!(
            access_flags(Access::LOCAL_WRITE | Access::REMOTE_READ),
            ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_READ
        );
        assert_eq!(
            transport_of(ffi::IBV_TRANSPORT_IWARP, None),
            Transport::Iwarp
        );
        assert_eq!(
            transport_of(ffi::IBV_TRANSPORT_IB, Some(ffi::IBV_LINK_LAYER_ETHERNET)),
            Transport::Roce
        );
        assert_eq!(
            transport_of(ffi::IBV_TRANSPORT_IB, Some(ffi::IBV_LINK_LAYER_INFINIBAND)),
            Transport::InfiniBand
        );
        assert_eq!(mtu_bytes(3), 1024);
    }
}
