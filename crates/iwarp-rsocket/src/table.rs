//! The descriptor table: which descriptor numbers of the process are
//! iWARP streams.
//!
//! A program's socket keeps its own descriptor number when it becomes an
//! iWARP stream: [`install`] `dup2`s the stream's readiness descriptor
//! (see `iwarp_sockets::Stream::as_raw_fd`) onto that number, so `poll`,
//! `select` and `epoll` on it work natively, and records the number here
//! so that the socket calls on it go to the stream. Every number that
//! refers to a stream (after `dup`, `dup2`, `F_DUPFD`) has its own entry,
//! and the entries share one [`Sock`]; the stream closes when the last of
//! them is closed.
//!
//! The check "is this descriptor a stream" is one atomic bit per
//! descriptor number ([`is_taken`]), so the calls the shim passes through
//! (every `read`/`write` of a file, and the stack's own socket calls) pay
//! only that.
//!
//! ## fork
//!
//! A child process shares the parent's TCP connections but not its
//! threads, so it cannot drive the parent's streams. Entries made before a
//! `fork` are *inherited* in the child: `close` on them only closes the
//! descriptor (the parent's stream carries on), and reads and writes on
//! them fail with `EOPNOTSUPP`. If the parent had made any stream, the
//! socket library's progress thread existed in the parent and does not in
//! the child, so the child makes no new streams ([`new_streams_allowed`]).
//! Listening sockets are real TCP sockets and work in the child as they
//! do in the parent.
//!
//! ## Accepts wait for their first use
//!
//! An accepted connection whose first bytes are an MPA Request is not made
//! a stream at once: it is *deferred* ([`defer`]). The descriptor stays
//! the TCP socket, the Request unread, until the first call that needs the
//! stream (a read, a write, `epoll_ctl`, `ioctl`, `shutdown`, ...); that
//! call makes the stream, in the process that makes it (`attach::settle`).
//! Calls that a TCP socket answers as well (`getsockname`, `getpeername`,
//! `setsockopt`, `getsockopt`, `fcntl` flags) and `close` leave it
//! deferred. Copies (`dup`, `dup2`, `F_DUPFD`) are deferred with it
//! ([`defer_copy`]); the first use of any makes one stream for all
//! ([`deferred_siblings`]), so copies made before an `exec` still find the
//! Request unread in the program `exec` starts, whose shim adopts them. So that a client does not wait
//! long for its MPA Reply (it gives up after a second and falls back to
//! TCP), an accept not used within `IWARP_PRELOAD_SETTLE_MS` (300 ms) is
//! made a stream by the shim's settle thread in the process that accepted
//! it. A settle only goes ahead while the MPA Request is still unread:
//! once another process made the connection its stream, this process's
//! descriptor is closed instead.
//!
//! So a program that accepts in one process and serves in a forked child
//! (socat's `fork` option, inetd style) works: the parent only accepts
//! and closes, the child reads and writes, and the stream is made in the
//! child, which has never seen a stream of its parent's.
//!
//! A stream made *before* a fork still belongs to the process that made
//! it. If a child reads or writes one it inherited, it says so in a word
//! it shares with the parent (a `MAP_SHARED` page mapped before the first
//! stream, so every later child has it), and from then on the parent makes
//! no more streams on accept ([`children_serve_inherited`]): it closes its
//! MPA clients, which fall back to plain TCP on the same port. The
//! connection that taught it fails (its child gets `EOPNOTSUPP`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex, Once, RwLock};
use std::time::{Duration, Instant};

use iwarp_sockets::{Options, Stream};

use crate::real::real;

/// Descriptor numbers at or above this are never taken over.
pub const MAX_FD: usize = 1 << 20;

static TAKEN: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];
static PENDING: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];
static DEFERRED: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];
/// A deferred accept: its options, when it was accepted, and whether its
/// first bytes are still unknown (`undecided`: nothing had arrived at
/// `accept`; it is an MPA client or a plain one once they do).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    opts: Options,
    since: Instant,
    undecided: bool,
}

static DEFERRED_OPTS: Mutex<BTreeMap<RawFd, Entry>> = Mutex::new(BTreeMap::new());
static TABLE: RwLock<BTreeMap<RawFd, Arc<Sock>>> = RwLock::new(BTreeMap::new());
static GENERATION: AtomicU32 = AtomicU32::new(0);
static EVER_STREAM: AtomicBool = AtomicBool::new(false);
static NO_NEW_STREAMS: AtomicBool = AtomicBool::new(false);

