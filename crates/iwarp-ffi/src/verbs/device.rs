//! Device and protection domain (`ibv_open_device`, `ibv_alloc_pd`).

use std::ffi::c_char;

use iwarp_rs::Context;

use super::types::{iwarp_context, iwarp_pd};
use crate::boundary::{free, give, guard, guard_or, handle, out_ptr};
use crate::error::{iwarp_result, FfiError};

/// Open the device named by the environment variable `IWARP_DEVICE`
/// ("soft", "auto", or a kernel RDMA device such as "siw0"), the software
/// iWARP device when it is unset (`ibv_open_device`); see
/// `iwarp_open_device_named` to name it. Free it with
/// `iwarp_close_device`.
///
/// # Safety
/// `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn iwarp_open_device(out: *mut *mut iwarp_context) -> iwarp_result {
    guard("iwarp_open_device", || {
        // SAFETY: `out` is NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        let ctx = Context::open()?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_context { ctx }) };
        Ok(())
    })
}

/// Open the device `name` (`ibv_open_device` on a device of
/// `ibv_get_device_list`): "soft" (the software iWARP stack over TCP),
/// "auto" (a kernel RDMA device if there is one, else soft), or a kernel
/// device as `ibv_devices` lists it ("siw0", "rxe0", "mlx5_0"), used
/// through rdma-core. NULL or "" is `iwarp_open_device`
/// (`IWARP_DEVICE`, else soft). A device that is not there gives
/// `IWARP_ERR_INVALID_ARG` and an `iwarp_last_error` naming the cause and
/// the fix. Free it with `iwarp_close_device`.
///
/// # Safety
/// `name` is NULL or NUL-terminated; `out` is NULL or valid for writing a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn iwarp_open_device_named(
    name: *const c_char,
    out: *mut *mut iwarp_context,
) -> iwarp_result {
    guard("iwarp_open_device_named", || {
        // SAFETY: `out` is NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        let ctx = if name.is_null() {
            Context::open()?
        } else {
            // SAFETY: non-NULL and NUL-terminated (caller).
            let name = unsafe { std::ffi::CStr::from_ptr(name) }
                .to_str()
                .map_err(|_| FfiError::invalid("device name is not valid UTF-8"))?;
            if name.is_empty() {
                Context::open()?
            } else {
                Context::open_device(name)?
            }
        };
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_context { ctx }) };
        Ok(())
    })
}

/// Copy the name of the device `ctx` runs on ("soft", "siw0", ...) into
/// `buf` (capacity `len`, NUL-terminated, truncated if needed); returns
/// the name's length without the NUL, or 0 if `ctx` is NULL.
///
/// # Safety
/// `ctx` is NULL or a live device handle; `buf` is NULL or valid for
/// `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_device_name(
    ctx: *const iwarp_context,
    buf: *mut c_char,
    len: usize,
) -> usize {
    guard_or("iwarp_device_name", 0, || {
        // SAFETY: NULL or a live handle (caller).
        let c = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: NULL or valid for `len` bytes (caller).
        Ok(unsafe { crate::error::copy_cstr(c.ctx.device_name(), buf, len) })
    })
}

/// Close the device (`ibv_close_device`). Objects created from it stay
/// usable until they are freed themselves. NULL is a no-op.
///
/// # Safety
/// `ctx` is NULL or a live handle from `iwarp_open_device`, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_close_device(ctx: *mut iwarp_context) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_close_device", ctx) }
}

/// Allocate a protection domain (`ibv_alloc_pd`). Free it with
/// `iwarp_dealloc_pd`.
///
/// # Safety
/// `ctx` is NULL or a live device handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_alloc_pd(
    ctx: *mut iwarp_context,
    out: *mut *mut iwarp_pd,
) -> iwarp_result {
    guard("iwarp_alloc_pd", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let ctx = unsafe { handle(ctx, "ctx") }?;
        let pd = ctx.ctx.alloc_pd();
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_pd { pd }) };
        Ok(())
    })
}

/// Free a protection domain (`ibv_dealloc_pd`). Regions and QPs created in
/// it stay usable until they are freed themselves. NULL is a no-op.
///
/// # Safety
/// `pd` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_dealloc_pd(pd: *mut iwarp_pd) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_dealloc_pd", pd) }
}
