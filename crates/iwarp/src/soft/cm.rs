//! Connection management in the style of librdmacm (`rdma_connect`,
//! `rdma_listen` / `rdma_get_request`, `rdma_accept`, `rdma_reject`).
//!
//! Implements the connection setup of RFC 5044 §7 (MPA Request / Reply over
//! a fresh TCP connection) with the RFC 6581 enhancements (MPA revision 2:
//! IRD/ORD exchange and the peer-to-peer ready-to-receive message). The
//! frames themselves are built and checked by [`iwarp_proto::handshake`];
//! this module does the blocking socket I/O around them, bounded by
//! timeouts, and then hands the socket to the QP's driver.
//!
//! - **Active side**: [`connect`] opens the TCP connection, sends the MPA
//!   Request with the private data, reads the Reply (exactly the Reply's
//!   bytes, so no FPDU is swallowed), establishes the QP and starts its
//!   driver. With RTR negotiated it then posts the zero-length RDMA Write,
//!   Read or Send that RFC 6581 §3 requires as the first FPDU.
//! - **Passive side**: [`Listener::get_request`] accepts a TCP connection
//!   and reads and validates its MPA Request. A malformed request (bad key,
//!   private data longer than 512 bytes, ...) or one the listener's policy
//!   cannot satisfy is answered by closing the connection (with a Reject
//!   frame where the request was well-formed) and returned as an error.
//!   [`ConnRequest::accept`] sends the Reply and starts the QP;
//!   [`ConnRequest::reject`] sends a Reject with private data.
//!
//! As in siw, the responder goes to RTS as soon as its Reply is sent; the
//! initiator's RTR message arrives as an ordinary zero-length operation.
//!
//! **Congestion control per connection.** [`ConnParam::congestion`] picks
//! the TCP congestion-control algorithm of the connection's socket
//! (`TCP_CONGESTION`, tcp(7)): set before `connect` on the active side,
//! on the accepted socket before the MPA Reply on the passive side, and
//! [`Listener::set_congestion`] sets it on the listening socket, whose
//! accepted connections inherit it. [`tcp_congestion`] reads back what a
//! connection uses. `None` keeps the kernel's default
//! (`net.ipv4.tcp_congestion_control`).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::time::{Duration, Instant};

use iwarp_proto::engine::{LinkParams, QpState, SendWr, SgList, WrOpcode};
use iwarp_proto::handshake::{self, Negotiated, Request};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

pub use iwarp_proto::handshake::{HandshakeError, MpaConfig, Policy, Rtr};

pub use super::link::{
    available_congestion_control, ALLOWED_CC_PATH, AVAILABLE_CC_PATH, TCP_CA_NAME_MAX_LEN,
};

use super::{Conn, SoftQp, RTR_WR_ID};
use crate::provider::{ConnInfo, QpEvent};
use crate::qp::QueuePair;
use std::sync::Arc;

/// Length of the fixed part of an MPA Request/Reply (RFC 5044 §7.1: 16-byte
/// key, flags, revision, 2-byte private-data length).
const MPA_HDR_LEN: usize = 20;

/// How long [`Listener::get_request`] waits for the MPA Request on an
/// accepted connection when it was called without a timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Parameters of a connect or accept (`struct rdma_conn_param`).
#[derive(Debug, Clone)]
pub struct ConnParam {
    /// Private data carried by the MPA Request or Reply (at most 512 bytes,
    /// RFC 5044 §7.1).
    pub private_data: Vec<u8>,
    /// MPA policy (CRC, markers, revision, IRD/ORD, RTR). On the passive
    /// side the listener's configuration governs negotiation; see
    /// [`ConnRequest::accept`].
    pub mpa: MpaConfig,
    /// Bound on the operation: the TCP connect plus the MPA exchange
    /// ([`TcpConnect::WithinTimeout`], the default), or the MPA exchange
    /// alone, counted from the TCP handshake's completion
    /// ([`TcpConnect::Kernel`]). The MPA exchange always gets at least
    /// [`MPA_WAIT_RTTS`] times the handshake's round-trip time, so a
    /// long path is not mistaken for a peer that does not speak MPA.
    pub timeout: Duration,
    /// What bounds the TCP handshake of a connect (active side only).
    pub tcp_connect: TcpConnect,
    /// How long a peer may stay silent while it owes an answer before the
    /// connection is declared dead, and every outstanding work request
    /// completes with `WrFlushErr` (`Duration::ZERO`: never). It bounds
    /// two things: data of ours the peer does not acknowledge
    /// (`TCP_USER_TIMEOUT`, so also a peer whose window stays shut), and
    /// RDMA Read Responses that do not come while everything we sent was
    /// acknowledged (a peer, or a relay, that takes our bytes and answers
    /// nothing). An idle connection with nothing owed is not affected;
    /// TCP keepalive (45 s) finds a vanished host there.
    pub peer_timeout: Duration,
    /// How long the peer may send nothing at all before we ask it for a
    /// sign of life (`Duration::ZERO`: never): a zero-length RDMA Read,
    /// which a live peer answers at once without its application (the
    /// RFC 6581 ready-to-receive message is the same request). A peer that
    /// does not answer within `peer_timeout` is given up, so an idle
    /// connection through a path that stopped forwarding is noticed within
    /// `probe_interval + peer_timeout` (TCP keepalive never notices it:
    /// the relay's kernel answers those). Needs `peer_timeout`; not sent
    /// to a peer that accepts no inbound Reads (IRD 0).
    pub probe_interval: Duration,
    /// Early in the connection, nudge a peer that has been silent since our
    /// last bytes with a zero-length RDMA Write (at most 6 times, within 2
    /// s, from 20 ms of silence on, doubling). Linux siw can miss bytes
    /// that arrive while it finishes connection setup and then waits for
    /// more; without the nudge a client whose first message expects an
    /// answer (rping) hangs against it. Harmless to siw and to this stack
    /// (RFC 6581's write-form ready-to-receive message); turn it off for a
    /// peer that refuses zero-length Writes at RTS.
    pub wake_nudge: bool,
    /// On the passive side: send no FPDU until the initiator's first FPDU
    /// has arrived, as RFC 5044 §7.1.2's connection startup rules require
    /// of the Responder (outside peer-to-peer mode, whose RTR message is
    /// that first FPDU). Linux siw's initiator enforces the rule: an FPDU
    /// that follows the MPA Reply before siw has read it makes the Reply
    /// read fail (`siw_recv_mpa_rr`: -EPROTO) and the connection is reset.
    /// Off by default because applications whose server speaks first
    /// (iwarp-demo's advertisement, rdma-xfer's session setup) would wait
    /// forever against an initiator that waits too; protocols whose
    /// initiator always sends first (rsockets) turn it on. Ignored on the
    /// active side.
    pub hold_until_first_fpdu: bool,
    /// The TCP congestion-control algorithm of this connection
    /// (`TCP_CONGESTION`, tcp(7)); `None` keeps the kernel's default
    /// (`net.ipv4.tcp_congestion_control`). The active side sets it
    /// before `connect`; the passive side on the accepted socket before
    /// the MPA Reply leaves (overriding what it inherited from
    /// [`Listener::set_congestion`]). An algorithm the kernel lacks fails
    /// the connect or accept with [`CmError::Congestion`]. Software
    /// provider only: a kernel device's TCP is the kernel's and cannot be
    /// given one ([`CmError::Unsupported`]).
    pub congestion: Option<CongestionControl>,
}

