//! Byte-literal vectors for every rsockets message word and for
//! `rs_conn_data`, malformed input, and property round trips.

use super::*;
use proptest::prelude::*;

const LE: ByteOrder = ByteOrder::Little;
const BE: ByteOrder = ByteOrder::Big;

/// (message, the u32 `rs_msg_set` builds, the 4 Send-payload bytes an
/// x86-64 rsocket puts on the wire over iWARP).
fn vectors() -> Vec<(Message, u32, [u8; 4])> {
    vec![
        (
            Message::Data { len: 0x1234 },
            0x0000_1234,
            [0x34, 0x12, 0x00, 0x00],
        ),
        (
            Message::Data { len: 65536 },
            0x0001_0000,
            [0x00, 0x00, 0x01, 0x00],
        ),
        (
            Message::Write { len: 5 },
            0x4000_0005,
            [0x05, 0x00, 0x00, 0x40],
        ),
        // rq_size 384 (def_rqsize) + rseq_no 0: the first credit update.
        (
            Message::Sgl { limit: 0x180 },
            0x8000_0180,
            [0x80, 0x01, 0x00, 0x80],
        ),
        // rseq_no + rq_size computed in int may pass 0xFFFF.
        (
            Message::Sgl { limit: 0x1_017f },
            0x8001_017f,
            [0x7f, 0x01, 0x01, 0x80],
        ),
        (
            Message::IomapSgl { index: 3 },
            0xC000_0003,
            [0x03, 0x00, 0x00, 0xC0],
        ),
        (
            Message::Ctrl(Ctrl::Disconnect),
            0xE000_0000,
            [0x00, 0x00, 0x00, 0xE0],
        ),
        (
            Message::Ctrl(Ctrl::Keepalive),
            0xE000_0001,
            [0x01, 0x00, 0x00, 0xE0],
        ),
        (
            Message::Ctrl(Ctrl::Shutdown),
            0xE000_0002,
            [0x02, 0x00, 0x00, 0xE0],
        ),
    ]
}

#[test]
fn every_message_type_as_iwarp_send_payload() {
    for (msg, word, bytes) in vectors() {
        let w = msg.emit().unwrap();
        assert_eq!(w.as_u32(), word, "{msg:?}");
        assert_eq!(w.to_send_payload(LE), bytes, "{msg:?}");
        assert_eq!(Message::from_send_payload(&bytes, LE).unwrap(), msg);
        // A big-endian sender puts the same word in the other order.
        let mut rev = bytes;
        rev.reverse();
        assert_eq!(w.to_send_payload(BE), rev);
        assert_eq!(Message::from_send_payload(&rev, BE).unwrap(), msg);
        // InfiniBand immediate data is htonl(msg).
        assert_eq!(w.to_imm_bytes(), word.to_be_bytes());
    }
}

#[test]
fn op_codes_are_rsocket_c_enum_order() {
    let ops = [
        (Op::Data, 0),
        (Op::RsvdDataMore, 1),
        (Op::Write, 2),
        (Op::RsvdDraMore, 3),
        (Op::Sgl, 4),
        (Op::Rsvd, 5),
        (Op::IomapSgl, 6),
        (Op::Ctrl, 7),
    ];
    for (op, n) in ops {
        assert_eq!(op as u8, n);
        assert_eq!(Op::from_bits(n), op);
        let w = MsgWord::new(op, 0).unwrap();
        assert_eq!(w.as_u32() >> 29, u32::from(n));
        assert_eq!(w.op(), op);
    }
}

#[test]
fn reserved_ops_are_refused() {
    for (bytes, op) in [
        ([0x00, 0x00, 0x00, 0x20], Op::RsvdDataMore),
        ([0x00, 0x00, 0x00, 0x60], Op::RsvdDraMore),
        ([0x10, 0x00, 0x00, 0xA0], Op::Rsvd),
    ] {
        let w = MsgWord::from_send_payload(&bytes, LE).unwrap();
        assert_eq!(w.op(), op);
        assert_eq!(Message::parse(w), Err(WireError::ReservedOp(op)));
    }
}

#[test]
fn unknown_ctrl_and_iomap_reserved_bits_are_refused() {
    assert_eq!(
        Message::from_send_payload(&[0x03, 0x00, 0x00, 0xE0], LE),
        Err(WireError::UnknownCtrl(3))
    );
    assert_eq!(
        Message::from_send_payload(&[0x00, 0x00, 0x01, 0xC0], LE),
        Err(WireError::IomapReservedBits(0x1_0000))
    );
}

