//! The provider seam, device half: what a `iwarp::Context`, its
//! protection domains and the connection manager's `iwarp::cm::Listener`
//! ask of a provider. The queue-pair half is `provider.rs` ([`QpOps`],
//! [`QpCm`](crate::provider::QpCm), `CqSource`); this module sits one level
//! above it because it names the verbs types (`CompletionQueue`,
//! `QpInitAttr`, `MemoryRegion`, `QueuePair`).
//!
//! | verbs object | trait | software provider | rdma-core provider |
//! |---|---|---|---|
//! | `Context` (`ibv_context`) | [`DeviceOps`] + [`DeviceCm`] | `iwarp-soft`: `device.rs` + `cm.rs` | `iwarp-rdmacore`: `ops.rs` + `cm.rs` |
//! | `ProtectionDomain` (`ibv_pd`), MR registration, QP creation | [`PdOps`] | `mr.rs` (creating the QP in `qp.rs`) | `ops.rs` (over `mr.rs`, `qp.rs`) |
//! | `Listener` (`rdma_listen`) | [`ListenerOps`] | `cm.rs` | `cm.rs` |
//! | `ConnRequest` (`RDMA_CM_EVENT_CONNECT_REQUEST`) | [`RequestOps`] | `cm.rs` | `cm.rs` |
//!
//! These traits are the provider interface: the providers are separate
//! crates (`iwarp-soft`, `iwarp-rdmacore`) that depend on this one, and a
//! third would implement the same traits. The facade `iwarp` holds the one
//! table of providers (its `device.rs` opens a device by name); its verbs
//! layer (`context.rs`, `cm.rs`) holds these objects as
//! `Arc<dyn ...>`/`Box<dyn ...>` and calls through them, with no `cfg`
//! branch and no downcast. A provider that needs its own concrete type back
//! (a CQ given to its `create_qp`, a QP given to its request's `accept`)
//! downcasts inside the provider, and an object of the other provider is
//! an error there ([`Error::WrongDevice`], [`CmError::OtherProvider`]).

use std::any::Any;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use iwarp_proto::mem::{Access, PdId};

use crate::cm_types::{CmError, CongestionControl, ConnParam, MpaConfig};
use crate::cq::CompletionQueue;
use crate::device_info::{DeviceAttr, Transport};
use crate::error::Error;
use crate::mr::{MemoryRegion, MrTable};
use crate::provider::QpOps;
use crate::qp::{QpInitAttr, QueuePair};

