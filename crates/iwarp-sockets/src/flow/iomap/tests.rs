//! Iomap tests: two flows through a small simulated link (RDMA Writes land
//! in the peer's memory by rkey, Sends are handed to `on_recv`), plus
//! single flows fed hostile `RS_OP_IOMAP_SGL` words.

use super::super::*;
use super::*;
use crate::wire::{ByteOrder, ConnDataRepr, Iomap, MsgWord, Op, Sge, IOMAP_LEN};

const TGT: u64 = 0x1000_0000;
const RBUF: u64 = 0x2000_0000;
const USER: u64 = 0x3000_0000;

struct Side {
    flow: Flow,
    target: Vec<u8>,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    /// The application buffer this side maps (rkey `key | 3`).
    user: Vec<u8>,
    key: u32,
    /// Bytes of the next `Source::External` Write.
    external: Vec<u8>,
    completions: Vec<SendTag>,
}

enum Wire {
    Write {
        addr: u64,
        rkey: u32,
        bytes: Vec<u8>,
    },
    Send([u8; 4]),
}

fn side(key: u32, order: ByteOrder, iomap: u16) -> Side {
    let mut flow = Flow::new(Config {
        sq_size: 16,
        rq_size: 16,
        sbuf_size: 4096,
        rbuf_size: 8192,
        order,
        target_sgl: Region {
            addr: TGT,
            key: key | 1,
        },
        rbuf: Region {
            addr: RBUF,
            key: key | 2,
        },
        ack_each: false,
    })
    .unwrap();
    flow.set_iomap_size(iomap).unwrap();
    while flow.poll_action().is_some() {}
    Side {
        target: vec![0; flow.target_region_len()],
        flow,
        sbuf: vec![0; 4096],
        rbuf: vec![0; 8192],
        user: vec![0; 4096],
        key,
        external: Vec::new(),
        completions: Vec::new(),
    }
}

fn pair(a: Side, b: Side) -> (Side, Side) {
    let (mut a, mut b) = (a, b);
    let req = a.flow.local_conn_data().to_bytes();
    let rep = b.flow.local_conn_data().to_bytes();
    let mut t = [0u8; TARGET_SGL_LEN];
    t.copy_from_slice(&b.target[..TARGET_SGL_LEN]);
    b.flow
        .establish(&ConnDataRepr::parse_bytes(&req).unwrap(), &mut t)
        .unwrap();
    b.target[..TARGET_SGL_LEN].copy_from_slice(&t);
    t.copy_from_slice(&a.target[..TARGET_SGL_LEN]);
    a.flow
        .establish(&ConnDataRepr::parse_bytes(&rep).unwrap(), &mut t)
        .unwrap();
    a.target[..TARGET_SGL_LEN].copy_from_slice(&t);
    settle(&mut a, &mut b);
    (a, b)
}

/// Takes `s`'s actions off as wire traffic.
fn pump(s: &mut Side) -> Vec<Wire> {
    let mut out = Vec::new();
    while let Some(a) = s.flow.poll_action() {
        match a {
            Action::PostRecv { .. } => {}
            Action::RdmaWrite {
                src,
                remote_addr,
                rkey,
                tag,
            } => {
                let bytes = match src {
                    Source::Empty => Vec::new(),
                    Source::Inline(b) => b.to_vec(),
                    Source::External { len } => s.external.drain(..len as usize).collect(),
                    Source::Sbuf(sp) => {
                        let mut v = Vec::new();
                        for x in [Some(sp.first), sp.second].into_iter().flatten() {
                            v.extend_from_slice(&s.sbuf[x.offset as usize..][..x.len as usize]);
                        }
                        v
                    }
                };
                s.completions.push(tag);
                out.push(Wire::Write {
                    addr: remote_addr,
                    rkey,
                    bytes,
                });
            }
            Action::Send { payload, tag } => {
                s.completions.push(tag);
                out.push(Wire::Send(payload));
            }
        }
    }
    out
}

