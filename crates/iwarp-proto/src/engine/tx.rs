//! Transmit path: segmentation of work requests into FPDUs.
//!
//! RFC 5040 §5 (which RDMAP message each work request becomes), RFC 5041
//! §4-§5 (tagged and untagged DDP headers, MSN and MO), RFC 5044 §4
//! (ULPDU length, pad, CRC, markers) and §5.1 (MULPDU: every FPDU fits the
//! negotiated maximum). Modeled on siw `siw_qp_tx.c`.
//!
//! Nothing is copied here: a frame holds the headers, pads, markers and
//! CRCs inline and refers to payload by (STag, TO, length) in registered
//! memory, so the driver can hand the kernel one `writev` straight from the
//! application's buffers. The CRC is computed by visiting that memory.
//!
//! Scheduling: a pending Terminate goes first and ends transmission. Then
//! the message in progress continues; a new message is an inbound Read's
//! response if one is waiting (so the peer's Reads are not starved by a
//! long send queue), else the next send-queue request. RDMA Reads wait
//! while ORD Read Requests are outstanding (RFC 5040 §5.2, RFC 6581 §3).

use super::qp::{wc_opcode_of, Engine, IrqEntry, OrqEntry};
use super::rx_state::CRC_COVERS_MARKERS;
use super::tx_state::{CurKind, Cursor};
use super::types::{QpState, TxFrame, TxPiece};
use super::wr::{SendWr, SgList, Sge, WcOpcode, WcStatus, WrOpcode, MAX_SGE};
use crate::fault::Fault;
use crate::mem::{Access, MemError, MemoryAccess, PdId};
use crate::wire::{crc, ddp, mpa, rdmap};
use rdmap::Opcode;

/// Upper bound on pieces per frame, so one `writev` stays under IOV_MAX.
const MAX_PIECES: usize = 512;

/// Frame state to restore if an FPDU cannot be finished.
#[derive(Clone, Copy)]
struct Snapshot {
    pieces: usize,
    inline: usize,
    stream_pos: u64,
}

impl Engine {
    /// True if [`Engine::poll_transmit`] would produce bytes.
    pub fn has_transmit(&self) -> bool {
        if self.tx.pending_term.is_some() {
            return true;
        }
        if self.state != QpState::Rts || self.tx_hold {
            return false;
        }
        self.tx.cursor.is_some()
            || !self.irq.is_empty()
            || self.sq.front().is_some_and(|wr| self.can_start(wr))
    }

    /// Append frames, up to about `max_bytes`, to `frame`. Returns true if
    /// anything was added. Call [`Engine::confirm_transmit`] once the frame
    /// has been written out.
    pub fn poll_transmit(
        &mut self,
        frame: &mut TxFrame,
        max_bytes: usize,
        mem: &dyn MemoryAccess,
    ) -> bool {
        let start = self.tx.stream_pos;
        let mut any = false;
        loop {
            if let Some(term) = self.tx.pending_term.take() {
                self.emit_ulpdu(frame, &term);
                return true;
            }
            let added = (self.tx.stream_pos - start) as usize;
            if self.state != QpState::Rts
                || self.tx_hold
                || added >= max_bytes
                || frame.pieces.len() + 8 >= MAX_PIECES
            {
                break;
            }
            if self.tx.cursor.is_some() {
                any |= self.emit_segment(frame, mem);
                continue;
            }
            if let Some(entry) = self.irq.pop_front() {
                self.start_read_response(entry, mem);
                continue;
            }
            match self.sq.front() {
                Some(wr) if self.can_start(wr) => {}
                _ => break,
            }
            let Some(wr) = self.sq.pop_front() else {
                break;
            };
            match wr.opcode {
                WrOpcode::RdmaRead { remote_addr, rkey } => {
                    any |= self.emit_read_requests(frame, &wr, remote_addr, rkey, mem);
                }
                _ => {
                    if self.emit_whole(frame, &wr, mem) {
                        any = true;
                    } else {
                        self.start_send_or_write(&wr, mem);
                    }
                }
            }
        }
        if let Some(cur) = self.tx.cursor.as_mut() {
            cur.checked = false;
        }
        any
    }

