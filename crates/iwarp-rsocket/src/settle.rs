//! Making deferred accepts streams off the program's threads (issue 26,
//! item 1: one client must never stall the program).
//!
//! An accepted connection waits for its first use (`table`, "Accepts wait
//! for their first use"). The MPA exchange it then needs waits on the
//! remote peer: for the rest of the MPA Request (RFC 5044 §7.1: the
//! Request is the 16-byte key, 4 bytes of flags, revision and length,
//! then up to 512 bytes of private data), and, for an accept whose first
//! bytes had not arrived at `accept` (*undecided*), for those first bytes.
//! A client that sends the key and then nothing holds that wait for its
//! whole timeout. So no program thread ever waits for it here:
//!
//! - **The first use starts a job** ([`begin`]) and the descriptor number
//!   (and its copies) is replaced by a *placeholder*: one end of an
//!   `AF_UNIX` socket pair that shows neither readable nor writable, as a
//!   TCP socket in its handshake. A non-blocking call then gets `EAGAIN`;
//!   a blocking call waits for the job ([`settle`], on its own thread,
//!   like a blocking read waits for data), holding no lock.
//! - **One thread per process** (the *watcher*) drives every job: it
//!   polls each job's private copy of the TCP socket, with `SO_RCVLOWAT`
//!   set to the bytes the next decision needs (socket(7): poll reports
//!   readable only from that many bytes), so a client that stalls costs a
//!   slot in its poll set and a deadline, never a thread. Once the whole
//!   Request has arrived (`MSG_PEEK`), the exchange itself is local work
//!   (read those bytes, send the Reply, set up the queue pair) and runs
//!   there. An undecided job whose bytes turn out to be plain, or that
//!   gets none within `peek` of its accept, gives the numbers their TCP
//!   socket back.
//! - **The end of a job** puts the stream's readiness descriptor (or a
//!   closed connection, if the exchange failed) on the numbers, and closes
//!   our end of the placeholder, so a `poll`/`select` that was sleeping on
//!   the placeholder wakes up (`POLLHUP`) and looks again.
//! - **epoll**: a registration belongs to the open file, not to the number
//!   (epoll(7), "Questions and answers": a descriptor replaced by `dup2`
//!   leaves the registration on the old file), so the `epoll_ctl` calls the
//!   program makes on a number in this state are recorded ([`epoll_ctl`]),
//!   and each replacement deletes them before the `dup2` and adds them
//!   again, with the program's events and data, after it. An `EPOLLET`
//!   registration added on a ready file reports it once (epoll's insert
//!   polls the file).
//! - **Bounds**: at most [`Settings::max_pending`] MPA accepts wait for
//!   their first use or their exchange at once (`IWARP_PRELOAD_MAX_PENDING`);
//!   beyond, a new MPA client is closed at `accept` (its client falls back
//!   to plain TCP) and a warning says so. Threads: one per process.
//!
//! Numbers are claimed by a job (the claims below) and changed only while
//! claimed; `close`, `dup2` onto a number and `close_range` drop the claim
//! first ([`forget`]), so a job never replaces a descriptor the program has
//! closed and reused (issue 26, item 2).

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use iwarp_sockets::{Listener, Options, Stream};

use crate::attach::{classify_first_bytes, dead_end, fd_flags, may_accept, FirstBytes};
use crate::real::real;
use crate::table::{self, Inside};

/// The MPA frame header: key, flags, revision, private data length (RFC
/// 5044 §7.1).
const MPA_HEADER: usize = 20;
/// The longest MPA Request: the header and 512 bytes of private data.
const MPA_MAX_REQUEST: usize = MPA_HEADER + 512;

/// How deferred accepts are decided and bounded.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How long an undecided accept waits for its client's first bytes
    /// before it is plain TCP (`IWARP_PRELOAD_PEEK_MS`).
    pub peek: Duration,
    /// How long an MPA accept may wait for its first use before its
    /// exchange starts anyway (`IWARP_PRELOAD_SETTLE_MS`).
    pub settle_after: Duration,
    /// At most this many MPA accepts wait for their first use or their
    /// exchange at once (`IWARP_PRELOAD_MAX_PENDING`).
    pub max_pending: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            peek: Duration::from_millis(1000),
            settle_after: Duration::from_millis(300),
            max_pending: 64,
        }
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Sets the [`Settings`] (once, before the first accept; later calls are
/// ignored).
pub fn configure(s: Settings) {
    let _ = SETTINGS.set(s);
}

/// The settings in force.
pub fn settings() -> Settings {
    *SETTINGS.get_or_init(Settings::default)
}

/// Records one decision: `(how, peer, why)` with `how` one of `iwarp`,
/// `plain`, `refused` (the preload's `IWARP_PRELOAD_STATS`).
pub type Reporter = fn(&str, Option<SocketAddr>, &str);
static REPORTER: OnceLock<Reporter> = OnceLock::new();

/// Sets where decisions taken here are recorded.
pub fn set_reporter(f: Reporter) {
    let _ = REPORTER.set(f);
}

fn report(how: &str, peer: Option<SocketAddr>, why: &str) {
    match REPORTER.get() {
        Some(f) => f(how, peer, why),
        None => tracing::info!(how, ?peer, why, "accept"),
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Undecided: waiting for the first bytes until then.
    Classify { until: Instant },
    /// An MPA client: waiting for the rest of its Request until then.
    Request { until: Instant },
    /// The Request is complete; the exchange runs (no more waiting).
    Exchange,
}

/// One accepted connection being made a stream.
struct Job {
    pid: u32,
    /// The first number (made the stream first; the others are copies).
    first: RawFd,
    /// Private copy of the TCP socket for the exchange (taken by it).
    tcp: Option<TcpStream>,
    /// Private copy for name and option calls meanwhile, and to give the
    /// numbers their socket back.
    names: OwnedFd,
    /// Our end of the placeholder: writing to it or closing it wakes
    /// pollers of the other (see [`Kick`]).
    ctl: Option<OwnedFd>,
    base: Options,
    phase: Phase,
    peer: Option<SocketAddr>,
    waiters: usize,
    /// Why this process could not accept MPA clients as streams when the
    /// job began (`attach::may_accept`), for an undecided job: its bytes
    /// still decide, and an MPA client is then refused. Taken at `begin`,
    /// not later: a job begun while this process could accept goes on (a
    /// child that learns of it since must not take its parent's stream).
    refuse_mpa: Option<String>,
}

impl Job {
    fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Classify { until } | Phase::Request { until } => Some(until),
            Phase::Exchange => None,
        }
    }
}

