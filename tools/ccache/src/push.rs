//! Adaptive push-pull: the push channel's two ends.
//!
//! - Proxy side, [`run_agent`]: registers the proxy's cache state region
//!   with ccappd's push listener and keeps the connection; answers `PUSH`
//!   (store the document if it is cached at an older version; see
//!   [`CacheState::store_pushed`]) and `STATE_REQUEST`. Reconnects and
//!   registers again when the connection ends (ccappd restarted). A frame
//!   cut short (ccappd killed mid-push) stores nothing.
//! - Module side, [`Pusher`]: accepts registrations; after each committed
//!   update it reads the document **under the Table 1 read protocol** (its
//!   own IPC client: `READ_REQUEST` → `READ_PROCEED(v)` → read the file →
//!   `READ_DONE`), so the body is exactly version `v`; then for each
//!   registered proxy it reads the proxy's state (one RDMA Read of the
//!   region, or `STATE_REQUEST` on the channel), asks the [`Policy`] and
//!   pushes `(doc, v, body)` where it says so. Pushes run on a thread of
//!   their own, after the update committed: the updater never waits for a
//!   proxy. Updates of the same document that pile up while a push runs
//!   are pushed once, at the newest version.
//!
//! With an access token (`--token-file`), `REGISTER` carries the proxy's
//! proof and `REGISTERED` ccappd's (see [`ccache_proto::auth`]): ccappd
//! registers (and so pushes to, and reads the state of) only proxies that
//! hold the token, and a proxy serves pushes only from a ccappd that
//! proved it. The proxy's proof is version 2 (its time under the MAC) and
//! ccappd's push listener keeps a [`ReplayGuard`] of its own: a
//! `REGISTER` read off the wire and sent again is refused (`AccessDenied`),
//! one outside the time window is refused (`Stale`), and an old proxy's
//! version-1 proof is refused (`Outdated`), never accepted or left
//! hanging. No frame body is allocated before its announced length is
//! checked against what that frame may carry (a registration's 100 bytes,
//! a push's `--max-doc-bytes`).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ccache_proto::auth::{self, CONN_PROOF_LEN, MAC_LEN, PROOF_WINDOW_MS};
use ccache_proto::ipc::{Kind as IpcKind, Repr};
use ccache_proto::push::{
    Header, Kind, PushError, PushStatus, Registration, HEADER_LEN, MAX_BODY, REGISTRATION_LEN,
};
use ccache_proto::state::{Decision, Policy, Snapshot, StateError};
use iwarp::{QpState, SendWr, SgList, WcStatus, WrOpcode};

use crate::access::{now_ms, ConnDenied, Token};
use crate::check::{connect_reader, Reader};
use crate::docs::doc_path;
use crate::msgio::{read_msg, write_msg};
use crate::replay::{Rejected, ReplayGuard, REPLAY_CAP};
use crate::state::CacheState;

/// A frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// Clean close between frames.
    Closed,
    /// Socket error or timeout (mid-frame, or waiting for a reply).
    Io(io::Error),
    /// Not a valid frame.
    Malformed(PushError),
    /// A frame whose announced body is longer than this frame may carry
    /// here; nothing of the body was read or allocated.
    TooLong {
        /// The header.
        header: Header,
        /// The most this frame may carry.
        max: u32,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => f.write_str("the peer closed the push channel"),
            FrameError::Io(e) => write!(f, "push channel: {e}"),
            FrameError::Malformed(e) => write!(f, "push channel: {e}"),
            FrameError::TooLong { header, max } => write!(
                f,
                "push channel: {:?} frame announces {} bytes of body, at most {max} accepted here (a larger document needs a larger --max-doc-bytes at the proxy)",
                header.kind, header.body_len
            ),
        }
    }
}

impl std::error::Error for FrameError {}

fn read_full(r: &mut impl Read, buf: &mut [u8], idle_ok: bool) -> Result<(), FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 && idle_ok => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(FrameError::Malformed(PushError::Truncated {
                    len: got,
                    need: buf.len(),
                }))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if idle_ok
                    && got == 0
                    && matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
            {
                // Idle between frames: keep waiting (the socket's timeout
                // bounds each wait inside a frame).
            }
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

/// Read one frame. With `idle_ok`, waiting for its first byte is unbounded
/// (the caller is a server between requests); the rest of the frame is
/// bounded by the socket's read timeout.
pub fn read_frame(r: &mut impl Read, idle_ok: bool) -> Result<(Header, Vec<u8>), FrameError> {
    read_frame_limited(r, idle_ok, |_| MAX_BODY)
}

