//! The two transports a test runs over, behind one type: an rsockets
//! stream of `iwarp-sockets` (the point of the tool) and a plain kernel
//! TCP socket (rstream's `-T s`, and our `--tcp` baseline).
//!
//! Both are driven the way rstream drives its socket: non-blocking calls
//! retried in a loop by default (`MSG_DONTWAIT`, a busy loop), blocking
//! calls with `-T b`, and with `-T a` an `rpoll` before every call, as
//! rstream's `do_poll` does: `iwarp_sockets::poll::poll`, which waits for
//! an rsocket and a plain TCP socket alike through the verbs crate's one
//! waiting API (`iwarp::wait::WaitSet`; for an rsocket in busy-poll mode
//! the waiting thread does its receive work, as rsocket.c's `rpoll`
//! does). Unlike rstream, every wait is bounded: a transfer that makes no
//! progress for `stall` fails with `TimedOut`.

use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

// The key that opens every MPA Request (RFC 5044 §7.1), from the one place
// that defines it.
use iwarp_proto::wire::mpa::KEY_REQ as MPA_REQ_KEY;
use iwarp_sockets::poll::{poll, PollFd};
use iwarp_sockets::{Listener, Options, Stream};
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

/// Which stack carries a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// rsockets over software iWARP (`iwarp-sockets`).
    Rsockets,
    /// Plain kernel TCP.
    Tcp,
}

impl Kind {
    /// The name used in messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Rsockets => "rsockets",
            Kind::Tcp => "tcp",
        }
    }
}

/// How calls wait (rstream's `flags`, `use_async` and `poll_timeout`).
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// `MSG_DONTWAIT` (the default): calls never block; the loop retries.
    pub nonblocking: bool,
    /// `-T a`: `poll(2)` before each call (timeout 0 when non-blocking,
    /// so a busy loop; otherwise until ready).
    pub async_poll: bool,
    /// Bound on a transfer that makes no progress (and on connecting and
    /// accepting).
    pub stall: Duration,
}

/// The socket sizes and stream options of both transports.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The rsockets options (rings, design, MPA terms, busy polling).
    pub opts: Options,
    /// `SO_SNDBUF` / `SO_RCVBUF` for TCP sockets (rstream's `-B`, default
    /// 512 KiB).
    pub tcp_buffer: usize,
    /// `SO_KEEPALIVE` on TCP sockets (`-k`).
    pub keepalive: bool,
}

/// A connected socket of either kind.
#[derive(Debug)]
pub enum Endpoint {
    /// An rsockets stream.
    Rsockets(Stream),
    /// A TCP stream.
    Tcp(TcpStream),
}

fn timed_out(what: &str, stall: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} made no progress for {stall:?} (--timeout); the peer is stuck or gone"),
    )
}