    /// Read Requests a Read work request needs: one per non-empty SGE (a
    /// Read Request names a single sink), at least one.
    fn reads_needed(wr: &SendWr) -> usize {
        wr.sgl
            .as_slice()
            .iter()
            .filter(|s| s.length > 0)
            .count()
            .max(1)
    }

    fn can_start(&self, wr: &SendWr) -> bool {
        match wr.opcode {
            WrOpcode::RdmaRead { .. } => {
                let n = Self::reads_needed(wr);
                let ord = self.link.ord as usize;
                n > ord || self.orq.len() + n <= ord
            }
            _ => true,
        }
    }

    /// A send-queue request failed locally before anything went on the
    /// wire: complete it with `status`, then tear the stream down.
    fn fail_local(&mut self, wr: &SendWr, status: WcStatus) {
        let seq = self.new_slot(wr, wc_opcode_of(&wr.opcode), 0);
        if let Some(slot) = self.slot_mut(seq) {
            slot.status = Some(status);
            slot.sent = true;
        }
        // RFC 5040 §4.8: RDMAP layer, local catastrophic error.
        self.fatal(Fault::RdmapLocal, None);
    }

    fn start_send_or_write(&mut self, wr: &SendWr, mem: &dyn MemoryAccess) {
        let pd = self.cfg.pd;
        for sge in wr.sgl.as_slice().iter().filter(|s| s.length > 0) {
            if mem
                .check(sge.lkey, sge.addr, sge.length, pd, Access::NONE)
                .is_err()
            {
                return self.fail_local(wr, WcStatus::LocProtErr);
            }
        }
        let total = wr.sgl.total_len() as u32;
        let Some((kind, wc_op)) = self.message_kind(wr) else {
            return;
        };
        let seq = self.new_slot(wr, wc_op, total);
        self.tx.cursor = Some(Cursor {
            kind,
            seq: Some(seq),
            sgl: wr.sgl,
            total,
            off: 0,
            sge_idx: 0,
            sge_off: 0,
            checked: true,
        });
    }

