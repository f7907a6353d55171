//! # RFTP: FTP with an RDMA data path
//!
//! - [`server`]: `rftpd`, an FTP server (RFC 959, RFC 2389 FEAT/OPTS,
//!   RFC 3659 SIZE/MDTM/REST/MLSD, RFC 2428 EPRT/EPSV, the `HASH` draft)
//!   with the RDMA extension `RADR` / `RSTR` / `RRTR`, whose payload moves
//!   through [`rdma_xfer`].
//! - [`client`]: the FTP client side used by the `rftp` binary.
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

pub mod client;
pub mod server;
pub mod util;

/// Reply text of a server that lacks the extension makes the client fall
/// back to plain FTP: these codes.
pub const FALLBACK_CODES: [u32; 3] = [500, 502, 504];
