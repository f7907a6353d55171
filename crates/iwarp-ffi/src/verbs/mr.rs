//! Memory regions (`ibv_reg_mr`, `ibv_dereg_mr`): registering caller or
//! library memory, and the region's address, length and keys.

use std::ffi::c_void;

use super::types::{access_from_c, iwarp_mr, iwarp_pd};
use crate::boundary::{free, give, guard, guard_or, handle, out_ptr};
use crate::error::{iwarp_result, FfiError};

/// Register caller memory `addr .. addr + length` (`ibv_reg_mr`). `access`
/// is `iwarp_access_flags` OR-ed together. The memory must stay valid until
/// `iwarp_dereg_mr`; the stack's threads read and write it while work
/// requests (and the peer's RDMA operations) use it.
///
/// # Safety
/// `pd` is NULL or a live handle; `out` is NULL or writable; `addr` is NULL
/// or valid for reads and writes of `length` bytes until the region is
/// deregistered.
#[no_mangle]
pub unsafe extern "C" fn iwarp_reg_mr(
    pd: *mut iwarp_pd,
    addr: *mut c_void,
    length: usize,
    access: u32,
    out: *mut *mut iwarp_mr,
) -> iwarp_result {
    guard("iwarp_reg_mr", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let pd = unsafe { handle(pd, "pd") }?;
        if addr.is_null() {
            return Err(FfiError::null("addr"));
        }
        let access = access_from_c(access)?;
        // SAFETY: the caller keeps `addr .. addr + length` valid until
        // iwarp_dereg_mr drops the region (the function's contract).
        let mr = unsafe { pd.pd.reg_mr_raw(addr.cast::<u8>(), length, access) }?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_mr { mr }) };
        Ok(())
    })
}

/// Allocate and register a zeroed, page-aligned buffer of `length` bytes
/// owned by the library (`ibv_reg_mr` over memory you do not manage). Its
/// address is `iwarp_mr_addr`; it is freed by `iwarp_dereg_mr`.
///
/// # Safety
/// `pd` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_alloc_mr(
    pd: *mut iwarp_pd,
    length: usize,
    access: u32,
    out: *mut *mut iwarp_mr,
) -> iwarp_result {
    guard("iwarp_alloc_mr", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let pd = unsafe { handle(pd, "pd") }?;
        let mr = pd.pd.reg_mr(length, access_from_c(access)?)?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_mr { mr }) };
        Ok(())
    })
}

/// Start address of the region (NULL if `mr` is NULL).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_addr(mr: *const iwarp_mr) -> *mut c_void {
    guard_or("iwarp_mr_addr", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live handle (caller).
        let mr = unsafe { handle(mr, "mr") }?;
        Ok(mr.mr.addr() as usize as *mut c_void)
    })
}

/// Length of the region in bytes (0 if `mr` is NULL).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_length(mr: *const iwarp_mr) -> usize {
    guard_or("iwarp_mr_length", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(mr, "mr") }?.mr.len())
    })
}

/// Local key, for `iwarp_sge.lkey` (0 if `mr` is NULL).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_lkey(mr: *const iwarp_mr) -> u32 {
    guard_or("iwarp_mr_lkey", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(mr, "mr") }?.mr.lkey())
    })
}

/// Remote key (STag) the peer uses in RDMA Write and Read (0 if `mr` is
/// NULL; 0 is never a valid key of a registered region).
///
/// # Safety
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_mr_rkey(mr: *const iwarp_mr) -> u32 {
    guard_or("iwarp_mr_rkey", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(mr, "mr") }?.mr.rkey())
    })
}

/// Deregister the region (`ibv_dereg_mr`); its keys are invalid from now
/// on, and a library-owned buffer is freed. Waits until no stack thread
/// still copies to or from it. Do not deregister a region an outstanding
/// work request uses. NULL is a no-op.
///
/// # Safety
/// `mr` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_dereg_mr(mr: *mut iwarp_mr) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_dereg_mr", mr) }
}