/// `rpoll` of one entry until `deadline` (`Duration::ZERO`: a check);
/// its `revents`. A signal counts as "nothing yet" (the caller's loop
/// looks at the deadline and polls again).
fn poll_one(mut entry: PollFd<'_>, timeout: Duration) -> io::Result<i16> {
    match poll(std::slice::from_mut(&mut entry), Some(timeout)) {
        Ok(_) => Ok(entry.revents),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

impl Endpoint {
    /// The kind of this endpoint.
    pub fn kind(&self) -> Kind {
        match self {
            Endpoint::Rsockets(_) => Kind::Rsockets,
            Endpoint::Tcp(_) => Kind::Tcp,
        }
    }

    /// Applies the mode: blocking or not, and in blocking mode the stall
    /// bound as the read and write timeouts.
    pub fn apply(&self, mode: &Mode) -> io::Result<()> {
        let t = Some(mode.stall.max(Duration::from_millis(1)));
        match self {
            Endpoint::Rsockets(s) => {
                s.set_nonblocking(mode.nonblocking)?;
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Endpoint::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_nonblocking(mode.nonblocking)?;
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// This endpoint as an `rpoll` entry for `events`.
    fn poll_entry(&self, events: i16) -> PollFd<'_> {
        match self {
            Endpoint::Rsockets(s) => PollFd::stream(s, events),
            Endpoint::Tcp(s) => PollFd::fd(s.as_raw_fd(), events),
        }
    }

    fn send_once(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Endpoint::Rsockets(s) => s.send(buf),
            Endpoint::Tcp(s) => (&*s).write(buf),
        }
    }

    fn recv_once(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Endpoint::Rsockets(s) => s.recv(buf),
            Endpoint::Tcp(s) => (&*s).read(buf),
        }
    }

    /// `do_poll`: waits until the descriptor reports `events`, at most
    /// until `deadline`; an error or hang-up on the descriptor is an error.
    fn wait_ready(&self, events: i16, mode: &Mode, deadline: Instant) -> io::Result<()> {
        loop {
            // rstream polls with timeout 0 in its non-blocking mode (a
            // busy loop), otherwise until ready: here until the deadline.
            let timeout = if mode.nonblocking {
                Duration::ZERO
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            let rev = poll_one(self.poll_entry(events), timeout)?;
            if rev & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 && rev & events == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("poll reported an error or hang-up (revents {rev:#x})"),
                ));
            }
            if rev & events != 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(timed_out("waiting in poll", mode.stall));
            }
        }
    }

    /// `send_xfer`: sends all of `buf` the way rstream does.
    pub fn send_all(&self, buf: &[u8], mode: &Mode) -> io::Result<()> {
        let mut off = 0;
        let mut deadline = Instant::now() + mode.stall;
        while off < buf.len() {
            if mode.async_poll {
                self.wait_ready(libc::POLLOUT, mode, deadline)?;
            }
            match self.send_once(&buf[off..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "send accepted no bytes",
                    ))
                }
                Ok(n) => {
                    off += n;
                    deadline = Instant::now() + mode.stall;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    if Instant::now() >= deadline {
                        return Err(timed_out("sending", mode.stall));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `recv_xfer`: receives exactly `buf.len()` bytes the way rstream
    /// does; end of stream before that is an error.
    pub fn recv_all(&self, buf: &mut [u8], mode: &Mode) -> io::Result<()> {
        let mut off = 0;
        let mut deadline = Instant::now() + mode.stall;
        while off < buf.len() {
            if mode.async_poll {
                self.wait_ready(libc::POLLIN, mode, deadline)?;
            }
            match self.recv_once(&mut buf[off..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the peer closed the connection after {off} of {} bytes",
                            buf.len()
                        ),
                    ))
                }
                Ok(n) => {
                    off += n;
                    deadline = Instant::now() + mode.stall;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    if Instant::now() >= deadline {
                        return Err(timed_out("receiving", mode.stall));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `rshutdown(SHUT_RDWR)`; errors are ignored, as rstream does.
    pub fn shutdown(&self) {
        let _ = match self {
            Endpoint::Rsockets(s) => s.shutdown(Shutdown::Both),
            Endpoint::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

fn tcp_socket(addr: &SocketAddr, setup: &Setup) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    s.set_send_buffer_size(setup.tcp_buffer)?;
    s.set_recv_buffer_size(setup.tcp_buffer)?;
    s.set_tcp_nodelay(true)?;
    if setup.keepalive {
        s.set_keepalive(true)?;
    }
    Ok(s)
}

/// Connects a client endpoint of `kind` to `addr`.
pub fn connect(
    kind: Kind,
    addr: SocketAddr,
    bind: Option<SocketAddr>,
    setup: &Setup,
    timeout: Duration,
) -> io::Result<Endpoint> {
    match kind {
        Kind::Rsockets => {
            let opts = Options {
                connect_timeout: timeout,
                ..setup.opts.clone()
            };
            Stream::connect_with(addr, &opts).map(Endpoint::Rsockets)
        }
        Kind::Tcp => {
            let s = tcp_socket(&addr, setup)?;
            if let Some(b) = bind {
                s.bind(&SockAddr::from(b))?;
            }
            s.connect_timeout(&SockAddr::from(addr), timeout)?;
            Ok(Endpoint::Tcp(s.into()))
        }
    }
}

/// The server's listening socket.
#[derive(Debug)]
pub enum Acceptor {
    /// rsockets only (the default).
    Rsockets(Box<Listener>),
    /// Plain TCP only (`-T s`).
    Tcp(TcpListener),
    /// Both on one port (`--tcp`): each accepted connection is told apart
    /// by its first 16 bytes (an MPA Request key, or a TCP client's first
    /// transfer).
    Both(TcpListener),
}

impl Acceptor {
    /// Listens on `addr` for the kinds in `kinds`.
    pub fn bind(addr: SocketAddr, kinds: &[Kind], setup: &Setup) -> io::Result<Acceptor> {
        let tcp_listener = || -> io::Result<TcpListener> {
            let s = tcp_socket(&addr, setup)?;
            s.bind(&SockAddr::from(addr))?;
            s.listen(16)?;
            Ok(s.into())
        };
        match kinds {
            [Kind::Rsockets] => {
                Listener::bind_with(addr, &setup.opts).map(|l| Acceptor::Rsockets(Box::new(l)))
            }
            [Kind::Tcp] => tcp_listener().map(Acceptor::Tcp),
            _ => tcp_listener().map(Acceptor::Both),
        }
    }

    /// The bound address (to learn the port after `-p 0`).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Acceptor::Rsockets(l) => l.local_addr(),
            Acceptor::Tcp(l) | Acceptor::Both(l) => l.local_addr(),
        }
    }

    /// The listening socket as an `rpoll` entry (readable: a connection
    /// waits).
    fn poll_entry(&self) -> PollFd<'_> {
        match self {
            Acceptor::Rsockets(l) => PollFd::listener(l, libc::POLLIN),
            Acceptor::Tcp(l) | Acceptor::Both(l) => PollFd::fd(l.as_raw_fd(), libc::POLLIN),
        }
    }

    /// Accepts the next connection, which must be of kind `want`, waiting
    /// at most `timeout`.
    pub fn accept(&self, want: Kind, setup: &Setup, timeout: Duration) -> io::Result<Endpoint> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no client connected within {timeout:?} (--timeout)"),
                ));
            }
            if poll_one(self.poll_entry(), left)? & libc::POLLIN == 0 {
                continue;
            }
            let ep = match self {
                Acceptor::Rsockets(l) => {
                    l.set_nonblocking(true)?;
                    match l.accept() {
                        Ok((s, _)) => Endpoint::Rsockets(s),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                }
                Acceptor::Tcp(l) => Endpoint::Tcp(l.accept()?.0),
                Acceptor::Both(l) => {
                    let (s, peer) = l.accept()?;
                    let opts = Options {
                        connect_timeout: timeout,
                        ..setup.opts.clone()
                    };
                    if starts_with_mpa_request(&s, deadline)? {
                        let st = Listener::accept_tcp(s, &opts).map_err(|e| {
                            io::Error::new(e.kind(), format!("accepting {peer} as an rsocket: {e}"))
                        })?;
                        Endpoint::Rsockets(st)
                    } else {
                        Endpoint::Tcp(s)
                    }
                }
            };
            if ep.kind() != want {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "expected a {} client but a {} client connected: run both ends with the \
                         same transport options (-T s, --tcp)",
                        want.name(),
                        ep.kind().name()
                    ),
                ));
            }
            return Ok(ep);
        }
    }
}

