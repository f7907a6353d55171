//! One rsocket stream connection over the `iwarp` verbs: the thin I/O
//! driver around [`Flow`].
//!
//! A [`Conn`] owns a queue pair, one completion queue for both of its
//! queues, and four registered regions:
//!
//! | region | bytes | rights | what |
//! |---|---|---|---|
//! | `rbuf` | `rbuf_size + 4 * rq_size` | local + remote write | the receive ring the peer RDMA-Writes into, then one 4-byte slot per posted receive (`rs_post_recv`) |
//! | `tsgl` | 32 | local + remote write | the target SGL the peer writes freed ring halves into |
//! | `sbuf` | `sbuf_size` | local | the send ring: one copy in from `write`, RDMA-Written from here |
//! | `ctl` | `16 * sq_size` | local | the 4-byte message words and 16-byte `rs_sge`s of posted Sends and credit Writes, one slot per send work request in posting order |
//!
//! Everything protocol-related is [`Flow`]'s; this file turns its actions
//! into work requests, feeds it completions, and copies between the
//! application's buffers and the rings. All of that happens under one
//! mutex per connection. Threads that must wait sleep on (or, in
//! busy-poll mode, poll) the completion queue itself, in slices so that a
//! close or shutdown from another thread is seen; whoever drains
//! completions (the application thread or the process's progress thread,
//! [`crate::progress`]) updates the readiness descriptor
//! ([`crate::ready`]). There is no condition variable of our own: its
//! notify would cost a futex system call on every drain (std's futex
//! condvar wakes unconditionally) for no waiter.
//!
//! Errors: a peer that breaks the rsockets protocol, or a queue pair that
//! fails (the peer was killed, reset the TCP connection, or sent an RFC
//! 5040 Terminate), ends the stream: reads return what was already
//! delivered, then `ConnectionReset`; writes return `ConnectionReset` at
//! once. A peer that closed in order (`RS_CTRL_DISCONNECT` /
//! `RS_CTRL_SHUTDOWN`) gives end of stream instead.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr,
    QueuePair, RecvWr, SendWr, SgList, WcQueue, WcStatus, WorkCompletion, WrOpcode,
};

use crate::flow::{
    Action, Config, Flow, FlowError, Phase, Region, SendTag, Shutdown, Source, Spans,
    TARGET_SGL_LEN,
};
use crate::options::{Design, Options};
use crate::ready::Readiness;
use crate::tune::RingTuner;
use crate::wire::{ByteOrder, ConnDataRepr, Ctrl, SGE_LEN};

mod iomap;
pub use iomap::IoMap;

/// The longest a blocked call waits on the completion queue before it
/// looks at the stream again (a close or shutdown from another thread).
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Bytes of one `ctl` slot (an `rs_sge`; a message word uses 4 of them).
const CTL_SLOT: usize = SGE_LEN;

thread_local! {
    /// The stream whose completion hook this thread is running (see
    /// [`Conn::on_completions`]).
    static HOOK_CONN: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// Counters of one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `write` calls that moved data.
    pub writes: u64,
    /// Data messages (RDMA Write + `RS_OP_DATA`) put on the wire.
    pub data_msgs: u64,
    /// Writes that joined a held message instead of taking their own.
    pub appended: u64,
    /// Bytes sent by zero copy.
    pub zcopy_bytes: u64,
    /// Bytes written into the peer's mappings by `riowrite` (not part of
    /// the stream, not in `bytes_sent`).
    pub iowrite_bytes: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received (read by the application).
    pub bytes_received: u64,
    /// Credit updates (`RS_OP_SGL`) sent: about one per `rq_size / 2`
    /// messages read, or one per message read between two basic-design
    /// ends (`flow::Config::ack_each`).
    pub credit_updates: u64,
}

/// What a watermark callback is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watermark {
    /// At least the receive watermark is readable, or the stream reached
    /// end of stream or an error (a read returns at once).
    Readable,
    /// At least the send watermark of send buffer is free, or the stream
    /// can no longer be written (a write returns at once).
    Writable,
}

/// A watermark callback (see `Stream::set_watermarks`).
pub type WatermarkFn = Arc<dyn Fn(Watermark) + Send + Sync>;

/// The watermarks and callback of a stream.
#[derive(Default)]
struct Marks {
    cb: Option<WatermarkFn>,
    rcvlowat: u64,
    sndlowat: u32,
    /// Fired, and the condition has not gone false since.
    read_fired: bool,
    write_fired: bool,
    /// To call once the lock is released.
    due: Vec<Watermark>,
}

struct State {
    flow: Flow,
    marks: Marks,
    /// Next `ctl` slot.
    ctl_next: usize,
    /// Data Writes posted and not yet completed (on their way to the wire).
    inflight: u32,
    /// Zero-copy Writes posted and not yet completed.
    zc_inflight: u32,
    /// The SGE of the next [`Source::External`] Write.
    zc_sge: Option<iwarp::Sge>,
    /// Why the stream is broken, once it is.
    broken: Option<(io::ErrorKind, String)>,
    closed: bool,
    /// A keepalive tick passed with no traffic.
    idle: bool,
    /// Completions handled so far (progress, for `close`'s linger).
    completions: u64,
    /// Active side: the peer's first message has not arrived yet (see
    /// [`Conn::first_word`]).
    awaiting_first_word: bool,
    stats: Stats,
    sends: Vec<SendWr>,
    /// Receives to post; between pumps, at most [`RECV_DEFER`] of them
    /// wait here (see [`Conn::pump`]).
    recvs: Vec<RecvWr>,
    /// The private buffer of [`Design::Basic`].
    basic_buf: Vec<u8>,
    /// Receive-ring autotuning ([`crate::tune`]).
    tuner: RingTuner,
    /// The path's RTT at the last measurement.
    rtt: Duration,
    /// Our `riomap` mappings (conn/iomap.rs).
    iomaps: iomap::LocalMaps,
}

