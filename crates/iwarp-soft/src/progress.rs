//! **Who reads this socket now.** Every decision about which thread does a
//! connection's receive work is made in this file; `rx.rs` only says how a
//! pass reads.
//!
//! Whoever holds `Conn::rx` may read the socket. Three kinds of thread
//! want it:
//!
//! | reader | takes `rx` | when |
//! |---|---|---|
//! | the receive thread, alone (`rx_exclusive`) | `lock`, and holds it across a blocking `recv` | no application thread has called `progress` since its last look (the CQ is `Threaded` and the application sleeps or computes) |
//! | the receive thread, sharing (`rx_loop`) | `lock` after `poll` said readable, never across a wait | application threads call `progress` now and then |
//! | an application thread (`Conn::progress`) | `try_lock` only: if busy, it yields and leaves the work to the holder | `CompletionQueue::progress`, `wait` in `BusyPoll` or `AppDriven` mode, `poll` in `AppDriven` mode |
//!
//! and the receive thread gets out of the way in two cases:
//!
//! - **Stepping aside** (a `BusyPoll` waiter): more than `SPINNING_POLLS`
//!   application `progress` calls between two of its looks make it sleep
//!   in `STEP_ASIDE` slices instead of waking for every segment; a waiter
//!   that goes to sleep says so (`Conn::stop_progress`, called by the CQ's
//!   threaded wait) and it takes over at once.
//! - **Application-driven** (a CQ in `ProgressMode::AppDriven`,
//!   `Conn::set_app_driven`): it feeds what it already buffered to the
//!   engine and parks until the mode is turned off or the connection ends.
//!
//! Every handover is a pair of `SeqCst` flags written by one side and read
//! by the other in opposite order (see `Conn::stop_progress`), so no side
//! can sleep while the other thinks it reads.
//!
//! **Pooled connections** (`pool.rs`, `IWARP_PROGRESS=pool`) have no
//! receive thread: their pool thread and application threads hand the
//! receive work over with one mechanism, `Conn::claim_rx` (an atomic
//! owner state: free, held, held-and-look-again), so exactly one of them
//! reads at a time and neither ever waits for the other; the pool thread
//! steps aside by leaving `EPOLLIN` out of the socket's interest. Their
//! receive passes never write: a transmit they make due is done by the
//! transmit half of the same call (`Conn::progress_pooled`) or by the
//! pool thread's transmit work.

use std::io;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::rx::*;
use crate::state::*;
use crate::tx::*;

/// One receive pass, then the transmit it made due: a Read Response or a
/// Terminate leaves from the thread that read its cause, at once and
/// without blocking ([`Conn::kick`]: written here if the socket has room
/// and nobody else writes, otherwise by the transmit thread).
///
/// On a pooled connection `tx_due` is left set for the caller, which
/// hands it to the transmit side (`Conn::progress_pooled`).
fn pass(qp: &SoftQp, conn: &Conn, rx: &mut RxState) -> Pass {
    let p = rx_pass(qp, conn, rx);
    if !conn.pooled() && std::mem::take(&mut rx.tx_due) {
        conn.kick(qp);
    }
    p
}

/// Feed what `rx` already holds to the engine, without reading the socket
/// (a partial FPDU stays for the next pass).
pub(super) fn rx_consume_buffered(qp: &SoftQp, conn: &Conn, rx: &mut RxState) {
    while rx.start < rx.end {
        rx.hint_buffered = false;
        let (n, stuck, tx) = feed(qp, conn, &rx.buf[rx.start..rx.end]);
        if tx {
            conn.kick(qp);
        }
        rx.start += n;
        if stuck {
            rx.start = rx.end;
        }
        if n == 0 {
            break;
        }
    }
    if rx.start == rx.end {
        (rx.start, rx.end) = (0, 0);
    }
}

