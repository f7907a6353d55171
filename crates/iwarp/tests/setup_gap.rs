//! The wake-up nudge (`ConnParam::wake_nudge`) against a peer that behaves
//! like Linux siw while it finishes connection setup.
//!
//! siw reads a connection's socket only when its `sk_data_ready` callback
//! fires, and on the passive side it installs the QP's callback only after
//! sending the MPA Reply (`siw_accept`). An FPDU that arrives in between
//! is acknowledged by TCP and then sits in the socket until *more* bytes
//! arrive. rping's client sends one Send and waits for the answer, so
//! against siw it hung (issue 11, part 1).
//!
//! The peer here is a raw TCP socket that answers the MPA Request, lets
//! the client's first FPDU arrive while it "finishes setup", and from then
//! on reads only when new bytes arrive after that point: exactly siw's
//! edge. It then checks that the bytes are our Send and answers with a
//! Send of its own.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use iwarp::cm::{self, ConnParam};
use iwarp::{WcStatus, WrOpcode};

/// How long the emulated siw takes to install its receive callback after
/// sending the MPA Reply (under QEMU TCG siw took several milliseconds;
/// here it is long enough that the client's first FPDU surely lands in
/// the gap, and that the first nudge may land in it too).
const SETUP_GAP: Duration = Duration::from_millis(100);

/// The peer's answer: an untagged Send FPDU (RFC 5041 §4.3, RFC 5040 §4):
/// MPA length 22, DDP control 0x41 (last, untagged, version 1), RDMAP
/// control 0x43 (version 1, Send), QN 0, MSN 1, MO 0, payload "pong", and
/// the MPA CRC field, zero without CRC (RFC 5044 §4.4).
const PONG: [u8; 28] = [
    0x00, 0x16, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'p', b'o', b'n', b'g',
    0, 0, 0, 0,
];

/// Bytes waiting in `s`, without consuming them.
fn available(s: &TcpStream) -> usize {
    let mut buf = [0u8; 4096];
    s.peek(&mut buf).unwrap_or(0)
}

/// Run the emulated siw responder on `raw`; returns whether it saw new
/// bytes after its setup gap (its "data ready" fired) within `wait`.
fn siw_like_peer(raw: TcpListener, wait: Duration) -> bool {
    let mut s = raw_mpa_accept(&raw);
    // The gap: whatever arrives now is not signalled.
    std::thread::sleep(SETUP_GAP);
    s.set_nonblocking(true).unwrap();
    let seen = available(&s);
    assert!(
        seen >= 28,
        "the client's first FPDU should have arrived during the setup gap (got {seen} bytes)"
    );
    // Data ready fires only for bytes that arrive from now on.
    let deadline = Instant::now() + wait;
    while available(&s) <= seen {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    s.set_nonblocking(false).unwrap();
    // Read everything: first our Send "ping" (MPA length 22, untagged,
    // RDMAP Send, payload at 20..24), then zero-length Writes (nudges).
    let mut first = [0u8; 28];
    s.read_exact(&mut first).unwrap();
    assert_eq!(
        (&first[..4], &first[20..24]),
        (&[0x00, 0x16, 0x41, 0x43][..], &b"ping"[..]),
        "the first FPDU is the client's Send"
    );
    s.write_all(&PONG).unwrap();
    // Keep the connection open until the client is done with it.
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut rest = [0u8; 256];
    while let Ok(n) = s.read(&mut rest) {
        if n == 0 {
            break;
        }
    }
    true
}

/// Connect to a siw-like peer and send "ping"; returns (the peer saw new
/// bytes after its gap, the client received "pong").
fn ping_siw_like_peer(wake_nudge: bool) -> (bool, bool) {
    let raw = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let wait = Duration::from_millis(1500);
    let peer = std::thread::spawn(move || siw_like_peer(raw, wait));
    let client = Host::new();
    let buf = client.mr(64);
    client.post_recv(1, &buf, 0, 64);
    cm::connect(
        &client.qp,
        addr,
        &ConnParam {
            timeout: T,
            wake_nudge,
            ..Default::default()
        },
    )
    .unwrap();
    buf.write_at(0, b"ping");
    client
        .qp
        .post_send(&wr(2, WrOpcode::Send, &[buf.sge(0, 4)]))
        .unwrap();
    assert_eq!(client.send_wc().status, WcStatus::Success);
    let reply = client
        .rcq
        .wait_one(wait + SETUP_GAP + Duration::from_millis(500))
        .unwrap();
    // Without an answer the peer gives up and closes, which flushes the
    // receive.
    let got_pong = match reply {
        Some(wc) if wc.status == WcStatus::Success => {
            assert_eq!(wc.byte_len, 4);
            let mut b = [0u8; 4];
            buf.read_at(0, &mut b);
            assert_eq!(&b, b"pong");
            true
        }
        Some(_) | None => false,
    };
    client.qp.disconnect();
    (peer.join().unwrap(), got_pong)
}

#[test]
fn a_peer_that_missed_our_first_fpdu_during_setup_is_nudged_into_reading_it() {
    let t0 = Instant::now();
    let (peer_read, got_pong) = ping_siw_like_peer(true);
    assert!(peer_read, "the peer never saw bytes after its setup gap");
    assert!(got_pong, "the client got no answer");
    // Nudges come 20, 60, 140 ms after the Send: well inside a second.
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn without_the_nudge_the_same_peer_never_reads_and_the_client_hangs() {
    // The emulation reproduces the stall: this is what rping against siw
    // did before the nudge.
    let (peer_read, got_pong) = ping_siw_like_peer(false);
    assert!(!peer_read && !got_pong);
}
