//! An async echo over sockets over iWARP (the `iwarp-sockets` crate's
//! tokio wrapper, feature `tokio`), both ends in one process on one tokio
//! runtime: a server that echoes every stream it accepts, and several
//! clients at once that each write a buffer in odd-sized pieces while
//! reading the echo back, then compare hashes.
//!
//! ```sh
//! cargo run --release -p iwarp-tokio --example sockets_echo
//! cargo run --release -p iwarp-tokio --example sockets_echo -- --connections 8 --size 16M
//! cargo run --release -p iwarp-tokio --example sockets_echo -- --help
//! ```
//!
//! A stream ([`AsyncStream`]) is `AsyncRead + AsyncWrite`: ordinary tokio
//! code (`read`, `write_all`, `tokio::io::split`, `copy`) runs over it.
//! Under it, the sockets crate keeps a readiness descriptor per stream
//! (readable when a read would not block, writable when a write would
//! not) that tokio's reactor watches, and moves the bytes by RDMA Write
//! into the peer's ring (the rsockets protocol). Connection setup (TCP
//! connect and the MPA exchange) runs on tokio's blocking pool, and so
//! does the close (`rclose` lingers until queued data has left, see
//! `close` below).
//!
//! Exits 0 when every echo matches, 1 on a mismatch or an error, 2 when
//! `--timeout` passes first.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use iwarp_sockets::tokio_io::{AsyncListener, AsyncStream};
use iwarp_sockets::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Echo buffers over sockets over iWARP on one tokio runtime, both ends in
/// this process, and check them by hash.
#[derive(Parser, Debug, Clone)]
#[command(name = "sockets_echo")]
pub struct Opts {
    /// Concurrent connections.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub connections: usize,
    /// Bytes each client writes and reads back (suffix K or M).
    #[arg(short, long, default_value = "8M", value_parser = parse_size)]
    pub size: usize,
    /// Bytes per write (odd sizes exercise the ring's wrap; suffix K or M).
    #[arg(long, default_value = "7001", value_parser = parse_size)]
    pub chunk: usize,
    /// Address to listen on and connect to (the port is chosen by the
    /// system).
    #[arg(short, long, default_value = "127.0.0.1")]
    pub addr: IpAddr,
    /// Give up after this many seconds (exit status 2).
    #[arg(short, long, default_value_t = 60)]
    pub timeout: u64,
}

/// `123`, `64K`, `8M` (KiB, MiB).
fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|e| format!("{s:?} is not a size (a number, optionally with K or M): {e}"))?;
    n.checked_mul(mult)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?}: the size must be above 0 and fit in memory"))
}

/// FNV-1a, 64 bits.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Client `i`'s bytes.
fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(13) ^ (j >> 11) ^ i.wrapping_mul(57)) as u8)
        .collect()
}

/// One client's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echoed {
    pub bytes: usize,
    pub sent_hash: u64,
    pub got_hash: u64,
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct Report {
    pub echoes: Vec<Echoed>,
    pub elapsed: Duration,
}

impl Report {
    /// Every client read back what it wrote.
    pub fn ok(&self) -> bool {
        self.echoes
            .iter()
            .all(|e| e.sent_hash == e.got_hash && e.bytes > 0)
    }
}

/// Echo one stream until the peer shuts its side down, then shut ours.
async fn echo(mut s: AsyncStream) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut n_total = 0u64;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n]).await?;
        n_total += n as u64;
    }
    s.shutdown().await?;
    close(s).await;
    Ok(n_total)
}

/// Drop a stream on the blocking pool: its close (`rclose`) lingers,
/// bounded by `Options::linger`, until queued data has left, which needs
/// the peer to read it: on the event loop's thread that could be the
/// peer's own reader waiting behind it.
async fn close(s: AsyncStream) {
    let _ = tokio::task::spawn_blocking(move || drop(s)).await;
}

