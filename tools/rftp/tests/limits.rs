//! rftpd's limits on what a client can hold: the login deadline, the
//! server-wide session memory budget, and RADR sessions bound to the
//! control connection's address. rftpd runs as a process on loopback;
//! every wait is bounded.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{server, T};
use rdma_xfer::{Config, Mode, Transport};
use rftp::client::Ftp;
use socket2::{Domain, Socket, Type};

/// Ask for a TCP-mode session; returns the reply code, and the address and
/// token on 200.
fn radr(f: &mut Ftp, args: &str) -> (u32, String, Option<(SocketAddr, u64)>) {
    let (c, t) = f.cmd(&format!("RADR {args} MODE=TCP")).unwrap();
    if c != 200 {
        return (c, t, None);
    }
    let field = |k: &str| {
        t.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    let addr = field("ADDR=").parse().unwrap();
    let token = u64::from_str_radix(&field("TOKEN="), 16).unwrap();
    (c, t, Some((addr, token)))
}

fn xcfg() -> Config {
    Config {
        streams: 2,
        block_size: 1 << 20,
        iodepth: 2,
        timeout: T,
        connect_timeout: T,
        ..Config::default()
    }
}

#[test]
fn a_connection_that_does_not_log_in_is_closed_at_the_login_deadline() {
    let s = server("login_timeout_secs = 1");
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let mut closed = false;
    // NOOP every 150 ms (far below the bytes allowed before login): it
    // must not keep the connection alive. The read waits for the next
    // NOOP's time, or returns at once with a reply or the close.
    let mut next = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        if Instant::now() >= next {
            let _ = c.write_all(b"NOOP\r\n");
            next += Duration::from_millis(150);
        }
        let wait = next.saturating_duration_since(Instant::now());
        c.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = [0u8; 1024];
        match c.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(closed, "still open after {:?}: {text}", t0.elapsed());
    assert!(
        text.contains("421 No login within 1 s"),
        "no 421 naming the deadline: {text}"
    );
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());

    // A logged-in session is not bound by the login deadline.
    let mut f = s.ftp();
    std::thread::sleep(Duration::from_millis(1500));
    f.expect("NOOP", |c| c == 200).unwrap();
}

#[test]
fn session_memory_budget_refuses_a_second_session_until_the_first_ends() {
    // One session of 2 streams x depth 2 x 1 MiB reserves 8 MiB (two pools);
    // the budget holds one and a half.
    let s = server(
        "max_streams = 2\niodepth = 2\nblock_size = 1048576\nsession_mem_budget_bytes = 12582912",
    );
    let mut a = s.ftp();
    let (c, t, at) = radr(&mut a, "STREAMS=2 DEPTH=2 BS=1048576");
    assert_eq!(c, 200, "{t}");
    let (addr, token) = at.unwrap();
    let xa: Box<dyn Transport> = rdma_xfer::connect(addr, Mode::Tcp, token, xcfg()).unwrap();

    let mut b = s.ftp();
    let (c, t, _) = radr(&mut b, "STREAMS=2 DEPTH=2 BS=1048576");
    assert_eq!(c, 452, "{t}");
    assert!(t.contains("needs 8 MiB"), "{t}");
    assert!(t.contains("4 MiB free"), "{t}");
    assert!(t.contains("session_mem_budget_bytes"), "{t}");
    // A smaller session still fits.
    let (c, t, bt) = radr(&mut b, "STREAMS=1 DEPTH=2 BS=1048576");
    assert_eq!(c, 200, "{t}");
    let (addr, token) = bt.unwrap();
    let xb = rdma_xfer::connect(addr, Mode::Tcp, token, xcfg()).unwrap();
    drop(xb);
    b.quit();

    // The first client vanishes without QUIT: its memory comes back.
    drop(xa);
    drop(a);
    let mut c2 = s.ftp();
    let t0 = Instant::now();
    loop {
        let (c, t, at) = radr(&mut c2, "STREAMS=2 DEPTH=2 BS=1048576");
        if c == 200 {
            let (addr, token) = at.unwrap();
            drop(rdma_xfer::connect(addr, Mode::Tcp, token, xcfg()).unwrap());
            break;
        }
        assert_eq!(c, 452, "{t}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "memory of a dead session never came back: {t}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(from, 0).into()).unwrap();
    s.connect_timeout(&to.into(), T).unwrap();
    s.into()
}

#[test]
fn radr_session_only_accepts_the_control_connections_address() {
    let s = server("");
    let mut f = s.ftp();
    let (c, t, at) = radr(&mut f, "STREAMS=1 DEPTH=2 BS=1048576");
    assert_eq!(c, 200, "{t}");
    let (addr, token) = at.unwrap();
    // An intruder on 127.0.0.2 with the token: refused, nothing answered.
    let mut evil = connect_from("127.0.0.2".parse().unwrap(), addr);
    evil.set_read_timeout(Some(T)).unwrap();
    let mut hello = b"RFTT".to_vec();
    hello.extend_from_slice(&token.to_be_bytes());
    for v in [1u32, 1 << 20, 2] {
        hello.extend_from_slice(&v.to_be_bytes());
    }
    let _ = evil.write_all(&hello);
    let mut ack = [0u8; 24];
    let got = evil.read(&mut ack);
    assert!(matches!(got, Ok(0) | Err(_)), "intruder answered: {got:?}");
    // The client itself still gets the session and can use it.
    let x = rdma_xfer::connect(addr, Mode::Tcp, token, xcfg()).unwrap();
    drop(x);
    f.quit();
}

/// Issue 27: rftpd's `iodepth` (4) used to be the most a RADR could get,
/// so `rftp --iodepth 16` silently got 4 (4 MiB per stream per round
/// trip: 0.41 Gbit/s at 50 ms). A default rftpd now grants up to
/// `max_iodepth` (64), still within the session memory budget.
#[test]
fn radr_depth_is_granted_past_the_default_up_to_max_iodepth() {
    let s = server("");
    let mut f = s.ftp();
    for (asked, granted) in [(16, 16), (64, 64), (200, 64)] {
        let (c, t, at) = radr(
            &mut f,
            &format!("STREAMS=1 DEPTH={asked} BS=1048576 MODE=tcp"),
        );
        assert_eq!(c, 200, "{t}");
        let (addr, token) = at.unwrap();
        let cfg = Config {
            streams: 1,
            iodepth: asked,
            ..xcfg()
        };
        let x = rdma_xfer::connect(addr, Mode::Tcp, token, cfg).unwrap();
        assert_eq!(x.config().iodepth, granted, "DEPTH={asked}");
    }
}
