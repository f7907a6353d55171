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
//! # Crates
//!
//! This crate is the facade of four; applications depend on it alone and
//! see one API (`iwarp::...`), whichever crate an item lives in:
//!
//! ```text
//! iwarp            Context, ProtectionDomain, device selection (the one table of providers), cm functions, re-exports
//!  ├── iwarp-soft      the software provider (re-exported as iwarp::soft)
//!  ├── iwarp-rdmacore  the rdma-core provider, cargo feature `rdma-core` (iwarp::rdma)
//!  └── iwarp-verbs     the verbs types (CompletionQueue, MemoryRegion, QueuePair, cm parameters) and the provider traits
//!        └── iwarp-proto   the sans-IO protocol (RFC 5040/5041/5044/6581)
//! ```
//!
//! Each provider depends on `iwarp-verbs` (and `iwarp-proto`) only, never
//! on the other provider or on this crate, so Cargo itself forbids import
//! circles and upward imports between the layers.
//!
//! This crate's files: `wait.rs` ([`wait`]: one wait over CQs and outside
//! descriptors with a deadline), `context.rs` ([`Context`], [`ProtectionDomain`]:
//! every verb through the provider's `DeviceOps` / `PdOps`), `device.rs`
//! (device names, [`list_devices`], and the table of providers, the only
//! place that names them), `cm.rs` (the connection-manager functions,
//! through the provider's `QpCm`, `DeviceCm`, `ListenerOps`,
//! `RequestOps`).
//!
//! # `unsafe`
//!
//! This crate has two uses: forwarding [`ProtectionDomain::reg_mr_raw`]'s
//! contract to `iwarp-verbs` (`context.rs`), and `poll(2)` on the wait
//! set's descriptors (`wait.rs`). The others are each crate's
//! own and listed in its docs: `iwarp-verbs` (registered memory in
//! `mr.rs`; `eventfd`, `epoll`, `poll` in `sys.rs`), `iwarp-soft` (its
//! `sys.rs` data-path calls into and out of registered memory, their two
//! callers `rx.rs` and `tx.rs`, and `Send` for the reusable iovec buffer
//! in `state.rs`), `iwarp-rdmacore` (the FFI edge to libibverbs and
//! librdmacm, and `Send`/`Sync` for its device objects). (The CRC32C
//! kernels in `iwarp_proto::wire::crc` are the one other `unsafe` of the
//! stack: CPU intrinsics.)
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
mod context;
pub mod device;

/// The rdma-core provider (crate `iwarp-rdmacore`, cargo feature
/// `rdma-core`).
#[cfg(feature = "rdma-core")]
pub use iwarp_rdmacore as rdma;
/// The software provider (crate `iwarp-soft`).
pub use iwarp_soft as soft;
pub mod wait;

pub use context::{Context, ProtectionDomain};
pub use device::{
    list_devices, DeviceAttr, DeviceError, DeviceInfo, DeviceSpec, Transport, DEVICE_ENV,
};
pub use iwarp_verbs::Error;

pub use iwarp_verbs::{Access, MemError, Negotiated, Rtr};
pub use iwarp_verbs::{
    PostError, QpState, RecvWr, SendWr, SgList, Sge, TermInfo, WcOpcode, WcQueue, WcStatus,
    WorkCompletion, WrOpcode, MAX_SGE,
};

pub use iwarp_verbs::MemoryRegion;
pub use iwarp_verbs::{CompletionQueue, CqWake, InterruptMark, ProgressMode, DEFAULT_SPIN};
pub use iwarp_verbs::{ConnInfo, DrainError, QpEvent, QpInitAttr, QpStats, QueuePair, DRAIN_WR_ID};
pub use wait::WaitSet;