/// Read one frame whose body may be at most `max(kind)` bytes: a longer
/// one is [`FrameError::TooLong`] as soon as its header is read, before
/// any of the body is allocated or read.
pub fn read_frame_limited(
    r: &mut impl Read,
    idle_ok: bool,
    max: impl Fn(Kind) -> u32,
) -> Result<(Header, Vec<u8>), FrameError> {
    let mut h = [0u8; HEADER_LEN];
    read_full(r, &mut h, idle_ok)?;
    let h = Header::parse(&h).map_err(FrameError::Malformed)?;
    let max = max(h.kind);
    if h.body_len > max {
        return Err(FrameError::TooLong { header: h, max });
    }
    let mut body = vec![0u8; h.body_len as usize];
    read_full(r, &mut body, false)?;
    Ok((h, body))
}

/// Write one frame.
pub fn write_frame(w: &mut impl Write, mut h: Header, body: &[u8]) -> io::Result<()> {
    h.body_len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame body too long"))?;
    let mut b = Vec::with_capacity(HEADER_LEN + body.len());
    b.extend_from_slice(&h.emit());
    b.extend_from_slice(body);
    w.write_all(&b)
}

fn error_frame(status: PushStatus) -> Header {
    Header {
        status: status.into(),
        ..Header::new(Kind::Error, 0)
    }
}

/// Serve one registered push channel (proxy side) until it ends: pushes
/// of at most `max_doc` bytes (`--max-doc-bytes`; a larger one is refused
/// from its header with `ERROR(too large)` and the channel closed, the body
/// never read), state requests. `Ok(())` is a clean close by ccappd.
pub fn serve_channel(
    s: &mut TcpStream,
    state: &CacheState,
    max_doc: u32,
) -> Result<(), FrameError> {
    loop {
        let limit = |k: Kind| if k == Kind::Push { max_doc } else { 0 };
        let (h, body) = match read_frame_limited(s, true, limit) {
            Ok(f) => f,
            Err(FrameError::Closed) => return Ok(()),
            Err(e @ FrameError::TooLong { .. }) => {
                tracing::warn!(error = %e, "push refused before reading its body; closing the channel");
                let _ = write_frame(s, error_frame(PushStatus::TooLarge), &[]);
                return Err(e);
            }
            Err(FrameError::Malformed(e)) => {
                tracing::warn!(error = %e, "malformed push frame; closing the channel");
                let _ = write_frame(s, error_frame(PushStatus::Malformed), &[]);
                return Err(FrameError::Malformed(e));
            }
            Err(e) => return Err(e),
        };
        match h.kind {
            Kind::Push => {
                let status = state.store_pushed(h.doc, h.version, body);
                tracing::debug!(doc = h.doc, version = h.version, ?status, "push");
                let ack = Header {
                    version: h.version,
                    status: status.into(),
                    ..Header::new(Kind::PushAck, h.doc)
                };
                write_frame(s, ack, &[]).map_err(FrameError::Io)?;
            }
            Kind::StateRequest => {
                let b = state.region_bytes();
                write_frame(s, Header::new(Kind::StateReply, 0), &b).map_err(FrameError::Io)?;
            }
            k => {
                tracing::warn!(kind = ?k, "unexpected frame on the push channel; closing");
                let _ = write_frame(s, error_frame(PushStatus::Malformed), &[]);
                return Err(FrameError::Malformed(PushError::UnknownKind(0)));
            }
        }
    }
}

/// The proxy's push agent's settings.
#[derive(Debug, Clone)]
pub struct AgentCfg {
    /// Bound on each connect and each wait inside a frame.
    pub timeout: Duration,
    /// Pause before registering again after the channel ended.
    pub retry: Duration,
    /// The deployment's token (`--token-file`): prove it in `REGISTER`,
    /// and serve only a ccappd that proves it in `REGISTERED`.
    pub token: Option<Token>,
    /// Largest push accepted (`--max-doc-bytes`).
    pub max_doc: u32,
}