/// Run receive passes until the socket is drained (`Ok`) or the connection
/// is over (`Err` with the reason).
pub(super) fn rx_drain(qp: &SoftQp, conn: &Conn, rx: &mut RxState) -> Result<(), String> {
    loop {
        if conn.stop.load(Ordering::Acquire) {
            return Err("stopped".into());
        }
        match pass(qp, conn, rx) {
            Pass::Progress => {}
            Pass::Idle | Pass::Drained => return Ok(()),
            Pass::Closed(why) => return Err(why),
        }
    }
}

/// The receive thread alone reads the socket (no application thread has
/// called `progress` since `polls_seen`): it holds `rx` and blocks in
/// `recv`, one system call per wake-up instead of `poll` plus `recv`.
/// Returns `Ok` as soon as an application thread calls `progress` (it then
/// finds `rx` free again), `Err` with the reason when the connection ends.
pub(super) fn rx_exclusive(
    qp: &SoftQp,
    conn: &Conn,
    rx: &mut RxState,
    polls_seen: u64,
) -> Result<(), String> {
    let fd = conn.sock.as_raw_fd();
    rx.block = true;
    let r = loop {
        if conn.stop.load(Ordering::Acquire) {
            break Err("stopped".into());
        }
        match pass(qp, conn, rx) {
            Pass::Progress | Pass::Drained => {}
            // A direct read found nothing: wait for readability, holding
            // no region (a deregistration may be waiting for it).
            Pass::Idle => {
                if let Err(e) = iwarp_verbs::sys::poll_one(fd, libc::POLLIN, TICK) {
                    break Err(format!("poll failed: {e}"));
                }
            }
            Pass::Closed(why) => break Err(why),
        }
        if conn.app_polls.load(Ordering::Relaxed) != polls_seen
            || conn.app_driven.load(Ordering::Relaxed)
        {
            break Ok(());
        }
    };
    rx.block = false;
    r
}

impl Conn {
    /// Receive work from the calling thread, if no other thread is doing
    /// it: everything the socket holds now is read, placed and completed.
    /// Never blocks. Counted, so that the receive thread steps aside while
    /// an application thread calls this in a loop (see [`rx_loop`]).
    pub(crate) fn progress(&self, qp: &SoftQp) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        self.app_polls.fetch_add(1, Ordering::Relaxed);
        if self.pooled() {
            self.progress_pooled(qp);
            return;
        }
        match self.rx.try_lock() {
            Ok(mut rx) => {
                if let Err(why) = self.progress_rx(qp, &mut rx) {
                    drop(rx);
                    self.connection_lost(qp, &why, None);
                    return;
                }
            }
            Err(TryLockError::Poisoned(p)) => {
                if let Err(why) = self.progress_rx(qp, &mut p.into_inner()) {
                    self.connection_lost(qp, &why, None);
                    return;
                }
            }
            // The receive thread is reading (or blocked in `recv` until it
            // notices this call): give it the CPU rather than spin against
            // it, which matters when threads outnumber cores.
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
        self.progress_tx(qp);
    }

    /// [`progress`](Self::progress) on a pooled connection: the receive
    /// work if nobody owns it ([`Conn::claim_rx`]; if the pool thread owns
    /// it, it reads and this thread does not wait), then the transmit
    /// work: a Read Response or Terminate the receive work made due, and a
    /// frame the socket could not take whole. The receive passes
    /// themselves never write.
    fn progress_pooled(&self, qp: &SoftQp) {
        if self.claim_rx(false) {
            let mut tx_due = false;
            loop {
                let r = {
                    let mut rx = lock(&self.rx);
                    let r = self.progress_rx(qp, &mut rx);
                    tx_due |= std::mem::take(&mut rx.tx_due);
                    r
                };
                if let Err(why) = r {
                    while !self.release_rx() {}
                    self.connection_lost(qp, &why, None);
                    return;
                }
                if self.release_rx() {
                    break;
                }
            }
            if tx_due {
                self.kick(qp);
            }
        }
        self.progress_tx(qp);
    }

