//! What the session's threads share: the verbs objects, the control
//! channel's send path and the source's block/grant pairing.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iwarp::{
    CompletionQueue, MemoryRegion, QpEvent, QueuePair, RecvWr, SendWr, SgList, Sge, WrOpcode,
};

use crate::msg::{Grant, Msg, MSG_BUF};
use crate::Error;

use super::base::{
    data_recv_slots, lock, wr_id, Fail, CTRL_RECVS, DATA_MSG, K_CTRL_RECV, K_CTRL_SEND,
    K_DATA_RECV, K_DATA_SEND, K_DATA_WRITE,
};
use super::flow::{pick_stream, CtrlCredits, SourcePairing};
use super::handoff::Handoff;

/// Everything the threads share.
pub(super) struct Shared {
    pub(super) cq: CompletionQueue,
    pub(super) ctrl_qp: QueuePair,
    pub(super) data_qps: Vec<QueuePair>,
    /// Control slots: [`CTRL_RECVS`] receive slots, then [`CTRL_SLOTS`]
    /// send slots, of [`MSG_BUF`] bytes.
    pub(super) ctrl_msgs: MemoryRegion,
    /// Data slots: `streams × depth` receive slots, then `depth` send
    /// slots (one per source block), of [`DATA_MSG`] bytes.
    pub(super) data_msgs: MemoryRegion,
    pub(super) depth: u32,
    /// Per data stream: blocks posted and not yet handed to TCP (their
    /// `BlockDone` Send has not completed), for [`pick_stream`].
    pub(super) queued: Vec<AtomicU32>,
    pub(super) ctrl: Mutex<CtrlCredits>,
    pub(super) pairing: Mutex<SourcePairing<Filled>>,
    /// The right to take completions off the CQ, and what handling them
    /// needs: held by the dispatcher thread while it drains the CQ, and by
    /// a transfer's caller while it waits (see [`RdmaSession::wait`]).
    pub(super) dispatch: Mutex<Dispatch>,
    pub(super) fail: Mutex<Option<Fail>>,
    pub(super) failed: AtomicBool,
    pub(super) stop: AtomicBool,
    /// The source sent a transfer's `End` and awaits the sink's `Fin`: a
    /// flushed data-stream receive is then the sink closing its streams
    /// after its `Fin` (see `threads::dispatch`).
    pub(super) awaiting_fin: AtomicBool,
    /// Who takes the completions, and the threads' bells (`handoff`).
    pub(super) handoff: Arc<Handoff>,
}

impl Shared {
    /// Why a work request was flushed, from the QPs' events: a Terminate
    /// either way (RFC 5040 §4.8; e.g. our MPA CRC check failed, RFC 5044
    /// §4.4), or a peer given up as silent; else the peer closed or
    /// vanished. The event is queued right after the flushed completions,
    /// so an empty queue is looked at once more after a moment.
    pub(super) fn why_flushed(&self) -> String {
        for attempt in 0..2 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            for qp in std::iter::once(&self.ctrl_qp).chain(&self.data_qps) {
                while let Some(ev) = qp.next_event(Duration::ZERO) {
                    match ev {
                        QpEvent::TerminateSent(t) => {
                            return format!("this side ended the connection with a Terminate: {t}")
                        }
                        QpEvent::TerminateReceived(t) => {
                            return format!("the peer ended the connection with a Terminate: {t}")
                        }
                        QpEvent::PeerTimeout(why) => return why,
                        _ => {}
                    }
                }
            }
        }
        "the peer closed the connection or vanished".to_string()
    }

    pub(super) fn set_fail(&self, f: Fail) {
        let mut g = lock(&self.fail);
        if g.is_none() {
            tracing::debug!(fail = ?f, "transfer session failed");
            *g = Some(f);
        }
        self.failed.store(true, Ordering::Release);
        // A caller waiting for completions learns it now, not at its
        // deadline (a failure set by the sender thread comes with none).
        self.handoff.caller.ring();
    }

    pub(super) fn check(&self) -> Result<(), Error> {
        if self.failed.load(Ordering::Acquire) {
            let g = lock(&self.fail);
            if let Some(f) = g.as_ref() {
                return Err(f.to_error());
            }
        }
        Ok(())
    }

    pub(super) fn post_ctrl_recv(&self, slot: u32) -> Result<(), Error> {
        self.ctrl_qp
            .post_recv(&RecvWr {
                wr_id: wr_id(K_CTRL_RECV, 0, u64::from(slot)),
                sgl: SgList::single(self.ctrl_msgs.sge(slot as usize * MSG_BUF, MSG_BUF)),
            })
            .map_err(|e| Error::Disconnected(format!("posting a control receive: {e:?}")))
    }

    pub(super) fn data_recv_off(&self, qp: usize, slot: u32) -> usize {
        (qp * data_recv_slots(self.depth) as usize + slot as usize) * DATA_MSG
    }

    pub(super) fn data_send_off(&self, block: u32) -> usize {
        (self.data_qps.len() * data_recv_slots(self.depth) as usize + block as usize) * DATA_MSG
    }

    /// Repost the consumed data receive slots `slots` of stream `qp`.
    pub(super) fn post_data_recvs(&self, qp: usize, slots: &[u32]) -> Result<(), Error> {
        let wrs: Vec<RecvWr> = slots
            .iter()
            .map(|&slot| RecvWr {
                wr_id: wr_id(K_DATA_RECV, qp, u64::from(slot)),
                sgl: SgList::single(self.data_msgs.sge(self.data_recv_off(qp, slot), DATA_MSG)),
            })
            .collect();
        self.data_qps[qp]
            .post_recv_list(&wrs)
            .map_err(|e| Error::Disconnected(format!("posting data receives: {e:?}")))
    }

    /// Queue a control message; it leaves as soon as credits and a send
    /// slot allow, in order.
    pub(super) fn ctrl_send(&self, msg: Msg) {
        let mut st = lock(&self.ctrl);
        st.queue(msg);
        self.flush(&mut st);
    }

    /// Post every control message [`CtrlCredits`] lets leave now.
    pub(super) fn flush(&self, st: &mut CtrlCredits) {
        while let Some(s) = st.next_send() {
            let mut buf = [0u8; MSG_BUF];
            let len = s.msg.emit(s.credits, &mut buf);
            let off = (CTRL_RECVS + s.slot) as usize * MSG_BUF;
            self.ctrl_msgs.write_at(off, &buf[..len]);
            let r = self.ctrl_qp.post_send(&SendWr {
                wr_id: wr_id(K_CTRL_SEND, 0, u64::from(s.slot)),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctrl_msgs.sge(off, len)),
                signaled: s.signaled,
                solicited: false,
            });
            match r {
                Ok(()) => st.sent(&s),
                Err(e) => {
                    st.send_failed(&s);
                    self.set_fail(Fail::Disconnected(format!(
                        "posting a control message: {e:?}"
                    )));
                    break;
                }
            }
        }
    }

    /// A control receive was consumed (and reposted): account the credits
    /// the message returned and the one we now owe.
    pub(super) fn on_ctrl_recv(&self, returned: u16) {
        let mut st = lock(&self.ctrl);
        st.on_recv(returned);
        self.flush(&mut st);
    }

    /// A signaled control Send completed: it and every Send posted before
    /// it are done, so their slots are free.
    pub(super) fn on_ctrl_send_done(&self, slot: u32) {
        let mut st = lock(&self.ctrl);
        st.on_send_done(slot);
        self.flush(&mut st);
    }
}

