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
//!    │                                                                  │ (provider seam: QpOps / CqSource)
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
//! The verbs layer (`cq.rs`, `qp.rs`, `provider.rs`, `device.rs`, and the
//! leaves `device_info.rs` and `error.rs`) and the rest of the software
//! provider have none. (The CRC32C kernels in `iwarp_proto::wire::crc` are
//! the one other `unsafe` of the stack: CPU intrinsics.)
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
mod cq;
pub mod device;
mod device_info;
mod error;
mod mr;
mod provider;
mod qp;
#[cfg(feature = "rdma-core")]
pub mod rdma;
pub mod soft;
mod sys;

pub use device::{list_devices, DeviceError, DeviceInfo, DeviceSpec, Transport, DEVICE_ENV};
pub use error::Error;

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub use iwarp_proto::engine::{
    PostError, QpState, RecvWr, SendWr, SgList, Sge, TermInfo, WcOpcode, WcQueue, WcStatus,
    WorkCompletion, WrOpcode, MAX_SGE,
};
pub use iwarp_proto::handshake::{Negotiated, Rtr};
pub use iwarp_proto::mem::{Access, MemError};

pub use cq::{Attendance, CompletionQueue, ProgressMode, WakePolicy, DEFAULT_SPIN};
pub use mr::MemoryRegion;
pub use qp::{ConnInfo, DrainError, QpEvent, QpInitAttr, QpStats, QueuePair, DRAIN_WR_ID};

use iwarp_proto::mem::PdId;
use mr::MrTable;

struct ContextInner {
    mrs: Arc<MrTable>,
    next_pd: AtomicU32,
    next_qpn: AtomicU32,
    /// The kernel device, when the context runs on rdma-core.
    #[cfg(feature = "rdma-core")]
    rdma: Option<Arc<rdma::Device>>,
}

/// A device (`struct ibv_context`): the software iWARP provider (`soft`)
/// or, with the `rdma-core` feature, a kernel RDMA device (see
/// [`device`]). Cloning yields another handle to the same device.
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
    /// [`DEVICE_ENV`] (`IWARP_DEVICE`: `soft`, `auto`, or a kernel device
    /// such as `siw0`), or the software device when it is unset
    /// (`ibv_open_device`).
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
        let kernel = match spec {
            DeviceSpec::Soft => Ok(Vec::new()),
            _ => device::kernel_devices().map(|v| v.into_iter().map(|d| d.name).collect()),
        };
        match device::resolve(spec, kernel).map_err(Error::Device)? {
            device::Choice::Soft => Ok(Context::soft()),
            device::Choice::Kernel(name) => Context::kernel(&name),
        }
    }

    fn soft() -> Context {
        Context {
            inner: Arc::new(ContextInner {
                mrs: Arc::new(MrTable::default()),
                next_pd: AtomicU32::new(1),
                next_qpn: AtomicU32::new(1),
                #[cfg(feature = "rdma-core")]
                rdma: None,
            }),
        }
    }

    #[cfg(feature = "rdma-core")]
    fn kernel(name: &str) -> Result<Context, Error> {
        let dev = rdma::Device::open(name).map_err(Error::Device)?;
        let mut ctx = Context::soft();
        Arc::get_mut(&mut ctx.inner).expect("new context").rdma = Some(dev);
        Ok(ctx)
    }

    #[cfg(not(feature = "rdma-core"))]
    fn kernel(name: &str) -> Result<Context, Error> {
        Err(Error::Device(DeviceError::FeatureOff {
            name: name.to_string(),
        }))
    }

    /// The device's name: `soft`, or the kernel device's (`siw0`).
    pub fn device_name(&self) -> &str {
        #[cfg(feature = "rdma-core")]
        if let Some(d) = &self.inner.rdma {
            return &d.attr.name;
        }
        "soft"
    }

    /// The transport the device speaks.
    pub fn transport(&self) -> Transport {
        #[cfg(feature = "rdma-core")]
        if let Some(d) = &self.inner.rdma {
            return d.attr.transport;
        }
        Transport::SoftIwarp
    }

    /// What a kernel device reports about itself (`ibv_query_device`,
    /// `ibv_query_port`); `None` for the software device.
    #[cfg(feature = "rdma-core")]
    pub fn device_attr(&self) -> Option<&rdma::DeviceAttr> {
        self.inner.rdma.as_ref().map(|d| &d.attr)
    }

    #[cfg(feature = "rdma-core")]
    pub(crate) fn rdma_device(&self) -> Option<&Arc<rdma::Device>> {
        self.inner.rdma.as_ref()
    }

    /// Allocate a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            ctx: self.clone(),
            id: self.inner.next_pd.fetch_add(1, Ordering::Relaxed),
            #[cfg(feature = "rdma-core")]
            hw: Arc::new(std::sync::OnceLock::new()),
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
        #[cfg(feature = "rdma-core")]
        if let Some(dev) = &self.inner.rdma {
            let hw = rdma::HwCq::create(dev, &cq, depth)?;
            cq.set_hw(hw);
        }
        Ok(cq)
    }
}

