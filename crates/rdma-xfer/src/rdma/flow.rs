//! The transport's credit and grant bookkeeping as sans-IO state machines:
//! no verbs, no threads, no clock. The callers feed them events (a
//! message to send, a receive or Send completion, a grant, a block) and
//! carry out the actions they return (post this Send, post this pair,
//! grant this block, hand this block to the sink).
//!
//! - [`CtrlCredits`]: the control channel — who may send (receive credits
//!   and free send slots), which Sends are signaled, what a completion
//!   frees.
//! - [`SourcePairing`]: the source — filled blocks waiting for a grant,
//!   grants waiting for a block, when to ask for more grants, stale
//!   grants of an earlier transfer.
//! - [`SinkWindow`]: the sink — which blocks are granted, how many more
//!   the source wants, the reorder window, checking each `BlockDone`, and
//!   when the transfer is complete.
//! - [`pick_stream`]: the source — which data stream carries a block.

use std::collections::VecDeque;

use crate::msg::{Grant, Msg};
use crate::Reorder;

/// A control message that may leave now: emit it with `credits` into send
/// slot `slot` and post it, then report [`CtrlCredits::sent`] or
/// [`CtrlCredits::send_failed`].
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CtrlSend {
    pub(super) msg: Msg,
    pub(super) slot: u32,
    /// Receive credits returned to the peer with the message.
    pub(super) credits: u16,
    pub(super) signaled: bool,
}

/// The control channel's credits and send slots.
///
/// Each side keeps `recvs` receives posted; a message spends one of the
/// peer's (a credit) and returns the ones we reposted since our last
/// message. The last credit is kept for a `Credit` message, so two sides
/// that both run out can always return theirs. Sends are signaled every
/// `signal_every`th time and whenever the last free slot goes; a signaled
/// completion frees its slot and every slot posted before it.
#[derive(Debug)]
pub(super) struct CtrlCredits {
    recvs: u32,
    signal_every: u32,
    credits: u32,
    unreturned: u32,
    backlog: VecDeque<Msg>,
    free_slots: Vec<u32>,
    /// Posted slots, oldest first (freed by the next signaled completion).
    in_flight: VecDeque<u32>,
    /// Unsignaled Sends posted since the last signaled one.
    unsignaled: u32,
}

impl CtrlCredits {
    /// The state after session setup, which sends no control message (the
    /// negotiation rides in the MPA handshakes, [`crate::hello`]): the
    /// peer's `recvs` receives are all ours to use.
    pub(super) fn new(recvs: u32, slots: u32, signal_every: u32) -> CtrlCredits {
        CtrlCredits {
            recvs,
            signal_every,
            credits: recvs,
            unreturned: 0,
            backlog: VecDeque::new(),
            free_slots: (0..slots).rev().collect(),
            in_flight: VecDeque::new(),
            unsignaled: 0,
        }
    }

    /// Queue a message; it leaves (in order) once [`Self::next_send`]
    /// allows.
    pub(super) fn queue(&mut self, msg: Msg) {
        self.backlog.push_back(msg);
    }

    /// The next queued message that credits and a free slot allow to
    /// leave now, with its slot taken.
    pub(super) fn next_send(&mut self) -> Option<CtrlSend> {
        let front = self.backlog.front()?;
        let need = if matches!(front, Msg::Credit) { 1 } else { 2 };
        if self.credits < need || self.free_slots.is_empty() {
            return None;
        }
        let msg = self.backlog.pop_front()?;
        let slot = self.free_slots.pop()?;
        Some(CtrlSend {
            msg,
            slot,
            credits: self.unreturned.min(u32::from(u16::MAX)) as u16,
            signaled: self.free_slots.is_empty() || self.unsignaled + 1 >= self.signal_every,
        })
    }

    /// `s` was posted.
    pub(super) fn sent(&mut self, s: &CtrlSend) {
        self.credits -= 1;
        self.unreturned -= u32::from(s.credits);
        self.in_flight.push_back(s.slot);
        self.unsignaled = if s.signaled { 0 } else { self.unsignaled + 1 };
    }

