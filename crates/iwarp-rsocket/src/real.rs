//! The C library's own socket and descriptor functions, found once with
//! `dlsym(RTLD_NEXT, ..)`.
//!
//! The preload shim defines `read`, `close`, `dup2`, ... itself, so a call
//! to `libc::close` from this code (or from the stack underneath) would
//! come back to the shim. Everything here that must reach the kernel calls
//! through this table instead. In the C API library nothing is
//! interposed, and `RTLD_NEXT` finds the same C library functions.

use std::ffi::CStr;
use std::sync::OnceLock;

use libc::{c_int, c_ulong, c_void, msghdr, size_t, sockaddr, socklen_t, ssize_t};

macro_rules! real_fns {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// Pointers to the C library's functions.
        #[allow(missing_docs)]
        pub struct Real {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl std::fmt::Debug for Real {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Real")
            }
        }

        fn resolve() -> Real {
            Real {
                $($name: {
                    let name = concat!(stringify!($name), "\0");
                    let sym = lookup(CStr::from_bytes_with_nul(name.as_bytes()).unwrap_or(c"?"));
                    // SAFETY: `sym` is the C library's function of this
                    // name (non-null, checked by `lookup`), whose C
                    // prototype is the signature declared here (taken
                    // from the glibc headers; `fcntl` and `ioctl` are
                    // variadic in C, and their third argument is passed
                    // like a fixed one on x86-64 and aarch64 Linux).
                    unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(sym)
                    }
                },)*
            }
        }
    };
}

real_fns! {
    socket: fn(c_int, c_int, c_int) -> c_int;
    bind: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    listen: fn(c_int, c_int) -> c_int;
    accept4: fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    connect: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    read: fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: fn(c_int, *const c_void, size_t) -> ssize_t;
    readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    sendto: fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    recvmsg: fn(c_int, *mut msghdr, c_int) -> ssize_t;
    sendmsg: fn(c_int, *const msghdr, c_int) -> ssize_t;
    sendfile: fn(c_int, c_int, *mut libc::off_t, size_t) -> ssize_t;
    pread: fn(c_int, *mut c_void, size_t, libc::off_t) -> ssize_t;
    lseek: fn(c_int, libc::off_t, c_int) -> libc::off_t;
    close: fn(c_int) -> c_int;
    shutdown: fn(c_int, c_int) -> c_int;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    fcntl: fn(c_int, c_int, c_ulong) -> c_int;
    ioctl: fn(c_int, c_ulong, *mut c_void) -> c_int;
    getsockname: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getpeername: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    poll: fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
    select: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int;
    epoll_ctl: fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
    epoll_wait: fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
}

fn lookup(name: &CStr) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle.
    let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        // SAFETY: as above, with the default handle (this object is then
        // first in the search order, which is fine for the C API library).
        p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    }
    if p.is_null() {
        let msg = format!(
            "iwarp-rsocket: the C library has no `{}`: this library needs glibc or musl's socket \
             functions; run the program without LD_PRELOAD\n",
            name.to_string_lossy()
        );
        // SAFETY: writes a valid buffer to stderr; no Rust state involved.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p
}

/// The C library's functions.
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(resolve)
}
