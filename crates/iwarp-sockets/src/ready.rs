//! The descriptor an application polls for a stream.
//!
//! A stream's state lives in user space (the [`Flow`](crate::flow::Flow)
//! and its rings), so no kernel object becomes readable when data arrives.
//! To let `poll(2)`, `select(2)`, `epoll(7)`, mio and tokio wait for a
//! stream like for a socket, each stream owns a connected `AF_UNIX`
//! socket pair whose poll state the library sets to match the stream:
//!
//! - **readable** (`POLLIN`): one byte sent from our end (`ctl`) into the
//!   application's end (`app`); read back out of `app` to clear it;
//! - **not writable** (no `POLLOUT`): bytes sent from `app` into `ctl`
//!   until the send buffer of `app` is full (its send buffer is made as
//!   small as the kernel allows, so that takes a few kilobytes); drained
//!   from `ctl` to make it writable again.
//!
//! So every combination is exact, each change is a real wake-up (edge-
//! triggered epoll and tokio see it), and `fstat` on the descriptor says
//! "socket". The application never reads or writes the pair itself: the
//! socket calls on a stream go to the library (through the Rust API, the C
//! API or the preload shim).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The readiness pair of one stream.
#[derive(Debug)]
pub(crate) struct Readiness {
    app: UnixStream,
    ctl: UnixStream,
    /// (readable, writable) as the pair shows it now.
    shown: Mutex<(bool, bool)>,
    /// Somebody asked for the descriptor: keep it in step from now on.
    /// Until then `show` costs nothing (no system calls), which matters
    /// for programs that only read and write.
    armed: AtomicBool,
}

impl Readiness {
    /// A pair that shows "writable, not readable".
    pub(crate) fn new() -> io::Result<Readiness> {
        let (app, ctl) = UnixStream::pair()?;
        app.set_nonblocking(true)?;
        ctl.set_nonblocking(true)?;
        // The kernel raises this to its minimum (SOCK_MIN_SNDBUF).
        socket2::SockRef::from(&app).set_send_buffer_size(1)?;
        Ok(Readiness {
            app,
            ctl,
            shown: Mutex::new((false, true)),
            armed: AtomicBool::new(false),
        })
    }

    /// The descriptor the application polls; from now on `show` keeps it
    /// in step (the caller then calls `show` with the current state).
    pub(crate) fn fd(&self) -> RawFd {
        self.armed.store(true, Ordering::Release);
        self.app.as_raw_fd()
    }

    /// Makes the pair show `readable` / `writable` (once armed by `fd`).
    pub(crate) fn show(&self, readable: bool, writable: bool) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if shown.0 != readable {
            if readable {
                let _ = (&self.ctl).write(&[1]);
            } else {
                drain(&self.app);
            }
            shown.0 = readable;
        }
        if shown.1 != writable {
            if writable {
                drain(&self.ctl);
            } else {
                // Fill the small send buffer; bounded (it takes a few
                // writes of this size).
                let junk = [0u8; 512];
                for _ in 0..256 {
                    if (&self.app).write(&junk).is_err() {
                        break;
                    }
                }
            }
            shown.1 = writable;
        }
    }
}

/// The events of one descriptor now (a zero-timeout check through
/// `iwarp::wait::WaitSet`): `POLLIN` / `POLLOUT` of those in `events`; 0
/// if none (or on an error).
pub(crate) fn fd_now(fd: RawFd, events: i16) -> i16 {
    use iwarp::wait::{Interest, Token, Until, WaitSet, Wake};
    let want = match (events & libc::POLLIN != 0, events & libc::POLLOUT != 0) {
        (true, true) => Interest::BOTH,
        (true, false) => Interest::READABLE,
        (false, true) => Interest::WRITABLE,
        (false, false) => return 0,
    };
    let mut set = WaitSet::new();
    set.add_fd(fd, want, Token(0));
    match set.wait(Until::Deadline(std::time::Instant::now())) {
        Ok(Wake::Ready(ev)) => {
            ev.iter().fold(0, |r, e| {
                r | if e.readable { libc::POLLIN } else { 0 }
                    | if e.writable { libc::POLLOUT } else { 0 }
            }) & events
        }
        _ => 0,
    }
}

fn drain(mut s: &UnixStream) {
    let mut buf = [0u8; 4096];
    for _ in 0..1024 {
        match s.read(&mut buf) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(fd: RawFd) -> (bool, bool) {
        let rev = fd_now(fd, libc::POLLIN | libc::POLLOUT);
        (rev & libc::POLLIN != 0, rev & libc::POLLOUT != 0)
    }

    #[test]
    fn every_combination_shows_exactly() {
        let r = Readiness::new().unwrap();
        assert_eq!(polled(r.fd()), (false, true));
        for (rd, wr) in [
            (true, true),
            (true, false),
            (false, false),
            (false, true),
            (true, false),
            (false, true),
        ] {
            r.show(rd, wr);
            assert_eq!(
                polled(r.fd()),
                (rd, wr),
                "shown readable={rd} writable={wr}"
            );
        }
    }
}
