//! An async RFTP-style copy over verbs, both ends in one process on one
//! tokio runtime (issue 28: one reactor): several connections at once,
//! each moving a buffer from a client to a server by RDMA Write, with
//! every wait a future on tokio's reactor.
//!
//! ```sh
//! cargo run --release -p iwarp-tokio --example verbs_copy
//! cargo run --release -p iwarp-tokio --example verbs_copy -- --connections 8 --size 16M
//! cargo run --release -p iwarp-tokio --example verbs_copy -- --help
//! ```
//!
//! Per connection (the protocol is this example's own):
//!
//! 1. The client posts a receive for the grant, then connects
//!    ([`iwarp_tokio::connect`]); the server takes the request from its
//!    [`AsyncListener`], posts a receive for DONE, accepts
//!    ([`iwarp_tokio::accept`]) and sends the grant: its sink region's
//!    address, STag and length (16 bytes, little-endian).
//! 2. The client RDMA-Writes its buffer into the sink in `--chunk` pieces,
//!    at most `--depth` outstanding, awaiting each completion on its
//!    [`AsyncCq`].
//! 3. The client sends DONE (the length and the FNV-1a hash of what it
//!    wrote). RDMAP delivers a Send after the RDMA Writes posted before it
//!    on the same queue pair, so the server's receive completion for DONE
//!    means the whole buffer is placed (RFC 5040 §5.5: messages on one
//!    stream are completed at the Data Sink in the order they were sent).
//!    The server hashes its sink and compares.
//! 4. The server answers with its hash (ACK, 8 bytes). A Send's completion
//!    at its sender only says the message was handed on, not that the
//!    peer has it, so neither side may close before the other has what it
//!    needs: the client closes once it has the ACK
//!    (`QueuePair::disconnect`), and the server waits for that close as a
//!    queue-pair event ([`AsyncQpEvents`]) before it lets go of its queue
//!    pair.
//!
//! Exits 0 when every connection's hashes match, 1 on a mismatch or an
//! error, 2 when `--timeout` passes first. `--device` runs it on a kernel
//! device (siw0, rxe0) through the rdma-core provider; the default is the
//! device in `IWARP_DEVICE`, else `soft` (this crate's stack over TCP).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use iwarp::cm::{ConnParam, Listener, MpaConfig};
use iwarp::{
    Access, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpEvent, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use iwarp_tokio::{AsyncCq, AsyncListener, AsyncQpEvents};

/// Copy buffers by RDMA Write over several connections on one tokio
/// runtime, both ends in this process, and check them by hash.
#[derive(Parser, Debug, Clone)]
#[command(name = "verbs_copy")]
pub struct Opts {
    /// Concurrent connections.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub connections: usize,
    /// Bytes per connection (suffix K or M for KiB, MiB).
    #[arg(short, long, default_value = "8M", value_parser = parse_size)]
    pub size: usize,
    /// Bytes per RDMA Write (suffix K or M).
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    pub chunk: usize,
    /// RDMA Writes outstanding per connection.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    /// Device: soft, auto, or a kernel device (siw0, rxe0); default
    /// IWARP_DEVICE, else soft.
    #[arg(short, long)]
    pub device: Option<String>,
    /// Address to listen on and connect to (the port is chosen by the
    /// system).
    #[arg(short, long, default_value = "127.0.0.1")]
    pub addr: IpAddr,
    /// Let the provider's threads read the sockets (ProgressMode::Threaded)
    /// instead of the event loop (ProgressMode::AppDriven, the default).
    #[arg(long)]
    pub threaded: bool,
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

/// What one connection's server received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub bytes: usize,
    /// The hash DONE carried (the client's, of its buffer).
    pub sent_hash: u64,
    /// The server's hash of its sink.
    pub got_hash: u64,
}

/// The whole run: what every server received (in the order the
/// connections were accepted), the clients' hashes of their buffers (in
/// the clients' order), and how long it took.
#[derive(Debug, Clone)]
pub struct Report {
    pub copies: Vec<Copied>,
    pub client_hashes: Vec<u64>,
    pub elapsed: Duration,
}

impl Report {
    /// Every sink hashes as its DONE said, and the sinks are the clients'
    /// buffers (as sets: accept order is not connect order).
    pub fn ok(&self) -> bool {
        let mut got: Vec<u64> = self.copies.iter().map(|c| c.got_hash).collect();
        let mut want = self.client_hashes.clone();
        got.sort_unstable();
        want.sort_unstable();
        self.copies.iter().all(|c| c.sent_hash == c.got_hash) && got == want
    }

    /// Bytes moved.
    pub fn bytes(&self) -> usize {
        self.copies.iter().map(|c| c.bytes).sum()
    }
}

/// The control region: the grant, DONE, the ACK.
const GRANT: usize = 16;
const DONE: usize = 16;
const ACK: usize = 8;
/// Work request ids.
const WR_GRANT: u64 = 1;
const WR_DONE: u64 = 2;
const WR_ACK: u64 = 3;

/// FNV-1a, 64 bits: enough to catch a misplaced or missing chunk.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Connection `i`'s bytes.
fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(31) ^ (j >> 9) ^ i.wrapping_mul(101)) as u8)
        .collect()
}

