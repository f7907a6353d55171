//! # RFTP: FTP with an RDMA data path
//!
//! - [`server`]: `rftpd`, an FTP server (RFC 959, RFC 2389 FEAT/OPTS,
//!   RFC 3659 SIZE/MDTM/REST/MLSD, RFC 2428 EPRT/EPSV, the `HASH` draft)
//!   with the RDMA extension `RADR` / `RSTR` / `RRTR`, whose payload moves
//!   through [`rdma_xfer`].
//! - [`client`]: the FTP client side used by the `rftp` binary.
//! - [`shell`]: the interactive mode of `rftp` (ftp(1)-style prompt).
//! - [`config`]: rftp's configuration file and `RFTP_SET_*` variables
//!   (rftpd's: [`server::ServerConfig`]).
//! - [`cli`]: progress bar and summary line shared by the binaries.
//! - [`reply`]: FTP replies as the client reads them (bounded), the PASV,
//!   EPSV and RADR reply addresses, and the check that they name the
//!   control connection's peer.
//! - [`util`]: path confinement, listings, time stamps, SHA-256.
//!
//! The extension (see `docs/RFTP.md`):
//!
//! ```text
//! C: RADR STREAMS=8 MODE=rdma BS=1048576 DEPTH=4
//! S: 200 RADR ADDR=127.0.0.1:40123 TOKEN=9f1c... MODE=rdma STREAMS=8
//!    (the client connects an rdma-xfer session to ADDR with TOKEN)
//! C: RSTR name            C: RRTR name
//! S: 150 ...              S: 150 ... (size)
//!    payload over RDMA       payload over RDMA
//! S: 226 ...              S: 226 ...
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod checksum;
pub mod cli;
pub mod client;
pub mod cmdline;
pub mod config;
pub mod confine;
pub mod hash_xxh3;
pub mod reply;
pub mod server;
pub mod shell;
pub mod util;

pub use reply::FALLBACK_CODES;

/// Send `tracing` output to stderr, filtered by `RUST_LOG` (or `default`,
/// e.g. "info", when it is unset or invalid). Used by every binary here.
pub fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
}
