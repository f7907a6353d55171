//! Hostile peers on both sides of RFTP (issue 26, round 2): clients that
//! dribble bytes or flood before logging in, a login that tries to take the
//! whole session memory budget, IPv4-mapped and IPv6 addresses in the
//! address checks, and fake servers that send an endless reply line, a
//! dribbled reply, or name another host for the data connection (PASV,
//! RADR). Every wait is bounded, so a regression fails instead of hanging.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{server, server_at, T};
use rdma_xfer::Mode;
use rftp::client::Ftp;

/// Run `rftp ARGS -q`, killed (and the test failed) after `limit`.
fn rftp(args: &[&str], limit: Duration) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rftp"))
        .args(args)
        // SHA-256 pinned: the output is checked for it.
        .args(["-q", "--checksum", "sha256"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "rftp {args:?} did not finish in {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out: Output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Read from `c` until EOF (or an error: a reset counts as closed) or
/// `limit`; returns what came and whether the connection was closed.
fn read_until_closed(c: &mut TcpStream, limit: Duration) -> (String, bool) {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (String::from_utf8_lossy(&seen).into_owned(), false);
        }
        c.set_read_timeout(Some(left)).unwrap();
        let mut buf = [0u8; 4096];
        match c.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&seen).into_owned(), true),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (String::from_utf8_lossy(&seen).into_owned(), true),
        }
    }
}

// ---- rftpd: the login deadline and byte limit --------------------------

#[test]
fn a_client_that_dribbles_a_byte_a_second_is_closed_at_the_login_deadline() {
    let s = server("login_timeout_secs = 3");
    let t0 = Instant::now();
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut seen = Vec::new();
    let mut closed = false;
    // One byte a second, never a line end. Each read waits one second: it
    // paces the client and sees the close. Before the fix every byte
    // restarted the wait, and the line (up to 4 KiB) took over an hour.
    for &b in b"NOOPNOOPNOOPNOOPNOOP".iter().cycle().take(15) {
        if c.write_all(&[b]).is_err() {
            closed = true;
            break;
        }
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 1024];
        match c.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&seen);
    let took = t0.elapsed();
    assert!(
        closed,
        "a dribbling client was still connected after {took:?}: {text}"
    );
    assert!(
        text.contains("421 No login within 3 s (login_timeout_secs)"),
        "no 421 naming the deadline: {text}"
    );
    assert!(took < Duration::from_secs(8), "closed only after {took:?}");
}

#[test]
fn a_client_that_floods_before_login_is_closed_at_the_byte_limit() {
    // The deadline is far; the byte limit (16 KiB) must end it first.
    let s = server("login_timeout_secs = 60");
    let t0 = Instant::now();
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let flood = b"NOOP\r\n".repeat(4000); // 24,000 bytes of complete lines
    let writer = {
        let mut w = c.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = w.write_all(&flood);
        })
    };
    let (text, closed) = read_until_closed(&mut c, Duration::from_secs(15));
    writer.join().unwrap();
    assert!(closed, "still open after {:?}", t0.elapsed());
    assert!(
        text.contains("421 Sent more than 16384 bytes without logging in"),
        "no 421 naming the byte limit: {}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(
        text.matches("200 OK.").count() < 2800,
        "too many NOOPs answered"
    );

    // One over-long line without an end counts too.
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let blob = vec![b'A'; 64 << 10];
    let writer = {
        let mut w = c.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = w.write_all(&blob);
        })
    };
    let (text, closed) = read_until_closed(&mut c, Duration::from_secs(15));
    writer.join().unwrap();
    assert!(closed && text.contains("421 Sent more than"), "{text}");

    // A normal login is far below the limit.
    let mut f = s.ftp();
    f.expect("NOOP", |c| c == 200).unwrap();
}

// ---- rftpd: each login's share of the session memory budget ----------

