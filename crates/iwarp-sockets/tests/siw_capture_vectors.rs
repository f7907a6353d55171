//! Wire vectors from a real capture: rdma-core's `rstream` and `riostream`
//! (librdmacm rsockets) between two Linux kernel soft-iWARP (siw) peers,
//! `../shared/testdata/siw-captures/siw-rsockets.pcap` (Debian 6.1 kernel,
//! rdma-core 44; client 10.77.0.3, server 10.77.0.2, port 7471). The bytes
//! below are copied from that file (TCP payloads, one MPA frame or one FPDU
//! each, the 4-byte MPA CRC field included: zero, CRC was not negotiated)
//! and `iwarp_sockets::wire` must read them as rsockets means them:
//!
//! - the MPA Request / Reply private data (after RFC 6581's 4-byte IRD/ORD
//!   block) is `struct rs_conn_data`, big endian;
//! - the first credit update is an RDMA Write of an `rs_sge` (sender's host
//!   order, little endian here) into slot 1 of the peer's target SGL,
//!   followed by the `RS_OP_SGL` word as a 4-byte Send;
//! - data is an RDMA Write into the peer's ring, then `RS_OP_DATA` as a Send;
//! - `riostream` writes an `rs_iomap` behind the two SGL entries and sends
//!   `RS_OP_IOMAP_SGL`; both programs end with `RS_CTRL_DISCONNECT`.
//!
//! Each vector is also re-emitted and compared byte for byte.

use iwarp_sockets::wire::{
    ByteOrder, ConnData, ConnDataRepr, Ctrl, Iomap, Message, MsgWord, Sge, CONN_DATA_LEN,
    IOMAP_LEN, MSG_SIZE, SGE_LEN,
};

/// Frame 4: rstream client (10.77.0.3) -> server, the MPA Request (64 bytes).
const RSTREAM_REQUEST: [u8; 64] = [
    0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65,
    0x10, 0x02, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x55, 0xa1, 0xc6, 0x61, 0xc0, 0x00, 0x5c, 0x41, 0xa1, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x7f, 0x70, 0x35, 0x8a, 0xc0, 0x00, 0x28, 0x6c, 0x6a, 0x00, 0x00, 0x08, 0x00, 0x00,
];

/// Frame 6: the server's MPA Reply.
const RSTREAM_REPLY: [u8; 64] = [
    0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65,
    0x10, 0x02, 0x00, 0x2c, 0x00, 0x01, 0x00, 0x00, 0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x7f, 0xcd, 0x64, 0x00, 0x30, 0x00, 0xef, 0xce, 0x8e, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x7f, 0xcd, 0x68, 0xf6, 0x80, 0x00, 0x8b, 0x1f, 0x97, 0x00, 0x00, 0x08, 0x00, 0x00,
];

/// Frame 330: riostream client, MPA Request (iomap of 1 entry).
const RIOSTREAM_REQUEST: [u8; 64] = [
    0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65,
    0x10, 0x02, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x01, 0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x55, 0x9e, 0x7c, 0xe2, 0x70, 0x00, 0x07, 0xe7, 0x1b, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x7f, 0x40, 0xcb, 0xe0, 0xc0, 0x00, 0x7c, 0x53, 0xf2, 0x00, 0x00, 0x08, 0x00, 0x00,
];

/// Frame 8: the client's first FPDU, an RDMA Write of an rs_sge into the server's target SGL.
const CLIENT_SGL_WRITE: [u8; 36] = [
    0x00, 0x1e, 0xc1, 0x40, 0xef, 0xce, 0x8e, 0x00, 0x00, 0x00, 0x7f, 0xcd, 0x64, 0x00, 0x30, 0x10,
    0x00, 0xc0, 0x92, 0x35, 0x70, 0x7f, 0x00, 0x00, 0x00, 0x6a, 0x6c, 0x28, 0x00, 0x00, 0x08, 0x00,
    0x00, 0x00, 0x00, 0x00,
];

/// Frame 9: the RS_OP_SGL message word that follows, as a Send.
const CLIENT_SGL_SEND: [u8; 28] = [
    0x00, 0x16, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x80, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00,
];

/// Frame 12: the first data, 16 bytes RDMA-Written into the server's receive ring.
const CLIENT_DATA_WRITE: [u8; 36] = [
    0x00, 0x1e, 0xc1, 0x40, 0x8b, 0x1f, 0x97, 0x00, 0x00, 0x00, 0x7f, 0xcd, 0x68, 0xf6, 0x80, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
];