    /// Posting `s` failed: its slot is free again, and nothing queued
    /// will leave (the session fails).
    pub(super) fn send_failed(&mut self, s: &CtrlSend) {
        self.free_slots.push(s.slot);
        self.backlog.clear();
    }

    /// A control receive was consumed (and reposted) carrying `returned`
    /// credits: count them and the one we now owe; queue a `Credit`
    /// message once half the receives are owed and nothing else would
    /// carry them.
    pub(super) fn on_recv(&mut self, returned: u16) {
        self.credits += u32::from(returned);
        self.unreturned += 1;
        if self.unreturned >= self.recvs / 2 && self.backlog.is_empty() {
            self.backlog.push_back(Msg::Credit);
        }
    }

    /// The signaled Send of `slot` completed: it and every Send posted
    /// before it are done. A slot not in flight is ignored.
    pub(super) fn on_send_done(&mut self, slot: u32) {
        if !self.in_flight.contains(&slot) {
            return;
        }
        while let Some(s) = self.in_flight.pop_front() {
            self.free_slots.push(s);
            if s == slot {
                break;
            }
        }
    }
}

/// The source's pairing stage: filled blocks (`B`) waiting for a grant,
/// and grants waiting for a block.
#[derive(Debug)]
pub(super) struct SourcePairing<B> {
    depth: u32,
    /// Grants of other transfers are stale and dropped.
    transfer: u64,
    blocks: VecDeque<B>,
    grants: VecDeque<Grant>,
    /// Grants asked for (pre-request) and not yet received.
    asked: u32,
    /// Grants for the next transfer that came before it began: a sink
    /// with [`crate::hello::feature::PREGRANT`] grants ahead, as if the
    /// next `Begin` had asked for the whole pool.
    early: Vec<Grant>,
}

impl<B> SourcePairing<B> {
    /// An idle stage for a pool of `depth` blocks (no transfer yet: every
    /// grant is stale).
    pub(super) fn new(depth: u32) -> SourcePairing<B> {
        SourcePairing {
            depth,
            transfer: 0,
            blocks: VecDeque::new(),
            grants: VecDeque::new(),
            asked: 0,
            early: Vec::new(),
        }
    }

    /// Start `transfer`, whose `Begin` pre-requests `depth` grants, of
    /// which those granted ahead (for this transfer) are already here.
    /// Anything left of an earlier transfer is dropped.
    pub(super) fn begin(&mut self, transfer: u64) {
        let early = if transfer == self.transfer + 1 {
            std::mem::take(&mut self.early)
        } else {
            Vec::new()
        };
        // A sink never grants more than its pool; a hostile one that did
        // is cut to it.
        let n = early.len().min(self.depth as usize);
        *self = SourcePairing {
            transfer,
            asked: self.depth - n as u32,
            grants: early.into_iter().take(n).collect(),
            ..SourcePairing::new(self.depth)
        };
    }

    /// Add a filled block and/or grants (of `transfer`), and push every
    /// pair that completes onto `pairs`. Returns how many more grants to
    /// request (asked for before they run out: at half the pool).
    pub(super) fn offer(
        &mut self,
        block: Option<B>,
        grants: Option<(u64, Vec<Grant>)>,
        pairs: &mut Vec<(B, Grant)>,
    ) -> u32 {
        let mut request = 0;
        if let Some(b) = block {
            self.blocks.push_back(b);
        }
        if let Some((t, gs)) = grants {
            if t == self.transfer + 1 {
                // Granted ahead for the next transfer: kept for its begin.
                let room = (self.depth as usize).saturating_sub(self.early.len());
                self.early.extend(gs.into_iter().take(room));
                return 0;
            }
            if t != self.transfer {
                return 0;
            }
            self.asked = self.asked.saturating_sub(gs.len() as u32);
            self.grants.extend(gs);
        }
        while !self.blocks.is_empty() && !self.grants.is_empty() {
            let (Some(b), Some(g)) = (self.blocks.pop_front(), self.grants.pop_front()) else {
                break;
            };
            pairs.push((b, g));
            let have = self.asked + self.grants.len() as u32;
            // Round up, so that a depth of 1 asks again as well.
            if have < self.depth.div_ceil(2) {
                let n = self.depth - have;
                self.asked += n;
                request += n;
            }
        }
        request
    }
}