#[test]
fn short_message_is_refused() {
    for n in 0..4 {
        let e = MsgWord::from_send_payload(&[0u8; 3][..n], LE).unwrap_err();
        assert_eq!(
            e,
            WireError::Truncated {
                what: "rsockets message (Send payload)",
                need: 4,
                got: n
            }
        );
        assert!(e.to_string().contains("needs 4 bytes"));
    }
}

#[test]
fn value_above_29_bits_is_refused() {
    assert_eq!(
        MsgWord::new(Op::Data, 0x2000_0000),
        Err(WireError::ValueTooLarge(0x2000_0000))
    );
    assert_eq!(
        MsgWord::new(Op::Data, DATA_MAX).unwrap().as_u32(),
        0x1FFF_FFFF
    );
    assert!(Message::Sgl { limit: u32::MAX }.emit().is_err());
}

/// An x86-64 rsocket with the defaults (rq_size 384, mem_default 128 KiB,
/// iomap_size 0): flags = RS_CONN_FLAG_IOMAP only.
const REALISTIC: [u8; 40] = [
    0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00,
    0x00, // version, flags, credits, reserved, iomap
    0x00, 0x00, 0x7f, 0x3a, 0x12, 0x34, 0x50, 0x00, // target_sgl.addr
    0x00, 0x00, 0x1a, 0x2b, 0x00, 0x00, 0x00, 0x02, // target_sgl.key, .length (2 entries)
    0x00, 0x00, 0x7f, 0x3a, 0x20, 0x00, 0x00, 0x00, // data_buf.addr
    0x00, 0x00, 0x3c, 0x4d, 0x00, 0x01, 0x00, 0x00, // data_buf.key, .length (64 KiB)
];

fn realistic_repr() -> ConnDataRepr {
    ConnDataRepr {
        order: LE,
        iomap: true,
        other_flags: 0,
        credits: 384,
        target_iomap_size: 0,
        target_sgl: Sge {
            addr: 0x7f3a_1234_5000,
            key: 0x1a2b,
            length: 2,
        },
        data_buf: Sge {
            addr: 0x7f3a_2000_0000,
            key: 0x3c4d,
            length: 0x1_0000,
        },
    }
}

#[test]
fn conn_data_realistic_vector() {
    let r = ConnDataRepr::parse_bytes(&REALISTIC).unwrap();
    assert_eq!(r, realistic_repr());
    assert_eq!(realistic_repr().to_bytes(), REALISTIC);
    let v = ConnData::new_checked(&REALISTIC[..]).unwrap();
    assert_eq!(v.version(), 1);
    assert_eq!(v.flags(), CONN_FLAG_IOMAP);
    assert_eq!(v.credits(), 384);
    assert_eq!(v.reserved(), [0; 3]);
    assert_eq!(v.target_sgl().length, SGL_SIZE);
}

#[test]
fn conn_data_with_our_ack_each_flag() {
    // The realistic vector from one of our basic-design ends: flags 0x82
    // (IOMAP | CONN_FLAG_ACK_EACH), the rest unchanged.
    let mut b = REALISTIC;
    b[1] = 0x82;
    let r = ConnDataRepr::parse_bytes(&b).unwrap();
    assert_eq!(r.other_flags, CONN_FLAG_ACK_EACH);
    assert!(r.iomap);
    assert_eq!(r.order, LE);
    assert_eq!(r.credits, 384);
    let mut want = realistic_repr();
    want.other_flags = CONN_FLAG_ACK_EACH;
    assert_eq!(r, want);
    assert_eq!(want.to_bytes(), b);
    assert_eq!(CONN_FLAG_ACK_EACH, 0x80);
}

#[test]
fn conn_data_net_flag_from_big_endian_host() {
    let mut r = realistic_repr();
    r.order = BE;
    let b = r.to_bytes();
    assert_eq!(b[1], CONN_FLAG_NET | CONN_FLAG_IOMAP);
    // The flag changes nothing else: conn data is big endian either way.
    assert_eq!(b[2..], REALISTIC[2..]);
    assert_eq!(ConnDataRepr::parse_bytes(&b).unwrap().order, BE);
}

#[test]
fn conn_data_longer_private_data_is_accepted() {
    let mut b = REALISTIC.to_vec();
    b.extend_from_slice(&[0xEE; 16]);
    assert_eq!(ConnDataRepr::parse_bytes(&b).unwrap(), realistic_repr());
}

#[test]
fn conn_data_short_is_refused() {
    for n in [0, 1, 8, 24, 39] {
        assert_eq!(
            ConnDataRepr::parse_bytes(&REALISTIC[..n]),
            Err(WireError::Truncated {
                what: "rs_conn_data (connection private data)",
                need: 40,
                got: n
            })
        );
    }
}