/// What bounds the TCP handshake of [`connect`].
///
/// A peer that never completes the handshake and a peer that completes it
/// and then does not speak MPA are different failures: the first is the
/// path or the host (a lost SYN, a host still starting), the second is a
/// plain TCP server. A caller that falls back to plain TCP for the second
/// (the preload library) must not do it for the first; [`CmError::no_tcp`]
/// tells them apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TcpConnect {
    /// The handshake counts against [`ConnParam::timeout`], as the MPA
    /// exchange does.
    #[default]
    WithinTimeout,
    /// The kernel's own SYN retransmissions and limit
    /// (`net.ipv4.tcp_syn_retries`, about two minutes by default), as a
    /// blocking `connect(2)` would have them (a first SYN lost costs its
    /// 1 s retransmission, not the connection); [`ConnParam::timeout`]
    /// then bounds the MPA exchange alone.
    Kernel,
}

/// The MPA exchange of a connect waits at least this many round-trip
/// times of the TCP handshake (`TCP_INFO`'s `tcpi_rtt` once it is
/// established): the Request and the Reply take one, and a peer's accept
/// may wait for its application.
pub const MPA_WAIT_RTTS: u32 = 8;

/// A TCP congestion-control algorithm's name, checked to fit the kernel's
/// `TCP_CA_NAME_MAX` (at most [`TCP_CA_NAME_MAX_LEN`] = 15 bytes, since
/// setsockopt(2) would silently cut a longer one) and to be a plain
/// module-style name (ASCII letters, digits, `_`, `-`, `.`). Whether the
/// kernel has it is known only when it is set ([`CmError::Congestion`]);
/// [`available_congestion_control`] lists what this kernel offers (here:
/// reno, cubic and bbr).
///
/// ```
/// use iwarp::cm::CongestionControl;
/// let cc: CongestionControl = "bbr".parse().unwrap();
/// assert_eq!(cc.as_str(), "bbr");
/// assert!("a-name-longer-than-15".parse::<CongestionControl>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CongestionControl(String);

impl CongestionControl {
    /// Check `name` (see the type's documentation).
    pub fn new(name: &str) -> Result<CongestionControl, BadCongestionName> {
        let why = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > TCP_CA_NAME_MAX_LEN {
            Some("it is longer than 15 bytes (TCP_CA_NAME_MAX - 1), and the kernel would cut it")
        } else if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            Some("only ASCII letters, digits, '_', '-' and '.' make an algorithm name")
        } else {
            None
        };
        match why {
            Some(why) => Err(BadCongestionName {
                name: name.to_owned(),
                why,
            }),
            None => Ok(CongestionControl(name.to_owned())),
        }
    }

    /// The algorithm's name, as given to `TCP_CONGESTION`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for CongestionControl {
    type Err = BadCongestionName;
    fn from_str(s: &str) -> Result<CongestionControl, BadCongestionName> {
        CongestionControl::new(s)
    }
}

impl fmt::Display for CongestionControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A string that cannot be a congestion-control name
/// ([`CongestionControl::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCongestionName {
    /// What was given.
    pub name: String,
    /// Why it is refused.
    pub why: &'static str,
}

