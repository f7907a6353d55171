//! The connection manager's parameters and errors ([`ConnParam`],
//! [`CmError`], [`CongestionControl`], the MPA policy types), re-exported
//! by `iwarp::cm`: a leaf that both providers and the verbs layer use,
//! so that neither provider defines what the other's connection manager
//! takes (librdmacm's `struct rdma_conn_param` is provider-neutral too).
//!
//! It also holds the kernel's congestion-control names and limits
//! (tcp(7)), which a [`CongestionControl`] is checked against; the socket
//! options themselves are the software provider's (`iwarp-soft`'s
//! `link.rs`).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use iwarp_proto::engine::QpState;
pub use iwarp_proto::handshake::{HandshakeError, MpaConfig, Policy, Rtr};

/// Longest congestion-control name the kernel keeps: `TCP_CA_NAME_MAX`
/// (16, include/net/tcp.h) less the terminating NUL. setsockopt(2) of
/// `TCP_CONGESTION` copies at most this many bytes and silently drops the
/// rest, so a longer name must be refused before it reaches the kernel.
pub const TCP_CA_NAME_MAX_LEN: usize = 15;

/// Where the kernel lists the congestion-control algorithms it has
/// loaded (tcp(7): `tcp_available_congestion_control`).
pub const AVAILABLE_CC_PATH: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// Where the kernel lists the algorithms a process without
/// `CAP_NET_ADMIN` may pick (tcp(7): `tcp_allowed_congestion_control`).
pub const ALLOWED_CC_PATH: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

/// The algorithms this kernel offers ([`AVAILABLE_CC_PATH`]), in its
/// order; empty where the file cannot be read (no `/proc`).
pub fn available_congestion_control() -> Vec<String> {
    std::fs::read_to_string(AVAILABLE_CC_PATH)
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `CmError::Timeout::during` of a TCP handshake that did not complete.
#[doc(hidden)]
pub const DURING_TCP: &str = "opening the TCP connection";

/// How long `iwarp::cm::Listener::get_request` waits for the MPA Request on an
/// accepted connection when it was called without a timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The least time `iwarp::cm::Listener::get_request`
/// gives the MPA Request of a connection it accepted, even when its own
/// timeout runs out sooner. The Request follows the TCP handshake at once,
/// so a connection that lands at the end of a caller's polling slice is
/// not cut off (and reset) after a few microseconds.
pub const REQUEST_GRACE: Duration = Duration::from_secs(2);

/// Parameters of a connect or accept (`struct rdma_conn_param`).
#[derive(Debug, Clone)]
pub struct ConnParam {
    /// Private data carried by the MPA Request or Reply (at most 512 bytes,
    /// RFC 5044 §7.1).
    pub private_data: Vec<u8>,
    /// MPA policy (CRC, markers, revision, IRD/ORD, RTR). On the passive
    /// side the listener's configuration governs negotiation; see
    /// `iwarp::cm::ConnRequest::accept`.
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
    /// `iwarp::cm::Listener::set_congestion`). An algorithm the kernel lacks fails
    /// the connect or accept with [`CmError::Congestion`]. Software
    /// provider only: a kernel device's TCP is the kernel's and cannot be
    /// given one ([`CmError::Unsupported`]).
    pub congestion: Option<CongestionControl>,
}

/// What bounds the TCP handshake of `iwarp::cm::connect`.
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
/// use iwarp_verbs::cm_types::CongestionControl;
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
        error: crate::error::Error,
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

#[doc(hidden)]
pub fn hex(data: &[u8]) -> String {
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
