//! The device and its protection domains (`ibv_context`, `ibv_pd`): the
//! verbs face of a provider's device.
//!
//! A [`Context`] holds the provider's device object (`DeviceOps` of
//! `device_ops.rs`, opened by name through the provider table in
//! `device.rs`) and the memory-region table; a [`ProtectionDomain`] holds
//! the provider's PD object (`PdOps`). Every verb here is written once and
//! calls through those objects: nothing in this file knows which provider
//! runs.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use iwarp_proto::mem::{Access, PdId};

use crate::device::{self, DeviceSpec, Transport};
use iwarp_verbs::device_info::DeviceAttr;
use iwarp_verbs::device_ops::{DeviceHandle, DeviceOps, PdOps};
use iwarp_verbs::CompletionQueue;
use iwarp_verbs::Error;
use iwarp_verbs::{MemoryRegion, MrTable};
use iwarp_verbs::{QpInitAttr, QueuePair};

struct ContextInner {
    mrs: Arc<MrTable>,
    next_pd: AtomicU32,
    /// The provider's device.
    dev: Arc<dyn DeviceOps>,
}

/// A device (`struct ibv_context`): the software iWARP provider (`soft`)
/// or, with the `rdma-core` feature, a kernel RDMA device (see
/// [`device`](crate::device)). Cloning yields another handle to the same
/// device.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device_name())
            .field("mrs", &self.inner.mrs)
            .finish()
    }
}

impl Context {
    /// Open the device named by the environment variable
    /// [`DEVICE_ENV`](crate::DEVICE_ENV) (`IWARP_DEVICE`: `soft`, `auto`,
    /// or a kernel device such as `siw0`), or the software device when it
    /// is unset (`ibv_open_device`).
    pub fn open() -> Result<Context, Error> {
        let spec = DeviceSpec::from_env().map_err(Error::Device)?;
        Context::open_spec(&spec)
    }

    /// Open the device `name`: `soft`, `auto` (a kernel device when one is
    /// present, else `soft`), or a kernel device name as `ibv_devices`
    /// lists it (`siw0`, `rxe0`, `mlx5_0`). The error names the cause and
    /// the fix (`--device soft` when there is no RDMA device).
    pub fn open_device(name: &str) -> Result<Context, Error> {
        let spec: DeviceSpec = name.parse().map_err(Error::Device)?;
        Context::open_spec(&spec)
    }

    /// Open the device `spec` names.
    pub fn open_spec(spec: &DeviceSpec) -> Result<Context, Error> {
        let dev = device::open(spec).map_err(Error::Device)?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                mrs: Arc::new(MrTable::default()),
                next_pd: AtomicU32::new(1),
                dev,
            }),
        })
    }

    /// The device's name: `soft`, or the kernel device's (`siw0`).
    pub fn device_name(&self) -> &str {
        self.inner.dev.name()
    }

    /// The transport the device speaks.
    pub fn transport(&self) -> Transport {
        self.inner.dev.transport()
    }

    /// What a kernel device reports about itself (`ibv_query_device`,
    /// `ibv_query_port`); `None` for the software device.
    pub fn device_attr(&self) -> Option<&DeviceAttr> {
        self.inner.dev.attr()
    }

    /// Allocate a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let id = self.inner.next_pd.fetch_add(1, Ordering::Relaxed);
        ProtectionDomain {
            ctx: self.clone(),
            id,
            ops: self.inner.dev.alloc_pd(id, &self.inner.mrs),
        }
    }

    /// The device's memory-access checker: the same
    /// [`MemoryAccess`](iwarp_proto::mem::MemoryAccess) implementation the
    /// engine uses for every remote and local access (siw `siw_check_mem`
    /// semantics). Useful for tests and diagnostics.
    pub fn memory_access(&self) -> &(dyn iwarp_proto::mem::MemoryAccess + Send + Sync) {
        &*self.inner.mrs
    }

    /// Create a completion queue holding up to `depth` completions
    /// (`ibv_create_cq`).
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue, Error> {
        let cq = CompletionQueue::new(depth)?;
        self.inner.dev.create_cq(&cq, depth)?;
        Ok(cq)
    }
}

/// The provider's device, for the connection manager and for a
/// provider's own calls that take a context.
impl DeviceHandle for Context {
    fn device_ops(&self) -> &Arc<dyn DeviceOps> {
        &self.inner.dev
    }
}

/// A protection domain (`struct ibv_pd`). Cloning yields another handle to
/// the same domain.
#[derive(Clone)]
pub struct ProtectionDomain {
    ctx: Context,
    id: PdId,
    /// The provider's domain.
    ops: Arc<dyn PdOps>,
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("id", &self.id)
            .finish()
    }
}

