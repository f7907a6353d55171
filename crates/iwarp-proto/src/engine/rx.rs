//! Receive path: a resumable state machine over the MPA byte stream.
//!
//! RFC 5044 §4 (FPDU format: ULPDU length, pad, CRC; markers), RFC 5041
//! §5-§7 (tagged and untagged placement and their errors), RFC 5040 §5
//! (RDMAP message semantics). Modeled on siw `siw_qp_rx.c`: the machine
//! moves from header to payload to trailer, and any split of the input
//! resumes where it stopped. Markers (when negotiated for this direction)
//! are removed before the bytes reach the FPDU machine. The MPA part of
//! that machine (ULPDU length, running CRC, pad and CRC field, the CRC
//! verdict) is `mpa::FpduRx`, the same state machine `mpa::deframe` (tests,
//! fuzzers) runs; the engine adds what only it knows: the DDP/RDMAP header
//! length per opcode (`Opcode::ulp_header_len`) and placement.
//!
//! Tagged payload (RDMA Write, Read Response) is validated once per
//! segment header, then placed straight into the target region: either by
//! [`MemoryAccess::write`] from the driver's buffer, or by the driver
//! reading from the socket directly into the region ([`RxHint::Direct`]).
//! Messages complete only after their last FPDU's CRC has been verified.

use super::qp::{recv_wc, Engine, IrqEntry};
use super::rx_state::{
    CurRecv, Phase, Seg, CLASSIFY_LEN, CRC_COVERS_MARKERS, MAX_HDR, TERM_BODY_MAX,
};
use super::types::{QpState, RxHint};
use super::wr::WcStatus;
use crate::fault::Fault;
use crate::mem::{Access, MemError, MemoryAccess};
use crate::wire::terminate::TermCode;
use crate::wire::{crc, ddp, mpa, rdmap, terminate};
use rdmap::Opcode;

impl Engine {
    /// Where the driver should put the next received bytes.
    pub fn rx_hint(&self) -> RxHint {
        let rx = &self.rx;
        if self.state != QpState::Rts || rx.phase != Phase::Payload || rx.marker_have > 0 {
            return RxHint::Buffered;
        }
        let (stag, to, mut len) = match rx.seg {
            Seg::Tagged { stag, to, .. } => (stag, to, rx.payload_rem as u64),
            // Send payload goes straight into the posted receive buffer too,
            // one SGE at a time (validated when the message started).
            Seg::Send => {
                let Some((sge, off)) = rx.cur_recv.as_ref().and_then(CurRecv::next_space) else {
                    return RxHint::Buffered;
                };
                let room = (sge.length - off) as u64;
                (
                    sge.lkey,
                    sge.addr.wrapping_add(off as u64),
                    room.min(rx.payload_rem as u64),
                )
            }
            _ => return RxHint::Buffered,
        };
        if self.link.markers_rx {
            if mpa::is_marker_pos(rx.stream_pos) {
                return RxHint::Buffered;
            }
            len = len.min(mpa::next_marker_pos(rx.stream_pos) - rx.stream_pos);
        }
        RxHint::Direct {
            stag,
            to,
            len: len as u32,
        }
    }

    /// Report `len` bytes the driver placed at the current
    /// [`RxHint::Direct`] target. `len` must not exceed the hint's length.
    pub fn handle_direct(&mut self, len: usize, mem: &dyn MemoryAccess) {
        let RxHint::Direct { stag, to, len: max } = self.rx_hint() else {
            // The driver placed bytes the engine did not ask for: a driver
            // bug, but never a reason to corrupt state. Treat as fatal.
            self.fatal(Fault::DdpLocal, None);
            return;
        };
        let len = len.min(max as usize) as u32;
        if len == 0 {
            return;
        }
        if self.rx.fpdu.crc_on() {
            let mut c = self.rx.fpdu.running_crc();
            let r = mem.visit(stag, to, len, &mut |b| c = crc::crc32c_append(c, b));
            if let Err(e) = r {
                self.fatal(Fault::TaggedSink(e), None);
                return;
            }
            self.rx.fpdu.set_running_crc(c);
        }
        match self.rx.seg {
            Seg::Send => self.advance_send(len),
            _ => self.advance_tagged(len),
        }
        self.rx.stream_pos += len as u64;
    }

