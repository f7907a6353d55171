//! The send path (`rsend`, `rs_write_data`, `rs_post_write_msg`): credits,
//! the send-buffer ring and the peer's target SGL, buffered and zero-copy
//! sends, and send completions.

use super::error::FlowError;
use super::state::{set_slot, slot, Flow};
use super::types::{
    Action, Phase, Reserve, SendGrant, SendTag, Source, Spans, MAX_TRANSFER, QP_CTRL_SIZE,
    SNDLOWAT, TARGET_SGL_LEN,
};
use crate::wire::{Ctrl, Message, Sge, SGL_SIZE};

impl Flow {
    /// `rs_can_send` (iWARP variant) against the target SGL region.
    pub fn can_send(&self, target: &[u8]) -> bool {
        self.phase == Phase::Connected
            && self.writable
            && self.sqe_avail >= 2
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.has_credit()
            && slot(target, self.target_sge, self.cfg.order).is_some_and(|s| s.length != 0)
    }

    /// Reserves up to `want` bytes of the send buffer and queues their RDMA
    /// Write and the `RS_OP_DATA` Send (`rs_write_data`). Copy the bytes
    /// into the returned spans before posting the actions. Bytes buffered
    /// by [`Flow::send_buffered`] go first (`WouldBlock` while they cannot).
    pub fn send(&mut self, want: u32, target: &mut [u8]) -> Result<SendGrant, FlowError> {
        if self.pend_len > 0 {
            // Buffered bytes go first.
            self.push(target);
            if self.pend_len > 0 {
                return Err(FlowError::WouldBlock);
            }
        }
        self.reserve(want, target, Reserve::Queue)
    }

    /// Zero copy: reserves a data message of up to `want` bytes that the
    /// driver RDMA-Writes straight from the application's registered
    /// memory ([`Source::External`]); no send-buffer space is used.
    /// Returns the bytes the message takes (the driver must keep that
    /// memory unchanged until the Write completes).
    pub fn send_zcopy(&mut self, want: u32, target: &mut [u8]) -> Result<u32, FlowError> {
        if self.pend_len > 0 {
            // Buffered bytes go first.
            self.push(target);
            if self.pend_len > 0 {
                return Err(FlowError::WouldBlock);
            }
        }
        self.reserve(want, target, Reserve::External)
            .map(|g| g.spans.len())
    }

    /// Buffered sending, the enhanced design's path: copies up to `want`
    /// bytes into the send buffer (copy them into the returned spans) and
    /// queues them as data messages as far as credits, send-queue entries
    /// and the peer's ring allow now (when `push` is true); what cannot go
    /// yet stays buffered, and later bytes join it, so that a run of small
    /// writes that finds the wire or the credits busy leaves as one message
    /// ("append") instead of one message each. Nothing waits for more data:
    /// buffered bytes go with the next [`Flow::push`], which the driver
    /// calls whenever a completion or a credit arrives.
    pub fn send_buffered(
        &mut self,
        want: u32,
        target: &mut [u8],
        push: bool,
    ) -> Result<SendGrant, FlowError> {
        self.check_sendable(target)?;
        let n = want.min(self.sbuf_bytes_avail);
        if want > 0 && n == 0 {
            if push {
                self.push(target);
            }
            return Err(FlowError::WouldBlock);
        }
        if self.pend_len == 0 {
            self.pend_start = self.sbuf_head;
        }
        let spans = Spans::of_ring(self.sbuf_head, n, self.cfg.sbuf_size);
        self.sbuf_head = (self.sbuf_head + n) % self.cfg.sbuf_size;
        self.sbuf_bytes_avail -= n;
        self.pend_len += n;
        if push {
            self.push(target);
        }
        Ok(SendGrant { spans })
    }

    /// Whether [`Flow::send_buffered`] would take bytes now (at least
    /// [`SNDLOWAT`] of send buffer free, or all of it when smaller).
    pub fn can_buffer(&self) -> bool {
        self.phase == Phase::Connected
            && self.writable
            && self.sbuf_bytes_avail >= SNDLOWAT.min(self.cfg.sbuf_size)
    }

    /// Free bytes of the send buffer.
    pub fn send_space(&self) -> u32 {
        self.sbuf_bytes_avail
    }

    /// Bytes buffered by [`Flow::send_buffered`] and not yet sent.
    pub fn buffered(&self) -> u32 {
        self.pend_len
    }

    /// Queues buffered bytes as data messages while a credit, two
    /// send-queue entries and ring space in the current target slot are
    /// available; returns the messages queued.
    pub fn push(&mut self, target: &mut [u8]) -> u32 {
        let mut msgs = 0;
        while self.pend_len > 0
            && self.phase == Phase::Connected
            && self.sqe_avail >= 2
            && self.has_credit()
            && target.len() >= TARGET_SGL_LEN
        {
            let Some(dst) = slot(target, self.target_sge, self.cfg.order) else {
                break;
            };
            if dst.length == 0 {
                break;
            }
            let n = self.pend_len.min(MAX_TRANSFER).min(dst.length);
            let spans = Spans::of_ring(self.pend_start, n, self.cfg.sbuf_size);
            self.pend_start = (self.pend_start + n) % self.cfg.sbuf_size;
            self.pend_len -= n;
            let (addr, rkey) = self.take_slot(target, dst, n);
            self.queue_data(
                Source::Sbuf(spans),
                addr,
                rkey,
                n,
                SendTag::DataWrite { len: n },
            );
            msgs += 1;
        }
        if self.pend_len == 0 {
            self.flush_pending_ctrl();
        }
        msgs
    }