fn bit(map: &[AtomicU64], fd: RawFd) -> Option<(&AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < MAX_FD)?;
    Some((&map[i / 64], 1u64 << (i % 64)))
}

fn test(map: &[AtomicU64], fd: RawFd) -> bool {
    bit(map, fd).is_some_and(|(w, b)| w.load(Ordering::Acquire) & b != 0)
}

fn set(map: &[AtomicU64], fd: RawFd, on: bool) {
    if let Some((w, b)) = bit(map, fd) {
        if on {
            w.fetch_or(b, Ordering::AcqRel);
        } else {
            w.fetch_and(!b, Ordering::AcqRel);
        }
    }
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside the library (its socket calls must go
/// straight to the C library).
pub fn inside() -> bool {
    INSIDE.with(Cell::get)
}

/// Marks this thread as inside the library until dropped.
#[derive(Debug)]
pub struct Inside {
    was: bool,
}

impl Inside {
    /// Enters.
    pub fn enter() -> Inside {
        Inside {
            was: INSIDE.with(|c| c.replace(true)),
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let was = self.was;
        INSIDE.with(|c| c.set(was));
    }
}

/// The process whose descriptors this table describes (0: none claimed,
/// as in a program that uses the rsocket API directly: then
/// [`in_vfork_child`] is always false).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Makes this process the owner of the table (the preload calls it when
/// it is loaded), and keeps a child made by `fork` its own table's owner.
pub fn claim_process() {
    static ATFORK: Once = Once::new();
    OWNER.store(std::process::id() as i32, Ordering::Release);
    ATFORK.call_once(|| {
        // SAFETY: registers a plain function without arguments that only
        // stores an atomic (async-signal-safe, as a fork child handler
        // must be).
        unsafe { libc::pthread_atfork(None, None, Some(owner_after_fork)) };
    });
}

extern "C" fn owner_after_fork() {
    // SAFETY: getpid(2) cannot fail.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Release);
}

/// Whether this thread runs in a child that shares the owner's memory
/// without being the owner: made by `vfork` (vfork(2): "the child
/// shares all memory with its parent, including the stack, until a
/// successful execve(2) or _exit(2)"; `posix_spawn` too, whose
/// CLONE_VM | CLONE_VFORK child runs no `pthread_atfork` handlers), or by
/// a raw `clone`. Its descriptors are copies of the parent's, but this
/// table, the deferred accepts, the settles and the streams in memory are
/// the parent's: the interposed calls (`close`, `dup2`, `close_range`, an
/// `exit` after a failed `exec`) must go straight to the C library there,
/// or they close or replace the parent's streams while the child only
/// closes or replaces its own numbers. One `getpid(2)` (not cached by
/// glibc since 2.25); asked only on the paths that change the table.
pub fn in_vfork_child() -> bool {
    let owner = OWNER.load(Ordering::Acquire);
    // SAFETY: getpid(2) cannot fail.
    owner != 0 && owner != unsafe { libc::getpid() }
}

/// One iWARP stream and what the socket calls keep beside it.
#[derive(Debug)]
pub struct Sock {
    /// The stream.
    pub stream: Stream,
    /// Bytes taken out of the stream by `MSG_PEEK`, returned first by the
    /// next reads.
    pub pushback: Mutex<Vec<u8>>,
    /// `SO_RCVTIMEO` / `SO_SNDTIMEO` as set (for `getsockopt`).
    pub timeouts: Mutex<(Option<Duration>, Option<Duration>)>,
    /// `SO_KEEPALIVE` as set (for `getsockopt`).
    pub keepalive: AtomicBool,
    /// The program's last successful call on the stream was a send (see
    /// `graceful_end`).
    pub last_was_send: AtomicBool,
    /// The program shut down the read side (`SHUT_RD`, `SHUT_RDWR`): reads
    /// return end of stream. Local only, as on TCP (nothing goes on the
    /// wire for it), so the stream can still see the peer's end of stream
    /// in `graceful_end`.
    pub read_shut: AtomicBool,
    generation: u32,
    /// This stream's place under the process's bound (last: dropped after
    /// the stream, so the count falls once its threads are gone).
    _slot: StreamSlot,
}

impl Sock {
    /// Whether this stream was made by another process (inherited through
    /// `fork`); such a stream cannot be driven here.
    pub fn inherited(&self) -> bool {
        self.generation != GENERATION.load(Ordering::Acquire)
    }
}

/// Whether `fd` is an iWARP stream (one atomic load).
pub fn is_taken(fd: RawFd) -> bool {
    test(&TAKEN, fd)
}

/// The stream behind `fd`, unless this thread is inside the library.
pub fn lookup(fd: RawFd) -> Option<Arc<Sock>> {
    if !is_taken(fd) || inside() {
        return None;
    }
    TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .cloned()
}

fn insert(fd: RawFd, sock: Arc<Sock>) -> Option<Arc<Sock>> {
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let old = t.insert(fd, sock);
    set(&TAKEN, fd, true);
    old
}

fn remove(fd: RawFd) -> Option<Arc<Sock>> {
    if !is_taken(fd) {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    set(&TAKEN, fd, false);
    t.remove(&fd)
}

/// Lets go of one entry's reference: in a child after `fork`, an inherited
/// stream is never torn down (that would disconnect the parent's
/// connection); otherwise the last reference closes the stream.
fn release(sock: Option<Arc<Sock>>) {
    if let Some(s) = sock {
        if s.inherited() {
            std::mem::forget(s);
        } else {
            let _inside = Inside::enter();
            if Arc::strong_count(&s) == 1 && s.last_was_send.load(Ordering::Acquire) {
                graceful_end(&s);
            }
            drop(s);
        }
    }
}

/// Before the last descriptor of a stream whose last call was a send
/// closes: sends the end of stream and waits (bounded by the stream's
/// linger) for the peer's end of stream, discarding what arrives.
///
/// Why: closing the stream closes its TCP connection at once, and a TCP
/// socket closed with unread input sends a reset, on which the peer's
/// kernel drops the data it has not yet handed to the peer's stack: the
/// last bytes of an upload that ends with `close` (socat does exactly
/// that) would be lost. Waiting for the peer's end of stream means the
/// peer has read everything first. (This belongs in the stack's close;
/// until it moves there, the table does it.)
fn graceful_end(s: &Sock) {
    graceful_end_all(std::slice::from_ref(&s));
}

/// [`graceful_end`] of several streams at once, under one deadline.
fn graceful_end_all(socks: &[&Sock]) {
    let start = std::time::Instant::now();
    let mut open: Vec<&Sock> = Vec::with_capacity(socks.len());
    let mut linger = std::time::Duration::ZERO;
    for s in socks {
        let _ = s.stream.shutdown(std::net::Shutdown::Write);
        linger = linger.max(s.stream.options().linger);
        open.push(s);
    }
    let deadline = start + linger;
    let mut buf = [0u8; 16384];
    while !open.is_empty() {
        open.retain(|s| loop {
            match s.stream.recv_nonblocking(&mut buf) {
                Ok(0) => return false,
                Ok(_) if std::time::Instant::now() < deadline => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                _ => return false,
            }
        });
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if open.is_empty() || left.is_zero() {
            break;
        }
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|s| libc::pollfd {
                fd: s.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds for the
        // duration of the call.
        unsafe { (real().poll)(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }
    tracing::debug!(
        streams = socks.len(),
        waited = ?start.elapsed(),
        without_end_of_stream = open.len(),
        "close: waited for the peers' end of stream"
    );
}

/// At `exit`: every stream still open is closed as `close` would, so that
/// data still queued in the send ring leaves and the peer reads it (a
/// program that ends with `exit` without closing its sockets, like socat,
/// would otherwise lose its last bytes: the kernel closes the TCP
/// connection with the stack's buffers unsent).
extern "C" fn at_exit() {
    if in_vfork_child() {
        // `exit` (not `_exit`) after a failed exec in a vfork child: the
        // streams are the parent's, which goes on with them.
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let _inside = Inside::enter();
        let all: Vec<Arc<Sock>> = {
            let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
            let fds: Vec<RawFd> = t.keys().copied().collect();
            for fd in &fds {
                set(&TAKEN, *fd, false);
            }
            std::mem::take(&mut *t).into_values().collect()
        };
        // One reference per stream; the peers' end of stream awaited for
        // all of them at once (a server with many idle clients must not
        // take a linger time per client to exit).
        let mut unique: Vec<Arc<Sock>> = Vec::new();
        for s in all {
            if s.inherited() {
                std::mem::forget(s);
            } else if !unique.iter().any(|u| Arc::ptr_eq(u, &s)) {
                unique.push(s);
            }
        }
        let sent: Vec<&Sock> = unique
            .iter()
            .filter(|s| s.last_was_send.load(Ordering::Acquire))
            .map(|s| &**s)
            .collect();
        graceful_end_all(&sent);
        drop(unique);
    });
}

/// The word shared with children (see "fork" above); null until the first
/// stream, or if the mapping failed (then the parent never learns).
static SHARED_WORD: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());

fn map_shared_word() {
    // SAFETY: an anonymous shared mapping of one page, never unmapped, so
    // the pointer stays valid for the life of the process and of every
    // child forked later (they inherit the mapping). The page is zeroed by
    // the kernel, and an AtomicU32 has the size and alignment of a u32, so
    // its start is a valid AtomicU32 holding 0.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        tracing::warn!(
            error = %io::Error::last_os_error(),
            "no shared page for fork bookkeeping: a server that serves in forked children will not learn to fall back"
        );
        return;
    }
    SHARED_WORD.store(p.cast(), Ordering::Release);
}

fn shared_word() -> Option<&'static AtomicU32> {
    let p = SHARED_WORD.load(Ordering::Acquire);
    // SAFETY: null, or the start of the page mapped by `map_shared_word`,
    // which is never unmapped (see there).
    unsafe { p.as_ref() }
}

/// A process tried to read or write a stream it inherited through `fork`:
/// tell the process that made it (see "fork" above), once per process
/// with a warning that names the cause and the remedy.
pub fn note_inherited_use() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Some(w) = shared_word() {
        w.store(1, Ordering::Release);
    }
    if !WARNED.swap(true, Ordering::AcqRel) {
        // On stderr whatever the log settings: the program's connection
        // fails here, and this line is the only place that says why.
        eprintln!(
            "iwarp (pid {}): an iWARP stream was used in a child process that inherited it \
             through fork; only the process that accepted or connected it can drive it, so \
             this connection fails (EOPNOTSUPP). The parent now serves new clients over plain \
             TCP. To keep such a server (accept in the parent, serve in a child: socat fork, \
             inetd) entirely on TCP, leave its port out of IWARP_PRELOAD_PORTS.",
            std::process::id()
        );
    }
}

/// Whether a child of this process tried to use a stream it inherited:
/// the program serves its connections in children, so it should make no
/// more streams on accept.
pub fn children_serve_inherited() -> bool {
    shared_word().is_some_and(|w| w.load(Ordering::Acquire) != 0)
}

extern "C" fn after_fork_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // The parent's streams are not this process's (they are never
    // dropped here, see `release`), nor are its exchanges in progress.
    LIVE.store(0, Ordering::Release);
    if EVER_STREAM.load(Ordering::Acquire) {
        NO_NEW_STREAMS.store(true, Ordering::Release);
    }
}

