//! Completions in: feeding work completions to the flow, a failed queue
//! pair or a broken protocol ending the stream, the readiness descriptor
//! and watermark callbacks kept in step, and the progress thread's and
//! completion hook's entries.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

use iwarp::{WcQueue, WcStatus, WorkCompletion};

use crate::flow::{FlowError, Phase, SendTag};

use super::types::{Conn, Marks, State, Watermark, WatermarkFn, HOOK_CONN};
use super::wrid::decode;

impl Conn {
    pub(super) fn broke(&self, st: &mut State, kind: io::ErrorKind, why: String) {
        if st.broken.is_none() {
            tracing::debug!(conn = self.id, %why, "stream broken");
            st.broken = Some((kind, why));
        }
    }

    /// The queue pair failed: the stream is reset unless it had closed in
    /// order.
    pub(super) fn qp_failed(&self, st: &mut State, status: WcStatus) {
        if st.broken.is_some() {
            return;
        }
        let mut why = format!(
            "the iWARP connection failed ({}): the peer was killed, reset the connection or \
             sent a Terminate",
            status.as_str()
        );
        while let Some(ev) = self.qp.next_event(Duration::ZERO) {
            why.push_str(&format!("; {ev:?}"));
        }
        match st.flow.phase() {
            Phase::Disconnected => {} // closed in order; the flush is the teardown
            _ => self.broke(st, io::ErrorKind::ConnectionReset, why),
        }
    }

    pub(super) fn complete(&self, st: &mut State, wc: WorkCompletion) {
        st.completions += 1;
        let ok = wc.status == WcStatus::Success;
        match wc.queue {
            WcQueue::Recv => {
                if ok {
                    let slot = (wc.wr_id & 0xffff) as usize;
                    let n = (wc.byte_len as usize).min(4);
                    let mut word = [0u8; 4];
                    self.rbuf
                        .read_at(self.slots_at as usize + 4 * slot, &mut word[..n]);
                    if st.awaiting_first_word {
                        self.first_word(st);
                    }
                    let r = if wc.byte_len as usize != 4 {
                        // Let the flow judge it (a malformed word).
                        st.flow.on_recv(&word[..n])
                    } else {
                        st.flow.on_recv(&word)
                    };
                    if let Err(e) = r {
                        self.flow_failed(st, e);
                    }
                } else {
                    st.flow.on_recv_failed();
                    self.qp_failed(st, wc.status);
                }
            }
            WcQueue::Send => {
                let Some(tag) = decode(wc.wr_id) else {
                    self.broke(
                        st,
                        io::ErrorKind::Other,
                        format!("completion with unknown wr_id {:#x}", wc.wr_id),
                    );
                    return;
                };
                match tag {
                    SendTag::DataWrite { .. } => st.inflight = st.inflight.saturating_sub(1),
                    SendTag::ZcopyWrite { .. } => st.zc_inflight = st.zc_inflight.saturating_sub(1),
                    _ => {}
                }
                if !ok {
                    // First, so the error names the failed connection.
                    self.qp_failed(st, wc.status);
                }
                if let Err(e) = st.flow.on_send_complete(tag, ok) {
                    self.flow_failed(st, e);
                }
            }
        }
    }

    /// The peer's first message arrived on the active side, which always
    /// sent first (its credit update, then maybe data): send one
    /// zero-length RDMA Write (the rsockets keepalive frame) now. A Linux
    /// siw responder can leave FPDUs that arrive while it finishes its
    /// connection setup unread in its socket until more bytes come, and an
    /// rsockets server on siw sends its own credit update unprompted, which
    /// the `iwarp` crate's wake-up nudge takes for an answer (it nudges only
    /// a silent peer): without this, our first FPDUs could wait there for
    /// ever while both sides wait for each other. Bytes from the peer prove
    /// its receive path is installed, so these arrive where it reads them.
    pub(super) fn first_word(&self, st: &mut State) {
        st.awaiting_first_word = false;
        // Queued now, posted with the other actions of this drain; without
        // a free control slot it is skipped (control words are on the way,
        // and they wake the peer's reader the same way).
        let _ = st.flow.keepalive();
    }

