//! Hostile clients against a blocking `Listener::accept` loop (issue 26,
//! item 1's rule for every listener): a client that connects and sends
//! nothing, or half of the MPA key (RFC 5044 §7.1), must not delay the
//! good client behind it; each is closed when its deadline
//! (`Options::connect_timeout`) passes, and the held set stays bounded
//! (`MAX_HELD`; one more closes the oldest).
//!
//! Before the fix `accept` read the first connection's Request with a
//! deadline of a year: every wait below is bounded, so that fails here
//! (the good client's echo does not come within its bound) rather than
//! hangs.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp_proto::wire::mpa::KEY_REQ;
use iwarp_sockets::poll::{poll, PollFd};
use iwarp_sockets::{Listener, Options, Stream, MAX_HELD};

/// How long the listener gives a connection to send its MPA Request.
const HOLD: Duration = Duration::from_secs(4);

/// The good client must be echoed within this, far below `HOLD`.
const GOOD: Duration = Duration::from_millis(2000);

fn listener(hold: Duration) -> (Listener, SocketAddr) {
    let opts = Options {
        connect_timeout: hold,
        ..Options::default()
    };
    let l = Listener::bind_with("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

/// A blocking accept loop serving echo, one thread per stream (the
/// threads end with the test process).
fn serve_echo(l: Listener) {
    thread::spawn(move || loop {
        let (s, _) = l.accept().expect("accept");
        thread::spawn(move || {
            let mut buf = [0u8; 256];
            loop {
                match (&s).read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if (&s).write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    });
}

/// A good rsockets client in its own thread: connects, writes, reads the
/// echo. The result arrives on the channel (so the caller bounds the wait).
fn good_client(addr: SocketAddr) -> mpsc::Receiver<Result<Duration, String>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let start = Instant::now();
        let r = (|| -> std::io::Result<Duration> {
            let opts = Options {
                connect_timeout: Duration::from_secs(10),
                ..Options::default()
            };
            let mut c = Stream::connect_with(addr, &opts)?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            c.write_all(b"ping")?;
            let mut echo = [0u8; 4];
            c.read_exact(&mut echo)?;
            assert_eq!(&echo, b"ping");
            Ok(start.elapsed())
        })();
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    rx
}

/// Waits (at most `bound`) for the server to close `c`: end of stream or
/// a reset. Returns when it saw it.
fn closed_within(c: &mut TcpStream, bound: Duration) -> Result<Instant, String> {
    c.set_read_timeout(Some(bound)).unwrap();
    let mut b = [0u8; 1];
    match c.read(&mut b) {
        Ok(0) => Ok(Instant::now()),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(Instant::now()),
        Ok(n) => Err(format!(
            "the server sent {n} bytes to a client that sent no Request"
        )),
        Err(e) => Err(format!("not closed within {bound:?}: {e}")),
    }
}

fn still_open(c: &TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let open = matches!(c.peek(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock);
    c.set_nonblocking(false).unwrap();
    open
}

#[test]
fn good_client_is_served_past_a_silent_and_a_half_key_client() {
    let (l, addr) = listener(HOLD);
    serve_echo(l);
    // The listen queue is in order: the server takes these two before the
    // good client, whenever it runs.
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&KEY_REQ[..8]).unwrap();

    let rx = good_client(addr);
    match rx.recv_timeout(GOOD) {
        Ok(Ok(took)) => assert!(took < GOOD, "echoed after {took:?}"),
        Ok(Err(e)) => panic!("the good client failed: {e}"),
        Err(_) => panic!(
            "the good client was not echoed within {GOOD:?}: accept waits on the silent \
             client before it"
        ),
    }
    // Both hostile clients are closed at their deadline, not before and
    // not much after (a blocking accept waits until the earliest one).
    let slack = Duration::from_secs(3);
    for (name, c) in [("silent", &mut silent), ("half-key", &mut half)] {
        let at = closed_within(c, HOLD + slack).unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = at - t0;
        assert!(
            after + Duration::from_millis(100) >= HOLD && after <= HOLD + slack,
            "{name} client closed after {after:?}, its deadline is {HOLD:?}"
        );
    }
}

#[test]
fn held_set_is_bounded_and_drops_the_oldest() {
    // A deadline far away: only the bound closes anything here.
    let (l, addr) = listener(Duration::from_secs(60));
    serve_echo(l);
    let silent: Vec<TcpStream> = (0..=MAX_HELD)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // The good client is behind all of them in the listen queue: once it
    // is echoed, the server has taken (and held) every silent one.
    match good_client(addr).recv_timeout(GOOD) {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!("the good client failed: {e}"),
        Err(_) => panic!("the good client was not echoed within {GOOD:?}"),
    }
    let mut first = silent[0].try_clone().unwrap();
    closed_within(&mut first, Duration::from_secs(5)).expect("the oldest held client is closed");
    // The closed ones are the oldest: silent[0], and silent[1] too when the
    // good client's Request came after its TCP connection (it was held
    // for that moment, one more than the bound).
    let open: Vec<bool> = silent.iter().map(still_open).collect();
    let closed = open.iter().take_while(|o| !**o).count();
    assert!(
        (1..=2).contains(&closed) && open[closed..].iter().all(|o| *o),
        "expected the oldest one or two of {} silent clients closed and the rest held, got open = \
         {open:?}",
        MAX_HELD + 1
    );
}

#[test]
fn nonblocking_accept_never_waits_on_a_silent_client() {
    let (l, addr) = listener(HOLD);
    l.set_nonblocking(true).unwrap();
    let _silent = TcpStream::connect(addr).unwrap();
    let mut p = [PollFd::listener(&l, libc::POLLIN)];
    assert_eq!(poll(&mut p, Some(Duration::from_secs(5))).unwrap(), 1);
    let start = Instant::now();
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("expected WouldBlock, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "a non-blocking accept waited {:?} on a silent client",
        start.elapsed()
    );
    // The held client does not keep the listener readable (no busy loop
    // for the program polling it).
    assert_eq!(poll(&mut p, Some(Duration::from_millis(200))).unwrap(), 0);
    // A good client makes it readable, and is accepted.
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = Stream::connect_with(addr, &Options::default());
        let _ = tx.send(r.map(|_s| ()).map_err(|e| e.to_string()));
        // Keep the thread (and nothing else) alive until the test ends.
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the good client was not accepted within 5 s"
        );
        if poll(&mut p, Some(left)).unwrap() == 0 {
            continue;
        }
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => panic!("accept: {e}"),
        }
    };
    drop(got);
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the client's connect returned")
        .expect("the client connected");
}
