//! The iomap state of one connection (`riomap`'s table and the peer's),
//! kept inside [`super::state::Flow`]; a leaf.

use std::collections::VecDeque;

use crate::wire::{ConnDataRepr, Iomap, Sge, SGE_LEN};

/// The iomap state of one connection (kept inside [`Flow`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Iomaps {
    /// Entries of our table (what we advertise).
    pub(super) local_size: u16,
    /// The peer's table: address, rkey, and entries in `length`.
    pub(super) remote: Sge,
    /// Which entries of the peer's table our mappings use.
    pub(super) used: Vec<bool>,
    /// Entries to write into the peer's table, in order.
    pub(super) queue: VecDeque<(u16, Iomap)>,
    /// The peer's mappings, copied out of our table.
    pub(super) peer: Vec<Option<Iomap>>,
    /// Indices the peer announced whose entry is not copied out yet.
    pub(super) announced: Vec<u16>,
}

impl Iomaps {
    /// `rs_save_conn_data`'s `remote_iomap`.
    pub(crate) fn on_establish(&mut self, peer: &ConnDataRepr) {
        if peer.iomap {
            self.remote = Sge {
                addr: peer
                    .target_sgl
                    .addr
                    .wrapping_add(SGE_LEN as u64 * u64::from(peer.target_sgl.length)),
                key: peer.target_sgl.key,
                length: u32::from(peer.target_iomap_size),
            };
            self.used = vec![false; usize::from(peer.target_iomap_size)];
        }
    }

    /// Entries we advertise.
    pub(crate) fn local_size(&self) -> u16 {
        self.local_size
    }
}