    pub(super) fn flow_failed(&self, st: &mut State, e: FlowError) {
        let kind = match e {
            FlowError::SendFailed => io::ErrorKind::ConnectionReset,
            other => other.kind(),
        };
        let why = e.to_string();
        self.broke(st, kind, why);
        if let FlowError::Protocol(_) = e {
            // The peer broke the protocol: tear the connection down now
            // (it may keep writing into our ring).
            self.qp.disconnect();
        }
    }

    /// Feeds every queued completion to the flow, posts what follows,
    /// updates readiness and wakes waiters. Returns whether anything came.
    pub(super) fn drain(&self, st: &mut State) -> bool {
        let mut any = false;
        while let Some(wc) = self.cq.poll_one() {
            any = true;
            self.complete(st, wc);
        }
        if any {
            self.iomap_progress(st);
            self.push_buffered(st);
            self.pump(st);
            self.refresh(st);
            // Threads still waiting may have slept through the completions
            // this drain took (`wake_waiters`).
            self.wake_waiters(st);
        }
        any
    }

    /// Whether buffered bytes should go now: the wire is idle (no data
    /// Write of ours waits to be handed to TCP), or a full message is
    /// ready. Otherwise they wait for the Write ahead of them and later
    /// writes join them.
    pub(super) fn should_push(st: &State) -> bool {
        st.inflight == 0 || st.flow.buffered() >= crate::flow::MAX_TRANSFER
    }

    /// Sends buffered bytes if [`Conn::should_push`] says so.
    pub(super) fn push_buffered(&self, st: &mut State) {
        if st.flow.buffered() > 0 && Self::should_push(st) {
            let mut t = self.target();
            let before = t;
            st.flow.push(&mut t);
            self.write_back(&before, &t);
        }
    }

    /// Updates the readiness descriptor from the state.
    pub(super) fn refresh(&self, st: &mut State) {
        let readable = st.flow.poll_readable() || st.broken.is_some();
        let writable = st.broken.is_some() || !st.flow.is_writable() || self.can_write(st);
        self.ready.show(readable, writable);
        if st.marks.cb.is_some() {
            let r = st.broken.is_some()
                || !st.flow.is_readable()
                || (st.flow.bytes_queued() >= st.marks.rcvlowat.max(1));
            let w = st.broken.is_some()
                || !st.flow.is_writable()
                || (st.flow.send_space() >= st.marks.sndlowat.max(1) && self.can_write(st));
            if r && !st.marks.read_fired {
                st.marks.read_fired = true;
                st.marks.due.push(Watermark::Readable);
            }
            st.marks.read_fired &= r;
            if w && !st.marks.write_fired {
                st.marks.write_fired = true;
                st.marks.due.push(Watermark::Writable);
            }
            st.marks.write_fired &= w;
        }
    }

    /// Releases the lock, then runs the watermark callbacks that became
    /// due (never under the lock: a callback may read or write).
    pub(super) fn unlock_and_notify(&self, mut st: MutexGuard<'_, State>) {
        if st.marks.due.is_empty() {
            return;
        }
        let due = std::mem::take(&mut st.marks.due);
        let cb = st.marks.cb.clone();
        drop(st);
        if let Some(cb) = cb {
            for ev in due {
                cb(ev);
            }
        }
    }

    /// Sets the watermark callback: `cb(Readable)` when at least
    /// `rcvlowat` bytes are readable (or end of stream / error),
    /// `cb(Writable)` when at least `sndlowat` bytes of send buffer are
    /// free (or writes would fail). Each fires once per crossing: again
    /// only after its condition went false (data read, buffer filled). It
    /// runs on the progress thread or on a thread inside a stream call,
    /// never with the stream locked.
    pub(crate) fn set_watermarks(&self, rcvlowat: u64, sndlowat: u32, cb: Option<WatermarkFn>) {
        let mut st = self.lock();
        st.marks = Marks {
            cb,
            rcvlowat,
            sndlowat,
            ..Marks::default()
        };
        self.drain(&mut st);
        self.refresh(&mut st);
        self.unlock_and_notify(st);
    }