/// A protection domain (`struct ibv_pd`). Cloning yields another handle to
/// the same domain.
#[derive(Clone)]
pub struct ProtectionDomain {
    ctx: Context,
    id: PdId,
    /// The `ibv_pd` (rdma-core), allocated on first use.
    #[cfg(feature = "rdma-core")]
    hw: Arc<std::sync::OnceLock<Arc<rdma::Pd>>>,
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
        let mr = MemoryRegion::register_owned(&self.ctx.inner.mrs, self.id, len, access)?;
        self.register_hw(mr, access)
    }

    /// The `ibv_pd` of a kernel device's domain.
    #[cfg(feature = "rdma-core")]
    fn hw_pd(&self) -> Result<Option<&Arc<rdma::Pd>>, Error> {
        let Some(dev) = &self.ctx.inner.rdma else {
            return Ok(None);
        };
        if let Some(pd) = self.hw.get() {
            return Ok(Some(pd));
        }
        let pd = rdma::Pd::alloc(dev)?;
        // A racing thread may have set it first; either Pd is fine.
        let _ = self.hw.set(pd);
        Ok(self.hw.get())
    }

    #[cfg(feature = "rdma-core")]
    fn register_hw(&self, mut mr: MemoryRegion, access: Access) -> Result<MemoryRegion, Error> {
        if let Some(pd) = self.hw_pd()? {
            let (ptr, len) = mr.raw_parts();
            let hw = rdma::HwMr::register(pd, ptr, len, access)?;
            mr.set_hw(hw.lkey, hw.rkey, Box::new(hw));
        }
        Ok(mr)
    }

    #[cfg(not(feature = "rdma-core"))]
    fn register_hw(&self, mr: MemoryRegion, _access: Access) -> Result<MemoryRegion, Error> {
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
        let mr =
            unsafe { MemoryRegion::register_raw(&self.ctx.inner.mrs, self.id, ptr, len, access) }?;
        self.register_hw(mr, access)
    }

    /// Create a queue pair in [`QpState::Init`] (`ibv_create_qp`).
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<QueuePair, Error> {
        if attr.max_send_wr == 0 || attr.max_recv_wr == 0 {
            return Err(Error::InvalidQpAttr(
                "max_send_wr and max_recv_wr must be at least 1",
            ));
        }
        #[cfg(feature = "rdma-core")]
        if let Some(pd) = self.hw_pd()? {
            let hw = |cq: &CompletionQueue| {
                cq.hw()
                    .and_then(|h| h.clone().downcast::<rdma::HwCq>().ok())
                    .ok_or(Error::WrongDevice("a completion queue of another device"))
            };
            let s = hw(&attr.send_cq)?;
            let r = hw(&attr.recv_cq)?;
            let qp = rdma::Qp::create(
                pd,
                (&attr.send_cq, s),
                (&attr.recv_cq, r),
                attr.max_send_wr,
                attr.max_recv_wr,
            )?;
            return Ok(QueuePair::new(
                qp,
                attr.send_cq.clone(),
                attr.recv_cq.clone(),
            ));
        }
        #[cfg(feature = "rdma-core")]
        if attr.send_cq.hw().is_some() || attr.recv_cq.hw().is_some() {
            return Err(Error::WrongDevice("a completion queue of a kernel device"));
        }
        let qpn = self.ctx.inner.next_qpn.fetch_add(1, Ordering::Relaxed);
        let qp = soft::create_qp(
            qpn,
            self.id,
            attr.max_send_wr,
            attr.max_recv_wr,
            self.ctx.inner.mrs.clone(),
            attr.send_cq.clone(),
            attr.recv_cq.clone(),
        );
        Ok(QueuePair::new(
            qp,
            attr.send_cq.clone(),
            attr.recv_cq.clone(),
        ))
    }
}
