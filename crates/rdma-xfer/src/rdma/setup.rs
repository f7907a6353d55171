//! Session setup: verbs resources, the Hello/HelloAck exchange, the data
//! streams' connections, and starting the threads.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, Listener};
use iwarp::{
    Access, CompletionQueue, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, WakePolicy, WcStatus, WorkCompletion, WrOpcode,
};

use crate::msg::{Msg, MSG_BUF};
use crate::progress::Logger;
use crate::{negotiate, Config, Error};

use super::*;

/// Verbs resources of a session before the data streams exist.
pub(super) struct Setup {
    /// Completions that arrived while waiting for another kind.
    pub(super) stash: std::cell::RefCell<VecDeque<WorkCompletion>>,
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) ctrl_qp: QueuePair,
    pub(super) ctrl_msgs: MemoryRegion,
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
    pub(super) fn send(&self, msg: &Msg, deadline: Instant) -> Result<(), Error> {
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
    pub(super) fn recv(&self, deadline: Instant) -> Result<Msg, Error> {
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
    pub(super) fn wait(
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

pub(super) fn private_data(id: u64, index: u32) -> Vec<u8> {
    let mut v = PD_MAGIC.to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(&index.to_be_bytes());
    v
}

pub(super) fn parse_private_data(pd: &[u8]) -> Option<(u64, u32)> {
    if pd.len() < 16 || &pd[..4] != PD_MAGIC {
        return None;
    }
    let id = u64::from_be_bytes(pd[4..12].try_into().ok()?);
    let index = u32::from_be_bytes(pd[12..16].try_into().ok()?);
    Some((id, index))
}

/// The CM parameter for `cfg.congestion` (checked by `Config::validated`).
fn congestion(cfg: &Config) -> Option<cm::CongestionControl> {
    cfg.congestion
        .as_deref()
        .and_then(|c| cm::CongestionControl::new(c).ok())
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
            congestion: congestion(cfg),
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
            congestion: congestion(ours),
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
            ctrl: Mutex::new(CtrlCredits::after_setup(
                CTRL_RECVS,
                CTRL_SLOTS,
                CTRL_SIGNAL_EVERY,
            )),
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

    /// The source's staging blocks: local access only, the peer cannot
    /// touch them.
    pub(super) fn src_pool(&self) -> Result<Vec<MemoryRegion>, Error> {
        (0..self.cfg.pool_depth())
            .map(|_| {
                self.pd
                    .reg_mr(self.cfg.block_size as usize, Access::LOCAL_WRITE)
                    .map_err(|e| Error::Local(std::io::Error::other(e.to_string())))
            })
            .collect()
    }

    /// The sink's landing blocks, unregistered until granted.
    pub(super) fn sink_pool(&self) -> Result<Vec<super::sink::SinkBlock>, Error> {
        (0..self.cfg.pool_depth())
            .map(|_| super::sink::SinkBlock::new(self.cfg.block_size as usize))
            .collect()
    }
}