impl fmt::Display for BadCongestionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a TCP congestion-control name: {}; pick one of {} ({})",
            self.name,
            self.why,
            offered(),
            AVAILABLE_CC_PATH
        )
    }
}

impl std::error::Error for BadCongestionName {}

/// This kernel's algorithms for a message, or a hint where `/proc` is
/// not readable.
fn offered() -> String {
    let a = available_congestion_control();
    if a.is_empty() {
        "the kernel's algorithms".into()
    } else {
        a.join(", ")
    }
}

/// The default [`ConnParam::probe_interval`]: off. The probe is a
/// zero-length RDMA Read with STag 0, which siw accepts (it is RFC 6581's
/// ready-to-receive message), but not every RNIC does outside connection
/// setup (Chelsio T4/T5 fail it), and a peer that refuses it ends the
/// connection with a Terminate. Turn it on (10 s is a sensible value) for
/// peers known to answer it.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::ZERO;

/// The default [`ConnParam::peer_timeout`].
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for ConnParam {
    fn default() -> ConnParam {
        ConnParam {
            private_data: Vec::new(),
            mpa: MpaConfig::default(),
            timeout: Duration::from_secs(5),
            tcp_connect: TcpConnect::WithinTimeout,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            wake_nudge: true,
            hold_until_first_fpdu: false,
            congestion: None,
        }
    }
}

impl ConnParam {
    fn liveness(&self) -> super::Liveness {
        super::Liveness {
            peer_timeout: self.peer_timeout,
            probe_interval: self.probe_interval,
            wake_nudge: self.wake_nudge,
            fpdu_per_segment: false,
        }
    }
}

/// Connection-manager errors. `Display` names the cause and the fix.
#[derive(Debug)]
#[non_exhaustive]
pub enum CmError {
    /// Nobody listens at the address (TCP RST).
    Refused { addr: SocketAddr },
    /// The TCP connection could not be opened.
    Connect { addr: SocketAddr, source: io::Error },
    /// The operation did not finish in time.
    Timeout {
        addr: SocketAddr,
        during: &'static str,
        after: Duration,
    },
    /// The peer sent an MPA Reject (with its private data).
    Rejected {
        addr: SocketAddr,
        private_data: Vec<u8>,
    },
    /// The MPA exchange failed (malformed frame, policy conflict, ...).
    Mpa {
        addr: SocketAddr,
        error: HandshakeError,
    },
    /// The peer closed the TCP connection during the MPA exchange.
    Closed {
        addr: SocketAddr,
        during: &'static str,
    },
    /// A socket call failed.
    Io {
        during: &'static str,
        source: io::Error,
    },
    /// The QP is not in a state that allows connecting it.
    InvalidState { state: QpState, connected: bool },
    /// Binding the listening socket failed.
    Bind { addr: SocketAddr, source: io::Error },
    /// Starting the driver threads failed.
    Driver(io::Error),
    /// The queue pair belongs to another provider.
    OtherProvider,
    /// The device to listen through could not be chosen or opened
    /// (`IWARP_DEVICE` names a device that is not there, ...).
    Device {
        addr: SocketAddr,
        error: crate::Error,
    },
    /// Setting the TCP congestion-control algorithm (`TCP_CONGESTION`)
    /// failed: `ENOENT`, the kernel does not have it; `EPERM`, it is not
    /// in the list unprivileged processes may pick.
    Congestion { name: String, source: io::Error },
    /// The queue pair's provider cannot do what was asked (a kernel
    /// device's TCP connection is the kernel's: its congestion control
    /// cannot be chosen per connection from user space).
    Unsupported {
        what: &'static str,
        provider: &'static str,
        fix: &'static str,
    },
    /// The queue pair has no connection (never connected, or still
    /// connecting).
    NotConnected,
}

impl CmError {
    /// Whether the TCP connection itself was never established (refused,
    /// unreachable, or its handshake timed out), as opposed to a peer
    /// that completed TCP and then failed, refused or ignored MPA. Only
    /// the second says the peer is not an iWARP endpoint.
    pub fn no_tcp(&self) -> bool {
        match self {
            CmError::Refused { .. } | CmError::Connect { .. } => true,
            CmError::Timeout { during, .. } => *during == DURING_TCP,
            _ => false,
        }
    }
}

