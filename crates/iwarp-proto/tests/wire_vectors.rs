//! Wire vectors: RFC 5044 / RFC 6581 MPA, RFC 5041 DDP and RFC 5040 RDMAP
//! headers, checked against the real Linux siw traffic in `tests/data/`
//! (the raw TCP streams of `siw-{default,crc,p2p}.pcap`, one file per
//! direction, extracted with `tshark -q -z follow,tcp,raw,N`), plus
//! byte-literal vectors and property round-trips.

use std::path::PathBuf;

use iwarp_proto::handshake::{self, HandshakeError, MpaConfig, Policy, Rtr};
use iwarp_proto::wire::crc::{crc32c, crc_from_wire, crc_to_wire};
use iwarp_proto::wire::ddp::{self, Placement};
use iwarp_proto::wire::mpa::{
    self, Deframe, EnhancedParams, FpduError, Frame, FrameKind, FrameRepr,
};
use iwarp_proto::wire::rdmap::{self, Opcode, ReadRequest, ReadRequestRepr};
use iwarp_proto::wire::terminate::{self, TermCode, TerminateRepr};
use iwarp_proto::wire::Error;
use proptest::prelude::*;

// ---------------------------------------------------------------- helpers

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// All stream files of one capture: (file name, bytes).
fn streams(capture: &str) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with(&format!("siw-{capture}-")) && n.ends_with(".bin")
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_str().unwrap().to_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    assert_eq!(v.len(), 14, "7 connections x 2 directions in {capture}");
    v
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// What one FPDU of a capture held.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    opcode: Opcode,
    ddp: ddp::Repr,
    payload_len: usize,
}

/// Checks one ULPDU the way the engine will read it, and returns it.
fn check_ulpdu(ulpdu: &[u8]) -> Seen {
    let p = ddp::Packet::new_checked(ulpdu).expect("DDP header");
    let d = ddp::Repr::parse(&p).unwrap();
    assert_eq!(d.version, ddp::DDP_VERSION);
    assert_eq!(p.reserved(), 0);
    assert_eq!(rdmap::ctrl_version(d.ulp_ctrl), rdmap::RDMAP_VERSION);
    let op = rdmap::ctrl_opcode(d.ulp_ctrl);
    assert!(!matches!(op, Opcode::Unknown(_)), "known opcode");
    assert_eq!(
        op.is_tagged(),
        Some(d.is_tagged()),
        "{op:?} uses its DDP model"
    );
    if let Placement::Untagged { qn, msn, mo } = d.placement {
        assert_eq!(Some(qn), op.queue_number());
        assert!(msn >= 1, "MSNs start at 1 (RFC 5041 §4.3)");
        if !op.has_invalidate_stag() {
            assert_eq!(d.ulp_word, 0);
        }
        let _ = mo;
    }
    let payload = p.payload();
    match op {
        Opcode::ReadRequest => {
            assert!(d.last);
            let rr = ReadRequestRepr::parse(&ReadRequest::new_checked(payload).unwrap()).unwrap();
            assert_eq!(payload.len(), rdmap::READ_REQUEST_LEN);
            let mut out = [0u8; rdmap::READ_REQUEST_LEN];
            rr.emit(&mut ReadRequest::new_unchecked(&mut out[..]));
            assert_eq!(&out[..], payload);
        }
        Opcode::Terminate => {
            let t = TerminateRepr::parse(&terminate::Packet::new_checked(payload).unwrap());
            assert!(t.is_ok());
        }
        _ => {}
    }
    // Every header re-emits to the same bytes.
    let mut out = vec![0u8; d.header_len()];
    d.emit(&mut ddp::Packet::new_unchecked(&mut out[..]));
    assert_eq!(&out[..], &ulpdu[..d.header_len()]);
    Seen {
        opcode: op,
        ddp: d,
        payload_len: payload.len(),
    }
}

/// Deframes a whole stream after its MPA frame, contiguous.
fn deframe_all(bytes: &[u8], crc: bool) -> Vec<Seen> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match mpa::deframe(&bytes[at..], crc).expect("FPDU deframes") {
            Deframe::Frame { ulpdu, consumed } => {
                assert_eq!(consumed, mpa::fpdu_len(ulpdu.len(), crc));
                let fpdu = &bytes[at..at + consumed];
                let crc_bytes: [u8; 4] = fpdu[consumed - 4..].try_into().unwrap();
                if crc {
                    assert_eq!(crc_from_wire(crc_bytes), crc32c(&fpdu[..consumed - 4]));
                } else {
                    // RFC 5044 §4.4 as siw does it: CRC field present, zero.
                    assert_eq!(crc_bytes, [0; 4]);
                }
                // The pad is not checked: siw does not zero it (a 2-byte
                // Send of perftest carries the pad bytes `00 40`).
                let _pad = &fpdu[2 + ulpdu.len()..consumed - 4];
                out.push(check_ulpdu(ulpdu));
                at += consumed;
            }
            Deframe::NeedMore => panic!("stream ends inside an FPDU at {at}"),
        }
    }
    out
}

/// The same, fed in chunks of the given sizes (cycled) to a buffering
/// deframer, as the engine receives TCP segments.
fn deframe_chunked(bytes: &[u8], crc: bool, chunks: &[usize]) -> Vec<Seen> {
    let mut out = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = chunks[i % chunks.len()].min(bytes.len() - at);
        i += 1;
        buf.extend_from_slice(&bytes[at..at + n]);
        at += n;
        loop {
            match mpa::deframe(&buf, crc).unwrap() {
                Deframe::NeedMore => break,
                Deframe::Frame { ulpdu, consumed } => {
                    out.push(check_ulpdu(ulpdu));
                    buf.drain(..consumed);
                }
            }
        }
    }
    assert!(buf.is_empty());
    out
}

