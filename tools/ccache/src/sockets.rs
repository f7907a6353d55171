//! The `sockets` validation mode: the two-sided version request of the
//! `tcp` mode, carried over the Sockets-over-iWARP library
//! (`iwarp-sockets`, rsockets-compatible) instead of kernel TCP.
//!
//! - [`serve_versions_sockets`]: ccappd's version thread over iWARP
//!   sockets (`ccappd --sockets-listen`): a thread per connection sets the
//!   stream up (off the accept path, within a deadline, a bounded number
//!   at once: issue 26 item 4) and answers `VERSION_REQUEST` with
//!   `VERSION_REPLY` from the version table, exactly as
//!   [`crate::appd::serve_versions`] does on TCP.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use iwarp::cm::CmError;
use iwarp::Context;
use iwarp_sockets::Listener;

use crate::acheck::AsyncCheck;
use crate::blocking::Blocking;
/// The stream options for version requests (see
/// [`crate::check_parts::sockets_options`]).
pub use crate::check_parts::sockets_options as options;
use crate::check_parts::{CheckError, VersionCheck};
use crate::listen::Endpoint;
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

/// The sockets version listener's settings (`ccappd --sockets-listen`).
#[derive(Debug, Clone)]
pub struct SocketsCfg {
    /// A stream idle this long is closed.
    pub idle: Duration,
    /// Streams at once, set up or being set up (`--version-max-conns`);
    /// one more connection is closed at once.
    pub max_conns: usize,
    /// Streams being set up at once (`--rdma-max-handshakes`); one more
    /// connection is closed at once.
    pub max_handshakes: usize,
    /// Bound on each step of a stream's setup (`--rdma-handshake-ms`):
    /// the peer's MPA Request, then our Reply and the peer's first
    /// message.
    pub handshake_timeout: Duration,
}

impl SocketsCfg {
    /// `idle` and `max_conns` with the handshake defaults of the RDMA
    /// listeners ([`crate::listen::MAX_HANDSHAKES`],
    /// [`crate::listen::HANDSHAKE_TIMEOUT`]).
    pub fn new(idle: Duration, max_conns: usize) -> SocketsCfg {
        SocketsCfg {
            idle,
            max_conns,
            max_handshakes: crate::listen::MAX_HANDSHAKES,
            handshake_timeout: crate::listen::HANDSHAKE_TIMEOUT,
        }
    }
}

/// What the sockets version listener did, for logs and tests.
#[derive(Debug, Default)]
pub struct SocketsStats {
    /// Streams set up.
    pub accepted: AtomicU64,
    /// Connections closed at once: `max_conns` streams were open.
    pub full: AtomicU64,
    /// Connections closed at once: `max_handshakes` setups were running.
    pub busy: AtomicU64,
    /// Setups that failed or ran out of time (silent peers among them).
    pub failed: AtomicU64,
    /// Setups running now.
    pub handshaking: AtomicUsize,
    /// Streams now (being set up or served).
    pub live: AtomicUsize,
}