/// The data stream that carries the source's block `seq`, given how many
/// blocks each stream has posted and not yet handed to TCP (`queued`):
/// the least queued, ties going to `seq % streams` and the streams after
/// it, so a path whose streams keep pace keeps the plain round robin.
///
/// Why not the round robin alone (issue 27, 100 ms RTT, 1 % loss): each
/// stream's TCP spends round trips in loss recovery at its own moments
/// (`ss -ti` on the sender, 8 streams: congestion windows of 579 to 5,622
/// packets side by side); a block given to a stream in recovery waits
/// behind its full send buffer while the others sit idle, and the sink's
/// pool fills with blocks waiting in order behind it. The streams'
/// completions say which one is free.
pub(super) fn pick_stream(seq: u64, queued: &[u32]) -> usize {
    let n = queued.len();
    if n <= 1 {
        return 0;
    }
    let start = (seq % n as u64) as usize;
    (0..n)
        .map(|i| (start + i) % n)
        .min_by_key(|&i| queued[i])
        .unwrap_or(start)
}

/// The sink's side of one transfer: its pool of `depth` landing blocks,
/// which are free, granted or waiting in the reorder stage, and how far
/// the transfer is.
#[derive(Debug)]
pub(super) struct SinkWindow {
    depth: u32,
    block_size: u32,
    free: Vec<u32>,
    granted: Vec<bool>,
    /// Grants the source asked for and has not got.
    pending: u32,
    /// Most blocks granted and not yet done at once (the autotuned
    /// window, `1..=depth`; [`crate::tune::Autotune`]).
    limit: u32,
    /// Blocks granted and not yet done.
    out: u32,
    // Every waiting block holds a granted buffer, and the source numbers
    // blocks in order, so an honest source never gets `depth` blocks
    // ahead of the first missing one.
    reorder: Reorder<(u32, u32)>,
    end: Option<(u64, u64)>,
    bytes: u64,
}

impl SinkWindow {
    /// A transfer whose `Begin` pre-requested `prerequest` grants.
    pub(super) fn new(depth: u32, block_size: u32, prerequest: u32) -> SinkWindow {
        SinkWindow {
            depth,
            block_size,
            free: (0..depth).rev().collect(),
            granted: vec![false; depth as usize],
            pending: prerequest.min(depth),
            limit: depth,
            out: 0,
            reorder: Reorder::with_window(u64::from(depth)),
            end: None,
            bytes: 0,
        }
    }

    /// The next block to grant (free and wanted), marked granted.
    pub(super) fn next_grant(&mut self) -> Option<u32> {
        if self.pending == 0 || self.out >= self.limit {
            return None;
        }
        let b = self.free.pop()?;
        self.granted[b as usize] = true;
        self.pending -= 1;
        self.out += 1;
        Some(b)
    }

    /// Grant at most `n` blocks at once from now on (`1..=depth`). Grants
    /// already out stay valid; a smaller window takes effect as they come
    /// back.
    pub(super) fn set_limit(&mut self, n: u32) {
        self.limit = n.clamp(1, self.depth);
    }

    /// The source asks for `n` more grants.
    pub(super) fn on_request(&mut self, n: u32) {
        self.pending = (self.pending + n).min(self.depth);
    }

    /// `BlockDone`: the source wrote block `seq` (`len` bytes) into
    /// granted block `block`. Errors are protocol violations.
    pub(super) fn on_block_done(&mut self, seq: u64, len: u32, block: u32) -> Result<(), String> {
        if block >= self.depth || !self.granted[block as usize] || len == 0 || len > self.block_size
        {
            return Err(format!(
                "BlockDone for block {block} ({len} bytes) that was not granted"
            ));
        }
        self.granted[block as usize] = false;
        self.out -= 1;
        self.reorder
            .insert(seq, (block, len))
            .map_err(|e| e.to_string())
    }

    /// The next block in sequence to hand to the sink: (block, length).
    /// Report [`Self::written`] once the sink is done with it.
    pub(super) fn next_ready(&mut self) -> Option<(u32, u32)> {
        self.reorder.pop()
    }

