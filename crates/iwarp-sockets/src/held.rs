//! The software provider's accept path for [`crate::Listener`]: `accept`
//! returns the next connection whose MPA Request is complete, whatever
//! silent or slow clients came before it (issue 26, item 1's rule for
//! every listener: no remote peer stalls `accept`).
//!
//! `iwarp::cm::Listener::get_request` accepts one TCP connection and then
//! reads its MPA Request, waiting on that one client; a client that
//! connects and sends nothing (or half of the 16-byte key) held every
//! later `accept` for as long as the caller's timeout (a year, for a
//! blocking `accept`). Here the listening socket is accepted from
//! directly, and a connection whose Request has not fully arrived is
//! *held* in a bounded set, each with a deadline:
//!
//! - RFC 5044 §7.1: the Request is a 20-byte header (the key, flags,
//!   revision, `PD_Length`) and `PD_Length` bytes of private data (at most
//!   512). A held socket's `SO_RCVLOWAT` is the number of bytes the Request
//!   still lacks to be known complete (20, then 20 + `PD_Length`), so it
//!   polls readable only when the Request is complete, or the client
//!   closed or failed: no polling a half-sent key on a timer, and one
//!   wake-up per step of the Request.
//! - One epoll descriptor holds the listening socket and the held
//!   sockets (level-triggered): it is readable exactly when `accept` has
//!   something to do, so it is the listener's [`AsRawFd`] (for `poll(2)`,
//!   `rpoll`, mio or tokio on a non-blocking listener: a Request that
//!   completes after a non-blocking `accept` returned `WouldBlock` wakes
//!   the program like a new connection does), and a blocking `accept`
//!   waits on it through an [`iwarp::wait::WaitSet`], until the earliest
//!   held deadline.
//! - A complete Request is handed, with its socket, to
//!   `iwarp::cm::request_from_stream`, which then reads it at once.
//! - Bounds: at most [`MAX_HELD`] connections are held; one more drops
//!   the **oldest** (logged), so a flood of silent clients cannot lock
//!   out a good client that connects after it. Each held connection is
//!   closed (logged) when its deadline (the listener's
//!   `Options::connect_timeout`, 5 s by default) passes: by the blocking
//!   `accept` that waits, or by the next `accept` call of a non-blocking
//!   listener (whose program is woken by the next connection or Request).
//!
//! This is the crate's other system-call edge (beside [`crate::sys`]'s
//! memory registration): `epoll_create1`, `epoll_ctl` and `SO_RCVLOWAT`
//! have no safe wrapper in std or socket2, and the listening descriptor
//! is borrowed from the `iwarp::cm::Listener` that owns it.
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use iwarp::wait::{Interest, Token, Until, WaitSet, Wake};
use iwarp_proto::handshake;
use iwarp_proto::wire::mpa;

/// At most this many accepted connections wait for their MPA Request; one
/// more closes the oldest of them.
pub const MAX_HELD: usize = 64;

/// Connections taken from the listening socket's queue per step at most,
/// so that one call does a bounded amount of work under a flood.
const ACCEPTS_PER_STEP: usize = 32;

/// The largest MPA Request (RFC 5044 §7.1): header and private data.
const MAX_REQUEST: usize = mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA_LEN;

/// An accepted connection whose MPA Request is not complete yet.
struct Held {
    sock: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    /// The socket's `SO_RCVLOWAT`: the bytes the Request needs.
    lowat: usize,
}

/// What one look at the listener found.
pub(crate) enum Step {
    /// A connection whose MPA Request is complete (or whose first 20 bytes
    /// are no MPA header: the Request's reader refuses it at once).
    Ready(TcpStream, SocketAddr),
    /// Nothing to accept now; the earliest held deadline, if any.
    Wait(Option<Instant>),
}