/// Frame 13: the RS_OP_DATA message word that follows, as a Send.
const CLIENT_DATA_SEND: [u8; 28] = [
    0x00, 0x16, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// Frame 22: an RS_OP_DATA word for a 2048-byte transfer.
const CLIENT_DATA_2K_SEND: [u8; 28] = [
    0x00, 0x16, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// Frame 322: RS_CTRL_DISCONNECT as a Send.
const CLIENT_DISCONNECT_SEND: [u8; 28] = [
    0x00, 0x16, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2b,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe0, 0x00, 0x00, 0x00, 0x00,
];

/// Frame 338: riostream's RDMA Write of an rs_iomap entry behind the 2-entry target SGL.
const RIO_IOMAP_WRITE: [u8; 44] = [
    0x00, 0x26, 0xc1, 0x40, 0x0e, 0xe5, 0xbd, 0x00, 0x00, 0x00, 0x7f, 0xbf, 0x24, 0x00, 0x30, 0x20,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0xb8, 0xe1, 0x7c, 0x9e, 0x55, 0x00, 0x00,
    0x00, 0xd3, 0x4b, 0xba, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// Frame 339: the RS_OP_IOMAP_SGL word (index 0), as a Send.
const RIO_IOMAP_SGL_SEND: [u8; 28] = [
    0x00, 0x16, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x00, 0x00,
];

/// The private data of an MPA Request/Reply frame (RFC 5044 §7.1: 16-byte
/// key, flags, revision, 2-byte length), without RFC 6581's IRD/ORD block.
fn conn_data_of<'a>(frame: &'a [u8], key: &[u8; 16]) -> &'a [u8] {
    assert_eq!(&frame[..16], key);
    assert_eq!(
        frame[16], 0x10,
        "flags: enhanced (RFC 6581), no CRC, no markers"
    );
    assert_eq!(frame[17], 2, "MPA revision 2");
    let pd_len = usize::from(u16::from_be_bytes([frame[18], frame[19]]));
    assert_eq!(
        pd_len,
        4 + CONN_DATA_LEN,
        "IRD/ORD + rs_conn_data, nothing else"
    );
    assert_eq!(frame.len(), 20 + pd_len);
    &frame[24..]
}

const REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
const REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";

/// One FPDU (RFC 5044 §6): the ULPDU length, then DDP (RFC 5041 §4) and
/// RDMAP (RFC 5040 §4) headers; returns (RDMAP opcode, tagged target as
/// (STag, TO) or untagged (QN, MSN, MO), payload).
#[derive(Debug, PartialEq)]
enum Placement {
    Tagged { stag: u32, to: u64 },
    Untagged { qn: u32, msn: u32, mo: u32 },
}

fn fpdu(b: &[u8]) -> (u8, Placement, &[u8]) {
    let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
    let pad = (4 - (2 + len) % 4) % 4;
    assert_eq!(
        b.len(),
        2 + len + pad + 4,
        "one whole FPDU with its CRC field"
    );
    assert_eq!(&b[b.len() - 4..], &[0, 0, 0, 0], "no CRC negotiated");
    let u = &b[2..2 + len];
    assert_eq!(u[0] & 0x40, 0x40, "DDP L flag (last segment)");
    assert_eq!(u[0] & 0x03, 1, "DDP version 1");
    assert_eq!(u[1] >> 6, 1, "RDMAP version 1");
    let opcode = u[1] & 0x0f;
    let be32 = |at: usize| u32::from_be_bytes(u[at..at + 4].try_into().unwrap());
    if u[0] & 0x80 != 0 {
        let to = u64::from_be_bytes(u[6..14].try_into().unwrap());
        (opcode, Placement::Tagged { stag: be32(2), to }, &u[14..])
    } else {
        let p = Placement::Untagged {
            qn: be32(6),
            msn: be32(10),
            mo: be32(14),
        };
        (opcode, p, &u[18..])
    }
}

const RDMA_WRITE: u8 = 0;
const SEND: u8 = 3;

/// An RS message word in an untagged Send on queue 0, message `msn`.
fn message_of(frame: &[u8], msn: u32) -> Message {
    let (op, place, payload) = fpdu(frame);
    assert_eq!(op, SEND);
    assert_eq!(place, Placement::Untagged { qn: 0, msn, mo: 0 });
    assert_eq!(payload.len(), MSG_SIZE, "the word is the whole Send");
    let m = Message::from_send_payload(payload, ByteOrder::Little).unwrap();
    // And back to the same four bytes.
    let word = m.emit().unwrap();
    assert_eq!(word.to_send_payload(ByteOrder::Little), payload);
    assert_eq!(
        MsgWord::from_send_payload(payload, ByteOrder::Little).unwrap(),
        word
    );
    m
}

fn client_conn() -> ConnDataRepr {
    ConnDataRepr::parse_bytes(conn_data_of(&RSTREAM_REQUEST, REQ_KEY)).unwrap()
}

fn server_conn() -> ConnDataRepr {
    ConnDataRepr::parse_bytes(conn_data_of(&RSTREAM_REPLY, REP_KEY)).unwrap()
}

#[test]
fn the_mpa_request_carries_the_clients_rs_conn_data() {
    let pd = conn_data_of(&RSTREAM_REQUEST, REQ_KEY);
    // RFC 6581 IRD/ORD in front: IRD 0, ORD 1.
    assert_eq!(&RSTREAM_REQUEST[20..24], &[0x00, 0x00, 0x00, 0x01]);
    let v = ConnData::new_checked(pd).unwrap();
    assert_eq!(v.version(), 1);
    assert_eq!(
        v.flags(),
        0x02,
        "RS_CONN_FLAG_IOMAP, not NET: a little-endian host"
    );
    assert_eq!(v.credits(), 384);
    assert_eq!(v.reserved(), [0, 0, 0]);
    assert_eq!(v.target_iomap_size_scaled(), 0);
    let c = ConnDataRepr::parse(&v).unwrap();
    assert_eq!(
        c,
        ConnDataRepr {
            order: ByteOrder::Little,
            iomap: true,
            other_flags: 0,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 0x0000_55a1_c661_c000,
                key: 0x5c41_a100,
                length: 2,
            },
            data_buf: Sge {
                addr: 0x0000_7f70_358a_c000,
                key: 0x286c_6a00,
                length: 0x8_0000,
            },
        }
    );
    assert_eq!(c.to_bytes(), pd, "re-emitted byte for byte");
}