/// A `poll`/`select` that was sleeping on a placeholder when its number
/// was replaced: the kernel looks the numbers up again at each wake-up,
/// but waits only on the files it saw in its first pass (fs/select.c
/// registers wait queues in the first pass only). So after a replacement
/// the placeholder is woken once at once (a byte written to our end:
/// pollers of `POLLOUT` see the new file writable), and again, by closing
/// our end, when the new file shows input (`watch`, a copy of it, polls
/// readable or hung up): pollers of `POLLIN` then see it readable.
struct Kick {
    number: RawFd,
    _ctl: OwnedFd,
    watch: OwnedFd,
}

#[derive(Default)]
struct State {
    /// Descriptor number -> the job that claimed it.
    claims: BTreeMap<RawFd, u64>,
    jobs: BTreeMap<u64, Job>,
    /// Jobs that failed, for their waiters: why, and waiters still to read it.
    failed: BTreeMap<u64, (String, usize)>,
    /// The program's epoll registrations of claimed (or deferred) numbers:
    /// number -> (epoll descriptor, event).
    regs: BTreeMap<RawFd, Vec<(RawFd, libc::epoll_event)>>,
    kicks: Vec<Kick>,
}

static STATE: Mutex<State> = Mutex::new(State {
    claims: BTreeMap::new(),
    jobs: BTreeMap::new(),
    failed: BTreeMap::new(),
    regs: BTreeMap::new(),
    kicks: Vec::new(),
});

