//! Byte-level tests of the relay: exact truncation point, RST vs FIN,
//! blackhole, corruption, stall timing, connection selection, resegmented
//! streams intact, header rewriting, bad specs named.

use crate::config::*;
use crate::relay::*;
use crate::rewrite::*;
use crate::spec::*;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn spec(s: &str) -> FaultSpec {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn fault_specs_parse_and_bad_ones_are_named() {
    let f = spec("drop:at=1M,dir=down,map=1,conn=2,how=fin");
    assert_eq!(f.kind, Kind::Drop { rst: false });
    assert_eq!(f.at, Trigger::Bytes(1 << 20));
    assert_eq!((f.dir, f.map), (Dir::Down, Some(1)));
    assert_eq!(f.conn, ConnRange { first: 2, last: 2 });
    assert_eq!(spec("drop").kind, Kind::Drop { rst: true });
    assert_eq!(spec("drop").at, Trigger::Bytes(0));
    assert_eq!(
        spec("stall:after=500ms,for=2s").kind,
        Kind::Stall(Duration::from_secs(2))
    );
    assert_eq!(
        spec("stall:after=500ms").at,
        Trigger::Time(Duration::from_millis(500))
    );
    assert_eq!(
        spec("stall:at=3s").at,
        Trigger::Time(Duration::from_secs(3))
    );
    assert_eq!(
        spec("truncate:how=close").kind,
        Kind::Truncate { close: true }
    );
    assert_eq!(spec("blackhole:conn=2-").conn.last, usize::MAX);
    assert_eq!(spec("corrupt:at=4096").at, Trigger::Bytes(4096));
    assert!(spec("drop:at=3M,wait=signal").wait_signal);
    assert!(!spec("drop:at=3M").wait_signal);
    assert_eq!(
        spec("reseg:seed=7,max=13").kind,
        Kind::Reseg {
            seed: Some(7),
            max: 13
        }
    );
    for (bad, says) in [
        ("explode", "unknown fault"),
        ("drop:how=slowly", "how=rst or how=fin"),
        ("drop:when=1", "unknown key"),
        ("drop:at", "not KEY=VALUE"),
        ("drop:at=soon", "byte offset"),
        ("drop:dir=sideways", "up, down or both"),
        ("drop:conn=0", "1-based"),
        ("drop:conn=3-2", "N-M"),
        ("drop:map=x", "--listen"),
        ("stall:for=x", "milliseconds"),
        ("drop:for=1", "does not apply"),
        ("corrupt:at=5ms", "byte offset"),
        ("reseg:max=0", "1 to 16M"),
        ("blackhole:seed=1", "does not apply"),
        ("drop:wait=later", "wait=signal"),
    ] {
        let e = bad.parse::<FaultSpec>().unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn pieces_are_tiny_odd_and_large() {
    let mut r = Rng::new(7);
    let p: Vec<usize> = (0..10_000).map(|_| r.piece(65536)).collect();
    assert!(p.iter().all(|&n| (1..=65536).contains(&n)));
    assert!(p.iter().filter(|&&n| n < 16).count() > 500);
    assert!(p.iter().filter(|&&n| n > 16384).count() > 200);
    assert!(p.iter().filter(|&&n| n % 2 == 1).count() > 2000);
    let mut a = Rng::new(7);
    assert!(
        (0..100).all(|i| a.piece(65536) == p[i]),
        "same seed, same pieces"
    );
    assert!(Rng::new(1).piece(1) == 1);
}

/// A target that records what each accepted connection sent and how
/// its stream ended; it sends `reply` on each connection first.
struct Sink {
    addr: SocketAddr,
    got: std::sync::mpsc::Receiver<(Vec<u8>, String)>,
}

fn sink(reply: Vec<u8>) -> Sink {
    sink_idle(reply, Duration::from_millis(800))
}

/// [`sink`] whose connections end as "open" after `idle` without bytes.
fn sink_idle(reply: Vec<u8>, idle: Duration) -> Sink {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let mut c = c.unwrap();
            let tx = tx.clone();
            let reply = reply.clone();
            std::thread::spawn(move || {
                let _ = c.write_all(&reply);
                c.set_read_timeout(Some(idle)).unwrap();
                let mut all = Vec::new();
                let mut b = vec![0u8; 65536];
                let end = loop {
                    match c.read(&mut b) {
                        Ok(0) => break "eof".to_string(),
                        Ok(n) => all.extend_from_slice(&b[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            break "open".to_string()
                        }
                        Err(e) => break format!("{:?}", e.kind()),
                    }
                };
                let _ = tx.send((all, end));
            });
        }
    });
    Sink { addr, got }
}

fn relay_to(target: SocketAddr, faults: &[&str]) -> SocketAddr {
    let cfg = Config {
        faults: faults.iter().map(|f| spec(f)).collect(),
        ..Config::default()
    };
    start(&[("127.0.0.1:0".parse().unwrap(), target)], cfg).unwrap()[0]
}

fn data(n: usize) -> Vec<u8> {
    let mut r = Rng::new(3);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

/// Send `d` through `relay`, then read what comes back until the end;
/// returns (what came back, how it ended, what the target got and how
/// that ended).
fn exchange(
    relay: SocketAddr,
    s: &Sink,
    d: &[u8],
    close: bool,
) -> (Vec<u8>, String, Vec<u8>, String) {
    let mut c = TcpStream::connect(relay).unwrap();
    let _ = c.write_all(d);
    if close {
        let _ = c.shutdown(Shutdown::Write);
    }
    c.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut back = Vec::new();
    let mut b = vec![0u8; 65536];
    let end = loop {
        match c.read(&mut b) {
            Ok(0) => break "eof".to_string(),
            Ok(n) => back.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break "open".to_string(),
            Err(e) => break format!("{:?}", e.kind()),
        }
    };
    let (got, tend) = s.got.recv_timeout(Duration::from_secs(10)).unwrap();
    (back, end, got, tend)
}

#[test]
fn clean_and_resegmented_streams_arrive_whole() {
    let d = data(3 << 20);
    let s = sink(data(100_000));
    for faults in [
        &[][..],
        &["reseg:seed=9,max=4000"][..],
        &["reseg:at=1000"][..],
    ] {
        let r = relay_to(s.addr, faults);
        let (back, end, got, tend) = exchange(r, &s, &d, true);
        assert_eq!((end.as_str(), tend.as_str()), ("eof", "eof"), "{faults:?}");
        assert!(got == d && back == data(100_000), "{faults:?}");
    }
}

#[test]
fn truncate_forwards_exactly_n_bytes_then_half_closes() {
    let d = data(200_000);
    let s = sink(b"hello".to_vec());
    let r = relay_to(s.addr, &["truncate:at=70001,dir=up"]);
    let (back, _end, got, tend) = exchange(r, &s, &d, false);
    assert_eq!(got.len(), 70001);
    assert_eq!(got, d[..70001]);
    assert_eq!(tend, "eof");
    assert_eq!(back, b"hello", "the other direction still flows");
}

/// `wait=signal`: the fault holds its direction at the offset (nothing
/// past it arrives, the connection stays open) until the signal, then
/// fires. The sink's own reader gives up after 800 ms of silence
/// ("open"), so without the hold it would see all 200,000 bytes and the
/// half-close at once.
#[test]
fn a_fault_waiting_for_the_signal_holds_then_fires() {
    let d = data(200_000);
    let s = sink(Vec::new());
    let signal = Signal::default();
    let cfg = Config {
        faults: vec![spec("truncate:at=70001,dir=up,wait=signal")],
        signal: signal.clone(),
        ..Config::default()
    };
    let r = start(&[("127.0.0.1:0".parse().unwrap(), s.addr)], cfg).unwrap()[0];
    let mut c = TcpStream::connect(r).unwrap();
    c.write_all(&d).unwrap();
    let (got, end) = s.got.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (got.len(), end.as_str()),
        (70001, "open"),
        "held at the offset"
    );
    assert_eq!(got, d[..70001]);
    // Raised: the truncation fires, the next connection's reader sees
    // the half-close right after the 70,001 bytes.
    signal.raise();
    let mut c2 = TcpStream::connect(r).unwrap();
    c2.write_all(&d).unwrap();
    let (got, end) = s.got.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((got.len(), end.as_str()), (70001, "eof"));
    drop(c);
}

#[test]
fn drop_with_rst_and_with_fin() {
    let d = data(300_000);
    let s = sink(Vec::new());
    let r = relay_to(s.addr, &["drop:at=100000,dir=up,how=rst"]);
    let (_, end, got, tend) = exchange(r, &s, &d, false);
    assert_eq!(got.len(), 100_000);
    assert_eq!(
        (end.as_str(), tend.as_str()),
        ("ConnectionReset", "ConnectionReset")
    );
    let r = relay_to(s.addr, &["drop:at=100000,dir=up,how=fin"]);
    let (_, end, got, tend) = exchange(r, &s, &d, false);
    assert_eq!(got.len(), 100_000);
    assert_eq!((end.as_str(), tend.as_str()), ("eof", "eof"));
    // By time, with nothing flowing.
    let r = relay_to(s.addr, &["drop:at=200ms"]);
    let t = Instant::now();
    let (_, end, _, tend) = exchange(r, &s, b"", false);
    assert_eq!(
        (end.as_str(), tend.as_str()),
        ("ConnectionReset", "ConnectionReset")
    );
    assert!(t.elapsed() < Duration::from_millis(1400));
}

#[test]
fn blackhole_swallows_and_keeps_the_connections_open() {
    let d = data(300_000);
    let s = sink(Vec::new());
    let r = relay_to(s.addr, &["blackhole:at=12345,dir=up", "blackhole:dir=down"]);
    let (_, end, got, tend) = exchange(r, &s, &d, true);
    assert_eq!(got, d[..12345]);
    assert_eq!(
        (end.as_str(), tend.as_str()),
        ("open", "open"),
        "no FIN passed on"
    );
}

#[test]
fn corrupt_flips_exactly_one_byte() {
    let d = data(300_000);
    let s = sink(Vec::new());
    let r = relay_to(s.addr, &["corrupt:at=200001,dir=up", "reseg:seed=3"]);
    let (_, _, got, _) = exchange(r, &s, &d, true);
    assert_eq!(got.len(), d.len());
    let diff: Vec<usize> = (0..d.len()).filter(|&i| got[i] != d[i]).collect();
    assert_eq!(diff, vec![200_001]);
    assert_eq!(got[200_001], d[200_001] ^ 0xff);
}

#[test]
fn stall_pauses_then_resumes_and_faults_pick_connections() {
    // The stall is long against a 50 kB exchange on loopback (which took
    // 0.63 s at load 50 under stress-ng), and each side is judged on its
    // own bound, not against the other's wall time: the stalled exchange
    // cannot end before the stall does at any load, and the other one,
    // were it stalled too, could not end before it either. The sink waits
    // longer than the stall without bytes, so the stalled stream resumes
    // rather than being cut.
    const STALL: Duration = Duration::from_millis(2500);
    let d = data(50_000);
    let s = sink_idle(Vec::new(), STALL * 2);
    let r = relay_to(
        s.addr,
        &[&format!(
            "stall:at=10000,for={},dir=up,conn=2",
            STALL.as_millis()
        )],
    );
    // Connection 1: no stall.
    let t = Instant::now();
    let (_, _, got, tend) = exchange(r, &s, &d, true);
    assert_eq!((got.len(), tend.as_str()), (d.len(), "eof"));
    assert_eq!(got, d);
    let quick = t.elapsed();
    assert!(
        quick < STALL,
        "connection 1 was held {quick:?}: stalled too?"
    );
    // Connection 2: stalled, then complete.
    let t = Instant::now();
    let (_, _, got, tend) = exchange(r, &s, &d, true);
    assert_eq!((got.len(), tend.as_str()), (d.len(), "eof"));
    assert_eq!(got, d);
    let slow = t.elapsed();
    assert!(slow >= STALL, "connection 2 took {slow:?}: not stalled?");
}
#[test]
fn connect_back_headers_are_rewritten_to_a_relay_listener() {
    let client_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = client_listener.local_addr().unwrap().port();
    let a = Alg {
        rdma_header: true,
        map: 1,
        ..Alg::default()
    };
    let cfg = Arc::new(Config {
        alg: Some(a.clone()),
        ..Config::default()
    });
    let lo = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut alg = Rewriter::new(Rewrite::RdmaHeader, a, cfg, lo, lo, serve_counted);
    let req = format!(
            "GET /f HTTP/1.1\r\nHost: h\r\nRDMA: client-reads, ip=127.0.0.1, port={p}, maxlen=9\r\n\r\n"
        );
    // Fed a byte at a time: the RDMA line is held until complete,
    // everything else passes at once.
    let mut out = Vec::new();
    for (i, b) in req.as_bytes().iter().enumerate() {
        let o = alg.feed(&[*b]);
        if i == 2 {
            assert_eq!(o, b"T", "not held outside an RDMA: line");
        }
        out.extend(o);
    }
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.ends_with("\r\n\r\n") && out.starts_with("GET /f HTTP/1.1\r\nHost: h\r\n"),
        "{out}"
    );
    let line = out.lines().find(|l| l.starts_with("RDMA:")).unwrap();
    let port: u16 = line
        .split("port=")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(port, p);
    assert!(
        line.starts_with("RDMA: client-reads, ip=127.0.0.1, port=") && line.ends_with(", maxlen=9"),
        "{line}"
    );
    // The same listener again: the same relay port.
    let again = String::from_utf8(alg.feed(req.as_bytes()).clone()).unwrap();
    assert!(again.contains(&format!("port={port},")), "{again}");
    // The relay port reaches the client's listener.
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"ping").unwrap();
    let (mut a, _) = client_listener.accept().unwrap();
    let mut b = [0u8; 4];
    a.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    // Other lines and bodies pass untouched.
    let body = b"xRDMA: ip=1.2.3.4, port=5\r\n".to_vec();
    assert_eq!(alg.feed(&body), body);
}
#[test]
fn ftp_passive_replies_are_rewritten_to_a_relay_listener() {
    let data_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = data_listener.local_addr().unwrap().port();
    let a = Alg {
        ftp_passive: true,
        map: 1,
        ..Alg::default()
    };
    let cfg = Arc::new(Config {
        alg: Some(a.clone()),
        ..Config::default()
    });
    let lo = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut alg = Rewriter::new(Rewrite::FtpPassive, a, cfg, lo, lo, serve_counted);
    let mut out = Vec::new();
    let epsv = format!("200 ok\r\n229 Entering Extended Passive Mode (|||{p}|)\r\n");
    for chunk in epsv.as_bytes().chunks(5) {
        out.extend(alg.feed(chunk));
    }
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.starts_with("200 ok\r\n229 Entering Extended Passive Mode (|||"),
        "{out}"
    );
    let port: u16 = out
        .split("|||")
        .nth(1)
        .unwrap()
        .split('|')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(port, p);
    let pasv = format!(
        "227 Entering Passive Mode (127,0,0,1,{},{}).\r\n",
        p / 256,
        p % 256
    );
    let out2 = String::from_utf8(alg.feed(pasv.as_bytes())).unwrap();
    assert_eq!(
        out2,
        format!(
            "227 Entering Passive Mode (127,0,0,1,{},{}).\r\n",
            port / 256,
            port % 256
        ),
        "the same target, the same relay listener"
    );
    // The relay port reaches the server's data listener, counted on
    // mapping 1.
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"data").unwrap();
    let (mut s, _) = data_listener.accept().unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"data");
    assert_eq!(alg.alg.count.load(Ordering::Relaxed), 1);
    // Other replies pass untouched.
    assert_eq!(
        alg.feed(b"226 Transfer complete (1 2)\r\n"),
        b"226 Transfer complete (1 2)\r\n"
    );
}
