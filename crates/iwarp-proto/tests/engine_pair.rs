//! Level 2 and 3 tests of the sans-IO engine: two engines wired back to
//! back through a simulated TCP stream, with deterministic pseudo-random
//! segmentation (any split of the byte stream), optional byte corruption
//! and loss, and both receive paths (buffered and direct placement).

use std::collections::VecDeque;

use iwarp_proto::engine::*;
use iwarp_proto::mem::{Access, MemoryAccess, SimMemory};
use iwarp_proto::wire::terminate::TermCode;

const PD: u32 = 7;

/// Deterministic xorshift, so every failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Peer {
    eng: Engine,
    mem: SimMemory,
    frame: TxFrame,
    wcs: Vec<WorkCompletion>,
    events: Vec<EngineEvent>,
    /// Rewrite this region (with the next generation of `pattern`) after
    /// every frame is built and before it is written: the application
    /// changing memory while its bytes are on their way to the socket.
    scribble: Option<(u32, usize)>,
    generation: u8,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            eng: Engine::new(EngineConfig {
                pd: PD,
                sq_depth: 64,
                rq_depth: 64,
            }),
            mem: SimMemory::new(),
            frame: TxFrame::default(),
            wcs: Vec::new(),
            events: Vec::new(),
            scribble: None,
            generation: 0,
        }
    }

    /// A peer on an established link without markers (MULPDU 1460, IRD
    /// and ORD 8).
    fn without_markers(crc: bool) -> Peer {
        let mut p = Peer::new();
        p.eng.establish(LinkParams {
            crc,
            markers_tx: false,
            markers_rx: false,
            mulpdu: 1460,
            ird: 8,
            ord: 8,
        });
        p
    }

    fn drain(&mut self) {
        while let Some(wc) = self.eng.poll_completion() {
            self.wcs.push(wc);
        }
        while let Some(ev) = self.eng.poll_event() {
            self.events.push(ev);
        }
    }

    /// Resolve a frame into the bytes a `writev` would send.
    fn flatten(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.frame.len());
        for p in &self.frame.pieces {
            match *p {
                TxPiece::Inline { start, len } => out
                    .extend_from_slice(&self.frame.inline[start as usize..(start + len) as usize]),
                TxPiece::Mem { stag, to, len } => {
                    self.mem
                        .visit(stag, to, len, &mut |b| out.extend_from_slice(b))
                        .expect("frame refers to valid memory");
                }
            }
        }
        out
    }
}

#[derive(Clone, Copy)]
struct Link {
    crc: bool,
    markers: bool,
    mulpdu: u32,
    ird: u32,
    ord: u32,
}

impl Default for Link {
    fn default() -> Link {
        Link {
            crc: true,
            markers: false,
            mulpdu: 1460,
            ird: 8,
            ord: 8,
        }
    }
}

struct Pair {
    a: Peer,
    b: Peer,
    rng: Rng,
    wire_ab: VecDeque<u8>,
    wire_ba: VecDeque<u8>,
    max_chunk: u64,
    /// Place tagged payload through `handle_direct` when offered.
    direct: bool,
    /// Bytes sent a->b so far, for fault injection.
    ab_sent: usize,
    /// Corrupt (flip) the a->b byte at this offset.
    corrupt_ab_at: Option<usize>,
    /// Drop this range of the a->b stream (loss that TCP would not allow:
    /// the framing must catch it).
    drop_ab: Option<(usize, usize)>,
    /// Every a->b byte sent, when recording.
    log_ab: Option<Vec<u8>>,
}

impl Pair {
    fn new(seed: u64, link: Link) -> Pair {
        let mut a = Peer::new();
        let mut b = Peer::new();
        for p in [&mut a, &mut b] {
            p.eng.establish(LinkParams {
                crc: link.crc,
                markers_tx: link.markers,
                markers_rx: link.markers,
                mulpdu: link.mulpdu,
                ird: link.ird,
                ord: link.ord,
            });
        }
        Pair {
            a,
            b,
            rng: Rng(seed | 1),
            wire_ab: VecDeque::new(),
            wire_ba: VecDeque::new(),
            max_chunk: 3000,
            direct: seed.is_multiple_of(2),
            ab_sent: 0,
            corrupt_ab_at: None,
            drop_ab: None,
            log_ab: None,
        }
    }

    fn transmit(p: &mut Peer, wire: &mut VecDeque<u8>, budget: usize) -> Vec<u8> {
        p.frame.clear();
        let _ = wire;
        if !p.eng.poll_transmit(&mut p.frame, budget, &p.mem) {
            return Vec::new();
        }
        if let Some((stag, len)) = p.scribble {
            p.generation = p.generation.wrapping_add(1);
            p.mem.fill(stag, &pattern(len, p.generation));
        }
        let bytes = p.flatten();
        p.eng.confirm_transmit();
        bytes
    }

    fn deliver(
        rng: &mut Rng,
        direct: bool,
        max_chunk: u64,
        p: &mut Peer,
        wire: &mut VecDeque<u8>,
    ) -> bool {
        if wire.is_empty() {
            return false;
        }
        let n = (1 + rng.below(max_chunk)) as usize;
        let n = n.min(wire.len());
        if direct {
            if let RxHint::Direct { stag, to, len } = p.eng.rx_hint() {
                let k = n.min(len as usize);
                let bytes: Vec<u8> = wire.drain(..k).collect();
                p.mem
                    .write(stag, to, &bytes)
                    .expect("direct target is valid");
                p.eng.handle_direct(k, &p.mem);
                p.drain();
                return true;
            }
        }
        let bytes: Vec<u8> = wire.drain(..n).collect();
        let used = p.eng.handle_input(&bytes, &p.mem);
        assert_eq!(
            used,
            bytes.len(),
            "an established engine consumes all input"
        );
        p.drain();
        true
    }

    /// Run until quiet. Bounded: a livelock fails the test.
    fn run(&mut self) {
        for _ in 0..200_000 {
            let mut progress = false;
            let budget = 1 + self.rng.below(70_000) as usize;
            let mut out = Self::transmit(&mut self.a, &mut self.wire_ab, budget);
            if !out.is_empty() {
                progress = true;
                let base = self.ab_sent;
                self.ab_sent += out.len();
                if let Some(log) = self.log_ab.as_mut() {
                    log.extend_from_slice(&out);
                }
                if let Some(at) = self.corrupt_ab_at {
                    if at >= base && at < base + out.len() {
                        out[at - base] ^= 0x5a;
                    }
                }
                if let Some((lo, hi)) = self.drop_ab {
                    out = out
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| !(lo..hi).contains(&(base + i)))
                        .map(|(_, b)| b)
                        .collect();
                }
                self.wire_ab.extend(out);
            }
            let out = Self::transmit(&mut self.b, &mut self.wire_ba, budget);
            if !out.is_empty() {
                progress = true;
                self.wire_ba.extend(out);
            }
            self.a.drain();
            self.b.drain();
            progress |= Self::deliver(
                &mut self.rng,
                self.direct,
                self.max_chunk,
                &mut self.b,
                &mut self.wire_ab,
            );
            progress |= Self::deliver(
                &mut self.rng,
                self.direct,
                self.max_chunk,
                &mut self.a,
                &mut self.wire_ba,
            );
            if !progress && !self.a.eng.has_transmit() && !self.b.eng.has_transmit() {
                return;
            }
        }
        panic!("pair did not quiesce");
    }
}

/// Compare buffers without printing megabytes on failure.
#[track_caller]
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn send_wr(wr_id: u64, opcode: WrOpcode, sgl: &[Sge]) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        sgl: SgList::from_slice(sgl).unwrap(),
        signaled: true,
        solicited: false,
    }
}

fn recv_wr(wr_id: u64, sgl: &[Sge]) -> RecvWr {
    RecvWr {
        wr_id,
        sgl: SgList::from_slice(sgl).unwrap(),
    }
}

fn term_sent(p: &Peer) -> Option<(u8, u8, u8)> {
    p.events.iter().find_map(|e| match e {
        EngineEvent::TerminateSent(t) => Some((t.layer, t.etype, t.ecode)),
        _ => None,
    })
}

fn term_received(p: &Peer) -> Option<(u8, u8, u8)> {
    p.events.iter().find_map(|e| match e {
        EngineEvent::TerminateReceived(t) => Some((t.layer, t.etype, t.ecode)),
        _ => None,
    })
}

const LINKS: [Link; 4] = [
    Link {
        crc: true,
        markers: false,
        mulpdu: 1460,
        ird: 8,
        ord: 8,
    },
    Link {
        crc: false,
        markers: false,
        mulpdu: 1460,
        ird: 8,
        ord: 8,
    },
    Link {
        crc: true,
        markers: true,
        mulpdu: 1460,
        ird: 8,
        ord: 8,
    },
    Link {
        crc: true,
        markers: true,
        mulpdu: 200,
        ird: 2,
        ord: 2,
    },
];

