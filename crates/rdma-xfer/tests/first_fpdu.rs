//! RFC 5044 §7.1.2's connection startup rule on rdma-xfer's passive side:
//! outside peer-to-peer mode the Responder sends no FPDU until the
//! Initiator's first FPDU has arrived. Linux siw's initiator enforces it:
//! `siw_recv_mpa_rr` reads the MPA Reply's private data with `pd_len + 4`
//! bytes, and an FPDU already behind the Reply makes it fail ("peer sent
//! extra data"): rdma_connect returns RDMA_CM_EVENT_CONNECT_ERROR with
//! status -22. rftpd met exactly that in `scripts/test-rdmacore-apps.sh`
//! (rftp-mixA, a guest rftp on siw0 getting a file from rftpd on soft):
//! with rftp's pipelined commands the server's `Begin` could follow its
//! MPA Reply within the same moment, and the get failed in 1 of 2 CI runs
//! and 1 of 1 local run.
//!
//! The fix is the `FIRST_FPDU` feature: an active side that offers it
//! sends a zero-length RDMA Write (RFC 6581's write-form RTR, a no-op at
//! RTS) on each connection right after it is established, and the passive
//! side holds its own FPDUs until then. A raw client here plays siw: it
//! sends MPA Requests itself and watches the bytes behind the Reply.
//! An older client, which offers no feature, is not held for (it would
//! never send first): the server then speaks at once, as before.

use std::io::{Cursor, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_xfer::hello::{feature, Hello, Proposal, CONTROL};
use rdma_xfer::{Config, Mode, ReadSource, XferListener};

/// Bound on every wait of these tests.
const WAIT: Duration = Duration::from_secs(10);
/// How long the raw client watches for bytes the server must not send:
/// without the hold, the `Begin` follows the Reply within milliseconds.
const QUIET: Duration = Duration::from_millis(500);

fn cfg() -> Config {
    Config {
        streams: 1,
        block_size: 64 << 10,
        iodepth: 2,
        timeout: Duration::from_secs(3),
        connect_timeout: WAIT,
        ..Config::default()
    }
}

/// An MPA Request, revision 1, no CRC, no markers (RFC 5044 §7.1).
fn mpa_request(pd: &[u8]) -> Vec<u8> {
    let mut f = b"MPA ID Req Frame".to_vec();
    f.extend_from_slice(&[0x00, 1]);
    f.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    f.extend_from_slice(pd);
    f
}

/// Read one MPA Reply (header, then the private data it announces).
fn read_reply(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).expect("MPA Reply header");
    assert_eq!(&h[..16], b"MPA ID Rep Frame");
    assert_eq!(h[16] & 0x20, 0, "the Reply rejects the connection");
    assert_eq!(
        h[16] & 0x40,
        0,
        "the Reply asks for CRCs (the test's FPDU has none)"
    );
    let mut pd = vec![0u8; usize::from(u16::from_be_bytes([h[18], h[19]]))];
    s.read_exact(&mut pd).expect("MPA Reply private data");
    pd
}

/// A zero-length RDMA Write FPDU: MPA length 14 (the tagged DDP and
/// RDMAP header, RFC 5041 §4.2, RFC 5040 §4.2), no pad (2 + 14 bytes), and
/// the CRC field zero: no CRC was negotiated (`read_reply` checks).
fn zero_length_write() -> Vec<u8> {
    let mut f = 14u16.to_be_bytes().to_vec();
    f.extend_from_slice(&[0xc1, 0x40]); // DDP: T, L, DV 1; RDMAP: RV 1, RDMA Write
    f.extend_from_slice(&[0; 12]); // STag 0, tagged offset 0
    f.extend_from_slice(&[0; 4]); // CRC field
    f
}

/// Whether any byte arrives on `s` within `d`.
fn arrives_within(s: &mut TcpStream, d: Duration) -> bool {
    s.set_read_timeout(Some(d)).unwrap();
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    s.set_read_timeout(Some(WAIT)).unwrap();
    matches!(r, Ok(n) if n > 0)
}

/// A server session that starts sending at once, and the raw client's
/// control and data connections, with `features` in their Hellos. The
/// receiver gets whether the server's send failed, when it ends.
fn session(features: u32) -> (TcpStream, TcpStream, mpsc::Receiver<bool>) {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, cfg()).unwrap();
    let (addr, token): (SocketAddr, u64) = (l.local_addr(), l.token());
    let (done_tx, server) = mpsc::channel();
    std::thread::spawn(move || {
        let mut t = l.accept(WAIT).expect("the session");
        // The raw client grants nothing: this ends when it goes away, or
        // at the session's timeout.
        let data = vec![7u8; 1000];
        let failed = t.send(&mut ReadSource(Cursor::new(&data))).is_err();
        let _ = done_tx.send(failed);
    });
    let hello = |index| {
        Hello {
            token,
            index,
            proposal: Proposal::of(&cfg()),
            features,
        }
        .emit()
    };
    let mut ctrl = TcpStream::connect(addr).unwrap();
    let mut data = TcpStream::connect(addr).unwrap();
    for s in [&mut ctrl, &mut data] {
        s.set_read_timeout(Some(WAIT)).unwrap();
    }
    ctrl.write_all(&mpa_request(&hello(CONTROL))).unwrap();
    data.write_all(&mpa_request(&hello(0))).unwrap();
    read_reply(&mut ctrl);
    read_reply(&mut data);
    (ctrl, data, server)
}

#[test]
fn the_server_holds_its_first_fpdu_until_a_first_fpdu_client_has_sent_one() {
    let (mut ctrl, data, server) = session(feature::ALL);
    assert!(
        !arrives_within(&mut ctrl, QUIET),
        "the server sent an FPDU behind its MPA Reply before the client's first \
         (Linux siw's initiator fails the connection on it)"
    );
    // The client's first FPDU releases the server's Begin.
    ctrl.write_all(&zero_length_write()).unwrap();
    let start = Instant::now();
    assert!(
        arrives_within(&mut ctrl, WAIT),
        "nothing followed the client's first FPDU within {WAIT:?}"
    );
    assert!(start.elapsed() < WAIT);
    drop((ctrl, data));
    server
        .recv_timeout(WAIT)
        .expect("the server's send ended once the client went away");
}

#[test]
fn an_older_client_without_the_feature_is_not_held_for() {
    let (mut ctrl, data, server) = session(0);
    assert!(
        arrives_within(&mut ctrl, WAIT),
        "the server waited for a first FPDU that a client of 0.4.0 never sends"
    );
    drop((ctrl, data));
    server
        .recv_timeout(WAIT)
        .expect("the server's send ended once the client went away");
}

#[test]
fn a_silent_client_that_offers_first_fpdu_holds_the_server_only_for_its_timeout() {
    // The hostile case of the hold: a client that offers FIRST_FPDU and
    // then never sends. The server's Begin stays held, and its send ends
    // with an error at the session's timeout (cfg: 3 s), not never.
    let (ctrl, data, server) = session(feature::ALL);
    let start = Instant::now();
    let failed = server
        .recv_timeout(WAIT)
        .expect("the held server's send did not end within 10 s");
    assert!(
        failed,
        "the send cannot succeed: the client granted nothing"
    );
    assert!(start.elapsed() < WAIT);
    drop((ctrl, data));
}
