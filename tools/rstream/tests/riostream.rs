//! The built `iwarp-riostream`, client against server over 127.0.0.1:
//! riostream's custom test with every iteration's last transfer verified
//! (`-T v`), blocking and non-blocking; the refused size sweep; and a short
//! `--compare`. Every process is bounded; one that overstays is killed and
//! fails the test.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iwarp-riostream");
const LIMIT: Duration = Duration::from_secs(120);
const HEADER: &str = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer";

/// Waits for `child` at most `LIMIT`, then kills it and fails.
fn bounded(mut child: Child, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish within {LIMIT:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a server on a free port and a client with the same `args`;
/// returns both stdouts.
fn run(args: &[&str]) -> (String, String) {
    let mut srv = Command::new(BIN)
        .args(["-b", "127.0.0.1", "-p", "0", "--timeout", "30"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let err = srv.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    let collector = thread::spawn(move || {
        let mut all = String::new();
        let mut sent = false;
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(p) = line
                    .strip_prefix("iwarp-riostream: listening on ")
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
    let port = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server printed its port");
    let cli = Command::new(BIN)
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
    let c = bounded(cli, "the client");
    let mut out = String::new();
    srv.stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut out)
        .expect("server stdout");
    let s = bounded(srv, "the server");
    let serr = collector.join().unwrap_or_default();
    assert!(
        c.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&c.stderr)
    );
    assert!(s.status.success(), "server failed: {serr}");
    (String::from_utf8_lossy(&c.stdout).into_owned(), out)
}

fn check_table(out: &str, row_start: &str) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0], HEADER);
    assert!(lines[1].starts_with(row_start), "{out}");
}

#[test]
fn blocking_64k_verified_both_ways() {
    let (c, s) = run(&["-S", "65536", "-C", "20", "-I", "4", "-T", "v", "-T", "b"]);
    check_table(&c, "custom    64k     20      4       10m");
    check_table(&s, "custom    64k     20      4       10m");
}

#[test]
fn nonblocking_odd_size_verified_both_ways() {
    let (c, s) = run(&["-S", "5000", "-C", "7", "-I", "30", "-T", "v"]);
    check_table(&c, "custom    4.8k    7       30");
    check_table(&s, "custom    4.8k    7       30");
}

#[test]
fn the_size_sweep_is_refused() {
    let out = bounded(
        Command::new(BIN)
            .args(["-s", "127.0.0.1", "-p", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "the client",
    );
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("sweep is not implemented"), "{e}");
}

#[test]
fn compare_prints_a_row_per_size() {
    let out = bounded(
        Command::new(BIN)
            .args([
                "--compare",
                "--sizes",
                "65536,262144",
                "--bytes",
                "2097152",
                "--repeat",
                "1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "--compare",
    );
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{o}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = o.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{o}");
    assert!(rows[0].trim_start().starts_with("65536 "), "{o}");
    assert!(rows[1].trim_start().starts_with("262144 "), "{o}");
}
