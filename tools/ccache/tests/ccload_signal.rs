//! `ccload run --duration D` ends early on SIGTERM and still reports what
//! ran: scripts/test-cache-topology.sh stops its load that way a fixed time
//! after it has killed a server, so the window it judges after the kill
//! does not depend on how long the kill took on a loaded machine.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A stand-in HTTP/1.1 server: every request on every connection gets a
/// 200 with a two-byte body, keep-alive. Tells `accepted` about each
/// connection.
fn serve(listener: TcpListener, accepted: mpsc::Sender<()>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { return };
        let _ = accepted.send(());
        std::thread::spawn(move || {
            let mut w = conn.try_clone().expect("clone");
            let mut r = BufReader::new(conn);
            let mut line = String::new();
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line == "\r\n" => {
                        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if w.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                }
            }
        });
    }
}

#[test]
fn sigterm_ends_a_timed_run_with_its_report() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, accepted) = mpsc::channel();
    std::thread::spawn(move || serve(listener, tx));

    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_ccload"))
        .args(["run", "--url", &format!("http://127.0.0.1:{port}/docs/")])
        .args([
            "--docs",
            "4",
            "--clients",
            "2",
            "--duration",
            "120",
            "--timeout",
            "5",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ccload");
    let pid = child.id();
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || done_tx.send(child.wait_with_output()));

    // A client connected, so the signals were caught before (ccload
    // catches them before it starts its clients): the SIGTERM below cannot
    // meet the default action.
    accepted
        .recv_timeout(Duration::from_secs(30))
        .expect("ccload connected within 30 s");
    let kill = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -TERM {pid}: {kill}");

    let out = match done.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("wait for ccload"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("ccload still ran 60 s after SIGTERM (its --duration is 120 s)");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some(),
        "ccload died of the signal instead of ending its run: {:?}\nstderr: {stderr}",
        out.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(100),
        "the run was not cut short: {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains(" requests in ") && stdout.contains("\"requests\":"),
        "no report after SIGTERM:\nstdout: {stdout}\nstderr: {stderr}"
    );
}