    /// Consume received bytes. Returns how many were consumed: all of them
    /// once the QP is established (after a fatal error the rest of the
    /// stream is discarded), none before [`Engine::establish`].
    pub fn handle_input(&mut self, data: &[u8], mem: &dyn MemoryAccess) -> usize {
        if self.state == QpState::Init {
            return 0;
        }
        if !data.is_empty() {
            // The initiator's first FPDU is arriving: the responder may
            // send (RFC 5044 §7.1.2, see `hold_transmit_until_input`).
            self.tx_hold = false;
        }
        let mut i = 0;
        while i < data.len() {
            if self.rx.phase == Phase::Dead || self.state != QpState::Rts {
                self.rx.phase = Phase::Dead;
                return data.len();
            }
            let avail = &data[i..];
            let mut limit = avail.len();
            if self.link.markers_rx {
                if self.rx.marker_have > 0 || mpa::is_marker_pos(self.rx.stream_pos) {
                    let n = (mpa::MARKER_LEN - self.rx.marker_have).min(avail.len());
                    let have = self.rx.marker_have;
                    self.rx.marker[have..have + n].copy_from_slice(&avail[..n]);
                    // Covered by the CRC unless it sits inside the CRC field.
                    let in_crc_field =
                        self.rx.phase == Phase::Trailer && self.rx.fpdu.in_crc_field();
                    if CRC_COVERS_MARKERS && !in_crc_field {
                        self.rx.fpdu.fold(&avail[..n]);
                    }
                    self.rx.marker_have += n;
                    self.rx.stream_pos += n as u64;
                    i += n;
                    if self.rx.marker_have == mpa::MARKER_LEN {
                        self.rx.marker_have = 0;
                        self.check_marker();
                    }
                    continue;
                }
                let to_marker = mpa::next_marker_pos(self.rx.stream_pos) - self.rx.stream_pos;
                limit = limit.min(to_marker as usize);
            }
            let n = if limit == avail.len()
                && self.rx.phase == Phase::Header
                && self.rx.hdr_have == 0
            {
                // An FPDU starts here and no marker interrupts the input.
                self.rx_whole(avail, mem)
                    .unwrap_or_else(|| self.rx_step(avail, mem))
            } else {
                self.rx_step(&avail[..limit], mem)
            };
            self.rx.stream_pos += n as u64;
            i += n;
            if self.rx.phase == Phase::Header && self.rx.hdr_have == 0 {
                // The previous FPDU just ended: the next one starts here
                // (with a marker, if one falls here).
                self.rx.fpdu_start = self.rx.stream_pos;
            }
        }
        data.len()
    }

    /// RFC 5044 §4.3: a marker's FPDU pointer gives the distance back to
    /// the start of the FPDU it sits in (zero when the FPDU starts with the
    /// marker). A marker that does not point there is a framing error.
    fn check_marker(&mut self) {
        let Ok(m) = mpa::Marker::parse(&self.rx.marker) else {
            self.fatal(Fault::Marker, None);
            return;
        };
        let marker_pos = self.rx.stream_pos - mpa::MARKER_LEN as u64;
        let expected = marker_pos - self.rx.fpdu_start;
        if u64::from(m.fpdu_ptr) != expected {
            self.fatal(Fault::Marker, None);
        }
    }