/// Client `i`: write the buffer while reading the echo back.
async fn client(i: usize, to: SocketAddr, o: &Opts) -> Result<Echoed, String> {
    let mut s = AsyncStream::connect(to, Options::default())
        .await
        .map_err(|e| format!("connecting to {to}: {e}"))?;
    let data = pattern(i, o.size);
    let (mut r, mut w) = tokio::io::split(&mut s);
    let writer = async {
        for piece in data.chunks(o.chunk) {
            w.write_all(piece).await?;
        }
        w.shutdown().await
    };
    let reader = async {
        let mut got = Vec::with_capacity(data.len());
        r.read_to_end(&mut got).await?;
        Ok::<_, std::io::Error>(got)
    };
    let (wr, got) = tokio::join!(writer, reader);
    close(s).await;
    wr.map_err(|e| format!("writing: {e}"))?;
    let got = got.map_err(|e| format!("reading the echo: {e}"))?;
    if got.len() != data.len() {
        tracing::error!(
            sent = data.len(),
            got = got.len(),
            "the echo's length differs"
        );
    }
    Ok(Echoed {
        bytes: got.len(),
        sent_hash: fnv1a(&data),
        got_hash: fnv1a(&got),
    })
}

/// Run the server and every client on the current runtime.
pub async fn run(o: &Opts) -> Result<Report, String> {
    if o.connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    let l = AsyncListener::bind(SocketAddr::new(o.addr, 0), &Options::default())
        .map_err(|e| format!("listening on {}: {e}", o.addr))?;
    let to = l.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%to, connections = o.connections, size = o.size, "echoing");
    let started = Instant::now();
    let n = o.connections;
    // The server: one task accepting, one task per stream echoing.
    let server = tokio::spawn(async move {
        let mut echoes = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (s, peer) = l.accept().await?;
            tracing::debug!(%peer, "accepted");
            echoes.spawn(echo(s));
        }
        let mut total = 0u64;
        while let Some(r) = echoes.join_next().await {
            total += r.map_err(std::io::Error::other)??;
        }
        Ok::<_, std::io::Error>(total)
    });
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..n {
        let o = o.clone();
        clients.spawn(async move { (i, client(i, to, &o).await) });
    }
    let mut echoes = vec![None; n];
    while let Some(r) = clients.join_next().await {
        let (i, e) = r.map_err(|e| format!("a client task: {e}"))?;
        echoes[i] = Some(e.map_err(|e| format!("client {i}: {e}"))?);
    }
    let echoed = server
        .await
        .map_err(|e| format!("the server task: {e}"))?
        .map_err(|e| format!("the server: {e}"))?;
    let echoes: Vec<Echoed> = echoes
        .into_iter()
        .map(|e| e.expect("every client joined"))
        .collect();
    let wrote: usize = echoes.iter().map(|e| e.bytes).sum();
    if echoed != (n * o.size) as u64 {
        tracing::error!(
            echoed,
            expected = n * o.size,
            read_back = wrote,
            "the server echoed another amount"
        );
    }
    Ok(Report {
        echoes,
        elapsed: started.elapsed(),
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let o = Opts::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sockets_echo: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let t = Duration::from_secs(o.timeout);
    match rt.block_on(async { tokio::time::timeout(t, run(&o)).await }) {
        Err(_) => {
            eprintln!("sockets_echo: not done within --timeout {} s", o.timeout);
            ExitCode::from(2)
        }
        Ok(Err(e)) => {
            eprintln!("sockets_echo: {e}");
            ExitCode::FAILURE
        }
        Ok(Ok(r)) => {
            let bytes: usize = r.echoes.iter().map(|e| e.bytes).sum();
            let secs = r.elapsed.as_secs_f64();
            println!(
                "sockets_echo: {} connections, {} bytes echoed in {:.3} s ({:.1} MiB/s each way), {}",
                r.echoes.len(),
                bytes,
                secs,
                bytes as f64 / secs.max(1e-9) / (1 << 20) as f64,
                if r.ok() { "every echo matches" } else { "an echo DIFFERS" }
            );
            if r.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