/// Whether this process may make new streams (false in a child forked
/// after the parent made one: the socket library's progress thread does
/// not exist here).
pub fn new_streams_allowed() -> bool {
    !NO_NEW_STREAMS.load(Ordering::Acquire)
}

/// Whether this process may accept MPA clients as streams (the errors
/// name why not).
pub fn may_accept() -> io::Result<()> {
    if !new_streams_allowed() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no new iWARP streams in a child forked after its parent made one (the socket \
             library's progress thread does not exist here)",
        ));
    }
    if children_serve_inherited() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a child of this process tried to use a stream it inherited: the program serves \
             its connections in forked children, which cannot drive this process's streams",
        ));
    }
    Ok(())
}

/// Records that a stream is about to be made (for [`new_streams_allowed`]
/// in children) and registers the `fork` handler once.
pub fn note_stream() {
    static ATFORK: Once = Once::new();
    ATFORK.call_once(|| {
        map_shared_word();
        // SAFETY: registers plain functions without arguments: the fork
        // child handler only touches atomics; the exit handler runs
        // before the process's threads are gone.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_child));
            libc::atexit(at_exit);
        }
    });
    EVER_STREAM.store(true, Ordering::Release);
}

/// The default of [`max_streams`]: each stream of the soft provider costs
/// a receive and a transmit thread and its buffers, so 256 streams are
/// about 512 threads.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// Streams this process made and has not closed, and those being made
/// ([`StreamSlot`]).
static LIVE: AtomicUsize = AtomicUsize::new(0);
static MAX_STREAMS: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_STREAMS);

