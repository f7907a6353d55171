//! Connection manager over loopback: private data, reject, policy
//! conflicts, IPv6, refused/silent/malformed peers, timeouts.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use iwarp::cm::{self, CmError, ConnParam, Listener};
use iwarp::{QpEvent, QpState};
use iwarp_proto::handshake::{HandshakeError, MpaConfig, Policy};

#[test]
fn connect_accept_with_private_data_both_ways() {
    let (client, server) = (Host::new(), Host::new());
    let param = ConnParam {
        private_data: b"hello from client".to_vec(),
        timeout: T,
        ..Default::default()
    };
    let (c, s) = connect_with(
        &client,
        &server,
        &param,
        MpaConfig::default(),
        b"hello from server",
    );
    assert_eq!(c.unwrap(), b"hello from server");
    assert_eq!(s.unwrap(), b"hello from client");
    assert_eq!(client.qp.state(), QpState::Rts);
    assert_eq!(server.qp.state(), QpState::Rts);
    assert_eq!(client.event(|_| true), QpEvent::Established);
    assert_eq!(server.event(|_| true), QpEvent::Established);
    assert_eq!(client.qp.peer_addr(), server.qp.local_addr());
    assert_eq!(client.qp.local_addr(), server.qp.peer_addr());
    let (ci, si) = (
        client.qp.conn_info().unwrap(),
        server.qp.conn_info().unwrap(),
    );
    assert_eq!(ci.mpa.crc, si.mpa.crc);
    assert_eq!(ci.mpa.markers_tx, si.mpa.markers_rx);
    assert!(ci.mulpdu >= 128 && ci.mulpdu <= iwarp::soft::MULPDU_CAP);

    // A QP connects once.
    let again = cm::connect(
        &client.qp,
        server.qp.local_addr().unwrap(),
        &ConnParam::default(),
    );
    assert!(
        matches!(again, Err(CmError::InvalidState { .. })),
        "{again:?}"
    );

    client.qp.disconnect();
    assert_eq!(
        client.event(|e| *e == QpEvent::Disconnected),
        QpEvent::Disconnected
    );
    assert_eq!(
        server.event(|e| *e == QpEvent::Disconnected),
        QpEvent::Disconnected
    );
    assert_ne!(server.qp.state(), QpState::Rts);
}

#[test]
fn reject_with_private_data() {
    let client = Host::new();
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let addr = listener.local_addr();
    let srv = std::thread::spawn(move || {
        let req = listener.get_request(Some(T)).unwrap();
        assert_eq!(req.private_data(), b"let me in");
        req.reject(b"go away").unwrap();
    });
    let param = ConnParam {
        private_data: b"let me in".to_vec(),
        timeout: T,
        ..Default::default()
    };
    let err = cm::connect(&client.qp, addr, &param).unwrap_err();
    srv.join().unwrap();
    match &err {
        CmError::Rejected { private_data, .. } => assert_eq!(private_data, b"go away"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(err.to_string().contains("rejected"), "{err}");
    assert_eq!(
        client.qp.state(),
        QpState::Init,
        "a refused connect leaves the QP usable"
    );
}

#[test]
fn crc_policy_conflict_fails_clearly_on_both_sides() {
    let (client, server) = (Host::new(), Host::new());
    let required = MpaConfig {
        crc: Policy::Required,
        ..Default::default()
    };
    let off = MpaConfig {
        crc: Policy::Off,
        ..Default::default()
    };
    let param = ConnParam {
        mpa: required,
        timeout: T,
        ..Default::default()
    };
    let (c, s) = connect_with(&client, &server, &param, off, b"");
    let (ce, se) = (c.unwrap_err(), s.unwrap_err());
    match &se {
        CmError::Mpa {
            error: HandshakeError::CrcPolicy(_),
            ..
        } => {}
        other => panic!("server: expected a CRC policy error, got {other:?}"),
    }
    assert!(se.to_string().contains("MPA negotiation"), "{se}");
    match &ce {
        CmError::Mpa { .. } | CmError::Rejected { .. } => {}
        other => panic!("client: expected an MPA error or a reject, got {other:?}"),
    }
    eprintln!("client error: {ce}\nserver error: {se}");
    assert_eq!(client.qp.state(), QpState::Init);
    assert_eq!(server.qp.state(), QpState::Init);
}

#[test]
fn ipv6_loopback() {
    let addr: SocketAddr = "[::1]:0".parse().unwrap();
    let listener = match Listener::bind(addr, MpaConfig::default()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipping: IPv6 loopback unavailable: {e}");
            return;
        }
    };
    let (client, server) = (Host::new(), Host::new());
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let req = listener.get_request(Some(T)).unwrap();
            assert!(req.peer_addr().is_ipv6());
            req.accept(&server.qp, &ConnParam::default()).unwrap();
        });
        let pd = client.connect(addr);
        assert!(pd.is_empty());
        srv.join().unwrap();
    });
    assert!(client.qp.peer_addr().unwrap().is_ipv6());
    assert_eq!(client.qp.state(), QpState::Rts);
}

