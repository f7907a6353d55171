//! The socket calls on a descriptor that is an iWARP stream, with C
//! arguments. The C API (`r*` functions) and the preload shim both call
//! these once [`crate::table::lookup`] found the stream; the C pointers are
//! turned into slices here, and nowhere else.

use std::io::{self, IoSlice, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::errno::{fail, fail_with};
use crate::real::real;
use crate::table::{self, Sock};

/// A read or write on a stream inherited through `fork`: the error, and
/// the parent learns that its children serve its connections
/// (`table::note_inherited_use`).
fn inherited_io() -> io::Error {
    crate::table::note_inherited_use();
    unsupported_inherited()
}

fn unsupported_inherited() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this iWARP stream was inherited through fork; only the process that made it can use \
         it (close it in the child)",
    )
}

/// Reads into `buf` with `recv(2)` flags (`MSG_PEEK`, `MSG_DONTWAIT`,
/// `MSG_WAITALL`).
pub fn recv_into(s: &Sock, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    if s.inherited() {
        return Err(inherited_io());
    }
    if buf.is_empty() || s.read_shut.load(Ordering::Acquire) {
        return Ok(0);
    }
    let peek = flags & libc::MSG_PEEK != 0;
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek && !dontwait;
    let mut done = 0;
    {
        let mut pb = s.pushback.lock().unwrap_or_else(|e| e.into_inner());
        if !pb.is_empty() {
            let n = pb.len().min(buf.len());
            buf[..n].copy_from_slice(&pb[..n]);
            if peek {
                return Ok(n);
            }
            pb.drain(..n);
            done = n;
            if !waitall || done == buf.len() {
                return Ok(done);
            }
        }
    }
    loop {
        let r = if dontwait {
            s.stream.recv_nonblocking(&mut buf[done..])
        } else if interruptible(s) {
            wait_then(s, libc::POLLIN, s.stream.read_timeout(), || {
                s.stream.recv_nonblocking(&mut buf[done..])
            })
        } else {
            s.stream.recv(&mut buf[done..])
        };
        match r {
            Ok(0) => return Ok(done),
            Ok(n) => {
                s.last_was_send.store(false, Ordering::Release);
                if peek {
                    s.pushback
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend_from_slice(&buf[..n]);
                    return Ok(n);
                }
                done += n;
                if !waitall || done == buf.len() {
                    return Ok(done);
                }
            }
            Err(e) if done > 0 && e.kind() != io::ErrorKind::Interrupted => return Ok(done),
            Err(e) => return Err(e),
        }
    }
}

/// Whether blocking calls wait in `poll(2)` on the readiness descriptor
/// (so that a signal interrupts them with `EINTR`, as on TCP) instead of
/// inside the stream (which no signal interrupts). On by default; the
/// preload shim turns it off with `IWARP_PRELOAD_EINTR=0`.
pub static INTERRUPTIBLE: AtomicBool = AtomicBool::new(true);

fn interruptible(s: &Sock) -> bool {
    INTERRUPTIBLE.load(Ordering::Relaxed) && !s.stream.is_nonblocking()
}

