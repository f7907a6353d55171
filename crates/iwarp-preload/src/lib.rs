//! # libiwarp_preload.so: unmodified TCP programs over iWARP sockets
//!
//! `LD_PRELOAD=libiwarp_preload.so program ...` runs a program's TCP
//! connections over iWARP (rsockets protocol, `iwarp-sockets`), with TCP
//! fallback on both sides of the same port:
//!
//! - **connect**: to a port (and address) the configuration takes over,
//!   the shim first connects over iWARP (bounded by
//!   `IWARP_PRELOAD_CONNECT_MS`, default 1000, and at least
//!   `iwarp::cm::MPA_WAIT_RTTS` round trips of the path). If the peer
//!   completed TCP and then did not answer MPA (timeout, closed, MPA
//!   error), it remembers the peer for `IWARP_PRELOAD_FALLBACK_SECS`
//!   (default 60) and connects the program's socket over plain TCP, so
//!   the program sees a normal connect. Peers in that memory get plain
//!   TCP at once. A TCP handshake that never completed says nothing about
//!   the peer and is not remembered: a blocking socket's connect waits
//!   through the kernel's SYN retransmissions as connect(2) would (only
//!   the MPA exchange is bounded by the limit) and gets the kernel's
//!   errno; a non-blocking one that is not connected within the limit
//!   goes on as the kernel's own connect (`EINPROGRESS`), plain.
//! - **accept**: the listening socket stays a real TCP socket, and
//!   `accept` never waits for a client: an accepted connection whose first
//!   16 bytes are already the MPA Request key (RFC 5044 §7.1) waits for
//!   its first use (a read, a write, `epoll_ctl`, ...: `settled`) in the
//!   process that uses it, so a server that accepts in the parent and
//!   serves in a forked child works; one whose first bytes have not
//!   arrived is *undecided* until they do; anything else is the program's
//!   TCP connection, untouched. The MPA exchange itself never runs on the
//!   program's thread (`iwarp_rsocket::settle`): the number shows "not
//!   ready" meanwhile, a non-blocking call gets `EAGAIN`, a blocking one
//!   waits, one watcher thread per process drives every exchange, and an
//!   accept left alone for `IWARP_PRELOAD_SETTLE_MS` (300) is made a stream
//!   anyway. Copies (`dup`, `dup2`, `F_DUPFD`) wait with it, and a program
//!   started by `exec` with such a connection (an inetd's service) adopts
//!   it when the shim loads (`adopt_inherited`). In a process that makes
//!   no streams, a blocking `accept` holds a connection whose client has
//!   said nothing yet and returns other connections meanwhile (`held`).
//! - **bounds**: at most `IWARP_PRELOAD_MAX_PENDING` (64) MPA clients wait
//!   for their exchange and at most `IWARP_PRELOAD_MAX_STREAMS` (256)
//!   streams live per process; past either, a new MPA client is closed at
//!   `accept` (it falls back to TCP) and a `connect` goes plain.
//! - **vfork**: a child that runs in this process's memory (`vfork`,
//!   `posix_spawn`) gets the C library's calls, untouched
//!   (`passthrough`): the table in memory is the parent's.
//!
//! A stream's descriptor number refers to its readiness descriptor (see
//! `iwarp_rsocket::table`), so `poll`, `select` and `epoll_wait` need no
//! interception (`epoll_ctl` is intercepted only to make a waiting
//! accept a stream before it is registered); the calls below go to the stream for descriptors in the
//! table and straight to the C library for every other descriptor, and
//! for every call the library itself makes ([`table::inside`]).
//!
//! Not intercepted, so not supported on streams: stdio on a socket
//! (`fdopen`: glibc calls its internal `read`/`close`), `recvmmsg`/
//! `sendmmsg`, `splice`, raw `syscall(2)`. See docs/SOCKETS.md.
#![allow(clippy::missing_safety_doc)]

mod config;
mod held;

use std::os::fd::RawFd;

use iwarp_rsocket::errno::{boundary, fail_with};
use iwarp_rsocket::real::real;
use iwarp_rsocket::{attach, ops, settle, table};
use libc::{c_int, c_ulong, c_void, iovec, msghdr, off_t, size_t, sockaddr, socklen_t, ssize_t};

