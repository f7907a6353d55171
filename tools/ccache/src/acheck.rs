//! The proxy's version checks on its event loop (tokio): the same three
//! ways as [`crate::check`] and [`crate::sockets`], but a check waits for
//! its answer without holding a thread, so one event loop thread serves
//! every client connection and every check in flight.
//!
//! - `rdma`: post the RDMA Read, then wait on the completion queue on
//!   tokio's reactor ([`iwarp_tokio::AsyncCq`], the verbs' one async
//!   wrapper). In
//!   [`RdmaWait::EventLoop`] (the default) the CQ is application-driven:
//!   the descriptor is an epoll set of the queue pair's socket, and the
//!   event loop thread itself reads the Read Response when the socket is
//!   readable, so no provider thread runs and no thread hand-off happens.
//!   In [`RdmaWait::ProviderThread`] the provider's receive thread takes
//!   the response and signals the CQ's eventfd.
//! - `tcp`: `VERSION_REQUEST` / `VERSION_REPLY` on a tokio `TcpStream`.
//! - `sockets`: the same on an iWARP socket ([`iwarp_sockets::tokio_io`]).
//!
//! Connection setup that blocks (the MPA exchange of the RDMA connection
//! and of the iWARP socket) runs on tokio's blocking pool. An operation on
//! a connection that was already up is retried once on a fresh one (the
//! module restarted); a failure on a fresh one is the caller's error (the
//! proxy answers 502); every step is bounded by the timeout.
//!
//! This is the one implementation of the checks: the blocking ones
//! ([`crate::check::RdmaCheck`], [`crate::check::TcpCheck`],
//! [`crate::sockets::SocketsCheck`]) run an `AsyncCheck` on a runtime of
//! their own (`blocking::Blocking`). Their RDMA wait is
//! [`iwarp::CompletionQueue::wait_one`] in the progress mode they were
//! given (a spin, busy polling), called from the check itself, because
//! nothing else runs on their runtime.

use std::net::SocketAddr;
use std::time::Duration;

use ccache_proto::ipc::{Kind, Repr, MSG_LEN};
use ccache_proto::slot::Advert;
use iwarp::{ProgressMode, WcStatus, WorkCompletion};
use iwarp_sockets::tokio_io::AsyncStream;
use iwarp_tokio::AsyncCq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::check_parts::{sockets_options, version_of_reply, CheckError, RdmaConn, TORN_RETRIES};

/// How an RDMA check's event loop learns that its Read completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaWait {
    /// The event loop thread reads the queue pair's socket itself
    /// (application-driven progress): no provider thread, no hand-off.
    EventLoop,
    /// The provider's receive thread reads it and signals the CQ's
    /// eventfd, on which the event loop waits.
    ProviderThread,
}

impl RdmaWait {
    fn progress(self) -> ProgressMode {
        match self {
            RdmaWait::EventLoop => ProgressMode::AppDriven {
                spin: Duration::ZERO,
            },
            RdmaWait::ProviderThread => ProgressMode::Threaded {
                spin: Duration::ZERO,
            },
        }
    }
}

/// How an RDMA check waits for its Read's completion.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CqWait {
    /// On tokio's reactor, on the CQ's descriptor ([`RdmaWait`]).
    Reactor(RdmaWait),
    /// In [`CompletionQueue::wait_one`], on the thread that runs the check,
    /// with the CQ in this progress mode (`None`: the CQ's default). Only
    /// for a runtime that runs nothing else: the blocking checks.
    Blocking(Option<ProgressMode>),
}

/// An RDMA connection to the version table with its descriptor in tokio's
/// reactor (`None`: waits with [`CqWait::Blocking`]). `fd` is declared
/// first so it is deregistered before the connection goes.
struct RdmaLink {
    fd: Option<AsyncCq>,
    conn: RdmaConn,
    timeout: Duration,
}

impl RdmaLink {
    /// The next completion, doing the receive work on this thread in
    /// application-driven mode (`poll_one` does it when the CQ is empty).
    async fn completion(&self) -> Result<WorkCompletion, CheckError> {
        let Some(fd) = &self.fd else {
            return self
                .conn
                .cq()
                .wait_one(self.timeout)
                .map_err(|e| CheckError::Protocol(e.to_string()))?
                .ok_or(CheckError::Timeout(self.timeout));
        };
        fd.completion_timeout(self.timeout)
            .await
            .map_err(|e| CheckError::Protocol(format!("waiting on the CQ: {e}")))?
            .ok_or(CheckError::Timeout(self.timeout))
    }

    async fn read(&mut self, doc: u32, bounds: bool) -> Result<u64, CheckError> {
        self.conn.bounds(doc, bounds)?;
        for _ in 0..TORN_RETRIES {
            let wr_id = self.conn.post_read(doc)?;
            let wc = self.completion().await?;
            if let Some(v) = self.conn.slot_version(doc, wr_id, &wc)? {
                return Ok(v);
            }
        }
        Err(CheckError::Torn { doc })
    }
}

