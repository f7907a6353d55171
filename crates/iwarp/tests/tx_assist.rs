//! An application thread that waits for a large transfer by calling
//! `progress` pushes the partly written frame on itself when the peer makes
//! room, instead of leaving it all to the transmit thread (which, on a
//! loaded machine, may wait a scheduler tick to run).
//!
//! The peer is a raw TCP socket that completes the MPA exchange and then
//! reads nothing for a while, so the socket fills with a 16 MiB RDMA Write
//! and a frame is left half written.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;
use iwarp::{WcStatus, WrOpcode};

const LEN: usize = 16 << 20;

#[test]
fn a_polling_waiter_pushes_a_half_written_frame_on() {
    let raw = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let mut s = raw_mpa_accept(&raw);
        // Read nothing while the Write fills the socket...
        std::thread::sleep(Duration::from_millis(300));
        // ... then drain everything, slowly enough that the writer sees the
        // socket fill again and again.
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0usize;
        while total < LEN {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        total
    });

    let client = Host::new();
    client.connect(addr);
    let src = client.mr(LEN);
    client
        .qp
        .post_send(&wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 0x100,
            },
            &[src.sge(0, LEN)],
        ))
        .unwrap();
    // Wait for the Write the busy-polling way.
    let t0 = Instant::now();
    let wc = loop {
        client.scq.progress();
        if let Some(wc) = client.scq.poll_one() {
            break wc;
        }
        assert!(t0.elapsed() < 3 * T, "the Write did not complete");
    };
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let st = client.qp.stats();
    assert!(
        st.tx_polled_bytes > 0,
        "the polling thread wrote part of the frame itself: {st:?}"
    );
    assert!(st.tx_polled_bytes <= st.tx_bytes, "{st:?}");
    // The frame went out whole: the peer read at least the Write's payload.
    client.qp.disconnect();
    let got = peer.join().unwrap();
    assert!(got >= LEN, "the peer read {got} of {LEN} bytes");
}