#[test]
fn the_mpa_reply_carries_the_servers_rs_conn_data() {
    let pd = conn_data_of(&RSTREAM_REPLY, REP_KEY);
    assert_eq!(&RSTREAM_REPLY[20..24], &[0x00, 0x01, 0x00, 0x00]);
    let s = server_conn();
    assert_eq!(s.order, ByteOrder::Little);
    assert!(s.iomap);
    assert_eq!(s.credits, 384);
    assert_eq!(
        s.target_sgl,
        Sge {
            addr: 0x0000_7fcd_6400_3000,
            key: 0xefce_8e00,
            length: 2,
        }
    );
    assert_eq!(
        s.data_buf,
        Sge {
            addr: 0x0000_7fcd_68f6_8000,
            key: 0x8b1f_9700,
            length: 0x8_0000,
        }
    );
    assert_eq!(s.to_bytes(), pd);
}

#[test]
fn riostream_advertises_an_iomap_of_one_entry() {
    let pd = conn_data_of(&RIOSTREAM_REQUEST, REQ_KEY);
    let c = ConnDataRepr::parse_bytes(pd).unwrap();
    assert!(c.iomap);
    assert_eq!(pd[7], 1, "target_iomap_size, scaled");
    assert_eq!(c.target_iomap_size, 1);
    assert_eq!(c.to_bytes(), pd);
}

#[test]
fn the_first_credit_update_writes_the_second_ring_half_into_target_sgl_slot_1() {
    let (client, server) = (client_conn(), server_conn());
    let (op, place, payload) = fpdu(&CLIENT_SGL_WRITE);
    assert_eq!(op, RDMA_WRITE);
    // Slot 1 of the server's target SGL, with the server's SGL STag.
    assert_eq!(
        place,
        Placement::Tagged {
            stag: server.target_sgl.key,
            to: server.target_sgl.addr + SGE_LEN as u64,
        }
    );
    assert_eq!(payload.len(), SGE_LEN);
    // In the owner's (server's) host order: little endian.
    let sge = Sge::parse(payload, ByteOrder::Little).unwrap();
    assert_eq!(
        sge,
        Sge {
            addr: client.data_buf.addr + u64::from(client.data_buf.length),
            key: client.data_buf.key,
            length: client.data_buf.length,
        },
        "the client's ring, second half"
    );
    assert_eq!(sge.to_bytes(ByteOrder::Little), payload);
    // Then RS_OP_SGL with rseq_no (0) + rq_size (384), message 1.
    assert_eq!(&CLIENT_SGL_SEND[20..24], &[0x80, 0x01, 0x00, 0x80]);
    assert_eq!(message_of(&CLIENT_SGL_SEND, 1), Message::Sgl { limit: 384 });
}

