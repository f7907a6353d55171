//! `iwarp_sockets::poll::poll` (`rpoll`) over streams and plain
//! descriptors together: poll(2)'s timeouts (-1, 0, N), `revents`, a
//! negative descriptor, and `EINTR`. Every wait is bounded.

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp_sockets::poll::{poll, PollFd};
use iwarp_sockets::{Listener, Options, Stream};

const T: Duration = Duration::from_secs(10);

fn pair(opts: &Options) -> (Stream, Stream) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let l = Listener::bind_with(any, opts).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        tx.send(s).unwrap();
    });
    let c = Stream::connect_with(addr, opts).unwrap();
    let s = rx.recv_timeout(T).expect("accepted in time");
    h.join().unwrap();
    (c, s)
}

#[test]
fn a_zero_timeout_reports_what_is_ready_now() {
    // poll(2) with timeout 0 is a check: a descriptor already ready is
    // reported, though the deadline has passed before anything was looked at.
    let (r, mut w) = std::io::pipe().unwrap();
    w.write_all(b"x").unwrap();
    let mut fds = [
        PollFd::fd(r.as_raw_fd(), libc::POLLIN),
        PollFd::fd(w.as_raw_fd(), libc::POLLOUT),
        PollFd::fd(-1, libc::POLLIN),
    ];
    assert_eq!(poll(&mut fds, Some(Duration::ZERO)).unwrap(), 2);
    assert_eq!(fds[0].revents, libc::POLLIN);
    assert_eq!(fds[1].revents, libc::POLLOUT);
    assert_eq!(fds[2].revents, 0, "a negative descriptor is ignored");
}

#[test]
fn streams_and_pipes_together_with_each_timeout() {
    for opts in [
        Options::default(),
        Options {
            busy_poll: true,
            ..Options::default()
        },
    ] {
        let (a, b) = pair(&opts);
        let (r, _w) = std::io::pipe().unwrap();
        // Nothing readable: 0 at once with timeout 0, 0 after N ms.
        let mut fds = [
            PollFd::stream(&b, libc::POLLIN),
            PollFd::fd(r.as_raw_fd(), libc::POLLIN),
        ];
        assert_eq!(poll(&mut fds, Some(Duration::ZERO)).unwrap(), 0);
        let t = Instant::now();
        assert_eq!(poll(&mut fds, Some(Duration::from_millis(100))).unwrap(), 0);
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        assert_eq!((fds[0].revents, fds[1].revents), (0, 0));
        // A stream is writable at once.
        let mut fds = [PollFd::stream(&a, libc::POLLIN | libc::POLLOUT)];
        assert_eq!(poll(&mut fds, None).unwrap(), 1);
        assert_eq!(fds[0].revents, libc::POLLOUT);
        // Data from another thread ends an unbounded wait (-1) with POLLIN
        // on the stream only.
        let writer = a.try_clone().unwrap();
        let h = thread::spawn(move || (&writer).write_all(b"hello").unwrap());
        let mut fds = [
            PollFd::fd(r.as_raw_fd(), libc::POLLIN),
            PollFd::stream(&b, libc::POLLIN),
        ];
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| {
                let n = poll(&mut fds, None);
                let _ = tx.send(());
                assert_eq!(n.unwrap(), 1);
            });
            rx.recv_timeout(T).expect("poll(-1) returned in time");
        });
        assert_eq!((fds[0].revents, fds[1].revents), (0, libc::POLLIN));
        h.join().unwrap();
        let mut buf = [0u8; 5];
        b.recv(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }
}

extern "C" fn on_signal(_: libc::c_int) {}

#[test]
fn a_signal_interrupts_the_wait_with_eintr() {
    // SAFETY: a handler that does nothing, installed without SA_RESTART
    // (poll(2) is never restarted anyway).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let (r, _w) = std::io::pipe().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let mut fds = [PollFd::fd(r.as_raw_fd(), libc::POLLIN)];
        poll(&mut fds, Some(T)).map_err(|e| e.kind())
    });
    let tid = rx.recv_timeout(T).unwrap();
    // Signalled until it returns: a signal that lands before the poll
    // sleeps is simply missed, as with poll(2).
    let t = Instant::now();
    while !h.is_finished() && t.elapsed() < T {
        // SAFETY: `tid` is a live thread until `h` is joined below.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(h.join().unwrap(), Err(std::io::ErrorKind::Interrupted));
}
