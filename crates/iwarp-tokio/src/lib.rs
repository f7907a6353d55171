//! Async verbs on tokio (issue 28: one reactor for every waiter).
//!
//! The verbs API blocks: [`CompletionQueue::wait_one`] sleeps on the CQ,
//! [`iwarp::cm::connect`] and [`Listener::get_request`] wait for the MPA
//! exchange. A program built on tokio wants none of that on its event loop.
//! This crate puts the CQ's descriptor ([`CompletionQueue::as_raw_fd`]) on
//! tokio's reactor and runs the connection manager's blocking steps on
//! tokio's blocking pool, so one event loop waits for completions,
//! connections and everything else the program does.
//!
//! - [`AsyncCq`]: `completion().await`, `completion_timeout(d).await`,
//!   `poll_completion(cx)`. In [`ProgressMode::AppDriven`] (the event loop
//!   does the receive work itself: no provider thread, no hand-off) the
//!   descriptor is an epoll set of the queue pairs' sockets and
//!   [`CompletionQueue::poll_one`] reads them; in
//!   [`ProgressMode::Threaded`] the provider's threads do the work and
//!   signal the CQ's eventfd.
//! - [`AsyncQpEvents`]: a queue pair's events ([`QueuePair::next_event`]:
//!   established, disconnected, a Terminate) as a future, on the QP's
//!   event descriptor ([`QueuePair::event_fd`]); a peer that disconnects
//!   while nothing is outstanding completes nothing, so this is how an
//!   event loop learns of it.
//! - [`connect`]: [`iwarp::cm::connect`] on the blocking pool.
//! - [`AsyncListener`]: waits for a connection on the reactor, then runs the
//!   accept and the MPA exchange (bounded by a handshake timeout) on the
//!   blocking pool, so a client that connects and stays silent holds one
//!   blocking-pool thread for at most that timeout, never the event loop.
//!
//! Everything works on both providers: the software one, and the
//! rdma-core one (kernel devices), whose CQ descriptor is the eventfd its
//! pump thread signals as it moves the device's completions into the
//! queue, and whose QP event descriptor is an eventfd of the QP's event
//! queue (`iwarp-rdmacore`'s `events.rs`). See docs/ASYNC.md.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use iwarp::cm::{self, CmError, ConnParam, ConnRequest, Listener};
use iwarp::{CompletionQueue, ProgressMode, QpEvent, QueuePair, WorkCompletion};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The CQ for the reactor; the handle keeps the descriptor open.
struct CqFd {
    cq: CompletionQueue,
    fd: RawFd,
}

impl AsRawFd for CqFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

/// A completion queue whose waits are futures on tokio's reactor.
pub struct AsyncCq {
    fd: AsyncFd<CqFd>,
}

impl std::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq")
            .field("fd", &self.fd.get_ref().fd)
            .finish()
    }
}

impl AsyncCq {
    /// Put `cq` on the reactor of the current tokio runtime, in progress
    /// mode `mode` (see the crate docs; `AppDriven` is the choice for an
    /// event loop that owns the queue pair). Call it inside a runtime,
    /// before the queue pairs connect, and do not change the CQ's mode
    /// afterwards: the descriptor it waits on depends on the mode.
    pub fn new(cq: CompletionQueue, mode: ProgressMode) -> io::Result<AsyncCq> {
        cq.set_progress(mode).map_err(|e| {
            io::Error::other(format!("setting the CQ's progress mode to {mode:?}: {e}"))
        })?;
        let fd = cq.as_raw_fd();
        // SAFETY: `CqFd` holds a handle to the CQ, which owns the descriptor
        // and keeps it open as long as the AsyncFd (its owner) lives; the
        // mode was set above and the docs forbid changing it, so the CQ
        // keeps naming this same descriptor. Nobody else closes it.
        let fd = unsafe { AsyncFd::register_with_interest(CqFd { cq, fd }, Interest::READABLE) }
            .map_err(|e| {
                let e = e.into_parts().1;
                io::Error::new(
                    e.kind(),
                    format!("putting the CQ's descriptor on tokio's reactor (inside a runtime with I/O enabled?): {e}"),
                )
            })?;
        Ok(AsyncCq { fd })
    }

    /// The completion queue (to poll it, or post to its queue pairs).
    pub fn cq(&self) -> &CompletionQueue {
        &self.fd.get_ref().cq
    }