#[test]
fn connect_to_closed_port_is_refused() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = Host::new();
    let err = cm::connect(
        &client.qp,
        addr,
        &ConnParam {
            timeout: T,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, CmError::Refused { .. }), "{err:?}");
    assert!(err.no_tcp(), "a refused connect never had TCP: {err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("connection refused by 127.0.0.1:{port}")),
        "{msg}"
    );
    assert!(msg.contains("server running"), "{msg}");
}

#[test]
fn silent_peer_times_out() {
    let raw = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let holder = std::thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        // Read the request, answer nothing, hold the connection open.
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        std::thread::sleep(Duration::from_millis(1500));
    });
    let client = Host::new();
    let t = Instant::now();
    let timeout = Duration::from_millis(400);
    let err = cm::connect(
        &client.qp,
        addr,
        &ConnParam {
            timeout,
            ..Default::default()
        },
    )
    .unwrap_err();
    let el = t.elapsed();
    assert!(matches!(err, CmError::Timeout { .. }), "{err:?}");
    assert!(!err.no_tcp(), "TCP was up, MPA was not answered: {err:?}");
    assert!(
        el >= timeout && el < timeout + Duration::from_secs(1),
        "{el:?}"
    );
    assert!(err.to_string().contains("timed out"), "{err}");
    holder.join().unwrap();
}

#[test]
fn get_request_times_out_without_connection() {
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let t = Instant::now();
    let err = listener
        .get_request(Some(Duration::from_millis(150)))
        .unwrap_err();
    assert!(matches!(err, CmError::Timeout { .. }), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// Send `frame` from a raw TCP peer; return the listener's error and
/// whether the raw peer then saw the connection closed.
fn raw_request(frame: Vec<u8>) -> (CmError, bool) {
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let addr = listener.local_addr();
    let peer = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&frame).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    });
    let err = listener.get_request(Some(T)).unwrap_err();
    (err, peer.join().unwrap())
}

