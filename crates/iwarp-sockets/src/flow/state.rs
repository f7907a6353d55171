//! The state of one connection ([`Flow`]): its fields, setup from the
//! configuration and the peer's conn data (`rs_alloc`, `rs_init_bufs`,
//! `rs_save_conn_data`), the action queue, and the helpers every path
//! shares (control slots, message words, failing).

use std::collections::VecDeque;

use super::error::FlowError;
use super::iomaps::Iomaps;
use super::types::{
    max_rq_size, recv_slots_for, Action, Config, Phase, CREDIT_RESERVE, MAX_BUF, QP_CTRL_SIZE,
    QP_MAX_SIZE, QP_MIN_SIZE, SNDLOWAT, TARGET_SGL_LEN,
};
use crate::wire::{ByteOrder, ConnDataRepr, Ctrl, Message, Sge, SGE_LEN, SGL_SIZE};

pub(super) fn slot(mem: &[u8], i: usize, order: ByteOrder) -> Option<Sge> {
    mem.get(i * SGE_LEN..(i + 1) * SGE_LEN)
        .map(|b| Sge::parse(b, order).expect("16 bytes"))
}

pub(super) fn set_slot(mem: &mut [u8], i: usize, s: &Sge, order: ByteOrder) {
    s.emit(&mut mem[i * SGE_LEN..(i + 1) * SGE_LEN], order)
        .expect("16 bytes");
}

/// The state of one rsocket stream connection (see the module doc).
#[derive(Debug, Clone)]
pub struct Flow {
    pub(super) cfg: Config,
    pub(super) phase: Phase,
    pub(super) readable: bool,
    pub(super) writable: bool,
    pub(super) err: Option<FlowError>,
    pub(super) peer_order: ByteOrder,
    pub(super) peer_rq: u16,
    /// Both ends set [`Config::ack_each`]: a credit per message read.
    pub(super) ack_each: bool,
    pub(super) early: Vec<[u8; 4]>,
    pub(super) actions: VecDeque<Action>,

    // Send side.
    pub(super) sqe_avail: i32,
    pub(super) ctrl_seqno: u32,
    pub(super) ctrl_max_seqno: u32,
    pub(super) sseq_no: u16,
    pub(super) sseq_comp: u16,
    pub(super) sbuf_bytes_avail: u32,
    pub(super) sbuf_head: u32,
    pub(super) target_sge: usize,
    pub(super) remote_sgl: Sge,
    pub(super) remote_sge: u32,
    pub(super) pending_ctrl: Option<Ctrl>,
    /// Bytes copied into the send buffer by [`Flow::send_buffered`] and
    /// not yet in a data message: `pend_len` bytes from `pend_start`.
    pub(super) pend_start: u32,
    pub(super) pend_len: u32,

    // Receive side.
    pub(super) rseq_no: u16,
    pub(super) rseq_comp: u16,
    pub(super) rmsg: VecDeque<u32>,
    /// Sum of `rmsg`.
    pub(super) rmsg_bytes: u64,
    pub(super) rbuf_offset: u32,
    pub(super) rbuf_bytes_avail: u32,
    pub(super) rbuf_free_offset: u32,
    pub(super) rbuf_msg_index: u16,
    pub(super) peer_write_closed: bool,
    pub(super) rx_count: u16,
    pub(super) rx_limit: u16,
    pub(super) rx_window: u64,
    /// The receive ring in use (`rbuf_size` at first; see
    /// [`Flow::set_ring_goal`]): halves of it are advertised, reads wrap
    /// at it.
    pub(super) ring: u32,
    /// What the ring may grow to: the driver's goal, and the registered
    /// region's capacity.
    pub(super) ring_goal: u32,
    pub(super) ring_cap: u32,

    // riomap / riowrite (flow/iomap.rs).
    pub(super) iomap: Iomaps,
}

