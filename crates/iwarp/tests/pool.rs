//! The progress pool (`iwarp::soft::pool`, issue 29 item 2): many
//! connections of one process served by a fixed set of threads, every
//! completion's data checked, and connections that leave the pool cleanly
//! when they are closed or the peer goes away mid-transfer.
//!
//! Every test here switches this test process to the pool
//! (`set_progress_engine`) and takes `SERIAL`, because they count the
//! process's threads and the pool's registrations.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use iwarp::cm::{self, ConnParam, Listener};
use iwarp::soft::{pool_stats, set_progress_engine, ProgressEngine};
use iwarp::{Access, QpEvent, QpInitAttr, QueuePair, RecvWr, SgList, WcStatus, WrOpcode};
use iwarp_proto::handshake::MpaConfig;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_progress_engine(ProgressEngine::Pool);
    g
}

/// Threads of this process now (/proc/self/task).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Wait (bounded) until the pool serves `n` connections.
fn pool_connections_reach(n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = pool_stats().connections;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool still serves {now} connections, expected {n} (a leaked registration)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn byte(conn: usize, i: usize, salt: u8) -> u8 {
    (conn.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8 ^ salt
}

/// 1,000 connections between two sides of this process (64-byte RDMA
/// Write then 64-byte Send on each), on at most 8 threads beyond the
/// test's own; each Send's payload and each Write's placement checked.
#[test]
fn a_thousand_connections_on_a_fixed_set_of_threads() {
    let _g = serial();
    let n: usize = std::env::var("POOL_TEST_CONNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    const MSG: usize = 64;
    let t0 = Instant::now();
    let base_threads = threads();

    let sctx = iwarp::Context::open().unwrap();
    let spd = sctx.alloc_pd();
    let scq = sctx.create_cq(2 * n + 16).unwrap();
    let wmr = spd.reg_mr(n * MSG, Access::ALL).unwrap();
    let rmr = spd.reg_mr(n * MSG, Access::ALL).unwrap();
    let cctx = iwarp::Context::open().unwrap();
    let cpd = cctx.alloc_pd();
    let ccq = cctx.create_cq(2 * n + 16).unwrap();
    let src = cpd.reg_mr(2 * n * MSG, Access::ALL).unwrap();
    let data: Vec<u8> = (0..2 * n * MSG)
        .map(|i| byte(i / (2 * MSG), i % (2 * MSG), 0x5a))
        .collect();
    src.write_at(0, &data);

    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let addr = listener.local_addr();
    let mut pd = wmr.addr().to_be_bytes().to_vec();
    pd.extend_from_slice(&wmr.rkey().to_be_bytes());
    let attr = |cq: &iwarp::CompletionQueue| QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        max_send_wr: 4,
        max_recv_wr: 4,
    };
    let (clients, servers): (Vec<QueuePair>, Vec<QueuePair>) = std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let mut qps = Vec::with_capacity(n);
            for i in 0..n {
                let req = listener.get_request(Some(T)).unwrap();
                let qp = spd.create_qp(&attr(&scq)).unwrap();
                qp.post_recv(&RecvWr {
                    wr_id: i as u64,
                    sgl: SgList::single(rmr.sge(i * MSG, MSG)),
                })
                .unwrap();
                req.accept(
                    &qp,
                    &ConnParam {
                        private_data: pd.clone(),
                        timeout: T,
                        ..Default::default()
                    },
                )
                .unwrap();
                qps.push(qp);
            }
            qps
        });
        let mut qps = Vec::with_capacity(n);
        for _ in 0..n {
            let qp = cpd.create_qp(&attr(&ccq)).unwrap();
            cm::connect(
                &qp,
                addr,
                &ConnParam {
                    timeout: T,
                    ..Default::default()
                },
            )
            .unwrap();
            qps.push(qp);
        }
        (qps, srv.join().unwrap())
    });
    let setup = t0.elapsed();
    assert_eq!(pool_stats().connections, 2 * n);
    let live_threads = threads();
    let pool_threads = pool_stats().threads;
    assert!(
        live_threads <= base_threads + 8,
        "{live_threads} threads with {} connections ({base_threads} before, {pool_threads} in \
         the pool): the pool must serve them from a fixed set",
        2 * n
    );

    let t1 = Instant::now();
    for (i, qp) in clients.iter().enumerate() {
        let off = i * 2 * MSG;
        let remote_addr = wmr.addr() + (i * MSG) as u64;
        qp.post_send_list(&[
            wr(
                2 * i as u64,
                WrOpcode::RdmaWrite {
                    remote_addr,
                    rkey: wmr.rkey(),
                },
                &[src.sge(off, MSG)],
            ),
            wr(2 * i as u64 + 1, WrOpcode::Send, &[src.sge(off + MSG, MSG)]),
        ])
        .unwrap();
    }
    // Every Send arrives whole, on its own connection, after its Write.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = vec![false; n];
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        let wc = scq
            .wait_one(left)
            .unwrap()
            .expect("timed out waiting for the Sends");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let i = wc.wr_id as usize;
        assert!(!got[i], "two receive completions for connection {i}");
        got[i] = true;
        assert_eq!(wc.byte_len as usize, MSG);
        let mut b = [0u8; MSG];
        rmr.read_at(i * MSG, &mut b);
        assert_eq!(
            b[..],
            data[i * 2 * MSG + MSG..(i + 1) * 2 * MSG],
            "Send {i}"
        );
        wmr.read_at(i * MSG, &mut b);
        assert_eq!(b[..], data[i * 2 * MSG..i * 2 * MSG + MSG], "Write {i}");
    }
    let mut sent = vec![0u8; n];
    for _ in 0..2 * n {
        let left = deadline.saturating_duration_since(Instant::now());
        let wc = ccq
            .wait_one(left)
            .unwrap()
            .expect("timed out waiting for the send completions");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        sent[wc.wr_id as usize / 2] += 1;
    }
    assert!(sent.iter().all(|&c| c == 2));
    let transfer = t1.elapsed();

    let t2 = Instant::now();
    drop(clients);
    drop(servers);
    pool_connections_reach(0, Duration::from_secs(10));
    eprintln!(
        "{n} connection pairs: set-up {setup:.2?}, transfer {transfer:.2?}, teardown {:.2?}; \
         {live_threads} threads ({base_threads} before, {pool_threads} pool threads)",
        t2.elapsed()
    );
}

