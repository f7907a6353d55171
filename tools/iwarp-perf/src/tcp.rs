//! The raw-TCP baseline: the same test patterns over plain sockets with the
//! socket setup the iWARP driver uses (`TCP_NODELAY`; send and receive
//! buffers left to Linux autotuning, as `iwarp::driver::tune_socket` does).
//!
//! - **write_bw / send_bw**: per connection a writer thread streams
//!   blocking `write_all`s of the message size; the reader consumes with
//!   large (256 KiB or message-sized) reads. The writer shuts down its write
//!   side after the last message; the reader answers with a 16-byte ACK
//!   (messages, checksum sum), and the writer stops its clock at the ACK, as
//!   the iWARP client does.
//! - **read_bw**: the client keeps `depth` 8-byte requests outstanding; the
//!   server answers each with one message.
//! - **write_lat / send_lat**: ping-pong of the message size with blocking
//!   `write_all` / `read_exact`; half the round trip is reported. With
//!   `--busy-poll` both ends instead spin on a non-blocking socket, as the
//!   iWARP side spins on its CQ or buffer, so neither side ever sleeps.
//! - **read_lat**: an 8-byte request answered by one message; the full
//!   round trip is reported (as for iWARP Reads).
//!
//! Each connection starts with the client's 80-byte parameter block
//! ([`crate::params::encode_request`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use crate::params::{self, Params, Remote, Request, Test};
use crate::pattern::{self, Verifier};
use crate::rdma::{warmup, LatClock};
use crate::report::{ClientResult, LatStats};

/// Read size of the bandwidth reader (at least the message size, unless
/// [`ENV_READ`] sets it).
const READ_CHUNK: usize = 256 * 1024;
/// Environment variable: the bandwidth reader's bytes per call, to
/// compare TCP at the receive-call count of the software provider.
const ENV_READ: &str = "IWARP_PERF_TCP_READ";

/// The bandwidth reader's buffer size for `size`-byte messages.
pub(crate) fn read_chunk(size: usize) -> Result<usize, String> {
    match std::env::var(ENV_READ) {
        Err(_) => Ok(READ_CHUNK.max(size)),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=64 << 20).contains(&n) => Ok(n),
            _ => Err(format!(
                "{ENV_READ}={v:?}: give the TCP reader's bytes per call, 1 to 67108864 (or unset it for the default, 256 KiB)"
            )),
        },
    }
}

fn io_err(what: &str, e: io::Error) -> String {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        format!("TCP: timed out {what} (raise --timeout for slow links)")
    } else {
        format!("TCP: {what}: {e}")
    }
}

fn setup(s: &TcpStream, p: &Params) -> Result<(), String> {
    s.set_nodelay(true)
        .map_err(|e| io_err("setting TCP_NODELAY", e))?;
    s.set_read_timeout(Some(p.timeout))
        .and_then(|_| s.set_write_timeout(Some(p.timeout)))
        .map_err(|e| io_err("setting socket timeouts", e))
}

/// Connect `p.qps` connections and send the parameter block on each.
fn connect(addr: SocketAddr, p: &Params, last: bool) -> Result<Vec<TcpStream>, String> {
    (0..p.qps)
        .map(|idx| {
            let mut s = TcpStream::connect_timeout(&addr, p.timeout)
                .map_err(|e| io_err(&format!("connecting to {addr}"), e))?;
            setup(&s, p)?;
            let req = Request {
                params: *p,
                qp_index: idx,
                last,
                remote: Remote::default(),
            };
            s.write_all(&params::encode_request(&req))
                .map_err(|e| io_err("sending the parameters", e))?;
            Ok(s)
        })
        .collect()
}

