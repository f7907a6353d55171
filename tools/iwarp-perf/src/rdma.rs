//! The iWARP side of the tests, on the `iwarp` verbs API.
//!
//! # Roles
//!
//! The **client** (the side that connects) drives every test and measures:
//! it posts the Writes, Reads and Sends of the bandwidth tests and is the
//! pinging side of the latency tests. The **server** (the side that
//! accepts) is passive in write_bw / read_bw / read_lat, keeps receives
//! posted in send_bw, and echoes in write_lat / send_lat.
//!
//! # Buffers of one connection
//!
//! - `data`: the message buffers. One message slot normally (every
//!   operation uses the same bytes, as perftest does); with `--integrity`
//!   one slot per outstanding operation, so each in-flight message keeps
//!   its own pattern. write_lat uses slot 0 as its source and lets the
//!   peer write into slot 1.
//! - `recv`: receive buffers (send tests: message-sized; otherwise only
//!   the 32-byte control messages).
//! - `ctrl`: 4 KiB: a credit word the peer RDMA-Writes (`[v, !v]`, so a
//!   torn read is detected), staging slots for our own credit Writes, and
//!   the control message being sent.
//!
//! # Flow control and the final handshake
//!
//! iWARP has no receiver-not-ready retry: a Send that finds no posted
//! receive is fatal (RFC 5040 §5.3, the QP is terminated). So send_bw
//! runs on credits: the receiver RDMA-Writes its count of posted receives
//! into the sender's credit word and the sender never sends past it. With
//! `--integrity`, write_bw uses the same credits to keep the sender from
//! overwriting a slot the receiver has not verified yet.
//!
//! Every test ends with a handshake of two control messages (Sends with
//! the Solicited Event flag, which is how the receiver tells them from
//! data): the client sends DONE (messages sent, checksum sum) after its
//! last operation completed, the server answers ACK (messages seen,
//! checksum sum). The client stops its clock at the ACK, so a bandwidth
//! includes the time for the last byte to be placed at the receiver.

use std::net::SocketAddr;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, ConnRequest, Listener};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, WcOpcode, WcQueue, WcStatus, WorkCompletion, WrOpcode,
};
use iwarp_proto::handshake::{MpaConfig, Policy};

use crate::params::{self, Params, Remote, Request, Test};
use crate::pattern::{self, Verifier};
use crate::report::LatStats;

const CTRL_LEN: usize = 4096;
const CREDIT_OFF: usize = 0;
const STAGE_OFF: usize = 64;
const STAGE_SLOTS: u64 = 16;
const MSG_OFF: usize = 512;
/// Size of a control message and the smallest receive buffer.
const CTRL_MSG: usize = 32;
const DONE: u64 = 0x444f_4e45;
const ACK: u64 = 0x0041_434b;

const K_DATA: u64 = 1;
const K_CTRL: u64 = 2;
const K_CREDIT: u64 = 3;
const K_RECV: u64 = 4;

/// Extra send-queue entries beyond the data window (credit Writes and
/// control messages).
const SQ_EXTRA: u32 = STAGE_SLOTS as u32 + 8;

fn wrid(kind: u64, qp: u32, seq: u64) -> u64 {
    kind << 56 | (u64::from(qp) & 0xffff) << 40 | (seq & ((1 << 40) - 1))
}

fn split_wrid(id: u64) -> (u64, usize, u64) {
    (
        id >> 56,
        ((id >> 40) & 0xffff) as usize,
        id & ((1 << 40) - 1),
    )
}

/// Warm-up round trips of the latency tests (not recorded).
pub fn warmup(p: &Params) -> u64 {
    if p.duration.is_some() {
        100
    } else {
        p.iters.min(100)
    }
}

/// Iteration control of a latency loop: `warmup` untimed iterations, then
/// a fixed count or a duration, timed from the end of the warm-up.
#[derive(Debug)]
pub struct LatClock {
    warm: u64,
    iters: u64,
    duration: Option<Duration>,
    from: Instant,
}

impl LatClock {
    pub fn new(p: &Params) -> LatClock {
        LatClock {
            warm: warmup(p),
            iters: p.iters,
            duration: p.duration,
            from: Instant::now(),
        }
    }

    /// Call at the top of iteration `i`; false once the run is over.
    pub fn keep_going(&mut self, i: u64) -> bool {
        if i == self.warm {
            self.from = Instant::now();
        }
        match self.duration {
            Some(d) => i < self.warm || self.from.elapsed() < d,
            None => i < self.warm + self.iters,
        }
    }

    /// Time since the warm-up ended.
    pub fn elapsed(&self) -> Duration {
        self.from.elapsed()
    }
}

/// Which end a [`Side`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// The MPA configuration for `--crc` / `--markers`: `Some(true)` requires,
/// `Some(false)` refuses, `None` (a server without the option) follows the
/// client. IRD/ORD are requested as `depth`, so read_bw can keep `depth`
/// Reads outstanding (RFC 6581 negotiates the minimum of both ends).
pub fn mpa_config(crc: Option<bool>, markers: Option<bool>, ird_ord: u32) -> MpaConfig {
    let pol = |o: Option<bool>| match o {
        Some(true) => Policy::Required,
        Some(false) => Policy::Off,
        None => Policy::Optional,
    };
    let v = ird_ord.clamp(1, 0x3fff) as u16;
    MpaConfig {
        crc: pol(crc),
        markers: pol(markers),
        ird: v,
        ord: v,
        ..MpaConfig::default()
    }
}

/// Slots of the data buffer.
fn data_slots(p: &Params) -> usize {
    match p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw if p.integrity => p.depth as usize,
        Test::WriteLat => 2,
        _ => 1,
    }
}

/// Receive-queue depth of `role`.
fn rq_depth(p: &Params, role: Role) -> u32 {
    match (p.test, role) {
        (Test::SendBw, Role::Server) => (p.depth.saturating_mul(2)).clamp(8, 4096),
        (Test::SendLat, _) => 8,
        _ => 4,
    }
}

