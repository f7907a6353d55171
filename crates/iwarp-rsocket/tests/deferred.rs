//! Accepts that wait for their first use (`table`, "Accepts wait for
//! their first use"): a deferred MPA connection stays the TCP socket until
//! `attach::settle`, which makes the stream with the descriptor's flags and
//! the options set meanwhile; a settle that fails leaves a closed
//! connection, not the client's MPA bytes; closing forgets the entry and
//! the socket options noted for the number.
//!
//! The tests of this file run one at a time ([`one_at_a_time`]), for
//! ThreadSanitizer (`scripts/sanitize.sh long`): a failed settle ends the
//! connection in `attach::dead_end`, which makes a `socketpair` (a call
//! TSan intercepts) and then `dup2`s and `close`s through the crate's
//! `real()` functions, found with `dlsym(RTLD_NEXT)`, which skips TSan's
//! interceptors. TSan never sees those descriptors closed, so when
//! another test's thread gets one of their numbers from `socket()` it
//! reports a data race on the descriptor (a false positive: the kernel
//! hands out a closed number; nothing is shared). With one test at a time,
//! a mutex TSan sees orders every test's descriptors before the next
//! test's, and nothing needs suppressing. The tests that reach `dead_end`
//! (a failed settle) start no thread of their own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use iwarp_rsocket::{attach, ops, table};
use iwarp_sockets::Options;
use socket2::{Domain, Socket, Type};

const WAIT: Duration = Duration::from_secs(5);

/// Held for the whole of each test (see the module doc: why, for TSan).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    // A test that failed poisons it; the next one still runs.
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_deferred_accept_becomes_a_stream_at_its_first_use() {
    let _one = one_at_a_time();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let fd = sock.into_raw_fd();
        // Returns once the server settled (the MPA Reply comes then).
        attach::connect(fd, addr, &Options::default()).unwrap();
        ops::send_from(&table::lookup(fd).unwrap(), b"after the settle", 0).unwrap();
        assert_eq!(table::close(fd), 0);
    });
    let (tcp, _) = l.accept().unwrap();
    let fd = tcp.into_raw_fd();
    assert!(attach::peek_is_mpa(fd, WAIT));
    attach::defer(fd, &Options::default()).unwrap();
    assert!(table::is_deferred(fd) && !table::is_taken(fd));
    // What the program does before its first read: non-blocking mode on
    // the TCP socket, a receive buffer size (the stream's ring).
    // SAFETY: plain descriptor calls on our socket (no shim in this test).
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
    }
    table::note_pending(fd, |p| p.rcvbuf = Some(256 * 1024));
    std::thread::sleep(Duration::from_millis(100));
    // The first use.
    attach::settle(fd).unwrap();
    assert!(table::is_taken(fd) && !table::is_deferred(fd));
    let s = table::lookup(fd).unwrap();
    assert!(s.stream.is_nonblocking(), "O_NONBLOCK set while deferred");
    s.stream.set_nonblocking(false).unwrap();
    let mut got = vec![0u8; 16];
    let n = ops::recv_into(&s, &mut got, libc::MSG_WAITALL).unwrap();
    assert_eq!(&got[..n], b"after the settle");
    // A second settle (another thread's first use) does nothing.
    attach::settle(fd).unwrap();
    drop(s);
    assert_eq!(table::close(fd), 0);
    client.join().unwrap();
}

#[test]
fn a_failed_settle_leaves_a_closed_connection() {
    let _one = one_at_a_time();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // The MPA key, then a header no MPA peer sends (revision 0x7f,
    // private data length 0xffff).
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x00, 0x7f, 0xff, 0xff]);
    c.write_all(&req).unwrap();
    let (tcp, _) = l.accept().unwrap();
    let fd = tcp.into_raw_fd();
    assert!(attach::peek_is_mpa(fd, WAIT));
    attach::defer(fd, &Options::default()).unwrap();
    let e = attach::settle(fd).unwrap_err();
    assert!(!table::is_deferred(fd) && !table::is_taken(fd), "{e}");
    // The program reads end of stream, never the client's MPA bytes.
    let mut b = [0u8; 32];
    // SAFETY: `b` is valid for its length.
    let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
    assert_eq!(n, 0, "read {n} bytes from a failed accept");
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    // The client sees its connection end, not a connection left open.
    let mut rest = Vec::new();
    let r = c.read_to_end(&mut rest);
    assert!(
        !matches!(&r, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the client's connection stayed open: {r:?}"
    );
}

