//! # iwarp-verbs: the verbs types and the provider interface
//!
//! The lower layer of the `iwarp` stack: the verbs objects every provider
//! produces and every application holds, and the traits a provider
//! implements to serve them. Applications use these types through the
//! facade crate `iwarp` (`iwarp::CompletionQueue`, `iwarp::QueuePair`,
//! `iwarp::cm::ConnParam`, ...), which re-exports them unchanged and adds
//! the context, device selection and the connection-manager functions.
//!
//! ```text
//! iwarp (Context, ProtectionDomain, device selection, cm functions)
//!   ├── iwarp-soft      (software provider: engine + TCP sockets + threads)
//!   ├── iwarp-rdmacore  (rdma-core provider: libibverbs / librdmacm, optional)
//!   └── iwarp-verbs     (this crate: verbs types + provider traits)
//!         └── iwarp-proto (sans-IO protocol)
//! ```
//!
//! Both providers depend on this crate only (and on `iwarp-proto`), never
//! on each other or on the facade, so Cargo itself forbids a provider from
//! reaching up into the API layer.
//!
//! # Files
//!
//! - `cq.rs`: [`CompletionQueue`] (`ibv_cq`): the queue, waiting, progress
//!   modes, the eventfd/epoll descriptor;
//! - `mr.rs`: [`MemoryRegion`] (`ibv_mr`) and the context's region table
//!   (`MrTable`: STags, bounds and access checks, RFC 5040 §2.1);
//! - `qp.rs`: [`QueuePair`] (`ibv_qp`), [`QpInitAttr`], drain;
//! - `cm_types.rs`: the connection manager's parameters and errors
//!   ([`cm_types::ConnParam`], [`cm_types::CmError`],
//!   [`cm_types::CongestionControl`]), re-exported by `iwarp::cm`;
//! - `device_info.rs`: what a provider says about a device
//!   ([`device_info::Transport`], [`device_info::DeviceAttr`], ...);
//! - `error.rs`: [`Error`];
//! - the **provider interface**: [`provider`] (the queue-pair half:
//!   [`provider::QpOps`], [`provider::QpCm`], [`provider::CqSource`], and
//!   the data every provider reports) and [`device_ops`] (the device half:
//!   [`device_ops::DeviceOps`], [`device_ops::PdOps`], the listener and
//!   request traits);
//! - `sys.rs`: the eventfd, the epoll set and `poll(2)` that the CQ and
//!   both providers share.
//!
//! Items marked `#[doc(hidden)]` are for providers only (the CQ's push and
//! hook, the region table's lookups); applications never need them.
//!
//! # `unsafe`
//!
//! Only at the memory-registration edge and the system calls, each use
//! with a `// SAFETY:` comment:
//!
//! - `mr.rs`: copies into and out of registered memory, the page-aligned
//!   allocation, and `MemoryRegion::register_raw` (caller memory, behind
//!   `iwarp::ProtectionDomain::reg_mr_raw`);
//! - `sys.rs`: `eventfd`, `epoll`, `poll`.
//!
//! `cq.rs`, `qp.rs`, `cm_types.rs`, `device_info.rs`, `error.rs`,
//! `provider.rs` and `device_ops.rs` have none.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm_types;
mod cq;
pub mod device_info;
pub mod device_ops;
mod error;
mod mr;
pub mod provider;
mod qp;
#[doc(hidden)]
pub mod sys;

pub use error::Error;

pub use iwarp_proto::engine::{
    PostError, QpState, RecvWr, SendWr, SgList, Sge, TermInfo, WcOpcode, WcQueue, WcStatus,
    WorkCompletion, WrOpcode, MAX_SGE,
};
pub use iwarp_proto::handshake::{Negotiated, Rtr};
pub use iwarp_proto::mem::{Access, MemError};

#[doc(hidden)]
pub use cq::WeakCq;
pub use cq::{CompletionQueue, CqWake, InterruptMark, ProgressMode, DEFAULT_SPIN};
pub use mr::MemoryRegion;
#[doc(hidden)]
pub use mr::{MrInner, MrTable};
pub use qp::{ConnInfo, DrainError, QpEvent, QpInitAttr, QpStats, QueuePair, DRAIN_WR_ID};
