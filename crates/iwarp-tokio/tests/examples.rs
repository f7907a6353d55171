//! The examples' cores, run small so they cannot rot: `verbs_copy` (RDMA
//! Write over several connections on one event loop, in both progress
//! modes) and `sockets_echo` (the sockets crate's tokio wrapper), each
//! with its own arguments parsed by its own clap definition. Each run is
//! bounded ([`T`]); each takes well under a second on loopback.

use std::time::Duration;

use clap::Parser;

#[allow(dead_code)]
#[path = "../examples/verbs_copy.rs"]
mod verbs_copy;

#[allow(dead_code)]
#[path = "../examples/sockets_echo.rs"]
mod sockets_echo;

const T: Duration = Duration::from_secs(30);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn copy(args: &[&str]) -> verbs_copy::Report {
    let o = verbs_copy::Opts::parse_from(std::iter::once("verbs_copy").chain(args.iter().copied()));
    rt().block_on(async { tokio::time::timeout(T, verbs_copy::run(&o)).await })
        .expect("the copy within T")
        .unwrap()
}

#[test]
fn verbs_copy_moves_every_connections_buffer_on_one_event_loop() {
    // 3 connections of 1 MiB + 5 bytes: chunks of 64 KiB, the last short.
    let r = copy(&[
        "-n", "3", "--size", "1048581", "--chunk", "64K", "--depth", "4", "--device", "soft",
    ]);
    assert_eq!(r.copies.len(), 3);
    assert_eq!(r.bytes(), 3 * 1048581);
    assert!(r.ok(), "{r:?}");
}

#[test]
fn verbs_copy_with_the_providers_threads() {
    let r = copy(&[
        "-n",
        "2",
        "--size",
        "256K",
        "--threaded",
        "--device",
        "soft",
    ]);
    assert_eq!(r.bytes(), 2 << 18);
    assert!(r.ok(), "{r:?}");
}

/// The check the examples' exit status rests on: one differing hash, or
/// sinks that are not the clients' buffers, is a failure.
#[test]
fn verbs_copy_reports_a_differing_sink() {
    let good = verbs_copy::Copied {
        bytes: 4,
        sent_hash: 1,
        got_hash: 1,
    };
    let r = |copies: Vec<verbs_copy::Copied>, client_hashes: Vec<u64>| verbs_copy::Report {
        copies,
        client_hashes,
        elapsed: Duration::ZERO,
    };
    assert!(r(vec![good], vec![1]).ok());
    let bad = verbs_copy::Copied {
        got_hash: 2,
        ..good
    };
    assert!(
        !r(vec![good, bad], vec![1, 1]).ok(),
        "a sink that differs from its DONE"
    );
    assert!(
        !r(vec![good, good], vec![1, 3]).ok(),
        "a client whose buffer no server holds"
    );
}

#[test]
fn verbs_copy_refuses_a_bad_size_with_the_reason() {
    let e = verbs_copy::Opts::try_parse_from(["verbs_copy", "--size", "12Q"]).unwrap_err();
    assert!(e.to_string().contains("is not a size"), "{e}");
}

/// Each client's 3 MiB are more than the 1 MiB rings hold, so the
/// server's close must wait on the blocking pool for its echo to leave
/// (a close on the event loop's one thread stalled the clients' readers
/// until the linger gave up, and the last bytes were flushed).
#[test]
fn sockets_echo_echoes_every_connection_on_one_event_loop() {
    let o = sockets_echo::Opts::parse_from([
        "sockets_echo",
        "-n",
        "3",
        "--size",
        "3145729",
        "--chunk",
        "7001",
    ]);
    let r = rt()
        .block_on(async { tokio::time::timeout(T, sockets_echo::run(&o)).await })
        .expect("the echo within T")
        .unwrap();
    assert_eq!(r.echoes.len(), 3);
    assert!(r.echoes.iter().all(|e| e.bytes == 3145729), "{r:?}");
    assert!(r.ok(), "{r:?}");
}