    /// A whole FPDU at the start of `chunk` (which holds no marker bytes
    /// before its end): run it through the same steps `rx_step` takes one
    /// call at a time (classify, header, payload, trailer) in one go, so a
    /// small message does not pay the input loop four times. Returns the
    /// bytes consumed (fewer than the FPDU when a step ends the stream),
    /// or `None` when the FPDU is not all there (the step-by-step machine
    /// takes it).
    fn rx_whole(&mut self, chunk: &[u8], mem: &dyn MemoryAccess) -> Option<usize> {
        let len_field = chunk.get(..mpa::ULPDU_LEN_FIELD)?;
        let ulpdu_len = u16::from_be_bytes([len_field[0], len_field[1]]) as usize;
        let total = mpa::fpdu_len(ulpdu_len, self.rx.fpdu.crc_on());
        if chunk.len() < total {
            return None;
        }
        self.rx.hdr[..CLASSIFY_LEN].copy_from_slice(&chunk[..CLASSIFY_LEN]);
        self.rx.fpdu.fold(&chunk[..CLASSIFY_LEN]);
        self.rx.hdr_have = CLASSIFY_LEN;
        self.rx_classify();
        if self.rx.phase != Phase::Header {
            return Some(CLASSIFY_LEN);
        }
        // `rx_classify` checked that the ULPDU covers the header, so the
        // header, payload and trailer below all lie within `total`.
        let need = self.rx.hdr_need;
        self.rx.hdr[CLASSIFY_LEN..need].copy_from_slice(&chunk[CLASSIFY_LEN..need]);
        self.rx.fpdu.fold(&chunk[CLASSIFY_LEN..need]);
        self.rx.hdr_have = need;
        self.rx_header_done(mem, true);
        let mut at = need;
        if self.rx.phase == Phase::Payload {
            let n = self.rx.payload_rem as usize;
            self.rx_payload(&chunk[at..at + n], mem);
            at += n;
        }
        if self.rx.phase != Phase::Trailer {
            return Some(at);
        }
        let (n, verdict) = self.rx.fpdu.trailer(&chunk[at..total]);
        if let Some(verdict) = verdict {
            self.rx_trailer_done(verdict, mem);
        }
        Some(at + n)
    }

    /// Consume a prefix of `chunk` (which holds no marker bytes).
    fn rx_step(&mut self, chunk: &[u8], mem: &dyn MemoryAccess) -> usize {
        match self.rx.phase {
            Phase::Dead => chunk.len(),
            Phase::Header => {
                let have = self.rx.hdr_have;
                let n = (self.rx.hdr_need - have).min(chunk.len());
                self.rx.hdr[have..have + n].copy_from_slice(&chunk[..n]);
                self.rx.fpdu.fold(&chunk[..n]);
                self.rx.hdr_have += n;
                if self.rx.hdr_have == self.rx.hdr_need && self.rx.hdr_need == CLASSIFY_LEN {
                    self.rx_classify();
                }
                if self.rx.phase == Phase::Header
                    && self.rx.hdr_have == self.rx.hdr_need
                    && self.rx.hdr_need > CLASSIFY_LEN
                {
                    self.rx_header_done(mem, false);
                }
                n
            }
            Phase::Payload => {
                let n = (self.rx.payload_rem as usize).min(chunk.len());
                self.rx_payload(&chunk[..n], mem);
                n
            }
            Phase::Trailer => {
                // Pad and CRC field: `mpa::FpduRx`, as `mpa::deframe`.
                let (n, verdict) = self.rx.fpdu.trailer(chunk);
                if let Some(verdict) = verdict {
                    self.rx_trailer_done(verdict, mem);
                }
                n
            }
        }
    }