/// RADR for a TCP-mode session and connect it; the reply code and text,
/// and the session on 200.
fn radr_session(f: &mut Ftp) -> (u32, String, Option<Box<dyn rdma_xfer::Transport>>) {
    let (c, t) = f.cmd("RADR STREAMS=1 DEPTH=1 BS=65536 MODE=tcp").unwrap();
    if c != 200 {
        return (c, t, None);
    }
    let r = rftp::reply::parse_radr_reply(&t).unwrap();
    let cfg = rdma_xfer::Config {
        streams: 1,
        block_size: 65536,
        iodepth: 1,
        timeout: T,
        connect_timeout: T,
        ..rdma_xfer::Config::default()
    };
    let x = rdma_xfer::connect(r.addr, Mode::Tcp, r.token, cfg).unwrap();
    (c, t, Some(x))
}

#[test]
fn one_login_cannot_take_the_whole_session_memory_budget() {
    // A session of 1 stream x depth 1 x 64 KiB holds 128 KiB (two pools).
    // The budget holds four, each login's share two.
    let s = server(
        "max_streams = 1\niodepth = 1\nblock_size = 65536\n\
         session_mem_budget_bytes = 524288\nsession_mem_per_user_bytes = 262144\n\
         [[users]]\nname = \"bob\"\npassword = \"pw\"\n",
    );
    let mut a1 = s.ftp();
    let (c, t, x1) = radr_session(&mut a1);
    assert_eq!(c, 200, "{t}");
    let mut a2 = s.ftp();
    let (c, t, _x2) = radr_session(&mut a2);
    assert_eq!(c, 200, "{t}");
    // alice's third control connection: over her share, though the server
    // has 256 KiB free.
    let mut a3 = s.ftp();
    let (c, t, _) = radr_session(&mut a3);
    assert_eq!(c, 452, "a third session of one login was granted: {t}");
    assert!(t.contains("session_mem_per_user_bytes"), "{t}");
    assert!(t.contains("(alice)"), "{t}");
    // Another login still gets its sessions.
    let mut b = Ftp::connect("127.0.0.1", s.port, T).unwrap();
    b.login("bob", "pw").unwrap();
    let (c, t, _xb) = radr_session(&mut b);
    assert_eq!(c, 200, "{t}");
    // alice ends one session: her share has room again.
    drop(x1);
    a1.quit();
    let t0 = Instant::now();
    loop {
        let (c, t, x) = radr_session(&mut a3);
        if c == 200 {
            drop(x);
            break;
        }
        assert_eq!(c, 452, "{t}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the ended session's memory never came back: {t}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- rftpd and rftp: IPv4-mapped and IPv6 addresses -------------------

#[test]
fn a_dual_stack_rftpd_serves_ipv4_clients_by_their_ipv4_address() {
    let s = server_at("[::]:0", "");
    common::write_random(&s.root.join("f.bin"), (3 << 20) + 17, 7);
    // rftpd sees this client as ::ffff:127.0.0.1.
    let mut f = s.ftp();
    // EPRT naming the client's IPv4 address is the client's own address.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = l.local_addr().unwrap().port();
    let (c, t) = f.cmd(&format!("EPRT |1|127.0.0.1|{p}|")).unwrap();
    assert_eq!(c, 200, "EPRT of the client's own IPv4 address refused: {t}");
    let (c, t) = f
        .cmd(&format!("PORT 127,0,0,1,{},{}", p >> 8, p & 255))
        .unwrap();
    assert_eq!(c, 200, "{t}");
    // PASV answers with the IPv4 address (227), not "use EPSV" (522).
    let (c, t) = f.cmd("PASV").unwrap();
    assert_eq!(c, 227, "{t}");
    let named = rftp::reply::parse_pasv(&t).unwrap();
    assert_eq!(named.ip().to_string(), "127.0.0.1", "{t}");
    f.quit();
    // An RDMA session (the RADR listener's address check) and a plain FTP
    // transfer, both verified.
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("rdma", &[][..]), ("ftp", &["--tcp"][..])] {
        let out = dir.path().join(name);
        let out_s = out.to_str().unwrap();
        let url = s.url("f.bin");
        let mut args = vec!["get", url.as_str(), "-o", out_s, "--timeout", "10"];
        args.extend_from_slice(extra);
        let (ok, text) = rftp(&args, Duration::from_secs(60));
        assert!(ok, "{name}: {text}");
        assert!(text.contains("SHA-256 verified"), "{name}: {text}");
    }
}

#[test]
fn rftp_reached_by_an_ipv4_mapped_address_accepts_the_ipv4_radr_address() {
    // rftpd on IPv4 names ADDR=127.0.0.1:P; the client's control peer is
    // ::ffff:127.0.0.1: the same host.
    let s = server("");
    common::write_random(&s.root.join("f.bin"), 1 << 20, 9);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("f.bin");
    let url = format!("ftp://alice:secret@[::ffff:127.0.0.1]:{}/f.bin", s.port);
    let (ok, text) = rftp(
        &["get", &url, "-o", out.to_str().unwrap(), "--timeout", "10"],
        Duration::from_secs(60),
    );
    assert!(ok, "{text}");
    assert!(text.contains("via rdma"), "{text}");
}

#[test]
fn rftp_and_rftpd_over_ipv6() {
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIP: no IPv6 loopback (::1) here");
        return;
    }
    let s = server_at("[::1]:0", "");
    common::write_random(&s.root.join("f.bin"), (2 << 20) + 5, 11);
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("rdma", &[][..]), ("ftp", &["--tcp"][..])] {
        let out = dir.path().join(name);
        let url = format!("ftp://alice:secret@[::1]:{}/f.bin", s.port);
        let mut args = vec!["get", url.as_str(), "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (ok, text) = rftp(&args, Duration::from_secs(60));
        assert!(ok, "{name}: {text}");
        assert!(text.contains("SHA-256 verified"), "{name}: {text}");
    }
}

// ---- rftp against hostile servers ---------------------------------------

/// A fake FTP server on 127.0.0.1 for one connection: greets, then answers
/// each command with `answer(verb)` (whole reply lines with CRLF) until
/// QUIT or the end of the connection.
fn fake_server(answer: impl Fn(&str) -> String + Send + 'static) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((c, _)) = l.accept() else { return };
        let _ = c.set_read_timeout(Some(Duration::from_secs(60)));
        let mut out = c.try_clone().unwrap();
        let _ = out.write_all(b"220 fake\r\n");
        let mut r = std::io::BufReader::new(c);
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut r, &mut line).is_ok_and(|n| n > 0) {
            let verb = line.split_whitespace().next().unwrap_or("").to_uppercase();
            let _ = out.write_all(answer(&verb).as_bytes());
            if verb == "QUIT" {
                return;
            }
            line.clear();
        }
    });
    port
}

