//! Setup: one connection (QP) and its buffers, one side of a run, connect and accept.

use std::net::SocketAddr;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use iwarp::cm::{self, ConnParam, ConnRequest, Listener};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, WcStatus, WorkCompletion, WrOpcode,
};
use iwarp_proto::handshake::MpaConfig;

use crate::params::{self, Params, Remote, Request, Test};
use crate::pattern::{self};

use super::layout::{
    ctrl_len, data_slots, recv_layout, rq_depth, split_wrid, wrid, Role, CREDIT_OFF, CTRL_LEN,
    CTRL_MSG, K_CREDIT, K_CTRL, K_DATA, K_HELLO, K_RECV, MSG_OFF, SQ_EXTRA, STAGE_OFF, STAGE_SLOTS,
};
use super::wait::{check_wc, empty_wc, progress_mode};

/// One connection (QP) and its buffers.
pub(super) struct Conn {
    pub(super) idx: u32,
    pub(super) qp: QueuePair,
    pub(super) data: MemoryRegion,
    pub(super) ctrl: MemoryRegion,
    pub(super) recv: MemoryRegion,
    pub(super) recv_slot: usize,
    pub(super) recv_slots: usize,
    pub(super) remote: Remote,
    /// Receives posted so far.
    pub(super) recv_posted: u64,
    /// Credit Writes posted / completed.
    pub(super) stage_posted: u64,
    pub(super) stage_done: u64,
    /// Last credit value written to the peer.
    pub(super) granted: u64,
    /// Control messages posted / completed.
    pub(super) ctrl_posted: u64,
    pub(super) ctrl_done: u64,
    /// Bytes of this run's control messages ([`ctrl_len`]).
    ctrl_len: usize,
}