fn hex(data: &[u8]) -> String {
    let shown: String = data.iter().take(32).map(|b| format!("{b:02x}")).collect();
    if data.len() > 32 {
        format!("{shown}... ({} bytes)", data.len())
    } else if data.is_empty() {
        "none".into()
    } else {
        shown
    }
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::Refused { addr } => write!(f, "connection refused by {addr}: is the server running and listening on that port?"),
            CmError::Connect { addr, source } => write!(f, "could not connect to {addr}: {source}; check the address and the route"),
            CmError::Timeout { addr, during, after } => write!(f, "timed out after {after:?} {during} with {addr}: is the peer an iWARP (MPA) endpoint and alive? raise ConnParam::timeout for slow links"),
            CmError::Rejected { addr, private_data } => write!(f, "peer {addr} rejected the connection (private data: {})", hex(private_data)),
            CmError::Mpa { addr, error } => write!(f, "MPA negotiation with {addr} failed: {error}"),
            CmError::Closed { addr, during } => write!(f, "{addr} closed the connection {during}: the peer is not an MPA endpoint or refused our parameters; check its logs"),
            CmError::Io { during, source } => write!(f, "socket error {during}: {source}"),
            CmError::InvalidState { state, connected } => {
                if *connected {
                    write!(f, "queue pair is already connected (or a connect/accept is in progress): create a new QP for each connection")
                } else {
                    write!(f, "queue pair is in state {state:?}, not Init: create a new QP for each connection")
                }
            }
            CmError::Bind { addr, source } => write!(f, "could not listen on {addr}: {source}; is another process using the port?"),
            CmError::Driver(e) => write!(f, "could not start the queue pair's driver threads: {e}; raise the thread limit"),
            CmError::OtherProvider => f.write_str("this queue pair was not made by the listener's provider (software or the same kernel device): create it on the device the listener was bound through"),
            CmError::Device { addr, error } => write!(f, "cannot listen on {addr}: {error}"),
            CmError::Congestion { name, source } => match source.raw_os_error() {
                Some(libc::ENOENT) => write!(f, "the kernel has no TCP congestion control {name:?} (it offers: {}, see {AVAILABLE_CC_PATH}); load it with `modprobe tcp_{name}` or pick an offered one", offered()),
                Some(libc::EPERM) => write!(f, "TCP congestion control {name:?} is not allowed for this process: add it to {ALLOWED_CC_PATH} (sysctl net.ipv4.tcp_allowed_congestion_control) or run with CAP_NET_ADMIN"),
                _ => write!(f, "could not set TCP congestion control {name:?}: {source}; see {AVAILABLE_CC_PATH}"),
            },
            CmError::Unsupported { what, provider, fix } => write!(f, "{what} is not supported on the {provider} provider: {fix}"),
            CmError::NotConnected => f.write_str("the queue pair has no connection: connect or accept it first"),
        }
    }
}

impl std::error::Error for CmError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CmError::Connect { source, .. }
            | CmError::Io { source, .. }
            | CmError::Bind { source, .. }
            | CmError::Congestion { source, .. } => Some(source),
            CmError::Driver(e) => Some(e),
            CmError::Device { error, .. } => Some(error),
            _ => None,
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Set `cc` on `sock` (`TCP_CONGESTION`, tcp(7)).
fn apply_congestion(sock: &Socket, cc: &CongestionControl) -> Result<(), CmError> {
    super::link::set_congestion(sock, cc.as_str()).map_err(|source| CmError::Congestion {
        name: cc.as_str().to_owned(),
        source,
    })
}

/// What `sock` uses, for logs: the name, or `?` where the kernel does
/// not say.
fn congestion_for_log(sock: &Socket) -> String {
    super::link::congestion(sock).unwrap_or_else(|_| "?".into())
}

/// The TCP congestion-control algorithm `qp`'s connection uses
/// (getsockopt(2) `TCP_CONGESTION`): the one [`ConnParam::congestion`]
/// set, or the kernel's default. [`CmError::NotConnected`] before the
/// connection is up.
pub fn tcp_congestion(qp: &QueuePair) -> Result<String, CmError> {
    let shared = super::of(qp).ok_or(CmError::OtherProvider)?;
    let conn = shared.conn.get().ok_or(CmError::NotConnected)?;
    super::link::congestion(&conn.sock).map_err(|source| CmError::Io {
        during: "reading TCP_CONGESTION",
        source,
    })
}

/// Change the TCP congestion-control algorithm of `qp`'s live connection
/// (setsockopt `TCP_CONGESTION` on an established socket: Linux switches
/// the algorithm at once, tcp(7)). For the `setsockopt` of a sockets
/// layer; a new connection sets it before `connect` with
/// [`ConnParam::congestion`] instead.
pub fn set_tcp_congestion(qp: &QueuePair, cc: &CongestionControl) -> Result<(), CmError> {
    let shared = super::of(qp).ok_or(CmError::OtherProvider)?;
    let conn = shared.conn.get().ok_or(CmError::NotConnected)?;
    apply_congestion(&conn.sock, cc)?;
    tracing::debug!(qpn = shared.qpn, congestion = %cc, "congestion control changed");
    Ok(())
}

/// The round-trip time of `qp`'s TCP path as the kernel measures it: the
/// larger of the smoothed RTT of our own segments' acknowledgements and
/// the receiver-side estimate (`tcpi_rtt`, `tcpi_rcv_rtt` of `TCP_INFO`,
/// tcp(7)); `Ok(None)` while the kernel has no sample yet. For sizing
/// buffers to the bandwidth-delay product.
pub fn path_rtt(qp: &QueuePair) -> Result<Option<Duration>, CmError> {
    let shared = super::of(qp).ok_or(CmError::OtherProvider)?;
    let conn = shared.conn.get().ok_or(CmError::NotConnected)?;
    let rtts = crate::sys::tcp_rtts(conn.sock.as_raw_fd()).ok_or_else(|| CmError::Io {
        during: "reading TCP_INFO",
        source: io::Error::last_os_error(),
    })?;
    let us = rtts.0.max(rtts.1);
    Ok((us > 0).then(|| Duration::from_micros(u64::from(us))))
}

/// A deadline-bounded MPA frame exchange on a blocking socket.
struct Exchange<'a> {
    sock: &'a Socket,
    addr: SocketAddr,
    start: Instant,
    deadline: Instant,
}