#[test]
fn send_multi_sge_across_segmentation() {
    for (i, link) in LINKS.iter().enumerate() {
        for seed in [1u64, 2, 99] {
            let mut p = Pair::new(seed + i as u64 * 1000, *link);
            let src = p.a.mem.register(PD, Access::NONE, 0x1000, 10_000);
            p.a.mem.fill(src, &pattern(10_000, 3));
            let dst = p.b.mem.register(PD, Access::LOCAL_WRITE, 0x9000, 12_000);
            p.b.eng
                .post_recv(recv_wr(
                    5,
                    &[
                        Sge {
                            addr: 0x9000,
                            length: 3000,
                            lkey: dst,
                        },
                        Sge {
                            addr: 0x9000 + 3000,
                            length: 0,
                            lkey: dst,
                        },
                        Sge {
                            addr: 0x9000 + 5000,
                            length: 7000,
                            lkey: dst,
                        },
                    ],
                ))
                .unwrap();
            p.a.eng
                .post_send(send_wr(
                    1,
                    WrOpcode::Send,
                    &[
                        Sge {
                            addr: 0x1000,
                            length: 4000,
                            lkey: src,
                        },
                        Sge {
                            addr: 0x1000 + 4000,
                            length: 6000,
                            lkey: src,
                        },
                    ],
                ))
                .unwrap();
            p.run();
            assert_eq!(p.a.wcs.len(), 1, "link {i} seed {seed}: {:?}", p.a.events);
            assert!(
                p.b.events.is_empty(),
                "link {i} seed {seed}: {:?}",
                p.b.events
            );
            assert_eq!(p.a.wcs[0].status, WcStatus::Success);
            assert_eq!(p.a.wcs[0].opcode, WcOpcode::Send);
            let wc = p.b.wcs[0];
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
                (5, WcStatus::Success, WcOpcode::Recv, 10_000)
            );
            let got = p.b.mem.contents(dst);
            let want = pattern(10_000, 3);
            assert_same(&got[..3000], &want[..3000], "first SGE");
            assert_same(&got[5000..12_000], &want[3000..], "third SGE");
            assert!(
                got[3000..5000].iter().all(|&b| b == 0),
                "gap between SGEs untouched"
            );
        }
    }
}

#[test]
fn write_and_read_large_with_any_split() {
    for (i, link) in LINKS.iter().enumerate() {
        let mut p = Pair::new(11 + i as u64, *link);
        let len = 150_000;
        let a_buf = p.a.mem.register(PD, Access::LOCAL_WRITE, 0x10_0000, len);
        p.a.mem.fill(a_buf, &pattern(len, 9));
        let b_buf = p.b.mem.register(
            PD,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
            0x50_0000,
            len,
        );
        p.a.eng
            .post_send(send_wr(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: 0x50_0000,
                    rkey: b_buf,
                },
                &[Sge {
                    addr: 0x10_0000,
                    length: len as u32,
                    lkey: a_buf,
                }],
            ))
            .unwrap();
        p.run();
        assert!(p.b.events.is_empty(), "link {i}: {:?}", p.b.events);
        assert_same(
            &p.b.mem.contents(b_buf),
            &pattern(len, 9),
            &format!("link {i}: write placed"),
        );
        assert!(
            p.b.wcs.is_empty(),
            "an RDMA Write completes nothing at the target"
        );
        // Now change the target and read it back into a second region.
        p.b.mem.fill(b_buf, &pattern(len, 77));
        let a_sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0x90_0000, len);
        p.a.eng
            .post_send(send_wr(
                2,
                WrOpcode::RdmaRead {
                    remote_addr: 0x50_0000,
                    rkey: b_buf,
                },
                &[Sge {
                    addr: 0x90_0000,
                    length: len as u32,
                    lkey: a_sink,
                }],
            ))
            .unwrap();
        p.run();
        let ids: Vec<_> =
            p.a.wcs
                .iter()
                .map(|w| (w.wr_id, w.status, w.opcode))
                .collect();
        assert_eq!(
            ids,
            vec![
                (1, WcStatus::Success, WcOpcode::RdmaWrite),
                (2, WcStatus::Success, WcOpcode::RdmaRead)
            ]
        );
        assert_eq!(p.a.wcs[1].byte_len, len as u32);
        assert_same(
            &p.a.mem.contents(a_sink),
            &pattern(len, 77),
            &format!("link {i}: read placed"),
        );
    }
}

/// The ends (stream positions, markers counted) and ULPDU lengths of the
/// FPDUs of a stream with markers every 512 octets from position 0
/// (RFC 5044 §5.1); a marker due where an FPDU ends opens the next one.
fn fpdu_ends_with_markers(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    // Read `n` bytes of FPDU content from `pos`, stepping over markers.
    let take = |pos: &mut usize, n: usize| -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            if (*pos).is_multiple_of(512) {
                *pos += 4;
            }
            v.push(stream[*pos]);
            *pos += 1;
        }
        v
    };
    while pos < stream.len() {
        let len = take(&mut pos, 2);
        let ulpdu = u16::from_be_bytes([len[0], len[1]]) as usize;
        let pad = (4 - (2 + ulpdu) % 4) % 4;
        take(&mut pos, ulpdu + pad + 4);
        out.push((pos, ulpdu));
    }
    assert_eq!(pos, stream.len(), "the stream ends with a whole FPDU");
    out
}

#[test]
fn with_markers_no_full_fpdu_ends_on_a_marker_position() {
    // Wireshark's iwarp_mpa dissector (one FPDU per TCP segment) counts a
    // marker due right after an FPDU in that FPDU too, and rejects it; the
    // sender keeps FPDU ends off marker positions when it can (tx.rs,
    // `emit_segment`). Without that, MULPDU 200 already puts an FPDU end
    // on a marker position within a 60 KB Write.
    for mulpdu in (200..=1460).step_by(4) {
        let link = Link {
            crc: true,
            markers: true,
            mulpdu,
            ird: 2,
            ord: 2,
        };
        let mut p = Pair::new(mulpdu as u64, link);
        p.log_ab = Some(Vec::new());
        let len = 60_000;
        let a_buf = p.a.mem.register(PD, Access::LOCAL_WRITE, 0x10_0000, len);
        p.a.mem.fill(a_buf, &pattern(len, 5));
        let b_buf = p.b.mem.register(PD, Access::REMOTE_WRITE, 0x50_0000, len);
        p.a.eng
            .post_send(send_wr(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: 0x50_0000,
                    rkey: b_buf,
                },
                &[Sge {
                    addr: 0x10_0000,
                    length: len as u32,
                    lkey: a_buf,
                }],
            ))
            .unwrap();
        p.run();
        assert!(p.b.events.is_empty(), "mulpdu {mulpdu}: {:?}", p.b.events);
        assert_same(
            &p.b.mem.contents(b_buf),
            &pattern(len, 5),
            &format!("mulpdu {mulpdu}: write placed"),
        );
        let log = p.log_ab.take().unwrap();
        for (end, ulpdu) in fpdu_ends_with_markers(&log) {
            // A tagged header is 14 bytes; an FPDU with more than 4 payload
            // bytes can always be shortened.
            if ulpdu > 14 + 4 {
                assert!(
                    !end.is_multiple_of(512),
                    "mulpdu {mulpdu}: an FPDU of ULPDU {ulpdu} ends on marker position {end}"
                );
            }
        }
    }
}

#[test]
fn reads_beyond_ord_wait_and_complete_in_order() {
    let link = Link {
        ord: 2,
        ird: 2,
        ..Link::default()
    };
    let mut p = Pair::new(5, link);
    let src = p.b.mem.register(PD, Access::REMOTE_READ, 0, 4096);
    p.b.mem.fill(src, &pattern(4096, 1));
    let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 4096 * 8);
    for k in 0..8u64 {
        // Interleave writes (which complete on transmit) with reads.
        p.a.eng
            .post_send(send_wr(
                k,
                WrOpcode::RdmaRead {
                    remote_addr: 0,
                    rkey: src,
                },
                &[
                    Sge {
                        addr: k * 4096,
                        length: 2048,
                        lkey: sink,
                    },
                    Sge {
                        addr: k * 4096 + 2048,
                        length: 2048,
                        lkey: sink,
                    },
                ],
            ))
            .unwrap();
    }
    p.run();
    let ids: Vec<u64> = p.a.wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert!(p
        .a
        .wcs
        .iter()
        .all(|w| w.status == WcStatus::Success && w.byte_len == 4096));
    let got = p.a.mem.contents(sink);
    for k in 0..8 {
        assert_same(
            &got[k * 4096..(k + 1) * 4096],
            &pattern(4096, 1),
            "read sink",
        );
    }
    assert!(term_sent(&p.b).is_none());
}

