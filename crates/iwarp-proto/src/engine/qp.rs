//! The queue pair: the [`Engine`] struct, what it remembers between calls,
//! and the calls that are neither receive ([`super::rx`]) nor transmit
//! ([`super::tx`]): posting, state changes, completions, errors and the
//! flush (RFC 5040 §5, §6; verbs semantics as Linux siw `siw_verbs.c`).

use std::collections::VecDeque;

use super::rx_state::{Rx, MAX_HDR};
use super::term::build_terminate;
use super::tx_state::Tx;
use super::types::{EngineConfig, EngineEvent, LinkParams, QpState, TermInfo};
use super::wr::{
    PostError, RecvWr, SendWr, SgList, WcOpcode, WcQueue, WcStatus, WorkCompletion, WrOpcode,
};
use crate::fault::Fault;
use crate::mem::MemError;
use crate::wire::terminate::TermCode;

/// One started send-queue work request, kept until it completes so that
/// completions leave the send queue in posting order (verbs semantics).
#[derive(Debug, Clone, Copy)]
pub(super) struct SqSlot {
    pub(super) seq: u64,
    pub(super) wr_id: u64,
    pub(super) opcode: WcOpcode,
    pub(super) signaled: bool,
    pub(super) byte_len: u32,
    /// Read Requests of this WR still waiting for their last Read Response.
    pub(super) reads_left: u32,
    /// All bytes handed to the driver; waits for `confirm_transmit`.
    pub(super) sent: bool,
    /// Final status, once known.
    pub(super) status: Option<WcStatus>,
}

/// An outstanding RDMA Read Request we issued (ORQ entry, RFC 5040 §5.2).
#[derive(Debug, Clone, Copy)]
pub(super) struct OrqEntry {
    pub(super) seq: u64,
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) size: u32,
    pub(super) placed: u32,
}

/// An inbound RDMA Read Request waiting for its Read Response (IRQ entry).
#[derive(Debug, Clone, Copy)]
pub(super) struct IrqEntry {
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) size: u32,
    pub(super) src_stag: u32,
    pub(super) src_to: u64,
    /// The Read Request's MPA length, DDP and RDMAP headers, for the
    /// Terminate's copied headers if the source turns out invalid.
    pub(super) hdr: [u8; MAX_HDR],
}

/// The queue-pair engine. See the module documentation for the call order.
#[derive(Debug)]
pub struct Engine {
    pub(super) cfg: EngineConfig,
    pub(super) link: LinkParams,
    pub(super) state: QpState,
    /// Posted, not yet started send work requests.
    pub(super) sq: VecDeque<SendWr>,
    /// Posted receives, oldest first.
    pub(super) rq: VecDeque<RecvWr>,
    /// Started send work requests, in posting order.
    pub(super) sq_slots: VecDeque<SqSlot>,
    pub(super) next_seq: u64,
    /// Slots finished by `poll_transmit`, waiting for `confirm_transmit`.
    pub(super) unconfirmed: Vec<u64>,
    pub(super) orq: VecDeque<OrqEntry>,
    pub(super) irq: VecDeque<IrqEntry>,
    /// The driver's own requests (liveness probes and wake-up nudges,
    /// `post_probe` / `post_nudge`) queued or outstanding, and their
    /// `wr_id`: they do not count against `sq_depth`.
    pub(super) probes: usize,
    pub(super) probe_wr_id: u64,
    pub(super) completions: VecDeque<WorkCompletion>,
    pub(super) events: VecDeque<EngineEvent>,
    pub(super) rx: Rx,
    pub(super) tx: Tx,
    /// The responder's startup rule: send nothing until the initiator's
    /// first FPDU arrives ([`Engine::hold_transmit_until_input`]).
    pub(super) tx_hold: bool,
}

