//! Session setup: verbs resources, connecting (or accepting) the control
//! connection and every data stream at once with the session's
//! negotiation in their MPA private data ([`crate::hello`]), and starting
//! the threads.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, Listener};
use iwarp::wait::{CqInterest, Interest, Token, WaitSet};
use iwarp::{
    Access, CompletionQueue, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SgList,
};

use crate::hello::{feature, Admission, Hello, HelloAck, Proposal, Verdict, CONTROL, REQUEST_WAIT};
use crate::msg::MSG_BUF;
use crate::progress::Logger;
use crate::{Config, Error};

use super::base::{
    data_recv_slots, mpa_config, refuse, wr_id, Fail, CTRL_RECVS, CTRL_SIGNAL_EVERY, CTRL_SLOTS,
    DATA_MSG, K_CTRL_RECV, K_DATA_RECV, K_FIRST_FPDU,
};
use super::flow::{CtrlCredits, SourcePairing};
use super::handoff::Handoff;
use super::session::RdmaSession;
use super::shared::{Dispatch, Routes, Shared};
use super::threads::{dispatcher, sender};

/// Verbs resources of a session before the data streams exist.
pub(super) struct Setup {
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) ctrl_qp: QueuePair,
    pub(super) ctrl_msgs: MemoryRegion,
    pub(super) handoff: Arc<Handoff>,
}

pub(super) fn verbs(e: iwarp::Error) -> Error {
    Error::Setup(e.to_string())
}

