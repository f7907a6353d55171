//! The connection manager (`rdma_cm`-style): [`connect`], [`Listener`]
//! and [`ConnRequest`] for queue pairs of any device. The software
//! provider does TCP plus the MPA exchange itself ([`crate::soft::cm`]);
//! a kernel device goes through librdmacm (the rdma-core provider), so
//! clients and servers written against `iwarp::cm` run unchanged on
//! `IWARP_DEVICE=siw0`. Every call here goes through the provider seam
//! (`QpCm` of the queue pair, `DeviceCm` of the context's device, and the
//! listener's and request's objects of `device_ops.rs`); nothing here
//! knows which provider runs.
//!
//! The TCP congestion control of a connection ([`ConnParam::congestion`],
//! [`Listener::set_congestion`], [`tcp_congestion`]) is the software
//! provider's: on a kernel device the TCP connection is the kernel's, and
//! asking for an algorithm there fails with [`CmError::Unsupported`]
//! rather than being ignored (the device's connections use the system
//! default, `sysctl net.ipv4.tcp_congestion_control`).
//!
//! The device a [`Listener`] listens through is the one of the
//! [`Context`] given to [`Listener::bind_on`], or, for
//! [`Listener::bind`], the one [`Context::open`] would pick
//! (`IWARP_DEVICE`, `soft` when unset).

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::context::Context;
use crate::device::DeviceSpec;
pub use iwarp_verbs::cm_types::{
    available_congestion_control, BadCongestionName, CmError, CongestionControl, ConnParam,
    HandshakeError, MpaConfig, Policy, Rtr, TcpConnect, ALLOWED_CC_PATH, AVAILABLE_CC_PATH,
    DEFAULT_PEER_TIMEOUT, DEFAULT_PROBE_INTERVAL, MPA_WAIT_RTTS, REQUEST_GRACE, REQUEST_TIMEOUT,
    TCP_CA_NAME_MAX_LEN,
};
use iwarp_verbs::device_ops::{DeviceHandle, ListenerOps, RequestOps};
use iwarp_verbs::QueuePair;

