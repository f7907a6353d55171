//! The `std::net`-shaped API: [`Stream`] and [`Listener`], byte streams
//! over iWARP that speak rsockets on the wire.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use iwarp_sockets::{Listener, Stream};
//!
//! let listener = Listener::bind("127.0.0.1:7471".parse().unwrap())?;
//! std::thread::spawn(move || {
//!     let (mut s, _peer) = listener.accept().unwrap();
//!     let mut buf = [0u8; 5];
//!     s.read_exact(&mut buf).unwrap();
//!     s.write_all(&buf).unwrap();
//! });
//! let mut c = Stream::connect("127.0.0.1:7471".parse().unwrap())?;
//! c.write_all(b"hello")?;
//! let mut echo = [0u8; 5];
//! c.read_exact(&mut echo)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Semantics follow `TcpStream`/`TcpListener`: blocking by default,
//! `set_nonblocking`, read/write timeouts (`WouldBlock` when they expire),
//! `shutdown`, `try_clone` (handles share one connection; it closes when
//! the last handle is dropped), and [`AsRawFd`] for `poll(2)`, `epoll(7)`,
//! mio or tokio: the descriptor is readable when a read would not block
//! and writable when a write would not.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp::cm;

use crate::conn::{self, Conn, Stats};
use crate::flow::Shutdown;
use crate::held::{AcceptSet, Step};
use crate::options::Options;

struct Shared {
    conn: Arc<Conn>,
    nonblocking: AtomicBool,
    read_timeout: Mutex<Option<Duration>>,
    write_timeout: Mutex<Option<Duration>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.conn.close();
    }
}

/// A connected rsockets byte stream over iWARP.
#[derive(Clone)]
pub struct Stream {
    s: Arc<Shared>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("local", &self.s.conn.local_addr())
            .field("peer", &self.s.conn.peer_addr())
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// The deadline a blocking call's timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO`)
/// gives from now; none for a non-blocking call, which never waits, so
/// that a program spinning on `EAGAIN` does not read the clock and a
/// mutex on every call.
fn deadline(nonblocking: bool, t: &Mutex<Option<Duration>>) -> Option<Instant> {
    if nonblocking {
        return None;
    }
    t.lock()
        .unwrap_or_else(|e| e.into_inner())
        .map(|d| Instant::now() + d)
}

impl Stream {
    /// Connects to an rsockets (or `iwarp-sockets`) listener with the
    /// default [`Options`].
    pub fn connect(addr: SocketAddr) -> io::Result<Stream> {
        Stream::connect_with(addr, &Options::default())
    }

    /// Connects with these options.
    pub fn connect_with(addr: SocketAddr, opts: &Options) -> io::Result<Stream> {
        conn::connect(addr, opts).map(Stream::from_conn)
    }

    /// The TCP congestion-control algorithm of the stream's TCP
    /// connection (getsockopt `TCP_CONGESTION`), for logs.
    pub fn tcp_congestion(&self) -> io::Result<String> {
        self.s.conn.tcp_congestion()
    }

    /// Change the TCP congestion control of the live stream: what
    /// `setsockopt(IPPROTO_TCP, TCP_CONGESTION, name)` does on a kernel
    /// TCP socket (tcp(7)), applied to the TCP connection below the
    /// stream. `name` is checked first (`InvalidInput`: not a name, or
    /// longer than 15 bytes); an algorithm the kernel lacks is `NotFound`
    /// (`ENOENT`), with a message naming
    /// /proc/sys/net/ipv4/tcp_available_congestion_control.
    pub fn set_tcp_congestion(&self, name: &str) -> io::Result<()> {
        let cc: iwarp::cm::CongestionControl = name
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.s.conn.set_tcp_congestion(&cc)
    }

    fn from_conn(conn: Arc<Conn>) -> Stream {
        Stream {
            s: Arc::new(Shared {
                conn,
                nonblocking: AtomicBool::new(false),
                read_timeout: Mutex::new(None),
                write_timeout: Mutex::new(None),
            }),
        }
    }

