//! `--perftest`: speak perftest's `-R` (rdma_cm) protocol, so that
//! `ib_write_bw -R`, `ib_read_bw -R` or `ib_read_lat -R` on one host and
//! `iwarp-perf --perftest` on the other run one test together, in either
//! role, on any device (a kernel device through rdma-core, or this
//! crate's software stack, which speaks iWARP on TCP like Linux siw).
//!
//! # The protocol (perftest 4.5-0.17, version string "6.06")
//!
//! Two rdma_cm connections to the same port, no private data:
//!
//! 1. **control**: an RC QP with one small receive posted before the
//!    connection is made. Every exchange is a pair of Sends: the client
//!    sends first and then waits for the server's; the server waits, then
//!    sends (each side re-posts its receive before it sends, so no Send
//!    finds no receive: iWARP has no RNR retry, RFC 5040 §5.3).
//!    In order: version (16 bytes), cycle buffer (4), cache line (4), MTU
//!    (text), one all-zero `pingpong_dest` (56): after it the server
//!    listens again and the client connects
//! 2. **data**: the QP the test runs on (IRD/ORD from rdma_cm).
//!
//! Then on the control connection: one zero `pingpong_dest`, then the
//! QPs' `pingpong_dest`s (QPN, PSN, rkey, buffer address; three times for
//! the bandwidth tests, four for the latency tests), the test on the data
//! QP (the client issues every Write or Read, the server is passive), and
//! a closing `pingpong_dest` exchange; the bandwidth tests put their
//! reports (size, iterations, peak, average, rate: five 8-byte Sends)
//! between a final `pingpong_dest` exchange and the closing one.
//!
//! As in perftest the server does not learn the message size: give both
//! ends the same `-s` (the server's buffer is `max(size, 4096)` bytes;
//! a larger client message is a remote access error).
//!
//! # Tests not spoken
//!
//! `send_bw`, `write_lat` and `send_lat` are refused with the reason
//! ([`unsupported`]): send_bw relies on InfiniBand's receiver-not-ready
//! retry or a receive count agreed out of band, and the two ping-pong
//! latency tests poll memory in a pattern we have not captured and
//! checked; they run in iwarp-perf's own protocol only.

pub use iwarp_perf::perftest_wire as wire;

mod unread;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

use crate::params::Test;
use crate::report::LatStats;
use wire::{BwReport, Dest};

/// One perftest-compatible run's options (perftest's defaults where the
/// user gives none).
#[derive(Debug, Clone)]
pub struct Opts {
    pub test: Test,
    pub size: usize,
    pub iters: u64,
    pub depth: u32,
    /// Bound on every single wait.
    pub timeout: Duration,
    /// Server: how long to wait for the client's first connection.
    pub idle: Duration,
    /// Poll the completion queues from the waiting thread (as perftest
    /// does by default) instead of sleeping on completion events.
    pub busy_poll: bool,
}

/// Why `test` cannot run against perftest, or `None` when it can.
pub fn unsupported(test: Test) -> Option<&'static str> {
    match test {
        Test::WriteBw | Test::ReadBw | Test::ReadLat => None,
        Test::SendBw => Some(
            "send_bw is not perftest-compatible here: perftest's receiver keeps a fixed \
             number of receives posted and its sender counts on InfiniBand's RNR retry to \
             wait for more, which iWARP does not have (a Send without a posted receive \
             terminates the connection, RFC 5040 §5.3); use iwarp-perf on both ends",
        ),
        Test::WriteLat | Test::SendLat => Some(
            "write_lat/send_lat are not perftest-compatible yet: their ping-pong (which side \
             starts, which byte is polled) is not implemented against perftest's; \
             read_lat is, and iwarp-perf on both ends runs all six tests",
        ),
    }
}

/// perftest's defaults: 64 KiB for bandwidth, 2 bytes for latency; 5000
/// bandwidth iterations, 1000 latency ones; 128 outstanding.
pub fn default_size(test: Test) -> usize {
    if test.is_bw() {
        65536
    } else {
        2
    }
}

