//! # iwarp-rdmacore: the rdma-core provider
//!
//! The verbs API over a kernel RDMA device (siw, rxe, an RNIC) through
//! libibverbs and librdmacm (the facade `iwarp` turns it on with its
//! cargo feature `rdma-core` and re-exports it as `iwarp::rdma`; the
//! libraries are loaded at run time, see `ffi.rs`, so there is no
//! build-time dependency on rdma-core).
//!
//! What maps to what, and where:
//!
//! | verbs type | rdma-core object | file |
//! |---|---|---|
//! | `iwarp::Context` | one `ibv_context` of librdmacm's device list (`rdma_get_devices`), so that queue pairs created on it can be connected by rdma_cm (which refuses a QP of another context) | `device.rs` |
//! | `iwarp::ProtectionDomain` | an `ibv_pd`, allocated on first use (`alloc_pd` cannot fail in this API) | `mr.rs` |
//! | `MemoryRegion` | the crate's buffer, also registered with `ibv_reg_mr`; `lkey`/`rkey` are the device's | `mr.rs` |
//! | `CompletionQueue` | an `ibv_cq` with a completion channel, drained into the CQ's queue by a pump thread (so `poll`, `wait`, and the eventfd behave as with the software provider) and by `CompletionQueue::progress` | `cq.rs` |
//! | `QueuePair` | an RC `ibv_qp`, moved to INIT at creation (so receives can be posted before connecting, as with the software provider) | `qp.rs` |
//! | work requests, completions | `ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`, `ibv_wc` | `wr.rs` |
//! | [`cm`] (`connect`, `Listener`, `ConnRequest`) | rdma_cm, which moves the QP on to RTS | `cm.rs` |
//! | a connected QP's connection | an rdma_cm id with its own event channel | `conn.rs` |
//! | `QueuePair::next_event`, `QueuePair::event_fd` | the QP's event queue and an eventfd readable while it holds an event (not the completion channel: see the file) | `events.rs` |
//!
//! Work requests, completions and statuses map one to one where the
//! verbs types have a variant ([`map_status`]); `ibv_wc_status` values with
//! no counterpart in `WcStatus` (InfiniBand's retry and
//! RNR errors, EEC errors) become `WcStatus::GeneralErr` and are logged
//! with their name.
//!
//! The files have the software provider's roles (`iwarp-soft`) where
//! they make sense: `device.rs` (the device), `mr.rs` (protection domain
//! and regions), `cq.rs`, `qp.rs`, `cm.rs`, `conn.rs`; plus `ffi.rs` (the
//! bindings), `wr.rs` (work requests and completions) and `ops.rs`, the
//! seam's device half (`DeviceOps` for `Device`, `PdOps` for
//! `mr::RdmaPd`), which wires `mr`, `cq` and `qp` together. (The software
//! provider has no low-level device to sit under its `mr` and `cq`, so its
//! `device.rs` holds `DeviceOps` itself.)
//!
//! The files form a chain with no circle: `ffi` at the bottom; `device`,
//! `wr` and `conn` on it alone (and `events` on nothing of this crate); `mr` and `cq` on `device` (and `cq` on
//! `wr`); `qp` on all of those; `ops` and `cm` on `qp`, `conn` and
//! `device`. The pump thread (`cq.rs`) reaches its queue pairs only
//! through the `Watched` trait it defines, so `cq` knows nothing of `qp`.
//! The crate root only declares the files and re-exports.
//!
//! The provider seam (`iwarp_verbs::device_ops`, `iwarp_verbs::provider`)
//! is implemented the way the software provider does it: `ops.rs` the
//! device and protection-domain traits, `qp.rs` the queue pair's
//! (`QpOps`, `CqSource`), and `cm.rs` the connection manager's
//! (`DeviceCm`, `QpCm`, `ListenerOps`, `RequestOps`). The facade's verbs
//! layer holds these as trait objects; only its provider table
//! (`iwarp`'s `device.rs`) names this crate ([`list`], [`open`]). This
//! crate depends on `iwarp-verbs` (the verbs types it implements, the
//! seam's traits, `Error`, the CM types, the device description) and
//! `iwarp-proto` only, never on the facade or on the software provider.
//!
//! `unsafe` is at the FFI edge only: `ffi.rs` (`dlopen`, the symbol
//! table) and the files that call libibverbs/librdmacm and read the
//! structures they return (`device.rs`, `mr.rs`, `cq.rs`, `qp.rs`,
//! `wr.rs`, `conn.rs`, `cm.rs`); each use says why it holds. libibverbs objects are thread-safe (verbs may be called from any
//! thread), which is what the `Send`/`Sync` impls rely on.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
mod conn;
mod cq;
mod device;
mod events;
mod ffi;
mod mr;
mod ops;
mod qp;
mod wr;

pub use device::list;
pub use ops::open;
pub use qp::{qp_caps, QpCaps};
pub use wr::{map_post_errno, map_status, send_wr_fields, status_name};

/// What a kernel device reports about itself (also
/// `iwarp::device::DeviceAttr`).
pub use iwarp_verbs::device_info::DeviceAttr;