enum Link {
    Rdma(Box<RdmaLink>),
    Tcp(TcpStream),
    /// A blocking check's TCP stream (read and write timeouts set).
    BlockingTcp(std::net::TcpStream),
    Sockets(AsyncStream),
}

#[derive(Debug, Clone, Copy)]
enum Way {
    Rdma(CqWait),
    Tcp,
    /// TCP with blocking reads and writes on the thread that runs the
    /// check (the blocking [`crate::check::TcpCheck`]: its runtime runs
    /// nothing else, and a read that sleeps in the kernel answers sooner
    /// than a wait on the reactor).
    BlockingTcp,
    Sockets,
}

/// One version-check connection of the proxy (made lazily, made again
/// when it broke).
pub struct AsyncCheck {
    kind: Way,
    addr: SocketAddr,
    timeout: Duration,
    token: Option<crate::access::Token>,
    link: Option<Link>,
}

impl std::fmt::Debug for AsyncCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCheck")
            .field("kind", &self.kind)
            .field("addr", &self.addr)
            .field("connected", &self.link.is_some())
            .finish()
    }
}

/// One two-sided version request on a connected stream, bounded by the
/// caller's timeout.
async fn ask<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, doc: u32) -> Result<u64, CheckError> {
    s.write_all(&Repr::new(Kind::VersionRequest, doc).to_bytes())
        .await
        .map_err(|e| CheckError::Protocol(format!("sending the version request: {e}")))?;
    let mut b = [0u8; MSG_LEN];
    s.read_exact(&mut b)
        .await
        .map_err(|e| CheckError::Protocol(format!("reading the version thread's answer: {e}")))?;
    let m = Repr::from_bytes(&b)
        .map_err(|e| CheckError::Protocol(format!("malformed IPC message: {e}")))?;
    version_of_reply(&m, doc)
}

/// [`ask`] with blocking reads and writes (`timeout`: the stream's, named
/// in the error).
fn ask_blocking(
    s: &mut std::net::TcpStream,
    doc: u32,
    timeout: Duration,
) -> Result<u64, CheckError> {
    use crate::msgio::{read_msg, write_msg, MsgError};
    write_msg(s, &Repr::new(Kind::VersionRequest, doc))
        .map_err(|e| CheckError::Protocol(format!("sending the version request: {e}")))?;
    let m = read_msg(s).map_err(|e| match e {
        MsgError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            CheckError::Timeout(timeout)
        }
        e => CheckError::Protocol(format!("reading the version thread's answer: {e}")),
    })?;
    version_of_reply(&m, doc)
}

impl AsyncCheck {
    /// RDMA Reads of the version table at the module's `--rdma-listen`.
    pub fn rdma(addr: SocketAddr, timeout: Duration, wait: RdmaWait) -> AsyncCheck {
        AsyncCheck::new(Way::Rdma(CqWait::Reactor(wait)), addr, timeout)
    }

    /// RDMA Reads that wait as `wait` says (the blocking checks use
    /// [`CqWait::Blocking`]).
    pub(crate) fn rdma_waiting(addr: SocketAddr, timeout: Duration, wait: CqWait) -> AsyncCheck {
        AsyncCheck::new(Way::Rdma(wait), addr, timeout)
    }

    /// Requests to the module's version thread at its `--version-listen`.
    pub fn tcp(addr: SocketAddr, timeout: Duration) -> AsyncCheck {
        AsyncCheck::new(Way::Tcp, addr, timeout)
    }

    /// Requests to the version thread with blocking I/O ([`Way::BlockingTcp`]).
    pub(crate) fn tcp_blocking(addr: SocketAddr, timeout: Duration) -> AsyncCheck {
        AsyncCheck::new(Way::BlockingTcp, addr, timeout)
    }

    /// Requests to the version thread over iWARP sockets (`--sockets-listen`).
    pub fn sockets(addr: SocketAddr, timeout: Duration) -> AsyncCheck {
        AsyncCheck::new(Way::Sockets, addr, timeout)
    }

    fn new(kind: Way, addr: SocketAddr, timeout: Duration) -> AsyncCheck {
        AsyncCheck {
            kind,
            addr,
            timeout,
            token: None,
            link: None,
        }
    }

    /// RDMA: prove `token` when connecting (ccappd's `--token-file`).
    pub fn with_token(mut self, token: Option<crate::access::Token>) -> AsyncCheck {
        self.token = token;
        self
    }