/// One connection (see the module docs).
pub(crate) struct Conn {
    id: usize,
    opts: Options,
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    rbuf: MemoryRegion,
    tsgl: MemoryRegion,
    sbuf: MemoryRegion,
    ctl: MemoryRegion,
    /// Where the message slots begin in `rbuf`: after the largest ring
    /// it may grow to ([`crate::tune`]).
    slots_at: u32,
    /// The clock of the ring tuner.
    epoch: Instant,
    sq_size: usize,
    cq_fd: RawFd,
    state: Mutex<State>,
    ready: Readiness,
    /// Threads waiting on the completion queue in a stream call: they
    /// drain it themselves, so the progress thread keeps out meanwhile.
    cq_waiters: AtomicUsize,
    /// Threads inside `read`/`write` (see [`Conn::enter`]).
    in_call: AtomicUsize,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.id)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish()
    }
}

fn verbs_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("iWARP verbs: {e}"))
}

/// Resources made before the connection exists.
pub(crate) struct Parts {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    rbuf: MemoryRegion,
    tsgl: MemoryRegion,
    sbuf: MemoryRegion,
    ctl: MemoryRegion,
    flow: Flow,
    opts: Options,
    /// The largest ring the receive ring may grow to.
    ring_cap: u32,
}

impl Parts {
    /// Makes the queue pair and regions and posts the receives (they must
    /// be posted before the connection exists: the peer may send at once).
    pub(crate) fn new(opts: &Options) -> io::Result<Parts> {
        let mut opts = opts.clone();
        opts.rbuf_size = opts.rbuf_size.max(4096) & !1;
        opts.sbuf_size = opts.sbuf_size.max(4096);
        let ctx = Context::open().map_err(verbs_err)?;
        let pd = ctx.alloc_pd();
        let sq = u32::from(opts.sq_size.max(crate::flow::QP_MIN_SIZE));
        // A credit per message read, to a peer that absorbs them (flow.rs,
        // "The basic design's credit return").
        let ack_each = opts.ack_each;
        // Credits granted; the queue holds more (flow::recv_slots_for).
        let credits = opts
            .rq_size
            .clamp(crate::flow::QP_MIN_SIZE, crate::flow::max_rq_size(ack_each));
        let rq = u32::from(crate::flow::recv_slots_for(credits, ack_each));
        let cq = ctx.create_cq((sq + rq) as usize + 16).map_err(verbs_err)?;
        let mode = if opts.busy_poll {
            ProgressMode::BusyPoll
        } else {
            ProgressMode::Threaded {
                spin: Duration::ZERO,
            }
        };
        cq.set_progress(mode).map_err(verbs_err)?;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: sq,
                max_recv_wr: rq,
            })
            .map_err(verbs_err)?;
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // Registered as large as the ring may grow (crate::tune); the
        // pages beyond the ring in use are never touched, so they cost
        // address space, not memory.
        let limit = opts.rbuf_max.unwrap_or_else(crate::tune::kernel_rmem_max);
        let ring_cap = crate::tune::ring_cap(opts.rbuf_size, limit);
        let rbuf = pd
            .reg_mr(ring_cap as usize + 4 * rq as usize, rw)
            .map_err(verbs_err)?;
        // The target SGL, then our iomap table (conn/iomap.rs).
        let tsgl = pd.reg_mr(iomap::region_len(&opts), rw).map_err(verbs_err)?;
        tsgl.fill(0);
        let sbuf = pd
            .reg_mr(opts.sbuf_size as usize, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        let ctl = pd
            .reg_mr(CTL_SLOT * sq as usize, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        let mut flow = Flow::new(Config {
            sq_size: sq as u16,
            rq_size: credits,
            sbuf_size: opts.sbuf_size,
            rbuf_size: opts.rbuf_size,
            order: ByteOrder::NATIVE,
            target_sgl: Region {
                addr: tsgl.addr(),
                key: tsgl.rkey(),
            },
            rbuf: Region {
                addr: rbuf.addr(),
                key: rbuf.rkey(),
            },
            ack_each,
        })
        .map_err(io::Error::from)?;
        flow.set_iomap_size(iomap::table_entries(&opts))
            .map_err(io::Error::from)?;
        Ok(Parts {
            ctx,
            pd,
            cq,
            qp,
            rbuf,
            tsgl,
            sbuf,
            ctl,
            flow,
            opts,
            ring_cap,
        })
    }

    /// Our `rs_conn_data`, to send as private data.
    pub(crate) fn conn_data(&self) -> [u8; crate::wire::CONN_DATA_LEN] {
        self.flow.local_conn_data().to_bytes()
    }

    pub(crate) fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The connection is up and `peer` is the peer's private data: start
    /// the stream.
    pub(crate) fn establish(self, peer: &[u8], active: bool) -> io::Result<Arc<Conn>> {
        let peer_cd = ConnDataRepr::parse_bytes(peer).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the peer's private data is not an rsockets rs_conn_data ({e}); it is an \
                     iWARP endpoint but not an rsocket"
                ),
            )
        })?;
        let sq_size = self.ctl.len() / CTL_SLOT;
        let slots_at = self.ring_cap;
        let tuner = RingTuner::new(self.opts.rbuf_size, self.ring_cap);
        let cq_fd = self.cq.as_raw_fd();
        let conn = Arc::new(Conn {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            local: self.qp.local_addr(),
            peer: self.qp.peer_addr(),
            opts: self.opts,
            _ctx: self.ctx,
            pd: self.pd,
            cq: self.cq,
            qp: self.qp,
            rbuf: self.rbuf,
            tsgl: self.tsgl,
            sbuf: self.sbuf,
            ctl: self.ctl,
            slots_at,
            epoch: Instant::now(),
            sq_size,
            cq_fd,
            state: Mutex::new(State {
                flow: self.flow,
                marks: Marks::default(),
                ctl_next: 0,
                inflight: 0,
                zc_inflight: 0,
                zc_sge: None,
                broken: None,
                closed: false,
                idle: false,
                completions: 0,
                awaiting_first_word: active,
                stats: Stats::default(),
                sends: Vec::with_capacity(64),
                recvs: Vec::with_capacity(64),
                basic_buf: Vec::new(),
                iomaps: iomap::LocalMaps::default(),
                tuner,
                rtt: Duration::ZERO,
            }),
            ready: Readiness::new()?,
            cq_waiters: AtomicUsize::new(0),
            in_call: AtomicUsize::new(0),
        });
        {
            let mut st = conn.lock();
            let mut t = conn.target();
            let before = t;
            let r = st.flow.establish(&peer_cd, &mut t);
            conn.write_back(&before, &t);
            if let Err(e) = r {
                conn.qp.disconnect();
                return Err(e.into());
            }
            conn.drain(&mut st);
            conn.pump(&mut st);
            conn.refresh(&mut st);
        }
        crate::progress::register(&conn, cq_fd)?;
        let weak = Arc::downgrade(&conn);
        conn.cq
            .set_completion_hook(Some(Arc::new(move || match weak.upgrade() {
                Some(c) => c.on_completions(),
                None => true,
            })));
        Ok(conn)
    }

    /// Posts what the flow queued so far (the initial receives).
    pub(crate) fn post_initial(&mut self) -> io::Result<()> {
        let mut recvs = Vec::new();
        while let Some(a) = self.flow.poll_action() {
            match a {
                Action::PostRecv { slot } => recvs.push(recv_wr(&self.rbuf, self.ring_cap, slot)),
                other => {
                    return Err(io::Error::other(format!(
                        "unexpected action before the connection: {other:?}"
                    )))
                }
            }
        }
        self.qp
            .post_recv_list(&recvs)
            .map_err(|e| verbs_err(format!("{e:?}")))
    }
}

