//! The receive path (`rs_poll_cq`, `rrecv`): message words in, reads out
//! of the receive ring, its growth, and the credit updates
//! (`rs_give_credits`, `rs_send_credits`).

use super::error::{FlowError, ProtocolError};
use super::state::Flow;
use super::types::{Action, Phase, RecvGrant, SendTag, Source, Spans, MAX_BUF};
use crate::wire::{Ctrl, Message, Op, Sge, SGE_LEN};

impl Flow {
    /// A receive completed successfully with `payload` (`rs_poll_cq`,
    /// receive branch); queues its repost while connected.
    pub fn on_recv(&mut self, payload: &[u8]) -> Result<(), FlowError> {
        if self.phase == Phase::Error {
            return Err(self.err.unwrap_or(FlowError::SendFailed));
        }
        if self.phase == Phase::Init {
            // The peer is connected before we are: its first credit update
            // can complete here before the driver has seen the CM event
            // with its conn data. Keep the words (at most one per posted
            // receive) until `establish`.
            if payload.len() != crate::wire::MSG_SIZE
                || self.early.len() >= usize::from(self.recv_slots())
            {
                return Err(FlowError::NotConnected);
            }
            self.early.push(payload.try_into().expect("4 bytes"));
            return Ok(());
        }
        let msg = match Message::from_send_payload(payload, self.peer_order) {
            Ok(m) => m,
            Err(e) => return Err(self.fail(FlowError::Protocol(ProtocolError::Malformed(e)))),
        };
        if let Err(p) = self.handle(msg) {
            return Err(self.fail(FlowError::Protocol(p)));
        }
        if self.phase == Phase::Connected {
            self.queue_recv();
        }
        self.update_credits();
        Ok(())
    }

    /// A receive completed with an error (flushed): rsocket.c skips it
    /// without reposting.
    pub fn on_recv_failed(&mut self) {}

    pub(super) fn handle(&mut self, msg: Message) -> Result<(), ProtocolError> {
        match msg {
            Message::Data { len } => {
                // After our own disconnect the peer may still have data in
                // flight; only data after *its* shutdown is a violation.
                if self.peer_write_closed {
                    return Err(ProtocolError::DataAfterShutdown);
                }
                // The limit we granted is never more than rq_size ahead of
                // the count (limit = rseq_no + rq_size, unread <= rq_size),
                // and the count grows one at a time: it reaches the limit
                // exactly, whatever rq_size (up to 0xFFFE).
                if self.rx_limit.wrapping_sub(self.rx_count) == 0 {
                    return Err(ProtocolError::CreditsExceeded {
                        received: self.rx_count,
                        limit: self.rx_limit,
                    });
                }
                if u64::from(len) > self.rx_window {
                    return Err(ProtocolError::RingOverrun {
                        len,
                        window: self.rx_window,
                    });
                }
                self.rx_count = self.rx_count.wrapping_add(1);
                self.rx_window -= u64::from(len);
                self.rmsg.push_back(len);
                self.rmsg_bytes += u64::from(len);
            }
            Message::Sgl { limit } => {
                let limit = limit as u16;
                // A correct peer sends rseq_no + rq_size with
                // sseq_no - rq_size <= rseq_no <= sseq_no.
                if limit.wrapping_sub(self.sseq_no) > self.peer_rq {
                    return Err(ProtocolError::CreditLimitOutOfRange {
                        limit,
                        sent: self.sseq_no,
                        peer_rq: self.peer_rq,
                    });
                }
                self.sseq_comp = limit;
            }
            Message::Ctrl(Ctrl::Disconnect) => {
                self.peer_write_closed = true;
                self.disconnected();
            }
            Message::Ctrl(Ctrl::Shutdown) => {
                self.peer_write_closed = true;
                if self.writable {
                    self.readable = false;
                } else {
                    self.disconnected();
                }
            }
            Message::Ctrl(Ctrl::Keepalive) => {}
            Message::Write { .. } => return Err(ProtocolError::Unexpected(Op::Write)),
            Message::IomapSgl { index } => self.iomap_announced(index)?,
        }
        Ok(())
    }

    /// Whether a read would not block (`rs_conn_have_rdata`): data queued,
    /// or the reading side is closed (a read returns end of stream).
    pub fn poll_readable(&self) -> bool {
        !self.rmsg.is_empty() || !self.readable
    }

    /// Takes up to `max` queued bytes (`rrecv`): returns where they are in
    /// the receive buffer and updates the ring and credits. Queued data is
    /// still delivered after the peer disconnected (rsocket.c: "Continue to
    /// receive any queued data even if the remote side has disconnected"),
    /// and after a local send error, but not after a protocol violation.
    pub fn recv(&mut self, max: u32) -> Result<RecvGrant, FlowError> {
        if self.rmsg.is_empty() {
            return match self.phase {
                Phase::Init => Err(FlowError::NotConnected),
                Phase::Error => Err(self.err.unwrap_or(FlowError::SendFailed)),
                _ if !self.readable => Ok(RecvGrant {
                    spans: Spans::of_ring(self.rbuf_offset, 0, self.ring),
                    eof: true,
                }),
                _ => Err(FlowError::WouldBlock),
            };
        }
        let mut left = max;
        let mut taken = 0u32;
        while left > 0 {
            let Some(head) = self.rmsg.front_mut() else {
                break;
            };
            if left < *head {
                *head -= left;
                taken += left;
                left = 0;
            } else {
                let n = *head;
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
                taken += n;
                left -= n;
            }
        }
        self.rmsg_bytes -= u64::from(taken);
        let spans = Spans::of_ring(self.rbuf_offset, taken, self.ring);
        self.rbuf_offset = (self.rbuf_offset + taken) % self.ring;
        self.rbuf_bytes_avail += taken;
        self.update_credits();
        Ok(RecvGrant { spans, eof: false })
    }

