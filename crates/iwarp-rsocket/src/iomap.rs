//! `riomap`, `riounmap`, `riowrite` (`include/iwarp_rsocket.h`), with
//! rsocket.h's signatures, over `Stream::riomap_raw`, `riounmap_raw` and
//! `riowrite` (the protocol and its checks: `iwarp_sockets::flow`'s iomap
//! module).

use libc::{c_int, c_void, off_t, size_t};

use crate::errno::{boundary, fail, fail_with};
use crate::table;

fn stream_or_errno(fd: c_int) -> Result<std::sync::Arc<table::Sock>, c_int> {
    match table::lookup(fd) {
        Some(s) if s.inherited() => Err(libc::EOPNOTSUPP),
        Some(s) => Ok(s),
        None => Err(libc::ENOTCONN),
    }
}

/// `riomap(socket, buf, len, prot, flags, offset)`: maps `len` bytes at
/// `buf` for the peer's `riowrite` at `offset` (-1: at `buf`'s address)
/// and returns the offset, or -1 with `errno`: `EINVAL` for a `prot` other
/// than `PROT_WRITE` (rsocket.c's local-only `PROT_NONE` mapping is not
/// supported), a null `buf`, 0 bytes or 4 GiB and more; `ENOMEM` when the
/// peer advertised no free iomap entry (`RDMA_IOMAPSIZE`); `ENOTCONN`
/// before `rconnect`/`raccept`. `flags` is ignored, as in rsocket.c.
///
/// # Safety
/// `buf` must stay valid for reads and writes of `len` bytes until
/// `riounmap(socket, buf, len)` or `rclose(socket)`: the peer writes into
/// it at any time.
#[no_mangle]
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    _flags: c_int,
    offset: off_t,
) -> off_t {
    boundary("riomap", || {
        if prot != libc::PROT_WRITE || buf.is_null() || offset < -1 {
            return fail_with(libc::EINVAL);
        }
        let s = match stream_or_errno(socket) {
            Ok(s) => s,
            Err(e) => return fail_with(e),
        };
        let at = if offset == -1 {
            None
        } else {
            Some(offset as u64)
        };
        // SAFETY: the caller's promise (see the function's doc).
        match unsafe { s.stream.riomap_raw(buf.cast::<u8>(), len, at) } {
            Ok(off) => off as off_t,
            Err(e) => fail(&e),
        }
    })
}

/// `riounmap(socket, buf, len)`: ends a `riomap` of exactly `buf`/`len`;
/// the memory is deregistered before it returns. `EINVAL` if there is no
/// such mapping. The peer is not told (as in rsocket.c): its next
/// `riowrite` there resets the connection.
#[no_mangle]
pub extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int {
    boundary("riounmap", || {
        let s = match stream_or_errno(socket) {
            Ok(s) => s,
            Err(e) => return fail_with(e),
        };
        match s.stream.riounmap_raw(buf.cast::<u8>(), len) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}

/// `riowrite(socket, buf, count, offset, flags)`: RDMA-Writes `count`
/// bytes from `buf` into the peer's mapping at `offset`, zero copy, and
/// returns the bytes written (all of them unless non-blocking:
/// `MSG_DONTWAIT` or `O_NONBLOCK`), or `(size_t) -1` with `errno`:
/// `EINVAL` when the range is not inside the peer's mappings (nothing is
/// written), `EAGAIN`, `ECONNRESET`.
///
/// # Safety
/// `buf` must be valid for reads of `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> size_t {
    let r: isize = boundary("riowrite", || {
        if count == 0 {
            return 0;
        }
        if buf.is_null() {
            return fail_with(libc::EFAULT);
        }
        if offset < 0 {
            return fail_with(libc::EINVAL);
        }
        let s = match stream_or_errno(socket) {
            Ok(s) => s,
            Err(e) => return fail_with(e),
        };
        // SAFETY: the caller's promise.
        let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) };
        let r = if flags & libc::MSG_DONTWAIT != 0 {
            s.stream.riowrite_nonblocking(b, offset as u64)
        } else {
            s.stream.riowrite(b, offset as u64)
        };
        match r {
            Ok(n) => n as isize,
            Err(e) => fail(&e),
        }
    });
    r as size_t
}