    async fn connect(&self) -> Result<Link, CheckError> {
        let (addr, t) = (self.addr, self.timeout);
        let join = |e: tokio::task::JoinError| CheckError::Unreachable(e.to_string());
        match self.kind {
            Way::Rdma(CqWait::Blocking(progress)) => {
                // Nothing else runs on this runtime: connect right here.
                let conn = RdmaConn::open(addr, t, progress, self.token.as_ref())?;
                Ok(Link::Rdma(Box::new(RdmaLink {
                    fd: None,
                    conn,
                    timeout: t,
                })))
            }
            Way::Rdma(CqWait::Reactor(wait)) => {
                let token = self.token.clone();
                let conn = tokio::task::spawn_blocking(move || {
                    RdmaConn::open(addr, t, Some(wait.progress()), token.as_ref())
                })
                .await
                .map_err(join)??;
                // The mode was set before the connection; the same mode
                // again only puts the CQ on this runtime's reactor.
                let fd = AsyncCq::new(conn.cq().clone(), wait.progress()).map_err(|e| {
                    CheckError::Unreachable(format!("registering the CQ's descriptor: {e}"))
                })?;
                Ok(Link::Rdma(Box::new(RdmaLink {
                    fd: Some(fd),
                    conn,
                    timeout: t,
                })))
            }
            Way::Tcp => {
                let s = tokio::time::timeout(t, TcpStream::connect(addr))
                    .await
                    .map_err(|_| CheckError::Unreachable(format!("{addr}: connect timed out")))?
                    .map_err(|e| CheckError::Unreachable(format!("{addr}: {e}")))?;
                s.set_nodelay(true)
                    .map_err(|e| CheckError::Unreachable(e.to_string()))?;
                Ok(Link::Tcp(s))
            }
            Way::BlockingTcp => {
                let s = std::net::TcpStream::connect_timeout(&addr, t)
                    .map_err(|e| CheckError::Unreachable(format!("{addr}: {e}")))?;
                let io = |e: std::io::Error| CheckError::Unreachable(e.to_string());
                s.set_nodelay(true).map_err(io)?;
                s.set_read_timeout(Some(t)).map_err(io)?;
                s.set_write_timeout(Some(t)).map_err(io)?;
                Ok(Link::BlockingTcp(s))
            }
            Way::Sockets => {
                let opts = iwarp_sockets::Options {
                    connect_timeout: t,
                    ..sockets_options()
                };
                let s = AsyncStream::connect(addr, opts)
                    .await
                    .map_err(|e| CheckError::Unreachable(format!("{addr} (iWARP sockets): {e}")))?;
                Ok(Link::Sockets(s))
            }
        }
    }

    /// One check on the current link, bounded by the timeout.
    async fn once(&mut self, doc: u32, bounds: bool) -> Result<u64, CheckError> {
        let t = self.timeout;
        let link = self.link.as_mut().expect("caller connects");
        let fut = async {
            match link {
                Link::Rdma(l) => l.read(doc, bounds).await,
                Link::Tcp(s) => ask(s, doc).await,
                Link::BlockingTcp(s) => ask_blocking(s, doc, t),
                Link::Sockets(s) => ask(s, doc).await,
            }
        };
        tokio::time::timeout(t, fut)
            .await
            .map_err(|_| CheckError::Timeout(t))?
    }

    fn usable(&self) -> bool {
        match &self.link {
            Some(Link::Rdma(l)) => l.conn.usable(),
            Some(_) => true,
            None => false,
        }
    }

    /// Connect unless the link is up; whether it was.
    async fn ensure_link(&mut self) -> Result<bool, CheckError> {
        let reused = self.usable();
        if !reused {
            self.link = None;
            self.link = Some(self.connect().await?);
        }
        Ok(reused)
    }

    async fn check(&mut self, doc: u32, bounds: bool) -> Result<u64, CheckError> {
        let reused = self.ensure_link().await?;
        match self.once(doc, bounds).await {
            Ok(v) => Ok(v),
            Err(e @ CheckError::NoSuchDocument { .. }) => Err(e),
            Err(e) => {
                // The link is unusable after a failure: the QP is in error,
                // a late completion or answer may still arrive.
                self.link = None;
                if reused && !matches!(e, CheckError::Completion(WcStatus::RemAccessErr)) {
                    tracing::info!(error = %e, addr = %self.addr, "version connection broke; reconnecting once");
                    self.link = Some(self.connect().await?);
                    let r = self.once(doc, bounds).await;
                    if r.is_err() {
                        self.link = None;
                    }
                    r
                } else {
                    Err(e)
                }
            }
        }
    }

    /// RDMA: the version table's advertisement (connecting if needed).
    pub async fn advert(&mut self) -> Result<Advert, CheckError> {
        if !matches!(self.kind, Way::Rdma(_)) {
            return Err(CheckError::Protocol(
                "only an RDMA check has a version table advertisement".into(),
            ));
        }
        self.ensure_link().await?;
        match &self.link {
            Some(Link::Rdma(l)) => Ok(l.conn.advert()),
            _ => Err(CheckError::Protocol(
                "no RDMA connection after connecting".into(),
            )),
        }
    }

    /// The address checked.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Is a connection up (made by an earlier check)?
    pub fn connected(&self) -> bool {
        self.link.is_some()
    }

    /// The same checker without its connection (the next check connects).
    pub fn fresh(mut self) -> AsyncCheck {
        self.link = None;
        self
    }

    /// The current version of `doc`.
    pub async fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.check(doc, true).await
    }

    /// RDMA: read slot `doc` even outside the advertised table (to exercise
    /// the module's bounds check: a Terminate and a remote access error).
    pub async fn read_slot_unchecked(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.check(doc, false).await
    }
}
