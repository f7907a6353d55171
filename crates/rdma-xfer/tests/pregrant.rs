//! The two round trips issue 27 removed from a transfer, and the wire
//! compatibility with peers of 0.4.0 and earlier:
//!
//! - **Pregrant.** A sink that knows a transfer is coming grants its
//!   blocks before the source's `Begin` (`Transport::prepare_recv`,
//!   negotiated as `hello::feature::PREGRANT`), so the source's first
//!   block needs no grant round trip after its `Begin`.
//! - **Unconfirmed send.** `Transport::send_unconfirmed` returns once the
//!   source's part is done, without the round trip for the sink's `Fin`;
//!   `confirm` (or the next transfer) checks the `Fin`.
//!
//! The first test shows both by counting, not timing: with the sink's
//! blocks granted ahead, the source's whole transfer completes while the
//! sink's application has not even started to receive, which is possible
//! only if the source waited for nothing from the sink after its `Begin`.
//! Every wait is bounded.

use std::io::Cursor;
use std::sync::mpsc;
use std::time::Duration;

use rdma_xfer::hello::feature;
use rdma_xfer::{connect, Config, Mode, ReadSource, Transport, WriteSink, XferListener};
use sha2::{Digest, Sha256};

const BS: u32 = 64 << 10;

fn cfg(features: u32) -> Config {
    Config {
        streams: 2,
        block_size: BS,
        iodepth: 2,
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        features,
        ..Config::default()
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}

/// A connected pair (active, passive), each with its own features.
fn pair(mode: Mode, active: u32, passive: u32) -> (Box<dyn Transport>, Box<dyn Transport>) {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), mode, cfg(passive)).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let t = std::thread::spawn(move || l.accept(Duration::from_secs(10)).unwrap());
    let a = connect(addr, mode, token, cfg(active)).unwrap();
    (a, t.join().unwrap())
}

#[test]
fn a_pregranted_source_finishes_before_the_sink_starts_to_receive() {
    let (mut sink, mut source) = pair(Mode::Rdma, feature::ALL, feature::ALL);
    assert_eq!(sink.config().features, feature::ALL);
    assert_eq!(source.config().features, feature::ALL);
    // 3 blocks in a pool of 4: the sink grants them all ahead.
    let data = pattern(3 * BS as usize - 100, 1);
    sink.prepare_recv(Some(data.len() as u64)).unwrap();
    let (done_tx, done) = mpsc::channel();
    let sent = data.clone();
    let src = std::thread::spawn(move || {
        let r = source.send_unconfirmed(&mut ReadSource(Cursor::new(sent)));
        let _ = done_tx.send(r.map(|st| st.bytes).map_err(|e| e.to_string()));
        source
    });
    // The sink's application has not called recv: nothing answers the
    // Begin, and no Fin can come. The source must finish anyway.
    let r = done.recv_timeout(Duration::from_secs(20)).expect(
        "the source did not finish its transfer while the sink had granted its blocks ahead: \
         it waited for something from the sink (a grant after Begin, or the Fin)",
    );
    assert_eq!(r.unwrap(), data.len() as u64);
    let mut source = src.join().unwrap();
    let mut got = WriteSink(Vec::new());
    let st = sink.recv(&mut got).unwrap();
    assert_eq!(st.bytes, data.len() as u64);
    assert_eq!(Sha256::digest(&got.0), Sha256::digest(&data));
    source.confirm().expect("the sink's Fin");
}

/// Transfers in both directions, each as the application would do it:
/// the sink prepares (or not), the source sends confirmed or unconfirmed;
/// one side prepares to receive and sends first (the pregrant waits for
/// the transfer it is for). Also larger than the pool (grants asked for
/// as it goes).
fn mixed(mode: Mode, active: u32, passive: u32) {
    let (mut a, mut b) = pair(mode, active, passive);
    let shared = active & passive & feature::ALL;
    let want = if mode == Mode::Rdma { shared } else { 0 };
    assert_eq!(a.config().features, want, "{mode} {active} {passive}");
    assert_eq!(b.config().features, want, "{mode} {active} {passive}");
    let sizes = [
        0usize,
        1,
        BS as usize,
        3 * BS as usize + 7,
        40 * BS as usize + 123,
    ];
    for (i, len) in sizes.into_iter().enumerate() {
        let data = pattern(len, i as u8);
        let (src, dst) = if i % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        if i % 3 != 2 {
            dst.prepare_recv(Some(len as u64).filter(|_| i != 4))
                .unwrap();
        }
        if i == 1 {
            // A prepares for its next receive, then sends first: B
            // receives 1 byte from... the pregrant is for what A receives
            // next, untouched by A's own send.
            src.prepare_recv(None).unwrap();
        }
        let got = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut sink = WriteSink(Vec::new());
                let st = dst.recv(&mut sink).unwrap();
                assert_eq!(st.bytes, len as u64);
                sink.0
            });
            let mut r = ReadSource(Cursor::new(&data[..]));
            let st = if i % 2 == 0 {
                src.send_unconfirmed(&mut r).unwrap()
            } else {
                src.send(&mut r).unwrap()
            };
            assert_eq!(st.bytes, len as u64);
            h.join().unwrap()
        });
        assert_eq!(
            Sha256::digest(&got),
            Sha256::digest(&data),
            "{mode} {active} {passive} len {len}"
        );
    }
    a.confirm().unwrap();
    b.confirm().unwrap();
}

#[test]
fn rdma_new_with_new_and_with_an_older_peer_either_side() {
    // 0 is how a peer of 0.4.0 and earlier sets up (the short Hello and
    // HelloAck, no features).
    for (active, passive) in [
        (feature::ALL, feature::ALL),
        (0, feature::ALL),
        (feature::ALL, 0),
    ] {
        mixed(Mode::Rdma, active, passive);
    }
}

#[test]
fn tcp_mode_has_no_features_and_defers_the_fin_too() {
    mixed(Mode::Tcp, feature::ALL, feature::ALL);
}