/// After number `d` was given its final file: wakes pollers of the
/// placeholder `ctl` now, and keeps it to wake them again once `d`'s
/// file shows input ([`Kick`]).
fn kick(st: &mut State, d: RawFd, ctl: Option<OwnedFd>) {
    let Some(ctl) = ctl else { return };
    let r = real();
    // SAFETY: plain descriptor calls on our descriptors.
    unsafe { (r.write)(ctl.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    // SAFETY: plain descriptor call; the copy is ours.
    let w = unsafe { (r.fcntl)(d, libc::F_DUPFD_CLOEXEC, 0) };
    if w < 0 {
        return; // dropping `ctl` wakes them once more
    }
    // SAFETY: a descriptor we just made.
    let watch = unsafe { OwnedFd::from_raw_fd(w) };
    if st.kicks.len() >= 4096 {
        st.kicks.remove(0);
    }
    set(&KICKED, d, true);
    st.kicks.push(Kick {
        number: d,
        _ctl: ctl,
        watch,
    });
}
/// Signalled when a job ends.
static SETTLED: Condvar = Condvar::new();
static NEXT_JOB: AtomicU64 = AtomicU64::new(1);

/// One bit per number: claimed (a copy of the claims' keys, so that
/// [`is_settling`] is one atomic load and never waits for the lock: it is
/// asked on every call on every descriptor, by the socket library's own
/// threads too, which hold their connection's lock then).
static CLAIMED: [AtomicU64; table::MAX_FD / 64] = [const { AtomicU64::new(0) }; table::MAX_FD / 64];
/// One bit per number: an epoll descriptor holding recorded registrations
/// (so that closing it forgets them).
static EPOLLS: [AtomicU64; table::MAX_FD / 64] = [const { AtomicU64::new(0) }; table::MAX_FD / 64];
/// One bit per number with a [`Kick`] (so that closing it drops the kick).
static KICKED: [AtomicU64; table::MAX_FD / 64] = [const { AtomicU64::new(0) }; table::MAX_FD / 64];

fn bit(map: &'static [AtomicU64], fd: RawFd) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < table::MAX_FD)?;
    Some((&map[i / 64], 1u64 << (i % 64)))
}

fn test(map: &'static [AtomicU64], fd: RawFd) -> bool {
    bit(map, fd).is_some_and(|(w, b)| w.load(Ordering::Acquire) & b != 0)
}

fn set(map: &'static [AtomicU64], fd: RawFd, on: bool) {
    if let Some((w, b)) = bit(map, fd) {
        if on {
            w.fetch_or(b, Ordering::AcqRel);
        } else {
            w.fetch_and(!b, Ordering::AcqRel);
        }
    }
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn claim(st: &mut State, fd: RawFd, id: u64) {
    st.claims.insert(fd, id);
    set(&CLAIMED, fd, true);
}

fn unclaim(st: &mut State, fd: RawFd) {
    st.claims.remove(&fd);
    set(&CLAIMED, fd, false);
}

fn numbers_of(st: &State, id: u64) -> Vec<RawFd> {
    st.claims
        .iter()
        .filter(|&(_, &i)| i == id)
        .map(|(&d, _)| d)
        .collect()
}

fn pid() -> u32 {
    std::process::id()
}

/// Whether a job of this process claims `fd` (calls on it wait for the job
/// or get `EAGAIN`).
pub fn is_settling(fd: RawFd) -> bool {
    test(&CLAIMED, fd)
}

/// Keeps jobs from changing any descriptor while held: a call that the
/// TCP socket answers (`getpeername`, ...) holds it. Never held across a
/// wait on a peer.
pub fn hold_settles() -> SettlesHeld {
    SettlesHeld(state())
}

/// While alive, no job changes a descriptor ([`hold_settles`]).
pub struct SettlesHeld(MutexGuard<'static, State>);

impl std::fmt::Debug for SettlesHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SettlesHeld")
    }
}

impl SettlesHeld {
    /// The descriptor that answers name and option calls for `fd`: the
    /// TCP socket's private copy while a job of this process has replaced
    /// `fd` by its placeholder, else `fd` itself.
    pub fn tcp_of(&self, fd: RawFd) -> RawFd {
        self.0
            .claims
            .get(&fd)
            .and_then(|id| self.0.jobs.get(id))
            .filter(|j| j.pid == pid())
            .map_or(fd, |j| j.names.as_raw_fd())
    }
}

/// `fd` is being closed or replaced (`close`, `dup2`/`dup3` onto it,
/// `close_range`): forgets its deferred entry, its recorded epoll
/// registrations (and those recorded in it, if it is an epoll
/// descriptor), and drops a job's claim on it, atomically with respect to
/// jobs, so that no job changes the number afterwards. Call before the
/// real call.
pub fn forget(first: RawFd, last: RawFd) {
    // The common case without the lock (the socket library's own threads
    // close descriptors through here while they hold a connection's
    // lock): the deferred bit first, then the claim bit (see `begin`).
    if first == last
        && !table::is_deferred(first)
        && !is_settling(first)
        && !test(&EPOLLS, first)
        && !test(&KICKED, first)
    {
        table::forget(first, last);
        return;
    }
    let mut st = state();
    table::forget(first, last);
    if first > last {
        return;
    }
    let gone: Vec<RawFd> = st.claims.range(first..=last).map(|(fd, _)| *fd).collect();
    for fd in gone {
        unclaim(&mut st, fd);
    }
    let gone: Vec<RawFd> = st.regs.range(first..=last).map(|(fd, _)| *fd).collect();
    for fd in gone {
        st.regs.remove(&fd);
    }
    st.kicks.retain(|k| !(first..=last).contains(&k.number));
    for fd in first..=last.min(first.saturating_add(4096)) {
        set(&KICKED, fd, false);
    }
    for ep in first..=last.min(table::MAX_FD as RawFd - 1) {
        if test(&EPOLLS, ep) {
            set(&EPOLLS, ep, false);
            for v in st.regs.values_mut() {
                v.retain(|(e, _)| *e != ep);
            }
        }
        if last - first > 4096 && ep - first > 4096 {
            // close_range over a huge range: epoll descriptors beyond the
            // first 4096 numbers keep stale entries, harmless (only used
            // with the number they name, which the lookups check).
            break;
        }
    }
}

/// `call` makes `new` a copy of the deferred or settling descriptor `old`
/// (`dup`, `dup2`, `F_DUPFD`): returns its result, with `new` deferred
/// with `old` (`table::defer_copy`), or claimed by the same job, so the
/// job makes it a copy of the stream too. `None` when `old` is neither.
pub fn copy_waiting(old: RawFd, call: impl FnOnce() -> libc::c_int) -> Option<libc::c_int> {
    let mut st = state();
    let settling = st.claims.get(&old).copied();
    if settling.is_none() && !table::is_deferred(old) {
        return None;
    }
    let rc = call();
    if rc >= 0 && rc != old {
        match settling {
            Some(id) => claim(&mut st, rc, id),
            None => table::defer_copy(old, rc),
        }
    }
    Some(rc)
}

/// The program's `epoll_ctl(epfd, op, fd, ev)` on a number a job claims:
/// made, and recorded so that the job's replacements of the number keep
/// it. `None` when `fd` is not claimed (the caller makes the plain call).
///
/// # Safety
/// `ev` as for epoll_ctl(2).
pub unsafe fn epoll_ctl(
    epfd: RawFd,
    op: libc::c_int,
    fd: RawFd,
    ev: *mut libc::epoll_event,
) -> Option<libc::c_int> {
    if !is_settling(fd) {
        return None;
    }
    let mut st = state();
    if !st.claims.contains_key(&fd) {
        return None;
    }
    // SAFETY: the caller's arguments, passed through.
    let rc = unsafe { (real().epoll_ctl)(epfd, op, fd, ev) };
    if rc == 0 {
        let v = st.regs.entry(fd).or_default();
        v.retain(|(e, _)| *e != epfd);
        if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
            // SAFETY: the caller's promise: `ev` is valid for reads.
            v.push((epfd, unsafe { std::ptr::read_unaligned(ev) }));
            set(&EPOLLS, epfd, true);
        }
    }
    Some(rc)
}

/// Replaces what number `d` refers to by `with` (a `dup2`), keeping its
/// close-on-exec flag and the program's epoll registrations of it.
fn replace(st: &State, d: RawFd, with: impl FnOnce(RawFd) -> bool) {
    let r = real();
    let regs = st.regs.get(&d).cloned().unwrap_or_default();
    for (ep, _) in &regs {
        // SAFETY: plain descriptor call; DEL ignores the event.
        unsafe { (r.epoll_ctl)(*ep, libc::EPOLL_CTL_DEL, d, std::ptr::null_mut()) };
    }
    let cloexec = fd_flags(d).1;
    if with(d) && cloexec {
        // SAFETY: plain descriptor call on the number just replaced.
        unsafe { (r.fcntl)(d, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    }
    for (ep, ev) in &regs {
        let mut e = *ev;
        // SAFETY: `e` is a valid event for the duration of the call.
        unsafe { (r.epoll_ctl)(*ep, libc::EPOLL_CTL_ADD, d, &mut e) };
    }
}

/// `dup2(from, d)` for [`replace`].
fn dup2_onto(from: RawFd) -> impl FnOnce(RawFd) -> bool {
    move |d| {
        // SAFETY: plain descriptor call onto a number a job claims.
        unsafe { (real().dup2)(from, d) >= 0 }
    }
}

/// A socket pair end that polls as neither readable nor writable (its
/// send buffer is filled) for as long as the other end is open; then it
/// polls as a closed connection.
fn placeholder(nonblocking: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let r = real();
    let mut pair = [-1; 2];
    // SAFETY: `pair` has room for two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            pair.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two descriptors just made and owned by nobody else.
    let (app, ctl) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let one: libc::c_int = 1;
    let junk = [0u8; 512];
    // SAFETY: plain calls on our descriptors with valid buffers; the
    // kernel raises SO_SNDBUF to its minimum, a few writes fill it.
    unsafe {
        (r.setsockopt)(
            app.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        for _ in 0..256 {
            if (r.write)(app.as_raw_fd(), junk.as_ptr().cast(), junk.len()) < 0 {
                break;
            }
        }
        if !nonblocking {
            let fl = (r.fcntl)(app.as_raw_fd(), libc::F_GETFL, 0);
            (r.fcntl)(
                app.as_raw_fd(),
                libc::F_SETFL,
                (fl & !libc::O_NONBLOCK) as libc::c_ulong,
            );
        }
    }
    Ok((app, ctl))
}

/// Sets `SO_RCVLOWAT` (socket(7): `poll` reports the socket readable from
/// that many bytes, or at end of stream).
fn set_lowat(fd: RawFd, n: usize) {
    let v = n.clamp(1, MPA_MAX_REQUEST) as libc::c_int;
    // SAFETY: a valid int option.
    unsafe {
        (real().setsockopt)(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Peeks (without waiting) at up to [`MPA_MAX_REQUEST`] bytes: `Some(n)`
/// (0: end of stream), `None` when nothing is there or on an error.
fn peek(fd: RawFd, buf: &mut [u8; MPA_MAX_REQUEST]) -> Option<usize> {
    // SAFETY: `buf` is valid for its length.
    let n = unsafe {
        (real().recv)(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).ok()
}

/// What the first bytes of `fd` say now, without waiting (end of stream
/// and errors: [`FirstBytes::Plain`]: the program gets what TCP says).
pub fn first_bytes(fd: RawFd) -> FirstBytes {
    let mut buf = [0u8; MPA_MAX_REQUEST];
    // SAFETY: `buf` is valid for 16 bytes.
    let n = unsafe {
        (real().recv)(
            fd,
            buf.as_mut_ptr().cast(),
            16,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => FirstBytes::Plain,
        n if n > 0 => classify_first_bytes(&buf[..n as usize]),
        _ => match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => FirstBytes::NeedMore,
            _ => FirstBytes::Plain,
        },
    }
}

fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&mut st as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `st` is valid for `len` bytes.
    if unsafe { (real().getpeername)(fd, p, &mut len) } != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes.
    unsafe { crate::ops::read_addr(p, len) }
}

/// MPA accepts waiting for their first use or their exchange.
pub fn pending() -> usize {
    table::count_deferred_mpa()
        + state()
            .jobs
            .values()
            .filter(|j| !matches!(j.phase, Phase::Classify { .. }))
            .count()
}

/// Whether one more MPA accept may wait (see [`Settings::max_pending`]);
/// logs (at most once a second) when not.
pub fn room_for_one_more() -> bool {
    let max = settings().max_pending;
    if pending() < max {
        return true;
    }
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        *last = Some(Instant::now());
        tracing::warn!(
            max,
            "{max} MPA clients already wait for their exchange (IWARP_PRELOAD_MAX_PENDING): new \
             MPA clients are closed at accept and fall back to plain TCP; raise the limit if \
             this is legitimate load, otherwise clients that stall their MPA exchange are \
             arriving"
        );
    }
    false
}

/// Starts making the deferred accept `fd` (and its deferred copies) a
/// stream, off this thread: `fd` and its copies become the placeholder
/// (see the module doc) until the job ends. `Ok(Some(id))`: a job (new or
/// already running) claims `fd`; `Ok(None)`: nothing to do (not deferred,
/// or an undecided accept whose first bytes are plain: it is plain TCP
/// now); `Err`: `fd` is a closed connection now.
pub fn begin(fd: RawFd) -> io::Result<Option<u64>> {
    begin_as(fd, false)
}

/// [`begin`]; with `waiter`, the caller will [`wait_for`] the job (so its
/// failure is kept for it).
fn begin_as(fd: RawFd, waiter: bool) -> io::Result<Option<u64>> {
    let _inside = Inside::enter();
    let mut st = state();
    if let Some(&id) = st.claims.get(&fd) {
        if st.jobs.get(&id).is_some_and(|j| j.pid != pid()) {
            // A job of the parent (fork): the stream will be the parent's,
            // as one made before the fork is (`table`, "fork"): this
            // process cannot drive it, and the parent learns that its
            // children serve its connections.
            table::note_inherited_use();
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this connection's MPA exchange was started by the parent process before fork; \
                 only the parent can use it (close it in the child)",
            ));
        }
        if let Some(j) = st.jobs.get_mut(&id).filter(|_| waiter) {
            j.waiters += 1;
        }
        return Ok(Some(id));
    }
    if !table::is_deferred(fd) {
        return Ok(None);
    }
    let siblings = table::deferred_siblings(fd);
    let id = NEXT_JOB.fetch_add(1, Ordering::Relaxed);
    // The claim bit goes up before the deferred bit comes down, so a
    // `close` that tests them in the other order without the lock
    // (`forget`) always sees one of them.
    claim(&mut st, fd, id);
    let Some((base, since, undecided)) = table::take_deferred_entry(fd) else {
        unclaim(&mut st, fd);
        return Ok(None);
    };
    let mut numbers = vec![fd];
    for d in siblings {
        claim(&mut st, d, id);
        if table::take_deferred(d).is_some() {
            numbers.push(d);
        } else {
            unclaim(&mut st, d);
        }
    }
    let peer = peer_of(fd);
    let fail_now = |st: &mut State, e: io::Error| {
        for &d in &numbers {
            unclaim(st, d);
            replace(st, d, |d| {
                dead_end(d);
                true
            });
        }
        Err(e)
    };
    let now = Instant::now();
    let s = settings();
    let phase = match (undecided, first_bytes(fd)) {
        (true, FirstBytes::Plain) => {
            for &d in &numbers {
                unclaim(&mut st, d);
            }
            report("plain", peer, "");
            return Ok(None);
        }
        // Not decided plain because this process cannot make streams: the
        // bytes decide (an MPA client is refused below, in `step`, so that
        // the program never writes plain bytes to an MPA client).
        (true, FirstBytes::NeedMore) if now >= since + s.peek => {
            for &d in &numbers {
                unclaim(&mut st, d);
            }
            report(
                "plain",
                peer,
                "(no first bytes within IWARP_PRELOAD_PEEK_MS)",
            );
            return Ok(None);
        }
        (true, FirstBytes::NeedMore) => Phase::Classify {
            until: since + s.peek,
        },
        (false, FirstBytes::Mpa) => Phase::Request {
            until: now + base.connect_timeout,
        },
        (true, FirstBytes::Mpa) => {
            drop(st);
            let room = room_for_one_more();
            st = state();
            if !room {
                report(
                    "refused",
                    peer,
                    "(MPA Request, but IWARP_PRELOAD_MAX_PENDING MPA clients already wait; \
                     closed, the client falls back)",
                );
                return fail_now(
                    &mut st,
                    io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "too many pending MPA clients",
                    ),
                );
            }
            report("iwarp", peer, "");
            Phase::Request {
                until: now + base.connect_timeout,
            }
        }
        (false, _) => {
            // Another process (a parent or a child sharing the
            // connection) read the Request and made the connection its
            // stream: this descriptor must not read that stream's bytes.
            return fail_now(
                &mut st,
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "another process made this connection its iWARP stream (it was shared through fork)",
                ),
            );
        }
    };
    let refuse_mpa = match (may_accept(), phase) {
        (Err(e), Phase::Request { .. }) => return fail_now(&mut st, e),
        (r, _) => r.err().map(|e| e.to_string()),
    };
    // Before the placeholder goes in: a child forked from now on shares
    // the page through which it tells this process it used the stream.
    table::note_stream();
    let r = real();
    let nonblocking = fd_flags(fd).0;
    // SAFETY: plain descriptor calls; the copies are ours (close-on-exec).
    let (tcp, names) = unsafe {
        (
            (r.fcntl)(fd, libc::F_DUPFD_CLOEXEC, 0),
            (r.fcntl)(fd, libc::F_DUPFD_CLOEXEC, 0),
        )
    };
    let made = if tcp < 0 || names < 0 {
        Err(io::Error::last_os_error())
    } else {
        placeholder(nonblocking)
    };
    // SAFETY: descriptors we just made (or -1, not wrapped).
    let (tcp, names) = unsafe {
        (
            (tcp >= 0).then(|| TcpStream::from_raw_fd(tcp)),
            (names >= 0).then(|| OwnedFd::from_raw_fd(names)),
        )
    };
    let (app, ctl, tcp, names) = match (made, tcp, names) {
        (Ok((app, ctl)), Some(t), Some(n)) => (app, ctl, t, n),
        (made, _, _) => {
            let e = made.err().unwrap_or_else(io::Error::last_os_error);
            report(
                "refused",
                peer,
                &format!("(MPA accept: {e}; closed, the client falls back)"),
            );
            return fail_now(&mut st, e);
        }
    };
    for &d in &numbers {
        replace(&st, d, dup2_onto(app.as_raw_fd()));
    }
    drop(app);
    set_lowat(
        tcp.as_raw_fd(),
        match phase {
            Phase::Classify { .. } => 1,
            _ => MPA_HEADER,
        },
    );
    tracing::debug!(fd, id, ?phase, numbers = ?numbers, "MPA accept: job begins");
    st.jobs.insert(
        id,
        Job {
            pid: pid(),
            first: fd,
            tcp: Some(tcp),
            names,
            ctl: Some(ctl),
            base,
            phase,
            peer,
            waiters: usize::from(waiter),
            refuse_mpa,
        },
    );
    drop(st);
    ensure_watcher();
    wake();
    Ok(Some(id))
}

/// Waits (on this thread, holding no lock) until the job `id` that claims
/// `fd` ended: `Ok` when `fd` is the stream or plain TCP, `Err` when the
/// exchange failed (`fd` is a closed connection). The job counts this
/// waiter already (`begin_as`).
fn wait_for(fd: RawFd, id: u64) -> io::Result<()> {
    let s = settings();
    let mut st = state();
    let limit = match st.jobs.get(&id) {
        None => return take_failure(&mut st, id),
        // A bound in case the watcher is gone (it never should be).
        Some(j) => Instant::now() + s.peek + j.base.connect_timeout + Duration::from_secs(2),
    };
    while st.jobs.contains_key(&id) {
        let left = limit.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("descriptor {fd}: the MPA exchange did not end in time"),
            ));
        }
        st = SETTLED
            .wait_timeout(st, left.min(Duration::from_secs(1)))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    take_failure(&mut st, id)
}