/// Register with ccappd's push listener at `appd` and serve pushes, for
/// ever: when the channel ends, register again (every `cfg.retry`).
pub fn run_agent(appd: SocketAddr, reg: Registration, state: Arc<CacheState>, cfg: AgentCfg) {
    let mut warned = false;
    loop {
        match register_with(appd, &reg, cfg.timeout, cfg.token.as_ref()) {
            Ok(mut s) => {
                warned = false;
                tracing::info!(%appd, "registered for pushes");
                match serve_channel(&mut s, &state, cfg.max_doc) {
                    Ok(()) => tracing::info!(%appd, "push channel closed by ccappd"),
                    Err(e) => tracing::warn!(%appd, error = %e, "push channel ended"),
                }
            }
            Err(e) if !warned => {
                tracing::warn!(%appd, error = %e, "cannot register for pushes (retrying; is ccappd --push-listen up, with the same --token-file?)");
                warned = true;
            }
            Err(_) => {}
        }
        std::thread::sleep(cfg.retry);
    }
}

/// Connect and register without a token; returns the channel.
pub fn register(appd: SocketAddr, reg: &Registration, timeout: Duration) -> io::Result<TcpStream> {
    register_with(appd, reg, timeout, None)
}

/// The body of `REGISTER`: the registration, and with a token its address
/// and STag masked and the proxy's (version-2) proof after it, made now;
/// and the nonce.
pub fn register_body(
    reg: &Registration,
    token: Option<&Token>,
) -> io::Result<(Vec<u8>, Option<[u8; auth::NONCE_LEN]>)> {
    register_body_at(reg, token, now_ms())
}

/// [`register_body`] with the proof made at `time_ms` (a test may give a
/// time other than now). The proof is
/// `"CCA2" | nonce | time | HMAC(token, LABEL_REGISTER | nonce | time |
/// masked registration)`, the mask keyed by the same nonce.
pub fn register_body_at(
    reg: &Registration,
    token: Option<&Token>,
    time_ms: u64,
) -> io::Result<(Vec<u8>, Option<[u8; auth::NONCE_LEN]>)> {
    let mut r = reg.emit();
    let Some(t) = token else {
        return Ok((r.to_vec(), None));
    };
    // The nonce is drawn first, so that the mask can be keyed by it.
    let nonce = crate::access::nonce()?;
    auth::mask_registration(&mut r, &t.mac(auth::LABEL_MASK, &[&nonce]));
    let mac = t.mac(auth::LABEL_REGISTER, &[&nonce, &time_ms.to_be_bytes(), &r]);
    let p = auth::ConnProof {
        nonce,
        time_ms,
        mac,
    };
    let mut b = r.to_vec();
    b.extend_from_slice(&p.emit());
    Ok((b, Some(nonce)))
}

/// Connect and register (with `token`: prove it, and require ccappd's
/// proof in `REGISTERED`); returns the channel.
pub fn register_with(
    appd: SocketAddr,
    reg: &Registration,
    timeout: Duration,
    token: Option<&Token>,
) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&appd, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let (body, nonce) = register_body(reg, token)?;
    write_frame(&mut s, Header::new(Kind::Register, 0), &body)?;
    let limit = |k: Kind| {
        if k == Kind::Registered {
            MAC_LEN as u32
        } else {
            0
        }
    };
    match read_frame_limited(&mut s, false, limit) {
        Ok((h, b)) if h.kind == Kind::Registered => match (token, nonce) {
            (Some(t), Some(n)) if !t.check_mac(auth::LABEL_REGISTERED, &[&n], &b) => {
                let _ = write_frame(&mut s, error_frame(PushStatus::AccessDenied), &[]);
                Err(io::Error::other(format!(
                    "{appd} answered REGISTERED without proving the access token: not our ccappd, or its --token-file holds another token; no push is taken from it"
                )))
            }
            _ => Ok(s),
        },
        Ok((h, _)) if h.kind == Kind::Error => Err(io::Error::other(
            match (PushStatus::from(h.status), token) {
                (PushStatus::AccessDenied, _) => format!(
                    "ccappd at {appd} refused the registration: access denied (give this proxy ccappd's --token-file)"
                ),
                (PushStatus::Stale, _) => format!(
                    "ccappd at {appd} refused the registration: stale access proof, its time is more than {} s from ccappd's clock (synchronise the two hosts' clocks, e.g. with chrony or systemd-timesyncd; right after ccappd restarts, a host whose clock is behind is refused until it catches up: the agent retries)",
                    PROOF_WINDOW_MS / 1000
                ),
                (PushStatus::Outdated, _) => format!(
                    "ccappd at {appd} refused the registration: outdated access proof (ccappd needs replay-proof registrations: upgrade this proxy to ccappd's release)"
                ),
                (PushStatus::Malformed, Some(_)) => format!(
                    "ccappd at {appd} refused the registration as malformed: a ccappd older than replay-proof registrations refuses this proxy's 100-byte REGISTER (upgrade ccappd to this release)"
                ),
                (st, _) => format!("ccappd at {appd} answered ERROR ({st:?}) to REGISTER"),
            },
        )),
        Ok((h, _)) => Err(io::Error::other(format!(
            "ccappd answered {:?} (status {}) to REGISTER",
            h.kind, h.status
        ))),
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// How ccappd reads a proxy's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRead {
    /// One RDMA Read of the region (if the proxy registered an iWARP
    /// listener; otherwise, or if it fails, a `STATE_REQUEST`).
    Rdma,
    /// Always a `STATE_REQUEST` on the push channel.
    Tcp,
}

