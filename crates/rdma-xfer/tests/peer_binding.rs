//! A session listener bound to the control connection's address
//! (`XferListener::only_from`): a connection from another address is
//! refused, even with the right token, and the token stays good for the
//! legitimate peer.

use std::io::{Cursor, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rdma_xfer::hello::{Hello, Proposal};
use rdma_xfer::{connect, Config, Error, Mode, ReadSource, WriteSink, XferListener};
use socket2::{Domain, Socket, Type};

fn cfg() -> Config {
    Config {
        streams: 2,
        block_size: 4096,
        iodepth: 2,
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// A TCP connection to `to` from the source address `from`.
fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(from, 0).into()).unwrap();
    s.connect_timeout(&to.into(), Duration::from_secs(5))
        .unwrap();
    s.into()
}

fn hello(token: u64) -> Vec<u8> {
    Hello {
        token,
        index: 0,
        proposal: Proposal::of(&cfg()),
        features: 0,
    }
    .emit()
    .to_vec()
}

#[test]
fn tcp_session_refuses_another_address_and_still_serves_its_peer() {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Tcp, cfg())
        .unwrap()
        .only_from("127.0.0.1".parse().unwrap());
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || {
        let mut t = l.accept(Duration::from_secs(10))?;
        let mut sink = WriteSink(Vec::new());
        t.recv(&mut sink).map(|_| sink.0)
    });

    // An intruder on 127.0.0.2 that learned the token: closed unanswered.
    let mut evil = connect_from("127.0.0.2".parse().unwrap(), addr);
    evil.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = evil.write_all(&hello(token));
    let mut ack = [0u8; 24];
    let got = evil.read(&mut ack);
    assert!(
        matches!(got, Ok(0) | Err(_)),
        "the intruder got a Hello reply: {got:?}"
    );

    // The legitimate peer still gets its session with the same token.
    let data: Vec<u8> = (0..50_000u32).map(|i| i as u8).collect();
    let mut t = connect(addr, Mode::Tcp, token, cfg()).unwrap();
    t.send(&mut ReadSource(Cursor::new(&data))).unwrap();
    assert_eq!(server.join().unwrap().unwrap(), data);
}

#[test]
fn rdma_session_refuses_another_address() {
    // Bound to 127.0.0.2; our connect comes from 127.0.0.1.
    let mut c = cfg();
    c.timeout = Duration::from_secs(2);
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, c.clone())
        .unwrap()
        .only_from("127.0.0.2".parse().unwrap());
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || l.accept(Duration::from_secs(2)).map(|_| ()));
    let t0 = Instant::now();
    let r = connect(addr, Mode::Rdma, token, c);
    let Err(e) = r else {
        panic!("a connection from the wrong address must be refused");
    };
    assert!(matches!(e, Error::Setup(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    // The server never got a session and gives up at its deadline.
    let e = server.join().unwrap().unwrap_err();
    assert!(
        e.to_string()
            .contains("waiting for the session's connection"),
        "{e}"
    );
}

#[test]
fn a_wrong_token_does_not_spend_the_session() {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Tcp, cfg()).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || {
        let mut t = l.accept(Duration::from_secs(10))?;
        let mut sink = WriteSink(Vec::new());
        t.recv(&mut sink).map(|_| sink.0)
    });
    let mut evil = TcpStream::connect(addr).unwrap();
    evil.write_all(&hello(token ^ 1)).unwrap();
    let mut t = connect(addr, Mode::Tcp, token, cfg()).unwrap();
    t.send(&mut ReadSource(Cursor::new(b"after the intruder".to_vec())))
        .unwrap();
    assert_eq!(server.join().unwrap().unwrap(), b"after the intruder");
}