    /// The progress thread's entry: drain, unless a thread is in a stream
    /// call (it drains before it leaves) or waits on the completion queue
    /// (it is woken by the same completion and drains it itself). Returns
    /// false when it left the work to such a thread and *parked* the
    /// stream: the progress thread stops watching its CQ descriptor (which
    /// stays readable until that thread drains) until [`Conn::unpark`].
    pub(crate) fn progress(&self) -> bool {
        let busy = || {
            self.cq_waiters.load(Ordering::SeqCst) > 0 || self.in_call.load(Ordering::SeqCst) > 0
        };
        if busy() {
            // Parked first, then looked again: a call that ended between
            // the two looks either sees the flag (`settle_parked`) or is
            // seen to have ended here (the fences of SeqCst order them).
            self.parked.store(true, Ordering::SeqCst);
            if busy() {
                return false;
            }
            self.parked.store(false, Ordering::SeqCst);
        }
        let mut st = self.lock();
        // Again under the lock: a thread that started waiting meanwhile
        // (it registers before it releases the lock) drains it itself.
        if busy() {
            return true;
        }
        self.drain(&mut st);
        self.unlock_and_notify(st);
        true
    }

    /// The completion hook (`CompletionQueue::set_completion_hook`): the
    /// provider thread that queued completions (the receive thread, the
    /// transmit thread, or the rdma-core provider's pump) feeds them to the
    /// flow and updates readiness itself, so a program blocked in `poll`
    /// on the readiness descriptor is woken by that thread directly rather
    /// than through the progress thread (one thread hand-off less per
    /// message). Leaves the completions to a thread that waits on the CQ
    /// (`Conn::wait`: queuing them woke it). Declines (returns false, and
    /// the CQ descriptor becomes readable) when the stream is locked by
    /// someone else or has watermark callbacks, which must not run on the
    /// provider's threads: then the progress thread does the work,
    /// watching the stream again if it had parked it. Never blocks.
    pub(crate) fn on_completions(&self) -> bool {
        if HOOK_CONN.with(|h| h.get()) == Some(self.id) {
            // Completions of what this very drain posted: the loop below
            // looks again.
            return true;
        }
        // The completions were queued before this runs; a waiter counts
        // itself off before it drains (`Conn::wait`). With a fence on each
        // side, either this sees the waiter, which then drains what was
        // queued, or the waiter's drain sees the completions.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.cq_waiters.load(Ordering::SeqCst) > 0 {
            // A thread sleeps on the CQ (`Conn::wait`, outside a call:
            // `close`; inside one the hook is not run). Queuing woke it,
            // and it drains before it looks at the stream.
            return true;
        }
        let busy = || self.in_call.load(Ordering::SeqCst) > 0;
        if busy() {
            // A thread in a stream call drains before it leaves (and
            // `end` hands what came after its drain to the descriptor).
            return true;
        }
        let mut st = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.unpark();
                return false;
            }
        };
        if self.cq_waiters.load(Ordering::SeqCst) > 0 {
            return true;
        }
        if st.marks.cb.is_some() || busy() {
            let handled = busy();
            if !handled {
                self.unpark();
            }
            return handled;
        }
        HOOK_CONN.with(|h| h.set(Some(self.id)));
        let mut done = false;
        for _ in 0..16 {
            if !self.drain(&mut st) {
                done = true;
                break;
            }
        }
        HOOK_CONN.with(|h| h.set(None));
        if !done {
            self.unpark();
        }
        done
    }

    /// The progress thread's keepalive tick.
    pub(crate) fn tick(&self) {
        if !self.opts.keepalive {
            return;
        }
        let mut st = self.lock();
        if st.idle && st.broken.is_none() && st.flow.keepalive() {
            self.pump(&mut st);
        }
        st.idle = true;
    }
}