impl Exchange<'_> {
    fn left(&self, during: &'static str) -> Result<Duration, CmError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timeout(during));
        }
        Ok(left)
    }

    fn timeout(&self, during: &'static str) -> CmError {
        CmError::Timeout {
            addr: self.addr,
            during,
            after: self.start.elapsed(),
        }
    }

    fn io_err(&self, e: io::Error, during: &'static str) -> CmError {
        if is_timeout(&e) {
            self.timeout(during)
        } else if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
        ) {
            CmError::Closed {
                addr: self.addr,
                during,
            }
        } else {
            CmError::Io { during, source: e }
        }
    }

    fn send(&self, frame: &[u8], during: &'static str) -> Result<(), CmError> {
        let mut sock = self.sock;
        let mut rest = frame;
        while !rest.is_empty() {
            let left = self.left(during)?;
            self.sock
                .set_write_timeout(Some(left))
                .map_err(|e| CmError::Io { during, source: e })?;
            match sock.write(rest) {
                Ok(0) => {
                    return Err(CmError::Closed {
                        addr: self.addr,
                        during,
                    })
                }
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e, during)),
            }
        }
        Ok(())
    }

    fn read_exact(&self, buf: &mut [u8], during: &'static str) -> Result<(), CmError> {
        let mut sock = self.sock;
        let mut got = 0;
        while got < buf.len() {
            let left = self.left(during)?;
            self.sock
                .set_read_timeout(Some(left))
                .map_err(|e| CmError::Io { during, source: e })?;
            match sock.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(CmError::Closed {
                        addr: self.addr,
                        during,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e, during)),
            }
        }
        Ok(())
    }

    /// Read one MPA Request/Reply: the fixed header, then exactly the rest
    /// of the frame (never past it: FPDUs may follow).
    fn read_frame(&self, during: &'static str) -> Result<Vec<u8>, CmError> {
        let mut frame = vec![0u8; MPA_HDR_LEN];
        self.read_exact(&mut frame, during)?;
        let total = handshake::frame_len(&frame).map_err(|error| CmError::Mpa {
            addr: self.addr,
            error,
        })?;
        if total > MPA_HDR_LEN {
            frame.resize(total, 0);
            self.read_exact(&mut frame[MPA_HDR_LEN..], during)?;
        }
        Ok(frame)
    }
}

/// Mark `qp` as being connected; fails unless it is a fresh QP in Init.
fn claim(qp: &QueuePair) -> Result<Arc<SoftQp>, CmError> {
    let shared = super::of(qp).ok_or(CmError::OtherProvider)?;
    let state = shared.lock_engine().state();
    if state != QpState::Init {
        return Err(CmError::InvalidState {
            state,
            connected: shared.conn.get().is_some(),
        });
    }
    if shared
        .claimed
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        return Err(CmError::InvalidState {
            state,
            connected: true,
        });
    }
    Ok(shared)
}

fn unclaim(qp: &SoftQp) {
    qp.claimed
        .store(false, std::sync::atomic::Ordering::Release);
}

/// Establish the engine with the negotiated parameters, post the RTR
/// message if we are the initiator in peer-to-peer mode, and start the
/// driver.
fn go_live(
    qp: &Arc<SoftQp>,
    sock: Socket,
    neg: &Negotiated,
    initiator: bool,
    param: &ConnParam,
) -> Result<(), CmError> {
    let shared: &Arc<SoftQp> = qp;
    super::tune_socket(&sock);
    // FPDUs are sized from the MSS (RFC 5044 §5.1), in whole segments up to
    // 64 KiB as siw does (see `mulpdu_for_path`). Early in a connection
    // TCP_MAXSEG can be bounded by half the peer's initial window; the
    // advertised MSS reflects the path MTU.
    let maxseg = sock.tcp_mss().unwrap_or(1460);
    let mss = crate::sys::tcp_advmss(sock.as_raw_fd()).map_or(maxseg, |adv| adv.max(maxseg));
    let mulpdu = super::mulpdu_for_path(mss, neg.markers_tx);
    let info = ConnInfo { mpa: *neg, mulpdu };
    {
        let mut eng = shared.lock_engine();
        if eng.state() != QpState::Init {
            // Disconnected (or destroyed) while the handshake ran.
            let state = eng.state();
            return Err(CmError::InvalidState {
                state,
                connected: false,
            });
        }
        eng.establish(LinkParams {
            crc: neg.crc,
            markers_tx: neg.markers_tx,
            markers_rx: neg.markers_rx,
            mulpdu,
            ird: u32::from(neg.ird),
            ord: u32::from(neg.ord),
        });
        if !initiator && param.hold_until_first_fpdu {
            // RFC 5044 §7.1.2: the Responder waits for the Initiator's
            // first FPDU before it sends any.
            eng.hold_transmit_until_input();
        }
        if let (true, Some(rtr)) = (initiator, neg.rtr) {
            // RFC 6581 §3: in peer-to-peer mode the initiator's first FPDU
            // is a zero-length message of the negotiated kind. STag 0 and
            // offset 0: nothing is accessed.
            let opcode = match rtr {
                Rtr::ZeroLengthWrite => WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
                Rtr::ZeroLengthRead => WrOpcode::RdmaRead {
                    remote_addr: 0,
                    rkey: 0,
                },
                Rtr::ZeroLengthSend => WrOpcode::Send,
            };
            let wr = SendWr {
                wr_id: RTR_WR_ID,
                opcode,
                sgl: SgList::new(),
                signaled: false,
                solicited: false,
            };
            shared.set_rtr_outstanding();
            if let Err(e) = eng.post_send(wr) {
                tracing::warn!(qpn = shared.qpn, error = %e, "could not post the RFC 6581 RTR message");
            }
        }
    }
    let _ = shared.info.set(info);
    let live = super::Liveness {
        fpdu_per_segment: neg.markers_tx,
        ..param.liveness()
    };
    let conn = Conn::start(shared, sock, &live).map_err(CmError::Driver)?;
    let _ = shared.conn.set(conn.clone());
    shared.push_event(QpEvent::Established);
    tracing::info!(
        qpn = shared.qpn,
        local = %conn.local,
        peer = %conn.peer,
        crc = info.mpa.crc,
        markers_tx = info.mpa.markers_tx,
        markers_rx = info.mpa.markers_rx,
        mulpdu,
        congestion = %congestion_for_log(&conn.sock),
        "connection established"
    );
    conn.kick(shared);
    Ok(())
}