    /// The receive half of [`progress`](Self::progress), `rx` held.
    pub(super) fn progress_rx(&self, qp: &SoftQp, rx: &mut RxState) -> Result<(), String> {
        let c = &qp.counters;
        let read = || {
            c.rx_buffered_bytes.load(Ordering::Relaxed) + c.rx_direct_bytes.load(Ordering::Relaxed)
        };
        // Only the holder of `rx` reads the socket, so the difference is
        // what this thread read.
        let before = read();
        let r = rx_drain(qp, self, rx);
        let got = read().wrapping_sub(before);
        if got > 0 {
            c.rx_polled_bytes.fetch_add(got, Ordering::Relaxed);
        }
        r
    }

    /// The transmit half of [`progress`](Self::progress).
    pub(super) fn progress_tx(&self, qp: &SoftQp) {
        // Transmit work too: a frame the socket could not take whole (a
        // large Write or Read Response) is pushed on from here as the peer
        // drains it, so a waiting application does not depend on the
        // transmit thread being scheduled (a scheduler tick on a loaded
        // machine). Only if nobody else is writing.
        if !self.tx_partial.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut tx) = self.tx.try_lock() else {
            return;
        };
        if tx.off >= tx.frame_len {
            // Pushed on meanwhile (or dropped with the connection).
            self.tx_partial.store(false, Ordering::Relaxed);
            drop(tx);
            // A pool thread may have found `tx` held by this look.
            self.tx_released();
            return;
        }
        // Only the holder of `tx` writes, so the difference is ours.
        let c = &qp.counters;
        let before = c.tx_bytes.load(Ordering::Relaxed);
        let r = flush(qp, self, &mut tx);
        drop(tx);
        self.tx_released();
        let sent = c.tx_bytes.load(Ordering::Relaxed).wrapping_sub(before);
        if sent > 0 {
            c.tx_polled_bytes.fetch_add(sent, Ordering::Relaxed);
        }
        if r == Flush::WouldBlock {
            self.wake_tx();
        }
    }

    /// Application-driven mode on or off (see `ProgressMode::AppDriven`):
    /// while on, the receive thread stays parked and only application
    /// threads read the socket; turning it off wakes the receive thread.
    /// On a pooled connection the pool thread drops `EPOLLIN` from the
    /// socket's interest while the mode is on (`WORK_REARM`).
    pub(crate) fn set_app_driven(&self, on: bool) {
        let changed = self.app_driven.swap(on, Ordering::SeqCst) != on;
        if self.pooled() {
            if changed {
                self.schedule(WORK_REARM);
            }
            return;
        }
        if changed && !on {
            self.stop_progress();
        }
    }

    /// The socket, for an application that waits for it to be readable.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// An application thread that may have been calling [`progress`]
    /// stops doing so (it is about to sleep): the receive thread takes the
    /// receive work back at once instead of after its step-aside slice.
    ///
    /// Without this, a waiter that polled for a while and then slept left
    /// the socket unread for up to two [`STEP_ASIDE`] slices (the receive
    /// thread counted the polls of the slice in which they stopped and
    /// stepped aside again): 1 MB client-reads GETs through mod_rdma took
    /// a 2 ms median on a loaded machine.
    ///
    /// Race-free with the receive thread's check in [`rx_loop`]: this
    /// bumps `handbacks` and then reads `aside`; the receive thread sets
    /// `aside` and then reads `handbacks` before it parks. With both
    /// `SeqCst`, at least one of them sees the other's write, so either
    /// the thread does not park or it is unparked (an `unpark` before
    /// `park_timeout` makes it return at once).
    pub(crate) fn stop_progress(&self) {
        self.handbacks.fetch_add(1, Ordering::SeqCst);
        if self.aside.load(Ordering::SeqCst) {
            // A pool thread stepping aside takes the socket back.
            self.schedule(WORK_REARM);
            if let Some(t) = self.rx_thread.get() {
                t.unpark();
            }
        }
    }
}