/// Accept one client's run (its `qps` connections) on `listener` and serve
/// it. Returns the client's request (for its `last` flag).
pub fn serve(listener: &TcpListener, wait: Duration) -> Result<Request, String> {
    let deadline = Instant::now() + wait;
    let accept = |what: &str| -> Result<(TcpStream, Request), String> {
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("listening", e))?;
        let mut s = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(format!("TCP: no client connected {what} within {wait:?}"));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(io_err("accepting", e)),
            }
        };
        s.set_nonblocking(false)
            .map_err(|e| io_err("accepting", e))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| io_err("accepting", e))?;
        let mut b = [0u8; params::REQUEST_LEN];
        s.read_exact(&mut b)
            .map_err(|e| io_err("reading the parameters", e))?;
        let req = params::decode_request(&b)?;
        setup(&s, &req.params)?;
        Ok((s, req))
    };
    let (s0, req0) = accept("")?;
    let mut socks = vec![(s0, req0.qp_index)];
    for _ in 1..req0.params.qps {
        let (s, r) = accept("for the next connection")?;
        if r.params != req0.params {
            return Err("TCP: connections of one run disagree on the parameters".into());
        }
        socks.push((s, r.qp_index));
    }
    let p = req0.params;
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = socks
            .into_iter()
            .map(|(s, idx)| sc.spawn(move || serve_conn(s, &p, idx)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("TCP server thread panicked".into()))
            })
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(req0)
}

fn serve_conn(mut s: TcpStream, p: &Params, idx: u32) -> Result<(), String> {
    let size = p.size;
    let mut v = Verifier::new(p.corrupt);
    match p.test {
        Test::WriteBw | Test::SendBw => {
            let mut buf = vec![0u8; if p.integrity { size } else { read_chunk(size)? }];
            let mut bytes = 0u64;
            if p.integrity {
                let mut i = 0u64;
                loop {
                    match read_full(&mut s, &mut buf) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => return Err(io_err("reading a message", e)),
                    }
                    v.check("TCP", i, &mut buf, pattern::seed(idx, 0, i), None)?;
                    i += 1;
                    bytes += size as u64;
                }
            } else {
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => bytes += n as u64,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(io_err("reading", e)),
                    }
                }
            }
            if bytes.checked_rem(size as u64) != Some(0) {
                return Err(format!(
                    "TCP: received {bytes} bytes, not a multiple of {size}"
                ));
            }
            let mut ack = [0u8; 16];
            ack[0..8].copy_from_slice(&(bytes / size as u64).to_le_bytes());
            ack[8..16].copy_from_slice(&v.sum.to_le_bytes());
            s.write_all(&ack)
                .map_err(|e| io_err("sending the ACK", e))?;
        }
        Test::ReadBw | Test::ReadLat => {
            let mut out = vec![0u8; size];
            let mut req = [0u8; 8];
            if p.busy_poll && p.test == Test::ReadLat {
                s.set_nonblocking(true)
                    .map_err(|e| io_err("setting non-blocking mode", e))?;
            }
            loop {
                match read_full(&mut s, &mut req) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => return Err(io_err("reading a request", e)),
                }
                let i = u64::from_le_bytes(req);
                if p.integrity {
                    pattern::fill(&mut out, pattern::seed(idx, 1, i));
                }
                write_full(&mut s, &out).map_err(|e| io_err("sending a response", e))?;
            }
        }
        Test::WriteLat | Test::SendLat => {
            let mut buf = vec![0u8; size];
            let mut i = 0u64;
            if p.busy_poll {
                s.set_nonblocking(true)
                    .map_err(|e| io_err("setting non-blocking mode", e))?;
            }
            loop {
                match read_full(&mut s, &mut buf) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => return Err(io_err("reading a ping", e)),
                }
                if p.integrity {
                    v.check("TCP ping", i, &mut buf, pattern::seed(idx, 0, i), None)?;
                    pattern::fill(&mut buf, pattern::seed(idx, 1, i));
                }
                write_full(&mut s, &buf).map_err(|e| io_err("sending a pong", e))?;
                i += 1;
            }
        }
    }
    Ok(())
}

