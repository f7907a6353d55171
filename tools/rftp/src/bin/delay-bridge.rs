//! `delay-bridge`: a user-space TCP relay that adds a fixed one-way delay
//! in each direction, for RTT experiments where the kernel has no netem.
//!
//! `delay-bridge --listen 127.0.0.1:7000=10.213.0.2:2121 --listen
//! 127.0.0.1:7001=10.213.0.2:2122 --delay-ms 1.8` relays every connection
//! on each listen address to its target; bytes read at time t are written
//! at t + delay, so the round trip grows by twice the delay. The relay
//! keeps up to `--max-inflight` bytes per direction queued, far above the
//! bandwidth-delay product of a loopback link at a few ms, so it delays
//! without limiting the window.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use clap::Parser;

/// TCP relay adding a fixed one-way delay in each direction.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// LISTEN=TARGET pairs, e.g. 127.0.0.1:7000=10.213.0.2:2121
    /// (repeatable).
    #[arg(short, long, required = true, value_name = "LISTEN=TARGET")]
    listen: Vec<String>,
    /// One-way delay added in each direction, milliseconds (RTT grows by
    /// twice this).
    #[arg(short, long, default_value_t = 1.8)]
    delay_ms: f64,
    /// Bytes queued per direction at most before the reader waits.
    #[arg(long, default_value_t = 64 << 20)]
    max_inflight: usize,
    /// Seconds to wait when connecting to a target.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
}

const CHUNK: usize = 64 << 10;

/// Read from `src`, stamp each chunk with its arrival time, queue it.
fn reader(mut src: TcpStream, tx: SyncSender<(Instant, Vec<u8>)>) {
    loop {
        let mut buf = vec![0u8; CHUNK];
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                buf.truncate(n);
                if tx.send((Instant::now(), buf)).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::debug!(%e, "relay read ended");
                break;
            }
        }
    }
    // Dropping tx tells the writer: end of stream.
}

/// Write each queued chunk once its delay has passed; at the end, pass
/// the half-close on.
fn writer(mut dst: TcpStream, rx: Receiver<(Instant, Vec<u8>)>, delay: Duration) {
    for (t, buf) in rx {
        if let Some(wait) = (t + delay).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if let Err(e) = dst.write_all(&buf) {
            tracing::debug!(%e, "relay write ended");
            let _ = dst.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = dst.shutdown(Shutdown::Write);
}

fn relay(client: TcpStream, target: SocketAddr, a: &Args) -> io::Result<()> {
    let server = TcpStream::connect_timeout(&target, Duration::from_secs(a.connect_timeout))?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let delay = Duration::from_secs_f64(a.delay_ms.max(0.0) / 1e3);
    let depth = (a.max_inflight / CHUNK).max(1);
    for (src, dst) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        let (tx, rx) = sync_channel(depth);
        std::thread::spawn(move || reader(src, tx));
        std::thread::spawn(move || writer(dst, rx, delay));
    }
    Ok(())
}

fn parse_pair(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (l, t) = s.split_once('=').ok_or_else(|| {
        format!("{s}: expected LISTEN=TARGET, e.g. 127.0.0.1:7000=127.0.0.1:2121")
    })?;
    let l = l
        .parse()
        .map_err(|e| format!("{l}: not an IP:PORT listen address: {e}"))?;
    let t = t
        .parse()
        .map_err(|e| format!("{t}: not an IP:PORT target: {e}"))?;
    Ok((l, t))
}

fn main() -> ExitCode {
    rftp::init_logging("info");
    let a = Args::parse();
    if !(0.0..=10_000.0).contains(&a.delay_ms) {
        eprintln!("delay-bridge: --delay-ms must be between 0 and 10000");
        return ExitCode::from(2);
    }
    let mut listeners = Vec::new();
    for s in &a.listen {
        let (l, t) = match parse_pair(s) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("delay-bridge: {e}");
                return ExitCode::from(2);
            }
        };
        match TcpListener::bind(l) {
            Ok(sock) => {
                let local = sock.local_addr().unwrap_or(l);
                println!("delay-bridge {local} -> {t} delay {} ms", a.delay_ms);
                listeners.push((sock, t));
            }
            Err(e) => {
                eprintln!("delay-bridge: cannot listen on {l}: {e}; pick a free port");
                return ExitCode::from(1);
            }
        }
    }
    let _ = io::stdout().flush();
    let a = std::sync::Arc::new(a);
    let mut handles = Vec::new();
    for (sock, target) in listeners {
        let a = a.clone();
        handles.push(std::thread::spawn(move || {
            for conn in sock.incoming() {
                match conn {
                    Ok(c) => {
                        let peer = c.peer_addr().ok();
                        if let Err(e) = relay(c, target, &a) {
                            tracing::warn!(?peer, %target, %e, "cannot reach the target");
                        }
                    }
                    Err(e) => tracing::warn!(%e, "accept failed"),
                }
            }
        }));
    }
    for h in handles {
        let _ = h.join();
    }
    ExitCode::SUCCESS
}