#[test]
fn conn_data_unknown_version_is_refused() {
    for v in [0u8, 2, 0xFF] {
        let mut b = REALISTIC;
        b[0] = v;
        let e = ConnDataRepr::parse_bytes(&b).unwrap_err();
        assert_eq!(e, WireError::UnsupportedVersion(v));
        assert!(e.to_string().contains("only version 1"));
    }
}

#[test]
fn sge_in_owner_order() {
    let s = Sge {
        addr: 0x0102_0304_0506_0708,
        key: 0x1122_3344,
        length: 0x8000,
    };
    assert_eq!(
        s.to_bytes(LE),
        [8, 7, 6, 5, 4, 3, 2, 1, 0x44, 0x33, 0x22, 0x11, 0x00, 0x80, 0x00, 0x00]
    );
    assert_eq!(
        s.to_bytes(BE),
        [1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x80, 0x00]
    );
    assert_eq!(Sge::parse(&s.to_bytes(BE), BE).unwrap(), s);
    assert!(Sge::parse(&[0; 15], LE).is_err());
}

#[test]
fn iomap_entry_layout() {
    let m = Iomap {
        offset: 0x10,
        sge: Sge {
            addr: 0x2000,
            key: 7,
            length: 4096,
        },
    };
    let mut b = [0u8; IOMAP_LEN];
    m.emit(&mut b, LE).unwrap();
    assert_eq!(&b[..8], &[0x10, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&b[8..16], &[0, 0x20, 0, 0, 0, 0, 0, 0]);
    assert_eq!(Iomap::parse(&b, LE).unwrap(), m);
    assert!(Iomap::parse(&b[..23], LE).is_err());
}

#[test]
fn iomap_size_scale_matches_rsocket_c() {
    for (v, s) in [
        (0u16, 0u8),
        (1, 1),
        (127, 127),
        (128, 128),
        (256, 0x81),
        (512, 0x82),
        (0x7f00, 0xff),
    ] {
        assert_eq!(iomap_value_to_scale(v), s, "value {v}");
        assert_eq!(iomap_scale_to_value(s), v, "scale {s:#x}");
    }
    // Sizes above 128 round down to a multiple of 256 (rs_configure rounds
    // def_iomap_size through both functions).
    assert_eq!(iomap_scale_to_value(iomap_value_to_scale(300)), 256);
}

fn arb_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (0..=DATA_MAX).prop_map(|len| Message::Data { len }),
        (0..=DATA_MAX).prop_map(|len| Message::Write { len }),
        (0..=DATA_MAX).prop_map(|limit| Message::Sgl { limit }),
        any::<u16>().prop_map(|index| Message::IomapSgl { index }),
        prop_oneof![
            Just(Ctrl::Disconnect),
            Just(Ctrl::Keepalive),
            Just(Ctrl::Shutdown)
        ]
        .prop_map(Message::Ctrl),
    ]
}

fn arb_sge() -> impl Strategy<Value = Sge> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, key, length)| Sge {
        addr,
        key,
        length,
    })
}

proptest! {
    #[test]
    fn message_round_trip(m in arb_message(), big in any::<bool>()) {
        let order = if big { BE } else { LE };
        let bytes = m.emit().unwrap().to_send_payload(order);
        prop_assert_eq!(Message::from_send_payload(&bytes, order).unwrap(), m);
    }

    #[test]
    fn any_word_parses_or_errs_without_panic(w in any::<u32>()) {
        let word = MsgWord::from_u32(w);
        if let Ok(m) = Message::parse(word) {
            prop_assert_eq!(m.emit().unwrap(), word);
        }
    }

    #[test]
    fn conn_data_round_trip(
        big in any::<bool>(), iomap in any::<bool>(), other in 0u8..64,
        credits in any::<u16>(), scale in any::<u8>(), t in arb_sge(), d in arb_sge(),
    ) {
        let r = ConnDataRepr {
            order: if big { BE } else { LE },
            iomap,
            other_flags: other << 2,
            credits,
            target_iomap_size: iomap_scale_to_value(scale),
            target_sgl: t,
            data_buf: d,
        };
        prop_assert_eq!(ConnDataRepr::parse_bytes(&r.to_bytes()).unwrap(), r);
    }

    #[test]
    fn conn_data_any_bytes_no_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(r) = ConnDataRepr::parse_bytes(&b) {
            prop_assert_eq!(&r.to_bytes()[..], &{
                let mut x = b[..40].to_vec();
                x[4..7].fill(0);
                x
            }[..]);
        }
    }
}
