//! The transmit path's state ([`Tx`]): the message being segmented and the
//! stream position, MSNs and CRC of the FPDU being built (siw
//! `siw_iwarp_tx`). A leaf beside the [`super::qp::Engine`] that holds it.

use super::wr::SgList;
use crate::wire::rdmap::Opcode;
use crate::wire::{ddp, rdmap};

#[derive(Debug, Clone, Copy)]
pub(super) enum CurKind {
    Send { op: Opcode, inval: u32, msn: u32 },
    Write { rkey: u32, raddr: u64 },
    ReadResp { sink_stag: u32, sink_to: u64 },
}

impl CurKind {
    /// The RDMAP opcode, DDP placement and ULP word (the Invalidate STag
    /// of a Send with Invalidate) of the message's segment at offset `off`
    /// (RFC 5040 §4.3-§4.5, RFC 5041 §4.2-§4.3).
    pub(super) fn segment(&self, off: u32) -> (Opcode, ddp::Placement, u32) {
        match *self {
            CurKind::Send { op, inval, msn } => (
                op,
                ddp::Placement::Untagged {
                    qn: rdmap::QN_SEND,
                    msn,
                    mo: off,
                },
                inval,
            ),
            CurKind::Write { rkey, raddr } => (
                Opcode::RdmaWrite,
                ddp::Placement::Tagged {
                    stag: rkey,
                    to: raddr.wrapping_add(off as u64),
                },
                0,
            ),
            CurKind::ReadResp { sink_stag, sink_to } => (
                Opcode::ReadResponse,
                ddp::Placement::Tagged {
                    stag: sink_stag,
                    to: sink_to.wrapping_add(off as u64),
                },
                0,
            ),
        }
    }

    pub(super) fn tagged(&self) -> bool {
        !matches!(self, CurKind::Send { .. })
    }
}

/// A message being segmented.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cursor {
    pub(super) kind: CurKind,
    pub(super) seq: Option<u64>,
    pub(super) sgl: SgList,
    pub(super) total: u32,
    pub(super) off: u32,
    pub(super) sge_idx: usize,
    pub(super) sge_off: u32,
    /// The whole source was validated when the message started, in this
    /// very `poll_transmit` call: its segments need no second lookup of
    /// the same range. Cleared when the call returns, so a message that
    /// continues in a later call is checked again per segment (the region
    /// may have been deregistered in between).
    pub(super) checked: bool,
}

#[derive(Debug)]
pub(super) struct Tx {
    /// A Terminate's ULPDU waiting to be sent.
    pub(super) pending_term: Option<Vec<u8>>,
    pub(super) cursor: Option<Cursor>,
    /// Bytes of the stream emitted so far, markers included.
    pub(super) stream_pos: u64,
    /// Stream position where the FPDU being built starts.
    pub(super) fpdu_start: u64,
    pub(super) crc: u32,
    /// Emitting the CRC field itself: a marker here is not covered.
    pub(super) in_crc_field: bool,
    /// Next MSN of untagged queues 0 (Send) and 1 (Read Request).
    pub(super) msn_send: u32,
    pub(super) msn_rreq: u32,
}

impl Tx {
    pub(super) fn new() -> Tx {
        Tx {
            pending_term: None,
            cursor: None,
            stream_pos: 0,
            fpdu_start: 0,
            crc: 0,
            in_crc_field: false,
            msn_send: 1,
            msn_rreq: 1,
        }
    }
}