impl ProtectionDomain {
    /// The domain's identifier.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Register a new zeroed, page-aligned buffer of `len` bytes
    /// (`ibv_reg_mr` over memory the region owns).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, Error> {
        let mut mr = MemoryRegion::register_owned(&self.ctx.inner.mrs, self.id, len, access)?;
        self.ops.register_mr(&mut mr, access)?;
        Ok(mr)
    }

    /// Register caller-owned memory (`ibv_reg_mr`). The region's address
    /// ([`MemoryRegion::addr`]) is `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes, and must not be
    /// accessed through Rust references that assume exclusivity, from this
    /// call until the returned [`MemoryRegion`] has been dropped. (Dropping
    /// it waits until no driver thread still copies to or from the memory.)
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        // SAFETY: forwarded from the caller.
        let mut mr =
            unsafe { MemoryRegion::register_raw(&self.ctx.inner.mrs, self.id, ptr, len, access) }?;
        self.ops.register_mr(&mut mr, access)?;
        Ok(mr)
    }

    /// Create a queue pair in [`QpState::Init`](crate::QpState::Init)
    /// (`ibv_create_qp`).
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<QueuePair, Error> {
        if attr.max_send_wr == 0 || attr.max_recv_wr == 0 {
            return Err(Error::InvalidQpAttr(
                "max_send_wr and max_recv_wr must be at least 1",
            ));
        }
        let qp = self.ops.create_qp(attr)?;
        Ok(QueuePair::new(
            qp,
            attr.send_cq.clone(),
            attr.recv_cq.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::cm::{self, CmError, MpaConfig};
    use iwarp_verbs::device_ops::{DeviceCm, ListenerOps};
    use iwarp_verbs::provider::QpOps;

    /// A provider that only counts what the verbs layer asks of it.
    #[derive(Debug, Default)]
    struct Fake {
        cqs: AtomicUsize,
        pds: AtomicUsize,
        mrs: Arc<AtomicUsize>,
        attr: Option<DeviceAttr>,
    }

    struct FakePd(Arc<AtomicUsize>);

    impl DeviceOps for Fake {
        fn name(&self) -> &str {
            "fake0"
        }
        fn transport(&self) -> Transport {
            Transport::Other(7)
        }
        fn attr(&self) -> Option<&DeviceAttr> {
            self.attr.as_ref()
        }
        fn alloc_pd(&self, _id: PdId, _mrs: &Arc<MrTable>) -> Arc<dyn PdOps> {
            self.pds.fetch_add(1, Ordering::Relaxed);
            Arc::new(FakePd(self.mrs.clone()))
        }
        fn create_cq(&self, _cq: &CompletionQueue, _depth: usize) -> Result<(), Error> {
            self.cqs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
            self
        }
    }

    impl DeviceCm for Fake {
        fn listen(&self, _: SocketAddr, _: MpaConfig) -> Result<Box<dyn ListenerOps>, CmError> {
            Err(CmError::Unsupported {
                what: "listening",
                provider: "fake",
                fix: "none",
            })
        }
    }

    impl PdOps for FakePd {
        fn register_mr(&self, _mr: &mut MemoryRegion, _access: Access) -> Result<(), Error> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn create_qp(&self, _attr: &QpInitAttr) -> Result<Arc<dyn QpOps>, Error> {
            Err(Error::RdmaCore {
                op: "fake create_qp",
                why: "a fake device".into(),
            })
        }
    }

    /// Every verb of the context, its PDs and the CM's listener reaches the
    /// provider through the seam: a provider the verbs layer has never
    /// heard of serves them.
    #[test]
    fn verbs_reach_any_provider_through_the_seam() {
        let fake = Arc::new(Fake::default());
        let ctx = Context {
            inner: Arc::new(ContextInner {
                mrs: Arc::new(MrTable::default()),
                next_pd: AtomicU32::new(1),
                dev: fake.clone(),
            }),
        };
        assert_eq!(ctx.device_name(), "fake0");
        assert_eq!(ctx.transport(), Transport::Other(7));
        assert!(ctx.device_attr().is_none());
        let cq = ctx.create_cq(4).unwrap();
        assert_eq!(fake.cqs.load(Ordering::Relaxed), 1);
        let pd = ctx.alloc_pd();
        assert_eq!(fake.pds.load(Ordering::Relaxed), 1);
        let _mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        assert_eq!(fake.mrs.load(Ordering::Relaxed), 1);
        let attr = QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq,
            max_send_wr: 1,
            max_recv_wr: 1,
        };
        let e = pd.create_qp(&attr).unwrap_err();
        assert!(e.to_string().contains("fake create_qp"), "{e}");
        let e = cm::Listener::bind_on(&ctx, "127.0.0.1:0".parse().unwrap(), MpaConfig::default())
            .unwrap_err();
        assert!(
            matches!(
                e,
                CmError::Unsupported {
                    provider: "fake",
                    ..
                }
            ),
            "{e}"
        );
        // The software device, opened by name, answers the same calls.
        let soft = Context::open_device("soft").unwrap();
        assert_eq!(soft.device_name(), "soft");
        assert!(soft.device_attr().is_none());
    }
}