/// Receives a pump may leave for the next one (see [`Conn::pump`]).
const RECV_DEFER: usize = 1;

fn recv_wr(rbuf: &MemoryRegion, slots_at: u32, slot: u16) -> RecvWr {
    RecvWr {
        wr_id: u64::from(slot),
        sgl: SgList::single(rbuf.sge(slots_at as usize + 4 * usize::from(slot), 4)),
    }
}

// wr_id of send work requests: kind in the top byte, value below.
const K_DATA_WRITE: u64 = 1;
const K_ZC_WRITE: u64 = 2;
const K_DATA_MSG: u64 = 3;
const K_SGL_WRITE: u64 = 4;
const K_SGL_MSG: u64 = 5;
const K_CTRL: u64 = 6;
const K_KEEPALIVE: u64 = 7;

fn encode(tag: SendTag) -> u64 {
    let (k, v) = match tag {
        SendTag::DataWrite { len } => (K_DATA_WRITE, u64::from(len)),
        SendTag::ZcopyWrite { len } => (K_ZC_WRITE, u64::from(len)),
        SendTag::DataMsg => (K_DATA_MSG, 0),
        SendTag::SglWrite => (K_SGL_WRITE, 0),
        SendTag::SglMsg => (K_SGL_MSG, 0),
        SendTag::Ctrl(c) => (K_CTRL, u64::from(c.value())),
        SendTag::Keepalive => (K_KEEPALIVE, 0),
    };
    k << 56 | v
}

fn decode(wr_id: u64) -> Option<SendTag> {
    let v = wr_id & ((1 << 56) - 1);
    Some(match wr_id >> 56 {
        K_DATA_WRITE => SendTag::DataWrite { len: v as u32 },
        K_ZC_WRITE => SendTag::ZcopyWrite { len: v as u32 },
        K_DATA_MSG => SendTag::DataMsg,
        K_SGL_WRITE => SendTag::SglWrite,
        K_SGL_MSG => SendTag::SglMsg,
        K_CTRL => SendTag::Ctrl(Ctrl::from_value(v as u32)?),
        K_KEEPALIVE => SendTag::Keepalive,
        _ => return None,
    })
}

fn for_spans(spans: Spans, mut f: impl FnMut(usize, usize)) {
    for s in [Some(spans.first), spans.second].into_iter().flatten() {
        if s.len > 0 {
            f(s.offset as usize, s.len as usize);
        }
    }
}

/// Why a wait ended without progress.
enum Waited {
    Again,
    TimedOut,
}