    /// The next completion, or `Pending` until one is there. A queue that
    /// stays empty never wakes: bound it (`completion_timeout`) when the
    /// peer may be gone without a word.
    pub fn poll_completion(&self, cx: &mut Context<'_>) -> Poll<io::Result<WorkCompletion>> {
        loop {
            // `poll_one` also does the receive work in application-driven
            // mode when the queue is empty.
            if let Some(wc) = self.cq().poll_one() {
                return Poll::Ready(Ok(wc));
            }
            let mut ready = match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match self.cq().poll_one() {
                Some(wc) => return Poll::Ready(Ok(wc)),
                // Nothing there after all (another task took it, or the
                // socket held only part of a frame): wait for the next
                // readiness; the descriptor is level-triggered, so one
                // that comes after this clear is not lost.
                None => ready.clear_ready(),
            }
        }
    }

    /// The next completion.
    pub async fn completion(&self) -> io::Result<WorkCompletion> {
        std::future::poll_fn(|cx| self.poll_completion(cx)).await
    }

    /// The next completion, or `None` after `timeout`.
    pub async fn completion_timeout(
        &self,
        timeout: Duration,
    ) -> io::Result<Option<WorkCompletion>> {
        match tokio::time::timeout(timeout, self.completion()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// The queue pair for the reactor; the handle keeps the descriptor open.
struct QpFd {
    qp: Arc<QueuePair>,
    fd: RawFd,
}

impl AsRawFd for QpFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

/// A queue pair's events ([`QueuePair::next_event`]) as futures on tokio's
/// reactor, through its event descriptor ([`QueuePair::event_fd`],
/// readable while an event waits).
pub struct AsyncQpEvents {
    fd: AsyncFd<QpFd>,
}

impl std::fmt::Debug for AsyncQpEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncQpEvents")
            .field("qp_num", &self.fd.get_ref().qp.qp_num())
            .field("fd", &self.fd.get_ref().fd)
            .finish()
    }
}

impl AsyncQpEvents {
    /// Put `qp`'s event descriptor on the reactor of the current tokio
    /// runtime. Fails if the provider gives none (both providers do,
    /// unless an eventfd could not be made: the open-file limit).
    ///
    /// With the CQ in [`ProgressMode::AppDriven`], the receive work that
    /// notices a peer's close runs only when the CQ is polled: await the
    /// events together with [`AsyncCq::completion`] (`tokio::select!`),
    /// as `examples/verbs_copy.rs` does.
    pub fn new(qp: Arc<QueuePair>) -> io::Result<AsyncQpEvents> {
        let fd = qp.event_fd().ok_or_else(|| {
            io::Error::other(format!(
                "queue pair {} has no event descriptor (QueuePair::event_fd is None: its provider gives none, or no eventfd could be made: raise the open-file limit, ulimit -n)",
                qp.qp_num()
            ))
        })?;
        // SAFETY: `QpFd` holds a handle to the queue pair, which owns the
        // event descriptor (made once, on the first `event_fd`, and kept
        // for the QP's life) and keeps it open as long as the AsyncFd (its
        // owner) lives; `as_raw_fd` always returns that same descriptor,
        // and nobody else closes it.
        let fd = unsafe { AsyncFd::register_with_interest(QpFd { qp, fd }, Interest::READABLE) }
            .map_err(|e| {
                let e = e.into_parts().1;
                io::Error::new(
                    e.kind(),
                    format!("putting the QP's event descriptor on tokio's reactor (inside a runtime with I/O enabled?): {e}"),
                )
            })?;
        Ok(AsyncQpEvents { fd })
    }

    /// The queue pair.
    pub fn qp(&self) -> &Arc<QueuePair> {
        &self.fd.get_ref().qp
    }

    /// The next event, or `Pending` until one is queued.
    pub fn poll_event(&self, cx: &mut Context<'_>) -> Poll<io::Result<QpEvent>> {
        loop {
            if let Some(ev) = self.qp().next_event(Duration::ZERO) {
                return Poll::Ready(Ok(ev));
            }
            let mut ready = match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match self.qp().next_event(Duration::ZERO) {
                Some(ev) => return Poll::Ready(Ok(ev)),
                // Another task took it: the descriptor is level-triggered,
                // so the next event after this clear is not lost.
                None => ready.clear_ready(),
            }
        }
    }