    /// The first four bytes of an FPDU are in: check versions and opcode
    /// and work out the full header length.
    fn rx_classify(&mut self) {
        let hdr = self.rx.hdr;
        let ulpdu_len = u16::from_be_bytes([hdr[0], hdr[1]]) as usize;
        let d = ddp::Packet::new_unchecked(&hdr[mpa::ULPDU_LEN_FIELD..]);
        let tagged = d.tagged();
        // RFC 5041 §7.2 / §7.3: unsupported DDP version.
        if d.version() != ddp::DDP_VERSION {
            return self.fatal_rx(Fault::DdpVersion { tagged });
        }
        let ctrl = d.ulp_ctrl();
        // RFC 5040 §7.2: unsupported RDMAP version.
        if rdmap::ctrl_version(ctrl) != rdmap::RDMAP_VERSION {
            return self.fatal_rx(Fault::RdmapVersion);
        }
        let opcode = rdmap::ctrl_opcode(ctrl);
        // RFC 5040 §4.2 / §7: an opcode we do not know, or one used with the
        // wrong DDP model (e.g. an untagged RDMA Write). The header lengths
        // are the one table, `Opcode::ulp_header_len`.
        let (Some(model), Some(ulp_hdr_len)) = (opcode.is_tagged(), opcode.ulp_header_len()) else {
            return self.fatal_rx(Fault::UnexpectedOpcode);
        };
        if model != tagged {
            return self.fatal_rx(Fault::UnexpectedOpcode);
        }
        // The bytes gathered before the payload. A Terminate's 4-byte
        // control field is gathered with its optional copied headers as
        // the body `terminate::Packet` parses and length-checks, so a
        // Terminate too short for it is reported by that parse (and taken
        // as an unspecified error from the peer), not as a framing error.
        let hdr_len = if opcode == Opcode::Terminate {
            ulp_hdr_len - terminate::HDR_LEN
        } else {
            ulp_hdr_len
        };
        // RFC 5044 §4.1: the ULPDU length must cover the DDP/RDMAP header.
        // A Read Request carries no payload (RFC 5040 §4.4); a Terminate's
        // body is bounded (RFC 5040 §4.8).
        let bad_len = ulpdu_len < hdr_len
            || (opcode == Opcode::ReadRequest && ulpdu_len != hdr_len)
            || (opcode == Opcode::Terminate && ulpdu_len - hdr_len > TERM_BODY_MAX);
        if bad_len {
            // The framing error `mpa::deframe` reports for a ULPDU too
            // short to frame a DDP segment (the engine knows the opcode, so
            // it checks against this opcode's header).
            return self.fatal_rx(mpa::FpduError::LengthTooShort.fault());
        }
        self.rx.fpdu.begin(ulpdu_len);
        self.rx.opcode = opcode;
        self.rx.last = d.last();
        self.rx.hdr_need = mpa::ULPDU_LEN_FIELD + hdr_len;
    }

    fn fatal_rx(&mut self, fault: Fault) {
        let have = self.rx.hdr_have;
        let hdr = self.rx.hdr;
        self.fatal(fault, Some(&hdr[..have]));
    }