/// Reads the configuration when the library is loaded, before `main`:
/// some servers clear their environment before they accept (nginx
/// workers keep only `TZ`), and the settings must still hold there.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static LOAD_CONFIG: extern "C" fn() = load_config;

#[cfg(not(test))]
extern "C" fn load_config() {
    let _ = std::panic::catch_unwind(|| {
        // Before anything else: a child that shares this memory (vfork)
        // must be told from this process (see `passthrough`).
        table::claim_process();
        config::get();
        adopt_inherited();
    });
}

/// The descriptors open in this process (`/proc/self/fd`; without `/proc`,
/// every number below 1024 that is open).
#[cfg(not(test))]
fn open_fds() -> Vec<RawFd> {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        // SAFETY: F_GETFD on any number only reads its flags.
        Err(_) => (0..1024)
            .filter(|&fd| unsafe { (real().fcntl)(fd, libc::F_GETFD, 0) } >= 0)
            .collect(),
    }
}

/// A program started by `exec` with an MPA client's connection as one of
/// its descriptors (an inetd's service gets it as standard input and
/// output; systemd's `Accept=yes` does the same): the accept that
/// deferred it was in the process before the `exec`, whose table is gone.
/// A connection on a port the configuration takes over whose unread first
/// bytes are the MPA Request key waits for its first use here, as if this
/// process had accepted it (copies of it are one stream). Runs when the
/// library is loaded; costs one `fstat` per descriptor, and one
/// non-blocking `MSG_PEEK` per connected TCP socket on a wanted port.
#[cfg(not(test))]
fn adopt_inherited() {
    let _inside = table::Inside::enter();
    let cfg = config::get();
    let mut any = false;
    let mut recorded = Vec::new();
    for fd in open_fds() {
        // SAFETY: an all-zero stat is a valid value for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is valid for writes.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            continue;
        }
        if !ops::is_tcp_socket(fd) {
            continue;
        }
        let (Some(local), Some(peer)) = (sock_addr(fd, false), sock_addr(fd, true)) else {
            continue; // listening, or not connected
        };
        if !cfg.wants(&local) {
            continue;
        }
        // The client's Request may still be on its way (the accept that
        // left it undecided was in the process before the exec).
        let deferred = match settle::first_bytes(fd) {
            attach::FirstBytes::Plain => continue,
            // Decided here, so recorded here: the accepting process before
            // the exec saw no bytes yet and recorded nothing (an undecided
            // one is recorded by the settle watcher when it decides).
            // Once per connection: an inetd's service has it as stdin and
            // stdout, two descriptors of one stream.
            attach::FirstBytes::Mpa => attach::defer(fd, &cfg.opts).inspect(|()| {
                if !recorded.contains(&(local, peer)) {
                    recorded.push((local, peer));
                    cfg.record("accept", "iwarp", Some(peer), "(inherited through exec)");
                }
            }),
            attach::FirstBytes::NeedMore => attach::defer_undecided(fd, &cfg.opts),
        };
        match deferred {
            Ok(()) => {
                any = true;
                tracing::debug!(fd, %peer, "an MPA client's connection inherited through exec waits for its first use");
            }
            Err(e) => {
                tracing::warn!(fd, %peer, error = %e, "an inherited MPA client's connection stays TCP");
            }
        }
    }
    if any {
        settle::ensure_watcher();
    }
}

macro_rules! on_stream {
    ($fd:ident, $what:literal, $dontwait:expr, |$s:ident| $body:expr, else $real:expr) => {
        match settled($fd, $what, $dontwait) {
            Err(errno) => fail_with(errno),
            // `_held`: see `settled`; `$fd` may now name the TCP socket's
            // private copy (a name or option call during an exchange).
            Ok((_held, $fd)) => match table::lookup($fd) {
                Some($s) => boundary($what, || $body),
                None => $real,
            },
        }
    };
}

