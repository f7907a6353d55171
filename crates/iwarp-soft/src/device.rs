//! The software device (`soft`): the provider seam's `DeviceOps` of
//! `iwarp_verbs::device_ops`. Completion queues need no device object (a
//! QP completes into the verbs `CompletionQueue` directly); the
//! connection-manager part (`DeviceCm`, listening) is `cm.rs`.

use std::any::Any;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use iwarp_proto::mem::PdId;
use iwarp_verbs::device_info::{DeviceAttr, Transport};
use iwarp_verbs::device_ops::{DeviceOps, PdOps};
use iwarp_verbs::{CompletionQueue, Error, MrTable};

use crate::mr::SoftPd;

/// The software device (`soft`), one per `iwarp::Context`: it
/// numbers the context's queue pairs.
#[derive(Debug, Default)]
pub struct SoftDevice {
    next_qpn: Arc<AtomicU32>,
}

impl SoftDevice {
    /// Open the software device (the provider table's entry point).
    pub fn open() -> Arc<SoftDevice> {
        Arc::new(SoftDevice {
            next_qpn: Arc::new(AtomicU32::new(1)),
        })
    }
}

impl DeviceOps for SoftDevice {
    fn name(&self) -> &str {
        "soft"
    }
    fn transport(&self) -> Transport {
        Transport::SoftIwarp
    }
    fn attr(&self) -> Option<&DeviceAttr> {
        None
    }
    fn alloc_pd(&self, id: PdId, mrs: &Arc<MrTable>) -> Arc<dyn PdOps> {
        Arc::new(SoftPd::new(id, mrs.clone(), self.next_qpn.clone()))
    }
    fn create_cq(&self, _cq: &CompletionQueue, _depth: usize) -> Result<(), Error> {
        Ok(())
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