    /// The receive ring in use: `rbuf_size`, or more once it grew.
    pub fn ring_size(&self) -> u32 {
        self.ring
    }

    /// Let the receive ring grow toward `goal` bytes, within `capacity`
    /// (the bytes registered for it, from the start of the receive
    /// region; the message slots must lie beyond). The driver measures the
    /// path (`crate::tune`) and calls this; the ring never shrinks.
    ///
    /// The wire does not change: rsocket.c's sender writes wherever the
    /// receiver's target-SGL entries point, for their length, one entry
    /// after the other (`rs_write_data`), and never reads the size of our
    /// ring. So the ring grows by doubling at the moment its free offset
    /// wraps to 0 (the half at offset 0 has been read, the other half is
    /// still the peer's): instead of advertising the half at 0 again, we
    /// advertise the untouched `[size, 2 * size)` as one entry, the new
    /// half. The peer fills it right after the old second half, so the
    /// reader runs on past the old end instead of wrapping, and from then
    /// on the ring is twice as large, its halves `size` bytes. A ring that
    /// covers twice the bandwidth-delay product keeps the sender busy
    /// (what the peer may have in flight is between one and two halves).
    pub fn set_ring_goal(&mut self, goal: u32, capacity: u32) {
        self.ring_cap = capacity.clamp(self.cfg.rbuf_size, MAX_BUF);
        self.ring_goal = goal.min(self.ring_cap);
        self.update_credits();
    }

    /// Whether the ring doubles at this advertisement (see
    /// [`Flow::set_ring_goal`]).
    pub(super) fn ring_grows_now(&self) -> bool {
        self.rbuf_free_offset == 0
            && self.ring < self.ring_goal
            && u64::from(self.ring) * 2 <= u64::from(self.ring_cap)
    }

    /// `rs_give_credits` (iWARP) then `rs_send_credits`, as often as it
    /// holds; with [`Flow::acks_each`] also whenever the limit moved.
    pub(super) fn update_credits(&mut self) {
        while self.phase == Phase::Connected
            && (self.rbuf_bytes_avail >= self.ring >> 1
                || self.rseq_no.wrapping_sub(self.rseq_comp) as i16 >= 0
                || (self.ack_each && self.rseq_no.wrapping_add(self.cfg.rq_size) != self.rx_limit))
            && self.two_ctrl_avail()
        {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            self.rseq_comp = self.rseq_no.wrapping_add(self.cfg.rq_size >> 1);
            // The value is computed in int in rsocket.c: it may pass 0xFFFF.
            let limit = u32::from(self.rseq_no) + u32::from(self.cfg.rq_size);
            self.rx_limit = limit as u16;
            let payload = self.word(Message::Sgl { limit });
            let half = self.ring >> 1;
            if self.rbuf_bytes_avail >= half {
                self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
                let grow = self.ring_grows_now();
                let (offset, len) = if grow {
                    (self.ring, self.ring)
                } else {
                    (self.rbuf_free_offset, half)
                };
                let sge = Sge {
                    addr: self.cfg.rbuf.addr.wrapping_add(u64::from(offset)),
                    key: self.cfg.rbuf.key,
                    length: len,
                };
                // RS_OPT_SWAP_SGL: the entry goes in the peer's order.
                let bytes = sge.to_bytes(self.peer_order);
                self.actions.push_back(Action::RdmaWrite {
                    src: Source::Inline(bytes),
                    remote_addr: self
                        .remote_sgl
                        .addr
                        .wrapping_add(u64::from(self.remote_sge) * SGE_LEN as u64),
                    rkey: self.remote_sgl.key,
                    tag: SendTag::SglWrite,
                });
                self.actions.push_back(Action::Send {
                    payload,
                    tag: SendTag::SglMsg,
                });
                if grow {
                    // Fresh memory: nothing read is used up, and the free
                    // bytes at offset 0 wait for the first new half.
                    if self.rbuf_offset == 0 {
                        // The reader had read everything up to the old
                        // end; the next bytes land at the old end.
                        self.rbuf_offset = self.ring;
                    }
                    self.ring *= 2;
                    tracing::debug!(ring = self.ring, "receive ring grew");
                } else {
                    self.rbuf_bytes_avail -= half;
                    self.rbuf_free_offset += half;
                    if self.rbuf_free_offset >= self.ring {
                        self.rbuf_free_offset = 0;
                    }
                }
                self.rx_window += u64::from(len);
                self.remote_sge += 1;
                if self.remote_sge == self.remote_sgl.length {
                    self.remote_sge = 0;
                }
            } else {
                self.actions.push_back(Action::Send {
                    payload,
                    tag: SendTag::SglMsg,
                });
            }
        }
    }

    pub(super) fn flush_pending_ctrl(&mut self) {
        // A control word never overtakes buffered data (SHUTDOWN after the
        // last byte).
        if self.phase == Phase::Connected && self.ctrl_avail() && self.pend_len == 0 {
            if let Some(c) = self.pending_ctrl.take() {
                self.post_ctrl(c);
            }
        }
    }

    pub(super) fn post_ctrl(&mut self, c: Ctrl) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        let payload = self.word(Message::Ctrl(c));
        self.actions.push_back(Action::Send {
            payload,
            tag: SendTag::Ctrl(c),
        });
    }
}
