//! The rdma-core provider: the verbs API over a kernel RDMA device
//! (siw, rxe, an RNIC) through libibverbs and librdmacm (cargo feature
//! `rdma-core`; the libraries are loaded at run time, see `ffi.rs`).
//!
//! What maps to what, and where:
//!
//! | verbs type | rdma-core object | file |
//! |---|---|---|
//! | [`Context`](crate::Context) | one `ibv_context` of librdmacm's device list (`rdma_get_devices`), so that queue pairs created on it can be connected by rdma_cm (which refuses a QP of another context) | `device.rs` |
//! | [`ProtectionDomain`](crate::ProtectionDomain) | an `ibv_pd`, allocated on first use (`alloc_pd` cannot fail in this API) | `mr.rs` |
//! | [`MemoryRegion`](crate::MemoryRegion) | the crate's buffer, also registered with `ibv_reg_mr`; `lkey`/`rkey` are the device's | `mr.rs` |
//! | [`CompletionQueue`](crate::CompletionQueue) | an `ibv_cq` with a completion channel, drained into the CQ's queue by a pump thread (so `poll`, `wait`, and the eventfd behave as with the software provider) and by `CompletionQueue::progress` | `cq.rs` |
//! | [`QueuePair`](crate::QueuePair) | an RC `ibv_qp`, moved to INIT at creation (so receives can be posted before connecting, as with the software provider) | `qp.rs` |
//! | work requests, completions | `ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`, `ibv_wc` | `wr.rs` |
//! | [`cm`] (`connect`, `Listener`, `ConnRequest`) | rdma_cm, which moves the QP on to RTS | `cm.rs` |
//! | a connected QP's connection | an rdma_cm id with its own event channel | `conn.rs` |
//!
//! Work requests, completions and statuses map one to one where the
//! verbs types have a variant ([`map_status`]); `ibv_wc_status` values with
//! no counterpart in [`WcStatus`](crate::WcStatus) (InfiniBand's retry and
//! RNR errors, EEC errors) become `WcStatus::GeneralErr` and are logged
//! with their name.
//!
//! The files form a chain with no circle: `ffi` (the bindings) at the
//! bottom; `device`, `wr` and `conn` on it alone; `mr` and `cq` on
//! `device` (and `cq` on `wr`); `qp` on all of those; `cm` on `qp`,
//! `conn` and `device`. The pump thread (`cq.rs`) reaches its queue pairs
//! only through the `Watched` trait it defines, so `cq` knows nothing of
//! `qp`. This module only wires them; the crate's verbs layer and device
//! selection call down into it, and it takes from the rest of the crate
//! only the verbs types it implements (`CompletionQueue`, `QueuePair`,
//! the provider traits), [`crate::Error`], and the device description of
//! the leaf `device_info.rs`.
//!
//! `unsafe` is confined to this provider's files; each use says why it
//! holds. libibverbs objects are thread-safe (verbs may be called from any
//! thread), which is what the `Send`/`Sync` impls rely on.

pub mod cm;
mod conn;
mod cq;
mod device;
pub(crate) mod ffi;
mod mr;
mod qp;
mod wr;

pub(crate) use cq::HwCq;
pub use device::DeviceAttr;
pub(crate) use device::{list, Device};
pub(crate) use mr::{HwMr, Pd};
pub(crate) use qp::{owns, Qp};
pub use qp::{qp_caps, QpCaps};
pub use wr::{map_post_errno, map_status, send_wr_fields, status_name};