/// `read_exact`, but a clean EOF before the first byte is `Ok(false)`. On a
/// non-blocking socket (busy-poll mode) it spins until the bytes are there.
fn read_full(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// `write_all` that also works on a non-blocking socket (busy-poll mode),
/// spinning while the send buffer is full.
fn write_full(s: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => put += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Run the client side of the TCP baseline against `addr`.
///
/// Bandwidth runs over several connections use ONE clock: every
/// connection's thread waits at a barrier, the clock starts when all are
/// released, a `--duration` ends at the same instant for all, and the run
/// ends at the last connection's ACK. (Each thread once kept its own clock,
/// so with hundreds of connections time-sliced on two cores the slices'
/// durations overlapped and the aggregate was reported over one slice's
/// length: 52 Gbit/s on loopback with 2 cores.)
pub fn run_client(addr: SocketAddr, p: &Params, last: bool) -> Result<ClientResult, String> {
    let socks = connect(addr, p, last)?;
    // Everyone, the main thread included, meets twice: once so the main
    // thread can start the clock after every thread exists, once so the
    // threads read the start it set.
    let barrier = Arc::new(Barrier::new(socks.len() + 1));
    let start: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    // CPU from the common start to the last thread's end (its ACK).
    let mut span_cpu = 0.0;
    let results: Vec<Result<ClientResult, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = socks
            .into_iter()
            .enumerate()
            .map(|(idx, s)| {
                let (b, start) = (barrier.clone(), start.clone());
                sc.spawn(move || {
                    b.wait();
                    b.wait();
                    let t0 = start.get().copied().unwrap_or_else(Instant::now);
                    client_conn(s, p, idx as u32, t0)
                })
            })
            .collect();
        barrier.wait();
        let cpu0 = crate::report::cpu_seconds();
        let _ = start.set(Instant::now());
        barrier.wait();
        let rs = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("TCP client thread panicked".into()))
            })
            .collect();
        span_cpu = crate::report::cpu_seconds() - cpu0;
        rs
    });
    let mut total = ClientResult {
        msgs: 0,
        elapsed: Duration::ZERO,
        lat: None,
        verified: 0,
        span_cpu_s: p.test.is_bw().then_some(span_cpu),
    };
    for r in results {
        let r = r?;
        total.msgs += r.msgs;
        total.verified += r.verified;
        total.lat = total.lat.or(r.lat);
        // Bandwidth: each connection's elapsed runs from the common start
        // to its ACK, so the largest is the span of the whole run.
        total.elapsed = total.elapsed.max(r.elapsed);
    }
    Ok(total)
}

