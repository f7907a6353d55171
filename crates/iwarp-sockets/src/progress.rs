//! The process-wide progress thread of the socket library.
//!
//! The software provider's receive threads place data and queue
//! completions; somebody must then feed those completions to each
//! stream's [`Flow`](crate::flow::Flow) — repost receives, return credits,
//! release send-buffer space — and update the stream's readiness
//! descriptor, even while the application is blocked elsewhere (in
//! `epoll_wait` on other descriptors, or computing). That is this thread:
//! one per process, waiting (edge-triggered, through mio) on the
//! completion-queue descriptors of every live stream. Application threads
//! that block in `read`/`write` sleep on the stream's condition variable,
//! which this thread (or any thread that drains completions) signals; a
//! stream in busy-poll mode is drained by its own polling thread, and this
//! thread leaves it alone while one polls.
//!
//! The thread also sends keepalives for streams that asked for them
//! (`SO_KEEPALIVE`), every [`KEEPALIVE_TICK`].

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};

use crate::conn::Conn;

/// How often idle streams with keepalive on are probed.
pub const KEEPALIVE_TICK: Duration = Duration::from_secs(10);

struct Progress {
    /// The process that started the thread: a child after `fork` has no
    /// such thread, so it starts its own (see [`get`]).
    pid: u32,
    registry: Registry,
    conns: Mutex<HashMap<usize, Weak<Conn>>>,
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
        let poll = Poll::new().map_err(|e| format!("epoll_create: {e}"))?;
        let registry = poll
            .registry()
            .try_clone()
            .map_err(|e| format!("epoll dup: {e}"))?;
        let p = Arc::new(Progress {
            pid,
            registry,
            conns: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&p);
        std::thread::Builder::new()
            .name("iwarp-sockets-progress".into())
            .spawn(move || run(poll, weak))
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
    let id = conn.id();
    p.conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, Arc::downgrade(conn));
    p.registry
        .register(&mut SourceFd(&fd), Token(id), Interest::READABLE)
}

/// Stops watching (the stream is closing; `fd` stays open until the
/// stream is dropped).
pub(crate) fn deregister(id: usize, fd: RawFd) {
    if let Ok(p) = get() {
        let _ = p.registry.deregister(&mut SourceFd(&fd));
        p.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

fn run(mut poll: Poll, me: Weak<Progress>) {
    let mut events = Events::with_capacity(256);
    let mut next_tick = Instant::now() + KEEPALIVE_TICK;
    loop {
        let timeout = next_tick.saturating_duration_since(Instant::now());
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "progress thread: epoll_wait failed");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        let Some(p) = me.upgrade() else { return };
        for ev in events.iter() {
            let conn = p
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&ev.token().0)
                .and_then(Weak::upgrade);
            if let Some(c) = conn {
                c.progress();
            }
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + KEEPALIVE_TICK;
            let live: Vec<Arc<Conn>> = p
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .filter_map(Weak::upgrade)
                .collect();
            for c in live {
                c.tick();
            }
        }
    }
}
