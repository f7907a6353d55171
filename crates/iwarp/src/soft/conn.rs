//! The connection of a software QP: its socket, its driver threads, the
//! liveness rules (peer timeout, probes, wake-up nudges) and teardown.

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::sys;

use super::progress::*;
use super::rx::*;
use super::tx::*;
use super::{lock, pump, SoftQp};

/// How long `disconnect` lets queued frames (a Terminate) leave before
/// shutting the socket down.
pub const LINGER: Duration = Duration::from_secs(1);
/// How long `disconnect` waits for the driver threads to exit.
pub(super) const JOIN_WAIT: Duration = Duration::from_secs(2);
/// Slice of the transmit thread's waits, so that it notices `stop`.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// `Conn::quiet_since_ms` when the peer owes nothing.
pub(super) const NOT_OWED: u64 = u64::MAX;
/// Wake-up nudges (see `Conn::maybe_nudge`): the silence after our last
/// bytes before the first one, doubled for each next one.
pub(super) const NUDGE_FIRST_GAP_MS: u64 = 20;
/// At most this many nudges per connection...
pub(super) const NUDGE_MAX: u32 = 6;
/// ...and only this long after the connection went live: the race they
/// repair is with the peer's connection setup.
pub(super) const NUDGE_WINDOW_MS: u64 = 2_000;