/// ccappd's push settings.
#[derive(Debug, Clone)]
pub struct PushCfg {
    /// The policy.
    pub policy: Policy,
    /// ccappd's own IPC socket (the pusher reads documents through it).
    pub ipc: PathBuf,
    /// The documents' files.
    pub docroot: PathBuf,
    /// How proxies' states are read.
    pub state_read: StateRead,
    /// Bound on every step (connect, Read, reply).
    pub timeout: Duration,
    /// The deployment's token: registrations must prove it, and state
    /// reads by RDMA present a proof of it.
    pub token: Option<Token>,
}

/// Registration handshakes in progress at once on the push listener; one
/// more connection is closed at once.
pub const MAX_REGISTRATIONS_IN_PROGRESS: usize = 16;

/// ccappd's push counters.
#[derive(Debug, Default)]
pub struct PushStats {
    /// Committed updates considered.
    pub updates: AtomicU64,
    /// Pushes sent.
    pub sent: AtomicU64,
    /// ... acknowledged as stored.
    pub stored: AtomicU64,
    /// ... ignored by the proxy (not newer or not cached).
    pub ignored: AtomicU64,
    /// Decisions not to push: not cached, up to date, or cold (hybrid).
    pub skipped: AtomicU64,
    /// State reads by RDMA Read.
    pub state_rdma: AtomicU64,
    /// State reads by `STATE_REQUEST`.
    pub state_tcp: AtomicU64,
    /// Proxies dropped after an error.
    pub dropped: AtomicU64,
    /// Registrations refused for their proof: none, a wrong one, or one
    /// replayed (all `AccessDenied`).
    pub denied: AtomicU64,
    /// ... of which replayed (a nonce accepted before).
    pub replayed: AtomicU64,
    /// Registrations refused as stale (time outside the window, or below
    /// the replay guard's horizon).
    pub stale: AtomicU64,
    /// Registrations refused for a version-1 proof (an old proxy).
    pub outdated: AtomicU64,
}

struct RdmaState {
    r: Reader,
    next: u64,
}

/// One RDMA Read of a proxy's region: connect once (with a proof of
/// `token`), read, retry a torn copy (at most 16 times).
fn rdma_connect(
    addr: SocketAddr,
    len: usize,
    timeout: Duration,
    token: Option<&Token>,
) -> Result<RdmaState, String> {
    let progress = iwarp::ProgressMode::Threaded {
        spin: Duration::ZERO,
    };
    let pdata = crate::listen::request_data(token, auth::LABEL_STATE_REGION)?;
    let (r, _) = connect_reader(addr, len, timeout, Some(progress), pdata)?;
    Ok(RdmaState { r, next: 1 })
}