fn take_failure(st: &mut State, id: u64) -> io::Result<()> {
    let Some((why, left)) = st.failed.get_mut(&id) else {
        return Ok(());
    };
    let e = io::Error::new(io::ErrorKind::ConnectionReset, why.clone());
    *left -= 1;
    if *left == 0 {
        st.failed.remove(&id);
    }
    Err(e)
}

/// Makes the deferred connection `fd` a stream now and waits for it (see
/// [`begin`], `wait_for`): the descriptor's `O_NONBLOCK` and
/// close-on-exec flags and the socket options set meanwhile apply. Its
/// deferred copies ([`table::deferred_siblings`]) become copies of the
/// stream. Does nothing if `fd` is not deferred (any more). If the stream
/// cannot be made, or the MPA Request is gone (another process sharing
/// the connection made it its stream), `fd` and its copies become closed
/// connections (reads see end of stream, writes `EPIPE`) and the error is
/// returned.
pub fn settle(fd: RawFd) -> io::Result<()> {
    match begin_as(fd, true)? {
        Some(id) => wait_for(fd, id),
        None => Ok(()),
    }
}

/// Ends job `id`: the stream on its numbers, or a closed connection.
fn finish(st: &mut State, id: u64, made: io::Result<Stream>) {
    let Some(job) = st.jobs.remove(&id) else {
        return;
    };
    let mut mine = numbers_of(st, id);
    if let Some(i) = mine.iter().position(|&d| d == job.first) {
        mine.swap(0, i);
    }
    for &d in &mine {
        unclaim(st, d);
    }
    let failed: Option<String> = match made {
        Ok(_) if mine.is_empty() => None, // closed meanwhile: dropped
        Ok(stream) => {
            let first = mine[0];
            let _ = stream.set_nonblocking(fd_flags(first).0);
            let mut err = None;
            replace(st, first, |d| {
                let cloexec = fd_flags(d).1;
                match table::install(d, stream, cloexec) {
                    Ok(()) => false, // `install` kept the flag
                    Err(e) => {
                        dead_end(d);
                        err = Some(e);
                        true
                    }
                }
            });
            for &d in &mine[1..] {
                replace(st, d, |d| {
                    if err.is_none() && dup2_onto(first)(d) {
                        table::duplicated(first, d);
                    } else {
                        dead_end(d);
                    }
                    true
                });
            }
            err.map(|e| format!("the stream could not take descriptor {first}: {e}"))
        }
        Err(e) => {
            for &d in &mine {
                replace(st, d, |d| {
                    dead_end(d);
                    true
                });
            }
            Some(e.to_string())
        }
    };
    if let Some(why) = &failed {
        let why = why.clone();
        tracing::debug!(fd = job.first, %why, "MPA accept failed");
        report(
            "refused",
            job.peer,
            &format!(
                "(MPA Request, but the iWARP accept failed: {why}; closed, the client falls back)"
            )
            .replace('\n', " "),
        );
        if job.waiters > 0 {
            st.failed.insert(id, (why, job.waiters));
        }
    }
    for &d in &mine {
        st.regs.remove(&d);
    }
    let mut job = job;
    match mine.first() {
        Some(&d) if failed.is_none() => kick(st, d, job.ctl.take()),
        _ => {} // a closed connection polls readable: dropping `ctl` is enough
    }
    drop(job); // closes our copies (and the placeholder's other end)
    SETTLED.notify_all();
}