/// The receive thread. While no application thread calls
/// [`Conn::progress`], it reads alone, blocking in `recv` with `rx` held
/// (`rx_exclusive`). Otherwise it waits for readability holding no lock,
/// then drains the socket holding `rx` (an application thread may have done
/// it meanwhile).
///
/// While an application thread busy-polls this QP (more than
/// [`SPINNING_POLLS`] [`Conn::progress`] calls since the last look), that
/// thread does the receive work, and the receive thread steps aside: it
/// sleeps [`STEP_ASIDE`] instead of waiting on the socket, and does not
/// read when it wakes, so arriving data does not wake it to compete for
/// the CPU (and for `rx`) with the thread that is already reading. When
/// the poller goes to sleep it says so
/// ([`Conn::stop_progress`], called by `CompletionQueue::wait`), which
/// wakes the receive thread at once; a poller that just stops without
/// saying so is noticed at most two `STEP_ASIDE` slices later.
pub(super) fn rx_loop(qp: &SoftQp, conn: &Conn) {
    let fd = conn.sock.as_raw_fd();
    let _ = conn.rx_thread.set(std::thread::current());
    let mut polls_seen = conn.app_polls.load(Ordering::Relaxed);
    let mut handbacks_seen = conn.handbacks.load(Ordering::SeqCst);
    let mut handed_to_app = false;
    let why: String = loop {
        if conn.app_driven.load(Ordering::SeqCst) {
            if !handed_to_app {
                // This thread may have read bytes the application has not
                // seen (it was blocked in `recv` when the mode changed): feed them
                // to the engine now, or a complete message could sit in the
                // buffer while the application sleeps on an empty socket.
                // What completes wakes the application through its CQ's
                // fd; the socket itself is left to the application.
                rx_consume_buffered(qp, conn, &mut lock(&conn.rx));
                handed_to_app = true;
            }
            // An application thread waits on the socket and reads it: stay
            // out of its way until it lets go (`set_app_driven(false)`
            // unparks; `aside` then `app_driven` here and the reverse
            // order there, both
            // SeqCst, so one of the two sees the other).
            conn.aside.store(true, Ordering::SeqCst);
            if conn.app_driven.load(Ordering::SeqCst) && !conn.stop.load(Ordering::Acquire) {
                qp.counters.rx_steps_aside.fetch_add(1, Ordering::Relaxed);
                std::thread::park_timeout(TICK);
            }
            conn.aside.store(false, Ordering::SeqCst);
            if conn.stop.load(Ordering::Acquire) {
                break "stopped".into();
            }
            polls_seen = conn.app_polls.load(Ordering::Relaxed);
            continue;
        }
        handed_to_app = false;
        let polls = conn.app_polls.load(Ordering::Relaxed);
        let mut calls = polls.wrapping_sub(polls_seen);
        polls_seen = polls;
        let hb = conn.handbacks.load(Ordering::SeqCst);
        if hb != handbacks_seen {
            // A poller went to sleep since the last look: whatever it
            // polled before, nobody polls now.
            handbacks_seen = hb;
            calls = 0;
        }
        if calls == 0 {
            // Nobody polls: block in `recv` holding `rx`.
            match rx_exclusive(qp, conn, &mut lock(&conn.rx), polls_seen) {
                Ok(()) => continue,
                Err(why) => break why,
            }
        }
        if calls > SPINNING_POLLS {
            // Step aside, unless the poller has just handed back (see
            // `Conn::stop_progress` for why this cannot miss it). Without
            // reading first: the poller does the receive work, and a read
            // from here would take `rx` from it (its `progress` then
            // yields the CPU, or its unlock has to wake this thread) and
            // handle on this thread a message the poller would have
            // handled a moment later. A poller that stops without handing
            // back is still noticed at the next look (fewer polls), which
            // reads below.
            conn.aside.store(true, Ordering::SeqCst);
            if conn.handbacks.load(Ordering::SeqCst) == handbacks_seen {
                qp.counters.rx_steps_aside.fetch_add(1, Ordering::Relaxed);
                std::thread::park_timeout(STEP_ASIDE);
            }
            conn.aside.store(false, Ordering::SeqCst);
            continue;
        }
        let r = rx_drain(qp, conn, &mut lock(&conn.rx));
        if let Err(why) = r {
            break why;
        }
        // Someone polls now and then: wait holding nothing, so that it can
        // take `rx` meanwhile.
        if let Err(e) = iwarp_verbs::sys::poll_one(fd, libc::POLLIN, TICK) {
            break format!("poll failed: {e}");
        }
    };
    conn.connection_lost(qp, &why, None);
    tracing::trace!(qpn = qp.qpn, "rx thread exits");
}

