//! Connection management for the rdma-core provider, through librdmacm
//! (`rdma_cm`): the same shape as [`crate::cm`] (connect with private
//! data and get the peer's back; listen, take a request, accept or
//! reject), for queue pairs of a kernel device.
//!
//! Client: `rdma_create_id` → `rdma_resolve_addr` → `rdma_resolve_route` →
//! `rdma_connect` → `RDMA_CM_EVENT_ESTABLISHED`. Server: `rdma_bind_addr` →
//! `rdma_listen` → `RDMA_CM_EVENT_CONNECT_REQUEST` → (`rdma_migrate_id` to
//! a channel of its own) → `rdma_accept` → `ESTABLISHED`. The queue pair
//! was created by [`ProtectionDomain::create_qp`](crate::ProtectionDomain::create_qp)
//! before the id existed; it is attached by setting `id->qp`, which is
//! what `rdma_create_qp` does, so librdmacm moves it through RTR/RTS on
//! InfiniBand and RoCE, and the kernel's iw_cm does on iWARP.
//!
//! On InfiniBand and RoCE the private data of a connect request arrives
//! padded to the CM message's size (56 bytes for REQ); iWARP (MPA)
//! delivers it at its length.

use std::ffi::{c_int, c_void, CStr};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ffi::{self, Lib};
use super::{Device, Qp};
use crate::{Context, Error, QueuePair};

fn err(op: &'static str, why: impl ToString) -> Error {
    Error::RdmaCore {
        op,
        why: why.to_string(),
    }
}

fn sockaddr_of(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// # Safety
/// `sa` is null or points at a valid sockaddr of its family's size.
unsafe fn socketaddr_from(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null, valid (caller).
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// One rdma_cm event, copied out and acknowledged.
struct Ev {
    kind: c_int,
    status: c_int,
    id: *mut ffi::rdma_cm_id,
    private: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
}

fn event_name(lib: &Lib, kind: c_int) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    let p = unsafe { (lib.cm.rdma_event_str)(kind) };
    if p.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: non-null static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The next event of `chan`, waiting up to `timeout`.
fn next_event(
    lib: &Lib,
    chan: *mut ffi::rdma_event_channel,
    timeout: Duration,
) -> Result<Option<Ev>, Error> {
    // SAFETY: `chan` is a live channel.
    let fd = unsafe { (*chan).fd };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // SAFETY: one valid pollfd; bounded wait.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n <= 0 {
        return Ok(None);
    }
    let mut ev: *mut ffi::rdma_cm_event = std::ptr::null_mut();
    // SAFETY: the channel's fd is readable, so this does not block.
    if unsafe { (lib.cm.rdma_get_cm_event)(chan, &mut ev) } != 0 {
        return Err(err("rdma_get_cm_event", std::io::Error::last_os_error()));
    }
    // SAFETY: a successful rdma_get_cm_event gives a valid event until it
    // is acknowledged; the private data (if any) is
    // `private_data_len` bytes long.
    let out = unsafe {
        let e = &*ev;
        let private = if e.conn.private_data.is_null() || e.conn.private_data_len == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(
                e.conn.private_data.cast::<u8>(),
                usize::from(e.conn.private_data_len),
            )
            .to_vec()
        };
        Ev {
            kind: e.event,
            status: e.status,
            id: e.id,
            private,
            initiator_depth: e.conn.initiator_depth,
            responder_resources: e.conn.responder_resources,
        }
    };
    // SAFETY: acknowledged once; nothing above keeps pointers into it.
    unsafe { (lib.cm.rdma_ack_cm_event)(ev) };
    Ok(Some(out))
}

/// Wait for `want` on `chan`; any other event (or the deadline) is an error.
fn expect(
    lib: &Lib,
    chan: *mut ffi::rdma_event_channel,
    want: c_int,
    timeout: Duration,
    what: &'static str,
) -> Result<Ev, Error> {
    match next_event(lib, chan, timeout)? {
        Some(ev) if ev.kind == want && ev.status == 0 => Ok(ev),
        Some(ev) => Err(err(
            what,
            format!(
                "got {} (status {}{}) instead of {}",
                event_name(lib, ev.kind),
                ev.status,
                if ev.private.is_empty() {
                    String::new()
                } else {
                    format!(", {} bytes of private data", ev.private.len())
                },
                event_name(lib, want)
            ),
        )),
        None => Err(err(
            what,
            format!("no {} within {timeout:?}", event_name(lib, want)),
        )),
    }
}

/// A connected id and its own event channel, owned by the [`Qp`].
pub(crate) struct CmConn {
    lib: &'static Lib,
    chan: *mut ffi::rdma_event_channel,
    id: *mut ffi::rdma_cm_id,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    disconnect_sent: AtomicBool,
    ended: AtomicBool,
}

// SAFETY: librdmacm calls on an id are thread-safe; the Qp serializes the
// event reads through its mutex.
unsafe impl Send for CmConn {}