/// Sets the bound on live streams in this process (the preload's
/// `IWARP_PRELOAD_MAX_STREAMS`; at least 1).
pub fn set_max_streams(n: usize) {
    MAX_STREAMS.store(n.max(1), Ordering::Release);
}

/// The bound on live streams in this process.
pub fn max_streams() -> usize {
    MAX_STREAMS.load(Ordering::Acquire)
}

/// Live streams of this process, those being made included.
pub fn live_streams() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// One stream's place under the process's bound on live streams
/// ([`max_streams`]): taken before the stream is made (its exchange
/// starts the provider's threads), given back when dropped.
#[derive(Debug)]
pub struct StreamSlot(());

impl StreamSlot {
    /// A place, if fewer than [`max_streams`] streams are live or being
    /// made; otherwise an error that [`is_stream_limit`] recognises.
    pub fn reserve() -> io::Result<StreamSlot> {
        let max = max_streams();
        LIVE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .map(|_| StreamSlot(()))
        .map_err(|live| io::Error::other(StreamLimit { live, max }))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        // Saturating: a fork child starts again from 0 (`after_fork_child`).
        let _ = LIVE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// The error of [`StreamSlot::reserve`] at the bound.
#[derive(Debug)]
pub struct StreamLimit {
    live: usize,
    max: usize,
}

impl std::fmt::Display for StreamLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} iWARP streams are live in this process, the bound (IWARP_PRELOAD_MAX_STREAMS = \
             {}); raise it if this is legitimate load",
            self.live, self.max
        )
    }
}