/// How long `disconnect` lets queued frames (a Terminate) leave before
/// shutting the socket down.
pub const LINGER: Duration = Duration::from_secs(1);

/// How long a local disconnect waits for the peer's FIN after sending its
/// own (see `Conn::close_gracefully`), unless [`ENV_FIN_WAIT`] says.
pub const FIN_WAIT: Duration = Duration::from_millis(500);
/// Environment variable overriding [`FIN_WAIT`], in milliseconds (0: do
/// not wait for the peer's FIN). Read once, through `iwarp_proto::env`
/// (unset in a privileged process). For tests that must tell a close that
/// waits for the peer's FIN from one that does not at any load, and for a
/// path whose round trip exceeds 500 ms.
pub const ENV_FIN_WAIT: &str = "IWARP_FIN_WAIT_MS";
/// The longest value [`ENV_FIN_WAIT`] may set: a minute.
const MAX_FIN_WAIT_MS: u64 = 60_000;

/// [`FIN_WAIT`], or [`ENV_FIN_WAIT`]'s value (read once).
fn fin_wait() -> Duration {
    static V: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *V.get_or_init(|| match iwarp_proto::env::var(ENV_FIN_WAIT) {
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(ms) if ms <= MAX_FIN_WAIT_MS => Duration::from_millis(ms),
            _ => {
                tracing::warn!(
                    value = %s,
                    "{ENV_FIN_WAIT} must be milliseconds from 0 to {MAX_FIN_WAIT_MS}; using {FIN_WAIT:?}"
                );
                FIN_WAIT
            }
        },
        Err(_) => FIN_WAIT,
    })
}
/// How long `disconnect` waits for the driver threads to exit.
pub(super) const JOIN_WAIT: Duration = Duration::from_secs(2);

pub(super) struct LiveGuard<'a>(&'a Conn);

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        let mut n = lock(&self.0.live);
        *n = n.saturating_sub(1);
        self.0.live_cond.notify_all();
    }
}

