//! `rftpd`: one thread per control connection.
//!
//! Commands: RFC 959 (USER PASS CWD XCWD CDUP PWD XPWD LIST NLST RETR STOR
//! DELE MKD XMKD RMD XRMD RNFR RNTO TYPE MODE STRU PORT PASV QUIT NOOP SYST
//! ALLO ABOR), RFC 2389 (FEAT OPTS), RFC 3659 (SIZE MDTM REST MLSD), RFC
//! 2428 (EPRT EPSV), draft-bryan-ftp-hash (HASH), and the RDMA extension
//! (RADR RSTR RRTR; see `docs/RFTP.md`).
//!
//! Robustness: every path is confined to the root ([`crate::util::resolve`]);
//! a malformed or unknown command gets a 5xx reply and the session goes on;
//! failed logins are counted per client address and, past the limit, the
//! address is refused for a while; connection counts are limited in all
//! and per address; a connection must log in within `login_timeout_secs`
//! whatever it sends; a client that vanishes only ends its own thread (every
//! socket has a timeout); uploads go to a temporary name and are renamed
//! only when complete. RADR sessions reserve their buffer memory against a
//! server-wide budget and accept connections only from the control
//! connection's address.

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_xfer::{BlockSource, FileReader, FileWriter, Mode, NullSink, ZeroSource};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::checksum::{self, Algo, HashRead, HashSink, HashSource, HashWrite, Running};
use crate::cmdline::{self, MAX_LINE};
use crate::confine::{self, Entry, Found};
use crate::reply::same_host;
use crate::util::{self, hex, resolve};
use std::os::fd::AsRawFd;

/// A user of the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    /// Plain-text password (prefer `password_sha256`).
    #[serde(default)]
    pub password: Option<String>,
    /// SHA-256 of the password, hex.
    #[serde(default)]
    pub password_sha256: Option<String>,
    /// May upload, delete, rename and make directories.
    #[serde(default = "yes")]
    pub write: bool,
}

fn yes() -> bool {
    true
}

/// Default `session_mem_budget_bytes`: 1 GiB (documented in docs/RFTP.md).
pub const DEFAULT_SESSION_MEM_BUDGET: u64 = 1 << 30;

/// Default `session_mem_per_user_bytes`: 256 MiB, a quarter of the default
/// budget and two sessions of the default largest size (2 x 16 streams x
/// depth 4 x 1 MiB = 128 MiB).
pub const DEFAULT_SESSION_MEM_PER_USER: u64 = 256 << 20;

/// Default `login_timeout_secs`.
pub const DEFAULT_LOGIN_TIMEOUT_SECS: u64 = 30;

/// Bytes a connection may send before it has logged in (all lines
/// together, NOOPs included). A login (USER, PASS, and what clients send
/// around them: FEAT, OPTS UTF8, SYST) is well under 1 KiB; past this the
/// connection gets 421 and is closed, as at the login deadline.
pub const PRE_LOGIN_MAX_BYTES: usize = 16 << 10;

/// The server's configuration (TOML; every field has a default but
/// `root`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Control-connection address.
    pub listen: String,
    /// Directory served; nothing outside it is reachable.
    pub root: PathBuf,
    /// Allow `anonymous` / `ftp` logins, read-only.
    pub anonymous: bool,
    pub max_connections: usize,
    pub max_per_ip: usize,
    /// Seconds a control connection may stay silent.
    pub idle_timeout_secs: u64,
    /// Seconds a new connection has to log in, whatever it sends meanwhile
    /// (NOOP does not extend it); then 421 and the connection is closed.
    pub login_timeout_secs: u64,
    /// Seconds to wait for a data connection or data progress.
    pub data_timeout_secs: u64,
    /// Failed logins per address within the window before it is refused.
    pub login_fail_limit: u32,
    pub login_fail_window_secs: u64,
    /// Delay before answering a failed login.
    pub login_fail_delay_ms: u64,
    /// Offer the RDMA extension.
    pub rdma: bool,
    pub max_streams: u32,
    pub block_size: u32,
    /// The I/O depth of a RADR that names none.
    pub iodepth: u32,
    /// The most a RADR may ask for (`DEPTH=`): enough for a long fat path
    /// (rftp sizes it to the path; issue 27 found a cap of 4 holding one
    /// stream to 4 MiB per round trip, 0.67 Gbit/s at 50 ms); the session
    /// memory budget still bounds every session.
    pub max_iodepth: u32,
    /// TCP congestion control of the transfer sessions' connections
    /// (`TCP_CONGESTION`, tcp(7): reno, cubic, bbr); unset: the kernel's
    /// default.
    pub congestion: Option<String>,
    /// Require MPA CRC on RDMA sessions.
    pub crc: bool,
    /// RDMA device of the sessions: `soft`, `auto`, or a kernel device
    /// (`siw0`); unset: `IWARP_DEVICE`, else `soft`.
    pub device: Option<String>,
    /// Largest memory-to-memory transfer a client may ask for.
    pub max_mem_bytes: u64,
    /// Buffer memory all transfer sessions together may hold (RADR): each
    /// session reserves the most its pools can register, 2 x streams x
    /// depth x block size, when it is set up, and gives it back when it
    /// ends. A RADR that does not fit gets 452.
    pub session_mem_budget_bytes: u64,
    /// The share of `session_mem_budget_bytes` the sessions of one login
    /// (user name; all anonymous logins count as one) may hold together, so
    /// that one account with many control connections cannot take the
    /// whole budget. A RADR over it gets 452.
    pub session_mem_per_user_bytes: u64,
    /// Accept a RADR session's connections only from the control
    /// connection's IP address (turn off only behind a NAT that maps the
    /// data connections to another address).
    pub rdma_bind_peer: bool,
    /// Port of the RADR session listener (0: a fresh one per session). A
    /// fixed port allows one RADR session at a time; it exists so that a
    /// relay (e.g. `delay-bridge`) or firewall can forward it.
    pub rdma_port: u16,
    /// Address announced in the RADR reply instead of the listener's own
    /// (`IP:PORT`, or `IP` to keep the port), like vsftpd's
    /// `pasv_address`: for relays and NAT.
    pub rdma_advertise: Option<String>,
    /// The checksums `HASH` offers, in the server's order (FEAT `HASH`
    /// line; `OPTS HASH` may select only these): XXH3-128, BLAKE3, SHA-256,
    /// CRC32C. `["SHA-256"]` behaves as a server from before the
    /// negotiation.
    pub hash_algorithms: Vec<String>,
    pub users: Vec<User>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:2121".into(),
            root: PathBuf::from("."),
            anonymous: false,
            max_connections: 64,
            max_per_ip: 16,
            idle_timeout_secs: 300,
            login_timeout_secs: DEFAULT_LOGIN_TIMEOUT_SECS,
            data_timeout_secs: 30,
            login_fail_limit: 5,
            login_fail_window_secs: 60,
            login_fail_delay_ms: 500,
            rdma: true,
            max_streams: 16,
            block_size: 1 << 20,
            iodepth: 4,
            max_iodepth: 64,
            congestion: None,
            crc: false,
            device: None,
            max_mem_bytes: 64 << 30,
            session_mem_budget_bytes: DEFAULT_SESSION_MEM_BUDGET,
            session_mem_per_user_bytes: DEFAULT_SESSION_MEM_PER_USER,
            rdma_bind_peer: true,
            rdma_port: 0,
            rdma_advertise: None,
            hash_algorithms: checksum::OFFERED_DEFAULT
                .iter()
                .map(|a| a.wire_name().to_string())
                .collect(),
            users: Vec::new(),
        }
    }
}

