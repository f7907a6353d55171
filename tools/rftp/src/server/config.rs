//! rftpd's configuration: the TOML file (`rftpd --config`), its users and
//! the limits' defaults (documented in docs/RFTP.md).

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::checksum::{self, Algo};

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