/// A peer that goes away in the middle of a large Write: the survivor's
/// Write ends (flushed or failed), it sees the disconnect, and its
/// connection leaves the pool while its QP is still alive; then a new pair
/// (whose sockets may reuse the old descriptor numbers) works.
#[test]
fn a_peer_gone_mid_transfer_leaves_the_pool_cleanly() {
    let _g = serial();
    let before = pool_stats().connections;
    const BIG: usize = 32 << 20;
    let (client, server) = pair_with(MpaConfig::default(), |_, _| {});
    pool_connections_reach(before + 2, T);
    let target = server.mr(BIG);
    let src = client.mr(BIG);
    client
        .qp
        .post_send(&wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: target.addr(),
                rkey: target.rkey(),
            },
            &[src.sge(0, BIG)],
        ))
        .unwrap();
    drop(server);
    let wc = client.send_wc();
    assert_eq!(wc.wr_id, 1);
    client.event(|e| matches!(e, QpEvent::Disconnected));
    pool_connections_reach(before, T);
    drop((target, client, src));

    // Descriptors are reused now: a fresh pair must be routed correctly.
    let (client, server) = pair_with(MpaConfig::default(), |_, _| {});
    let msg = pattern(4096, 7);
    let (s, r) = (client.mr(4096), server.mr(4096));
    s.write_at(0, &msg);
    server.post_recv(9, &r, 0, 4096);
    client
        .qp
        .post_send(&wr(3, WrOpcode::Send, &[s.sge(0, 4096)]))
        .unwrap();
    assert_eq!(client.send_wc().status, WcStatus::Success);
    let wc = server.recv_wc();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
    assert_eq!(r.to_vec(), msg);
    drop((client, server));
    pool_connections_reach(before, T);
}