/// Connect `qp` to a listener at `addr` (`rdma_connect`; IPv4 or IPv6).
/// Returns the private data of the peer's MPA Reply. The whole exchange is
/// bounded by `param.timeout`. On success the QP is in RTS and
/// [`QpEvent::Established`] is queued.
pub fn connect(qp: &QueuePair, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError> {
    let soft = claim(qp)?;
    let r = connect_inner(&soft, addr, param);
    if r.is_err() {
        unclaim(&soft);
    }
    r
}

fn connect_inner(
    qp: &Arc<SoftQp>,
    addr: SocketAddr,
    param: &ConnParam,
) -> Result<Vec<u8>, CmError> {
    let start = Instant::now();
    let deadline = start + param.timeout;
    let request = handshake::request(&param.mpa, &param.private_data)
        .map_err(|error| CmError::Mpa { addr, error })?;
    let sock =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(|e| {
            CmError::Io {
                during: "creating the socket",
                source: e,
            }
        })?;
    sock.set_cloexec(true).map_err(|e| CmError::Io {
        during: "creating the socket",
        source: e,
    })?;
    if let Some(cc) = &param.congestion {
        // Before connect, so the connection starts (and its first window
        // grows) under the chosen algorithm.
        apply_congestion(&sock, cc)?;
    }
    let tcp = match param.tcp_connect {
        TcpConnect::WithinTimeout => sock.connect_timeout(&SockAddr::from(addr), param.timeout),
        // A blocking connect(2): the kernel retransmits the SYN on its own
        // schedule (RFC 6298 §5.7's 1 s initial RTO, doubling) up to
        // `tcp_syn_retries`, and gives its own errno.
        TcpConnect::Kernel => sock.connect(&SockAddr::from(addr)),
    };
    match tcp {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            return Err(CmError::Refused { addr })
        }
        Err(e) if is_timeout(&e) => {
            return Err(CmError::Timeout {
                addr,
                during: DURING_TCP,
                after: start.elapsed(),
            })
        }
        Err(e) => return Err(CmError::Connect { addr, source: e }),
    }
    let _ = sock.set_tcp_nodelay(true);
    let x = Exchange {
        sock: &sock,
        addr,
        start,
        deadline: mpa_deadline(param, deadline, &sock),
    };
    x.send(&request, "sending the MPA Request")?;
    let reply = x.read_frame("waiting for the MPA Reply")?;
    let (neg, peer_pd) = match handshake::parse_reply(&param.mpa, &reply) {
        Ok(x) => x,
        Err(HandshakeError::Rejected { private_data }) => {
            let _ = sock.shutdown(Shutdown::Both);
            return Err(CmError::Rejected { addr, private_data });
        }
        Err(error) => {
            let _ = sock.shutdown(Shutdown::Both);
            return Err(CmError::Mpa { addr, error });
        }
    };
    go_live(qp, sock, &neg, true, param)?;
    Ok(peer_pd)
}

/// When the MPA exchange of a connect must be over: `deadline` (the
/// whole connect's, or under [`TcpConnect::Kernel`] `timeout` from now),
/// but never sooner than [`MPA_WAIT_RTTS`] handshake round trips from now.
fn mpa_deadline(param: &ConnParam, deadline: Instant, sock: &Socket) -> Instant {
    let now = Instant::now();
    let base = match param.tcp_connect {
        TcpConnect::WithinTimeout => deadline,
        TcpConnect::Kernel => now + param.timeout,
    };
    let rtt = crate::sys::tcp_rtts(sock.as_raw_fd()).map_or(0, |r| r.0);
    base.max(now + Duration::from_micros(u64::from(rtt)) * MPA_WAIT_RTTS)
}

/// `CmError::Timeout::during` of a TCP handshake that did not complete.
const DURING_TCP: &str = "opening the TCP connection";

/// A listening endpoint (`rdma_listen`).
pub struct Listener {
    sock: Socket,
    local: SocketAddr,
    mpa: MpaConfig,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .field("mpa", &self.mpa)
            .finish()
    }
}