    /// Another handle to the same connection (`dup`).
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(self.clone())
    }

    /// Non-blocking mode for every handle of this connection: reads and
    /// writes that would wait return `WouldBlock`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.s.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether non-blocking mode is on.
    pub fn is_nonblocking(&self) -> bool {
        self.s.nonblocking.load(Ordering::Relaxed)
    }

    /// `SO_RCVTIMEO` (`None`: wait forever). A zero duration is refused,
    /// as by `TcpStream`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a zero read timeout is not allowed; use None for no timeout",
            ));
        }
        *self
            .s
            .read_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = t;
        Ok(())
    }

    /// `SO_SNDTIMEO` (`None`: wait forever).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a zero write timeout is not allowed; use None for no timeout",
            ));
        }
        *self
            .s
            .write_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = t;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        *self
            .s
            .read_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        *self
            .s
            .write_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The local address of the underlying TCP connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.s
            .conn
            .local_addr()
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.s
            .conn
            .peer_addr()
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// `rshutdown`: `Write` sends `RS_CTRL_SHUTDOWN` (the peer reads end
    /// of stream), `Both` sends `RS_CTRL_DISCONNECT`.
    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        self.s.conn.shutdown(match how {
            std::net::Shutdown::Read => Shutdown::Read,
            std::net::Shutdown::Write => Shutdown::Write,
            std::net::Shutdown::Both => Shutdown::Both,
        })
    }

    /// Reads like `recv(2)`: at most `buf.len()` bytes, 0 at end of stream.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let nb = self.is_nonblocking();
        self.s
            .conn
            .read(buf, nb, deadline(nb, &self.s.read_timeout))
    }

    /// Reads without blocking, whatever the mode (`MSG_DONTWAIT`).
    pub fn recv_nonblocking(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.s.conn.read(buf, true, None)
    }

    /// Writes like `send(2)`: a blocking stream sends all of `buf`.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let nb = self.is_nonblocking();
        self.s
            .conn
            .write(buf, nb, deadline(nb, &self.s.write_timeout))
    }

    /// Writes without blocking, whatever the mode (`MSG_DONTWAIT`).
    pub fn send_nonblocking(&self, buf: &[u8]) -> io::Result<usize> {
        self.s.conn.write(buf, true, None)
    }

    /// Whether a read would not block now (data, end of stream or error).
    pub fn poll_read_ready(&self) -> bool {
        self.s.conn.poll_read()
    }

    /// Whether a write would not block now.
    pub fn poll_write_ready(&self) -> bool {
        self.s.conn.poll_write()
    }

    /// Bytes readable now (`FIONREAD`).
    pub fn bytes_readable(&self) -> u64 {
        self.s.conn.bytes_readable()
    }

    /// Watermark callbacks for asynchronous use: `cb(Watermark::Readable)`
    /// once at least `rcvlowat` bytes can be read (or the stream ended or
    /// failed), `cb(Watermark::Writable)` once at least `sndlowat` bytes
    /// of send buffer are free (or writes would fail). Each fires once per
    /// crossing of its watermark, from the library's progress thread or
    /// from inside a stream call, never with the stream locked, so the
    /// callback may read or write. `None` removes it.
    pub fn set_watermarks(
        &self,
        rcvlowat: usize,
        sndlowat: usize,
        cb: Option<crate::conn::WatermarkFn>,
    ) {
        self.s
            .conn
            .set_watermarks(rcvlowat as u64, sndlowat.min(u32::MAX as usize) as u32, cb);
    }

    /// (readable, writable, broken) now, from the stream's state
    /// ([`crate::poll`]).
    pub(crate) fn poll_state(&self) -> (bool, bool, bool) {
        self.s.conn.poll_state()
    }

    /// The completion queue, if the stream is in busy-poll mode (a
    /// waiting thread does its receive work, [`crate::poll`]).
    pub(crate) fn busy_poll_cq(&self) -> Option<&iwarp::CompletionQueue> {
        self.s.conn.busy_poll_cq()
    }

    /// This connection's counters.
    pub fn stats(&self) -> Stats {
        self.s.conn.stats()
    }

    /// The options the stream was made with.
    pub fn options(&self) -> &Options {
        self.s.conn.options()
    }

    /// `riomap(PROT_WRITE)`: maps a new zeroed buffer of `len` bytes for
    /// the peer's `riowrite` at `offset` (`None`: at the buffer's address,
    /// rsocket.c's offset -1) and announces it (an RDMA Write of its
    /// `rs_iomap` entry into the peer's table, then `RS_OP_IOMAP_SGL`).
    /// The peer's writes land straight in the buffer (zero copy); it is
    /// told nothing, so the two programs agree on their own how completion
    /// is signalled (a marker byte as `riostream` does, or a message after
    /// the writes). Dropping the [`IoMap`](crate::IoMap) unmaps it.
    ///
    /// Errors: `OutOfMemory` (`ENOMEM`) when the peer advertised no free
    /// iomap entry (it sets `RDMA_IOMAPSIZE` / [`Options::iomap_size`]),
    /// `InvalidInput` for 0 bytes or 4 GiB and more, `ConnectionReset` on a
    /// broken stream.
    pub fn riomap(&self, len: usize, offset: Option<u64>) -> io::Result<crate::IoMap> {
        self.s.conn.riomap(len, offset)
    }

    /// `riomap(PROT_WRITE)` of the caller's own memory (the C API's
    /// `riomap`); returns the offset. Unmap with [`Stream::riounmap_raw`].
    ///
    /// # Safety
    /// `buf` must be valid for reads and writes of `len` bytes until
    /// `riounmap_raw(buf, len)` returns or the last handle to the stream is
    /// dropped, and no Rust reference to that memory may exist meanwhile:
    /// the peer writes into it at any time.
    #[allow(unsafe_code)]
    pub unsafe fn riomap_raw(
        &self,
        buf: *mut u8,
        len: usize,
        offset: Option<u64>,
    ) -> io::Result<u64> {
        // SAFETY: forwarded from the caller.
        unsafe { self.s.conn.riomap_raw(buf, len, offset) }
    }

    /// `riounmap(buf, len)` of a [`Stream::riomap_raw`] mapping: the memory
    /// is deregistered before this returns (the peer's next write there
    /// ends the connection with a Terminate). `InvalidInput` if there is no
    /// such mapping.
    pub fn riounmap_raw(&self, buf: *mut u8, len: usize) -> io::Result<()> {
        self.s.conn.riounmap_raw(buf, len)
    }

    /// `riowrite`: writes `buf` into the peer's mapped memory at `offset`,
    /// straight from `buf` (zero copy on both sides), without a message
    /// (as rsocket.c). The whole range must lie in the peer's mappings:
    /// otherwise `InvalidInput` (`EINVAL`) and nothing is written. A
    /// blocking stream writes everything; a non-blocking one what the send
    /// queue takes now (`WouldBlock` if nothing).
    pub fn riowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let nb = self.is_nonblocking();
        self.s
            .conn
            .riowrite(buf, offset, nb, deadline(nb, &self.s.write_timeout))
    }

    /// `riowrite` without blocking, whatever the mode (`MSG_DONTWAIT`).
    pub fn riowrite_nonblocking(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.s.conn.riowrite(buf, offset, true, None)
    }

    /// The peer's mappings announced so far: `(offset, length)`.
    pub fn peer_iomaps(&self) -> Vec<(u64, u32)> {
        self.s.conn.peer_iomaps()
    }
}

