//! Round trips before the first data byte (issue 27): rftp's control
//! connection to rftpd passes through a counting relay, which counts the
//! client's *flights*: bursts of commands sent after the server last
//! spoke, each a round trip the client waited for. Against rftpd (whose
//! greeting names the RDMA extension) rftp pipelines its commands (RFC 959
//! §4.2: replies come in command order), so a small `get` needs two
//! flights up to its `RRTR` (FEAT USER PASS TYPE SIZE RADR; OPTS HASH
//! RRTR HASH) and sends QUIT without waiting for its reply; it needed nine
//! before (USER, PASS, TYPE, FEAT, OPTS HASH, SIZE, NOOP, RADR, RRTR).
//! The RADR rides with the login (issue 27, session 11): the session's
//! connections open while the transfer's batch is on its way, a round
//! trip earlier than when it went with RRTR.
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
        // The session is asked for in the login's flight.
        let radr = flights_until(&f, "RADR");
        assert_eq!(
            radr,
            1,
            "{extra:?}: RADR in flight {radr}, not with the login: {}",
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
fn a_radr_refused_with_the_login_is_asked_again_sized_to_the_file() {
    // The RADR in the login's flight is sized to the path, not to the file
    // (its SIZE reply comes in the same flight). A server whose memory
    // budget refuses that session (452) is asked again in the transfer's
    // flight, sized to the file, which fits: the get succeeds.
    let s = server("session_mem_budget_bytes = 1048576");
    write_random(&s.root.join("small.bin"), 100_000, 5);
    let f = counted_get(s.port, "small.bin", &[]);
    let radrs: Vec<usize> = f
        .iter()
        .enumerate()
        .filter(|(_, fl)| fl.iter().any(|l| l.starts_with("RADR")))
        .map(|(i, _)| i)
        .collect();
    let shown = format!("{f:?}").replace("PASS secret", "PASS ****");
    assert_eq!(radrs, [0, 1], "RADR flights: {shown}");
    let rrtr = flights_until(&f, "RRTR");
    assert_eq!(rrtr, 2, "RRTR in flight {rrtr}: {shown}");
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

/// What the session relay and the control relay saw, for
/// [`a_get_waits_for_no_client_message_after_the_session_is_up`].
#[derive(Default)]
struct Path {
    /// The server wrote its first byte of file data on a data stream.
    first_data: bool,
    /// The control relay passed the server's 226 to the client.
    saw_226: bool,
    /// The round trips the server waited for: a message of the client it
    /// could not go on without, which the relay held until its bound.
    waited: Vec<&'static str>,
}

type Shared = Arc<(Mutex<Path>, std::sync::Condvar)>;

/// The relay's deadlock breaker: a held message goes on after this long,
/// and the wait is counted (the server needed it). Below rftpd's data
/// timeout (5 s in these tests), so an old server still completes; a
/// correct one never comes near it (it needs nothing held).
const HOLD_BOUND: Duration = Duration::from_secs(4);

/// Hold the calling pump until `ready` holds (the server did not need
/// what this pump carries), or for [`HOLD_BOUND`] (it did: counted as
/// `why`).
fn hold_until(sh: &Shared, ready: impl Fn(&Path) -> bool, why: &'static str) {
    let (m, cv) = &**sh;
    let g = m.lock().unwrap();
    let (mut g, t) = cv.wait_timeout_while(g, HOLD_BOUND, |p| !ready(p)).unwrap();
    if t.timed_out() {
        g.waited.push(why);
    }
}

/// The FTP control relay: forwards both ways, notes the 226.
fn ftp_relay(port: u16, sh: Shared) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = l.local_addr().unwrap().port();
    thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        pump(c.try_clone().unwrap(), s.try_clone().unwrap(), |_| {});
        let mut line = String::new();
        pump(s, c, move |b| {
            line.push_str(&String::from_utf8_lossy(b));
            while let Some(i) = line.find("\r\n") {
                let l: String = line.drain(..i + 2).collect();
                if l.starts_with("226 ") {
                    let (m, cv) = &*sh;
                    m.lock().unwrap().saw_226 = true;
                    cv.notify_all();
                }
            }
        });
    });
    me
}