impl Conn {
    pub(super) fn new(
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
            ctrl_len: ctrl_len(p.size),
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

    pub(super) fn local(&self) -> Remote {
        Remote {
            data_addr: self.data.addr(),
            data_len: self.data.len() as u64,
            data_rkey: self.data.rkey(),
            ctrl_addr: self.ctrl.addr(),
            ctrl_rkey: self.ctrl.rkey(),
        }
    }

    pub(super) fn post_recv(&mut self) -> Result<(), String> {
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
    pub(super) fn recv_bytes(&self, seq: u64, len: usize, out: &mut Vec<u8>) {
        let slot = (seq % self.recv_slots as u64) as usize;
        out.resize(len.min(self.recv_slot), 0);
        self.recv.read_at(slot * self.recv_slot, out);
    }

    /// Credit the peer granted us (its count of receives posted, or of
    /// messages verified plus slots), at least `initial`.
    pub(super) fn credit(&self, initial: u64) -> u64 {
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
    pub(super) fn grant(&mut self, v: u64, step: u64, force: bool) -> Result<bool, String> {
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
    pub(super) fn send_ctrl(&mut self, kind: u64, count: u64, sum: u64) -> Result<(), String> {
        let off = MSG_OFF + (self.ctrl_posted % 4) as usize * CTRL_MSG;
        let mut b = [0u8; CTRL_MSG];
        b[0..8].copy_from_slice(&kind.to_le_bytes());
        b[8..16].copy_from_slice(&count.to_le_bytes());
        b[16..24].copy_from_slice(&sum.to_le_bytes());
        self.ctrl.write_at(off, &b);
        // Sent with the Solicited Event flag as well, though the receiver
        // goes by the length (`ctrl_len`), which every device reports.
        self.qp
            .post_send(&SendWr {
                wr_id: wrid(K_CTRL, self.idx, self.ctrl_posted),
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctrl.sge(off, self.ctrl_len)),
                signaled: true,
                solicited: true,
            })
            .map_err(|e| format!("QP {}: posting a control message: {e}", self.idx))?;
        self.ctrl_posted += 1;
        Ok(())
    }

    /// Read the message buffer's byte `off` (polled while the peer writes
    /// it; the fence keeps the compiler from caching it).
    pub(super) fn peek_data(&self, off: usize) -> u8 {
        let mut b = [0u8; 1];
        fence(Ordering::SeqCst);
        self.data.read_at(off, &mut b);
        b[0]
    }
}

/// One end of a run: device, CQs and the connections.
pub struct Side {
    pub(super) _ctx: Context,
    pub(super) p: Params,
    pub(super) scq: CompletionQueue,
    pub(super) rcq: CompletionQueue,
    pub(super) conns: Vec<Conn>,
    pub(super) wcs: Vec<WorkCompletion>,
    pub(super) scratch: Vec<u8>,
}

impl Side {
    pub(super) fn new(p: &Params) -> Result<(Side, ProtectionDomain), String> {
        let ctx = crate::device::open_context()?;
        let pd = ctx.alloc_pd();
        let q = p.qps as usize;
        let scq = ctx
            .create_cq(q * (p.depth + SQ_EXTRA) as usize + 16)
            .map_err(|e| format!("creating the send CQ: {e}"))?;
        let rcq = ctx
            .create_cq(q * 4096 + 16)
            .map_err(|e| format!("creating the receive CQ: {e}"))?;
        // Before any QP connects: who does the receive work while we wait.
        let mode = progress_mode(p);
        for cq in [&scq, &rcq] {
            cq.set_progress(mode)
                .map_err(|e| format!("setting the CQs' progress mode: {e}"))?;
        }
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
            .map_or((false, false), |i| {
                (i.mpa.crc, i.mpa.markers_tx || i.mpa.markers_rx)
            })
    }

    /// Smallest negotiated ORD (outbound Reads) over the connections.
    pub(super) fn ord(&self) -> u32 {
        self.conns
            .iter()
            .filter_map(|c| c.qp.conn_info())
            .map(|i| u32::from(i.mpa.ord))
            .min()
            .unwrap_or(1)
            .max(1)
    }

    /// Move send-CQ completions into `self.wcs`; returns how many.
    pub(super) fn poll_send(&mut self) -> Result<usize, String> {
        self.poll_send_ext(false)
    }

    /// `closing`: a flushed control message or credit Write is expected
    /// (the peer may close as soon as it has our last message).
    pub(super) fn poll_send_ext(&mut self, closing: bool) -> Result<usize, String> {
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
        // RFC 5044 §7.1.2: the Responder sends nothing before the
        // Initiator's first FPDU (the server holds; an FPDU right behind
        // the MPA Reply makes Linux siw's initiator reset the connection).
        // The tests where the server speaks first (send_bw's credits) need
        // that first FPDU: a zero-length RDMA Write to the server's control
        // buffer, which places nothing.
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_HELLO, idx, 0),
            opcode: WrOpcode::RdmaWrite {
                remote_addr: c.remote.ctrl_addr,
                rkey: c.remote.ctrl_rkey,
            },
            sgl: SgList::new(),
            signaled: false,
            solicited: false,
        })
        .map_err(|e| format!("QP {idx}: posting the first (zero-length) Write: {e}"))?;
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
                // RFC 5044 §7.1.2; the client's first FPDU lifts it.
                hold_until_first_fpdu: true,
                ..ConnParam::default()
            },
        )
        .map_err(|e| format!("accepting connection {idx}: {e}"))?;
        side.conns.push(c);
    }
    Ok((side, req0))
}

/// The stamp byte of write_bw message `iter` in a buffer of `slots` slots
/// (`--integrity`): the slot's round, never 0, so a slot's previous
/// content never looks like the expected message.
pub(super) fn stamp(iter: u64, slots: u64) -> u8 {
    ((iter / slots) % 255 + 1) as u8
}

/// Fill data slot `slot` of `c` with pattern `seed` (and the stamp);
/// returns its checksum.
pub(super) fn fill_slot(
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
