//! The vocabulary of the flow: rsocket.c's limits, the configuration,
//! ring spans, what a send is made of ([`SendTag`], [`Source`]), the
//! [`Action`]s a driver posts, and the connection's [`Phase`]; a leaf.

use crate::wire::{ByteOrder, Ctrl, SGE_LEN, SGL_SIZE};

/// `RS_SNDLOWAT`: the send buffer space `rs_can_send` requires.
pub const SNDLOWAT: u32 = 2048;
/// `RS_QP_CTRL_SIZE`: control work requests outstanding at most.
pub const QP_CTRL_SIZE: u32 = 4;
/// `RS_QP_MIN_SIZE`: the smallest queue `rs_set_qp_size` allows.
pub const QP_MIN_SIZE: u16 = 16;
/// `RS_QP_MAX_SIZE`: the largest queue `rs_set_qp_size` allows.
pub const QP_MAX_SIZE: u16 = 0xFFFE;
/// Receives posted beyond the credits granted. rsocket.c posts exactly
/// `rq_size` receives and grants `rq_size` credits, but its credit
/// updates and control words consume the peer's receives too, and a
/// receive is only reposted when its completion is handled: a peer whose
/// credit update arrives just before a full window of data finds one
/// receive short. On InfiniBand the RNR retry hides that; iWARP has no
/// RNR retry (RFC 5041 §7: an untagged message with no buffer is fatal),
/// so this side posts a few more than it grants.
pub const RQ_EXTRA: u16 = 8;

/// Credits this side leaves unused when the peer's queue is large enough
/// (at least 32): the room its own credit updates and control words need
/// in a peer that, like rsocket.c, posts exactly as many receives as it
/// grants credits (see [`RQ_EXTRA`]).
pub const CREDIT_RESERVE: u16 = 2;

/// `RS_MAX_TRANSFER`: the most bytes rsocket.c moves per data message.
pub const MAX_TRANSFER: u32 = 65536;
/// The largest send or receive buffer [`Flow::new`](crate::flow::Flow::new) accepts (1 GiB), so
/// that ring offsets never overflow `u32`.
pub const MAX_BUF: u32 = 1 << 30;
/// Bytes of the target SGL region (`RS_SGL_SIZE` slots of `rs_sge`).
pub const TARGET_SGL_LEN: usize = SGL_SIZE as usize * SGE_LEN;

/// A registered region: where it is and its rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// Address the peer uses.
    pub addr: u64,
    /// Remote key.
    pub key: u32,
}

/// Sizes and regions of one connection (rsocket.c's defaults:
/// `def_sqsize`/`def_rqsize` 384, `def_wmem`/`def_mem` 128 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Send queue entries (clamped to 16..=0xFFFE as `rs_set_qp_size` does).
    pub sq_size: u16,
    /// Receive queue entries, and the credits we grant (clamped likewise).
    pub rq_size: u16,
    /// Send buffer bytes (at least [`SNDLOWAT`]).
    pub sbuf_size: u32,
    /// Receive buffer bytes (even, at least 2).
    pub rbuf_size: u32,
    /// Our host order, declared by `RS_CONN_FLAG_NET`.
    pub order: ByteOrder,
    /// Our target SGL region ([`TARGET_SGL_LEN`] bytes, remote write).
    pub target_sgl: Region,
    /// Our receive buffer region (remote write).
    pub rbuf: Region,
    /// The basic design's credit return: advertise
    /// [`CONN_FLAG_ACK_EACH`](crate::wire::CONN_FLAG_ACK_EACH), keep
    /// `rq_size` more receives posted for the peer's updates, and, if the
    /// peer advertises it too, return a credit after every message read
    /// (see the module docs).
    pub ack_each: bool,
}

/// Receives a side keeps posted for `rq_size` credits: [`RQ_EXTRA`] more,
/// and `rq_size` more again with [`Config::ack_each`](crate::flow::Config::ack_each).
pub fn recv_slots_for(rq_size: u16, ack_each: bool) -> u16 {
    let per_credit = if ack_each { 2 } else { 1 };
    rq_size.saturating_mul(per_credit).saturating_add(RQ_EXTRA)
}

/// The largest `rq_size` [`Flow::new`](crate::flow::Flow::new) keeps (`rs_set_qp_size`'s limit,
/// less the extra receives).
pub fn max_rq_size(ack_each: bool) -> u16 {
    if ack_each {
        (QP_MAX_SIZE - RQ_EXTRA) / 2
    } else {
        QP_MAX_SIZE - RQ_EXTRA
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            sq_size: 384,
            rq_size: 384,
            sbuf_size: 1 << 17,
            rbuf_size: 1 << 17,
            order: ByteOrder::NATIVE,
            target_sgl: Region::default(),
            rbuf: Region::default(),
            ack_each: false,
        }
    }
}