impl CmConn {
    fn new(
        lib: &'static Lib,
        chan: *mut ffi::rdma_event_channel,
        id: *mut ffi::rdma_cm_id,
    ) -> CmConn {
        // SAFETY: `id` is live; its route addresses are sockaddr_storage
        // (what rdma_get_local_addr / rdma_get_peer_addr return).
        let (local, peer) = unsafe {
            (
                socketaddr_from((&(*id).src_addr as *const libc::sockaddr_storage).cast()),
                socketaddr_from((&(*id).dst_addr as *const libc::sockaddr_storage).cast()),
            )
        };
        CmConn {
            lib,
            chan,
            id,
            local,
            peer,
            disconnect_sent: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Read events for up to `slice`; true once the connection has ended.
    pub(crate) fn poll_disconnected(&self, slice: Duration) -> bool {
        if self.ended.load(Ordering::Acquire) {
            return true;
        }
        if let Ok(Some(ev)) = next_event(self.lib, self.chan, slice) {
            if ev.kind == ffi::RDMA_CM_EVENT_DISCONNECTED
                || ev.kind == ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT
                || ev.kind == ffi::RDMA_CM_EVENT_DEVICE_REMOVAL
            {
                self.ended.store(true, Ordering::Release);
            } else {
                tracing::debug!(event = %event_name(self.lib, ev.kind), "rdma_cm event");
            }
        }
        self.ended.load(Ordering::Acquire)
    }

    /// `rdma_disconnect`, then wait up to `timeout` for DISCONNECTED.
    pub(crate) fn disconnect(&self, timeout: Duration) {
        if !self.disconnect_sent.swap(true, Ordering::AcqRel) {
            // SAFETY: live id.
            unsafe { (self.lib.cm.rdma_disconnect)(self.id) };
        }
        let deadline = Instant::now() + timeout;
        while !self.ended.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= deadline {
                tracing::debug!("no RDMA_CM_EVENT_DISCONNECTED within {timeout:?}");
                break;
            }
            self.poll_disconnected(deadline - now);
        }
    }

    /// Detach the QP and free the id and channel.
    pub(crate) fn destroy(self) {
        // SAFETY: the id is live; clearing `qp` keeps librdmacm from
        // touching the QP, which the caller destroys next (the same as
        // rdma_destroy_qp followed by rdma_destroy_id, without the QP
        // having been created by rdma_create_qp).
        unsafe {
            (*self.id).qp = std::ptr::null_mut();
            (self.lib.cm.rdma_destroy_id)(self.id);
            (self.lib.cm.rdma_destroy_event_channel)(self.chan);
        }
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

/// Owns a channel and an id until handed to a [`CmConn`].
struct Pending {
    lib: &'static Lib,
    chan: *mut ffi::rdma_event_channel,
    id: *mut ffi::rdma_cm_id,
}

impl Pending {
    fn new(lib: &'static Lib) -> Result<Pending, Error> {
        // SAFETY: plain constructor.
        let chan = unsafe { (lib.cm.rdma_create_event_channel)() };
        if chan.is_null() {
            return Err(err(
                "rdma_create_event_channel",
                std::io::Error::last_os_error(),
            ));
        }
        let mut id = std::ptr::null_mut();
        // SAFETY: `chan` is live; `id` receives the new id.
        if unsafe { (lib.cm.rdma_create_id)(chan, &mut id, std::ptr::null_mut(), ffi::RDMA_PS_TCP) }
            != 0
        {
            let e = err("rdma_create_id", std::io::Error::last_os_error());
            // SAFETY: created above, no ids on it.
            unsafe { (lib.cm.rdma_destroy_event_channel)(chan) };
            return Err(e);
        }
        Ok(Pending { lib, chan, id })
    }

    fn into_conn(self) -> CmConn {
        let c = CmConn::new(self.lib, self.chan, self.id);
        std::mem::forget(self);
        c
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // SAFETY: the id and channel are ours; no QP is attached (it is set
        // only right before connect/accept, and cleared on failure).
        unsafe {
            (*self.id).qp = std::ptr::null_mut();
            (self.lib.cm.rdma_destroy_id)(self.id);
            (self.lib.cm.rdma_destroy_event_channel)(self.chan);
        }
    }
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
    let rq = rdma_qp(qp)?;
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
    pub fn bind(ctx: &Context, addr: SocketAddr) -> Result<Listener, Error> {
        let dev = ctx.rdma_device().ok_or_else(|| {
            err(
                "rdma_listen",
                "this context is the software device: use iwarp::cm::Listener",
            )
        })?;
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

impl std::os::fd::AsRawFd for Listener {
    /// The listener's event channel: readable when a connect request (or
    /// another rdma_cm event of the listening id) is waiting.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_round_trip() {
        for a in ["10.77.0.2:7174", "[::1]:18515", "127.0.0.1:0"] {
            let addr: SocketAddr = a.parse().unwrap();
            let ss = sockaddr_of(addr);
            // SAFETY: a sockaddr_storage filled by sockaddr_of.
            let back = unsafe { socketaddr_from((&ss as *const libc::sockaddr_storage).cast()) };
            assert_eq!(back, Some(addr));
        }
        assert!(conn_param(&[0; 256], 1, 1).is_err());
        let p = conn_param(b"abc", 4, 2).unwrap();
        assert_eq!(
            (p.private_data_len, p.responder_resources, p.initiator_depth),
            (3, 4, 2)
        );
    }
}
