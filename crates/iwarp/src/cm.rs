//! The connection manager (`rdma_cm`-style): this crate's MPA connection
//! manager over TCP ([`crate::soft::cm`], re-exported here), with
//! [`connect`], [`Listener`] and [`ConnRequest`] also serving queue pairs
//! of a kernel device (the rdma-core provider, through librdmacm), so that
//! clients and servers written against `iwarp::cm` run unchanged on
//! `IWARP_DEVICE=siw0`.
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
#[cfg(feature = "rdma-core")]
use std::time::Instant;

pub use crate::soft::cm::{
    available_congestion_control, BadCongestionName, CmError, CongestionControl, ConnParam,
    HandshakeError, MpaConfig, Policy, Rtr, TcpConnect, ALLOWED_CC_PATH, AVAILABLE_CC_PATH,
    DEFAULT_PEER_TIMEOUT, DEFAULT_PROBE_INTERVAL, MPA_WAIT_RTTS, REQUEST_TIMEOUT,
    TCP_CA_NAME_MAX_LEN,
};
use crate::{Context, DeviceSpec, QueuePair};

/// Connect `qp` to `addr` (`rdma_connect`); returns the peer's private
/// data. A queue pair of the software provider does the MPA exchange over
/// TCP ([`crate::soft::cm::connect`]); one of a kernel device goes through
/// rdma_cm with `param.private_data` (at most 255 bytes there) and
/// `param.timeout` for each step, and the MPA policy is the kernel's
/// (`param.mpa` is not used), and `param.congestion` must be `None`
/// ([`CmError::Unsupported`]).
pub fn connect(qp: &QueuePair, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError> {
    #[cfg(feature = "rdma-core")]
    if crate::rdma::owns(qp) {
        no_congestion_on_device(param)?;
        return crate::rdma::cm::connect(qp, addr, &param.private_data, param.timeout)
            .map_err(|e| provider_err("rdma_cm connect", e));
    }
    crate::soft::cm::connect(qp, addr, param)
}

/// What a kernel device answers to a congestion-control request.
#[cfg(feature = "rdma-core")]
const CC_UNSUPPORTED: CmError = CmError::Unsupported {
    what: "choosing the TCP congestion control per connection",
    provider: "rdma-core",
    fix: "the device's TCP connections belong to the kernel, which uses the system default (sysctl net.ipv4.tcp_congestion_control); set that, or use the software provider (IWARP_DEVICE=soft)",
};

#[cfg(feature = "rdma-core")]
fn no_congestion_on_device(param: &ConnParam) -> Result<(), CmError> {
    match &param.congestion {
        Some(cc) => {
            tracing::warn!(congestion = %cc, "congestion control requested on a kernel device");
            Err(CC_UNSUPPORTED)
        }
        None => Ok(()),
    }
}

/// The TCP congestion-control algorithm `qp`'s connection uses (for
/// logs): see [`crate::soft::cm::tcp_congestion`].
/// [`CmError::Unsupported`] for a queue pair of a kernel device.
pub fn tcp_congestion(qp: &QueuePair) -> Result<String, CmError> {
    #[cfg(feature = "rdma-core")]
    if crate::rdma::owns(qp) {
        return Err(CC_UNSUPPORTED);
    }
    crate::soft::cm::tcp_congestion(qp)
}

/// Change the congestion control of `qp`'s live connection: see
/// [`crate::soft::cm::set_tcp_congestion`]. [`CmError::Unsupported`] for
/// a queue pair of a kernel device.
pub fn set_tcp_congestion(qp: &QueuePair, cc: &CongestionControl) -> Result<(), CmError> {
    #[cfg(feature = "rdma-core")]
    if crate::rdma::owns(qp) {
        let _ = cc;
        return Err(CC_UNSUPPORTED);
    }
    crate::soft::cm::set_tcp_congestion(qp, cc)
}

/// The round-trip time of `qp`'s TCP path: see
/// [`crate::soft::cm::path_rtt`]. [`CmError::Unsupported`] for a queue
/// pair of a kernel device (its TCP is the kernel's).
pub fn path_rtt(qp: &QueuePair) -> Result<Option<Duration>, CmError> {
    #[cfg(feature = "rdma-core")]
    if crate::rdma::owns(qp) {
        return Err(CmError::Unsupported {
            what: "reading the TCP path's round-trip time",
            provider: "rdma-core",
            fix: "the device's TCP connections belong to the kernel; size buffers by hand there",
        });
    }
    crate::soft::cm::path_rtt(qp)
}

#[cfg(feature = "rdma-core")]
fn provider_err(during: &'static str, e: impl ToString) -> CmError {
    CmError::Io {
        during,
        source: std::io::Error::other(e.to_string()),
    }
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
    crate::soft::cm::request_from_stream(stream, mpa, timeout).map(|r| ConnRequest {
        inner: ReqInner::Soft(r),
    })
}

enum ListenerInner {
    Soft(crate::soft::cm::Listener),
    #[cfg(feature = "rdma-core")]
    Kernel {
        l: crate::rdma::cm::Listener,
        local: SocketAddr,
        mpa: MpaConfig,
    },
}

/// A listening endpoint (`rdma_listen`) on the software provider (a TCP
/// socket, MPA negotiated by this crate) or on a kernel device (an
/// rdma_cm id; the kernel negotiates MPA on iWARP devices).
pub struct Listener {
    inner: ListenerInner,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            ListenerInner::Soft(l) => l.fmt(f),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { l, local, .. } => f
                .debug_struct("Listener")
                .field("device", &l.device_name())
                .field("local", local)
                .finish(),
        }
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
            error: crate::Error::Device(e),
        })?;
        if spec == DeviceSpec::Soft {
            return crate::soft::cm::Listener::bind(addr, mpa).map(|l| Listener {
                inner: ListenerInner::Soft(l),
            });
        }
        let ctx = Context::open_spec(&spec).map_err(|error| CmError::Device { addr, error })?;
        Listener::bind_on(&ctx, addr, mpa)
    }

    /// Listen on `addr` through `ctx`'s device: a TCP listener for the
    /// software provider, an rdma_cm listener for a kernel device (`addr`
    /// must then be an address of that device's network interface, or the
    /// wildcard). Accept requests onto queue pairs of the same device.
    pub fn bind_on(ctx: &Context, addr: SocketAddr, mpa: MpaConfig) -> Result<Listener, CmError> {
        #[cfg(feature = "rdma-core")]
        if ctx.rdma_device().is_some() {
            let l = crate::rdma::cm::Listener::bind(ctx, addr).map_err(|e| CmError::Bind {
                addr,
                source: std::io::Error::other(e.to_string()),
            })?;
            let local = l.local_addr().unwrap_or(addr);
            tracing::debug!(%local, device = l.device_name(), "listening through rdma_cm");
            return Ok(Listener {
                inner: ListenerInner::Kernel { l, local, mpa },
            });
        }
        let _ = ctx;
        crate::soft::cm::Listener::bind(addr, mpa).map(|l| Listener {
            inner: ListenerInner::Soft(l),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        match &self.inner {
            ListenerInner::Soft(l) => l.local_addr(),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { local, .. } => *local,
        }
    }

    /// The MPA policy of the listener (on a kernel device: the one given
    /// at bind, which the kernel's MPA does not consult).
    pub fn mpa(&self) -> &MpaConfig {
        match &self.inner {
            ListenerInner::Soft(l) => l.mpa(),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { mpa, .. } => mpa,
        }
    }

    /// Set the TCP congestion control of the listening socket; connections
    /// accepted afterwards inherit it (see
    /// [`crate::soft::cm::Listener::set_congestion`]).
    /// [`CmError::Unsupported`] on a kernel device.
    pub fn set_congestion(&self, cc: &CongestionControl) -> Result<(), CmError> {
        match &self.inner {
            ListenerInner::Soft(l) => l.set_congestion(cc),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { .. } => {
                let _ = cc;
                Err(CC_UNSUPPORTED)
            }
        }
    }

    /// The congestion control of the listening socket.
    /// [`CmError::Unsupported`] on a kernel device.
    pub fn tcp_congestion(&self) -> Result<String, CmError> {
        match &self.inner {
            ListenerInner::Soft(l) => l.tcp_congestion(),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { .. } => Err(CC_UNSUPPORTED),
        }
    }

    /// The device the listener runs on: `soft` or a kernel device name.
    pub fn device_name(&self) -> &str {
        match &self.inner {
            ListenerInner::Soft(_) => "soft",
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { l, .. } => l.device_name(),
        }
    }

    /// Wait for the next connection request (`rdma_get_request`), at most
    /// `timeout` (`None`: without limit). On the software provider see
    /// [`crate::soft::cm::Listener::get_request`]; on a kernel device this
    /// is the next `RDMA_CM_EVENT_CONNECT_REQUEST`. Running out of time is
    /// [`CmError::Timeout`] on both.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnRequest, CmError> {
        match &self.inner {
            ListenerInner::Soft(l) => l.get_request(timeout).map(|r| ConnRequest {
                inner: ReqInner::Soft(r),
            }),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { l, local, .. } => {
                let start = Instant::now();
                loop {
                    let slice = match timeout {
                        Some(t) => t.saturating_sub(start.elapsed()),
                        None => Duration::from_secs(1),
                    };
                    match l.get_request(slice) {
                        Ok(Some(r)) => {
                            return Ok(ConnRequest {
                                inner: ReqInner::Kernel(r),
                            })
                        }
                        Ok(None) if timeout.is_some_and(|t| start.elapsed() >= t) => {
                            return Err(CmError::Timeout {
                                addr: *local,
                                during: "waiting for a connection",
                                after: start.elapsed(),
                            })
                        }
                        Ok(None) => {}
                        Err(e) => return Err(provider_err("waiting for a connection", e)),
                    }
                }
            }
        }
    }
}

