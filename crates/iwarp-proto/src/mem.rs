//! The memory-access boundary of the sans-IO engine.
//!
//! The engine never touches memory itself. Every check of a remote or local
//! access, and every byte copied into or out of a registered region, goes
//! through [`MemoryAccess`]. The `iwarp` crate implements it over real
//! registered memory (the one `unsafe` edge); tests implement it over plain
//! vectors.
//!
//! STags follow the siw layout (RFC 5040 §2.1 leaves the format to the
//! implementation): `stag = index << 8 | key`, so a stale or guessed STag fails
//! the key check. The local key (lkey) and remote key (rkey) of a region are
//! the same STag, as in siw.

use core::fmt;

/// Protection-domain identifier.
pub type PdId = u32;

/// Access rights of a memory region (a subset of `ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No rights beyond local read, which every region has.
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: receive buffers and Read sinks.
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: target of a peer's RDMA Write.
    pub const REMOTE_WRITE: Access = Access(2);
    /// `IBV_ACCESS_REMOTE_READ`: source of a peer's RDMA Read.
    pub const REMOTE_READ: Access = Access(4);

    /// All of the above.
    pub const ALL: Access = Access(7);

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// Build from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u8) -> Access {
        Access(bits & 7)
    }
    /// True if every right in `other` is also in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if `self` has the REMOTE_READ or REMOTE_WRITE right: the region
    /// was registered to be named by a peer.
    pub const fn is_remote(self) -> bool {
        self.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0) != 0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.contains(Access::LOCAL_WRITE) {
            parts.push("LOCAL_WRITE");
        }
        if self.contains(Access::REMOTE_WRITE) {
            parts.push("REMOTE_WRITE");
        }
        if self.contains(Access::REMOTE_READ) {
            parts.push("REMOTE_READ");
        }
        if parts.is_empty() {
            parts.push("NONE");
        }
        write!(f, "Access({})", parts.join("|"))
    }
}

/// Why a memory access was refused (siw `siw_check_mem`).
///
/// Mapped once to the RDMAP/DDP Terminate codes by
/// [`crate::fault::term_code`] (as [`crate::fault::Fault::TaggedSink`] or
/// [`crate::fault::Fault::ReadSource`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No region with this STag index, or it was deregistered/invalidated.
    InvalidStag,
    /// The index exists but its 8-bit key does not match.
    KeyMismatch,
    /// The region belongs to another protection domain.
    PdMismatch,
    /// The region lacks the access right the operation needs.
    AccessRights,
    /// The range `[to, to + len)` is not inside the region (or overflows).
    Bounds,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemError::InvalidStag => "invalid STag (not registered, deregistered or invalidated)",
            MemError::KeyMismatch => "STag key mismatch (stale or guessed STag)",
            MemError::PdMismatch => "STag belongs to another protection domain",
            MemError::AccessRights => "memory region lacks the required access right",
            MemError::Bounds => "access outside the memory region's bounds",
        })
    }
}

impl std::error::Error for MemError {}

/// What the engine needs from registered memory.
///
/// Addresses are tagged offsets (TO) in the region's address space: a region
/// registered at `iova` with length `len` covers `[iova, iova + len)`.
/// Implementations must bounds-check every call themselves and return an
/// error rather than panic or touch memory outside the region, even if the
/// engine has already called [`MemoryAccess::check`].
pub trait MemoryAccess {
    /// RFC 5040 §6.4 / siw `siw_check_mem`: may the QP in protection domain
    /// `pd` access `[to, to + len)` of the region named by `stag` with the
    /// rights `need`? A zero-length access needs only a valid STag (RFC 5041
    /// §7.2 still validates the STag of a zero-length tagged segment).
    fn check(&self, stag: u32, to: u64, len: u32, pd: PdId, need: Access) -> Result<(), MemError>;

    /// Copy `data` into the region at `to`.
    fn write(&self, stag: u32, to: u64, data: &[u8]) -> Result<(), MemError>;

    /// [`check`](Self::check) then [`write`](Self::write) of the same
    /// range, for a tagged segment whose payload is all at hand: an
    /// implementation may do both with one lookup of the region. Fails
    /// with the error `check` would give, and then writes nothing.
    fn check_and_write(
        &self,
        stag: u32,
        to: u64,
        data: &[u8],
        pd: PdId,
        need: Access,
    ) -> Result<(), MemError> {
        self.check(stag, to, data.len() as u32, pd, need)?;
        self.write(stag, to, data)
    }

    /// Call `f` with the bytes of `[to, to + len)` in one or more pieces, in
    /// order, without copying them (used for the transmit CRC and by tests).
    fn visit(&self, stag: u32, to: u64, len: u32, f: &mut dyn FnMut(&[u8]))
        -> Result<(), MemError>;

    /// Invalidate the region on a peer's Send with Invalidate (RFC 5040
    /// §5.1, §6.7.2). After this, every check of `stag` fails with
    /// `InvalidStag`.
    ///
    /// The STag must be valid, in the QP's protection domain (as siw's
    /// `siw_invalidate_stag` checks) and registered for remote access
    /// (`AccessRights` otherwise): a peer only ever learns STags that were
    /// advertised to it, which are remote STags, so naming a local-only one
    /// (a server's private buffer, whose key a hostile client can guess
    /// from the 8-bit key space) is refused rather than letting the peer
    /// break the owner's later local work. siw itself does not check
    /// rights here; no well-behaved peer sees the difference.
    fn invalidate(&self, stag: u32, pd: PdId) -> Result<(), MemError>;
}