/// (receive slot size, receive slots) of `role`.
fn recv_layout(p: &Params, role: Role) -> (usize, usize) {
    let rq = rq_depth(p, role) as usize;
    match (p.test, role) {
        (Test::SendBw, Role::Server) if p.integrity => (p.size.max(CTRL_MSG), rq),
        (Test::SendBw, Role::Server) | (Test::SendLat, _) => (p.size.max(CTRL_MSG), 1),
        _ => (CTRL_MSG, rq),
    }
}

/// One connection (QP) and its buffers.
struct Conn {
    idx: u32,
    qp: QueuePair,
    data: MemoryRegion,
    ctrl: MemoryRegion,
    recv: MemoryRegion,
    recv_slot: usize,
    recv_slots: usize,
    remote: Remote,
    /// Receives posted so far.
    recv_posted: u64,
    /// Credit Writes posted / completed.
    stage_posted: u64,
    stage_done: u64,
    /// Last credit value written to the peer.
    granted: u64,
    /// Control messages posted / completed.
    ctrl_posted: u64,
    ctrl_done: u64,
}

impl Conn {
    fn new(
        pd: &ProtectionDomain,
        scq: &CompletionQueue,
        rcq: &CompletionQueue,
        p: &Params,
        role: Role,
        idx: u32,
    ) -> Result<Conn, String> {
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let reg = |len: usize, what: &str| {
            pd.reg_mr(len, acc)
                .map_err(|e| format!("registering the {what} buffer ({len} bytes): {e}"))
        };
        let data = reg(p.size * data_slots(p), "data")?;
        let ctrl = reg(CTRL_LEN, "control")?;
        let (recv_slot, recv_slots) = recv_layout(p, role);
        let recv = reg(recv_slot * recv_slots, "receive")?;
        let rq = rq_depth(p, role);
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: scq.clone(),
                recv_cq: rcq.clone(),
                max_send_wr: p.depth + SQ_EXTRA,
                max_recv_wr: rq,
            })
            .map_err(|e| format!("creating the queue pair: {e}"))?;
        let mut c = Conn {
            idx,
            qp,
            data,
            ctrl,
            recv,
            recv_slot,
            recv_slots,
            remote: Remote::default(),
            recv_posted: 0,
            stage_posted: 0,
            stage_done: 0,
            granted: 0,
            ctrl_posted: 0,
            ctrl_done: 0,
        };
        // Receives go up before the connection exists: the peer may send
        // as soon as it is established.
        for _ in 0..rq {
            c.post_recv()?;
        }
        Ok(c)
    }

    fn local(&self) -> Remote {
        Remote {
            data_addr: self.data.addr(),
            data_len: self.data.len() as u64,
            data_rkey: self.data.rkey(),
            ctrl_addr: self.ctrl.addr(),
            ctrl_rkey: self.ctrl.rkey(),
        }
    }

    fn post_recv(&mut self) -> Result<(), String> {
        let n = self.recv_posted;
        let slot = (n % self.recv_slots as u64) as usize;
        self.qp
            .post_recv(&RecvWr {
                wr_id: wrid(K_RECV, self.idx, n),
                sgl: SgList::single(self.recv.sge(slot * self.recv_slot, self.recv_slot)),
            })
            .map_err(|e| format!("QP {}: post_recv: {e}", self.idx))?;
        self.recv_posted += 1;
        Ok(())
    }

    /// The bytes of a completed receive.
    fn recv_bytes(&self, seq: u64, len: usize, out: &mut Vec<u8>) {
        let slot = (seq % self.recv_slots as u64) as usize;
        out.resize(len.min(self.recv_slot), 0);
        self.recv.read_at(slot * self.recv_slot, out);
    }

    /// Credit the peer granted us (its count of receives posted, or of
    /// messages verified plus slots), at least `initial`.
    fn credit(&self, initial: u64) -> u64 {
        let mut b = [0u8; 16];
        fence(Ordering::SeqCst);
        self.ctrl.read_at(CREDIT_OFF, &mut b);
        let v = u64::from_le_bytes(b[0..8].try_into().unwrap_or_default());
        let nv = u64::from_le_bytes(b[8..16].try_into().unwrap_or_default());
        if nv == !v {
            v.max(initial)
        } else {
            // Torn read (the peer's Write is being placed): use the floor.
            initial
        }
    }

    /// Write credit value `v` into the peer's credit word if it grew by at
    /// least `step` (or at all, with `force`) and a staging slot is free.
    fn grant(&mut self, v: u64, step: u64, force: bool) -> Result<bool, String> {
        if v <= self.granted || (!force && v - self.granted < step) {
            return Ok(false);
        }
        if self.stage_posted - self.stage_done >= STAGE_SLOTS {
            return Ok(false);
        }
        let off = STAGE_OFF + (self.stage_posted % STAGE_SLOTS) as usize * 16;
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&v.to_le_bytes());
        b[8..16].copy_from_slice(&(!v).to_le_bytes());
        self.ctrl.write_at(off, &b);
        self.qp
            .post_send(&SendWr {
                wr_id: wrid(K_CREDIT, self.idx, self.stage_posted),
                opcode: WrOpcode::RdmaWrite {
                    remote_addr: self.remote.ctrl_addr + CREDIT_OFF as u64,
                    rkey: self.remote.ctrl_rkey,
                },
                sgl: SgList::single(self.ctrl.sge(off, 16)),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| format!("QP {}: posting a credit Write: {e}", self.idx))?;
        self.stage_posted += 1;
        self.granted = v;
        Ok(true)
    }

    /// Send a control message (DONE or ACK).
    fn send_ctrl(&mut self, kind: u64, count: u64, sum: u64) -> Result<(), String> {
        let off = MSG_OFF + (self.ctrl_posted % 4) as usize * CTRL_MSG;
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&kind.to_le_bytes());
        b[8..16].copy_from_slice(&count.to_le_bytes());
        b[16..24].copy_from_slice(&sum.to_le_bytes());
        self.ctrl.write_at(off, &b);
        self.qp
            .post_send(&SendWr {
                wr_id: wrid(K_CTRL, self.idx, self.ctrl_posted),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctrl.sge(off, 24)),
                signaled: true,
                solicited: true,
            })
            .map_err(|e| format!("QP {}: posting a control message: {e}", self.idx))?;
        self.ctrl_posted += 1;
        Ok(())
    }

    /// Read the message buffer's byte `off` (polled while the peer writes
    /// it; the fence keeps the compiler from caching it).
    fn peek_data(&self, off: usize) -> u8 {
        let mut b = [0u8; 1];
        fence(Ordering::SeqCst);
        self.data.read_at(off, &mut b);
        b[0]
    }
}