fn split_mpa(stream: &[u8]) -> (&[u8], &[u8]) {
    let n = mpa::frame_total_len(stream).unwrap();
    stream.split_at(n)
}

// ------------------------------------------------------------ the captures

#[test]
fn capture_mpa_frames_parse_and_reemit() {
    for cap in ["default", "crc", "p2p"] {
        for (name, bytes) in streams(cap) {
            let (frame, _) = split_mpa(&bytes);
            let f = Frame::new_checked(frame).unwrap();
            let r = FrameRepr::parse(&f).unwrap();
            let init = name.ends_with("-init.bin");
            assert_eq!(
                r.kind,
                if init {
                    FrameKind::Request
                } else {
                    FrameKind::Reply
                },
                "{name}"
            );
            assert_eq!(r.revision, 2, "{name}");
            assert!(!r.markers && !r.reject, "{name}");
            assert_eq!(r.crc, cap == "crc", "{name}");
            assert!(r.private_data.is_empty(), "{name}");
            let e = r.enhanced.expect("siw sends the RFC 6581 block");
            assert_eq!(e.peer_to_peer, cap == "p2p", "{name}");
            assert_eq!(r.to_vec(), frame, "{name} re-emits byte for byte");
            if init {
                let req = handshake::parse_request(frame).unwrap();
                assert_eq!(req.enhanced, Some(e));
            } else {
                let cfg = MpaConfig {
                    crc: if cap == "crc" {
                        Policy::Required
                    } else {
                        Policy::Optional
                    },
                    rtr: (cap == "p2p").then_some(Rtr::ZeroLengthWrite),
                    ird: 1000,
                    ord: 1000,
                    ..Default::default()
                };
                let (n, _) = handshake::parse_reply(&cfg, frame).unwrap();
                assert_eq!(n.crc, cap == "crc");
                assert_eq!(n.rtr, (cap == "p2p").then_some(Rtr::ZeroLengthWrite));
            }
        }
    }
}

/// The exact frames of the README: siw-default's rping Request, siw-crc's
/// flags 0x50, siw-p2p's `8001 c001` and its Reply `8001 8001`.
#[test]
fn capture_mpa_literals() {
    let req = b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01";
    let r = FrameRepr::parse(&Frame::new_checked(&req[..]).unwrap()).unwrap();
    assert_eq!(
        r,
        FrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: false,
            reject: false,
            revision: 2,
            enhanced: Some(EnhancedParams {
                ird: 1,
                ord: 1,
                ..Default::default()
            }),
            private_data: &[],
        }
    );
    let crc_rep = b"MPA ID Rep Frame\x50\x02\x00\x04\x00\x01\x00\x01";
    let r = FrameRepr::parse(&Frame::new_checked(&crc_rep[..]).unwrap()).unwrap();
    assert!(r.crc && r.kind == FrameKind::Reply);
    let p2p_rep = b"MPA ID Rep Frame\x10\x02\x00\x04\x80\x01\x80\x01";
    let r = FrameRepr::parse(&Frame::new_checked(&p2p_rep[..]).unwrap()).unwrap();
    assert_eq!(
        r.enhanced,
        Some(EnhancedParams {
            ird: 1,
            ord: 1,
            peer_to_peer: true,
            rtr_zero_write: true,
            ..Default::default()
        })
    );
    let streams = streams("p2p");
    let resp = &streams
        .iter()
        .find(|(n, _)| n == "siw-p2p-s0-p7174-resp.bin")
        .unwrap()
        .1;
    assert_eq!(&resp[..24], &p2p_rep[..]);
}

/// Our handshake produces siw's exact frames for siw's settings, and
/// answers siw's requests exactly as siw answered them.
#[test]
fn handshake_reproduces_capture_frames() {
    for cap in ["default", "crc", "p2p"] {
        let all = streams(cap);
        for pair in all.chunks(2) {
            let (init, resp) = (&pair[0].1, &pair[1].1);
            assert!(pair[0].0.ends_with("-init.bin"));
            let (req_frame, _) = split_mpa(init);
            let (rep_frame, _) = split_mpa(resp);
            let req = handshake::parse_request(req_frame).unwrap();
            let e = req.enhanced.unwrap();
            let crc = if cap == "crc" {
                Policy::Required
            } else {
                Policy::Optional
            };
            let rtr = (cap == "p2p").then_some(Rtr::ZeroLengthWrite);
            let initiator = MpaConfig {
                crc,
                ird: e.ird,
                ord: e.ord,
                rtr,
                ..Default::default()
            };
            assert_eq!(
                handshake::request(&initiator, &[]).unwrap(),
                req_frame,
                "{}",
                pair[0].0
            );
            // A responder with more resources negotiates down to siw's answer.
            let responder = MpaConfig {
                crc,
                ird: 1000,
                ord: 1000,
                ..Default::default()
            };
            let (reply, n) = handshake::accept(&responder, &req, &[]).unwrap();
            assert_eq!(reply, rep_frame, "{}", pair[1].0);
            let (back, _) = handshake::parse_reply(&initiator, &reply).unwrap();
            assert_eq!(back.ord, n.ird, "initiator ORD is the responder's IRD");
            assert_eq!(back.ird, n.ord);
            assert_eq!(back.rtr, n.rtr);
            assert_eq!(back.crc, n.crc);
        }
    }
}

