//! Making a stream: the queue pair, completion queue and regions before
//! the connection exists ([`Parts`]), the connection manager's connect
//! and accept, and the stream started once the peer's `rs_conn_data`
//! arrived (RFC 5044 §7.1 private data).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr,
    QueuePair,
};

use crate::flow::{Action, Config, Flow, Region};
use crate::options::Options;
use crate::ready::Readiness;
use crate::tune::RingTuner;
use crate::wire::{ByteOrder, ConnDataRepr};

use super::maps::LocalMaps;
use super::types::{cm_err, recv_wr, verbs_err, Conn, Marks, State, Stats, CTL_SLOT, NEXT_ID};

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
        let tsgl = pd
            .reg_mr(super::maps::region_len(&opts), rw)
            .map_err(verbs_err)?;
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
        flow.set_iomap_size(super::maps::table_entries(&opts))
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
                iomaps: LocalMaps::default(),
                tuner,
                rtt: Duration::ZERO,
            }),
            ready: Readiness::new()?,
            cq_waiters: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
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

/// Connects to an rsockets listener at `addr`.
pub(crate) fn connect(addr: SocketAddr, opts: &Options) -> io::Result<Arc<Conn>> {
    let mut parts = Parts::new(opts)?;
    parts.post_initial()?;
    let param = ConnParam {
        private_data: parts.conn_data().to_vec(),
        mpa: opts.mpa.clone(),
        timeout: opts.connect_timeout,
        tcp_connect: opts.tcp_connect,
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