impl Listener {
    /// Listen on `addr` (IPv4 or IPv6; port 0 picks a free port). `mpa` is
    /// the policy every incoming request is negotiated against.
    pub fn bind(addr: SocketAddr, mpa: MpaConfig) -> Result<Listener, CmError> {
        let bind_err = |e| CmError::Bind { addr, source: e };
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(bind_err)?;
        sock.set_cloexec(true).map_err(bind_err)?;
        sock.set_reuse_address(true).map_err(bind_err)?;
        if addr.is_ipv6() {
            sock.set_only_v6(true).map_err(bind_err)?;
        }
        sock.bind(&SockAddr::from(addr)).map_err(bind_err)?;
        sock.listen(128).map_err(bind_err)?;
        let local = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| bind_err(io::Error::other("listening socket has no IP address")))?;
        tracing::debug!(%local, "listening");
        Ok(Listener { sock, local, mpa })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The MPA policy of the listener.
    pub fn mpa(&self) -> &MpaConfig {
        &self.mpa
    }

    /// Set the TCP congestion-control algorithm of the listening socket
    /// (`TCP_CONGESTION`, tcp(7)); every connection whose TCP handshake
    /// completes afterwards inherits it (Linux copies the listener's
    /// algorithm into the accepted socket). A [`ConnParam::congestion`]
    /// given to [`ConnRequest::accept`] overrides it per connection.
    pub fn set_congestion(&self, cc: &CongestionControl) -> Result<(), CmError> {
        apply_congestion(&self.sock, cc)?;
        tracing::debug!(local = %self.local, congestion = %cc, "listener congestion control set");
        Ok(())
    }

    /// The congestion-control algorithm of the listening socket (the one
    /// its accepted connections start with).
    pub fn tcp_congestion(&self) -> Result<String, CmError> {
        super::link::congestion(&self.sock).map_err(|source| CmError::Io {
            during: "reading TCP_CONGESTION",
            source,
        })
    }

    /// Wait for the next connection request (`rdma_get_request`): accept a
    /// TCP connection and read its MPA Request. `None` waits for a
    /// connection without limit; the MPA Request must then arrive within
    /// [`REQUEST_TIMEOUT`]. A connection whose request is malformed or
    /// incompatible with the listener's policy is closed and reported as an
    /// error (call `get_request` again to serve the next one).
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnRequest, CmError> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if let Some(d) = deadline {
            loop {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(CmError::Timeout {
                        addr: self.local,
                        during: "waiting for a connection",
                        after: start.elapsed(),
                    });
                }
                let ready = crate::sys::poll_one(self.sock.as_raw_fd(), libc::POLLIN, left)
                    .map_err(|e| CmError::Io {
                        during: "waiting for a connection",
                        source: e,
                    })?;
                if ready != 0 {
                    break;
                }
            }
        }
        let (sock, peer) = self.sock.accept().map_err(|e| CmError::Io {
            during: "accepting a connection",
            source: e,
        })?;
        let peer = peer.as_socket().ok_or_else(|| CmError::Io {
            during: "accepting a connection",
            source: io::Error::other("peer has no IP address"),
        })?;
        let deadline = deadline.unwrap_or_else(|| Instant::now() + REQUEST_TIMEOUT);
        read_request(sock, peer, &self.mpa, deadline)
    }
}

impl AsRawFd for Listener {
    /// The listening TCP socket: readable when a connection is waiting
    /// (its MPA Request may not have arrived yet).
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

/// Reads and validates the MPA Request on a TCP connection accepted
/// elsewhere (`Listener::get_request` does the same on its own socket),
/// bounded by `timeout`. For servers that share a port between plain TCP
/// and MPA clients: they accept the connection themselves, peek at its
/// first bytes ([`handshake`]'s request key, RFC 5044 §7.1) and hand it
/// here when it is an MPA Request. `mpa` is the policy it is negotiated
/// against.
pub fn request_from_stream(
    stream: std::net::TcpStream,
    mpa: &MpaConfig,
    timeout: Duration,
) -> Result<ConnRequest, CmError> {
    let peer = stream.peer_addr().map_err(|e| CmError::Io {
        during: "reading the peer's address",
        source: e,
    })?;
    let sock = Socket::from(stream);
    sock.set_nonblocking(false).map_err(|e| CmError::Io {
        during: "making the socket blocking",
        source: e,
    })?;
    read_request(sock, peer, mpa, Instant::now() + timeout)
}

fn read_request(
    sock: Socket,
    peer: SocketAddr,
    mpa: &MpaConfig,
    deadline: Instant,
) -> Result<ConnRequest, CmError> {
    let _ = sock.set_cloexec(true);
    let _ = sock.set_tcp_nodelay(true);
    let x = Exchange {
        sock: &sock,
        addr: peer,
        start: Instant::now(),
        deadline,
    };
    let frame = x.read_frame("waiting for the MPA Request")?;
    let req = match handshake::parse_request(&frame) {
        Ok(r) => r,
        Err(error) => {
            // RFC 5044 §7.1.1: a bad key or malformed request: close.
            tracing::warn!(%peer, %error, "bad MPA Request; closing the connection");
            let _ = sock.shutdown(Shutdown::Both);
            return Err(CmError::Mpa { addr: peer, error });
        }
    };
    // Negotiate now so that an incompatible request is refused at once
    // and the request's parameters can be shown before accepting.
    let neg = match handshake::accept(mpa, &req, &[]) {
        Ok((_, n)) => n,
        Err(error) => {
            tracing::warn!(%peer, %error, "MPA Request incompatible with the listener's policy; rejecting");
            let reject = handshake::reject(mpa, Some(&req), &[]);
            let _ = x.send(&reject, "sending the MPA Reject");
            let _ = sock.shutdown(Shutdown::Both);
            return Err(CmError::Mpa { addr: peer, error });
        }
    };
    Ok(ConnRequest {
        sock,
        peer,
        req,
        neg,
        mpa: mpa.clone(),
    })
}

/// An incoming connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`),
/// already validated against the listener's MPA policy.
pub struct ConnRequest {
    sock: Socket,
    peer: SocketAddr,
    req: Request,
    neg: Negotiated,
    mpa: MpaConfig,
}

impl fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer", &self.peer)
            .field("private_data", &hex(&self.req.private_data))
            .field("crc", &self.neg.crc)
            .field("markers", &self.markers())
            .field("ird", &self.neg.ird)
            .field("ord", &self.neg.ord)
            .finish()
    }
}

