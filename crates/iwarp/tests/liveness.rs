//! A peer that goes silent without closing (ConnParam::peer_timeout): the
//! connection runs through a relay in this test that can stop forwarding
//! while keeping both TCP connections open, as a dead middlebox or a
//! blackholed path does. Outstanding RDMA Reads must then fail within the
//! configured time; a slow but live path must not be cut.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{loopback, wr, Host, T};
use iwarp::cm::{self, ConnParam, Listener};
use iwarp::{QpEvent, WcStatus, WrOpcode};
use iwarp_proto::handshake::MpaConfig;

/// A TCP relay on 127.0.0.1 to `to`, for one connection. While `forward`
/// is false it neither reads nor writes (the kernel still acknowledges
/// what fits in its buffers); every chunk waits `delay_ms` first.
struct Relay {
    addr: SocketAddr,
    forward: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
}

impl Relay {
    fn start(to: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let forward = Arc::new(AtomicBool::new(true));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (f, d) = (forward.clone(), delay_ms.clone());
        std::thread::spawn(move || {
            let (a, _) = l.accept().unwrap();
            let b = TcpStream::connect(to).unwrap();
            let pump = |mut from: TcpStream, mut to: TcpStream| {
                let (f, d) = (f.clone(), d.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        while !f.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        std::thread::sleep(Duration::from_millis(d.load(Ordering::Relaxed)));
                        while !f.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            };
            pump(a.try_clone().unwrap(), b.try_clone().unwrap());
            pump(b, a);
        });
        Relay {
            addr,
            forward,
            delay_ms,
        }
    }
}

/// Client connected to server through a relay; the client's peer_timeout
/// is `timeout`. Returns (client, server, relay, server's buffer).
fn relayed(timeout: Duration) -> (Host, Host, Relay, iwarp::MemoryRegion) {
    relayed_with(timeout, Duration::ZERO)
}

/// As [`relayed`], with the client's probe_interval `probe`.
fn relayed_with(timeout: Duration, probe: Duration) -> (Host, Host, Relay, iwarp::MemoryRegion) {
    let (client, server) = (Host::new(), Host::new());
    let src = server.mr(64 << 10);
    src.write_at(0, &common::pattern(64 << 10, 7));
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let relay = Relay::start(listener.local_addr());
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.get_request(Some(T)).unwrap();
            req.accept(&server.qp, &ConnParam::default()).unwrap();
        });
        cm::connect(
            &client.qp,
            relay.addr,
            &ConnParam {
                timeout: T,
                peer_timeout: timeout,
                probe_interval: probe,
                ..Default::default()
            },
        )
        .unwrap();
    });
    assert_eq!(client.event(|_| true), QpEvent::Established);
    (client, server, relay, src)
}

fn read(c: &Host, id: u64, sink: &iwarp::MemoryRegion, src: &iwarp::MemoryRegion) {
    c.qp.post_send(&wr(
        id,
        WrOpcode::RdmaRead {
            remote_addr: src.addr(),
            rkey: src.rkey(),
        },
        &[sink.sge(0, 64 << 10)],
    ))
    .unwrap();
}

#[test]
fn reads_to_a_peer_that_went_silent_fail_within_the_peer_timeout() {
    let (c, _s, relay, src) = relayed(Duration::from_secs(1));
    let sink = c.mr(64 << 10);
    read(&c, 1, &sink, &src);
    assert_eq!(c.send_wc().status, WcStatus::Success);
    assert_eq!(sink.to_vec(), src.to_vec());

    relay.forward.store(false, Ordering::Relaxed);
    let t0 = Instant::now();
    read(&c, 2, &sink, &src);
    read(&c, 3, &sink, &src);
    let wc = c.send_wc();
    let took = t0.elapsed();
    assert_eq!(wc.wr_id, 2);
    assert_eq!(wc.status, WcStatus::WrFlushErr);
    assert_eq!(c.send_wc().status, WcStatus::WrFlushErr);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "flushed after {took:?}, peer_timeout 1 s"
    );
    // The event says why, then the disconnect follows.
    let QpEvent::PeerTimeout(why) = c.event(|e| matches!(e, QpEvent::PeerTimeout(_))) else {
        unreachable!()
    };
    assert!(why.contains("RDMA Read"), "{why}");
    assert_eq!(c.event(|_| true), QpEvent::Disconnected);
}