/// Tries `op` (a non-blocking call); while it would block, waits in
/// `poll(2)` for `events` on the stream's readiness descriptor, up to
/// `timeout` (`SO_RCVTIMEO`/`SO_SNDTIMEO`; `WouldBlock` when it passes,
/// as on TCP). A signal ends the wait with `Interrupted` (`EINTR`).
fn wait_then(
    s: &Sock,
    events: i16,
    timeout: Option<Duration>,
    mut op: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                left.as_millis().clamp(1, i32::MAX as u128) as c_int
            }
        };
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&s.stream),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let rc = unsafe { (real().poll)(&mut p, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// A blocking `send` that waits in `poll(2)`: all of `buf`, or what went
/// before a signal or an error (then the count, as TCP does).
fn send_all_interruptible(s: &Sock, buf: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match wait_then(s, libc::POLLOUT, s.stream.write_timeout(), || {
            s.stream.send_nonblocking(&buf[done..])
        }) {
            Ok(n) => done += n,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Writes `buf` with `send(2)` flags (`MSG_DONTWAIT`, `MSG_NOSIGNAL`;
/// `MSG_MORE` is ignored: nothing is held back anyway).
pub fn send_from(s: &Sock, buf: &[u8], flags: c_int) -> io::Result<usize> {
    if s.inherited() {
        return Err(inherited_io());
    }
    let r = if flags & libc::MSG_DONTWAIT != 0 {
        s.stream.send_nonblocking(buf)
    } else if interruptible(s) {
        send_all_interruptible(s, buf)
    } else {
        s.stream.send(buf)
    };
    if matches!(r, Ok(n) if n > 0) {
        s.last_was_send.store(true, Ordering::Release);
    }
    if let Err(e) = &r {
        tracing::debug!(error = %e, len = buf.len(), "send on an iWARP stream failed");
        if crate::errno::code(e) == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
            // Like a TCP socket: writing to a closed connection raises
            // SIGPIPE unless MSG_NOSIGNAL.
            // SAFETY: raising a signal in this thread.
            unsafe { libc::raise(libc::SIGPIPE) };
        }
    }
    r
}

/// Converts a C result.
fn done(r: io::Result<usize>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(&e),
    }
}

/// # Safety
/// `buf` must be valid for `len` bytes of writes (or `len` 0).
pub unsafe fn recv(s: &Sock, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    if len == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail_with(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    done(recv_into(s, b, flags))
}

/// # Safety
/// `buf` must be valid for `len` bytes of reads (or `len` 0).
pub unsafe fn send(s: &Sock, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    if len == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail_with(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
    done(send_from(s, b, flags))
}

/// # Safety
/// `iov` must point to `cnt` valid `iovec`s, each valid for writes.
pub unsafe fn readv(s: &Sock, iov: *const iovec, cnt: c_int, flags: c_int) -> ssize_t {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return fail_with(libc::EINVAL);
    }
    if cnt > 0 && iov.is_null() {
        return fail_with(libc::EFAULT);
    }
    let mut total = 0usize;
    for i in 0..cnt as usize {
        // SAFETY: the caller's promise.
        let v = unsafe { &*iov.add(i) };
        if v.iov_len == 0 {
            continue;
        }
        if v.iov_base.is_null() {
            return if total > 0 {
                total as ssize_t
            } else {
                fail_with(libc::EFAULT)
            };
        }
        // SAFETY: the caller's promise.
        let b = unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast::<u8>(), v.iov_len) };
        let f = if total > 0 {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        };
        match recv_into(s, b, f) {
            Ok(n) => {
                total += n;
                if n < b.len() {
                    break;
                }
            }
            Err(_) if total > 0 => break,
            Err(e) => return fail(&e),
        }
    }
    total as ssize_t
}

/// # Safety
/// `iov` must point to `cnt` valid `iovec`s, each valid for reads.
pub unsafe fn writev(s: &Sock, iov: *const iovec, cnt: c_int, flags: c_int) -> ssize_t {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return fail_with(libc::EINVAL);
    }
    if cnt > 0 && iov.is_null() {
        return fail_with(libc::EFAULT);
    }
    let mut slices = Vec::with_capacity(cnt as usize);
    let mut len = 0usize;
    for i in 0..cnt as usize {
        // SAFETY: the caller's promise.
        let v = unsafe { &*iov.add(i) };
        if v.iov_len == 0 {
            continue;
        }
        if v.iov_base.is_null() {
            return fail_with(libc::EFAULT);
        }
        // SAFETY: the caller's promise.
        slices.push(unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) });
        len += v.iov_len;
    }
    match slices.len() {
        0 => 0,
        1 => done(send_from(s, slices[0], flags)),
        _ if len <= 64 * 1024 => {
            // Small gathers (headers + body) become one message.
            let joined = slices.concat();
            done(send_from(s, &joined, flags))
        }
        _ => {
            if s.inherited() {
                return fail(&inherited_io());
            }
            let io: Vec<IoSlice<'_>> = slices.iter().map(|b| IoSlice::new(b)).collect();
            if flags & libc::MSG_DONTWAIT != 0 && !s.stream.is_nonblocking() {
                // One slice at a time without blocking.
                let mut total = 0;
                for b in &slices {
                    match send_from(s, b, flags) {
                        Ok(n) => {
                            total += n;
                            if n < b.len() {
                                break;
                            }
                        }
                        Err(_) if total > 0 => break,
                        Err(e) => return fail(&e),
                    }
                }
                return total as ssize_t;
            }
            let r = (&s.stream).write_vectored(&io);
            if matches!(r, Ok(n) if n > 0) {
                s.last_was_send.store(true, Ordering::Release);
            }
            if let Err(e) = &r {
                if crate::errno::code(e) == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                    // SAFETY: raising a signal in this thread.
                    unsafe { libc::raise(libc::SIGPIPE) };
                }
            }
            done(r)
        }
    }
}