impl AsRawFd for Listener {
    /// Readable when a connection request may be waiting: the listening
    /// TCP socket (software provider) or the rdma_cm event channel.
    fn as_raw_fd(&self) -> RawFd {
        match &self.inner {
            ListenerInner::Soft(l) => l.as_raw_fd(),
            #[cfg(feature = "rdma-core")]
            ListenerInner::Kernel { l, .. } => l.as_raw_fd(),
        }
    }
}

enum ReqInner {
    Soft(crate::soft::cm::ConnRequest),
    #[cfg(feature = "rdma-core")]
    Kernel(crate::rdma::cm::ConnRequest),
}

/// An incoming connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`) of
/// either provider. Dropping one of a kernel device rejects it; one of
/// the software provider is closed.
pub struct ConnRequest {
    inner: ReqInner,
}

impl fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            ReqInner::Soft(r) => r.fmt(f),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => r.fmt(f),
        }
    }
}

impl ConnRequest {
    /// The initiator's address (on a kernel device, the unspecified
    /// address if librdmacm did not report one).
    pub fn peer_addr(&self) -> SocketAddr {
        match &self.inner {
            ReqInner::Soft(r) => r.peer_addr(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => r
                .peer_addr()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
        }
    }

    /// The private data of the request.
    pub fn private_data(&self) -> &[u8] {
        match &self.inner {
            ReqInner::Soft(r) => r.private_data(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => r.private_data(),
        }
    }

    /// MPA revision the connection will use; 0 on a kernel device, whose
    /// MPA negotiation the kernel does without reporting it.
    pub fn revision(&self) -> u8 {
        match &self.inner {
            ReqInner::Soft(r) => r.revision(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(_) => 0,
        }
    }

    /// CRC will be used (false on a kernel device: not reported).
    pub fn crc(&self) -> bool {
        match &self.inner {
            ReqInner::Soft(r) => r.crc(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(_) => false,
        }
    }

    /// Markers will be used in at least one direction (false on a kernel
    /// device: not reported).
    pub fn markers(&self) -> bool {
        match &self.inner {
            ReqInner::Soft(r) => r.markers(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(_) => false,
        }
    }

    /// Our IRD after negotiation.
    pub fn ird(&self) -> u16 {
        match &self.inner {
            ReqInner::Soft(r) => r.ird(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => u16::from(r.ird_ord().0),
        }
    }

    /// Our ORD after negotiation.
    pub fn ord(&self) -> u16 {
        match &self.inner {
            ReqInner::Soft(r) => r.ord(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => u16::from(r.ird_ord().1),
        }
    }

    /// The congestion control of the accepted TCP connection before
    /// [`accept`](ConnRequest::accept) applies `param.congestion`.
    /// [`CmError::Unsupported`] on a kernel device.
    pub fn tcp_congestion(&self) -> Result<String, CmError> {
        match &self.inner {
            ReqInner::Soft(r) => r.tcp_congestion(),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(_) => Err(CC_UNSUPPORTED),
        }
    }

    /// The provider the request came in on: `soft` or `rdma-core`.
    pub fn provider(&self) -> &'static str {
        match &self.inner {
            ReqInner::Soft(_) => "soft",
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(_) => "rdma-core",
        }
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
        match self.inner {
            ReqInner::Soft(r) => r.accept(qp, param),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => {
                if !crate::rdma::owns(qp) {
                    // Dropping `r` rejects the request.
                    return Err(CmError::OtherProvider);
                }
                no_congestion_on_device(param)?;
                r.accept(qp, &param.private_data, param.timeout)
                    .map_err(|e| provider_err("rdma_cm accept", e))
            }
        }
    }

    /// Reject the request (`rdma_reject`) with `private_data` (at most 512
    /// bytes in MPA; 255 on a kernel device).
    pub fn reject(self, private_data: &[u8]) -> Result<(), CmError> {
        match self.inner {
            ReqInner::Soft(r) => r.reject(private_data),
            #[cfg(feature = "rdma-core")]
            ReqInner::Kernel(r) => r
                .reject(private_data)
                .map_err(|e| provider_err("rdma_cm reject", e)),
        }
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
