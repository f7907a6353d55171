//! The state of a software QP's connection, which every other module of
//! the provider works on: the socket, the receive and transmit state
//! (`RxState`, `TxState`) behind their locks, the liveness rules (peer
//! timeout, probes, wake-up nudges), and losing the connection. It uses no
//! sibling module: `rx.rs` and `tx.rs` build on it, and `progress.rs`
//! (threads, who reads, start and teardown) on all three, with `pool.rs`
//! (the progress pool) between them. The pool reaches a connection only
//! through [`PoolLink`] and the [`Waker`] trait defined here, so this file
//! still imports no sibling.

use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_proto::engine::TxFrame;
use socket2::Socket;

use crate::mr::MrInner;

use crate::sys;

use super::{lock, pump, SoftQp};

/// Slice of the transmit thread's waits, so that it notices `stop`.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// Application `progress` calls between two looks of the receive thread
/// (or pool thread) above which it considers the application to be busy
/// polling.
pub(super) const SPINNING_POLLS: u64 = 64;
/// How long the receive thread (or pool thread) steps aside while an
/// application thread busy-polls.
pub(super) const STEP_ASIDE: Duration = Duration::from_millis(1);

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
    /// Milliseconds since `epoch` when bytes last arrived, as of the last
    /// [`Conn::last_rx_ms`] (read it through that).
    pub(super) last_rx_ms: AtomicU64,
    /// Bytes arrived since `last_rx_ms` was last brought up to date.
    pub(super) rx_unstamped: AtomicBool,
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
    /// We send markers (RFC 5044 §5): one FPDU per write, each written
    /// with `MSG_EOR`, so that every FPDU is alone in its TCP segment.
    pub(super) fpdu_per_segment: bool,
    /// We shut down our write side.
    pub(super) write_shut: AtomicBool,
    pub(super) live: Mutex<usize>,
    pub(super) live_cond: Condvar,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Set when the connection is served by the progress pool (`pool.rs`)
    /// instead of its own two threads; never changes afterwards.
    pub(super) pool: std::sync::OnceLock<PoolLink>,
    /// Pool work due for this connection (`WORK_*` bits); see
    /// [`Conn::schedule`].
    pub(super) pending: AtomicU8,
    /// Pooled connections only: who does the receive work now
    /// (`RX_FREE`, `RX_HELD`, `RX_AGAIN`); see [`Conn::claim_rx`].
    pub(super) rx_owner: AtomicU8,
}

/// Pool work bits (see [`Conn::schedule`]): read what the socket holds...
pub(super) const WORK_RX: u8 = 1;
/// ...write what the engine has...
pub(super) const WORK_TX: u8 = 2;
/// ...recompute the epoll interest (application-driven mode or stepping
/// aside changed)...
pub(super) const WORK_REARM: u8 = 4;
/// ...the connection is over: leave the pool.
pub(super) const WORK_CLOSE: u8 = 8;

/// `Conn::rx_owner`: nobody does the receive work.
pub(super) const RX_FREE: u8 = 0;
/// One thread does it.
pub(super) const RX_HELD: u8 = 1;
/// One thread does it, and the pool was told the socket became readable
/// meanwhile: the holder runs one more pass before it lets go.
pub(super) const RX_AGAIN: u8 = 2;

/// Where a pooled connection's work is queued.
pub(super) trait Waker: Send + Sync {
    /// Queue `token` for the pool thread serving it (and wake it).
    fn wake(&self, token: u64);
}

/// A pooled connection's place in the pool: its pool thread and its key
/// in that thread's table.
pub(super) struct PoolLink {
    pub(super) token: u64,
    pub(super) worker: Arc<dyn Waker>,
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

/// What the connection manager knows about a handshaken socket when it
/// hands it to the driver (`Conn::start`), so that nobody asks the
/// kernel twice.
pub(crate) struct SockState {
    /// Our address, if known without `getsockname` (the listener's, when
    /// it is bound to a specific address).
    pub(crate) local: Option<SocketAddr>,
    /// The peer's address.
    pub(crate) peer: SocketAddr,
    /// The socket is in non-blocking mode (`O_NONBLOCK`).
    pub(crate) nonblocking: bool,
    /// `TCP_NODELAY` and keepalive are in force (set on our listener,
    /// which the accepted socket inherits).
    pub(crate) tuned: bool,
}

/// The connection's liveness settings, from
/// [`ConnParam`](crate::cm::ConnParam).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    pub(crate) peer_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) wake_nudge: bool,
    /// Markers are negotiated for what we send: one FPDU per TCP segment
    /// (see [`Conn::fpdu_per_segment`]).
    pub(crate) fpdu_per_segment: bool,
}