/// Ends the undecided job `id` as plain TCP: its numbers get their socket
/// back, with the `O_NONBLOCK` the program set meanwhile.
fn revert(st: &mut State, id: u64, why: &str) {
    let Some(job) = st.jobs.remove(&id) else {
        return;
    };
    let mut job = job;
    let r = real();
    let tcp = job.names.as_raw_fd();
    set_lowat(tcp, 1);
    let numbers = numbers_of(st, id);
    for &d in &numbers {
        unclaim(st, d);
        let nonblocking = fd_flags(d).0;
        replace(st, d, dup2_onto(tcp));
        // SAFETY: plain descriptor calls on the socket just put back.
        unsafe {
            let fl = (r.fcntl)(d, libc::F_GETFL, 0);
            let fl = if nonblocking {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            (r.fcntl)(d, libc::F_SETFL, fl as libc::c_ulong);
        }
        st.regs.remove(&d);
    }
    if let Some(&d) = numbers.first() {
        kick(st, d, job.ctl.take());
    }
    report("plain", job.peer, why);
    drop(job);
    SETTLED.notify_all();
}

/// Looks at job `id` again (its socket polled readable, or its deadline
/// passed).
fn step(id: u64) {
    let mut st = state();
    loop {
        let Some(job) = st.jobs.get_mut(&id) else {
            return;
        };
        if job.pid != pid() {
            return;
        }
        let Some(tcp) = job.tcp.as_ref().map(|t| t.as_raw_fd()) else {
            return;
        };
        if !st.claims.values().any(|&i| i == id) {
            // Every number was closed: drop the connection.
            st.jobs.remove(&id);
            SETTLED.notify_all();
            return;
        }
        let (phase, connect_timeout, peer) = match st.jobs.get(&id) {
            Some(j) => (j.phase, j.base.connect_timeout, j.peer),
            None => return,
        };
        let now = Instant::now();
        let mut buf = [0u8; MPA_MAX_REQUEST];
        let got = peek(tcp, &mut buf);
        match phase {
            Phase::Classify { until } => match got.map(|n| (n, classify_first_bytes(&buf[..n]))) {
                Some((0, _)) | Some((_, FirstBytes::Plain)) => {
                    return revert(&mut st, id, "");
                }
                Some((_, FirstBytes::Mpa)) => {
                    if let Some(why) = st.jobs.get(&id).and_then(|j| j.refuse_mpa.clone()) {
                        return finish(&mut st, id, Err(io::Error::other(why)));
                    }
                    drop(st);
                    let room = room_for_one_more();
                    st = state();
                    if !room {
                        return finish(
                            &mut st,
                            id,
                            Err(io::Error::other(
                                "IWARP_PRELOAD_MAX_PENDING MPA clients already wait",
                            )),
                        );
                    }
                    report("iwarp", peer, "");
                    if let Some(job) = st.jobs.get_mut(&id) {
                        job.phase = Phase::Request {
                            until: now + connect_timeout,
                        };
                    }
                    continue;
                }
                _ if now >= until => {
                    return revert(&mut st, id, "(no first bytes within IWARP_PRELOAD_PEEK_MS)");
                }
                r => set_lowat(tcp, r.map_or(1, |(n, _)| n + 1)),
            },
            Phase::Request { until } => {
                let need = match got {
                    Some(0) => {
                        return finish(
                            &mut st,
                            id,
                            Err(io::Error::new(
                                io::ErrorKind::ConnectionReset,
                                "the client closed before its MPA Request was complete",
                            )),
                        );
                    }
                    Some(n) if n >= MPA_HEADER => {
                        // A bad header: the exchange reads it and fails at
                        // once (RFC 5044 §7.1.1).
                        iwarp_proto::handshake::frame_len(&buf[..n]).unwrap_or(MPA_HEADER)
                    }
                    _ => MPA_HEADER,
                };
                if got.is_some_and(|n| n >= need) {
                    return exchange(st, id);
                }
                if now >= until {
                    return finish(
                        &mut st,
                        id,
                        Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "the MPA Request was not complete within {connect_timeout:?} (a \
                                 client that stalls its exchange)"
                            ),
                        )),
                    );
                }
                set_lowat(tcp, need);
            }
            Phase::Exchange => {}
        }
        return;
    }
}