    /// What a Send or Write work request becomes on the wire (RFC 5040
    /// §5.1, §5.3), taking the next Send MSN for a Send; `None` for a Read.
    fn message_kind(&mut self, wr: &SendWr) -> Option<(CurKind, WcOpcode)> {
        Some(match wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithInv { .. } => {
                let (op, inval) = match (wr.opcode, wr.solicited) {
                    (WrOpcode::SendWithInv { invalidate_rkey }, true) => {
                        (Opcode::SendSeInvalidate, invalidate_rkey)
                    }
                    (WrOpcode::SendWithInv { invalidate_rkey }, false) => {
                        (Opcode::SendInvalidate, invalidate_rkey)
                    }
                    (_, true) => (Opcode::SendSe, 0),
                    (_, false) => (Opcode::Send, 0),
                };
                let msn = self.tx.msn_send;
                self.tx.msn_send = msn.wrapping_add(1);
                (CurKind::Send { op, inval, msn }, WcOpcode::Send)
            }
            WrOpcode::RdmaWrite { remote_addr, rkey } => (
                CurKind::Write {
                    rkey,
                    raddr: remote_addr,
                },
                WcOpcode::RdmaWrite,
            ),
            WrOpcode::RdmaRead { .. } => return None,
        })
    }

    /// A Send or Write that fits one FPDU, from at most one SGE, on a
    /// stream without markers (the common small message): emitted whole,
    /// without the segmentation cursor. Returns false, having done
    /// nothing, for anything else (the general path takes it). The frame
    /// is what `emit_segment` makes of it; the tests compare the two.
    fn emit_whole(&mut self, frame: &mut TxFrame, wr: &SendWr, mem: &dyn MemoryAccess) -> bool {
        if self.link.markers_tx {
            return false;
        }
        let mut src = None;
        for sge in wr.sgl.as_slice().iter().filter(|s| s.length > 0) {
            if src.replace(*sge).is_some() {
                return false;
            }
        }
        let total = src.map_or(0, |s| s.length);
        let hdr_len = match wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithInv { .. } => ddp::UNTAGGED_HDR_LEN,
            WrOpcode::RdmaWrite { .. } => ddp::TAGGED_HDR_LEN,
            WrOpcode::RdmaRead { .. } => return false,
        };
        // RFC 5044 §5.1 / RFC 5041 §5.2: the one segment fits in MULPDU.
        if total as usize > self.link.mulpdu as usize - hdr_len {
            return false;
        }
        // The source, validated as `start_send_or_write` does.
        if let Some(s) = src {
            if mem
                .check(s.lkey, s.addr, s.length, self.cfg.pd, Access::NONE)
                .is_err()
            {
                self.fail_local(wr, WcStatus::LocProtErr);
                return true;
            }
        }
        let mut lead = [0u8; mpa::ULPDU_LEN_FIELD + ddp::UNTAGGED_HDR_LEN];
        let lead_len = mpa::ULPDU_LEN_FIELD + hdr_len;
        let ulpdu_len = hdr_len + total as usize;
        lead[..mpa::ULPDU_LEN_FIELD].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
        let Some((kind, wc_op)) = self.message_kind(wr) else {
            return false;
        };
        let (op, placement, ulp_word) = kind.segment(0);
        ddp::Repr {
            last: true,
            version: ddp::DDP_VERSION,
            ulp_ctrl: rdmap::ctrl_byte(op),
            ulp_word,
            placement,
        }
        .emit(&mut ddp::Packet::new_unchecked(
            &mut lead[mpa::ULPDU_LEN_FIELD..lead_len],
        ));
        let lead = &lead[..lead_len];
        let mut running = None;
        if self.link.crc {
            // RFC 5044 §4.4: over the length field, the ULPDU and the pad.
            // The payload is visited once and goes by reference: the verbs
            // contract keeps a posted buffer unchanged until its
            // completion (see `emit_segment`).
            let mut c = crc::crc32c_append(0, lead);
            if let Some(s) = src {
                if mem
                    .visit(s.lkey, s.addr, s.length, &mut |b| {
                        c = crc::crc32c_append(c, b)
                    })
                    .is_err()
                {
                    // Deregistered since the check: as `emit_segment`.
                    self.fail_local(wr, WcStatus::LocProtErr);
                    return true;
                }
            }
            running = Some(c);
        }
        let seq = self.new_slot(wr, wc_op, total);
        push_inline(frame, lead);
        if let Some(s) = src {
            frame.pieces.push(TxPiece::Mem {
                stag: s.lkey,
                to: s.addr,
                len: s.length,
            });
        }
        push_trailer(frame, mpa::pad_len(ulpdu_len), running);
        self.tx.fpdu_start = self.tx.stream_pos;
        self.tx.stream_pos += mpa::fpdu_len(ulpdu_len, self.link.crc) as u64;
        self.unconfirmed.push(seq);
        true
    }

    /// RFC 5040 §5.2: the responder validates the source region when it
    /// generates the Read Response; a failure is an RDMAP remote
    /// protection error carrying the Read Request's headers.
    fn start_read_response(&mut self, e: IrqEntry, mem: &dyn MemoryAccess) {
        if e.size > 0 {
            if let Err(err) = mem.check(
                e.src_stag,
                e.src_to,
                e.size,
                self.cfg.pd,
                Access::REMOTE_READ,
            ) {
                return self.fatal(Fault::ReadSource(err), Some(&e.hdr));
            }
        }
        self.tx.cursor = Some(Cursor {
            kind: CurKind::ReadResp {
                sink_stag: e.sink_stag,
                sink_to: e.sink_to,
            },
            seq: None,
            sgl: SgList::single(Sge {
                addr: e.src_to,
                length: e.size,
                lkey: e.src_stag,
            }),
            total: e.size,
            off: 0,
            sge_idx: 0,
            sge_off: 0,
            checked: true,
        });
    }

    fn emit_read_requests(
        &mut self,
        frame: &mut TxFrame,
        wr: &SendWr,
        remote_addr: u64,
        rkey: u32,
        mem: &dyn MemoryAccess,
    ) -> bool {
        let n = Self::reads_needed(wr);
        if n > self.link.ord as usize {
            // More sink SGEs than Read Requests the peer accepts at once.
            self.fail_local(wr, WcStatus::LocQpOpErr);
            return false;
        }
        let pd = self.cfg.pd;
        for sge in wr.sgl.as_slice().iter().filter(|s| s.length > 0) {
            if mem
                .check(sge.lkey, sge.addr, sge.length, pd, Access::LOCAL_WRITE)
                .is_err()
            {
                self.fail_local(wr, WcStatus::LocProtErr);
                return false;
            }
        }
        let total = wr.sgl.total_len() as u32;
        let seq = self.new_slot(wr, WcOpcode::RdmaRead, total);
        if let Some(slot) = self.slot_mut(seq) {
            slot.reads_left = n as u32;
        }
        let mut sinks: Vec<Sge> = wr
            .sgl
            .as_slice()
            .iter()
            .copied()
            .filter(|s| s.length > 0)
            .collect();
        if sinks.is_empty() {
            // A zero-length Read (e.g. the RFC 6581 RTR message).
            let first = wr.sgl.as_slice().first().copied().unwrap_or_default();
            sinks.push(Sge { length: 0, ..first });
        }
        let mut roff = 0u64;
        for sge in sinks {
            let rr = rdmap::ReadRequestRepr {
                sink_stag: sge.lkey,
                sink_to: sge.addr,
                size: sge.length,
                src_stag: rkey,
                src_to: remote_addr.wrapping_add(roff),
            };
            roff += sge.length as u64;
            let mut ulpdu = [0u8; ddp::UNTAGGED_HDR_LEN + rdmap::READ_REQUEST_LEN];
            let (d, r) = ulpdu.split_at_mut(ddp::UNTAGGED_HDR_LEN);
            let msn = self.tx.msn_rreq;
            self.tx.msn_rreq = msn.wrapping_add(1);
            ddp::Repr {
                last: true,
                version: ddp::DDP_VERSION,
                ulp_ctrl: rdmap::ctrl_byte(Opcode::ReadRequest),
                ulp_word: 0,
                placement: ddp::Placement::Untagged {
                    qn: rdmap::QN_READ_REQUEST,
                    msn,
                    mo: 0,
                },
            }
            .emit(&mut ddp::Packet::new_unchecked(d));
            rr.emit(&mut rdmap::ReadRequest::new_unchecked(r));
            self.emit_ulpdu(frame, &ulpdu);
            self.orq.push_back(OrqEntry {
                seq,
                sink_stag: sge.lkey,
                sink_to: sge.addr,
                size: sge.length,
                placed: 0,
            });
        }
        self.unconfirmed.push(seq);
        true
    }

    /// Emit the next DDP segment of the message in progress. Returns false
    /// if the message failed (the QP is then in error).
    fn emit_segment(&mut self, frame: &mut TxFrame, mem: &dyn MemoryAccess) -> bool {
        let mulpdu = self.link.mulpdu as usize;
        // Worked on in place: the cursor holds a whole SGL, and copying it
        // out and back per segment cost two block copies per message.
        let Some(cur) = self.tx.cursor.as_mut() else {
            return false;
        };
        let hdr_len = if cur.kind.tagged() {
            ddp::TAGGED_HDR_LEN
        } else {
            ddp::UNTAGGED_HDR_LEN
        };
        // RFC 5044 §5.1 / RFC 5041 §5.2: each segment fits in MULPDU.
        let max_payload = mulpdu - hdr_len;
        let mut n = ((cur.total - cur.off) as usize).min(max_payload) as u32;
        if self.link.markers_tx
            && n > 4
            && mpa::is_marker_pos(fpdu_end_with_markers(
                self.tx.stream_pos,
                hdr_len + n as usize,
            ))
        {
            // The FPDU would end exactly where a marker is due, so the
            // next FPDU starts with that marker (RFC 5044 §5.1). That is
            // valid, but Wireshark's iwarp_mpa dissector, which assumes one
            // FPDU per TCP segment, then counts the marker in both FPDUs
            // and rejects the first (`number_of_markers` is one too many
            // when the segment ends on a marker position). Four payload
            // bytes fewer move the end off the marker position; any
            // segment size up to MULPDU is allowed (RFC 5041 §5.2), and the
            // four bytes lead the next segment.
            n -= 4;
        }
        let last = cur.off + n == cur.total;
        let (op, placement, ulp_word) = cur.kind.segment(cur.off);
        let mut hdr = [0u8; ddp::UNTAGGED_HDR_LEN];
        ddp::Repr {
            last,
            version: ddp::DDP_VERSION,
            ulp_ctrl: rdmap::ctrl_byte(op),
            ulp_word,
            placement,
        }
        .emit(&mut ddp::Packet::new_unchecked(&mut hdr[..hdr_len]));

        // Payload pieces of this segment, from the SGL cursor.
        let mut pieces: [(u32, u64, u32); MAX_SGE] = [(0, 0, 0); MAX_SGE];
        let mut np = 0;
        let mut rem = n;
        while rem > 0 {
            let sge = cur.sgl.as_slice()[cur.sge_idx];
            let room = sge.length - cur.sge_off;
            if room == 0 {
                cur.sge_idx += 1;
                cur.sge_off = 0;
                continue;
            }
            let k = room.min(rem);
            pieces[np] = (sge.lkey, sge.addr.wrapping_add(cur.sge_off as u64), k);
            np += 1;
            cur.sge_off += k;
            rem -= k;
        }
        // A Read Response's source is memory the responder's application
        // may be rewriting (see `put_mem`); a Send's or Write's is the
        // requester's own posted buffer, which it leaves alone until the
        // completion (the verbs contract), so it goes by reference.
        let snapshot = matches!(cur.kind, CurKind::ReadResp { .. });
        let src = Source {
            snapshot,
            checked: cur.checked,
        };
        cur.off += n;
        let seq = cur.seq;
        if !self.emit_fpdu(frame, &hdr[..hdr_len], &pieces[..np], src, mem) {
            self.tx.cursor = None;
            if let Some(seq) = seq {
                if let Some(slot) = self.slot_mut(seq) {
                    slot.status = Some(WcStatus::LocProtErr);
                    slot.sent = true;
                }
            }
            self.fatal(Fault::RdmapLocal, None);
            return false;
        }
        if last {
            self.tx.cursor = None;
            if let Some(seq) = seq {
                self.unconfirmed.push(seq);
            }
        }
        true
    }

    /// Emit one FPDU whose ULPDU is entirely inline.
    fn emit_ulpdu(&mut self, frame: &mut TxFrame, ulpdu: &[u8]) {
        // Inline ULPDUs never touch registered memory, so this cannot fail.
        let src = Source {
            snapshot: false,
            checked: true,
        };
        let ok = self.emit_fpdu(frame, ulpdu, &[], src, &NoMemory);
        debug_assert!(ok);
    }

    /// Emit one FPDU (RFC 5044 §4.1): ULPDU length, `head` inline, then the
    /// payload `pieces` (lkey/STag, address, length) from registered
    /// memory, pad, and CRC (zero when CRC is not in use, §4.4), with
    /// markers inserted where they fall. On failure the frame is restored.
    fn emit_fpdu(
        &mut self,
        frame: &mut TxFrame,
        head: &[u8],
        pieces: &[(u32, u64, u32)],
        src: Source,
        mem: &dyn MemoryAccess,
    ) -> bool {
        let snap = Snapshot {
            pieces: frame.pieces.len(),
            inline: frame.inline.len(),
            stream_pos: self.tx.stream_pos,
        };
        let payload: usize = pieces.iter().map(|p| p.2 as usize).sum();
        let ulpdu_len = head.len() + payload;
        self.tx.fpdu_start = self.tx.stream_pos;
        self.tx.crc = 0;
        let len_field = (ulpdu_len as u16).to_be_bytes();
        if self.link.markers_tx {
            self.put_inline(frame, &len_field, true);
            self.put_inline(frame, head, true);
        } else {
            // No markers in this direction (RFC 5044 §4.3 not negotiated):
            // the length field and the header are one inline run.
            push_inline(frame, &len_field);
            push_inline(frame, head);
            if self.link.crc {
                self.tx.crc = crc::crc32c_append(crc::crc32c_append(0, &len_field), head);
            }
            self.tx.stream_pos += (len_field.len() + head.len()) as u64;
        }
        for &(stag, to, len) in pieces {
            if self.put_mem(frame, stag, to, len, src, mem).is_err() {
                frame.pieces.truncate(snap.pieces);
                frame.inline.truncate(snap.inline);
                self.tx.stream_pos = snap.stream_pos;
                return false;
            }
        }
        let pad_len = mpa::pad_len(ulpdu_len);
        if !self.link.markers_tx {
            let n = push_trailer(frame, pad_len, self.link.crc.then_some(self.tx.crc));
            self.tx.stream_pos += n as u64;
            return true;
        }
        let pad = [0u8; 3];
        self.put_inline(frame, &pad[..pad_len], true);
        // A marker due right before the CRC field goes first and is covered
        // by the CRC; one that falls inside the field cannot be.
        self.marker_gap(frame);
        let crc = if self.link.crc {
            crc::crc_to_wire(self.tx.crc)
        } else {
            [0; 4]
        };
        self.tx.in_crc_field = true;
        self.put_inline(frame, &crc, false);
        self.tx.in_crc_field = false;
        true
    }

    /// If a marker is due at the current stream position, emit it; return
    /// how many bytes may follow before the next marker.
    fn marker_gap(&mut self, frame: &mut TxFrame) -> usize {
        if !self.link.markers_tx {
            return usize::MAX;
        }
        let pos = self.tx.stream_pos;
        if mpa::is_marker_pos(pos) {
            let mut m = [0u8; mpa::MARKER_LEN];
            mpa::Marker {
                fpdu_ptr: (pos - self.tx.fpdu_start) as u16,
            }
            .emit(&mut m);
            push_inline(frame, &m);
            if self.link.crc && CRC_COVERS_MARKERS && !self.tx.in_crc_field {
                self.tx.crc = crc::crc32c_append(self.tx.crc, &m);
            }
            self.tx.stream_pos += mpa::MARKER_LEN as u64;
        }
        (mpa::next_marker_pos(self.tx.stream_pos) - self.tx.stream_pos) as usize
    }

    fn put_inline(&mut self, frame: &mut TxFrame, bytes: &[u8], in_crc: bool) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let k = self.marker_gap(frame).min(rest.len());
            push_inline(frame, &rest[..k]);
            if in_crc && self.link.crc {
                self.tx.crc = crc::crc32c_append(self.tx.crc, &rest[..k]);
            }
            self.tx.stream_pos += k as u64;
            rest = &rest[k..];
        }
    }

    fn put_mem(
        &mut self,
        frame: &mut TxFrame,
        stag: u32,
        to: u64,
        len: u32,
        src: Source,
        mem: &dyn MemoryAccess,
    ) -> Result<(), MemError> {
        let Source { snapshot, checked } = src;
        let mut done = 0u32;
        while done < len {
            let k = self.marker_gap(frame).min((len - done) as usize) as u32;
            let at = to.wrapping_add(done as u64);
            if self.link.crc && snapshot {
                // RFC 5044 §6: the CRC covers the bytes on the wire. The
                // writer hands a `Mem` piece to the kernel later than its
                // CRC is computed, and a Read Response's source may change
                // in between: RFC 5040 §5.2 lets the responder's
                // application keep writing a region that a peer reads
                // (e.g. a version slot being published). So a Read
                // Response's payload is copied into the frame once and the
                // CRC is computed over that copy: what is sent is what is
                // covered, as an RNIC's CRC covers what it DMAs.
                let start = frame.inline.len();
                let inline = &mut frame.inline;
                mem.visit(stag, at, k, &mut |b| inline.extend_from_slice(b))?;
                self.tx.crc = crc::crc32c_append(self.tx.crc, &frame.inline[start..]);
                record_inline(frame, start as u32, k);
            } else {
                if self.link.crc {
                    let mut c = self.tx.crc;
                    mem.visit(stag, at, k, &mut |b| c = crc::crc32c_append(c, b))?;
                    self.tx.crc = c;
                } else if !checked {
                    mem.check(stag, at, k, self.cfg.pd, Access::NONE)?;
                }
                frame.pieces.push(TxPiece::Mem {
                    stag,
                    to: at,
                    len: k,
                });
            }
            self.tx.stream_pos += k as u64;
            done += k;
        }
        Ok(())
    }
}

