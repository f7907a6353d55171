//! The one per-opcode header-length table (`rdmap::Opcode::ulp_header_len`)
//! agrees with the wire parsers for every opcode value, and the engine's
//! receive path classifies FPDUs by it.

use iwarp_proto::engine::{Engine, EngineConfig, EngineEvent, LinkParams};
use iwarp_proto::fault::{term_code, Fault};
use iwarp_proto::mem::SimMemory;
use iwarp_proto::wire::{ddp, mpa, rdmap, terminate};
use rdmap::Opcode;

/// The RDMAP header bytes a wire parser needs after the DDP header:
/// the smallest buffer its `new_checked` accepts.
fn rdmap_parser_min_len(op: Opcode) -> usize {
    let buf = [0u8; 64];
    let min = |ok: &dyn Fn(&[u8]) -> bool| (0..=buf.len()).find(|&n| ok(&buf[..n])).unwrap();
    match op {
        Opcode::ReadRequest => min(&|b| rdmap::ReadRequest::new_checked(b).is_ok()),
        Opcode::Terminate => min(&|b| terminate::Packet::new_checked(b).is_ok()),
        _ => 0,
    }
}

/// The DDP header length the DDP parser gives for this opcode's model.
fn ddp_parser_len(tagged: bool) -> usize {
    let mut h = [0u8; ddp::UNTAGGED_HDR_LEN];
    h[0] = if tagged { ddp::FLAG_TAGGED } else { 0 } | ddp::DDP_VERSION;
    let p = ddp::Packet::new_checked(&h[..]).unwrap();
    assert_eq!(p.tagged(), tagged);
    p.header_len()
}

#[test]
fn header_table_matches_the_wire_parsers_for_every_opcode() {
    for v in 0u8..16 {
        let op = Opcode::from(v);
        match (op.ulp_header_len(), op.is_tagged()) {
            (Some(len), Some(tagged)) => {
                assert_eq!(
                    len,
                    ddp_parser_len(tagged) + rdmap_parser_min_len(op),
                    "{op:?}"
                );
            }
            (None, None) => assert!(matches!(op, Opcode::Unknown(_)), "{op:?}"),
            other => panic!("{op:?}: length and model disagree: {other:?}"),
        }
    }
    // The values RFC 5040 §4 / siw iwarp_pktinfo give.
    assert_eq!(Opcode::RdmaWrite.ulp_header_len(), Some(14));
    assert_eq!(Opcode::ReadResponse.ulp_header_len(), Some(14));
    assert_eq!(Opcode::Send.ulp_header_len(), Some(18));
    assert_eq!(Opcode::SendSeInvalidate.ulp_header_len(), Some(18));
    assert_eq!(Opcode::ReadRequest.ulp_header_len(), Some(18 + 28));
    assert_eq!(Opcode::Terminate.ulp_header_len(), Some(18 + 4));
}

fn engine() -> Engine {
    let mut e = Engine::new(EngineConfig {
        pd: 1,
        sq_depth: 4,
        rq_depth: 4,
    });
    e.establish(LinkParams {
        crc: false,
        markers_tx: false,
        markers_rx: false,
        mulpdu: 1024,
        ird: 4,
        ord: 4,
    });
    e
}

/// The Terminate the engine sends after `bytes`, if any.
fn term_after(bytes: &[u8]) -> Option<(u8, u8, u8)> {
    let mut e = engine();
    let mem = SimMemory::new();
    e.handle_input(bytes, &mem);
    while let Some(ev) = e.poll_event() {
        if let EngineEvent::TerminateSent(t) = ev {
            return Some((t.layer, t.etype, t.ecode));
        }
    }
    None
}

/// An FPDU start: ULPDU length, then the DDP control and RDMAP control
/// bytes of `op` in the `tagged` model, then zeros up to `ulpdu_len`.
fn fpdu(op: Opcode, tagged: bool, ulpdu_len: usize) -> Vec<u8> {
    let mut b = (ulpdu_len as u16).to_be_bytes().to_vec();
    let mut u = vec![0u8; ulpdu_len.max(2)];
    u[0] = if tagged { ddp::FLAG_TAGGED } else { 0 } | ddp::FLAG_LAST | ddp::DDP_VERSION;
    u[1] = rdmap::ctrl_byte(op);
    b.extend_from_slice(&u);
    b.resize(mpa::fpdu_len(ulpdu_len, false), 0);
    b
}

#[test]
fn engine_classifies_by_the_table() {
    let code = |f| Some(term_code(f).to_wire());
    for v in 0u8..16 {
        let op = Opcode::from(v);
        let Some(tagged) = op.is_tagged() else {
            // Unknown opcode, in either model.
            assert_eq!(
                term_after(&fpdu(op, false, 18)),
                code(Fault::UnexpectedOpcode)
            );
            assert_eq!(
                term_after(&fpdu(op, true, 14)),
                code(Fault::UnexpectedOpcode)
            );
            continue;
        };
        let len = op.ulp_header_len().unwrap();
        // The wrong DDP model is an unexpected opcode (RFC 5040 §4.2).
        assert_eq!(
            term_after(&fpdu(op, !tagged, 18)),
            code(Fault::UnexpectedOpcode),
            "{op:?}"
        );
        // A ULPDU shorter than the header loses the framing (RFC 5044
        // §4.1), except for the Terminate, whose control field is parsed
        // with its body (a short one is taken as an unspecified error from
        // the peer, and answered with nothing).
        let short = term_after(&fpdu(op, tagged, len - 1));
        if op == Opcode::Terminate {
            assert_eq!(short, None, "{op:?}");
        } else {
            assert_eq!(short, code(Fault::UlpduLength), "{op:?}");
        }
    }
}
