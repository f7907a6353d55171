//! Memory of the rdma-core provider: the protection domain (`ibv_pd`) and
//! the registration of a [`MemoryRegion`](iwarp_verbs::MemoryRegion)'s buffer
//! with the device (`ibv_reg_mr`), whose `lkey`/`rkey` the region then
//! reports instead of the software provider's STags.

use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use iwarp_proto::mem::Access;

use crate::device::{os_err, Device};
use crate::ffi;
use iwarp_verbs::Error;

/// An `ibv_reg_mr` failure; for ENOMEM, which is what a device's check of
/// the locked-memory limit gives (siw counts registered pages against
/// RLIMIT_MEMLOCK even for root), the limit and the fix.
fn reg_mr_err(len: usize, e: std::io::Error) -> Error {
    let mut why = e.to_string();
    if e.raw_os_error() == Some(libc::ENOMEM) {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit.
        let known = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0;
        why.push_str(&memlock_hint(len, known.then_some(lim.rlim_cur)));
    }
    Error::RdmaCore {
        op: "ibv_reg_mr",
        why,
    }
}

/// The fix for an ENOMEM of `ibv_reg_mr` of `len` bytes under the
/// locked-memory limit `limit` (None: unknown; `RLIM_INFINITY`: none).
fn memlock_hint(len: usize, limit: Option<libc::rlim_t>) -> String {
    match limit {
        Some(l) if l != libc::RLIM_INFINITY => format!(
            " registering {len} bytes; the locked-memory limit (RLIMIT_MEMLOCK) is {l} bytes, \
             and the kernel device pins registered memory against it: raise it (`ulimit -l \
             unlimited`, systemd LimitMEMLOCK=, /etc/security/limits.conf memlock) or register \
             less"
        ),
        _ => format!(
            " registering {len} bytes: the host is short of memory it can pin; register less"
        ),
    }
}

/// An `ibv_pd`.
pub(crate) struct Pd {
    pub(crate) dev: Arc<Device>,
    pub(crate) pd: *mut ffi::ibv_pd,
}

// SAFETY: see `Device`.
unsafe impl Send for Pd {}
// SAFETY: see `Device`.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn alloc(dev: &Arc<Device>) -> Result<Arc<Pd>, Error> {
        // SAFETY: the context is open.
        let pd = unsafe { (dev.lib.verbs.ibv_alloc_pd)(dev.ctx) };
        if pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd {
            dev: dev.clone(),
            pd,
        }))
    }
}

/// A protection domain of a kernel device: its `ibv_pd`, allocated on
/// first use (`alloc_pd` cannot fail in the verbs API).
pub(crate) struct RdmaPd {
    pub(crate) dev: Arc<Device>,
    hw: std::sync::OnceLock<Arc<Pd>>,
}

impl RdmaPd {
    pub(crate) fn new(dev: &Arc<Device>) -> RdmaPd {
        RdmaPd {
            dev: dev.clone(),
            hw: std::sync::OnceLock::new(),
        }
    }

    /// The `ibv_pd`, allocated now if this is its first use.
    pub(crate) fn hw_pd(&self) -> Result<&Arc<Pd>, Error> {
        if let Some(pd) = self.hw.get() {
            return Ok(pd);
        }
        let pd = Pd::alloc(&self.dev)?;
        // A racing thread may have set it first; either Pd is fine.
        Ok(self.hw.get_or_init(|| pd))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; every MR and QP holds an Arc
        // to this Pd, so none is left.
        unsafe { (self.dev.lib.verbs.ibv_dealloc_pd)(self.pd) };
    }
}

/// The `ibv_mr` of a [`MemoryRegion`](iwarp_verbs::MemoryRegion).
pub(crate) struct HwMr {
    pd: Arc<Pd>,
    mr: *mut ffi::ibv_mr,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

// SAFETY: see `Device`.
unsafe impl Send for HwMr {}
// SAFETY: see `Device`.
unsafe impl Sync for HwMr {}

impl fmt::Debug for HwMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HwMr(lkey {:#x}, rkey {:#x})", self.lkey, self.rkey)
    }
}

/// `ibv_access_flags` of an [`Access`]. iWARP devices require
/// `REMOTE_WRITE` on the sink of an RDMA Read (the Read Response is a
/// tagged write into it); the caller's flags are passed as given.
pub(crate) fn access_flags(a: Access) -> c_int {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= ffi::IBV_ACCESS_LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= ffi::IBV_ACCESS_REMOTE_WRITE;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= ffi::IBV_ACCESS_REMOTE_READ;
    }
    f
}

impl HwMr {
    /// Register `ptr..ptr + len`, which the caller keeps valid until the
    /// returned value is dropped (the [`MemoryRegion`](iwarp_verbs::MemoryRegion)
    /// owns both).
    pub(crate) fn register(
        pd: &Arc<Pd>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<HwMr, Error> {
        // SAFETY: `pd` is allocated; the memory is valid for `len` bytes
        // while this registration lives (the caller's contract above).
        let mr =
            unsafe { (pd.dev.lib.verbs.ibv_reg_mr)(pd.pd, ptr.cast(), len, access_flags(access)) };
        if mr.is_null() {
            return Err(reg_mr_err(len, std::io::Error::last_os_error()));
        }
        // SAFETY: a non-null result of ibv_reg_mr is a valid ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(HwMr {
            pd: pd.clone(),
            mr,
            lkey,
            rkey,
        })
    }
}

impl Drop for HwMr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once, before the
        // memory is freed (the MemoryRegion drops this first).
        unsafe { (self.pd.dev.lib.verbs.ibv_dereg_mr)(self.mr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reg_mr_enomem_names_the_memlock_limit_and_the_fix() {
        let e = reg_mr_err(33_554_432, std::io::Error::from_raw_os_error(libc::ENOMEM)).to_string();
        assert!(e.contains("ibv_reg_mr"), "{e}");
        assert!(e.contains("33554432 bytes"), "{e}");
        let h = memlock_hint(1 << 25, Some(8 << 20));
        assert!(
            h.contains("8388608 bytes") && h.contains("ulimit -l"),
            "{h}"
        );
        let h = memlock_hint(1 << 25, Some(libc::RLIM_INFINITY));
        assert!(!h.contains("ulimit") && h.contains("register less"), "{h}");
        // Other errors are passed through as they are.
        let e = reg_mr_err(4096, std::io::Error::from_raw_os_error(libc::EINVAL)).to_string();
        assert!(!e.contains("RLIMIT_MEMLOCK"), "{e}");
    }

    #[test]
    fn access_flags_map_to_ibv_bits() {
        assert_eq!(
            access_flags(Access::LOCAL_WRITE | Access::REMOTE_READ),
            ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_READ
        );
    }
}