pub fn default_iters(test: Test) -> u64 {
    if test.is_bw() {
        5000
    } else {
        1000
    }
}

/// What one end measured (the client) or heard (the server).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub device: String,
    pub peer_version: String,
    /// Our own bandwidth (client) or the client's report (server).
    pub bw: Option<BwReport>,
    /// read_lat on the client: round-trip times in microseconds.
    pub lat: Option<LatStats>,
    pub elapsed: Duration,
}

const RECVS: usize = 4;
const SLOT: usize = 64;
const SEND_OFF: usize = 1024;
/// Upper bound for the Reads we keep outstanding (the rdma_cm IRD/ORD our
/// provider asks for is at most 16).
const MAX_ORD: u32 = 16;
/// How long the client waits after the closing exchange before it
/// disconnects.
const CLOSE_LINGER: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

/// The control connection's QP and its buffer: receive slots, then the
/// message being sent.
struct Ctrl {
    qp: QueuePair,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    mr: MemoryRegion,
    sent: u64,
    t: Duration,
    /// The closing exchange: the client's receive is its last, and the
    /// peer may disconnect right after its Send, so nothing is re-posted.
    closing: bool,
}

fn cq(ctx: &Context, n: usize, what: &str, busy: bool) -> Result<CompletionQueue, String> {
    let cq = ctx
        .create_cq(n)
        .map_err(|e| format!("creating the {what} CQ: {e}"))?;
    if busy {
        cq.set_progress(iwarp::ProgressMode::BusyPoll)
            .map_err(|e| format!("busy-polling the {what} CQ: {e}"))?;
    }
    Ok(cq)
}

fn check(wc: &WorkCompletion, op: WcOpcode, what: &str) -> Result<(), String> {
    if wc.status != WcStatus::Success {
        return Err(format!(
            "{what} completed with {:?} (the peer closed or refused the access: same test and -s on both ends?)",
            wc.status
        ));
    }
    if wc.opcode != op {
        return Err(format!("{what}: unexpected completion {:?}", wc.opcode));
    }
    Ok(())
}

