//! Protection domains and memory regions of the software device: the
//! provider seam's `PdOps` of `iwarp_verbs::device_ops`. A region needs
//! nothing beyond the context's region table (`iwarp_verbs::MrTable`,
//! which the engine checks every access against, RFC 5040 §2.1), so
//! registering is a no-op here; creating a queue pair goes to `qp.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use iwarp_proto::mem::{Access, PdId};
use iwarp_verbs::device_ops::PdOps;
use iwarp_verbs::provider::QpOps;
use iwarp_verbs::{Error, MemoryRegion, MrTable, QpInitAttr};

use crate::qp::create_qp;

/// A protection domain of the software device: its identifier scopes the
/// regions and queue pairs of the context's table (RFC 5040 §2.1 PD check,
/// done by the engine through `MrTable`).
pub(crate) struct SoftPd {
    id: PdId,
    mrs: Arc<MrTable>,
    next_qpn: Arc<AtomicU32>,
}

impl SoftPd {
    pub(crate) fn new(id: PdId, mrs: Arc<MrTable>, next_qpn: Arc<AtomicU32>) -> SoftPd {
        SoftPd { id, mrs, next_qpn }
    }
}

impl PdOps for SoftPd {
    fn register_mr(&self, _mr: &mut MemoryRegion, _access: Access) -> Result<(), Error> {
        // The context's table is the whole registration here.
        Ok(())
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>, Error> {
        if attr.send_cq.hw().is_some() || attr.recv_cq.hw().is_some() {
            return Err(Error::WrongDevice("a completion queue of a kernel device"));
        }
        let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed);
        Ok(create_qp(
            qpn,
            self.id,
            attr.max_send_wr,
            attr.max_recv_wr,
            self.mrs.clone(),
            attr.send_cq.clone(),
            attr.recv_cq.clone(),
        ))
    }
}
