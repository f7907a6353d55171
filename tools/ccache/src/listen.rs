//! The cache's RDMA listeners: ccappd's version table and a proxy's cache
//! state region (issue 26 item 4).
//!
//! Each is a read-only region behind an iWARP listener: a peer connects,
//! gets a queue pair, and RDMA-Reads. Three rules keep one peer from
//! hurting the others:
//!
//! - **The accept path never waits on a peer.** One thread accepts TCP
//!   connections and hands each to a handshake thread of its own, which
//!   reads the MPA Request (RFC 5044 §7.1.2: the initiator sends it first)
//!   within `handshake_timeout` and then drops a silent peer. At most
//!   `max_handshakes` run at once; one more connection is closed at once
//!   (before MPA there is nothing else to answer). Before, the accept loop
//!   read each MPA Request itself, so a peer that connected and said
//!   nothing held the next one for up to 1 s.
//! - **Live queue pairs are bounded** (`max_conns`): a request past the
//!   limit gets an MPA Reject (RFC 5044 §7.1.3, the Reply with the Rej
//!   bit) with [`Refusal::Busy`] and a log line naming the flag; no queue
//!   pair is created for it.
//! - **An access token**, when the deployment has one: the Request's
//!   private data must be a [`ConnProof`](ccache_proto::auth::ConnProof)
//!   of it for this listener's label, checked before any queue pair
//!   exists: the MAC (in constant time), then the time and the nonce
//!   ([`ReplayGuard`]: within the window, never accepted before). A
//!   missing or wrong proof, or a replayed one, gets an MPA Reject with
//!   [`Refusal::AccessDenied`], a version-1 proof [`Refusal::Outdated`], a
//!   proof out of the time window [`Refusal::Stale`]; none carries an
//!   address or an STag (the version table's advertisement goes only into
//!   an accepted Reply), and each is logged with its cause.
//!
//! On a kernel device (`IWARP_DEVICE=siw0`, ...) the kernel runs the MPA
//! exchange and rdma_cm hands over complete requests, so the accept thread
//! waits only for those; the token and the limit are checked the same way
//! on handshake threads.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccache_proto::auth::Refusal;
use iwarp::cm::{CmError, ConnParam, ConnRequest, Listener, MpaConfig};
use iwarp::{CompletionQueue, Context, ProtectionDomain, QpInitAttr, QpState, QueuePair};

use crate::access::{now_ms, ConnDenied, Token};
use crate::replay::{Rejected, ReplayGuard, REPLAY_CAP};

/// Default of `--rdma-max-conns` (ccappd) and `--state-rdma-max-conns`
/// (ccproxy): live RDMA connections per listener. A proxy opens
/// `--check-conns` (default 4) to ccappd, ccappd one to each proxy.
pub const MAX_CONNS: usize = 256;
/// Default of `--rdma-max-handshakes`: MPA handshakes in progress at once.
pub const MAX_HANDSHAKES: usize = 32;
/// Default of `--rdma-handshake-ms`: how long a connected peer has to send
/// its MPA Request (and to take our Reply).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A listener's settings.
#[derive(Debug, Clone)]
pub struct ListenCfg {
    /// What is served, for logs ("version table", "cache state").
    pub what: &'static str,
    /// The private data of an accepted Reply (the version table's
    /// advertisement; empty for the state region).
    pub private_data: Vec<u8>,
    /// The deployment's token: requests must prove it (`None`: anyone).
    pub token: Option<Token>,
    /// The label the proof must be for
    /// ([`ccache_proto::auth::LABEL_VERSION_TABLE`], ...).
    pub label: &'static [u8],
    /// Live connections at most.
    pub max_conns: usize,
    /// Handshakes in progress at most.
    pub max_handshakes: usize,
    /// Bound on a peer's MPA Request and on sending our Reply.
    pub handshake_timeout: Duration,
    /// Proofs made before this time (ms since the Unix epoch) are
    /// refused: a proof recorded before a restart. [`ListenCfg::new`] sets
    /// it to the time it runs.
    pub started_ms: u64,
    /// How far a proof's time may be from ours, either way.
    pub window_ms: u64,
    /// Nonces remembered at most ([`ReplayGuard`]).
    pub replay_cap: usize,
}

