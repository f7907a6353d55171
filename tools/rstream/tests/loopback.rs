//! The built `iwarp-rstream`, client against server over 127.0.0.1: a
//! latency (ping-pong) and a bandwidth test with every byte verified
//! (`-T v`), blocking and async variants, the `--tcp` baseline with JSON
//! output, and a verification failure that must fail the run. Every
//! process is bounded; one that overstays is killed and fails the test.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iwarp-rstream");
const LIMIT: Duration = Duration::from_secs(120);
const HEADER: &str = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer";

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

fn finish(mut child: Child, stderr: thread::JoinHandle<String>, what: &str) -> Outcome {
    let out = drain(child.stdout.take().expect("piped stdout"));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {LIMIT:?}; killed it.\nstdout:\n{}\nstderr:\n{}",
                out.join().unwrap_or_default(),
                stderr.join().unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Starts a server on a free port (`-p 0`); returns it, its stderr
/// collector and the port it printed.
fn server(args: &[&str]) -> (Child, thread::JoinHandle<String>, u16) {
    let mut child = Command::new(BIN)
        .args(["-b", "127.0.0.1", "-p", "0", "--timeout", "30"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let err = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    let collector = thread::spawn(move || {
        let mut all = String::new();
        let mut sent = false;
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(p) = line
                    .strip_prefix("iwarp-rstream: listening on ")
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.trim().parse::<u16>().ok())
                {
                    let _ = tx.send(p);
                    sent = true;
                }
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let port = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(p) => p,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the server never printed its port; stderr:\n{}",
                collector.join().unwrap_or_default()
            );
        }
    };
    (child, collector, port)
}

fn client(port: u16, args: &[&str]) -> Outcome {
    let mut child = Command::new(BIN)
        .args([
            "-s",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--timeout",
            "30",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the client");
    let err = drain(child.stderr.take().expect("piped stderr"));
    finish(child, err, "the client")
}

/// Runs server and client with the same arguments; returns both outcomes.
fn pair(args: &[&str]) -> (Outcome, Outcome) {
    let (srv, srv_err, port) = server(args);
    let c = client(port, args);
    let s = finish(srv, srv_err, "the server");
    (c, s)
}

/// A row of the table: the columns rstream prints.
#[derive(Debug)]
struct Row {
    name: String,
    bytes: String,
    xfers: String,
    iters: String,
    total: String,
    secs: f64,
    gbps: f64,
    usec: f64,
}

fn rows(out: &Outcome, who: &str) -> Vec<Row> {
    assert!(
        out.status.success(),
        "{who} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some(HEADER), "{who}: header\n{}", out.stdout);
    lines
        .map(|l| {
            // Fixed columns: name 10, bytes/xfers/iters/total 8 each, then
            // "%8.2fs%10.2f%11.2f".
            assert!(l.len() >= 72, "{who}: short row {l:?}");
            let col = |a: usize, b: usize| l[a..b].trim().to_string();
            assert_eq!(&l[50..51], "s", "{who}: time column in {l:?}");
            Row {
                name: col(0, 10),
                bytes: col(10, 18),
                xfers: col(18, 26),
                iters: col(26, 34),
                total: col(34, 42),
                secs: col(42, 50).parse().expect("time"),
                gbps: col(51, 61).parse().expect("Gb/sec"),
                usec: col(61, 72).parse().expect("usec/xfer"),
            }
        })
        .collect()
}

#[test]
fn latency_ping_pong_verified() {
    let args = ["-T", "v", "-C", "1", "-I", "500", "-S", "64"];
    let (c, s) = pair(&args);
    for (out, who) in [(&c, "client"), (&s, "server")] {
        let r = rows(out, who);
        assert_eq!(r.len(), 1, "{who}: {}", out.stdout);
        let r = &r[0];
        assert_eq!(
            (&*r.name, &*r.bytes, &*r.xfers, &*r.iters, &*r.total),
            ("custom", "64", "1", "500", "62k"),
            "{r:?}"
        );
        assert!(r.secs > 0.0 && r.usec > 0.0, "{r:?}");
    }
}

#[test]
fn bandwidth_verified_nonblocking_and_blocking() {
    for mode in ["n", "b"] {
        let args = ["-T", "v", "-T", mode, "-C", "100", "-S", "65536"];
        let (c, s) = pair(&args);
        for (out, who) in [(&c, "client"), (&s, "server")] {
            let r = rows(out, who);
            assert_eq!(r.len(), 1, "{who}: {}", out.stdout);
            let r = &r[0];
            assert_eq!(
                (&*r.name, &*r.bytes, &*r.xfers, &*r.iters, &*r.total),
                ("custom", "64k", "100", "1", "12m"),
                "-T {mode}: {r:?}"
            );
            assert!(r.gbps > 0.0, "{r:?}");
        }
    }
}

#[test]
fn async_mode_with_poll_on_the_readiness_descriptor() {
    let args = [
        "-T", "a", "-T", "b", "-T", "v", "-C", "20", "-I", "3", "-S", "10000",
    ];
    let (c, s) = pair(&args);
    for (out, who) in [(&c, "client"), (&s, "server")] {
        let r = rows(out, who);
        assert_eq!(r[0].total, "1.1m", "{r:?}"); // 3 * 20 * 10000 * 2 bytes
    }
}

#[test]
fn tcp_baseline_in_the_same_run_as_json() {
    let args = [
        "-T", "v", "-C", "1", "-I", "200", "-S", "64", "--tcp", "--json",
    ];
    let (c, s) = pair(&args);
    for (out, who) in [(&c, "client"), (&s, "server")] {
        assert!(out.status.success(), "{who}: {out:?}");
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{who}: {}", out.stdout);
        assert!(
            lines[0].contains("\"transport\":\"rsockets\""),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("\"design\":\"enhanced\""), "{}", lines[0]);
        assert!(lines[1].contains("\"transport\":\"tcp\""), "{}", lines[1]);
        for l in lines {
            assert!(l.starts_with('{') && l.ends_with('}'), "{l}");
            assert!(l.contains("\"total_bytes\":25600"), "{l}");
        }
    }
}

#[test]
fn plain_sockets_and_the_basic_design() {
    for extra in [&["-T", "s"][..], &["--design", "basic"][..]] {
        let mut args = vec!["-T", "v", "-C", "50", "-S", "4096"];
        args.extend_from_slice(extra);
        let (c, s) = pair(&args);
        assert_eq!(rows(&c, "client")[0].total, "400k", "{extra:?}");
        assert_eq!(rows(&s, "server")[0].total, "400k", "{extra:?}");
    }
}

#[test]
fn a_corrupt_stream_fails_verification() {
    // The server does not format its data (no -T v): it sends back
    // whatever its buffer holds, which breaks the client's sequence once
    // more than one transfer goes each way.
    let (srv, srv_err, port) = server(&["-C", "4", "-S", "64"]);
    let c = client(port, &["-T", "v", "-C", "4", "-S", "64"]);
    let _ = finish(srv, srv_err, "the server");
    assert!(!c.status.success(), "{c:?}");
    assert!(
        c.stderr.contains("data verification failed byte"),
        "{}",
        c.stderr
    );
}