/// One end of one connection: its CQ on the reactor, its queue pair, and
/// a small region for the grant and DONE messages.
struct End {
    cq: AsyncCq,
    qp: Arc<QueuePair>,
    ctl: MemoryRegion,
}

fn end(
    ctx: &Context,
    pd: &ProtectionDomain,
    mode: ProgressMode,
    depth: usize,
) -> Result<End, String> {
    let cq = ctx
        .create_cq(2 * depth + 8)
        .map_err(|e| format!("creating a CQ: {e}"))?;
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: depth as u32 + 2,
            max_recv_wr: 2,
        })
        .map_err(|e| format!("creating a QP: {e}"))?;
    let ctl = pd
        .reg_mr(GRANT + DONE + ACK, Access::LOCAL_WRITE)
        .map_err(|e| format!("registering the control region: {e}"))?;
    Ok(End {
        cq: AsyncCq::new(cq, mode).map_err(|e| e.to_string())?,
        qp: Arc::new(qp),
        ctl,
    })
}

impl End {
    fn recv(&self, wr_id: u64, off: usize, len: usize) -> Result<(), String> {
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sgl: SgList::single(self.ctl.sge(off, len)),
            })
            .map_err(|e| format!("posting a receive: {e}"))
    }

    fn send(&self, wr_id: u64, off: usize, len: usize) -> Result<(), String> {
        self.qp
            .post_send(&SendWr {
                wr_id,
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctl.sge(off, len)),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| format!("posting a Send: {e}"))
    }

    /// The next completion, which must be a success.
    async fn next(&self, what: &str) -> Result<WorkCompletion, String> {
        let wc = self
            .cq
            .completion()
            .await
            .map_err(|e| format!("{what}: waiting for a completion: {e}"))?;
        if wc.status != WcStatus::Success {
            return Err(format!(
                "{what}: work request {} ended {:?}",
                wc.wr_id, wc.status
            ));
        }
        Ok(wc)
    }
}

fn param(t: Duration) -> ConnParam {
    ConnParam {
        timeout: t,
        ..ConnParam::default()
    }
}

