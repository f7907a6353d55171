//! `accept` on a blocking listener in a process that makes no streams
//! (issue 26 item 1: `accept` never waits on one client).
//!
//! Such a process (a child forked after its parent made a stream, or a
//! parent whose children used inherited streams: `attach::may_accept`)
//! closes its MPA clients so that each falls back with a new TCP
//! connection, and that close must come before the program sees the
//! connection: a connection handed over and found to be MPA later could
//! only be reset under the program, and a one-shot server (a child that
//! serves one client) would lose its only client. So the first bytes
//! (RFC 5044 §7.1: an MPA client's first 16 bytes are the Request key)
//! decide before `accept` returns a connection. Without waiting on any one
//! client: a connection whose client has sent nothing yet is *held* here,
//! and `accept` waits for whichever comes first, a new connection on the
//! listener or the first bytes (or the peek time) of a held one, as a
//! blocking `accept` waits for the next connection anyway. A silent client
//! costs a slot in that poll, never the other clients their turn.
//!
//! Held connections belong to the thread that accepted them (the thread
//! that calls `accept` again watches them); a non-blocking listener never
//! gets here (its program waits for readiness of the listener, which a
//! held connection's bytes do not give: the preload hands such a
//! connection over undecided instead).

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use iwarp_rsocket::attach::{classify_first_bytes, FirstBytes};
use iwarp_rsocket::real::real;

/// A connection accepted on `lfd` whose client has not said enough yet.
struct Held {
    pid: u32,
    lfd: RawFd,
    fd: RawFd,
    since: Instant,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// What decided a connection ([`next`] reports each one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Its first bytes are not an MPA Request: the program's.
    Plain,
    /// Nothing from the client within the peek time: the program's.
    Silent,
    /// An MPA Request: closed here (the client falls back).
    Mpa,
    /// Not a connection the preload takes over: the program's.
    NotWanted,
}

/// The first bytes of `fd` so far (never waits): the decision, and
/// whether some bytes of the key are there (then `fd` polls readable
/// while undecided).
fn look(fd: RawFd) -> (FirstBytes, bool) {
    let mut buf = [0u8; 16];
    // SAFETY: `buf` is valid for 16 bytes of writes.
    let n = unsafe {
        (real().recv)(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        // Closed before saying anything: the program sees the close.
        0 => (FirstBytes::Plain, false),
        n if n > 0 => (classify_first_bytes(&buf[..n as usize]), true),
        _ => match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => (FirstBytes::NeedMore, false),
            _ => (FirstBytes::Plain, false), // an error: the program's to see
        },
    }
}

fn close(fd: RawFd) {
    // SAFETY: a descriptor this module accepted and owns.
    unsafe { (real().close)(fd) };
}

/// The next connection on the blocking listener `lfd` that is not an MPA
/// client (see the module doc), accepted close-on-exec and blocking (the
/// caller sets the program's flags). `wanted` says whether a connection
/// is one the preload takes over; `report` hears each decision (an
/// `Seen::Mpa` connection is closed after it). Waits as a blocking
/// `accept` does; `Err` as `accept(2)` fails (`EINTR` on a signal).
pub fn next(
    lfd: RawFd,
    peek: Duration,
    mut wanted: impl FnMut(RawFd) -> bool,
    mut report: impl FnMut(RawFd, Seen),
) -> io::Result<RawFd> {
    let me = std::process::id();
    let r = real();
    loop {
        // The held connections of this listener, decided as far as they can be.
        let mut watch: Vec<libc::pollfd> = vec![libc::pollfd {
            fd: lfd,
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut wait_ms: libc::c_int = -1;
        let found = HELD.with(|h| -> Option<RawFd> {
            let mut h = h.borrow_mut();
            // Inherited through fork: the parent's thread watches them.
            h.retain(|c| {
                c.pid == me || {
                    close(c.fd);
                    false
                }
            });
            let mut i = 0;
            while i < h.len() {
                if h[i].lfd != lfd {
                    i += 1;
                    continue;
                }
                let (seen, partial) = look(h[i].fd);
                let age = h[i].since.elapsed();
                match seen {
                    FirstBytes::Plain => {
                        let c = h.remove(i);
                        report(c.fd, Seen::Plain);
                        return Some(c.fd);
                    }
                    FirstBytes::Mpa => {
                        let c = h.remove(i);
                        report(c.fd, Seen::Mpa);
                        close(c.fd);
                        continue;
                    }
                    FirstBytes::NeedMore if age >= peek => {
                        let c = h.remove(i);
                        report(c.fd, Seen::Silent);
                        return Some(c.fd);
                    }
                    FirstBytes::NeedMore => {
                        let left = (peek - age).as_millis().clamp(1, 1000) as libc::c_int;
                        // Part of the key there: the socket polls readable
                        // until the rest comes, so look again shortly.
                        let left = if partial { left.min(5) } else { left };
                        wait_ms = if wait_ms < 0 { left } else { wait_ms.min(left) };
                        if !partial {
                            watch.push(libc::pollfd {
                                fd: h[i].fd,
                                events: libc::POLLIN,
                                revents: 0,
                            });
                        }
                        i += 1;
                    }
                }
            }
            None
        });
        if let Some(fd) = found {
            return Ok(fd);
        }
        // SAFETY: `watch` is a valid array of its length for the call.
        let n = unsafe { (r.poll)(watch.as_mut_ptr(), watch.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            return Err(io::Error::last_os_error()); // EINTR: as accept(2)
        }
        if watch[0].revents == 0 {
            continue; // a held connection spoke, or its time passed
        }
        // SAFETY: plain call; null address arguments are allowed.
        let nfd = unsafe {
            (r.accept4)(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if nfd < 0 {
            return Err(io::Error::last_os_error());
        }
        if !wanted(nfd) {
            report(nfd, Seen::NotWanted);
            return Ok(nfd);
        }
        match look(nfd).0 {
            FirstBytes::Plain => {
                report(nfd, Seen::Plain);
                return Ok(nfd);
            }
            FirstBytes::Mpa => {
                report(nfd, Seen::Mpa);
                close(nfd);
            }
            FirstBytes::NeedMore => HELD.with(|h| {
                h.borrow_mut().push(Held {
                    pid: me,
                    lfd,
                    fd: nfd,
                    since: Instant::now(),
                })
            }),
        }
    }
}