/// An open device (`ibv_context`), as a provider implements it; its
/// connection-manager part ([`DeviceCm`]) lives in the provider's `cm.rs`.
pub trait DeviceOps: DeviceCm + Send + Sync + fmt::Debug {
    /// The device's name: `soft`, or the kernel device's (`siw0`).
    fn name(&self) -> &str;
    /// The transport the device speaks.
    fn transport(&self) -> Transport;
    /// What a kernel device reports about itself; `None` for `soft`.
    fn attr(&self) -> Option<&DeviceAttr>;
    /// `ibv_alloc_pd` (cannot fail in this API: a provider that must ask a
    /// device allocates on first use). `mrs` is the context's region table,
    /// in which every provider's regions also live (STags for `soft`,
    /// bounds and access checks for both).
    fn alloc_pd(&self, id: PdId, mrs: &Arc<MrTable>) -> Arc<dyn PdOps>;
    /// `ibv_create_cq`: give the new `cq` whatever the device needs behind
    /// it (an `ibv_cq` and its pump thread on rdma-core; nothing on
    /// `soft`, whose queue pairs complete into `cq` directly).
    fn create_cq(&self, cq: &CompletionQueue, depth: usize) -> Result<(), Error>;
    /// For the provider's own calls that take a context (rdma-core's
    /// `rdma::cm::Listener::bind`; unused in a build without it).
    #[allow(dead_code)]
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// Something that holds an open device: `iwarp::Context`. A provider's
/// own calls that take a context (the rdma-core provider's
/// `Listener::bind`) take it through this trait, since the context type
/// lives above the providers.
pub trait DeviceHandle {
    /// The provider's device object.
    fn device_ops(&self) -> &Arc<dyn DeviceOps>;
}

/// The connection-manager part of a device: listening (`rdma_listen`).
pub trait DeviceCm {
    /// Listen on `addr`; `mpa` is the policy requests are negotiated
    /// against (where the provider negotiates MPA itself).
    fn listen(&self, addr: SocketAddr, mpa: MpaConfig) -> Result<Box<dyn ListenerOps>, CmError>;
}

/// A protection domain (`ibv_pd`), as a provider implements it.
pub trait PdOps: Send + Sync {
    /// Register `mr` (already in the context's table) with the device, if
    /// the device keeps its own registrations (`ibv_reg_mr`: the region
    /// then reports the device's lkey/rkey).
    fn register_mr(&self, mr: &mut MemoryRegion, access: Access) -> Result<(), Error>;
    /// `ibv_create_qp` in INIT. `attr`'s depths are checked by the caller.
    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>, Error>;
}

/// A listening endpoint, as a provider implements it.
pub trait ListenerOps: Send + Sync + fmt::Debug {
    fn local_addr(&self) -> SocketAddr;
    fn mpa(&self) -> &MpaConfig;
    fn set_congestion(&self, cc: &CongestionControl) -> Result<(), CmError>;
    fn tcp_congestion(&self) -> Result<String, CmError>;
    fn device_name(&self) -> &str;
    /// The next request, at most `timeout` (`None`: without limit);
    /// [`CmError::Timeout`] when the time runs out.
    fn get_request(&self, timeout: Option<Duration>) -> Result<Box<dyn RequestOps>, CmError>;
    /// Readable when a request may be waiting.
    fn raw_fd(&self) -> RawFd;
}

/// An incoming connection request, as a provider implements it.
pub trait RequestOps: Send + Sync + fmt::Debug {
    fn peer_addr(&self) -> SocketAddr;
    fn private_data(&self) -> &[u8];
    fn revision(&self) -> u8;
    fn crc(&self) -> bool;
    fn markers(&self) -> bool;
    fn ird(&self) -> u16;
    fn ord(&self) -> u16;
    fn tcp_congestion(&self) -> Result<String, CmError>;
    /// `soft` or `rdma-core`.
    fn provider(&self) -> &'static str;
    /// `rdma_accept` onto `qp`, which must be the same provider's
    /// ([`CmError::OtherProvider`] otherwise, and the request is refused).
    fn accept(self: Box<Self>, qp: &QueuePair, param: &ConnParam) -> Result<(), CmError>;
    /// `rdma_reject` with `private_data`.
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), CmError>;
}

#[cfg(test)]
mod tests {
    /// The verbs types call providers only through the seam: no
    /// `cfg(feature = ...)` branch and no downcast in this crate's files
    /// (issue 28 item 1). The facade `iwarp` checks its own files the same
    /// way; the providers may downcast their own objects.
    #[test]
    fn verbs_types_have_no_provider_branch_or_downcast() {
        let files = [
            ("qp.rs", include_str!("qp.rs")),
            ("cq.rs", include_str!("cq.rs")),
            ("mr.rs", include_str!("mr.rs")),
            ("provider.rs", include_str!("provider.rs")),
            ("lib.rs", include_str!("lib.rs")),
        ];
        for (name, text) in files {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                assert!(
                    !code.contains("cfg(feature") && !code.contains("cfg(not(feature"),
                    "{name}:{}: a provider branch in the verbs types: {line}",
                    n + 1
                );
                assert!(
                    !code.contains("downcast"),
                    "{name}:{}: a downcast in the verbs types: {line}",
                    n + 1
                );
            }
        }
    }
}
