//! Two connection-startup problems that `scripts/test-rstream-siw.sh`
//! found between `iwarp-sockets` and rdma-core's rstream over Linux siw,
//! reproduced here without siw: a raw TCP peer plays siw's side and
//! checks the bytes our side puts on the wire. Both are fixed, and these
//! tests keep them fixed: (1) by `ConnParam::hold_until_first_fpdu`
//! (RFC 5044 §7.1.2), which `iwarp-sockets` turns on for accepted streams;
//! (2) by the zero-length RDMA Write an active rsocket sends when the
//! peer's first message arrives (`Conn::first_word` in
//! `crates/iwarp-sockets/src/conn.rs`).
//!
//! 1. **Our server sends an FPDU before the client's first FPDU.** An
//!    accepted `iwarp-sockets` stream posts its first credit update (an RDMA
//!    Write of an `rs_sge` and the `RS_OP_SGL` Send) right behind its MPA
//!    Reply. RFC 5044's connection startup rules (§7.1) let the responder
//!    send FPDUs only after it has received one from the initiator (in
//!    non-peer-to-peer mode; RFC 6581's RTR exists to lift exactly that
//!    rule). siw enforces it on the initiator side: `siw_recv_mpa_rr` reads
//!    the Reply's private data with `pd_len + 4` bytes and fails with
//!    `-EPROTO` ("peer sent extra data") when more is there; the connection
//!    is reset. rdma-core's `rstream -s <our server>` gets "rconnect:
//!    Connection refused" or "rpoll: Invalid argument" whenever our FPDU
//!    wins that race (3 of the 5 rstream-client scenarios of one run of
//!    the script under QEMU TCG).
//! 2. **The wake-up nudge is suppressed by the peer's own first message.**
//!    Against a siw *server* our first FPDUs can land before siw installs
//!    its receive callback and then sit unread (the stall the `iwarp`
//!    crate's wake-up nudge repairs). The nudge is only sent if the peer
//!    stays silent after our last bytes, but an rsockets server sends its
//!    own first credit update unprompted 3-15 ms later, so the nudge never
//!    goes and both sides wait forever: our client for the answer to its
//!    sync, rstream for the sync. Seen in 2 of the 5 rstream-server
//!    scenarios of that run, and in the latency scenario of two others.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp_sockets::wire::{ByteOrder, ConnDataRepr, Message, Sge};
use iwarp_sockets::{Listener, Options, Stream};

/// rs_conn_data of the fake siw peer: a target SGL and a 1 MiB ring
/// (first half advertised), made-up addresses and keys.
fn fake_conn_data() -> [u8; 40] {
    ConnDataRepr {
        order: ByteOrder::Little,
        iomap: true,
        other_flags: 0,
        credits: 384,
        target_iomap_size: 0,
        target_sgl: Sge {
            addr: 0x7f00_0000_3000,
            key: 0x1111_1100,
            length: 2,
        },
        data_buf: Sge {
            addr: 0x7f00_1000_0000,
            key: 0x2222_2200,
            length: 0x8_0000,
        },
    }
    .to_bytes()
}

/// An MPA Request or Reply, revision 2 with RFC 6581's IRD/ORD block, no
/// CRC, no markers (what siw sends).
fn mpa_frame(key: &[u8; 16], ird: u16, ord: u16, pd: &[u8]) -> Vec<u8> {
    let mut f = key.to_vec();
    f.extend_from_slice(&[0x10, 2]);
    f.extend_from_slice(&((4 + pd.len()) as u16).to_be_bytes());
    f.extend_from_slice(&ird.to_be_bytes());
    f.extend_from_slice(&ord.to_be_bytes());
    f.extend_from_slice(pd);
    f
}

/// Reads one MPA frame (header, then the private data it announces).
fn read_mpa(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).expect("MPA header");
    let len = usize::from(u16::from_be_bytes([h[18], h[19]]));
    let mut pd = vec![0u8; len];
    s.read_exact(&mut pd).expect("MPA private data");
    let mut f = h.to_vec();
    f.extend_from_slice(&pd);
    f
}

/// An FPDU around `ulpdu` (MPA length, pad, zero CRC field: no CRC).
fn fpdu(ulpdu: &[u8]) -> Vec<u8> {
    let mut f = (ulpdu.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(ulpdu);
    while !f.len().is_multiple_of(4) {
        f.push(0);
    }
    f.extend_from_slice(&[0; 4]);
    f
}

fn rdma_write(stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0xc1, 0x40];
    u.extend_from_slice(&stag.to_be_bytes());
    u.extend_from_slice(&to.to_be_bytes());
    u.extend_from_slice(payload);
    fpdu(&u)
}

fn send(msn: u32, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
    u.extend_from_slice(&msn.to_be_bytes());
    u.extend_from_slice(&[0; 4]);
    u.extend_from_slice(payload);
    fpdu(&u)
}

