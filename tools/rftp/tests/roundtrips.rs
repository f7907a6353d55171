//! Round trips before the first data byte (issue 27): rftp's control
//! connection to rftpd passes through a counting relay, which counts the
//! client's *flights*: bursts of commands sent after the server last
//! spoke, each a round trip the client waited for. Against rftpd (whose
//! greeting names the RDMA extension) rftp pipelines its commands (RFC 959
//! §4.2: replies come in command order), so a small `get` needs two
//! flights up to its `RRTR` (FEAT USER PASS TYPE SIZE; OPTS HASH RADR
//! RRTR HASH) and sends QUIT without waiting for its reply; it needed nine
//! before (USER, PASS, TYPE, FEAT, OPTS HASH, SIZE, NOOP, RADR, RRTR).
//! A server that does not name the extension still gets one command per
//! round trip. Every wait is bounded.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::{server, write_random};

/// What the relay saw: the client's flights, each the command lines it
/// carried.
#[derive(Default)]
struct Seen {
    flights: Vec<Vec<String>>,
    /// The server spoke since the client's last flight.
    server_spoke: bool,
    partial: String,
}

/// A relay on a fresh port to `127.0.0.1:port` for one control
/// connection; returns its port, what it saw, and a channel that says
/// when the client closed its side (everything it sent has been seen).
fn counting_relay(port: u16) -> (u16, Arc<Mutex<Seen>>, mpsc::Receiver<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Seen {
        server_spoke: true,
        ..Seen::default()
    }));
    let s2 = seen.clone();
    let (closed_tx, closed) = mpsc::channel();
    thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        for x in [&c, &s] {
            x.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let _ = x.set_nodelay(true);
        }
        let (mut c_in, mut s_out) = (c.try_clone().unwrap(), s.try_clone().unwrap());
        let up_seen = s2.clone();
        let up = thread::spawn(move || {
            let mut buf = [0u8; 16384];
            while let Ok(n) = c_in.read(&mut buf) {
                if n == 0 {
                    break;
                }
                {
                    let mut g = up_seen.lock().unwrap();
                    if g.server_spoke {
                        g.flights.push(Vec::new());
                        g.server_spoke = false;
                    }
                    g.partial.push_str(&String::from_utf8_lossy(&buf[..n]));
                    while let Some(i) = g.partial.find("\r\n") {
                        let line: String = g.partial.drain(..i + 2).collect();
                        let line = line.trim_end().to_string();
                        g.flights.last_mut().unwrap().push(line);
                    }
                }
                if s_out.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = s_out.shutdown(Shutdown::Write);
            let _ = closed_tx.send(());
        });
        let (mut s_in, mut c_out) = (s, c);
        let mut buf = [0u8; 16384];
        while let Ok(n) = s_in.read(&mut buf) {
            if n == 0 {
                break;
            }
            // Marked before forwarding: a command the client sends after
            // reading this reply is a new flight.
            s2.lock().unwrap().server_spoke = true;
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Write);
        let _ = up.join();
    });
    (me, seen, closed)
}

/// Run `rftp get` of `name` through a counting relay in front of `port`.
fn counted_get(port: u16, name: &str, extra: &[&str]) -> Vec<Vec<String>> {
    let (relay, seen, closed) = counting_relay(port);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("got.bin");
    let url = format!("ftp://alice:secret@127.0.0.1:{relay}/{name}");
    let o = Command::new(env!("CARGO_BIN_EXE_rftp"))
        .args([
            "get",
            &url,
            "-o",
            out.to_str().unwrap(),
            "-q",
            "--timeout",
            "10",
        ])
        .args(extra)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The relay has seen everything once rftp closed the connection.
    closed
        .recv_timeout(Duration::from_secs(10))
        .expect("rftp's control connection still open 10 s after it exited");
    let flights = seen.lock().unwrap().flights.clone();
    flights
}

/// The flights up to and including the one that carries `verb`.
fn flights_until(f: &[Vec<String>], verb: &str) -> usize {
    f.iter()
        .position(|fl| fl.iter().any(|l| l.starts_with(verb)))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no {verb} in {f:?}"))
}

#[test]
fn get_from_rftpd_waits_two_round_trips_before_the_data() {
    let s = server("");
    write_random(&s.root.join("small.bin"), 200_000, 7);
    // Hide the password in failure output.
    let shown =
        |f: &[Vec<String>]| -> String { format!("{f:?}").replace("PASS secret", "PASS ****") };
    // RDMA (the default) and the middleware's TCP mode.
    for extra in [&[][..], &["--xfer-mode", "tcp"][..]] {
        let f = counted_get(s.port, "small.bin", extra);
        let before = flights_until(&f, "RRTR");
        assert!(
            before <= 2,
            "{extra:?}: {before} round trips up to RRTR (at most 2): {}",
            shown(&f)
        );
        // HASH rode in the same flight as RRTR, and QUIT's reply is not
        // waited for: no flight after the QUIT one.
        assert!(
            f.len() <= 3,
            "{extra:?}: {} flights in all (at most 3): {}",
            f.len(),
            shown(&f)
        );
    }
    // A resume sends REST in the same flight.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("got.bin");
    let part = dir.path().join("got.bin.part");
    let whole = std::fs::read(s.root.join("small.bin")).unwrap();
    std::fs::write(&part, &whole[..65536]).unwrap();
    let (relay, seen, closed) = counting_relay(s.port);
    let url = format!("ftp://alice:secret@127.0.0.1:{relay}/small.bin");
    let o = Command::new(env!("CARGO_BIN_EXE_rftp"))
        .args([
            "get",
            &url,
            "-o",
            out.to_str().unwrap(),
            "-q",
            "--timeout",
            "10",
        ])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&out).unwrap(), whole);
    closed
        .recv_timeout(Duration::from_secs(10))
        .expect("rftp's control connection still open 10 s after it exited");
    let f = seen.lock().unwrap().flights.clone();
    let rrtr = flights_until(&f, "RRTR");
    assert!(
        rrtr <= 2,
        "resume: {rrtr} round trips up to RRTR: {}",
        shown(&f)
    );
    assert!(
        f[rrtr - 1].iter().any(|l| l == "REST 65536"),
        "resume: REST not in the RRTR flight: {}",
        shown(&f)
    );
}

#[test]
fn plain_ftp_and_other_servers_are_not_pipelined() {
    // rftpd without the extension does not name it in its greeting: one
    // command per flight (the fallback a server that is not rftpd gets).
    let s = server("rdma = false");
    write_random(&s.root.join("small.bin"), 100_000, 9);
    let f = counted_get(s.port, "small.bin", &[]);
    for fl in &f {
        assert_eq!(fl.len(), 1, "a flight with more than one command: {f:?}");
    }
}