impl Conn {
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// The readiness descriptor; kept in step from the first call on.
    pub(crate) fn readiness_fd(&self) -> RawFd {
        let fd = self.ready.fd();
        let mut st = self.lock();
        self.refresh(&mut st);
        fd
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The TCP congestion control of the connection (getsockopt
    /// `TCP_CONGESTION` on its TCP socket).
    pub(crate) fn tcp_congestion(&self) -> io::Result<String> {
        cm::tcp_congestion(&self.qp).map_err(cm_err)
    }

    /// Change the TCP congestion control of the live connection.
    pub(crate) fn set_tcp_congestion(&self, cc: &cm::CongestionControl) -> io::Result<()> {
        cm::set_tcp_congestion(&self.qp, cc).map_err(cm_err)
    }

    pub(crate) fn options(&self) -> &Options {
        &self.opts
    }

    pub(crate) fn stats(&self) -> Stats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the target SGL region.
    fn target(&self) -> [u8; TARGET_SGL_LEN] {
        let mut t = [0u8; TARGET_SGL_LEN];
        self.tsgl.read_at(0, &mut t);
        t
    }

    /// Writes back the slots the flow changed (only those: the peer may
    /// be writing the other slot meanwhile).
    fn write_back(&self, before: &[u8; TARGET_SGL_LEN], after: &[u8; TARGET_SGL_LEN]) {
        for i in 0..TARGET_SGL_LEN / SGE_LEN {
            let r = i * SGE_LEN..(i + 1) * SGE_LEN;
            if before[r.clone()] != after[r.clone()] {
                self.tsgl.write_at(r.start, &after[r]);
            }
        }
    }

    fn ctl_slot(&self, st: &mut State, bytes: &[u8]) -> iwarp::Sge {
        let off = st.ctl_next * CTL_SLOT;
        st.ctl_next = (st.ctl_next + 1) % self.sq_size;
        self.ctl.write_at(off, bytes);
        self.ctl.sge(off, bytes.len())
    }

    /// Posts every action the flow queued.
    ///
    /// Receives and sends go to different queues, so their relative order
    /// only matters where a credit update grants what the receives make
    /// room for: then the receives are posted first. Otherwise the sends go
    /// first, and a receive queued with no send behind it (the repost for
    /// a message just read) may wait for the next pump, at most
    /// [`RECV_DEFER`] of them: a reader that answers at once (a ping-pong)
    /// then posts it after its answer went to TCP, not on the answer's
    /// way. The peer never notices: this side keeps
    /// [`RQ_EXTRA`](crate::flow::RQ_EXTRA) more receives posted than it
    /// grants.
    fn pump(&self, st: &mut State) {
        st.sends.clear();
        let mut grants = false;
        while let Some(a) = st.flow.poll_action() {
            match a {
                Action::PostRecv { slot } => {
                    let wr = recv_wr(&self.rbuf, self.slots_at, slot);
                    st.recvs.push(wr);
                }
                Action::RdmaWrite {
                    src,
                    remote_addr,
                    rkey,
                    tag,
                } => {
                    let sgl = match src {
                        Source::Sbuf(spans) => {
                            let mut l = SgList::new();
                            for_spans(spans, |o, n| {
                                l.push(self.sbuf.sge(o, n));
                            });
                            st.inflight += 1;
                            st.stats.data_msgs += 1;
                            l
                        }
                        Source::Inline(b) => SgList::single(self.ctl_slot(st, &b)),
                        Source::Empty => SgList::new(),
                        Source::External { .. } => {
                            st.zc_inflight += 1;
                            st.stats.data_msgs += 1;
                            match st.zc_sge.take() {
                                Some(s) => SgList::single(s),
                                None => SgList::new(),
                            }
                        }
                    };
                    grants |= tag == SendTag::SglWrite;
                    st.sends.push(SendWr {
                        wr_id: encode(tag),
                        opcode: WrOpcode::RdmaWrite { remote_addr, rkey },
                        sgl,
                        signaled: true,
                        solicited: false,
                    });
                }
                Action::Send { payload, tag } => {
                    if tag == SendTag::SglMsg {
                        grants = true;
                        st.stats.credit_updates += 1;
                    }
                    let sge = self.ctl_slot(st, &payload);
                    st.sends.push(SendWr {
                        wr_id: encode(tag),
                        opcode: WrOpcode::Send,
                        sgl: SgList::single(sge),
                        signaled: true,
                        solicited: false,
                    });
                }
            }
        }
        if grants {
            self.post_recvs(st);
        }
        if !st.sends.is_empty() {
            if let Err(e) = self.qp.post_send_list(&st.sends) {
                self.broke(
                    st,
                    io::ErrorKind::ConnectionReset,
                    format!("the iWARP connection failed (posting sends: {e:?})"),
                );
            }
            self.post_recvs(st);
        } else if st.recvs.len() > RECV_DEFER {
            self.post_recvs(st);
        }
    }

    /// Posts the queued receives.
    fn post_recvs(&self, st: &mut State) {
        if st.recvs.is_empty() {
            return;
        }
        if let Err(e) = self.qp.post_recv_list(&st.recvs) {
            self.broke(
                st,
                io::ErrorKind::ConnectionReset,
                format!("the iWARP connection failed (posting receives: {e:?})"),
            );
        }
        st.recvs.clear();
    }

    fn broke(&self, st: &mut State, kind: io::ErrorKind, why: String) {
        if st.broken.is_none() {
            tracing::debug!(conn = self.id, %why, "stream broken");
            st.broken = Some((kind, why));
        }
    }

    /// The queue pair failed: the stream is reset unless it had closed in
    /// order.
    fn qp_failed(&self, st: &mut State, status: WcStatus) {
        if st.broken.is_some() {
            return;
        }
        let mut why = format!(
            "the iWARP connection failed ({}): the peer was killed, reset the connection or \
             sent a Terminate",
            status.as_str()
        );
        while let Some(ev) = self.qp.next_event(Duration::ZERO) {
            why.push_str(&format!("; {ev:?}"));
        }
        match st.flow.phase() {
            Phase::Disconnected => {} // closed in order; the flush is the teardown
            _ => self.broke(st, io::ErrorKind::ConnectionReset, why),
        }
    }

    fn complete(&self, st: &mut State, wc: WorkCompletion) {
        st.completions += 1;
        let ok = wc.status == WcStatus::Success;
        match wc.queue {
            WcQueue::Recv => {
                if ok {
                    let slot = (wc.wr_id & 0xffff) as usize;
                    let n = (wc.byte_len as usize).min(4);
                    let mut word = [0u8; 4];
                    self.rbuf
                        .read_at(self.slots_at as usize + 4 * slot, &mut word[..n]);
                    if st.awaiting_first_word {
                        self.first_word(st);
                    }
                    let r = if wc.byte_len as usize != 4 {
                        // Let the flow judge it (a malformed word).
                        st.flow.on_recv(&word[..n])
                    } else {
                        st.flow.on_recv(&word)
                    };
                    if let Err(e) = r {
                        self.flow_failed(st, e);
                    }
                } else {
                    st.flow.on_recv_failed();
                    self.qp_failed(st, wc.status);
                }
            }
            WcQueue::Send => {
                let Some(tag) = decode(wc.wr_id) else {
                    self.broke(
                        st,
                        io::ErrorKind::Other,
                        format!("completion with unknown wr_id {:#x}", wc.wr_id),
                    );
                    return;
                };
                match tag {
                    SendTag::DataWrite { .. } => st.inflight = st.inflight.saturating_sub(1),
                    SendTag::ZcopyWrite { .. } => st.zc_inflight = st.zc_inflight.saturating_sub(1),
                    _ => {}
                }
                if !ok {
                    // First, so the error names the failed connection.
                    self.qp_failed(st, wc.status);
                }
                if let Err(e) = st.flow.on_send_complete(tag, ok) {
                    self.flow_failed(st, e);
                }
            }
        }
    }

    /// The peer's first message arrived on the active side, which always
    /// sent first (its credit update, then maybe data): send one
    /// zero-length RDMA Write (the rsockets keepalive frame) now. A Linux
    /// siw responder can leave FPDUs that arrive while it finishes its
    /// connection setup unread in its socket until more bytes come, and an
    /// rsockets server on siw sends its own credit update unprompted, which
    /// the `iwarp` crate's wake-up nudge takes for an answer (it nudges only
    /// a silent peer): without this, our first FPDUs could wait there for
    /// ever while both sides wait for each other. Bytes from the peer prove
    /// its receive path is installed, so these arrive where it reads them.
    fn first_word(&self, st: &mut State) {
        st.awaiting_first_word = false;
        // Queued now, posted with the other actions of this drain; without
        // a free control slot it is skipped (control words are on the way,
        // and they wake the peer's reader the same way).
        let _ = st.flow.keepalive();
    }

    fn flow_failed(&self, st: &mut State, e: FlowError) {
        let kind = match e {
            FlowError::SendFailed => io::ErrorKind::ConnectionReset,
            other => other.kind(),
        };
        let why = e.to_string();
        self.broke(st, kind, why);
        if let FlowError::Protocol(_) = e {
            // The peer broke the protocol: tear the connection down now
            // (it may keep writing into our ring).
            self.qp.disconnect();
        }
    }

    /// Feeds every queued completion to the flow, posts what follows,
    /// updates readiness and wakes waiters. Returns whether anything came.
    fn drain(&self, st: &mut State) -> bool {
        let mut any = false;
        while let Some(wc) = self.cq.poll_one() {
            any = true;
            self.complete(st, wc);
        }
        if any {
            self.iomap_progress(st);
            self.push_buffered(st);
            self.pump(st);
            self.refresh(st);
        }
        any
    }

    /// Whether buffered bytes should go now: the wire is idle (no data
    /// Write of ours waits to be handed to TCP), or a full message is
    /// ready. Otherwise they wait for the Write ahead of them and later
    /// writes join them.
    fn should_push(st: &State) -> bool {
        st.inflight == 0 || st.flow.buffered() >= crate::flow::MAX_TRANSFER
    }

    /// Sends buffered bytes if [`Conn::should_push`] says so.
    fn push_buffered(&self, st: &mut State) {
        if st.flow.buffered() > 0 && Self::should_push(st) {
            let mut t = self.target();
            let before = t;
            st.flow.push(&mut t);
            self.write_back(&before, &t);
        }
    }

    /// Updates the readiness descriptor from the state.
    fn refresh(&self, st: &mut State) {
        let readable = st.flow.poll_readable() || st.broken.is_some();
        let writable = st.broken.is_some() || !st.flow.is_writable() || self.can_write(st);
        self.ready.show(readable, writable);
        if st.marks.cb.is_some() {
            let r = st.broken.is_some()
                || !st.flow.is_readable()
                || (st.flow.bytes_queued() >= st.marks.rcvlowat.max(1));
            let w = st.broken.is_some()
                || !st.flow.is_writable()
                || (st.flow.send_space() >= st.marks.sndlowat.max(1) && self.can_write(st));
            if r && !st.marks.read_fired {
                st.marks.read_fired = true;
                st.marks.due.push(Watermark::Readable);
            }
            st.marks.read_fired &= r;
            if w && !st.marks.write_fired {
                st.marks.write_fired = true;
                st.marks.due.push(Watermark::Writable);
            }
            st.marks.write_fired &= w;
        }
    }

    /// Releases the lock, then runs the watermark callbacks that became
    /// due (never under the lock: a callback may read or write).
    fn unlock_and_notify(&self, mut st: MutexGuard<'_, State>) {
        if st.marks.due.is_empty() {
            return;
        }
        let due = std::mem::take(&mut st.marks.due);
        let cb = st.marks.cb.clone();
        drop(st);
        if let Some(cb) = cb {
            for ev in due {
                cb(ev);
            }
        }
    }

    /// Sets the watermark callback: `cb(Readable)` when at least
    /// `rcvlowat` bytes are readable (or end of stream / error),
    /// `cb(Writable)` when at least `sndlowat` bytes of send buffer are
    /// free (or writes would fail). Each fires once per crossing: again
    /// only after its condition went false (data read, buffer filled). It
    /// runs on the progress thread or on a thread inside a stream call,
    /// never with the stream locked.
    pub(crate) fn set_watermarks(&self, rcvlowat: u64, sndlowat: u32, cb: Option<WatermarkFn>) {
        let mut st = self.lock();
        st.marks = Marks {
            cb,
            rcvlowat,
            sndlowat,
            ..Marks::default()
        };
        self.drain(&mut st);
        self.refresh(&mut st);
        self.unlock_and_notify(st);
    }

    /// The progress thread's entry: drain, unless a thread waits on the
    /// completion queue in a stream call (it is woken by the same
    /// completion and drains it itself).
    pub(crate) fn progress(&self) {
        let busy = || {
            self.cq_waiters.load(Ordering::Acquire) > 0 || self.in_call.load(Ordering::Acquire) > 0
        };
        if busy() {
            return;
        }
        let mut st = self.lock();
        // Again under the lock: a thread that started waiting meanwhile
        // (it registers before it releases the lock) drains it itself.
        if busy() {
            return;
        }
        self.drain(&mut st);
        self.unlock_and_notify(st);
    }

    /// The completion hook (`CompletionQueue::set_completion_hook`): the
    /// provider thread that queued completions (the receive thread, the
    /// transmit thread, or the rdma-core provider's pump) feeds them to the
    /// flow and updates readiness itself, so a program blocked in `poll`
    /// on the readiness descriptor is woken by that thread directly rather
    /// than through the progress thread (one thread hand-off less per
    /// message). Declines (returns false, and the CQ descriptor wakes the
    /// progress thread as before) when the stream is locked by someone
    /// else or has watermark callbacks, which must not run on the
    /// provider's threads. Never blocks.
    pub(crate) fn on_completions(&self) -> bool {
        if HOOK_CONN.with(|h| h.get()) == Some(self.id) {
            // Completions of what this very drain posted: the loop below
            // looks again.
            return true;
        }
        let busy = || {
            self.cq_waiters.load(Ordering::Acquire) > 0 || self.in_call.load(Ordering::Acquire) > 0
        };
        if busy() {
            // A thread in a stream call drains before it leaves (and
            // `leave` hands what came after its drain to the descriptor).
            return true;
        }
        let mut st = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        if st.marks.cb.is_some() || busy() {
            return busy();
        }
        HOOK_CONN.with(|h| h.set(Some(self.id)));
        let mut done = false;
        for _ in 0..16 {
            if !self.drain(&mut st) {
                done = true;
                break;
            }
        }
        HOOK_CONN.with(|h| h.set(None));
        done
    }

    /// The progress thread's keepalive tick.
    pub(crate) fn tick(&self) {
        if !self.opts.keepalive {
            return;
        }
        let mut st = self.lock();
        if st.idle && st.broken.is_none() && st.flow.keepalive() {
            self.pump(&mut st);
        }
        st.idle = true;
    }

    /// Waits for progress until `deadline` (None: forever); the lock is
    /// released meanwhile.
    fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, Waited) {
        let left = match deadline {
            Some(d) => {
                let l = d.saturating_duration_since(Instant::now());
                if l.is_zero() {
                    return (st, Waited::TimedOut);
                }
                l
            }
            None => Duration::from_secs(3600),
        };
        // Wait on the completion queue itself, so that the receive thread
        // that queues the next completion wakes this thread directly (one
        // hand-over, as for a TCP reader); the progress thread keeps out
        // while anyone waits here (see `progress`). In busy-poll mode the
        // CQ's `wait` does the receive work itself. The wait is sliced so
        // that a local close or shutdown from another thread is seen too.
        self.cq_waiters.fetch_add(1, Ordering::AcqRel);
        drop(st);
        let _ = self.cq.wait(left.min(WAIT_SLICE));
        st = self.lock();
        self.cq_waiters.fetch_sub(1, Ordering::AcqRel);
        self.drain(&mut st);
        (st, Waited::Again)
    }

    fn check_broken(st: &State) -> io::Result<()> {
        match &st.broken {
            Some((k, why)) => Err(io::Error::new(*k, why.clone())),
            None => Ok(()),
        }
    }

    /// A thread starts a stream call: the first one pauses the CQ
    /// descriptor's updates (`CompletionQueue::set_fd_updates`), so the
    /// progress thread is not woken for completions this thread handles
    /// itself (on two cores those wake-ups cost a busy-polled ping-pong
    /// most of its time); the progress thread keeps out meanwhile. The
    /// returned [`Call`] keeps the state locked for the call's work and
    /// ends the call when dropped.
    pub(crate) fn begin(&self) -> Call<'_> {
        let st = self.lock();
        if self.in_call.fetch_add(1, Ordering::AcqRel) == 0 {
            self.cq.set_fd_updates(false);
        }
        Call {
            conn: self,
            st: Some(st),
        }
    }