/// Lands `wire` in `to` as the verbs layer would: a Write outside a
/// registered region is refused (`Err`: the Terminate).
fn land(wire: Vec<Wire>, to: &mut Side) -> Result<(), String> {
    for w in wire {
        match w {
            Wire::Write { addr, rkey, bytes } => {
                if bytes.is_empty() && rkey == 0 {
                    continue; // keepalive
                }
                let (base, mem) = if rkey == to.key | 1 {
                    (TGT, &mut to.target)
                } else if rkey == to.key | 2 {
                    (RBUF, &mut to.rbuf)
                } else if rkey == to.key | 3 {
                    (USER, &mut to.user)
                } else {
                    return Err(format!("invalid STag {rkey:#x}"));
                };
                let off = addr.checked_sub(base).ok_or("write below the region")? as usize;
                let end = off + bytes.len();
                if end > mem.len() {
                    return Err(format!("base/bounds: {off}..{end} of {}", mem.len()));
                }
                mem[off..end].copy_from_slice(&bytes);
            }
            Wire::Send(p) => to.flow.on_recv(&p).map_err(|e| e.to_string())?,
        }
    }
    let table = to.target[TARGET_SGL_LEN..].to_vec();
    to.flow.iomap_refresh(&table);
    Ok(())
}

fn complete(s: &mut Side) {
    for t in std::mem::take(&mut s.completions) {
        s.flow.on_send_complete(t, true).unwrap();
    }
}

fn settle(a: &mut Side, b: &mut Side) {
    for _ in 0..64 {
        let wa = pump(a);
        let wb = pump(b);
        if wa.is_empty() && wb.is_empty() && a.completions.is_empty() && b.completions.is_empty() {
            return;
        }
        land(wa, b).unwrap();
        land(wb, a).unwrap();
        complete(a);
        complete(b);
    }
    panic!("the pair did not settle");
}

/// `riomap` on `s` of `len` bytes of its user buffer from `at`, at `offset`.
fn map(s: &mut Side, at: u64, len: u32, offset: u64) -> u16 {
    let i = s
        .flow
        .map_remote(
            offset,
            Sge {
                addr: USER + at,
                key: s.key | 3,
                length: len,
            },
        )
        .unwrap();
    assert_eq!(push(s), Some(i));
    i
}

/// Sends the next queued entry as the driver does (copy, then post).
fn push(s: &mut Side) -> Option<u16> {
    let g = s.flow.push_iomap()?;
    let mut done = 0;
    for x in [Some(g.spans.first), g.spans.second].into_iter().flatten() {
        let n = x.len as usize;
        s.sbuf[x.offset as usize..][..n].copy_from_slice(&g.bytes[done..done + n]);
        done += n;
    }
    Some(g.index)
}

/// `riowrite` of `data` at `offset` from `s`: every piece.
fn riowrite(s: &mut Side, data: &[u8], offset: u64) -> Result<(), IomapError> {
    s.flow.check_direct(offset, data.len() as u64)?;
    let mut done = 0;
    while done < data.len() {
        let n = s
            .flow
            .write_direct(offset + done as u64, (data.len() - done) as u64)?
            as usize;
        s.external.extend_from_slice(&data[done..done + n]);
        done += n;
    }
    Ok(())
}

#[test]
fn conn_data_advertises_the_table_and_its_size_rounds_like_rsocket_c() {
    let s = side(0xA0, ByteOrder::Little, 3);
    let cd = s.flow.local_conn_data();
    assert!(cd.iomap);
    assert_eq!(cd.target_iomap_size, 3);
    assert_eq!(s.flow.target_region_len(), 32 + 3 * 24);
    let bytes = cd.to_bytes();
    assert_eq!(bytes[1], crate::wire::CONN_FLAG_IOMAP);
    assert_eq!(bytes[7], 3, "target_iomap_size, scaled");

    let mut f = Flow::new(Config::default()).unwrap();
    assert_eq!(f.set_iomap_size(128).unwrap(), 128);
    assert_eq!(
        f.set_iomap_size(300).unwrap(),
        256,
        "multiples of 256 above 128"
    );
    assert_eq!(f.set_iomap_size(u16::MAX).unwrap(), IOMAP_SIZE_MAX);
    assert_eq!(f.set_iomap_size(0).unwrap(), 0);
}

#[test]
fn the_size_cannot_change_after_the_connection() {
    let (mut a, _b) = pair(
        side(0xA0, ByteOrder::Little, 1),
        side(0xB0, ByteOrder::Little, 1),
    );
    assert_eq!(a.flow.set_iomap_size(4), Err(IomapError::TooLate));
    assert_eq!(a.flow.iomap_size(), 1);
}