/// A piece of a local buffer: `len` bytes at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Offset in the buffer.
    pub offset: u32,
    /// Bytes.
    pub len: u32,
}

/// One or two spans of a ring buffer (two when the bytes wrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spans {
    /// The first part.
    pub first: Span,
    /// The part that wrapped to offset 0, if any.
    pub second: Option<Span>,
}

impl Spans {
    pub(crate) fn of_ring(offset: u32, len: u32, size: u32) -> Spans {
        let to_end = size - offset;
        if len <= to_end {
            Spans {
                first: Span { offset, len },
                second: None,
            }
        } else {
            Spans {
                first: Span {
                    offset,
                    len: to_end,
                },
                second: Some(Span {
                    offset: 0,
                    len: len - to_end,
                }),
            }
        }
    }

    /// Total bytes.
    pub fn len(&self) -> u32 {
        self.first.len + self.second.map_or(0, |s| s.len)
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where the bytes of an RDMA Write come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The send buffer.
    Sbuf(Spans),
    /// These 16 bytes (an `rs_sge` in the peer's order), posted inline.
    Inline([u8; SGE_LEN]),
    /// Nothing: a zero-length Write (keepalive).
    Empty,
    /// `len` bytes of the application's own registered memory (zero copy,
    /// [`Flow::send_zcopy`](crate::flow::Flow::send_zcopy)): the driver supplies the SGE.
    External {
        /// Bytes.
        len: u32,
    },
}

/// What a send work request was, handed back with its completion (the
/// role of rsocket.c's `wr_id` encoding, kept local).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendTag {
    /// The RDMA Write of `len` data bytes.
    DataWrite {
        /// Bytes written.
        len: u32,
    },
    /// The RDMA Write of `len` bytes straight from application memory
    /// ([`Flow::send_zcopy`](crate::flow::Flow::send_zcopy)); returns no send-buffer space.
    ZcopyWrite {
        /// Bytes written.
        len: u32,
    },
    /// The Send of the `RS_OP_DATA` word after it.
    DataMsg,
    /// The RDMA Write of an `rs_sge` into the peer's target SGL.
    SglWrite,
    /// The Send of an `RS_OP_SGL` word.
    SglMsg,
    /// The Send of an `RS_OP_CTRL` word.
    Ctrl(Ctrl),
    /// The zero-length keepalive Write.
    Keepalive,
}

/// A work request for the driver to post, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Post a 4-byte receive into message slot `slot`, at offset
    /// `rbuf_size + 4 * slot` of the receive region (`rs_post_recv`).
    PostRecv {
        /// Slot, 0..rq_size.
        slot: u16,
    },
    /// Post an RDMA Write (signaled).
    RdmaWrite {
        /// The bytes.
        src: Source,
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
        /// Hand back with the completion.
        tag: SendTag,
    },
    /// Post a Send of these 4 bytes (inline, signaled).
    Send {
        /// The message word in our host order.
        payload: [u8; 4],
        /// Hand back with the completion.
        tag: SendTag,
    },
}

/// What the application gets from [`Flow::send`](crate::flow::Flow::send).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendGrant {
    /// Where in the send buffer to copy the next `spans.len()` bytes.
    pub spans: Spans,
}

/// What the application gets from [`Flow::recv`](crate::flow::Flow::recv).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvGrant {
    /// Where in the receive buffer to copy from.
    pub spans: Spans,
    /// The reading side is closed and nothing is queued: end of stream
    /// (`spans` is then empty).
    pub eof: bool,
}

/// What [`Flow::reserve`](crate::flow::Flow::reserve) does with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reserve {
    /// Queue its actions now.
    Queue,
    /// Queue it with an external source (zero copy).
    External,
}

/// `rshutdown`'s `how`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// `SHUT_RD`.
    Read,
    /// `SHUT_WR`.
    Write,
    /// `SHUT_RDWR`.
    Both,
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Created, conn data not yet exchanged.
    Init,
    /// `rs_connected`, with `readable`/`writable` telling which halves are
    /// open.
    Connected,
    /// `rs_disconnected`.
    Disconnected,
    /// `rs_error`: see [`Flow::error`](crate::flow::Flow::error).
    Error,
}