impl Engine {
    /// A QP in [`QpState::Init`].
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine {
            cfg,
            link: LinkParams {
                crc: false,
                markers_tx: false,
                markers_rx: false,
                mulpdu: 1024,
                ird: 1,
                ord: 1,
            },
            state: QpState::Init,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            sq_slots: VecDeque::new(),
            next_seq: 0,
            unconfirmed: Vec::new(),
            orq: VecDeque::new(),
            probes: 0,
            probe_wr_id: 0,
            irq: VecDeque::new(),
            completions: VecDeque::new(),
            events: VecDeque::new(),
            rx: Rx::new(),
            tx: Tx::new(),
            tx_hold: false,
        }
    }

    /// RFC 5044 §7.1.2 (connection startup rules): the Responder sends no
    /// FPDU until it has received the first FPDU from the Initiator (in
    /// peer-to-peer mode that first FPDU is the RFC 6581 RTR message, which
    /// exists to lift exactly this rule). Until input arrives,
    /// [`Engine::has_transmit`] is false and [`Engine::poll_transmit`]
    /// produces nothing but a Terminate; posted work waits. Linux siw's
    /// initiator enforces it: an FPDU right behind the MPA Reply makes its
    /// Reply read fail (`siw_recv_mpa_rr`: -EPROTO) and the connection is
    /// reset. The connection manager calls this on the passive side.
    pub fn hold_transmit_until_input(&mut self) {
        self.tx_hold = true;
    }

    /// Whether the responder still waits for the initiator's first FPDU.
    pub fn transmit_held(&self) -> bool {
        self.tx_hold
    }

    /// The static configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The negotiated link parameters (meaningful after [`Engine::establish`]).
    pub fn link(&self) -> &LinkParams {
        &self.link
    }

    /// Enter RTS with the negotiated link parameters. Ignored unless the QP
    /// is in [`QpState::Init`].
    pub fn establish(&mut self, link: LinkParams) {
        if self.state != QpState::Init {
            return;
        }
        let min_mulpdu =
            (crate::wire::ddp::UNTAGGED_HDR_LEN + crate::wire::rdmap::READ_REQUEST_LEN + 4) as u32;
        self.link = LinkParams {
            mulpdu: link.mulpdu.clamp(min_mulpdu, 65535 - 8),
            ird: link.ird.max(1),
            ord: link.ord.max(1),
            ..link
        };
        self.rx.establish(self.link.crc);
        self.state = QpState::Rts;
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Queue a send-queue work request (`ibv_post_send`). Memory is checked
    /// when the request is processed; a bad local SGE completes it with
    /// [`WcStatus::LocProtErr`].
    ///
    /// In [`QpState::Error`] or [`QpState::Closed`] the request is accepted
    /// and completed at once with [`WcStatus::WrFlushErr`], signaled or not,
    /// with its own opcode and a byte count of 0, behind any completion of
    /// the send queue still pending (Linux siw `siw_post_send` →
    /// `siw_sq_flush_wr`, which `ib_drain_sq` relies on). In
    /// [`QpState::Init`] it waits for [`Engine::establish`].
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.sq.len() + self.sq_slots.len() - self.probes >= self.cfg.sq_depth as usize {
            // In the error state the queue holds only flushed requests
            // waiting behind one still in flight (see `flush_all`).
            return Err(PostError::QueueFull { wr_id: wr.wr_id });
        }
        if matches!(self.state, QpState::Error | QpState::Closed) {
            // siw `siw_sq_flush_wr`: completed without processing,
            // `siw_sqe_complete(.., SIW_WC_WR_FLUSH_ERR)` whatever the
            // signaled flag, and without looking at the SGL.
            self.new_slot(&wr, wc_opcode_of(&wr.opcode), 0);
            let slot = self.sq_slots.back_mut().expect("slot just added");
            slot.status = Some(WcStatus::WrFlushErr);
            slot.sent = true;
            self.drain_sq_completions();
            return Ok(());
        }
        if wr.sgl.total_len() > u32::MAX as u64 {
            return Err(PostError::InvalidWr {
                wr_id: wr.wr_id,
                why: "total SGL length exceeds 2^32 - 1 bytes (RFC 5040 §5.1 message size limit)",
            });
        }
        self.sq.push_back(wr);
        Ok(())
    }

    /// Queue the driver's liveness probe: a zero-length RDMA Read with
    /// STag 0 and offset 0, the same request RFC 6581 §5 uses as the
    /// ready-to-receive message, which every RFC 6581 peer (Linux siw
    /// among them) answers with a zero-length Read Response without
    /// touching memory (RFC 5040 §4.4: nothing is read for a Read Message
    /// Size of 0). It is an ordinary Read for the protocol, so it takes an
    /// ORD slot while outstanding (RFC 5040 §5.2: the peer's IRD is
    /// respected), but it does not count against the application's send
    /// queue depth: a full send queue must not refuse it, and it must not
    /// refuse the application's last request either. Returns false if the
    /// QP is not in RTS.
    pub fn post_probe(&mut self, wr_id: u64) -> bool {
        self.post_driver_wr(
            wr_id,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
        )
    }

    /// Queue the driver's wake-up nudge: a zero-length RDMA Write with
    /// STag 0 and offset 0, the message RFC 6581 §5 defines as the
    /// write-form ready-to-receive. It places nothing, needs no answer and
    /// completes nothing at either end (RFC 5041 §7.2: a zero-length
    /// tagged segment has nothing to validate or place; Linux siw's
    /// `siw_proc_write` returns at once for it); its only effect is that
    /// bytes arrive at the peer, which makes a peer that missed the
    /// arrival of our earlier bytes read its socket again (see the driver's
    /// `maybe_nudge`). Like the probe it takes no send-queue slot and
    /// produces no completion. Returns false if the QP is not in RTS.
    pub fn post_nudge(&mut self, wr_id: u64) -> bool {
        self.post_driver_wr(
            wr_id,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
        )
    }

    /// A zero-length, unsignaled request of the driver's own (probe or
    /// nudge): outside the application's send-queue accounting, and its
    /// completion swallowed in `drain_sq_completions`.
    fn post_driver_wr(&mut self, wr_id: u64, opcode: WrOpcode) -> bool {
        if self.state != QpState::Rts {
            return false;
        }
        self.sq.push_back(SendWr {
            wr_id,
            opcode,
            sgl: SgList::new(),
            signaled: false,
            solicited: false,
        });
        self.probes += 1;
        self.probe_wr_id = wr_id;
        true
    }

    /// Queue a receive (`ibv_post_recv`), from [`QpState::Init`] on.
    ///
    /// In [`QpState::Error`] or [`QpState::Closed`] the receive is accepted
    /// and completed at once with [`WcStatus::WrFlushErr`] and a byte count
    /// of 0; the receive queue was emptied when the QP entered the state,
    /// so it completes in order (Linux siw `siw_post_receive` →
    /// `siw_rq_flush_wr`, which `ib_drain_rq` relies on).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if matches!(self.state, QpState::Error | QpState::Closed) {
            self.completions
                .push_back(recv_wc(wr.wr_id, WcStatus::WrFlushErr, 0));
            return Ok(());
        }
        let busy = self.rq.len() + usize::from(self.rx.has_current_recv());
        if busy >= self.cfg.rq_depth as usize {
            return Err(PostError::QueueFull { wr_id: wr.wr_id });
        }
        if wr.sgl.total_len() > u32::MAX as u64 {
            return Err(PostError::InvalidWr {
                wr_id: wr.wr_id,
                why: "total SGL length exceeds 2^32 - 1 bytes",
            });
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// RDMA Read Requests sent whose responses have not all arrived (the
    /// outbound read queue). While this is non-zero the peer owes us bytes:
    /// RFC 5040 §4.5, the Data Source answers every Read Request, without
    /// involving its application. The driver uses it to tell a silent peer
    /// from an idle one.
    pub fn reads_outstanding(&self) -> usize {
        self.orq.len()
    }

    /// Posted receives not yet consumed by an incoming Send.
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }

    /// Next work completion.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// Everything handed out by [`Engine::poll_transmit`] so far is written
    /// to the socket: release the completions of the requests it finished.
    pub fn confirm_transmit(&mut self) {
        // Taken and put back empty, so its capacity stays: a fresh vector
        // here was an allocation and a free per transmitted message.
        let mut unconfirmed = std::mem::take(&mut self.unconfirmed);
        for &seq in &unconfirmed {
            if let Some(slot) = self.slot_mut(seq) {
                slot.sent = true;
                if slot.reads_left == 0 && slot.status.is_none() {
                    slot.status = Some(WcStatus::Success);
                }
            }
        }
        unconfirmed.clear();
        self.unconfirmed = unconfirmed;
        self.drain_sq_completions();
    }

    /// The peer closed the connection or it broke (EOF, reset, write error):
    /// the QP moves to the error state and every outstanding work request is
    /// flushed.
    pub fn on_peer_closed(&mut self) {
        match self.state {
            QpState::Error | QpState::Closed => {}
            QpState::Init | QpState::Rts => {
                self.state = QpState::Error;
                self.events.push_back(EngineEvent::PeerClosed);
                self.flush_all(false);
            }
        }
    }

    /// Local close (disconnect or destroy): flush everything and accept
    /// nothing more. An orderly close from RTS sends no Terminate; but a
    /// Terminate already queued for an error found earlier still goes out
    /// before the stream closes (RFC 5040 §4.8, §6: the peer must learn why
    /// its request failed), even when the application closes as soon as it
    /// sees [`EngineEvent::TerminateSent`], before the driver wrote it.
    pub fn close(&mut self) {
        if self.state != QpState::Closed {
            self.state = QpState::Closed;
            self.flush_all(false);
        }
    }

    /// True once the driver should flush the remaining frames and close the
    /// socket (error or close, and any Terminate already handed out).
    pub fn wants_close(&self) -> bool {
        matches!(self.state, QpState::Error | QpState::Closed) && self.tx.pending_term.is_none()
    }

    pub(super) fn slot_mut(&mut self, seq: u64) -> Option<&mut SqSlot> {
        let front = self.sq_slots.front()?.seq;
        let idx = seq.checked_sub(front)? as usize;
        self.sq_slots.get_mut(idx)
    }

    pub(super) fn new_slot(&mut self, wr: &SendWr, opcode: WcOpcode, byte_len: u32) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sq_slots.push_back(SqSlot {
            seq,
            wr_id: wr.wr_id,
            opcode,
            signaled: wr.signaled,
            byte_len,
            reads_left: 0,
            sent: false,
            status: None,
        });
        seq
    }

    /// Move finished send-queue slots, in order, to the completion queue.
    pub(super) fn drain_sq_completions(&mut self) {
        while let Some(slot) = self.sq_slots.front() {
            let Some(status) = slot.status else { break };
            if status == WcStatus::Success && !slot.sent {
                break;
            }
            let slot = self.sq_slots.pop_front().expect("front exists");
            if self.probes > 0 && slot.wr_id == self.probe_wr_id && !slot.signaled {
                // The driver's probe: answered or flushed, never a
                // completion of the application's.
                self.probes -= 1;
                continue;
            }
            if slot.signaled || status != WcStatus::Success {
                self.completions.push_back(WorkCompletion {
                    wr_id: slot.wr_id,
                    status,
                    opcode: slot.opcode,
                    queue: WcQueue::Send,
                    byte_len: if status == WcStatus::Success {
                        slot.byte_len
                    } else {
                        0
                    },
                    invalidated_rkey: None,
                    solicited: false,
                });
            }
        }
    }

    /// Complete every outstanding work request with `WrFlushErr` (after any
    /// specific error status already recorded on a slot).
    ///
    /// With `keep_in_flight`, a Send or Write whose last bytes were handed
    /// to the driver but not yet confirmed is left pending: the driver is
    /// still writing it (a protocol error does not stop the frame in
    /// progress), and `confirm_transmit` completes it successfully, or
    /// `on_peer_closed` flushes it if the write never finishes.
    fn flush_all(&mut self, keep_in_flight: bool) {
        let in_flight = if keep_in_flight {
            std::mem::take(&mut self.unconfirmed)
        } else {
            Vec::new()
        };
        // Unstarted requests join the started ones so that completions keep
        // posting order behind a request still in flight.
        while let Some(wr) = self.sq.pop_front() {
            self.new_slot(&wr, wc_opcode_of(&wr.opcode), 0);
        }
        for slot in self.sq_slots.iter_mut() {
            if slot.status.is_none() && slot.reads_left == 0 && in_flight.contains(&slot.seq) {
                continue;
            }
            if slot.status.is_none() || !slot.sent && slot.status == Some(WcStatus::Success) {
                slot.status = Some(WcStatus::WrFlushErr);
            }
            slot.sent = true;
        }
        self.unconfirmed = in_flight;
        self.orq.clear();
        self.irq.clear();
        self.tx.cursor = None;
        self.drain_sq_completions();
        if let Some(cur) = self.rx.take_current_recv() {
            self.completions
                .push_back(recv_wc(cur.wr_id, WcStatus::WrFlushErr, 0));
        }
        while let Some(wr) = self.rq.pop_front() {
            self.completions
                .push_back(recv_wc(wr.wr_id, WcStatus::WrFlushErr, 0));
        }
    }

    /// RFC 5040 §5.4 / §4.8: a fatal error detected here. Queue the
    /// Terminate carrying the code of `fault` ([`crate::fault::term_code`],
    /// the only mapping) and the offending segment's headers (the RFC's
    /// copied-header fields), enter the error state and flush.
    pub(super) fn fatal(&mut self, fault: Fault, offending_hdr: Option<&[u8]>) {
        if matches!(self.state, QpState::Error | QpState::Closed) {
            return;
        }
        let code = crate::fault::term_code(fault);
        let (layer, etype, ecode) = code.to_wire();
        let info = TermInfo {
            layer,
            etype,
            ecode,
            reason: code.description().to_string(),
        };
        self.tx.pending_term = Some(build_terminate(code, offending_hdr));
        self.rx.kill();
        self.state = QpState::Error;
        self.events.push_back(EngineEvent::TerminateSent(info));
        self.flush_all(true);
    }

    /// A Terminate arrived (RFC 5040 §5.4.2): the peer found an error. The
    /// oldest unfinished send request takes the error status the code
    /// implies; everything else is flushed.
    ///
    /// `culprit` is the opcode of the failed message, from the Terminate's
    /// copied DDP header. The error goes to the oldest unfinished request
    /// of that kind (a Read for a Read Request or Read Response; a Write or
    /// Send not yet confirmed as written), and to the oldest unfinished
    /// request of any kind when the peer copied no header. A Write or Send
    /// that already completed keeps its success (it had been handed to
    /// TCP, as in siw); the requests behind it are flushed.
    pub(super) fn on_terminate(
        &mut self,
        code: TermCode,
        culprit: Option<crate::wire::rdmap::Opcode>,
    ) {
        use crate::wire::rdmap::Opcode;
        if matches!(self.state, QpState::Error | QpState::Closed) {
            return;
        }
        let (layer, etype, ecode) = code.to_wire();
        let status = status_for_remote(code);
        let kind = match culprit {
            Some(Opcode::ReadRequest | Opcode::ReadResponse) => Some(WcOpcode::RdmaRead),
            Some(Opcode::RdmaWrite) => Some(WcOpcode::RdmaWrite),
            Some(
                Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate,
            ) => Some(WcOpcode::Send),
            _ => None,
        };
        if let Some(slot) = self
            .sq_slots
            .iter_mut()
            .filter(|s| s.status.is_none() || !s.sent)
            .find(|s| kind.is_none_or(|k| s.opcode == k))
        {
            slot.status = Some(status);
            slot.sent = true;
        }
        self.state = QpState::Error;
        self.tx.pending_term = None;
        self.rx.kill();
        self.events
            .push_back(EngineEvent::TerminateReceived(TermInfo {
                layer,
                etype,
                ecode,
                reason: code.description().to_string(),
            }));
        self.flush_all(true);
    }
}