impl std::error::Error for StreamLimit {}

/// Whether `e` says this process is at its bound on live streams.
pub fn is_stream_limit(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<StreamLimit>())
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// Makes descriptor `fd` the stream `stream`: its readiness descriptor is
/// `dup2`ed onto `fd` (closing what `fd` was), close-on-exec as asked.
/// `slot` is the stream's place under the bound ([`StreamSlot::reserve`],
/// taken before the stream was made); the stream keeps it until its last
/// descriptor closes.
pub fn install(fd: RawFd, stream: Stream, slot: StreamSlot, cloexec: bool) -> io::Result<()> {
    if usize::try_from(fd).map_or(true, |i| i >= MAX_FD) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is beyond the table ({MAX_FD}); lower RLIMIT_NOFILE"),
        ));
    }
    let r = real();
    // SAFETY: plain descriptor calls; `stream` keeps its descriptor open.
    unsafe {
        if (r.dup2)(stream.as_raw_fd(), fd) < 0 {
            return Err(errno());
        }
        if cloexec {
            (r.fcntl)(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong);
        }
    }
    let sock = Arc::new(Sock {
        stream,
        pushback: Mutex::new(Vec::new()),
        timeouts: Mutex::new((None, None)),
        keepalive: AtomicBool::new(false),
        last_was_send: AtomicBool::new(false),
        read_shut: AtomicBool::new(false),
        generation: GENERATION.load(Ordering::Acquire),
        _slot: slot,
    });
    clear_pending(fd);
    release(insert(fd, sock));
    Ok(())
}

/// `close(fd)`.
pub fn close(fd: RawFd) -> libc::c_int {
    let old = remove(fd);
    clear_pending(fd);
    // SAFETY: plain descriptor call.
    let rc = unsafe { (real().close)(fd) };
    if old.is_some() {
        let e = errno();
        release(old);
        if rc < 0 {
            // SAFETY: restores errno after the release may have changed it.
            unsafe { *libc::__errno_location() = e.raw_os_error().unwrap_or(0) };
        }
    }
    rc
}

/// After a successful `dup`-like call made `new` a copy of `old`: records
/// it if `old` is a stream (and forgets what `new` was).
pub fn duplicated(old: RawFd, new: RawFd) {
    if old == new {
        return;
    }
    let was = remove(new);
    clear_pending(new);
    let src = TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&old)
        .cloned();
    if let Some(s) = src {
        release(insert(new, s));
    }
    release(was);
}

/// `dup2(old, new)` / `dup3`: the real call, then the table.
pub fn dup3(old: RawFd, new: RawFd, flags: libc::c_int, three: bool) -> libc::c_int {
    // SAFETY: plain descriptor calls.
    let rc = unsafe {
        if three {
            (real().dup3)(old, new, flags)
        } else {
            (real().dup2)(old, new)
        }
    };
    if rc >= 0 {
        duplicated(old, rc);
    }
    rc
}