#[test]
fn a_slow_but_live_path_is_not_cut() {
    // Each chunk waits 400 ms in each direction: a Read takes > 800 ms,
    // close to the 1 s peer_timeout, yet the peer answers every time.
    let (c, _s, relay, src) = relayed(Duration::from_secs(1));
    let sink = c.mr(64 << 10);
    relay.delay_ms.store(400, Ordering::Relaxed);
    for id in 1..=3 {
        read(&c, id, &sink, &src);
        let wc = c.send_wc();
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    // Idle with nothing owed, longer than the timeout: still connected.
    std::thread::sleep(Duration::from_millis(1500));
    relay.delay_ms.store(0, Ordering::Relaxed);
    read(&c, 9, &sink, &src);
    assert_eq!(c.send_wc().status, WcStatus::Success);
}

#[test]
fn without_a_peer_timeout_the_read_stays_outstanding() {
    // The guard is what ends the wait: with peer_timeout zero nothing
    // completes in 2.5 s (TCP itself would take minutes).
    let (c, _s, relay, src) = relayed(Duration::ZERO);
    let sink = c.mr(64 << 10);
    relay.forward.store(false, Ordering::Relaxed);
    read(&c, 1, &sink, &src);
    assert!(c
        .scq
        .wait_one(Duration::from_millis(2500))
        .unwrap()
        .is_none());
    // Forwarding again, the Read completes: it was only waiting.
    relay.forward.store(true, Ordering::Relaxed);
    assert_eq!(c.send_wc().status, WcStatus::Success);
}

/// Post `n` RDMA Writes of `len` bytes from `c` to `dst` and return when
/// all have completed (or `limit` passed): (completions, time taken).
fn writes_until_done(
    c: &Host,
    n: u64,
    len: usize,
    dst: &iwarp::MemoryRegion,
    limit: Duration,
) -> (Vec<iwarp::WorkCompletion>, Duration) {
    let src = c.mr(len);
    let t0 = Instant::now();
    for id in 1..=n {
        c.qp.post_send(&wr(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &[src.sge(0, len)],
        ))
        .unwrap();
    }
    let mut wcs = Vec::new();
    while (wcs.len() as u64) < n {
        let left = limit.saturating_sub(t0.elapsed());
        match c.scq.wait_one(left).unwrap() {
            Some(wc) => wcs.push(wc),
            None => break,
        }
    }
    (wcs, t0.elapsed())
}

#[test]
fn writes_that_fill_the_socket_to_a_silent_peer_fail_within_the_peer_timeout() {
    // The relay stops reading: its kernel takes what fits in its receive
    // buffer, then advertises a zero window; our socket fills and the
    // later Writes cannot be handed to TCP. They must complete with an
    // error, not wait for TCP's persist timer (which never gives up on a
    // peer that answers its window probes).
    let (c, s, relay, _src) = relayed(Duration::from_secs(1));
    let dst = s.mr(4 << 20);
    relay.forward.store(false, Ordering::Relaxed);
    let (wcs, took) = writes_until_done(&c, 48, 4 << 20, &dst, Duration::from_secs(8));
    assert_eq!(
        wcs.len(),
        48,
        "only {} of 48 Writes completed in {took:?}",
        wcs.len()
    );
    assert!(
        wcs.iter().any(|wc| wc.status == WcStatus::WrFlushErr),
        "192 MiB cannot all fit into socket buffers: {:?}",
        wcs.iter().map(|w| w.status).collect::<Vec<_>>()
    );
    assert!(
        took < Duration::from_millis(4000),
        "flushed after {took:?}, peer_timeout 1 s"
    );
    c.event(|e| matches!(e, QpEvent::PeerTimeout(_) | QpEvent::Disconnected));
}

#[test]
fn writes_through_a_slow_but_live_path_are_not_cut() {
    // 20 ms per chunk of at most 64 KiB each way (under 3.2 MB/s): 16 MiB
    // of Writes keep our socket full for seconds, but it keeps draining,
    // so nothing is given up.
    let (c, s, relay, _src) = relayed(Duration::from_secs(1));
    let dst = s.mr(2 << 20);
    relay.delay_ms.store(20, Ordering::Relaxed);
    let (wcs, took) = writes_until_done(&c, 8, 2 << 20, &dst, Duration::from_secs(40));
    assert_eq!(
        wcs.len(),
        8,
        "only {} of 8 Writes completed in {took:?}",
        wcs.len()
    );
    assert!(
        took > Duration::from_secs(2),
        "the path was not slow: {took:?}"
    );
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success, "after {took:?}");
    }
}