/// RFC 5044 §6 / RFC 5040 §5.2: a Read Response is built from memory
/// that the responder's application may keep rewriting (a version slot
/// being published). With CRC on, the CRC must cover the bytes that go
/// out, whatever the memory holds by the time the frame is written; each
/// FPDU then carries one consistent snapshot. (Before the payload was
/// copied into the frame when CRC is on, this ended in a CRC Terminate.)
#[test]
fn read_responses_of_memory_rewritten_in_flight_keep_a_good_crc() {
    for (i, link) in LINKS.iter().enumerate() {
        let mut p = Pair::new(17 + i as u64, *link);
        let len = 4096usize;
        let src = p.b.mem.register(PD, Access::REMOTE_READ, 0, len);
        p.b.mem.fill(src, &pattern(len, 0));
        p.b.scribble = Some((src, len));
        let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, len * 4);
        for k in 0..4u64 {
            p.a.eng
                .post_send(send_wr(
                    k,
                    WrOpcode::RdmaRead {
                        remote_addr: 0,
                        rkey: src,
                    },
                    &[Sge {
                        addr: k * len as u64,
                        length: len as u32,
                        lkey: sink,
                    }],
                ))
                .unwrap();
        }
        p.run();
        assert_eq!(
            term_sent(&p.a),
            None,
            "link {i}: the reader found a bad FPDU"
        );
        assert_eq!(term_received(&p.b), None, "link {i}");
        assert_eq!(p.a.wcs.len(), 4, "link {i}");
        assert!(
            p.a.wcs
                .iter()
                .all(|w| w.status == WcStatus::Success && w.byte_len == len as u32),
            "link {i}: {:?}",
            p.a.wcs
        );
        // Every byte read is the byte of some generation the region held
        // (the pattern of generation g at offset j is 31 j + g), and the
        // generations seen only move forward within a read.
        let got = p.a.mem.contents(sink);
        for k in 0..4 {
            let mut last = 0u8;
            for j in 0..len {
                let g = got[k * len + j].wrapping_sub((j as u8).wrapping_mul(31));
                assert!(
                    g <= p.b.generation,
                    "link {i}: byte {j} of read {k} from nowhere"
                );
                assert!(
                    g >= last,
                    "link {i}: read {k} went back in time at byte {j}"
                );
                last = g;
            }
        }
        assert!(
            p.b.generation > 0,
            "link {i}: the region was never rewritten"
        );
    }
}

#[test]
fn send_with_invalidate_and_solicited() {
    let mut p = Pair::new(3, Link::default());
    let victim = p.b.mem.register(PD, Access::REMOTE_WRITE, 0x7000, 64);
    let dst = p.b.mem.register(PD, Access::LOCAL_WRITE, 0, 256);
    let exposed = p.b.mem.register(PD, Access::REMOTE_READ, 0x9000, 64);
    for i in 0..3 {
        p.b.eng
            .post_recv(recv_wr(
                10 + i,
                &[Sge {
                    addr: i * 64,
                    length: 64,
                    lkey: dst,
                }],
            ))
            .unwrap();
    }
    let src = p.a.mem.register(PD, Access::NONE, 0, 64);
    let sge = [Sge {
        addr: 0,
        length: 16,
        lkey: src,
    }];
    let mut w = send_wr(
        1,
        WrOpcode::SendWithInv {
            invalidate_rkey: victim,
        },
        &sge,
    );
    w.solicited = true;
    p.a.eng.post_send(w).unwrap();
    let mut w = send_wr(2, WrOpcode::Send, &sge);
    w.solicited = true;
    p.a.eng.post_send(w).unwrap();
    p.a.eng
        .post_send(send_wr(
            3,
            WrOpcode::SendWithInv {
                invalidate_rkey: exposed,
            },
            &[],
        ))
        .unwrap();
    p.run();
    let r: Vec<_> =
        p.b.wcs
            .iter()
            .map(|w| {
                (
                    w.wr_id,
                    w.status,
                    w.invalidated_rkey,
                    w.solicited,
                    w.byte_len,
                )
            })
            .collect();
    assert_eq!(
        r,
        vec![
            (10, WcStatus::Success, Some(victim), true, 16),
            (11, WcStatus::Success, None, true, 16),
            (12, WcStatus::Success, Some(exposed), false, 0),
        ]
    );
    assert!(
        p.b.mem.check(victim, 0x7000, 1, PD, Access::NONE).is_err(),
        "STag invalidated"
    );
}

/// A hostile peer's Send with Invalidate naming a LOCAL-ONLY STag (one
/// never advertised: here the receive buffer's own lkey, guessable from
/// its 8-bit key) is refused with the RFC 5040 §7 "cannot invalidate"
/// Terminate and a receive completion in error, and the region stays
/// valid for its owner.
#[test]
fn send_with_invalidate_of_a_local_only_stag_is_refused() {
    let mut p = Pair::new(3, Link::default());
    let dst = p.b.mem.register(PD, Access::LOCAL_WRITE, 0, 256);
    let private = p.b.mem.register(PD, Access::LOCAL_WRITE, 0x4000, 64);
    p.b.eng
        .post_recv(recv_wr(
            20,
            &[Sge {
                addr: 0,
                length: 64,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::SendWithInv {
                invalidate_rkey: private,
            },
            &[],
        ))
        .unwrap();
    p.run();
    assert_eq!(term_sent(&p.b), code(TermCode::RdmapCannotInvalidate));
    assert_eq!(term_received(&p.a), code(TermCode::RdmapCannotInvalidate));
    assert!(
        p.b.wcs
            .iter()
            .any(|w| w.wr_id == 20 && w.status == WcStatus::RemInvReqErr),
        "{:?}",
        p.b.wcs
    );
    assert!(
        p.b.mem.check(private, 0x4000, 1, PD, Access::NONE).is_ok(),
        "the local-only region must stay valid"
    );
}

#[test]
fn zero_length_operations() {
    let mut p = Pair::new(8, Link::default());
    let dst = p.b.mem.register(
        PD,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        0,
        16,
    );
    p.b.eng
        .post_recv(recv_wr(
            1,
            &[Sge {
                addr: 0,
                length: 16,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.a.eng.post_send(send_wr(1, WrOpcode::Send, &[])).unwrap();
    // RFC 6581 RTR-style zero-length Write and Read with STag 0.
    p.a.eng
        .post_send(send_wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            &[],
        ))
        .unwrap();
    p.a.eng
        .post_send(send_wr(
            3,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            &[],
        ))
        .unwrap();
    p.run();
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(p.b.wcs[0].byte_len, 0);
}

#[test]
fn unsignaled_requests_complete_silently_but_errors_always_complete() {
    let mut p = Pair::new(4, Link::default());
    let b_buf = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 64);
    let src = p.a.mem.register(PD, Access::NONE, 0, 64);
    let mut w = send_wr(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: 0,
            rkey: b_buf,
        },
        &[Sge {
            addr: 0,
            length: 64,
            lkey: src,
        }],
    );
    w.signaled = false;
    p.a.eng.post_send(w).unwrap();
    p.a.eng
        .post_send(send_wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: b_buf,
            },
            &[Sge {
                addr: 0,
                length: 64,
                lkey: src,
            }],
        ))
        .unwrap();
    p.run();
    assert_eq!(p.a.wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![2]);
}

/// Run `op` on a fresh pair and return (terminate sent by b, terminate
/// received by a, a's completions).
fn remote_violation(
    setup: impl FnOnce(&mut Pair) -> SendWr,
) -> (TermCodes, TermCodes, Vec<WorkCompletion>, Pair) {
    let mut p = Pair::new(21, Link::default());
    let wr = setup(&mut p);
    p.a.eng.post_send(wr).unwrap();
    // A follow-up Read stays outstanding until answered, so it must end in
    // an error completion, never be lost.
    let rsrc = p.b.mem.register(PD, Access::REMOTE_READ, 0xbeef_0000, 8);
    let rsink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0xdead_0000, 8);
    p.a.eng
        .post_send(send_wr(
            99,
            WrOpcode::RdmaRead {
                remote_addr: 0xbeef_0000,
                rkey: rsrc,
            },
            &[Sge {
                addr: 0xdead_0000,
                length: 8,
                lkey: rsink,
            }],
        ))
        .unwrap();
    p.run();
    assert_eq!(p.a.eng.state(), QpState::Error);
    assert_eq!(p.b.eng.state(), QpState::Error);
    let (s, r, w) = (term_sent(&p.b), term_received(&p.a), p.a.wcs.clone());
    (s, r, w, p)
}