    /// The call is over (`st` locked): handle what completed meanwhile,
    /// and the last one out resumes the descriptor (readable at once if
    /// completions arrived since), then runs due watermark callbacks.
    fn end(&self, mut st: MutexGuard<'_, State>) {
        self.drain(&mut st);
        if self.in_call.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.cq.set_fd_updates(true);
        }
        self.unlock_and_notify(st);
    }

    /// Once per round trip while the ring may still grow: measure what
    /// the application read and the path's RTT, and let the ring grow
    /// toward twice the bandwidth-delay product ([`crate::tune`]).
    fn tune_ring(&self, st: &mut State) {
        if !st.tuner.can_grow() {
            return;
        }
        let now = self.epoch.elapsed();
        if !st.tuner.due(now, st.rtt) {
            return;
        }
        let Ok(Some(rtt)) = cm::path_rtt(&self.qp) else {
            return;
        };
        st.rtt = rtt;
        if let Some(goal) = st.tuner.sample(now, st.stats.bytes_received, rtt) {
            tracing::debug!(stream = self.id, goal, ?rtt, "receive ring goal raised");
            st.flow.set_ring_goal(goal, self.slots_at);
        }
    }

    /// `rrecv`: up to `buf.len()` bytes; 0 at end of stream.
    pub(crate) fn read(
        &self,
        buf: &mut [u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let mut call = self.begin();
        self.read_inner(&mut call, buf, nonblocking, deadline)
    }

    fn read_inner(
        &self,
        call: &mut Call<'_>,
        buf: &mut [u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let max = buf.len().min(u32::MAX as usize) as u32;
        if nonblocking && self.opts.busy_poll {
            // A program that spins on EAGAIN never waits on the CQ, so the
            // receive work (which busy-poll mode leaves to the waiting
            // thread) is done here, with the state unlocked.
            call.unlocked(|| self.cq.progress());
        }
        loop {
            let st = call.st();
            self.drain(st);
            match st.flow.recv(max) {
                Ok(g) if g.eof => {
                    self.refresh(st);
                    return Ok(0);
                }
                Ok(g) => {
                    let n = g.spans.len() as usize;
                    self.copy_out(st, g.spans, &mut buf[..n]);
                    st.stats.bytes_received += n as u64;
                    st.idle = false;
                    self.tune_ring(st);
                    // The credit update the read made possible.
                    self.pump(st);
                    self.refresh(st);
                    return Ok(n);
                }
                Err(FlowError::WouldBlock) => {
                    Self::check_broken(st)?;
                }
                Err(e) => {
                    Self::check_broken(st)?;
                    return Err(e.into());
                }
            }
            if nonblocking {
                self.refresh(st);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if let Waited::TimedOut = call.wait(deadline) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "read timed out (SO_RCVTIMEO)",
                ));
            }
        }
    }

    fn copy_out(&self, st: &mut State, spans: Spans, dst: &mut [u8]) {
        if self.opts.design == Design::Basic {
            // The basic design's private receive buffer: ring -> private
            // buffer -> user.
            let n = dst.len();
            if st.basic_buf.len() < n {
                st.basic_buf.resize(n, 0);
            }
            let mut done = 0;
            for_spans(spans, |o, len| {
                self.rbuf.read_at(o, &mut st.basic_buf[done..done + len]);
                done += len;
            });
            dst.copy_from_slice(&st.basic_buf[..n]);
            return;
        }
        let mut done = 0;
        for_spans(spans, |o, len| {
            self.rbuf.read_at(o, &mut dst[done..done + len]);
            done += len;
        });
    }

    fn copy_in(&self, st: &mut State, spans: Spans, src: &[u8]) {
        if self.opts.design == Design::Basic {
            let n = src.len();
            if st.basic_buf.len() < n {
                st.basic_buf.resize(n, 0);
            }
            st.basic_buf[..n].copy_from_slice(src);
            let mut done = 0;
            for_spans(spans, |o, len| {
                self.sbuf.write_at(o, &st.basic_buf[done..done + len]);
                done += len;
            });
            return;
        }
        let mut done = 0;
        for_spans(spans, |o, len| {
            self.sbuf.write_at(o, &src[done..done + len]);
            done += len;
        });
    }

    /// `rsend`: blocking streams send everything (or fail); non-blocking
    /// ones send what fits now.
    pub(crate) fn write(
        &self,
        buf: &[u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let mut call = self.begin();
        self.write_inner(&mut call, buf, nonblocking, deadline)
    }

    fn write_inner(
        &self,
        call: &mut Call<'_>,
        buf: &[u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !nonblocking {
            if let Some(t) = self.opts.zcopy() {
                if buf.len() >= t {
                    return call.unlocked(|| self.write_zcopy(buf, deadline));
                }
            }
        }
        let mut done = 0usize;
        // Whether this call did the receive work yet (busy-poll mode).
        let mut progressed = false;
        call.st().stats.writes += 1;
        loop {
            let st = call.st();
            self.drain(st);
            Self::check_broken(st)?;
            let coalesce = self.opts.coalescing();
            while done < buf.len() {
                let want = (buf.len() - done).min(u32::MAX as usize) as u32;
                let mut t = self.target();
                let before = t;
                let r = if coalesce {
                    let push = Self::should_push(st);
                    let waiting = st.flow.buffered();
                    let r = st.flow.send_buffered(want, &mut t, push);
                    if r.is_ok() && waiting > 0 && done == 0 {
                        // This write joined bytes that wait for the wire.
                        st.stats.appended += 1;
                    }
                    r
                } else {
                    st.flow.send(want, &mut t)
                };
                self.write_back(&before, &t);
                match r {
                    Ok(g) => {
                        let n = g.spans.len() as usize;
                        if n == 0 {
                            break;
                        }
                        self.copy_in(st, g.spans, &buf[done..done + n]);
                        done += n;
                    }
                    Err(FlowError::WouldBlock) => break,
                    Err(e) => {
                        if done > 0 {
                            break;
                        }
                        return Err(match e {
                            FlowError::NotWritable => io::Error::new(
                                io::ErrorKind::BrokenPipe,
                                "the stream is shut down for writing (by shutdown or the peer's \
                                 disconnect)",
                            ),
                            other => other.into(),
                        });
                    }
                }
            }
            self.push_buffered(st);
            self.pump(st);
            st.idle = false;
            if done == buf.len() || (nonblocking && done > 0) {
                st.stats.bytes_sent += done as u64;
                self.refresh(st);
                return Ok(done);
            }
            if nonblocking {
                if self.opts.busy_poll && !progressed {
                    // A program that spins on EAGAIN never waits on the CQ,
                    // so the receive work that may return credits (which
                    // busy-poll mode leaves to the waiting thread) is done
                    // here, then the write tries again. Only when blocked: a
                    // write that can go at once must not pay a `recv` first,
                    // which was a system call on every ping-pong reply's
                    // path.
                    progressed = true;
                    call.unlocked(|| self.cq.progress());
                    continue;
                }
                self.refresh(st);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if let Waited::TimedOut = call.wait(deadline) {
                call.st().stats.bytes_sent += done as u64;
                if done > 0 {
                    return Ok(done);
                }
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "write timed out (SO_SNDTIMEO)",
                ));
            }
        }
    }

    /// Zero copy: registers `buf`, RDMA-Writes it straight into the peer's
    /// ring, and returns when every Write from it has completed.
    fn write_zcopy(&self, buf: &[u8], deadline: Option<Instant>) -> io::Result<usize> {
        let mr = crate::sys::register_source(&self.pd, buf).map_err(verbs_err)?;
        let mut st = self.lock();
        st.stats.writes += 1;
        let mut done = 0usize;
        let mut err = None;
        while done < buf.len() {
            self.drain(&mut st);
            if let Err(e) = Self::check_broken(&st) {
                err = Some(e);
                break;
            }
            let want = (buf.len() - done).min(u32::MAX as usize) as u32;
            let mut t = self.target();
            let before = t;
            let r = st.flow.send_zcopy(want, &mut t);
            self.write_back(&before, &t);
            match r {
                Ok(n) => {
                    st.zc_sge = Some(mr.sge(done, n as usize));
                    self.pump(&mut st);
                    done += n as usize;
                }
                Err(FlowError::WouldBlock) => {
                    let (g, w) = self.wait(st, deadline);
                    st = g;
                    if let Waited::TimedOut = w {
                        err = Some(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            "write timed out (SO_SNDTIMEO)",
                        ));
                        break;
                    }
                }
                Err(e) => {
                    err = Some(e.into());
                    break;
                }
            }
        }
        // Every Write from `buf` must be done before it is released: wait
        // for their completions (or the flush of a failed connection),
        // without a deadline.
        while st.zc_inflight > 0 {
            self.drain(&mut st);
            if st.zc_inflight == 0 {
                break;
            }
            let (g, _) = self.wait(st, Some(Instant::now() + Duration::from_millis(100)));
            st = g;
        }
        st.stats.zcopy_bytes += done as u64;
        st.stats.bytes_sent += done as u64;
        st.idle = false;
        self.refresh(&mut st);
        drop(st);
        drop(mr);
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Whether a read would not block.
    pub(crate) fn poll_read(&self) -> bool {
        let mut st = self.lock();
        self.drain(&mut st);
        st.flow.poll_readable() || st.broken.is_some()
    }

    /// Whether a write would not block.
    pub(crate) fn poll_write(&self) -> bool {
        let mut st = self.lock();
        self.drain(&mut st);
        st.broken.is_some() || !st.flow.is_writable() || self.can_write(&st)
    }

    fn can_write(&self, st: &State) -> bool {
        if self.opts.coalescing() {
            st.flow.can_buffer()
        } else {
            st.flow.can_send(&self.target())
        }
    }

    /// Bytes that can be read now.
    pub(crate) fn bytes_readable(&self) -> u64 {
        let mut st = self.lock();
        self.drain(&mut st);
        st.flow.bytes_queued()
    }

    /// `rshutdown`.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut st = self.lock();
        self.drain(&mut st);
        if st.flow.phase() == Phase::Connected {
            st.flow.shutdown(how).map_err(io::Error::from)?;
            self.pump(&mut st);
        }
        self.refresh(&mut st);
        Ok(())
    }

    /// `rclose`: disconnect message, linger (bounded), tear down.
    pub(crate) fn close(&self) {
        {
            let mut st = self.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            self.drain(&mut st);
            if st.flow.phase() == Phase::Connected && st.broken.is_none() {
                let _ = st.flow.shutdown(Shutdown::Both);
                self.pump(&mut st);
            }
            // Linger while the data still queued keeps moving: give up
            // after `linger` without progress (a peer that stopped reading;
            // a dead peer resets the stream at once).
            let mut deadline = Instant::now() + self.opts.linger;
            while !st.flow.all_sends_done() && st.broken.is_none() {
                let seen = st.completions;
                let (g, w) = self.wait(st, Some(deadline));
                st = g;
                self.drain(&mut st);
                // Progress counts even when it is noticed only after the
                // deadline (a wake-up late on a loaded machine): the wait
                // timed out, but the peer did take data, so linger on.
                if st.completions != seen {
                    deadline = Instant::now() + self.opts.linger;
                } else if let Waited::TimedOut = w {
                    if !st.flow.all_sends_done() {
                        tracing::debug!(
                            conn = self.id,
                            buffered = st.flow.buffered(),
                            "close: the peer took nothing for the linger time; dropping what is queued"
                        );
                    }
                    break;
                }
            }
        }
        crate::progress::deregister(self.id, self.cq_fd);
        self.cq.set_completion_hook(None);
        self.qp.disconnect();
        self.iomap_close();
        let mut st = self.lock();
        self.broke(
            &mut st,
            io::ErrorKind::NotConnected,
            "the stream is closed".into(),
        );
        self.refresh(&mut st);
    }
}

