//! rftpd's configuration: the TOML file (`rftpd --config`) with its
//! `RFTPD_SET_KEY=value` environment overrides, read through the shared
//! loader ([`iwarp_conf::load`]; precedence and prefixes in
//! [`crate::config`]), its users and the limits' defaults (documented in
//! docs/RFTP.md).

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, Error as _};
use serde::Deserialize;

use crate::checksum::{self, Algo};
use crate::config::RFTPD_ENV_PREFIX;

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
    #[serde(deserialize_with = "iwarp_conf::de::size")]
    pub max_mem_bytes: u64,
    /// Buffer memory all transfer sessions together may hold (RADR): each
    /// session reserves the most its pools can register, 2 x streams x
    /// depth x block size, when it is set up, and gives it back when it
    /// ends. A RADR that does not fit gets 452.
    #[serde(deserialize_with = "iwarp_conf::de::size")]
    pub session_mem_budget_bytes: u64,
    /// The share of `session_mem_budget_bytes` the sessions of one login
    /// (user name; all anonymous logins count as one) may hold together, so
    /// that one account with many control connections cannot take the
    /// whole budget. A RADR over it gets 452.
    #[serde(deserialize_with = "iwarp_conf::de::size")]
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
    #[serde(deserialize_with = "advertise")]
    pub rdma_advertise: Option<String>,
    /// The checksums `HASH` offers, in the server's order (FEAT `HASH`
    /// line; `OPTS HASH` may select only these): XXH3-128, BLAKE3, SHA-256,
    /// CRC32C. `["SHA-256"]` behaves as a server from before the
    /// negotiation.
    #[serde(deserialize_with = "hash_algorithms")]
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
    /// Reads the TOML file at `path` (none: the defaults) with the
    /// process's `RFTPD_SET_*` variables over it. Every value is checked
    /// here, so an error names its line or variable, the key and the fix.
    pub fn load(path: Option<&Path>) -> Result<ServerConfig, String> {
        Self::load_from(path, std::env::vars_os())
    }

    /// [`ServerConfig::load`] with the environment given (tests).
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<ServerConfig, String> {
        iwarp_conf::load_from(path, RFTPD_ENV_PREFIX, env)
    }

    /// `hash_algorithms` as algorithms; an unknown name or an empty list
    /// is an error naming the known ones.
    pub fn offered_hashes(&self) -> Result<Vec<Algo>, String> {
        offered(&self.hash_algorithms)
    }
}

/// Checksum names as algorithms; an unknown name or an empty list is an
/// error naming the known ones.
fn offered(names: &[String]) -> Result<Vec<Algo>, String> {
    let v = names
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

/// `rdma_advertise`: `IP` or `IP:PORT`.
fn advertise<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let a = String::deserialize(d)?;
    if a.parse::<SocketAddr>().is_err() && a.parse::<IpAddr>().is_err() {
        return Err(D::Error::custom(format!(
            "{a:?} is neither IP nor IP:PORT (fix: the address clients should connect to, \
             such as \"192.0.2.7\" or \"192.0.2.7:7000\")"
        )));
    }
    Ok(Some(a))
}

/// `hash_algorithms`: known names, at least one.
fn hash_algorithms<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    offered(&names).map_err(|e| D::Error::custom(format!("{e} (fix: list some of those)")))?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    fn load(text: &str, vars: &[(&str, &str)]) -> Result<ServerConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("rftpd.toml");
        std::fs::write(&f, text).unwrap();
        ServerConfig::load_from(Some(&f), env(vars))
            .map_err(|e| e.replace(&f.display().to_string(), "FILE"))
    }

    const FILE: &str = "listen = \"127.0.0.1:0\"\nroot = \"/srv\"\nmax_streams = 4\n\
                        session_mem_budget_bytes = 1073741824\n\n[[users]]\nname = \"ann\"\n\
                        password = \"x\"\n";

    #[test]
    fn the_environment_overrides_the_file() {
        let c = load(FILE, &[]).unwrap();
        assert_eq!((c.max_streams, c.users.len()), (4, 1));
        let c = load(
            FILE,
            &[
                ("RFTPD_SET_MAX_STREAMS", "8"),
                ("RFTPD_SET_LISTEN", "0.0.0.0:2121"), // text, not TOML
                ("RFTPD_SET_SESSION_MEM_BUDGET_BYTES", "2G"),
                ("RFTPD_SET_RDMA", "false"),
                ("RFTPD_SET_HASH_ALGORITHMS", "[\"SHA-256\"]"),
                ("RFTPD_CONFINE_FALLBACK", "1"), // rftpd's other variable
                ("RFTP_SET_STREAMS", "2"),       // rftp's
            ],
        )
        .unwrap();
        assert_eq!(c.max_streams, 8);
        assert_eq!(c.listen, "0.0.0.0:2121");
        assert_eq!(c.session_mem_budget_bytes, 2 << 30);
        assert!(!c.rdma);
        assert_eq!(c.offered_hashes(), Ok(vec![Algo::Sha256]));
        assert_eq!(
            c.root,
            Path::new("/srv"),
            "what the variables leave is the file's"
        );
        // No file: the variables over the defaults.
        let c = ServerConfig::load_from(None, env(&[("RFTPD_SET_MAX_PER_IP", "2")])).unwrap();
        assert_eq!((c.max_per_ip, c.max_connections), (2, 64));
    }

    #[test]
    fn a_bad_key_or_value_names_its_line_or_variable_and_the_fix() {
        let e = load("root = \"/srv\"\nmax_stream = 4\n", &[]).unwrap_err();
        assert!(
            e.starts_with("FILE:2: key `max_stream`: unknown field"),
            "{e}"
        );
        assert!(e.contains("correct its spelling"), "{e}");
        let e = load(FILE, &[("RFTPD_SET_MAX_STREAM", "4")]).unwrap_err();
        assert!(
            e.starts_with("environment RFTPD_SET_MAX_STREAM=\"4\": key `max_stream`: unknown"),
            "{e}"
        );
        let e = load("[[users]]\nname = \"a\"\nwritable = true\n", &[]).unwrap_err();
        assert!(
            e.starts_with("FILE:3: key `writable`: unknown field"),
            "{e}"
        );
        for (text, line, key, fix) in [
            (
                "rdma_advertise = \"here\"\n",
                1,
                "rdma_advertise",
                "192.0.2.7:7000",
            ),
            (
                "\nhash_algorithms = [\"MD5\"]\n",
                2,
                "hash_algorithms",
                "known: XXH3-128",
            ),
            (
                "hash_algorithms = []\n",
                1,
                "hash_algorithms",
                "list some of those",
            ),
            (
                "max_mem_bytes = \"lots\"\n",
                1,
                "max_mem_bytes",
                "such as 64M",
            ),
            ("max_streams = \"8\"\n", 1, "max_streams", "expected type"),
        ] {
            let e = load(text, &[]).unwrap_err();
            assert!(e.starts_with(&format!("FILE:{line}: key `{key}`:")), "{e}");
            assert!(e.contains(fix), "{e}");
        }
        let e = load(FILE, &[("RFTPD_SET_RDMA_ADVERTISE", "here")]).unwrap_err();
        assert!(
            e.starts_with("environment RFTPD_SET_RDMA_ADVERTISE=\"here\": key `rdma_advertise`:"),
            "{e}"
        );
        assert!(e.contains("or unset RFTPD_SET_RDMA_ADVERTISE"), "{e}");
    }
}
