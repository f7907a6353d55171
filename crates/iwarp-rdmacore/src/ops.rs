//! The provider seam's device half for kernel devices: `DeviceOps` for
//! [`Device`] (the device list's `ibv_context`) and `PdOps` for
//! [`RdmaPd`] (an `ibv_pd`). This is where the other files meet: a
//! protection domain registers regions (`mr.rs`) and creates queue pairs
//! (`qp.rs`) on completion queues of this device (`cq.rs`), so it sits
//! above all of them (only `cm.rs` is beside it), and nothing imports it
//! but the crate root, which hands [`open`] to the facade's provider table.

use std::any::Any;
use std::sync::Arc;

use iwarp_proto::mem::{Access, PdId};
use iwarp_verbs::device_info::{DeviceAttr, DeviceError, Transport};
use iwarp_verbs::device_ops::{DeviceOps, PdOps};
use iwarp_verbs::provider::QpOps;
use iwarp_verbs::{CompletionQueue, Error, MemoryRegion, MrTable, QpInitAttr};

use crate::cq::HwCq;
use crate::device::Device;
use crate::mr::{HwMr, RdmaPd};
use crate::qp::Qp;

/// Open the kernel device `name` (the provider table's entry point).
pub fn open(name: &str) -> Result<Arc<dyn DeviceOps>, DeviceError> {
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