    /// The whole DDP/RDMAP header is in: validate it and set up placement.
    ///
    /// With `whole` (the segment's payload is in the same input,
    /// `rx_whole`), an RDMA Write's sink is checked with its placement in
    /// one region lookup (`MemoryAccess::check_and_write`, from
    /// `rx_payload`): the same checks in the same order, failing with the
    /// same Terminate, before any byte is placed.
    fn rx_header_done(&mut self, mem: &dyn MemoryAccess, whole: bool) {
        let hdr_len = self.rx.hdr_need - mpa::ULPDU_LEN_FIELD;
        let payload_len = (self.rx.fpdu.ulpdu_len() - hdr_len) as u32;
        let hdr = self.rx.hdr;
        let d = ddp::Packet::new_unchecked(&hdr[mpa::ULPDU_LEN_FIELD..]);
        let pd = self.cfg.pd;
        let last = self.rx.last;
        let seg = match self.rx.opcode {
            Opcode::RdmaWrite => {
                let (stag, to) = (d.stag(), d.to());
                // RFC 5041 §7.2, RFC 5040 §5.1: the sink STag must be valid,
                // of this QP's PD, writable remotely, and cover the segment.
                // A zero-length Write (the RFC 6581 RTR) places nothing and
                // is not checked, as in siw.
                if payload_len > 0 {
                    if whole {
                        self.rx.sink_unchecked = true;
                    } else if let Err(e) =
                        mem.check(stag, to, payload_len, pd, Access::REMOTE_WRITE)
                    {
                        return self.fatal_rx(Fault::TaggedSink(e));
                    }
                }
                Seg::Tagged {
                    stag,
                    to,
                    read_resp: false,
                }
            }
            Opcode::ReadResponse => {
                let (stag, to) = (d.stag(), d.to());
                // RFC 5040 §5.2: a Read Response must answer the oldest
                // outstanding Read Request, in order and within its size.
                let Some(head) = self.orq.front().copied() else {
                    return self.fatal_rx(Fault::UnexpectedOpcode);
                };
                if stag != head.sink_stag {
                    return self.fatal_rx(Fault::TaggedSink(MemError::InvalidStag));
                }
                let end = head.placed as u64 + payload_len as u64;
                if to != head.sink_to.wrapping_add(head.placed as u64)
                    || end > head.size as u64
                    || (last && end != head.size as u64)
                {
                    return self.fatal_rx(Fault::TaggedSink(MemError::Bounds));
                }
                if payload_len > 0 {
                    if let Err(e) = mem.check(stag, to, payload_len, pd, Access::LOCAL_WRITE) {
                        if let Some(slot) = self.slot_mut(head.seq) {
                            slot.status = Some(WcStatus::LocProtErr);
                            slot.sent = true;
                        }
                        return self.fatal_rx(Fault::TaggedSink(e));
                    }
                }
                Seg::Tagged {
                    stag,
                    to,
                    read_resp: true,
                }
            }
            op @ (Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSe
            | Opcode::SendSeInvalidate) => {
                // RFC 5041 §5.1, §7.3: untagged queue 0, in-order MSN and MO.
                if d.qn() != rdmap::QN_SEND {
                    return self.fatal_rx(Fault::UntaggedQn);
                }
                if d.msn() != self.rx.msn[0] {
                    return self.fatal_rx(Fault::UntaggedMsn);
                }
                if self.rx.cur_recv.is_none() {
                    if d.mo() != 0 {
                        return self.fatal_rx(Fault::UntaggedMo);
                    }
                    // RFC 5040 §5.3: a Send needs a posted receive; iWARP
                    // has no receiver-not-ready retry, so this is fatal.
                    let Some(wr) = self.rq.pop_front() else {
                        return self.fatal_rx(Fault::UntaggedNoBuffer);
                    };
                    for sge in wr.sgl.as_slice().iter().filter(|s| s.length > 0) {
                        if mem
                            .check(sge.lkey, sge.addr, sge.length, pd, Access::LOCAL_WRITE)
                            .is_err()
                        {
                            self.completions
                                .push_back(recv_wc(wr.wr_id, WcStatus::LocProtErr, 0));
                            return self.fatal_rx(Fault::DdpLocal);
                        }
                    }
                    let inval = matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate);
                    self.rx.cur_recv = Some(CurRecv {
                        wr_id: wr.wr_id,
                        sgl: wr.sgl,
                        cap: wr.sgl.total_len() as u32,
                        placed: 0,
                        sge_idx: 0,
                        sge_off: 0,
                        inval_stag: inval.then(|| d.ulp_word()),
                        solicited: matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate),
                    });
                }
                let (placed, cap, wr_id) = match self.rx.cur_recv.as_ref() {
                    Some(c) => (c.placed, c.cap, c.wr_id),
                    None => unreachable!("set above"),
                };
                if d.mo() != placed {
                    return self.fatal_rx(Fault::UntaggedMo);
                }
                if placed as u64 + payload_len as u64 > cap as u64 {
                    self.rx.cur_recv = None;
                    self.completions
                        .push_back(recv_wc(wr_id, WcStatus::LocLenErr, 0));
                    return self.fatal_rx(Fault::UntaggedTooLong);
                }
                Seg::Send
            }
            Opcode::ReadRequest => {
                if d.qn() != rdmap::QN_READ_REQUEST {
                    return self.fatal_rx(Fault::UntaggedQn);
                }
                if d.msn() != self.rx.msn[1] {
                    return self.fatal_rx(Fault::UntaggedMsn);
                }
                if d.mo() != 0 || !last {
                    return self.fatal_rx(Fault::UntaggedMo);
                }
                // RFC 5040 §5.2 / RFC 6581 §3: at most IRD Read Requests
                // outstanding; siw answers an overflow with this code.
                if self.irq.len() >= self.link.ird as usize {
                    return self.fatal_rx(Fault::IrdExceeded);
                }
                let rr_bytes = &hdr[mpa::ULPDU_LEN_FIELD + ddp::UNTAGGED_HDR_LEN..MAX_HDR];
                let Ok(rr) =
                    rdmap::ReadRequestRepr::parse(&rdmap::ReadRequest::new_unchecked(rr_bytes))
                else {
                    return self.fatal_rx(Fault::UlpduLength);
                };
                self.irq.push_back(IrqEntry {
                    sink_stag: rr.sink_stag,
                    sink_to: rr.sink_to,
                    size: rr.size,
                    src_stag: rr.src_stag,
                    src_to: rr.src_to,
                    hdr,
                });
                self.rx.msn[1] = self.rx.msn[1].wrapping_add(1);
                Seg::None
            }
            Opcode::Terminate => {
                self.rx.term_have = 0;
                Seg::Terminate
            }
            _ => return self.fatal_rx(Fault::UnexpectedOpcode),
        };
        self.rx.seg = seg;
        self.rx.payload_rem = payload_len;
        self.rx.phase = if payload_len > 0 {
            Phase::Payload
        } else {
            Phase::Trailer
        };
    }

    fn rx_payload(&mut self, bytes: &[u8], mem: &dyn MemoryAccess) {
        let n = bytes.len() as u32;
        match self.rx.seg {
            Seg::Tagged { stag, to, .. } => {
                let r = if std::mem::take(&mut self.rx.sink_unchecked) {
                    // RFC 5041 §7.2, RFC 5040 §5.1, as in `rx_header_done`.
                    mem.check_and_write(stag, to, bytes, self.cfg.pd, Access::REMOTE_WRITE)
                } else {
                    mem.write(stag, to, bytes)
                };
                if let Err(e) = r {
                    return self.fatal_rx(Fault::TaggedSink(e));
                }
                self.rx.fpdu.fold(bytes);
                self.advance_tagged(n);
            }
            Seg::Send => {
                let Some(cur) = self.rx.cur_recv.as_ref() else {
                    return self.fatal_rx(Fault::DdpLocal);
                };
                // Walk the receive's SGEs from where the last segment left
                // off (by position, not by copying the receive).
                let sges = cur.sgl.as_slice();
                let (mut idx, mut off) = (cur.sge_idx, cur.sge_off);
                let mut rest = bytes;
                let mut fault = None;
                while !rest.is_empty() {
                    let Some(sge) = sges.get(idx) else {
                        // Bounded by the capacity check in the header.
                        fault = Some(Fault::UntaggedTooLong);
                        break;
                    };
                    if off >= sge.length {
                        idx += 1;
                        off = 0;
                        continue;
                    }
                    let k = ((sge.length - off) as usize).min(rest.len());
                    if mem
                        .write(sge.lkey, sge.addr + off as u64, &rest[..k])
                        .is_err()
                    {
                        fault = Some(Fault::DdpLocal);
                        break;
                    }
                    off += k as u32;
                    rest = &rest[k..];
                }
                match fault {
                    None => {}
                    Some(Fault::DdpLocal) => {
                        let wr_id = cur.wr_id;
                        self.rx.cur_recv = None;
                        self.completions
                            .push_back(recv_wc(wr_id, WcStatus::LocProtErr, 0));
                        return self.fatal_rx(Fault::DdpLocal);
                    }
                    Some(f) => return self.fatal_rx(f),
                }
                self.rx.fpdu.fold(bytes);
                self.advance_send(n);
            }
            Seg::Terminate => {
                let have = self.rx.term_have;
                let k = bytes.len().min(TERM_BODY_MAX - have);
                self.rx.term_body[have..have + k].copy_from_slice(&bytes[..k]);
                self.rx.term_have += k;
                self.rx.fpdu.fold(bytes);
                self.rx.payload_rem -= n;
            }
            Seg::None => {
                self.rx.fpdu.fold(bytes);
                self.rx.payload_rem -= n;
            }
        }
        if self.rx.phase == Phase::Payload && self.rx.payload_rem == 0 {
            self.rx.phase = Phase::Trailer;
        }
    }

    /// `n` tagged payload bytes were placed (and folded into the CRC).
    fn advance_tagged(&mut self, n: u32) {
        if let Seg::Tagged {
            stag,
            to,
            read_resp,
        } = self.rx.seg
        {
            self.rx.seg = Seg::Tagged {
                stag,
                to: to.wrapping_add(n as u64),
                read_resp,
            };
            if read_resp {
                if let Some(head) = self.orq.front_mut() {
                    head.placed += n;
                }
            }
        }
        self.rx.payload_rem -= n;
        if self.rx.payload_rem == 0 && self.rx.phase == Phase::Payload {
            self.rx.phase = Phase::Trailer;
        }
    }

    /// `n` bytes of Send payload were placed (and folded into the CRC).
    fn advance_send(&mut self, n: u32) {
        if let Some(cur) = self.rx.cur_recv.as_mut() {
            cur.advance(n);
        }
        self.rx.payload_rem -= n;
        if self.rx.payload_rem == 0 && self.rx.phase == Phase::Payload {
            self.rx.phase = Phase::Trailer;
        }
    }

    /// Pad and CRC are in: verify the CRC, then finish the message if this
    /// was its last segment.
    fn rx_trailer_done(
        &mut self,
        verdict: core::result::Result<(), mpa::FpduError>,
        mem: &dyn MemoryAccess,
    ) {
        // RFC 5044 §4.4: a CRC mismatch is a fatal LLP error.
        if let Err(e) = verdict {
            return self.fatal_rx(e.fault());
        }
        let last = self.rx.last;
        let seg = self.rx.seg;
        self.rx.reset_fpdu();
        match seg {
            Seg::Tagged {
                read_resp: true, ..
            } if last => {
                if let Some(head) = self.orq.pop_front() {
                    if let Some(slot) = self.slot_mut(head.seq) {
                        slot.reads_left = slot.reads_left.saturating_sub(1);
                        if slot.reads_left == 0 && slot.status.is_none() {
                            slot.status = Some(WcStatus::Success);
                        }
                    }
                    self.drain_sq_completions();
                }
            }
            Seg::Send if last => {
                let Some(cur) = self.rx.cur_recv.take() else {
                    return;
                };
                self.rx.msn[0] = self.rx.msn[0].wrapping_add(1);
                let mut wc = recv_wc(cur.wr_id, WcStatus::Success, cur.placed);
                wc.solicited = cur.solicited;
                if let Some(stag) = cur.inval_stag {
                    // RFC 5040 §5.3: Send with Invalidate invalidates the
                    // named STag before the receive completes.
                    if mem.invalidate(stag, self.cfg.pd).is_err() {
                        self.completions
                            .push_back(recv_wc(cur.wr_id, WcStatus::RemInvReqErr, 0));
                        return self.fatal(Fault::CannotInvalidate, None);
                    }
                    wc.invalidated_rkey = Some(stag);
                }
                self.completions.push_back(wc);
            }
            Seg::Terminate => {
                self.rx.msn[2] = self.rx.msn[2].wrapping_add(1);
                let body = &self.rx.term_body[..self.rx.term_have];
                let (code, culprit) =
                    match terminate::Packet::new_checked(body).ok().and_then(|p| {
                        terminate::TerminateRepr::parse(&p)
                            .ok()
                            .map(|r| (r.code, r.ddp_hdr.map(<[u8]>::to_vec)))
                    }) {
                        Some((code, hdr)) => {
                            // The copied DDP header names the message that
                            // failed (RFC 5040 §4.8): its RDMAP opcode.
                            let op = hdr
                                .filter(|h| h.len() >= 2)
                                .map(|h| rdmap::ctrl_opcode(h[1]));
                            (code, op)
                        }
                        None => (TermCode::RdmapUnspecified, None),
                    };
                self.on_terminate(code, culprit);
            }
            _ => {}
        }
    }
}