/// # Safety
/// `msg` must be a valid `msghdr` whose iovecs are valid for writes and
/// whose name buffer (if any) is valid for `msg_namelen` bytes.
pub unsafe fn recvmsg(s: &Sock, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        return fail_with(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    let m = unsafe { &mut *msg };
    // SAFETY: the caller's promise.
    let n = unsafe { readv(s, m.msg_iov, m.msg_iovlen as c_int, flags) };
    if n >= 0 {
        if !m.msg_name.is_null() {
            if let Ok(peer) = s.stream.peer_addr() {
                // SAFETY: the caller's promise.
                unsafe { write_addr(peer, m.msg_name.cast(), &mut m.msg_namelen) };
            }
        }
        m.msg_controllen = 0;
        m.msg_flags = 0;
    }
    n
}

/// # Safety
/// `msg` must be a valid `msghdr` whose iovecs are valid for reads.
pub unsafe fn sendmsg(s: &Sock, msg: *const msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        return fail_with(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    let m = unsafe { &*msg };
    // SAFETY: the caller's promise.
    unsafe { writev(s, m.msg_iov, m.msg_iovlen as c_int, flags) }
}

/// `sendfile(out = this stream, in_fd, offset, count)`: reads the file
/// with `pread` and sends it.
///
/// # Safety
/// `offset` must be null or valid for reads and writes.
pub unsafe fn sendfile(s: &Sock, in_fd: c_int, offset: *mut libc::off_t, count: size_t) -> ssize_t {
    let r = real();
    let mut pos = if offset.is_null() {
        // SAFETY: plain descriptor call.
        let p = unsafe { (r.lseek)(in_fd, 0, libc::SEEK_CUR) };
        if p < 0 {
            return -1;
        }
        p
    } else {
        // SAFETY: the caller's promise.
        unsafe { *offset }
    };
    let mut buf = vec![0u8; count.min(256 * 1024)];
    let mut total = 0usize;
    while total < count {
        let want = (count - total).min(buf.len());
        // SAFETY: `buf` is valid for `want` bytes of writes.
        let got = unsafe { (r.pread)(in_fd, buf.as_mut_ptr().cast(), want, pos) };
        if got < 0 {
            if total == 0 {
                return -1;
            }
            break;
        }
        if got == 0 {
            break;
        }
        let got = got as usize;
        let flags = if total > 0 { libc::MSG_DONTWAIT } else { 0 };
        match send_from(s, &buf[..got], flags) {
            Ok(n) => {
                total += n;
                pos += n as libc::off_t;
                if n < got {
                    break;
                }
            }
            Err(_) if total > 0 => break,
            Err(e) => return fail(&e),
        }
    }
    if offset.is_null() {
        // SAFETY: plain descriptor call.
        unsafe { (r.lseek)(in_fd, pos, libc::SEEK_SET) };
    } else {
        // SAFETY: the caller's promise.
        unsafe { *offset = pos };
    }
    total as ssize_t
}

/// `shutdown(2)`. The read side is shut locally (as on TCP, nothing goes
/// on the wire for it); the write side sends the end of stream. The
/// disconnect message goes when the stream closes.
pub fn shutdown(s: &Sock, how: c_int) -> c_int {
    let (rd, wr) = match how {
        libc::SHUT_RD => (true, false),
        libc::SHUT_WR => (false, true),
        libc::SHUT_RDWR => (true, true),
        _ => return fail_with(libc::EINVAL),
    };
    if s.inherited() {
        return fail(&unsupported_inherited());
    }
    if rd {
        s.read_shut.store(true, Ordering::Release);
    }
    if wr {
        if let Err(e) = s.stream.shutdown(std::net::Shutdown::Write) {
            return fail(&e);
        }
    }
    0
}

/// Writes `a` as a `sockaddr` into `addr`/`len` (truncated like the
/// kernel does; `*len` becomes the full length).
///
/// # Safety
/// `addr` must be valid for `*len` bytes of writes, `len` for a read and a
/// write.
pub unsafe fn write_addr(a: SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if addr.is_null() || len.is_null() {
        return fail_with(libc::EFAULT);
    }
    let sa = socket2::SockAddr::from(a);
    // SAFETY: the caller's promise.
    let cap = unsafe { *len } as usize;
    let n = (sa.len() as usize).min(cap);
    // SAFETY: `sa` holds `sa.len()` bytes; `addr` takes `cap` of them.
    unsafe {
        std::ptr::copy_nonoverlapping(sa.as_ptr().cast::<u8>(), addr.cast::<u8>(), n);
        *len = sa.len();
    }
    0
}

/// Reads a `sockaddr_in`/`sockaddr_in6`.
///
/// # Safety
/// `addr` must be valid for `len` bytes of reads.
pub unsafe fn read_addr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: `len` bytes are readable; `SockAddr` has room for any
    // socket address, and `len` is capped to it.
    let (_, sa) = unsafe {
        socket2::SockAddr::try_init(|storage, l| {
            let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
            std::ptr::copy_nonoverlapping(addr.cast::<u8>(), storage.cast::<u8>(), n);
            *l = n as socklen_t;
            Ok(())
        })
    }
    .ok()?;
    sa.as_socket()
}

/// `getsockname(2)` (`peer` false) or `getpeername(2)` (`peer` true).
///
/// # Safety
/// As [`write_addr`].
pub unsafe fn sockname(s: &Sock, peer: bool, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let a = if peer {
        s.stream.peer_addr()
    } else {
        s.stream.local_addr()
    };
    match a {
        // SAFETY: the caller's promise.
        Ok(a) => unsafe { write_addr(a, addr, len) },
        Err(e) => fail(&e),
    }
}

/// Reads an `int` option value.
///
/// # Safety
/// `val` must be valid for `len` bytes of reads.
pub unsafe fn opt_int(val: *const c_void, len: socklen_t) -> Option<c_int> {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return None;
    }
    // SAFETY: the caller's promise; unaligned read.
    Some(unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) })
}