impl Conn {
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Bytes arrived from the peer. Only a flag: this runs for every
    /// message on its way to the application, and reading the clock there
    /// cost about 100 cycles in a VM (a tenth of what the busy-polled
    /// ping-pong spends above TCP). The time is taken by whoever needs it
    /// ([`Conn::last_rx_ms`]): the transmit thread at every wake-up (at
    /// least every [`TICK`]) and every write of ours while nudges may be
    /// sent, so the recorded time is late by at most that much, which
    /// only makes a silent peer's timeout run that much longer.
    pub(super) fn heard_from_peer(&self) {
        if !self.rx_unstamped.load(Ordering::Relaxed) {
            self.rx_unstamped.store(true, Ordering::Relaxed);
        }
    }

    /// Milliseconds since `epoch` when bytes last arrived, as far as is
    /// known now (see [`Conn::heard_from_peer`]).
    pub(super) fn last_rx_ms(&self) -> u64 {
        if self.rx_unstamped.swap(false, Ordering::Relaxed) {
            let now = self.now_ms();
            self.last_rx_ms.fetch_max(now, Ordering::Relaxed).max(now)
        } else {
            self.last_rx_ms.load(Ordering::Relaxed)
        }
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
        let last_rx = self.last_rx_ms();
        let now = self.now_ms();
        let limit = self.peer_timeout.as_millis() as u64;
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
        let owed = qp.lock_engine().reads_outstanding();
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
            .last_rx_ms()
            .max(self.last_probe_ms.load(Ordering::Relaxed));
        if now.saturating_sub(quiet_since) < every {
            return false;
        }
        let mut eng = qp.lock_engine();
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
        if !qp.lock_engine().post_nudge(super::PROBE_WR_ID) {
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
        if self.last_rx_ms() > last_tx {
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
            // Bytes that arrived before these get a time no later than
            // theirs, so "the peer sent nothing since our last bytes"
            // (`nudge_due_ms`) stays true for them.
            let _ = self.last_rx_ms();
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
            let mut eng = qp.lock_engine();
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
        // A pooled connection leaves its pool thread's epoll set (before
        // the socket can be closed: the pool holds the `Conn`).
        self.schedule(WORK_CLOSE);
        qp.report_disconnected();
    }
}

impl Conn {
    /// A writer let go of `tx`: if `disconnect` waits for the last frames
    /// to leave (`Conn::shutdown`), it looks again now. One relaxed load
    /// when nobody waits.
    pub(super) fn tx_released(&self) {
        if self.lingering.load(Ordering::Acquire) {
            let _g = lock(&self.linger_lock);
            self.linger_cond.notify_all();
        }
    }

    /// Wake the transmit side: the transmit thread, or for a pooled
    /// connection its pool thread.
    pub(crate) fn wake_tx(&self) {
        if self.schedule(WORK_TX) {
            return;
        }
        *lock(&self.wake) = true;
        self.wake_cond.notify_one();
    }

    /// True if the progress pool serves this connection.
    pub(super) fn pooled(&self) -> bool {
        self.pool.get().is_some()
    }

    /// Queue pool work (`WORK_*` bits) for this connection; false (and
    /// nothing done) if the connection is not pooled. Only the call that
    /// finds no work pending queues the connection, so a busy connection
    /// costs one queue entry however often it is woken; the pool thread
    /// takes the bits with a `swap` before it does the work, so bits set
    /// during that work queue it again.
    pub(super) fn schedule(&self, bits: u8) -> bool {
        let Some(link) = self.pool.get() else {
            return false;
        };
        if self.pending.fetch_or(bits, Ordering::SeqCst) == 0 {
            link.worker.wake(link.token);
        }
        true
    }

    /// Become the reader of a pooled connection (the one mechanism by which
    /// a pool thread and application threads hand the receive work over:
    /// one owner at a time, no thread ever waits for another). True if the
    /// caller now owns the receive work; it must then call
    /// [`release_rx`](Self::release_rx) until that returns true.
    ///
    /// `notify` (a pool thread told that the socket became readable): if
    /// another thread owns the work, make it run one more pass before it
    /// lets go, so the edge-triggered readiness is not lost. Application
    /// threads do not notify: the owner reads whatever the socket holds
    /// anyway.
    pub(super) fn claim_rx(&self, notify: bool) -> bool {
        loop {
            match self.rx_owner.compare_exchange(
                RX_FREE,
                RX_HELD,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(RX_HELD) if notify => {
                    if self
                        .rx_owner
                        .compare_exchange(RX_HELD, RX_AGAIN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return false;
                    }
                    // Released meanwhile: try to take it.
                }
                Err(_) => return false,
            }
        }
    }

    /// Let go of the receive work claimed with [`claim_rx`](Self::claim_rx):
    /// true if released, false if the pool asked for one more pass (the
    /// caller still owns the work and must run it, then call this again).
    pub(super) fn release_rx(&self) -> bool {
        match self
            .rx_owner
            .compare_exchange(RX_HELD, RX_FREE, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(_) => {
                self.rx_owner.store(RX_HELD, Ordering::Release);
                false
            }
        }
    }

    pub(super) fn shut_write(&self) {
        if !self.write_shut.swap(true, Ordering::AcqRel) {
            let _ = self.sock.shutdown(Shutdown::Write);
        }
    }
}

/// Confirm a frame that is entirely in the socket (`tx` held, engine not).
pub(super) fn confirm_written(qp: &SoftQp, tx: &mut TxState) {
    if tx.frame_len > 0 && tx.off >= tx.frame_len {
        let mut eng = qp.lock_engine();
        eng.confirm_transmit();
        pump(qp, &mut eng);
        tx.frame.clear();
        tx.frame_len = 0;
        tx.off = 0;
    }
}

/// Bytes of the frame being written and how much of it is out.
#[derive(Default)]
pub(crate) struct TxState {
    pub(super) frame: TxFrame,
    pub(super) frame_len: usize,
    pub(super) off: usize,
    /// Regions held alive during one `sendmsg` (kept for its capacity).
    pub(super) hold: Vec<Arc<MrInner>>,
    /// The iovecs of one `sendmsg` (kept for its capacity).
    pub(super) iov: IovBuf,
    /// Where a small frame is gathered for one `send` (see `write_some`).
    pub(super) small: SmallBuf,
}

/// The gather buffer of a small frame, allocated once per connection
/// rather than zeroed on the stack at every write.
pub(super) struct SmallBuf(pub(super) Box<[u8; super::tx::SMALL_SEND]>);

impl Default for SmallBuf {
    fn default() -> SmallBuf {
        SmallBuf(Box::new([0; super::tx::SMALL_SEND]))
    }
}

/// Reusable iovec storage, so a write allocates nothing.
#[derive(Default)]
pub(super) struct IovBuf(pub(super) Vec<libc::iovec>);

// SAFETY: `IovBuf` is empty between calls of `write_some`, which clears it
// on every exit (errors included), so the raw pointers it holds never
// outlive the borrow they were taken under and are never seen by another
// thread; only the capacity moves between threads.
unsafe impl Send for IovBuf {}

/// Size of the receive buffer (room for any partial FPDU), allocated at a
/// connection's first receive pass.
pub const RX_BUF: usize = 256 * 1024;

/// The receive side of a connection: the buffer of bytes read but not yet
/// consumed by the engine, and the bulk-mode heuristics. Behind
/// `Conn::rx`: whoever holds it may read the socket (the receive thread,
/// or an application thread in [`Conn::progress`]).
pub(crate) struct RxState {
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Bulk tagged traffic: keep buffered reads header-sized so that each
    /// segment's payload goes through the direct path.
    pub(super) bulk: bool,
    /// The last read was a header-sized peek.
    pub(super) peeked: bool,
    /// The last read returned less than it asked for: the socket is
    /// probably empty, so once its bytes are consumed the pass reports
    /// `Idle` instead of paying for a `recv` that would find nothing (on
    /// the latency path of a busy poller, that `recv` is a socket lock
    /// round trip before the application sees its data).
    pub(super) short: bool,
    /// Buffered reads block (the receive thread alone reads; see
    /// `rx_exclusive`).
    pub(super) block: bool,
    /// The engine has something to send after this pass (a Read Response,
    /// a Terminate): the caller transmits (`progress.rs`).
    pub(super) tx_due: bool,
}

impl RxState {
    /// The buffer, allocated ([`RX_BUF`] bytes) on first use.
    pub(super) fn ready(&mut self) {
        if self.buf.is_empty() {
            self.buf = vec![0u8; RX_BUF];
        }
    }

    pub(crate) fn new() -> RxState {
        RxState {
            // Allocated by the first receive pass (`RxState::ready`): a
            // connection that is set up and never receives costs no
            // 256 KiB mapping (an mmap and a munmap per connection).
            buf: Vec::new(),
            start: 0,
            end: 0,
            bulk: false,
            peeked: false,
            short: false,
            block: false,
            tx_due: false,
        }
    }
}
