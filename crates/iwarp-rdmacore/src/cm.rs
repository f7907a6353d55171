//! Connection management for the rdma-core provider, through librdmacm
//! (`rdma_cm`): the same shape as [`crate::cm`] (connect with private
//! data and get the peer's back; listen, take a request, accept or
//! reject), for queue pairs of a kernel device.
//!
//! Client: `rdma_create_id` → `rdma_resolve_addr` → `rdma_resolve_route` →
//! `rdma_connect` → `RDMA_CM_EVENT_ESTABLISHED`. Server: `rdma_bind_addr` →
//! `rdma_listen` → `RDMA_CM_EVENT_CONNECT_REQUEST` → (`rdma_migrate_id` to
//! a channel of its own) → `rdma_accept` → `ESTABLISHED`. The queue pair
//! was created by `iwarp::ProtectionDomain::create_qp`
//! before the id existed; it is attached by setting `id->qp`, which is
//! what `rdma_create_qp` does, so librdmacm moves it through RTR/RTS on
//! InfiniBand and RoCE, and the kernel's iw_cm does on iWARP.
//!
//! On InfiniBand and RoCE the private data of a connect request arrives
//! padded to the CM message's size (56 bytes for REQ); iWARP (MPA)
//! delivers it at its length.
//!
//! A connection, once made, is the queue pair's: the id and its event
//! channel (`conn.rs`), which the QP reads for a disconnect.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conn::{err, event_name, expect, next_event, sockaddr_of, socketaddr_from, Pending};
use crate::device::Device;
use crate::ffi::{self, Lib};
use crate::qp::Qp;
use iwarp_verbs::cm_types::{CmError, CongestionControl, ConnParam, MpaConfig};
use iwarp_verbs::device_ops::DeviceHandle;
use iwarp_verbs::device_ops::{DeviceCm, ListenerOps, RequestOps};
use iwarp_verbs::provider::QpCm;
use iwarp_verbs::Error;
use iwarp_verbs::QueuePair;

/// What a kernel device answers to a congestion-control request.
const CC_UNSUPPORTED: CmError = CmError::Unsupported {
    what: "choosing the TCP congestion control per connection",
    provider: "rdma-core",
    fix: "the device's TCP connections belong to the kernel, which uses the system default (sysctl net.ipv4.tcp_congestion_control); set that, or use the software provider (IWARP_DEVICE=soft)",
};

fn no_congestion_on_device(param: &ConnParam) -> Result<(), CmError> {
    match &param.congestion {
        Some(cc) => {
            tracing::warn!(congestion = %cc, "congestion control requested on a kernel device");
            Err(CC_UNSUPPORTED)
        }
        None => Ok(()),
    }
}

fn provider_err(during: &'static str, e: impl ToString) -> CmError {
    CmError::Io {
        during,
        source: std::io::Error::other(e.to_string()),
    }
}

fn rdma_qp(qp: &QueuePair) -> Result<Arc<Qp>, Error> {
    qp.ops.clone().into_any().downcast::<Qp>().map_err(|_| {
        err(
            "rdma_cm",
            "this queue pair belongs to the software provider: connect it with iwarp::cm",
        )
    })
}

fn depths(dev: &Device) -> (u8, u8) {
    let ird = dev.attr.max_qp_rd_atom.clamp(1, 16) as u8;
    let ord = dev.attr.max_qp_init_rd_atom.clamp(1, 16) as u8;
    (ird, ord)
}

fn conn_param(
    private: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
) -> Result<ffi::rdma_conn_param, Error> {
    let len = u8::try_from(private.len())
        .map_err(|_| err("rdma_cm", "private data longer than 255 bytes"))?;
    Ok(ffi::rdma_conn_param {
        private_data: if private.is_empty() {
            std::ptr::null()
        } else {
            private.as_ptr().cast::<c_void>()
        },
        private_data_len: len,
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    })
}

