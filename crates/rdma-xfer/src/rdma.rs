//! The RDMA transport: one control QP and N data QPs per session, all on
//! one completion queue.
//!
//! # Control channel and credits
//!
//! An RDMAP Send needs a posted receive at the peer, or the peer's QP
//! goes to error (RFC 5040 §5.3, DDP RFC 5041 §7.2 "no buffer"). Each
//! side posts [`CTRL_RECVS`] receives on the control QP and reposts each
//! one as it consumes it; every message returns the count reposted since
//! the previous message in its `credits` field. A sender spends one credit
//! per message and keeps the last one for a `Credit` message, so two
//! sides that both run out of credits can always return them.
//!
//! # Data channel
//!
//! The source posts, per block, an unsignaled RDMA Write into a granted
//! sink block and a signaled Send carrying `BlockDone` on the same data
//! QP; the Send's completion frees the local block. No credit scheme is
//! needed there: the source sends a `BlockDone` only for a block it holds
//! a grant for, so at most `pool depth` of them are ever unconsumed, and
//! the sink keeps that many receives posted on each data QP plus a batch
//! it reposts together ([`data_recv_slots`]). Control Sends are signaled
//! only every [`CTRL_SIGNAL_EVERY`]th time.
//!
//! # Threads
//!
//! - The **caller's thread** reads (source) or writes (sink) blocks, and
//!   handles completions itself between those steps and while it waits:
//!   it holds an [`Attendance`](iwarp::Attendance) on the CQ and sleeps in
//!   `wait` under [`WakePolicy::Newest`], so a completion wakes it and
//!   nobody else.
//! - The **dispatcher thread** sleeps in `wait_background`: it takes the
//!   completions whenever the caller does not (while it reads or writes a
//!   block, which may be disk I/O, and between transfers). Whoever holds
//!   [`Shared::dispatch`] drains the CQ, reposts receives and routes
//!   messages.
//! - The **sender thread** posts the Write + `BlockDone` pairs the
//!   dispatcher thread completes (a grant arriving for a block that waits),
//!   so the dispatcher goes on draining the CQ. A pair completed on the
//!   caller's thread (a block filled while a grant is in hand, or a grant
//!   found while it waits) is posted there: handing it over would cost a
//!   wake-up per block.
//! - The **logger thread** reports progress ([`Logger`]).
//!
//! Handing each block through dedicated threads cost 12-16 context
//! switches per 1 MiB block, on a 2-CPU machine about a quarter of the
//! CPU time per GB; this arrangement needs 4-6. All waits check a shared
//! failure flag at least every [`TICK`] and give up after
//! [`Config::timeout`].

use std::collections::VecDeque;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, Listener, MpaConfig, Policy};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, Sge, WakePolicy, WcStatus, WorkCompletion, WrOpcode,
};

use crate::io::{BlockSink, BlockSource};
use crate::msg::{Grant, Msg, MAX_GRANTS, MSG_BUF};
use crate::progress::Logger;
use crate::{negotiate, Config, Error, Mode, ProgressFn, Reorder, Stats, Transport};

/// Receives posted on the control QP.
pub const CTRL_RECVS: u32 = 32;
/// Control-message send slots.
const CTRL_SLOTS: u32 = 32;
/// Every this many control Sends one is signaled; its completion frees
/// its slot and every slot posted before it (one send queue completes in
/// order). The last free slot is always signaled, so slots come back.
/// Each signaled completion wakes the dispatcher, and the sink sends a
/// Grant per block: signaling each one cost a wake-up per block.
const CTRL_SIGNAL_EVERY: u32 = CTRL_SLOTS / 4;
/// Size of a data-QP message slot.
const DATA_MSG: usize = 64;
/// Most consumed data receives the dispatcher collects before reposting
/// them in one call (each post takes the QP's engine lock, which the
/// receive thread holds while it places data: a repost per block often
/// had to wait for it).
const DATA_REPOST_MAX: u32 = 32;

/// Why a connection from `peer` is refused when the session accepts only
/// `only_from` (logged here; the text goes into the MPA reject).
pub(crate) fn refuse(peer: SocketAddr, only_from: Option<IpAddr>) -> Option<String> {
    let ip = only_from?;
    if peer.ip() == ip {
        return None;
    }
    tracing::warn!(%peer, expected = %ip, "rdma-xfer: refused a connection from an address other than the control connection's");
    Some("rdma-xfer: refused: not the address that opened the session".into())
}

/// Receives posted per data QP for a pool of `depth` blocks: `depth` (at
/// most one BlockDone per granted block is in flight) plus the batch that
/// may wait to be reposted.
fn data_recv_slots(depth: u32) -> u32 {
    depth + repost_batch(depth)
}

/// How many consumed data receives are reposted together.
fn repost_batch(depth: u32) -> u32 {
    depth.clamp(1, DATA_REPOST_MAX)
}
/// How often blocked waits look at the failure flag.
pub const TICK: Duration = Duration::from_millis(50);
/// Private-data magic of rdma-xfer connection requests.
const PD_MAGIC: &[u8; 4] = b"RFTX";

const K_CTRL_RECV: u64 = 1;
const K_CTRL_SEND: u64 = 2;
const K_DATA_RECV: u64 = 3;
const K_DATA_SEND: u64 = 4;
const K_DATA_WRITE: u64 = 5;

fn wr_id(kind: u64, qp: usize, val: u64) -> u64 {
    kind << 56 | (qp as u64 & 0xff) << 48 | (val & 0xffff_ffff_ffff)
}

fn wr_parts(id: u64) -> (u64, usize, u64) {
    (
        id >> 56,
        ((id >> 48) & 0xff) as usize,
        id & 0xffff_ffff_ffff,
    )
}

/// The MPA settings of rdma-xfer connections.
pub(crate) fn mpa_config(crc: bool) -> MpaConfig {
    MpaConfig {
        crc: if crc {
            Policy::Required
        } else {
            Policy::Optional
        },
        ..MpaConfig::default()
    }
}

