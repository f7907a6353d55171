//! The Terminate the engine sends: RFC 5040 §4.8 message format, built
//! from the offending segment's received headers (siw `siw_send_terminate`).

use crate::wire::rdmap::Opcode;
use crate::wire::terminate::TermCode;
use crate::wire::{ddp, mpa, rdmap, terminate};

/// The ULPDU of an RDMAP Terminate (RFC 5040 §4.8) on untagged queue 2,
/// MSN 1 (a stream carries at most one Terminate), carrying `code` and,
/// when known, the offending segment's length and headers.
///
/// `offending` holds the received bytes from the ULPDU length field on:
/// as much of the DDP header and Read Request header as had arrived.
pub(super) fn build_terminate(code: TermCode, offending: Option<&[u8]>) -> Vec<u8> {
    let mut seg_len = None;
    let mut ddp_hdr = None;
    let mut rdmap_hdr = None;
    if let Some(h) = offending.filter(|h| h.len() >= mpa::ULPDU_LEN_FIELD + 2) {
        let tagged = ddp::Packet::new_unchecked(&h[mpa::ULPDU_LEN_FIELD..]).tagged();
        let dlen = if tagged {
            ddp::TAGGED_HDR_LEN
        } else {
            ddp::UNTAGGED_HDR_LEN
        };
        let d_end = mpa::ULPDU_LEN_FIELD + dlen;
        if h.len() >= d_end {
            seg_len = Some(u16::from_be_bytes([h[0], h[1]]));
            ddp_hdr = Some(&h[mpa::ULPDU_LEN_FIELD..d_end]);
            let op = rdmap::ctrl_opcode(h[mpa::ULPDU_LEN_FIELD + 1]);
            if op == Opcode::ReadRequest && h.len() >= d_end + rdmap::READ_REQUEST_LEN {
                rdmap_hdr = Some(&h[d_end..d_end + rdmap::READ_REQUEST_LEN]);
            }
        }
    }
    let body = terminate::TerminateRepr {
        code,
        ddp_seg_len: seg_len,
        ddp_hdr,
        rdmap_hdr,
    };
    let mut out = vec![0u8; ddp::UNTAGGED_HDR_LEN + body.buffer_len()];
    let (d, b) = out.split_at_mut(ddp::UNTAGGED_HDR_LEN);
    ddp::Repr {
        last: true,
        version: ddp::DDP_VERSION,
        ulp_ctrl: rdmap::ctrl_byte(Opcode::Terminate),
        ulp_word: 0,
        placement: ddp::Placement::Untagged {
            qn: rdmap::QN_TERMINATE,
            msn: 1,
            mo: 0,
        },
    }
    .emit(&mut ddp::Packet::new_unchecked(d));
    body.emit(&mut terminate::Packet::new_unchecked(b));
    out
}