impl ListenCfg {
    /// The defaults, for `what` with `label`, replying `private_data`.
    pub fn new(what: &'static str, label: &'static [u8], private_data: Vec<u8>) -> ListenCfg {
        ListenCfg {
            what,
            private_data,
            token: None,
            label,
            max_conns: MAX_CONNS,
            max_handshakes: MAX_HANDSHAKES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            started_ms: now_ms(),
            window_ms: ccache_proto::auth::PROOF_WINDOW_MS,
            replay_cap: REPLAY_CAP,
        }
    }
}

/// What a listener did, for logs and tests.
#[derive(Debug, Default)]
pub struct ListenStats {
    /// Connections accepted (a queue pair each).
    pub accepted: AtomicU64,
    /// Requests refused for a missing or wrong proof (replays included).
    pub denied: AtomicU64,
    /// Of those, proofs of the token accepted before: replays.
    pub replayed: AtomicU64,
    /// Requests refused for a proof out of the time window.
    pub stale: AtomicU64,
    /// Requests refused for a version-1 proof (an old peer).
    pub outdated: AtomicU64,
    /// Nonces the listener remembers now (at most `replay_cap`).
    pub nonces: AtomicUsize,
    /// Requests refused at the live-connection limit.
    pub full: AtomicU64,
    /// Connections closed at once: `max_handshakes` were in progress.
    pub busy: AtomicU64,
    /// Peers dropped for not sending their MPA Request in time.
    pub timed_out: AtomicU64,
    /// Other failed handshakes (malformed or incompatible Request, ...).
    pub failed: AtomicU64,
    /// Handshakes in progress now.
    pub handshaking: AtomicUsize,
}

/// Where requests come from: a TCP socket whose MPA Requests we read
/// ourselves (software provider), or an rdma_cm listener (kernel device).
#[derive(Debug)]
pub enum Endpoint {
    /// Software provider: our TCP listener and the MPA policy.
    Soft {
        /// The listening socket.
        listener: TcpListener,
        /// The policy requests are negotiated against.
        mpa: MpaConfig,
    },
    /// A kernel device's listener.
    Cm(Listener),
}

impl Endpoint {
    /// Listen on `addr` through `ctx`'s device.
    pub fn bind(ctx: &Context, addr: SocketAddr, mpa: MpaConfig) -> io::Result<Endpoint> {
        if ctx.device_name() == "soft" {
            let listener = TcpListener::bind(addr)?;
            return Ok(Endpoint::Soft { listener, mpa });
        }
        Listener::bind_on(ctx, addr, mpa)
            .map(Endpoint::Cm)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Endpoint::Soft { listener, .. } => listener.local_addr(),
            Endpoint::Cm(l) => Ok(l.local_addr()),
        }
    }
}

struct Live {
    qps: Vec<QueuePair>,
    /// Handshakes past the limit check that have not finished.
    reserved: usize,
}

struct Shared {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    cfg: ListenCfg,
    stats: Arc<ListenStats>,
    live: Mutex<Live>,
    replay: Mutex<ReplayGuard>,
    /// The listening address, for logs.
    local: String,
}