fn parse_ctrl(b: &[u8]) -> Option<(u64, u64, u64)> {
    if b.len() < 24 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    Some((w(0), w(8), w(16)))
}

/// Bounded waiting: spin (busy-poll) or spin briefly then yield (event
/// mode, where the CQ is waited on with `cq.wait` instead when possible).
struct Waiter {
    busy: bool,
    /// Busy-poll mode spins on memory or on `is_empty`, so it drives the
    /// receive work of these CQs' QPs itself (`CompletionQueue::progress`),
    /// as a spinning TCP reader reads its own socket.
    cq: Option<CompletionQueue>,
    timeout: Duration,
    last_progress: Instant,
    spins: u32,
}

impl Waiter {
    fn new(p: &Params, cq: &CompletionQueue) -> Waiter {
        // Every QP of a side reports to both of its CQs, so progressing
        // one of them covers them all (each call is a `recv` per QP).
        let cq = p.busy_poll.then(|| cq.clone());
        Waiter {
            busy: p.busy_poll,
            cq,
            timeout: p.timeout,
            last_progress: Instant::now(),
            spins: 0,
        }
    }

    fn progress(&mut self) {
        self.spins = 0;
        self.last_progress = Instant::now();
    }

    /// Nothing happened: spin or yield once; `Err` after `timeout` without
    /// progress.
    fn idle(&mut self, what: &str) -> Result<(), String> {
        self.spins += 1;
        if self.spins & 1023 == 0 && self.last_progress.elapsed() > self.timeout {
            return Err(format!(
                "timed out after {:?} {what}: the peer stopped making progress (raise --timeout for slow links)",
                self.timeout
            ));
        }
        if self.busy {
            if let Some(cq) = &self.cq {
                cq.progress();
            }
        } else if self.spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Wait until `cq` holds a completion (bounded by `timeout`).
    fn wait_cq(&mut self, cq: &CompletionQueue, what: &str) -> Result<(), String> {
        if self.busy {
            while cq.is_empty() {
                self.idle(what)?;
            }
            return Ok(());
        }
        let left = self.timeout.saturating_sub(self.last_progress.elapsed());
        match cq.wait(left) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "timed out after {:?} {what}: no completion arrived (raise --timeout for slow links)",
                self.timeout
            )),
            Err(e) => Err(format!("waiting for a completion: {e}")),
        }
    }
}

fn empty_wc() -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        queue: WcQueue::Send,
        byte_len: 0,
        invalidated_rkey: None,
        solicited: false,
    }
}

fn check_wc(wc: &WorkCompletion) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        return Ok(());
    }
    let (kind, qp, seq) = split_wrid(wc.wr_id);
    let what = match kind {
        K_DATA => "data operation",
        K_CTRL => "control message",
        K_CREDIT => "credit Write",
        K_RECV => "receive",
        _ => "work request",
    };
    Err(format!(
        "QP {qp}: {what} {seq} ({:?}) completed with status '{}'{}",
        wc.opcode,
        wc.status.as_str(),
        if wc.status == WcStatus::WrFlushErr {
            " (the connection went down: see the peer's error)"
        } else {
            ""
        }
    ))
}

/// One end of a run: device, CQs and the connections.
pub struct Side {
    _ctx: Context,
    p: Params,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    conns: Vec<Conn>,
    wcs: Vec<WorkCompletion>,
    scratch: Vec<u8>,
}

impl Side {
    fn new(p: &Params) -> Result<(Side, ProtectionDomain), String> {
        let ctx = Context::open().map_err(|e| format!("opening the device: {e}"))?;
        let pd = ctx.alloc_pd();
        let q = p.qps as usize;
        let scq = ctx
            .create_cq(q * (p.depth + SQ_EXTRA) as usize + 16)
            .map_err(|e| format!("creating the send CQ: {e}"))?;
        let rcq = ctx
            .create_cq(q * 4096 + 16)
            .map_err(|e| format!("creating the receive CQ: {e}"))?;
        Ok((
            Side {
                _ctx: ctx,
                p: *p,
                scq,
                rcq,
                conns: Vec::with_capacity(q),
                wcs: vec![empty_wc(); 64],
                scratch: Vec::new(),
            },
            pd,
        ))
    }

    /// Negotiated CRC and markers of the first connection.
    pub fn crc_markers(&self) -> (bool, bool) {
        self.conns
            .first()
            .and_then(|c| c.qp.conn_info())
            .map_or((false, false), |i| (i.crc, i.markers_tx || i.markers_rx))
    }

    /// Smallest negotiated ORD (outbound Reads) over the connections.
    fn ord(&self) -> u32 {
        self.conns
            .iter()
            .filter_map(|c| c.qp.conn_info())
            .map(|i| u32::from(i.ord))
            .min()
            .unwrap_or(1)
            .max(1)
    }

    /// Move send-CQ completions into `self.wcs`; returns how many.
    fn poll_send(&mut self) -> Result<usize, String> {
        self.poll_send_ext(false)
    }

    /// `closing`: a flushed control message or credit Write is expected
    /// (the peer may close as soon as it has our last message).
    fn poll_send_ext(&mut self, closing: bool) -> Result<usize, String> {
        let n = self.scq.poll(&mut self.wcs);
        for wc in &self.wcs[..n] {
            let (kind, qp, seq) = split_wrid(wc.wr_id);
            let benign = closing && wc.status == WcStatus::WrFlushErr && kind != K_DATA;
            if !benign {
                check_wc(wc)?;
            }
            if let Some(c) = self.conns.get_mut(qp) {
                match kind {
                    K_CREDIT => c.stage_done = c.stage_done.max(seq + 1),
                    K_CTRL => c.ctrl_done = c.ctrl_done.max(seq + 1),
                    _ => {}
                }
            }
        }
        Ok(n)
    }
}

