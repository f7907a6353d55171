//! The process-wide progress thread of the socket library.
//!
//! The software provider's receive threads place data and queue
//! completions; somebody must then feed those completions to each
//! stream's [`Flow`](crate::flow::Flow) — repost receives, return credits,
//! release send-buffer space — and update the stream's readiness
//! descriptor, even while the application is blocked elsewhere (in
//! `epoll_wait` on other descriptors, or computing). Mostly the provider
//! thread that queued them does it (the completion hook); when the hook
//! declines (the stream is locked, or has watermark callbacks), the CQ's
//! descriptor becomes readable and this thread does it: one per process,
//! sleeping in one [`WaitSet`] over the completion-queue descriptors of
//! every live stream and its own wake descriptor, with the next keepalive
//! tick as the deadline. It never sleeps in slices: registering or
//! removing a stream, and handing a parked stream back, write to the wake
//! descriptor, and the thread rebuilds its set.
//!
//! Application threads that block in `read`/`write` sleep on the stream's
//! completion queue themselves (`conn/call.rs`); when this thread wakes
//! for a stream such a thread waits on, it *parks* the stream (leaves its
//! descriptor out of the set, which stays readable until that thread
//! drains) instead of polling it in a loop, and the stream comes back
//! when completions are left that nobody else will take (`Conn::unpark`:
//! the hook declined, or a call ended with completions queued). A stream
//! in busy-poll mode is drained by its own polling thread, and this thread
//! leaves it alone while one polls.
//!
//! The thread also sends keepalives for streams that asked for them
//! (`SO_KEEPALIVE`), every [`KEEPALIVE_TICK`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use iwarp::wait::{Interest, Token, Until, WaitSet, Wake};

use crate::conn::Conn;

/// How often idle streams with keepalive on are probed.
pub const KEEPALIVE_TICK: Duration = Duration::from_secs(10);

/// The token of the wake descriptor; a stream's is its id (never 0).
const WAKE: Token = Token(0);

struct Progress {
    /// The process that started the thread: a child after `fork` has no
    /// such thread, so it starts its own (see [`get`]).
    pid: u32,
    /// The streams watched, by id: the stream and its CQ descriptor.
    conns: Mutex<HashMap<usize, (Weak<Conn>, RawFd)>>,
    /// Written to wake the thread (the set changed); the thread reads the
    /// other end.
    wake: UnixStream,
}

impl Progress {
    /// Wake the thread so that it rebuilds its set.
    fn wake(&self) {
        // A full pair is readable already: nothing is lost.
        let _ = (&self.wake).write(&[1]);
    }
}

static PROGRESS: Mutex<Option<Arc<Progress>>> = Mutex::new(None);

/// The progress thread of this process, started on first use, and again in
/// a child process after `fork` (threads do not survive `fork`; the
/// parent's streams stay the parent's, and the child's new ones are
/// watched by the child's own thread).
fn get() -> Result<Arc<Progress>, std::io::Error> {
    let mut g = PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some(p) = g.as_ref().filter(|p| p.pid == pid) {
        return Ok(p.clone());
    }
    let start = || -> Result<Arc<Progress>, String> {
        let (wake, woken) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
        wake.set_nonblocking(true)
            .and_then(|()| woken.set_nonblocking(true))
            .map_err(|e| format!("O_NONBLOCK on the wake pair: {e}"))?;
        let p = Arc::new(Progress {
            pid,
            conns: Mutex::new(HashMap::new()),
            wake,
        });
        let weak = Arc::downgrade(&p);
        std::thread::Builder::new()
            .name("iwarp-sockets-progress".into())
            .spawn(move || run(woken, weak))
            .map_err(|e| format!("spawning the progress thread: {e}"))?;
        Ok(p)
    };
    let p = start().map_err(|e| {
        std::io::Error::other(format!(
            "the socket library's progress thread could not start ({e}); raise the process's \
             thread or descriptor limit"
        ))
    })?;
    *g = Some(p.clone());
    Ok(p)
}

/// Watches `conn`'s completion queue descriptor `fd` from now on.
pub(crate) fn register(conn: &Arc<Conn>, fd: RawFd) -> std::io::Result<()> {
    let p = get()?;
    p.conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(conn.id(), (Arc::downgrade(conn), fd));
    p.wake();
    Ok(())
}

/// Stops watching (the stream is closing; `fd` stays open until the
/// stream is dropped).
pub(crate) fn deregister(id: usize) {
    if let Ok(p) = get() {
        p.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        p.wake();
    }
}

/// A parked stream is to be watched again (`Conn::unpark`).
pub(crate) fn resume() {
    if let Ok(p) = get() {
        p.wake();
    }
}

fn run(woken: UnixStream, me: Weak<Progress>) {
    let mut set = WaitSet::new();
    let mut rebuild = true;
    let mut ready: Vec<Token> = Vec::new();
    let mut next_tick = Instant::now() + KEEPALIVE_TICK;
    loop {
        let Some(p) = me.upgrade() else { return };
        if rebuild {
            rebuild = false;
            set.clear();
            set.add_fd(woken.as_raw_fd(), Interest::READABLE, WAKE);
            for (id, (conn, fd)) in p.conns.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                if conn
                    .upgrade()
                    .is_some_and(|c| !c.parked.load(Ordering::SeqCst))
                {
                    set.add_fd(*fd, Interest::READABLE, Token(*id));
                }
            }
        }
        drop(p);
        ready.clear();
        match set.wait(Until::Deadline(next_tick)) {
            Ok(Wake::Ready(events)) => ready.extend(events.iter().map(|e| e.token)),
            Ok(Wake::Timeout) => {}
            Err(e) => {
                // poll(2) itself failed (ENOMEM): say so, and do not spin
                // on the failure.
                tracing::error!(error = %e, "progress thread: poll(2) failed; raise the memory limit");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let Some(p) = me.upgrade() else { return };
        for &token in &ready {
            if token == WAKE {
                let mut buf = [0u8; 64];
                while matches!((&woken).read(&mut buf), Ok(n) if n > 0) {}
                rebuild = true;
                continue;
            }
            let conn = p
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&token.0)
                .and_then(|(c, _)| c.upgrade());
            match conn {
                Some(c) => {
                    if !c.progress() {
                        // Parked: its descriptor stays readable until the
                        // waiting thread drains; leave it out meanwhile.
                        set.remove(token);
                    }
                }
                // Gone (its descriptor may be closed or reused by now).
                None => set.remove(token),
            }
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + KEEPALIVE_TICK;
            let live: Vec<Arc<Conn>> = p
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .filter_map(|(c, _)| c.upgrade())
                .collect();
            for c in live {
                c.tick();
            }
        }
    }
}