/// A named violation: how to set it up, and the Terminate it must cause.
type Case = (&'static str, Box<dyn Fn(&mut Pair) -> SendWr>, TermCode);
type TermCodes = Option<(u8, u8, u8)>;

fn code(c: TermCode) -> Option<(u8, u8, u8)> {
    Some(c.to_wire())
}

#[test]
fn write_violations_terminate_with_ddp_tagged_codes() {
    let cases: Vec<Case> = vec![
        (
            "invalid stag",
            Box::new(|p: &mut Pair| {
                let src = p.a.mem.register(PD, Access::NONE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: 0,
                        rkey: 0x4242_4201,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: src,
                    }],
                )
            }),
            TermCode::DdpTaggedInvalidStag,
        ),
        (
            "key mismatch",
            Box::new(|p: &mut Pair| {
                let old = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 64);
                p.b.mem.deregister(old);
                let _new = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 64);
                let src = p.a.mem.register(PD, Access::NONE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: 0,
                        rkey: old,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: src,
                    }],
                )
            }),
            TermCode::DdpTaggedInvalidStag,
        ),
        (
            "pd mismatch",
            Box::new(|p: &mut Pair| {
                let other = p.b.mem.register(PD + 1, Access::REMOTE_WRITE, 0, 64);
                let src = p.a.mem.register(PD, Access::NONE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: 0,
                        rkey: other,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: src,
                    }],
                )
            }),
            TermCode::DdpTaggedStagNotAssociated,
        ),
        (
            "no remote write right",
            Box::new(|p: &mut Pair| {
                let ro = p.b.mem.register(PD, Access::REMOTE_READ, 0, 64);
                let src = p.a.mem.register(PD, Access::NONE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: 0,
                        rkey: ro,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: src,
                    }],
                )
            }),
            TermCode::DdpTaggedInvalidStag,
        ),
        (
            "out of bounds",
            Box::new(|p: &mut Pair| {
                let t = p.b.mem.register(PD, Access::REMOTE_WRITE, 0x1000, 64);
                let src = p.a.mem.register(PD, Access::NONE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: 0x1000 + 32,
                        rkey: t,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: src,
                    }],
                )
            }),
            TermCode::DdpTaggedBaseBounds,
        ),
        (
            "offset wraps",
            Box::new(|p: &mut Pair| {
                let t = p.b.mem.register(PD, Access::REMOTE_WRITE, 0x1000, 64);
                let src = p.a.mem.register(PD, Access::NONE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: u64::MAX - 8,
                        rkey: t,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: src,
                    }],
                )
            }),
            TermCode::DdpTaggedBaseBounds,
        ),
    ];
    for (name, setup, want) in cases {
        let (sent, recvd, wcs, p) = remote_violation(setup);
        assert_eq!(sent, code(want), "{name}: terminate sent by target");
        assert_eq!(recvd, code(want), "{name}: terminate received by initiator");
        // The Write completed when it was handed to TCP, before the
        // Terminate came back; the Read behind it is flushed.
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status),
            (1, WcStatus::Success),
            "{name}: {wcs:?}"
        );
        let last = wcs.last().expect("an error completion");
        assert_eq!(
            (last.wr_id, last.status),
            (99, WcStatus::WrFlushErr),
            "{name}: {wcs:?}"
        );
        let _ = p;
    }
}

#[test]
fn read_violations_terminate_with_rdmap_codes_and_fail_the_read() {
    let cases: Vec<Case> = vec![
        (
            "invalid stag",
            Box::new(|p: &mut Pair| {
                let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaRead {
                        remote_addr: 0,
                        rkey: 0x0bad_0001,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: sink,
                    }],
                )
            }),
            TermCode::RdmapInvalidStag,
        ),
        (
            "no remote read right",
            Box::new(|p: &mut Pair| {
                let wo = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 64);
                let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaRead {
                        remote_addr: 0,
                        rkey: wo,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: sink,
                    }],
                )
            }),
            TermCode::RdmapAccessRights,
        ),
        (
            "pd mismatch",
            Box::new(|p: &mut Pair| {
                let other = p.b.mem.register(PD + 3, Access::REMOTE_READ, 0, 64);
                let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
                send_wr(
                    1,
                    WrOpcode::RdmaRead {
                        remote_addr: 0,
                        rkey: other,
                    },
                    &[Sge {
                        addr: 0,
                        length: 64,
                        lkey: sink,
                    }],
                )
            }),
            TermCode::RdmapStagNotAssociated,
        ),
        (
            "out of bounds",
            Box::new(|p: &mut Pair| {
                let src = p.b.mem.register(PD, Access::REMOTE_READ, 0, 64);
                let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 128);
                send_wr(
                    1,
                    WrOpcode::RdmaRead {
                        remote_addr: 0,
                        rkey: src,
                    },
                    &[Sge {
                        addr: 0,
                        length: 128,
                        lkey: sink,
                    }],
                )
            }),
            TermCode::RdmapBaseBounds,
        ),
    ];
    for (name, setup, want) in cases {
        let (sent, recvd, wcs, _p) = remote_violation(setup);
        assert_eq!(sent, code(want), "{name}");
        assert_eq!(recvd, code(want), "{name}");
        assert_eq!(wcs[0].wr_id, 1);
        assert_eq!(
            wcs[0].status,
            WcStatus::RemAccessErr,
            "{name}: the Read fails"
        );
        assert_eq!(
            (wcs[1].wr_id, wcs[1].status),
            (99, WcStatus::WrFlushErr),
            "{name}"
        );
    }
}

#[test]
fn too_many_outstanding_reads_is_refused() {
    // The initiator ignores the responder's IRD (as a broken peer would).
    let mut p = Pair::new(6, Link::default());
    p.b = Peer::new();
    p.b.eng.establish(LinkParams {
        crc: true,
        markers_tx: false,
        markers_rx: false,
        mulpdu: 1460,
        ird: 1,
        ord: 1,
    });
    let src = p.b.mem.register(PD, Access::REMOTE_READ, 0, 1 << 20);
    let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 1 << 20);
    for k in 0..4 {
        p.a.eng
            .post_send(send_wr(
                k,
                WrOpcode::RdmaRead {
                    remote_addr: 0,
                    rkey: src,
                },
                &[Sge {
                    addr: 0,
                    length: 1 << 18,
                    lkey: sink,
                }],
            ))
            .unwrap();
    }
    // Deliver all four Read Requests before b gets a chance to answer.
    let mut f = TxFrame::default();
    assert!(p.a.eng.poll_transmit(&mut f, 1 << 20, &p.a.mem));
    p.a.frame = f;
    let bytes = p.a.flatten();
    p.a.eng.confirm_transmit();
    p.b.eng.handle_input(&bytes, &p.b.mem);
    p.b.drain();
    assert_eq!(term_sent(&p.b), code(TermCode::RdmapCatastrophicStream));
    p.run();
    assert_eq!(term_received(&p.a), code(TermCode::RdmapCatastrophicStream));
    assert_eq!(p.a.wcs.len(), 4);
    assert_eq!(p.a.wcs[0].status, WcStatus::RemInvReqErr);
    assert!(p.a.wcs[1..]
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr));
}

#[test]
fn send_without_posted_receive_is_fatal() {
    let mut p = Pair::new(12, Link::default());
    let src = p.a.mem.register(PD, Access::NONE, 0, 8);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: src,
            }],
        ))
        .unwrap();
    p.a.eng
        .post_send(send_wr(
            2,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: src,
            }],
        ))
        .unwrap();
    let rsrc = p.b.mem.register(PD, Access::REMOTE_READ, 0, 8);
    let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 8);
    p.a.eng
        .post_send(send_wr(
            3,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: rsrc,
            },
            &[Sge {
                addr: 0,
                length: 8,
                lkey: sink,
            }],
        ))
        .unwrap();
    p.run();
    assert_eq!(term_sent(&p.b), code(TermCode::DdpUntaggedNoBuffer));
    assert_eq!(term_received(&p.a), code(TermCode::DdpUntaggedNoBuffer));
    assert_eq!(p.a.eng.state(), QpState::Error);
    // The Sends completed when handed to TCP (as in siw: iWARP has no
    // receiver-not-ready retry); the Read behind them is flushed.
    let last = p.a.wcs.last().expect("completions");
    assert_eq!(
        (last.wr_id, last.status),
        (3, WcStatus::WrFlushErr),
        "{:?}",
        p.a.wcs
    );
    // Work posted in the error state is flushed, not refused (siw
    // `siw_sq_flush_wr`).
    let before = p.a.wcs.len();
    p.a.eng.post_send(send_wr(4, WrOpcode::Send, &[])).unwrap();
    p.a.drain();
    let flushed: Vec<_> = p.a.wcs[before..]
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(flushed, vec![(4, WcStatus::WrFlushErr)]);
}