/// Connects to an rsockets listener at `addr`.
/// A stream call in progress, from [`Conn::begin`] to its drop
/// ([`Conn::end`]). It holds the state lock for the call's work, except
/// while the call waits or does receive work (then the lock is taken again
/// when next needed), and ends the call with the lock it holds: one lock
/// round trip for a call that neither waits nor polls, where separate
/// enter and leave steps took three.
pub(crate) struct Call<'a> {
    conn: &'a Conn,
    st: Option<MutexGuard<'a, State>>,
}

impl<'a> Call<'a> {
    /// The state, locked again if the call let it go.
    fn st(&mut self) -> &mut MutexGuard<'a, State> {
        let conn = self.conn;
        self.st.get_or_insert_with(|| conn.lock())
    }

    /// Runs `f` with the state unlocked (it may lock it itself).
    pub(crate) fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.st = None;
        f()
    }

    /// [`Conn::wait`] for this call.
    fn wait(&mut self, deadline: Option<Instant>) -> Waited {
        let conn = self.conn;
        let st = self.st.take().unwrap_or_else(|| conn.lock());
        let (st, waited) = conn.wait(st, deadline);
        self.st = Some(st);
        waited
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let conn = self.conn;
        let st = self.st.take().unwrap_or_else(|| conn.lock());
        conn.end(st);
    }
}