/// Connect `p.qps` connections to `addr` as the client.
pub fn connect(addr: SocketAddr, p: &Params, mpa: &MpaConfig, last: bool) -> Result<Side, String> {
    let (mut side, pd) = Side::new(p)?;
    for idx in 0..p.qps {
        let mut c = Conn::new(&pd, &side.scq, &side.rcq, p, Role::Client, idx)?;
        let req = Request {
            params: *p,
            qp_index: idx,
            last,
            remote: c.local(),
        };
        let reply = cm::connect(
            &c.qp,
            addr,
            &ConnParam {
                private_data: params::encode_request(&req),
                mpa: mpa.clone(),
                timeout: p.timeout,
                ..ConnParam::default()
            },
        )
        .map_err(|e| format!("connecting QP {idx} to {addr}: {e}"))?;
        c.remote = params::decode_reply(&reply)?;
        side.conns.push(c);
    }
    Ok(side)
}

/// Accept one client's run on `listener`: wait (up to `wait`) for its first
/// connection request, then for the rest of its `qps`. Returns the side and
/// the client's request (parameters, `last` flag).
pub fn accept(listener: &Listener, wait: Duration) -> Result<(Side, Request), String> {
    let first = listener
        .get_request(Some(wait))
        .map_err(|e| format!("waiting for a client: {e}"))?;
    let req0 = params::decode_request(first.private_data())?;
    let p = req0.params;
    let (mut side, pd) = Side::new(&p)?;
    let mut pending: Option<ConnRequest> = Some(first);
    for idx in 0..p.qps {
        let creq = match pending.take() {
            Some(r) => r,
            None => listener
                .get_request(Some(p.timeout))
                .map_err(|e| format!("waiting for connection {idx} of {}: {e}", p.qps))?,
        };
        let req = params::decode_request(creq.private_data())?;
        if req.qp_index != idx || req.params != p {
            return Err(format!(
                "connection {} of {} came with different parameters (qp index {}): one client at a time",
                idx, p.qps, req.qp_index
            ));
        }
        let mut c = Conn::new(&pd, &side.scq, &side.rcq, &p, Role::Server, idx)?;
        c.remote = req.remote;
        if matches!(p.test, Test::ReadBw | Test::ReadLat) {
            // The Read source: one pattern per slot, in place before the
            // client can issue its first Read.
            let mut scratch = Vec::new();
            for s in 0..data_slots(&p) {
                fill_slot(
                    &c,
                    p.size,
                    s,
                    pattern::seed(c.idx, 1, s as u64),
                    None,
                    &mut scratch,
                );
            }
        }
        creq.accept(
            &c.qp,
            &ConnParam {
                private_data: params::encode_reply(&c.local()),
                mpa: listener.mpa().clone(),
                timeout: p.timeout,
                ..ConnParam::default()
            },
        )
        .map_err(|e| format!("accepting connection {idx}: {e}"))?;
        side.conns.push(c);
    }
    Ok((side, req0))
}

/// What the client measured.
pub struct ClientResult {
    pub msgs: u64,
    pub elapsed: Duration,
    pub lat: Option<LatStats>,
    pub verified: u64,
}

/// Run the client role of the test.
pub fn run_client(side: &mut Side) -> Result<ClientResult, String> {
    match side.p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => client_bw(side),
        Test::WriteLat => client_write_lat(side),
        Test::ReadLat => client_read_lat(side),
        Test::SendLat => client_send_lat(side),
    }
}

/// Run the server role of the test; returns messages verified.
pub fn run_server(side: &mut Side) -> Result<u64, String> {
    let v = match side.p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => server_bw(side),
        Test::WriteLat => server_write_lat(side),
        Test::ReadLat => server_passive(side),
        Test::SendLat => server_send_lat(side),
    }?;
    // The client closes first, once it has our ACK; closing before that
    // could flush its last receive. Bounded by --timeout.
    let deadline = Instant::now() + side.p.timeout;
    for c in &side.conns {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match c.qp.next_event(left) {
                Some(iwarp::QpEvent::Disconnected) | None => break,
                Some(_) => {}
            }
        }
    }
    Ok(v)
}

/// The stamp byte of write_bw message `iter` in a buffer of `slots` slots
/// (`--integrity`): the slot's round, never 0, so a slot's previous
/// content never looks like the expected message.
fn stamp(iter: u64, slots: u64) -> u8 {
    ((iter / slots) % 255 + 1) as u8
}

/// Fill data slot `slot` of `c` with pattern `seed` (and the stamp);
/// returns its checksum.
fn fill_slot(
    c: &Conn,
    size: usize,
    slot: usize,
    seed: u64,
    last: Option<u8>,
    scratch: &mut Vec<u8>,
) -> u32 {
    scratch.resize(size, 0);
    pattern::fill(scratch, seed);
    if let (Some(b), Some(l)) = (last, scratch.last_mut()) {
        *l = b;
    }
    c.data.write_at(slot * size, scratch);
    pattern::checksum(scratch)
}

#[derive(Default, Clone)]
struct BwState {
    posted: u64,
    completed: u64,
    sent_sum: u64,
    /// Reads verified (read_bw `--integrity`).
    verified: u64,
}

