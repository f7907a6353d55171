//! iwarp-riostream: librdmacm's `riostream` (the `riomap`/`riowrite`
//! benchmark of rdma-core's `librdmacm/examples/riostream.c`) over
//! `iwarp-sockets`, so either end can be the real `riostream` on a host
//! with kernel siw or an iWARP RNIC; and `--compare`, a loopback
//! measurement of `riowrite` (zero copy) against `send` (copy) by size.
//!
//! riostream's exchange, which this tool follows on the wire:
//!
//! 1. Both ends set `RDMA_IOMAPSIZE` 1 and `SO_SNDBUF`/`SO_RCVBUF` (`-B`,
//!    default 512 KiB; rsocket.c makes its rings twice that), connect, set
//!    the last byte of the buffer (the poll byte) to 0xff and `riomap` the
//!    buffer (`-S` bytes) at offset 0.
//! 2. `sync_test`: the client sends 16 bytes, the server answers 16 (the
//!    iomap entries travel before them).
//! 3. Each iteration (`-I`): the client `riowrite`s the buffer to offset 0
//!    `-C` times; before the last write it sets the poll byte to the next
//!    marker (and with `-T v` fills the other bytes with common.c's
//!    `format_buf` sequence). It then spins until its own poll byte shows
//!    the next marker, which the server's last write brings; the server
//!    does the same the other way round. No message announces a write: the
//!    poll byte, written last, is the signal.
//!
//! Only riostream's custom test (`-S`, `-C`, `-I`) is implemented, not its
//! size sweep. Our side uses a separate source buffer for its writes (the
//! receive mapping is the library's [`iwarp_sockets::IoMap`]); the bytes on
//! the wire are the same.
#![deny(unsafe_code)]

#[allow(dead_code)]
#[path = "report.rs"]
mod report;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use clap::{ArgAction, Parser};
use iwarp_sockets::{IoMap, Listener, Options, Stream};

use report::Sample;

/// riostream-compatible riomap/riowrite benchmark over software iWARP
/// (rsockets wire protocol), and a riowrite-versus-send comparison.
///
/// Without -s it is the server: it listens (on -b, port -p) and serves one
/// client. With -s it is the client. Either end may be rdma-core's
/// `riostream` with the same -S/-C/-I/-B options. Both ends print
/// riostream's row: name bytes xfers iters total time Gb/sec usec/xfer.
#[derive(Debug, Parser)]
#[command(
    name = "iwarp-riostream",
    disable_version_flag = true,
    after_help = "Test options (-T, may repeat): b|blocking, n|nonblocking (riostream's default: \
MSG_DONTWAIT in a loop), a|async (taken as nonblocking), v|verify (check the bytes of the last \
transfer of every iteration).\n\n\
Examples:\n  iwarp-riostream -b 10.77.0.1 -S 65536 -C 100 -I 5 -T v        # server\n  \
riostream -s 10.77.0.1 -S 65536 -C 100 -I 5 -T v              # a real riostream client\n  \
iwarp-riostream --compare                                    # riowrite vs send, loopback\n\n\
Logging: RUST_LOG=debug writes protocol events to stderr."
)]
struct Args {
    /// Server address: run as the client and connect to it.
    #[arg(short = 's', value_name = "server_address")]
    server: Option<String>,
    /// Bind address (the server listens on it; default any).
    #[arg(short = 'b', value_name = "bind_address")]
    bind: Option<String>,
    /// SO_SNDBUF / SO_RCVBUF in bytes (default 512 KiB, as riostream).
    #[arg(short = 'B', value_name = "buffer_size")]
    buffer_size: Option<u32>,
    /// Inline size (accepted for compatibility).
    #[arg(short = 'i', value_name = "inline_size")]
    inline_size: Option<u32>,
    /// Iterations.
    #[arg(short = 'I', value_name = "iterations")]
    iterations: Option<u32>,
    /// Transfers per direction and iteration.
    #[arg(short = 'C', value_name = "transfer_count")]
    count: Option<u32>,
    /// Transfer size in bytes (the mapped buffer).
    #[arg(short = 'S', value_name = "transfer_size")]
    size: Option<usize>,
    /// Port.
    #[arg(short = 'p', value_name = "port_number", default_value_t = 7471)]
    port: u16,
    /// Test option; see below.
    #[arg(short = 'T', value_name = "test_option", action = ArgAction::Append)]
    test: Vec<String>,
    /// Bound in seconds on connecting and on any wait without progress.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    timeout: f64,
    /// Instead of riostream's test: on loopback, riowrite (zero copy)
    /// against send (copy), and send with zero copy forced, at each size,
    /// in one run; prints Gbit/s and the ratios (medians of --repeat
    /// pairs).
    #[arg(long)]
    compare: bool,
    /// Sizes for --compare, in bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "65536,262144,1048576,4194304"
    )]
    sizes: Vec<usize>,
    /// Bytes moved per measurement in --compare.
    #[arg(long, default_value_t = 256 << 20)]
    bytes: u64,
    /// Measurement pairs per size in --compare.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