pub(crate) fn connect(addr: SocketAddr, opts: &Options) -> io::Result<Arc<Conn>> {
    let mut parts = Parts::new(opts)?;
    parts.post_initial()?;
    let param = ConnParam {
        private_data: parts.conn_data().to_vec(),
        mpa: opts.mpa.clone(),
        timeout: opts.connect_timeout,
        congestion: opts.congestion.clone(),
        ..ConnParam::default()
    };
    let peer = cm::connect(parts.qp(), addr, &param).map_err(cm_err)?;
    parts.establish(&peer, true)
}

/// Accepts a validated request (its private data must be an
/// `rs_conn_data`).
pub(crate) fn accept(req: cm::ConnRequest, opts: &Options) -> io::Result<Arc<Conn>> {
    if let Err(e) = ConnDataRepr::parse_bytes(req.private_data()) {
        let peer = req.peer_addr();
        let _ = req.reject(&[]);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{peer} sent an MPA Request whose private data is not an rsockets rs_conn_data \
                 ({e}): an iWARP client but not an rsocket; rejected"
            ),
        ));
    }
    let peer_pd = req.private_data().to_vec();
    let mut parts = Parts::new(opts)?;
    parts.post_initial()?;
    let param = ConnParam {
        private_data: parts.conn_data().to_vec(),
        mpa: opts.mpa.clone(),
        timeout: opts.connect_timeout,
        congestion: opts.congestion.clone(),
        ..ConnParam::default()
    };
    // rsockets' initiator sends its credit update first thing; wait for it
    // before sending ours (RFC 5044 §7.1.2; Linux siw resets a connection
    // whose Responder sends right behind the MPA Reply).
    let param = ConnParam {
        hold_until_first_fpdu: true,
        ..param
    };
    req.accept(parts.qp(), &param).map_err(cm_err)?;
    parts.establish(&peer_pd, false)
}