/// The version thread over iWARP sockets: accept connections on this
/// thread and give each a thread of its own, which sets the stream up
/// (the MPA Request, the queue pair, the rings' registration, the Reply:
/// each step within `cfg.handshake_timeout`) and then answers its version
/// requests until it closes or idles for `cfg.idle`. At most
/// `cfg.max_conns` streams and `cfg.max_handshakes` setups at once; a
/// connection past either is closed at once. Runs for ever.
///
/// Before, `iwarp_sockets::Listener::accept` set each stream up on the
/// accept thread: a peer that connected and said nothing held every later
/// one (a proxy's checkers, which connect at once, waited out their
/// 2 s bound behind each other).
pub fn serve_versions_sockets(
    ep: Endpoint,
    table: Arc<VersionTable>,
    cfg: SocketsCfg,
    stats: Arc<SocketsStats>,
) -> ! {
    let mut opts = options();
    opts.connect_timeout = cfg.handshake_timeout;
    let sh = Arc::new(Shared {
        table,
        cfg,
        opts,
        stats,
    });
    match ep {
        Endpoint::Soft { listener, .. } => loop {
            let (s, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // A peer that gave up (ECONNABORTED) or a passing
                    // shortage (EMFILE): wait a little, go on.
                    tracing::warn!(error = %e, "sockets version listener accept failed; retrying");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            spawn_stream(&sh, peer, move |o| Listener::accept_tcp(s, o));
        },
        // A kernel device runs the MPA exchange itself and hands over
        // complete requests; the stream's setup still runs off this thread.
        Endpoint::Cm(l) => loop {
            match l.get_request(Some(Duration::from_secs(1))) {
                Ok(req) => {
                    let peer = req.peer_addr();
                    spawn_stream(&sh, peer, move |o| Listener::accept_request(req, o));
                }
                Err(CmError::Timeout { .. }) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "sockets version listener: connection request failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        },
    }
}

struct Shared {
    table: Arc<VersionTable>,
    cfg: SocketsCfg,
    opts: iwarp_sockets::Options,
    stats: Arc<SocketsStats>,
}

/// Take a place among `max` in `n`, if there is one.
fn take(n: &AtomicUsize, max: usize) -> bool {
    n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
        (x < max.max(1)).then_some(x + 1)
    })
    .is_ok()
}

/// Gives a place back when dropped.
struct Place<'a>(&'a AtomicUsize);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn spawn_stream<F>(sh: &Arc<Shared>, peer: SocketAddr, setup: F)
where
    F: FnOnce(&iwarp_sockets::Options) -> std::io::Result<iwarp_sockets::Stream> + Send + 'static,
{
    let st = &sh.stats;
    // Dropping `setup` (and the connection it holds) closes it.
    if !take(&st.live, sh.cfg.max_conns) {
        st.full.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, max = sh.cfg.max_conns, "sockets version connection closed: --version-max-conns streams are open (raise it if the proxies need more)");
        return;
    }
    if !take(&st.handshaking, sh.cfg.max_handshakes) {
        st.live.fetch_sub(1, Ordering::AcqRel);
        st.busy.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, max = sh.cfg.max_handshakes, "sockets version connection closed: --rdma-max-handshakes setups are in progress (slow or silent peers; raise it if real proxies are refused)");
        return;
    }
    let sh2 = sh.clone();
    let spawned = std::thread::Builder::new()
        .name("ccappd-sockets".into())
        .spawn(move || {
            let st = &sh2.stats;
            let _live = Place(&st.live);
            let made = {
                let _setup = Place(&st.handshaking);
                setup(&sh2.opts)
            };
            let mut s = match made {
                Ok(s) => s,
                Err(e) => {
                    st.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%peer, error = %e, "sockets version stream not set up (a silent or slow peer is dropped after --rdma-handshake-ms)");
                    return;
                }
            };
            st.accepted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "proxy connected for version requests over iWARP sockets");
            let _ = s.set_read_timeout(Some(sh2.cfg.idle));
            let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
            answer_versions(&mut s, &sh2.table);
        });
    if let Err(e) = spawned {
        // The closure and its connection were dropped without running;
        // the places it would have given back were taken here.
        st.handshaking.fetch_sub(1, Ordering::AcqRel);
        st.live.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(error = %e, %peer, "cannot start a sockets stream thread; connection closed");
    }
}

/// Bind the sockets version listener (`ccappd --sockets-listen`) on
/// `ctx`'s device and serve it on a thread of its own
/// ([`serve_versions_sockets`]); its address.
pub fn spawn_listener(
    ctx: &Context,
    addr: SocketAddr,
    table: Arc<VersionTable>,
    cfg: SocketsCfg,
    stats: Arc<SocketsStats>,
) -> Result<SocketAddr, String> {
    let ep = Endpoint::bind(ctx, addr, options().mpa)
        .map_err(|e| format!("--sockets-listen {addr}: {e} (port in use? pick another)"))?;
    let local = ep.local_addr().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("ccappd-sockets-accept".into())
        .spawn(move || serve_versions_sockets(ep, table, cfg, stats))
        .map_err(|e| format!("--sockets-listen {addr}: cannot start its thread: {e}"))?;
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
