//! Socket-option system calls per iWARP connection set-up (issue 29, the
//! set-up rate), counted by `strace -c` around `iwarp-connrate`: the
//! calls of 220 connections less those of 20, per connection, both ends.
//!
//! Before the set-up path was trimmed a connection cost 45 of them: a
//! socket timeout armed before every MPA read and write and both cleared
//! again for the data path (12), `TCP_NODELAY` and keepalive set twice,
//! the accepted socket's options set one by one although it inherits its
//! listener's, `fcntl`s around the connect, `getsockname`/`getpeername`
//! for addresses the connection manager knew, two `TCP_INFO` reads and a
//! `TCP_MAXSEG`. Now about 13 (pool) or 15 (threads). The bound, 20,
//! catches any one of those coming back in numbers without pinning the
//! exact count.
//!
//! Skipped (with a note) where strace is missing or cannot trace.

use std::path::PathBuf;
use std::process::{Command, Stdio};

const TRACED: &str = "trace=setsockopt,getsockopt,fcntl,getsockname,getpeername";
const BOUND: f64 = 20.0;

fn strace_usable() -> bool {
    Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The traced calls of one `iwarp-connrate` run of `n` connections.
fn calls(engine: &str, n: u32) -> u64 {
    let out: PathBuf = std::env::temp_dir().join(format!(
        "connrate-strace-{}-{engine}-{n}.txt",
        std::process::id()
    ));
    let st = Command::new("timeout")
        .arg("120")
        .args(["strace", "-f", "-c", "-e", TRACED, "-o"])
        .arg(&out)
        .arg(env!("CARGO_BIN_EXE_iwarp-connrate"))
        .args(["-n", &n.to_string(), "-c", "2", "--pairs", "1"])
        .args(["--transport", "iwarp", "--timeout", "30"])
        .env("IWARP_PROGRESS", engine)
        .stdout(Stdio::null())
        .status()
        .expect("running strace");
    assert!(st.success(), "iwarp-connrate under strace failed: {st}");
    let text = std::fs::read_to_string(&out).expect("reading strace's summary");
    let _ = std::fs::remove_file(&out);
    // strace -c ends with: "100.00  0.001234  5  678  9 total" (the
    // errors column may be empty): calls are the 4th field.
    text.lines()
        .find(|l| l.trim_end().ends_with("total"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no total line in strace's summary:\n{text}"))
}

#[test]
fn a_connection_set_up_costs_few_socket_option_calls() {
    if !strace_usable() {
        eprintln!("SKIP: strace is missing or cannot trace here (apt-get install strace)");
        return;
    }
    for engine in ["pool", "threads"] {
        let (small, large) = (calls(engine, 10), calls(engine, 110));
        let per_conn = large.saturating_sub(small) as f64 / 100.0;
        eprintln!("{engine}: {per_conn:.1} socket-option calls per connection (both ends)");
        assert!(
            per_conn <= BOUND,
            "{engine}: {per_conn:.1} setsockopt/getsockopt/fcntl/getsockname/getpeername calls \
             per connection set-up (both ends), more than {BOUND}: see this file's docs for the \
             calls that were removed"
        );
    }
}