fn timeval_of(d: Option<Duration>) -> libc::timeval {
    let d = d.unwrap_or_default();
    libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    }
}

/// `setsockopt(2)` on a stream. Options that mean nothing for a stream
/// over iWARP (`TCP_NODELAY`: nothing is ever held back; `TCP_CORK`,
/// buffer sizes after connect, `SO_REUSEADDR`, `SO_LINGER`, the TCP
/// keepalive timers) are accepted and ignored; unknown ones get
/// `ENOPROTOOPT`.
///
/// # Safety
/// `val` must be valid for `len` bytes of reads.
pub unsafe fn setsockopt(
    s: &Sock,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
            if val.is_null() || (len as usize) < std::mem::size_of::<libc::timeval>() {
                return fail_with(libc::EINVAL);
            }
            // SAFETY: the caller's promise; unaligned read.
            let tv = unsafe { std::ptr::read_unaligned(val.cast::<libc::timeval>()) };
            if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
                return fail_with(libc::EDOM);
            }
            let d =
                Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64);
            let d = (!d.is_zero()).then_some(d);
            let r = if name == libc::SO_RCVTIMEO {
                s.stream.set_read_timeout(d)
            } else {
                s.stream.set_write_timeout(d)
            };
            if let Err(e) = r {
                return fail(&e);
            }
            let mut t = s.timeouts.lock().unwrap_or_else(|e| e.into_inner());
            if name == libc::SO_RCVTIMEO {
                t.0 = d;
            } else {
                t.1 = d;
            }
            0
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            // SAFETY: the caller's promise.
            match unsafe { opt_int(val, len) } {
                Some(v) => {
                    s.keepalive
                        .store(v != 0, std::sync::atomic::Ordering::Relaxed);
                    0
                }
                None => fail_with(libc::EINVAL),
            }
        }
        (
            libc::SOL_SOCKET,
            libc::SO_RCVBUF
            | libc::SO_SNDBUF
            | libc::SO_REUSEADDR
            | libc::SO_REUSEPORT
            | libc::SO_LINGER
            | libc::SO_RCVLOWAT
            | libc::SO_PRIORITY
            | libc::SO_OOBINLINE,
        )
        | (
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY
            | libc::TCP_CORK
            | libc::TCP_QUICKACK
            | libc::TCP_KEEPIDLE
            | libc::TCP_KEEPINTVL
            | libc::TCP_KEEPCNT
            | libc::TCP_USER_TIMEOUT
            | libc::TCP_DEFER_ACCEPT,
        )
        | (libc::IPPROTO_IP, libc::IP_TOS)
        | (libc::IPPROTO_IPV6, libc::IPV6_TCLASS | libc::IPV6_V6ONLY) => {
            tracing::debug!(level, name, "socket option ignored on an iWARP stream");
            0
        }
        // tcp(7) TCP_CONGESTION: the algorithm of the TCP connection
        // below the stream (the congestion control is TCP's, not the
        // stream's), so it is passed through, not ignored.
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => {
            // SAFETY: the caller's promise.
            let Some(name) = (unsafe { opt_name(val, len) }) else {
                return fail_with(libc::EINVAL);
            };
            match s.stream.set_tcp_congestion(&name) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::debug!(name, error = %e, "TCP_CONGESTION on an iWARP stream");
                    fail_with(congestion_errno(&e))
                }
            }
        }
        // rsocket.c: the table is part of the connection's private data,
        // so it cannot change once connected.
        (SOL_RDMA, RDMA_IOMAPSIZE) => fail_with(libc::EINVAL),
        _ => fail_with(libc::ENOPROTOOPT),
    }
}