    /// The next event.
    pub async fn next(&self) -> io::Result<QpEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next event, or `None` after `timeout`.
    pub async fn next_timeout(&self, timeout: Duration) -> io::Result<Option<QpEvent>> {
        match tokio::time::timeout(timeout, self.next()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// [`iwarp::cm::connect`] on tokio's blocking pool: the TCP connect and the
/// MPA exchange (bounded by `param.timeout`) hold no event-loop thread.
/// Returns the peer's private data.
pub async fn connect(
    qp: Arc<QueuePair>,
    addr: SocketAddr,
    param: ConnParam,
) -> Result<Vec<u8>, CmError> {
    tokio::task::spawn_blocking(move || cm::connect(&qp, addr, &param))
        .await
        .map_err(|e| CmError::Io {
            during: "connecting (the blocking task panicked or was cancelled)",
            source: io::Error::other(e.to_string()),
        })?
}

/// [`ConnRequest::accept`] on tokio's blocking pool (the MPA Reply and,
/// with RFC 6581, the peer's first frame).
pub async fn accept(req: ConnRequest, qp: Arc<QueuePair>, param: ConnParam) -> Result<(), CmError> {
    tokio::task::spawn_blocking(move || req.accept(&qp, &param))
        .await
        .map_err(|e| CmError::Io {
            during: "accepting (the blocking task panicked or was cancelled)",
            source: io::Error::other(e.to_string()),
        })?
}

/// The listener's socket for the reactor.
struct ListenFd(Arc<Listener>);

impl AsRawFd for ListenFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A listener whose waits are futures: readiness on the reactor, then the
/// accept and the MPA request on the blocking pool.
pub struct AsyncListener {
    fd: AsyncFd<ListenFd>,
    handshake: Duration,
}

impl std::fmt::Debug for AsyncListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncListener")
            .field("local", &self.fd.get_ref().0.local_addr())
            .field("handshake", &self.handshake)
            .finish()
    }
}

impl AsyncListener {
    /// Put `listener` on the reactor. `handshake` bounds each client's MPA
    /// request (a silent client costs at most that, on the blocking pool).
    pub fn new(listener: Listener, handshake: Duration) -> io::Result<AsyncListener> {
        let l = Arc::new(listener);
        // SAFETY: `ListenFd` holds the listener, which owns the listening
        // socket and keeps it open as long as the AsyncFd (its owner) lives.
        let fd = unsafe { AsyncFd::register_with_interest(ListenFd(l), Interest::READABLE) }
            .map_err(|e| {
                let e = e.into_parts().1;
                io::Error::new(
                    e.kind(),
                    format!("putting the listening socket on tokio's reactor (inside a runtime with I/O enabled?): {e}"),
                )
            })?;
        Ok(AsyncListener { fd, handshake })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.fd.get_ref().0.local_addr()
    }

    /// The next connection request (its MPA Request read and checked,
    /// within the handshake timeout). A client that fails its handshake or
    /// stays silent is an `Err` for this call; the listener goes on. Calls
    /// from several tasks overlap handshakes (each holds one blocking-pool
    /// thread while it runs).
    pub async fn next_request(&self) -> Result<ConnRequest, CmError> {
        loop {
            let mut ready = self.fd.readable().await.map_err(|e| CmError::Io {
                during: "waiting for a connection",
                source: e,
            })?;
            let l = self.fd.get_ref().0.clone();
            let handshake = self.handshake;
            // `get_request` polls the socket before it accepts, so a
            // connection another task took meanwhile mostly costs a wait in
            // `poll` (two tasks racing between poll and accept can leave
            // one in `accept` until the next connection); its timeout
            // bounds the wait and the MPA Request.
            let r = tokio::task::spawn_blocking(move || l.get_request(Some(handshake)))
                .await
                .map_err(|e| CmError::Io {
                    during: "accepting (the blocking task panicked or was cancelled)",
                    source: io::Error::other(e.to_string()),
                })?;
            match r {
                // Nobody there any more: wait for the next readiness.
                Err(CmError::Timeout {
                    during: "waiting for a connection",
                    ..
                }) => ready.clear_ready(),
                other => return other,
            }
        }
    }
}
