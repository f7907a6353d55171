//! End-to-end tests of the built `iwarp-ping` and `iwarp-demo` binaries:
//! real processes talking over 127.0.0.1, every wait bounded, every child
//! killed if it overstays.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp_tools::rping;

const PING: &str = env!("CARGO_BIN_EXE_iwarp-ping");
const DEMO: &str = env!("CARGO_BIN_EXE_iwarp-demo");

/// What a finished process left behind.
#[derive(Debug)]
struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn drain(r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(r).read_to_string(&mut s);
        s
    })
}

/// Wait for `child` at most `limit`; kill it (and fail) if it takes longer.
fn finish(mut child: Child, limit: Duration, what: &str) -> Outcome {
    let out = drain(child.stdout.take().expect("piped stdout"));
    let err = drain(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let (o, e) = (
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            );
            panic!(
                "{what} did not finish within {limit:?}; killed it.\nstdout:\n{o}\nstderr:\n{e}"
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn run(bin: &str, args: &[&str], limit: Duration) -> Outcome {
    let child = Command::new(bin)
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    finish(child, limit, &format!("{bin} {}", args.join(" ")))
}

/// A port nobody listens on (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A running `iwarp-ping -s`, started and confirmed listening.
struct Server {
    child: Option<Child>,
    stderr_lines: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
    stdout: Option<thread::JoinHandle<String>>,
}

impl Server {
    fn start(port: u16, extra: &[&str]) -> Server {
        let port_s = port.to_string();
        let mut args = vec!["-s", "-a", "127.0.0.1", "-p", &port_s, "--timeout", "20"];
        args.extend_from_slice(extra);
        let mut child = Command::new(PING)
            .args(&args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start iwarp-ping -s");
        let stdout = drain(child.stdout.take().expect("stdout"));
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = Server {
            child: Some(child),
            stderr_lines: rx,
            stderr_seen: Vec::new(),
            stdout: Some(stdout),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match s.stderr_lines.recv_timeout(left) {
                Ok(line) => {
                    let ready = line.contains("listening on");
                    s.stderr_seen.push(line);
                    if ready {
                        return s;
                    }
                }
                Err(_) => panic!(
                    "iwarp-ping -s did not start listening within 10 s: {:?}",
                    s.stderr_seen
                ),
            }
        }
    }

    /// Wait for the server to exit by itself (it does when its client leaves).
    fn finish(mut self, limit: Duration) -> Outcome {
        let mut child = self.child.take().expect("child");
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break st;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("iwarp-ping -s did not exit within {limit:?} after its client finished");
            }
            thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends at EOF; collect what it forwarded.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = self
            .stderr_lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.stderr_seen.push(line);
        }
        let stdout = self
            .stdout
            .take()
            .expect("stdout")
            .join()
            .unwrap_or_default();
        Outcome {
            status,
            stdout,
            stderr: self.stderr_seen.join("\n"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn expected_lines(size: usize, count: u64, prefix: &str) -> Vec<String> {
    (0..count)
        .map(|i| {
            let d = rping::ping_data(size, i);
            format!("{prefix}{}", String::from_utf8_lossy(rping::c_str(&d)))
        })
        .collect()
}

fn ping_roundtrip(size: usize, count: u64, mpa: &[&str]) -> (Outcome, Outcome) {
    let port = free_port();
    let mut server_args = vec!["-v"];
    server_args.extend_from_slice(mpa);
    let server = Server::start(port, &server_args);
    let (port_s, size_s, count_s) = (port.to_string(), size.to_string(), count.to_string());
    let mut args = vec![
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &port_s,
        "-S",
        &size_s,
        "-C",
        &count_s,
        "-V",
        "-v",
        "--timeout",
        "20",
    ];
    args.extend_from_slice(mpa);
    let client = run(PING, &args, Duration::from_secs(60));
    let server = server.finish(Duration::from_secs(20));
    (client, server)
}

#[test]
fn ping_client_against_ping_server_matches_rping_data() {
    let (client, server) = ping_roundtrip(64, 5, &[]);
    assert!(client.status.success(), "client failed: {client:?}");
    assert!(server.status.success(), "server failed: {server:?}");
    let lines: Vec<&str> = client.stdout.lines().collect();
    assert_eq!(
        lines,
        expected_lines(64, 5, "ping data: "),
        "client output: {client:?}"
    );
    // Ping 0 exactly as rping on siw sent it (siw-default.pcap, frame 11).
    assert_eq!(
        lines[0],
        "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    let slines: Vec<&str> = server.stdout.lines().collect();
    assert_eq!(
        slines,
        expected_lines(64, 5, "server ping data: "),
        "server output: {server:?}"
    );
    assert!(
        client.stderr.contains("5 ping(s)") && client.stderr.contains("data validated"),
        "{client:?}"
    );
}

#[test]
fn ping_with_crc_markers_and_the_largest_size() {
    let (client, server) = ping_roundtrip(
        rping::MAX_SIZE,
        3,
        &["--crc", "required", "--markers", "required"],
    );
    assert!(client.status.success(), "client failed: {client:?}");
    assert!(server.status.success(), "server failed: {server:?}");
    assert_eq!(client.stdout.lines().count(), 3, "{client:?}");
    assert!(
        client.stderr.contains("CRC on"),
        "negotiated CRC not reported: {client:?}"
    );
    assert!(
        client.stderr.contains("markers on/on"),
        "negotiated markers not reported: {client:?}"
    );
    assert_eq!(server.stdout.lines().count(), 3, "{server:?}");
}

#[test]
fn ping_without_crc() {
    let (client, server) = ping_roundtrip(1000, 4, &["--crc", "off"]);
    assert!(client.status.success(), "client failed: {client:?}");
    assert!(server.status.success(), "server failed: {server:?}");
    assert!(client.stderr.contains("CRC off"), "{client:?}");
    assert_eq!(
        client.stdout.lines().collect::<Vec<_>>(),
        expected_lines(1000, 4, "ping data: ")
    );
}

#[test]
fn crc_policy_conflict_is_refused() {
    let port = free_port();
    let server = Server::start(port, &["--crc", "off"]);
    let port_s = port.to_string();
    let client = run(
        PING,
        &[
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port_s,
            "-C",
            "1",
            "--crc",
            "required",
            "--timeout",
            "5",
        ],
        Duration::from_secs(30),
    );
    drop(server);
    assert_eq!(client.status.code(), Some(1), "{client:?}");
    assert!(
        client
            .stderr
            .starts_with("iwarp-ping: error: connect to 127.0.0.1:"),
        "{client:?}"
    );
}

#[test]
fn connecting_to_a_closed_port_says_what_to_do() {
    let port = free_port();
    let port_s = port.to_string();
    let out = run(
        PING,
        &["-c", "-a", "127.0.0.1", "-p", &port_s, "-C", "1"],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let want = format!(
        "iwarp-ping: error: connect to 127.0.0.1:{port} failed: connection refused; is `iwarp-ping -s` (or rping -s) running on port {port}?"
    );
    assert_eq!(out.stderr.trim_end(), want, "{out:?}");
    assert!(out.stdout.is_empty());
}

#[test]
fn demo_runs_and_exits_zero() {
    let out = run(DEMO, &[], Duration::from_secs(120));
    assert!(out.status.success(), "{out:?}");
    for want in [
        "ping data: rdma-ping-4: ",
        "5 ping(s)",
        "RDMA Write                      1048576 bytes",
        "content matches what was written",
        "server verified its region: ok",
        "iwarp-demo: OK",
    ] {
        assert!(
            out.stdout.contains(want),
            "missing {want:?} in:\n{}",
            out.stdout
        );
    }
}

#[test]
fn demo_opcodes_ends_with_a_terminate() {
    for mode in [
        ["--crc", "on", "--markers", "off"],
        ["--crc", "off", "--markers", "on"],
    ] {
        let out = run(
            DEMO,
            &["opcodes", mode[0], mode[1], mode[2], mode[3]],
            Duration::from_secs(120),
        );
        assert!(out.status.success(), "{mode:?}: {out:?}");
        for want in [
            "Send with Invalidate",
            "Send with SE and Invalidate",
            "invalidated STag 0x",
            "content matches",
            "peer answered with Terminate",
            "server rejected the bad-STag RDMA Write with a Terminate",
        ] {
            assert!(
                out.stdout.contains(want),
                "{mode:?}: missing {want:?} in:\n{}",
                out.stdout
            );
        }
    }
}

#[test]
fn demo_ping_subcommand() {
    let out = run(
        DEMO,
        &["ping", "-C", "3", "-S", "100"],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("client: 3 ping(s)"), "{out:?}");
    assert!(out.stdout.contains("server: 3 ping(s)"), "{out:?}");
}

#[test]
fn help_works_for_every_tool() {
    for (bin, args, want) in [
        (PING, &["--help"][..], "rping-compatible"),
        (PING, &["-h"][..], "-S <SIZE>"),
        (DEMO, &["--help"][..], "opcodes"),
        (DEMO, &["opcodes", "--help"][..], "--markers"),
        (DEMO, &["ping", "--help"][..], "-C <COUNT>"),
    ] {
        let out = run(bin, args, Duration::from_secs(10));
        assert!(out.status.success(), "{bin} {args:?}: {out:?}");
        assert!(out.stdout.contains("Usage:"), "{bin} {args:?}: {out:?}");
        assert!(
            out.stdout.contains(want),
            "{bin} {args:?}: no {want:?} in {}",
            out.stdout
        );
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    let out = run(PING, &[], Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run(
        PING,
        &["-c", "-a", "127.0.0.1", "-S", "10"],
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("valid range is 26 to 65535"), "{out:?}");
    let out = run(PING, &["-s", "-c"], Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run(PING, &["-c"], Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("needs the server's address"), "{out:?}");
}
