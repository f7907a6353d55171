//! A peer process killed mid-transfer (SIGKILL: no goodbye, the kernel
//! resets the connection): every outstanding work request on the survivor
//! completes with a flush error within one second, and no thread is left
//! blocked.
//!
//! The test re-runs its own binary as the peer: with `IWARP_KILL_PEER` set,
//! `peer_process` listens, accepts, serves RDMA Reads and Writes from its
//! driver threads and otherwise sleeps until it is killed.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use iwarp::cm::{ConnParam, Listener, MpaConfig};
use iwarp::{WcStatus, WrOpcode};

const REGION: usize = 8 << 20;

#[test]
fn peer_process() {
    if std::env::var_os("IWARP_KILL_PEER").is_none() {
        return; // Only meaningful as the child of the test below.
    }
    let server = Host::new();
    let mr = server.mr(REGION);
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    println!("LISTEN {}", listener.local_addr());
    let req = listener.get_request(Some(T)).unwrap();
    let mut pdata = mr.addr().to_be_bytes().to_vec();
    pdata.extend_from_slice(&mr.rkey().to_be_bytes());
    req.accept(
        &server.qp,
        &ConnParam {
            private_data: pdata,
            ..Default::default()
        },
    )
    .unwrap();
    // Serve until killed (bounded so a broken parent cannot leak us).
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn killed_peer_flushes_everything_within_a_second() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env("IWARP_KILL_PEER", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("peer printed its address").unwrap();
        // libtest may print "test peer_process ... " on the same line.
        if let Some(at) = line.find("LISTEN ") {
            break line[at + 7..].trim().parse().unwrap();
        }
    };
    let client = Host::new();
    let pdata = client.connect(addr);
    let remote = u64::from_be_bytes(pdata[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(pdata[8..12].try_into().unwrap());
    let local = client.mr(REGION);
    // Keep the send queue full of large Writes and Reads.
    let mut posted = 0u64;
    for i in 0..48u64 {
        let op = if i % 2 == 0 {
            WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey,
            }
        } else {
            WrOpcode::RdmaRead {
                remote_addr: remote + (1 << 20),
                rkey,
            }
        };
        // Writes gather from the first MiB, Reads land in the second: a
        // verbs consumer must not let one outstanding operation write
        // bytes another one reads (ThreadSanitizer reports it as a race).
        let at = if i % 2 == 0 { 0 } else { 1 << 20 };
        if client
            .qp
            .post_send(&wr(i, op, &[local.sge(at, 1 << 20)]))
            .is_ok()
        {
            posted += 1;
        }
    }
    // Let the transfer get going, then kill the peer.
    let first = wait_wc(&client.scq);
    assert_eq!(first.status, WcStatus::Success);
    let mut done = 1u64;
    child.kill().unwrap();
    let killed = Instant::now();
    let mut flushed = 0;
    while done < posted {
        let wc = client
            .scq
            .wait_one(Duration::from_secs(2))
            .unwrap()
            .unwrap_or_else(|| panic!("only {done} of {posted} completions after the kill"));
        done += 1;
        if wc.status == WcStatus::WrFlushErr {
            flushed += 1;
        } else {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
    }
    let took = killed.elapsed();
    child.wait().unwrap();
    assert!(flushed > 0, "the kill interrupted the transfer");
    assert!(
        took < Duration::from_secs(1),
        "all flushed {took:?} after the kill"
    );
    assert_eq!(client.qp.state(), iwarp::QpState::Error);
    // The QP's driver threads are gone: disconnect returns promptly.
    let t0 = Instant::now();
    client.qp.disconnect();
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// `disconnect` of an idle connection does not sit out its linger time:
/// the wait for the last frames ends as soon as a writer reports that
/// nothing is left (or at once when nothing was queued).
#[test]
fn disconnecting_an_idle_connection_is_prompt() {
    for _ in 0..5 {
        let (client, server) = common::pair();
        let t = std::time::Instant::now();
        client.qp.disconnect();
        let took = t.elapsed();
        assert!(
            took < std::time::Duration::from_millis(500),
            "disconnect took {took:?} (linger is {:?})",
            iwarp::soft::LINGER
        );
        assert_eq!(
            server.qp.next_event(common::T),
            Some(iwarp::QpEvent::Disconnected),
            "the peer saw the close"
        );
    }
}

/// The same with application-driven CQs, whose receive thread is parked:
/// teardown wakes it instead of waiting out its park slice (100 ms), so
/// even the fastest of five disconnects took 100 ms before.
#[test]
fn disconnecting_an_app_driven_connection_does_not_wait_for_the_parked_receive_thread() {
    let driven = iwarp::ProgressMode::AppDriven {
        spin: Duration::ZERO,
    };
    let mut fastest = Duration::MAX;
    for _ in 0..5 {
        let (client, _server) = pair_with(MpaConfig::default(), |c, _| {
            c.scq.set_progress(driven).unwrap();
            c.rcq.set_progress(driven).unwrap();
        });
        // Wait until the receive thread is parked (it steps aside once).
        let t0 = Instant::now();
        while client.qp.stats().rx_steps_aside == 0 {
            assert!(t0.elapsed() < T, "the receive thread never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        client.qp.disconnect();
        fastest = fastest.min(t.elapsed());
    }
    assert!(
        fastest < Duration::from_millis(50),
        "the fastest of five disconnects took {fastest:?}"
    );
}
