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
//!
//! The modules, by role (each imports only the ones above it in this list
//! that it needs; none imports this parent):
//!
//! - `config`: the TOML configuration and its defaults.
//! - `state`: what all sessions share (limits, lockouts, the memory
//!   budget).
//! - `served`: digests of files a session just moved.
//! - `session`: one control connection, its command loop and helpers.
//! - `dispatch`: the command table, login, FEAT/OPTS, directories.
//! - `hash`: the `HASH` command.
//! - `data`: PASV/PORT, listings, RETR and STOR.
//! - `rdma`: RADR, RSTR and RRTR.
//! - `listener`: the accept loop and the connection limits.

mod config;
mod data;
mod dispatch;
mod hash;
mod listener;
mod rdma;
mod served;
mod session;
mod state;

pub use config::{
    ServerConfig, User, DEFAULT_LOGIN_TIMEOUT_SECS, DEFAULT_SESSION_MEM_BUDGET,
    DEFAULT_SESSION_MEM_PER_USER, PRE_LOGIN_MAX_BYTES,
};
pub use listener::serve;