#[test]
fn send_longer_than_receive_buffer() {
    let mut p = Pair::new(13, Link::default());
    let dst = p.b.mem.register(PD, Access::LOCAL_WRITE, 0, 16);
    p.b.eng
        .post_recv(recv_wr(
            1,
            &[Sge {
                addr: 0,
                length: 16,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.b.eng
        .post_recv(recv_wr(
            2,
            &[Sge {
                addr: 0,
                length: 16,
                lkey: dst,
            }],
        ))
        .unwrap();
    let src = p.a.mem.register(PD, Access::NONE, 0, 64);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 64,
                lkey: src,
            }],
        ))
        .unwrap();
    p.run();
    assert_eq!(term_sent(&p.b), code(TermCode::DdpUntaggedTooLong));
    let st: Vec<_> = p.b.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn crc_error_is_detected_and_terminates() {
    let mut p = Pair::new(14, Link::default());
    let dst = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 4096);
    let src = p.a.mem.register(PD, Access::NONE, 0, 4096);
    p.a.mem.fill(src, &pattern(4096, 5));
    p.corrupt_ab_at = Some(100);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: dst,
            },
            &[Sge {
                addr: 0,
                length: 4096,
                lkey: src,
            }],
        ))
        .unwrap();
    p.run();
    assert_eq!(term_sent(&p.b), code(TermCode::MpaCrcError));
    assert_eq!(term_received(&p.a), code(TermCode::MpaCrcError));
}

#[test]
fn without_crc_a_corrupted_header_is_still_caught_or_harmless() {
    // With CRC off only header checks protect the stream; corrupting the
    // ULPDU length must end in an error, never a panic or a hang.
    for at in [0usize, 1, 3] {
        let mut p = Pair::new(
            15,
            Link {
                crc: false,
                ..Link::default()
            },
        );
        let dst = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 4096);
        let src = p.a.mem.register(PD, Access::NONE, 0, 4096);
        p.corrupt_ab_at = Some(at);
        p.a.eng
            .post_send(send_wr(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: dst,
                },
                &[Sge {
                    addr: 0,
                    length: 4096,
                    lkey: src,
                }],
            ))
            .unwrap();
        p.run();
        assert_eq!(
            p.b.eng.state(),
            QpState::Error,
            "corruption at byte {at} detected"
        );
    }
}

#[test]
fn lost_bytes_break_framing_and_are_detected() {
    for (lo, hi) in [(10usize, 11usize), (1500, 1700), (3, 40)] {
        let mut p = Pair::new(16, Link::default());
        let dst = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 20_000);
        let src = p.a.mem.register(PD, Access::NONE, 0, 20_000);
        p.drop_ab = Some((lo, hi));
        p.a.eng
            .post_send(send_wr(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: dst,
                },
                &[Sge {
                    addr: 0,
                    length: 20_000,
                    lkey: src,
                }],
            ))
            .unwrap();
        p.run();
        assert_eq!(
            p.b.eng.state(),
            QpState::Error,
            "loss of {lo}..{hi} detected"
        );
        assert!(term_sent(&p.b).is_some());
    }
}

#[test]
fn peer_close_flushes_everything() {
    let mut p = Pair::new(17, Link::default());
    let dst = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
    p.a.eng
        .post_recv(recv_wr(
            1,
            &[Sge {
                addr: 0,
                length: 64,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.a.eng
        .post_recv(recv_wr(
            2,
            &[Sge {
                addr: 0,
                length: 64,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.a.eng
        .post_send(send_wr(
            3,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0x100,
            },
            &[Sge {
                addr: 0,
                length: 64,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.a.eng.post_send(send_wr(4, WrOpcode::Send, &[])).unwrap();
    // The Read goes out; then the connection dies before any answer.
    let mut f = TxFrame::default();
    p.a.eng.poll_transmit(&mut f, 1, &p.a.mem);
    p.a.eng.confirm_transmit();
    p.a.eng.on_peer_closed();
    p.a.drain();
    let mut ids: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    ids.sort_by_key(|x| x.0);
    assert_eq!(
        ids,
        vec![
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert!(p.a.events.contains(&EngineEvent::PeerClosed));
    assert!(p.a.eng.wants_close());
    assert!(!p.a.eng.has_transmit());
}

/// Linux siw `siw_post_send` / `siw_post_receive` in the ERROR state
/// (`siw_sq_flush_wr`, `siw_rq_flush_wr`): every posted request completes
/// at once with a flush status, the send queue's even when unsignaled, each
/// with its own opcode and no bytes; `ib_drain_qp` relies on it. Our Closed
/// state (after `rdma_disconnect`, which moves an iWARP QP to ERROR) does
/// the same.
#[test]
fn posts_in_the_error_state_complete_at_once_with_wr_flush_err() {
    for closed in [false, true] {
        let mut p = Pair::new(40, Link::default());
        let m = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
        let sge = [Sge {
            addr: 0,
            length: 64,
            lkey: m,
        }];
        if closed {
            p.a.eng.close();
            assert_eq!(p.a.eng.state(), QpState::Closed);
        } else {
            p.a.eng.on_peer_closed();
            assert_eq!(p.a.eng.state(), QpState::Error);
        }
        p.a.drain();
        assert!(p.a.wcs.is_empty(), "nothing was outstanding: {:?}", p.a.wcs);
        let mut unsignaled_write = send_wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x100,
            },
            &sge,
        );
        unsignaled_write.signaled = false;
        let mut unsignaled_send = send_wr(5, WrOpcode::Send, &sge);
        unsignaled_send.signaled = false;
        p.a.eng.post_send(send_wr(1, WrOpcode::Send, &sge)).unwrap();
        p.a.eng.post_send(unsignaled_write).unwrap();
        p.a.eng.post_recv(recv_wr(3, &sge)).unwrap();
        p.a.eng
            .post_send(send_wr(
                4,
                WrOpcode::RdmaRead {
                    remote_addr: 0,
                    rkey: 0x100,
                },
                &sge,
            ))
            .unwrap();
        p.a.eng.post_send(unsignaled_send).unwrap();
        // More than the queue depths: nothing stays queued.
        for i in 0..100 {
            p.a.eng
                .post_send(send_wr(100 + i, WrOpcode::Send, &sge))
                .unwrap();
            p.a.eng.post_recv(recv_wr(200 + i, &sge)).unwrap();
        }
        p.a.drain();
        let got: Vec<_> = p.a.wcs[..5]
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.queue, w.byte_len))
            .collect();
        use WcOpcode as O;
        use WcQueue as Q;
        let f = WcStatus::WrFlushErr;
        assert_eq!(
            got,
            vec![
                (1, f, O::Send, Q::Send, 0),
                (2, f, O::RdmaWrite, Q::Send, 0),
                (3, f, O::Recv, Q::Recv, 0),
                (4, f, O::RdmaRead, Q::Send, 0),
                (5, f, O::Send, Q::Send, 0),
            ],
            "closed: {closed}"
        );
        assert_eq!(p.a.wcs.len(), 205);
        assert!(p.a.wcs.iter().all(|w| w.status == f));
        assert!(!p.a.eng.has_transmit(), "a flushed request sends nothing");
    }
}

/// A request posted in the error state completes after the send-queue
/// requests ahead of it: behind a Send whose frame the driver is still
/// writing (its completion waits for `confirm_transmit`), in posting order.
/// Those waiting requests still occupy the send queue.
#[test]
fn a_post_in_the_error_state_completes_behind_a_send_still_in_flight() {
    let mut p = Pair::new(41, Link::default());
    let src = p.b.mem.register(PD, Access::NONE, 0, 8);
    let sge = [Sge {
        addr: 0,
        length: 8,
        lkey: src,
    }];
    p.b.eng.post_send(send_wr(7, WrOpcode::Send, &sge)).unwrap();
    let mut f = TxFrame::default();
    assert!(p.b.eng.poll_transmit(&mut f, 1 << 16, &p.b.mem));
    // a Write to an STag b never registered: b terminates while its Send
    // is still being written.
    let asrc = p.a.mem.register(PD, Access::NONE, 0, 8);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x7777_7701,
            },
            &[Sge {
                addr: 0,
                length: 8,
                lkey: asrc,
            }],
        ))
        .unwrap();
    let mut af = TxFrame::default();
    p.a.eng.poll_transmit(&mut af, 1 << 16, &p.a.mem);
    p.a.frame = af;
    let bytes = p.a.flatten();
    p.b.eng.handle_input(&bytes, &p.b.mem);
    assert_eq!(p.b.eng.state(), QpState::Error);
    let mut unsignaled = send_wr(8, WrOpcode::Send, &sge);
    unsignaled.signaled = false;
    p.b.eng.post_send(unsignaled).unwrap();
    p.b.drain();
    assert!(p.b.wcs.is_empty(), "waits behind the Send: {:?}", p.b.wcs);
    // The send queue (depth 64) holds the Send in flight and the flushed
    // request behind it.
    for i in 0..62 {
        p.b.eng
            .post_send(send_wr(10 + i, WrOpcode::Send, &sge))
            .unwrap();
    }
    assert_eq!(
        p.b.eng.post_send(send_wr(99, WrOpcode::Send, &sge)),
        Err(PostError::QueueFull { wr_id: 99 })
    );
    p.b.eng.confirm_transmit();
    p.b.drain();
    let st: Vec<_> = p.b.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let mut want = vec![(7, WcStatus::Success), (8, WcStatus::WrFlushErr)];
    want.extend((0..62).map(|i| (10 + i, WcStatus::WrFlushErr)));
    assert_eq!(st, want);
    // The queue is empty again.
    p.b.eng
        .post_send(send_wr(100, WrOpcode::Send, &sge))
        .unwrap();
}

/// Before the connection exists (`Init`) nothing is flushed: receives are
/// queued for the first Sends, and so are sends, which leave once the QP is
/// established. (Linux siw refuses a send before RTS with `ENOTCONN`; this
/// provider queues it.)
#[test]
fn posts_before_the_connection_wait_for_it() {
    let mut p = Pair::new(42, Link::default());
    let mut a = Peer::new();
    let m = a.mem.register(PD, Access::LOCAL_WRITE, 0, 8);
    let sge = [Sge {
        addr: 0,
        length: 8,
        lkey: m,
    }];
    assert_eq!(a.eng.state(), QpState::Init);
    a.eng.post_recv(recv_wr(1, &sge)).unwrap();
    a.eng.post_send(send_wr(2, WrOpcode::Send, &sge)).unwrap();
    a.drain();
    assert!(a.wcs.is_empty(), "{:?}", a.wcs);
    assert_eq!(a.eng.recv_queue_len(), 1);
    let dst = p.b.mem.register(PD, Access::LOCAL_WRITE, 0, 8);
    p.b.eng
        .post_recv(recv_wr(
            3,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: dst,
            }],
        ))
        .unwrap();
    a.eng.establish(LinkParams {
        crc: true,
        markers_tx: false,
        markers_rx: false,
        mulpdu: 1460,
        ird: 8,
        ord: 8,
    });
    p.a = a;
    p.run();
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(2, WcStatus::Success)]);
    let st: Vec<_> = p.b.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(3, WcStatus::Success)]);
}