/// A failure that every thread of the session sees.
#[derive(Debug, Clone)]
enum Fail {
    PeerAborted(String),
    Disconnected(String),
    Protocol(String),
    Timeout(&'static str, Duration),
    Local(String),
}

impl Fail {
    fn to_error(&self) -> Error {
        match self.clone() {
            Fail::PeerAborted(s) => Error::PeerAborted(s),
            Fail::Disconnected(s) => Error::Disconnected(s),
            Fail::Protocol(s) => Error::Protocol(s),
            Fail::Timeout(w, a) => Error::Timeout {
                waiting_for: w,
                after: a,
            },
            Fail::Local(s) => Error::Broken(s),
        }
    }
}

#[derive(Debug)]
struct CtrlState {
    credits: u32,
    unreturned: u32,
    backlog: VecDeque<Msg>,
    free_slots: Vec<u32>,
    /// Posted slots, oldest first (freed by the next signaled completion).
    in_flight: VecDeque<u32>,
    /// Unsignaled Sends posted since the last signaled one.
    unsignaled: u32,
}

/// Everything the threads share.
struct Shared {
    cq: CompletionQueue,
    ctrl_qp: QueuePair,
    data_qps: Vec<QueuePair>,
    /// Control slots: [`CTRL_RECVS`] receive slots, then [`CTRL_SLOTS`]
    /// send slots, of [`MSG_BUF`] bytes.
    ctrl_msgs: MemoryRegion,
    /// Data slots: `streams × depth` receive slots, then `depth` send
    /// slots (one per source block), of [`DATA_MSG`] bytes.
    data_msgs: MemoryRegion,
    depth: u32,
    ctrl: Mutex<CtrlState>,
    pairing: Mutex<Pairing>,
    /// The right to take completions off the CQ, and what handling them
    /// needs: held by the dispatcher thread while it drains the CQ, and by
    /// a transfer's caller while it waits (see [`RdmaSession::wait`]).
    dispatch: Mutex<Dispatch>,
    fail: Mutex<Option<Fail>>,
    failed: AtomicBool,
    stop: AtomicBool,
}

impl Shared {
    fn set_fail(&self, f: Fail) {
        let mut g = lock(&self.fail);
        if g.is_none() {
            tracing::debug!(fail = ?f, "transfer session failed");
            *g = Some(f);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn check(&self) -> Result<(), Error> {
        if self.failed.load(Ordering::Acquire) {
            let g = lock(&self.fail);
            if let Some(f) = g.as_ref() {
                return Err(f.to_error());
            }
        }
        Ok(())
    }

    fn post_ctrl_recv(&self, slot: u32) -> Result<(), Error> {
        self.ctrl_qp
            .post_recv(&RecvWr {
                wr_id: wr_id(K_CTRL_RECV, 0, u64::from(slot)),
                sgl: SgList::single(self.ctrl_msgs.sge(slot as usize * MSG_BUF, MSG_BUF)),
            })
            .map_err(|e| Error::Disconnected(format!("posting a control receive: {e:?}")))
    }

    fn data_recv_off(&self, qp: usize, slot: u32) -> usize {
        (qp * data_recv_slots(self.depth) as usize + slot as usize) * DATA_MSG
    }

    fn data_send_off(&self, block: u32) -> usize {
        (self.data_qps.len() * data_recv_slots(self.depth) as usize + block as usize) * DATA_MSG
    }

    /// Repost the consumed data receive slots `slots` of stream `qp`.
    fn post_data_recvs(&self, qp: usize, slots: &[u32]) -> Result<(), Error> {
        let wrs: Vec<RecvWr> = slots
            .iter()
            .map(|&slot| RecvWr {
                wr_id: wr_id(K_DATA_RECV, qp, u64::from(slot)),
                sgl: SgList::single(self.data_msgs.sge(self.data_recv_off(qp, slot), DATA_MSG)),
            })
            .collect();
        self.data_qps[qp]
            .post_recv_list(&wrs)
            .map_err(|e| Error::Disconnected(format!("posting data receives: {e:?}")))
    }

    /// Queue a control message; it leaves as soon as credits and a send
    /// slot allow, in order.
    fn ctrl_send(&self, msg: Msg) {
        let mut st = lock(&self.ctrl);
        st.backlog.push_back(msg);
        self.flush(&mut st);
    }

    fn flush(&self, st: &mut CtrlState) {
        while let Some(front) = st.backlog.front() {
            let need = if matches!(front, Msg::Credit) { 1 } else { 2 };
            if st.credits < need || st.free_slots.is_empty() {
                break;
            }
            let msg = st.backlog.pop_front().unwrap_or(Msg::Credit);
            let slot = st.free_slots.pop().unwrap_or(0);
            let mut buf = [0u8; MSG_BUF];
            let credits = st.unreturned.min(u32::from(u16::MAX)) as u16;
            let len = msg.emit(credits, &mut buf);
            let off = (CTRL_RECVS + slot) as usize * MSG_BUF;
            self.ctrl_msgs.write_at(off, &buf[..len]);
            let signaled = st.free_slots.is_empty() || st.unsignaled + 1 >= CTRL_SIGNAL_EVERY;
            let r = self.ctrl_qp.post_send(&SendWr {
                wr_id: wr_id(K_CTRL_SEND, 0, u64::from(slot)),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctrl_msgs.sge(off, len)),
                signaled,
                solicited: false,
            });
            match r {
                Ok(()) => {
                    st.credits -= 1;
                    st.unreturned -= u32::from(credits);
                    st.in_flight.push_back(slot);
                    st.unsignaled = if signaled { 0 } else { st.unsignaled + 1 };
                }
                Err(e) => {
                    st.free_slots.push(slot);
                    self.set_fail(Fail::Disconnected(format!(
                        "posting a control message: {e:?}"
                    )));
                    st.backlog.clear();
                    break;
                }
            }
        }
    }

    /// A control receive was consumed (and reposted): account the credits
    /// the message returned and the one we now owe.
    fn on_ctrl_recv(&self, returned: u16) {
        let mut st = lock(&self.ctrl);
        st.credits += u32::from(returned);
        st.unreturned += 1;
        if st.unreturned >= CTRL_RECVS / 2 && st.backlog.is_empty() {
            st.backlog.push_back(Msg::Credit);
        }
        self.flush(&mut st);
    }

    /// A signaled control Send completed: it and every Send posted before
    /// it are done, so their slots are free.
    fn on_ctrl_send_done(&self, slot: u32) {
        let mut st = lock(&self.ctrl);
        if !st.in_flight.contains(&slot) {
            return;
        }
        while let Some(s) = st.in_flight.pop_front() {
            st.free_slots.push(s);
            if s == slot {
                break;
            }
        }
        self.flush(&mut st);
    }
}

/// A filled source block: where it is, its sequence number, its index.
type Filled = (Sge, u64, u32);

/// The source's pairing stage: filled blocks waiting for a grant, and
/// grants waiting for a block.
#[derive(Default)]
struct Pairing {
    /// Grants of other transfers are stale and dropped.
    transfer: u64,
    blocks: VecDeque<Filled>,
    grants: VecDeque<Grant>,
    /// Grants asked for (pre-request) and not yet received.
    asked: u32,
}

impl Shared {
    /// Add a filled block and/or grants to the pairing stage and post
    /// every pair that completes: from this thread, or through the sender
    /// thread if `to_sender` is given. Asks for more grants before they run
    /// out (pre-request, at half the pool).
    fn offer(
        &self,
        block: Option<Filled>,
        grants: Option<(u64, Vec<Grant>)>,
        to_sender: Option<&Sender<(Filled, Grant)>>,
    ) {
        let mut pairs = Vec::new();
        let mut request = 0;
        {
            let mut p = lock(&self.pairing);
            if let Some(b) = block {
                p.blocks.push_back(b);
            }
            if let Some((t, gs)) = grants {
                if t != p.transfer {
                    return;
                }
                p.asked = p.asked.saturating_sub(gs.len() as u32);
                p.grants.extend(gs);
            }
            while !p.blocks.is_empty() && !p.grants.is_empty() {
                let (Some(b), Some(g)) = (p.blocks.pop_front(), p.grants.pop_front()) else {
                    break;
                };
                pairs.push((b, g));
                let have = p.asked + p.grants.len() as u32;
                // Round up, so that a depth of 1 asks again as well.
                if have < self.depth.div_ceil(2) {
                    let n = self.depth - have;
                    p.asked += n;
                    request += n;
                }
            }
        }
        if request > 0 {
            self.ctrl_send(Msg::Request { n: request });
        }
        for (b, g) in pairs {
            match to_sender {
                Some(tx) => {
                    let _ = tx.send((b, g));
                }
                None => self.post_block(b, g),
            }
        }
    }

