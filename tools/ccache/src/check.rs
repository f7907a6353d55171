//! The proxy's version checks, blocking, and what every check shares.
//!
//! - [`RdmaCheck`]: one RDMA Read of the document's 16-byte slot in the
//!   module's version table; the module runs no code for it.
//! - [`TcpCheck`]: a `VERSION_REQUEST` to the module's version thread.
//!
//! The checks themselves are written once, in [`crate::acheck`]
//! ([`AsyncCheck`]); these blocking types run one on a runtime of their
//! own (`Blocking`), so they behave alike: one connection, made again
//! when it broke (the module restarted): an operation on a connection that
//! was already up is retried once on a fresh one; a failure on a fresh one
//! is the caller's error (the proxy answers 502). A slot outside the table
//! is refused before any Read; [`RdmaCheck::read_slot_unchecked`] skips
//! that check (tests), and then the module's stack answers with a
//! Terminate, the Read completes with a remote access error, and the
//! connection is dropped: an error, never a stale or made-up version.
//!
//! The pieces of a check (the errors, the RDMA connection to the version
//! table, the meaning of the version thread's answer) are in
//! `crate::check_parts`; [`CheckError`] and [`VersionCheck`] are
//! re-exported here, their public path.

use std::net::SocketAddr;
use std::time::Duration;

use ccache_proto::slot::Advert;

use crate::access::Token;
use crate::acheck::{AsyncCheck, CqWait};
use crate::blocking::Blocking;
pub(crate) use crate::check_parts::{connect_reader, Reader};
pub use crate::check_parts::{CheckError, VersionCheck};

/// Version checks by RDMA Read (blocking; [`AsyncCheck::rdma`] is the
/// same check on an event loop).
#[derive(Debug)]
pub struct RdmaCheck {
    inner: Blocking,
    addr: SocketAddr,
    timeout: Duration,
    progress: Option<iwarp::ProgressMode>,
    token: Option<Token>,
}

impl RdmaCheck {
    /// Checks against the module at `addr` (its `--rdma-listen`), each
    /// operation bounded by `timeout`. Connects lazily.
    pub fn new(addr: SocketAddr, timeout: Duration) -> RdmaCheck {
        RdmaCheck {
            inner: Blocking::new(AsyncCheck::rdma_waiting(
                addr,
                timeout,
                CqWait::Blocking(None),
            )),
            addr,
            timeout,
            progress: None,
            token: None,
        }
    }

    fn rebuild(mut self) -> RdmaCheck {
        let c = AsyncCheck::rdma_waiting(self.addr, self.timeout, CqWait::Blocking(self.progress));
        self.inner = Blocking::new(c.with_token(self.token.clone()));
        self
    }

    /// Prove `token` when connecting (ccappd's `--token-file`).
    pub fn with_token(mut self, token: Option<Token>) -> RdmaCheck {
        self.token = token;
        self.rebuild()
    }

    /// Wait for the Read's completion this way (default: the CQ's default,
    /// `Threaded` with a short spin).
    pub fn with_progress(mut self, mode: iwarp::ProgressMode) -> RdmaCheck {
        self.progress = Some(mode);
        self.rebuild()
    }

    /// The table's advertisement (connecting if needed).
    pub fn advert(&mut self) -> Result<Advert, CheckError> {
        self.inner.advert()
    }

    /// Read slot `doc` even if it is outside the advertised table (to
    /// exercise the module's bounds check).
    pub fn read_slot_unchecked(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.read_slot_unchecked(doc)
    }
}

impl VersionCheck for RdmaCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.version(doc)
    }
}

/// Version checks by a request to the module's version thread (blocking;
/// [`AsyncCheck::tcp`] is the same check on an event loop).
#[derive(Debug)]
pub struct TcpCheck {
    inner: Blocking,
}

impl TcpCheck {
    /// Checks against the module's `--version-listen` at `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> TcpCheck {
        TcpCheck {
            inner: Blocking::new(AsyncCheck::tcp_blocking(addr, timeout)),
        }
    }
}

impl VersionCheck for TcpCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.version(doc)
    }
}
