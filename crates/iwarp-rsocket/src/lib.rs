//! # iwarp-rsocket: descriptors that are iWARP streams, and the C API
//!
//! The layer between C programs and `iwarp_sockets::Stream`:
//!
//! - [`table`]: which descriptor numbers are streams. A stream keeps the
//!   program's descriptor number: its readiness descriptor is `dup2`ed
//!   onto it, so `poll`, `select` and `epoll` work on it natively, and the
//!   socket calls on it come here.
//! - [`attach`]: making a descriptor a stream, after connect or on an
//!   accepted TCP connection whose first bytes are an MPA Request (RFC
//!   5044 §7.1), the way to share a port with plain TCP clients.
//! - [`settle`]: making deferred accepts streams off the program's
//!   threads (one watcher thread per process, placeholders, epoll
//!   registrations kept across the descriptor's replacement).
//! - [`ops`]: the socket calls on a stream, from C arguments.
//! - `capi`: the `rsocket.h`-style C API (`include/iwarp_rsocket.h`,
//!   `libiwarp_rsocket.so`).
//! - [`real`]: the C library's functions, for the preload shim
//!   (`crates/iwarp-preload`), which interposes the same names.
//!
//! `unsafe` lives at the C edge only: [`real`] (the function table),
//! [`ops`] (C pointers to slices), `capi` (the exported functions), and
//! two descriptor handovers in [`attach`] and [`table`]; each block says
//! why it holds.

pub mod attach;
mod capi;
pub mod errno;
mod iomap;
pub mod ops;
pub mod real;
pub mod settle;
pub mod table;

use libc::{c_int, c_void, socklen_t};

pub use capi::*;
pub use iomap::*;

/// `SOL_RDMA`, the level of rsocket's own options (`<rdma/rsocket.h>`).
pub const SOL_RDMA: c_int = 0x10000;
/// `RDMA_IOMAPSIZE`: entries of the iomap table a socket advertises
/// (the fourth of `RDMA_SQSIZE`, `RDMA_RQSIZE`, `RDMA_INLINE`,
/// `RDMA_IOMAPSIZE`, `RDMA_ROUTE`).
pub const RDMA_IOMAPSIZE: c_int = 3;

/// Notes the socket options that shape a stream made later on `fd`
/// (`SO_RCVBUF`, `SO_SNDBUF`, `SO_KEEPALIVE`, `RDMA_IOMAPSIZE`,
/// `TCP_CONGESTION`). Call it for an option the TCP socket took (a
/// congestion-control name the kernel refused is not noted).
///
/// # Safety
/// `val` must be valid for `len` bytes of reads.
pub unsafe fn note_sockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) {
    if level == SOL_RDMA && name == RDMA_IOMAPSIZE {
        // SAFETY: the caller's promise.
        if let Some(v) = unsafe { ops::opt_int(val, len) } {
            table::note_pending(fd, |p| {
                p.iomap_size = Some(v.clamp(0, i32::from(u16::MAX)) as u16)
            });
        }
        return;
    }
    if level == libc::IPPROTO_TCP && name == libc::TCP_CONGESTION {
        // SAFETY: the caller's promise.
        if let Some(n) = unsafe { ops::opt_name(val, len) }.filter(|n| n.len() < 16) {
            let mut b = [0u8; 16];
            b[..n.len()].copy_from_slice(n.as_bytes());
            table::note_pending(fd, |p| p.congestion = Some(b));
        }
        return;
    }
    if level != libc::SOL_SOCKET {
        return;
    }
    // SAFETY: the caller's promise.
    let Some(v) = (unsafe { ops::opt_int(val, len) }) else {
        return;
    };
    match name {
        libc::SO_RCVBUF => table::note_pending(fd, |p| p.rcvbuf = Some(v.max(0) as u32)),
        libc::SO_SNDBUF => table::note_pending(fd, |p| p.sndbuf = Some(v.max(0) as u32)),
        libc::SO_KEEPALIVE => table::note_pending(fd, |p| p.keepalive = Some(v != 0)),
        _ => {}
    }
}

/// `fcntl` with the stream's view: `F_GETFL`/`F_SETFL` on a stream, and
/// the `F_DUPFD` family recorded in the table; everything else goes to the
/// C library.
pub fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    if let Some(s) = table::lookup(fd) {
        if let Some(rc) = ops::fcntl_flags(&s, cmd, arg) {
            return rc;
        }
    }
    // SAFETY: plain descriptor call; `arg` is passed through as the C
    // caller gave it.
    let rc = unsafe { (real::real().fcntl)(fd, cmd, arg) };
    if rc >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) && !table::inside() {
        table::duplicated(fd, rc);
    }
    rc
}