/// Append an FPDU's pad and CRC field as one inline run (RFC 5044 §4.1,
/// §4.4; no marker falls inside): `running` is the CRC of the FPDU up to
/// the pad, `None` without CRC (the field is then zero). Returns the bytes
/// added.
fn push_trailer(frame: &mut TxFrame, pad_len: usize, running: Option<u32>) -> usize {
    let mut trailer = [0u8; 3 + mpa::CRC_LEN];
    if let Some(c) = running {
        let c = crc::crc32c_append(c, &trailer[..pad_len]);
        trailer[pad_len..pad_len + mpa::CRC_LEN].copy_from_slice(&crc::crc_to_wire(c));
    }
    let n = pad_len + mpa::CRC_LEN;
    push_inline(frame, &trailer[..n]);
    n
}

/// How `emit_fpdu` takes a segment's payload from registered memory.
#[derive(Debug, Clone, Copy)]
struct Source {
    /// Copy it into the frame (a Read Response's source, see `put_mem`).
    snapshot: bool,
    /// Its range was validated earlier in this `poll_transmit` call.
    checked: bool,
}

/// Append inline bytes, merging with the previous inline piece when
/// contiguous so a frame has few iovecs.
fn push_inline(frame: &mut TxFrame, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let start = frame.inline.len() as u32;
    frame.inline.extend_from_slice(bytes);
    record_inline(frame, start, bytes.len() as u32);
}

