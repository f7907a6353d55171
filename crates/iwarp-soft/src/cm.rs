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
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use iwarp_proto::engine::{LinkParams, QpState, SendWr, SgList, WrOpcode};
use iwarp_proto::handshake::{self, Negotiated, Request};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

// The provider-neutral parameters and errors (`iwarp_verbs::cm_types`), also
// under this module's name as before.
pub use iwarp_verbs::cm_types::{
    available_congestion_control, BadCongestionName, CmError, CongestionControl, ConnParam,
    HandshakeError, MpaConfig, Policy, Rtr, TcpConnect, ALLOWED_CC_PATH, AVAILABLE_CC_PATH,
    DEFAULT_PEER_TIMEOUT, DEFAULT_PROBE_INTERVAL, MPA_WAIT_RTTS, REQUEST_GRACE, REQUEST_TIMEOUT,
    TCP_CA_NAME_MAX_LEN,
};
use iwarp_verbs::cm_types::{hex, DURING_TCP};

use crate::device::SoftDevice;
use crate::state::{Conn, SockState, SoftQp, RTR_WR_ID};
use iwarp_verbs::device_ops::{DeviceCm, ListenerOps, RequestOps};
use iwarp_verbs::provider::{ConnInfo, QpCm, QpEvent};
use iwarp_verbs::QueuePair;
use std::os::fd::RawFd;
use std::sync::Arc;

/// The listening socket's backlog (`listen(2)`; the kernel caps it at
/// `net.core.somaxconn`).
pub const LISTEN_BACKLOG: i32 = 4096;
/// Length of the fixed part of an MPA Request/Reply (RFC 5044 §7.1: 16-byte
/// key, flags, revision, 2-byte private-data length).
const MPA_HDR_LEN: usize = 20;

