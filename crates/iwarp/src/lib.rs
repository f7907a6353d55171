//! # iwarp: user-space software iWARP over TCP sockets
//!
//! The verbs and connection-manager API of a software iWARP stack (RFC 5040
//! RDMAP, RFC 5041 DDP, RFC 5044 MPA with RFC 6581 enhancements), wire
//! compatible with Linux soft-iWARP (siw). The protocol lives in the sans-IO
//! crate [`iwarp_proto`]; this crate is the thin I/O driver around it, in the
//! way `quinn` drives `quinn-proto`. Names follow libibverbs and librdmacm.
//!
//! ```text
//! Context (device, MR table) ── alloc_pd ──> ProtectionDomain ── reg_mr ──> MemoryRegion
//!    │                                             └── create_qp ──> QueuePair ── cm::connect / ConnRequest::accept
//!    │                                                                  │ (provider seam: DeviceOps, PdOps / QpOps, QpCm, CqSource)
//!    └── create_cq ──> CompletionQueue <── completions ── soft provider (rx, tx threads) ── TCP socket
//! ```
//!
//! # Objects
//!
//! - [`Context`]: the "device" (`ibv_context`). It owns the memory-region
//!   table: a slab indexed by STag (`index << 8 | key`, the key changes
//!   whenever an index is reused, as in siw).
//! - [`ProtectionDomain`] (`ibv_pd`): scopes regions and queue pairs.
//! - [`MemoryRegion`] (`ibv_mr`): registered memory; `reg_mr` allocates a
//!   zeroed, page-aligned buffer (safe), `reg_mr_raw` registers caller memory
//!   (unsafe: the caller keeps it valid while registered).
//! - [`CompletionQueue`] (`ibv_cq`): busy-pollable, blockable, and epoll-able
//!   through an eventfd.
//! - [`QueuePair`] (`ibv_qp`): created in [`QpState::Init`] so receives can
//!   be posted before connecting; connected with [`cm`].
//!
//! # Threading model
//!
//! All handles are `Send + Sync`; every verb takes `&self`. Per connected QP
//! there is a receive thread and a transmit thread; `post_send` writes to
//! the socket itself when it can do so without blocking. The engine is
//! behind a mutex that is never held across a blocking system call, the
//! receive thread never writes blocking, and locks are always taken in one
//! order (receive state → transmit state → engine → MR table / CQ / events), which is why
//! the driver cannot deadlock; [`soft`] has the full argument.
//!
//! # `unsafe`
//!
//! Only at the memory-registration edge, in exactly these places, each
//! use with a `// SAFETY:` comment:
//!
//! - `mr.rs`: copies into and out of registered memory, the page-aligned
//!   allocation, and [`ProtectionDomain::reg_mr_raw`] (caller memory);
//! - `sys.rs`: the system calls std lacks (`recv` into registered memory,
//!   gather `sendmsg` from it, `eventfd`, `epoll`, `poll`, `TCP_INFO`,
//!   `SIOCOUTQ`);
//! - the two callers of `sys.rs`'s pointer-taking calls in the software
//!   provider: `soft/rx.rs` (one scatter `recv` straight into a region)
//!   and `soft/tx.rs` (one gather `sendmsg` from regions), plus `Send`
//!   for the reusable iovec buffer that is empty between those calls
//!   (`soft/conn.rs`, where the transmit state lives).
//!
//! - the rdma-core provider (`rdma/`, feature `rdma-core`): the FFI edge to
//!   libibverbs and librdmacm (`dlopen`, the verbs calls, reading the
//!   structures they return), and `Send`/`Sync` for its device objects.
//!
//! The verbs layer (`context.rs`, `cm.rs`, `cq.rs`, `qp.rs`, the seam's
//! `provider.rs` and `device_ops.rs`, the provider table `device.rs`, and
//! the leaves `cm_types.rs`, `device_info.rs` and `error.rs`) and the rest
//! of the software provider have none. (The CRC32C kernels in `iwarp_proto::wire::crc` are
//! the one other `unsafe` of the stack: CPU intrinsics.)
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
mod cm_types;
mod context;
mod cq;
pub mod device;
mod device_info;
mod device_ops;
mod error;
mod mr;
mod provider;
mod qp;
#[cfg(feature = "rdma-core")]
pub mod rdma;
pub mod soft;
mod sys;
pub mod wait;

pub use context::{Context, ProtectionDomain};
pub use device::{
    list_devices, DeviceAttr, DeviceError, DeviceInfo, DeviceSpec, Transport, DEVICE_ENV,
};
pub use error::Error;

pub use iwarp_proto::engine::{
    PostError, QpState, RecvWr, SendWr, SgList, Sge, TermInfo, WcOpcode, WcQueue, WcStatus,
    WorkCompletion, WrOpcode, MAX_SGE,
};
pub use iwarp_proto::handshake::{Negotiated, Rtr};
pub use iwarp_proto::mem::{Access, MemError};

pub use cq::{Attendance, CompletionQueue, ProgressMode, WakePolicy, DEFAULT_SPIN};
pub use mr::MemoryRegion;
pub use qp::{ConnInfo, DrainError, QpEvent, QpInitAttr, QpStats, QueuePair, DRAIN_WR_ID};
pub use wait::WaitSet;