#[test]
fn local_protection_error_completes_with_loc_prot_err() {
    let mut p = Pair::new(18, Link::default());
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: 0x999,
            }],
        ))
        .unwrap();
    p.run();
    assert_eq!(
        (p.a.wcs[0].wr_id, p.a.wcs[0].status),
        (1, WcStatus::LocProtErr)
    );
    assert_eq!(p.a.eng.state(), QpState::Error);
    assert!(
        term_received(&p.b).is_some(),
        "the peer is told the stream is over"
    );
}

#[test]
fn malformed_headers_terminate() {
    use iwarp_proto::wire::{crc, mpa};
    // (ulpdu bytes, expected code)
    let tagged_v2 = {
        let mut u = vec![0u8; 14];
        u[0] = 0x80 | 0x40 | 0x02; // T, L, DV=2
        u[1] = 0x40; // RV=1, Write
        u
    };
    let bad_rdmap_version = {
        let mut u = vec![0u8; 14];
        u[0] = 0xc1;
        u[1] = 0x80; // RV=2
        u
    };
    let unknown_opcode = {
        let mut u = vec![0u8; 18];
        u[0] = 0x41;
        u[1] = 0x4c; // opcode 12
        u
    };
    let untagged_write = {
        let mut u = vec![0u8; 18];
        u[0] = 0x41;
        u[1] = 0x40;
        u
    };
    let cases = [
        (tagged_v2, TermCode::DdpTaggedInvalidVersion),
        (bad_rdmap_version, TermCode::RdmapInvalidVersion),
        (unknown_opcode, TermCode::RdmapUnexpectedOpcode),
        (untagged_write, TermCode::RdmapUnexpectedOpcode),
    ];
    for (ulpdu, want) in cases {
        let mut b = Peer::new();
        b.eng.establish(LinkParams {
            crc: true,
            markers_tx: false,
            markers_rx: false,
            mulpdu: 1460,
            ird: 1,
            ord: 1,
        });
        let mut fpdu = Vec::new();
        mpa::emit_fpdu(&ulpdu, true, &mut fpdu);
        // Feed one byte at a time: the worst split.
        for byte in &fpdu {
            b.eng.handle_input(std::slice::from_ref(byte), &b.mem);
        }
        b.drain();
        assert_eq!(term_sent(&b), code(want));
        let _ = crc::crc32c(&[]);
    }
    // A ULPDU length shorter than the header it announces.
    let mut b = Peer::new();
    b.eng.establish(LinkParams {
        crc: false,
        markers_tx: false,
        markers_rx: false,
        mulpdu: 1460,
        ird: 1,
        ord: 1,
    });
    b.eng
        .handle_input(&[0x00, 0x05, 0xc1, 0x40, 0, 0, 0, 0], &b.mem);
    b.drain();
    assert_eq!(term_sent(&b), code(TermCode::MpaInvalidUlpduLen));
}

#[test]
fn terminate_frames_decode_with_copied_headers() {
    // The Terminate b sends for a bad Write carries the Write's DDP header.
    let mut p = Pair::new(22, Link::default());
    let src = p.a.mem.register(PD, Access::NONE, 0, 64);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x1234,
                rkey: 0xabcd_ef01,
            },
            &[Sge {
                addr: 0,
                length: 64,
                lkey: src,
            }],
        ))
        .unwrap();
    let mut f = TxFrame::default();
    p.a.eng.poll_transmit(&mut f, 1 << 16, &p.a.mem);
    p.a.frame = f;
    let bytes = p.a.flatten();
    p.b.eng.handle_input(&bytes, &p.b.mem);
    let mut tf = TxFrame::default();
    assert!(p.b.eng.poll_transmit(&mut tf, 1 << 16, &p.b.mem));
    p.b.frame = tf;
    let term = p.b.flatten();
    use iwarp_proto::wire::{ddp, mpa, rdmap, terminate};
    let mpa::Deframe::Frame { ulpdu, consumed } = mpa::deframe(&term, true).expect("valid FPDU")
    else {
        panic!("complete FPDU expected")
    };
    assert_eq!(consumed, term.len());
    let d = ddp::Packet::new_checked(ulpdu).unwrap();
    assert_eq!(rdmap::ctrl_opcode(d.ulp_ctrl()), rdmap::Opcode::Terminate);
    assert_eq!((d.qn(), d.msn(), d.mo(), d.last()), (2, 1, 0, true));
    let t = terminate::Packet::new_checked(d.payload()).unwrap();
    let r = terminate::TerminateRepr::parse(&t).unwrap();
    assert_eq!(r.code, TermCode::DdpTaggedInvalidStag);
    let copied = ddp::Packet::new_checked(r.ddp_hdr.expect("DDP header copied")).unwrap();
    assert_eq!((copied.stag(), copied.to()), (0xabcd_ef01, 0x1234));
    assert!(p.b.eng.wants_close());
}