/// The liveness rules `param` asks the driver for.
fn liveness(param: &ConnParam) -> crate::state::Liveness {
    crate::state::Liveness {
        peer_timeout: param.peer_timeout,
        probe_interval: param.probe_interval,
        wake_nudge: param.wake_nudge,
        fpdu_per_segment: false,
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
    crate::link::set_congestion(sock, cc.as_str()).map_err(|source| CmError::Congestion {
        name: cc.as_str().to_owned(),
        source,
    })
}

/// What `sock` uses, for logs: the name, or `?` where the kernel does
/// not say.
fn congestion_for_log(sock: &Socket) -> String {
    crate::link::congestion(sock).unwrap_or_else(|_| "?".into())
}

/// The TCP congestion-control algorithm `qp`'s connection uses
/// (getsockopt(2) `TCP_CONGESTION`): the one [`ConnParam::congestion`]
/// set, or the kernel's default. [`CmError::NotConnected`] before the
/// connection is up.
pub fn tcp_congestion(qp: &QueuePair) -> Result<String, CmError> {
    crate::qp::of(qp)
        .ok_or(CmError::OtherProvider)?
        .tcp_congestion()
}

/// Change the TCP congestion-control algorithm of `qp`'s live connection
/// (setsockopt `TCP_CONGESTION` on an established socket: Linux switches
/// the algorithm at once, tcp(7)). For the `setsockopt` of a sockets
/// layer; a new connection sets it before `connect` with
/// [`ConnParam::congestion`] instead.
pub fn set_tcp_congestion(qp: &QueuePair, cc: &CongestionControl) -> Result<(), CmError> {
    crate::qp::of(qp)
        .ok_or(CmError::OtherProvider)?
        .set_tcp_congestion(cc)
}

/// The round-trip time of `qp`'s TCP path as the kernel measures it: the
/// larger of the smoothed RTT of our own segments' acknowledgements and
/// the receiver-side estimate (`tcpi_rtt`, `tcpi_rcv_rtt` of `TCP_INFO`,
/// tcp(7)); `Ok(None)` while the kernel has no sample yet. For sizing
/// buffers to the bandwidth-delay product.
pub fn path_rtt(qp: &QueuePair) -> Result<Option<Duration>, CmError> {
    crate::qp::of(qp).ok_or(CmError::OtherProvider)?.path_rtt()
}

/// The connection-manager verbs of a software queue pair (the seam's
/// `QpCm`; [`crate::cm`]'s functions call these).
impl QpCm for SoftQp {
    fn connect(self: Arc<Self>, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError> {
        claim(&self)?;
        let r = connect_inner(&self, addr, param);
        if r.is_err() {
            unclaim(&self);
        }
        r
    }

    fn tcp_congestion(&self) -> Result<String, CmError> {
        let conn = self.conn.get().ok_or(CmError::NotConnected)?;
        crate::link::congestion(&conn.sock).map_err(|source| CmError::Io {
            during: "reading TCP_CONGESTION",
            source,
        })
    }

    fn set_tcp_congestion(&self, cc: &CongestionControl) -> Result<(), CmError> {
        let conn = self.conn.get().ok_or(CmError::NotConnected)?;
        apply_congestion(&conn.sock, cc)?;
        tracing::debug!(qpn = self.qpn, congestion = %cc, "congestion control changed");
        Ok(())
    }

    fn path_rtt(&self) -> Result<Option<Duration>, CmError> {
        let conn = self.conn.get().ok_or(CmError::NotConnected)?;
        let rtts = crate::sys::tcp_rtts(conn.sock.as_raw_fd()).ok_or_else(|| CmError::Io {
            during: "reading TCP_INFO",
            source: io::Error::last_os_error(),
        })?;
        let us = rtts.0.max(rtts.1);
        Ok((us > 0).then(|| Duration::from_micros(u64::from(us))))
    }
}

/// A deadline-bounded MPA frame exchange. Every read and write is
/// non-blocking (`MSG_DONTWAIT`) and waits, when it must, in `poll(2)`
/// with what is left of the deadline, so the socket may be in either mode
/// and no socket timeout is ever set: arming `SO_RCVTIMEO`/`SO_SNDTIMEO`
/// before each call, and clearing both before the data path, cost six
/// `setsockopt`s per end of every connection (issue 29, set-up rate).
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

    fn closed(&self, during: &'static str) -> CmError {
        CmError::Closed {
            addr: self.addr,
            during,
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
            self.closed(during)
        } else {
            CmError::Io { during, source: e }
        }
    }

    /// Wait until the socket is ready for `events` or the deadline passes.
    fn wait(&self, events: i16, during: &'static str) -> Result<(), CmError> {
        let left = self.left(during)?;
        // poll(2) counts whole milliseconds: round up, or the last
        // fraction of a millisecond would spin.
        let left = left + Duration::from_micros(999);
        iwarp_verbs::sys::poll_one(self.sock.as_raw_fd(), events, left)
            .map(drop)
            .map_err(|e| CmError::Io { during, source: e })
    }

    fn send(&self, frame: &[u8], during: &'static str) -> Result<(), CmError> {
        let fd = self.sock.as_raw_fd();
        let mut rest = frame;
        while !rest.is_empty() {
            match crate::sys::send_nonblocking(fd, rest, 0) {
                Ok(0) => return Err(self.closed(during)),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(libc::POLLOUT, during)?
                }
                Err(e) => return Err(self.io_err(e, during)),
            }
        }
        Ok(())
    }

    /// Read exactly `buf.len()` bytes. `poll_first`: the peer has not
    /// answered yet for certain (our request just left), so wait before
    /// the first read instead of paying for one that finds nothing.
    fn read_exact(
        &self,
        buf: &mut [u8],
        mut poll_first: bool,
        during: &'static str,
    ) -> Result<(), CmError> {
        let fd = self.sock.as_raw_fd();
        let mut got = 0;
        while got < buf.len() {
            if std::mem::take(&mut poll_first) {
                self.wait(libc::POLLIN, during)?;
            }
            match crate::sys::recv_nonblocking(fd, &mut buf[got..]) {
                Ok(0) => return Err(self.closed(during)),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => poll_first = true,
                Err(e) => return Err(self.io_err(e, during)),
            }
            // Checked after every read, so a peer that trickles bytes
            // cannot stretch the exchange past its deadline.
            if got < buf.len() {
                self.left(during)?;
            }
        }
        Ok(())
    }

    /// Read one MPA Request/Reply: the fixed header, then exactly the rest
    /// of the frame (never past it: FPDUs may follow).
    fn read_frame(&self, poll_first: bool, during: &'static str) -> Result<Vec<u8>, CmError> {
        let mut frame = vec![0u8; MPA_HDR_LEN];
        self.read_exact(&mut frame, poll_first, during)?;
        let total = handshake::frame_len(&frame).map_err(|error| CmError::Mpa {
            addr: self.addr,
            error,
        })?;
        if total > MPA_HDR_LEN {
            frame.resize(total, 0);
            self.read_exact(&mut frame[MPA_HDR_LEN..], false, during)?;
        }
        Ok(frame)
    }
}

/// Mark `qp` as being connected; fails unless it is a fresh QP in Init.
fn claim(shared: &SoftQp) -> Result<(), CmError> {
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
    Ok(())
}

fn unclaim(qp: &SoftQp) {
    qp.claimed
        .store(false, std::sync::atomic::Ordering::Release);
}