/// Record `len` bytes already appended to `frame.inline` at `start` as the
/// next piece, merged with the previous inline piece when contiguous.
fn record_inline(frame: &mut TxFrame, start: u32, len: u32) {
    if len == 0 {
        return;
    }
    if let Some(TxPiece::Inline { start: s, len: l }) = frame.pieces.last_mut() {
        if *s + *l == start {
            *l += len;
            return;
        }
    }
    frame.pieces.push(TxPiece::Inline { start, len });
}

/// Memory for FPDUs that carry no payload by reference.
struct NoMemory;

impl MemoryAccess for NoMemory {
    fn check(&self, _: u32, _: u64, _: u32, _: PdId, _: Access) -> Result<(), MemError> {
        Err(MemError::InvalidStag)
    }
    fn write(&self, _: u32, _: u64, _: &[u8]) -> Result<(), MemError> {
        Err(MemError::InvalidStag)
    }
    fn visit(&self, _: u32, _: u64, _: u32, _: &mut dyn FnMut(&[u8])) -> Result<(), MemError> {
        Err(MemError::InvalidStag)
    }
    fn invalidate(&self, _: u32, _: PdId) -> Result<(), MemError> {
        Err(MemError::InvalidStag)
    }
}

/// Where an FPDU carrying an ULPDU of `ulpdu_len` bytes ends on the stream
/// when it starts at `start` and markers are in use: its bytes without
/// markers (`2 + ULPDU + pad + 4`, RFC 5044 §4.1) plus a marker at every
/// marker position from `start` (included: a marker due at the start is
/// the FPDU's first bytes, as `marker_gap` emits it) up to its end
/// (excluded: a marker due right after the CRC opens the next FPDU).
pub(crate) fn fpdu_end_with_markers(start: u64, ulpdu_len: usize) -> u64 {
    let bare = mpa::fpdu_len(ulpdu_len, true) as u64;
    let mut markers = 0u64;
    loop {
        let end = start + bare + markers * mpa::MARKER_LEN as u64;
        // Marker positions in [start, end).
        let n = mpa::next_marker_pos(end).saturating_sub(mpa::next_marker_pos(start))
            / mpa::MARKER_PERIOD;
        if n == markers {
            return end;
        }
        markers = n;
    }
}
