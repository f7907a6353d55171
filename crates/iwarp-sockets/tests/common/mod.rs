//! Helpers shared by this crate's integration tests.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use iwarp_sockets::{Listener, Options, Stream};

/// A connected pair over loopback with default options: (client, server).
/// `bound` limits the wait for the accepting thread.
pub fn pair(bound: Duration) -> (Stream, Stream) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let l = Listener::bind_with(any, &Options::default()).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        tx.send(s).unwrap();
    });
    let c = Stream::connect_with(addr, &Options::default()).unwrap();
    let s = rx.recv_timeout(bound).expect("accepted in time");
    h.join().unwrap();
    (c, s)
}