/// The errno tcp(7) gives for a `TCP_CONGESTION` that failed: `ENOENT`
/// (no such algorithm), `EPERM` (not in
/// `tcp_allowed_congestion_control`), `EINVAL` (not a name).
fn congestion_errno(e: &io::Error) -> c_int {
    match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EPERM,
        io::ErrorKind::InvalidInput => libc::EINVAL,
        _ => crate::errno::code(e),
    }
}

/// A `TCP_CONGESTION` value: the bytes up to the first NUL (tcp(7): a
/// string of at most `TCP_CA_NAME_MAX` (16) bytes with its NUL); `None`
/// for a null pointer, no bytes or bytes that are not UTF-8.
///
/// # Safety
/// `val` must be valid for `len` bytes of reads.
pub unsafe fn opt_name(val: *const c_void, len: socklen_t) -> Option<String> {
    if val.is_null() || len == 0 {
        return None;
    }
    // SAFETY: the caller's promise.
    let bytes = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), (len as usize).min(64)) };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let name = std::str::from_utf8(&bytes[..end]).ok()?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// Writes an option value (truncated to `*len`).
///
/// # Safety
/// `val` must be valid for `*len` bytes of writes, `len` for a read and a
/// write.
unsafe fn put<T: Copy>(v: T, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if val.is_null() || len.is_null() {
        return fail_with(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    let cap = unsafe { *len } as usize;
    let n = std::mem::size_of::<T>().min(cap);
    // SAFETY: `v` holds size_of::<T>() bytes; `val` takes `n` of them.
    unsafe {
        std::ptr::copy_nonoverlapping((&v as *const T).cast::<u8>(), val.cast::<u8>(), n);
        *len = n as socklen_t;
    }
    0
}

/// `getsockopt(2)` on a stream: the usual `SOL_SOCKET` and `IPPROTO_TCP`
/// questions get the answers a connected TCP socket would give (with the
/// ring sizes as buffer sizes); `TCP_INFO` is all zeros but the state
/// (established); unknown ones get `ENOPROTOOPT`.
///
/// # Safety
/// As `put`.
pub unsafe fn getsockopt(
    s: &Sock,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let o = s.stream.options();
    let int = |v: c_int| -> c_int {
        // SAFETY: the caller's promise.
        unsafe { put(v, val, len) }
    };
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => int(0),
        (libc::SOL_SOCKET, libc::SO_TYPE) => int(libc::SOCK_STREAM),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => int(libc::IPPROTO_TCP),
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => int(match s.stream.local_addr() {
            Ok(SocketAddr::V6(_)) => libc::AF_INET6,
            _ => libc::AF_INET,
        }),
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => int(0),
        (SOL_RDMA, RDMA_IOMAPSIZE) => int(c_int::from(o.iomap_size)),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => int(o.rbuf_size as c_int),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => int(o.sbuf_size as c_int),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => int(c_int::from(
            o.keepalive || s.keepalive.load(std::sync::atomic::Ordering::Relaxed),
        )),
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => int(0),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
            let t = *s.timeouts.lock().unwrap_or_else(|e| e.into_inner());
            let d = if name == libc::SO_RCVTIMEO { t.0 } else { t.1 };
            // SAFETY: the caller's promise.
            unsafe { put(timeval_of(d), val, len) }
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // SAFETY: the caller's promise.
            unsafe {
                put(
                    libc::linger {
                        l_onoff: 0,
                        l_linger: 0,
                    },
                    val,
                    len,
                )
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => {
            // tcp(7): the name, NUL-padded, at most TCP_CA_NAME_MAX bytes.
            let name = match s.stream.tcp_congestion() {
                Ok(n) => n,
                Err(e) => return fail(&e),
            };
            if val.is_null() || len.is_null() {
                return fail_with(libc::EFAULT);
            }
            let mut buf = [0u8; 16];
            let n = name.len().min(buf.len() - 1);
            buf[..n].copy_from_slice(&name.as_bytes()[..n]);
            // SAFETY: the caller's promise.
            let n = (unsafe { *len } as usize).min(buf.len());
            // SAFETY: `val` takes `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(buf.as_ptr(), val.cast::<u8>(), n);
                *len = n as socklen_t;
            }
            0
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => int(1),
        (libc::IPPROTO_TCP, libc::TCP_CORK) => int(0),
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => int(1448),
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            // struct tcp_info is 232 bytes on current kernels; tcpi_state
            // (the first byte) = TCP_ESTABLISHED.
            let mut info = [0u8; 232];
            info[0] = 1;
            if val.is_null() || len.is_null() {
                return fail_with(libc::EFAULT);
            }
            // SAFETY: the caller's promise.
            let n = (unsafe { *len } as usize).min(info.len());
            // SAFETY: `val` takes `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(info.as_ptr(), val.cast::<u8>(), n);
                *len = n as socklen_t;
            }
            0
        }
        _ => fail_with(libc::ENOPROTOOPT),
    }
}