impl ServerConfig {
    /// Read a TOML config file.
    pub fn load(path: &Path) -> Result<ServerConfig, String> {
        let text = fs::read_to_string(path)
            .map_err(|e| format!("reading config {}: {e}", path.display()))?;
        let cfg: ServerConfig =
            toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        if let Some(a) = &cfg.rdma_advertise {
            if a.parse::<SocketAddr>().is_err() && a.parse::<IpAddr>().is_err() {
                return Err(format!(
                    "config {}: rdma_advertise = {a:?} is neither IP nor IP:PORT",
                    path.display()
                ));
            }
        }
        cfg.offered_hashes()
            .map_err(|e| format!("config {}: {e}", path.display()))?;
        Ok(cfg)
    }

    /// `hash_algorithms` as algorithms; an unknown name or an empty list
    /// is an error naming the known ones.
    pub fn offered_hashes(&self) -> Result<Vec<Algo>, String> {
        let v = self
            .hash_algorithms
            .iter()
            .map(|n| {
                n.parse::<Algo>().map_err(|_| {
                    format!(
                        "hash_algorithms: unknown {n:?}; known: {}",
                        Algo::list(&checksum::OFFERED_DEFAULT)
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if v.is_empty() {
            return Err(format!(
                "hash_algorithms is empty; offer at least one of {}",
                Algo::list(&checksum::OFFERED_DEFAULT)
            ));
        }
        Ok(v)
    }
}

#[derive(Default)]
struct Failures {
    by_ip: HashMap<IpAddr, (u32, Instant)>,
}

struct Server {
    cfg: ServerConfig,
    root: PathBuf,
    conns: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    fails: Mutex<Failures>,
    /// Bytes reserved by live transfer sessions, in all
    /// (`session_mem_budget_bytes`) and per login
    /// (`session_mem_per_user_bytes`).
    session_mem: Mutex<MemUse>,
    /// The root held open: every file operation resolves beneath it.
    confined: confine::Root,
    /// The checksums HASH offers (`hash_algorithms`).
    hashes: Vec<Algo>,
}

/// Session buffer memory in use.
#[derive(Debug, Default)]
struct MemUse {
    total: u64,
    by_user: HashMap<String, u64>,
}

impl MemUse {
    fn give_back(&mut self, user: &str, bytes: u64) {
        self.total = self.total.saturating_sub(bytes);
        if let Some(u) = self.by_user.get_mut(user) {
            *u = u.saturating_sub(bytes);
            if *u == 0 {
                self.by_user.remove(user);
            }
        }
    }
}

/// Why a session's memory could not be reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemRefusal {
    /// The server-wide budget has only this much free.
    Server { free: u64 },
    /// The login already holds `held` of its share `share`.
    User { held: u64, share: u64 },
}

/// Buffer memory reserved for one transfer session of `user`; given back
/// on drop, however the session ends.
struct MemReservation {
    srv: Arc<Server>,
    user: String,
    bytes: u64,
}

impl MemReservation {
    /// Reserve `bytes` for `user`, or say which limit is in the way.
    fn take(srv: &Arc<Server>, user: &str, bytes: u64) -> Result<MemReservation, MemRefusal> {
        let mut used = lock(&srv.session_mem);
        // The server-wide budget first: when it is what is short, that is
        // the limit to name.
        let free = srv.cfg.session_mem_budget_bytes.saturating_sub(used.total);
        if bytes > free {
            return Err(MemRefusal::Server { free });
        }
        let share = srv.cfg.session_mem_per_user_bytes;
        let held = used.by_user.get(user).copied().unwrap_or(0);
        if bytes > share.saturating_sub(held) {
            return Err(MemRefusal::User { held, share });
        }
        used.total += bytes;
        *used.by_user.entry(user.to_string()).or_insert(0) += bytes;
        Ok(MemReservation {
            srv: srv.clone(),
            user: user.to_string(),
            bytes,
        })
    }

    /// Keep only `bytes` (the negotiated session may be smaller).
    fn shrink(&mut self, bytes: u64) {
        if bytes < self.bytes {
            lock(&self.srv.session_mem).give_back(&self.user, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for MemReservation {
    fn drop(&mut self) {
        lock(&self.srv.session_mem).give_back(&self.user, self.bytes);
    }
}

/// The most buffer memory a session with `c` can register: a source and a
/// sink pool of `streams x iodepth` blocks each.
fn session_bytes(c: &rdma_xfer::Config) -> u64 {
    2 * u64::from(c.pool_depth()) * u64::from(c.block_size)
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / f64::from(1 << 20))
}

/// Serve forever on `listener` (bound by the caller to `cfg.listen`).
pub fn serve(listener: TcpListener, cfg: ServerConfig) -> io::Result<()> {
    let root = cfg
        .root
        .canonicalize()
        .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", cfg.root.display())))?;
    let confined = confine::Root::open(&root)
        .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", root.display())))?;
    tracing::info!(mode = ?confined.mode(), "paths are confined beneath the root by the kernel");
    let hashes = cfg
        .offered_hashes()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let srv = Arc::new(Server {
        hashes,
        cfg,
        root,
        conns: AtomicUsize::new(0),
        per_ip: Mutex::new(HashMap::new()),
        fails: Mutex::new(Failures::default()),
        session_mem: Mutex::new(MemUse::default()),
        confined,
    });
    tracing::info!(addr = %listener.local_addr()?, root = %srv.root.display(), "rftpd listening");
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let srv = srv.clone();
        let spawned = std::thread::Builder::new()
            .name("rftpd-session".into())
            .spawn(move || srv.admit(stream));
        if let Err(e) = spawned {
            tracing::error!(%e, "could not start a session thread");
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    fn admit(self: &Arc<Self>, mut stream: TcpStream) {
        let Ok(peer) = stream.peer_addr() else { return };
        // A dual-stack listener shows IPv4 clients as ::ffff:a.b.c.d: count
        // them by their IPv4 address.
        let ip = peer.ip().to_canonical();
        let total = self.conns.fetch_add(1, Ordering::AcqRel) + 1;
        let mine = {
            let mut m = lock(&self.per_ip);
            let c = m.entry(ip).or_insert(0);
            *c += 1;
            *c
        };
        if total > self.cfg.max_connections || mine > self.cfg.max_per_ip {
            tracing::warn!(%peer, total, mine, "connection limit reached");
            let _ = stream.write_all(b"421 Too many connections; try again later.\r\n");
        } else {
            tracing::info!(%peer, "session start");
            let peer = SocketAddr::new(ip, peer.port());
            match Session::new(self.clone(), stream, peer) {
                Ok(mut s) => {
                    if let Err(e) = s.run() {
                        tracing::info!(%peer, %e, "session ended");
                    }
                }
                Err(e) => tracing::warn!(%peer, %e, "session setup failed"),
            }
        }
        self.conns.fetch_sub(1, Ordering::AcqRel);
        let mut m = lock(&self.per_ip);
        if let Some(c) = m.get_mut(&ip) {
            *c -= 1;
            if *c == 0 {
                m.remove(&ip);
            }
        }
    }

    /// True while `ip` is locked out after too many failed logins.
    fn locked_out(&self, ip: IpAddr) -> bool {
        let window = Duration::from_secs(self.cfg.login_fail_window_secs);
        let mut f = lock(&self.fails);
        match f.by_ip.get(&ip) {
            Some(&(n, first)) if first.elapsed() < window => n >= self.cfg.login_fail_limit,
            Some(_) => {
                f.by_ip.remove(&ip);
                false
            }
            None => false,
        }
    }

    fn record_failure(&self, ip: IpAddr) {
        let window = Duration::from_secs(self.cfg.login_fail_window_secs);
        let mut f = lock(&self.fails);
        let e = f.by_ip.entry(ip).or_insert((0, Instant::now()));
        if e.1.elapsed() >= window {
            *e = (0, Instant::now());
        }
        e.0 += 1;
    }

    fn check_password(&self, user: &str, pass: &str) -> Option<bool> {
        if self.cfg.anonymous && (user == "anonymous" || user == "ftp") {
            return Some(false);
        }
        let u = self.cfg.users.iter().find(|u| u.name == user)?;
        let ok = match (&u.password_sha256, &u.password) {
            (Some(h), _) => hex(&Sha256::digest(pass.as_bytes())).eq_ignore_ascii_case(h.trim()),
            (None, Some(p)) => p == pass,
            (None, None) => false,
        };
        ok.then_some(u.write)
    }
}

/// What the control connection brought.
enum Input {
    /// A command line, or the reply for a line that cannot be one.
    Line(Result<String, Reply>),
    /// End of stream.
    Eof,
    /// The login deadline passed before a line was complete.
    LoginDeadline,
    /// More than [`PRE_LOGIN_MAX_BYTES`] before login.
    LoginBytes,
}

enum DataMode {
    None,
    Passive(TcpListener),
    Active(SocketAddr),
}

struct Session {
    srv: Arc<Server>,
    ctrl: BufReader<TcpStream>,
    out: TcpStream,
    /// The client's address (IPv4-mapped addresses as IPv4).
    peer: SocketAddr,
    local: SocketAddr,
    /// The login deadline (`login_timeout_secs` after connect).
    login_by: Instant,
    /// Bytes received before login ([`PRE_LOGIN_MAX_BYTES`]).
    pre_login_bytes: usize,
    user: Option<String>,
    pending_user: Option<String>,
    writable: bool,
    cwd: String,
    rest: u64,
    rnfr: Option<PathBuf>,
    data: DataMode,
    /// The transfer session and the memory it reserved (dropped together).
    xfer: Option<Box<dyn rdma_xfer::Transport>>,
    xfer_mem: Option<MemReservation>,
    mem: bool,
    /// The checksum `HASH` uses (`OPTS HASH`).
    hash_algo: Algo,
    /// The client asked for `OPTS HASH`: it will verify, so transfers
    /// compute the running digest (clients that never do pay nothing).
    hash_during: bool,
    /// Digests of whole files this session just sent or received, so that
    /// `HASH` right after a transfer costs nothing.
    served: Vec<Served>,
}

/// A digest computed while a whole file went through a transfer, valid
/// while the file is the same (device, inode, size, modification time).
#[derive(Debug, Clone)]
struct Served {
    path: PathBuf,
    algo: Algo,
    id: FileId,
    digest: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// Digests kept per session.
const SERVED_KEEP: usize = 8;

/// A command's reply.
type Reply = (u32, String);

fn r(code: u32, text: impl Into<String>) -> Reply {
    (code, text.into())
}

/// The FTP reply for a file-system error.
fn io_reply(e: &io::Error, what: &str) -> Reply {
    let code = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => 552,
        _ => match e.kind() {
            io::ErrorKind::NotFound => 550,
            io::ErrorKind::PermissionDenied => 550,
            _ => 451,
        },
    };
    r(code, format!("{what}: {e}"))
}

impl Session {
    fn new(srv: Arc<Server>, stream: TcpStream, peer: SocketAddr) -> io::Result<Session> {
        let idle = Duration::from_secs(srv.cfg.idle_timeout_secs.max(1));
        stream.set_read_timeout(Some(idle))?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr()?;
        let login_by = Instant::now() + Duration::from_secs(srv.cfg.login_timeout_secs.max(1));
        let srv_hashes = srv.hashes.clone();
        Ok(Session {
            srv,
            out: stream.try_clone()?,
            ctrl: BufReader::new(stream),
            peer,
            local,
            login_by,
            pre_login_bytes: 0,
            user: None,
            pending_user: None,
            writable: false,
            cwd: "/".into(),
            rest: 0,
            rnfr: None,
            data: DataMode::None,
            xfer: None,
            xfer_mem: None,
            mem: false,
            // SHA-256 for a client that sends HASH without OPTS HASH, as
            // before the negotiation, when it is offered.
            hash_algo: if srv_hashes.contains(&Algo::Sha256) {
                Algo::Sha256
            } else {
                srv_hashes[0]
            },
            hash_during: false,
            served: Vec::new(),
        })
    }

    fn reply(&mut self, (code, text): &Reply) -> io::Result<()> {
        let s = crate::reply::emit_reply(*code, text);
        tracing::debug!(peer = %self.peer, reply = %s.trim_end(), "reply");
        self.out.write_all(s.as_bytes())
    }

    /// One command line. Over-long or non-UTF-8 lines become
    /// `Input::Line(Err(reply))`. Before login, the login deadline and
    /// [`PRE_LOGIN_MAX_BYTES`] hold for the whole line, not per read: a
    /// client that sends a byte now and then without ending its line is
    /// cut off at the deadline all the same (every read waits at most until
    /// it).
    fn read_command(&mut self) -> io::Result<Input> {
        let idle = Duration::from_secs(self.srv.cfg.idle_timeout_secs.max(1));
        let mut buf = Vec::new();
        // Bytes of an over-long line dropped (up to its end, at most 1 MiB).
        let mut dropped = 0usize;
        loop {
            let before_login = self.user.is_none();
            if before_login {
                let left = self.login_by.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Input::LoginDeadline);
                }
                self.ctrl.get_ref().set_read_timeout(Some(left.min(idle)))?;
            }
            let avail = match self.ctrl.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if before_login
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        )
                        && Instant::now() >= self.login_by =>
                {
                    return Ok(Input::LoginDeadline)
                }
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                return Ok(Input::Eof);
            }
            let nl = avail.iter().position(|&b| b == b'\n');
            let take = nl.map_or(avail.len(), |i| i + 1);
            let keep = take.min((MAX_LINE + 1).saturating_sub(buf.len()));
            buf.extend_from_slice(&avail[..keep]);
            dropped += take - keep;
            self.ctrl.consume(take);
            if before_login {
                self.pre_login_bytes += take;
                if self.pre_login_bytes > PRE_LOGIN_MAX_BYTES {
                    return Ok(Input::LoginBytes);
                }
            }
            if nl.is_some() {
                if dropped > 0 {
                    return Ok(Input::Line(Err(r(500, "Command line too long."))));
                }
                return Ok(Input::Line(cmdline::decode_line(buf)));
            }
            if dropped > 1 << 20 {
                // A megabyte without a line end: not an FTP client.
                return Ok(Input::Eof);
            }
        }
    }

    fn run(&mut self) -> io::Result<()> {
        let rdma = if self.srv.cfg.rdma {
            " (RDMA extension: RADR RSTR RRTR)"
        } else {
            ""
        };
        self.reply(&r(220, format!("rftpd ready{rdma}")))?;
        let idle = Duration::from_secs(self.srv.cfg.idle_timeout_secs.max(1));
        let login_limit = Duration::from_secs(self.srv.cfg.login_timeout_secs.max(1));
        let write_limit = Duration::from_secs(30);
        let mut logged_in = false;
        loop {
            // Before login every read and write is bounded by the login
            // deadline (read_command checks it before each read), so a
            // connection that never logs in, sends NOOP forever or dribbles
            // a line does not hold a connection slot for the idle timeout.
            if self.user.is_none() {
                let left = self.login_by.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return self.login_timed_out(login_limit);
                }
                self.out.set_write_timeout(Some(left.min(write_limit)))?;
            } else if !logged_in {
                logged_in = true;
                self.ctrl.get_ref().set_read_timeout(Some(idle))?;
                self.out.set_write_timeout(Some(write_limit))?;
            }
            let line = match self.read_command()? {
                Input::Eof => return Ok(()),
                Input::LoginDeadline => return self.login_timed_out(login_limit),
                Input::LoginBytes => return self.login_too_long(),
                Input::Line(Err(reply)) => {
                    self.reply(&reply)?;
                    continue;
                }
                Input::Line(Ok(l)) => l,
            };
            let (verb, arg) = cmdline::split_command(&line);
            if verb == "PASS" {
                tracing::debug!(peer = %self.peer, "command PASS ****");
            } else {
                tracing::debug!(peer = %self.peer, command = %line, "command");
            }
            if verb == "QUIT" {
                self.reply(&r(221, "Goodbye."))?;
                return Ok(());
            }
            let reply = self.dispatch(&verb, &arg)?;
            if let Some(rep) = reply {
                self.reply(&rep)?;
                if rep.0 == 421 {
                    let _ = self.out.shutdown(Shutdown::Both);
                    return Ok(());
                }
            }
            // RFC 959 §4.1.3: REST is followed by the transfer command;
            // like common servers, allow the data-connection setup and
            // TYPE in between (clients open the data connection first or
            // last).
            if !matches!(
                verb.as_str(),
                "REST" | "PASV" | "EPSV" | "PORT" | "EPRT" | "TYPE"
            ) {
                self.rest = 0;
            }
            if verb != "RNFR" {
                self.rnfr = None;
            }
        }
    }

    /// 421 and close: the connection sent too much without logging in.
    fn login_too_long(&mut self) -> io::Result<()> {
        tracing::info!(peer = %self.peer, bytes = self.pre_login_bytes, "too many bytes before login; closing");
        self.close_with(&r(
            421,
            format!(
                "Sent more than {PRE_LOGIN_MAX_BYTES} bytes without logging in; closing. \
                 Reconnect and send USER and PASS."
            ),
        ));
        Ok(())
    }

    /// 421 and close: the connection did not log in in time.
    fn login_timed_out(&mut self, limit: Duration) -> io::Result<()> {
        tracing::info!(peer = %self.peer, secs = limit.as_secs(), "no login in time; closing");
        self.close_with(&r(
            421,
            format!(
                "No login within {} s (login_timeout_secs); closing. Reconnect and send USER and PASS.",
                limit.as_secs()
            ),
        ));
        Ok(())
    }

    /// Send `reply` and close so that the client can read it: the write
    /// side is shut (FIN after the reply), then what the client still sends
    /// is read and dropped for a moment (at most 1 s and 64 KiB), since
    /// closing with unread input would reset the connection and the reset
    /// can discard the reply before the client reads it (RFC 1122
    /// §4.2.2.13).
    fn close_with(&mut self, reply: &Reply) {
        let _ = self.out.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = self.reply(reply);
        let _ = self.out.shutdown(Shutdown::Write);
        let until = Instant::now() + Duration::from_secs(1);
        let mut drained = 0usize;
        let mut sink = [0u8; 8192];
        while drained < 64 << 10 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.ctrl.get_ref().set_read_timeout(Some(left)).is_err() {
                break;
            }
            match self.ctrl.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        let _ = self.out.shutdown(Shutdown::Both);
    }

    /// The account whose share of the session memory budget this
    /// connection's sessions count against: the user name, or one account
    /// for all anonymous logins.
    fn mem_account(&self) -> String {
        match self.user.as_deref() {
            Some("anonymous" | "ftp") if !self.writable => "anonymous".into(),
            Some(u) => u.to_string(),
            None => String::new(),
        }
    }

    fn need_login(&self) -> Option<Reply> {
        self.user
            .is_none()
            .then(|| r(530, "Please log in with USER and PASS."))
    }

    fn need_write(&self) -> Option<Reply> {
        self.need_login()
            .or_else(|| (!self.writable).then(|| r(550, "Permission denied: read-only access.")))
    }

    fn path(&self, arg: &str) -> Result<(String, PathBuf), Reply> {
        if arg.is_empty() {
            return Err(r(501, "Missing path argument."));
        }
        resolve(&self.srv.root, &self.cwd, arg).map_err(|e| r(550, format!("{arg}: {e}.")))
    }

    /// The object at `real` (a path from [`Session::path`]), looked up by
    /// the kernel beneath the root at this moment (see [`confine`]).
    fn find(&self, real: &Path) -> io::Result<Found> {
        self.srv.confined.find(self.rel(real)?)
    }

    /// The name `real` inside its parent directory, looked up beneath the
    /// root (for create, rename, delete, mkdir).
    fn entry(&self, real: &Path) -> io::Result<Entry> {
        self.srv.confined.entry(self.rel(real)?)
    }

    fn rel<'a>(&self, real: &'a Path) -> io::Result<&'a Path> {
        real.strip_prefix(&self.srv.root)
            .map_err(|_| io::Error::new(io::ErrorKind::PermissionDenied, "outside the root"))
    }

    fn dispatch(&mut self, verb: &str, arg: &str) -> io::Result<Option<Reply>> {
        let open = matches!(
            verb,
            "USER" | "PASS" | "FEAT" | "SYST" | "NOOP" | "OPTS" | "QUIT"
        );
        if !open {
            if let Some(rep) = self.need_login() {
                // Unknown commands are still 500 before login.
                return Ok(Some(if known(verb) {
                    rep
                } else {
                    r(500, format!("Unknown command {verb:.32}."))
                }));
            }
        }
        let rep = match verb {
            "USER" => self.user_cmd(arg),
            "PASS" => self.pass_cmd(arg),
            "SYST" => r(215, "UNIX Type: L8"),
            "NOOP" => r(200, "OK."),
            "FEAT" => self.feat(),
            "OPTS" => self.opts(arg),
            "PWD" | "XPWD" => r(
                257,
                format!(
                    "\"{}\" is the current directory.",
                    self.cwd.replace('"', "\"\"")
                ),
            ),
            "CWD" | "XCWD" => self.cwd_cmd(arg),
            "CDUP" | "XCUP" => self.cwd_cmd(".."),
            "TYPE" => match arg.to_ascii_uppercase().as_str() {
                "I" | "L 8" | "L8" => r(200, "Type set to I."),
                "A" | "A N" => r(200, "Type set to A (transfers are binary)."),
                _ => r(504, "Type not supported."),
            },
            "MODE" => match arg.to_ascii_uppercase().as_str() {
                "S" => r(200, "Mode set to S."),
                _ => r(504, "Only stream mode is supported."),
            },
            "STRU" => match arg.to_ascii_uppercase().as_str() {
                "F" => r(200, "Structure set to F."),
                _ => r(504, "Only file structure is supported."),
            },
            "ALLO" => r(202, "No storage allocation necessary."),
            "ABOR" => r(226, "No transfer to abort."),
            "PASV" => self.pasv(false),
            "EPSV" => {
                if arg.eq_ignore_ascii_case("ALL") {
                    r(200, "EPSV ALL accepted.")
                } else {
                    self.pasv(true)
                }
            }
            "PORT" => self.port(arg, false),
            "EPRT" => self.port(arg, true),
            "REST" => match arg.trim().parse::<u64>() {
                Ok(n) => {
                    self.rest = n;
                    r(350, format!("Restarting at {n}. Send RETR, STOR or RRTR."))
                }
                Err(_) => r(501, "REST needs a byte offset."),
            },
            "SIZE" => match self.path(arg) {
                Ok((_, p)) => match self.find(&p).and_then(|f| fs::metadata(f.path())) {
                    Ok(m) if m.is_file() => r(213, m.len().to_string()),
                    Ok(_) => r(550, format!("{arg}: not a plain file.")),
                    Err(e) => io_reply(&e, arg),
                },
                Err(e) => e,
            },
            "MDTM" => match self.path(arg) {
                Ok((_, p)) => match self
                    .find(&p)
                    .and_then(|f| fs::metadata(f.path()))
                    .and_then(|m| m.modified())
                {
                    Ok(t) => r(213, util::mdtm(t)),
                    Err(e) => io_reply(&e, arg),
                },
                Err(e) => e,
            },
            "HASH" => self.hash(arg),
            "LIST" | "NLST" | "MLSD" => return self.listing(verb, arg),
            "RETR" => return self.retr(arg),
            "STOR" => return self.stor(arg),
            "DELE" => self.modify(arg, |p| fs::remove_file(p), 250, "Deleted."),
            "RMD" | "XRMD" => self.modify(arg, |p| fs::remove_dir(p), 250, "Directory removed."),
            "MKD" | "XMKD" => match self.need_write().map_or_else(|| self.path(arg), Err) {
                Ok((v, p)) => match self.entry(&p).and_then(|e| fs::create_dir(e.path())) {
                    Ok(()) => r(257, format!("\"{}\" created.", v.replace('"', "\"\""))),
                    Err(e) => io_reply(&e, arg),
                },
                Err(e) => e,
            },
            "RNFR" => match self.need_write().map_or_else(|| self.path(arg), Err) {
                Ok((_, p))
                    if self
                        .entry(&p)
                        .and_then(|e| fs::symlink_metadata(e.path()))
                        .is_ok() =>
                {
                    self.rnfr = Some(p);
                    return Ok(Some(r(350, "Ready for RNTO.")));
                }
                Ok(_) => r(550, format!("{arg}: no such file or directory.")),
                Err(e) => e,
            },
            "RNTO" => match (
                self.rnfr.take(),
                self.need_write().map_or_else(|| self.path(arg), Err),
            ) {
                (None, _) => r(503, "RNFR first."),
                (Some(from), Ok((_, to))) => match self
                    .entry(&from)
                    .and_then(|f| self.entry(&to).map(|t| (f, t)))
                    .and_then(|(f, t)| fs::rename(f.path(), t.path()))
                {
                    Ok(()) => r(250, "Renamed."),
                    Err(e) => io_reply(&e, arg),
                },
                (_, Err(e)) => e,
            },
            "RADR" => return self.radr(arg),
            "RSTR" => return self.rstr(arg),
            "RRTR" => return self.rrtr(arg),
            "" => r(500, "Empty command."),
            _ => r(500, format!("Unknown command {verb:.32}.")),
        };
        Ok(Some(rep))
    }

    fn user_cmd(&mut self, arg: &str) -> Reply {
        if self.srv.locked_out(self.peer.ip()) {
            return r(421, "Too many failed logins; try again later.");
        }
        if arg.is_empty() {
            return r(501, "USER needs a name.");
        }
        self.user = None;
        self.pending_user = Some(arg.to_string());
        r(331, "Password required.")
    }

    fn pass_cmd(&mut self, arg: &str) -> Reply {
        let ip = self.peer.ip();
        if self.srv.locked_out(ip) {
            return r(421, "Too many failed logins; try again later.");
        }
        let Some(user) = self.pending_user.take() else {
            return r(503, "Send USER first.");
        };
        match self.srv.check_password(&user, arg) {
            Some(write) => {
                tracing::info!(peer = %self.peer, %user, write, "login");
                lock(&self.srv.fails).by_ip.remove(&ip);
                self.user = Some(user);
                self.writable = write;
                r(230, "Logged in.")
            }
            None => {
                tracing::warn!(peer = %self.peer, %user, "failed login");
                self.srv.record_failure(ip);
                std::thread::sleep(Duration::from_millis(self.srv.cfg.login_fail_delay_ms));
                if self.srv.locked_out(ip) {
                    r(421, "Too many failed logins; try again later.")
                } else {
                    r(530, "Login incorrect.")
                }
            }
        }
    }

    fn feat(&self) -> Reply {
        let mut f = vec![
            "Extensions supported:",
            "EPRT",
            "EPSV",
            "MDTM",
            "SIZE",
            "REST STREAM",
            "MLST type*;size*;modify*;",
            "UTF8",
        ];
        let hash = format!(
            "HASH {}",
            self.srv
                .hashes
                .iter()
                .map(|a| {
                    let star = if *a == self.hash_algo { "*" } else { "" };
                    format!("{a}{star}")
                })
                .collect::<Vec<_>>()
                .join(";")
        );
        f.push(&hash);
        if self.srv.cfg.rdma {
            f.extend(["RADR", "RSTR", "RRTR"]);
        }
        let mut text: String = f.iter().map(|l| format!("{l}\n")).collect();
        text.push_str("End");
        r(211, text)
    }

    fn opts(&mut self, arg: &str) -> Reply {
        let up = arg.to_ascii_uppercase();
        let mut it = up.split_whitespace();
        match (it.next(), it.next(), it.next()) {
            (Some("UTF8"), Some("ON") | None, _) => r(200, "UTF8 is always on."),
            (Some("HASH"), None, _) => r(200, self.hash_algo.wire_name()),
            // draft-bryan-ftpext-hash §4: 200 and the algorithm selected;
            // one the server does not offer gets 501 and the selection
            // stays; the reply names what is offered, so the client can
            // choose again.
            (Some("HASH"), Some(a), _) => match a.parse::<Algo>() {
                Ok(algo) if self.srv.hashes.contains(&algo) => {
                    self.hash_algo = algo;
                    self.hash_during = true;
                    r(200, algo.wire_name())
                }
                _ => r(
                    501,
                    format!(
                        "Unknown algorithm {a:.32}, current selection not changed; this server \
                         offers {} (FEAT HASH).",
                        Algo::list(&self.srv.hashes)
                    ),
                ),
            },
            (Some("MLST"), _, _) => r(200, "MLST OPTS type;size;modify;"),
            (Some("RDMA"), Some("MEM"), Some(v)) if self.srv.cfg.rdma => {
                if self.user.is_none() {
                    return r(530, "Please log in first.");
                }
                self.mem = v == "ON";
                r(
                    200,
                    format!(
                        "Memory-to-memory mode {}.",
                        if self.mem { "on" } else { "off" }
                    ),
                )
            }
            _ => r(501, "Option not understood."),
        }
    }

    fn cwd_cmd(&mut self, arg: &str) -> Reply {
        match self.path(if arg.is_empty() { "/" } else { arg }) {
            Ok((v, p)) if self.find(&p).is_ok_and(|f| f.path().is_dir()) => {
                self.cwd = v;
                r(250, format!("Directory changed to {}.", self.cwd))
            }
            Ok(_) => r(550, format!("{arg}: no such directory.")),
            Err(e) => e,
        }
    }

    fn modify(
        &mut self,
        arg: &str,
        f: impl Fn(&Path) -> io::Result<()>,
        code: u32,
        ok: &str,
    ) -> Reply {
        match self.need_write().map_or_else(|| self.path(arg), Err) {
            Ok((v, p)) => {
                if v == "/" {
                    return r(550, "The root cannot be changed.");
                }
                match self.entry(&p).and_then(|e| f(&e.path())) {
                    Ok(()) => r(code, ok),
                    Err(e) => io_reply(&e, arg),
                }
            }
            Err(e) => e,
        }
    }

    fn hash(&mut self, arg: &str) -> Reply {
        match self.path(arg) {
            Ok((_, p)) => match self
                .find(&p)
                .and_then(|f| fs::metadata(f.path()).map(|m| (f, m)))
            {
                Ok((f, m)) if m.is_file() => {
                    let algo = self.hash_algo;
                    let range = format!("0-{}", m.len().saturating_sub(1));
                    if let Some(d) = self.served_digest(&p, algo) {
                        tracing::debug!(peer = %self.peer, file = %arg, "HASH from the transfer's running digest");
                        return r(213, format!("{algo} {range} {d} {arg}"));
                    }
                    match checksum::file_digest(&f.path(), algo) {
                        Ok(h) => r(213, format!("{algo} {range} {h} {arg}")),
                        Err(e) => io_reply(&e, arg),
                    }
                }
                Ok(_) => r(553, format!("{arg}: not a plain file.")),
                Err(e) => io_reply(&e, arg),
            },
            Err(e) => e,
        }
    }

    /// The digest a transfer computed of `path`, if the file is unchanged.
    fn served_digest(&self, path: &Path, algo: Algo) -> Option<String> {
        let id = FileId::of(path)?;
        self.served
            .iter()
            .rev()
            .find(|s| s.path == path && s.algo == algo && s.id == id)
            .map(|s| s.digest.clone())
    }

    /// Remember the digest of the whole file `path`, computed by a
    /// transfer that covered all `bytes` of it; `before` is the file's
    /// identity when the transfer began (None: a new file).
    fn record_digest(&mut self, path: &Path, run: Option<Running>, before: Option<FileId>) {
        let Some(run) = run else { return };
        let Some(id) = FileId::of(path) else { return };
        if run.bytes() != id.size || before.is_some_and(|b| b != id) {
            return; // partial, or the file changed meanwhile
        }
        let algo = run.algo();
        self.served.retain(|s| s.path != path);
        if self.served.len() >= SERVED_KEEP {
            self.served.remove(0);
        }
        self.served.push(Served {
            path: path.to_path_buf(),
            algo,
            id,
            digest: run.finish(),
        });
    }

    fn pasv(&mut self, extended: bool) -> Reply {
        let ip = self.local.ip();
        let l = match TcpListener::bind(SocketAddr::new(ip, 0)) {
            Ok(l) => l,
            Err(e) => return r(425, format!("Cannot open a data port: {e}")),
        };
        let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
        self.data = DataMode::Passive(l);
        if extended {
            r(229, format!("Entering Extended Passive Mode (|||{port}|)"))
        } else {
            // An IPv4 client of a dual-stack listener: its IPv4 address.
            match ip.to_canonical() {
                IpAddr::V4(v4) => {
                    let o = v4.octets();
                    r(
                        227,
                        format!(
                            "Entering Passive Mode ({},{},{},{},{},{})",
                            o[0],
                            o[1],
                            o[2],
                            o[3],
                            port >> 8,
                            port & 255
                        ),
                    )
                }
                IpAddr::V6(_) => r(522, "Use EPSV on IPv6."),
            }
        }
    }

    fn port(&mut self, arg: &str, extended: bool) -> Reply {
        let parsed = if extended {
            cmdline::parse_eprt(arg)
        } else {
            cmdline::parse_port(arg)
        };
        let addr = match parsed {
            Ok(a) => a,
            Err(e) => return e,
        };
        // No FTP bounce (RFC 2577 §3): data goes to the client only,
        // compared canonically (EPRT |1|a.b.c.d| from a client that a
        // dual-stack listener sees as ::ffff:a.b.c.d is that client).
        if !same_host(addr.ip(), self.peer.ip()) || addr.port() < 1024 {
            return r(
                504,
                "PORT/EPRT must name your own address and a port >= 1024.",
            );
        }
        self.data = DataMode::Active(addr);
        r(200, "PORT command successful.")
    }

    fn open_data(&mut self) -> Result<TcpStream, Reply> {
        let t = Duration::from_secs(self.srv.cfg.data_timeout_secs.max(1));
        let s = match std::mem::replace(&mut self.data, DataMode::None) {
            DataMode::None => return Err(r(425, "Use PASV, EPSV, PORT or EPRT first.")),
            DataMode::Active(a) => TcpStream::connect_timeout(&a, t)
                .map_err(|e| r(425, format!("Cannot open data connection: {e}")))?,
            DataMode::Passive(l) => {
                l.set_nonblocking(true).map_err(|e| r(425, e.to_string()))?;
                let start = Instant::now();
                loop {
                    match l.accept() {
                        Ok((s, a)) if same_host(a.ip(), self.peer.ip()) => break s,
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if start.elapsed() > t {
                                return Err(r(425, "No data connection arrived in time."));
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(r(425, format!("Data connection failed: {e}"))),
                    }
                }
            }
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(t));
        let _ = s.set_write_timeout(Some(t));
        Ok(s)
    }

    fn listing(&mut self, verb: &str, arg: &str) -> io::Result<Option<Reply>> {
        // Options like "-la" (sent by some clients) are ignored.
        let target = arg
            .split_whitespace()
            .filter(|a| !a.starts_with('-'))
            .collect::<Vec<_>>()
            .join(" ");
        let (_, p) = match self.path(if target.is_empty() { "." } else { &target }) {
            Ok(x) => x,
            Err(e) => return Ok(Some(e)),
        };
        let mut lines = Vec::new();
        // The directory is looked up beneath the root; its entries are
        // listed as they are (a symlink as a symlink, never followed).
        let found = match self.find(&p) {
            Ok(f) => f,
            Err(e) => return Ok(Some(io_reply(&e, &target))),
        };
        match fs::metadata(found.path()) {
            Ok(m) if m.is_dir() => {
                let mut names: Vec<_> = match fs::read_dir(found.path()) {
                    Ok(rd) => rd.filter_map(Result::ok).collect(),
                    Err(e) => return Ok(Some(io_reply(&e, &target))),
                };
                names.sort_by_key(|e| e.file_name());
                for e in names {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let Ok(md) = e.metadata() else { continue };
                    lines.push(match verb {
                        "NLST" => name,
                        "MLSD" => util::mlsd_line(&name, &md),
                        _ => util::list_line(&name, &md),
                    });
                }
            }
            Ok(m) if verb != "MLSD" => {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                lines.push(if verb == "NLST" {
                    target.clone()
                } else {
                    util::list_line(&name, &m)
                });
            }
            Ok(_) => return Ok(Some(r(501, "MLSD needs a directory."))),
            Err(e) => return Ok(Some(io_reply(&e, &target))),
        }
        let mut data = match self.open_data() {
            Ok(d) => d,
            Err(e) => return Ok(Some(e)),
        };
        self.reply(&r(150, "Here comes the listing."))?;
        let mut text = lines.join("\r\n");
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        Ok(Some(match data.write_all(text.as_bytes()) {
            Ok(()) => r(226, "Listing sent."),
            Err(e) => r(426, format!("Listing aborted: {e}")),
        }))
    }

    fn retr(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        let (_, p) = match self.path(arg) {
            Ok(x) => x,
            Err(e) => return Ok(Some(e)),
        };
        let offset = self.rest;
        let found = match self.find(&p) {
            Ok(f) => f,
            Err(e) => return Ok(Some(io_reply(&e, arg))),
        };
        let mut f = match fs::metadata(found.path()) {
            Ok(m) if m.is_file() => match fs::File::open(found.path()) {
                Ok(f) => f,
                Err(e) => return Ok(Some(io_reply(&e, arg))),
            },
            Ok(_) => return Ok(Some(r(550, format!("{arg}: not a plain file.")))),
            Err(e) => return Ok(Some(io_reply(&e, arg))),
        };
        if offset > 0 {
            use std::io::Seek;
            if let Err(e) = f.seek(io::SeekFrom::Start(offset)) {
                return Ok(Some(io_reply(&e, arg)));
            }
        }
        let mut data = match self.open_data() {
            Ok(d) => d,
            Err(e) => return Ok(Some(e)),
        };
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        let before = FileId::of(&p);
        self.reply(&r(
            150,
            format!(
                "Opening BINARY data connection for {arg} ({} bytes).",
                size.saturating_sub(offset)
            ),
        ))?;
        // A whole file is hashed as it is sent, for a HASH that follows.
        let mut src = HashRead {
            inner: f,
            run: self.hash_during.then(|| Running::new(self.hash_algo)),
        };
        let res = io::copy(&mut src, &mut data);
        let _ = data.shutdown(Shutdown::Write);
        Ok(Some(match res {
            Ok(n) => {
                tracing::info!(peer = %self.peer, file = %arg, bytes = n, offset, "RETR done");
                if offset == 0 {
                    self.record_digest(&p, src.run, before);
                }
                r(226, "Transfer complete.")
            }
            Err(e) => r(426, format!("Transfer aborted: {e}")),
        }))
    }

    /// A temporary name beside `target`, for uploads.
    fn temp_for(target: &Path) -> PathBuf {
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        target.with_file_name(format!(
            ".{name}.rftp-part-{:08x}",
            rdma_xfer::random_u64() as u32
        ))
    }

    fn stor(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        let (_, p) = match self.need_write().map_or_else(|| self.path(arg), Err) {
            Ok(x) => x,
            Err(e) => return Ok(Some(e)),
        };
        if self.find(&p).is_ok_and(|f| f.path().is_dir()) {
            return Ok(Some(r(550, format!("{arg}: is a directory."))));
        }
        let offset = self.rest;
        let (target, tmp, mut f) = match self.create_temp(&p) {
            Ok(x) => x,
            Err(e) => return Ok(Some(io_reply(&e, arg))),
        };
        if offset > 0 {
            // Resume: continue the existing file (copied into the temp file
            // through its own handle, never by name).
            let copied = self
                .find(&p)
                .and_then(|src| fs::File::open(src.path()))
                .and_then(|mut src| io::copy(&mut (&mut src).take(offset), &mut f))
                .and_then(|_| f.set_len(offset));
            if let Err(e) = copied {
                let _ = fs::remove_file(tmp.path());
                return Ok(Some(io_reply(&e, arg)));
            }
            use std::io::Seek;
            let _ = f.seek(io::SeekFrom::Start(offset));
        }
        let mut data = match self.open_data() {
            Ok(d) => d,
            Err(e) => {
                let _ = fs::remove_file(tmp.path());
                return Ok(Some(e));
            }
        };
        self.reply(&r(150, format!("Ready to receive {arg}.")))?;
        let mut dst = HashWrite {
            inner: f,
            run: self.hash_during.then(|| Running::new(self.hash_algo)),
            journal: None,
        };
        let res = copy_in(&mut data, &mut dst)
            .and_then(|n| dst.inner.sync_data().map(|_| n).map_err(CopyErr::Write));
        let HashWrite { inner: f, run, .. } = dst;
        drop(f);
        Ok(Some(match res {
            Ok(n) => match fs::rename(tmp.path(), target.path()) {
                Ok(()) => {
                    tracing::info!(peer = %self.peer, file = %arg, bytes = n, "STOR done");
                    if offset == 0 {
                        self.record_digest(&p, run, None);
                    }
                    r(226, "Transfer complete.")
                }
                Err(e) => {
                    let _ = fs::remove_file(tmp.path());
                    io_reply(&e, arg)
                }
            },
            Err(CopyErr::Read(e)) => {
                let _ = fs::remove_file(tmp.path());
                // The data connection's read timeout shows as EAGAIN.
                let why = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                        "no data on the data connection for {} s (data_timeout_secs)",
                        self.srv.cfg.data_timeout_secs.max(1)
                    ),
                    _ => e.to_string(),
                };
                r(426, format!("Connection lost; upload discarded: {why}"))
            }
            Err(CopyErr::Write(e)) => {
                let _ = fs::remove_file(tmp.path());
                io_reply(&e, arg)
            }
        }))
    }