#[test]
fn an_idle_connection_with_probing_notices_a_stalled_path() {
    // Nothing is outstanding but a posted receive: only the probe (a
    // zero-length RDMA Read after 500 ms of silence) can find out that the
    // relay stopped forwarding; its response never comes, so 1 s later the
    // connection is given up and the receive flushes.
    let (c, _s, relay, _src) = relayed_with(Duration::from_secs(1), Duration::from_millis(500));
    let rb = c.mr(64);
    c.post_recv(5, &rb, 0, 64);
    relay.forward.store(false, Ordering::Relaxed);
    let t0 = Instant::now();
    let QpEvent::PeerTimeout(why) = c.event(|e| matches!(e, QpEvent::PeerTimeout(_))) else {
        unreachable!()
    };
    let took = t0.elapsed();
    assert!(why.contains("RDMA Read"), "{why}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(3500),
        "noticed after {took:?}: probe 0.5 s + peer_timeout 1 s"
    );
    let wc = c.recv_wc();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
    assert_eq!(c.event(|_| true), QpEvent::Disconnected);
}

#[test]
fn without_probing_an_idle_stalled_path_goes_unnoticed() {
    // The probe is what notices it: with probe_interval zero nothing
    // happens (TCP keepalive would not either: the relay's kernel answers).
    let (c, _s, relay, _src) = relayed_with(Duration::from_secs(1), Duration::ZERO);
    relay.forward.store(false, Ordering::Relaxed);
    assert_eq!(c.qp.next_event(Duration::from_millis(3000)), None);
}

#[test]
fn probes_through_a_slow_but_live_path_are_answered() {
    // 300 ms per chunk each way: every probe is answered in about 600 ms,
    // under the 1 s peer_timeout; idle for 4 s (a dozen probes), the
    // connection stays up, no probe shows up as a completion, and Reads
    // still work.
    let (c, _s, relay, src) = relayed_with(Duration::from_secs(1), Duration::from_millis(300));
    relay.delay_ms.store(300, Ordering::Relaxed);
    let tx0 = c.qp.stats().tx_bytes;
    assert_eq!(c.qp.next_event(Duration::from_millis(4000)), None);
    // Probes went out (a Read Request FPDU is 44 bytes without CRC).
    let probed = c.qp.stats().tx_bytes - tx0;
    assert!(
        probed >= 3 * 44,
        "only {probed} bytes sent while idle: no probes"
    );
    assert!(
        c.scq.wait_one(Duration::ZERO).unwrap().is_none(),
        "a probe completed in the CQ"
    );
    relay.delay_ms.store(0, Ordering::Relaxed);
    let sink = c.mr(64 << 10);
    read(&c, 9, &sink, &src);
    let wc = c.send_wc();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
    assert_eq!(sink.to_vec(), src.to_vec());
}