/// The client of write_bw / read_bw / send_bw.
fn client_bw(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let slots = data_slots(&p) as u64;
    let window = match p.test {
        Test::ReadBw => p.depth.min(side.ord()),
        _ => p.depth,
    } as u64;
    // perftest signals every Nth request; the last one of a fixed count is
    // always signaled, and in duration mode the DONE message's completion
    // covers the unsignaled tail.
    let sig_every = if p.integrity { 1 } else { (window / 4).max(1) };
    // Credits: send_bw always, write_bw with --integrity.
    let credit_floor = match p.test {
        Test::SendBw => Some(u64::from(rq_depth(&p, Role::Server))),
        Test::WriteBw if p.integrity => Some(slots),
        _ => None,
    };
    let mut verifiers: Vec<Verifier> = (0..p.qps).map(|_| Verifier::new(p.corrupt)).collect();
    let mut st = vec![BwState::default(); side.conns.len()];
    let mut wrs: Vec<SendWr> = Vec::with_capacity(64);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut scratch = Vec::new();
    let start = Instant::now();
    let end_at = p.duration.map(|d| start + d);
    let mut stop_posting = false;
    loop {
        let mut progress = false;
        let mut credit_blocked = false;
        if !stop_posting {
            if let Some(t) = end_at {
                stop_posting = Instant::now() >= t;
            }
        }
        for (ci, c) in side.conns.iter().enumerate() {
            let s = &mut st[ci];
            let credit = credit_floor.map(|f| c.credit(f));
            wrs.clear();
            // In duration mode posting stops at a signaling boundary, so
            // the last request posted is a signaled one.
            while s.posted - s.completed < window
                && wrs.len() < 64
                && !(stop_posting && s.posted % sig_every == 0)
            {
                let i = s.posted;
                if end_at.is_none() && i >= p.iters {
                    break;
                }
                if let Some(cr) = credit {
                    if i >= cr {
                        credit_blocked = true;
                        break;
                    }
                }
                let slot = (i % slots) as usize;
                let last_one = end_at.is_none() && i + 1 == p.iters;
                let signaled = last_one || (i + 1) % sig_every == 0;
                let opcode = match p.test {
                    Test::WriteBw => WrOpcode::RdmaWrite {
                        remote_addr: c.remote.data_addr + (slot * size) as u64,
                        rkey: c.remote.data_rkey,
                    },
                    Test::ReadBw => WrOpcode::RdmaRead {
                        remote_addr: c.remote.data_addr + (slot * size) as u64,
                        rkey: c.remote.data_rkey,
                    },
                    _ => WrOpcode::Send,
                };
                if p.integrity && p.test != Test::ReadBw {
                    let st_byte = (p.test == Test::WriteBw).then(|| stamp(i, slots));
                    let crc = fill_slot(
                        c,
                        size,
                        slot,
                        pattern::seed(c.idx, 0, i),
                        st_byte,
                        &mut scratch,
                    );
                    s.sent_sum = s.sent_sum.wrapping_add(u64::from(crc));
                }
                wrs.push(SendWr {
                    wr_id: wrid(K_DATA, c.idx, i),
                    opcode,
                    sgl: SgList::single(c.data.sge(slot * size, size)),
                    signaled,
                    solicited: false,
                });
                s.posted += 1;
            }
            if !wrs.is_empty() {
                c.qp.post_send_list(&wrs)
                    .map_err(|e| format!("QP {}: post_send: {e}", c.idx))?;
                progress = true;
            }
        }
        let n = side.poll_send()?;
        for k in 0..n {
            let wc = side.wcs[k];
            let (kind, qi, seq) = split_wrid(wc.wr_id);
            if kind != K_DATA {
                continue;
            }
            let s = &mut st[qi];
            let upto = seq + 1;
            if p.integrity && p.test == Test::ReadBw {
                let c = &side.conns[qi];
                for i in s.completed.max(s.verified)..upto {
                    let slot = (i % slots) as usize;
                    side.scratch.resize(size, 0);
                    c.data.read_at(slot * size, &mut side.scratch);
                    verifiers[qi].check(
                        "RDMA Read",
                        i,
                        &mut side.scratch,
                        pattern::seed(c.idx, 1, slot as u64),
                        None,
                    )?;
                    s.verified = i + 1;
                }
            }
            s.completed = s.completed.max(upto);
        }
        if n > 0 {
            progress = true;
        }
        let all_posted = st.iter().all(|s| match end_at {
            Some(_) => stop_posting && s.posted % sig_every == 0,
            None => s.posted >= p.iters,
        });
        if all_posted && st.iter().all(|s| s.completed == s.posted) {
            break;
        }
        if progress {
            waiter.progress();
            continue;
        }
        // Blocked on credits: they arrive as RDMA Writes into memory, with
        // no completion here (and the requests still outstanding may all be
        // unsignaled), so poll the credit word.
        if credit_blocked {
            waiter.idle("waiting for credits from the receiver")?;
        } else {
            waiter.wait_cq(&side.scq, "waiting for send completions")?;
        }
    }
    // The final handshake: DONE (messages, checksum sum) on every
    // connection, then the ACKs. send_bw needs a credit for DONE too.
    for (ci, c) in side.conns.iter_mut().enumerate() {
        if let Some(f) = credit_floor.filter(|_| p.test == Test::SendBw) {
            let mut w = Waiter::new(&p, &side.scq);
            while st[ci].posted >= c.credit(f) {
                w.idle("waiting for a credit for the final DONE message")?;
            }
        }
        c.send_ctrl(DONE, st[ci].posted, st[ci].sent_sum)?;
    }
    let acks = collect_ctrl(side, ACK, &mut waiter)?;
    let elapsed = start.elapsed();
    drain_sends(side)?;
    let mut verified = 0;
    for (ci, (count, sum)) in acks.iter().enumerate() {
        if *count != st[ci].posted {
            return Err(format!(
                "QP {ci}: the server saw {count} messages, we sent {}",
                st[ci].posted
            ));
        }
        if p.integrity && p.test != Test::ReadBw {
            if *sum != st[ci].sent_sum {
                return Err(format!(
                    "INTEGRITY FAILURE: QP {ci}: checksum sum at the receiver {sum:#x}, at the sender {:#x}",
                    st[ci].sent_sum
                ));
            }
            verified += count;
        }
    }
    verified += verifiers.iter().map(|v| v.checked).sum::<u64>();
    Ok(ClientResult {
        msgs: st.iter().map(|s| s.posted).sum(),
        elapsed,
        lat: None,
        verified,
    })
}

