//! The engine's streaming receive path and the public deframer
//! (`mpa::deframe`) agree on MPA framing: on random streams of FPDUs, split
//! at random points, fed through the engine's buffered and direct paths,
//! both accept the same frames, find the same framing error (CRC mismatch,
//! ULPDU length too short) at the same FPDU, and report it with the same
//! Terminate code (`FpduError::term_code`, the one mapping).

use iwarp_proto::engine::{Engine, EngineConfig, EngineEvent, LinkParams, QpState, RxHint};
use iwarp_proto::mem::{Access, MemoryAccess, SimMemory};
use iwarp_proto::wire::{ddp, mpa, rdmap};
use proptest::prelude::*;

const REGION: usize = 4096;
const PD: u32 = 1;

/// One RDMA Write: offset and payload.
type Write = (u64, Vec<u8>);

fn write_strategy() -> impl Strategy<Value = Write> {
    (0usize..300).prop_flat_map(|len| {
        (
            0..=(REGION - len) as u64,
            proptest::collection::vec(any::<u8>(), len),
        )
    })
}

fn stream(writes: &[Write], stag: u32, crc: bool) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
    let mut out = Vec::new();
    let mut fpdus = Vec::new();
    for (to, payload) in writes {
        let mut ulpdu = vec![0u8; ddp::TAGGED_HDR_LEN];
        ddp::Repr {
            last: true,
            version: ddp::DDP_VERSION,
            ulp_ctrl: rdmap::ctrl_byte(rdmap::Opcode::RdmaWrite),
            ulp_word: 0,
            placement: ddp::Placement::Tagged { stag, to: *to },
        }
        .emit(&mut ddp::Packet::new_unchecked(&mut ulpdu[..]));
        ulpdu.extend_from_slice(payload);
        let start = out.len();
        mpa::emit_fpdu(&ulpdu, crc, &mut out);
        fpdus.push(start..out.len());
    }
    (out, fpdus)
}

/// What the public deframer makes of `s`: the writes it frames (in order)
/// and the Terminate a framing error calls for.
fn reference(s: &[u8], crc: bool) -> (Vec<Write>, Option<(u8, u8, u8)>) {
    let mut at = 0;
    let mut frames = Vec::new();
    loop {
        match mpa::deframe(&s[at..], crc) {
            Ok(mpa::Deframe::Frame { ulpdu, consumed }) => {
                let p = ddp::Packet::new_checked(ulpdu).unwrap();
                frames.push((p.to(), p.payload().to_vec()));
                at += consumed;
            }
            Ok(mpa::Deframe::NeedMore) => return (frames, None),
            Err(e) => return (frames, Some(e.term_code().to_wire())),
        }
    }
}

/// Feed `s` to an engine in `chunks`, using the direct path whenever the
/// engine offers it (as the driver does) if `direct`.
fn engine_run(
    s: &[u8],
    crc: bool,
    chunks: &[usize],
    direct: bool,
) -> (Vec<u8>, Option<(u8, u8, u8)>, QpState) {
    let mem = SimMemory::new();
    let stag = mem.register(PD, Access::REMOTE_WRITE, 0, REGION);
    assert_eq!(stag, STAG);
    let mut e = Engine::new(EngineConfig {
        pd: PD,
        sq_depth: 4,
        rq_depth: 4,
    });
    e.establish(LinkParams {
        crc,
        markers_tx: false,
        markers_rx: false,
        mulpdu: 1024,
        ird: 4,
        ord: 4,
    });
    let mut at = 0;
    let mut i = 0;
    while at < s.len() {
        let n = chunks[i % chunks.len()].min(s.len() - at);
        i += 1;
        let mut chunk = &s[at..at + n];
        at += n;
        while !chunk.is_empty() {
            match e.rx_hint() {
                RxHint::Direct { stag, to, len } if direct => {
                    let k = (len as usize).min(chunk.len());
                    mem.write(stag, to, &chunk[..k]).unwrap();
                    e.handle_direct(k, &mem);
                    chunk = &chunk[k..];
                }
                _ => {
                    let k = e.handle_input(chunk, &mem);
                    assert_eq!(k, chunk.len());
                    chunk = &[];
                }
            }
        }
    }
    let mut term = None;
    while let Some(ev) = e.poll_event() {
        if let EngineEvent::TerminateSent(t) = ev {
            term = Some((t.layer, t.etype, t.ecode));
        }
    }
    (mem.contents(stag), term, e.state())
}

/// The first region SimMemory registers gets this STag (index 1, key 1).
const STAG: u32 = 0x101;

/// Damage to the stream.
#[derive(Debug, Clone)]
enum Damage {
    None,
    /// Flip bits in a byte after the DDP header of FPDU `k` (payload, pad
    /// or CRC): only a CRC can see it.
    Flip {
        k: usize,
        at: usize,
        mask: u8,
    },
    /// Set FPDU `k`'s ULPDU length below the smallest DDP header.
    ShortLen {
        k: usize,
        len: u16,
    },
    /// Cut the stream before its end.
    Truncate {
        at: usize,
    },
}

fn damage_strategy() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::None),
        (any::<usize>(), any::<usize>(), 1u8..=255).prop_map(|(k, at, mask)| Damage::Flip {
            k,
            at,
            mask
        }),
        (any::<usize>(), 0u16..ddp::TAGGED_HDR_LEN as u16)
            .prop_map(|(k, len)| Damage::ShortLen { k, len }),
        any::<usize>().prop_map(|at| Damage::Truncate { at }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn engine_and_public_deframer_agree(
        writes in proptest::collection::vec(write_strategy(), 1..8),
        crc in any::<bool>(),
        damage in damage_strategy(),
        chunks in proptest::collection::vec(1usize..80, 1..6),
        direct in any::<bool>(),
    ) {
        let (mut s, fpdus) = stream(&writes, STAG, crc);
        match damage {
            Damage::None => {}
            Damage::Flip { k, at, mask } => {
                // Without CRC nothing can see a flipped payload byte.
                prop_assume!(crc);
                let r = &fpdus[k % fpdus.len()];
                let start = r.start + mpa::ULPDU_LEN_FIELD + ddp::TAGGED_HDR_LEN;
                s[start + at % (r.end - start)] ^= mask;
            }
            Damage::ShortLen { k, len } => {
                let r = &fpdus[k % fpdus.len()];
                s[r.start..r.start + 2].copy_from_slice(&len.to_be_bytes());
            }
            Damage::Truncate { at } => {
                s.truncate(at % s.len());
            }
        }
        let (frames, want_term) = reference(&s, crc);
        let (mem, term, state) = engine_run(&s, crc, &chunks, direct);
        prop_assert_eq!(term, want_term);
        prop_assert_eq!(state == QpState::Error, want_term.is_some());
        if want_term.is_none() {
            // Every frame the deframer found was placed, in order.
            let mut model = vec![0u8; REGION];
            for (to, p) in &frames {
                model[*to as usize..*to as usize + p.len()].copy_from_slice(p);
            }
            if matches!(damage, Damage::None) {
                prop_assert_eq!(frames.len(), writes.len());
                prop_assert!(mem == model, "placed bytes differ");
            } else {
                // A truncated last FPDU may have placed a prefix of its
                // payload: every other byte matches.
                let partial = frames.len() < writes.len();
                for (i, (&m, &w)) in mem.iter().zip(&model).enumerate() {
                    if m != w {
                        prop_assert!(partial, "byte {} differs", i);
                        let (to, p) = &writes[frames.len()];
                        prop_assert!((*to as usize..*to as usize + p.len()).contains(&i));
                    }
                }
            }
        }
    }
}
