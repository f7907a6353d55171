//! TCP congestion control of a stream (`TCP_CONGESTION`, tcp(7)):
//! [`Options::congestion`] on the connecting side and on the listener
//! (inherited by accepted streams), read back with
//! `Stream::tcp_congestion`, changed on a live stream as a TCP socket's
//! setsockopt would, and an algorithm the kernel lacks refused with
//! `ENOENT`'s kind and a message that says where to look. Every wait is
//! bounded.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use iwarp_sockets::{Listener, Options, Stream};

const T: Duration = Duration::from_secs(20);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn kernel_default() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_owned()
}

/// An algorithm this kernel offers other than `not` (reno is built in).
fn other_than(not: &str) -> String {
    let offered = iwarp::cm::available_congestion_control();
    ["reno", "cubic", "bbr"]
        .into_iter()
        .find(|a| *a != not && offered.iter().any(|o| o == a))
        .expect("a second congestion-control algorithm")
        .to_owned()
}

fn with_cc(name: Option<&str>) -> Options {
    Options {
        congestion: name.map(|n| n.parse().unwrap()),
        ..Options::default()
    }
}

fn pair_with(client: &Options, server: &Options) -> (Stream, Stream) {
    let l = Listener::bind_with(any_port(), server).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        tx.send(s).unwrap();
    });
    let c = Stream::connect_with(addr, client).unwrap();
    let s = rx.recv_timeout(T).expect("accepted in time");
    h.join().unwrap();
    (c, s)
}

#[test]
fn options_set_the_algorithm_on_both_ends_and_data_flows() {
    let client_cc = other_than(&kernel_default());
    let server_cc = other_than(&client_cc);
    let (c, s) = pair_with(&with_cc(Some(&client_cc)), &with_cc(Some(&server_cc)));
    assert_eq!(c.tcp_congestion().unwrap(), client_cc);
    assert_eq!(s.tcp_congestion().unwrap(), server_cc);
    c.set_read_timeout(Some(T)).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    (&c).write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
}

#[test]
fn a_live_stream_changes_its_algorithm_like_a_tcp_socket() {
    let (c, _s) = pair_with(&with_cc(None), &with_cc(None));
    assert_eq!(c.tcp_congestion().unwrap(), kernel_default());
    let want = other_than(&kernel_default());
    c.set_tcp_congestion(&want).unwrap();
    assert_eq!(c.tcp_congestion().unwrap(), want);
    // What setsockopt(2) answers for an algorithm the kernel lacks.
    let e = c.set_tcp_congestion("nosuch").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string().contains("tcp_available_congestion_control"),
        "{e}"
    );
    let e = c.set_tcp_congestion("abcdefghijklmnop").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    assert_eq!(c.tcp_congestion().unwrap(), want);
}

#[test]
fn a_missing_algorithm_fails_connect_and_bind() {
    let l = Listener::bind(any_port()).unwrap();
    let e = Stream::connect_with(l.local_addr().unwrap(), &with_cc(Some("nosuch"))).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("modprobe tcp_nosuch"), "{e}");
    let e = Listener::bind_with(any_port(), &with_cc(Some("nosuch"))).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
}
