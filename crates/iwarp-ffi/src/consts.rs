//! The C API's limits and special values (`IWARP_TIMEOUT_INFINITE`,
//! `IWARP_MAX_PRIVATE_DATA`, `IWARP_MAX_SGE`): a leaf that the verbs and
//! connection-manager files import, re-exported at the crate root.

/// Wait without a limit (for the `timeout_ms` arguments).
pub const IWARP_TIMEOUT_INFINITE: u32 = u32::MAX;

/// Most private data an MPA Request, Reply or Reject carries (RFC 5044
/// §7.1). With MPA revision 2 (the default) the RFC 6581 parameters take 4
/// of these bytes, which leaves 508 for the application.
pub const IWARP_MAX_PRIVATE_DATA: usize = 512;

/// Most scatter/gather elements in one work request.
pub const IWARP_MAX_SGE: usize = 6;
const _: () = assert!(IWARP_MAX_SGE == iwarp_rs::MAX_SGE);