/// The Request of job `id` is all there: the exchange (local work: read
/// it, send the Reply, set up the queue pair), without the lock, then the
/// stream on the numbers still claimed.
fn exchange(mut st: MutexGuard<'static, State>, id: u64) {
    let Some(job) = st.jobs.get_mut(&id) else {
        return;
    };
    job.phase = Phase::Exchange;
    let Some(tcp) = job.tcp.take() else {
        return;
    };
    let first = job.first;
    let base = job.base.clone();
    drop(st);
    set_lowat(tcp.as_raw_fd(), 1);
    let opts = table::options_for(first, &base);
    // No `may_accept` again: the job began when this process could accept
    // (a child that learned since must not take its parent's stream).
    let made = Listener::accept_tcp(tcp, &opts);
    let mut st = state();
    finish(&mut st, id, made);
}

/// The pid whose watcher runs (0: none); a child inherits the value, not
/// the thread.
static WATCHER: AtomicI32 = AtomicI32::new(0);
/// The watcher's wake-up eventfd (-1: none).
static WAKE: AtomicI32 = AtomicI32::new(-1);

fn wake() {
    let fd = WAKE.load(Ordering::Acquire);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 valid bytes to our eventfd.
        unsafe { (real().write)(fd, one.as_ptr().cast(), one.len()) };
    }
}

