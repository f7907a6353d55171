//! The receive path's state ([`Rx`]): where the resumable receive machine
//! of [`super::rx`] stands between two calls (siw `siw_rx_stream`). A leaf
//! beside the [`super::qp::Engine`] that holds it, so neither imports the
//! other's parent.

use super::wr::{SgList, Sge};
use crate::wire::rdmap::Opcode;
use crate::wire::{ddp, mpa, rdmap};

/// ULPDU length field + untagged DDP header + RDMA Read Request header.
pub(super) const MAX_HDR: usize =
    mpa::ULPDU_LEN_FIELD + ddp::UNTAGGED_HDR_LEN + rdmap::READ_REQUEST_LEN;
/// Bytes needed to know the header's full length: ULPDU length, DDP
/// control byte, RDMAP control byte.
pub(super) const CLASSIFY_LEN: usize = 4;
/// A Terminate's body is at most its 4-byte control, the DDP segment
/// length, a copied untagged DDP header and a Read Request header.
pub(super) const TERM_BODY_MAX: usize = 128;
/// Markers are part of the FPDU and so covered by its CRC (RFC 5044 §4.4,
/// "the CRC is computed over the entire FPDU, including markers").
pub(super) const CRC_COVERS_MARKERS: bool = true;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Header,
    Payload,
    Trailer,
    /// After a fatal error: input is discarded.
    Dead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seg {
    /// Nothing to place (Read Request; zero-length segments).
    None,
    /// Tagged placement at `stag`/`to`, advancing as bytes arrive.
    Tagged { stag: u32, to: u64, read_resp: bool },
    /// Untagged Send payload into the current receive.
    Send,
    /// A Terminate's body, collected for parsing.
    Terminate,
}

/// The receive work request an incoming Send is filling.
#[derive(Debug, Clone, Copy)]
pub(super) struct CurRecv {
    pub(super) wr_id: u64,
    pub(super) sgl: SgList,
    pub(super) cap: u32,
    pub(super) placed: u32,
    pub(super) sge_idx: usize,
    pub(super) sge_off: u32,
    pub(super) inval_stag: Option<u32>,
    pub(super) solicited: bool,
}

impl CurRecv {
    /// The SGE the next byte goes to and the offset in it, skipping
    /// exhausted and empty SGEs; `None` when the buffer is full.
    pub(super) fn next_space(&self) -> Option<(Sge, u32)> {
        let mut idx = self.sge_idx;
        let mut off = self.sge_off;
        while let Some(sge) = self.sgl.as_slice().get(idx) {
            if off < sge.length {
                return Some((*sge, off));
            }
            idx += 1;
            off = 0;
        }
        None
    }

    /// `n` bytes were placed at `next_space`.
    pub(super) fn advance(&mut self, mut n: u32) {
        while n > 0 {
            let Some(sge) = self.sgl.as_slice().get(self.sge_idx) else {
                return;
            };
            let k = (sge.length - self.sge_off).min(n);
            self.sge_off += k;
            self.placed += k;
            n -= k;
            if self.sge_off == sge.length {
                self.sge_idx += 1;
                self.sge_off = 0;
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct Rx {
    pub(super) phase: Phase,
    pub(super) hdr: [u8; MAX_HDR],
    pub(super) hdr_have: usize,
    pub(super) hdr_need: usize,
    pub(super) opcode: Opcode,
    pub(super) last: bool,
    pub(super) seg: Seg,
    pub(super) payload_rem: u32,
    /// ULPDU length, running CRC and trailer: the FPDU state machine
    /// shared with `mpa::deframe`.
    pub(super) fpdu: mpa::FpduRx,
    /// Bytes of the stream consumed so far, markers included.
    pub(super) stream_pos: u64,
    /// Stream position where the current FPDU starts: its ULPDU length
    /// field, or a marker placed right before it (RFC 5044 §4.3).
    pub(super) fpdu_start: u64,
    pub(super) marker: [u8; mpa::MARKER_LEN],
    pub(super) marker_have: usize,
    /// Expected MSN per untagged queue (RFC 5041 §5.1: starts at 1).
    pub(super) msn: [u32; 3],
    pub(super) cur_recv: Option<CurRecv>,
    pub(super) term_body: [u8; TERM_BODY_MAX],
    pub(super) term_have: usize,
    /// The current RDMA Write segment's sink is checked as it is placed
    /// (see `rx_header_done`).
    pub(super) sink_unchecked: bool,
}

impl Rx {
    pub(super) fn new() -> Rx {
        Rx {
            phase: Phase::Header,
            hdr: [0; MAX_HDR],
            hdr_have: 0,
            hdr_need: CLASSIFY_LEN,
            opcode: Opcode::Send,
            last: false,
            seg: Seg::None,
            payload_rem: 0,
            fpdu: mpa::FpduRx::new(false),
            stream_pos: 0,
            fpdu_start: 0,
            marker: [0; mpa::MARKER_LEN],
            marker_have: 0,
            msn: [1; 3],
            cur_recv: None,
            term_body: [0; TERM_BODY_MAX],
            term_have: 0,
            sink_unchecked: false,
        }
    }

    pub(super) fn has_current_recv(&self) -> bool {
        self.cur_recv.is_some()
    }

    pub(super) fn take_current_recv(&mut self) -> Option<CurRecv> {
        self.cur_recv.take()
    }

    pub(super) fn kill(&mut self) {
        self.phase = Phase::Dead;
    }

    pub(super) fn reset_fpdu(&mut self) {
        self.phase = Phase::Header;
        self.hdr_have = 0;
        self.hdr_need = CLASSIFY_LEN;
        self.fpdu.reset();
        self.seg = Seg::None;
        self.sink_unchecked = false;
    }

    /// The link is up: check the CRC of every FPDU if it was negotiated.
    pub(super) fn establish(&mut self, crc: bool) {
        self.fpdu = mpa::FpduRx::new(crc);
    }
}
