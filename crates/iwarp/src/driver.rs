//! The I/O driver of one connected queue pair: a receive thread, a transmit
//! thread, and the opportunistic transmit done by `post_send`.
//!
//! # Threads and locks
//!
//! Per connected QP there is one **receive thread** and one **transmit
//! thread**; application threads also do receive work when they call
//! `CompletionQueue::progress` or `QueuePair::progress` (`Conn::progress`). The state they share:
//!
//! | lock | guards | held across |
//! |------|--------|-------------|
//! | `rx` (`Mutex<RxState>`) | the receive buffer and the right to read the socket | non-blocking `recv` calls and engine calls, and the receive thread's blocking `recv` while no application thread polls (`rx_exclusive`, which returns once one does). The receive thread `lock`s it, application threads only `try_lock` it |
//! | `tx` (`Mutex<TxState>`) | the frame being written and how much of it is out | non-blocking `send`/`sendmsg` calls and engine calls; never a wait (the transmit thread waits for socket space holding nothing). Every thread but the transmit thread only `try_lock`s it |
//! | `engine` (`Mutex<Engine>`) | the sans-IO engine | engine calls only; never a system call on the socket |
//! | MR table (`RwLock`, read side) | region lookup | the lookup only (the region's `Arc` is cloned out) |
//! | CQ / event queue mutexes | the queues | a push or a pop |
//!
//! Lock order is `rx` → `tx` → `engine` → MR table / CQ / event queue;
//! nothing is ever acquired in the other direction, so the locks cannot
//! deadlock. (A CQ's list of attached QPs is taken only by a polling
//! thread, before any of these, and with `try_lock`.)
//!
//! **Receive work** (`rx_pass`), by whoever holds `rx`, never blocks:
//! lock the engine to ask [`Engine::rx_hint`], unlock, then read with a
//! non-blocking `recv`: large tagged payload (≥ [`DIRECT_MIN`]) goes
//! straight into the target region (zero-copy placement; the region is held
//! only for that copy), everything else into a reusable 256 KiB buffer.
//! Buffered reads from an empty buffer are kept short ([`RX_READ`], or
//! [`HDR_PEEK`] during bulk tagged traffic) so that segment payloads are
//! left in the socket for the direct path rather than copied twice. Then it
//! locks the engine, feeds the bytes ([`Engine::handle_input`] /
//! [`Engine::handle_direct`]), drains completions into the CQs and events
//! into the QP's event queue, unlocks, and if the engine has something to
//! send tries one *non-blocking* transmit pass (or wakes the transmit
//! thread). Nobody doing receive work ever blocks on a write, so two peers
//! that are both sending a lot cannot end up both blocked in `write` with
//! nobody reading.
//!
//! **Receive thread** (`rx_loop`): while no application thread calls
//! `progress`, it holds `rx` and blocks in `recv` (one system call per
//! wake-up); once one does, it waits for readability with `poll` holding
//! no lock, then takes `rx` and drains the socket. This is what
//! makes one-sided operations progress while the application computes
//! (RFC 5040 requires no help from the target's application). While an
//! application thread busy-polls, the receive thread steps aside (see
//! `rx_loop`) so that arriving data does not wake a second thread to
//! compete for the CPU: the polling thread reads its own socket, as a
//! spinning TCP reader does, which removes a thread hand-off from every
//! message's latency.
//!
//! **Transmit path.** Whoever holds `tx` loops: lock the engine,
//! [`Engine::poll_transmit`] into the shared [`TxFrame`], unlock, write the
//! frame's pieces with one gather `sendmsg` (inline headers from the frame,
//! payload straight from registered memory; a frame of at most
//! [`SMALL_SEND`] bytes is copied and written with one `send`), handle
//! partial writes, and
//! once the whole frame is out lock the engine and
//! [`Engine::confirm_transmit`]. An application thread in `post_send` takes
//! `tx` only with `try_lock` and only writes non-blocking: on `EAGAIN` or
//! if `tx` is busy it wakes the transmit thread, which is the only one that
//! waits for socket space (with `poll`, in 100 ms slices so it notices a
//! stop request), and it waits *without* holding `tx`: an application
//! thread in `progress` (waiting for this very transfer) pushes a partly
//! written frame on itself whenever it finds `tx` free, so a large Write or
//! Read Response keeps moving while the transmit thread waits to be
//! scheduled. After releasing `tx`, every writer re-checks
//! [`Engine::has_transmit`] and wakes the transmit thread if work appeared
//! meanwhile; the wake flag is sticky, so no wake-up is lost.
//!
//! **Teardown.** EOF, a read error or a write error first confirms a frame
//! that is already entirely in the socket (the receive thread sets the stop
//! flag and takes `tx` with a bounded `try_lock` wait, so a Send the peer
//! read just before closing still completes successfully), then calls
//! [`Engine::on_peer_closed`] (every other outstanding work request is
//! flushed into the CQs at once), queues [`QpEvent::Disconnected`](crate::QpEvent::Disconnected), sets the stop
//! flag and shuts the socket down, which wakes a thread blocked in `read`
//! or `poll`. When the engine [`wants_close`](Engine::wants_close) (after a
//! Terminate, or a local close) the transmit path writes what is left and
//! shuts down the write side, so the peer sees EOF. `disconnect` and `Drop`
//! give the last frames up to [`LINGER`] to leave, shut the socket down in
//! both directions and wait (bounded) for both threads to exit.

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_proto::engine::{Engine, QpState, RxHint, TxFrame, TxPiece, WcQueue};
use socket2::{Socket, TcpKeepalive};

use crate::mr::MrInner;
use crate::qp::QpShared;
use crate::sys;

/// Tagged payload at least this long is read straight into the region.
pub const DIRECT_MIN: u32 = 8 * 1024;
/// Size of the receive thread's buffer (room for any partial FPDU).
pub const RX_BUF: usize = 256 * 1024;
/// A buffered read from an empty buffer asks for at most this much, so that
/// a large tagged segment usually ends up partly unread and its remaining
/// payload takes the direct path.
pub const RX_READ: usize = 16 * 1024;
/// While bulk tagged traffic flows (the previous segment was placed
/// directly), a buffered read from an empty buffer asks only for this much:
/// enough for the trailer of one FPDU, the headers of the next and a
/// marker, so the engine can hint the next payload as direct.
pub const HDR_PEEK: usize = 64;
/// Bytes read into the buffer behind a direct placement: an FPDU's pad and
/// CRC (at most 7) and the next tagged header (16), rounded up.
pub const DIRECT_TAIL: usize = 24;
/// Bytes the transmit path asks the engine for per `poll_transmit`.
pub const TX_BATCH: usize = 64 * 1024;
/// How long `disconnect` lets queued frames (a Terminate) leave before
/// shutting the socket down.
pub const LINGER: Duration = Duration::from_secs(1);
/// How long `disconnect` waits for the driver threads to exit.
const JOIN_WAIT: Duration = Duration::from_secs(2);
/// Slice of the transmit thread's waits, so that it notices `stop`.
const TICK: Duration = Duration::from_millis(100);