/// A [`MemoryAccess`] over plain vectors, for tests, fuzzing and
/// simulation: the same checks as real registered memory (siw
/// `siw_check_mem`), with no real addresses involved.
#[derive(Debug, Default)]
pub struct SimMemory {
    regions: std::cell::RefCell<Vec<Option<SimRegion>>>,
    next_key: std::cell::Cell<u8>,
}

#[derive(Debug)]
struct SimRegion {
    stag: u32,
    pd: PdId,
    access: Access,
    iova: u64,
    data: Vec<u8>,
    valid: bool,
}

impl SimMemory {
    /// No regions.
    pub fn new() -> SimMemory {
        SimMemory::default()
    }

    /// Register `len` zeroed bytes at tagged offset `iova`; returns the STag.
    pub fn register(&self, pd: PdId, access: Access, iova: u64, len: usize) -> u32 {
        let mut regions = self.regions.borrow_mut();
        let index = match regions.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                regions.push(None);
                regions.len() - 1
            }
        };
        let key = self.next_key.get().wrapping_add(1);
        self.next_key.set(key);
        let stag = ((index as u32 + 1) << 8) | key as u32;
        regions[index] = Some(SimRegion {
            stag,
            pd,
            access,
            iova,
            data: vec![0; len],
            valid: true,
        });
        stag
    }

    /// Deregister; the index may be reused with another key.
    pub fn deregister(&self, stag: u32) {
        let mut regions = self.regions.borrow_mut();
        if let Some(slot) = Self::index(stag).and_then(|i| regions.get_mut(i)) {
            if slot.as_ref().is_some_and(|r| r.stag == stag) {
                *slot = None;
            }
        }
    }

    /// A copy of the region's bytes.
    pub fn contents(&self, stag: u32) -> Vec<u8> {
        let regions = self.regions.borrow();
        Self::index(stag)
            .and_then(|i| regions.get(i))
            .and_then(|r| r.as_ref())
            .filter(|r| r.stag == stag)
            .map(|r| r.data.clone())
            .unwrap_or_default()
    }

    /// Overwrite the start of the region with `data` (local CPU access).
    pub fn fill(&self, stag: u32, data: &[u8]) {
        let mut regions = self.regions.borrow_mut();
        if let Some(r) = Self::index(stag)
            .and_then(|i| regions.get_mut(i))
            .and_then(|r| r.as_mut())
            .filter(|r| r.stag == stag)
        {
            let n = data.len().min(r.data.len());
            r.data[..n].copy_from_slice(&data[..n]);
        }
    }

    fn index(stag: u32) -> Option<usize> {
        (stag >> 8).checked_sub(1).map(|i| i as usize)
    }

    fn with_region<R>(
        &self,
        stag: u32,
        f: impl FnOnce(&mut SimRegion) -> Result<R, MemError>,
    ) -> Result<R, MemError> {
        let mut regions = self.regions.borrow_mut();
        let r = Self::index(stag)
            .and_then(|i| regions.get_mut(i))
            .and_then(|r| r.as_mut())
            .ok_or(MemError::InvalidStag)?;
        if r.stag != stag {
            return Err(MemError::KeyMismatch);
        }
        if !r.valid {
            return Err(MemError::InvalidStag);
        }
        f(r)
    }

    fn range(r: &SimRegion, to: u64, len: u32) -> Result<std::ops::Range<usize>, MemError> {
        let off = to.checked_sub(r.iova).ok_or(MemError::Bounds)?;
        let end = off.checked_add(len as u64).ok_or(MemError::Bounds)?;
        if end > r.data.len() as u64 {
            return Err(MemError::Bounds);
        }
        Ok(off as usize..end as usize)
    }
}

impl MemoryAccess for SimMemory {
    fn check(&self, stag: u32, to: u64, len: u32, pd: PdId, need: Access) -> Result<(), MemError> {
        self.with_region(stag, |r| {
            if r.pd != pd {
                return Err(MemError::PdMismatch);
            }
            if !r.access.contains(need) {
                return Err(MemError::AccessRights);
            }
            Self::range(r, to, len).map(|_| ())
        })
    }

    fn write(&self, stag: u32, to: u64, data: &[u8]) -> Result<(), MemError> {
        self.with_region(stag, |r| {
            let range = Self::range(r, to, data.len() as u32)?;
            r.data[range].copy_from_slice(data);
            Ok(())
        })
    }

    fn visit(
        &self,
        stag: u32,
        to: u64,
        len: u32,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<(), MemError> {
        self.with_region(stag, |r| {
            let range = Self::range(r, to, len)?;
            f(&r.data[range]);
            Ok(())
        })
    }

    fn invalidate(&self, stag: u32, pd: PdId) -> Result<(), MemError> {
        self.with_region(stag, |r| {
            if r.pd != pd {
                return Err(MemError::PdMismatch);
            }
            if !r.access.is_remote() {
                return Err(MemError::AccessRights);
            }
            r.valid = false;
            Ok(())
        })
    }
}