impl Ctrl {
    fn new(ctx: &Context, pd: &ProtectionDomain, t: Duration) -> Result<Ctrl, String> {
        // The control messages are few: the CQs sleep between them.
        let scq = cq(ctx, 16, "control send", false)?;
        let rcq = cq(ctx, 16, "control receive", false)?;
        let mr = pd
            .reg_mr(4096, Access::LOCAL_WRITE)
            .map_err(|e| format!("registering the control buffer: {e}"))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: scq.clone(),
                recv_cq: rcq.clone(),
                max_send_wr: 4,
                max_recv_wr: RECVS as u32,
            })
            .map_err(|e| format!("creating the control QP: {e}"))?;
        let c = Ctrl {
            qp,
            scq,
            rcq,
            mr,
            sent: 0,
            t,
            closing: false,
        };
        for slot in 0..RECVS {
            c.post_recv(slot)?;
        }
        Ok(c)
    }

    fn post_recv(&self, slot: usize) -> Result<(), String> {
        self.qp
            .post_recv(&RecvWr {
                wr_id: slot as u64,
                sgl: SgList::single(self.mr.sge(slot * SLOT, SLOT)),
            })
            .map_err(|e| format!("posting a control receive: {e}"))
    }

    fn send(&mut self, msg: &[u8], what: &str) -> Result<(), String> {
        self.mr.write_at(SEND_OFF, msg);
        self.qp
            .post_send(&SendWr {
                wr_id: self.sent,
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.mr.sge(SEND_OFF, msg.len())),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| format!("sending perftest's {what}: {e}"))?;
        self.sent += 1;
        let wc = self
            .scq
            .wait_one(self.t)
            .map_err(|e| format!("sending perftest's {what}: {e}"))?
            .ok_or_else(|| {
                format!(
                    "sending perftest's {what}: no completion within {:?}",
                    self.t
                )
            })?;
        check(&wc, WcOpcode::Send, &format!("sending perftest's {what}"))
    }

    fn recv(&mut self, what: &str) -> Result<Vec<u8>, String> {
        let wc = self
            .rcq
            .wait_one(self.t)
            .map_err(|e| format!("waiting for perftest's {what}: {e}"))?
            .ok_or_else(|| {
                // Nothing came: say so, and whether the message is stuck
                // in a TCP receive queue of this host (Linux siw's accept
                // race, see `unread`).
                unread::explain(
                    format!(
                        "waiting for perftest's {what}: nothing within {:?} (does the peer run the same test with -R?)",
                        self.t
                    ),
                    self.qp.local_addr(),
                    self.qp.peer_addr(),
                )
            })?;
        check(&wc, WcOpcode::Recv, &format!("receiving perftest's {what}"))?;
        let slot = (wc.wr_id as usize).min(RECVS - 1);
        let mut b = vec![0u8; (wc.byte_len as usize).min(SLOT)];
        self.mr.read_at(slot * SLOT, &mut b);
        if !self.closing {
            self.post_recv(slot)?;
        }
        Ok(b)
    }

    /// One exchange: the client sends first, the server answers.
    fn exch(&mut self, role: Role, mine: &[u8], what: &str) -> Result<Vec<u8>, String> {
        tracing::debug!(what, len = mine.len(), "perftest exchange");
        if role == Role::Client {
            self.send(mine, what)?;
            self.recv(what)
        } else {
            let theirs = self.recv(what)?;
            self.send(mine, what)?;
            Ok(theirs)
        }
    }

    fn dest(&mut self, role: Role, mine: &Dest, what: &str) -> Result<Dest, String> {
        let b = self.exch(role, &mine.encode(), what)?;
        Dest::decode(&b).map_err(|e| e.to_string())
    }
}

/// The data connection's QP and buffer.
struct Data {
    qp: QueuePair,
    scq: CompletionQueue,
    mr: MemoryRegion,
}

impl Data {
    fn new(ctx: &Context, pd: &ProtectionDomain, len: usize, o: &Opts) -> Result<Data, String> {
        let depth = o.depth;
        let scq = cq(ctx, depth as usize + 16, "data send", o.busy_poll)?;
        let rcq = cq(ctx, 16, "data receive", false)?;
        let mr = pd
            .reg_mr(
                len,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .map_err(|e| format!("registering the data buffer ({len} bytes): {e}"))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: scq.clone(),
                recv_cq: rcq,
                max_send_wr: depth + 4,
                max_recv_wr: 4,
            })
            .map_err(|e| format!("creating the data QP: {e}"))?;
        Ok(Data { qp, scq, mr })
    }

    fn dest(&self, out_reads: u32) -> Dest {
        Dest {
            lid: 0,
            out_reads,
            qpn: self.qp.qp_num(),
            psn: psn(),
            rkey: self.mr.rkey(),
            vaddr: self.mr.addr(),
            ..Dest::default()
        }
    }
}

/// A 24-bit packet sequence number (unused by iWARP; perftest prints it).
fn psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(7)) & 0x00ff_ffff
}

/// Listen on `addr` through `ctx`'s device (rdma_cm for a kernel device,
/// TCP for soft).
fn listen(ctx: &Context, addr: SocketAddr) -> Result<iwarp::cm::Listener, String> {
    iwarp::cm::Listener::bind_on(ctx, addr, iwarp::cm::MpaConfig::default())
        .map_err(|e| format!("listening on {addr} ({}): {e}", ctx.device_name()))
}

/// Accept the next connection request on `qp`, waiting up to `wait`.
fn accept(
    l: &iwarp::cm::Listener,
    qp: &QueuePair,
    wait: Duration,
    t: Duration,
) -> Result<(), String> {
    let req = l
        .get_request(Some(wait))
        .map_err(|e| format!("waiting for perftest's connection: {e}"))?;
    req.accept(
        qp,
        &iwarp::cm::ConnParam {
            timeout: t,
            ..iwarp::cm::ConnParam::default()
        },
    )
    .map_err(|e| format!("accepting perftest's connection: {e}"))
}