impl Flow {
    /// A connection with these sizes (`rs_alloc`, `rs_set_qp_size`,
    /// `rs_init_bufs`); queues the `rq_size` initial receives.
    pub fn new(mut cfg: Config) -> Result<Flow, FlowError> {
        cfg.sq_size = cfg.sq_size.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        cfg.rq_size = cfg.rq_size.clamp(QP_MIN_SIZE, max_rq_size(cfg.ack_each));
        if cfg.sbuf_size < SNDLOWAT {
            return Err(FlowError::Config(
                "sbuf_size below RS_SNDLOWAT (2048): nothing could ever be sent",
            ));
        }
        if cfg.sbuf_size > MAX_BUF || cfg.rbuf_size > MAX_BUF {
            return Err(FlowError::Config(
                "sbuf_size and rbuf_size are limited to 1 GiB",
            ));
        }
        if cfg.rbuf_size < 2 || !cfg.rbuf_size.is_multiple_of(2) {
            return Err(FlowError::Config(
                "rbuf_size must be even and at least 2 (it is used in halves)",
            ));
        }
        let mut f = Flow {
            cfg,
            phase: Phase::Init,
            readable: false,
            writable: false,
            err: None,
            peer_order: cfg.order,
            peer_rq: 0,
            ack_each: false,
            early: Vec::new(),
            actions: VecDeque::new(),
            sqe_avail: i32::from(cfg.sq_size) - QP_CTRL_SIZE as i32,
            ctrl_seqno: 0,
            ctrl_max_seqno: QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            sbuf_bytes_avail: cfg.sbuf_size,
            sbuf_head: 0,
            target_sge: 0,
            remote_sgl: Sge::default(),
            remote_sge: 0,
            pending_ctrl: None,
            pend_start: 0,
            pend_len: 0,
            rseq_no: 0,
            rseq_comp: cfg.rq_size >> 1,
            rmsg: VecDeque::with_capacity(usize::from(cfg.rq_size) + 1),
            rmsg_bytes: 0,
            rbuf_offset: 0,
            rbuf_bytes_avail: cfg.rbuf_size >> 1,
            rbuf_free_offset: cfg.rbuf_size >> 1,
            rbuf_msg_index: 0,
            peer_write_closed: false,
            rx_count: 0,
            rx_limit: cfg.rq_size,
            rx_window: u64::from(cfg.rbuf_size >> 1),
            ring: cfg.rbuf_size,
            ring_goal: cfg.rbuf_size,
            ring_cap: cfg.rbuf_size,
            iomap: Iomaps::default(),
        };
        for _ in 0..f.recv_slots() {
            f.queue_recv();
        }
        Ok(f)
    }

    /// Receives this side keeps posted ([`recv_slots_for`]; the driver
    /// sizes the receive queue and the message slots by it).
    pub fn recv_slots(&self) -> u16 {
        recv_slots_for(self.cfg.rq_size, self.cfg.ack_each)
    }

    /// Whether this connection returns a credit after every message read
    /// (both ends set [`Config::ack_each`]).
    pub fn acks_each(&self) -> bool {
        self.ack_each
    }

    /// Whether a credit may be used now (see [`CREDIT_RESERVE`]).
    pub(super) fn has_credit(&self) -> bool {
        let reserve = if self.peer_rq >= 32 {
            CREDIT_RESERVE
        } else {
            0
        };
        self.sseq_comp.wrapping_sub(self.sseq_no) > reserve
    }

    /// The configuration in force (sizes after clamping).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The next work request to post.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Where the connection is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether reads may still return data (`rs_readable`).
    pub fn is_readable(&self) -> bool {
        self.readable
    }

    /// Whether writes are still allowed (`rs_writable`).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The error that ended the connection, if any.
    pub fn error(&self) -> Option<FlowError> {
        self.err
    }

    /// Data messages we may still send before the next credit update.
    pub fn send_credits(&self) -> u16 {
        self.sseq_comp.wrapping_sub(self.sseq_no)
    }

    /// Bytes received and not yet read.
    pub fn bytes_queued(&self) -> u64 {
        self.rmsg_bytes
    }