#[test]
fn bad_key_is_refused_and_closed() {
    let mut frame = b"MPA ID Bad Frame".to_vec();
    frame.extend_from_slice(&[0x40, 1, 0, 0]);
    let (err, closed) = raw_request(frame);
    assert!(
        matches!(
            err,
            CmError::Mpa {
                error: HandshakeError::BadKey,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(closed, "the listener closed the connection");
}

#[test]
fn private_data_too_long_is_refused_and_closed() {
    let mut frame = b"MPA ID Req Frame".to_vec();
    frame.extend_from_slice(&[0x40, 1]);
    frame.extend_from_slice(&600u16.to_be_bytes());
    frame.extend_from_slice(&[0u8; 600]);
    let (err, closed) = raw_request(frame);
    assert!(
        matches!(
            err,
            CmError::Mpa {
                error: HandshakeError::PrivateDataTooLong(600),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(closed, "the listener closed the connection");
}

#[test]
fn oversized_private_data_refused_locally() {
    let client = Host::new();
    let param = ConnParam {
        private_data: vec![0; 513],
        timeout: T,
        ..Default::default()
    };
    let err = cm::connect(&client.qp, "127.0.0.1:9".parse().unwrap(), &param).unwrap_err();
    assert!(
        matches!(err, CmError::Mpa { error: HandshakeError::PrivateDataTooLong(n), .. } if n >= 513),
        "{err:?}"
    );
}

/// A listener whose accept queue is full drops the next SYN (Linux,
/// `tcp_conn_request`: `LISTENOVERFLOWS`), as a lossy path or a host
/// still starting would, until the caller accepts the filler connection
/// (then the client's SYN retransmission, RFC 6298 §5.7: 1 s, gets
/// through). Returns the address, the listener and the filler.
fn listener_with_full_queue() -> (SocketAddr, socket2::Socket, TcpStream) {
    use socket2::{Domain, Protocol, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    l.bind(&loopback().into()).unwrap();
    // Backlog 0: one connection fills the queue.
    l.listen(0).unwrap();
    // accept(2) honours SO_RCVTIMEO: a failing test ends instead of
    // waiting for a client that gave up.
    l.set_read_timeout(Some(T)).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let filler = TcpStream::connect(addr).unwrap();
    (addr, l, filler)
}

#[test]
fn a_lost_syn_costs_its_retransmission_not_the_connection() {
    let (addr, l, filler) = listener_with_full_queue();
    let (client, server) = (Host::new(), Host::new());
    std::thread::scope(|s| {
        let srv = s.spawn(|| -> Result<(), CmError> {
            std::thread::sleep(Duration::from_millis(300));
            drop(l.accept().unwrap()); // the filler: the queue has room again
            let (sock, _) = l.accept().unwrap();
            let req = cm::request_from_stream(sock.into(), &MpaConfig::default(), T)?;
            req.accept(&server.qp, &ConnParam::default())
        });
        let t = Instant::now();
        let r = cm::connect(
            &client.qp,
            addr,
            &ConnParam {
                // Shorter than the SYN retransmission: only the MPA
                // exchange is bounded by it.
                timeout: Duration::from_millis(500),
                tcp_connect: cm::TcpConnect::Kernel,
                ..Default::default()
            },
        );
        let el = t.elapsed();
        assert!(r.is_ok(), "{r:?} after {el:?}");
        // The first SYN was lost: the connect took the kernel's 1 s
        // retransmission, which a 500 ms bound on the whole connect
        // would have cut.
        assert!(el >= Duration::from_millis(900), "{el:?}");
        srv.join().unwrap().unwrap();
    });
    drop(filler);
    assert_eq!(client.qp.state(), QpState::Rts);
}

#[test]
fn a_lost_syn_within_a_short_timeout_is_no_tcp_not_no_mpa() {
    let (addr, l, filler) = listener_with_full_queue();
    let client = Host::new();
    let err = cm::connect(
        &client.qp,
        addr,
        &ConnParam {
            timeout: Duration::from_millis(400),
            ..Default::default()
        },
    )
    .unwrap_err();
    // The handshake never completed: a caller that falls back to plain
    // TCP for peers that do not speak MPA must not count this one.
    assert!(matches!(err, CmError::Timeout { .. }), "{err:?}");
    assert!(err.no_tcp(), "{err:?}");
    assert!(
        err.to_string().contains("opening the TCP connection"),
        "{err}"
    );
    drop((l, filler));
}

/// Many clients reaching a listener before it accepts any: each TCP
/// connect completes in the kernel, so they queue in the listener's accept
/// queue, which must hold them (`LISTEN_BACKLOG`). With the old backlog of
/// 128 the kernel dropped the 130th SYN and that client waited for the 1 s
/// SYN retransmission: a connect bounded well under it fails.
#[test]
fn a_burst_of_clients_fits_in_the_accept_queue() {
    let l = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let addr = l.local_addr();
    let mut held = Vec::new();
    for i in 0..300 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(700)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("client {i} of 300 could not connect before anyone accepted: {e}"),
        }
    }
    assert_eq!(held.len(), 300);
}

#[test]
fn a_connection_accepted_at_the_end_of_the_wait_still_gets_its_request_read() {
    // The caller waits 200 ms; the client has connected but sends its
    // MPA Request 500 ms later, inside REQUEST_GRACE. Cutting the read at
    // the caller's 200 ms dropped such a connection (the client saw a
    // reset): what a server polling in slices did to a client whose
    // connection landed at the end of a slice.
    assert!(iwarp::cm::REQUEST_GRACE > Duration::from_millis(1500));
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let addr = listener.local_addr();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // Connected before the wait starts (the kernel completes the handshake
    // into the listener's backlog), so the connection is there to accept
    // within the caller's 200 ms at any load; a client thread left to
    // connect by itself missed the 200 ms once at load 30.
    let mut s = TcpStream::connect(addr).unwrap();
    let client = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        // RFC 5044 §7.1: key, flags 0 (no markers, no CRC), revision 1, no
        // private data.
        let mut frame = b"MPA ID Req Frame".to_vec();
        frame.extend_from_slice(&[0, 1, 0, 0]);
        s.write_all(&frame).unwrap();
        let _ = done_rx.recv_timeout(T);
    });
    let r = listener.get_request(Some(Duration::from_millis(200)));
    let _ = done_tx.send(());
    client.join().unwrap();
    let req = r.expect("the Request that came 500 ms after the accept");
    assert!(req.private_data().is_empty());
}
