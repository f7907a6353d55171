//! From the flow's actions to work requests: copies of the target SGL in
//! and out, `ctl` slots for message words, and the pump that posts the
//! queued sends and receives.

use std::io;

use iwarp::{SendWr, SgList, WrOpcode};

use crate::flow::{Action, SendTag, Source, TARGET_SGL_LEN};
use crate::wire::SGE_LEN;

use super::types::{for_spans, recv_wr, Conn, State, CTL_SLOT, RECV_DEFER};
use super::wrid::encode;

impl Conn {
    /// A copy of the target SGL region.
    pub(super) fn target(&self) -> [u8; TARGET_SGL_LEN] {
        let mut t = [0u8; TARGET_SGL_LEN];
        self.tsgl.read_at(0, &mut t);
        t
    }

    /// Writes back the slots the flow changed (only those: the peer may
    /// be writing the other slot meanwhile).
    pub(super) fn write_back(&self, before: &[u8; TARGET_SGL_LEN], after: &[u8; TARGET_SGL_LEN]) {
        for i in 0..TARGET_SGL_LEN / SGE_LEN {
            let r = i * SGE_LEN..(i + 1) * SGE_LEN;
            if before[r.clone()] != after[r.clone()] {
                self.tsgl.write_at(r.start, &after[r]);
            }
        }
    }

    pub(super) fn ctl_slot(&self, st: &mut State, bytes: &[u8]) -> iwarp::Sge {
        let off = st.ctl_next * CTL_SLOT;
        st.ctl_next = (st.ctl_next + 1) % self.sq_size;
        self.ctl.write_at(off, bytes);
        self.ctl.sge(off, bytes.len())
    }

    /// Posts every action the flow queued.
    ///
    /// Receives and sends go to different queues, so their relative order
    /// only matters where a credit update grants what the receives make
    /// room for: then the receives are posted first. Otherwise the sends go
    /// first, and a receive queued with no send behind it (the repost for
    /// a message just read) may wait for the next pump, at most
    /// [`RECV_DEFER`] of them: a reader that answers at once (a ping-pong)
    /// then posts it after its answer went to TCP, not on the answer's
    /// way. The peer never notices: this side keeps
    /// [`RQ_EXTRA`](crate::flow::RQ_EXTRA) more receives posted than it
    /// grants.
    pub(super) fn pump(&self, st: &mut State) {
        st.sends.clear();
        let mut grants = false;
        while let Some(a) = st.flow.poll_action() {
            match a {
                Action::PostRecv { slot } => {
                    let wr = recv_wr(&self.rbuf, self.slots_at, slot);
                    st.recvs.push(wr);
                }
                Action::RdmaWrite {
                    src,
                    remote_addr,
                    rkey,
                    tag,
                } => {
                    let sgl = match src {
                        Source::Sbuf(spans) => {
                            let mut l = SgList::new();
                            for_spans(spans, |o, n| {
                                l.push(self.sbuf.sge(o, n));
                            });
                            st.inflight += 1;
                            st.stats.data_msgs += 1;
                            l
                        }
                        Source::Inline(b) => SgList::single(self.ctl_slot(st, &b)),
                        Source::Empty => SgList::new(),
                        Source::External { .. } => {
                            st.zc_inflight += 1;
                            st.stats.data_msgs += 1;
                            match st.zc_sge.take() {
                                Some(s) => SgList::single(s),
                                None => SgList::new(),
                            }
                        }
                    };
                    grants |= tag == SendTag::SglWrite;
                    st.sends.push(SendWr {
                        wr_id: encode(tag),
                        opcode: WrOpcode::RdmaWrite { remote_addr, rkey },
                        sgl,
                        signaled: true,
                        solicited: false,
                    });
                }
                Action::Send { payload, tag } => {
                    if tag == SendTag::SglMsg {
                        grants = true;
                        st.stats.credit_updates += 1;
                    }
                    let sge = self.ctl_slot(st, &payload);
                    st.sends.push(SendWr {
                        wr_id: encode(tag),
                        opcode: WrOpcode::Send,
                        sgl: SgList::single(sge),
                        signaled: true,
                        solicited: false,
                    });
                }
            }
        }
        if grants {
            self.post_recvs(st);
        }
        if !st.sends.is_empty() {
            if let Err(e) = self.qp.post_send_list(&st.sends) {
                self.broke(
                    st,
                    io::ErrorKind::ConnectionReset,
                    format!("the iWARP connection failed (posting sends: {e:?})"),
                );
            }
            self.post_recvs(st);
        } else if st.recvs.len() > RECV_DEFER {
            self.post_recvs(st);
        }
    }

    /// Posts the queued receives.
    pub(super) fn post_recvs(&self, st: &mut State) {
        if st.recvs.is_empty() {
            return;
        }
        if let Err(e) = self.qp.post_recv_list(&st.recvs) {
            self.broke(
                st,
                io::ErrorKind::ConnectionReset,
                format!("the iWARP connection failed (posting receives: {e:?})"),
            );
        }
        st.recvs.clear();
    }
}