/// Establish the engine with the negotiated parameters, post the RTR
/// message if we are the initiator in peer-to-peer mode, and start the
/// driver. `known` is what the connection manager already knows about
/// the socket (see [`SockState`]), so the driver does not ask again.
fn go_live(
    qp: &Arc<SoftQp>,
    sock: Socket,
    known: SockState,
    neg: &Negotiated,
    initiator: bool,
    param: &ConnParam,
) -> Result<(), CmError> {
    let shared: &Arc<SoftQp> = qp;
    if !known.tuned {
        crate::link::tune_socket(&sock);
    }
    // FPDUs are sized from the MSS (RFC 5044 §5.1), in whole segments up to
    // 64 KiB as siw does (see `mulpdu_for_path`). Early in a connection
    // the send MSS (TCP_MAXSEG, `tcpi_snd_mss`) can be bounded by half the
    // peer's initial window; the advertised MSS reflects the path MTU.
    // One TCP_INFO gives both.
    let mss = match crate::sys::tcp_mss_pair(sock.as_raw_fd()) {
        Some((snd, adv)) if snd > 0 => snd.max(adv),
        _ => sock.tcp_mss().unwrap_or(1460),
    };
    let mulpdu = crate::link::mulpdu_for_path(mss, neg.markers_tx);
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
    let live = crate::state::Liveness {
        fpdu_per_segment: neg.markers_tx,
        ..liveness(param)
    };
    let conn = Conn::start(shared, sock, &live, known).map_err(CmError::Driver)?;
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
    crate::qp::of(qp)
        .ok_or(CmError::OtherProvider)?
        .connect(addr, param)
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
    // Non-blocking from its creation when the connect is bounded by our
    // timeout (one `socket` call instead of four `fcntl`s around the
    // connect); socket2 sets close-on-exec atomically (SOCK_CLOEXEC).
    let within = param.tcp_connect == TcpConnect::WithinTimeout;
    let ty = if within {
        Type::STREAM.nonblocking()
    } else {
        Type::STREAM
    };
    let sock = Socket::new(Domain::for_address(addr), ty, Some(Protocol::TCP)).map_err(|e| {
        CmError::Io {
            during: "creating the socket",
            source: e,
        }
    })?;
    if let Some(cc) = &param.congestion {
        // Before connect, so the connection starts (and its first window
        // grows) under the chosen algorithm.
        apply_congestion(&sock, cc)?;
    }
    let tcp = if within {
        connect_nonblocking(&sock, addr, deadline)
    } else {
        // A blocking connect(2): the kernel retransmits the SYN on its own
        // schedule (RFC 6298 §5.7's 1 s initial RTO, doubling) up to
        // `tcp_syn_retries`, and gives its own errno.
        sock.connect(&SockAddr::from(addr))
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
    set_nodelay(&sock);
    let x = Exchange {
        sock: &sock,
        addr,
        start,
        deadline: mpa_deadline(param, deadline, start, &sock),
    };
    x.send(&request, "sending the MPA Request")?;
    let reply = x.read_frame(true, "waiting for the MPA Reply")?;
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
    let known = SockState {
        local: None,
        peer: addr,
        nonblocking: within,
        tuned: false,
    };
    go_live(qp, sock, known, &neg, true, param)?;
    Ok(peer_pd)
}

/// `connect(2)` on a non-blocking socket, waiting for the handshake in
/// `poll(2)` until `deadline` (what socket2's `connect_timeout` does,
/// without switching the socket's mode twice).
fn connect_nonblocking(sock: &Socket, addr: SocketAddr, deadline: Instant) -> io::Result<()> {
    match sock.connect(&SockAddr::from(addr)) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let ev = iwarp_verbs::sys::poll_one(
            sock.as_raw_fd(),
            libc::POLLOUT,
            left + Duration::from_micros(999),
        )?;
        if ev == 0 {
            continue;
        }
        // connect(2), EINPROGRESS: the outcome is SO_ERROR once writable.
        return match sock.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        };
    }
}

/// `TCP_NODELAY` for the MPA exchange and the data path.
fn set_nodelay(sock: &Socket) {
    if let Err(e) = sock.set_tcp_nodelay(true) {
        tracing::warn!(error = %e, "TCP_NODELAY failed; small messages will see Nagle delays");
    }
}

