//! A connection of the rdma-core provider: an rdma_cm id with its own
//! event channel ([`CmConn`], owned by the queue pair once connected, or
//! [`Pending`] while the connection manager sets it up), the reading of
//! its rdma_cm events, and the socket addresses librdmacm takes and gives.
//!
//! The connection manager (`cm.rs`) makes connections; the queue pair
//! (`qp.rs`) owns one and reads its events for a disconnect. This module
//! uses neither, so both build on it.

use std::ffi::{c_int, CStr};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::ffi::{self, Lib};
use iwarp_verbs::Error;

/// An rdma_cm call `op` failed because of `why`.
pub(super) fn err(op: &'static str, why: impl ToString) -> Error {
    Error::RdmaCore {
        op,
        why: why.to_string(),
    }
}

/// `addr` as the sockaddr librdmacm takes.
pub(super) fn sockaddr_of(addr: SocketAddr) -> libc::sockaddr_storage {
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
pub(super) unsafe fn socketaddr_from(sa: *const libc::sockaddr) -> Option<SocketAddr> {
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
pub(super) struct Ev {
    pub(super) kind: c_int,
    pub(super) status: c_int,
    pub(super) id: *mut ffi::rdma_cm_id,
    pub(super) private: Vec<u8>,
    pub(super) initiator_depth: u8,
    pub(super) responder_resources: u8,
}

/// The name librdmacm gives an event kind (`rdma_event_str`).
pub(super) fn event_name(lib: &Lib, kind: c_int) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    let p = unsafe { (lib.cm.rdma_event_str)(kind) };
    if p.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: non-null static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The next event of `chan`, waiting up to `timeout`.
pub(super) fn next_event(
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
pub(super) fn expect(
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

/// A connected id and its own event channel, owned by the queue pair
/// (`Qp`, in `qp.rs`).
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

/// Owns a channel and an id until handed to a [`CmConn`].
pub(super) struct Pending {
    pub(super) lib: &'static Lib,
    pub(super) chan: *mut ffi::rdma_event_channel,
    pub(super) id: *mut ffi::rdma_cm_id,
}

impl Pending {
    pub(super) fn new(lib: &'static Lib) -> Result<Pending, Error> {
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

    pub(super) fn into_conn(self) -> CmConn {
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
    }
}