#[test]
fn the_first_data_is_a_write_at_the_start_of_the_peers_ring_then_rs_op_data() {
    let server = server_conn();
    let (op, place, payload) = fpdu(&CLIENT_DATA_WRITE);
    assert_eq!(op, RDMA_WRITE);
    assert_eq!(
        place,
        Placement::Tagged {
            stag: server.data_buf.key,
            to: server.data_buf.addr,
        }
    );
    assert_eq!(payload.len(), 16, "rstream's 16-byte sync");
    assert_eq!(&CLIENT_DATA_SEND[20..24], &[0x10, 0x00, 0x00, 0x00]);
    assert_eq!(message_of(&CLIENT_DATA_SEND, 2), Message::Data { len: 16 });
    // A later transfer: 2048 bytes (rsocket's first transfer size) in one word.
    assert_eq!(
        message_of(&CLIENT_DATA_2K_SEND, 3),
        Message::Data { len: 2048 }
    );
}

#[test]
fn riostream_writes_an_rs_iomap_behind_the_sgl_then_rs_op_iomap_sgl() {
    // The server of the riostream connection (frame 332's Reply).
    let (op, place, payload) = fpdu(&RIO_IOMAP_WRITE);
    assert_eq!(op, RDMA_WRITE);
    let Placement::Tagged { stag, to } = place else {
        panic!("tagged")
    };
    assert_eq!(stag, 0x0ee5_bd00);
    assert_eq!(
        to,
        0x0000_7fbf_2400_3000 + 2 * SGE_LEN as u64,
        "after the 2 SGL slots"
    );
    assert_eq!(payload.len(), IOMAP_LEN);
    let m = Iomap::parse(payload, ByteOrder::Little).unwrap();
    assert_eq!(
        m,
        Iomap {
            offset: 0,
            sge: Sge {
                addr: 0x0000_559e_7ce1_b810,
                key: 0xba4b_d300,
                length: 4096,
            },
        }
    );
    let mut back = [0u8; IOMAP_LEN];
    m.emit(&mut back, ByteOrder::Little).unwrap();
    assert_eq!(back, payload);
    assert_eq!(
        message_of(&RIO_IOMAP_SGL_SEND, 2),
        Message::IomapSgl { index: 0 }
    );
}

#[test]
fn the_connection_ends_with_rs_ctrl_disconnect() {
    assert_eq!(&CLIENT_DISCONNECT_SEND[20..24], &[0x00, 0x00, 0x00, 0xe0]);
    assert_eq!(
        message_of(&CLIENT_DISCONNECT_SEND, 0x2b),
        Message::Ctrl(Ctrl::Disconnect)
    );
}

#[test]
fn our_riomap_puts_riostreams_bytes_on_the_wire() {
    use iwarp_sockets::flow::{Action, Config, Flow, Region, SendTag, Source, TARGET_SGL_LEN};
    // The riostream connection's peer, as its conn data would say: the
    // target SGL the entry went behind, with its STag, one iomap entry.
    let peer = ConnDataRepr {
        order: ByteOrder::Little,
        iomap: true,
        other_flags: 0,
        credits: 384,
        target_iomap_size: 1,
        target_sgl: Sge {
            addr: 0x0000_7fbf_2400_3000,
            key: 0x0ee5_bd00,
            length: 2,
        },
        data_buf: Sge {
            addr: 0x0000_7fbf_2500_0000,
            key: 0x1234_5600,
            length: 65536,
        },
    };
    let mut f = Flow::new(Config {
        order: ByteOrder::Little,
        target_sgl: Region { addr: 1, key: 2 },
        rbuf: Region { addr: 3, key: 4 },
        ..Config::default()
    })
    .unwrap();
    let mut t = [0u8; TARGET_SGL_LEN];
    f.establish(&peer, &mut t).unwrap();
    while f.poll_action().is_some() {}
    // The mapping riostream made: 4096 bytes at offset 0.
    let index = f
        .map_remote(
            0,
            Sge {
                addr: 0x0000_559e_7ce1_b810,
                key: 0xba4b_d300,
                length: 4096,
            },
        )
        .unwrap();
    assert_eq!(index, 0);
    let g = f.push_iomap().expect("credits available");
    let (_, place, payload) = fpdu(&RIO_IOMAP_WRITE);
    assert_eq!(g.bytes[..], payload[..], "the 24 bytes of frame 338");
    match f.poll_action() {
        Some(Action::RdmaWrite {
            src: Source::Sbuf(spans),
            remote_addr,
            rkey,
            tag: SendTag::DataWrite { len: 24 },
        }) => {
            assert_eq!(spans, g.spans);
            assert_eq!(
                Placement::Tagged {
                    stag: rkey,
                    to: remote_addr
                },
                place,
                "frame 338's STag and tagged offset"
            );
        }
        other => panic!("expected the entry's RDMA Write, got {other:?}"),
    }
    match f.poll_action() {
        Some(Action::Send { payload, .. }) => {
            assert_eq!(payload[..], RIO_IOMAP_SGL_SEND[20..24], "frame 339's word")
        }
        other => panic!("expected the RS_OP_IOMAP_SGL Send, got {other:?}"),
    }
}