fn rdma_read_state(
    c: &mut RdmaState,
    reg: &Registration,
    timeout: Duration,
) -> Result<Snapshot, String> {
    let len = reg.len as usize;
    let mut last = String::new();
    for _ in 0..16 {
        let wr_id = c.next;
        c.next += 1;
        c.r.qp
            .post_send(&SendWr {
                wr_id,
                opcode: WrOpcode::RdmaRead {
                    remote_addr: reg.addr,
                    rkey: reg.rkey,
                },
                sgl: SgList::single(c.r.buf.sge(0, len)),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| format!("posting the RDMA Read of the state region: {e:?}"))?;
        let wc =
            c.r.cq
                .wait_one(timeout)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("no RDMA Read completion within {timeout:?}"))?;
        if wc.wr_id != wr_id || wc.status != WcStatus::Success {
            return Err(format!(
                "RDMA Read of the state region completed with {} (wr {})",
                wc.status.as_str(),
                wc.wr_id
            ));
        }
        let mut b = vec![0u8; len];
        c.r.buf.read_at(0, &mut b);
        match Snapshot::parse(&b) {
            Ok(s) => return Ok(s),
            Err(e) if e.is_transient() => last = e.to_string(),
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("every read of the state region was torn: {last}"))
}

/// Reads one proxy's state region by RDMA Read, connecting on first use
/// and again after a failure.
pub struct RdmaStateReader {
    addr: SocketAddr,
    reg: Registration,
    timeout: Duration,
    token: Option<Token>,
    conn: Option<RdmaState>,
}

impl std::fmt::Debug for RdmaStateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStateReader")
            .field("addr", &self.addr)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

impl RdmaStateReader {
    /// A reader of the region `reg` behind the iWARP listener `addr`.
    pub fn new(addr: SocketAddr, reg: Registration, timeout: Duration) -> RdmaStateReader {
        RdmaStateReader {
            addr,
            reg,
            timeout,
            token: None,
            conn: None,
        }
    }

    /// Present a proof of `token` when connecting.
    pub fn with_token(mut self, token: Option<Token>) -> RdmaStateReader {
        self.token = token;
        self
    }

    /// One consistent snapshot (torn copies are read again, at most 16
    /// times).
    pub fn read(&mut self) -> Result<Snapshot, String> {
        if self
            .conn
            .as_ref()
            .is_none_or(|c| c.r.qp.state() != QpState::Rts)
        {
            self.conn = None;
            self.conn = Some(rdma_connect(
                self.addr,
                self.reg.len as usize,
                self.timeout,
                self.token.as_ref(),
            )?);
        }
        let c = self.conn.as_mut().expect("connected above");
        let r = rdma_read_state(c, &self.reg, self.timeout);
        if r.is_err() {
            self.conn = None;
        }
        r
    }
}

struct Link {
    id: u64,
    peer: SocketAddr,
    reg: Registration,
    chan: Mutex<TcpStream>,
    rdma: Mutex<Option<RdmaStateReader>>,
}

/// The module's side: registrations, state reads, pushes.
pub struct Pusher {
    cfg: PushCfg,
    links: Mutex<Vec<Arc<Link>>>,
    pending: Mutex<BTreeSet<u32>>,
    wake: Condvar,
    next_id: AtomicU64,
    registering: Arc<std::sync::atomic::AtomicUsize>,
    /// The nonces of the registrations admitted within the window.
    replay: Mutex<ReplayGuard>,
    /// Counters.
    pub stats: PushStats,
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pusher")
            .field("policy", &self.cfg.policy)
            .field("proxies", &self.proxies())
            .finish()
    }
}

impl Pusher {
    /// A pusher with this configuration and no proxies. Registrations
    /// whose proof was made before now are refused (its replay guard
    /// starts now: a registration recorded before a restart is stale).
    pub fn new(cfg: PushCfg) -> Pusher {
        Pusher::with_replay_cap(cfg, REPLAY_CAP)
    }

    /// [`Pusher::new`] remembering at most `cap` registration nonces.
    pub fn with_replay_cap(cfg: PushCfg, cap: usize) -> Pusher {
        Pusher {
            replay: Mutex::new(ReplayGuard::new(now_ms(), PROOF_WINDOW_MS, cap)),
            cfg,
            links: Mutex::new(Vec::new()),
            pending: Mutex::new(BTreeSet::new()),
            wake: Condvar::new(),
            next_id: AtomicU64::new(1),
            registering: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            stats: PushStats::default(),
        }
    }

    /// Registered proxies.
    pub fn proxies(&self) -> usize {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.cfg.policy
    }

