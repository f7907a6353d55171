//! Our `riomap` table: the mappings of one connection and the size of the
//! table the peer writes into (`rs_iomap`, riostream's `riomap(3)`); a
//! leaf, kept in the stream's state ([`super::types::State`]).

use std::sync::Arc;

use iwarp::MemoryRegion;

use crate::flow::TARGET_SGL_LEN;
use crate::options::Options;
use crate::wire::{iomap_scale_to_value, iomap_value_to_scale, IOMAP_LEN};
/// One of our mappings.
#[derive(Debug)]
pub(super) struct LocalMap {
    pub(super) id: u64,
    /// Its entry in the peer's table.
    pub(super) index: u16,
    /// Held for its lifetime: the memory is deregistered when the last
    /// handle drops.
    pub(super) _mr: Arc<MemoryRegion>,
    /// `(address, length)` of a C caller's buffer (`riounmap` finds it by
    /// them); `None` for a buffer the library allocated ([`IoMap`]).
    pub(super) raw: Option<(usize, usize)>,
}

/// The mappings of one connection (kept in its state).
#[derive(Debug, Default)]
pub(crate) struct LocalMaps {
    pub(super) maps: Vec<LocalMap>,
    pub(super) next_id: u64,
}

/// Entries of our iomap table for these options (rounded as the conn data
/// carries them).
pub(crate) fn table_entries(opts: &Options) -> u16 {
    iomap_scale_to_value(iomap_value_to_scale(
        opts.iomap_size.min(crate::flow::IOMAP_SIZE_MAX),
    ))
}

/// Bytes of the `tsgl` region: the target SGL and our iomap table.
pub(crate) fn region_len(opts: &Options) -> usize {
    TARGET_SGL_LEN + IOMAP_LEN * usize::from(table_entries(opts))
}