/// A filled source block: where it is, its sequence number, its index.
pub(super) type Filled = (Sge, u64, u32);

/// For the sender thread: a pair to post, or `None` to stop (the session
/// ends).
pub(super) type ToSender = Option<(Filled, Grant)>;

impl Shared {
    /// Add a filled block and/or grants to the pairing stage and post
    /// every pair that completes: from this thread, or through the sender
    /// thread if `to_sender` is given. Asks for more grants before they run
    /// out (pre-request, at half the pool).
    pub(super) fn offer(
        &self,
        block: Option<Filled>,
        grants: Option<(u64, Vec<Grant>)>,
        to_sender: Option<&Sender<ToSender>>,
    ) {
        let mut pairs = Vec::new();
        let request = lock(&self.pairing).offer(block, grants, &mut pairs);
        if request > 0 {
            self.ctrl_send(Msg::Request { n: request });
        }
        for (b, g) in pairs {
            match to_sender {
                Some(tx) => {
                    let _ = tx.send(Some((b, g)));
                }
                None => self.post_block(b, g),
            }
        }
    }

    /// Post the Write of a filled block into granted sink block `g`, and
    /// its `BlockDone` behind it on the same stream: the least queued one
    /// ([`pick_stream`]).
    pub(super) fn post_block(&self, (sge, seq, block): Filled, g: Grant) {
        let queued: Vec<u32> = self
            .queued
            .iter()
            .map(|q| q.load(Ordering::Relaxed))
            .collect();
        let qi = pick_stream(seq, &queued);
        self.queued[qi].fetch_add(1, Ordering::Relaxed);
        let notice = Msg::BlockDone {
            seq,
            len: sge.length,
            block: g.block,
        };
        let mut buf = [0u8; DATA_MSG];
        let len = notice.emit(0, &mut buf);
        let off = self.data_send_off(block);
        self.data_msgs.write_at(off, &buf[..len]);
        let wrs = [
            SendWr {
                wr_id: wr_id(K_DATA_WRITE, qi, u64::from(block)),
                opcode: WrOpcode::RdmaWrite {
                    remote_addr: g.addr,
                    rkey: g.rkey,
                },
                sgl: SgList::single(sge),
                signaled: false,
                solicited: false,
            },
            SendWr {
                wr_id: wr_id(K_DATA_SEND, qi, u64::from(block)),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.data_msgs.sge(off, len)),
                signaled: true,
                solicited: false,
            },
        ];
        if let Err(e) = self.data_qps[qi].post_send_list(&wrs) {
            self.set_fail(Fail::Disconnected(format!(
                "posting an RDMA Write on stream {qi}: {e:?}"
            )));
        }
    }
}

/// What the dispatcher hands the sink's writer.
#[derive(Debug)]
pub(super) enum SinkEv {
    Begin {
        transfer: u64,
        len: Option<u64>,
        prerequest: u32,
    },
    Request(u32),
    Block {
        seq: u64,
        len: u32,
        block: u32,
    },
    End {
        blocks: u64,
        bytes: u64,
    },
    Abort(String),
}

/// What handling completions needs (behind [`Shared::dispatch`]).
pub(super) struct Dispatch {
    pub(super) routes: Routes,
    /// Each stream's consumed data receive slots, until a batch is
    /// reposted.
    pub(super) consumed: Vec<Vec<u32>>,
}

pub(super) struct Routes {
    /// Block/grant pairs the dispatcher thread found, for the sender.
    pub(super) pair_tx: Sender<ToSender>,
    pub(super) freed_tx: Sender<u32>,
    pub(super) fin_tx: Sender<u64>,
    pub(super) sink_tx: Sender<SinkEv>,
}
