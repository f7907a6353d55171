//! The connection manager (`rdma_cm`-style): this crate's MPA connection
//! manager over TCP ([`crate::soft::cm`], re-exported here whole), with
//! [`connect`] also serving queue pairs of a kernel device (the rdma-core
//! provider, through librdmacm), so that a client written against
//! `iwarp::cm::connect` runs unchanged on `IWARP_DEVICE=siw0`.
//!
//! The passive side ([`Listener`], [`ConnRequest`]) is the software
//! provider's; a server on a kernel device uses
//! [`crate::rdma::cm::Listener`] (feature `rdma-core`).

use std::net::SocketAddr;

pub use crate::soft::cm::*;
use crate::QueuePair;

/// Connect `qp` to `addr` (`rdma_connect`); returns the peer's private
/// data. A queue pair of the software provider does the MPA exchange over
/// TCP ([`crate::soft::cm::connect`]); one of a kernel device goes through
/// rdma_cm with `param.private_data` (at most 255 bytes there) and
/// `param.timeout` for each step, and the MPA policy is the kernel's
/// (`param.mpa` is not used).
pub fn connect(qp: &QueuePair, addr: SocketAddr, param: &ConnParam) -> Result<Vec<u8>, CmError> {
    #[cfg(feature = "rdma-core")]
    if crate::rdma::owns(qp) {
        return crate::rdma::cm::connect(qp, addr, &param.private_data, param.timeout).map_err(
            |e| CmError::Io {
                during: "rdma_cm connect",
                source: std::io::Error::other(e.to_string()),
            },
        );
    }
    crate::soft::cm::connect(qp, addr, param)
}