#[test]
fn capture_streams_deframe_fully() {
    let mut opcodes = std::collections::BTreeSet::new();
    for cap in ["default", "crc", "p2p"] {
        let crc = cap == "crc";
        for (name, bytes) in streams(cap) {
            let (_, rest) = split_mpa(&bytes);
            let seen = deframe_all(rest, crc);
            for s in &seen {
                opcodes.insert(format!("{:?}", s.opcode));
            }
            // Untagged MSNs count up per queue from 1 (RFC 5041 §4.3).
            let mut next = [1u32; 3];
            for s in &seen {
                if let Placement::Untagged { qn, msn, mo } = s.ddp.placement {
                    assert_eq!(msn, next[qn as usize], "{name} (mo {mo})");
                    if s.ddp.last {
                        next[qn as usize] += 1;
                    }
                }
            }
            if cap == "p2p" && name.ends_with("-init.bin") {
                // The RTR: a zero-length RDMA Write (STag 1, TO 0).
                let first = &seen[0];
                assert_eq!(first.opcode, Opcode::RdmaWrite, "{name}");
                assert_eq!(first.payload_len, 0);
                assert_eq!(first.ddp.placement, Placement::Tagged { stag: 1, to: 0 });
            }
            if crc {
                // The CRC check is real: the same bytes fail without the
                // right CRC...
                let mut bad = rest.to_vec();
                if !bad.is_empty() {
                    bad[3] ^= 0x20;
                    assert!(matches!(
                        mpa::deframe(&bad, true),
                        Err(FpduError::CrcMismatch { .. })
                    ));
                }
            } else if !rest.is_empty() {
                // ... and zero CRC fields do not pass a CRC check.
                assert!(matches!(
                    mpa::deframe(rest, true),
                    Err(FpduError::CrcMismatch { received: 0, .. })
                ));
            }
        }
    }
    for op in ["RdmaWrite", "ReadRequest", "ReadResponse", "Send"] {
        assert!(opcodes.contains(op), "captures hold {op}: {opcodes:?}");
    }
}

#[test]
fn capture_streams_deframe_in_any_segmentation() {
    for cap in ["default", "crc", "p2p"] {
        let crc = cap == "crc";
        for (name, bytes) in streams(cap) {
            let (_, rest) = split_mpa(&bytes);
            let whole = deframe_all(rest, crc);
            for chunks in [&[1usize][..], &[3, 7], &[1444, 4], &[4096], &[5, 1, 600, 2]] {
                assert_eq!(
                    deframe_chunked(rest, crc, chunks),
                    whole,
                    "{name} {chunks:?}"
                );
            }
        }
    }
}

/// Every split of a few real FPDUs: any prefix needs more, the whole
/// FPDU (and the FPDU followed by anything) gives the same ULPDU.
#[test]
fn every_byte_split_of_real_fpdus() {
    for cap in ["crc", "default"] {
        let crc = cap == "crc";
        for (name, bytes) in streams(cap)
            .into_iter()
            .filter(|(n, _)| n.contains("-s0-") || n.contains("-s2-p18515-init"))
        {
            let (_, rest) = split_mpa(&bytes);
            let mut at = 0;
            for _ in 0..4 {
                let Ok(Deframe::Frame { ulpdu, consumed }) = mpa::deframe(&rest[at..], crc) else {
                    panic!("{name}: FPDU at {at}");
                };
                let fpdu = &rest[at..at + consumed];
                for k in 0..consumed {
                    assert_eq!(
                        mpa::deframe(&fpdu[..k], crc),
                        Ok(Deframe::NeedMore),
                        "{name} split {k}"
                    );
                    // The two halves reassembled.
                    let mut joined = fpdu[..k].to_vec();
                    joined.extend_from_slice(&fpdu[k..]);
                    assert_eq!(
                        mpa::deframe(&joined, crc),
                        Ok(Deframe::Frame { ulpdu, consumed })
                    );
                }
                at += consumed;
            }
        }
    }
}

// ------------------------------------------------- byte-literal vectors

/// rping's Send of {addr, rkey, len} from siw-crc.pcap, with its CRC.
const CRC_SEND_FPDU: &str = "0022 4143 00000000 00000000 00000001 00000000
    0000564fef633d50 be4dff00 00000040 7273ebc2";
/// rping's RDMA Read Request from siw-default.pcap.
const READ_REQUEST_FPDU: &str = "002e 4141 00000000 00000001 00000001 00000000
    ad6fed00 0000557483309f30 00000040 d21b4e00 00005583eef0dd50 00000000";
/// An RDMA Write of rping (siw-default.pcap): 64 payload bytes (a
/// NUL-terminated string), no pad, zero CRC field.
const WRITE_FPDU: &str = "004e c140 a4a1c500 00005583eef0df30
    72646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200
    00000000";
/// The p2p RTR: a zero-length RDMA Write, STag 1, TO 0.
const RTR_FPDU: &str = "000e c140 00000001 0000000000000000 00000000";

#[test]
fn literal_crc_send() {
    let b = hex(CRC_SEND_FPDU);
    assert_eq!(crc_to_wire(crc32c(&b[..36])), [0x72, 0x73, 0xeb, 0xc2]);
    let Ok(Deframe::Frame {
        ulpdu,
        consumed: 40,
    }) = mpa::deframe(&b, true)
    else {
        panic!()
    };
    let p = ddp::Packet::new_checked(ulpdu).unwrap();
    assert_eq!(
        ddp::Repr::parse(&p).unwrap(),
        ddp::Repr {
            last: true,
            version: 1,
            ulp_ctrl: 0x43,
            ulp_word: 0,
            placement: Placement::Untagged {
                qn: 0,
                msn: 1,
                mo: 0
            },
        }
    );
    assert_eq!(p.payload(), &hex("0000564fef633d50 be4dff00 00000040")[..]);
    let mut again = Vec::new();
    mpa::emit_fpdu(ulpdu, true, &mut again);
    assert_eq!(again, b);
}

