//! The `sockets` validation mode: the two-sided version request of the
//! `tcp` mode, carried over the Sockets-over-iWARP library
//! (`iwarp-sockets`, rsockets-compatible) instead of kernel TCP.
//!
//! - [`serve_versions_sockets`]: ccappd's version thread on an
//!   `iwarp_sockets::Listener` (`ccappd --sockets-listen`): a thread per
//!   connection answers `VERSION_REQUEST` with `VERSION_REPLY` from the
//!   version table, exactly as [`crate::appd::serve_versions`] does on TCP.
//! - [`SocketsCheck`]: the blocking check (`ccproxy --mode sockets
//!   --appd-sockets A` uses [`AsyncCheck::sockets`], the same check on its
//!   event loop), one stream per checker, reconnected once when a stream
//!   that was up breaks (ccappd restarted).
//!
//! Like the `tcp` mode, every check runs the version thread on the
//! application server; only the transport differs (RDMA Writes of the
//! message into the peer's ring and a 4-byte Send, by rsockets' protocol).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use iwarp_sockets::Listener;

use crate::acheck::AsyncCheck;
use crate::blocking::Blocking;
/// The stream options for version requests (see
/// [`crate::check_parts::sockets_options`]).
pub use crate::check_parts::sockets_options as options;
use crate::check_parts::{CheckError, VersionCheck};
use crate::msgio::{read_msg, write_msg, MsgError};
use crate::table::VersionTable;

/// Answer version requests on one stream until it closes, errs, idles, or
/// sends a malformed message (answered with `ERROR(malformed)`, then
/// closed: the stream's framing is lost).
pub fn answer_versions<S: Read + Write>(s: &mut S, table: &VersionTable) {
    loop {
        let reply = match read_msg(s) {
            Ok(m) if m.kind == Kind::VersionRequest => match table.get(m.doc) {
                Some(Ok(v)) => Repr::with_value(Kind::VersionReply, m.doc, v),
                Some(Err(_)) => Repr::with_value(Kind::Error, m.doc, ErrorCode::Busy.into()),
                None => Repr::with_value(Kind::Error, m.doc, ErrorCode::NoSuchDocument.into()),
            },
            Ok(m) => Repr::with_value(Kind::Error, m.doc, ErrorCode::NotARequest.into()),
            Err(MsgError::Malformed(e)) => {
                tracing::warn!(error = %e, "malformed version request over sockets; closing");
                let _ = write_msg(
                    s,
                    &Repr::with_value(Kind::Error, 0, ErrorCode::Malformed.into()),
                );
                return;
            }
            Err(_) => return,
        };
        if write_msg(s, &reply).is_err() {
            return;
        }
    }
}

/// The version thread over iWARP sockets: accept streams, a thread each,
/// at most `max_conns` at once (one more is closed at once). A stream idle
/// for `idle` is closed.
pub fn serve_versions_sockets(
    listener: Listener,
    table: Arc<VersionTable>,
    idle: Duration,
    max_conns: usize,
) {
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let (mut s, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "sockets version listener accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        tracing::debug!(%peer, "proxy connected for version requests over iWARP sockets");
        if live.fetch_add(1, std::sync::atomic::Ordering::AcqRel) >= max_conns.max(1) {
            live.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            tracing::warn!(%peer, max = max_conns, "sockets version connection refused: --version-max-conns streams are open");
            continue;
        }
        let table = table.clone();
        let live = live.clone();
        std::thread::spawn(move || {
            let _live = LiveGuard(live);
            let _ = s.set_read_timeout(Some(idle));
            let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
            answer_versions(&mut s, &table);
        });
    }
}

/// Counts a stream's thread out when it ends.
struct LiveGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Bind the sockets version listener (`ccappd --sockets-listen`) and
/// serve it on a thread of its own.
pub fn spawn_listener(
    addr: SocketAddr,
    table: Arc<VersionTable>,
    idle: Duration,
    max_conns: usize,
) -> Result<SocketAddr, String> {
    let l = Listener::bind_with(addr, &options())
        .map_err(|e| format!("--sockets-listen {addr}: {e} (port in use? pick another)"))?;
    let local = l.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || serve_versions_sockets(l, table, idle, max_conns));
    Ok(local)
}

/// Version checks by a request to the version thread over iWARP sockets
/// (blocking; [`AsyncCheck::sockets`] is the same check on an event loop).
#[derive(Debug)]
pub struct SocketsCheck {
    inner: Blocking,
}

impl SocketsCheck {
    /// Checks against ccappd's `--sockets-listen` at `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> SocketsCheck {
        SocketsCheck {
            inner: Blocking::new(AsyncCheck::sockets(addr, timeout)),
        }
    }
}

impl VersionCheck for SocketsCheck {
    fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        self.inner.version(doc)
    }
}