impl AsRawFd for Stream {
    /// The readiness descriptor (see the `ready` module): poll it, never read
    /// or write it.
    fn as_raw_fd(&self) -> RawFd {
        self.s.conn.readiness_fd()
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        // One copy out of the ring per buffer; stops at the first short one.
        let mut total = 0;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            let r = if total == 0 {
                self.recv(b)
            } else {
                match self.recv_nonblocking(b) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    r => r,
                }
            };
            let n = match r {
                Ok(n) => n,
                Err(e) if total > 0 => {
                    let _ = e;
                    break;
                }
                Err(e) => return Err(e),
            };
            total += n;
            if n < b.len() {
                break;
            }
        }
        Ok(total)
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            match self.send(b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if total > 0 => {
                    let _ = e;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Nothing is held back for long: a coalesced message leaves as soon
        // as the data before it has.
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (&*self).read_vectored(bufs)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A listening rsockets endpoint.
///
/// On the software provider `accept` never waits on one client: a
/// connection whose MPA Request has not fully arrived is held (at most
/// [`MAX_HELD`](crate::MAX_HELD), each until [`Options::connect_timeout`])
/// while `accept` serves whichever connection is complete first; see
/// the `held` module.
pub struct Listener {
    /// The held connections and the epoll set over them and the
    /// listening socket (software provider; `None` on a kernel device,
    /// whose kernel does the MPA exchange off our accept path).
    set: Option<AcceptSet>,
    cm: cm::Listener,
    opts: Options,
    nonblocking: AtomicBool,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.cm.local_addr())
            .field("held", &self.set)
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` with the default [`Options`] (port 0: any free).
    pub fn bind(addr: SocketAddr) -> io::Result<Listener> {
        Listener::bind_with(addr, &Options::default())
    }

    /// Listens with these options (they apply to every accepted stream;
    /// [`Options::congestion`] is set on the listening socket too, so
    /// connections inherit it from their first byte).
    /// [`Options::connect_timeout`] is also how long an accepted
    /// connection may take to send its MPA Request.
    pub fn bind_with(addr: SocketAddr, opts: &Options) -> io::Result<Listener> {
        let cm = cm::Listener::bind(addr, opts.mpa.clone()).map_err(conn::cm_err)?;
        if let Some(cc) = &opts.congestion {
            cm.set_congestion(cc).map_err(conn::cm_err)?;
        }
        let set = if cm.device_name() == "soft" {
            Some(AcceptSet::new(cm.as_raw_fd(), opts.connect_timeout)?)
        } else {
            None
        };
        Ok(Listener {
            set,
            cm,
            opts: opts.clone(),
            nonblocking: AtomicBool::new(false),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.cm.local_addr())
    }

    /// Non-blocking `accept`: `WouldBlock` when no connection waits.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Accepts the next rsockets connection. Connections that are not
    /// (bad MPA Request, private data that is not an `rs_conn_data`) are
    /// refused, logged and skipped. On the software provider it returns
    /// the first connection whose MPA Request is complete: a client that
    /// connects and stays silent (or sends part of its Request) is held,
    /// and closed after [`Options::connect_timeout`], without delaying
    /// the others; a non-blocking `accept` returns `WouldBlock` without
    /// waiting on any client.
    pub fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        loop {
            let nb = self.nonblocking.load(Ordering::Relaxed);
            let req = match &self.set {
                Some(set) => {
                    let (tcp, peer) = Listener::next_complete(set, nb)?;
                    // The Request is complete: this reads it at once. Any
                    // failure here is this client's (a reset, a bad
                    // Request): skip it.
                    match cm::request_from_stream(tcp, &self.opts.mpa, self.opts.connect_timeout) {
                        Ok(r) => Ok(r),
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "refused a connection that is not a valid MPA client");
                            continue;
                        }
                    }
                }
                None => {
                    if nb && crate::ready::fd_now(self.cm.as_raw_fd(), libc::POLLIN) == 0 {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    match self.cm.get_request(Some(if nb {
                        self.opts.connect_timeout
                    } else {
                        Duration::from_secs(365 * 24 * 3600)
                    })) {
                        Err(cm::CmError::Timeout { .. }) if nb => {
                            return Err(io::ErrorKind::WouldBlock.into())
                        }
                        r => r,
                    }
                }
            };
            let req = match req {
                Ok(r) => r,
                Err(
                    e @ (cm::CmError::Mpa { .. }
                    | cm::CmError::Closed { .. }
                    | cm::CmError::Timeout { .. }),
                ) => {
                    tracing::warn!(error = %e, "refused a connection that is not a valid MPA client");
                    continue;
                }
                Err(e) => return Err(conn::cm_err(e)),
            };
            let peer = req.peer_addr();
            // The setup does not wait on the client: the MPA Reply (a few
            // dozen bytes into an empty send buffer) leaves at once, and
            // the Responder's hold until the first FPDU (RFC 5044 §7.1.2)
            // holds the queue pair's transmit, not this call; the whole is
            // bounded by `connect_timeout` anyway.
            match conn::accept(req, &self.opts) {
                Ok(c) => return Ok((Stream::from_conn(c), peer)),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    tracing::warn!(error = %e, "refused a connection");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "accept failed");
                    continue;
                }
            }
        }
    }

    /// The next connection of `set` whose MPA Request is complete: waits
    /// for it unless `nb` (then `WouldBlock`), never on one client.
    fn next_complete(set: &AcceptSet, nb: bool) -> io::Result<(std::net::TcpStream, SocketAddr)> {
        loop {
            match set.step()? {
                Step::Ready(tcp, peer) => return Ok((tcp, peer)),
                Step::Wait(_) if nb => return Err(io::ErrorKind::WouldBlock.into()),
                Step::Wait(until) => set.wait(until)?,
            }
        }
    }

    /// Accepts a connection that arrived elsewhere (a shared port) and
    /// whose first bytes are an MPA Request: reads it and accepts it.
    pub fn accept_tcp(stream: std::net::TcpStream, opts: &Options) -> io::Result<Stream> {
        let req = cm::request_from_stream(stream, &opts.mpa, opts.connect_timeout)
            .map_err(conn::cm_err)?;
        Listener::accept_request(req, opts)
    }

    /// Accepts a connection request taken elsewhere (an
    /// `iwarp::cm::Listener` of the caller's, or
    /// `iwarp::cm::request_from_stream`) as a stream: the queue pair, the
    /// rings' registration and the MPA Reply, bounded by
    /// `opts.connect_timeout`. For servers that take requests on one
    /// thread and set streams up on others, so that a slow or silent peer
    /// delays nobody else. A request whose private data is not an
    /// `rs_conn_data` is rejected (`InvalidData`).
    pub fn accept_request(req: cm::ConnRequest, opts: &Options) -> io::Result<Stream> {
        conn::accept(req, opts).map(Stream::from_conn)
    }
}

/// Whether a failed [`Stream::connect_with`] never had a TCP connection
/// (refused, unreachable, or a handshake that did not complete in time:
/// `iwarp::cm::CmError::no_tcp`), as opposed to a peer that completed
/// TCP and then did not speak MPA. Only the second says the peer is a
/// plain TCP server; the first is the path or the host, and falling back
/// to plain TCP for it would misread a lost SYN. `Some` carries the errno
/// connect(2) gives for it (`ECONNREFUSED`, the kernel's own, or
/// `ETIMEDOUT`).
pub fn never_reached_tcp(e: &io::Error) -> Option<i32> {
    let cm = e.get_ref()?.downcast_ref::<cm::CmError>()?;
    if !cm.no_tcp() {
        return None;
    }
    Some(match cm {
        cm::CmError::Refused { .. } => libc::ECONNREFUSED,
        cm::CmError::Connect { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::ETIMEDOUT,
    })
}

impl AsRawFd for Listener {
    /// Readable when `accept` has a connection to take: on the software
    /// provider an epoll descriptor over the listening TCP socket and the
    /// held connections (a held connection counts once its MPA Request is
    /// complete, or it closed); on a kernel device the rdma_cm event
    /// channel. Poll it; never read, accept on or close it.
    fn as_raw_fd(&self) -> RawFd {
        match &self.set {
            Some(set) => set.fd(),
            None => self.cm.as_raw_fd(),
        }
    }
}