/// When the MPA exchange of a connect must be over: `deadline` (the
/// whole connect's, or under [`TcpConnect::Kernel`] `timeout` from now),
/// but never sooner than [`MPA_WAIT_RTTS`] handshake round trips from now.
/// `start` is when the connect began: the handshake's RTT sample (SYN to
/// SYN-ACK, `tcpi_rtt` right after it, RFC 6298 §2.2) cannot exceed the
/// time since, so when `deadline` is later than that many of those, it
/// stands without asking the kernel (`TCP_INFO`).
fn mpa_deadline(param: &ConnParam, deadline: Instant, start: Instant, sock: &Socket) -> Instant {
    let now = Instant::now();
    let base = match param.tcp_connect {
        TcpConnect::WithinTimeout => deadline,
        TcpConnect::Kernel => now + param.timeout,
    };
    if base >= now + now.saturating_duration_since(start) * MPA_WAIT_RTTS {
        return base;
    }
    let rtt = crate::sys::tcp_rtts(sock.as_raw_fd()).map_or(0, |r| r.0);
    base.max(now + Duration::from_micros(u64::from(rtt)) * MPA_WAIT_RTTS)
}

/// A listening endpoint (`rdma_listen`).
pub struct Listener {
    sock: Socket,
    local: SocketAddr,
    mpa: MpaConfig,
    /// The listening socket carries the data path's options (TCP_NODELAY,
    /// keepalive), which every accepted socket inherits.
    tuned: bool,
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
        // socket2 sets close-on-exec atomically (SOCK_CLOEXEC).
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(bind_err)?;
        sock.set_reuse_address(true).map_err(bind_err)?;
        if addr.is_ipv6() {
            sock.set_only_v6(true).map_err(bind_err)?;
        }
        sock.bind(&SockAddr::from(addr)).map_err(bind_err)?;
        // The kernel caps the backlog at net.core.somaxconn (4096 here).
        // 128 was too shallow for a server that many clients reach at
        // once: a client's TCP connect completes in the kernel without
        // waiting for `accept`, the queue overflowed, the kernel dropped
        // SYNs and those clients waited for the 1 s SYN retransmission
        // (seen as a 1 s p99 in iwarp-connrate's TCP baseline with 128).
        sock.listen(LISTEN_BACKLOG).map_err(bind_err)?;
        let local = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| bind_err(io::Error::other("listening socket has no IP address")))?;
        // The data path's options once here rather than five `setsockopt`s
        // on every accepted connection: Linux copies a listener's socket
        // options (TCP_NODELAY, SO_KEEPALIVE and the keepalive times) into
        // each connection it accepts (`sk_clone_lock`).
        set_nodelay(&sock);
        crate::link::tune_socket(&sock);
        tracing::debug!(%local, "listening");
        Ok(Listener {
            sock,
            local,
            mpa,
            tuned: true,
        })
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
        crate::link::congestion(&self.sock).map_err(|source| CmError::Io {
            during: "reading TCP_CONGESTION",
            source,
        })
    }

    /// Wait for the next connection request (`rdma_get_request`): accept a
    /// TCP connection and read its MPA Request. `None` waits for a
    /// connection without limit; the MPA Request must then arrive within
    /// [`REQUEST_TIMEOUT`]. With a timeout, the Request must arrive by its
    /// end, or within [`REQUEST_GRACE`] of the accept if that is later.
    /// `Some(Duration::ZERO)` takes a connection that is waiting and does
    /// not wait for one. A connection whose request is malformed or
    /// incompatible with the listener's policy is closed and reported as an
    /// error (call `get_request` again to serve the next one).
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnRequest, CmError> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if let Some(d) = deadline {
            loop {
                let left = d.saturating_duration_since(Instant::now());
                // Look before giving up: a zero timeout is a check that
                // does not wait (poll(2) with timeout 0), as on a kernel
                // device, so a caller can take what waits and no more.
                let ready = iwarp_verbs::sys::poll_one(self.sock.as_raw_fd(), libc::POLLIN, left)
                    .map_err(|e| CmError::Io {
                    during: "waiting for a connection",
                    source: e,
                })?;
                if ready != 0 {
                    break;
                }
                if left.is_zero() {
                    return Err(CmError::Timeout {
                        addr: self.local,
                        during: "waiting for a connection",
                        after: start.elapsed(),
                    });
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
        // The caller's timeout bounds the wait for a connection, and the
        // Request's read only down to REQUEST_GRACE: cutting that read at
        // the caller's deadline reset a client whose connection happened
        // to arrive at the end of the caller's slice (iwarp-ping waits in
        // 1 s slices; Linux siw's rping then saw RDMA_CM_EVENT_REJECTED,
        // -ECONNRESET, in 1 or 2 of 16 connections on a loaded machine).
        let now = Instant::now();
        let deadline = deadline.map_or(now + REQUEST_TIMEOUT, |d| d.max(now + REQUEST_GRACE));
        let known = SockState {
            local: (!self.local.ip().is_unspecified()).then_some(self.local),
            peer,
            // accept(2) on Linux: the new socket does not inherit
            // O_NONBLOCK; it has our listener's other options.
            nonblocking: false,
            tuned: self.tuned,
        };
        read_request(sock, known, &self.mpa, deadline)
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
    // A stream accepted elsewhere may carry socket timeouts; the data
    // path's threads wait without them.
    let _ = sock.set_read_timeout(None);
    let _ = sock.set_write_timeout(None);
    let _ = sock.set_cloexec(true);
    let known = SockState {
        local: None,
        peer,
        nonblocking: false,
        tuned: false,
    };
    read_request(sock, known, mpa, Instant::now() + timeout)
}

fn read_request(
    sock: Socket,
    known: SockState,
    mpa: &MpaConfig,
    deadline: Instant,
) -> Result<ConnRequest, CmError> {
    let peer = known.peer;
    if !known.tuned {
        set_nodelay(&sock);
    }
    let x = Exchange {
        sock: &sock,
        addr: peer,
        start: Instant::now(),
        deadline,
    };
    let frame = x.read_frame(false, "waiting for the MPA Request")?;
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
        known,
        req,
        neg,
        mpa: mpa.clone(),
    })
}