/// The login and settings rftp sends before a transfer.
fn common_answer(verb: &str) -> Option<&'static str> {
    Some(match verb {
        "USER" => "331 password\r\n",
        "PASS" => "230 in\r\n",
        "TYPE" => "200 ok\r\n",
        "SIZE" => "213 5\r\n",
        "QUIT" => "221 bye\r\n",
        _ => return None,
    })
}

#[test]
fn rftp_refuses_an_endless_reply_line() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else { return };
        let _ = c.write_all(b"220-");
        let chunk = vec![b'x'; 64 << 10];
        // Up to 64 MiB or until rftp hangs up.
        for _ in 0..1024 {
            if c.write_all(&chunk).is_err() {
                return;
            }
        }
        // Then silence, with the connection open.
        std::thread::sleep(Duration::from_secs(30));
    });
    let t0 = Instant::now();
    let e = Ftp::connect("127.0.0.1", port, Duration::from_secs(10)).unwrap_err();
    assert!(
        e.contains("reply line longer than 8192 bytes"),
        "{e} (after {:?})",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn rftp_gives_up_on_a_dribbled_reply_at_its_timeout() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else { return };
        let _ = c.write_all(b"220 ");
        // A byte every 200 ms for up to a minute, never a line end.
        for _ in 0..300 {
            std::thread::sleep(Duration::from_millis(200));
            if c.write_all(b"x").is_err() {
                return;
            }
        }
    });
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(Ftp::connect("127.0.0.1", port, Duration::from_secs(2)).map(|_| ()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("rftp still reading a dribbled reply after 20 s (timeout 2 s)");
    let e = got.unwrap_err();
    assert!(e.contains("no reply from the server within 2 s"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
}

/// A listener on 127.0.0.2, "another host": the address a hostile server
/// names for the data connection.
fn other_host() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.2:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// True if someone connected to `l` (the kernel queues the connection
/// whether or not it was accepted).
fn was_connected(l: &TcpListener) -> bool {
    l.set_nonblocking(true).unwrap();
    l.accept().is_ok()
}

#[test]
fn rftp_refuses_a_pasv_address_other_than_the_servers_unless_allowed() {
    for allow in [false, true] {
        let (data, at) = other_host();
        let pasv = format!(
            "227 Entering Passive Mode (127,0,0,2,{},{})\r\n",
            at.port() >> 8,
            at.port() & 255
        );
        let served = if allow {
            // The data connection, when allowed, gets the file.
            let d = data.try_clone().unwrap();
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                if let Ok((mut c, _)) = d.accept() {
                    let _ = c.write_all(b"hello");
                    let _ = tx.send(());
                }
            });
            Some(rx)
        } else {
            None
        };
        let port = fake_server(move |verb| match common_answer(verb) {
            Some(a) => a.to_string(),
            None => match verb {
                "EPSV" => "500 no EPSV here\r\n".into(),
                "PASV" => pasv.clone(),
                "RETR" => "150 here it comes\r\n226 done\r\n".into(),
                _ => "502 no\r\n".into(),
            },
        });
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("f.txt");
        let url = format!("ftp://u:p@127.0.0.1:{port}/f.txt");
        let mut args = vec![
            "get",
            url.as_str(),
            "-o",
            out.to_str().unwrap(),
            "--tcp",
            "--no-verify",
            "--timeout",
            "5",
        ];
        if allow {
            args.push("--allow-foreign-data-addr");
        }
        let (ok, text) = rftp(&args, Duration::from_secs(30));
        if allow {
            assert!(ok, "{text}");
            served
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .expect("the named data address was not used");
            assert_eq!(std::fs::read(&out).unwrap(), b"hello");
        } else {
            assert!(!ok, "{text}");
            assert!(text.contains("PASV reply names 127.0.0.2"), "{text}");
            assert!(text.contains("--allow-foreign-data-addr"), "{text}");
            assert!(!was_connected(&data), "rftp connected to {at}: {text}");
            assert!(!out.exists() && !dir.path().join("f.txt.part").exists());
        }
    }
}

#[test]
fn rftp_refuses_a_radr_address_other_than_the_servers_unless_allowed() {
    for allow in [false, true] {
        let (data, at) = other_host();
        let radr = format!("200 RADR ADDR={at} TOKEN=0123456789abcdef MODE=tcp STREAMS=1\r\n");
        let port = fake_server(move |verb| match common_answer(verb) {
            Some(a) => a.to_string(),
            None if verb == "RADR" => radr.clone(),
            None => "502 no\r\n".into(),
        });
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("f.bin");
        let url = format!("ftp://u:p@127.0.0.1:{port}/f.bin");
        let mut args = vec![
            "get",
            url.as_str(),
            "-o",
            out.to_str().unwrap(),
            "--no-verify",
            "--timeout",
            "2",
        ];
        if allow {
            args.push("--allow-foreign-data-addr");
        }
        let (ok, text) = rftp(&args, Duration::from_secs(30));
        // Nothing listens to the session protocol there: it fails either
        // way; what matters is whether rftp went there.
        assert!(!ok, "{text}");
        if allow {
            assert!(was_connected(&data), "allowed, but not used: {text}");
        } else {
            assert!(text.contains("RADR reply names 127.0.0.2"), "{text}");
            assert!(text.contains("--allow-foreign-data-addr"), "{text}");
            assert!(!was_connected(&data), "rftp connected to {at}: {text}");
        }
    }
}