/// One connection of the client. `t0` is the run's common start: bandwidth
/// runs measure from it and end a `--duration` at `t0 + duration`.
fn client_conn(
    mut s: TcpStream,
    p: &Params,
    idx: u32,
    t0: Instant,
) -> Result<ClientResult, String> {
    let size = p.size;
    let mut v = Verifier::new(p.corrupt);
    let mut buf = vec![0u8; size];
    match p.test {
        Test::WriteBw | Test::SendBw => {
            let start = t0;
            let mut i = 0u64;
            let mut sent_sum = 0u64;
            loop {
                let more = match p.duration {
                    Some(d) => start.elapsed() < d,
                    None => i < p.iters,
                };
                if !more {
                    break;
                }
                if p.integrity {
                    pattern::fill(&mut buf, pattern::seed(idx, 0, i));
                    sent_sum = sent_sum.wrapping_add(u64::from(pattern::checksum(&buf)));
                }
                s.write_all(&buf).map_err(|e| io_err("writing", e))?;
                i += 1;
            }
            s.shutdown(std::net::Shutdown::Write)
                .map_err(|e| io_err("closing the write side", e))?;
            let mut ack = [0u8; 16];
            s.read_exact(&mut ack)
                .map_err(|e| io_err("waiting for the ACK", e))?;
            let elapsed = start.elapsed();
            let count = u64::from_le_bytes(ack[0..8].try_into().unwrap_or_default());
            let sum = u64::from_le_bytes(ack[8..16].try_into().unwrap_or_default());
            if count != i {
                return Err(format!(
                    "TCP: the server counted {count} messages, we sent {i}"
                ));
            }
            if p.integrity && sum != sent_sum {
                return Err(format!(
                    "INTEGRITY FAILURE: TCP: checksum sum at the receiver {sum:#x}, at the sender {sent_sum:#x}"
                ));
            }
            Ok(ClientResult {
                msgs: i,
                elapsed,
                lat: None,
                verified: if p.integrity { count } else { 0 },
                span_cpu_s: None,
            })
        }
        Test::ReadBw => {
            let start = t0;
            let depth = u64::from(p.depth);
            let (mut requested, mut got) = (0u64, 0u64);
            let more = |requested: u64| match p.duration {
                Some(d) => start.elapsed() < d,
                None => requested < p.iters,
            };
            // Requests are tiny: the first `depth` go out in one write.
            let mut reqs = Vec::with_capacity(depth as usize * 8);
            while requested < depth && more(requested) {
                reqs.extend_from_slice(&requested.to_le_bytes());
                requested += 1;
            }
            s.write_all(&reqs)
                .map_err(|e| io_err("sending requests", e))?;
            while got < requested {
                s.read_exact(&mut buf)
                    .map_err(|e| io_err("reading a response", e))?;
                if p.integrity {
                    v.check("TCP read", got, &mut buf, pattern::seed(idx, 1, got), None)?;
                }
                got += 1;
                if more(requested) {
                    s.write_all(&requested.to_le_bytes())
                        .map_err(|e| io_err("sending a request", e))?;
                    requested += 1;
                }
            }
            let elapsed = start.elapsed();
            let _ = s.shutdown(std::net::Shutdown::Write);
            Ok(ClientResult {
                msgs: got,
                elapsed,
                lat: None,
                verified: v.checked,
                span_cpu_s: None,
            })
        }
        Test::WriteLat | Test::SendLat | Test::ReadLat => {
            let warm = warmup(p);
            let read = p.test == Test::ReadLat;
            let mut rx = vec![0u8; size];
            let mut samples = Vec::new();
            let mut clock = LatClock::new(p);
            let mut i = 0u64;
            // The server spins too: it sees the busy-poll flag.
            if p.busy_poll {
                s.set_nonblocking(true)
                    .map_err(|e| io_err("setting non-blocking mode", e))?;
            }
            while clock.keep_going(i) {
                if p.integrity && !read {
                    pattern::fill(&mut buf, pattern::seed(idx, 0, i));
                }
                let t0 = Instant::now();
                if read {
                    write_full(&mut s, &i.to_le_bytes())
                } else {
                    write_full(&mut s, &buf)
                }
                .map_err(|e| io_err("sending a ping", e))?;
                match read_full(&mut s, &mut rx) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(io_err(
                            "waiting for the pong",
                            io::ErrorKind::UnexpectedEof.into(),
                        ))
                    }
                    Err(e) => return Err(io_err("waiting for the pong", e)),
                }
                let rtt = t0.elapsed().as_secs_f64() * 1e6;
                if i >= warm {
                    samples.push(if read { rtt } else { rtt / 2.0 });
                }
                if p.integrity {
                    v.check("TCP pong", i, &mut rx, pattern::seed(idx, 1, i), None)?;
                }
                i += 1;
            }
            let elapsed = clock.elapsed();
            let _ = s.shutdown(std::net::Shutdown::Write);
            let n = samples.len() as u64;
            Ok(ClientResult {
                msgs: n,
                elapsed,
                lat: LatStats::from_samples(&mut samples),
                verified: v.checked,
                span_cpu_s: None,
            })
        }
    }
}
