//! What setting a connection up costs the progress pool (issue 29, the
//! set-up rate): a new pooled connection must not wake a pool thread.
//!
//! A new socket is writable at once, so registering it with `EPOLLOUT`
//! in its edge-triggered interest raised an event on every connection,
//! at both ends: a pool thread woke up for nothing, two context switches
//! per connection set-up. `EPOLLOUT` now joins the interest only when a
//! write first finds the socket full.
//!
//! One test (the pool's counters are process-wide).

mod common;

use common::*;
use iwarp::cm::{self, ConnParam, Listener};
use iwarp::soft::{pool_stats, set_progress_engine, ProgressEngine};
use iwarp::{QpEvent, WcStatus, WrOpcode};
use iwarp_proto::handshake::MpaConfig;

/// A connected pair without wake-up nudges (`ConnParam::wake_nudge`) on
/// either side. A nudge is a zero-length RDMA Write sent when the peer has
/// been silent for 20 ms after our last bytes, early in the connection;
/// here the server never answers, so on a slow machine (a CPU-bound
/// process beside the test, or ThreadSanitizer) the client's nudges add
/// readiness events at the server: 34 and 41 for 16 connections were seen
/// with nudges on. They are not set-up cost, which is what is counted.
fn pair_without_nudges() -> (Host, Host) {
    let (client, server) = (Host::new(), Host::new());
    let param = ConnParam {
        timeout: T,
        wake_nudge: false,
        ..Default::default()
    };
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let req = listener.get_request(Some(T)).unwrap();
            req.accept(&server.qp, &param).unwrap();
        });
        cm::connect(&client.qp, addr, &param).unwrap();
        srv.join().unwrap();
    });
    assert_eq!(client.event(|_| true), QpEvent::Established);
    assert_eq!(server.event(|_| true), QpEvent::Established);
    (client, server)
}

/// 16 pooled connections are set up, then each carries one 64-byte Send:
/// the pool threads take one readiness event per Send (the receiver's
/// `EPOLLIN`) and none for the set-up. Before the fix: one `EPOLLOUT`
/// per end on top, 48 events for 16 connections.
#[test]
fn setting_up_a_pooled_connection_wakes_no_pool_thread() {
    set_progress_engine(ProgressEngine::Pool);
    const N: usize = 16;
    let before = pool_stats().events;
    let pairs: Vec<(Host, Host)> = (0..N).map(|_| pair_without_nudges()).collect();
    // One message per pair: when its receive completes, its pool thread
    // has run past every event queued at set-up (an EPOLLOUT edge would
    // have been raised when the sockets joined the pool, before it).
    for (i, (client, server)) in pairs.iter().enumerate() {
        let src = client.mr(64);
        let dst = server.mr(64);
        src.write_at(0, &pattern(64, i as u8));
        server.post_recv(1, &dst, 0, 64);
        client
            .qp
            .post_send(&wr(2, WrOpcode::Send, &[src.sge(0, 64)]))
            .unwrap();
        let wc = server.recv_wc();
        assert_eq!(wc.status, WcStatus::Success, "pair {i}: {wc:?}");
        assert_eq!(client.send_wc().status, WcStatus::Success, "pair {i}");
        let mut got = vec![0u8; 64];
        dst.read_at(0, &mut got);
        assert_eq!(got, pattern(64, i as u8), "pair {i}");
    }
    let stats = pool_stats();
    assert_eq!(stats.connections, 2 * N, "every end is pooled");
    let events = stats.events - before;
    assert!(
        events < 2 * N as u64,
        "the pool threads took {events} readiness events for {N} connections that each \
         carried one Send: set-up itself must raise none (a socket registered with EPOLLOUT \
         raises one at once, per end)"
    );
}