impl Conn {
    /// Start the driver threads for `qp` on the connected, handshaken
    /// socket (no socket timeouts set: the connection manager waits in
    /// `poll`). The engine must already be established. `known` is what
    /// the connection manager already knows about the socket, so it is
    /// not asked again (issue 29: every system call here is paid by every
    /// connection's set-up).
    ///
    /// With [`ProgressEngine::Pool`](crate::pool::ProgressEngine) (see
    /// `pool.rs`) no thread is started: the socket becomes non-blocking
    /// and joins a pool thread's epoll set.
    pub(crate) fn start(
        qp: &Arc<SoftQp>,
        sock: Socket,
        live: &Liveness,
        known: SockState,
    ) -> io::Result<Arc<Conn>> {
        let pooled = crate::pool::progress_engine() == crate::pool::ProgressEngine::Pool;
        let peer_timeout = live.peer_timeout;
        if pooled != known.nonblocking {
            // Pooled: every read and write already passes MSG_DONTWAIT;
            // this makes any other call on the socket non-blocking too.
            // Threads: the receive thread blocks in `recv`.
            sock.set_nonblocking(pooled)?;
        }
        if !peer_timeout.is_zero() {
            // Data the peer does not acknowledge (or a window it keeps
            // shut) ends the connection after `peer_timeout`, instead of
            // after ~15 minutes of retransmissions.
            if let Err(e) = sock.set_tcp_user_timeout(Some(peer_timeout)) {
                tracing::warn!(error = %e, "TCP_USER_TIMEOUT failed; a peer that stops acknowledging is noticed only by TCP's own retransmission limit");
            }
        }
        let local = match known.local {
            Some(a) => a,
            None => sock
                .local_addr()?
                .as_socket()
                .ok_or_else(|| io::Error::other("not an IP socket"))?,
        };
        let peer = known.peer;
        let conn = Arc::new(Conn {
            sock,
            local,
            peer,
            tx: Mutex::new(TxState::default()),
            rx: Mutex::new(RxState::new()),
            app_polls: AtomicU64::new(0),
            handbacks: AtomicU64::new(0),
            aside: AtomicBool::new(false),
            app_driven: AtomicBool::new(false),
            rx_thread: std::sync::OnceLock::new(),
            wake: Mutex::new(false),
            wake_cond: Condvar::new(),
            stop: AtomicBool::new(false),
            down: AtomicBool::new(false),
            peer_timeout: live.peer_timeout,
            epoch: Instant::now(),
            last_rx_ms: AtomicU64::new(0),
            rx_unstamped: AtomicBool::new(false),
            quiet_since_ms: AtomicU64::new(NOT_OWED),
            probe_interval: live.probe_interval,
            last_probe_ms: AtomicU64::new(0),
            nudges_left: AtomicU32::new(if live.wake_nudge { NUDGE_MAX } else { 0 }),
            last_tx_ms: AtomicU64::new(NOT_OWED),
            last_nudge_ms: AtomicU64::new(0),
            acked_mark: AtomicU64::new(0),
            stalled_since_ms: AtomicU64::new(NOT_OWED),
            fpdu_per_segment: live.fpdu_per_segment,
            write_shut: AtomicBool::new(false),
            lingering: AtomicBool::new(false),
            linger_lock: Mutex::new(()),
            linger_cond: Condvar::new(),
            // The two threads, or the pool's table entry.
            live: Mutex::new(if pooled { 1 } else { 2 }),
            live_cond: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            pool: std::sync::OnceLock::new(),
            pending: AtomicU8::new(0),
            rx_owner: AtomicU8::new(RX_FREE),
            tx_wanted: AtomicBool::new(false),
            tx_partial: AtomicBool::new(false),
        });
        let qpn = qp.qpn;
        if qp.send_cq.app_driven() || qp.recv_cq.app_driven() {
            // Before the receive thread starts: it must not block in `recv`.
            conn.set_app_driven(true);
        }
        for cq in [&qp.send_cq, &qp.recv_cq] {
            cq.watch(conn.raw_fd());
        }
        if pooled {
            if let Err(e) = crate::pool::register(qp, &conn) {
                *lock(&conn.live) = 0;
                for cq in [&qp.send_cq, &qp.recv_cq] {
                    cq.unwatch(conn.raw_fd());
                }
                return Err(e);
            }
            tracing::debug!(qpn, %local, %peer, "connection joined the progress pool");
            return Ok(conn);
        }
        let (q, c) = (qp.clone(), conn.clone());
        let rx = std::thread::Builder::new()
            .name(format!("iwarp-rx-{qpn}"))
            .spawn(move || {
                let _live = LiveGuard(&c);
                rx_loop(&q, &c);
            });
        let rx = match rx {
            Ok(h) => h,
            Err(e) => {
                *lock(&conn.live) = 0;
                return Err(e);
            }
        };
        let (q, c) = (qp.clone(), conn.clone());
        let tx = std::thread::Builder::new()
            .name(format!("iwarp-tx-{qpn}"))
            .spawn(move || {
                let _live = LiveGuard(&c);
                tx_loop(&q, &c);
            });
        let tx = match tx {
            Ok(h) => h,
            Err(e) => {
                *lock(&conn.live) -= 1;
                conn.stop.store(true, Ordering::Release);
                let _ = conn.sock.shutdown(Shutdown::Both);
                let _ = rx.join();
                return Err(e);
            }
        };
        lock(&conn.threads).extend([rx, tx]);
        tracing::debug!(qpn, %local, %peer, "driver started");
        Ok(conn)
    }

