//! The crate's memory edge: the registration of application memory for
//! zero-copy sends and `riomap`. Everything else in the crate is safe code
//! (`#![deny(unsafe_code)]` in `lib.rs`); waiting on descriptors goes
//! through `iwarp::wait::WaitSet` ([`crate::poll`]).
#![allow(unsafe_code)]

use iwarp::{Access, MemoryRegion, ProtectionDomain};

/// Registers `buf` as the source of zero-copy RDMA Writes: no access
/// rights beyond local read, so no receive, Read Response or peer Write
/// can ever target it.
///
/// The caller must drop the region before `buf`'s borrow ends (the
/// stream's zero-copy send waits for every Write from it to complete,
/// then drops it; dropping waits until no driver thread still reads it).
pub(crate) fn register_source(
    pd: &ProtectionDomain,
    buf: &[u8],
) -> Result<MemoryRegion, iwarp::Error> {
    // SAFETY: `buf` is valid for reads for its whole length while the
    // borrow lasts, and the region outlives no part of it (see above).
    // `reg_mr_raw` asks for memory valid for writes too, because a region
    // with write rights may be written; this one has none
    // (`Access::NONE`), so the stack only ever reads it (RDMA Write
    // sources are read at transmit time) and the shared borrow's promise
    // of immutability holds.
    unsafe { pd.reg_mr_raw(buf.as_ptr().cast_mut(), buf.len(), Access::NONE) }
}

/// Registers the caller's memory at `ptr` as the target of the peer's
/// `riowrite` (local and remote write), for the C API's `riomap`.
///
/// # Safety
/// `ptr` must be valid for reads and writes of `len` bytes for as long as
/// the returned region lives, and no Rust reference to that memory may
/// exist meanwhile (the peer writes into it at any time).
pub(crate) unsafe fn register_target(
    pd: &ProtectionDomain,
    ptr: *mut u8,
    len: usize,
) -> Result<MemoryRegion, iwarp::Error> {
    // SAFETY: forwarded from the caller: valid for reads and writes of
    // `len` bytes while the region lives, aliased by no Rust reference.
    unsafe { pd.reg_mr_raw(ptr, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }
}