/// Peeks at the first 16 bytes of a fresh connection: an MPA Request key,
/// or something else (a TCP client's first transfer, which rstream makes
/// 16 bytes long: the sync message). The kernel waits for all 16 bytes
/// (`MSG_PEEK | MSG_WAITALL`, recv(2)), at most until `deadline`.
fn starts_with_mpa_request(s: &TcpStream, deadline: Instant) -> io::Result<bool> {
    let mut head = [MaybeUninit::<u8>::uninit(); 16];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "a client connected but sent nothing (--timeout)",
            ));
        }
        s.set_read_timeout(Some(left))?;
        let got = SockRef::from(s).recv_with_flags(&mut head, libc::MSG_PEEK | libc::MSG_WAITALL);
        s.set_read_timeout(None)?;
        match got {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a client connected and closed without sending anything",
                ))
            }
            Ok(n) => {
                let seen: Vec<u8> = head[..n]
                    .iter()
                    // SAFETY: recv(2) initialized the first `n` bytes.
                    .map(|b| unsafe { b.assume_init() })
                    .collect();
                if seen[..] != MPA_REQ_KEY[..n] {
                    return Ok(false);
                }
                if n == head.len() {
                    return Ok(true);
                }
                // A prefix of the key, then the peer closed or the wait
                // was cut short: look again until the deadline.
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::TimedOut
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