#[test]
fn closing_forgets_a_deferred_accept() {
    let _one = one_at_a_time();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.write_all(b"MPA ID Req Frame").unwrap();
    let (tcp, _) = l.accept().unwrap();
    let fd = tcp.as_raw_fd();
    attach::defer(fd, &Options::default()).unwrap();
    table::note_pending(fd, |p| p.rcvbuf = Some(8192));
    assert!(table::is_deferred(fd));
    assert_eq!(table::options_for(fd, &Options::default()).rbuf_size, 8192);
    table::forget(fd, fd);
    assert!(!table::is_deferred(fd));
    // The number's next socket does not inherit the closed one's options.
    assert_eq!(
        table::options_for(fd, &Options::default()).rbuf_size,
        Options::default().rbuf_size
    );
    // Nothing to settle any more: the socket is left as it is.
    attach::settle(fd).unwrap();
    assert!(!table::is_taken(fd));
    drop(tcp);
}

#[test]
fn a_request_already_read_elsewhere_is_not_settled_again() {
    let _one = one_at_a_time();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.write_all(b"MPA ID Req Frame").unwrap();
    let (tcp, _) = l.accept().unwrap();
    let fd = tcp.into_raw_fd();
    assert!(attach::peek_is_mpa(fd, WAIT));
    attach::defer(fd, &Options::default()).unwrap();
    // Another process sharing the connection took the Request (a copy of
    // the descriptor stands for it here) and now owns the stream.
    // SAFETY: plain descriptor calls on our socket.
    let other = unsafe { libc::dup(fd) };
    let mut b = [0u8; 16];
    // SAFETY: `b` is valid for its length.
    assert_eq!(unsafe { libc::read(other, b.as_mut_ptr().cast(), 16) }, 16);
    c.write_all(b"its stream's bytes").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let e = attach::settle(fd).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    // This descriptor reads end of stream; the other still has the bytes.
    // SAFETY: `b` is valid for its length.
    assert_eq!(unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) }, 0);
    // SAFETY: as above.
    let n = unsafe { libc::read(other, b.as_mut_ptr().cast(), b.len()) };
    assert_eq!(n, 16);
    assert_eq!(&b[..], &b"its stream's bytes"[..16]);
    // SAFETY: our descriptors.
    unsafe {
        libc::close(fd);
        libc::close(other);
    }
}

/// inetd style: the deferred accept is copied (`dup2` onto the service's
/// standard input and output, here two fresh numbers) before its first
/// use. The copies wait too; the first use of one makes the stream for
/// all, each keeping its close-on-exec flag, and the client's bytes are
/// read once, through any of them.
#[test]
fn copies_of_a_deferred_accept_become_one_stream() {
    let _one = one_at_a_time();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let fd = sock.into_raw_fd();
        attach::connect(fd, addr, &Options::default()).unwrap();
        let s = table::lookup(fd).unwrap();
        ops::send_from(&s, b"to the service", 0).unwrap();
        let mut got = vec![0u8; 10];
        let n = ops::recv_into(&s, &mut got, libc::MSG_WAITALL).unwrap();
        assert_eq!(&got[..n], b"its answer");
        rx.recv_timeout(WAIT).unwrap();
        drop(s);
        assert_eq!(table::close(fd), 0);
    });
    let (tcp, _) = l.accept().unwrap();
    let fd = tcp.into_raw_fd();
    assert!(attach::peek_is_mpa(fd, WAIT));
    attach::defer(fd, &Options::default()).unwrap();
    table::note_pending(fd, |p| p.rcvbuf = Some(128 * 1024));
    // SAFETY: plain descriptor calls on our socket (no shim in this test).
    let (a, b) = unsafe { (libc::dup(fd), libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0)) };
    assert!(a >= 0 && b >= 0);
    table::defer_copy(fd, a);
    table::defer_copy(fd, b);
    let mut sib = table::deferred_siblings(a);
    sib.sort_unstable();
    let mut want = vec![fd, b];
    want.sort_unstable();
    assert_eq!(sib, want, "the copies of one socket");
    // The original goes (the inetd's child closes it after its dup2s).
    table::forget(fd, fd);
    // SAFETY: our descriptor.
    assert_eq!(unsafe { libc::close(fd) }, 0);
    // The first use, through `a`, makes the stream for `b` too.
    attach::settle(a).unwrap();
    for d in [a, b] {
        assert!(
            table::is_taken(d) && !table::is_deferred(d),
            "descriptor {d}"
        );
    }
    assert!(
        !attach::fd_flags(a).1 && attach::fd_flags(b).1,
        "close-on-exec kept per copy"
    );
    let (sa, sb) = (table::lookup(a).unwrap(), table::lookup(b).unwrap());
    assert!(std::sync::Arc::ptr_eq(&sa, &sb), "one stream");
    let mut got = vec![0u8; 14];
    let n = ops::recv_into(&sa, &mut got, libc::MSG_WAITALL).unwrap();
    assert_eq!(&got[..n], b"to the service");
    ops::send_from(&sb, b"its answer", 0).unwrap();
    tx.send(()).unwrap();
    drop((sa, sb));
    assert_eq!(table::close(a), 0);
    assert_eq!(table::close(b), 0);
    client.join().unwrap();
}
