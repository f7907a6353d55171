//! A Send that was handed to TCP completes successfully even when the peer
//! reads it and closes the connection before the sender's driver gets back
//! to confirming the frame to the engine.
//!
//! The window is microseconds wide in normal runs (it showed up under
//! valgrind on a loaded machine); the driver's fault hook widens it to
//! 50 ms so the race happens every time. This file is its own test binary
//! because the hook is process-wide.

mod common;

use std::time::{Duration, Instant};

use common::*;
use iwarp::cm::ConnParam;
use iwarp::cm::MpaConfig;
use iwarp::{soft, WcStatus, WrOpcode};

#[test]
fn send_completes_when_the_peer_closes_right_after_receiving_it() {
    soft::fault::set_confirm_delay(Duration::from_millis(50));
    for round in 0..3 {
        let client = Host::new();
        let server = Host::new();
        let inbox = server.mr(64);
        server.post_recv(7, &inbox, 0, 64);
        let (c, s) = connect_with(
            &client,
            &server,
            &ConnParam::default(),
            MpaConfig::default(),
            &[],
        );
        c.unwrap();
        s.unwrap();

        // The server takes the message and hangs up at once, on its own
        // thread: the client's `post_send` may be the writer that pauses.
        let closer = std::thread::spawn(move || {
            let rwc = server.recv_wc();
            drop(server);
            (rwc, Instant::now())
        });
        let out = client.mr(64);
        out.write_at(0, b"last words");
        client
            .qp
            .post_send(&wr(12, WrOpcode::Send, &[out.sge(0, 10)]))
            .unwrap();
        let (rwc, closed_at) = closer.join().unwrap();
        assert_eq!(rwc.status, WcStatus::Success, "round {round}: {rwc:?}");

        let swc = client.send_wc();
        assert_eq!(
            (swc.wr_id, swc.status),
            (12, WcStatus::Success),
            "round {round}: a Send the peer received must not be flushed"
        );
        assert!(
            closed_at.elapsed() < Duration::from_secs(1),
            "round {round}: completion took {:?} after the close",
            closed_at.elapsed()
        );
        // The client still learns that the connection is gone.
        client.event(|e| matches!(e, iwarp::QpEvent::Disconnected));
    }
    soft::fault::set_confirm_delay(Duration::ZERO);
}
