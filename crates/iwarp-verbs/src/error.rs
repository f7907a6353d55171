//! The error of the verbs calls ([`Error`], re-exported at the crate
//! root as `iwarp::Error`).
//!
//! A leaf, like `device_info.rs`: the verbs layer and the providers return
//! it, and it imports neither, so a provider need not reach up into the
//! crate root for it.

use std::fmt;
use std::io;

use iwarp_proto::mem::Access;

use crate::device_info::DeviceError;

/// Errors of the verbs calls. `Display` names the cause and the fix.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `reg_mr` with a length of 0.
    ZeroLength,
    /// A region larger than this stack can address with one SGE.
    TooLarge { len: usize },
    /// The allocator refused the region's buffer.
    OutOfMemory { len: usize },
    /// `reg_mr_raw` with a null pointer or a range that wraps around.
    BadAddress,
    /// An access combination ibverbs also refuses.
    InvalidAccess { access: Access },
    /// All 2^24 STag indices are in use.
    TooManyRegions,
    /// `create_cq` with depth 0.
    ZeroDepth,
    /// `create_qp` with a zero queue depth.
    InvalidQpAttr(&'static str),
    /// The CQ's eventfd could not be created.
    EventFd(io::Error),
    /// The device could not be chosen or opened.
    Device(DeviceError),
    /// An rdma-core call failed (the rdma-core provider).
    RdmaCore { op: &'static str, why: String },
    /// Objects of two devices were mixed (a CQ of one context given to a
    /// QP of another).
    WrongDevice(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ZeroLength => f.write_str("cannot register a zero-length memory region: pass a length of at least 1 byte"),
            Error::TooLarge { len } => write!(f, "memory region of {len} bytes is too large: split it into regions of at most 4 GiB - 1"),
            Error::OutOfMemory { len } => write!(f, "could not allocate {len} bytes for a memory region: free memory or register a smaller region"),
            Error::BadAddress => f.write_str("reg_mr_raw: null pointer or address range wraps around: pass a valid buffer"),
            Error::InvalidAccess { access } => write!(f, "invalid access flags {access:?}: REMOTE_WRITE requires LOCAL_WRITE (as in ibverbs); add Access::LOCAL_WRITE"),
            Error::TooManyRegions => f.write_str("all 2^24 STag indices are in use: deregister regions you no longer need"),
            Error::ZeroDepth => f.write_str("cannot create a completion queue of depth 0: pass the number of completions it must hold"),
            Error::InvalidQpAttr(why) => write!(f, "invalid queue pair attributes: {why}"),
            Error::EventFd(e) => write!(f, "could not create the completion queue's eventfd ({e}): raise the open-file limit (ulimit -n)"),
            Error::Device(e) => e.fmt(f),
            Error::RdmaCore { op, why } => write!(f, "rdma-core {op} failed: {why}"),
            Error::WrongDevice(what) => write!(f, "{what} belongs to another device: create every object of a connection from one Context"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::EventFd(e) => Some(e),
            Error::Device(e) => Some(e),
            _ => None,
        }
    }
}