mod random_traffic {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Send(usize),
        Write(usize, usize),
        Read(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..5000).prop_map(Op::Send),
            (0usize..6000, 0usize..2000).prop_map(|(l, o)| Op::Write(l, o)),
            (0usize..6000, 0usize..2000).prop_map(|(l, o)| Op::Read(l, o)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Any mix of operations over any link setting and any split of the
        /// stream completes successfully, in order, with the right bytes.
        #[test]
        fn any_traffic_arrives_intact(
            ops in proptest::collection::vec(op(), 1..24),
            seed in 1u64..u64::MAX,
            crc in any::<bool>(),
            markers in any::<bool>(),
            mulpdu in 64u32..9000,
            ord in 1u32..4,
        ) {
            let link = Link { crc, markers, mulpdu, ird: ord, ord };
            let mut p = Pair::new(seed, link);
            p.max_chunk = 1 + seed % 4000;
            const SZ: usize = 8192;
            let a_src = p.a.mem.register(PD, Access::LOCAL_WRITE, 0x1_0000, SZ);
            p.a.mem.fill(a_src, &pattern(SZ, (seed % 251) as u8));
            let b_mem = p.b.mem.register(PD, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ, 0x8_0000, SZ);
            p.b.mem.fill(b_mem, &pattern(SZ, 200));
            let a_sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0x4_0000, SZ * ops.len());
            let b_rq = p.b.mem.register(PD, Access::LOCAL_WRITE, 0, SZ * ops.len());
            let mut expect_b_recv = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let i64_ = i as u64;
                match *op {
                    Op::Send(len) => {
                        p.b.eng.post_recv(recv_wr(i64_, &[Sge { addr: (i * SZ) as u64, length: SZ as u32, lkey: b_rq }])).unwrap();
                        p.a.eng.post_send(send_wr(i64_, WrOpcode::Send, &[Sge { addr: 0x1_0000, length: len as u32, lkey: a_src }])).unwrap();
                        expect_b_recv.push((i64_, len));
                    }
                    Op::Write(len, off) => {
                        let len = len.min(SZ - off);
                        p.a.eng.post_send(send_wr(i64_, WrOpcode::RdmaWrite { remote_addr: 0x8_0000 + off as u64, rkey: b_mem }, &[Sge { addr: 0x1_0000, length: len as u32, lkey: a_src }])).unwrap();
                    }
                    Op::Read(len, off) => {
                        let len = len.min(SZ - off);
                        p.a.eng.post_send(send_wr(i64_, WrOpcode::RdmaRead { remote_addr: 0x8_0000 + off as u64, rkey: b_mem }, &[Sge { addr: 0x4_0000 + (i * SZ) as u64, length: len as u32, lkey: a_sink }])).unwrap();
                    }
                }
            }
            p.run();
            prop_assert!(p.a.events.is_empty() && p.b.events.is_empty(), "{:?} {:?}", p.a.events, p.b.events);
            let ids: Vec<u64> = p.a.wcs.iter().map(|w| w.wr_id).collect();
            prop_assert_eq!(ids, (0..ops.len() as u64).collect::<Vec<_>>());
            prop_assert!(p.a.wcs.iter().all(|w| w.status == WcStatus::Success));
            let got: Vec<(u64, usize)> = p.b.wcs.iter().map(|w| (w.wr_id, w.byte_len as usize)).collect();
            prop_assert_eq!(got, expect_b_recv);
            // Replay the writes on a model of b's region to check reads.
            let src = pattern(SZ, (seed % 251) as u8);
            let mut model = pattern(SZ, 200);
            let sink = p.a.mem.contents(a_sink);
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Op::Write(len, off) => {
                        let len = len.min(SZ - off);
                        model[off..off + len].copy_from_slice(&src[..len]);
                    }
                    Op::Read(len, off) => {
                        let len = len.min(SZ - off);
                        let at = i * SZ;
                        // RFC 5040 §5.5: a Write posted after a Read may be
                        // placed before the Read Response is generated
                        // (verbs needs a fence to order them), so only
                        // reads no later Write overlaps are deterministic.
                        let overtaken = ops[i + 1..].iter().any(|later| match *later {
                            Op::Write(wl, wo) => {
                                let wl = wl.min(SZ - wo);
                                wo < off + len && off < wo + wl
                            }
                            _ => false,
                        });
                        if !overtaken {
                            prop_assert!(sink[at..at + len] == model[off..off + len], "read {} content", i);
                        }
                    }
                    Op::Send(len) => {
                        let got = p.b.mem.contents(b_rq);
                        prop_assert!(got[i * SZ..i * SZ + len] == src[..len], "send {} content", i);
                    }
                }
            }
            prop_assert!(p.b.mem.contents(b_mem) == model, "final target region");
        }
    }
}

#[test]
fn terminate_is_charged_to_an_unconfirmed_write() {
    // If the Terminate arrives before the driver confirmed the Write's
    // transmission, the Write itself completes with the remote error.
    let mut p = Pair::new(23, Link::default());
    let src = p.a.mem.register(PD, Access::NONE, 0, 64);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x0bad_0001,
            },
            &[Sge {
                addr: 0,
                length: 64,
                lkey: src,
            }],
        ))
        .unwrap();
    let mut f = TxFrame::default();
    p.a.eng.poll_transmit(&mut f, 1 << 16, &p.a.mem);
    p.a.frame = f;
    let bytes = p.a.flatten();
    p.b.eng.handle_input(&bytes, &p.b.mem);
    let mut tf = TxFrame::default();
    p.b.eng.poll_transmit(&mut tf, 1 << 16, &p.b.mem);
    p.b.frame = tf;
    let term = p.b.flatten();
    p.a.eng.handle_input(&term, &p.a.mem);
    p.a.eng.confirm_transmit();
    p.a.drain();
    assert_eq!(p.a.wcs.len(), 1);
    assert_eq!(
        (p.a.wcs[0].wr_id, p.a.wcs[0].status),
        (1, WcStatus::RemAccessErr)
    );
}

#[test]
fn a_send_being_written_when_the_qp_fails_completes_once_written() {
    // b's Send is handed to the driver; before the driver confirms the
    // write, a Terminate from a arrives. The Send was delivered, so once
    // the driver confirms, it completes successfully; only later work is
    // flushed.
    let mut p = Pair::new(24, Link::default());
    let src = p.b.mem.register(PD, Access::NONE, 0, 8);
    let dst = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 8);
    p.a.eng
        .post_recv(recv_wr(
            1,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: dst,
            }],
        ))
        .unwrap();
    p.b.eng
        .post_send(send_wr(
            7,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: src,
            }],
        ))
        .unwrap();
    p.b.eng
        .post_send(send_wr(
            8,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 1,
            },
            &[],
        ))
        .unwrap();
    let mut f = TxFrame::default();
    assert!(
        p.b.eng.poll_transmit(&mut f, 1, &p.b.mem),
        "the Send is handed out"
    );
    // a sends a Write to a bad STag; b terminates.
    let asrc = p.a.mem.register(PD, Access::NONE, 0, 8);
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x7777_7701,
            },
            &[Sge {
                addr: 0,
                length: 8,
                lkey: asrc,
            }],
        ))
        .unwrap();
    let mut af = TxFrame::default();
    p.a.eng.poll_transmit(&mut af, 1 << 16, &p.a.mem);
    p.a.frame = af;
    let bytes = p.a.flatten();
    p.b.eng.handle_input(&bytes, &p.b.mem);
    p.b.drain();
    assert_eq!(term_sent(&p.b), code(TermCode::DdpTaggedInvalidStag));
    assert!(
        p.b.wcs.is_empty(),
        "the Send in flight is not flushed: {:?}",
        p.b.wcs
    );
    p.b.eng.confirm_transmit();
    p.b.drain();
    let st: Vec<_> = p.b.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(7, WcStatus::Success), (8, WcStatus::WrFlushErr)]);
}

#[test]
fn a_send_in_flight_is_flushed_if_the_connection_dies() {
    let mut p = Pair::new(25, Link::default());
    let src = p.b.mem.register(PD, Access::NONE, 0, 8);
    p.b.eng
        .post_send(send_wr(
            7,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 8,
                lkey: src,
            }],
        ))
        .unwrap();
    let mut f = TxFrame::default();
    assert!(p.b.eng.poll_transmit(&mut f, 1 << 16, &p.b.mem));
    p.b.eng.on_peer_closed();
    p.b.drain();
    let st: Vec<_> = p.b.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(7, WcStatus::WrFlushErr)]);
}

/// The application may close its QP as soon as it sees `TerminateSent`,
/// before the driver has written the Terminate: the Terminate still goes
/// out, and the peer learns why its request failed.
#[test]
fn closing_right_after_an_error_still_sends_the_terminate() {
    let mut p = Pair::new(21, Link::default());
    let src = p.a.mem.register(PD, Access::NONE, 0, 64);
    // A Write to an STag B never registered.
    p.a.eng
        .post_send(send_wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x0bad_0100,
            },
            &[Sge {
                addr: 0,
                length: 64,
                lkey: src,
            }],
        ))
        .unwrap();
    // Move A's frame to B by hand, then let B detect the violation.
    let out = Pair::transmit(&mut p.a, &mut p.wire_ab, 70_000);
    assert!(!out.is_empty());
    assert_eq!(p.b.eng.handle_input(&out, &p.b.mem), out.len());
    p.b.drain();
    assert_eq!(term_sent(&p.b), code(TermCode::DdpTaggedInvalidStag));
    // B's application closes before B's driver transmitted anything.
    p.b.eng.close();
    assert!(p.b.eng.has_transmit(), "the Terminate is still queued");
    assert!(
        !p.b.eng.wants_close(),
        "the stream stays open until it leaves"
    );
    p.run();
    assert_eq!(term_received(&p.a), code(TermCode::DdpTaggedInvalidStag));
    assert!(p.b.eng.wants_close());
}

#[test]
fn the_liveness_probe_takes_an_ord_slot_but_no_send_queue_slot_and_no_completion() {
    // ORD 1: the probe (a zero-length Read, STag 0) holds the only ORD
    // slot while outstanding, so the application's Read waits behind it.
    let link = Link {
        ord: 1,
        ird: 1,
        ..Link::default()
    };
    let mut p = Pair::new(11, link);
    let src = p.b.mem.register(PD, Access::REMOTE_READ, 0, 64);
    p.b.mem.fill(src, &pattern(64, 3));
    let sink = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
    assert!(p.a.eng.post_probe(999));
    assert_eq!(p.a.eng.reads_outstanding(), 0, "queued, not yet sent");
    // The application still gets its whole send queue (64 entries).
    p.a.eng
        .post_send(send_wr(
            0,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: src,
            },
            &[Sge {
                addr: 0,
                length: 64,
                lkey: sink,
            }],
        ))
        .unwrap();
    for k in 1..64 {
        let wr = send_wr(
            k,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            &[],
        );
        p.a.eng.post_send(wr).unwrap();
    }
    let full = send_wr(64, WrOpcode::Send, &[]);
    assert!(matches!(
        p.a.eng.post_send(full),
        Err(PostError::QueueFull { .. })
    ));
    p.run();
    let ids: Vec<u64> = p.a.wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (0..64).collect::<Vec<_>>(),
        "no completion for the probe"
    );
    assert!(p.a.wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_same(
        &p.a.mem.contents(sink),
        &pattern(64, 3),
        "read after the probe",
    );
    assert_eq!(p.a.eng.reads_outstanding(), 0);
    assert!(term_sent(&p.b).is_none() && term_sent(&p.a).is_none());

    // A probe flushed by the connection's end completes nothing either.
    assert!(p.a.eng.post_probe(999));
    p.a.eng.on_peer_closed();
    p.a.drain();
    assert_eq!(p.a.wcs.len(), 64, "the flushed probe reached the CQ");
}