/// Calls that a TCP socket answers as well as a stream: they leave a
/// deferred accept deferred (socat's parent asks for names before it
/// forks the child that serves), and during its exchange the TCP socket
/// (a private copy) answers them.
const ANSWERED_BY_TCP: [&str; 4] = ["getsockname", "getpeername", "getsockopt", "setsockopt"];
/// Calls that start the exchange of a deferred accept but never wait for
/// it: they act on the placeholder meanwhile (`iwarp_rsocket::settle`).
const NEVER_WAIT: [&str; 2] = ["epoll_ctl", "ioctl"];

/// If `fd` is an accept deferred to its first use (`table`, "Accepts
/// wait for their first use"), start making it a stream, off this thread
/// (`iwarp_rsocket::settle`): a non-blocking call (`O_NONBLOCK`, or
/// `dontwait`: `MSG_DONTWAIT`) then fails with `EAGAIN` until the stream
/// is ready, as a TCP socket in its handshake would; a blocking call
/// waits for it. A call the TCP socket answers ([`ANSWERED_BY_TCP`])
/// leaves the accept deferred; the returned guard keeps the settle
/// watcher from changing the descriptor during that call, and the
/// returned number is the one to make the call on. `Err(errno)` when the
/// stream could not be made (`fd` is then a closed connection, and the
/// client falls back).
fn settled(
    fd: RawFd,
    what: &str,
    dontwait: bool,
) -> Result<(Option<attach::SettlesHeld>, RawFd), c_int> {
    if table::inside() || !(table::is_deferred(fd) || attach::is_settling(fd)) {
        return Ok((None, fd));
    }
    if table::in_vfork_child() {
        // The parent's accept: the child's call acts on its own copy of
        // the number, as without the shim (see `passthrough`).
        return Ok((None, fd));
    }
    if ANSWERED_BY_TCP.contains(&what) {
        let held = attach::hold_settles();
        let target = held.tcp_of(fd);
        return Ok((Some(held), target));
    }
    let wait = !NEVER_WAIT.contains(&what) && !dontwait && !attach::fd_flags(fd).0;
    let mut why = None;
    let rc: i8 = boundary(what, || {
        let r = if wait {
            attach::settle(fd)
        } else {
            settle::begin(fd).map(|_| ())
        };
        why = r.err();
        0
    });
    match why {
        // The call acts on what is at `fd` now: the placeholder, or a
        // closed connection if the accept failed (the program reads its end).
        _ if !wait && NEVER_WAIT.contains(&what) => Ok((None, fd)),
        _ if rc != 0 => Err(libc::ECONNRESET),
        Some(e) => {
            tracing::debug!(fd, what, error = %e, "the iWARP accept failed at its first use");
            Err(match iwarp_rsocket::errno::code(&e) {
                libc::EOPNOTSUPP => libc::EOPNOTSUPP,
                _ => libc::ECONNRESET,
            })
        }
        None if !wait && !NEVER_WAIT.contains(&what) && attach::is_settling(fd) => {
            Err(libc::EAGAIN)
        }
        None => Ok((None, fd)),
    }
}