    /// Post the Write of a filled block into granted sink block `g`, and
    /// its `BlockDone` behind it on the same stream.
    fn post_block(&self, (sge, seq, block): Filled, g: Grant) {
        let streams = self.data_qps.len() as u64;
        let qi = (seq % streams) as usize;
        let notice = Msg::BlockDone {
            seq,
            len: sge.length,
            block: g.block,
        };
        let mut buf = [0u8; DATA_MSG];
        let len = notice.emit(0, &mut buf);
        let off = self.data_send_off(block);
        self.data_msgs.write_at(off, &buf[..len]);
        let wrs = [
            SendWr {
                wr_id: wr_id(K_DATA_WRITE, qi, u64::from(block)),
                opcode: WrOpcode::RdmaWrite {
                    remote_addr: g.addr,
                    rkey: g.rkey,
                },
                sgl: SgList::single(sge),
                signaled: false,
                solicited: false,
            },
            SendWr {
                wr_id: wr_id(K_DATA_SEND, qi, u64::from(block)),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.data_msgs.sge(off, len)),
                signaled: true,
                solicited: false,
            },
        ];
        if let Err(e) = self.data_qps[qi].post_send_list(&wrs) {
            self.set_fail(Fail::Disconnected(format!(
                "posting an RDMA Write on stream {qi}: {e:?}"
            )));
        }
    }
}

/// What the dispatcher hands the sink's writer.
#[derive(Debug)]
enum SinkEv {
    Begin {
        transfer: u64,
        len: Option<u64>,
        prerequest: u32,
    },
    Request(u32),
    Block {
        seq: u64,
        len: u32,
        block: u32,
    },
    End {
        blocks: u64,
        bytes: u64,
    },
    Abort(String),
}

/// An RDMA transfer session.
pub struct RdmaSession {
    shared: Arc<Shared>,
    cfg: Config,
    session: u64,
    pd: ProtectionDomain,
    /// Source staging blocks: local access only, the peer cannot touch
    /// them. Registered at the first `send`.
    src_pool: Vec<MemoryRegion>,
    /// Sink landing blocks (remote write). Registered at the first `recv`.
    sink_pool: Vec<MemoryRegion>,
    freed_rx: Receiver<u32>,
    fin_rx: Receiver<u64>,
    sink_rx: Receiver<SinkEv>,
    threads: Vec<JoinHandle<()>>,
    logger: Logger,
    transfer: u64,
}

impl fmt::Debug for RdmaSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaSession")
            .field("session", &format_args!("{:016x}", self.session))
            .field("streams", &self.cfg.streams)
            .field("block_size", &self.cfg.block_size)
            .field("iodepth", &self.cfg.iodepth)
            .finish()
    }
}

/// Verbs resources of a session before the data streams exist.
struct Setup {
    /// Completions that arrived while waiting for another kind.
    stash: std::cell::RefCell<VecDeque<WorkCompletion>>,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    ctrl_qp: QueuePair,
    ctrl_msgs: MemoryRegion,
}

fn verbs(e: iwarp::Error) -> Error {
    Error::Setup(e.to_string())
}