#[test]
fn literal_read_request() {
    let b = hex(READ_REQUEST_FPDU);
    let Ok(Deframe::Frame { ulpdu, .. }) = mpa::deframe(&b, false) else {
        panic!()
    };
    let p = ddp::Packet::new_checked(ulpdu).unwrap();
    assert_eq!(rdmap::ctrl_opcode(p.ulp_ctrl()), Opcode::ReadRequest);
    assert_eq!((p.qn(), p.msn(), p.mo()), (rdmap::QN_READ_REQUEST, 1, 0));
    let rr = ReadRequestRepr::parse(&ReadRequest::new_checked(p.payload()).unwrap()).unwrap();
    assert_eq!(
        rr,
        ReadRequestRepr {
            sink_stag: 0xad6f_ed00,
            sink_to: 0x5574_8330_9f30,
            size: 64,
            src_stag: 0xd21b_4e00,
            src_to: 0x5583_eef0_dd50,
        }
    );
    // Construct the whole FPDU from the Reprs.
    let d = ddp::Repr::parse(&p).unwrap();
    let mut ulpdu2 = vec![0u8; d.header_len() + rr.buffer_len()];
    d.emit(&mut ddp::Packet::new_unchecked(&mut ulpdu2[..]));
    rr.emit(&mut ReadRequest::new_unchecked(
        &mut ulpdu2[d.header_len()..],
    ));
    let mut fpdu = Vec::new();
    mpa::emit_fpdu(&ulpdu2, false, &mut fpdu);
    assert_eq!(fpdu, b);
    // Impossible lengths.
    assert_eq!(
        ReadRequest::new_checked(&p.payload()[..27]),
        Err(Error::Truncated)
    );
    assert_eq!(
        ddp::Packet::new_checked(&ulpdu[..17]),
        Err(Error::Truncated)
    );
}

#[test]
fn literal_write_and_rtr() {
    let b = hex(WRITE_FPDU);
    assert_eq!(b.len(), mpa::fpdu_len(0x4e, false));
    assert_eq!(mpa::pad_len(0x4e), 0);
    let Ok(Deframe::Frame { ulpdu, consumed }) = mpa::deframe(&b, false) else {
        panic!()
    };
    assert_eq!(consumed, b.len());
    let p = ddp::Packet::new_checked(ulpdu).unwrap();
    assert!(p.tagged() && p.last());
    assert_eq!((p.stag(), p.to()), (0xa4a1_c500, 0x5583_eef0_df30));
    assert!(p.payload().starts_with(b"rdma-ping-0: ABC"));
    assert_eq!(p.payload().len(), 64);

    let b = hex(RTR_FPDU);
    let Ok(Deframe::Frame { ulpdu, .. }) = mpa::deframe(&b, false) else {
        panic!()
    };
    let d = ddp::Repr::parse(&ddp::Packet::new_checked(ulpdu).unwrap()).unwrap();
    assert_eq!(d.placement, Placement::Tagged { stag: 1, to: 0 });
    assert_eq!(rdmap::ctrl_opcode(d.ulp_ctrl), Opcode::RdmaWrite);
    assert_eq!(ulpdu.len(), ddp::TAGGED_HDR_LEN);
}