/// Wait for one control message of `kind` on every connection (data
/// receives must not arrive meanwhile). Returns (count, sum) per QP.
fn collect_ctrl(
    side: &mut Side,
    kind: u64,
    waiter: &mut Waiter,
) -> Result<Vec<(u64, u64)>, String> {
    let mut got: Vec<Option<(u64, u64)>> = vec![None; side.conns.len()];
    let mut buf = Vec::new();
    waiter.progress();
    while got.iter().any(Option::is_none) {
        side.poll_send()?;
        let n = side.rcq.poll(&mut side.wcs);
        if n == 0 {
            waiter.wait_cq(&side.rcq, "waiting for the peer's final handshake message")?;
            continue;
        }
        waiter.progress();
        for k in 0..n {
            let wc = side.wcs[k];
            let (_, qi, seq) = split_wrid(wc.wr_id);
            if wc.status == WcStatus::WrFlushErr && got.get(qi).is_some_and(Option::is_some) {
                // The peer closed after its last message: expected.
                continue;
            }
            check_wc(&wc)?;
            let c = side
                .conns
                .get(qi)
                .ok_or_else(|| format!("completion for unknown QP {qi}"))?;
            c.recv_bytes(seq, wc.byte_len as usize, &mut buf);
            match parse_ctrl(&buf) {
                Some((k2, count, sum)) if wc.solicited && k2 == kind => {
                    got[qi] = Some((count, sum))
                }
                _ => {
                    return Err(format!(
                    "QP {qi}: unexpected message of {} bytes while waiting for the final handshake",
                    wc.byte_len
                ))
                }
            }
        }
    }
    Ok(got.into_iter().map(|g| g.unwrap_or_default()).collect())
}

/// Wait until every control message and credit Write has completed, so
/// that the last control message has left before the QPs are torn down.
fn drain_sends(side: &mut Side) -> Result<(), String> {
    let mut w = Waiter::new(&side.p, &side.scq);
    loop {
        let n = side.poll_send_ext(true)?;
        if side
            .conns
            .iter()
            .all(|c| c.ctrl_done >= c.ctrl_posted && c.stage_done >= c.stage_posted)
        {
            return Ok(());
        }
        if n == 0 {
            w.wait_cq(&side.scq, "waiting for the last control message to leave")?;
        } else {
            w.progress();
        }
    }
}

#[derive(Default, Clone)]
struct RxState {
    /// Next message to see.
    expected: u64,
    /// DONE (count, sum) once received.
    done: Option<(u64, u64)>,
    acked: bool,
}

/// The server of write_bw / read_bw / send_bw.
fn server_bw(side: &mut Side) -> Result<u64, String> {
    let p = side.p;
    let slots = data_slots(&p) as u64;
    let size = p.size;
    let check_writes = p.integrity && p.test == Test::WriteBw;
    let grant_step = match p.test {
        Test::SendBw => (u64::from(rq_depth(&p, Role::Server)) / 4).max(1),
        _ => (slots / 2).max(1),
    };
    let mut st = vec![RxState::default(); side.conns.len()];
    let mut verifiers: Vec<Verifier> = (0..p.qps).map(|_| Verifier::new(p.corrupt)).collect();
    let mut waiter = Waiter::new(&p, &side.scq);
    let passive_limit = passive_limit(&p);
    let started = Instant::now();
    let mut buf = Vec::new();
    loop {
        let mut progress = false;
        let n = side.rcq.poll(&mut side.wcs);
        for k in 0..n {
            let wc = side.wcs[k];
            check_wc(&wc)?;
            let (_, qi, seq) = split_wrid(wc.wr_id);
            let s = &mut st[qi];
            let c = &mut side.conns[qi];
            if wc.solicited {
                c.recv_bytes(seq, wc.byte_len as usize, &mut buf);
                match parse_ctrl(&buf) {
                    Some((DONE, count, sum)) => s.done = Some((count, sum)),
                    _ => return Err(format!("QP {qi}: malformed control message")),
                }
                continue;
            }
            if p.test != Test::SendBw {
                return Err(format!(
                    "QP {qi}: unexpected Send of {} bytes in {}",
                    wc.byte_len, p.test
                ));
            }
            if wc.byte_len as usize != size {
                return Err(format!(
                    "QP {qi}: message {} has {} bytes, expected {size}",
                    s.expected, wc.byte_len
                ));
            }
            if p.integrity {
                c.recv_bytes(seq, size, &mut buf);
                verifiers[qi].check(
                    "Send",
                    s.expected,
                    &mut buf,
                    pattern::seed(c.idx, 0, s.expected),
                    None,
                )?;
            }
            s.expected += 1;
            c.post_recv()?;
        }
        if n > 0 {
            progress = true;
        }
        if check_writes {
            for (qi, c) in side.conns.iter().enumerate() {
                let s = &mut st[qi];
                let limit = s.done.map_or(u64::MAX, |d| d.0);
                while s.expected < limit {
                    let i = s.expected;
                    let slot = (i % slots) as usize;
                    let want = stamp(i, slots);
                    if c.peek_data(slot * size + size - 1) != want {
                        break;
                    }
                    buf.resize(size, 0);
                    c.data.read_at(slot * size, &mut buf);
                    verifiers[qi].check(
                        "RDMA Write",
                        i,
                        &mut buf,
                        pattern::seed(c.idx, 0, i),
                        Some(want),
                    )?;
                    s.expected += 1;
                    progress = true;
                }
            }
        }
        // Credits: posted receives (send_bw) or verified + slots (write_bw).
        for (qi, c) in side.conns.iter_mut().enumerate() {
            let v = match p.test {
                Test::SendBw => c.recv_posted,
                Test::WriteBw if check_writes => st[qi].expected + slots,
                _ => continue,
            };
            if st[qi].done.is_none() && c.grant(v, grant_step, !progress)? {
                progress = true;
            }
        }
        side.poll_send()?;
        for (qi, c) in side.conns.iter_mut().enumerate() {
            let s = &mut st[qi];
            if let (Some((count, _)), false) = (s.done, s.acked) {
                let seen = match p.test {
                    Test::SendBw => s.expected,
                    Test::WriteBw if check_writes => s.expected,
                    _ => count,
                };
                if seen == count {
                    c.send_ctrl(ACK, seen, verifiers[qi].sum)?;
                    s.acked = true;
                    progress = true;
                } else if seen > count {
                    return Err(format!(
                        "QP {qi}: received {seen} messages, the client sent {count}"
                    ));
                }
            }
        }
        if st.iter().all(|s| s.acked) {
            break;
        }
        if progress {
            waiter.progress();
            continue;
        }
        let grants_pending = side.conns.iter().any(|c| {
            c.stage_done < c.stage_posted || (p.test == Test::SendBw && c.granted < c.recv_posted)
        });
        if check_writes || grants_pending {
            waiter.idle("waiting for RDMA Writes or credit Writes to complete")?;
        } else {
            // Passive: wait as long as the client runs (bounded).
            let mut w = Waiter::new(&p, &side.scq);
            if let Err(e) = w.wait_cq(&side.rcq, "waiting for data") {
                if started.elapsed() > passive_limit
                    || side
                        .conns
                        .iter()
                        .any(|c| c.qp.state() != iwarp::QpState::Rts)
                {
                    return Err(e);
                }
            }
        }
    }
    drain_sends(side)?;
    Ok(verifiers.iter().map(|v| v.checked).sum())
}