impl Setup {
    fn new(cfg: &Config) -> Result<Setup, Error> {
        let ctx = Context::open().map_err(verbs)?;
        let pd = ctx.alloc_pd();
        let depth = cfg.pool_depth() as usize;
        let cq = ctx
            .create_cq(
                2 * (CTRL_RECVS + CTRL_SLOTS) as usize + 4 * depth * cfg.streams as usize + 64,
            )
            .map_err(verbs)?;
        let ctrl_qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: CTRL_SLOTS + 4,
                max_recv_wr: CTRL_RECVS,
            })
            .map_err(verbs)?;
        let ctrl_msgs = pd
            .reg_mr(
                (CTRL_RECVS + CTRL_SLOTS) as usize * MSG_BUF,
                Access::LOCAL_WRITE,
            )
            .map_err(verbs)?;
        for slot in 0..CTRL_RECVS {
            ctrl_qp
                .post_recv(&RecvWr {
                    wr_id: wr_id(K_CTRL_RECV, 0, u64::from(slot)),
                    sgl: SgList::single(ctrl_msgs.sge(slot as usize * MSG_BUF, MSG_BUF)),
                })
                .map_err(|e| Error::Setup(format!("posting control receives: {e:?}")))?;
        }
        Ok(Setup {
            stash: Default::default(),
            pd,
            cq,
            ctrl_qp,
            ctrl_msgs,
        })
    }

    /// Send one setup message from send slot 0 and wait for its completion.
    fn send(&self, msg: &Msg, deadline: Instant) -> Result<(), Error> {
        let mut buf = [0u8; MSG_BUF];
        let len = msg.emit(0, &mut buf);
        let off = CTRL_RECVS as usize * MSG_BUF;
        self.ctrl_msgs.write_at(off, &buf[..len]);
        self.ctrl_qp
            .post_send(&SendWr {
                wr_id: wr_id(K_CTRL_SEND, 0, 0),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctrl_msgs.sge(off, len)),
                signaled: true,
                solicited: false,
            })
            .map_err(|e| Error::Setup(format!("sending {msg:?}: {e:?}")))?;
        self.wait(K_CTRL_SEND, deadline, "the session setup message to leave")?;
        Ok(())
    }

    /// Wait for the next setup message; the receive slot is reposted.
    fn recv(&self, deadline: Instant) -> Result<Msg, Error> {
        let wc = self.wait(K_CTRL_RECV, deadline, "the peer's session setup message")?;
        let slot = wr_parts(wc.wr_id).2;
        let mut buf = vec![0u8; wc.byte_len as usize];
        self.ctrl_msgs.read_at(slot as usize * MSG_BUF, &mut buf);
        self.ctrl_qp
            .post_recv(&RecvWr {
                wr_id: wc.wr_id,
                sgl: SgList::single(self.ctrl_msgs.sge(slot as usize * MSG_BUF, MSG_BUF)),
            })
            .map_err(|e| Error::Setup(format!("reposting a control receive: {e:?}")))?;
        Msg::parse(&buf)
            .map(|(m, _)| m)
            .map_err(|e| Error::Protocol(e.to_string()))
    }

    /// The next successful completion of `kind`; others are stashed.
    fn wait(
        &self,
        kind: u64,
        deadline: Instant,
        what: &'static str,
    ) -> Result<WorkCompletion, Error> {
        let mut stash = self.stash.borrow_mut();
        if let Some(i) = stash.iter().position(|wc| wr_parts(wc.wr_id).0 == kind) {
            if let Some(wc) = stash.remove(i) {
                return Ok(wc);
            }
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.cq.wait_one(left).map_err(verbs)? {
                Some(wc) if wc.status != WcStatus::Success => {
                    return Err(Error::Disconnected(format!(
                        "{} while waiting for {what}",
                        wc.status.as_str()
                    )))
                }
                Some(wc) if wr_parts(wc.wr_id).0 == kind => return Ok(wc),
                Some(wc) => stash.push_back(wc),
                None => {
                    return Err(Error::Timeout {
                        waiting_for: what,
                        after: left,
                    })
                }
            }
        }
    }

    fn data_qp(&self, depth: u32) -> Result<QueuePair, Error> {
        self.pd
            .create_qp(&QpInitAttr {
                send_cq: self.cq.clone(),
                recv_cq: self.cq.clone(),
                max_send_wr: 2 * depth + 4,
                max_recv_wr: data_recv_slots(depth),
            })
            .map_err(verbs)
    }
}

fn private_data(id: u64, index: u32) -> Vec<u8> {
    let mut v = PD_MAGIC.to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(&index.to_be_bytes());
    v
}

fn parse_private_data(pd: &[u8]) -> Option<(u64, u32)> {
    if pd.len() < 16 || &pd[..4] != PD_MAGIC {
        return None;
    }
    let id = u64::from_be_bytes(pd[4..12].try_into().ok()?);
    let index = u32::from_be_bytes(pd[12..16].try_into().ok()?);
    Some((id, index))
}

impl RdmaSession {
    /// The active side (see [`crate::connect`]).
    pub fn connect(addr: SocketAddr, token: u64, cfg: &Config) -> Result<RdmaSession, Error> {
        let deadline = Instant::now() + cfg.connect_timeout;
        let s = Setup::new(cfg)?;
        let param = |pdata: Vec<u8>| ConnParam {
            private_data: pdata,
            mpa: mpa_config(cfg.crc),
            timeout: cfg.connect_timeout,
            // A peer silent this long while it owes Read Responses is gone.
            peer_timeout: cfg.timeout,
            ..ConnParam::default()
        };
        cm::connect(&s.ctrl_qp, addr, &param(private_data(token, u32::MAX)))
            .map_err(|e| Error::Setup(e.to_string()))?;
        s.send(
            &Msg::Hello {
                token,
                streams: cfg.streams,
                block_size: cfg.block_size,
                iodepth: cfg.iodepth,
            },
            deadline,
        )?;
        let (session, neg) = match s.recv(deadline)? {
            Msg::HelloAck {
                session,
                streams,
                block_size,
                iodepth,
            } => {
                let mut neg = cfg.clone();
                neg.streams = streams;
                neg.block_size = block_size;
                neg.iodepth = iodepth;
                let neg = neg
                    .validated()
                    .map_err(|e| Error::Protocol(format!("peer granted {e}")))?;
                (session, neg)
            }
            Msg::Abort { reason } => return Err(Error::PeerAborted(reason)),
            m => return Err(Error::Protocol(format!("expected HelloAck, got {m:?}"))),
        };
        let depth = neg.pool_depth();
        let mut qps = Vec::new();
        for _ in 0..neg.streams {
            qps.push(s.data_qp(depth)?);
        }
        let data_msgs = Self::post_data_recvs(&s, &qps, depth)?;
        for (i, qp) in qps.iter().enumerate() {
            cm::connect(qp, addr, &param(private_data(session, i as u32)))
                .map_err(|e| Error::Setup(format!("data stream {i}: {e}")))?;
        }
        tracing::debug!(%addr, session = format_args!("{session:016x}"), streams = neg.streams, block_size = neg.block_size, iodepth = neg.iodepth, "rdma-xfer session connected");
        Ok(Self::start(s, qps, data_msgs, neg, session))
    }