/// A connection-manager error as the `io::Error` a socket call returns.
pub(crate) fn cm_err(e: cm::CmError) -> io::Error {
    use cm::CmError as E;
    let kind = match &e {
        E::Refused { .. } => io::ErrorKind::ConnectionRefused,
        E::Timeout { .. } => io::ErrorKind::TimedOut,
        E::Rejected { .. } => io::ErrorKind::ConnectionRefused,
        E::Closed { .. } => io::ErrorKind::ConnectionReset,
        E::Bind { source, .. } => source.kind(),
        E::Connect { source, .. } => source.kind(),
        // The kind of setsockopt(2)'s errno (ENOENT: NotFound, no such
        // algorithm; EPERM: PermissionDenied), with the message that says
        // where to look.
        E::Congestion { source, .. } => source.kind(),
        E::NotConnected => io::ErrorKind::NotConnected,
        E::Unsupported { .. } => io::ErrorKind::Unsupported,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        for tag in [
            SendTag::DataWrite { len: 65536 },
            SendTag::ZcopyWrite { len: u32::MAX },
            SendTag::DataMsg,
            SendTag::SglWrite,
            SendTag::SglMsg,
            SendTag::Ctrl(Ctrl::Disconnect),
            SendTag::Ctrl(Ctrl::Shutdown),
            SendTag::Ctrl(Ctrl::Keepalive),
            SendTag::Keepalive,
        ] {
            assert_eq!(decode(encode(tag)), Some(tag));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(9 << 56), None);
    }
}