/// What one FPDU from our side was.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Write { stag: u32, len: usize },
    Send { payload: Vec<u8> },
    Other,
}

/// Reads one FPDU, waiting at most until `deadline` (`None`: nothing came).
fn read_fpdu(s: &mut TcpStream, deadline: Instant) -> Option<Seen> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return None;
    }
    s.set_read_timeout(Some(left)).unwrap();
    let mut l = [0u8; 2];
    if s.read_exact(&mut l).is_err() {
        return None;
    }
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let len = usize::from(u16::from_be_bytes(l));
    let mut rest = vec![0u8; len + (4 - (2 + len) % 4) % 4 + 4];
    s.read_exact(&mut rest).expect("the rest of the FPDU");
    let u = &rest[..len];
    Some(match (u[0] & 0x80 != 0, u[1] & 0x0f) {
        (true, 0) => Seen::Write {
            stag: u32::from_be_bytes(u[2..6].try_into().unwrap()),
            len: len - 14,
        },
        (false, 3) => Seen::Send {
            payload: u[18..].to_vec(),
        },
        _ => Seen::Other,
    })
}

fn is_data_msg(seen: &Seen) -> bool {
    matches!(seen, Seen::Send { payload }
        if matches!(Message::from_send_payload(payload, ByteOrder::Little), Ok(Message::Data { .. })))
}

#[test]
fn our_server_sends_nothing_after_its_mpa_reply_until_the_client_has_sent_an_fpdu() {
    let l = Listener::bind_with("127.0.0.1:0".parse().unwrap(), &Options::default()).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        // Keep the stream until the client is done looking.
        let _ = rx.recv_timeout(Duration::from_secs(20));
        drop(s);
    });

    // The client, as siw's initiator: Request, then read the Reply.
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(&mpa_frame(b"MPA ID Req Frame", 0, 1, &fake_conn_data()))
        .unwrap();
    let reply = read_mpa(&mut c);
    assert_eq!(&reply[..16], b"MPA ID Rep Frame");
    ConnDataRepr::parse_bytes(&reply[24..]).expect("an rs_conn_data in the Reply");

    // siw reads pd_len + 4 bytes here: anything behind the Reply resets the
    // connection. Nothing may come while we have sent no FPDU.
    let early = read_fpdu(&mut c, Instant::now() + Duration::from_millis(500));
    let _ = tx.send(());
    server.join().unwrap();
    assert_eq!(
        early, None,
        "the responder sent an FPDU before receiving the initiator's first one"
    );
}

#[test]
fn our_client_nudges_a_server_that_talks_but_never_read_our_first_fpdus() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = fake.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = read_mpa(&mut s);
        let client = ConnDataRepr::parse_bytes(&req[24..]).expect("rs_conn_data");
        s.write_all(&mpa_frame(b"MPA ID Rep Frame", 1, 0, &fake_conn_data()))
            .unwrap();
        // The client's first FPDUs: its credit update, then the 16-byte
        // sync (Write + RS_OP_DATA). siw, still setting up, leaves them in
        // the socket; we read them only to know they were sent.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = read_fpdu(&mut s, until).expect("the client's sync");
            if is_data_msg(&seen) {
                break;
            }
        }
        // Like an rsockets server, send our own first credit update a few
        // milliseconds later (3.5 to 14 ms in the captures under TCG)
        // without having read any of that: slot 1 of the client's target
        // SGL, then RS_OP_SGL.
        thread::sleep(Duration::from_millis(5));
        let sge = Sge {
            addr: 0x7f00_1008_0000,
            key: 0x2222_2200,
            length: 0x8_0000,
        };
        let mut upd = rdma_write(
            client.target_sgl.key,
            client.target_sgl.addr + 16,
            &sge.to_bytes(ByteOrder::Little),
        );
        upd.extend(send(
            1,
            &Message::Sgl { limit: 384 }
                .emit()
                .unwrap()
                .to_send_payload(ByteOrder::Little),
        ));
        s.write_all(&upd).unwrap();
        // A stalled siw reads the socket again only when new bytes come:
        // the client must send some (a nudge) within its 2 s window.
        let until = Instant::now() + Duration::from_millis(2500);
        let mut nudged = false;
        while let Some(seen) = read_fpdu(&mut s, until) {
            if seen == (Seen::Write { stag: 0, len: 0 }) {
                nudged = true;
                break;
            }
        }
        nudged
    });

    let opts = Options {
        connect_timeout: Duration::from_secs(10),
        ..Options::default()
    };
    let c = Stream::connect_with(addr, &opts).unwrap();
    (&c).write_all(&[0u8; 16]).unwrap();
    let nudged = peer.join().unwrap();
    drop(c);
    assert!(
        nudged,
        "no wake-up nudge after the peer's unprompted first message: a stalled siw server \
         would never read our sync"
    );
}