/// Connect `qp` to `addr` (`rdma_connect`); returns the peer's private
/// data. A queue pair of the software provider does the MPA exchange over
/// TCP ([`crate::soft::cm::connect`]); one of a kernel device goes through
/// rdma_cm with `param.private_data` (at most 255 bytes there) and
/// `param.timeout` for each step, and the MPA policy is the kernel's
/// (`param.mpa` is not used), and `param.congestion` must be `None`
/// ([`CmError::Unsupported`]).
pub fn connect(qp: &QueuePair, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError> {
    qp.ops.clone().connect(addr, param)
}

/// The TCP congestion-control algorithm `qp`'s connection uses (for
/// logs): see [`crate::soft::cm::tcp_congestion`].
/// [`CmError::Unsupported`] for a queue pair of a kernel device.
pub fn tcp_congestion(qp: &QueuePair) -> Result<String, CmError> {
    qp.ops.tcp_congestion()
}

/// Change the congestion control of `qp`'s live connection: see
/// [`crate::soft::cm::set_tcp_congestion`]. [`CmError::Unsupported`] for
/// a queue pair of a kernel device.
pub fn set_tcp_congestion(qp: &QueuePair, cc: &CongestionControl) -> Result<(), CmError> {
    qp.ops.set_tcp_congestion(cc)
}

/// The round-trip time of `qp`'s TCP path: see
/// [`crate::soft::cm::path_rtt`]. [`CmError::Unsupported`] for a queue
/// pair of a kernel device (its TCP is the kernel's).
pub fn path_rtt(qp: &QueuePair) -> Result<Option<Duration>, CmError> {
    qp.ops.path_rtt()
}

/// Reads and validates the MPA Request on a TCP connection accepted
/// elsewhere: see [`crate::soft::cm::request_from_stream`]. Software
/// provider only (a kernel device's connections never surface as TCP
/// streams in user space).
pub fn request_from_stream(
    stream: std::net::TcpStream,
    mpa: &MpaConfig,
    timeout: Duration,
) -> Result<ConnRequest, CmError> {
    iwarp_soft::cm::request_from_stream(stream, mpa, timeout)
        .map(|r| ConnRequest { inner: Box::new(r) })
}

/// A listening endpoint (`rdma_listen`) on the software provider (a TCP
/// socket, MPA negotiated by this crate) or on a kernel device (an
/// rdma_cm id; the kernel negotiates MPA on iWARP devices).
pub struct Listener {
    inner: Box<dyn ListenerOps>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Listener {
    /// Listen on `addr` (IPv4 or IPv6; port 0 picks a free port) through
    /// the device [`Context::open`] picks: `IWARP_DEVICE` (`soft`, `auto`,
    /// `siw0`, ...), the software provider when it is unset. `mpa` is the
    /// policy every incoming request is negotiated against (software
    /// provider; a kernel device uses its own).
    pub fn bind(addr: SocketAddr, mpa: MpaConfig) -> Result<Listener, CmError> {
        let spec = DeviceSpec::from_env().map_err(|e| CmError::Device {
            addr,
            error: iwarp_verbs::Error::Device(e),
        })?;
        let ctx = Context::open_spec(&spec).map_err(|error| CmError::Device { addr, error })?;
        Listener::bind_on(&ctx, addr, mpa)
    }

    /// Listen on `addr` through `ctx`'s device: a TCP listener for the
    /// software provider, an rdma_cm listener for a kernel device (`addr`
    /// must then be an address of that device's network interface, or the
    /// wildcard). Accept requests onto queue pairs of the same device.
    pub fn bind_on(ctx: &Context, addr: SocketAddr, mpa: MpaConfig) -> Result<Listener, CmError> {
        ctx.device_ops()
            .listen(addr, mpa)
            .map(|inner| Listener { inner })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The MPA policy of the listener (on a kernel device: the one given
    /// at bind, which the kernel's MPA does not consult).
    pub fn mpa(&self) -> &MpaConfig {
        self.inner.mpa()
    }

    /// Set the TCP congestion control of the listening socket; connections
    /// accepted afterwards inherit it (see
    /// [`crate::soft::cm::Listener::set_congestion`]).
    /// [`CmError::Unsupported`] on a kernel device.
    pub fn set_congestion(&self, cc: &CongestionControl) -> Result<(), CmError> {
        self.inner.set_congestion(cc)
    }

    /// The congestion control of the listening socket.
    /// [`CmError::Unsupported`] on a kernel device.
    pub fn tcp_congestion(&self) -> Result<String, CmError> {
        self.inner.tcp_congestion()
    }

    /// The device the listener runs on: `soft` or a kernel device name.
    pub fn device_name(&self) -> &str {
        self.inner.device_name()
    }

    /// Wait for the next connection request (`rdma_get_request`), at most
    /// `timeout` (`None`: without limit). On the software provider see
    /// [`crate::soft::cm::Listener::get_request`]; on a kernel device this
    /// is the next `RDMA_CM_EVENT_CONNECT_REQUEST`. Running out of time is
    /// [`CmError::Timeout`] on both. `Some(Duration::ZERO)` looks once
    /// without waiting, on both: a request already waiting is returned.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnRequest, CmError> {
        self.inner
            .get_request(timeout)
            .map(|inner| ConnRequest { inner })
    }
}

impl AsRawFd for Listener {
    /// Readable when a connection request may be waiting: the listening
    /// TCP socket (software provider) or the rdma_cm event channel.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw_fd()
    }
}

/// An incoming connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`) of
/// either provider. Dropping one of a kernel device rejects it; one of
/// the software provider is closed.
pub struct ConnRequest {
    inner: Box<dyn RequestOps>,
}

impl fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl ConnRequest {
    /// The initiator's address (on a kernel device, the unspecified
    /// address if librdmacm did not report one).
    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer_addr()
    }

    /// The private data of the request.
    pub fn private_data(&self) -> &[u8] {
        self.inner.private_data()
    }

    /// MPA revision the connection will use; 0 on a kernel device, whose
    /// MPA negotiation the kernel does without reporting it.
    pub fn revision(&self) -> u8 {
        self.inner.revision()
    }

    /// CRC will be used (false on a kernel device: not reported).
    pub fn crc(&self) -> bool {
        self.inner.crc()
    }

    /// Markers will be used in at least one direction (false on a kernel
    /// device: not reported).
    pub fn markers(&self) -> bool {
        self.inner.markers()
    }

    /// Our IRD after negotiation.
    pub fn ird(&self) -> u16 {
        self.inner.ird()
    }

    /// Our ORD after negotiation.
    pub fn ord(&self) -> u16 {
        self.inner.ord()
    }

    /// The congestion control of the accepted TCP connection before
    /// [`accept`](ConnRequest::accept) applies `param.congestion`.
    /// [`CmError::Unsupported`] on a kernel device.
    pub fn tcp_congestion(&self) -> Result<String, CmError> {
        self.inner.tcp_congestion()
    }

    /// The provider the request came in on: `soft` or `rdma-core`.
    pub fn provider(&self) -> &'static str {
        self.inner.provider()
    }

    /// Accept the request onto `qp` (`rdma_accept`), which must belong to
    /// the listener's provider (and, for a kernel device, to the same
    /// device): otherwise [`CmError::OtherProvider`], and the request is
    /// refused. See [`crate::soft::cm::ConnRequest::accept`]; on a kernel
    /// device `param.private_data` (at most 255 bytes) goes with the
    /// accept and `param.timeout` bounds the wait for ESTABLISHED, and
    /// `param.congestion` must be `None` ([`CmError::Unsupported`], the
    /// request is refused). Post receives before accepting.
    pub fn accept(self, qp: &QueuePair, param: &ConnParam) -> Result<(), CmError> {
        self.inner.accept(qp, param)
    }

    /// Reject the request (`rdma_reject`) with `private_data` (at most 512
    /// bytes in MPA; 255 on a kernel device).
    pub fn reject(self, private_data: &[u8]) -> Result<(), CmError> {
        self.inner.reject(private_data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_context_listens_on_tcp() {
        let ctx = Context::open_device("soft").unwrap();
        let l =
            Listener::bind_on(&ctx, "127.0.0.1:0".parse().unwrap(), MpaConfig::default()).unwrap();
        assert_eq!(l.device_name(), "soft");
        assert_ne!(l.local_addr().port(), 0);
        assert!(l.as_raw_fd() >= 0);
        match l.get_request(Some(Duration::from_millis(20))) {
            Err(CmError::Timeout { during, .. }) => assert_eq!(during, "waiting for a connection"),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