#[test]
fn riomap_writes_the_entry_in_the_peers_order_then_rs_op_iomap_sgl() {
    // A is little endian, B big endian: the entry lands in B's order.
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 0),
        side(0xB0, ByteOrder::Big, 2),
    );
    assert_eq!(a.flow.peer_iomap_size(), 2);
    let credits = a.flow.send_credits();
    let i = map(&mut a, 0x100, 512, 0x7000);
    assert_eq!(i, 0);
    assert_eq!(
        a.flow.send_credits(),
        credits - 1,
        "an entry costs a credit"
    );
    let wire = pump(&mut a);
    assert_eq!(wire.len(), 2);
    match &wire[0] {
        Wire::Write { addr, rkey, bytes } => {
            // Behind B's two SGL entries, with the target SGL's rkey.
            assert_eq!(*addr, TGT + 32);
            assert_eq!(*rkey, 0xB1);
            assert_eq!(
                bytes[..],
                [
                    0, 0, 0, 0, 0, 0, 0x70, 0x00, // offset 0x7000, big endian
                    0, 0, 0, 0, 0x30, 0, 0x01, 0x00, // addr USER + 0x100
                    0, 0, 0, 0xA3, // key
                    0, 0, 0x02, 0x00, // length 512
                ]
            );
        }
        Wire::Send(_) => panic!("the entry is written before the word"),
    }
    match &wire[1] {
        // RS_OP_IOMAP_SGL (6 << 29) | index 0, in A's (little-endian) order.
        Wire::Send(p) => assert_eq!(*p, [0x00, 0x00, 0x00, 0xC0]),
        Wire::Write { .. } => panic!("expected the word"),
    }
    assert_eq!(b.flow.peer_iomaps().count(), 0);
    land(wire, &mut b).unwrap();
    let maps: Vec<_> = b.flow.peer_iomaps().collect();
    assert_eq!(
        maps,
        vec![(
            0,
            Iomap {
                offset: 0x7000,
                sge: Sge {
                    addr: USER + 0x100,
                    key: 0xA3,
                    length: 512
                }
            }
        )]
    );
}

#[test]
fn riowrite_places_bytes_at_the_offset_with_no_message() {
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 1),
        side(0xB0, ByteOrder::Little, 1),
    );
    map(&mut a, 1024, 2048, 0);
    settle(&mut a, &mut b);
    let data: Vec<u8> = (0..1500u32).map(|i| (i * 7 + 3) as u8).collect();
    riowrite(&mut b, &data, 100).unwrap();
    let wire = pump(&mut b);
    assert!(
        wire.iter().all(|w| matches!(w, Wire::Write { .. })),
        "RS_OP_WRITE is not transmitted"
    );
    let queued = a.flow.bytes_queued();
    land(wire, &mut a).unwrap();
    complete(&mut b);
    assert_eq!(a.user[1024 + 100..1024 + 1600], data[..]);
    assert!(a.user[..1124].iter().all(|&x| x == 0), "nothing before");
    assert!(
        a.user[1024 + 1600..].iter().all(|&x| x == 0),
        "nothing after"
    );
    assert_eq!(a.flow.bytes_queued(), queued, "no stream data");
}

#[test]
fn riowrite_is_split_at_direct_max_and_at_mapping_ends() {
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 2),
        side(0xB0, ByteOrder::Little, 0),
    );
    // B maps two adjacent regions in A's table: 0..1000 and 1000..3000.
    b.user = vec![0; 4096];
    map(&mut b, 0, 1000, 0);
    settle(&mut a, &mut b);
    map(&mut b, 2000, 2000, 1000);
    settle(&mut a, &mut b);
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    riowrite(&mut a, &data, 0).unwrap();
    land(pump(&mut a), &mut b).unwrap();
    complete(&mut a);
    assert_eq!(b.user[..1000], data[..1000]);
    assert_eq!(b.user[2000..4000], data[1000..]);
    assert!(b.user[1000..2000].iter().all(|&x| x == 0));

    // A long write into one mapping leaves in DIRECT_MAX pieces.
    let mut f = a.flow.clone();
    f.iomap.peer[0] = Some(Iomap {
        offset: 0,
        sge: Sge {
            addr: USER,
            key: 0xB3,
            length: u32::MAX,
        },
    });
    assert_eq!(f.write_direct(0, 3 << 20).unwrap(), DIRECT_MAX);
}