/// Copy `from` to `to` on a thread, calling `see` on each chunk after
/// forwarding it.
fn pump(mut from: TcpStream, mut to: TcpStream, mut see: impl FnMut(&[u8]) + Send + 'static) {
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
            see(&buf[..n]);
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// The transfer session's relay, in front of rftpd's session port. It
/// tells the session's connections apart by their setup (the MPA Request's
/// private data in RDMA mode, RFC 5044 §7.1: key 16, flags 2, length 2,
/// then, after RFC 6581's IRD/ORD, rdma-xfer's Hello, whose index
/// 0xffffffff is the control
/// connection; in TCP mode the 28-byte Hello, stream 0 carrying the
/// control frames), and holds:
///
/// - in RDMA mode, the server's control messages (Begin, ...) until the
///   server wrote file data on a data stream: a server that waits for the
///   client's grant after its Begin cannot, and the hold runs out;
/// - the client's control messages sent after the data began (its Fin)
///   until the server's 226 passed: a server that waits for the Fin
///   before its 226 cannot reply, and the hold runs out.
fn session_relay(target: u16, rdma: bool, sh: Shared) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { break };
            let s = TcpStream::connect(("127.0.0.1", target)).unwrap();
            let (sh_up, sh_down) = (sh.clone(), sh.clone());
            let control = Arc::new(Mutex::new(None::<bool>));
            let ctl_down = control.clone();
            let (mut c_in, mut s_out) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            // Client to server: the setup, then (control only) held
            // after the data began until the 226.
            thread::spawn(move || {
                let mut setup = Vec::new();
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut rest = &buf[..n];
                    if control.lock().unwrap().is_none() {
                        setup.extend_from_slice(rest);
                        let need = if rdma {
                            (setup.len() >= 20).then(|| {
                                20 + usize::from(u16::from_be_bytes([setup[18], setup[19]]))
                            })
                        } else {
                            Some(28)
                        };
                        match need {
                            Some(need) if setup.len() >= need => {
                                // RFC 6581 §5: with the E flag the private
                                // data opens with 4 bytes of IRD/ORD.
                                let at = match (rdma, setup[16] & 0x10 != 0) {
                                    (true, true) => 24,
                                    (true, false) => 20,
                                    (false, _) => 0,
                                };
                                let hello = &setup[at..need];
                                let index = u32::from_be_bytes(hello[12..16].try_into().unwrap());
                                *control.lock().unwrap() =
                                    Some(if rdma { index == u32::MAX } else { index == 0 });
                                let ahead = setup.len() - need;
                                if s_out.write_all(&setup[..need]).is_err() {
                                    break;
                                }
                                rest = &buf[n - ahead..n];
                            }
                            _ => continue,
                        }
                    }
                    if rest.is_empty() {
                        continue;
                    }
                    let after_data = sh_up.0.lock().unwrap().first_data || !rdma;
                    if *control.lock().unwrap() == Some(true) && after_data {
                        hold_until(&sh_up, |p| p.saw_226, "the 226 waited for the client's Fin");
                    }
                    if s_out.write_all(rest).is_err() {
                        break;
                    }
                }
                let _ = s_out.shutdown(Shutdown::Write);
            });
            // Server to client: the MPA Reply (RDMA), then file data on a
            // data stream, or control messages held until the data began.
            let (mut s_in, mut c_out) = (s, c);
            thread::spawn(move || {
                let mut reply = Vec::new();
                let mut setup_done = !rdma;
                let mut buf = [0u8; 65536];
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut rest = &buf[..n];
                    if !setup_done {
                        reply.extend_from_slice(rest);
                        if reply.len() < 20 {
                            continue;
                        }
                        let need = 20 + usize::from(u16::from_be_bytes([reply[18], reply[19]]));
                        if reply.len() < need {
                            continue;
                        }
                        if c_out.write_all(&reply[..need]).is_err() {
                            break;
                        }
                        setup_done = true;
                        rest = &buf[n - (reply.len() - need)..n];
                    }
                    if rest.is_empty() {
                        continue;
                    }
                    if rdma {
                        if *ctl_down.lock().unwrap() == Some(true) {
                            hold_until(
                                &sh_down,
                                |p| p.first_data,
                                "the first block waited for the client's grant",
                            );
                        } else {
                            let (m, cv) = &*sh_down;
                            m.lock().unwrap().first_data = true;
                            cv.notify_all();
                        }
                    }
                    if c_out.write_all(rest).is_err() {
                        break;
                    }
                }
                let _ = c_out.shutdown(Shutdown::Write);
            });
        }
    });
    me
}

/// issue 27: after the session's setup, a get waits for no message of
/// the client. The sink grants its blocks as soon as the session is up
/// (rdma-xfer's PREGRANT), so the server's first block needs no grant
/// round trip after its Begin; and rftpd sends its 226 when its part is
/// done, without the round trip for the client's Fin (the client checks
/// the file against HASH). The relays count the round trips the server
/// waited for, by holding what it should not need: 0 now, 2 before.
#[test]
fn a_get_waits_for_no_client_message_after_the_session_is_up() {
    for rdma in [true, false] {
        let sh: Shared = Arc::default();
        // rftpd's session port, given to it and to the relay in front.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let relay = session_relay(port, rdma, sh.clone());
        let s = server(&format!(
            "rdma_port = {port}\nrdma_advertise = \"127.0.0.1:{relay}\""
        ));
        write_random(&s.root.join("small.bin"), 200_000, 11);
        let ctl = ftp_relay(s.port, sh.clone());
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got.bin");
        let url = format!("ftp://alice:secret@127.0.0.1:{ctl}/small.bin");
        let mode = if rdma { "rdma" } else { "tcp" };
        let o = Command::new(env!("CARGO_BIN_EXE_rftp"))
            .args(["get", &url, "-o", out.to_str().unwrap(), "-q"])
            .args(["--timeout", "10", "--xfer-mode", mode])
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{mode}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(s.root.join("small.bin")).unwrap()
        );
        let p = sh.0.lock().unwrap();
        assert!(p.first_data || !rdma, "{mode}: no data stream seen");
        assert!(
            p.waited.is_empty(),
            "{mode}: the server waited {} round trip(s) for the client after the session was \
             up: {:?}",
            p.waited.len(),
            p.waited
        );
    }
}
