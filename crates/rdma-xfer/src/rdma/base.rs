//! What every file of the RDMA transport uses: the sizes of the control
//! and data channels, the work-request IDs, the MPA settings, the failure
//! every thread sees ([`Fail`]) and the session's lock helper. A leaf.

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use iwarp::cm::{MpaConfig, Policy};

use crate::Error;

/// Receives posted on the control QP.
pub const CTRL_RECVS: u32 = 32;
/// Control-message send slots.
pub(super) const CTRL_SLOTS: u32 = 32;
/// Every this many control Sends one is signaled; its completion frees
/// its slot and every slot posted before it (one send queue completes in
/// order). The last free slot is always signaled, so slots come back.
/// Each signaled completion wakes the dispatcher, and the sink sends a
/// Grant per block: signaling each one cost a wake-up per block.
pub(super) const CTRL_SIGNAL_EVERY: u32 = CTRL_SLOTS / 4;
/// Size of a data-QP message slot.
pub(super) const DATA_MSG: usize = 64;
/// Most consumed data receives the dispatcher collects before reposting
/// them in one call (each post takes the QP's engine lock, which the
/// receive thread holds while it places data: a repost per block often
/// had to wait for it).
pub(super) const DATA_REPOST_MAX: u32 = 32;

/// Why a connection from `peer` is refused when the session accepts only
/// `only_from` (logged here; the text goes into the MPA reject).
pub(crate) fn refuse(peer: SocketAddr, only_from: Option<IpAddr>) -> Option<String> {
    let ip = only_from?;
    // An IPv4 peer of a dual-stack socket shows as ::ffff:a.b.c.d (RFC 4291
    // §2.5.5.2): the same host as a.b.c.d.
    if peer.ip().to_canonical() == ip.to_canonical() {
        return None;
    }
    tracing::warn!(%peer, expected = %ip, "rdma-xfer: refused a connection from an address other than the control connection's");
    Some("rdma-xfer: refused: not the address that opened the session".into())
}

/// Receives posted per data QP for a pool of `depth` blocks: `depth` (at
/// most one BlockDone per granted block is in flight) plus the batch that
/// may wait to be reposted.
pub(super) fn data_recv_slots(depth: u32) -> u32 {
    depth + repost_batch(depth)
}

/// How many consumed data receives are reposted together.
pub(super) fn repost_batch(depth: u32) -> u32 {
    depth.clamp(1, DATA_REPOST_MAX)
}
pub(super) const K_CTRL_RECV: u64 = 1;
pub(super) const K_CTRL_SEND: u64 = 2;
pub(super) const K_DATA_RECV: u64 = 3;
pub(super) const K_DATA_SEND: u64 = 4;
pub(super) const K_DATA_WRITE: u64 = 5;
/// The active side's first FPDU on a connection (`setup::first_fpdu`),
/// unsignaled: it never completes unless flushed.
pub(super) const K_FIRST_FPDU: u64 = 6;

pub(super) fn wr_id(kind: u64, qp: usize, val: u64) -> u64 {
    kind << 56 | (qp as u64 & 0xff) << 48 | (val & 0xffff_ffff_ffff)
}

pub(super) fn wr_parts(id: u64) -> (u64, usize, u64) {
    (
        id >> 56,
        ((id >> 48) & 0xff) as usize,
        id & 0xffff_ffff_ffff,
    )
}

/// The MPA settings of rdma-xfer connections.
pub(crate) fn mpa_config(crc: bool) -> MpaConfig {
    MpaConfig {
        crc: if crc {
            Policy::Required
        } else {
            Policy::Optional
        },
        ..MpaConfig::default()
    }
}

/// A failure that every thread of the session sees.
#[derive(Debug, Clone)]
pub(super) enum Fail {
    PeerAborted(String),
    Disconnected(String),
    Protocol(String),
    Timeout(&'static str, Duration),
    Local(String),
}

impl Fail {
    pub(super) fn to_error(&self) -> Error {
        match self.clone() {
            Fail::PeerAborted(s) => Error::PeerAborted(s),
            Fail::Disconnected(s) => Error::Disconnected(s),
            Fail::Protocol(s) => Error::Protocol(s),
            Fail::Timeout(w, a) => Error::Timeout {
                waiting_for: w,
                after: a,
            },
            Fail::Local(s) => Error::Broken(s),
        }
    }
}

/// Lock a mutex, ignoring poisoning (a panic elsewhere must not take the
/// session's bookkeeping down with it; failures go through `set_fail`).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