    /// Accept registrations on `listener`, for ever. Each registration is
    /// read on a thread of its own (at most
    /// [`MAX_REGISTRATIONS_IN_PROGRESS`] at once), so a silent peer delays
    /// nobody else.
    pub fn serve_registrations(self: &Arc<Self>, listener: TcpListener) {
        use std::sync::atomic::AtomicUsize;
        struct Slot(Arc<AtomicUsize>);
        impl Drop for Slot {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // The listener's address names it in the refusals' log lines.
        let local = listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string());
        for conn in listener.incoming() {
            let s = match conn {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "push listener accept failed");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let n = &self.registering;
            if n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                (x < MAX_REGISTRATIONS_IN_PROGRESS).then_some(x + 1)
            })
            .is_err()
            {
                tracing::warn!(peer = ?s.peer_addr().ok(), "push registration closed: {MAX_REGISTRATIONS_IN_PROGRESS} registrations are in progress (slow or silent peers)");
                continue;
            }
            let slot = Slot(n.clone());
            let me = self.clone();
            let local = local.clone();
            let _ = std::thread::Builder::new()
                .name("ccappd-register".into())
                .spawn(move || {
                    let _slot = slot;
                    if let Err(e) = me.accept_one(s) {
                        tracing::warn!(listen = %local, error = %e, "refused a push registration");
                    }
                });
        }
    }

    fn accept_one(&self, mut s: TcpStream) -> Result<(), String> {
        let peer = s.peer_addr().map_err(|e| e.to_string())?;
        let t = Some(self.cfg.timeout);
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(t).map_err(|e| e.to_string())?;
        s.set_write_timeout(t).map_err(|e| e.to_string())?;
        // A registration (and its proof) is all a REGISTER may carry: a
        // larger announced body is refused before it is allocated.
        let limit = |k: Kind| {
            if k == Kind::Register {
                (REGISTRATION_LEN + CONN_PROOF_LEN) as u32
            } else {
                0
            }
        };
        let (h, mut body) = match read_frame_limited(&mut s, false, limit) {
            Ok(f) => f,
            Err(e) => {
                let _ = write_frame(&mut s, error_frame(PushStatus::Malformed), &[]);
                return Err(format!("{peer}: {e}"));
            }
        };
        let mut registered_body = Vec::new();
        if let (Kind::Register, Some(tok)) = (h.kind, &self.cfg.token) {
            let (reg_bytes, proof) = body.split_at(REGISTRATION_LEN.min(body.len()));
            let p = match self.check_register(tok, proof, reg_bytes) {
                Ok(p) => p,
                Err((status, why)) => {
                    let _ = write_frame(&mut s, error_frame(status), &[]);
                    return Err(format!("{peer}: registration refused: {why}"));
                }
            };
            let mut r = [0u8; REGISTRATION_LEN];
            r.copy_from_slice(reg_bytes);
            auth::mask_registration(&mut r, &tok.mac(auth::LABEL_MASK, &[&p.nonce]));
            body = r.to_vec();
            registered_body = tok.mac(auth::LABEL_REGISTERED, &[&p.nonce]).to_vec();
        }
        let max = ccache_proto::state::region_len(ccache_proto::state::MAX_CAPACITY);
        let reg = match (h.kind, Registration::parse(&body)) {
            (Kind::Register, Ok(r))
                if (ccache_proto::state::HEADER_LEN..=max).contains(&(r.len as usize)) =>
            {
                r
            }
            (Kind::Register, Ok(r)) => {
                let _ = write_frame(&mut s, error_frame(PushStatus::Malformed), &[]);
                return Err(format!(
                    "{peer}: state region of {} bytes registered; a region is {} to {max} bytes",
                    r.len,
                    ccache_proto::state::HEADER_LEN
                ));
            }
            (k, r) => {
                let _ = write_frame(&mut s, error_frame(PushStatus::Malformed), &[]);
                return Err(format!(
                    "{peer}: expected REGISTER with a 40-byte registration, got {k:?} ({})",
                    r.err().map_or("kind".to_string(), |e| e.to_string())
                ));
            }
        };
        write_frame(&mut s, Header::new(Kind::Registered, 0), &registered_body)
            .map_err(|e| e.to_string())?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        tracing::info!(proxy = id, %peer, rdma = ?reg.rdma, len = reg.len, "proxy registered for pushes");
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(Link {
                id,
                peer,
                reg,
                chan: Mutex::new(s),
                rdma: Mutex::new(None),
            }));
        Ok(())
    }

    /// Check a `REGISTER`'s proof of `tok`: its MAC (over the masked
    /// registration `reg` too), then its time and nonce, as a listener
    /// checks an MPA Request's (issue 26 item 4: a recorded registration
    /// must be worth nothing). Each refusal is counted; the status to send
    /// and the cause.
    fn check_register(
        &self,
        tok: &Token,
        proof: &[u8],
        reg: &[u8],
    ) -> Result<auth::ConnProof, (PushStatus, String)> {
        let st = &self.stats;
        let p = match tok.verify_conn_covering(auth::LABEL_REGISTER, proof, reg) {
            Ok(p) => p,
            Err(ConnDenied::Outdated(why)) => {
                st.outdated.fetch_add(1, Ordering::Relaxed);
                return Err((
                    PushStatus::Outdated,
                    format!("{why} (the proxy is too old for this ccappd's replay-proof registrations: upgrade it)"),
                ));
            }
            Err(ConnDenied::Denied(why)) => {
                st.denied.fetch_add(1, Ordering::Relaxed);
                return Err((
                    PushStatus::AccessDenied,
                    format!("access denied, {why} (give the proxy the same --token-file)"),
                ));
            }
        };
        let mut g = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        let admitted = g.admit(p.nonce, p.time_ms, now_ms());
        drop(g);
        match admitted {
            Ok(()) => Ok(p),
            Err(e @ Rejected::Replayed) => {
                st.denied.fetch_add(1, Ordering::Relaxed);
                st.replayed.fetch_add(1, Ordering::Relaxed);
                Err((
                    PushStatus::AccessDenied,
                    format!("access denied, {e} (someone who can read the traffic to this push listener sent a recorded REGISTER again)"),
                ))
            }
            Err(e) => {
                st.stale.fetch_add(1, Ordering::Relaxed);
                Err((PushStatus::Stale, format!("stale access proof: {e}")))
            }
        }
    }

    /// Registration nonces remembered now.
    pub fn replay_nonces(&self) -> usize {
        self.replay.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn drop_link(&self, id: u64, why: &str) {
        let mut l = self.links.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = l.iter().position(|x| x.id == id) {
            let x = l.remove(i);
            tracing::warn!(proxy = id, peer = %x.peer, why, "proxy dropped from pushes");
            if let Ok(c) = x.chan.lock() {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn state_over_channel(&self, l: &Link) -> Result<Snapshot, String> {
        self.stats.state_tcp.fetch_add(1, Ordering::Relaxed);
        let mut c = l.chan.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *c, Header::new(Kind::StateRequest, 0), &[]).map_err(|e| e.to_string())?;
        let max = ccache_proto::state::region_len(ccache_proto::state::MAX_CAPACITY);
        let limit = |k: Kind| if k == Kind::StateReply { max as u32 } else { 0 };
        match read_frame_limited(&mut *c, false, limit) {
            Ok((h, b)) if h.kind == Kind::StateReply => {
                Snapshot::parse(&b).map_err(|e: StateError| e.to_string())
            }
            Ok((h, _)) => Err(format!("answered {:?} to STATE_REQUEST", h.kind)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A proxy's current state.
    fn state_of(&self, l: &Link) -> Result<Snapshot, String> {
        if let (StateRead::Rdma, Some(addr)) = (self.cfg.state_read, l.reg.rdma) {
            let mut r = l.rdma.lock().unwrap_or_else(|p| p.into_inner());
            let reader = r.get_or_insert_with(|| {
                RdmaStateReader::new(addr, l.reg, self.cfg.timeout)
                    .with_token(self.cfg.token.clone())
            });
            match reader.read() {
                Ok(s) => {
                    self.stats.state_rdma.fetch_add(1, Ordering::Relaxed);
                    return Ok(s);
                }
                Err(e) => {
                    tracing::warn!(proxy = l.id, error = %e, "RDMA Read of the proxy's state failed; asking over the push channel");
                }
            }
        }
        self.state_over_channel(l)
    }

    /// A committed update of `doc`: push it (later, on the push thread).
    pub fn notify(&self, doc: u32) {
        if self.cfg.policy == Policy::Pull {
            self.stats.updates.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(doc);
        self.wake.notify_one();
    }

    /// A document some registered proxy has in its recently-accessed list,
    /// picked with `rnd`, and how many there were to pick from; `None` if
    /// no proxy has accessed anything (or none is registered).
    pub fn pick_accessed(&self, rnd: u64) -> Option<(u32, usize)> {
        let links: Vec<Arc<Link>> = self.links.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut docs = BTreeSet::new();
        for l in links {
            match self.state_of(&l) {
                Ok(s) => docs.extend(s.entries.iter().map(|e| e.doc)),
                Err(e) => self.drop_link(l.id, &e),
            }
        }
        let n = docs.len();
        let i = usize::try_from(rnd % (n.max(1) as u64)).unwrap_or(0);
        docs.into_iter().nth(i).map(|d| (d, n))
    }

    /// Read `doc` under the read protocol through `ipc`: (version, body).
    /// A connection kept from before that fails (ccappd's IPC server closes
    /// idle ones) is replaced once.
    fn read_doc(&self, ipc: &mut Option<UnixStream>, doc: u32) -> Result<(u64, Vec<u8>), String> {
        let reused = ipc.is_some();
        match self.read_doc_once(ipc, doc) {
            Err(e) if reused => {
                tracing::debug!(error = %e, "IPC connection of the pusher broke; connecting again");
                self.read_doc_once(ipc, doc)
            }
            r => r,
        }
    }

    fn read_doc_once(
        &self,
        ipc: &mut Option<UnixStream>,
        doc: u32,
    ) -> Result<(u64, Vec<u8>), String> {
        if ipc.is_none() {
            let s = UnixStream::connect(&self.cfg.ipc)
                .map_err(|e| format!("connecting to {}: {e}", self.cfg.ipc.display()))?;
            s.set_read_timeout(Some(self.cfg.timeout))
                .map_err(|e| e.to_string())?;
            s.set_write_timeout(Some(self.cfg.timeout))
                .map_err(|e| e.to_string())?;
            *ipc = Some(s);
        }
        let s = ipc.as_mut().expect("connected above");
        let r = (|| {
            write_msg(s, &Repr::new(IpcKind::ReadRequest, doc)).map_err(|e| e.to_string())?;
            let m = read_msg(s).map_err(|e| e.to_string())?;
            if m.kind != IpcKind::ReadProceed || m.doc != doc {
                return Err(format!("ccappd answered {m} to READ_REQUEST"));
            }
            // The read is held: no update runs until READ_DONE.
            let mut body = Vec::new();
            let read = File::open(doc_path(&self.cfg.docroot, doc))
                .and_then(|mut f| f.read_to_end(&mut body));
            write_msg(s, &Repr::new(IpcKind::ReadDone, doc)).map_err(|e| e.to_string())?;
            read.map_err(|e| format!("reading document {doc}: {e}"))?;
            Ok((m.value, body))
        })();
        if r.is_err() {
            *ipc = None;
        }
        r
    }

    /// Push `doc` at `version` to one proxy if the policy says so.
    fn push_to(&self, l: &Link, doc: u32, version: u64, body: &[u8]) -> Result<(), String> {
        let snap = self.state_of(l)?;
        match self.cfg.policy.decide(&snap, doc, version) {
            Decision::Push { rank } => {
                self.stats.sent.fetch_add(1, Ordering::Relaxed);
                let mut c = l.chan.lock().unwrap_or_else(|p| p.into_inner());
                let h = Header {
                    version,
                    ..Header::new(Kind::Push, doc)
                };
                write_frame(&mut *c, h, body).map_err(|e| e.to_string())?;
                let (a, _) =
                    read_frame_limited(&mut *c, false, |_| 0).map_err(|e| e.to_string())?;
                if a.kind != Kind::PushAck || a.doc != doc {
                    return Err(format!("answered {:?} to PUSH", a.kind));
                }
                let st = PushStatus::from(a.status);
                tracing::debug!(proxy = l.id, doc, version, rank, status = ?st, "pushed");
                if st == PushStatus::Stored {
                    self.stats.stored.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.stats.ignored.fetch_add(1, Ordering::Relaxed);
                }
            }
            d => {
                tracing::trace!(proxy = l.id, doc, version, decision = ?d, "not pushed");
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The push thread: for ever, take a committed document, read it, and
    /// push it where the policy says.
    pub fn run(self: &Arc<Self>) {
        let mut ipc: Option<UnixStream> = None;
        loop {
            let doc = {
                let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(d) = p.pop_first() {
                        break d;
                    }
                    p = self.wake.wait(p).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.stats.updates.fetch_add(1, Ordering::Relaxed);
            if self.proxies() == 0 {
                continue;
            }
            let (version, body) = match self.read_doc(&mut ipc, doc) {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(doc, error = %e, "cannot read the updated document; not pushed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let links: Vec<Arc<Link>> =
                self.links.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for l in links {
                if let Err(e) = self.push_to(&l, doc, version, &body) {
                    self.drop_link(l.id, &e);
                }
            }
        }
    }
}
