//! Fuzz target: RFC 5044 / RFC 6581 MPA Request/Reply parsing and the
//! handshake on top of it. Nothing may panic; what parses must re-emit.
#![no_main]

use iwarp_proto::handshake::{self, MpaConfig, Policy, Rtr};
use iwarp_proto::wire::mpa;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks a local configuration, the rest is the frame.
    let (sel, frame) = match data.split_first() {
        Some((s, f)) => (*s, f),
        None => (0, data),
    };
    let pol = |v: u8| [Policy::Required, Policy::Optional, Policy::Off][(v % 3) as usize];
    let cfg = MpaConfig {
        crc: pol(sel),
        markers: pol(sel >> 2),
        revision: if sel & 0x10 != 0 { 1 } else { 2 },
        ird: u16::from(sel & 0x07),
        ord: u16::from(sel >> 5),
        rtr: match (sel >> 6) & 3 {
            0 => None,
            1 => Some(Rtr::ZeroLengthWrite),
            2 => Some(Rtr::ZeroLengthRead),
            _ => Some(Rtr::ZeroLengthSend),
        },
    };

    let total = mpa::frame_total_len(frame);
    assert_eq!(total.is_ok(), handshake::frame_len(frame).is_ok());
    if let Ok(f) = mpa::Frame::new_checked(frame) {
        if let Ok(r) = mpa::FrameRepr::parse(&f) {
            // Re-emits identically, except that reserved flag bits are
            // written as zero.
            let mut orig = frame[..r.buffer_len()].to_vec();
            orig[16] &= !mpa::MASK_RESERVED;
            assert_eq!(r.to_vec(), orig);
        }
    }
    match handshake::parse_request(frame) {
        Ok(req) => {
            let _ = handshake::reject(&cfg, Some(&req), frame);
            if let Ok((reply, n)) = handshake::accept(&cfg, &req, &req.private_data) {
                assert_eq!(handshake::frame_len(&reply), Ok(reply.len()));
                assert!(n.ird <= cfg.ird && n.ord <= cfg.ord);
            }
        }
        Err(e) => {
            let _ = (e.to_string(), e.term_code());
        }
    }
    match handshake::parse_reply(&cfg, frame) {
        Ok((n, _)) => {
            assert!(n.revision <= cfg.revision);
            assert!(n.ird <= cfg.ird && n.ord <= cfg.ord);
        }
        Err(e) => {
            let _ = (e.to_string(), e.term_code());
        }
    }
    if let Ok(req) = handshake::request(&cfg, frame) {
        assert_eq!(handshake::parse_request(&req).unwrap().private_data, frame);
    }
});
