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
//! | [`MemoryRegion`] | the crate's buffer, also registered with `ibv_reg_mr`; `lkey`/`rkey` are the device's | `mr.rs` |
//! | [`CompletionQueue`] | an `ibv_cq` with a completion channel, drained into the CQ's queue by a pump thread (so `poll`, `wait`, and the eventfd behave as with the software provider) and by `CompletionQueue::progress` | `cq.rs` |
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
//! `qp`.
//!
//! The provider seam (`device_ops.rs`, `provider.rs`) is implemented the
//! way the software provider does it: this module implements the device
//! and protection-domain traits (`DeviceOps` for `Device`, `PdOps` for
//! `mr::RdmaPd`: it wires `mr`, `cq` and `qp` together), `qp.rs` the
//! queue pair's (`QpOps`, `CqSource`), and `cm.rs` the connection
//! manager's (`DeviceCm`, `QpCm`, `ListenerOps`, `RequestOps`). The
//! crate's verbs layer holds these as trait objects; only the provider
//! table in `device.rs` names this module. It takes from the rest of the
//! crate only the verbs types it implements (`CompletionQueue`,
//! `QueuePair`, the seam's traits), [`crate::Error`], the CM types of
//! `cm_types.rs`, and the device description of the leaf
//! `device_info.rs`.
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

use std::any::Any;
use std::sync::Arc;

use iwarp_proto::mem::{Access, PdId};

use cq::HwCq;
pub(crate) use device::list;
use device::Device;
use mr::{HwMr, RdmaPd};
use qp::Qp;
pub use qp::{qp_caps, QpCaps};
pub use wr::{map_post_errno, map_status, send_wr_fields, status_name};

use crate::cq::CompletionQueue;
/// What a kernel device reports about itself (also
/// `iwarp::device::DeviceAttr`).
pub use crate::device_info::DeviceAttr;
use crate::device_info::{DeviceError, Transport};
use crate::device_ops::{DeviceOps, PdOps};
use crate::error::Error;
use crate::mr::{MemoryRegion, MrTable};
use crate::provider::QpOps;
use crate::qp::QpInitAttr;

/// Open the kernel device `name` (the provider table's entry point).
pub(crate) fn open(name: &str) -> Result<Arc<dyn DeviceOps>, DeviceError> {
    Ok(Device::open(name)?)
}

impl DeviceOps for Device {
    fn name(&self) -> &str {
        &self.attr.name
    }
    fn transport(&self) -> Transport {
        self.attr.transport
    }
    fn attr(&self) -> Option<&DeviceAttr> {
        Some(&self.attr)
    }
    fn alloc_pd(&self, _id: PdId, _mrs: &Arc<MrTable>) -> Arc<dyn PdOps> {
        // `self` is always inside the Arc that `open` made.
        Arc::new(RdmaPd::new(&self.arc()))
    }
    fn create_cq(&self, cq: &CompletionQueue, depth: usize) -> Result<(), Error> {
        let hw = HwCq::create(&self.arc(), cq, depth)?;
        cq.set_hw(hw);
        Ok(())
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl PdOps for RdmaPd {
    fn register_mr(&self, mr: &mut MemoryRegion, access: Access) -> Result<(), Error> {
        let pd = self.hw_pd()?;
        let (ptr, len) = mr.raw_parts();
        let hw = HwMr::register(pd, ptr, len, access)?;
        mr.set_hw(hw.lkey, hw.rkey, Box::new(hw));
        Ok(())
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>, Error> {
        let pd = self.hw_pd()?;
        let hw = |cq: &CompletionQueue| {
            cq.hw()
                .and_then(|h| h.clone().downcast::<HwCq>().ok())
                .ok_or(Error::WrongDevice("a completion queue of another device"))
        };
        let s = hw(&attr.send_cq)?;
        let r = hw(&attr.recv_cq)?;
        let qp: Arc<dyn QpOps> = Qp::create(
            pd,
            (&attr.send_cq, s),
            (&attr.recv_cq, r),
            attr.max_send_wr,
            attr.max_recv_wr,
        )?;
        Ok(qp)
    }
}
