//! Issue requirement "Progress": one-sided operations complete without the
//! target application calling into the library. The target's only thread
//! spins on pure computation (no verbs call, no CQ poll) while the
//! initiator RDMA-Reads and RDMA-Writes its registered region; the
//! library's own driver threads must answer.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use iwarp::{WcStatus, WrOpcode};

#[test]
fn reads_and_writes_complete_while_the_target_computes() {
    let (client, server) = pair();
    let target = server.mr(1 << 20);
    target.write_at(0, &pattern(1 << 20, 0x42));
    let sink = client.mr(1 << 20);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // The target application: busy computing, never calling in.
        let busy = s.spawn(|| {
            let mut x = 1u64;
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(10) {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            }
            x
        });
        let t0 = Instant::now();
        for round in 0..4u64 {
            client
                .qp
                .post_send(&wr(
                    round,
                    WrOpcode::RdmaRead {
                        remote_addr: target.addr(),
                        rkey: target.rkey(),
                    },
                    &[sink.sge(0, 1 << 20)],
                ))
                .unwrap();
            let wc = client.send_wc();
            assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
        }
        let src = client.mr(4096);
        src.write_at(0, &pattern(4096, 7));
        client
            .qp
            .post_send(&wr(
                9,
                WrOpcode::RdmaWrite {
                    remote_addr: target.addr() + 8192,
                    rkey: target.rkey(),
                },
                &[src.sge(0, 4096)],
            ))
            .unwrap();
        assert_eq!(client.send_wc().status, WcStatus::Success);
        // A Read after the Write returns the written bytes: the Write was
        // placed by the target's driver, not by its application.
        client
            .qp
            .post_send(&wr(
                10,
                WrOpcode::RdmaRead {
                    remote_addr: target.addr() + 8192,
                    rkey: target.rkey(),
                },
                &[sink.sge(0, 4096)],
            ))
            .unwrap();
        assert_eq!(client.send_wc().status, WcStatus::Success);
        let elapsed = t0.elapsed();
        assert!(
            !busy.is_finished(),
            "the target was still computing throughout"
        );
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        let mut got = vec![0u8; 4096];
        sink.read_at(0, &mut got);
        assert_eq!(got, pattern(4096, 7));
        assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    });
    let mut head = vec![0u8; 64];
    target.read_at(0, &mut head);
    assert_eq!(head, pattern(1 << 20, 0x42)[..64].to_vec());
}