/// An incoming connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`),
/// already validated against the listener's MPA policy.
pub struct ConnRequest {
    sock: Socket,
    known: SockState,
    req: Request,
    neg: Negotiated,
    mpa: MpaConfig,
}

impl fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer", &self.known.peer)
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
        self.known.peer
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
        crate::link::congestion(&self.sock).map_err(|source| CmError::Io {
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
        let soft = crate::qp::of(qp).ok_or(CmError::OtherProvider)?;
        claim(&soft)?;
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
            addr: self.known.peer,
            start,
            deadline: start + timeout,
        };
        let _ = x.send(&reject, "sending the MPA Reject");
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    fn accept_inner(self, qp: &Arc<SoftQp>, param: &ConnParam) -> Result<(), CmError> {
        let addr = self.known.peer;
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
        go_live(qp, self.sock, self.known, &neg, false, param)
    }

    /// Reject the request (`rdma_reject`): send an MPA Reject carrying
    /// `private_data` (at most 512 bytes) and close the connection.
    pub fn reject(self, private_data: &[u8]) -> Result<(), CmError> {
        let addr = self.known.peer;
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

/// Listening on the software device: a TCP listener; this provider
/// negotiates MPA itself, against `mpa`.
impl DeviceCm for SoftDevice {
    fn listen(&self, addr: SocketAddr, mpa: MpaConfig) -> Result<Box<dyn ListenerOps>, CmError> {
        Ok(Box::new(Listener::bind(addr, mpa)?))
    }
}

impl ListenerOps for Listener {
    fn local_addr(&self) -> SocketAddr {
        Listener::local_addr(self)
    }
    fn mpa(&self) -> &MpaConfig {
        Listener::mpa(self)
    }
    fn set_congestion(&self, cc: &CongestionControl) -> Result<(), CmError> {
        Listener::set_congestion(self, cc)
    }
    fn tcp_congestion(&self) -> Result<String, CmError> {
        Listener::tcp_congestion(self)
    }
    fn device_name(&self) -> &str {
        "soft"
    }
    fn get_request(&self, timeout: Option<Duration>) -> Result<Box<dyn RequestOps>, CmError> {
        Ok(Box::new(Listener::get_request(self, timeout)?))
    }
    fn raw_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

impl RequestOps for ConnRequest {
    fn peer_addr(&self) -> SocketAddr {
        ConnRequest::peer_addr(self)
    }
    fn private_data(&self) -> &[u8] {
        ConnRequest::private_data(self)
    }
    fn revision(&self) -> u8 {
        ConnRequest::revision(self)
    }
    fn crc(&self) -> bool {
        ConnRequest::crc(self)
    }
    fn markers(&self) -> bool {
        ConnRequest::markers(self)
    }
    fn ird(&self) -> u16 {
        ConnRequest::ird(self)
    }
    fn ord(&self) -> u16 {
        ConnRequest::ord(self)
    }
    fn tcp_congestion(&self) -> Result<String, CmError> {
        ConnRequest::tcp_congestion(self)
    }
    fn provider(&self) -> &'static str {
        "soft"
    }
    fn accept(self: Box<Self>, qp: &QueuePair, param: &ConnParam) -> Result<(), CmError> {
        ConnRequest::accept(*self, qp, param)
    }
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), CmError> {
        ConnRequest::reject(*self, private_data)
    }
}