    /// Block `block` (`len` bytes) is written: it counts and is free.
    pub(super) fn written(&mut self, block: u32, len: u32) {
        self.bytes += u64::from(len);
        self.free.push(block);
    }

    /// `End`: the source sent `blocks` blocks, `bytes` bytes.
    pub(super) fn on_end(&mut self, blocks: u64, bytes: u64) {
        self.end = Some((blocks, bytes));
    }

    /// Once every announced block is written: `Ok((blocks, bytes))`, or
    /// an error if the bytes differ from the announced ones. `None` while
    /// blocks are outstanding or before `End`.
    pub(super) fn finished(&self) -> Option<Result<(u64, u64), String>> {
        let (blocks, total) = self.end?;
        if self.reorder.delivered() != blocks {
            return None;
        }
        Some(if total != self.bytes {
            Err(format!(
                "source announced {total} bytes, {} arrived",
                self.bytes
            ))
        } else {
            Ok((blocks, self.bytes))
        })
    }

    /// Blocks granted and not yet reported done.
    #[cfg(test)]
    fn outstanding(&self) -> usize {
        self.granted.iter().filter(|g| **g).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(block: u32) -> Grant {
        Grant {
            block,
            rkey: 7,
            addr: 0x1000 * u64::from(block),
        }
    }

    fn drain(c: &mut CtrlCredits) -> Vec<CtrlSend> {
        let mut out = Vec::new();
        while let Some(s) = c.next_send() {
            c.sent(&s);
            out.push(s);
        }
        out
    }

    #[test]
    fn ctrl_messages_leave_in_order_returning_credits() {
        let mut c = CtrlCredits::new(32, 32, 8);
        c.queue(Msg::Request { n: 1 });
        c.queue(Msg::Request { n: 2 });
        let sent = drain(&mut c);
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].msg, Msg::Request { n: 1 });
        // Setup consumed no receive: nothing to return yet.
        assert_eq!((sent[0].credits, sent[1].credits), (0, 0));
        assert_eq!((sent[0].slot, sent[1].slot), (0, 1));
        assert!(!sent[0].signaled && !sent[1].signaled);
        assert_eq!(c.credits, 30);
        // A consumed receive goes back with the next message.
        c.on_recv(0);
        c.queue(Msg::Request { n: 3 });
        assert_eq!(drain(&mut c)[0].credits, 1);
    }

    #[test]
    fn ctrl_keeps_the_last_credit_for_a_credit_message() {
        let mut c = CtrlCredits::new(4, 32, 8);
        for n in 0..5 {
            c.queue(Msg::Request { n });
        }
        // 4 credits: three messages, the fourth waits, keeping one.
        assert_eq!(drain(&mut c).len(), 3);
        assert_eq!(c.credits, 1);
        // Two receives consumed: half of 4 owed, but the backlog will
        // carry them, so no Credit message is queued; nothing can leave.
        c.on_recv(0);
        c.on_recv(0);
        assert!(c.next_send().is_none());
        assert_eq!(c.backlog.len(), 2);
        // The peer returns credits: the rest leaves, the first carrying
        // the three receives we owe.
        c.on_recv(3);
        let sent = drain(&mut c);
        assert_eq!(sent.len(), 2);
        assert_eq!(sent.iter().map(|s| s.credits).collect::<Vec<_>>(), [3, 0]);
        assert_eq!(c.credits, 2);
    }

    #[test]
    fn ctrl_queues_a_credit_message_when_half_the_receives_are_owed() {
        let mut c = CtrlCredits::new(4, 32, 8);
        c.on_recv(0);
        assert!(drain(&mut c).is_empty(), "one of four owed: not yet");
        c.on_recv(0);
        let sent = drain(&mut c);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].msg, Msg::Credit);
        assert_eq!(sent[0].credits, 2);
        // A Credit message needs only the last credit.
        let mut c = CtrlCredits::new(2, 32, 8);
        c.queue(Msg::Request { n: 1 });
        assert_eq!(drain(&mut c).len(), 1);
        c.on_recv(0);
        assert_eq!(c.credits, 1);
        assert_eq!(drain(&mut c)[0].msg, Msg::Credit);
    }

    #[test]
    fn ctrl_signals_every_nth_and_the_last_slot_and_frees_in_order() {
        let mut c = CtrlCredits::new(32, 3, 2);
        for n in 0..4 {
            c.queue(Msg::Request { n });
        }
        let sent = drain(&mut c);
        assert_eq!(sent.len(), 3);
        assert_eq!(
            sent.iter().map(|s| s.signaled).collect::<Vec<_>>(),
            [false, true, true]
        );
        // No slot: the fourth waits for a completion.
        assert!(c.next_send().is_none());
        // The completion of slot 1 frees slots 0 and 1.
        c.on_send_done(sent[1].slot);
        assert_eq!(c.free_slots.len(), 2);
        assert_eq!(drain(&mut c).len(), 1);
    }

    #[test]
    fn ctrl_ignores_a_completion_for_a_slot_not_in_flight() {
        let mut c = CtrlCredits::new(32, 4, 8);
        c.queue(Msg::Request { n: 1 });
        let s = drain(&mut c).remove(0);
        c.on_send_done(3);
        assert_eq!(c.in_flight.len(), 1);
        c.on_send_done(s.slot);
        c.on_send_done(s.slot);
        assert_eq!(c.free_slots.len(), 4);
        assert!(c.in_flight.is_empty());
    }

    #[test]
    fn ctrl_failed_post_frees_the_slot_and_drops_the_backlog() {
        let mut c = CtrlCredits::new(32, 4, 8);
        c.queue(Msg::Request { n: 1 });
        c.queue(Msg::Request { n: 2 });
        let s = c.next_send().unwrap();
        c.send_failed(&s);
        assert_eq!(c.free_slots.len(), 4);
        assert_eq!(c.credits, 32);
        assert!(c.next_send().is_none());
    }

    #[test]
    fn pairing_pairs_in_order_and_asks_again_at_half_the_pool() {
        let mut p = SourcePairing::new(4);
        p.begin(1);
        let mut pairs = Vec::new();
        assert_eq!(p.offer(Some('a'), None, &mut pairs), 0);
        assert!(pairs.is_empty());
        assert_eq!(
            p.offer(None, Some((1, vec![grant(2), grant(0)])), &mut pairs),
            0
        );
        assert_eq!(pairs, [('a', grant(2))]);
        // Two grants asked and one held: 3 >= 2, no request yet.
        pairs.clear();
        assert_eq!(p.offer(Some('b'), None, &mut pairs), 0);
        assert_eq!(pairs, [('b', grant(0))]);
        // The remaining two arrive; pairing one leaves 1 < 2: ask for 3.
        pairs.clear();
        assert_eq!(
            p.offer(None, Some((1, vec![grant(1), grant(3)])), &mut pairs),
            0
        );
        assert_eq!(p.offer(Some('c'), None, &mut pairs), 3);
        assert_eq!(pairs, [('c', grant(1))]);
    }

    #[test]
    fn pairing_with_a_pool_of_one_asks_after_every_block() {
        let mut p = SourcePairing::new(1);
        p.begin(1);
        let mut pairs = Vec::new();
        p.offer(None, Some((1, vec![grant(0)])), &mut pairs);
        assert_eq!(p.offer(Some(0u64), None, &mut pairs), 1);
        assert_eq!(p.offer(Some(1), None, &mut pairs), 0);
        assert_eq!(pairs.len(), 1);
        assert_eq!(p.offer(None, Some((1, vec![grant(0)])), &mut pairs), 1);
        assert_eq!(pairs.len(), 2);
    }

    #[test]
    fn pairing_drops_stale_grants() {
        let mut p: SourcePairing<u8> = SourcePairing::new(2);
        let mut pairs = Vec::new();
        // Before any transfer, and of an earlier transfer.
        p.offer(None, Some((1, vec![grant(0)])), &mut pairs);
        p.begin(2);
        p.offer(None, Some((1, vec![grant(1)])), &mut pairs);
        p.offer(Some(9), None, &mut pairs);
        assert!(pairs.is_empty());
        assert_eq!(p.blocks.len(), 1);
        // A new transfer drops the waiting block.
        p.begin(3);
        assert!(p.blocks.is_empty() && p.grants.is_empty());
        assert_eq!(p.asked, 2);
    }

    #[test]
    fn pairing_keeps_grants_for_the_next_transfer_until_it_begins() {
        let mut p = SourcePairing::new(4);
        let mut pairs = Vec::new();
        // Before the first transfer: grants for transfer 1 come ahead
        // (PREGRANT); a block of transfer 1 then pairs at once, and only
        // the grants not yet received are still asked for.
        p.offer(
            None,
            Some((1, vec![grant(0), grant(1), grant(2)])),
            &mut pairs,
        );
        assert!(pairs.is_empty());
        p.begin(1);
        assert_eq!(p.asked, 1, "4 pre-requested, 3 already granted");
        assert_eq!(p.offer(Some('a'), None, &mut pairs), 0);
        assert_eq!(pairs, [('a', grant(0))]);
        // During transfer 1, grants for transfer 2 wait for it; those
        // for transfer 3 (not next) are stale.
        pairs.clear();
        p.offer(None, Some((2, vec![grant(3)])), &mut pairs);
        p.offer(None, Some((3, vec![grant(1)])), &mut pairs);
        assert_eq!(p.early, [grant(3)]);
        p.begin(2);
        assert_eq!(p.offer(Some('b'), None, &mut pairs), 0);
        assert_eq!(pairs, [('b', grant(3))]);
        // More than the pool ahead is cut to the pool.
        let mut p = SourcePairing::new(2);
        p.offer(None, Some((1, (0..5).map(grant).collect())), &mut pairs);
        p.begin(1);
        assert_eq!((p.grants.len(), p.asked), (2, 0));
    }

    #[test]
    fn blocks_go_to_the_least_queued_stream_else_round_robin() {
        // Streams that keep pace: the round robin.
        let picks: Vec<usize> = (0..8).map(|seq| pick_stream(seq, &[1, 1, 1, 1])).collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
        // Stream 2 is in loss recovery with 3 blocks in its send buffer:
        // its turn goes to the next least queued stream.
        assert_eq!(pick_stream(2, &[1, 1, 3, 1]), 3);
        assert_eq!(pick_stream(6, &[0, 1, 3, 1]), 0);
        // A source that follows the picks never queues a block on the
        // stalled stream while another has room.
        let mut q = [0u32, 0, 50, 0];
        for seq in 0..100 {
            let s = pick_stream(seq, &q);
            assert_ne!(s, 2, "block {seq} queued behind the stalled stream");
            q[s] += 1;
            if seq % 3 == 0 {
                // The free streams complete blocks as they go.
                for (i, v) in q.iter_mut().enumerate() {
                    if i != 2 {
                        *v = v.saturating_sub(1);
                    }
                }
            }
        }
        assert_eq!(pick_stream(5, &[]), 0);
        assert_eq!(pick_stream(5, &[7]), 0);
    }

    /// Grant everything wanted.
    fn grants(w: &mut SinkWindow) -> Vec<u32> {
        std::iter::from_fn(|| w.next_grant()).collect()
    }

    /// Write every block ready, in order: (block, len) pairs.
    fn write_ready(w: &mut SinkWindow) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        while let Some((b, l)) = w.next_ready() {
            w.written(b, l);
            out.push((b, l));
        }
        out
    }

    #[test]
    fn sink_normal_flow_with_reordering() {
        let mut w = SinkWindow::new(4, 100, 4);
        assert_eq!(grants(&mut w), [0, 1, 2, 3]);
        assert_eq!(w.outstanding(), 4);
        w.on_block_done(1, 100, 1).unwrap();
        assert!(write_ready(&mut w).is_empty());
        w.on_block_done(0, 100, 0).unwrap();
        assert_eq!(write_ready(&mut w), [(0, 100), (1, 100)]);
        // The source asks for more: the written blocks are granted again.
        w.on_request(2);
        assert_eq!(grants(&mut w), [1, 0]);
        w.on_block_done(2, 100, 2).unwrap();
        w.on_block_done(3, 50, 3).unwrap();
        w.on_end(4, 350);
        assert_eq!(w.finished(), None);
        write_ready(&mut w);
        assert_eq!(w.finished(), Some(Ok((4, 350))));
        assert_eq!(w.outstanding(), 2);
    }

    #[test]
    fn sink_grants_no_more_than_asked_or_free() {
        let mut w = SinkWindow::new(2, 100, 1);
        assert_eq!(grants(&mut w), [0]);
        w.on_request(10);
        // Capped at the pool: one more is free.
        assert_eq!(grants(&mut w), [1]);
        assert_eq!(w.pending, 1);
        w.on_block_done(0, 1, 0).unwrap();
        assert!(grants(&mut w).is_empty());
        write_ready(&mut w);
        assert_eq!(grants(&mut w), [0]);
    }

    #[test]
    fn sink_grants_within_the_autotuned_window() {
        let mut w = SinkWindow::new(8, 100, 8);
        w.set_limit(3);
        assert_eq!(grants(&mut w), [0, 1, 2]);
        // A block back frees a place in the window (once written, its
        // buffer is free again).
        w.on_block_done(0, 100, 0).unwrap();
        assert_eq!(grants(&mut w), [3]);
        write_ready(&mut w);
        // The window grows: the rest of the asked-for grants go out.
        w.set_limit(100);
        assert_eq!(grants(&mut w), [0, 4, 5, 6], "the pending four");
        assert_eq!(w.outstanding(), 7);
        // Shrinking never recalls grants; it holds new ones back.
        w.set_limit(0);
        w.on_request(8);
        for (seq, b) in [(1, 1), (2, 2), (3, 3)] {
            w.on_block_done(seq, 100, b).unwrap();
        }
        write_ready(&mut w);
        assert!(grants(&mut w).is_empty(), "4 still out, window 1");
    }

    #[test]
    fn sink_refuses_a_block_it_did_not_grant() {
        let mut w = SinkWindow::new(4, 100, 2);
        grants(&mut w);
        // Outside the pool, in the pool but not granted, and granted but
        // reported twice.
        assert!(w.on_block_done(0, 10, 4).is_err());
        assert!(w.on_block_done(0, 10, 2).is_err());
        w.on_block_done(0, 10, 0).unwrap();
        assert!(w.on_block_done(1, 10, 0).is_err());
    }

    #[test]
    fn sink_refuses_bad_lengths() {
        let mut w = SinkWindow::new(2, 100, 2);
        grants(&mut w);
        assert!(w.on_block_done(0, 0, 0).is_err());
        assert!(w.on_block_done(0, 101, 0).is_err());
        w.on_block_done(0, 100, 0).unwrap();
    }

    #[test]
    fn sink_refuses_a_block_beyond_the_window_and_duplicates() {
        let mut w = SinkWindow::new(2, 100, 2);
        grants(&mut w);
        let e = w.on_block_done(2, 10, 0).unwrap_err();
        assert!(e.contains("beyond the reorder window"), "{e}");
        w.on_block_done(0, 10, 1).unwrap();
        write_ready(&mut w);
        w.on_request(1);
        grants(&mut w);
        let e = w.on_block_done(0, 10, 1).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn sink_end_with_the_wrong_byte_count_fails() {
        let mut w = SinkWindow::new(2, 100, 2);
        grants(&mut w);
        w.on_block_done(0, 60, 0).unwrap();
        write_ready(&mut w);
        w.on_end(1, 100);
        let e = w.finished().unwrap().unwrap_err();
        assert_eq!(e, "source announced 100 bytes, 60 arrived");
    }

    #[test]
    fn sink_end_with_blocks_outstanding_is_not_finished() {
        let mut w = SinkWindow::new(4, 100, 4);
        grants(&mut w);
        w.on_block_done(1, 10, 1).unwrap();
        w.on_end(2, 20);
        // Block 0 never came; block 1 waits in the reorder stage.
        assert_eq!(w.finished(), None);
        assert_eq!(w.outstanding(), 3);
        assert_eq!(w.reorder.waiting(), 1);
        // An empty transfer is finished at once.
        let mut w = SinkWindow::new(4, 100, 4);
        w.on_end(0, 0);
        assert_eq!(w.finished(), Some(Ok((0, 0))));
    }
}