    /// Half-close, then read (and discard: the engine is closed) until the
    /// peer's FIN, at most [`fin_wait`] ([`FIN_WAIT`]). Closing a TCP socket that still
    /// holds unread input makes the kernel send a reset instead of a FIN
    /// (RFC 2525 §2.17; Linux `tcp_close`), and a reset makes the *peer's*
    /// kernel drop what it has received and not yet read, such as our last
    /// Sends and Writes, which we already completed as handed to TCP. The
    /// peer's own stack answers our FIN with its FIN at once (this one in
    /// `connection_lost`, Linux siw when its socket closes), so the wait is
    /// a round trip, and bounded for a peer that stays silent.
    fn close_gracefully(&self) {
        if self.down.load(Ordering::Acquire) {
            return;
        }
        self.shut_write();
        let fd = self.sock.as_raw_fd();
        let deadline = Instant::now() + fin_wait();
        let mut sink = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::debug!(peer = %self.peer, "no FIN from the peer within FIN_WAIT; closing anyway");
                return;
            }
            match crate::sys::recv_nonblocking(fd, &mut sink) {
                Ok(0) => return, // the peer's FIN
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // The receive thread may take the bytes (and the FIN)
                    // first: wait in short slices and look again.
                    let _ = iwarp_verbs::sys::poll_one(fd, libc::POLLIN, left.min(TICK));
                    if self.down.load(Ordering::Acquire) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    }

    /// Local teardown (`disconnect` / `Drop`), after the engine was closed.
    pub(crate) fn shutdown(&self, qp: &SoftQp) {
        // Let queued frames (a Terminate, the last responses) leave: wait
        // until a writer lets go of `tx` with nothing left to send (it
        // says so, `tx_released`), the connection ends, or LINGER passes.
        self.lingering.store(true, Ordering::Release);
        self.kick(qp);
        let deadline = Instant::now() + LINGER;
        let mut g = lock(&self.linger_lock);
        while !self.stop.load(Ordering::Acquire) {
            // Checked under `linger_lock`: a writer that releases `tx`
            // after this look notifies only once this thread waits.
            let idle = match self.tx.try_lock() {
                Ok(tx) => {
                    let idle = tx.off >= tx.frame_len && !qp.lock_engine().has_transmit();
                    drop(tx);
                    // A pool thread may have found `tx` held by this look.
                    if self.tx_wanted.load(Ordering::Relaxed) {
                        self.tx_released();
                    }
                    idle
                }
                Err(_) => false,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if idle || left.is_zero() {
                break;
            }
            self.wake_tx();
            g = self
                .linger_cond
                .wait_timeout(g, left.min(TICK))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.close_gracefully();
        self.connection_lost(qp, "local disconnect", None);
        // Wait (bounded) for both threads.
        let deadline = Instant::now() + JOIN_WAIT;
        let mut live = lock(&self.live);
        while *live > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            live = self
                .live_cond
                .wait_timeout(live, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let exited = *live == 0;
        drop(live);
        let handles = std::mem::take(&mut *lock(&self.threads));
        if exited {
            for h in handles {
                let _ = h.join();
            }
        } else {
            tracing::warn!(
                qpn = qp.qpn,
                "driver threads did not exit in time; detaching them"
            );
        }
    }
}

#[cfg(test)]
mod fin_wait_doc {
    use super::{ENV_FIN_WAIT, FIN_WAIT};

    /// docs/C_API.md names the variable and states the code's default.
    #[test]
    fn the_c_api_doc_states_the_fin_wait_and_its_variable() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/C_API.md"))
                .expect("docs/C_API.md")
                .replace('\n', " ");
        let said = format!("at most {} ms", FIN_WAIT.as_millis());
        assert!(doc.contains(&said), "docs/C_API.md does not say: {said}");
        assert!(
            doc.contains(&format!("`{ENV_FIN_WAIT}`")),
            "docs/C_API.md does not name {ENV_FIN_WAIT}"
        );
        assert!(
            doc.contains(&format!("0 to {}", super::MAX_FIN_WAIT_MS)),
            "docs/C_API.md does not state {ENV_FIN_WAIT}'s range"
        );
    }
}