    /// Our `rs_conn_data` (`rs_format_conn_data`): credits = `rq_size`,
    /// the first half of `rbuf`, iomap flag set with size 0, and
    /// [`CONN_FLAG_ACK_EACH`](crate::wire::CONN_FLAG_ACK_EACH) with
    /// [`Config::ack_each`].
    pub fn local_conn_data(&self) -> ConnDataRepr {
        ConnDataRepr {
            order: self.cfg.order,
            iomap: true,
            other_flags: if self.cfg.ack_each {
                crate::wire::CONN_FLAG_ACK_EACH
            } else {
                0
            },
            credits: self.cfg.rq_size,
            target_iomap_size: self.iomap.local_size(),
            target_sgl: Sge {
                addr: self.cfg.target_sgl.addr,
                key: self.cfg.target_sgl.key,
                length: SGL_SIZE,
            },
            data_buf: Sge {
                addr: self.cfg.rbuf.addr,
                key: self.cfg.rbuf.key,
                length: self.cfg.rbuf_size >> 1,
            },
        }
    }

    /// Takes the peer's conn data (`rs_save_conn_data`) and puts its first
    /// half into slot 0 of our target SGL region `target` (which must have
    /// been zeroed before registration: the peer may write slot 1 before
    /// this call returns on the active side). Words received before this
    /// call ([`Flow::on_recv`] keeps them) are handled now.
    ///
    /// rsocket.c quirk not reproduced: `rs_save_conn_data` *assigns*
    /// `rs->opts = RS_OPT_SWAP_SGL` for a peer of the other endianness,
    /// which clears `RS_OPT_MSG_SEND`, so a mixed-endian iWARP pair of
    /// rsocket.c cannot work; here the peer's order is simply remembered.
    pub fn establish(&mut self, peer: &ConnDataRepr, target: &mut [u8]) -> Result<(), FlowError> {
        if self.phase != Phase::Init {
            return Err(FlowError::Config("establish called twice"));
        }
        if target.len() < TARGET_SGL_LEN {
            return Err(FlowError::Config("target SGL region shorter than 32 bytes"));
        }
        if peer.target_sgl.length == 0 {
            return Err(FlowError::BadConnData(
                "its target SGL has no entries (target_sgl.length 0)",
            ));
        }
        if peer.credits == 0 {
            return Err(FlowError::BadConnData(
                "it grants no credits (credits 0), nothing could ever be sent",
            ));
        }
        self.peer_order = peer.order;
        self.peer_rq = peer.credits;
        self.ack_each =
            self.cfg.ack_each && peer.other_flags & crate::wire::CONN_FLAG_ACK_EACH != 0;
        self.remote_sgl = peer.target_sgl;
        self.remote_sge = 1 % peer.target_sgl.length;
        self.iomap.on_establish(peer);
        set_slot(target, 0, &peer.data_buf, self.cfg.order);
        self.sseq_comp = peer.credits;
        self.phase = Phase::Connected;
        self.readable = true;
        self.writable = true;
        self.update_credits();
        for payload in std::mem::take(&mut self.early) {
            self.on_recv(&payload)?;
        }
        Ok(())
    }

    pub(super) fn queue_recv(&mut self) {
        self.actions.push_back(Action::PostRecv {
            slot: self.rbuf_msg_index,
        });
        self.rbuf_msg_index += 1;
        if self.rbuf_msg_index == self.recv_slots() {
            self.rbuf_msg_index = 0;
        }
    }

    pub(super) fn word(&self, m: Message) -> [u8; 4] {
        m.emit()
            .expect("values of this machine fit 29 bits")
            .to_send_payload(self.cfg.order)
    }

    pub(super) fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    pub(super) fn two_ctrl_avail(&self) -> bool {
        (self
            .ctrl_seqno
            .wrapping_add(1)
            .wrapping_sub(self.ctrl_max_seqno) as i32)
            < 0
    }

    pub(super) fn fail(&mut self, e: FlowError) -> FlowError {
        if self.err.is_none() {
            self.err = Some(e);
        }
        self.phase = Phase::Error;
        self.readable = false;
        self.writable = false;
        // Nothing more goes on the wire but the teardown.
        self.actions.clear();
        self.pend_len = 0;
        if let FlowError::Protocol(_) = e {
            // A peer that broke the protocol may have written anywhere in
            // the ring (its RDMA Write lands before the word that gives it
            // away): nothing queued is trusted any more.
            self.rmsg.clear();
            self.rmsg_bytes = 0;
        }
        e
    }
}