impl Setup {
    pub(super) fn new(cfg: &Config) -> Result<Setup, Error> {
        let ctx = cfg.open_device()?;
        let pd = ctx.alloc_pd();
        let depth = cfg.pool_depth() as usize;
        let cq = ctx
            .create_cq(
                2 * (CTRL_RECVS + CTRL_SLOTS) as usize + 4 * depth * cfg.streams as usize + 64,
            )
            .map_err(verbs)?;
        // Receive threads do the receive work; `wait` sleeps at once, with
        // no polling phase: completions come per block, hundreds of
        // microseconds apart in bulk, so a yielding poll before each sleep
        // burned CPU on every wait and rarely saved a sleep. Set before
        // any QP connects.
        cq.set_progress(ProgressMode::Threaded {
            spin: Duration::ZERO,
        })
        .map_err(verbs)?;
        // Who is woken for a completion (`handoff`): set before any QP
        // exists, so that what arrives before the threads start rings the
        // dispatcher, which drains it first thing.
        let handoff = Arc::new(Handoff::new().map_err(|e| {
            Error::Setup(format!(
                "creating the session's eventfds: {e} (out of descriptors? raise `ulimit -n`)"
            ))
        })?);
        cq.set_completion_hook(Some(handoff.hook()));
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
            pd,
            cq,
            ctrl_qp,
            ctrl_msgs,
            handoff,
        })
    }

    pub(super) fn data_qp(&self, depth: u32) -> Result<QueuePair, Error> {
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

/// The CM parameter for `cfg.congestion` (checked by `Config::validated`).
fn congestion(cfg: &Config) -> Option<cm::CongestionControl> {
    cfg.congestion
        .as_deref()
        .and_then(|c| cm::CongestionControl::new(c).ok())
}

/// A CM error, with the peer's reason when it refused the connection
/// (the MPA Reject's private data, RFC 5044 §7.1.3).
fn cm_err(what: &str, e: &cm::CmError) -> String {
    match e {
        cm::CmError::Rejected { private_data, .. } if !private_data.is_empty() => format!(
            "{what}: the peer refused it: {}",
            String::from_utf8_lossy(private_data)
        ),
        e => format!("{what}: {e}"),
    }
}

/// The active side's first FPDU on a connection it just established
/// ([`feature::FIRST_FPDU`]): a zero-length RDMA Write, RFC 6581's
/// write-form ready-to-receive message, which every receiver treats as a
/// no-op at RTS (Linux siw's `siw_proc_write`: "zero length WRITE"; this
/// stack's engine likewise). Unsignaled, so it completes silently; if it
/// fails, the connection has failed and the session's first real request
/// says so.
fn first_fpdu(qp: &QueuePair) {
    let _ = qp.post_send(&iwarp::SendWr {
        wr_id: wr_id(K_FIRST_FPDU, 0, 0),
        opcode: iwarp::WrOpcode::RdmaWrite {
            remote_addr: 0,
            rkey: 0,
        },
        sgl: iwarp::SgList::new(),
        signaled: false,
        solicited: false,
    });
}

impl RdmaSession {
    /// The active side (see [`crate::connect`]): the control connection
    /// and every data stream connect at once, each with the whole proposal
    /// in its MPA Request ([`crate::hello`]); the grant comes back in the
    /// control connection's MPA Reply. Two round trips (TCP, MPA) in all.
    pub fn connect(addr: SocketAddr, token: u64, cfg: &Config) -> Result<RdmaSession, Error> {
        let deadline = Instant::now() + cfg.connect_timeout;
        let s = Setup::new(cfg)?;
        let proposal = Proposal::of(cfg);
        // Offered FIRST_FPDU: every connection sends first (`first_fpdu`).
        let first = cfg.features & feature::FIRST_FPDU != 0;
        let param = |index: u32| ConnParam {
            private_data: Hello {
                token,
                index,
                proposal,
                features: cfg.features & feature::ALL,
            }
            .emit(),
            mpa: mpa_config(cfg.crc),
            timeout: cfg.connect_timeout,
            // A peer silent this long while it owes Read Responses is gone.
            peer_timeout: cfg.timeout,
            congestion: congestion(cfg),
            ..ConnParam::default()
        };
        // The data QPs are sized for the proposal (the grant is at most
        // that); their receives are posted once the grant is known, before
        // the session starts: the peer sends on a data QP only a
        // `BlockDone` for a block we granted, so never before then.
        let (tx, rx) = mpsc::channel();
        for i in 0..cfg.streams {
            let qp = s.data_qp(cfg.pool_depth())?;
            let (tx, p) = (tx.clone(), param(i));
            // The CM's connect blocks for its round trips: one thread per
            // stream. A stream the passive side does not grant is refused
            // (or, once the session is complete, left to the listener), and
            // its thread ends then or at `connect_timeout`: nobody waits
            // for it.
            std::thread::Builder::new()
                .name(format!("xfer-connect-{i}"))
                .spawn(move || {
                    let r = cm::connect(&qp, addr, &p);
                    if r.is_ok() && first {
                        first_fpdu(&qp);
                    }
                    let _ = tx.send((i, qp, r));
                })
                .map_err(|e| Error::Setup(format!("starting a connect thread: {e}")))?;
        }
        drop(tx);
        let ack = cm::connect(&s.ctrl_qp, addr, &param(CONTROL))
            .map_err(|e| Error::Setup(cm_err("the control connection", &e)))?;
        if first {
            first_fpdu(&s.ctrl_qp);
        }
        let ack = HelloAck::parse(&ack)
            .map_err(|e| Error::Protocol(format!("the control connection's MPA Reply: {e}")))?;
        let neg = ack.apply(cfg).map_err(Error::Protocol)?;
        let session = ack.session;
        let mut qps: Vec<Option<QueuePair>> = (0..neg.streams).map(|_| None).collect();
        while qps.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let (i, qp, r) = rx.recv_timeout(left).map_err(|_| Error::Timeout {
                waiting_for: "the data streams to connect",
                after: cfg.connect_timeout,
            })?;
            if i >= neg.streams {
                // Not granted: dropped (disconnected if it got through).
                continue;
            }
            r.map_err(|e| Error::Setup(cm_err(&format!("data stream {i}"), &e)))?;
            qps[i as usize] = Some(qp);
        }
        let qps: Vec<QueuePair> = qps.into_iter().flatten().collect();
        let data_msgs = Self::post_data_recvs(&s, &qps, neg.pool_depth())?;
        tracing::debug!(%addr, session = format_args!("{session:016x}"), streams = neg.streams, block_size = neg.block_size, iodepth = neg.iodepth, features = neg.features, "rdma-xfer session connected");
        Ok(Self::start(s, qps, data_msgs, neg, session))
    }

    /// The passive side (see [`crate::XferListener::accept`]): connections
    /// in any order, matched by token and index ([`Admission`]); anything
    /// else is refused with the reason in the MPA Reject, and the session
    /// goes on waiting for its own connections until `timeout`.
    pub(crate) fn accept(
        l: &Listener,
        token: u64,
        ours: &Config,
        only_from: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<RdmaSession, Error> {
        let deadline = Instant::now() + timeout;
        let s = Setup::new(ours)?;
        let param = |private_data: Vec<u8>, hold_until_first_fpdu: bool| ConnParam {
            private_data,
            hold_until_first_fpdu,
            mpa: mpa_config(ours.crc),
            timeout: ours.connect_timeout,
            peer_timeout: ours.timeout,
            congestion: congestion(ours),
            ..ConnParam::default()
        };
        let session = crate::random_u64();
        let mut adm = Admission::new(token, ours, true, session);
        // The data QPs and their receives, made when the first connection
        // of the session fixes the grant.
        let mut data: Option<(Vec<QueuePair>, MemoryRegion)> = None;
        while !adm.complete() {
            let left = deadline.saturating_duration_since(Instant::now());
            let req = match l.get_request(Some(left.min(REQUEST_WAIT))) {
                Ok(r) => r,
                Err(e) if Instant::now() >= deadline => {
                    let what = if adm.granted().is_none() {
                        "waiting for the session's connection"
                    } else {
                        "waiting for the data streams"
                    };
                    let (got, of) = adm.admitted();
                    return Err(Error::Setup(format!(
                        "{what} ({got} of {of} streams connected): {e}"
                    )));
                }
                Err(e) => {
                    // A connection that sent no (or a malformed) MPA
                    // Request: the CM closed it; keep waiting for ours.
                    tracing::debug!(%e, "rdma-xfer: a connection attempt failed during setup");
                    continue;
                }
            };
            if let Some(reason) = refuse(req.peer_addr(), only_from) {
                let _ = req.reject(reason.as_bytes());
                continue;
            }
            let verdict = adm.admit(req.private_data());
            // An active side that sends first is waited for (FIRST_FPDU).
            let hold = Hello::parse(req.private_data())
                .is_ok_and(|h| h.features & ours.features & feature::FIRST_FPDU != 0);
            if let Verdict::Refuse(reason) = &verdict {
                tracing::warn!(peer = %req.peer_addr(), %reason, "rdma-xfer: refused a connection during session setup");
                let _ = req.reject(crate::hello::clip(reason).as_bytes());
                continue;
            }
            let neg = adm
                .granted()
                .expect("an admitted connection fixed the grant");
            if data.is_none() {
                let depth = neg.pool_depth();
                let qps = (0..neg.streams)
                    .map(|_| s.data_qp(depth))
                    .collect::<Result<Vec<_>, _>>()?;
                let msgs = Self::post_data_recvs(&s, &qps, depth)?;
                data = Some((qps, msgs));
            }
            let qps = &data.as_ref().expect("made above").0;
            match verdict {
                Verdict::Control => {
                    let ack = adm.ack().expect("granted").emit();
                    req.accept(&s.ctrl_qp, &param(ack, hold))
                        .map_err(|e| Error::Setup(format!("the control connection: {e}")))?;
                }
                Verdict::Stream(i) => req
                    .accept(&qps[i as usize], &param(Vec::new(), hold))
                    .map_err(|e| Error::Setup(format!("data stream {i}: {e}")))?,
                Verdict::Refuse(_) => unreachable!("handled above"),
            }
        }
        let mut neg = adm.granted().expect("complete").clone();
        // What both sides have: the control connection's Hello decided.
        neg.features = adm.ack().expect("complete").features;
        let (qps, data_msgs) = data.expect("complete");
        tracing::debug!(
            session = format_args!("{session:016x}"),
            streams = neg.streams,
            block_size = neg.block_size,
            iodepth = neg.iodepth,
            features = neg.features,
            "rdma-xfer session accepted"
        );
        Ok(Self::start(s, qps, data_msgs, neg, session))
    }

    pub(super) fn post_data_recvs(
        s: &Setup,
        qps: &[QueuePair],
        depth: u32,
    ) -> Result<MemoryRegion, Error> {
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

    pub(super) fn start(
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
        // The caller's wait (`RdmaSession::wait`): the CQ, and its bell for
        // a failure another thread sets.
        let mut waits = WaitSet::new();
        waits.add_cq(&s.cq, CqInterest::Completions, Token(0));
        waits.add_fd(s.handoff.caller.fd(), Interest::READABLE, Token(1));
        let shared = Arc::new(Shared {
            cq: s.cq,
            ctrl_qp: s.ctrl_qp,
            data_qps: qps,
            ctrl_msgs: s.ctrl_msgs,
            data_msgs,
            depth,
            queued: (0..streams).map(|_| AtomicU32::new(0)).collect(),
            ctrl: Mutex::new(CtrlCredits::new(CTRL_RECVS, CTRL_SLOTS, CTRL_SIGNAL_EVERY)),
            pairing: Mutex::new(SourcePairing::new(depth)),
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
            awaiting_fin: AtomicBool::new(false),
            handoff: s.handoff,
        });
        let mut threads = Vec::new();
        let sh = shared.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name("xfer-dispatch".into())
            .spawn(move || dispatcher(&sh))
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
            waits: Mutex::new(waits),
            threads,
            transfer: 0,
            received: 0,
            pre: None,
            unconfirmed: None,
        }
    }

    /// One of the source's staging blocks: local access only, the peer
    /// cannot touch it. Made as a transfer first needs it (`send_inner`).
    pub(super) fn src_block(&self) -> Result<MemoryRegion, std::io::Error> {
        self.pd
            .reg_mr(self.cfg.block_size as usize, Access::LOCAL_WRITE)
            .map_err(|e| std::io::Error::other(format!("registering a source block: {e}")))
    }

    /// The sink's landing blocks, unregistered until granted.
    pub(super) fn sink_pool(&self) -> Result<Vec<super::sink::SinkBlock>, Error> {
        (0..self.cfg.pool_depth())
            .map(|_| super::sink::SinkBlock::new(self.cfg.block_size as usize))
            .collect()
    }
}
