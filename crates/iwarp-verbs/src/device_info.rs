//! What a provider says about a device: the transport it speaks, its entry
//! in the device list, its attributes, and why it could not be chosen or
//! opened.
//!
//! A leaf: device selection (`iwarp::device`) and the providers (the
//! rdma-core provider's device list and `open`) both use these types, and
//! this module uses neither, so the selection can call down into a
//! provider without the provider reaching back up into the selection.
//! The public paths are `iwarp::device`'s (`iwarp::device::Transport`,
//! also re-exported at the crate root).

use std::fmt;

/// The transport a device speaks (`ibv_device::transport_type`, and for
/// InfiniBand-transport devices the port's link layer, which tells
/// InfiniBand from RoCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// This crate's software iWARP (RFC 5040/5041/5044 over TCP).
    SoftIwarp,
    /// iWARP (`IBV_TRANSPORT_IWARP`): kernel siw, Chelsio, Intel iWARP.
    Iwarp,
    /// InfiniBand transport over an InfiniBand link.
    InfiniBand,
    /// InfiniBand transport over Ethernet (RoCE: rxe, mlx5 on Ethernet).
    Roce,
    /// Something else (`ibv_transport_type` value).
    Other(i32),
}

impl Transport {
    /// True for the iWARP transports, which have no Write with Immediate,
    /// no RNR retry (a Send without a posted receive is a fatal error),
    /// and need `REMOTE_WRITE` on the sink of an RDMA Read.
    pub fn is_iwarp(self) -> bool {
        matches!(self, Transport::SoftIwarp | Transport::Iwarp)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::SoftIwarp => f.write_str("iWARP (software, TCP)"),
            Transport::Iwarp => f.write_str("iWARP"),
            Transport::InfiniBand => f.write_str("InfiniBand"),
            Transport::Roce => f.write_str("RoCE"),
            Transport::Other(v) => write!(f, "transport {v}"),
        }
    }
}

/// What the device says it can do (`ibv_query_device` and port 1 of
/// `ibv_query_port`): the numbers that differ between transports and
/// devices and that the rdma-core provider uses instead of assuming them
/// (`iwarp::Context::device_attr`; the software
/// device reports none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// The kernel device name.
    pub name: String,
    /// iWARP, InfiniBand or RoCE (from the transport type and the link
    /// layer of port 1).
    pub transport: Transport,
    /// Firmware version string.
    pub fw_ver: String,
    /// Largest queue depth.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list of a send or receive.
    pub max_sge: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// RDMA Reads a QP can serve at once (IRD).
    pub max_qp_rd_atom: u32,
    /// RDMA Reads a QP can have outstanding (ORD).
    pub max_qp_init_rd_atom: u32,
    /// Port 1's active MTU in bytes (IB/RoCE; iWARP reports the netdev's).
    pub active_mtu: u32,
    /// Port 1 is ACTIVE.
    pub port_active: bool,
    /// The transport has Write with Immediate and RNR retry (IB, RoCE);
    /// iWARP has neither.
    pub has_write_imm_and_rnr: bool,
}

/// A device `iwarp::list_devices` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The name to pass to `iwarp::Context::open_device`.
    pub name: String,
    /// What it speaks.
    pub transport: Transport,
    /// `"soft"` or `"rdma-core"`.
    pub provider: &'static str,
}

/// Why a device could not be chosen or opened. `Display` names the cause
/// and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// Not `soft`, `auto` or a plausible kernel device name.
    BadName(String),
    /// A kernel device was asked for but rdma-core cannot be used: the
    /// libraries are missing, or the kernel has no RDMA device at all.
    NoRdma { name: String, why: String },
    /// rdma-core works but has no device of that name.
    NoSuchDevice {
        name: String,
        available: Vec<String>,
    },
    /// This build has no rdma-core provider (cargo feature `rdma-core` off).
    FeatureOff { name: String },
    /// rdma-core refused to open the device.
    Open { name: String, why: String },
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::BadName(s) => write!(f, "invalid device name {s:?}: use soft, auto, or a kernel RDMA device name as `ibv_devices` lists it (siw0, rxe0, mlx5_0)"),
            DeviceError::NoRdma { name, why } => write!(f, "no RDMA device {name}: {why}; use --device soft (or IWARP_DEVICE=soft) for the software provider"),
            DeviceError::NoSuchDevice { name, available } => write!(f, "no RDMA device {name}: rdma-core lists [{}]; pick one of them, auto, or soft", available.join(", ")),
            DeviceError::FeatureOff { name } => write!(f, "device {name} needs the rdma-core provider, which this build lacks: rebuild with the cargo feature rdma-core (on by default), or use --device soft"),
            DeviceError::Open { name, why } => write!(f, "cannot open RDMA device {name}: {why}"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// Why rdma-core sees no device, from what `/sys` shows.
#[doc(hidden)]
pub fn no_device_reason() -> String {
    if std::path::Path::new("/sys/class/infiniband").exists() {
        String::from("the kernel has RDMA support but no RDMA device (load a driver or add one: `rdma link add siw0 type siw netdev eth0`)")
    } else {
        String::from("the kernel has no RDMA modules loaded (/sys/class/infiniband is missing)")
    }
}