/// Connect `qp` (of a kernel device) to `addr` with `private_data`
/// (`rdma_connect`); returns the peer's private data. Every step waits at
/// most `timeout`.
pub fn connect(
    qp: &QueuePair,
    addr: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    connect_qp(&rdma_qp(qp)?, addr, private_data, timeout)
}

fn connect_qp(
    rq: &Arc<Qp>,
    addr: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let dev = rq.pd.dev.clone();
    let lib = dev.lib;
    let p = Pending::new(lib)?;
    let mut dst = sockaddr_of(addr);
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // SAFETY: live id; `dst` is a valid sockaddr for the call.
    if unsafe {
        (lib.cm.rdma_resolve_addr)(
            p.id,
            std::ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            ms,
        )
    } != 0
    {
        return Err(err("rdma_resolve_addr", std::io::Error::last_os_error()));
    }
    expect(
        lib,
        p.chan,
        ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
        timeout,
        "rdma_resolve_addr",
    )?;
    // SAFETY: after ADDR_RESOLVED, `verbs` is the device the route uses.
    let verbs = unsafe { (*p.id).verbs };
    if verbs != dev.ctx {
        let other = if verbs.is_null() {
            String::from("none")
        } else {
            // SAFETY: non-null `verbs` is one of librdmacm's open contexts.
            ffi::cstr_field(unsafe { &(*(*verbs).device).name })
        };
        return Err(err(
            "rdma_resolve_addr",
            format!(
                "{addr} is reached through device {other}, not {}: open that device",
                dev.attr.name
            ),
        ));
    }
    // SAFETY: live id.
    if unsafe { (lib.cm.rdma_resolve_route)(p.id, ms) } != 0 {
        return Err(err("rdma_resolve_route", std::io::Error::last_os_error()));
    }
    expect(
        lib,
        p.chan,
        ffi::RDMA_CM_EVENT_ROUTE_RESOLVED,
        timeout,
        "rdma_resolve_route",
    )?;
    let (ird, ord) = depths(&dev);
    let mut param = conn_param(private_data, ird, ord)?;
    // SAFETY: attach our QP (of this id's context) as rdma_create_qp would.
    unsafe { (*p.id).qp = rq.qp };
    // SAFETY: live id, QP attached, `param` valid for the call.
    if unsafe { (lib.cm.rdma_connect)(p.id, &mut param) } != 0 {
        return Err(err("rdma_connect", std::io::Error::last_os_error()));
    }
    let ev = expect(
        lib,
        p.chan,
        ffi::RDMA_CM_EVENT_ESTABLISHED,
        timeout,
        "rdma_connect",
    )?;
    *rq.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(p.into_conn());
    rq.established();
    Ok(ev.private)
}

/// A listening rdma_cm id (`rdma_listen`).
pub struct Listener {
    p: Pending,
    dev: Arc<Device>,
    local: Option<SocketAddr>,
    /// Serializes event reads: a second reader could block in
    /// rdma_get_cm_event after the first took the event it polled for.
    reading: std::sync::Mutex<()>,
}

// SAFETY: the id and channel are plain handles; librdmacm calls are
// thread-safe and `reading` lets one thread at a time take events.
unsafe impl Send for Listener {}
// SAFETY: as above: `&self` methods read immutable fields or take events
// under `reading`.
unsafe impl Sync for Listener {}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("rdma_cm::Listener")
            .field("device", &self.dev.attr.name)
            .finish()
    }
}

impl Listener {
    /// Listen on `addr` (an address of `ctx`'s device, or the wildcard).
    pub fn bind(ctx: &impl DeviceHandle, addr: SocketAddr) -> Result<Listener, Error> {
        let dev = ctx
            .device_ops()
            .clone()
            .into_any()
            .downcast::<Device>()
            .map_err(|_| {
                err(
                    "rdma_listen",
                    "this context is the software device: use iwarp::cm::Listener",
                )
            })?;
        Listener::bind_dev(&dev, addr)
    }