impl ConnRequest {
    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    /// The private data of the MPA Request.
    pub fn private_data(&self) -> &[u8] {
        &self.req.private_data
    }
    /// MPA revision the connection will use.
    pub fn revision(&self) -> u8 {
        self.neg.revision
    }
    /// CRC will be used.
    pub fn crc(&self) -> bool {
        self.neg.crc
    }
    /// Markers will be used in at least one direction.
    pub fn markers(&self) -> bool {
        self.neg.markers_rx || self.neg.markers_tx
    }
    /// Our IRD after negotiation.
    pub fn ird(&self) -> u16 {
        self.neg.ird
    }
    /// Our ORD after negotiation.
    pub fn ord(&self) -> u16 {
        self.neg.ord
    }
    /// The congestion-control algorithm of the accepted TCP connection
    /// (inherited from the listener, or the kernel's default) before
    /// [`accept`](ConnRequest::accept) applies [`ConnParam::congestion`].
    pub fn tcp_congestion(&self) -> Result<String, CmError> {
        super::link::congestion(&self.sock).map_err(|source| CmError::Io {
            during: "reading TCP_CONGESTION",
            source,
        })
    }

    /// Accept the request onto `qp` (`rdma_accept`): send the MPA Reply with
    /// `param.private_data`, establish the QP and start its driver. The
    /// listener's [`MpaConfig`] governs the negotiation (it is the policy the
    /// request was validated against); `param.mpa` is not consulted here.
    /// The reply must leave within `param.timeout`. Post receives before
    /// accepting: the peer may send as soon as it has the Reply.
    /// `param.congestion` is set on the connection's socket before the
    /// Reply; if the kernel refuses it the request is rejected (an MPA
    /// Reject, then the connection is closed) and the error returned.
    pub fn accept(self, qp: &QueuePair, param: &ConnParam) -> Result<(), CmError> {
        let soft = claim(qp)?;
        let r = self.accept_inner(&soft, param);
        if r.is_err() {
            unclaim(&soft);
        }
        r
    }

    /// Send an MPA Reject (RFC 5044 §7.1.3) within `timeout`, best effort,
    /// and close the connection.
    fn reject_and_close(&self, timeout: Duration) {
        let reject = handshake::reject(&self.mpa, Some(&self.req), &[]);
        let start = Instant::now();
        let x = Exchange {
            sock: &self.sock,
            addr: self.peer,
            start,
            deadline: start + timeout,
        };
        let _ = x.send(&reject, "sending the MPA Reject");
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    fn accept_inner(self, qp: &Arc<SoftQp>, param: &ConnParam) -> Result<(), CmError> {
        let addr = self.peer;
        if let Some(cc) = &param.congestion {
            if let Err(e) = apply_congestion(&self.sock, cc) {
                tracing::warn!(peer = %addr, error = %e, "rejecting the connection");
                self.reject_and_close(param.timeout);
                return Err(e);
            }
        }
        let (reply, neg) =
            handshake::accept(&self.mpa, &self.req, &param.private_data).map_err(|error| {
                self.reject_and_close(param.timeout);
                CmError::Mpa { addr, error }
            })?;
        let start = Instant::now();
        let x = Exchange {
            sock: &self.sock,
            addr,
            start,
            deadline: start + param.timeout,
        };
        x.send(&reply, "sending the MPA Reply")?;
        go_live(qp, self.sock, &neg, false, param)
    }

    /// Reject the request (`rdma_reject`): send an MPA Reject carrying
    /// `private_data` (at most 512 bytes) and close the connection.
    pub fn reject(self, private_data: &[u8]) -> Result<(), CmError> {
        let addr = self.peer;
        if private_data.len() > 512 {
            return Err(CmError::Mpa {
                addr,
                error: HandshakeError::PrivateDataTooLong(private_data.len()),
            });
        }
        let frame = handshake::reject(&self.mpa, Some(&self.req), private_data);
        let start = Instant::now();
        let x = Exchange {
            sock: &self.sock,
            addr,
            start,
            deadline: start + Duration::from_secs(5),
        };
        let r = x.send(&frame, "sending the MPA Reject");
        let _ = self.sock.shutdown(Shutdown::Write);
        // Give the peer a moment to read the Reject before the socket is
        // closed (an RST could otherwise destroy the unread frame).
        let _ = self.sock.set_read_timeout(Some(Duration::from_millis(200)));
        let mut sink = [0u8; 64];
        let _ = (&self.sock).read(&mut sink);
        r
    }
}
