//! Fuzz target: RFC 5044 FPDU deframing, then the RFC 5041 DDP / RFC 5040
//! RDMAP parsers on every ULPDU. Any input, CRC checked or not; nothing may
//! panic, and what parses must re-emit to the same bytes.
#![no_main]

use iwarp_proto::wire::{ddp, mpa, rdmap, terminate};
use libfuzzer_sys::fuzz_target;

fn ulpdu(u: &[u8]) {
    let Ok(p) = ddp::Packet::new_checked(u) else {
        return;
    };
    let d = ddp::Repr::parse(&p).expect("checked packet parses");
    let mut hdr = vec![0u8; d.header_len()];
    d.emit(&mut ddp::Packet::new_unchecked(&mut hdr[..]));
    let reemitted = ddp::Repr::parse(&ddp::Packet::new_checked(&hdr[..]).unwrap()).unwrap();
    assert_eq!(reemitted, d);
    let payload = p.payload();
    match rdmap::ctrl_opcode(d.ulp_ctrl) {
        rdmap::Opcode::ReadRequest => {
            if let Ok(r) = rdmap::ReadRequest::new_checked(payload) {
                let rr = rdmap::ReadRequestRepr::parse(&r).unwrap();
                let mut b = [0u8; rdmap::READ_REQUEST_LEN];
                rr.emit(&mut rdmap::ReadRequest::new_unchecked(&mut b[..]));
                assert_eq!(&b[..], &payload[..rdmap::READ_REQUEST_LEN]);
            }
        }
        rdmap::Opcode::Terminate => {
            if let Ok(t) = terminate::Packet::new_checked(payload) {
                let _ = (t.code(), t.ddp_hdr(), t.rdmap_hdr(), t.reserved());
                let tr = terminate::TerminateRepr::parse(&t).unwrap();
                let _ = tr.code.description();
                let mut b = vec![0u8; tr.buffer_len()];
                tr.emit(&mut terminate::Packet::new_unchecked(&mut b[..]));
                let again = terminate::TerminateRepr::parse(
                    &terminate::Packet::new_checked(&b[..]).unwrap(),
                )
                .unwrap();
                assert_eq!(again.code, tr.code);
                assert_eq!(again.ddp_hdr, tr.ddp_hdr);
                assert_eq!(again.rdmap_hdr, tr.rdmap_hdr);
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    for crc in [false, true] {
        let mut at = 0;
        while at < data.len() {
            match mpa::deframe(&data[at..], crc) {
                Ok(mpa::Deframe::Frame { ulpdu: u, consumed }) => {
                    assert!(consumed > 0 && consumed <= data.len() - at);
                    assert_eq!(consumed, mpa::fpdu_len(u.len(), crc));
                    ulpdu(u);
                    // The streaming FPDU state machine the engine uses
                    // agrees with deframe when the trailer is split.
                    let fpdu = &data[at..at + consumed];
                    let body = mpa::ULPDU_LEN_FIELD + u.len();
                    let cut = body + (fpdu[0] as usize) % (consumed - body + 1);
                    let mut rx = mpa::FpduRx::new(crc);
                    rx.begin(u.len());
                    rx.fold(&fpdu[..body]);
                    let verdict = match rx.trailer(&fpdu[body..cut]) {
                        (_, Some(v)) => v,
                        (_, None) => rx.trailer(&fpdu[cut..]).1.expect("complete"),
                    };
                    assert_eq!(verdict, Ok(()));
                    // The same ULPDU re-framed deframes to itself.
                    let mut again = Vec::new();
                    mpa::emit_fpdu(u, crc, &mut again);
                    match mpa::deframe(&again, crc) {
                        Ok(mpa::Deframe::Frame { ulpdu: v, .. }) => assert_eq!(u, v),
                        other => panic!("re-framed FPDU: {other:?}"),
                    }
                    at += consumed;
                }
                Ok(mpa::Deframe::NeedMore) => break,
                Err(e) => {
                    let _ = (e.to_string(), e.term_code());
                    break;
                }
            }
        }
    }
    // The input as one ULPDU, whatever its length.
    ulpdu(data);
});