/// The listening socket, the held connections and their epoll set.
pub(crate) struct AcceptSet {
    listener: TcpListener,
    ep: OwnedFd,
    held: Mutex<Vec<Held>>,
    limit: Duration,
}

impl std::fmt::Debug for AcceptSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptSet")
            .field("epoll", &self.ep.as_raw_fd())
            .field("held", &self.lock().len())
            .finish()
    }
}

fn epoll_ctl(ep: RawFd, op: libc::c_int, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: `ev` is a valid event for the call; `ep` is our epoll
    // descriptor and `fd` an open socket of ours.
    if unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_lowat(sock: &TcpStream, n: usize) -> io::Result<()> {
    let v = n.clamp(1, MAX_REQUEST) as libc::c_int;
    // SAFETY: a valid int option of an open socket.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How much of the MPA Request has arrived on `sock` (never waits).
enum Look {
    /// Complete (or not an MPA header at all: handed over to be refused).
    Complete,
    /// The Request needs this many bytes in all, and fewer are there.
    Need(usize),
    /// Closed by the client, or failed, before the Request was complete.
    Gone(Option<io::Error>),
}

fn look(sock: &TcpStream) -> Look {
    let mut buf = [0u8; MAX_REQUEST];
    let n = match sock.peek(&mut buf) {
        Ok(0) => return Look::Gone(None),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
        Err(e) => return Look::Gone(Some(e)),
    };
    if n < mpa::HEADER_LEN {
        return Look::Need(mpa::HEADER_LEN);
    }
    match handshake::frame_len(&buf[..n]) {
        Ok(total) if n < total => Look::Need(total),
        _ => Look::Complete,
    }
}

impl AcceptSet {
    /// The set over the listening socket `lfd`, which the caller's
    /// `iwarp::cm::Listener` owns; connections wait at most `limit` for
    /// their Request. The listening socket is made non-blocking (its
    /// `get_request` is not used any more on it).
    pub(crate) fn new(lfd: RawFd, limit: Duration) -> io::Result<AcceptSet> {
        // SAFETY: `lfd` is the open listening socket of the caller's
        // `cm::Listener`, alive during this call; the borrow ends here with
        // a duplicate (F_DUPFD_CLOEXEC) that this set owns.
        let own = unsafe { BorrowedFd::borrow_raw(lfd) }.try_clone_to_owned()?;
        let listener = TcpListener::from(own);
        listener.set_nonblocking(true)?;
        // SAFETY: plain call.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a new descriptor nobody else owns.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, listener.as_raw_fd())?;
        Ok(AcceptSet {
            listener,
            ep,
            held: Mutex::new(Vec::new()),
            limit,
        })
    }

    /// The descriptor that is readable when [`AcceptSet::step`] has work.
    pub(crate) fn fd(&self) -> RawFd {
        self.ep.as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Out of the set and back to a plain socket for the Request's reader.
    fn release(&self, h: Held) -> Step {
        let _ = epoll_ctl(self.fd(), libc::EPOLL_CTL_DEL, h.sock.as_raw_fd());
        let _ = set_lowat(&h.sock, 1);
        Step::Ready(h.sock, h.peer)
    }

    /// Closes a held connection (the client sees the close).
    fn drop_held(&self, h: Held, why: &str) {
        let _ = epoll_ctl(self.fd(), libc::EPOLL_CTL_DEL, h.sock.as_raw_fd());
        let _ = h.sock.shutdown(std::net::Shutdown::Both);
        tracing::warn!(peer = %h.peer, "{why}; connection closed");
    }

    /// One look, never waiting: the held connections first (expired ones
    /// closed), then new connections from the listening socket's queue.
    pub(crate) fn step(&self) -> io::Result<Step> {
        let now = Instant::now();
        let mut held = self.lock();
        if !held.is_empty() {
            // Which held sockets poll readable: complete, closed or failed
            // (their SO_RCVLOWAT hides a partial Request).
            let mut set = WaitSet::new();
            for (i, h) in held.iter().enumerate() {
                set.add_fd(h.sock.as_raw_fd(), Interest::READABLE, Token(i));
            }
            let mut ready = vec![false; held.len()];
            if let Wake::Ready(events) = set.wait(Until::Deadline(now))? {
                for e in events {
                    ready[e.token.0] = true;
                }
            }
            let mut i = 0;
            let mut k = 0; // index into `ready`, which does not shrink
            while i < held.len() {
                let is_ready = ready[k];
                k += 1;
                if is_ready {
                    match look(&held[i].sock) {
                        Look::Complete => {
                            let h = held.remove(i);
                            return Ok(self.release(h));
                        }
                        Look::Need(n) if n != held[i].lowat => {
                            // The header is there: wait for the private data.
                            if let Err(e) = set_lowat(&held[i].sock, n) {
                                let h = held.remove(i);
                                self.drop_held(h, &format!("setting SO_RCVLOWAT: {e}"));
                                continue;
                            }
                            held[i].lowat = n;
                        }
                        Look::Need(_) => {
                            let h = held.remove(i);
                            self.drop_held(h, "client closed before its MPA Request was complete");
                            continue;
                        }
                        Look::Gone(e) => {
                            let h = held.remove(i);
                            let why = match e {
                                Some(e) => format!("connection failed before its MPA Request: {e}"),
                                None => "client closed before its MPA Request".to_owned(),
                            };
                            self.drop_held(h, &why);
                            continue;
                        }
                    }
                }
                if now >= held[i].deadline {
                    let h = held.remove(i);
                    let why = format!(
                        "no complete MPA Request within {:?} (Options::connect_timeout)",
                        self.limit
                    );
                    self.drop_held(h, &why);
                    continue;
                }
                i += 1;
            }
        }
        for _ in 0..ACCEPTS_PER_STEP {
            let (sock, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // accept(2)'s per-connection errors (RFC 793 resets before
                // the accept, ECONNABORTED): the next one may be fine.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if let Err(e) = sock.set_nonblocking(true) {
                tracing::warn!(%peer, error = %e, "making an accepted connection non-blocking; closed");
                continue;
            }
            let lowat = match look(&sock) {
                Look::Complete => {
                    return Ok(Step::Ready(sock, peer));
                }
                Look::Need(n) => n,
                Look::Gone(_) => {
                    tracing::debug!(%peer, "client closed before its MPA Request");
                    continue;
                }
            };
            if let Err(e) = set_lowat(&sock, lowat) {
                tracing::warn!(%peer, error = %e, "setting SO_RCVLOWAT; connection closed");
                continue;
            }
            if held.len() >= MAX_HELD {
                let oldest = held.remove(0);
                self.drop_held(
                    oldest,
                    &format!(
                        "{MAX_HELD} connections wait for their MPA Request; closed the oldest"
                    ),
                );
            }
            if let Err(e) = epoll_ctl(self.fd(), libc::EPOLL_CTL_ADD, sock.as_raw_fd()) {
                // ENOSPC: fs.epoll.max_user_watches reached.
                tracing::warn!(%peer, error = %e, "adding a held connection to the epoll set; closed");
                continue;
            }
            tracing::debug!(%peer, held = held.len() + 1, "MPA Request not complete yet: held");
            held.push(Held {
                sock,
                peer,
                deadline: now + self.limit,
                lowat,
            });
        }
        Ok(Step::Wait(held.iter().map(|h| h.deadline).min()))
    }

    /// Waits until the set's descriptor is readable or `until` (the
    /// earliest held deadline) passes.
    pub(crate) fn wait(&self, until: Option<Instant>) -> io::Result<()> {
        let mut set = WaitSet::new();
        set.add_fd(self.fd(), Interest::READABLE, Token(0));
        set.wait(until.map_or(Until::Forever, Until::Deadline))?;
        Ok(())
    }
}