/// `fcntl(2)` commands that concern a stream (`F_GETFL`/`F_SETFL` for
/// `O_NONBLOCK`; the `dup` family is the caller's); `None` for the others,
/// which go to the C library.
pub fn fcntl_flags(s: &Sock, cmd: c_int, arg: libc::c_ulong) -> Option<c_int> {
    match cmd {
        libc::F_GETFL => Some(
            libc::O_RDWR
                | if s.stream.is_nonblocking() {
                    libc::O_NONBLOCK
                } else {
                    0
                },
        ),
        libc::F_SETFL => {
            // Never passed through: the readiness descriptor shares its
            // open file description with the library's end, which must
            // stay non-blocking.
            let _ = s
                .stream
                .set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
            Some(0)
        }
        _ => None,
    }
}

/// `ioctl(2)` requests that concern a stream (`FIONREAD`, `FIONBIO`);
/// `None` for the others.
///
/// # Safety
/// `arg` must be valid for an `int` read or write as the request says.
pub unsafe fn ioctl(s: &Sock, req: libc::c_ulong, arg: *mut c_void) -> Option<c_int> {
    match req {
        libc::FIONREAD => {
            if arg.is_null() {
                return Some(fail_with(libc::EFAULT));
            }
            let pb = s.pushback.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
            let n = (s.stream.bytes_readable() + pb).min(c_int::MAX as u64) as c_int;
            // SAFETY: the caller's promise; unaligned write.
            unsafe { std::ptr::write_unaligned(arg.cast::<c_int>(), n) };
            Some(0)
        }
        libc::FIONBIO => {
            if arg.is_null() {
                return Some(fail_with(libc::EFAULT));
            }
            // SAFETY: the caller's promise; unaligned read.
            let on = unsafe { std::ptr::read_unaligned(arg.cast::<c_int>()) } != 0;
            let _ = s.stream.set_nonblocking(on);
            Some(0)
        }
        _ => None,
    }
}