pub(super) fn wc_opcode_of(op: &WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::Send | WrOpcode::SendWithInv { .. } => WcOpcode::Send,
        WrOpcode::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
    }
}

pub(super) fn recv_wc(wr_id: u64, status: WcStatus, byte_len: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode: WcOpcode::Recv,
        queue: WcQueue::Recv,
        byte_len,
        invalidated_rkey: None,
        solicited: false,
    }
}

/// The error status a Terminate from the peer puts on our request.
pub(super) fn status_for_remote(code: TermCode) -> WcStatus {
    use TermCode::*;
    match code {
        RdmapInvalidStag
        | RdmapBaseBounds
        | RdmapAccessRights
        | RdmapStagNotAssociated
        | RdmapToWrap
        | DdpTaggedInvalidStag
        | DdpTaggedBaseBounds
        | DdpTaggedStagNotAssociated
        | DdpTaggedToWrap => WcStatus::RemAccessErr,
        RdmapCannotInvalidate => WcStatus::RemInvReqErr,
        RdmapCatastrophicStream => WcStatus::RemInvReqErr,
        _ => WcStatus::RemOpErr,
    }
}

/// siw `siw_tagged_error`: a failed check of a tagged placement (RDMA
/// Write, Read Response) is a DDP tagged-buffer error (RFC 5041 §7).
/// Kept for callers of the old API; the mapping is
/// [`crate::fault::term_code`] of [`Fault::TaggedSink`].
pub fn term_code_for_tagged(e: MemError) -> TermCode {
    crate::fault::term_code(Fault::TaggedSink(e))
}

/// siw `siw_rdmap_error`: a failed check of an RDMA Read source is an
/// RDMAP remote-protection error (RFC 5040 §7, §5.2). Kept for callers of
/// the old API; the mapping is [`crate::fault::term_code`] of
/// [`Fault::ReadSource`].
pub fn term_code_for_read_source(e: MemError) -> TermCode {
    crate::fault::term_code(Fault::ReadSource(e))
}