/// What went wrong, for the exit message.
#[derive(Debug)]
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure(e.to_string())
    }
}

type Result<T> = std::result::Result<T, Failure>;

/// `format_buf` / `verify_buf` of common.c: a running byte counter.
#[derive(Debug, Default)]
struct Pattern {
    next: u8,
    total: u64,
}

impl Pattern {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next;
            self.next = self.next.wrapping_add(1);
        }
    }

    fn check(&mut self, buf: &[u8]) -> std::result::Result<(), u64> {
        for &b in buf {
            if b != self.next {
                return Err(self.total);
            }
            self.next = self.next.wrapping_add(1);
            self.total += 1;
        }
        Ok(())
    }
}

struct Test {
    size: usize,
    count: u32,
    iterations: u32,
    verify: bool,
    blocking: bool,
    timeout: Duration,
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| Failure(format!("{host}: no address")))
}

fn options(buffer: u32) -> Options {
    // rsocket.c makes its rings twice SO_SNDBUF / SO_RCVBUF.
    let ring = buffer.saturating_mul(2).clamp(8192, 1 << 30) & !1;
    Options {
        sbuf_size: ring,
        rbuf_size: ring,
        iomap_size: 1,
        ..Options::default()
    }
}

/// `send_msg` / `recv_msg`: 16 stream bytes each way.
fn sync(s: &Stream, client: bool) -> Result<()> {
    let mut b = [0u8; 16];
    if client {
        (&*s).write_all(&b)?;
        (&*s).read_exact(&mut b)?;
    } else {
        (&*s).read_exact(&mut b)?;
        (&*s).write_all(&b)?;
    }
    Ok(())
}

/// `send_xfer`: the whole buffer to offset 0, in a loop on `EAGAIN` when
/// non-blocking.
fn send_xfer(s: &Stream, src: &[u8], t: &Test) -> Result<()> {
    let start = Instant::now();
    let mut done = 0;
    while done < src.len() {
        let r = if t.blocking {
            s.riowrite(&src[done..], done as u64)
        } else {
            s.riowrite_nonblocking(&src[done..], done as u64)
        };
        match r {
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > t.timeout {
                    return Err(Failure(format!(
                        "riowrite made no progress in {:?}",
                        t.timeout
                    )));
                }
                thread::yield_now();
            }
            Err(e) => return Err(Failure(format!("riowrite: {e}"))),
        }
    }
    Ok(())
}

/// `recv_xfer`: spins until the poll byte shows `marker`, then checks the
/// other bytes with `-T v`.
fn recv_xfer(map: &IoMap, marker: u8, t: &Test, check: &mut Pattern) -> Result<()> {
    let start = Instant::now();
    let mut b = [0u8; 1];
    loop {
        map.read_at(t.size - 1, &mut b);
        if b[0] == marker {
            break;
        }
        if start.elapsed() > t.timeout {
            return Err(Failure(format!(
                "the peer's write with marker {marker} did not arrive in {:?} (poll byte {})",
                t.timeout, b[0]
            )));
        }
        std::hint::spin_loop();
        thread::yield_now();
    }
    if t.verify {
        let mut got = vec![0u8; t.size - 1];
        map.read_at(0, &mut got);
        check
            .check(&got)
            .map_err(|at| Failure(format!("data verification failed byte {at}")))?;
    }
    Ok(())
}