/// `Conn::quiet_since_ms` when the peer owes nothing.
const NOT_OWED: u64 = u64::MAX;
/// Wake-up nudges (see `Conn::maybe_nudge`): the silence after our last
/// bytes before the first one, doubled for each next one.
const NUDGE_FIRST_GAP_MS: u64 = 20;
/// At most this many nudges per connection...
const NUDGE_MAX: u32 = 6;
/// ...and only this long after the connection went live: the race they
/// repair is with the peer's connection setup.
const NUDGE_WINDOW_MS: u64 = 2_000;
/// Application `progress` calls between two looks of the receive thread
/// above which it considers the application to be busy polling.
const SPINNING_POLLS: u64 = 64;
/// How long the receive thread steps aside while an application thread
/// busy-polls.
const STEP_ASIDE: Duration = Duration::from_millis(1);
/// Frames (or remainders) up to this size are copied and written with one
/// `send` instead of a gather `sendmsg` (see `write_some`).
pub const SMALL_SEND: usize = 512;
/// Largest iovec count per `sendmsg` (Linux `IOV_MAX` is 1024).
const MAX_IOV: usize = 1024;

/// Largest ULPDU we let the engine build: 16-bit MPA length field, rounded
/// down to a multiple of 4.
pub const MULPDU_CAP: u32 = 65532;

/// MULPDU (largest DDP segment incl. its header) for a TCP connection with
/// maximum segment size `mss` (`TCP_MAXSEG`).
///
/// RFC 5044 sizes FPDUs to fit the effective MSS (EMSS): an FPDU is the
/// 2-byte ULPDU length, the ULPDU, 0-3 pad bytes and the 4-byte CRC field
/// (always present on the wire, zero when CRC is off), plus with markers a
/// 4-byte marker every 512 bytes of the stream. Hence, as in RFC 5044:
/// `MULPDU = EMSS - (6 + EMSS mod 4)` without markers and
/// `MULPDU = EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)` with them.
/// Capped at [`MULPDU_CAP`] (an MSS above 64 KiB, e.g. with large MTUs on
/// loopback, cannot be used whole) and floored at
/// 128 bytes so a broken MSS report cannot stall the stream.
pub fn mulpdu_for_mss(mss: u32, markers: bool) -> u32 {
    let emss = mss.clamp(256, 1 << 20);
    let mut overhead = 6 + emss % 4;
    if markers {
        overhead += 4 * emss.div_ceil(512);
    }
    emss.saturating_sub(overhead).clamp(128, MULPDU_CAP)
}

/// MULPDU for a connection: FPDUs as large as one TCP send of `k` whole
/// segments (a GSO super-segment), up to [`MULPDU_CAP`].
///
/// RFC 5044 §8 asks a sender to align FPDUs with TCP segments (a SHOULD;
/// a receiver must accept FPDUs that span segments, and every receiver
/// here does), and the formula of [`mulpdu_for_mss`] gives one FPDU per
/// segment. Linux siw, the implementation this stack must interoperate
/// with, instead sizes FPDUs to `mss_cache * gso_segs`
/// (`siw_update_tcpseg` in `siw_qp_tx.c`): one FPDU per GSO send, which
/// the kernel then cuts into MSS segments. On an Ethernet MTU (MSS 1448)
/// the per-segment rule means 45 FPDUs, headers, CRC set-ups and receive
/// system calls for every 64 KiB, and measured 0.67x raw TCP for 1 MiB
/// RDMA Writes over a veth pair; 64 KiB FPDUs remove that overhead. So,
/// like siw, we use the largest multiple `k * mss` that fits the 16-bit
/// ULPDU length, keeping FPDU boundaries on segment boundaries whenever
/// FPDUs are full.
///
/// With markers we keep one FPDU per segment: markers exist for receivers
/// that recover FPDU boundaries segment by segment, and the Wireshark
/// dissector finds them only in an FPDU alone in its segment.
pub fn mulpdu_for_path(mss: u32, markers: bool) -> u32 {
    if markers {
        return mulpdu_for_mss(mss, true);
    }
    let mss = mss.clamp(256, 1 << 20);
    let k = ((MULPDU_CAP + 6) / mss).max(1);
    mulpdu_for_mss(k * mss, false)
}

/// Apply the data-path socket options. Errors are logged, not fatal: they
/// only cost performance.
pub(crate) fn tune_socket(sock: &Socket) {
    if let Err(e) = sock.set_tcp_nodelay(true) {
        tracing::warn!(error = %e, "TCP_NODELAY failed; small messages will see Nagle delays");
    }
    // Keepalive notices a peer that vanished without FIN/RST (power loss,
    // cable pulled) within about 45 s. SO_SNDBUF/SO_RCVBUF are left to
    // Linux autotuning, which sizes them better than a fixed value.
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    if let Err(e) = sock
        .set_tcp_keepalive(&ka)
        .and_then(|_| sock.set_keepalive(true))
    {
        tracing::warn!(error = %e, "TCP keepalive setup failed");
    }
}

/// Bytes of the frame being written and how much of it is out.
#[derive(Default)]
pub(crate) struct TxState {
    frame: TxFrame,
    frame_len: usize,
    off: usize,
    /// Regions held alive during one `sendmsg` (kept for its capacity).
    hold: Vec<Arc<MrInner>>,
    /// The iovecs of one `sendmsg` (kept for its capacity).
    iov: IovBuf,
}

/// Reusable iovec storage, so a write allocates nothing.
#[derive(Default)]
struct IovBuf(Vec<libc::iovec>);

// SAFETY: `IovBuf` is empty between calls of `write_some`, which clears it
// on every exit (errors included), so the raw pointers it holds never
// outlive the borrow they were taken under and are never seen by another
// thread; only the capacity moves between threads.
unsafe impl Send for IovBuf {}

