//! The jobs themselves: `accept` starts one ([`begin`]), the first use of
//! the descriptor ([`settle`]) or the watcher thread finishes it, by the
//! MPA exchange into an iWARP stream or by reverting to plain TCP; the
//! watcher thread, its fork handlers, and the settle timer.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use iwarp_sockets::{Listener, Stream};

use super::config::{report, settings, MPA_HEADER, MPA_MAX_REQUEST};
use super::fds::{dup2_onto, first_bytes, peek, peer_of, placeholder, replace, set_lowat};
use super::state::{
    claim, kick, numbers_of, pid, set, state, unclaim, wake, Job, Phase, State, KICKED, NEXT_JOB,
    SETTLED, WAKE, WATCHER,
};
use crate::classify::{classify_first_bytes, FirstBytes};
use crate::fd::{dead_end, fd_flags};
use crate::real::real;
use crate::table::{self, may_accept, Inside, StreamSlot};

/// MPA accepts waiting for their first use or their exchange.
pub fn pending() -> usize {
    table::count_deferred_mpa()
        + state()
            .jobs
            .values()
            .filter(|j| !matches!(j.phase, Phase::Classify { .. }))
            .count()
}

/// Whether one more MPA accept may wait for its exchange: fewer than
/// [`Settings::max_pending`](crate::settle::Settings::max_pending) wait,
/// and the live streams and those waiting are fewer than
/// [`table::max_streams`] (each would become a stream). `Err` says which
/// bound is reached, naming its setting; a warning says so (at most once
/// a second).
pub fn room_for_one_more() -> Result<(), &'static str> {
    let max = settings().max_pending;
    let waiting = pending();
    let (why, warning) = if waiting >= max {
        (
            "IWARP_PRELOAD_MAX_PENDING MPA clients already wait for their exchange",
            format!(
                "{max} MPA clients already wait for their exchange (IWARP_PRELOAD_MAX_PENDING): \
                 new MPA clients are closed at accept and fall back to plain TCP; raise the \
                 limit if this is legitimate load, otherwise clients that stall their MPA \
                 exchange are arriving"
            ),
        )
    } else if table::live_streams() + waiting >= table::max_streams() {
        (
            "IWARP_PRELOAD_MAX_STREAMS iWARP streams are live or waiting",
            format!(
                "{} iWARP streams are live and {waiting} wait (IWARP_PRELOAD_MAX_STREAMS = {}): \
                 new MPA clients are closed at accept and fall back to plain TCP until streams \
                 close; raise the bound if this is legitimate load",
                table::live_streams(),
                table::max_streams()
            ),
        )
    } else {
        return Ok(());
    };
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        *last = Some(Instant::now());
        tracing::warn!("{warning}");
    }
    Err(why)
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
pub(super) fn begin_as(fd: RawFd, waiter: bool) -> io::Result<Option<u64>> {
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
            if let Err(e) = may_accept() {
                report(
                    "refused",
                    peer,
                    &format!("(MPA Request, but no iWARP accept here: {e}; closed, the client falls back)"),
                );
                // The program sees the connection reset (not EOPNOTSUPP:
                // this process never had the stream).
                return fail_now(&mut st, io::Error::new(io::ErrorKind::ConnectionReset, e));
            }
            drop(st);
            let room = room_for_one_more();
            st = state();
            if let Err(why) = room {
                report(
                    "refused",
                    peer,
                    &format!("(MPA Request, but {why}; closed, the client falls back)"),
                );
                return fail_now(
                    &mut st,
                    io::Error::new(io::ErrorKind::ConnectionRefused, why),
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
pub(super) fn wait_for(fd: RawFd, id: u64) -> io::Result<()> {
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

pub(super) fn take_failure(st: &mut State, id: u64) -> io::Result<()> {
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
pub(super) fn finish(st: &mut State, id: u64, made: io::Result<(Stream, StreamSlot)>) {
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
        Ok((stream, slot)) => {
            let first = mine[0];
            let _ = stream.set_nonblocking(fd_flags(first).0);
            let mut err = None;
            replace(st, first, |d| {
                let cloexec = fd_flags(d).1;
                match table::install(d, stream, slot, cloexec) {
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
pub(super) fn revert(st: &mut State, id: u64, why: &str) {
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
pub(super) fn step(id: u64) {
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
                    if let Err(why) = room {
                        return finish(&mut st, id, Err(io::Error::other(why)));
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
pub(super) fn exchange(mut st: MutexGuard<'static, State>, id: u64) {
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
    // (a child that learned since must not take its parent's stream). The
    // bound on streams holds here whatever was admitted before (a
    // `connect` may have taken the last place meanwhile): past it the
    // connection closes unanswered and the client falls back.
    let made = StreamSlot::reserve().and_then(|slot| Ok((Listener::accept_tcp(tcp, &opts)?, slot)));
    let mut st = state();
    finish(&mut st, id, made);
}

pub(super) type ForkGuards = (MutexGuard<'static, State>, crate::table::ForkGuards);

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

pub(super) fn watch(me: i32) {
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
pub(super) fn tick_undecided(peek: Duration) {
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
                // This process may make no streams (`may_accept`): its job
                // refuses the client (and says so).
                if room_for_one_more().is_ok() && may_accept().is_ok() {
                    table::set_decided(fd);
                    for d in copies {
                        table::set_decided(d);
                    }
                    report("iwarp", peer, "");
                } else {
                    // Its job fails at once (over a bound, or no streams
                    // here): closed, the client falls back.
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