#[test]
fn riowrite_outside_the_mappings_is_refused_before_anything_is_written() {
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 1),
        side(0xB0, ByteOrder::Little, 1),
    );
    // Nothing mapped yet.
    assert_eq!(
        riowrite(&mut b, &[1; 10], 0),
        Err(IomapError::NotMapped {
            offset: 0,
            len: 10,
            gap: 0
        })
    );
    map(&mut a, 0, 1000, 5000);
    settle(&mut a, &mut b);
    // Below, across the end, after, and an overflowing range.
    for (off, len, gap) in [
        (4999u64, 2usize, 4999u64),
        (5990, 20, 6000),
        (6000, 1, 6000),
    ] {
        let e = riowrite(&mut b, &vec![9; len], off).unwrap_err();
        assert_eq!(
            e,
            IomapError::NotMapped {
                offset: off,
                len: len as u64,
                gap
            }
        );
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("riomap"), "{e}");
    }
    assert!(b.flow.check_direct(u64::MAX - 1, 10).is_err());
    assert!(pump(&mut b).is_empty(), "nothing was queued");
    // The whole mapping is fine.
    riowrite(&mut b, &[7; 1000], 5000).unwrap();
    land(pump(&mut b), &mut a).unwrap();
    assert!(a.user[..1000].iter().all(|&x| x == 7));
}

#[test]
fn the_table_fills_up_and_unmap_frees_an_entry() {
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 0),
        side(0xB0, ByteOrder::Little, 2),
    );
    let r = Sge {
        addr: USER,
        key: 0xA3,
        length: 10,
    };
    assert_eq!(a.flow.map_remote(0, r), Ok(0));
    assert_eq!(a.flow.map_remote(10, r), Ok(1));
    let full = a.flow.map_remote(20, r).unwrap_err();
    assert_eq!(full, IomapError::NoSlot { size: 2 });
    assert_eq!(full.kind(), std::io::ErrorKind::OutOfMemory);
    // Unmapping a queued entry drops it from the queue.
    a.flow.unmap_remote(0).unwrap();
    assert_eq!(a.flow.unmap_remote(0), Err(IomapError::UnknownIndex(0)));
    assert_eq!(a.flow.unmap_remote(9), Err(IomapError::UnknownIndex(9)));
    assert_eq!(
        a.flow.unmap_remote(9).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
    assert_eq!(push(&mut a), Some(1));
    assert_eq!(push(&mut a), None);
    assert_eq!(a.flow.map_remote(20, r), Ok(0), "index 0 is free again");
    assert_eq!(push(&mut a), Some(0));
    settle(&mut a, &mut b);
    assert_eq!(
        b.flow.peer_iomaps().map(|(i, _)| i).collect::<Vec<_>>(),
        [0, 1]
    );

    // B advertised 2, A advertised none: B cannot map at all.
    let e = b.flow.map_remote(0, r).unwrap_err();
    assert_eq!(e, IomapError::NoSlot { size: 0 });
    assert!(e.to_string().contains("RDMA_IOMAPSIZE"), "{e}");
}

#[test]
fn riomap_before_the_connection_is_refused() {
    let mut s = side(0xA0, ByteOrder::Little, 1);
    assert_eq!(
        s.flow.map_remote(0, Sge::default()),
        Err(IomapError::Flow(FlowError::NotConnected))
    );
    assert_eq!(
        s.flow.write_direct(0, 1),
        Err(IomapError::Flow(FlowError::NotConnected))
    );
}

#[test]
fn entries_wait_behind_buffered_bytes_and_for_credits() {
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 0),
        side(0xB0, ByteOrder::Little, 1),
    );
    // Buffered bytes that cannot leave (push off) hold the entry back.
    let mut t = [0u8; TARGET_SGL_LEN];
    t.copy_from_slice(&a.target[..TARGET_SGL_LEN]);
    a.flow.send_buffered(10, &mut t, false).unwrap();
    a.flow
        .map_remote(
            0,
            Sge {
                addr: USER,
                key: 0xA3,
                length: 10,
            },
        )
        .unwrap();
    assert_eq!(a.flow.push_iomap(), None);
    a.flow.push(&mut t);
    a.target[..TARGET_SGL_LEN].copy_from_slice(&t);
    assert_eq!(push(&mut a), Some(0));
    settle(&mut a, &mut b);

    // No credit: the entry waits.
    let mut f = a.flow.clone();
    f.sseq_comp = f.sseq_no;
    f.map_remote(0, Sge::default()).unwrap_err(); // B's table has one entry, in use
    f.unmap_remote(0).unwrap();
    f.map_remote(0, Sge::default()).unwrap();
    assert!(f.iomap_pending());
    assert_eq!(f.push_iomap(), None);
}