/// Defers the accepted MPA connection `fd` (see "Accepts wait for their
/// first use" above): it becomes a stream with `opts` at its first use.
pub fn defer(fd: RawFd, opts: Options) -> io::Result<()> {
    defer_entry(fd, opts, false)
}

/// Defers the accepted connection `fd` whose first bytes have not arrived
/// yet: it is decided (MPA client or plain TCP) when they do, off the
/// program's thread (`settle`), or at its first use.
pub fn defer_undecided(fd: RawFd, opts: Options) -> io::Result<()> {
    defer_entry(fd, opts, true)
}

fn defer_entry(fd: RawFd, opts: Options, undecided: bool) -> io::Result<()> {
    if usize::try_from(fd).map_or(true, |i| i >= MAX_FD) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is beyond the table ({MAX_FD}); lower RLIMIT_NOFILE"),
        ));
    }
    DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            fd,
            Entry {
                opts,
                since: Instant::now(),
                undecided,
            },
        );
    set(&DEFERRED, fd, true);
    Ok(())
}

/// After a `dup`-like call made `new` a copy of the deferred accept `old`:
/// `new` waits for its first use too, with the same options, the same
/// age and the socket options noted on `old` (they name one socket).
/// Whichever of them is used first makes the stream for both
/// (`attach::settle`, [`deferred_siblings`]).
pub fn defer_copy(old: RawFd, new: RawFd) {
    if old == new || usize::try_from(new).map_or(true, |i| i >= MAX_FD) {
        return;
    }
    let entry = DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&old)
        .cloned();
    let Some(entry) = entry else {
        return;
    };
    let pending = PENDING_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&old)
        .copied();
    if let Some(p) = pending {
        note_pending(new, |q| *q = p);
    }
    DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(new, entry);
    set(&DEFERRED, new, true);
}

/// `(st_dev, st_ino)` of what `fd` refers to.
fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid value for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// The other deferred descriptors of this process that refer to the same
/// socket as `fd` (copies made by `dup`, `dup2`, `F_DUPFD`, or inherited
/// together through `exec`, as an inetd's service gets its connection as
/// standard input and output).
pub fn deferred_siblings(fd: RawFd) -> Vec<RawFd> {
    let Some(me) = identity(fd) else {
        return Vec::new();
    };
    let fds: Vec<RawFd> = DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .copied()
        .filter(|&d| d != fd)
        .collect();
    fds.into_iter()
        .filter(|&d| identity(d) == Some(me))
        .collect()
}

/// The deferred MPA accepts (not the undecided ones) that have waited at
/// least `age` for their first use.
pub fn deferred_older_than(age: Duration) -> Vec<RawFd> {
    DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(_, e)| !e.undecided && e.since.elapsed() >= age)
        .map(|(fd, _)| *fd)
        .collect()
}

/// The undecided accepts (first bytes unknown), with when each was
/// accepted.
pub fn undecided() -> Vec<(RawFd, Instant)> {
    DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(_, e)| e.undecided)
        .map(|(fd, e)| (*fd, e.since))
        .collect()
}

/// Whether the deferred accept `fd` is undecided (see [`defer_undecided`]).
pub fn is_undecided(fd: RawFd) -> bool {
    is_deferred(fd)
        && DEFERRED_OPTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fd)
            .is_some_and(|e| e.undecided)
}

/// The undecided accept `fd` turned out to be an MPA client.
pub fn set_decided(fd: RawFd) {
    if let Some(e) = DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&fd)
    {
        e.undecided = false;
    }
}

/// Deferred MPA accepts (undecided ones not counted).
pub fn count_deferred_mpa() -> usize {
    DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .filter(|e| !e.undecided)
        .count()
}

/// Whether no accept waits for its first use.
pub fn none_deferred() -> bool {
    DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_empty()
}

/// Is `fd` an accepted MPA connection waiting for its first use? One
/// atomic load.
pub fn is_deferred(fd: RawFd) -> bool {
    test(&DEFERRED, fd)
}

/// Takes the deferred entry of `fd` (its options), if it still has one.
pub fn take_deferred(fd: RawFd) -> Option<Options> {
    take_deferred_entry(fd).map(|(opts, _, _)| opts)
}

/// Takes the deferred entry of `fd`: its options, when it was accepted,
/// and whether it is undecided.
pub fn take_deferred_entry(fd: RawFd) -> Option<(Options, Instant, bool)> {
    if !test(&DEFERRED, fd) {
        return None;
    }
    let o = DEFERRED_OPTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&fd);
    set(&DEFERRED, fd, false);
    o.map(|e| (e.opts, e.since, e.undecided))
}