/// The server's half of one connection: grant the sink, wait for DONE,
/// hash what arrived.
async fn serve(
    l: &AsyncListener,
    ctx: &Context,
    pd: &ProtectionDomain,
    o: &Opts,
    mode: ProgressMode,
) -> Result<Copied, String> {
    let e = end(ctx, pd, mode, 1)?;
    let sink = pd
        .reg_mr(o.size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| format!("registering the sink ({} bytes): {e}", o.size))?;
    e.recv(WR_DONE, GRANT, DONE)?;
    let req = l
        .next_request()
        .await
        .map_err(|e| format!("accepting: {e}"))?;
    let t = Duration::from_secs(o.timeout);
    iwarp_tokio::accept(req, e.qp.clone(), param(t))
        .await
        .map_err(|e| format!("accepting: {e}"))?;
    let mut grant = [0u8; GRANT];
    grant[..8].copy_from_slice(&sink.addr().to_le_bytes());
    grant[8..12].copy_from_slice(&sink.rkey().to_le_bytes());
    grant[12..16].copy_from_slice(&(o.size as u32).to_le_bytes());
    e.ctl.write_at(0, &grant);
    e.send(WR_GRANT, 0, GRANT)?;
    // The grant's completion and DONE, in either order.
    let mut done = None;
    while done.is_none() {
        let wc = e.next("server").await?;
        if wc.opcode == WcOpcode::Recv {
            done = Some(wc);
        }
    }
    let mut msg = [0u8; DONE];
    e.ctl.read_at(GRANT, &mut msg);
    let len = u64::from_le_bytes(msg[..8].try_into().unwrap()) as usize;
    let sent_hash = u64::from_le_bytes(msg[8..].try_into().unwrap());
    if len > o.size {
        return Err(format!("DONE says {len} bytes, the sink holds {}", o.size));
    }
    let mut got = vec![0u8; len];
    sink.read_at(0, &mut got);
    let got_hash = fnv1a(&got);
    if got_hash != sent_hash {
        tracing::error!(
            len,
            sent_hash,
            got_hash,
            "the sink differs from what the client sent"
        );
    }
    e.ctl.write_at(GRANT + DONE, &got_hash.to_le_bytes());
    e.send(WR_ACK, GRANT + DONE, ACK)?;
    // The ACK's completion (after the grant's, if that one is still due).
    while e.next("server: ACK").await?.wr_id != WR_ACK {}
    // Keep the queue pair until the client has the ACK and closes. In
    // application-driven mode the receive work that notices the close
    // runs when the CQ is polled: wait for either.
    let events = AsyncQpEvents::new(e.qp.clone()).map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            ev = events.next() => match ev.map_err(|e| format!("server: QP events: {e}"))? {
                QpEvent::Disconnected => break,
                ev => tracing::debug!(?ev, "server: QP event"),
            },
            wc = e.cq.completion() => {
                let wc = wc.map_err(|e| format!("server: waiting for the close: {e}"))?;
                return Err(format!("server: unexpected completion while waiting for the close: {wc:?}"));
            }
        }
    }
    Ok(Copied {
        bytes: len,
        sent_hash,
        got_hash,
    })
}