type ForkGuards = (MutexGuard<'static, State>, crate::table::ForkGuards);

thread_local! {
    /// The locks taken before a `fork` (see [`ensure_watcher`]).
    static AT_FORK: std::cell::RefCell<Option<ForkGuards>> = const { std::cell::RefCell::new(None) };
}

extern "C" fn fork_prepare() {
    let g = (state(), crate::table::lock_for_fork());
    AT_FORK.with(|f| *f.borrow_mut() = Some(g));
}

extern "C" fn fork_release() {
    AT_FORK.with(|f| drop(f.borrow_mut().take()));
}

/// Makes sure this process has its watcher (see the module doc); it ends
/// when no job runs and no accept waits.
///
/// The watcher takes the job lock often; a `fork` while it held it would
/// leave the lock held forever in the child (only the forking thread
/// lives on there). So the fork handlers registered here take the job
/// lock and the table's before the fork and release them after, in
/// parent and child (pthread_atfork(3)).
pub fn ensure_watcher() {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registers plain functions without arguments; they only
        // take and release this library's locks, on the forking thread.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_release), Some(fork_release)) };
    });
    let me = pid() as i32;
    let cur = WATCHER.load(Ordering::Acquire);
    if cur == me
        || WATCHER
            .compare_exchange(cur, me, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    if cur != 0 || WAKE.load(Ordering::Acquire) < 0 {
        // A new process (fork), or the first watcher: its own eventfd.
        // SAFETY: plain call; the descriptor is ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        WAKE.store(fd, Ordering::Release);
    }
    tracing::debug!(me, "settle watcher starts");
    let spawned = std::thread::Builder::new()
        .name("iwarp-settle".into())
        .spawn(move || watch(me));
    if spawned.is_err() {
        WATCHER.store(0, Ordering::Release);
    }
}