/// Serve `ep` for ever: accept on this thread, handshake on threads of
/// their own. Counters go to `stats`.
pub fn serve(
    ep: Endpoint,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    cfg: ListenCfg,
    stats: Arc<ListenStats>,
) -> ! {
    if cfg.token.is_none() {
        tracing::warn!(
            what = cfg.what,
            "no access token (--insecure-no-token): anyone who reaches this RDMA listener can read the {}",
            cfg.what
        );
    }
    let replay = Mutex::new(ReplayGuard::new(
        cfg.started_ms,
        cfg.window_ms,
        cfg.replay_cap,
    ));
    let local = ep
        .local_addr()
        .map_or_else(|e| format!("? ({e})"), |a| a.to_string());
    let sh = Arc::new(Shared {
        pd,
        cq,
        cfg,
        stats,
        replay,
        local,
        live: Mutex::new(Live {
            qps: Vec::new(),
            reserved: 0,
        }),
    });
    match ep {
        Endpoint::Soft { listener, mpa } => loop {
            let (s, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // accept(2) on a listening socket fails for a peer
                    // that gave up (ECONNABORTED) or a passing shortage
                    // (EMFILE, ENOBUFS): wait a little, go on.
                    tracing::warn!(error = %e, what = sh.cfg.what, "RDMA listener accept failed; retrying");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let mpa = mpa.clone();
            spawn_handshake(&sh, peer, move |t| {
                iwarp::cm::request_from_stream(s, &mpa, t)
            });
        },
        Endpoint::Cm(l) => loop {
            match l.get_request(Some(Duration::from_secs(1))) {
                Ok(req) => {
                    let peer = req.peer_addr();
                    spawn_handshake(&sh, peer, move |_| Ok(req));
                }
                Err(CmError::Timeout { .. }) => {}
                Err(e) => {
                    tracing::warn!(error = %e, what = sh.cfg.what, "RDMA connection request failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        },
    }
}

/// Releases a handshake slot when the handshake thread ends.
struct Slot(Arc<ListenStats>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.handshaking.fetch_sub(1, Ordering::AcqRel);
    }
}

fn spawn_handshake<F>(sh: &Arc<Shared>, peer: SocketAddr, request: F)
where
    F: FnOnce(Duration) -> Result<ConnRequest, CmError> + Send + 'static,
{
    let st = &sh.stats;
    let max = sh.cfg.max_handshakes.max(1);
    if st
        .handshaking
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_err()
    {
        st.busy.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, max, what = sh.cfg.what, "RDMA connection closed: --rdma-max-handshakes handshakes are in progress (slow or silent peers; raise it if real peers are refused)");
        // Dropping the request closes its connection.
        return;
    }
    let slot = Slot(st.clone());
    let sh2 = sh.clone();
    let spawned = std::thread::Builder::new()
        .name("ccache-mpa".into())
        .spawn(move || {
            let _slot = slot;
            handshake(&sh2, peer, request);
        });
    if let Err(e) = spawned {
        // The closure (and the slot with it) was dropped.
        tracing::warn!(error = %e, %peer, "cannot start a handshake thread; connection closed");
    }
}

fn handshake<F>(sh: &Shared, peer: SocketAddr, request: F)
where
    F: FnOnce(Duration) -> Result<ConnRequest, CmError>,
{
    let (cfg, st) = (&sh.cfg, &sh.stats);
    let req = match request(cfg.handshake_timeout) {
        Ok(r) => r,
        Err(e @ CmError::Timeout { .. }) => {
            st.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, what = cfg.what, error = %e, "dropped a peer that sent no MPA Request in time (--rdma-handshake-ms)");
            return;
        }
        Err(e) => {
            st.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, what = cfg.what, error = %e, "RDMA handshake failed");
            return;
        }
    };
    if let Some(t) = &cfg.token {
        if let Err(refusal) = check_proof(sh, t, peer, req.private_data()) {
            let _ = req.reject(&refusal.emit());
            return;
        }
    }
    {
        let mut live = sh.live.lock().unwrap_or_else(|p| p.into_inner());
        live.qps
            .retain(|qp| !matches!(qp.state(), QpState::Error | QpState::Closed));
        if live.qps.len() + live.reserved >= cfg.max_conns {
            let n = live.qps.len();
            drop(live);
            st.full.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, what = cfg.what, live = n, max = cfg.max_conns, "RDMA connection refused: the live-connection limit is reached (--rdma-max-conns / --state-rdma-max-conns)");
            let _ = req.reject(&Refusal::Busy.emit());
            return;
        }
        live.reserved += 1;
    }
    let accepted = accept(sh, req);
    let mut live = sh.live.lock().unwrap_or_else(|p| p.into_inner());
    live.reserved -= 1;
    match accepted {
        Ok(qp) => {
            live.qps.push(qp);
            st.accepted.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, live = live.qps.len(), what = cfg.what, "RDMA reader connected");
        }
        Err(e) => {
            st.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, what = cfg.what, error = %e, "accepting an RDMA reader failed");
        }
    }
}