/// How long a passive server waits in total for the client's DONE.
fn passive_limit(p: &Params) -> Duration {
    p.timeout * 60 + p.duration.unwrap_or_default()
}

/// read_lat server: nothing to do until DONE.
fn server_passive(side: &mut Side) -> Result<u64, String> {
    wait_done_and_ack(side, None)?;
    Ok(0)
}

/// Wait (bounded) for DONE on every connection and answer ACK.
fn wait_done_and_ack(side: &mut Side, seen: Option<u64>) -> Result<(), String> {
    let p = side.p;
    let started = Instant::now();
    let mut waiter = Waiter::new(&p, &side.scq);
    loop {
        match collect_ctrl(side, DONE, &mut waiter) {
            Ok(dones) => {
                for (qi, (count, _)) in dones.iter().enumerate() {
                    side.conns[qi].send_ctrl(ACK, seen.unwrap_or(*count), 0)?;
                }
                return drain_sends(side);
            }
            Err(e)
                if e.starts_with("timed out")
                    && started.elapsed() < passive_limit(&p)
                    && side
                        .conns
                        .iter()
                        .all(|c| c.qp.state() == iwarp::QpState::Rts) => {}
            Err(e) => return Err(e),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Keep the send queue from filling in the latency tests (every request is
/// signaled; completions are reaped lazily).
fn reap_lat(side: &mut Side, outstanding: &mut u64, waiter: &mut Waiter) -> Result<(), String> {
    loop {
        let n = side.poll_send()?;
        *outstanding = outstanding.saturating_sub(n as u64);
        if *outstanding < u64::from(SQ_EXTRA) {
            return Ok(());
        }
        if n == 0 {
            waiter.wait_cq(&side.scq, "waiting for send completions")?;
        }
    }
}

/// write_lat client: Write our slot 0 into the peer's slot 1 with a stamp in
/// the last byte, poll our slot 1's last byte for the peer's echo.
fn client_write_lat(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let warm = warmup(&p);
    let mut samples = Vec::with_capacity(p.iters.min(1 << 24) as usize);
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let mut clock = LatClock::new(&p);
    let mut i = 0u64;
    while clock.keep_going(i) {
        let st = (i % 255 + 1) as u8;
        let c = &side.conns[0];
        if p.integrity {
            fill_slot(
                c,
                size,
                0,
                pattern::seed(c.idx, 0, i),
                Some(st),
                &mut scratch,
            );
        } else {
            c.data.write_at(size - 1, &[st]);
        }
        let t0 = Instant::now();
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::RdmaWrite {
                remote_addr: c.remote.data_addr + size as u64,
                rkey: c.remote.data_rkey,
            },
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        outstanding += 1;
        waiter.progress();
        while side.conns[0].peek_data(2 * size - 1) != st {
            if !side.scq.is_empty() {
                let n = side.poll_send()?;
                outstanding = outstanding.saturating_sub(n as u64);
            }
            waiter.idle("waiting for the peer's RDMA Write")?;
        }
        let rtt = t0.elapsed();
        if i >= warm {
            samples.push(us(rtt) / 2.0);
        }
        if p.integrity {
            let c = &side.conns[0];
            scratch.resize(size, 0);
            c.data.read_at(size, &mut scratch);
            verifier.check(
                "RDMA Write echo",
                i,
                &mut scratch,
                pattern::seed(0, 1, i),
                Some(st),
            )?;
        }
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
    finish_lat(side, i, samples, clock.elapsed(), verifier.checked)
}

/// The client's DONE / ACK exchange after a latency test.
fn finish_lat(
    side: &mut Side,
    total: u64,
    mut samples: Vec<f64>,
    elapsed: Duration,
    verified: u64,
) -> Result<ClientResult, String> {
    let n = samples.len() as u64;
    side.conns[0].send_ctrl(DONE, total, 0)?;
    let mut waiter = Waiter::new(&side.p, &side.scq);
    let acks = collect_ctrl(side, ACK, &mut waiter)?;
    drain_sends(side)?;
    if acks[0].0 != total {
        return Err(format!(
            "the server counted {} round trips, we made {total}",
            acks[0].0
        ));
    }
    let lat = LatStats::from_samples(&mut samples);
    Ok(ClientResult {
        msgs: n,
        elapsed,
        lat,
        verified: verified + acks[0].1,
    })
}

/// write_lat server: poll slot 1's last byte for the client's stamp, echo
/// it with a Write into the client's slot 1; DONE ends the test.
fn server_write_lat(side: &mut Side) -> Result<u64, String> {
    let p = side.p;
    let size = p.size;
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let started = Instant::now();
    let mut i = 0u64;
    loop {
        let st = (i % 255 + 1) as u8;
        waiter.progress();
        loop {
            if side.conns[0].peek_data(2 * size - 1) == st {
                break;
            }
            if !side.rcq.is_empty() {
                // DONE: the client finished (it only sends DONE after its
                // last echo arrived, so no Write is in flight).
                let (count, verified) = (i, verifier.checked);
                let mut w = Waiter::new(&p, &side.scq);
                let dones = collect_ctrl(side, DONE, &mut w)?;
                if dones[0].0 != count {
                    return Err(format!(
                        "the client made {} round trips, we echoed {count}",
                        dones[0].0
                    ));
                }
                side.conns[0].send_ctrl(ACK, count, verified)?;
                drain_sends(side)?;
                return Ok(verified);
            }
            if let Err(e) = waiter.idle("waiting for the client's RDMA Write") {
                if i > 0 || started.elapsed() > passive_limit(&p) {
                    return Err(e);
                }
                waiter.progress();
            }
        }
        let c = &side.conns[0];
        if p.integrity {
            scratch.resize(size, 0);
            c.data.read_at(size, &mut scratch);
            verifier.check(
                "RDMA Write",
                i,
                &mut scratch,
                pattern::seed(0, 0, i),
                Some(st),
            )?;
            fill_slot(
                c,
                size,
                0,
                pattern::seed(c.idx, 1, i),
                Some(st),
                &mut scratch,
            );
        } else {
            c.data.write_at(size - 1, &[st]);
        }
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::RdmaWrite {
                remote_addr: c.remote.data_addr + size as u64,
                rkey: c.remote.data_rkey,
            },
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        outstanding += 1;
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
}

/// read_lat client: one Read at a time; full round trip, as perftest
/// reports for reads.
fn client_read_lat(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let warm = warmup(&p);
    let mut samples = Vec::new();
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut scratch = Vec::new();
    let mut clock = LatClock::new(&p);
    let mut i = 0u64;
    while clock.keep_going(i) {
        let c = &side.conns[0];
        let t0 = Instant::now();
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::RdmaRead {
                remote_addr: c.remote.data_addr,
                rkey: c.remote.data_rkey,
            },
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        waiter.progress();
        loop {
            let n = side.poll_send()?;
            if side.wcs[..n]
                .iter()
                .any(|wc| split_wrid(wc.wr_id).0 == K_DATA)
            {
                break;
            }
            if n == 0 {
                if p.busy_poll {
                    waiter.idle("waiting for the RDMA Read")?;
                } else {
                    waiter.wait_cq(&side.scq, "waiting for the RDMA Read")?;
                }
            }
        }
        let rtt = t0.elapsed();
        if i >= warm {
            samples.push(us(rtt));
        }
        if p.integrity {
            scratch.resize(size, 0);
            side.conns[0].data.read_at(0, &mut scratch);
            verifier.check("RDMA Read", i, &mut scratch, pattern::seed(0, 1, 0), None)?;
        }
        i += 1;
    }
    finish_lat(side, i, samples, clock.elapsed(), verifier.checked)
}

/// send_lat client: Send, wait for the echo's receive completion.
fn client_send_lat(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let warm = warmup(&p);
    let mut samples = Vec::new();
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let mut clock = LatClock::new(&p);
    let mut i = 0u64;
    while clock.keep_going(i) {
        let c = &side.conns[0];
        if p.integrity {
            fill_slot(c, size, 0, pattern::seed(0, 0, i), None, &mut scratch);
        }
        let t0 = Instant::now();
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::Send,
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        outstanding += 1;
        waiter.progress();
        let wc = loop {
            if let Some(wc) = side.rcq.poll_one() {
                break wc;
            }
            if p.busy_poll {
                waiter.idle("waiting for the echo")?;
            } else {
                waiter.wait_cq(&side.rcq, "waiting for the echo")?;
            }
        };
        let rtt = t0.elapsed();
        check_wc(&wc)?;
        if i >= warm {
            samples.push(us(rtt) / 2.0);
        }
        let (_, _, seq) = split_wrid(wc.wr_id);
        let c = &mut side.conns[0];
        if wc.solicited || wc.byte_len as usize != size {
            return Err(format!(
                "echo {i}: unexpected message of {} bytes",
                wc.byte_len
            ));
        }
        if p.integrity {
            c.recv_bytes(seq, size, &mut scratch);
            verifier.check("Send echo", i, &mut scratch, pattern::seed(0, 1, i), None)?;
        }
        c.post_recv()?;
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
    finish_lat(side, i, samples, clock.elapsed(), verifier.checked)
}

/// send_lat server: echo every Send; DONE ends the test.
fn server_send_lat(side: &mut Side) -> Result<u64, String> {
    let p = side.p;
    let size = p.size;
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let started = Instant::now();
    let mut i = 0u64;
    loop {
        waiter.progress();
        let wc = loop {
            if let Some(wc) = side.rcq.poll_one() {
                break wc;
            }
            let r = if p.busy_poll {
                waiter.idle("waiting for the client's Send")
            } else {
                waiter.wait_cq(&side.rcq, "waiting for the client's Send")
            };
            if let Err(e) = r {
                if i > 0 || started.elapsed() > passive_limit(&p) {
                    return Err(e);
                }
                waiter.progress();
            }
        };
        check_wc(&wc)?;
        let (_, _, seq) = split_wrid(wc.wr_id);
        let c = &mut side.conns[0];
        if wc.solicited {
            c.recv_bytes(seq, wc.byte_len as usize, &mut scratch);
            match parse_ctrl(&scratch) {
                Some((DONE, count, _)) if count == i => {}
                Some((DONE, count, _)) => {
                    return Err(format!(
                        "the client made {count} round trips, we echoed {i}"
                    ))
                }
                _ => return Err("malformed control message".into()),
            }
            c.send_ctrl(ACK, i, verifier.checked)?;
            drain_sends(side)?;
            return Ok(verifier.checked);
        }
        if wc.byte_len as usize != size {
            return Err(format!(
                "message {i}: {} bytes, expected {size}",
                wc.byte_len
            ));
        }
        if p.integrity {
            c.recv_bytes(seq, size, &mut scratch);
            verifier.check("Send", i, &mut scratch, pattern::seed(0, 0, i), None)?;
            fill_slot(c, size, 0, pattern::seed(0, 1, i), None, &mut scratch);
        }
        // Repost before answering: the client's next Send may follow the
        // echo immediately.
        c.post_recv()?;
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::Send,
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        outstanding += 1;
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
}