fn watch(me: i32) {
    let _inside = Inside::enter();
    loop {
        let s = settings();
        let now = Instant::now();
        let (mut fds, ids, next) = {
            let st = state();
            let mut fds = vec![libc::pollfd {
                fd: WAKE.load(Ordering::Acquire),
                events: libc::POLLIN,
                revents: 0,
            }];
            let mut ids = Vec::new();
            let mut next: Option<Instant> = None;
            for (&id, j) in st.jobs.iter().filter(|(_, j)| j.pid == pid()) {
                let Some(t) = &j.tcp else { continue };
                fds.push(libc::pollfd {
                    fd: t.as_raw_fd(),
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                });
                ids.push(id);
                if let Some(d) = j.deadline() {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
            for k in &st.kicks {
                fds.push(libc::pollfd {
                    fd: k.watch.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            (fds, ids, next)
        };
        let tick = (s.settle_after / 4).clamp(Duration::from_millis(5), Duration::from_millis(50));
        let waiting = !table::none_deferred();
        let until = match (next, waiting) {
            (Some(n), true) => Some(n.min(now + tick)),
            (Some(n), false) => Some(n),
            (None, true) => Some(now + tick),
            (None, false) => None,
        };
        let kicks = fds.len() - 1 - ids.len();
        if ids.is_empty() && !waiting && kicks == 0 {
            WATCHER.store(0, Ordering::Release);
            // An accept deferred or a job begun meanwhile may have seen
            // this thread still running: take the job back unless another
            // thread did.
            let idle = {
                let st = state();
                st.jobs.values().all(|j| j.pid != pid()) && st.kicks.is_empty()
            } && table::none_deferred();
            if idle
                || WATCHER
                    .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                tracing::debug!(idle, "settle watcher ends");
                return;
            }
            continue;
        }
        let ms = until.map_or(1000, |u| {
            u.saturating_duration_since(now).as_millis().clamp(1, 1000) as libc::c_int
        });
        // SAFETY: `fds` is a valid array of pollfds for the call.
        unsafe { (real().poll)(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if fds[0].revents != 0 {
            let mut b = [0u8; 8];
            // SAFETY: reads 8 bytes into `b` from our eventfd.
            unsafe { (real().read)(fds[0].fd, b.as_mut_ptr().cast(), b.len()) };
        }
        if kicks > 0 {
            let ready: Vec<RawFd> = fds[1 + ids.len()..]
                .iter()
                .filter(|p| p.revents != 0)
                .map(|p| p.fd)
                .collect();
            if !ready.is_empty() {
                let mut st = state();
                st.kicks.retain(|k| {
                    let keep = !ready.contains(&k.watch.as_raw_fd());
                    if !keep {
                        set(&KICKED, k.number, false);
                    }
                    keep
                });
            }
        }
        let now = Instant::now();
        for (i, id) in ids.iter().enumerate() {
            let due = state()
                .jobs
                .get(id)
                .and_then(Job::deadline)
                .is_some_and(|d| now >= d);
            if fds[i + 1].revents != 0 || due {
                step(*id);
            }
        }
        // MPA accepts the program left alone: their client gives up on
        // its Reply after its connect timeout (1 s by default).
        for fd in table::deferred_older_than(s.settle_after) {
            let _ = begin(fd);
        }
        tick_undecided(s.peek);
    }
}

/// Undecided accepts the program has not used yet: decided as their bytes
/// arrive (or plain once `peek` passed without any).
fn tick_undecided(peek: Duration) {
    for (fd, since) in table::undecided() {
        // Under the lock: `close` forgets the entry under it first, so the
        // number is still the accepted socket while the entry is there.
        let st = state();
        if !table::is_undecided(fd) {
            continue;
        }
        match first_bytes(fd) {
            FirstBytes::Mpa => {
                let peer = peer_of(fd);
                let copies = table::deferred_siblings(fd);
                drop(st);
                let room = room_for_one_more();
                if room {
                    table::set_decided(fd);
                    for d in copies {
                        table::set_decided(d);
                    }
                    report("iwarp", peer, "");
                } else {
                    // Its job fails at once (over the bound): closed.
                    let _ = begin(fd);
                }
            }
            FirstBytes::Plain => {
                let peer = peer_of(fd);
                for d in std::iter::once(fd).chain(table::deferred_siblings(fd)) {
                    table::take_deferred(d);
                }
                drop(st);
                report("plain", peer, "");
            }
            FirstBytes::NeedMore if since.elapsed() >= peek => {
                let peer = peer_of(fd);
                for d in std::iter::once(fd).chain(table::deferred_siblings(fd)) {
                    table::take_deferred(d);
                }
                drop(st);
                report(
                    "plain",
                    peer,
                    "(no first bytes within IWARP_PRELOAD_PEEK_MS)",
                );
            }
            FirstBytes::NeedMore => {}
        }
    }
}