/// riostream's `run_test` on a connected stream.
fn run_test(s: &Stream, client: bool, t: &Test) -> Result<Sample> {
    let mut src = vec![0u8; t.size];
    src[t.size - 1] = 0xff;
    let map = s.riomap(t.size, Some(0))?;
    map.write_at(t.size - 1, &[0xff]);
    sync(s, client)?;
    let (mut fmt, mut chk) = (Pattern::default(), Pattern::default());
    let mut marker: u8 = 0;
    let start = Instant::now();
    let send_all = |src: &mut Vec<u8>, marker: &mut u8, fmt: &mut Pattern| -> Result<()> {
        for _ in 0..t.count.saturating_sub(1) {
            send_xfer(s, src, t)?;
        }
        src[t.size - 1] = *marker;
        *marker = marker.wrapping_add(1);
        if t.verify {
            fmt.fill(&mut src[..t.size - 1]);
        }
        send_xfer(s, src, t)
    };
    for _ in 0..t.iterations {
        if client {
            send_all(&mut src, &mut marker, &mut fmt)?;
            recv_xfer(&map, marker, t, &mut chk)?;
            marker = marker.wrapping_add(1);
        } else {
            recv_xfer(&map, marker, t, &mut chk)?;
            marker = marker.wrapping_add(1);
            send_all(&mut src, &mut marker, &mut fmt)?;
        }
    }
    let elapsed = start.elapsed();
    map.unmap()?;
    Ok(Sample {
        name: "custom".into(),
        size: t.size,
        count: t.count,
        iterations: t.iterations,
        elapsed,
        msgs: None,
    })
}

