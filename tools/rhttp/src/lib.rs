//! # rhttp: the client side of mod_rdma's HTTP-over-RDMA protocol
//!
//! The wire protocol is specified in `docs/MOD_RDMA.md`. It has two parts:
//!
//! - [`header`]: the `RDMA:` HTTP header (request and response forms), in
//!   the grammar of the mod_rdma paper's Figure 1:
//!   `RDMA: server-writes, ip=127.0.0.1, port=4791, stag=0x1234, to=0x7f00, maxlen=1048576`.
//! - [`ctrl`]: the fixed 32-byte control messages (BUF, DONE, ABORT) that
//!   travel as RDMAP Sends on the RDMA connection.
//!
//! [`http`] is the small HTTP/1.1 client (keep-alive, Content-Length and
//! chunked bodies) that the `rhttp` binary drives.
#![deny(unsafe_code)]

pub mod ctrl;
pub mod header;
pub mod http;