/// The connection of a QP: its socket and the driver's shared state.
pub(crate) struct Conn {
    pub(super) sock: Socket,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    pub(super) tx: Mutex<TxState>,
    pub(super) rx: Mutex<RxState>,
    /// Calls of [`Conn::progress`] by application threads (busy polling).
    pub(super) app_polls: AtomicU64,
    /// Bumped by [`Conn::stop_progress`]: an application thread that
    /// polled is about to sleep, so the receive thread must not step aside.
    pub(super) handbacks: AtomicU64,
    /// The receive thread is stepping aside (parked for up to
    /// [`STEP_ASIDE`], or while `app_driven` is set); `stop_progress`
    /// unparks it.
    pub(super) aside: AtomicBool,
    /// One of the QP's CQs is in `ProgressMode::AppDriven`: application
    /// threads wait on the socket themselves and do the receive work, so
    /// the receive thread stays parked.
    pub(super) app_driven: AtomicBool,
    /// The receive thread, for `unpark` (set by the thread itself).
    pub(super) rx_thread: std::sync::OnceLock<std::thread::Thread>,
    pub(super) wake: Mutex<bool>,
    pub(super) wake_cond: Condvar,
    /// Set when the connection is over: threads exit.
    pub(super) stop: AtomicBool,
    /// The engine was told the peer is gone.
    pub(super) down: AtomicBool,
    /// [`ConnParam::peer_timeout`](crate::cm::ConnParam::peer_timeout).
    pub(super) peer_timeout: Duration,
    /// [`ConnParam::probe_interval`](crate::cm::ConnParam::probe_interval).
    pub(super) probe_interval: Duration,
    /// Milliseconds since `epoch` when the last probe was queued.
    pub(super) last_probe_ms: AtomicU64,
    /// Wake-up nudges still allowed (0: off, or done); see
    /// [`Conn::maybe_nudge`].
    pub(super) nudges_left: AtomicU32,
    /// Milliseconds since `epoch` when we last wrote bytes (kept only
    /// while `nudges_left > 0`; `NOT_OWED`: nothing written yet).
    pub(super) last_tx_ms: AtomicU64,
    /// Milliseconds since `epoch` when the last nudge was queued.
    pub(super) last_nudge_ms: AtomicU64,
    /// When the connection started (the clock of the fields below).
    pub(super) epoch: Instant,
    /// Milliseconds since `epoch` when bytes last arrived.
    pub(super) last_rx_ms: AtomicU64,
    /// Milliseconds since `epoch` since when the peer owes Read Responses
    /// with all our data acknowledged (`NOT_OWED`: it owes nothing).
    pub(super) quiet_since_ms: AtomicU64,
    /// Bytes of ours the peer had acknowledged at the last look
    /// (`tx_bytes - SIOCOUTQ`; only its changes matter).
    pub(super) acked_mark: AtomicU64,
    /// Milliseconds since `epoch` since when data of ours sits in the
    /// socket and the peer acknowledges none of it (`NOT_OWED`: no such
    /// stall).
    pub(super) stalled_since_ms: AtomicU64,
    /// `shutdown` waits for the last frames to leave: writers notify
    /// `linger_cond` (under `linger_lock`) when they release `tx`.
    pub(super) lingering: AtomicBool,
    pub(super) linger_lock: Mutex<()>,
    pub(super) linger_cond: Condvar,
    /// We shut down our write side.
    pub(super) write_shut: AtomicBool,
    pub(super) live: Mutex<usize>,
    pub(super) live_cond: Condvar,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
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

/// The connection's liveness settings, from
/// [`ConnParam`](crate::cm::ConnParam).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    pub(crate) peer_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) wake_nudge: bool,
}

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
    /// socket. The engine must already be established.
    pub(crate) fn start(qp: &Arc<SoftQp>, sock: Socket, live: &Liveness) -> io::Result<Arc<Conn>> {
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
            lingering: AtomicBool::new(false),
            linger_lock: Mutex::new(()),
            linger_cond: Condvar::new(),
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

    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Bytes arrived from the peer.
    pub(super) fn heard_from_peer(&self) {
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
    pub(super) fn peer_silent(&self, qp: &SoftQp) -> Option<String> {
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
    pub(super) fn maybe_probe(&self, qp: &SoftQp) -> bool {
        if self.probe_interval.is_zero() || self.peer_timeout.is_zero() {
            return false;
        }
        if qp.info.get().is_some_and(|i| i.mpa.ord == 0) {
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
        if eng.reads_outstanding() > 0 || !eng.post_probe(super::PROBE_WR_ID) {
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
    pub(super) fn maybe_nudge(&self, qp: &SoftQp) -> bool {
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
        if !lock(&qp.engine).post_nudge(super::PROBE_WR_ID) {
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
    pub(super) fn nudge_due_ms(&self) -> Option<u64> {
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
    pub(super) fn tx_sleep(&self) -> Duration {
        match self.nudge_due_ms() {
            Some(due) => Duration::from_millis(due.saturating_sub(self.now_ms()).max(1)).min(TICK),
            None => TICK,
        }
    }

    /// Bytes of ours went to the socket (recorded only while nudges may
    /// still be sent).
    pub(super) fn wrote_bytes(&self) {
        if self.nudges_left.load(Ordering::Relaxed) > 0 {
            self.last_tx_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Apply [`Conn::peer_silent`]: if the peer is to be given up, end the
    /// connection (flushing outstanding work, with the reason as the QP's
    /// event) and return true.
    pub(super) fn give_up_if_silent(&self, qp: &SoftQp) -> bool {
        let Some(why) = self.peer_silent(qp) else {
            return false;
        };
        tracing::warn!(qpn = qp.qpn, peer = %self.peer, "{why}");
        qp.push_event(crate::QpEvent::PeerTimeout(why.clone()));
        self.connection_lost(qp, &why, None);
        true
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
    pub(super) fn connection_lost(&self, qp: &SoftQp, why: &str, held: Option<&mut TxState>) {
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::debug!(qpn = qp.qpn, peer = %self.peer, why, "connection closed");
            // The stop flag makes a writer that holds `tx` give it up (it
            // checks the flag after every write and every poll slice).
            self.stop.store(true, Ordering::Release);
            self.wake_tx();
            match held {
                Some(tx) => confirm_written(qp, tx),
                // `tx` is held only across non-blocking writes and engine
                // calls, never across a wait (the transmit thread waits for
                // socket space after releasing it), and a writer gives it
                // up at its next write once `stop` is set: a plain `lock`
                // is bounded. Lock order rx -> tx -> engine holds: callers
                // hold at most `rx` here.
                None => confirm_written(qp, &mut lock(&self.tx)),
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
        // A receive thread parked for an application-driven CQ (or
        // stepping aside) sees `stop` now instead of after its park slice,
        // so teardown does not wait for it.
        if let Some(t) = self.rx_thread.get() {
            t.unpark();
        }
        self.tx_released();
        qp.report_disconnected();
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
                Ok(tx) => tx.off >= tx.frame_len && !lock(&qp.engine).has_transmit(),
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