fn riostream(a: &Args) -> Result<()> {
    if a.size.is_none() && a.count.is_none() && a.iterations.is_none() {
        return Err(Failure(
            "riostream's size sweep is not implemented: give -S, -C and/or -I (its custom test)"
                .into(),
        ));
    }
    let mut t = Test {
        size: a.size.unwrap_or(1000),
        count: a.count.unwrap_or(1000),
        iterations: a.iterations.unwrap_or(1),
        verify: false,
        blocking: false,
        timeout: Duration::from_secs_f64(a.timeout),
    };
    if t.size < 1 || t.count < 1 {
        return Err(Failure("-S and -C must be at least 1".into()));
    }
    for o in &a.test {
        match o.as_str() {
            "b" | "block" | "blocking" => t.blocking = true,
            "n" | "nonblock" | "nonblocking" | "a" | "async" => t.blocking = false,
            "v" | "verify" => t.verify = true,
            other => return Err(Failure(format!("unknown test option -T {other}"))),
        }
    }
    let opts = options(a.buffer_size.unwrap_or(1 << 19));
    let s = match &a.server {
        Some(host) => Stream::connect_with(resolve(host, a.port)?, &opts)?,
        None => {
            let bind = resolve(a.bind.as_deref().unwrap_or("0.0.0.0"), a.port)?;
            let l = Listener::bind_with(bind, &opts)?;
            eprintln!("iwarp-riostream: listening on {}", l.local_addr()?);
            l.accept()?.0
        }
    };
    s.set_read_timeout(Some(t.timeout))?;
    s.set_write_timeout(Some(t.timeout))?;
    println!("{}", report::header());
    let sample = run_test(&s, a.server.is_some(), &t)?;
    println!("{}", sample.row());
    let _ = s.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// One measurement of `--compare`: `n` transfers of `src` by `how`.
#[derive(Clone, Copy, PartialEq)]
enum How {
    Riowrite,
    Send,
}

fn compare_one(c: &Stream, how: How, src: &[u8], n: u64) -> Result<Duration> {
    let start = Instant::now();
    match how {
        How::Riowrite => {
            for _ in 0..n {
                c.riowrite(src, 0)?;
            }
            (&*c).write_all(b"R")?;
        }
        How::Send => {
            let mut cmd = [b'S'; 9];
            cmd[1..].copy_from_slice(&n.to_le_bytes());
            (&*c).write_all(&cmd)?;
            for _ in 0..n {
                (&*c).write_all(src)?;
            }
        }
    }
    let mut ack = [0u8; 1];
    (&*c).read_exact(&mut ack)?;
    Ok(start.elapsed())
}

/// The server of `--compare`: maps `size` bytes; "R": the writes are
/// done, answer; "S" and a count `n` (8 bytes): read `n * size` bytes,
/// answer; "Q": check the mapping against `expect` and quit.
fn compare_server(s: Stream, size: usize, expect: Vec<u8>, check_map: bool) -> Result<()> {
    let map = s.riomap(size, Some(0))?;
    (&s).write_all(b"m")?;
    let mut buf = vec![0u8; size];
    loop {
        let mut op = [0u8; 1];
        (&s).read_exact(&mut op)?;
        match &op {
            b"R" => (&s).write_all(b"r")?,
            b"S" => {
                let mut n = [0u8; 8];
                (&s).read_exact(&mut n)?;
                let mut left = u64::from_le_bytes(n) * size as u64;
                while left > 0 {
                    let k = (left as usize).min(size);
                    (&s).read_exact(&mut buf[..k])?;
                    left -= k as u64;
                }
                if buf[..size] != expect[..] {
                    return Err(Failure("send: the last transfer differs".into()));
                }
                (&s).write_all(b"s")?;
            }
            b"Q" => {
                if check_map && map.to_vec() != expect {
                    return Err(Failure("riowrite: the mapping differs".into()));
                }
                (&s).write_all(b"q")?;
                // The client closes first (nothing of ours is in flight
                // when the stream goes).
                let mut rest = Vec::new();
                let _ = (&s).read_to_end(&mut rest);
                return Ok(());
            }
            other => return Err(Failure(format!("unexpected op {other:?}"))),
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

type Server = thread::JoinHandle<Result<()>>;

fn pair(opts: &Options, size: usize, expect: Vec<u8>, check_map: bool) -> Result<(Stream, Server)> {
    let l = Listener::bind_with("127.0.0.1:0".parse()?, opts)?;
    let addr = l.local_addr()?;
    let h = thread::spawn(move || -> Result<()> {
        let (s, _) = l.accept()?;
        let r = compare_server(s, size, expect, check_map);
        if let Err(Failure(e)) = &r {
            eprintln!("iwarp-riostream: compare server: {e}");
        }
        r
    });
    let c = Stream::connect_with(addr, opts)?;
    c.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut m = [0u8; 1];
    (&c).read_exact(&mut m)?;
    Ok((c, h))
}

fn compare(a: &Args) -> Result<()> {
    println!(
        "{:>9} {:>6} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "size", "xfers", "send Gb/s", "riowrite", "send zcopy", "riowrite/send", "zcopy/send"
    );
    for &size in &a.sizes {
        let n = (a.bytes / size as u64).max(4);
        let src: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
        let copy = options(1 << 19);
        let mut zc = copy.clone();
        zc.zcopy_threshold = Some(1);
        let (c, h) = pair(&copy, size, src.clone(), true)?;
        let (z, hz) = pair(&zc, size, src.clone(), false)?;
        wait_for_map(&c)?;
        let gbps = |d: Duration| (n * size as u64 * 8) as f64 / d.as_secs_f64() / 1e9;
        let (mut send, mut rio, mut zsend) = (Vec::new(), Vec::new(), Vec::new());
        let (mut r_rio, mut r_z) = (Vec::new(), Vec::new());
        // Warm-up, then pairs in alternating order.
        compare_one(&c, How::Send, &src, n.min(8))?;
        compare_one(&c, How::Riowrite, &src, n.min(8))?;
        compare_one(&z, How::Send, &src, n.min(8))?;
        for i in 0..a.repeat {
            let (s, r, zs) = if i % 2 == 0 {
                let s = compare_one(&c, How::Send, &src, n)?;
                let r = compare_one(&c, How::Riowrite, &src, n)?;
                (s, r, compare_one(&z, How::Send, &src, n)?)
            } else {
                let zs = compare_one(&z, How::Send, &src, n)?;
                let r = compare_one(&c, How::Riowrite, &src, n)?;
                (compare_one(&c, How::Send, &src, n)?, r, zs)
            };
            send.push(gbps(s));
            rio.push(gbps(r));
            zsend.push(gbps(zs));
            r_rio.push(gbps(r) / gbps(s));
            r_z.push(gbps(zs) / gbps(s));
        }
        for (s, h) in [(c, h), (z, hz)] {
            (&s).write_all(b"Q")?;
            let mut q = [0u8; 1];
            (&s).read_exact(&mut q)?;
            drop(s);
            h.join()
                .map_err(|_| Failure("server thread panicked".into()))??;
        }
        println!(
            "{:>9} {:>6} {:>12.2} {:>12.2} {:>12.2} {:>14.2} {:>14.2}",
            size,
            n,
            median(send),
            median(rio),
            median(zsend),
            median(r_rio),
            median(r_z)
        );
    }
    Ok(())
}

fn wait_for_map(c: &Stream) -> Result<()> {
    let start = Instant::now();
    while c.peer_iomaps().is_empty() {
        if start.elapsed() > Duration::from_secs(20) {
            return Err(Failure("the server's mapping did not arrive".into()));
        }
        thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let r = if a.compare {
        compare(&a)
    } else {
        riostream(&a)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(e)) => {
            eprintln!("iwarp-riostream: {e}");
            ExitCode::FAILURE
        }
    }
}