    /// Whether a send may be asked for at all (connected, writable, a
    /// whole target SGL region).
    pub(super) fn check_sendable(&self, target: &[u8]) -> Result<(), FlowError> {
        match self.phase {
            Phase::Error => return Err(self.err.unwrap_or(FlowError::SendFailed)),
            Phase::Init => return Err(FlowError::NotConnected),
            Phase::Disconnected => return Err(FlowError::NotWritable),
            Phase::Connected => {}
        }
        if !self.writable {
            return Err(FlowError::NotWritable);
        }
        if target.len() < TARGET_SGL_LEN {
            return Err(FlowError::Config("target SGL region shorter than 32 bytes"));
        }
        Ok(())
    }

    /// Takes `n` bytes (at most its length) from the front of the current
    /// target slot `dst` for one data message: one credit and two
    /// send-queue entries; advances the slot in `target` and moves to the
    /// next slot when it is used up. Returns the peer address and rkey.
    pub(super) fn take_slot(&mut self, target: &mut [u8], mut dst: Sge, n: u32) -> (u64, u32) {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 2;
        let at = (dst.addr, dst.key);
        dst.addr = dst.addr.wrapping_add(u64::from(n));
        dst.length -= n;
        set_slot(target, self.target_sge, &dst, self.cfg.order);
        if dst.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE as usize;
        }
        at
    }

    pub(super) fn queue_data(&mut self, src: Source, addr: u64, rkey: u32, n: u32, tag: SendTag) {
        self.actions.push_back(Action::RdmaWrite {
            src,
            remote_addr: addr,
            rkey,
            tag,
        });
        let payload = self.word(Message::Data { len: n });
        self.actions.push_back(Action::Send {
            payload,
            tag: SendTag::DataMsg,
        });
    }

    pub(super) fn reserve(
        &mut self,
        want: u32,
        target: &mut [u8],
        how: Reserve,
    ) -> Result<SendGrant, FlowError> {
        self.check_sendable(target)?;
        if want == 0 {
            return Ok(SendGrant {
                spans: Spans::of_ring(self.sbuf_head, 0, self.cfg.sbuf_size),
            });
        }
        if !self.can_send(target) {
            return Err(FlowError::WouldBlock);
        }
        let dst = slot(target, self.target_sge, self.cfg.order).expect("checked length");
        let mut n = want.min(MAX_TRANSFER).min(dst.length);
        if how != Reserve::External {
            n = n.min(self.sbuf_bytes_avail);
        }
        let spans = if how == Reserve::External {
            Spans::of_ring(0, n, n)
        } else {
            let spans = Spans::of_ring(self.sbuf_head, n, self.cfg.sbuf_size);
            self.sbuf_head = (self.sbuf_head + n) % self.cfg.sbuf_size;
            self.sbuf_bytes_avail -= n;
            spans
        };

        let (addr, rkey) = self.take_slot(target, dst, n);
        match how {
            Reserve::Queue => self.queue_data(
                Source::Sbuf(spans),
                addr,
                rkey,
                n,
                SendTag::DataWrite { len: n },
            ),
            Reserve::External => self.queue_data(
                Source::External { len: n },
                addr,
                rkey,
                n,
                SendTag::ZcopyWrite { len: n },
            ),
        }
        Ok(SendGrant { spans })
    }

    /// A send work request completed (`rs_poll_cq`, send branch).
    pub fn on_send_complete(&mut self, tag: SendTag, ok: bool) -> Result<(), FlowError> {
        let ctrl_outstanding = self
            .ctrl_seqno
            .wrapping_sub(self.ctrl_max_seqno.wrapping_sub(QP_CTRL_SIZE));
        let sq_outstanding = i32::from(self.cfg.sq_size) - QP_CTRL_SIZE as i32 - self.sqe_avail;
        match tag {
            SendTag::DataWrite { len } => {
                if sq_outstanding <= 0 || len > self.cfg.sbuf_size - self.sbuf_bytes_avail {
                    return Err(FlowError::UnexpectedCompletion(tag));
                }
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += len;
            }
            SendTag::ZcopyWrite { .. } | SendTag::DataMsg => {
                if sq_outstanding <= 0 {
                    return Err(FlowError::UnexpectedCompletion(tag));
                }
                self.sqe_avail += 1;
            }
            SendTag::SglWrite | SendTag::SglMsg | SendTag::Ctrl(_) | SendTag::Keepalive => {
                if ctrl_outstanding == 0 {
                    return Err(FlowError::UnexpectedCompletion(tag));
                }
                self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                if tag == SendTag::Ctrl(Ctrl::Disconnect) && ok && self.phase == Phase::Connected {
                    self.disconnected();
                }
            }
        }
        if !ok && self.phase == Phase::Connected {
            return Err(self.fail(FlowError::SendFailed));
        }
        self.flush_pending_ctrl();
        self.update_credits();
        Ok(())
    }

    pub(super) fn disconnected(&mut self) {
        self.phase = Phase::Disconnected;
        self.readable = false;
        self.writable = false;
        self.pending_ctrl = None;
    }
}
