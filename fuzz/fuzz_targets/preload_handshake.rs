//! Fuzz target: what the preload shim parses from a peer it has not yet
//! accepted. The accept-time peek's decision
//! (`iwarp_rsocket::attach::classify_first_bytes`), then, on the same
//! bytes, the MPA Request/Reply frame parsers with their length checks
//! (`iwarp_proto::handshake::{frame_len, parse_request, parse_reply}`,
//! `wire::mpa::FrameRepr`) and the rsockets connect data carried in a
//! Request's private data (`iwarp_sockets::wire::ConnDataRepr`).
//!
//! Properties: nothing panics; the classifier is monotone (once a prefix
//! is Mpa or Plain, every longer input gets the same answer) and agrees
//! with the frame parsers (a Request that parses is classified Mpa); a
//! frame or conn data that parses re-emits to the same bytes (reserved
//! MPA flag bits as zero; conn data: the emitted form is a fixed point).
//!
//! `iwarp-rsocket` links in as an rlib: its `#[no_mangle]` exports are
//! the `r*` names of rsocket.h (`rclose`, `rpoll`, ...), none of them a C
//! library name, so nothing in libFuzzer's process is interposed (the
//! `close`/`dup2` interposers live in the iwarp-preload cdylib, which is
//! not linked here).
#![no_main]

use iwarp_proto::handshake::{self, MpaConfig, Policy, Rtr};
use iwarp_proto::wire::mpa;
use iwarp_rsocket::attach::{classify_first_bytes, FirstBytes, MPA_REQ_KEY};
use iwarp_sockets::wire::{ConnData, ConnDataRepr, CONN_DATA_LEN};
use libfuzzer_sys::fuzz_target;

/// The rsockets conn data as the preload would take it from a Request's
/// private data: parses, and its emitted form parses to the same value and
/// emits to the same bytes.
fn conn_data(pd: &[u8]) {
    let Ok(c) = ConnDataRepr::parse_bytes(pd) else {
        return;
    };
    let mut buf = [0u8; CONN_DATA_LEN];
    c.emit(&mut ConnData::new_checked(&mut buf[..]).expect("40 bytes"))
        .expect("emit into 40 bytes");
    let back = ConnDataRepr::parse_bytes(&buf).expect("emitted conn data reparses");
    assert_eq!(back, c);
    let mut again = [0u8; CONN_DATA_LEN];
    back.emit(&mut ConnData::new_checked(&mut again[..]).expect("40 bytes"))
        .expect("emit into 40 bytes");
    assert_eq!(again, buf, "emitted conn data is a fixed point");
}

fuzz_target!(|data: &[u8]| {
    // The peek: monotone, and NeedMore only before 16 bytes.
    let whole = classify_first_bytes(data);
    if whole == FirstBytes::NeedMore {
        assert!(data.len() < MPA_REQ_KEY.len());
        assert_eq!(data, &MPA_REQ_KEY[..data.len()]);
    }
    for k in 0..=data.len().min(MPA_REQ_KEY.len() + 1) {
        let c = classify_first_bytes(&data[..k]);
        if c != FirstBytes::NeedMore {
            assert_eq!(c, whole, "prefix of {k} bytes said {c:?}");
        }
    }
    assert_eq!(whole == FirstBytes::Mpa, data.starts_with(MPA_REQ_KEY));

    // The length checks.
    let total = handshake::frame_len(data);
    assert_eq!(total.is_ok(), mpa::frame_total_len(data).is_ok());
    if let Ok(n) = total {
        assert!((mpa::HEADER_LEN..=mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA_LEN).contains(&n));
    }

    // The frame view: what parses re-emits byte for byte (reserved flag
    // bits as zero).
    if let Ok(f) = mpa::Frame::new_checked(data) {
        if let Ok(r) = mpa::FrameRepr::parse(&f) {
            let mut orig = data[..r.buffer_len()].to_vec();
            orig[16] &= !mpa::MASK_RESERVED;
            assert_eq!(r.to_vec(), orig);
        }
    }

    // The Request the shim takes from an accepted MPA peer.
    if let Ok(req) = handshake::parse_request(data) {
        assert_eq!(whole, FirstBytes::Mpa, "a Request the peek calls plain");
        let n = total.expect("a parsed Request has a length");
        assert!(data.len() >= n);
        // Re-emit from the parsed fields. A revision 1 frame's E flag is
        // not kept (its block is ULP data), and the R flag of a Request is
        // ignored: both are taken from the input.
        let flags = data[16];
        if req.revision == mpa::REVISION_2 || flags & mpa::FLAG_ENHANCED == 0 {
            let repr = mpa::FrameRepr {
                kind: mpa::FrameKind::Request,
                markers: req.markers,
                crc: req.crc,
                reject: flags & mpa::FLAG_REJECT != 0,
                revision: req.revision,
                enhanced: req.enhanced,
                private_data: &req.private_data,
            };
            let mut orig = data[..n].to_vec();
            orig[16] &= !mpa::MASK_RESERVED;
            assert_eq!(repr.to_vec(), orig, "a parsed Request re-emits");
        }
        conn_data(&req.private_data);
    }

    // The Reply an initiator reads, under a few local configurations.
    let cfgs = [
        MpaConfig::default(),
        MpaConfig {
            crc: Policy::Required,
            markers: Policy::Off,
            revision: mpa::REVISION_1,
            ..MpaConfig::default()
        },
        MpaConfig {
            rtr: Some(Rtr::ZeroLengthSend),
            ird: 1,
            ord: 1,
            ..MpaConfig::default()
        },
    ];
    for cfg in &cfgs {
        match handshake::parse_reply(cfg, data) {
            Ok((neg, pd)) => {
                assert!(data.starts_with(mpa::KEY_REP));
                assert!(neg.revision <= cfg.revision);
                assert!(pd.len() <= mpa::MAX_PRIVATE_DATA_LEN);
                conn_data(&pd);
            }
            Err(e) => {
                let _ = (e.to_string(), e.term_code(), e.fault());
            }
        }
    }

    // The conn data on its own.
    conn_data(data);
});