    fn bind_dev(dev: &Arc<Device>, addr: SocketAddr) -> Result<Listener, Error> {
        let p = Pending::new(dev.lib)?;
        let mut sa = sockaddr_of(addr);
        // SAFETY: live id, valid sockaddr.
        if unsafe {
            (dev.lib.cm.rdma_bind_addr)(p.id, (&mut sa as *mut libc::sockaddr_storage).cast())
        } != 0
        {
            return Err(err(
                "rdma_bind_addr",
                format!("{addr}: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: bound id.
        if unsafe { (dev.lib.cm.rdma_listen)(p.id, 16) } != 0 {
            return Err(err("rdma_listen", std::io::Error::last_os_error()));
        }
        // SAFETY: bound id; librdmacm filled its source address (with the
        // port the kernel picked for port 0) in rdma_bind_addr.
        let local =
            unsafe { socketaddr_from((&(*p.id).src_addr as *const libc::sockaddr_storage).cast()) };
        Ok(Listener {
            p,
            dev: dev.clone(),
            local,
            reading: std::sync::Mutex::new(()),
        })
    }

    /// The address the listener is bound to (the port the kernel picked
    /// when bound to port 0), if librdmacm reports one.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The device the listener was bound through.
    pub fn device_name(&self) -> &str {
        &self.dev.attr.name
    }

    /// The next connect request, waiting up to `timeout`. Other events on
    /// the listening id are logged and skipped.
    pub fn get_request(&self, timeout: Duration) -> Result<Option<ConnRequest>, Error> {
        let deadline = Instant::now() + timeout;
        let _one_reader = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(ev) = next_event(self.dev.lib, self.p.chan, left)? else {
                return Ok(None);
            };
            if ev.kind == ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
                // SAFETY: the request's id is live (ours until accepted or
                // rejected); its destination is the client's address.
                let peer = unsafe {
                    socketaddr_from((&(*ev.id).dst_addr as *const libc::sockaddr_storage).cast())
                };
                return Ok(Some(ConnRequest {
                    peer,
                    lib: self.dev.lib,
                    dev: self.dev.clone(),
                    id: ev.id,
                    private: ev.private,
                    initiator_depth: ev.initiator_depth,
                    responder_resources: ev.responder_resources,
                    done: false,
                }));
            }
            tracing::debug!(event = %event_name(self.dev.lib, ev.kind), "listener event ignored");
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }
}

impl AsRawFd for Listener {
    /// The listener's event channel: readable when a connect request (or
    /// another rdma_cm event of the listening id) is waiting.
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as the listener.
        unsafe { (*self.p.chan).fd }
    }
}

/// A connect request (`RDMA_CM_EVENT_CONNECT_REQUEST`); dropping it
/// rejects it.
pub struct ConnRequest {
    peer: Option<SocketAddr>,
    lib: &'static Lib,
    dev: Arc<Device>,
    id: *mut ffi::rdma_cm_id,
    private: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
    done: bool,
}

// SAFETY: the request id is used by one owner (accept and reject take
// `self`); librdmacm calls are thread-safe.
unsafe impl Send for ConnRequest {}
// SAFETY: `&self` methods only read fields copied out of the event.
unsafe impl Sync for ConnRequest {}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("rdma_cm::ConnRequest")
            .field("private_data", &self.private)
            .finish()
    }
}

impl ConnRequest {
    /// The client's private data.
    pub fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// The client's address, if librdmacm reports one.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The (IRD, ORD) an accept will give the connection: the device's
    /// limits (at most 16), lowered to serve no more Reads than the client
    /// may issue and issue no more than it serves (RFC 5040 §6.5).
    pub fn ird_ord(&self) -> (u8, u8) {
        let (ird, ord) = depths(&self.dev);
        (
            ird.min(self.initiator_depth.max(1)),
            ord.min(self.responder_resources.max(1)),
        )
    }