#[test]
fn the_wake_up_nudge_is_a_zero_length_write_that_changes_nothing_at_either_end() {
    let mut p = Pair::new(12, Link::default());
    let sink = p.b.mem.register(PD, Access::REMOTE_WRITE, 0, 64);
    p.b.mem.fill(sink, &pattern(64, 9));
    assert!(p.a.eng.post_nudge(999));
    // On the wire: one FPDU, an RDMA Write (RDMAP opcode 0) in a tagged,
    // last DDP segment with STag 0, offset 0 and no payload (RFC 6581 §5,
    // the write-form ready-to-receive message).
    let out = Pair::transmit(&mut p.a, &mut p.wire_ab, 70_000);
    let ulpdu_len = usize::from(u16::from_be_bytes([out[0], out[1]]));
    let seg = iwarp_proto::wire::ddp::Packet::new_checked(&out[2..2 + ulpdu_len]).unwrap();
    assert!(seg.tagged() && seg.last());
    assert_eq!((seg.ulp_ctrl() & 0x0f, seg.stag(), seg.to()), (0, 0, 0));
    assert!(seg.payload().is_empty());
    assert_eq!(p.b.eng.handle_input(&out, &p.b.mem), out.len());
    p.b.drain();
    // The application's whole send queue is still free (64 entries).
    for k in 0..64 {
        p.a.eng
            .post_send(send_wr(k, WrOpcode::Send, &[]))
            .unwrap_or_else(|e| panic!("send {k} refused behind the nudge: {e:?}"));
    }
    for k in 0..64 {
        p.b.eng.post_recv(recv_wr(k, &[])).unwrap();
    }
    p.run();
    let ids: Vec<u64> = p.a.wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (0..64).collect::<Vec<_>>(),
        "no completion for the nudge"
    );
    assert_eq!(p.b.wcs.len(), 64, "the receiver completed only the Sends");
    assert_same(&p.b.mem.contents(sink), &pattern(64, 9), "nothing placed");
    assert!(term_sent(&p.b).is_none() && term_sent(&p.a).is_none());
    assert_eq!(p.b.eng.state(), QpState::Rts);

    // A nudge and a probe outstanding together are both the driver's: no
    // completion for either, and the send queue accounting returns to zero.
    assert!(p.a.eng.post_nudge(999));
    assert!(p.a.eng.post_probe(999));
    p.run();
    assert_eq!(p.a.wcs.len(), 64);
    for k in 100..164 {
        p.a.eng.post_send(send_wr(k, WrOpcode::Send, &[])).unwrap();
    }
}

/// RFC 5044 §7.1.2: a Responder that holds its transmit sends nothing
/// (its posted Send waits) until the Initiator's first FPDU arrives, then
/// everything flows as usual.
#[test]
fn a_held_responder_sends_nothing_before_the_initiators_first_fpdu() {
    let mut p = Pair::new(10, Link::default());
    // b is the responder: it wants to speak first.
    p.b.eng.hold_transmit_until_input();
    assert!(p.b.eng.transmit_held());
    let a_buf = p.a.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
    p.a.eng
        .post_recv(recv_wr(
            7,
            &[Sge {
                addr: 0,
                length: 64,
                lkey: a_buf,
            }],
        ))
        .unwrap();
    let b_src = p.b.mem.register(PD, Access::LOCAL_WRITE, 0, 64);
    p.b.mem.write(b_src, 0, b"responder first").unwrap();
    p.b.eng
        .post_send(send_wr(
            1,
            WrOpcode::Send,
            &[Sge {
                addr: 0,
                length: 15,
                lkey: b_src,
            }],
        ))
        .unwrap();
    assert!(!p.b.eng.has_transmit(), "held: nothing to transmit");
    p.run();
    assert!(p.a.wcs.is_empty(), "the Send left before any input");
    assert!(p.b.wcs.is_empty());
    // The initiator's first FPDU (here the RFC 6581-style zero-length
    // Write) releases the responder.
    p.a.eng
        .post_send(send_wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            &[],
        ))
        .unwrap();
    p.run();
    assert!(!p.b.eng.transmit_held());
    assert_eq!(
        p.a.wcs
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(2, WcStatus::Success), (7, WcStatus::Success)]
    );
    assert_eq!(p.a.wcs[1].byte_len, 15);
    assert_eq!(p.b.wcs[0].wr_id, 1);
}

/// A Send or Write from one SGE that fits one FPDU takes the transmit
/// path's whole-message shortcut; the same message from two SGEs takes
/// the general segmenting path. The bytes on the wire must be the same
/// (header, payload, pad, CRC, the next message's MSN and stream
/// position), with CRC on and off, for every pad length, and the peer
/// must accept them.
#[test]
fn whole_message_shortcut_frames_match_the_segmenting_path() {
    let ops = [
        (WrOpcode::Send, false),
        (WrOpcode::Send, true),
        (
            WrOpcode::SendWithInv {
                invalidate_rkey: 0x1234_5678,
            },
            false,
        ),
        (
            WrOpcode::RdmaWrite {
                remote_addr: 0x9000,
                rkey: 0x4242_4201,
            },
            false,
        ),
    ];
    for crc in [true, false] {
        for &(opcode, solicited) in &ops {
            for len in (2u32..=9).chain([64, 1000]) {
                let stream = |split: bool| {
                    let mut p = Peer::without_markers(crc);
                    let src = p.mem.register(PD, Access::NONE, 0x100, 1024);
                    p.mem.fill(src, &pattern(1024, len as u8));
                    let sgl: Vec<Sge> = if split {
                        let h = len / 2;
                        vec![
                            Sge {
                                addr: 0x100,
                                length: h,
                                lkey: src,
                            },
                            Sge {
                                addr: 0x100 + h as u64,
                                length: len - h,
                                lkey: src,
                            },
                        ]
                    } else {
                        vec![Sge {
                            addr: 0x100,
                            length: len,
                            lkey: src,
                        }]
                    };
                    // Two messages, so the second shows the MSN and stream
                    // position the first one left.
                    for id in [1, 2] {
                        let mut w = send_wr(id, opcode, &sgl);
                        w.solicited = solicited;
                        p.eng.post_send(w).unwrap();
                    }
                    p.frame.clear();
                    assert!(p.eng.poll_transmit(&mut p.frame, 1 << 20, &p.mem));
                    let bytes = p.flatten();
                    p.eng.confirm_transmit();
                    p.drain();
                    let done: Vec<_> = p.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
                    (bytes, done)
                };
                let (whole, whole_done) = stream(false);
                let (split, split_done) = stream(true);
                let what = format!("{opcode:?} solicited={solicited} len={len} crc={crc}");
                assert_same(&whole, &split, &what);
                assert_eq!(whole_done, split_done, "{what}");
                assert_eq!(
                    whole_done,
                    vec![(1, WcStatus::Success), (2, WcStatus::Success)],
                    "{what}"
                );
            }
        }
    }
}

/// The whole-message shortcut validates its source as the general path
/// does: a bad lkey completes the request with a local protection error
/// and ends the stream with a Terminate.
#[test]
fn whole_message_shortcut_refuses_a_bad_source() {
    let mut p = Peer::without_markers(true);
    let src = p.mem.register(PD, Access::NONE, 0, 64);
    // Past the end of the region.
    p.eng
        .post_send(send_wr(
            7,
            WrOpcode::Send,
            &[Sge {
                addr: 60,
                length: 8,
                lkey: src,
            }],
        ))
        .unwrap();
    p.frame.clear();
    p.eng.poll_transmit(&mut p.frame, 1 << 20, &p.mem);
    p.drain();
    assert_eq!(p.eng.state(), QpState::Error);
    assert_eq!(
        p.wcs
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(7, WcStatus::LocProtErr)]
    );
    assert!(
        p.events
            .iter()
            .any(|e| matches!(e, EngineEvent::TerminateSent(_))),
        "no Terminate: {:?}",
        p.events
    );
}