#[test]
fn credits_spent_on_entries_come_back_from_this_library() {
    // 16 credits; 60 map/unmap cycles each spend one.
    let (mut a, mut b) = pair(
        side(0xA0, ByteOrder::Little, 0),
        side(0xB0, ByteOrder::Little, 1),
    );
    for k in 0..60u64 {
        map(&mut a, 0, 64, k * 64);
        settle(&mut a, &mut b);
        let (_, e) = b.flow.peer_iomaps().next().unwrap();
        assert_eq!(e.offset, k * 64);
        a.flow.unmap_remote(0).unwrap();
    }
    assert!(a.flow.send_credits() >= 8, "{}", a.flow.send_credits());
    // And data still flows.
    let mut t = [0u8; TARGET_SGL_LEN];
    t.copy_from_slice(&a.target[..TARGET_SGL_LEN]);
    assert!(a.flow.send(100, &mut t).is_ok());
}

fn hostile(iomap: u16) -> Flow {
    let mut f = Flow::new(Config::default()).unwrap();
    f.set_iomap_size(iomap).unwrap();
    let peer = Flow::new(Config {
        target_sgl: Region { addr: 1, key: 2 },
        ..Config::default()
    })
    .unwrap()
    .local_conn_data();
    let mut s = [0u8; TARGET_SGL_LEN];
    f.establish(&peer, &mut s).unwrap();
    f
}

fn word(op: Op, v: u32) -> [u8; 4] {
    MsgWord::new(op, v)
        .unwrap()
        .to_send_payload(ByteOrder::NATIVE)
}

#[test]
fn an_iomap_word_without_a_table_resets() {
    let mut f = hostile(0);
    let e = f.on_recv(&word(Op::IomapSgl, 0)).unwrap_err();
    assert_eq!(
        e,
        FlowError::Protocol(ProtocolError::Unexpected(Op::IomapSgl))
    );
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(f.phase(), Phase::Error);
}

#[test]
fn an_iomap_word_beyond_the_table_resets() {
    let mut f = hostile(4);
    f.on_recv(&word(Op::IomapSgl, 3)).unwrap();
    let e = f.on_recv(&word(Op::IomapSgl, 4)).unwrap_err();
    assert_eq!(
        e,
        FlowError::Protocol(ProtocolError::IomapIndex { index: 4, size: 4 })
    );
    assert!(e.to_string().contains("outside the table"), "{e}");
    assert_eq!(f.phase(), Phase::Error);
}

#[test]
fn iomap_words_beyond_the_credits_reset() {
    let mut f = hostile(1);
    let rq = f.config().rq_size;
    // Each word is consumed at once, but the limit moves only with the
    // credit update, which needs the control slots the peer never frees.
    let mut n = 0u32;
    let err = loop {
        match f.on_recv(&word(Op::IomapSgl, 0)) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n <= 4 * u32::from(rq), "never refused");
    };
    assert!(
        matches!(
            err,
            FlowError::Protocol(ProtocolError::CreditsExceeded { .. })
        ),
        "{err:?}"
    );
}

#[test]
fn an_iomap_word_after_shutdown_resets() {
    let mut f = hostile(1);
    f.on_recv(&word(Op::Ctrl, 2)).unwrap();
    assert_eq!(
        f.on_recv(&word(Op::IomapSgl, 0)),
        Err(FlowError::Protocol(ProtocolError::DataAfterShutdown))
    );
}

#[test]
fn an_rs_op_write_word_resets() {
    // rsocket.c never transmits RS_OP_WRITE (it only tags the local work
    // request of a direct write): a word with op 2 is a broken peer.
    let mut f = hostile(1);
    let w = word(Op::Write, 16);
    assert_eq!(u32::from_ne_bytes(w), 0x4000_0010);
    assert_eq!(
        f.on_recv(&w),
        Err(FlowError::Protocol(ProtocolError::Unexpected(Op::Write)))
    );
}

#[test]
fn an_announced_entry_of_length_zero_is_no_mapping() {
    let mut f = hostile(2);
    f.on_recv(&word(Op::IomapSgl, 1)).unwrap();
    let mut table = vec![0u8; 2 * IOMAP_LEN];
    f.iomap_refresh(&table);
    assert_eq!(f.peer_iomaps().count(), 0);
    Iomap {
        offset: 8,
        sge: Sge {
            addr: 64,
            key: 5,
            length: 8,
        },
    }
    .emit(&mut table[IOMAP_LEN..], ByteOrder::NATIVE)
    .unwrap();
    f.on_recv(&word(Op::IomapSgl, 1)).unwrap();
    f.iomap_refresh(&table);
    assert_eq!(f.peer_iomaps().map(|(i, _)| i).collect::<Vec<_>>(), [1]);
    assert!(f.check_direct(8, 8).is_ok());
    assert!(f.check_direct(8, 9).is_err());
}