/// Check the Request's proof of `t`: its MAC, then its time and nonce
/// (each refusal counted and logged with its cause); the refusal to send.
fn check_proof(sh: &Shared, t: &Token, peer: SocketAddr, pdata: &[u8]) -> Result<(), Refusal> {
    let (cfg, st) = (&sh.cfg, &sh.stats);
    let p = match t.verify_conn(cfg.label, pdata) {
        Ok(p) => p,
        Err(ConnDenied::Outdated(why)) => {
            st.outdated.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, listen = %sh.local, what = cfg.what, why, "RDMA connection refused: the peer is too old for this listener's replay-proof access tokens (upgrade it)");
            return Err(Refusal::Outdated);
        }
        Err(ConnDenied::Denied(why)) => {
            st.denied.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, listen = %sh.local, what = cfg.what, why, "RDMA connection refused: access denied (give the peer the same --token-file)");
            return Err(Refusal::AccessDenied);
        }
    };
    let mut g = sh.replay.lock().unwrap_or_else(|p| p.into_inner());
    let admitted = g.admit(p.nonce, p.time_ms, now_ms());
    st.nonces.store(g.len(), Ordering::Relaxed);
    drop(g);
    match admitted {
        Ok(()) => Ok(()),
        Err(e @ Rejected::Replayed) => {
            st.denied.fetch_add(1, Ordering::Relaxed);
            st.replayed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, listen = %sh.local, what = cfg.what, why = %e, "RDMA connection refused: access denied (a replayed access proof: someone who can read the traffic to this listener tried it again)");
            Err(Refusal::AccessDenied)
        }
        Err(e) => {
            st.stale.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, listen = %sh.local, what = cfg.what, why = %e, "RDMA connection refused: stale access proof");
            Err(Refusal::Stale)
        }
    }
}

/// A queue pair for `req` (with `max_send_wr` 4: enough to answer Reads),
/// accepted with the listener's private data.
fn accept(sh: &Shared, req: ConnRequest) -> Result<QueuePair, String> {
    let qp = match sh.pd.create_qp(&QpInitAttr {
        send_cq: sh.cq.clone(),
        recv_cq: sh.cq.clone(),
        max_send_wr: 4,
        max_recv_wr: 4,
    }) {
        Ok(qp) => qp,
        Err(e) => {
            let _ = req.reject(b"no QP");
            return Err(format!("cannot create a QP ({e}); rejected"));
        }
    };
    let param = ConnParam {
        private_data: sh.cfg.private_data.clone(),
        timeout: sh.cfg.handshake_timeout,
        ..ConnParam::default()
    };
    req.accept(&qp, &param).map_err(|e| e.to_string())?;
    Ok(qp)
}

/// The [`Refusal`] in a connection's MPA Reject, if it was one.
pub fn refusal_of(e: &CmError) -> Option<Refusal> {
    match e {
        CmError::Rejected { private_data, .. } => Refusal::parse(private_data),
        _ => None,
    }
}

/// The private data of a Request to a listener with `label`: a fresh
/// connection proof of `token` made now, or nothing. Build it for each
/// connection: a listener accepts a proof once.
pub fn request_data(token: Option<&Token>, label: &[u8]) -> Result<Vec<u8>, String> {
    match token {
        Some(t) => t
            .conn_proof(label, now_ms())
            .map(|p| p.emit().to_vec())
            .map_err(|e| format!("reading /dev/urandom for a nonce: {e}")),
        None => Ok(Vec::new()),
    }
}