/// The client's half of connection `i`: wait for the grant, write the
/// buffer, send DONE.
async fn copy(
    i: usize,
    to: SocketAddr,
    ctx: &Context,
    pd: &ProtectionDomain,
    o: &Opts,
    mode: ProgressMode,
) -> Result<u64, String> {
    let e = end(ctx, pd, mode, o.depth)?;
    let src = pd
        .reg_mr(o.size, Access::LOCAL_WRITE)
        .map_err(|e| format!("registering the source ({} bytes): {e}", o.size))?;
    let data = pattern(i, o.size);
    src.write_at(0, &data);
    let hash = fnv1a(&data);
    e.recv(WR_GRANT, 0, GRANT)?;
    e.recv(WR_ACK, GRANT + DONE, ACK)?;
    iwarp_tokio::connect(e.qp.clone(), to, param(Duration::from_secs(o.timeout)))
        .await
        .map_err(|e| format!("connecting to {to}: {e}"))?;
    e.next("client: the grant").await?;
    let mut grant = [0u8; GRANT];
    e.ctl.read_at(0, &mut grant);
    let addr = u64::from_le_bytes(grant[..8].try_into().unwrap());
    let rkey = u32::from_le_bytes(grant[8..12].try_into().unwrap());
    let room = u32::from_le_bytes(grant[12..16].try_into().unwrap()) as usize;
    if room < o.size {
        return Err(format!(
            "the server granted {room} bytes, {} to copy",
            o.size
        ));
    }
    let (mut off, mut outstanding) = (0usize, 0usize);
    while off < o.size || outstanding > 0 {
        if off < o.size && outstanding < o.depth {
            let n = o.chunk.min(o.size - off);
            e.qp.post_send(&SendWr {
                wr_id: 100 + off as u64,
                opcode: WrOpcode::RdmaWrite {
                    remote_addr: addr + off as u64,
                    rkey,
                },
                sgl: SgList::single(src.sge(off, n)),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| format!("posting an RDMA Write at {off}: {e}"))?;
            off += n;
            outstanding += 1;
        } else {
            e.next("client: an RDMA Write").await?;
            outstanding -= 1;
        }
    }
    let mut msg = [0u8; DONE];
    msg[..8].copy_from_slice(&(o.size as u64).to_le_bytes());
    msg[8..].copy_from_slice(&hash.to_le_bytes());
    e.ctl.write_at(GRANT, &msg);
    e.send(WR_DONE, GRANT, DONE)?;
    // DONE's completion and the ACK, in either order.
    let mut acked = false;
    while !acked {
        acked = e.next("client: DONE and the ACK").await?.opcode == WcOpcode::Recv;
    }
    let mut ack = [0u8; ACK];
    e.ctl.read_at(GRANT + DONE, &mut ack);
    if u64::from_le_bytes(ack) != hash {
        tracing::error!(i, "the server's hash differs from ours");
    }
    // The server waits for this close before it lets go of its QP.
    let qp = e.qp.clone();
    tokio::task::spawn_blocking(move || qp.disconnect())
        .await
        .map_err(|e| format!("client: disconnecting: {e}"))?;
    Ok(hash)
}

/// Run every connection on the current runtime; an error names the
/// connection and what failed.
pub async fn run(o: &Opts) -> Result<Report, String> {
    if o.connections == 0 || o.depth == 0 {
        return Err("--connections and --depth must be at least 1".into());
    }
    if o.size > u32::MAX as usize {
        return Err(format!(
            "--size {} is above the 4 GiB this protocol's grant can name",
            o.size
        ));
    }
    let open = || {
        match &o.device {
            Some(d) => Context::open_device(d),
            None => Context::open(),
        }
        .map_err(|e| format!("opening the device: {e}"))
    };
    let (sctx, cctx) = (open()?, open()?);
    let (spd, cpd) = (sctx.alloc_pd(), cctx.alloc_pd());
    let mode = if o.threaded {
        ProgressMode::Threaded {
            spin: Duration::ZERO,
        }
    } else {
        ProgressMode::AppDriven {
            spin: Duration::ZERO,
        }
    };
    let l = Listener::bind_on(&sctx, SocketAddr::new(o.addr, 0), MpaConfig::default())
        .map_err(|e| format!("listening on {}: {e}", o.addr))?;
    let l = AsyncListener::new(l, Duration::from_secs(o.timeout)).map_err(|e| e.to_string())?;
    let to = l.local_addr();
    tracing::info!(%to, device = %sctx.device_name(), connections = o.connections, size = o.size, "copying");
    let started = Instant::now();
    // Both halves of every connection as futures of this one task: the
    // reactor wakes whichever CQ or listener is ready.
    let servers = (0..o.connections).map(|_| serve(&l, &sctx, &spd, o, mode));
    let clients = (0..o.connections).map(|i| copy(i, to, &cctx, &cpd, o, mode));
    let (got, sent) = tokio::join!(join_all(servers), join_all(clients));
    let elapsed = started.elapsed();
    let client_hashes = sent
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.map_err(|e| format!("connection {i}, client: {e}")))
        .collect::<Result<Vec<u64>, String>>()?;
    let copies = got
        .into_iter()
        .enumerate()
        .map(|(i, g)| g.map_err(|e| format!("server {i}: {e}")))
        .collect::<Result<Vec<Copied>, String>>()?;
    Ok(Report {
        copies,
        client_hashes,
        elapsed,
    })
}

/// Poll futures together on the current task, results in their order (a
/// small `join_all`, so the example needs nothing beyond tokio).
async fn join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
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
    // One thread: every connection's waits are futures of one event loop.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("verbs_copy: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let t = Duration::from_secs(o.timeout);
    match rt.block_on(async { tokio::time::timeout(t, run(&o)).await }) {
        Err(_) => {
            eprintln!("verbs_copy: not done within --timeout {} s", o.timeout);
            ExitCode::from(2)
        }
        Ok(Err(e)) => {
            eprintln!("verbs_copy: {e}");
            ExitCode::FAILURE
        }
        Ok(Ok(r)) => {
            let bytes = r.bytes();
            let secs = r.elapsed.as_secs_f64();
            println!(
                "verbs_copy: {} connections, {} bytes in {:.3} s ({:.1} MiB/s), hashes {}",
                r.copies.len(),
                bytes,
                secs,
                bytes as f64 / secs.max(1e-9) / (1 << 20) as f64,
                if r.ok() { "match" } else { "DIFFER" }
            );
            if r.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