    /// Accept on `qp` with `private_data` (`rdma_accept`), waiting up to
    /// `timeout` for ESTABLISHED.
    pub fn accept(
        mut self,
        qp: &QueuePair,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(), Error> {
        self.done = true;
        let rq = rdma_qp(qp)?;
        let lib = self.lib;
        // SAFETY: plain constructor.
        let chan = unsafe { (lib.cm.rdma_create_event_channel)() };
        if chan.is_null() {
            return Err(err(
                "rdma_create_event_channel",
                std::io::Error::last_os_error(),
            ));
        }
        let p = Pending {
            lib,
            chan,
            id: self.id,
        };
        // SAFETY: live id of a connect request; moved to its own channel
        // so its events do not mix with the listener's.
        if unsafe { (lib.cm.rdma_migrate_id)(p.id, p.chan) } != 0 {
            return Err(err("rdma_migrate_id", std::io::Error::last_os_error()));
        }
        // SAFETY: the request's id is bound to its device.
        if unsafe { (*p.id).verbs } != rq.pd.dev.ctx {
            return Err(err(
                "rdma_accept",
                format!(
                    "the request came in on another device than {}",
                    rq.pd.dev.attr.name
                ),
            ));
        }
        // Serve as many Reads as the client may issue and issue no more
        // than it can serve (RFC 5040 §6.5 IRD/ORD).
        let (ird, ord) = self.ird_ord();
        let mut param = conn_param(private_data, ird, ord)?;
        // SAFETY: attach our QP, as in connect.
        unsafe { (*p.id).qp = rq.qp };
        // SAFETY: live id, QP attached, valid param.
        if unsafe { (lib.cm.rdma_accept)(p.id, &mut param) } != 0 {
            return Err(err("rdma_accept", std::io::Error::last_os_error()));
        }
        expect(
            lib,
            p.chan,
            ffi::RDMA_CM_EVENT_ESTABLISHED,
            timeout,
            "rdma_accept",
        )?;
        *rq.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(p.into_conn());
        rq.established();
        Ok(())
    }

    /// Reject with `private_data` (`rdma_reject`).
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), Error> {
        self.done = true;
        let len = u8::try_from(private_data.len())
            .map_err(|_| err("rdma_reject", "private data longer than 255 bytes"))?;
        // SAFETY: live request id; the data is valid for the call.
        let rc = unsafe { (self.lib.cm.rdma_reject)(self.id, private_data.as_ptr().cast(), len) };
        // SAFETY: the id is ours and done with.
        unsafe { (self.lib.cm.rdma_destroy_id)(self.id) };
        if rc != 0 {
            return Err(err("rdma_reject", std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: live request id, rejected and freed once.
            unsafe {
                (self.lib.cm.rdma_reject)(self.id, std::ptr::null(), 0);
                (self.lib.cm.rdma_destroy_id)(self.id);
            }
        }
    }
}

/// The connection-manager verbs of a kernel device's queue pair (the
/// seam's `QpCm`). The TCP connection of an iWARP device is the kernel's:
/// its congestion control and round-trip time are not ours to set or read.
impl QpCm for Qp {
    fn connect(self: Arc<Self>, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError> {
        no_congestion_on_device(param)?;
        connect_qp(&self, addr, &param.private_data, param.timeout)
            .map_err(|e| provider_err("rdma_cm connect", e))
    }

    fn tcp_congestion(&self) -> Result<String, CmError> {
        Err(CC_UNSUPPORTED)
    }

    fn set_tcp_congestion(&self, _cc: &CongestionControl) -> Result<(), CmError> {
        Err(CC_UNSUPPORTED)
    }

    fn path_rtt(&self) -> Result<Option<Duration>, CmError> {
        Err(CmError::Unsupported {
            what: "reading the TCP path's round-trip time",
            provider: "rdma-core",
            fix: "the device's TCP connections belong to the kernel; size buffers by hand there",
        })
    }
}

/// Listening on a kernel device: an rdma_cm listener (`addr` must be an
/// address of the device's network interface, or the wildcard); the
/// kernel negotiates MPA on iWARP devices, so `mpa` is only kept.
impl DeviceCm for Device {
    fn listen(&self, addr: SocketAddr, mpa: MpaConfig) -> Result<Box<dyn ListenerOps>, CmError> {
        let l = Listener::bind_dev(&self.arc(), addr).map_err(|e| CmError::Bind {
            addr,
            source: std::io::Error::other(e.to_string()),
        })?;
        let local = l.local_addr().unwrap_or(addr);
        tracing::debug!(%local, device = l.device_name(), "listening through rdma_cm");
        Ok(Box::new(KernelListener { l, local, mpa }))
    }
}

/// A [`Listener`] as the verbs layer's `cm::Listener` holds it.
#[derive(Debug)]
struct KernelListener {
    l: Listener,
    local: SocketAddr,
    mpa: MpaConfig,
}

impl ListenerOps for KernelListener {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }
    fn mpa(&self) -> &MpaConfig {
        &self.mpa
    }
    fn set_congestion(&self, _cc: &CongestionControl) -> Result<(), CmError> {
        Err(CC_UNSUPPORTED)
    }
    fn tcp_congestion(&self) -> Result<String, CmError> {
        Err(CC_UNSUPPORTED)
    }
    fn device_name(&self) -> &str {
        self.l.device_name()
    }
    fn get_request(&self, timeout: Option<Duration>) -> Result<Box<dyn RequestOps>, CmError> {
        let start = Instant::now();
        loop {
            let slice = match timeout {
                Some(t) => t.saturating_sub(start.elapsed()),
                None => Duration::from_secs(1),
            };
            match self.l.get_request(slice) {
                Ok(Some(r)) => return Ok(Box::new(r)),
                Ok(None) if timeout.is_some_and(|t| start.elapsed() >= t) => {
                    return Err(CmError::Timeout {
                        addr: self.local,
                        during: "waiting for a connection",
                        after: start.elapsed(),
                    })
                }
                Ok(None) => {}
                Err(e) => return Err(provider_err("waiting for a connection", e)),
            }
        }
    }
    fn raw_fd(&self) -> RawFd {
        self.l.as_raw_fd()
    }
}

impl RequestOps for ConnRequest {
    /// The unspecified address if librdmacm did not report one.
    fn peer_addr(&self) -> SocketAddr {
        ConnRequest::peer_addr(self).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }
    fn private_data(&self) -> &[u8] {
        ConnRequest::private_data(self)
    }
    /// The kernel negotiates MPA without reporting it: 0.
    fn revision(&self) -> u8 {
        0
    }
    /// Not reported by the kernel: false.
    fn crc(&self) -> bool {
        false
    }
    /// Not reported by the kernel: false.
    fn markers(&self) -> bool {
        false
    }
    fn ird(&self) -> u16 {
        u16::from(self.ird_ord().0)
    }
    fn ord(&self) -> u16 {
        u16::from(self.ird_ord().1)
    }
    fn tcp_congestion(&self) -> Result<String, CmError> {
        Err(CC_UNSUPPORTED)
    }
    fn provider(&self) -> &'static str {
        "rdma-core"
    }
    fn accept(self: Box<Self>, qp: &QueuePair, param: &ConnParam) -> Result<(), CmError> {
        if rdma_qp(qp).is_err() {
            // Dropping the request rejects it.
            return Err(CmError::OtherProvider);
        }
        no_congestion_on_device(param)?;
        ConnRequest::accept(*self, qp, &param.private_data, param.timeout)
            .map_err(|e| provider_err("rdma_cm accept", e))
    }
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), CmError> {
        ConnRequest::reject(*self, private_data).map_err(|e| provider_err("rdma_cm reject", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_param_limits_private_data() {
        assert!(conn_param(&[0; 256], 1, 1).is_err());
        let p = conn_param(b"abc", 4, 2).unwrap();
        assert_eq!(
            (p.private_data_len, p.responder_resources, p.initiator_depth),
            (3, 4, 2)
        );
    }
}
