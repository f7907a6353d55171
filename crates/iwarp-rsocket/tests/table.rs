//! The descriptor table with real streams: a TCP connection accepted on a
//! plain `TcpListener` becomes a stream when its first bytes are an MPA
//! Request (the shared-port path of the preload shim), keeps its
//! descriptor number, survives `F_DUPFD` and the close of one of its
//! descriptors, and ends (the peer reads end of stream) when the last
//! one closes.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::time::Duration;

use iwarp_rsocket::{attach, ops, table};
use iwarp_sockets::Options;
use socket2::{Domain, Socket, Type};

fn recv_all(fd: i32, want: usize) -> Vec<u8> {
    let s = table::lookup(fd).expect("a stream");
    let mut out = vec![0u8; want];
    let n = ops::recv_into(&s, &mut out, libc::MSG_WAITALL).unwrap();
    out.truncate(n);
    out
}

#[test]
fn shared_port_dup_and_close() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let opts = Options::default();

    // A plain client's first bytes are not an MPA Request.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let (p, _) = l.accept().unwrap();
    assert!(!attach::peek_is_mpa(
        p.as_raw_fd(),
        Duration::from_millis(500)
    ));
    drop((plain, p));

    // A silent client: the peek gives up after its wait.
    let silent = TcpStream::connect(addr).unwrap();
    let (q, _) = l.accept().unwrap();
    let t0 = std::time::Instant::now();
    assert!(!attach::peek_is_mpa(
        q.as_raw_fd(),
        Duration::from_millis(100)
    ));
    assert!(t0.elapsed() >= Duration::from_millis(90));
    drop((silent, q));

    // An iWARP client.
    let server = std::thread::spawn(move || {
        let (tcp, _) = l.accept().unwrap();
        let fd = tcp.into_raw_fd();
        assert!(attach::peek_is_mpa(fd, Duration::from_secs(5)));
        attach::accept(fd, &Options::default(), false, true).unwrap();
        assert!(
            table::is_taken(fd),
            "the accepted descriptor keeps its number"
        );
        let got = recv_all(fd, 11);
        assert_eq!(got, b"hello world");
        // End of stream once the client closed every descriptor.
        assert!(recv_all(fd, 1).is_empty());
        assert_eq!(table::close(fd), 0);
        assert!(!table::is_taken(fd));
    });

    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let fd = sock.into_raw_fd();
    attach::connect(fd, addr, &opts).unwrap();
    assert!(table::is_taken(fd));
    let s = table::lookup(fd).unwrap();
    assert_eq!(s.stream.peer_addr().unwrap(), addr);

    // F_DUPFD: a second descriptor of the same stream.
    let dup = iwarp_rsocket::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
    assert!(dup >= 0 && dup != fd);
    assert!(table::is_taken(dup));
    // F_GETFL/F_SETFL are the stream's.
    assert_eq!(
        iwarp_rsocket::fcntl(dup, libc::F_GETFL, 0) & libc::O_NONBLOCK,
        0
    );
    assert_eq!(
        iwarp_rsocket::fcntl(dup, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong),
        0
    );
    assert!(
        s.stream.is_nonblocking(),
        "O_NONBLOCK is shared, like an open file description"
    );
    s.stream.set_nonblocking(false).unwrap();
    drop(s);

    ops::send_from(&table::lookup(fd).unwrap(), b"hello ", 0).unwrap();
    assert_eq!(table::close(fd), 0);
    // The dup still reaches the connection.
    ops::send_from(&table::lookup(dup).unwrap(), b"world", 0).unwrap();
    assert_eq!(table::close(dup), 0);
    server.join().unwrap();
}
