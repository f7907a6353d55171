//! Closing a session costs one round trip, not one per connection
//! (issue 27): each connection's graceful close waits for the peer's FIN
//! (iwarp-soft, `close_gracefully`), so the session closes its control and
//! data connections at once. A relay between the two ends holds every
//! half-close for `HOLD` before passing it on, as a long path would: one
//! after the other, 5 connections took at least 5 x `HOLD`.
//!
//! Every wait is bounded: the drop runs on a thread the test waits for with
//! a timeout.

use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_xfer::{connect, Config, Mode, XferListener};

const WAIT: Duration = Duration::from_secs(20);
/// How long the relay holds each half-close.
const HOLD: Duration = Duration::from_millis(400);
const STREAMS: u32 = 4;

/// Copy `from` to `to`; at `from`'s end, wait `HOLD`, then half-close `to`.
fn pump(mut from: TcpStream, to: TcpStream) {
    let mut to_w = to.try_clone().unwrap();
    let mut buf = [0u8; 65536];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    thread::sleep(HOLD);
    let _ = to.shutdown(Shutdown::Write);
}

/// A relay to `target` for every connection it accepts; returns its address.
fn holding_relay(target: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(s) = TcpStream::connect(target) else {
                return;
            };
            for x in [&c, &s] {
                let _ = x.set_nodelay(true);
                x.set_read_timeout(Some(WAIT)).unwrap();
            }
            let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            thread::spawn(move || pump(c, s2));
            thread::spawn(move || pump(s, c2));
        }
    });
    addr
}

#[test]
fn a_session_closes_its_connections_at_once() {
    let c = Config {
        streams: STREAMS,
        block_size: 64 << 10,
        iodepth: 2,
        timeout: WAIT,
        connect_timeout: WAIT,
        ..Config::default()
    };
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, c.clone()).unwrap();
    let (target, token) = (l.local_addr(), l.token());
    let relay = holding_relay(target);
    let t = thread::spawn(move || l.accept(WAIT).unwrap());
    let mut a = connect(relay, Mode::Rdma, token, c).unwrap();
    let mut b = ManuallyDrop::new(t.join().unwrap());
    // A transfer first, so every connection has carried data.
    thread::scope(|s| {
        let h = s.spawn(|| b.recv(&mut rdma_xfer::NullSink::default()).unwrap());
        a.send(&mut rdma_xfer::ZeroSource::new(16 << 16)).unwrap();
        assert_eq!(h.join().unwrap().bytes, 16 << 16);
    });
    assert_eq!(a.config().streams, STREAMS);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t0 = Instant::now();
        drop(a);
        let _ = tx.send(t0.elapsed());
    });
    let took = rx.recv_timeout(WAIT).expect("the session's drop ended");
    // 1 control + STREAMS data connections, each held HOLD at least once.
    assert!(
        took < 3 * HOLD,
        "closing {} connections took {took:?}: one after the other, not at once (each \
         waits {HOLD:?} here for the peer's FIN)",
        STREAMS + 1
    );
    // `b` is left undropped (its connections are closed by now; a drop
    // that hung would hang the test).
    let _ = &b;
}