/// The `tcp_info`-free check: whether an address family is one a stream
/// can use.
pub fn is_inet(family: c_int) -> bool {
    family == libc::AF_INET || family == libc::AF_INET6
}

/// Whether `fd` is a TCP (stream, IPv4/IPv6) socket, asked of the kernel.
pub fn is_tcp_socket(fd: c_int) -> bool {
    let r = real();
    let mut ty: c_int = 0;
    let mut dom: c_int = 0;
    let mut l = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `ty`/`dom` are valid ints with their length in `l`.
    unsafe {
        if (r.getsockopt)(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut c_int).cast(),
            &mut l,
        ) != 0
        {
            return false;
        }
        l = std::mem::size_of::<c_int>() as socklen_t;
        if (r.getsockopt)(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut dom as *mut c_int).cast(),
            &mut l,
        ) != 0
        {
            return false;
        }
    }
    ty == libc::SOCK_STREAM && is_inet(dom)
}

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
        if let Some(v) = unsafe { opt_int(val, len) } {
            table::note_pending(fd, |p| {
                p.iomap_size = Some(v.clamp(0, i32::from(u16::MAX)) as u16)
            });
        }
        return;
    }
    if level == libc::IPPROTO_TCP && name == libc::TCP_CONGESTION {
        // SAFETY: the caller's promise.
        if let Some(n) = unsafe { opt_name(val, len) }.filter(|n| n.len() < 16) {
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
    let Some(v) = (unsafe { opt_int(val, len) }) else {
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
        if let Some(rc) = fcntl_flags(&s, cmd, arg) {
            return rc;
        }
    }
    // SAFETY: plain descriptor call; `arg` is passed through as the C
    // caller gave it.
    let rc = unsafe { (real().fcntl)(fd, cmd, arg) };
    if rc >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) && !table::inside() {
        table::duplicated(fd, rc);
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_and_truncate() {
        for a in ["127.0.0.1:7471", "[::1]:80", "[fe80::1%2]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            // SAFETY: an all-zero sockaddr_storage is a valid value.
            let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of_val(&st) as socklen_t;
            let p = (&mut st as *mut libc::sockaddr_storage).cast::<sockaddr>();
            // SAFETY: `st` is valid for `len` bytes.
            assert_eq!(unsafe { write_addr(a, p, &mut len) }, 0);
            // SAFETY: `write_addr` wrote `len` bytes.
            assert_eq!(unsafe { read_addr(p, len) }, Some(a));
        }
        // A short buffer gets the first bytes and the full length.
        let mut buf = [0u8; 4];
        let mut len = 4 as socklen_t;
        let a: SocketAddr = "10.0.0.1:8".parse().unwrap();
        // SAFETY: `buf` is valid for `len` bytes.
        unsafe { write_addr(a, buf.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        assert_eq!(u16::from_ne_bytes([buf[0], buf[1]]), libc::AF_INET as u16);
        assert_eq!(u16::from_be_bytes([buf[2], buf[3]]), 8);
        // Not an internet address.
        // SAFETY: a null pointer is refused before any read.
        assert_eq!(unsafe { read_addr(std::ptr::null(), 16) }, None);
    }
}
