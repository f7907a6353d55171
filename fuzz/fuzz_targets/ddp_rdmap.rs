//! Fuzz target: the RFC 5041 DDP, RFC 5040 Read Request and Terminate
//! views and Reprs on raw bytes (no MPA framing), plus MPA markers.
//! Nothing may panic; what parses must re-emit to the same Repr.
#![no_main]

use iwarp_proto::wire::{ddp, mpa, rdmap, terminate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = ddp::Packet::new_checked(data) {
        let _ = (
            p.tagged(),
            p.last(),
            p.version(),
            p.stag(),
            p.to(),
            p.qn(),
            p.msn(),
            p.mo(),
        );
        let _ = (p.ulp_word(), p.reserved(), p.payload());
        let r = ddp::Repr::parse(&p).unwrap();
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut ddp::Packet::new_unchecked(&mut b[..]));
        assert_eq!(
            ddp::Repr::parse(&ddp::Packet::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
        let op = rdmap::ctrl_opcode(r.ulp_ctrl);
        let _ = (
            op.is_tagged(),
            op.queue_number(),
            op.ulp_header_len(),
            u8::from(op),
        );
    }
    if let Ok(p) = rdmap::ReadRequest::new_checked(data) {
        let r = rdmap::ReadRequestRepr::parse(&p).unwrap();
        let mut b = [0u8; rdmap::READ_REQUEST_LEN];
        r.emit(&mut rdmap::ReadRequest::new_unchecked(&mut b[..]));
        assert_eq!(&b[..], &data[..rdmap::READ_REQUEST_LEN]);
    }
    if let Ok(p) = terminate::Packet::new_checked(data) {
        let _ = (
            p.layer(),
            p.etype(),
            p.ecode(),
            p.flag_m(),
            p.ddp_seg_len_field(),
        );
        let _ = (p.ddp_hdr(), p.rdmap_hdr(), p.code().to_string());
        let r = terminate::TerminateRepr::parse(&p).unwrap();
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut terminate::Packet::new_unchecked(&mut b[..]));
        let again =
            terminate::TerminateRepr::parse(&terminate::Packet::new_checked(&b[..]).unwrap())
                .unwrap();
        assert_eq!(again.code, r.code);
        assert_eq!(again.ddp_hdr, r.ddp_hdr);
        assert_eq!(again.rdmap_hdr, r.rdmap_hdr);
        // ddp_seg_len survives when the length field is present.
        assert_eq!(again.ddp_seg_len, r.ddp_seg_len);
    }
    if let Ok(m) = mpa::Marker::parse(data) {
        let mut b = [0u8; 4];
        m.emit(&mut b);
        assert_eq!(mpa::Marker::parse(&b), Ok(m));
    }
    if data.len() >= 8 {
        let pos = u64::from_le_bytes(data[..8].try_into().unwrap());
        let next = mpa::next_marker_pos(pos.min(u64::MAX - mpa::MARKER_PERIOD));
        assert!(mpa::is_marker_pos(next));
    }
});