    /// The upload's temporary file beside `target`, created exclusively
    /// and without following a symlink, both names looked up beneath the
    /// root: (target's entry, temp's entry, the open file).
    fn create_temp(&self, target: &Path) -> io::Result<(Entry, Entry, fs::File)> {
        use std::os::unix::fs::OpenOptionsExt;
        let t = self.entry(target)?;
        let tmp = self.entry(&Self::temp_for(target))?;
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp.path())?;
        Ok((t, tmp, f))
    }

    fn radr(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        if !self.srv.cfg.rdma {
            return Ok(Some(r(502, "RDMA extension disabled.")));
        }
        let srv = self.srv.clone();
        let c = &srv.cfg;
        let mut want = rdma_xfer::Config {
            streams: c.max_streams,
            block_size: c.block_size,
            iodepth: c.iodepth,
            crc: c.crc,
            device: c.device.clone(),
            congestion: c.congestion.clone(),
            timeout: Duration::from_secs(c.data_timeout_secs.max(1)),
            ..rdma_xfer::Config::default()
        };
        let asked = match cmdline::parse_radr(arg) {
            Ok(a) => a,
            Err(e) => return Ok(Some(e)),
        };
        if let Some(n) = asked.streams {
            want.streams = n.clamp(1, c.max_streams);
        }
        if let Some(n) = asked.block_size {
            want.block_size = n.clamp(rdma_xfer::MIN_BLOCK, c.block_size.max(rdma_xfer::MIN_BLOCK));
        }
        if let Some(n) = asked.depth {
            want.iodepth = n.clamp(1, c.max_iodepth.max(c.iodepth).max(1));
        }
        let mode = asked.mode.unwrap_or(Mode::Rdma);
        self.xfer = None;
        self.xfer_mem = None;
        let need = session_bytes(&want);
        let account = self.mem_account();
        let mut reservation = match MemReservation::take(&srv, &account, need) {
            Ok(m) => m,
            Err(MemRefusal::Server { free }) => {
                tracing::warn!(peer = %self.peer, need, free, "RADR refused: session memory budget");
                return Ok(Some(r(
                    452,
                    format!(
                        "RADR refused: this session needs {} of buffer memory and the server's \
                         session_mem_budget_bytes has {} free (other sessions hold the rest); \
                         retry later or ask for fewer STREAMS, DEPTH or a smaller BS.",
                        mib(need),
                        mib(free)
                    ),
                )));
            }
            Err(MemRefusal::User { held, share }) => {
                tracing::warn!(peer = %self.peer, user = %account, need, held, share, "RADR refused: per-login share of the session memory budget");
                return Ok(Some(r(
                    452,
                    format!(
                        "RADR refused: this session needs {} of buffer memory and your login \
                         ({account}) already holds {} of its {} share \
                         (session_mem_per_user_bytes) in other sessions; end one of them or ask \
                         for fewer STREAMS, DEPTH or a smaller BS.",
                        mib(need),
                        mib(held),
                        mib(share)
                    ),
                )));
            }
        };
        // An IPv4 client of a dual-stack listener is served, and checked,
        // on IPv4: the session listener binds the canonical local address
        // and accepts the canonical peer, so both sides of the rdma-xfer
        // check see the same family.
        let l = match rdma_xfer::XferListener::bind(
            SocketAddr::new(self.local.ip().to_canonical(), c.rdma_port),
            mode,
            want.clone(),
        ) {
            Ok(l) => l,
            Err(e) => {
                let hint = if c.rdma_port != 0 {
                    " (rdma_port is fixed: another RADR session may hold it; retry later)"
                } else {
                    ""
                };
                return Ok(Some(r(
                    425,
                    format!("Cannot open the RDMA listener: {e}{hint}"),
                )));
            }
        };
        let l = if c.rdma_bind_peer {
            l.only_from(self.peer.ip().to_canonical())
        } else {
            l
        };
        let shown = match &c.rdma_advertise {
            None => l.local_addr(),
            Some(a) => match a.parse::<SocketAddr>() {
                Ok(sa) => sa,
                Err(_) => match a.parse::<IpAddr>() {
                    Ok(ip) => SocketAddr::new(ip, l.local_addr().port()),
                    Err(_) => {
                        tracing::error!(rdma_advertise = %a, "rdma_advertise is neither IP nor IP:PORT");
                        return Ok(Some(r(
                            425,
                            "Server misconfigured: rdma_advertise is neither IP nor IP:PORT.",
                        )));
                    }
                },
            },
        };
        self.reply(&r(
            200,
            format!(
                "RADR ADDR={} TOKEN={:016x} MODE={mode} STREAMS={}",
                shown,
                l.token(),
                want.streams
            ),
        ))?;
        match l.accept(Duration::from_secs(c.data_timeout_secs.max(1))) {
            Ok(t) => {
                tracing::info!(peer = %self.peer, %mode, streams = t.config().streams, block_size = t.config().block_size, iodepth = t.config().iodepth, "transfer session established");
                reservation.shrink(session_bytes(t.config()));
                self.xfer = Some(t);
                self.xfer_mem = Some(reservation);
            }
            Err(e) => tracing::warn!(peer = %self.peer, %e, "transfer session setup failed"),
        }
        Ok(None)
    }

    fn rstr(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        if let Some(e) = self.need_write() {
            return Ok(Some(e));
        }
        if self.xfer.is_none() {
            return Ok(Some(r(425, "No transfer session: send RADR first.")));
        }
        // A file is hashed as its blocks are written, for a HASH that
        // follows; memory mode writes nowhere.
        // (path, target's entry, temp's entry, the temp file held open).
        type Upload = (PathBuf, Entry, Entry, fs::File);
        let (upload, mut sink): (Option<Upload>, Option<HashSink<FileWriter>>) = if self.mem {
            (None, None)
        } else {
            let (_, p) = match self.path(arg) {
                Ok(x) => x,
                Err(e) => return Ok(Some(e)),
            };
            if self.find(&p).is_ok_and(|f| f.path().is_dir()) {
                return Ok(Some(r(550, format!("{arg}: is a directory."))));
            }
            let (target, tmp, file) = match self.create_temp(&p) {
                Ok(x) => x,
                Err(e) => return Ok(Some(io_reply(&e, arg))),
            };
            // The writer reopens the file just created (by its descriptor,
            // not its name) to choose O_DIRECT.
            let fd_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            match FileWriter::create(&fd_path, 0, true) {
                Ok(w) => (
                    Some((p, target, tmp, file)),
                    Some(HashSink {
                        inner: w,
                        run: self.hash_during.then(|| Running::new(self.hash_algo)),
                        journal: None,
                    }),
                ),
                Err(e) => {
                    let _ = fs::remove_file(tmp.path());
                    return Ok(Some(io_reply(&e, arg)));
                }
            }
        };
        self.reply(&r(150, "Ready to receive over RDMA."))?;
        let res = self.xfer.as_mut().map(|x| match sink.as_mut() {
            Some(s) => x.recv(s),
            None => x.recv(&mut NullSink::default()),
        });
        let run = sink.map(|HashSink { inner, run, .. }| {
            drop(inner);
            run
        });
        Ok(Some(match res {
            Some(Ok(st)) => {
                let ok = match &upload {
                    Some((_, target, tmp, _)) => fs::rename(tmp.path(), target.path()),
                    None => Ok(()),
                };
                match ok {
                    Ok(()) => {
                        tracing::info!(peer = %self.peer, file = %arg, bytes = st.bytes, gbps = st.bits_per_sec() / 1e9, "RSTR done");
                        if let (Some((p, ..)), Some(run)) = (&upload, run) {
                            self.record_digest(p, run, None);
                        }
                        r(
                            226,
                            format!(
                                "Transfer complete: {} bytes in {:.3} s.",
                                st.bytes,
                                st.elapsed.as_secs_f64()
                            ),
                        )
                    }
                    Err(e) => io_reply(&e, arg),
                }
            }
            Some(Err(e)) => {
                if let Some((_, _, tmp, _)) = &upload {
                    let _ = fs::remove_file(tmp.path());
                }
                self.xfer = None;
                self.xfer_mem = None;
                match e {
                    rdma_xfer::Error::Local(io) => io_reply(&io, arg),
                    e => r(426, format!("Transfer failed; upload discarded: {e}")),
                }
            }
            None => r(425, "No transfer session."),
        }))
    }

    fn rrtr(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        if self.xfer.is_none() {
            return Ok(Some(r(425, "No transfer session: send RADR first.")));
        }
        // A whole file is hashed as it is read, for a HASH that follows.
        let mut whole: Option<(PathBuf, Option<FileId>, HashSource<FileReader>)> = None;
        let mut held: Option<Found> = None;
        let mut src: Box<dyn BlockSource> = if self.mem {
            match util::parse_size(arg) {
                Ok(n) if n <= self.srv.cfg.max_mem_bytes => Box::new(ZeroSource::new(n)),
                Ok(_) => return Ok(Some(r(552, "Size above the server's max_mem_bytes."))),
                Err(e) => return Ok(Some(r(501, e))),
            }
        } else {
            let (_, p) = match self.path(arg) {
                Ok(x) => x,
                Err(e) => return Ok(Some(e)),
            };
            let found = match self.find(&p) {
                Ok(f) => f,
                Err(e) => return Ok(Some(io_reply(&e, arg))),
            };
            if !found.path().is_file() {
                return Ok(Some(r(550, format!("{arg}: not a plain file."))));
            }
            let before = FileId::of(&p);
            // The reader may reopen its file (to drop O_DIRECT): it does so
            // through `found`, which stays alive until the transfer ends.
            let opened = FileReader::open(&found.path(), self.rest, true);
            held = Some(found);
            match opened {
                Ok(f) if self.rest == 0 => {
                    whole = Some((
                        p,
                        before,
                        HashSource {
                            inner: f,
                            run: self.hash_during.then(|| Running::new(self.hash_algo)),
                        },
                    ));
                    Box::new(ZeroSource::new(0))
                }
                Ok(f) => Box::new(f),
                Err(e) => return Ok(Some(io_reply(&e, arg))),
            }
        };
        let len = match &whole {
            Some((_, _, h)) => h.len_hint(),
            None => src.len_hint(),
        }
        .unwrap_or(0);
        self.reply(&r(150, format!("Sending {len} bytes over RDMA.")))?;
        let res = self.xfer.as_mut().map(|x| match whole.as_mut() {
            Some((_, _, h)) => x.send(h),
            None => x.send(&mut src),
        });
        // The reader is done with its file: the pinned lookup may go.
        drop(src);
        drop(held);
        Ok(Some(match res {
            Some(Ok(st)) => {
                tracing::info!(peer = %self.peer, file = %arg, bytes = st.bytes, gbps = st.bits_per_sec() / 1e9, "RRTR done");
                if let Some((p, before, h)) = whole {
                    self.record_digest(&p, h.run, before);
                }
                r(
                    226,
                    format!(
                        "Transfer complete: {} bytes in {:.3} s.",
                        st.bytes,
                        st.elapsed.as_secs_f64()
                    ),
                )
            }
            Some(Err(e)) => {
                self.xfer = None;
                self.xfer_mem = None;
                match e {
                    rdma_xfer::Error::Local(io) => io_reply(&io, arg),
                    e => r(426, format!("Transfer failed: {e}")),
                }
            }
            None => r(425, "No transfer session."),
        }))
    }
}

fn known(verb: &str) -> bool {
    matches!(
        verb,
        "CWD"
            | "XCWD"
            | "CDUP"
            | "XCUP"
            | "PWD"
            | "XPWD"
            | "LIST"
            | "NLST"
            | "MLSD"
            | "RETR"
            | "STOR"
            | "DELE"
            | "MKD"
            | "XMKD"
            | "RMD"
            | "XRMD"
            | "RNFR"
            | "RNTO"
            | "TYPE"
            | "MODE"
            | "STRU"
            | "PORT"
            | "PASV"
            | "EPRT"
            | "EPSV"
            | "SIZE"
            | "MDTM"
            | "REST"
            | "HASH"
            | "RADR"
            | "RSTR"
            | "RRTR"
            | "ALLO"
            | "ABOR"
    )
}

enum CopyErr {
    Read(io::Error),
    Write(io::Error),
}

fn copy_in(src: &mut impl Read, dst: &mut impl Write) -> Result<u64, CopyErr> {
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    loop {
        let k = match src.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyErr::Read(e)),
        };
        dst.write_all(&buf[..k]).map_err(CopyErr::Write)?;
        n += k as u64;
    }
}