/// Forgets what is noted about the descriptors `first..=last` that are not
/// streams (deferred accepts, socket options for a later stream): they are
/// being closed, or replaced by `dup2`, and their numbers will be reused.
/// Two atomic loads when `first == last` and nothing is noted.
pub fn forget(first: RawFd, last: RawFd) {
    if first > last || (first == last && !test(&DEFERRED, first) && !test(&PENDING, first)) {
        return;
    }
    {
        let mut m = DEFERRED_OPTS.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<RawFd> = m.range(first..=last).map(|(fd, _)| *fd).collect();
        for fd in gone {
            m.remove(&fd);
            set(&DEFERRED, fd, false);
        }
    }
    let mut m = PENDING_OPTS.lock().unwrap_or_else(|e| e.into_inner());
    let gone: Vec<RawFd> = m.range(first..=last).map(|(fd, _)| *fd).collect();
    for fd in gone {
        m.remove(&fd);
        set(&PENDING, fd, false);
    }
}

/// The table's locks, held across a `fork` (see `settle::ensure_watcher`).
pub(crate) type ForkGuards = (
    std::sync::MutexGuard<'static, BTreeMap<RawFd, Entry>>,
    std::sync::MutexGuard<'static, BTreeMap<RawFd, Pending>>,
);

/// Takes the table's locks (in the order the library takes them).
pub(crate) fn lock_for_fork() -> ForkGuards {
    (
        DEFERRED_OPTS.lock().unwrap_or_else(|e| e.into_inner()),
        PENDING_OPTS.lock().unwrap_or_else(|e| e.into_inner()),
    )
}

/// Socket options set on a descriptor before it became a stream, applied
/// when it does.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pending {
    /// `SO_RCVBUF`.
    pub rcvbuf: Option<u32>,
    /// `SO_SNDBUF`.
    pub sndbuf: Option<u32>,
    /// `SO_KEEPALIVE`.
    pub keepalive: Option<bool>,
    /// `RDMA_IOMAPSIZE` (level `SOL_RDMA`).
    pub iomap_size: Option<u16>,
    /// `TCP_CONGESTION` (level `IPPROTO_TCP`): the name, NUL-padded
    /// (tcp(7): at most 15 bytes and the NUL).
    pub congestion: Option<[u8; 16]>,
}

static PENDING_OPTS: Mutex<BTreeMap<RawFd, Pending>> = Mutex::new(BTreeMap::new());

fn clear_pending(fd: RawFd) {
    if test(&PENDING, fd) {
        set(&PENDING, fd, false);
        PENDING_OPTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fd);
    }
}

/// Notes a socket option set on a descriptor that is not a stream (yet).
pub fn note_pending(fd: RawFd, f: impl FnOnce(&mut Pending)) {
    if usize::try_from(fd).map_or(true, |i| i >= MAX_FD) {
        return;
    }
    let mut m = PENDING_OPTS.lock().unwrap_or_else(|e| e.into_inner());
    f(m.entry(fd).or_default());
    set(&PENDING, fd, true);
}

/// `base` with the options noted on `fd` applied.
pub fn options_for(fd: RawFd, base: &Options) -> Options {
    let mut o = base.clone();
    if test(&PENDING, fd) {
        if let Some(p) = PENDING_OPTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fd)
        {
            let ring = |v: u32| v.clamp(4096, 64 << 20) & !1;
            if let Some(v) = p.rcvbuf {
                o.rbuf_size = ring(v);
            }
            if let Some(v) = p.sndbuf {
                o.sbuf_size = ring(v);
            }
            if let Some(k) = p.keepalive {
                o.keepalive = k;
            }
            if let Some(n) = p.iomap_size {
                o.iomap_size = n;
            }
            if let Some(name) = p.congestion {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                // The kernel took the name on the TCP socket already
                // (the caller notes it only then), so it parses.
                if let Some(cc) = std::str::from_utf8(&name[..end])
                    .ok()
                    .and_then(|n| n.parse().ok())
                {
                    o.congestion = Some(cc);
                }
            }
        }
    }
    o
}

/// Descriptors that are streams now (for diagnostics and tests).
pub fn taken() -> Vec<RawFd> {
    TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .copied()
        .collect()
}