/// The connection of a QP: its socket and the driver's shared state.
pub(crate) struct Conn {
    sock: Socket,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    tx: Mutex<TxState>,
    rx: Mutex<RxState>,
    /// Calls of [`Conn::progress`] by application threads (busy polling).
    app_polls: AtomicU64,
    /// Bumped by [`Conn::stop_progress`]: an application thread that
    /// polled is about to sleep, so the receive thread must not step aside.
    handbacks: AtomicU64,
    /// The receive thread is stepping aside (parked for up to
    /// [`STEP_ASIDE`], or while `drivers` is non-zero); `stop_progress`
    /// unparks it.
    aside: AtomicBool,
    /// Live [`Drive`](crate::Drive) guards: an application thread waits on
    /// the socket itself and does the receive work, so the receive thread
    /// stays parked.
    drivers: AtomicUsize,
    /// One of the QP's CQs is in `ProgressMode::AppDriven`: this holds one
    /// of the `drivers` counts.
    app_driven: AtomicBool,
    /// The receive thread, for `unpark` (set by the thread itself).
    rx_thread: std::sync::OnceLock<std::thread::Thread>,
    wake: Mutex<bool>,
    wake_cond: Condvar,
    /// Set when the connection is over: threads exit.
    stop: AtomicBool,
    /// The engine was told the peer is gone.
    down: AtomicBool,
    /// [`ConnParam::peer_timeout`](crate::cm::ConnParam::peer_timeout).
    peer_timeout: Duration,
    /// [`ConnParam::probe_interval`](crate::cm::ConnParam::probe_interval).
    probe_interval: Duration,
    /// Milliseconds since `epoch` when the last probe was queued.
    last_probe_ms: AtomicU64,
    /// Wake-up nudges still allowed (0: off, or done); see
    /// [`Conn::maybe_nudge`].
    nudges_left: AtomicU32,
    /// Milliseconds since `epoch` when we last wrote bytes (kept only
    /// while `nudges_left > 0`; `NOT_OWED`: nothing written yet).
    last_tx_ms: AtomicU64,
    /// Milliseconds since `epoch` when the last nudge was queued.
    last_nudge_ms: AtomicU64,
    /// When the connection started (the clock of the fields below).
    epoch: Instant,
    /// Milliseconds since `epoch` when bytes last arrived.
    last_rx_ms: AtomicU64,
    /// Milliseconds since `epoch` since when the peer owes Read Responses
    /// with all our data acknowledged (`NOT_OWED`: it owes nothing).
    quiet_since_ms: AtomicU64,
    /// Bytes of ours the peer had acknowledged at the last look
    /// (`tx_bytes - SIOCOUTQ`; only its changes matter).
    acked_mark: AtomicU64,
    /// Milliseconds since `epoch` since when data of ours sits in the
    /// socket and the peer acknowledges none of it (`NOT_OWED`: no such
    /// stall).
    stalled_since_ms: AtomicU64,
    /// We shut down our write side.
    write_shut: AtomicBool,
    live: Mutex<usize>,
    live_cond: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("stop", &self.stop.load(Ordering::Relaxed))
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drain completions and events out of the engine (engine lock held).
pub(crate) fn pump(qp: &QpShared, eng: &mut Engine) {
    while let Some(wc) = eng.poll_completion() {
        if wc.queue == WcQueue::Send && qp.take_rtr_completion(&wc) {
            continue;
        }
        match wc.queue {
            WcQueue::Send => qp.send_cq.push(wc),
            WcQueue::Recv => qp.recv_cq.push(wc),
        }
    }
    while let Some(ev) = eng.poll_event() {
        qp.push_engine_event(ev);
    }
}

/// The connection's liveness settings, from
/// [`ConnParam`](crate::cm::ConnParam).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    pub(crate) peer_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) wake_nudge: bool,
}

struct LiveGuard<'a>(&'a Conn);

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        let mut n = lock(&self.0.live);
        *n = n.saturating_sub(1);
        self.0.live_cond.notify_all();
    }
}

