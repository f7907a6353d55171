//! What a software QP's connection does with its state (`state.rs`): the
//! liveness rules (peer timeout, probes, wake-up nudges), scheduling work
//! for the progress pool, handing the right to read the socket between
//! threads (`claim_rx` / `release_rx`), and losing the connection. It
//! imports only the leaf `state.rs`; `rx.rs`, `tx.rs`, `progress.rs` and
//! `pool.rs` call these methods on the `Conn` they hold.

use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::state::*;
use crate::sys;

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
        if eng.reads_outstanding() > 0 || !eng.post_probe(crate::state::PROBE_WR_ID) {
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
        if !qp.lock_engine().post_nudge(crate::state::PROBE_WR_ID) {
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
        qp.push_event(iwarp_verbs::QpEvent::PeerTimeout(why.clone()));
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
    /// A writer let go of `tx`: if a pool thread found it held meanwhile
    /// (`tx_wanted`, see `pool.rs`'s `tx_work`), queue the transmit work it
    /// left; if `disconnect` waits for the last frames to leave
    /// (`Conn::shutdown`), it looks again now. Every holder of `tx` calls
    /// this after letting go.
    pub(super) fn tx_released(&self) {
        // Pairs with the fence in `tx_work`: either this load sees the
        // pool thread's flag, or the pool thread's second `try_lock` sees
        // `tx` free (both fences SeqCst, the store-buffer pattern).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.tx_wanted.load(Ordering::Relaxed) && self.tx_wanted.swap(false, Ordering::SeqCst) {
            self.schedule(WORK_TX);
        }
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