/// A Terminate FPDU as siw would send it for an untagged "invalid MSN, no
/// buffer" error on a 64-byte Send (M, D, the Send's DDP header).
#[test]
fn literal_terminate_fpdu() {
    let body = hex("12 02 c000 0040
         4143 00000000 00000000 00000007 00000000");
    let t = TerminateRepr::parse(&terminate::Packet::new_checked(&body[..]).unwrap()).unwrap();
    assert_eq!(t.code, TermCode::DdpUntaggedNoBuffer);
    assert_eq!(t.ddp_seg_len, Some(64));
    let d = ddp::Repr {
        last: true,
        version: 1,
        ulp_ctrl: rdmap::ctrl_byte(Opcode::Terminate),
        ulp_word: 0,
        placement: Placement::Untagged {
            qn: rdmap::QN_TERMINATE,
            msn: 1,
            mo: 0,
        },
    };
    let mut ulpdu = vec![0u8; d.header_len() + t.buffer_len()];
    d.emit(&mut ddp::Packet::new_unchecked(&mut ulpdu[..]));
    t.emit(&mut terminate::Packet::new_unchecked(
        &mut ulpdu[d.header_len()..],
    ));
    let mut fpdu = Vec::new();
    mpa::emit_fpdu(&ulpdu, true, &mut fpdu);
    // 2 + 18 + 24 = 44: siw's Terminate length for an untagged DDP error.
    assert_eq!(fpdu.len(), 44 + 4);
    assert_eq!(&fpdu[..4], &[0x00, 0x2a, 0x41, 0x47]);
    let Ok(Deframe::Frame { ulpdu: u2, .. }) = mpa::deframe(&fpdu, true) else {
        panic!()
    };
    assert_eq!(u2, &ulpdu[..]);
    assert_eq!(
        terminate::Packet::new_checked(&body[..10]),
        Err(Error::Truncated)
    );
}

// ------------------------------------------------------------- handshake

fn cfg(crc: Policy, markers: Policy) -> MpaConfig {
    MpaConfig {
        crc,
        markers,
        ..Default::default()
    }
}

/// Runs a whole setup; `Err` carries which side failed.
fn connect(
    init: &MpaConfig,
    resp: &MpaConfig,
) -> Result<(handshake::Negotiated, handshake::Negotiated), (&'static str, HandshakeError)> {
    let req = handshake::request(init, b"hello").map_err(|e| ("request", e))?;
    assert_eq!(handshake::frame_len(&req[..20]), Ok(req.len()));
    let parsed = handshake::parse_request(&req).map_err(|e| ("parse_request", e))?;
    let (rep, rn) = match handshake::accept(resp, &parsed, b"world") {
        Ok(x) => x,
        Err(e) => {
            // The caller answers with a reject, which the initiator sees.
            let rej = handshake::reject(resp, Some(&parsed), b"no");
            assert_eq!(
                handshake::parse_reply(init, &rej),
                Err(HandshakeError::Rejected {
                    private_data: b"no".to_vec()
                })
            );
            return Err(("accept", e));
        }
    };
    let (inn, pd) = handshake::parse_reply(init, &rep).map_err(|e| ("parse_reply", e))?;
    assert_eq!(pd, b"world");
    assert_eq!(parsed.private_data, b"hello");
    Ok((inn, rn))
}

#[test]
fn crc_policy_matrix() {
    use Policy::*;
    for i in [Required, Optional, Off] {
        for r in [Required, Optional, Off] {
            let res = connect(&cfg(i, Optional), &cfg(r, Optional));
            match (i, r) {
                (Required, Off) => {
                    let (side, e) = res.unwrap_err();
                    assert_eq!(side, "accept");
                    assert!(matches!(e, HandshakeError::CrcPolicy(_)));
                    let m = e.to_string();
                    assert!(
                        m.contains("crc=off") && m.contains("set crc=optional or required"),
                        "{m}"
                    );
                }
                (Off, Required) => {
                    let (side, e) = res.unwrap_err();
                    assert_eq!(side, "parse_reply");
                    assert!(e.to_string().contains("set crc=optional or required"));
                }
                _ => {
                    let (a, b) = res.unwrap();
                    let want = i == Required || r == Required;
                    assert_eq!((a.crc, b.crc), (want, want), "{i:?}/{r:?}");
                }
            }
        }
    }
}

#[test]
fn marker_policy_matrix() {
    use Policy::*;
    for i in [Required, Optional, Off] {
        for r in [Required, Optional, Off] {
            let res = connect(&cfg(Optional, i), &cfg(Optional, r));
            match (i, r) {
                (Required, Off) | (Off, Required) => {
                    let (side, e) = res.unwrap_err();
                    assert_eq!(
                        side,
                        if i == Required {
                            "accept"
                        } else {
                            "parse_reply"
                        }
                    );
                    assert!(matches!(e, HandshakeError::MarkerPolicy(_)));
                    assert!(e.to_string().contains("set markers=optional or required"));
                }
                _ => {
                    let (a, b) = res.unwrap();
                    // Per direction: each side receives markers iff it
                    // required them, and sends them iff the peer did.
                    assert_eq!(a.markers_rx, i == Required);
                    assert_eq!(b.markers_rx, r == Required);
                    assert_eq!(a.markers_tx, b.markers_rx);
                    assert_eq!(b.markers_tx, a.markers_rx);
                }
            }
        }
    }
}

#[test]
fn crc_required_reply_without_c_is_refused() {
    let init = cfg(Policy::Required, Policy::Optional);
    let mut rep = b"MPA ID Rep Frame\x10\x02\x00\x04\x00\x01\x00\x01".to_vec();
    let e = handshake::parse_reply(&init, &rep).unwrap_err();
    assert!(matches!(e, HandshakeError::CrcPolicy(_)));
    assert!(e.to_string().contains("crc=required"));
    rep[16] |= mpa::FLAG_CRC;
    assert!(handshake::parse_reply(&init, &rep).unwrap().0.crc);
}

#[test]
fn markers_requested_by_a_peer_are_valid_mpa() {
    // siw rejects this; we handle it per our policy.
    let mut req = handshake::request(&MpaConfig::default(), &[]).unwrap();
    req[16] |= mpa::FLAG_MARKERS;
    let r = handshake::parse_request(&req).unwrap();
    assert!(r.markers);
    let (rep, n) = handshake::accept(&MpaConfig::default(), &r, &[]).unwrap();
    assert!(n.markers_tx && !n.markers_rx);
    assert_eq!(rep[16] & mpa::FLAG_MARKERS, 0);
}

#[test]
fn private_data_limits() {
    let rev1 = MpaConfig {
        revision: 1,
        ..Default::default()
    };
    let req = handshake::request(&rev1, &[7u8; 512]).unwrap();
    assert_eq!(req.len(), 532);
    assert_eq!(
        handshake::parse_request(&req).unwrap().private_data.len(),
        512
    );
    assert_eq!(
        handshake::request(&rev1, &[7u8; 513]),
        Err(HandshakeError::PrivateDataTooLong(513))
    );
    // Revision 2: the IRD/ORD block takes 4 of the 512 bytes.
    let rev2 = MpaConfig::default();
    let req = handshake::request(&rev2, &[7u8; 508]).unwrap();
    assert_eq!(req.len(), 532);
    let parsed = handshake::parse_request(&req).unwrap();
    assert_eq!(parsed.private_data.len(), 508);
    assert_eq!(
        handshake::request(&rev2, &[7u8; 509]),
        Err(HandshakeError::PrivateDataTooLong(513))
    );
    assert!(matches!(
        handshake::accept(&rev2, &parsed, &[0u8; 509]),
        Err(HandshakeError::PrivateDataTooLong(513))
    ));
    // A received frame announcing 513 bytes.
    let mut big = req.clone();
    big[18..20].copy_from_slice(&513u16.to_be_bytes());
    big.push(0);
    assert_eq!(
        handshake::frame_len(&big),
        Err(HandshakeError::PrivateDataTooLong(513))
    );
    assert_eq!(
        handshake::parse_request(&big),
        Err(HandshakeError::PrivateDataTooLong(513))
    );
    assert!(HandshakeError::PrivateDataTooLong(513)
        .to_string()
        .contains("512"));
    // A reject truncates rather than failing.
    let rej = handshake::reject(&rev2, Some(&parsed), &[1u8; 600]);
    assert_eq!(rej.len(), 532);
}

#[test]
fn wrong_key_revision_and_truncation() {
    let good = handshake::request(&MpaConfig::default(), &[]).unwrap();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(handshake::frame_len(&bad), Err(HandshakeError::BadKey));
    assert_eq!(handshake::parse_request(&bad), Err(HandshakeError::BadKey));
    // A Reply where a Request is expected, and the other way round.
    let (rep, _) = handshake::accept(
        &MpaConfig::default(),
        &handshake::parse_request(&good).unwrap(),
        &[],
    )
    .unwrap();
    assert_eq!(handshake::parse_request(&rep), Err(HandshakeError::BadKey));
    assert_eq!(
        handshake::parse_reply(&MpaConfig::default(), &good),
        Err(HandshakeError::BadKey)
    );
    assert!(HandshakeError::BadKey.to_string().contains("iWARP"));
    for rev in [0u8, 3, 255] {
        let mut r = good.clone();
        r[17] = rev;
        assert_eq!(
            handshake::parse_request(&r),
            Err(HandshakeError::BadRevision(rev))
        );
        let mut p = rep.clone();
        p[17] = rev;
        assert_eq!(
            handshake::parse_reply(&MpaConfig::default(), &p),
            Err(HandshakeError::BadRevision(rev))
        );
    }
    let bad_cfg = MpaConfig {
        revision: 3,
        ..Default::default()
    };
    assert_eq!(
        handshake::request(&bad_cfg, &[]),
        Err(HandshakeError::BadRevision(3))
    );
    // Rev 2 reply to a rev 1 request.
    let rev1 = MpaConfig {
        revision: 1,
        ..Default::default()
    };
    assert_eq!(
        handshake::parse_reply(&rev1, &rep),
        Err(HandshakeError::BadRevision(2))
    );
    assert_eq!(
        handshake::frame_len(&good[..19]),
        Err(HandshakeError::Truncated)
    );
    assert_eq!(
        handshake::parse_request(&good[..23]),
        Err(HandshakeError::Truncated)
    );
    // Rev 2 with E but no block.
    let mut noblk = good[..20].to_vec();
    noblk[19] = 0;
    assert!(matches!(
        handshake::parse_request(&noblk),
        Err(HandshakeError::Malformed(_))
    ));
    // Rev 2 reply without E: siw fails such a connection too.
    let mut no_e = rep.clone();
    no_e[16] &= !mpa::FLAG_ENHANCED;
    assert!(matches!(
        handshake::parse_reply(&MpaConfig::default(), &no_e),
        Err(HandshakeError::Malformed(_))
    ));
    assert_eq!(
        HandshakeError::Malformed("x").term_code(),
        Some(TermCode::MpaInvalidReqRep)
    );
}

#[test]
fn revision_fallback() {
    let rev1 = MpaConfig {
        revision: 1,
        ird: 4,
        ord: 2,
        ..Default::default()
    };
    let rev2 = MpaConfig::default();
    // A rev 2 responder answers a rev 1 initiator with rev 1, no block.
    let (a, b) = connect(&rev1, &rev2).unwrap();
    assert_eq!((a.revision, b.revision), (1, 1));
    assert_eq!((a.ird, a.ord), (4, 2));
    let req = handshake::request(&rev1, &[]).unwrap();
    assert_eq!(req.len(), 20);
    assert_eq!(req[16], 0);
    // A rev 1 responder answers a rev 2 initiator with rev 1; no RTR.
    let p2p = MpaConfig {
        rtr: Some(Rtr::ZeroLengthWrite),
        ..Default::default()
    };
    let (a, b) = connect(&p2p, &rev1).unwrap();
    assert_eq!((a.revision, a.rtr, b.rtr), (1, None, None));
}

#[test]
fn ird_ord_negotiation() {
    let init = MpaConfig {
        ird: 8,
        ord: 4,
        ..Default::default()
    };
    let resp = MpaConfig {
        ird: 2,
        ord: 16,
        ..Default::default()
    };
    let (a, b) = connect(&init, &resp).unwrap();
    // Responder: IRD = min(2, initiator ORD 4) = 2; ORD = min(16, initiator IRD 8) = 8.
    assert_eq!((b.ird, b.ord), (2, 8));
    // Initiator: ORD = min(4, responder IRD 2) = 2; IRD = responder ORD 8.
    assert_eq!((a.ird, a.ord), (8, 2));
    // Zero reads either way (perftest's 0000 0000).
    let zero = MpaConfig {
        ird: 0,
        ord: 0,
        ..Default::default()
    };
    let (a, b) = connect(&zero, &MpaConfig::default()).unwrap();
    assert_eq!((a.ird, a.ord, b.ird, b.ord), (0, 0, 0, 0));
    // Values beyond 14 bits are clamped.
    let huge = MpaConfig {
        ird: u16::MAX,
        ord: u16::MAX,
        ..Default::default()
    };
    let req = handshake::request(&huge, &[]).unwrap();
    assert_eq!(&req[20..24], &[0x3f, 0xff, 0x3f, 0xff]);
    // A responder ORD above our IRD.
    let rep = b"MPA ID Rep Frame\x10\x02\x00\x04\x00\x01\x00\x09";
    let e = handshake::parse_reply(&init, rep).unwrap_err();
    assert_eq!(
        e,
        HandshakeError::InsufficientIrd {
            ird: 8,
            peer_ord: 9
        }
    );
    assert_eq!(e.term_code(), Some(TermCode::MpaInsufficientIrd));
    assert!(e.to_string().contains("raise ird"));
}

#[test]
fn rtr_negotiation() {
    let p2p = |r| MpaConfig {
        rtr: Some(r),
        ..Default::default()
    };
    // Initiator prefers Write: siw's offer (Write + Read); the responder's
    // preference among the offered wins, else Write.
    let (a, b) = connect(&p2p(Rtr::ZeroLengthWrite), &MpaConfig::default()).unwrap();
    assert_eq!(
        (a.rtr, b.rtr),
        (Some(Rtr::ZeroLengthWrite), Some(Rtr::ZeroLengthWrite))
    );
    let (a, b) = connect(&p2p(Rtr::ZeroLengthWrite), &p2p(Rtr::ZeroLengthRead)).unwrap();
    assert_eq!(
        (a.rtr, b.rtr),
        (Some(Rtr::ZeroLengthRead), Some(Rtr::ZeroLengthRead))
    );
    // Send is offered only by an initiator that prefers it.
    let (a, b) = connect(&p2p(Rtr::ZeroLengthSend), &p2p(Rtr::ZeroLengthSend)).unwrap();
    assert_eq!(
        (a.rtr, b.rtr),
        (Some(Rtr::ZeroLengthSend), Some(Rtr::ZeroLengthSend))
    );
    let (a, _) = connect(&p2p(Rtr::ZeroLengthWrite), &p2p(Rtr::ZeroLengthSend)).unwrap();
    assert_eq!(a.rtr, Some(Rtr::ZeroLengthWrite));
    let req = handshake::request(&p2p(Rtr::ZeroLengthSend), &[]).unwrap();
    assert_eq!(&req[20..24], &[0xc0, 0x10, 0xc0, 0x10]);
    // No P2P requested: none negotiated even if the responder likes it.
    let (a, b) = connect(&MpaConfig::default(), &p2p(Rtr::ZeroLengthRead)).unwrap();
    assert_eq!((a.rtr, b.rtr), (None, None));
    // A Reply that picks nothing we offered, or drops P2P.
    let init = p2p(Rtr::ZeroLengthWrite);
    for block in [
        [0x80, 0x10, 0x00, 0x10],
        [0x00, 0x10, 0x80, 0x10],
        [0xc0, 0x10, 0x00, 0x10],
    ] {
        let mut rep = b"MPA ID Rep Frame\x10\x02\x00\x04".to_vec();
        rep.extend_from_slice(&block);
        let e = handshake::parse_reply(&init, &rep).unwrap_err();
        assert_eq!(e, HandshakeError::NoMatchingRtr, "{block:02x?}");
        assert_eq!(e.term_code(), Some(TermCode::MpaNoMatchingRtr));
    }
    // P2P with no type offered: Write, as siw answers.
    let req =
        handshake::parse_request(b"MPA ID Req Frame\x10\x02\x00\x04\x80\x01\x00\x01").unwrap();
    let (rep, n) = handshake::accept(&MpaConfig::default(), &req, &[]).unwrap();
    assert_eq!(n.rtr, Some(Rtr::ZeroLengthWrite));
    assert_eq!(&rep[20..24], &[0x80, 0x01, 0x80, 0x01]);
}

#[test]
fn reject_frames() {
    let req =
        handshake::parse_request(b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01").unwrap();
    let strict = MpaConfig {
        crc: Policy::Required,
        ..Default::default()
    };
    let rej = handshake::reject(&strict, Some(&req), b"busy");
    // R and C set, rev 2, a zero IRD/ORD block, then the private data.
    assert_eq!(
        &rej[..],
        &b"MPA ID Rep Frame\x70\x02\x00\x08\x00\x00\x00\x00busy"[..]
    );
    let e = handshake::parse_reply(&MpaConfig::default(), &rej).unwrap_err();
    assert_eq!(
        e,
        HandshakeError::Rejected {
            private_data: b"busy".to_vec()
        }
    );
    assert!(e.to_string().contains("rejected"));
    // Without a parsed request: own revision, no block.
    let rej = handshake::reject(&MpaConfig::default(), None, &[]);
    assert_eq!(&rej[..], &b"MPA ID Rep Frame\x20\x02\x00\x00"[..]);
}

// ------------------------------------------------------------- proptests

fn arb_ddp() -> impl Strategy<Value = ddp::Repr> {
    let tagged =
        (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| (Placement::Tagged { stag, to }, 0u32));
    let untagged = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
        .prop_map(|(qn, msn, mo, w)| (Placement::Untagged { qn, msn, mo }, w));
    (
        any::<bool>(),
        0u8..4,
        any::<u8>(),
        prop_oneof![tagged, untagged],
    )
        .prop_map(
            |(last, version, ulp_ctrl, (placement, ulp_word))| ddp::Repr {
                last,
                version,
                ulp_ctrl,
                ulp_word,
                placement,
            },
        )
}

proptest! {
    #[test]
    fn ddp_round_trip(r in arb_ddp(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut ddp::Packet::new_unchecked(&mut b[..]));
        b.extend_from_slice(&tail);
        let p = ddp::Packet::new_checked(&b[..]).unwrap();
        prop_assert_eq!(ddp::Repr::parse(&p).unwrap(), r);
        prop_assert_eq!(p.payload(), &tail[..]);
    }

    #[test]
    fn read_request_round_trip(sink_stag: u32, sink_to: u64, size: u32, src_stag: u32, src_to: u64) {
        let r = ReadRequestRepr { sink_stag, sink_to, size, src_stag, src_to };
        let mut b = [0u8; rdmap::READ_REQUEST_LEN];
        r.emit(&mut ReadRequest::new_unchecked(&mut b[..]));
        prop_assert_eq!(ReadRequestRepr::parse(&ReadRequest::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn terminate_round_trip(
        layer in 0u8..16, etype in 0u8..16, ecode: u8,
        seg in proptest::option::of(any::<u16>()),
        ddp_hdr in proptest::option::of(arb_ddp()),
        rdmap_len in proptest::option::of(0usize..=28),
        fill: u8,
    ) {
        let code = TermCode::from_wire(layer, etype, ecode);
        let hdr_bytes = ddp_hdr.map(|d| {
            let mut b = vec![0u8; d.buffer_len()];
            d.emit(&mut ddp::Packet::new_unchecked(&mut b[..]));
            b
        });
        // A short RDMAP part only at the end of the message (siw's R for Send).
        let rdmap_bytes = rdmap_len.map(|n| vec![fill; n]);
        let r = TerminateRepr {
            code,
            ddp_seg_len: if hdr_bytes.is_some() { seg } else { None },
            ddp_hdr: hdr_bytes.as_deref(),
            rdmap_hdr: rdmap_bytes.as_deref(),
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut terminate::Packet::new_unchecked(&mut b[..]));
        let p = terminate::Packet::new_checked(&b[..]).unwrap();
        prop_assert_eq!(TerminateRepr::parse(&p).unwrap(), r);
        prop_assert_eq!(code.to_wire(), (layer, etype, ecode));
    }

    #[test]
    fn mpa_frame_round_trip(
        request: bool, markers: bool, crc: bool, reject: bool, revision: u8,
        enh in proptest::option::of((0u16..0x4000, 0u16..0x4000, any::<[bool; 4]>())),
        pd in proptest::collection::vec(any::<u8>(), 0..=508),
    ) {
        let r = FrameRepr {
            kind: if request { FrameKind::Request } else { FrameKind::Reply },
            markers, crc, reject, revision,
            enhanced: enh.map(|(ird, ord, f)| EnhancedParams {
                ird, ord, peer_to_peer: f[0], rtr_zero_write: f[1], rtr_zero_read: f[2], rtr_zero_send: f[3],
            }),
            private_data: &pd,
        };
        let b = r.to_vec();
        prop_assert_eq!(mpa::frame_total_len(&b), Ok(b.len()));
        prop_assert_eq!(FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn fpdu_round_trip(ulpdu in proptest::collection::vec(any::<u8>(), 14..600), crc: bool, split in 0usize..700) {
        let mut s = Vec::new();
        mpa::emit_fpdu(&ulpdu, crc, &mut s);
        prop_assert_eq!(s.len(), mpa::fpdu_len(ulpdu.len(), crc));
        prop_assert_eq!(s.len() % 4, 0);
        let k = split.min(s.len());
        let expect = if k == s.len() {
            Deframe::Frame { ulpdu: &ulpdu, consumed: s.len() }
        } else {
            Deframe::NeedMore
        };
        prop_assert_eq!(mpa::deframe(&s[..k], crc), Ok(expect));
    }

    #[test]
    fn handshake_agrees(
        ird_i in 0u16..100, ord_i in 0u16..100, ird_r in 0u16..100, ord_r in 0u16..100,
        rtr_i in proptest::option::of(0u8..3), rtr_r in proptest::option::of(0u8..3),
        pd in proptest::collection::vec(any::<u8>(), 0..=100),
    ) {
        let rtr = |x: Option<u8>| x.map(|v| [Rtr::ZeroLengthWrite, Rtr::ZeroLengthRead, Rtr::ZeroLengthSend][v as usize]);
        let init = MpaConfig { ird: ird_i, ord: ord_i, rtr: rtr(rtr_i), ..Default::default() };
        let resp = MpaConfig { ird: ird_r, ord: ord_r, rtr: rtr(rtr_r), ..Default::default() };
        let req = handshake::request(&init, &pd).unwrap();
        let parsed = handshake::parse_request(&req).unwrap();
        prop_assert_eq!(&parsed.private_data, &pd);
        let (rep, b) = handshake::accept(&resp, &parsed, &pd).unwrap();
        let (a, _) = handshake::parse_reply(&init, &rep).unwrap();
        // Nobody issues more reads than the other side accepts.
        prop_assert!(a.ord <= b.ird && b.ord <= a.ird);
        prop_assert!(a.ord <= ord_i && b.ord <= ord_r && a.ird <= ird_i && b.ird <= ird_r);
        prop_assert_eq!(a.rtr, b.rtr);
        prop_assert_eq!(a.rtr.is_some(), rtr_i.is_some());
    }
}