impl Conn {
    /// Start the driver threads for `qp` on the connected, handshaken
    /// socket. The engine must already be established.
    pub(crate) fn start(
        qp: &Arc<QpShared>,
        sock: Socket,
        live: &Liveness,
    ) -> io::Result<Arc<Conn>> {
        let peer_timeout = live.peer_timeout;
        sock.set_read_timeout(None)?;
        sock.set_write_timeout(None)?;
        if !peer_timeout.is_zero() {
            // Data the peer does not acknowledge (or a window it keeps
            // shut) ends the connection after `peer_timeout`, instead of
            // after ~15 minutes of retransmissions.
            if let Err(e) = sock.set_tcp_user_timeout(Some(peer_timeout)) {
                tracing::warn!(error = %e, "TCP_USER_TIMEOUT failed; a peer that stops acknowledging is noticed only by TCP's own retransmission limit");
            }
        }
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))?;
        let peer = sock
            .peer_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))?;
        let conn = Arc::new(Conn {
            sock,
            local,
            peer,
            tx: Mutex::new(TxState::default()),
            rx: Mutex::new(RxState::new()),
            app_polls: AtomicU64::new(0),
            handbacks: AtomicU64::new(0),
            aside: AtomicBool::new(false),
            drivers: AtomicUsize::new(0),
            app_driven: AtomicBool::new(false),
            rx_thread: std::sync::OnceLock::new(),
            wake: Mutex::new(false),
            wake_cond: Condvar::new(),
            stop: AtomicBool::new(false),
            down: AtomicBool::new(false),
            peer_timeout: live.peer_timeout,
            epoch: Instant::now(),
            last_rx_ms: AtomicU64::new(0),
            quiet_since_ms: AtomicU64::new(NOT_OWED),
            probe_interval: live.probe_interval,
            last_probe_ms: AtomicU64::new(0),
            nudges_left: AtomicU32::new(if live.wake_nudge { NUDGE_MAX } else { 0 }),
            last_tx_ms: AtomicU64::new(NOT_OWED),
            last_nudge_ms: AtomicU64::new(0),
            acked_mark: AtomicU64::new(0),
            stalled_since_ms: AtomicU64::new(NOT_OWED),
            write_shut: AtomicBool::new(false),
            live: Mutex::new(2),
            live_cond: Condvar::new(),
            threads: Mutex::new(Vec::new()),
        });
        let qpn = qp.qpn;
        if qp.send_cq.app_driven() || qp.recv_cq.app_driven() {
            // Before the receive thread starts: it must not block in `recv`.
            conn.set_app_driven(true);
        }
        for cq in [&qp.send_cq, &qp.recv_cq] {
            cq.watch(conn.raw_fd());
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

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Bytes arrived from the peer.
    fn heard_from_peer(&self) {
        self.last_rx_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Checked by the transmit thread at every wake-up (at least every
    /// [`TICK`]): the reason to give up on a silent peer, if any. Two
    /// rules, both measured against `peer_timeout`:
    ///
    /// - *Our data does not drain.* Bytes of ours sit in the socket (the
    ///   Sends and Writes behind them cannot be handed to TCP) and the peer
    ///   has neither acknowledged any of them nor sent anything. An iWARP
    ///   peer reads its socket whatever its application does (placement
    ///   needs no receiver involvement, RFC 5041 §5), so a window that
    ///   stays shut means the peer or the path is gone. TCP_USER_TIMEOUT
    ///   covers this too on Linux 5.11 and later (zero-window probes count
    ///   against it); this rule does not depend on the kernel, and a slow
    ///   path that still acknowledges now and then is never cut.
    /// - *Read Responses do not come.* The peer owes Read Responses, has
    ///   acknowledged everything we sent, and has sent nothing. A live
    ///   iWARP peer answers a Read Request without its application (RFC
    ///   5040 §4.5), so silence means the peer is gone, or a relay that
    ///   takes our bytes stopped forwarding (its kernel still acknowledges
    ///   them, so TCP alone never notices).
    fn peer_silent(&self, qp: &QpShared) -> Option<String> {
        if self.peer_timeout.is_zero() {
            return None;
        }
        let now = self.now_ms();
        let limit = self.peer_timeout.as_millis() as u64;
        let last_rx = self.last_rx_ms.load(Ordering::Relaxed);
        let unacked = sys::unacked_bytes(self.sock.as_raw_fd()).unwrap_or(0);
        // Clock of a rule: since when its condition holds (reset when it
        // stops holding), and whether the peer has been silent for the
        // whole `peer_timeout` since then.
        let clock = |cell: &AtomicU64, holds: bool, progress: bool| -> bool {
            if !holds || progress {
                cell.store(if holds { now } else { NOT_OWED }, Ordering::Relaxed);
                return false;
            }
            let since = match cell.load(Ordering::Relaxed) {
                NOT_OWED => {
                    cell.store(now, Ordering::Relaxed);
                    now
                }
                t => t,
            };
            now.saturating_sub(since.max(last_rx)) >= limit
        };
        let acked = qp
            .counters
            .tx_bytes
            .load(Ordering::Relaxed)
            .wrapping_sub(u64::from(unacked));
        let progress = self.acked_mark.swap(acked, Ordering::Relaxed) != acked;
        if clock(&self.stalled_since_ms, unacked > 0, progress) {
            return Some(format!(
                "the peer acknowledged none of our {unacked} queued bytes and sent nothing for \
                 {:.1} s: the peer or the path is gone (ConnParam::peer_timeout); outstanding \
                 work is flushed",
                self.peer_timeout.as_secs_f64()
            ));
        }
        let owed = lock(&qp.engine).reads_outstanding();
        if clock(&self.quiet_since_ms, owed > 0 && unacked == 0, false) {
            return Some(format!(
                "the peer sent nothing for {:.1} s while {owed} RDMA Read(s) waited for their \
                 responses and it had acknowledged all our data: the peer or the path is gone \
                 (ConnParam::peer_timeout); outstanding work is flushed",
                self.peer_timeout.as_secs_f64()
            ));
        }
        None
    }

    /// Queue a liveness probe if the peer has sent nothing for
    /// `probe_interval` and nothing of ours is waiting for an answer that
    /// would show it alive: without one, a connection on which we only
    /// wait (or only send) would never notice a path that takes our bytes
    /// and forwards nothing. The probe is a zero-length RDMA Read
    /// ([`Engine::post_probe`]); its response is traffic from the peer,
    /// and while it is owed the Read rule of [`Conn::peer_silent`] runs,
    /// so a silent peer is given up `probe_interval + peer_timeout` after
    /// it went quiet. Not sent when the peer accepts no inbound Reads
    /// (negotiated ORD 0), when Reads are already outstanding (they do the
    /// probe's job), or when probing or `peer_timeout` is off. Returns
    /// true if a probe was queued (the caller transmits it).
    fn maybe_probe(&self, qp: &QpShared) -> bool {
        if self.probe_interval.is_zero() || self.peer_timeout.is_zero() {
            return false;
        }
        if qp.info.get().is_some_and(|i| i.ord == 0) {
            return false;
        }
        let now = self.now_ms();
        let every = self.probe_interval.as_millis() as u64;
        let quiet_since = self
            .last_rx_ms
            .load(Ordering::Relaxed)
            .max(self.last_probe_ms.load(Ordering::Relaxed));
        if now.saturating_sub(quiet_since) < every {
            return false;
        }
        let mut eng = lock(&qp.engine);
        if eng.reads_outstanding() > 0 || !eng.post_probe(crate::qp::PROBE_WR_ID) {
            return false;
        }
        drop(eng);
        self.last_probe_ms.store(now, Ordering::Relaxed);
        tracing::trace!(qpn = qp.qpn, peer = %self.peer, "liveness probe (zero-length RDMA Read)");
        true
    }

    /// Queue a wake-up nudge ([`Engine::post_nudge`], a zero-length RDMA
    /// Write) if, early in the connection, the peer has been silent for a
    /// while since our last bytes. Returns true if one was queued (the
    /// caller transmits it).
    ///
    /// Why: Linux siw (drivers/infiniband/sw/siw, checked in 6.1 and 6.12)
    /// reads a connection's socket only from its `sk_data_ready` callback.
    /// On the passive side, `siw_accept` moves the QP to RTS, sends the MPA
    /// Reply, and only then installs the QP's receive callback
    /// (`siw_qp_socket_assoc`, or `siw_sk_assign_rtr_upcalls` in
    /// peer-to-peer mode). Until then the connection manager's callback is
    /// in place, and in `SIW_EPSTATE_RDMA_MODE` it ignores arriving data
    /// (`siw_cm_llp_data_ready`). The active side has the same gap: it
    /// reads the MPA Reply in a work item and installs the receive callback
    /// afterwards (`siw_proc_mpareply`), so bytes that came with or right
    /// behind the Reply are not signalled again. An FPDU that arrives in
    /// that window is acknowledged by TCP and then sits in the socket until
    /// more bytes arrive. Our first FPDU leaves within a millisecond of the
    /// MPA exchange (siw's own initiator, going through rdma_cm in user
    /// space, needs about 13 ms), so with rping, which then waits for an
    /// answer to it, both sides waited forever (every run with 2 vCPUs
    /// under QEMU TCG, 1 in 6 with 1 vCPU). No delay of the first FPDU is
    /// safe for every peer and every load, and one would slow every
    /// connection; instead, bytes that arrive later make siw read
    /// everything queued, so a nudge repairs the stall whenever it happens,
    /// costing nothing where it does not.
    ///
    /// When: within [`NUDGE_WINDOW_MS`] of going live, at most
    /// [`NUDGE_MAX`] times, after we wrote bytes and the peer has sent
    /// nothing for [`NUDGE_FIRST_GAP_MS`] since (the gap doubles after each
    /// nudge, so a nudge that itself lands in the window is followed by
    /// another). A peer that answers within the gap is never nudged. The
    /// zero-length Write is RFC 6581's write-form RTR, which siw treats as
    /// a no-op at RTS (`siw_proc_write`: "zero length WRITE"), as does our
    /// engine; [`ConnParam::wake_nudge`](crate::cm::ConnParam::wake_nudge)
    /// turns it off for a peer that refuses it.
    fn maybe_nudge(&self, qp: &QpShared) -> bool {
        if self.nudges_left.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let now = self.now_ms();
        if now > NUDGE_WINDOW_MS {
            self.nudges_left.store(0, Ordering::Relaxed);
            return false;
        }
        let Some(due) = self.nudge_due_ms() else {
            return false;
        };
        if now < due {
            return false;
        }
        if !lock(&qp.engine).post_nudge(crate::qp::PROBE_WR_ID) {
            return false;
        }
        self.nudges_left.fetch_sub(1, Ordering::Relaxed);
        self.last_nudge_ms.store(now, Ordering::Relaxed);
        tracing::debug!(
            qpn = qp.qpn,
            peer = %self.peer,
            ms_since_tx = now.saturating_sub(self.last_tx_ms.load(Ordering::Relaxed)),
            "peer silent since our last bytes: wake-up nudge (zero-length RDMA Write)"
        );
        true
    }

    /// When the next wake-up nudge is due (milliseconds since `epoch`), or
    /// `None` if none is wanted now: nudging is over, we have written
    /// nothing yet, or the peer has sent something since our last bytes.
    fn nudge_due_ms(&self) -> Option<u64> {
        let left = self.nudges_left.load(Ordering::Relaxed);
        if left == 0 {
            return None;
        }
        let last_tx = self.last_tx_ms.load(Ordering::Relaxed);
        if last_tx == NOT_OWED {
            return None;
        }
        if self.last_rx_ms.load(Ordering::Relaxed) > last_tx {
            return None;
        }
        let gap = NUDGE_FIRST_GAP_MS << (NUDGE_MAX - left);
        Some(last_tx.max(self.last_nudge_ms.load(Ordering::Relaxed)) + gap)
    }

    /// How long the transmit thread may sleep: [`TICK`], or less when a
    /// wake-up nudge falls due sooner.
    fn tx_sleep(&self) -> Duration {
        match self.nudge_due_ms() {
            Some(due) => Duration::from_millis(due.saturating_sub(self.now_ms()).max(1)).min(TICK),
            None => TICK,
        }
    }

    /// Bytes of ours went to the socket (recorded only while nudges may
    /// still be sent).
    fn wrote_bytes(&self) {
        if self.nudges_left.load(Ordering::Relaxed) > 0 {
            self.last_tx_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Apply [`Conn::peer_silent`]: if the peer is to be given up, end the
    /// connection (flushing outstanding work, with the reason as the QP's
    /// event) and return true.
    fn give_up_if_silent(&self, qp: &QpShared) -> bool {
        let Some(why) = self.peer_silent(qp) else {
            return false;
        };
        tracing::warn!(qpn = qp.qpn, peer = %self.peer, "{why}");
        qp.push_event(crate::QpEvent::PeerTimeout(why.clone()));
        self.connection_lost(qp, &why, None);
        true
    }

    /// Wake the transmit thread.
    pub(crate) fn wake_tx(&self) {
        *lock(&self.wake) = true;
        self.wake_cond.notify_one();
    }

    /// Transmit what the engine has, from the calling thread if `tx` is free
    /// and the socket has room, otherwise by waking the transmit thread.
    /// Never blocks on the network.
    pub(crate) fn kick(&self, qp: &QpShared) {
        let guard = match self.tx.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.wake_tx();
                return;
            }
        };
        let mut tx = guard;
        let r = flush(qp, self, &mut tx);
        drop(tx);
        match r {
            Flush::Done => {
                if lock(&qp.engine).has_transmit() {
                    self.wake_tx();
                }
            }
            Flush::WouldBlock => self.wake_tx(),
            Flush::Closed => {}
        }
    }

    /// The connection is over (EOF, error, or local teardown): flush the
    /// engine, report `Disconnected`, stop the threads.
    ///
    /// `held` is the transmit state when the caller already holds `tx` (a
    /// write failed inside [`flush`]); otherwise this takes `tx` itself,
    /// waiting a bounded time. Either way, a frame that was written whole
    /// but not yet confirmed is confirmed before the engine is flushed: its
    /// work requests were handed to TCP, so they complete successfully
    /// instead of with a flush error. (The peer can read the last Send and
    /// close before the writer gets back to [`Engine::confirm_transmit`].)
    fn connection_lost(&self, qp: &QpShared, why: &str, held: Option<&mut TxState>) {
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::debug!(qpn = qp.qpn, peer = %self.peer, why, "connection closed");
            // The stop flag makes a writer that holds `tx` give it up (it
            // checks the flag after every write and every poll slice).
            self.stop.store(true, Ordering::Release);
            self.wake_tx();
            match held {
                Some(tx) => confirm_written(qp, tx),
                None => {
                    let deadline = Instant::now() + 2 * TICK;
                    loop {
                        match self.tx.try_lock() {
                            Ok(mut tx) => break confirm_written(qp, &mut tx),
                            Err(TryLockError::Poisoned(p)) => {
                                break confirm_written(qp, &mut p.into_inner())
                            }
                            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            // A writer stuck longer than a poll slice has not
                            // finished its frame: nothing to confirm.
                            Err(TryLockError::WouldBlock) => break,
                        }
                    }
                }
            }
            let mut eng = lock(&qp.engine);
            eng.on_peer_closed();
            pump(qp, &mut eng);
            drop(eng);
            // Out of the application-driven wait sets before the socket is
            // shut down (a shut socket is readable forever) and closed.
            for cq in [&qp.send_cq, &qp.recv_cq] {
                cq.unwatch(self.sock.as_raw_fd());
            }
        }
        self.stop.store(true, Ordering::Release);
        let _ = self.sock.shutdown(Shutdown::Both);
        self.wake_tx();
        qp.report_disconnected();
    }

    /// Local teardown (`disconnect` / `Drop`), after the engine was closed.
    pub(crate) fn shutdown(&self, qp: &QpShared) {
        // Let queued frames (a Terminate, the last responses) leave.
        self.kick(qp);
        let deadline = Instant::now() + LINGER;
        while !self.stop.load(Ordering::Acquire) && Instant::now() < deadline {
            // Only try_lock: the transmit thread may hold `tx` while it
            // waits for socket space.
            let idle = match self.tx.try_lock() {
                Ok(tx) => tx.off >= tx.frame_len && !lock(&qp.engine).has_transmit(),
                Err(_) => false,
            };
            if idle {
                break;
            }
            self.wake_tx();
            std::thread::sleep(Duration::from_millis(2));
        }
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

    fn shut_write(&self) {
        if !self.write_shut.swap(true, Ordering::AcqRel) {
            let _ = self.sock.shutdown(Shutdown::Write);
        }
    }
}

/// Fault injection for tests of the driver's races (not for applications).
#[doc(hidden)]
pub mod fault {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    static CONFIRM_DELAY_US: AtomicU64 = AtomicU64::new(0);

    /// Make every writer pause this long between writing a whole frame and
    /// confirming it to the engine, widening the window in which the peer
    /// can read the frame and close first. Process-wide; zero turns it off.
    pub fn set_confirm_delay(d: Duration) {
        CONFIRM_DELAY_US.store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// One relaxed load per frame when off.
    #[inline]
    pub(super) fn after_frame_written() {
        let us = CONFIRM_DELAY_US.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

/// Confirm a frame that is entirely in the socket (`tx` held, engine not).
fn confirm_written(qp: &QpShared, tx: &mut TxState) {
    if tx.frame_len > 0 && tx.off >= tx.frame_len {
        let mut eng = lock(&qp.engine);
        eng.confirm_transmit();
        pump(qp, &mut eng);
        tx.frame.clear();
        tx.frame_len = 0;
        tx.off = 0;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// Nothing left to send.
    Done,
    /// The socket is full.
    WouldBlock,
    /// The connection is gone.
    Closed,
}

/// Write one batch of the current frame from `tx.off` on; returns the bytes
/// written.
///
/// A small remainder (at most [`SMALL_SEND`] bytes: the frame of a short
/// message) is copied into a stack buffer and written with one `send`, like
/// the inline data of an RNIC's work request: for a few hundred bytes the
/// copy is cheaper than `sendmsg`'s message header and iovec import, and it
/// is on the latency path of every small message. Everything else goes out
/// with one gather `sendmsg` straight from the frame's inline bytes and
/// the registered regions.
fn write_some(qp: &QpShared, conn: &Conn, tx: &mut TxState) -> io::Result<usize> {
    let r = gather_and_send(qp, conn, tx);
    // On every exit, errors included: no pointer outlives this call, and
    // no region stays pinned.
    tx.iov.0.clear();
    tx.hold.clear();
    r
}

/// The body of [`write_some`], which empties `iov` and `hold` after it.
fn gather_and_send(qp: &QpShared, conn: &Conn, tx: &mut TxState) -> io::Result<usize> {
    let left = tx.frame_len.saturating_sub(tx.off);
    if left == 0 {
        return Ok(0);
    }
    let small = left <= SMALL_SEND;
    let mut copy = [0u8; SMALL_SEND];
    let mut copied = 0usize;
    let mut skip = tx.off;
    let TxState {
        frame, hold, iov, ..
    } = tx;
    for piece in &frame.pieces {
        let (plen, ptr): (usize, *const u8) = match *piece {
            TxPiece::Inline { start, len } => {
                let (s, l) = (start as usize, len as usize);
                let bytes = frame.inline.get(s..s + l).ok_or_else(|| {
                    io::Error::other("engine frame piece outside its inline buffer")
                })?;
                if skip >= l {
                    skip -= l;
                    continue;
                }
                if small {
                    let b = &bytes[skip..];
                    copy[copied..copied + b.len()].copy_from_slice(b);
                    copied += b.len();
                    skip = 0;
                    continue;
                }
                (l, bytes.as_ptr())
            }
            TxPiece::Mem { stag, to, len } => {
                if skip >= len as usize {
                    skip -= len as usize;
                    continue;
                }
                let region = qp.mem.resolve(stag).map_err(|e| {
                    io::Error::other(format!(
                        "memory region {stag:#010x} deregistered while a work request was sending from it: {e}"
                    ))
                })?;
                if small {
                    let n = len as usize - skip;
                    region
                        .read_into(to + skip as u64, &mut copy[copied..copied + n])
                        .map_err(|e| {
                            io::Error::other(format!("transmit from {stag:#010x}: {e}"))
                        })?;
                    copied += n;
                    skip = 0;
                    continue;
                }
                let p = region
                    .ptr_at(to, len as u64)
                    .map_err(|e| io::Error::other(format!("transmit from {stag:#010x}: {e}")))?;
                hold.push(region);
                (len as usize, p as *const u8)
            }
        };
        if skip >= plen {
            skip -= plen;
            continue;
        }
        iov.0.push(libc::iovec {
            iov_base: ptr.wrapping_add(skip) as *mut libc::c_void,
            iov_len: plen - skip,
        });
        skip = 0;
        if iov.0.len() == MAX_IOV {
            break;
        }
    }
    let fd = conn.sock.as_raw_fd();
    if small {
        return sys::send_nonblocking(fd, &copy[..copied]);
    }
    if iov.0.is_empty() {
        return Ok(0);
    }
    // SAFETY: each iovec points into `frame.inline` (borrowed for this
    // call) or into a registered region whose `Arc` is in `hold`, so all of
    // it is readable until the call returns; the call does not block.
    unsafe { sys::send_iovecs(fd, &iov.0) }
}

/// Write everything the engine has, `tx` held; returns `WouldBlock` when the
/// socket is full (never waits: the transmit thread waits for `POLLOUT`
/// after releasing `tx`, see `tx_loop`).
fn flush(qp: &QpShared, conn: &Conn, tx: &mut TxState) -> Flush {
    loop {
        if conn.stop.load(Ordering::Acquire) {
            return Flush::Closed;
        }
        if tx.off < tx.frame_len {
            match write_some(qp, conn, tx) {
                Ok(n) => {
                    tx.off += n;
                    qp.counters.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    conn.wrote_bytes();
                    if tx.off >= tx.frame_len {
                        fault::after_frame_written();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Flush::WouldBlock,
                Err(e) => {
                    conn.connection_lost(qp, &format!("write failed: {e}"), Some(tx));
                    return Flush::Closed;
                }
            }
            continue;
        }
        let mut eng = lock(&qp.engine);
        if tx.frame_len > 0 {
            eng.confirm_transmit();
            tx.frame.clear();
            tx.frame_len = 0;
            tx.off = 0;
            pump(qp, &mut eng);
        }
        if eng.has_transmit() && eng.poll_transmit(&mut tx.frame, TX_BATCH, &*qp.mem) {
            tx.frame_len = tx.frame.len();
            continue;
        }
        let close = eng.wants_close();
        drop(eng);
        if close {
            conn.shut_write();
        }
        return Flush::Done;
    }
}

fn tx_loop(qp: &QpShared, conn: &Conn) {
    loop {
        let woken = {
            let mut woken = lock(&conn.wake);
            if !*woken && !conn.stop.load(Ordering::Acquire) {
                let sleep = conn.tx_sleep();
                woken = conn
                    .wake_cond
                    .wait_timeout(woken, sleep)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::replace(&mut *woken, false)
        };
        if conn.stop.load(Ordering::Acquire) {
            break;
        }
        // Every wake-up and every TICK: is the peer still there?
        if conn.give_up_if_silent(qp) {
            break;
        }
        let woken = conn.maybe_probe(qp) || woken;
        let woken = conn.maybe_nudge(qp) || woken;
        if !woken {
            continue;
        }
        // Write until done, waiting for socket space holding nothing: a
        // thread in `progress` (an application waiting for this very
        // transfer) may take `tx` meanwhile and push the frame on itself
        // as soon as the peer makes room, instead of waiting for this
        // thread to be scheduled.
        let closed = loop {
            let mut tx = lock(&conn.tx);
            let r = flush(qp, conn, &mut tx);
            if r != Flush::WouldBlock {
                break r == Flush::Closed;
            }
            drop(tx);
            if let Err(e) = sys::poll_one(conn.sock.as_raw_fd(), libc::POLLOUT, TICK) {
                let mut tx = lock(&conn.tx);
                conn.connection_lost(qp, &format!("poll failed: {e}"), Some(&mut tx));
                break true;
            }
            // Every TICK of waiting for room, too: a peer that never opens
            // its window again must not hold the outstanding work forever.
            if conn.give_up_if_silent(qp) {
                break true;
            }
        };
        if closed {
            break;
        }
        if lock(&qp.engine).has_transmit() {
            conn.wake_tx();
        }
    }
    conn.shut_write();
    tracing::trace!(qpn = qp.qpn, "tx thread exits");
}

/// Feed buffered bytes to the engine; returns (consumed, engine is stuck).
fn feed(qp: &QpShared, conn: &Conn, data: &[u8]) -> (usize, bool) {
    if !data.is_empty() {
        conn.heard_from_peer();
    }
    let mut eng = lock(&qp.engine);
    let n = eng.handle_input(data, &*qp.mem);
    let stuck = n == 0 && eng.state() != QpState::Rts;
    pump(qp, &mut eng);
    let tx = eng.has_transmit() || eng.wants_close();
    drop(eng);
    if tx {
        conn.kick(qp);
    }
    (n, stuck)
}

/// The receive side of a connection: the buffer of bytes read but not yet
/// consumed by the engine, and the bulk-mode heuristics. Behind
/// `Conn::rx`: whoever holds it may read the socket (the receive thread,
/// or an application thread in [`Conn::progress`]).
pub(crate) struct RxState {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bulk tagged traffic: keep buffered reads header-sized so that each
    /// segment's payload goes through the direct path.
    bulk: bool,
    /// The last read was a header-sized peek.
    peeked: bool,
    /// The last read returned less than it asked for: the socket is
    /// probably empty, so once its bytes are consumed the pass reports
    /// `Idle` instead of paying for a `recv` that would find nothing (on
    /// the latency path of a busy poller, that `recv` is a socket lock
    /// round trip before the application sees its data).
    short: bool,
    /// Buffered reads block (the receive thread alone reads; see
    /// `rx_exclusive`).
    block: bool,
}

impl RxState {
    pub(crate) fn new() -> RxState {
        RxState {
            buf: vec![0u8; RX_BUF],
            start: 0,
            end: 0,
            bulk: false,
            peeked: false,
            short: false,
            block: false,
        }
    }
}

/// What one receive pass did.
enum Pass {
    /// Bytes were read or consumed; call again.
    Progress,
    /// The socket had nothing and the buffer holds no complete unit.
    Idle,
    /// The last read was short, so the socket is probably empty; its bytes
    /// are consumed. (A blocking reader reads again; others stop.)
    Drained,
    /// The connection is over (EOF or an error), with the reason.
    Closed(String),
}

/// `recv` into `buf` (plain `recv`, not `recvmsg`: a busy poller calls this
/// in a loop, and `recvmsg` costs a message header and iovec import per
/// call on top); non-blocking unless `block`.
fn recv_buf(fd: std::os::fd::RawFd, buf: &mut [u8], block: bool) -> io::Result<usize> {
    if block {
        sys::recv_blocking(fd, buf)
    } else {
        sys::recv_nonblocking(fd, buf)
    }
}

/// One step of receive work, never blocking: feed buffered bytes to the
/// engine, or read once from the socket (straight into a registered region
/// when the engine hints tagged payload, otherwise into the buffer).
fn rx_pass(qp: &QpShared, conn: &Conn, rx: &mut RxState) -> Pass {
    let fd = conn.sock.as_raw_fd();
    if rx.start < rx.end {
        let (n, stuck) = feed(qp, conn, &rx.buf[rx.start..rx.end]);
        rx.start += n;
        if stuck {
            // The QP left RTS (Terminate sent or received): it accepts no
            // more input. Discard until the peer closes.
            rx.start = rx.end;
        }
        if rx.start == rx.end {
            (rx.start, rx.end) = (0, 0);
        } else if n > 0 {
            return Pass::Progress;
        } else {
            // The engine needs more bytes to make progress.
            rx.buf.copy_within(rx.start..rx.end, 0);
            rx.end -= rx.start;
            rx.start = 0;
            if rx.end == rx.buf.len() {
                return Pass::Closed(format!(
                    "engine consumed nothing from a full {RX_BUF}-byte buffer"
                ));
            }
        }
    }
    if std::mem::take(&mut rx.short) {
        return Pass::Drained;
    }
    let hint = if rx.end == 0 {
        lock(&qp.engine).rx_hint()
    } else {
        RxHint::Buffered
    };
    if rx.end == 0 && rx.peeked {
        // Bulk tagged traffic continues while a header-sized read leads
        // straight into tagged payload again.
        rx.bulk = matches!(hint, RxHint::Direct { .. });
    }
    rx.peeked = false;
    match hint {
        // In bulk mode, also finish a segment's shorter remainder directly.
        RxHint::Direct { stag, to, len } if len >= DIRECT_MIN || rx.bulk => {
            let Ok(region) = qp.mem.resolve(stag) else {
                // Deregistered meanwhile: let the engine see the bytes (and
                // fail the access) through the buffered path.
                return match recv_buf(fd, &mut rx.buf, false) {
                    Ok(0) => Pass::Closed("EOF".into()),
                    Ok(n) => {
                        rx.end = n;
                        Pass::Progress
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Pass::Idle,
                    Err(e) => Pass::Closed(format!("read failed: {e}")),
                };
            };
            // The engine validated the range; check again, we are about to
            // let the kernel write there.
            let ptr = match region.ptr_at(to, len as u64) {
                Ok(p) => p,
                Err(e) => {
                    return Pass::Closed(format!(
                        "direct placement outside region {stag:#010x}: {e}"
                    ))
                }
            };
            // One scatter read takes the payload into the region and the
            // FPDU's trailer plus the next header into the buffer, so a bulk
            // stream costs one system call per FPDU.
            let mut iov = [
                libc::iovec {
                    iov_base: ptr.cast(),
                    iov_len: len as usize,
                },
                libc::iovec {
                    iov_base: rx.buf.as_mut_ptr().cast(),
                    iov_len: DIRECT_TAIL,
                },
            ];
            // SAFETY: the first iovec lies inside the region (checked just
            // above), which stays allocated while `region` (an Arc) is held:
            // owned memory lives in the Arc, raw memory is kept alive by the
            // `reg_mr_raw` contract and the MemoryRegion's Drop, which waits
            // for this Arc. The second is the start of `rx.buf`, which is
            // empty (`end == 0`) and at least DIRECT_TAIL long. The call
            // does not block, so the region is held only for one copy.
            let r = unsafe { sys::recv_iovecs(fd, &mut iov) };
            drop(region);
            match r {
                Ok(0) => Pass::Closed("EOF".into()),
                Ok(n) => {
                    // Payload placed straight into memory is news from the
                    // peer too (a long Read Response on a slow path).
                    conn.heard_from_peer();
                    rx.bulk = true;
                    rx.short = n < len as usize + DIRECT_TAIL;
                    let direct = n.min(len as usize);
                    rx.end = n - direct;
                    qp.counters
                        .rx_direct_bytes
                        .fetch_add(direct as u64, Ordering::Relaxed);
                    qp.counters
                        .rx_buffered_bytes
                        .fetch_add(rx.end as u64, Ordering::Relaxed);
                    let mut eng = lock(&qp.engine);
                    eng.handle_direct(direct, &*qp.mem);
                    pump(qp, &mut eng);
                    let tx = eng.has_transmit() || eng.wants_close();
                    drop(eng);
                    if tx {
                        conn.kick(qp);
                    }
                    Pass::Progress
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Pass::Idle,
                Err(e) => Pass::Closed(format!("read failed: {e}")),
            }
        }
        _ => {
            let want = match (rx.end, rx.bulk) {
                (0, true) => {
                    rx.peeked = true;
                    HDR_PEEK
                }
                (0, false) => RX_READ,
                _ => rx.buf.len() - rx.end,
            };
            let end = rx.end;
            match recv_buf(fd, &mut rx.buf[end..end + want], rx.block) {
                Ok(0) => Pass::Closed("EOF".into()),
                Ok(n) => {
                    rx.end += n;
                    rx.short = n < want;
                    qp.counters
                        .rx_buffered_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    Pass::Progress
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    rx.peeked = false;
                    Pass::Idle
                }
                Err(e) => Pass::Closed(format!("read failed: {e}")),
            }
        }
    }
}

/// Feed what `rx` already holds to the engine, without reading the socket
/// (a partial FPDU stays for the next pass).
fn rx_consume_buffered(qp: &QpShared, conn: &Conn, rx: &mut RxState) {
    while rx.start < rx.end {
        let (n, stuck) = feed(qp, conn, &rx.buf[rx.start..rx.end]);
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
fn rx_drain(qp: &QpShared, conn: &Conn, rx: &mut RxState) -> Result<(), String> {
    loop {
        if conn.stop.load(Ordering::Acquire) {
            return Err("stopped".into());
        }
        match rx_pass(qp, conn, rx) {
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
fn rx_exclusive(
    qp: &QpShared,
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
        match rx_pass(qp, conn, rx) {
            Pass::Progress | Pass::Drained => {}
            // A direct read found nothing: wait for readability, holding
            // no region (a deregistration may be waiting for it).
            Pass::Idle => {
                if let Err(e) = sys::poll_one(fd, libc::POLLIN, TICK) {
                    break Err(format!("poll failed: {e}"));
                }
            }
            Pass::Closed(why) => break Err(why),
        }
        if conn.app_polls.load(Ordering::Relaxed) != polls_seen
            || conn.drivers.load(Ordering::Relaxed) > 0
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
    pub(crate) fn progress(&self, qp: &QpShared) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        self.app_polls.fetch_add(1, Ordering::Relaxed);
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

    /// The receive half of [`progress`](Self::progress), `rx` held.
    fn progress_rx(&self, qp: &QpShared, rx: &mut RxState) -> Result<(), String> {
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
    fn progress_tx(&self, qp: &QpShared) {
        // Transmit work too: a frame the socket could not take whole (a
        // large Write or Read Response) is pushed on from here as the peer
        // drains it, so a waiting application does not depend on the
        // transmit thread being scheduled (a scheduler tick on a loaded
        // machine). Only if nobody else is writing.
        let Ok(mut tx) = self.tx.try_lock() else {
            return;
        };
        if tx.off >= tx.frame_len {
            return;
        }
        // Only the holder of `tx` writes, so the difference is ours.
        let c = &qp.counters;
        let before = c.tx_bytes.load(Ordering::Relaxed);
        let r = flush(qp, self, &mut tx);
        drop(tx);
        let sent = c.tx_bytes.load(Ordering::Relaxed).wrapping_sub(before);
        if sent > 0 {
            c.tx_polled_bytes.fetch_add(sent, Ordering::Relaxed);
        }
        if r == Flush::WouldBlock {
            self.wake_tx();
        }
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
    /// An application thread starts driving the receive side (see
    /// [`Drive`](crate::Drive)).
    pub(crate) fn start_driving(&self) {
        self.drivers.fetch_add(1, Ordering::SeqCst);
    }

    /// Application-driven mode on or off (see `ProgressMode::AppDriven`):
    /// while on, the receive thread stays parked as for a live `Drive`.
    pub(crate) fn set_app_driven(&self, on: bool) {
        if self.app_driven.swap(on, Ordering::AcqRel) != on {
            if on {
                self.start_driving();
            } else {
                self.stop_driving();
            }
        }
    }

    /// A driver stops; the last one wakes the receive thread.
    pub(crate) fn stop_driving(&self) {
        if self.drivers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.stop_progress();
        }
    }

    /// The socket, for an application that waits for it to be readable.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    pub(crate) fn stop_progress(&self) {
        self.handbacks.fetch_add(1, Ordering::SeqCst);
        if self.aside.load(Ordering::SeqCst) {
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
/// sleeps [`STEP_ASIDE`] instead of waiting on the socket, so arriving data
/// does not wake it to compete for the CPU with the thread that is already
/// reading. When the poller goes to sleep it says so
/// ([`Conn::stop_progress`], called by `CompletionQueue::wait`), which
/// wakes the receive thread at once; a poller that just stops without
/// saying so is noticed at most two `STEP_ASIDE` slices later.
fn rx_loop(qp: &QpShared, conn: &Conn) {
    let fd = conn.sock.as_raw_fd();
    let _ = conn.rx_thread.set(std::thread::current());
    let mut polls_seen = conn.app_polls.load(Ordering::Relaxed);
    let mut handbacks_seen = conn.handbacks.load(Ordering::SeqCst);
    let mut handed_to_driver = false;
    let why: String = loop {
        if conn.drivers.load(Ordering::SeqCst) > 0 {
            if !handed_to_driver {
                // This thread may have read bytes the driver has not seen
                // (it was blocked in `recv` when the driver came): feed them
                // to the engine now, or a complete message could sit in the
                // buffer while the driver sleeps on an empty socket. What
                // completes wakes the driver through its CQ's fd; the
                // socket itself is left to the driver.
                rx_consume_buffered(qp, conn, &mut lock(&conn.rx));
                handed_to_driver = true;
            }
            // An application thread waits on the socket and reads it: stay
            // out of its way until it lets go (`stop_driving` unparks;
            // `aside` then `drivers` here and the reverse order there, both
            // SeqCst, so one of the two sees the other).
            conn.aside.store(true, Ordering::SeqCst);
            if conn.drivers.load(Ordering::SeqCst) > 0 && !conn.stop.load(Ordering::Acquire) {
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
        handed_to_driver = false;
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
        let r = rx_drain(qp, conn, &mut lock(&conn.rx));
        if let Err(why) = r {
            break why;
        }
        if calls > SPINNING_POLLS {
            // Step aside, unless the poller has just handed back (see
            // `Conn::stop_progress` for why this cannot miss it).
            conn.aside.store(true, Ordering::SeqCst);
            if conn.handbacks.load(Ordering::SeqCst) == handbacks_seen {
                qp.counters.rx_steps_aside.fetch_add(1, Ordering::Relaxed);
                std::thread::park_timeout(STEP_ASIDE);
            }
            conn.aside.store(false, Ordering::SeqCst);
            continue;
        }
        // Someone polls now and then: wait holding nothing, so that it can
        // take `rx` meanwhile.
        if let Err(e) = sys::poll_one(fd, libc::POLLIN, TICK) {
            break format!("poll failed: {e}");
        }
    };
    conn.connection_lost(qp, &why, None);
    tracing::trace!(qpn = qp.qpn, "rx thread exits");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mulpdu_fits_the_mss() {
        // Ethernet MSS 1460: FPDU = 2 + ULPDU + pad + 4 must fit.
        let m = mulpdu_for_mss(1460, false);
        assert_eq!(m, 1460 - 6);
        assert_eq!(iwarp_proto::wire::mpa::fpdu_len(m as usize, true), 1460);
        // With markers, 4 bytes per 512 of stream are lost as well.
        let mk = mulpdu_for_mss(1460, true);
        assert_eq!(mk, 1460 - (6 + 4 * 3));
        // 9000-byte jumbo frames, odd MSS.
        assert_eq!(mulpdu_for_mss(8947, false), 8947 - 6 - 3);
        assert!(iwarp_proto::wire::mpa::fpdu_len(8938, false) <= 8947);
        // Loopback MSS (65483) still fits the 16-bit ULPDU length field;
        // anything larger is capped.
        assert_eq!(mulpdu_for_mss(65483, false), 65474);
        assert_eq!(mulpdu_for_mss(200_000, false), MULPDU_CAP);
        // Nonsense inputs are clamped.
        assert!(mulpdu_for_mss(0, true) >= 128);
        assert_eq!(mulpdu_for_mss(u32::MAX, false), MULPDU_CAP);
    }

    #[test]
    fn mulpdu_for_path_uses_whole_segments_up_to_64k() {
        use iwarp_proto::wire::mpa::fpdu_len;
        // Ethernet (MSS 1448): 45 segments per FPDU, exactly.
        let m = mulpdu_for_path(1448, false);
        assert_eq!(fpdu_len(m as usize, true), 45 * 1448);
        assert!(m <= MULPDU_CAP);
        // Jumbo frames (MSS 8948): 7 segments.
        let j = mulpdu_for_path(8948, false);
        assert_eq!(fpdu_len(j as usize, true), 7 * 8948);
        // Loopback: one segment already holds 64 KiB; early-connection
        // MSS of 32 KiB gives two segments.
        assert_eq!(mulpdu_for_path(65483, false), 65474);
        assert_eq!(
            fpdu_len(mulpdu_for_path(32768, false) as usize, true),
            65536
        );
        // With markers, one FPDU per segment as before.
        assert_eq!(mulpdu_for_path(1448, true), mulpdu_for_mss(1448, true));
        // Nonsense inputs stay in range.
        for mss in [0, 1, 255, 257, 100_000, u32::MAX] {
            let m = mulpdu_for_path(mss, false);
            assert!((128..=MULPDU_CAP).contains(&m), "mss {mss}: {m}");
        }
    }
}