/// The local (`peer` false) or peer address of socket `fd`.
fn sock_addr(fd: RawFd, peer: bool) -> Option<std::net::SocketAddr> {
    let r = real();
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    let p = (&mut st as *mut libc::sockaddr_storage).cast::<sockaddr>();
    // SAFETY: `st` is valid for `len` bytes.
    let rc = unsafe {
        if peer {
            (r.getpeername)(fd, p, &mut len)
        } else {
            (r.getsockname)(fd, p, &mut len)
        }
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes into `st`.
    unsafe { ops::read_addr(p, len) }
}

/// Whether the call must go straight to the C library: made by the
/// library itself ([`table::inside`]), or in a child made by `vfork` (or
/// `posix_spawn`'s CLONE_VM | CLONE_VFORK child, or a raw `clone`) before
/// its `exec`, which runs in the parent's memory with copies of the
/// parent's descriptors ([`table::in_vfork_child`]): the table, the
/// deferred accepts and the settles there are the parent's, and a
/// child's `close` or `dup2` of its own copy must not close, forget or
/// replace the parent's stream. (A child's read or write of a stream it
/// shares acts on the parent's stream, as another thread of the parent
/// would: vfork(2) makes any such call undefined behaviour anyway.)
fn passthrough() -> bool {
    table::inside() || table::in_vfork_child()
}

// --- connect and accept --------------------------------------------------

// Not in the unit-test build: there the exports would interpose the C
// library for the test harness itself.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let r = real();
    if addr.is_null() || passthrough() {
        // SAFETY: the caller's arguments, passed through.
        return unsafe { (r.connect)(fd, addr, len) };
    }
    // SAFETY: the caller's promise: `addr` is valid for `len` bytes.
    let Some(a) = (unsafe { ops::read_addr(addr, len) }) else {
        // SAFETY: passed through.
        return unsafe { (r.connect)(fd, addr, len) };
    };
    boundary("connect", || {
        let cfg = config::get();
        if !cfg.wants(&a) || !ops::is_tcp_socket(fd) {
            // SAFETY: passed through.
            return unsafe { (r.connect)(fd, addr, len) };
        }
        if table::is_taken(fd) {
            return fail_with(libc::EISCONN);
        }
        if table::live_streams() >= table::max_streams() {
            // Nothing learnt about the peer: not remembered.
            cfg.record(
                "connect",
                "plain",
                Some(a),
                "(IWARP_PRELOAD_MAX_STREAMS streams live)",
            );
            // SAFETY: passed through.
            return unsafe { (r.connect)(fd, addr, len) };
        }
        if config::is_plain_peer(&a) {
            cfg.record("connect", "plain", Some(a), "(remembered: no MPA)");
            // SAFETY: passed through.
            return unsafe { (r.connect)(fd, addr, len) };
        }
        let mut opts = table::options_for(fd, &cfg.opts);
        let (nonblocking, _) = attach::fd_flags(fd);
        if !nonblocking {
            // A blocking connect(2) waits through the kernel's SYN
            // retransmissions (a lost SYN costs 1 s, not the connection);
            // ours does too, and `IWARP_PRELOAD_CONNECT_MS` bounds only
            // the MPA exchange (issue 27 section 4).
            opts.tcp_connect = iwarp_sockets::TcpConnect::Kernel;
        }
        match attach::connect(fd, a, &opts) {
            Ok(()) => {
                cfg.record("connect", "iwarp", Some(a), "");
                0
            }
            Err(e) if table::is_stream_limit(&e) => {
                // Another thread took the last place meanwhile.
                cfg.record(
                    "connect",
                    "plain",
                    Some(a),
                    "(IWARP_PRELOAD_MAX_STREAMS streams live)",
                );
                // SAFETY: passed through.
                unsafe { (r.connect)(fd, addr, len) }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                // Nobody listens (or an iWARP listener rejected us):
                // plain TCP gives the program its own answer.
                cfg.record("connect", "plain", Some(a), "(refused over iWARP)");
                // SAFETY: passed through.
                unsafe { (r.connect)(fd, addr, len) }
            }
            Err(e) if iwarp_sockets::never_reached_tcp(&e).is_some() => {
                // The path or the host did not complete TCP: nothing is
                // known about the peer's protocol, so nothing is
                // remembered. A blocking socket already waited as the
                // kernel would and gets the kernel's answer; a
                // non-blocking one (bounded by the connect limit) goes on
                // as the kernel's own connect, in progress.
                let why = format!("(no TCP answer, not remembered: {e})").replace('\n', " ");
                if nonblocking {
                    cfg.record("connect", "plain", Some(a), &why);
                    // SAFETY: passed through.
                    unsafe { (r.connect)(fd, addr, len) }
                } else {
                    cfg.record("connect", "failed", Some(a), &why);
                    fail_with(iwarp_sockets::never_reached_tcp(&e).unwrap_or(libc::ETIMEDOUT))
                }
            }
            Err(e) => {
                config::remember_plain_peer(a, cfg.fallback);
                let why = format!("(no MPA answer: {e})");
                cfg.record("connect", "plain", Some(a), &why.replace('\n', " "));
                // SAFETY: passed through.
                unsafe { (r.connect)(fd, addr, len) }
            }
        }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept4(
    lfd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let r = real();
    if passthrough() {
        // SAFETY: passed through.
        return unsafe { (r.accept4)(lfd, addr, len, flags) };
    }
    if attach::may_accept().is_err() && !attach::fd_flags(lfd).0 {
        // SAFETY: the caller's promise.
        return boundary("accept", || unsafe {
            accept_no_streams(lfd, addr, len, flags)
        });
    }
    boundary("accept", || loop {
        // SAFETY: the caller's arguments, passed through.
        let nfd = unsafe { (r.accept4)(lfd, addr, len, flags) };
        if nfd < 0 {
            return nfd;
        }
        let cfg = config::get();
        let local = sock_addr(nfd, false);
        if !local.is_some_and(|l| cfg.wants(&l)) || !ops::is_tcp_socket(nfd) {
            return nfd;
        }
        // No waiting here for the client's first bytes (issue 26 item 1):
        // what has arrived decides now; if nothing has, the accept is
        // decided when its bytes arrive, off the program's thread
        // (`iwarp_rsocket::settle`).
        let peer_addr = sock_addr(nfd, true);
        let deferred = match settle::first_bytes(nfd) {
            attach::FirstBytes::Plain => {
                cfg.record("accept", "plain", peer_addr, "");
                return nfd;
            }
            // Nothing from the client yet: decided when its bytes arrive,
            // off the program's thread (issue 26 item 1: `accept` never
            // waits on a client). In a process that makes no MPA streams
            // this is a non-blocking listener only (a blocking one holds
            // such connections in `held`): an MPA client found then is
            // closed under the program (it reads end of stream or gets
            // ECONNRESET) and falls back with a new connection that the
            // program accepts next.
            attach::FirstBytes::NeedMore => attach::defer_undecided(nfd, &cfg.opts),
            attach::FirstBytes::Mpa => match settle::room_for_one_more() {
                // Over IWARP_PRELOAD_MAX_PENDING or IWARP_PRELOAD_MAX_STREAMS.
                Err(why) => Err(std::io::Error::other(why)),
                // The stream is made at the first use, in the process that
                // uses it (table.rs, "Accepts wait for their first use").
                Ok(()) => attach::defer(nfd, &cfg.opts).inspect(|()| {
                    cfg.record("accept", "iwarp", peer_addr, "");
                }),
            },
        };
        match deferred {
            Ok(()) => {
                settle::ensure_watcher();
                return nfd;
            }
            Err(e) => {
                let why = format!(
                    "(MPA Request but no iWARP accept here: {e}; closed, the client falls back)"
                );
                cfg.record("accept", "refused", peer_addr, &why.replace('\n', " "));
                // SAFETY: our descriptor.
                unsafe { (r.close)(nfd) };
            }
        }
    })
}

/// `accept4` on a blocking listener in a process that makes no MPA
/// streams: the next connection that is not an MPA client, decided
/// without waiting on any one client (`held`), with the program's flags
/// and its peer's address.
///
/// # Safety
/// As `accept4(2)`: `addr` null or valid for `*len` bytes.
unsafe fn accept_no_streams(
    lfd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let r = real();
    let cfg = config::get();
    let wanted = |fd| sock_addr(fd, false).is_some_and(|l| cfg.wants(&l)) && ops::is_tcp_socket(fd);
    let report = |fd, seen| {
        let peer = sock_addr(fd, true);
        match seen {
            held::Seen::Plain => cfg.record("accept", "plain", peer, ""),
            held::Seen::Silent => cfg.record(
                "accept",
                "plain",
                peer,
                "(no first bytes within IWARP_PRELOAD_PEEK_MS)",
            ),
            held::Seen::Mpa => {
                let why = attach::may_accept()
                    .err()
                    .map_or(String::new(), |e| e.to_string());
                cfg.record(
                    "accept",
                    "refused",
                    peer,
                    &format!("(MPA Request but no iWARP accept here: {why}; closed, the client falls back)")
                        .replace('\n', " "),
                );
            }
            held::Seen::NotWanted => {}
        }
    };
    let fd = match held::next(lfd, cfg.peek, wanted, report) {
        Ok(fd) => fd,
        Err(e) => return fail_with(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    // SAFETY: plain descriptor calls on the connection just accepted.
    unsafe {
        if flags & libc::SOCK_NONBLOCK != 0 {
            let fl = (r.fcntl)(fd, libc::F_GETFL, 0);
            (r.fcntl)(fd, libc::F_SETFL, (fl | libc::O_NONBLOCK) as c_ulong);
        }
        if flags & libc::SOCK_CLOEXEC == 0 {
            (r.fcntl)(fd, libc::F_SETFD, 0);
        }
        if !addr.is_null() && !len.is_null() {
            // As accept(2) fills them (truncated to the caller's length).
            (r.getpeername)(fd, addr, len);
        }
    }
    fd
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(lfd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { accept4(lfd, addr, len, 0) }
}

// --- data ----------------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    on_stream!(
        fd,
        "read",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::recv(&s, buf, n, 0) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().read)(fd, buf, n) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // What glibc's __chk_fail does: the program has a buffer overflow.
        eprintln!("*** buffer overflow detected ***: read of {n} bytes into {buflen}");
        std::process::abort();
    }
    // SAFETY: the caller's promise.
    unsafe { read(fd, buf, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    on_stream!(
        fd,
        "write",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::send(&s, buf, n, 0) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().write)(fd, buf, n) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    on_stream!(
        fd,
        "readv",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::readv(&s, iov, cnt, 0) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().readv)(fd, iov, cnt) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    on_stream!(
        fd,
        "writev",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::writev(&s, iov, cnt, 0) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().writev)(fd, iov, cnt) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    on_stream!(
        fd,
        "recv",
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::recv(&s, buf, n, flags) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().recv)(fd, buf, n, flags) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        eprintln!("*** buffer overflow detected ***: recv of {n} bytes into {buflen}");
        std::process::abort();
    }
    // SAFETY: the caller's promise.
    unsafe { recv(fd, buf, n, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    on_stream!(
        fd,
        "send",
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::send(&s, buf, n, flags) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().send)(fd, buf, n, flags) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> ssize_t {
    on_stream!(
        fd,
        "recvfrom",
        flags & libc::MSG_DONTWAIT != 0,
        |s| {
            // SAFETY: the caller's promise.
            let got = unsafe { ops::recv(&s, buf, n, flags) };
            if got >= 0 && !src.is_null() && !srclen.is_null() {
                // SAFETY: the caller's promise.
                unsafe { ops::sockname(&s, true, src, srclen) };
            }
            got
        },
        // SAFETY: passed through.
        else unsafe { (real().recvfrom)(fd, buf, n, flags, src, srclen) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        eprintln!("*** buffer overflow detected ***: recvfrom of {n} bytes into {buflen}");
        std::process::abort();
    }
    // SAFETY: the caller's promise.
    unsafe { recvfrom(fd, buf, n, flags, src, srclen) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    dst: *const sockaddr,
    dstlen: socklen_t,
) -> ssize_t {
    on_stream!(
        fd,
        "sendto",
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::send(&s, buf, n, flags) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().sendto)(fd, buf, n, flags, dst, dstlen) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    on_stream!(
        fd,
        "recvmsg",
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::recvmsg(&s, msg, flags) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().recvmsg)(fd, msg, flags) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    on_stream!(
        fd,
        "sendmsg",
        flags & libc::MSG_DONTWAIT != 0,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::sendmsg(&s, msg, flags) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().sendmsg)(fd, msg, flags) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    in_fd: c_int,
    off: *mut off_t,
    count: size_t,
) -> ssize_t {
    if table::lookup(in_fd).is_some() {
        return fail_with(libc::EINVAL);
    }
    on_stream!(
        out,
        "sendfile",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::sendfile(&s, in_fd, off, count) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().sendfile)(out, in_fd, off, count) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    in_fd: c_int,
    off: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: off_t is 64-bit on the 64-bit targets this builds for.
    unsafe { sendfile(out, in_fd, off, count) }
}

// --- descriptors -----------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn close(fd: c_int) -> c_int {
    if passthrough() {
        // SAFETY: passed through.
        return unsafe { (real().close)(fd) };
    }
    if !table::is_taken(fd) {
        // Also drops a settle's claim on `fd`: the settle must not touch
        // the number once it is closed (it may be reused at once).
        attach::forget(fd, fd);
    }
    if !table::is_taken(fd) {
        // SAFETY: passed through.
        return unsafe { (real().close)(fd) };
    }
    tracing::debug!(fd, "close of an iWARP stream");
    boundary("close", || table::close(fd))
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int {
    if !passthrough() {
        let hi = (last as usize).min(table::MAX_FD - 1);
        if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first as usize <= hi {
            attach::forget(first as RawFd, hi as RawFd);
        }
        for fd in table::taken() {
            if (fd as usize) >= first as usize
                && (fd as usize) <= hi
                && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0
            {
                boundary("close_range", || table::close(fd));
            }
        }
    }
    // SAFETY: the raw system call, as glibc's close_range makes it.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int }
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: passed through.
    on_stream!(
        fd,
        "shutdown",
        false,
        |s| {
            tracing::debug!(fd, how, "shutdown of an iWARP stream");
            ops::shutdown(&s, how)
        },
        // SAFETY: passed through.
        else unsafe { (real().shutdown)(fd, how) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn dup(fd: c_int) -> c_int {
    if let Some(rc) = dup_deferred(fd, None, |r| {
        // SAFETY: plain descriptor call.
        unsafe { (r.dup)(fd) }
    }) {
        return rc;
    }
    // SAFETY: plain descriptor call.
    let rc = unsafe { (real().dup)(fd) };
    if rc >= 0 && table::is_taken(fd) && !passthrough() {
        table::duplicated(fd, rc);
    }
    rc
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if passthrough() {
        // SAFETY: passed through.
        return unsafe { (real().dup2)(old, new) };
    }
    if let Some(rc) = dup_deferred(old, Some(new), |_| table::dup3(old, new, 0, false)) {
        return rc;
    }
    redirected(old, new);
    if table::inside() || (!table::is_taken(old) && !table::is_taken(new)) {
        // SAFETY: passed through.
        return unsafe { (real().dup2)(old, new) };
    }
    boundary("dup2", || table::dup3(old, new, 0, false))
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if passthrough() {
        // SAFETY: passed through.
        return unsafe { (real().dup3)(old, new, flags) };
    }
    if let Some(rc) = dup_deferred(old, Some(new), |_| table::dup3(old, new, flags, true)) {
        return rc;
    }
    redirected(old, new);
    if table::inside() || (!table::is_taken(old) && !table::is_taken(new)) {
        // SAFETY: passed through.
        return unsafe { (real().dup3)(old, new, flags) };
    }
    boundary("dup3", || table::dup3(old, new, flags, true))
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
        if let Some(rc) = dup_deferred(fd, None, |r| {
            // SAFETY: plain descriptor call.
            unsafe { (r.fcntl)(fd, cmd, arg) }
        }) {
            return rc;
        }
    }
    if table::inside() || !table::is_taken(fd) || table::in_vfork_child() {
        // SAFETY: passed through.
        return unsafe { (real().fcntl)(fd, cmd, arg) };
    }
    boundary("fcntl", || iwarp_rsocket::fcntl(fd, cmd, arg))
}

#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl(fd, cmd, arg)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    if let Err(e) = settled(fd, "ioctl", true) {
        return fail_with(e);
    }
    // (In a vfork child, FIONBIO must not change the parent's stream.)
    if let Some(s) = table::lookup(fd).filter(|_| !table::in_vfork_child()) {
        let rc = boundary("ioctl", || {
            // SAFETY: the caller's promise: `arg` points to what `req`
            // says (an int for FIONREAD and FIONBIO).
            let r = unsafe { ops::ioctl(&s, req, arg) };
            r.unwrap_or(-2)
        });
        if rc != -2 {
            return rc;
        }
    }
    // SAFETY: passed through.
    unsafe { (real().ioctl)(fd, req, arg) }
}

/// A `dup`-like call on a deferred accept `old` (`Some(rc)`; `None` when
/// `old` is not one): the copy waits for its first use too, so a copy
/// made before an `exec` (an inetd puts its connection on the service's
/// standard input and output) still finds the MPA Request unread, and the
/// first use of either makes the stream for both (`attach::settle`).
/// `target` is `dup2`'s `new`: what was noted about it is forgotten (it
/// is replaced). `call` makes the copy (with the table, when `new` is a
/// stream being replaced).
fn dup_deferred(
    old: c_int,
    target: Option<c_int>,
    call: impl FnOnce(&iwarp_rsocket::real::Real) -> c_int,
) -> Option<c_int> {
    if table::inside()
        || !(table::is_deferred(old) || attach::is_settling(old))
        || table::in_vfork_child()
    {
        return None;
    }
    if let Some(new) = target {
        if new == old {
            return None; // dup2 returns it, dup3 fails: the C library says
        }
        if !table::is_taken(new) {
            attach::forget(new, new);
        }
    }
    // Made under the settles' lock: a settle in progress makes the copy a
    // copy of the stream too.
    attach::copy_waiting(old, || call(real()))
}

/// Before `dup2(old, new)` of a descriptor that is not a deferred accept:
/// a deferred `new` is forgotten (it is replaced).
fn redirected(old: c_int, new: c_int) {
    if old != new && !table::inside() && !table::is_taken(new) {
        attach::forget(new, new);
    }
}

/// `epoll_ctl` needs no stream calls (a stream's descriptor is its
/// readiness socket), but a deferred accept's number is replaced while it
/// becomes a stream, and an epoll registration belongs to the file, not
/// the number (epoll(7)): registering a deferred accept starts its
/// exchange (the number becomes the placeholder at once), and the
/// registrations made while it runs are recorded and moved to the stream
/// (`iwarp_rsocket::settle::epoll_ctl`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if !table::inside() {
        if op != libc::EPOLL_CTL_DEL {
            // A failure leaves a closed connection on `fd`: registered,
            // the program reads its end.
            let _ = settled(fd, "epoll_ctl", true);
        }
        // (A vfork child's registration is of its own copy: not recorded
        // with the parent's settle.)
        if !(attach::is_settling(fd) && table::in_vfork_child()) {
            // SAFETY: the caller's arguments, passed through.
            if let Some(rc) = unsafe { settle::epoll_ctl(epfd, op, fd, ev) } {
                return rc;
            }
        }
    }
    // SAFETY: the caller's arguments, passed through unchanged.
    unsafe { (real().epoll_ctl)(epfd, op, fd, ev) }
}

// --- names and options -----------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    on_stream!(
        fd,
        "getsockname",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::sockname(&s, false, addr, len) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().getsockname)(fd, addr, len) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    on_stream!(
        fd,
        "getpeername",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::sockname(&s, true, addr, len) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().getpeername)(fd, addr, len) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if table::is_taken(fd) && table::in_vfork_child() {
        // SAFETY: passed through (see `passthrough`).
        return unsafe { (real().setsockopt)(fd, level, name, val, len) };
    }
    if let Some(s) = table::lookup(fd) {
        // SAFETY: the caller's promise.
        return boundary("setsockopt", || unsafe {
            ops::setsockopt(&s, level, name, val, len)
        });
    }
    if !passthrough() && level == libc::SOL_SOCKET {
        // SAFETY: the caller's promise.
        unsafe { iwarp_rsocket::note_sockopt(fd, level, name, val, len) };
    }
    // During an exchange the TCP socket (a private copy) takes it.
    let (_held, target) = settled(fd, "setsockopt", false).unwrap_or((None, fd));
    // SAFETY: passed through.
    let rc = unsafe { (real().setsockopt)(target, level, name, val, len) };
    if rc == 0 && level == libc::IPPROTO_TCP && name == libc::TCP_CONGESTION && !passthrough() {
        // The kernel took the name (ENOENT/EPERM otherwise, as tcp(7)
        // says): a stream made later on `fd` by `connect` uses it too
        // (an accepted one is this TCP socket already).
        // SAFETY: the caller's promise.
        unsafe { iwarp_rsocket::note_sockopt(fd, level, name, val, len) };
    }
    rc
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    on_stream!(
        fd,
        "getsockopt",
        false,
        // SAFETY: the caller's promise: its pointers are valid for the
        // lengths it gives, as the C prototype requires.
        |s| unsafe { ops::getsockopt(&s, level, name, val, len) },
        // SAFETY: the caller's arguments, passed through unchanged.
        else unsafe { (real().getsockopt)(fd, level, name, val, len) }
    )
}