fn connect_once(qp: &QueuePair, addr: SocketAddr, t: Duration) -> Result<(), String> {
    iwarp::cm::connect(
        qp,
        addr,
        &iwarp::cm::ConnParam {
            timeout: t,
            ..iwarp::cm::ConnParam::default()
        },
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// Connect a fresh QP (`make`) to `addr`, retrying while the peer is not
/// listening yet (perftest listens for the data connection only after
/// the exchange that precedes it), for at most `t`.
fn connect_retry<T>(
    addr: SocketAddr,
    t: Duration,
    what: &str,
    mut make: impl FnMut() -> Result<T, String>,
    qp: impl Fn(&T) -> &QueuePair,
) -> Result<T, String> {
    let deadline = Instant::now() + t;
    loop {
        let x = make()?;
        match connect_once(qp(&x), addr, t) {
            Ok(()) => return Ok(x),
            Err(e) if Instant::now() + Duration::from_millis(200) < deadline => {
                tracing::debug!(error = %e, "perftest {what} connection refused; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connecting the {what} connection to {addr}: {e}")),
        }
    }
}

/// The control prologue (version, cycle buffer, cache line, MTU, the
/// zero dest); returns the peer's version string.
fn prologue(c: &mut Ctrl, role: Role, mtu: u32) -> Result<String, String> {
    let v = c.exch(role, &wire::encode_version(wire::OUR_VERSION), "version")?;
    let (vs, vn) = wire::decode_version(&v).map_err(|e| e.to_string())?;
    if vn < 5.33 {
        return Err(format!(
            "perftest version {vs} is older than 5.33 (4-byte iteration counts in its reports): \
             not supported, use perftest 4.5 or newer"
        ));
    }
    let cyc = c.exch(role, &wire::encode_u32(wire::CYCLE_BUFFER), "cycle buffer")?;
    let peer_cycle = wire::decode_u32(&cyc, "cycle buffer").map_err(|e| e.to_string())?;
    let cl = c.exch(role, &wire::encode_u32(wire::CACHE_LINE), "cache line")?;
    wire::decode_u32(&cl, "cache line").map_err(|e| e.to_string())?;
    let m = c.exch(role, &wire::encode_mtu(mtu), "MTU")?;
    let peer_mtu = wire::decode_mtu(&m).map_err(|e| e.to_string())?;
    tracing::debug!(version = %vs, peer_cycle, peer_mtu, "perftest prologue");
    c.dest(role, &Dest::default(), "sync before the data connection")?;
    Ok(vs)
}

fn mtu_of(ctx: &Context) -> u32 {
    ctx.device_attr()
        .map(|a| a.active_mtu)
        .filter(|&m| m > 0)
        .unwrap_or(1024)
}

fn handshakes(test: Test) -> usize {
    if test.is_bw() {
        3
    } else {
        4
    }
}

/// The client: connect to a perftest server (or `iwarp-perf --perftest
/// --server`) at `addr`, run `o.test`, return what we measured.
pub fn client(ctx: &Context, addr: SocketAddr, o: &Opts) -> Result<Outcome, String> {
    if let Some(why) = unsupported(o.test) {
        return Err(why.into());
    }
    let pd = ctx.alloc_pd();
    let mut c = connect_retry(
        addr,
        o.timeout,
        "control",
        || Ctrl::new(ctx, &pd, o.timeout),
        |c| &c.qp,
    )?;
    let role = Role::Client;
    let peer_version = prologue(&mut c, role, mtu_of(ctx))?;
    let data = connect_retry(
        addr,
        o.timeout,
        "data",
        || Data::new(ctx, &pd, o.size.max(1), o),
        |d| &d.qp,
    )?;
    c.dest(role, &Dest::default(), "sync after the data connection")?;
    let ord = if o.test == Test::ReadBw {
        o.depth.min(MAX_ORD)
    } else {
        1
    };
    let mine = data.dest(ord);
    let mut rem = Dest::default();
    for k in 0..handshakes(o.test) {
        rem = c.dest(role, &mine, &format!("queue pair data ({})", k + 1))?;
    }
    let mut out = Outcome {
        device: ctx.device_name().to_string(),
        peer_version,
        bw: None,
        lat: None,
        elapsed: Duration::ZERO,
    };
    match o.test {
        Test::WriteBw | Test::ReadBw => {
            let window = if o.test == Test::ReadBw {
                o.depth.min(MAX_ORD).min(rem.out_reads.max(1))
            } else {
                o.depth
            };
            let elapsed = run_bw(&data, o, &rem, window)?;
            let secs = elapsed.as_secs_f64().max(1e-9);
            let bytes = o.size as f64 * o.iters as f64;
            let avg = bytes / secs / 1_048_576.0;
            let rep = BwReport {
                size: o.size as u64,
                iters: o.iters,
                bw_peak: avg,
                bw_avg: avg,
                msg_rate: o.iters as f64 / secs / 1e6,
            };
            c.dest(role, &mine, "end of the test")?;
            let mut theirs = Vec::with_capacity(5);
            for (k, part) in rep.encode().iter().enumerate() {
                theirs.push(c.exch(role, part, &format!("report part {}", k + 1))?);
            }
            out.bw = Some(rep);
            out.elapsed = elapsed;
        }
        Test::ReadLat => {
            let (elapsed, lat) = run_read_lat(&data, o, &rem)?;
            out.lat = Some(lat);
            out.elapsed = elapsed;
        }
        _ => unreachable!("refused above"),
    }
    c.closing = true;
    c.dest(role, &mine, "closing")?;
    // The server's closing Send may not have completed on its side yet:
    // closing at once can make it complete in error there (siw reported
    // IBV_WC_LOC_QP_OP_ERR to ib_write_bw). perftest's own client takes
    // this long tearing down; the run is measured already.
    std::thread::sleep(CLOSE_LINGER);
    data.qp.disconnect();
    c.qp.disconnect();
    Ok(out)
}

/// The server: wait on `addr` for a perftest client (or `iwarp-perf
/// --perftest` client), serve one `o.test` run (passively), return the
/// client's report.
pub fn server(ctx: &Context, addr: SocketAddr, o: &Opts) -> Result<Outcome, String> {
    if let Some(why) = unsupported(o.test) {
        return Err(why.into());
    }
    let pd = ctx.alloc_pd();
    let l = listen(ctx, addr)?;
    eprintln!(
        "iwarp-perf: listening for a perftest {} client on {addr} (device {})",
        o.test,
        ctx.device_name()
    );
    let mut c = Ctrl::new(ctx, &pd, o.timeout)?;
    accept(&l, &c.qp, o.idle, o.timeout)?;
    let t0 = Instant::now();
    let role = Role::Server;
    let peer_version = prologue(&mut c, role, mtu_of(ctx))?;
    // perftest's server buffer: max(size, cycle buffer).
    let len = o.size.max(wire::CYCLE_BUFFER as usize);
    let data = Data::new(ctx, &pd, len, o)?;
    if o.test == Test::ReadBw || o.test == Test::ReadLat {
        data.mr.fill(0x5a);
    }
    accept(&l, &data.qp, o.timeout, o.timeout)?;
    c.dest(role, &Dest::default(), "sync after the data connection")?;
    let ord = if o.test == Test::ReadBw { MAX_ORD } else { 1 };
    let mine = data.dest(ord);
    for k in 0..handshakes(o.test) {
        c.dest(role, &mine, &format!("queue pair data ({})", k + 1))?;
    }
    let mut out = Outcome {
        device: ctx.device_name().to_string(),
        peer_version,
        bw: None,
        lat: None,
        elapsed: Duration::ZERO,
    };
    // The client runs the test now; we wait for its next message, as
    // long as the test may take (bounded by the idle timeout).
    let per = c.t;
    c.t = o.idle;
    if o.test.is_bw() {
        c.dest(role, &mine, "end of the test")?;
        c.t = per;
        let mut parts = Vec::with_capacity(5);
        for k in 0..5 {
            parts.push(c.exch(role, &[0u8; 8], &format!("report part {}", k + 1))?);
        }
        out.bw = Some(BwReport::decode(&parts).map_err(|e| e.to_string())?);
        c.dest(role, &mine, "closing")?;
    } else {
        c.dest(role, &mine, "closing")?;
        c.t = per;
    }
    out.elapsed = t0.elapsed();
    data.qp.disconnect();
    c.qp.disconnect();
    Ok(out)
}

/// Post `o.iters` Writes or Reads of `o.size` bytes to the peer's buffer,
/// `window` outstanding, every `m`-th signaled; the time from the first
/// post to the last completion.
fn run_bw(d: &Data, o: &Opts, rem: &Dest, window: u32) -> Result<Duration, String> {
    let window = u64::from(window.max(1));
    let m = (window / 2).clamp(1, 100);
    let op = if o.test == Test::ReadBw {
        WrOpcode::RdmaRead {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        }
    } else {
        WrOpcode::RdmaWrite {
            remote_addr: rem.vaddr,
            rkey: rem.rkey,
        }
    };
    let want = if o.test == Test::ReadBw {
        WcOpcode::RdmaRead
    } else {
        WcOpcode::RdmaWrite
    };
    let mut wcs = vec![
        WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            queue: iwarp::WcQueue::Send,
            byte_len: 0,
            invalidated_rkey: None,
            solicited: false,
        };
        64
    ];
    let (mut posted, mut done) = (0u64, 0u64);
    let t0 = Instant::now();
    while done < o.iters {
        while posted < o.iters && posted - done < window {
            let last = posted + 1 == o.iters;
            d.qp.post_send(&SendWr {
                wr_id: posted,
                opcode: op,
                sgl: SgList::single(d.mr.sge(0, o.size)),
                signaled: last || (posted + 1) % m == 0,
                solicited: false,
            })
            .map_err(|e| format!("posting {} {posted}: {e}", o.test))?;
            posted += 1;
        }
        if !d
            .scq
            .wait(o.timeout)
            .map_err(|e| format!("waiting for {} completions: {e}", o.test))?
        {
            return Err(format!(
                "{}: no completion within {:?} ({done} of {} done)",
                o.test, o.timeout, o.iters
            ));
        }
        let n = d.scq.poll(&mut wcs);
        for wc in &wcs[..n] {
            check(wc, want, &format!("{} {}", o.test, wc.wr_id))?;
            done = done.max(wc.wr_id + 1);
        }
    }
    Ok(t0.elapsed())
}

/// One Read of `o.size` bytes at a time; round-trip times in µs.
fn run_read_lat(d: &Data, o: &Opts, rem: &Dest) -> Result<(Duration, LatStats), String> {
    let mut samples = Vec::with_capacity(o.iters as usize);
    let t0 = Instant::now();
    for i in 0..o.iters {
        let t = Instant::now();
        d.qp.post_send(&SendWr {
            wr_id: i,
            opcode: WrOpcode::RdmaRead {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            },
            sgl: SgList::single(d.mr.sge(0, o.size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("posting Read {i}: {e}"))?;
        let wc = d
            .scq
            .wait_one(o.timeout)
            .map_err(|e| format!("waiting for Read {i}: {e}"))?
            .ok_or_else(|| format!("Read {i}: no completion within {:?}", o.timeout))?;
        check(&wc, WcOpcode::RdmaRead, &format!("Read {i}"))?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let elapsed = t0.elapsed();
    let lat = LatStats::from_samples(&mut samples).ok_or("read_lat: no iterations")?;
    Ok((elapsed, lat))
}