    /// The passive side (see [`crate::XferListener::accept`]).
    pub(crate) fn accept(
        l: &Listener,
        token: u64,
        ours: &Config,
        only_from: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<RdmaSession, Error> {
        let deadline = Instant::now() + timeout;
        let s = Setup::new(ours)?;
        let param = ConnParam {
            mpa: mpa_config(ours.crc),
            timeout: ours.connect_timeout,
            peer_timeout: ours.timeout,
            ..ConnParam::default()
        };
        let left = || deadline.saturating_duration_since(Instant::now());
        // A connection from the wrong address or with the wrong token is
        // refused, and the session keeps waiting for its own peer.
        let req = loop {
            let req = l
                .get_request(Some(left()))
                .map_err(|e| Error::Setup(format!("waiting for the session's connection: {e}")))?;
            if let Some(reason) = refuse(req.peer_addr(), only_from) {
                let _ = req.reject(reason.as_bytes());
                continue;
            }
            if parse_private_data(req.private_data()).map(|p| p.0) != Some(token) {
                tracing::warn!(peer = %req.peer_addr(), "rdma-xfer: refused a connection with a wrong session token");
                let _ = req.reject(b"rdma-xfer: bad session token");
                continue;
            }
            break req;
        };
        req.accept(&s.ctrl_qp, &param)
            .map_err(|e| Error::Setup(e.to_string()))?;
        let (streams, block_size, iodepth) = match s.recv(deadline)? {
            Msg::Hello {
                token: t,
                streams,
                block_size,
                iodepth,
            } if t == token => (streams, block_size, iodepth),
            m => return Err(Error::Protocol(format!("expected Hello, got {m:?}"))),
        };
        let neg = negotiate(ours, streams, block_size, iodepth);
        let session = crate::random_u64();
        let depth = neg.pool_depth();
        let mut qps = Vec::new();
        for _ in 0..neg.streams {
            qps.push(s.data_qp(depth)?);
        }
        let data_msgs = Self::post_data_recvs(&s, &qps, depth)?;
        s.send(
            &Msg::HelloAck {
                session,
                streams: neg.streams,
                block_size: neg.block_size,
                iodepth: neg.iodepth,
            },
            deadline,
        )?;
        let mut done = vec![false; qps.len()];
        while done.iter().any(|d| !d) {
            let req = l
                .get_request(Some(left()))
                .map_err(|e| Error::Setup(format!("waiting for the data streams: {e}")))?;
            if let Some(reason) = refuse(req.peer_addr(), only_from) {
                let _ = req.reject(reason.as_bytes());
                continue;
            }
            match parse_private_data(req.private_data()) {
                Some((id, i)) if id == session && (i as usize) < qps.len() && !done[i as usize] => {
                    req.accept(&qps[i as usize], &param)
                        .map_err(|e| Error::Setup(format!("data stream {i}: {e}")))?;
                    done[i as usize] = true;
                }
                _ => {
                    let _ = req.reject(b"rdma-xfer: unknown session or stream");
                }
            }
        }
        tracing::debug!(
            session = format_args!("{session:016x}"),
            streams = neg.streams,
            block_size = neg.block_size,
            iodepth = neg.iodepth,
            "rdma-xfer session accepted"
        );
        Ok(Self::start(s, qps, data_msgs, neg, session))
    }

    fn post_data_recvs(s: &Setup, qps: &[QueuePair], depth: u32) -> Result<MemoryRegion, Error> {
        let per_qp = data_recv_slots(depth) as usize;
        let slots = qps.len() * per_qp + depth as usize;
        let data_msgs =
            s.pd.reg_mr(slots * DATA_MSG, Access::LOCAL_WRITE)
                .map_err(verbs)?;
        for (i, qp) in qps.iter().enumerate() {
            let wrs: Vec<RecvWr> = (0..per_qp)
                .map(|slot| RecvWr {
                    wr_id: wr_id(K_DATA_RECV, i, slot as u64),
                    sgl: SgList::single(data_msgs.sge((i * per_qp + slot) * DATA_MSG, DATA_MSG)),
                })
                .collect();
            qp.post_recv_list(&wrs)
                .map_err(|e| Error::Setup(format!("posting data receives: {e:?}")))?;
        }
        Ok(data_msgs)
    }

    fn start(
        s: Setup,
        qps: Vec<QueuePair>,
        data_msgs: MemoryRegion,
        cfg: Config,
        session: u64,
    ) -> RdmaSession {
        let depth = cfg.pool_depth();
        let streams = qps.len();
        let (pair_tx, pair_rx) = mpsc::channel();
        let (freed_tx, freed_rx) = mpsc::channel();
        let (fin_tx, fin_rx) = mpsc::channel();
        let (sink_tx, sink_rx) = mpsc::channel();
        // The caller handles completions itself while it waits; the
        // dispatcher thread is woken only while nobody else waits.
        s.cq.set_wake_policy(WakePolicy::Newest);
        let shared = Arc::new(Shared {
            cq: s.cq,
            ctrl_qp: s.ctrl_qp,
            data_qps: qps,
            ctrl_msgs: s.ctrl_msgs,
            data_msgs,
            depth,
            ctrl: Mutex::new(CtrlState {
                // One setup message went each way: one credit spent, one
                // receive reposted but not yet returned.
                credits: CTRL_RECVS - 1,
                unreturned: 1,
                backlog: VecDeque::new(),
                free_slots: (0..CTRL_SLOTS).rev().collect(),
                in_flight: VecDeque::new(),
                unsignaled: 0,
            }),
            pairing: Mutex::new(Pairing::default()),
            dispatch: Mutex::new(Dispatch {
                routes: Routes {
                    pair_tx,
                    freed_tx,
                    fin_tx,
                    sink_tx,
                },
                consumed: vec![Vec::new(); streams],
            }),
            fail: Mutex::new(None),
            failed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        let stashed: Vec<WorkCompletion> = s.stash.into_inner().into();
        let sh = shared.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name("xfer-dispatch".into())
            .spawn(move || dispatcher(&sh, stashed))
        {
            threads.push(t);
        }
        let sh = shared.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name("xfer-sender".into())
            .spawn(move || sender(&sh, &pair_rx))
        {
            threads.push(t);
        }
        if threads.len() < 2 {
            shared.set_fail(Fail::Local("could not start the session threads".into()));
        }
        RdmaSession {
            shared,
            logger: Logger::new(cfg.progress_interval),
            cfg,
            session,
            pd: s.pd,
            src_pool: Vec::new(),
            sink_pool: Vec::new(),
            freed_rx,
            fin_rx,
            sink_rx,
            threads,
            transfer: 0,
        }
    }

    fn pool(&self, remote: bool) -> Result<Vec<MemoryRegion>, Error> {
        let access = if remote {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        (0..self.cfg.pool_depth())
            .map(|_| {
                self.pd
                    .reg_mr(self.cfg.block_size as usize, access)
                    .map_err(|e| Error::Local(std::io::Error::other(e.to_string())))
            })
            .collect()
    }

    /// Wait on `rx` up to the session timeout, watching the failure flag.
    ///
    /// While it waits, the caller takes completions off the CQ itself (the
    /// CQ wakes the newest waiter only, so the dispatcher thread sleeps
    /// meanwhile): the completion that ends the wait costs one wake-up of
    /// this thread instead of one of the dispatcher and another of this
    /// thread. While the caller is busy elsewhere (reading or writing a
    /// block), the dispatcher thread handles the completions.
    fn wait<T>(&self, rx: &Receiver<T>, what: &'static str) -> Result<T, Error> {
        let sh = &*self.shared;
        let start = Instant::now();
        loop {
            sh.check()?;
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            let mut d = lock(&sh.dispatch);
            while let Some(wc) = sh.cq.poll_one() {
                dispatch(sh, &mut d, &wc, false);
            }
            sh.check()?;
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            let waited = start.elapsed();
            if waited >= self.cfg.timeout {
                sh.set_fail(Fail::Timeout(what, waited));
                return Err(sh.check().unwrap_err());
            }
            // Sleep holding the token: the dispatcher thread cannot be
            // halfway through routing an event to us meanwhile.
            let _ = sh
                .cq
                .wait_spin(TICK.min(self.cfg.timeout - waited), Duration::ZERO);
        }
    }

    fn fail_local(&self, e: std::io::Error) -> Error {
        let reason = e.to_string();
        self.shared.ctrl_send(Msg::Abort {
            reason: reason.clone(),
        });
        self.shared.set_fail(Fail::Local(reason));
        Error::Local(e)
    }

    fn send_inner(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        self.shared.check()?;
        if self.src_pool.is_empty() {
            self.src_pool = self.pool(false)?;
        }
        let start = Instant::now();
        let depth = self.cfg.pool_depth();
        self.transfer += 1;
        let transfer = self.transfer;
        // Grants carry their transfer: the pairing stage drops stale ones
        // (set before Begin goes out, so none of this transfer's is early).
        *lock(&self.shared.pairing) = Pairing {
            transfer,
            asked: depth,
            ..Pairing::default()
        };
        self.shared.ctrl_send(Msg::Begin {
            transfer,
            len: src.len_hint(),
            prerequest: depth,
        });
        let mut free: Vec<u32> = (0..depth).rev().collect();
        let mut lens = vec![0u32; depth as usize];
        let (mut seq, mut bytes) = (0u64, 0u64);
        // This thread handles the completions between its short steps (see
        // `poll_completions`); the dispatcher thread only while it reads.
        let sh = self.shared.clone();
        let mut attend = Some(sh.cq.attend());
        loop {
            let idx = match free.pop() {
                Some(i) => i,
                None => {
                    let i = self.wait(&self.freed_rx, "a local block to be sent")?;
                    self.logger.add(u64::from(lens[i as usize]));
                    i
                }
            };
            let mr = &self.src_pool[idx as usize];
            // SAFETY: block `idx` is in no outstanding work request (it is
            // free: never posted, or its BlockDone Send completed, which
            // on one send queue follows its Write), and its region has
            // local access only, so the peer cannot write it either.
            let buf = unsafe { mr.as_mut_slice() };
            // A read may take long (a disk): the dispatcher thread takes
            // over the completions meanwhile.
            self.poll_completions();
            drop(attend.take());
            let n = src.read_block(buf).map_err(|e| self.fail_local(e))?;
            attend = Some(sh.cq.attend());
            if n == 0 {
                free.push(idx);
                break;
            }
            lens[idx as usize] = n as u32;
            self.shared
                .offer(Some((mr.sge(0, n), seq, idx)), None, None);
            self.poll_completions();
            seq += 1;
            bytes += n as u64;
        }
        self.shared.ctrl_send(Msg::End { blocks: seq, bytes });
        let got = self.wait(&self.fin_rx, "the sink to finish")?;
        if got != bytes {
            self.shared.set_fail(Fail::Protocol(format!(
                "sink acknowledged {got} bytes, {bytes} were sent"
            )));
            return Err(self.shared.check().unwrap_err());
        }
        // Collect the remaining Send completions so every block is free for
        // the next transfer.
        while free.len() < depth as usize {
            let i = self.wait(&self.freed_rx, "the last sends to complete")?;
            self.logger.add(u64::from(lens[i as usize]));
            free.push(i);
        }
        Ok(Stats {
            bytes,
            blocks: seq,
            elapsed: start.elapsed(),
        })
    }

    /// Handle the completions waiting in the CQ from this thread, unless
    /// another thread is at it; never blocks for long.
    fn poll_completions(&self) {
        let sh = &*self.shared;
        if sh.cq.is_empty() {
            return;
        }
        if let Ok(mut d) = sh.dispatch.try_lock() {
            while let Some(wc) = sh.cq.poll_one() {
                dispatch(sh, &mut d, &wc, false);
            }
        }
    }

    fn recv_inner(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        self.shared.check()?;
        if self.sink_pool.is_empty() {
            self.sink_pool = self.pool(true)?;
        }
        let depth = self.cfg.pool_depth();
        let bs = self.cfg.block_size;
        let (transfer, len, prerequest) = loop {
            match self.wait(&self.sink_rx, "the source to begin")? {
                SinkEv::Begin {
                    transfer,
                    len,
                    prerequest,
                } => break (transfer, len, prerequest),
                SinkEv::Abort(r) => return Err(Error::PeerAborted(r)),
                ev => tracing::debug!(?ev, "stale event before Begin ignored"),
            }
        };
        let start = Instant::now();
        self.logger.begin(len);
        let mut free: Vec<u32> = (0..depth).rev().collect();
        let mut granted = vec![false; depth as usize];
        let mut pending = prerequest.min(depth);
        let mut batch: Vec<Grant> = Vec::new();
        // Every waiting block holds a granted buffer, and the source numbers
        // blocks in order, so an honest source never gets `depth` blocks
        // ahead of the first missing one.
        let mut reorder: Reorder<(u32, u32)> = Reorder::with_window(u64::from(depth));
        let mut end: Option<(u64, u64)> = None;
        let mut bytes = 0u64;
        let proto = |s: &Shared, m: String| {
            s.ctrl_send(Msg::Abort { reason: m.clone() });
            s.set_fail(Fail::Protocol(m));
            s.check().unwrap_err()
        };
        // As in `send_inner`: this thread handles the completions, the
        // dispatcher thread while it writes.
        let sh = self.shared.clone();
        let mut attend = Some(sh.cq.attend());
        loop {
            // Grant what is free and wanted; send the batch when it is full
            // or when there is nothing else to do.
            while pending > 0 {
                let Some(b) = free.pop() else { break };
                let mr = &self.sink_pool[b as usize];
                granted[b as usize] = true;
                batch.push(Grant {
                    block: b,
                    rkey: mr.rkey(),
                    addr: mr.addr(),
                });
                pending -= 1;
                if batch.len() == MAX_GRANTS {
                    self.shared.ctrl_send(Msg::Grant {
                        transfer,
                        grants: std::mem::take(&mut batch),
                    });
                }
            }
            if let Some((blocks, total)) = end {
                if reorder.delivered() == blocks {
                    if total != bytes {
                        return Err(proto(
                            &self.shared,
                            format!("source announced {total} bytes, {bytes} arrived"),
                        ));
                    }
                    drop(attend.take());
                    sink.finish().map_err(|e| self.fail_local(e))?;
                    self.shared.ctrl_send(Msg::Fin { bytes });
                    return Ok(Stats {
                        bytes,
                        blocks,
                        elapsed: start.elapsed(),
                    });
                }
            }
            self.poll_completions();
            let ev = match self.sink_rx.try_recv() {
                Ok(ev) => ev,
                Err(_) => {
                    if !batch.is_empty() {
                        self.shared.ctrl_send(Msg::Grant {
                            transfer,
                            grants: std::mem::take(&mut batch),
                        });
                    }
                    self.wait(&self.sink_rx, "the next block")?
                }
            };
            match ev {
                SinkEv::Request(n) => pending = (pending + n).min(depth),
                SinkEv::Block { seq, len, block } => {
                    if block >= depth || !granted[block as usize] || len == 0 || len > bs {
                        return Err(proto(
                            &self.shared,
                            format!(
                                "BlockDone for block {block} ({len} bytes) that was not granted"
                            ),
                        ));
                    }
                    granted[block as usize] = false;
                    if let Err(e) = reorder.insert(seq, (block, len)) {
                        return Err(proto(&self.shared, e.to_string()));
                    }
                    while let Some((b, l)) = reorder.pop() {
                        let mr = &self.sink_pool[b as usize];
                        // SAFETY: the source told us (BlockDone, behind its
                        // Write on the same stream) that it is done with
                        // block `b`, and we do not grant it again before the
                        // slice is gone; no local work request names it.
                        let data = unsafe { &mr.as_slice()[..l as usize] };
                        self.poll_completions();
                        drop(attend.take());
                        sink.write_block(data).map_err(|e| self.fail_local(e))?;
                        attend = Some(sh.cq.attend());
                        self.logger.add(u64::from(l));
                        bytes += u64::from(l);
                        free.push(b);
                    }
                }
                SinkEv::End { blocks, bytes } => end = Some((blocks, bytes)),
                SinkEv::Abort(r) => return Err(Error::PeerAborted(r)),
                SinkEv::Begin { .. } => {
                    return Err(proto(&self.shared, "Begin during a transfer".into()))
                }
            }
        }
    }
}

/// What handling completions needs (behind [`Shared::dispatch`]).
struct Dispatch {
    routes: Routes,
    /// Each stream's consumed data receive slots, until a batch is
    /// reposted.
    consumed: Vec<Vec<u32>>,
}

struct Routes {
    /// Block/grant pairs the dispatcher thread found, for the sender.
    pair_tx: Sender<(Filled, Grant)>,
    freed_tx: Sender<u32>,
    fin_tx: Sender<u64>,
    sink_tx: Sender<SinkEv>,
}

/// The completion dispatcher: drains the CQ until the session stops,
/// starting with what setup stashed.
fn dispatcher(sh: &Shared, stashed: Vec<WorkCompletion>) {
    {
        let mut d = lock(&sh.dispatch);
        for wc in stashed {
            dispatch(sh, &mut d, &wc, true);
        }
    }
    while !sh.stop.load(Ordering::Acquire) {
        // No polling phase: completions here come per block, hundreds of
        // microseconds apart in bulk, so a yielding poll before each sleep
        // burned CPU on every wait and rarely saved a sleep.
        if !sh.cq.wait_background(TICK).unwrap_or(false) {
            continue;
        }
        let mut d = lock(&sh.dispatch);
        while let Some(wc) = sh.cq.poll_one() {
            dispatch(sh, &mut d, &wc, true);
        }
    }
}

/// Lock a mutex, ignoring poisoning (a panic elsewhere must not take the
/// session's bookkeeping down with it; failures go through `set_fail`).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handle one completion. `on_dispatcher`: the dispatcher thread runs
/// this (pairs it completes go to the sender thread; a waiting caller
/// posts them itself).
fn dispatch(sh: &Shared, d: &mut Dispatch, wc: &WorkCompletion, on_dispatcher: bool) {
    let Dispatch {
        routes: out,
        consumed,
    } = d;
    let (kind, qp, val) = wr_parts(wc.wr_id);
    if wc.status != WcStatus::Success {
        let why = if wc.status == WcStatus::WrFlushErr {
            "the peer closed the connection or vanished".to_string()
        } else {
            format!("work request failed: {}", wc.status.as_str())
        };
        sh.set_fail(Fail::Disconnected(why));
        return;
    }
    match kind {
        K_CTRL_RECV => {
            let mut buf = vec![0u8; wc.byte_len as usize];
            sh.ctrl_msgs.read_at(val as usize * MSG_BUF, &mut buf);
            if let Err(e) = sh.post_ctrl_recv(val as u32) {
                sh.set_fail(Fail::Disconnected(e.to_string()));
                return;
            }
            match Msg::parse(&buf) {
                Ok((m, credits)) => {
                    sh.on_ctrl_recv(credits);
                    route(sh, out, m, on_dispatcher);
                }
                Err(e) => sh.set_fail(Fail::Protocol(e.to_string())),
            }
        }
        K_CTRL_SEND => sh.on_ctrl_send_done(val as u32),
        K_DATA_RECV => {
            let mut buf = [0u8; DATA_MSG];
            let len = (wc.byte_len as usize).min(DATA_MSG);
            sh.data_msgs
                .read_at(sh.data_recv_off(qp, val as u32), &mut buf[..len]);
            let Some(batch) = consumed.get_mut(qp) else {
                sh.set_fail(Fail::Protocol(format!(
                    "completion for unknown stream {qp}"
                )));
                return;
            };
            batch.push(val as u32);
            if batch.len() >= repost_batch(sh.depth) as usize {
                let r = sh.post_data_recvs(qp, batch);
                batch.clear();
                if let Err(e) = r {
                    sh.set_fail(Fail::Disconnected(e.to_string()));
                    return;
                }
            }
            match Msg::parse(&buf[..len]) {
                Ok((Msg::BlockDone { seq, len, block }, _)) => {
                    let _ = out.sink_tx.send(SinkEv::Block { seq, len, block });
                }
                Ok((m, _)) => sh.set_fail(Fail::Protocol(format!(
                    "unexpected message on a data stream: {m:?}"
                ))),
                Err(e) => sh.set_fail(Fail::Protocol(e.to_string())),
            }
        }
        K_DATA_SEND => {
            let _ = out.freed_tx.send(val as u32);
        }
        _ => {}
    }
}

fn route(sh: &Shared, out: &Routes, m: Msg, on_dispatcher: bool) {
    match m {
        Msg::Grant { transfer, grants } => {
            let via = on_dispatcher.then_some(&out.pair_tx);
            sh.offer(None, Some((transfer, grants)), via);
        }
        Msg::Fin { bytes } => {
            let _ = out.fin_tx.send(bytes);
        }
        Msg::Begin {
            transfer,
            len,
            prerequest,
        } => {
            let _ = out.sink_tx.send(SinkEv::Begin {
                transfer,
                len,
                prerequest,
            });
        }
        Msg::Request { n } => {
            let _ = out.sink_tx.send(SinkEv::Request(n));
        }
        Msg::End { blocks, bytes } => {
            let _ = out.sink_tx.send(SinkEv::End { blocks, bytes });
        }
        Msg::Abort { reason } => {
            let _ = out.sink_tx.send(SinkEv::Abort(reason.clone()));
            sh.set_fail(Fail::PeerAborted(reason));
        }
        Msg::Credit => {}
        m => sh.set_fail(Fail::Protocol(format!("unexpected control message {m:?}"))),
    }
}

/// The sender thread: posts the pairs the dispatcher completed.
fn sender(sh: &Shared, pairs: &Receiver<(Filled, Grant)>) {
    while !sh.stop.load(Ordering::Acquire) {
        match pairs.recv_timeout(TICK) {
            Ok((b, g)) => {
                if !sh.failed.load(Ordering::Acquire) {
                    sh.post_block(b, g);
                }
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

impl Transport for RdmaSession {
    fn send(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        self.logger.begin(src.len_hint());
        let r = self.send_inner(src);
        self.logger.end(r.is_ok());
        r
    }

    fn recv(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        let r = self.recv_inner(sink);
        self.logger.end(r.is_ok());
        r
    }

    fn set_progress(&mut self, cb: Option<ProgressFn>) {
        self.logger.set_callback(cb);
    }

    fn config(&self) -> &Config {
        &self.cfg
    }

    fn mode(&self) -> Mode {
        Mode::Rdma
    }

    fn session_id(&self) -> u64 {
        self.session
    }
}

impl Drop for RdmaSession {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for qp in &self.shared.data_qps {
            qp.disconnect();
        }
        self.shared.ctrl_qp.disconnect();
    }
}
