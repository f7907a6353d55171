//! The credit and ring state machine of one rsocket stream connection, as
//! librdmacm's `rsocket.c` runs it on iWARP (`RS_OPT_MSG_SEND`), without
//! I/O: it consumes events (the peer's conn data, completions, received
//! message words, the application's send/recv/shutdown calls) and produces
//! [`Action`]s (post a receive, post an RDMA Write, post a Send) for a
//! driver that owns the queue pair and the memory.
//!
//! # The protocol, from rsocket.c
//!
//! Each side has a **receive buffer** (`rbuf`, `rbuf_size` bytes, default
//! `mem_default` = 128 KiB) that the peer fills by RDMA Write, split in two
//! halves, and a **target SGL** (`RS_SGL_SIZE` = 2 [`Sge`] slots, 32 bytes,
//! registered for remote write) that the peer fills with the addresses of
//! freed halves. The conn data gives the peer the target SGL's address and
//! the first half (`rs_format_conn_data`: `data_buf.length = rbuf_size >> 1`),
//! which the peer stores in its own slot 0 (`rs_save_conn_data`).
//!
//! **Sending** (`rsend`, `rs_write_data`, `rs_post_write_msg`): when
//! `rs_can_send` holds — on iWARP `sqe_avail >= 2`,
//! `sbuf_bytes_avail >= RS_SNDLOWAT` (2048), `sseq_no != sseq_comp` and the
//! current target slot has a non-zero length — the sender copies up to
//! `min(len, sbuf_bytes_avail, slot length)` bytes into its send buffer,
//! RDMA-Writes them to `slot.addr` with `slot.key`, then Sends the word
//! `RS_OP_DATA | n`. It advances the slot (`addr += n; length -= n`) and
//! moves to the next slot (mod 2) when the slot is empty. Each transfer
//! costs one credit (`sseq_no++`), two send-queue entries and `n` bytes of
//! send buffer; the RDMA Write's completion returns `n` bytes and one entry,
//! the Send's one entry (`rs_poll_cq`, the `default:` branch).
//!
//! **Credits** are data *messages*, not bytes: the peer's `credits` in the
//! conn data (its `rq_size`) is the first `sseq_comp`, and each `RS_OP_SGL`
//! word sets `sseq_comp = (uint16_t) value`. The receiver counts messages
//! the application has fully read (`rseq_no`, in `rrecv`) and, when
//! `rs_give_credits` holds, `rs_send_credits` announces
//! `rseq_no + rq_size`. `rs_give_credits` on iWARP: (`rbuf_bytes_avail >=
//! rbuf_size / 2` or `(short)(rseq_no - rseq_comp) >= 0`) and two control
//! slots free (`rs_2ctrl_avail`) and connected. `rs_send_credits` sets
//! `rseq_comp = rseq_no + rq_size / 2`; if half a buffer is free it
//! RDMA-Writes the `rs_sge` of the next free half (`rbuf + rbuf_free_offset`,
//! in the peer's host order) into the peer's target SGL slot `remote_sge`
//! (starting at 1, cycling mod the peer's `target_sgl.length`), then Sends
//! `RS_OP_SGL | limit` (two control slots); otherwise it only Sends the
//! word (one control slot).
//!
//! **Control slots**: at most `RS_QP_CTRL_SIZE` (4) control work requests
//! are outstanding (`ctrl_seqno` / `ctrl_max_seqno`); they are carved out
//! of the send queue (`sqe_avail = sq_size - ctrl_max_seqno`,
//! `rs_init_bufs`). SGL writes, SGL words, CTRL words and keepalives use
//! them; their completions return them.
//!
//! **Receiving** (`rs_poll_cq`, `rrecv`): every `rq_size` receive is a
//! 4-byte buffer in a message area after `rbuf` (`rs_post_recv`), reposted
//! after its completion while connected. A data word queues `(len)`; the
//! application reads from `rbuf_offset` on, wrapping at `rbuf_size`; bytes
//! read return to `rbuf_bytes_avail`, fully read messages to `rseq_no`.
//!
//! **Shutdown** (`rshutdown`): `SHUT_RDWR` sends `RS_CTRL_DISCONNECT`;
//! `SHUT_WR` sends `RS_CTRL_SHUTDOWN` if still readable, else DISCONNECT;
//! `SHUT_RD` sends DISCONNECT only if no longer writable. Receiving
//! DISCONNECT ends the connection; SHUTDOWN ends the readable side if we
//! are still writable, else the connection. Our own DISCONNECT's
//! completion ends the connection too.
//!
//! **Keepalive** (`tcp_svc_send_keepalive`): a zero-length RDMA Write to
//! address 0 with rkey 0, using a control slot; its comment says "RDMA
//! write with immediate" but it calls `rs_post_write`, a plain
//! `IBV_WR_RDMA_WRITE` in both modes, so the peer sees no message and
//! consumes no receive. On iWARP it is a zero-length tagged DDP segment
//! with STag 0, the same frame RFC 6581 §5 uses as the write-form
//! ready-to-receive: RFC 5041 §7.2 leaves nothing to validate or place for
//! it, Linux siw's `siw_proc_write` returns at once, and our engine places
//! nothing (`iwarp-proto`, `engine::Engine::post_nudge` sends the same
//! frame).
//!
//! # The basic design's credit return (ours, between our own ends)
//!
//! The seed paper's basic socket design returns a credit to the sender
//! after every message its reader consumes; the enhanced design keeps only
//! the flow control the ring needs. rsocket.c cannot take per-message
//! updates: it posts exactly as many receives as it grants credits, and a
//! credit update takes one of them without being counted. So
//! [`Config::ack_each`] works only between two ends that both set it: each
//! advertises [`CONN_FLAG_ACK_EACH`](crate::wire::CONN_FLAG_ACK_EACH) and
//! keeps `rq_size` more receives posted ([`recv_slots_for`]), and each then
//! Sends `RS_OP_SGL` whenever its limit `rseq_no + rq_size` has moved
//! since the last update (on top of rsocket.c's rules above, which still
//! decide when a freed half is written to the target SGL). Why `rq_size`
//! more receives are enough: such updates are sent one per data message
//! read at most, and the sender cannot send beyond the last limit it
//! handled, so at most `rq_size` of them are ever unhandled at the sender.
//! Toward a peer without the flag (rsocket.c, or our enhanced design) the
//! rules above stay as they are.
//!
//! # What this machine adds: checks rsocket.c does not make
//!
//! rsocket.c trusts its peer. This machine ends the connection with a
//! [`ProtocolError`] when the peer sends a data message beyond the credits
//! we granted, claims more bytes than the ring space we advertised, sets
//! a credit limit below what we already sent or beyond its receive queue,
//! sends data after it shut
//! down, or sends a malformed or unexpected word (reserved ops,
//! `RS_OP_WRITE`, `RS_OP_IOMAP_SGL` although we advertise no iomap table
//! or for an entry beyond it).
//!
//! # Covered, and not covered
//!
//! Covered: the conn data exchange ([`Flow::local_conn_data`],
//! [`Flow::establish`]), the send path with the send-buffer ring and the
//! target SGL, the receive path with the receive ring and credit return,
//! control slots, shutdown in all three directions, keepalive, completion
//! errors.
//!
//! `riomap`/`riowrite`/`riounmap` and the iomap table (`RS_OP_IOMAP_SGL`;
//! `RS_OP_WRITE` is never transmitted) are in the `iomap` submodule
//! (`flow/iomap.rs`), as more methods of [`Flow`].
//!
//! Not covered (yet):
//! `MSG_PEEK`/`MSG_WAITALL` (driver-level loops over [`Flow::recv`]);
//! rsocket.c's growing per-call transfer size (`RS_OLAP_START_SIZE` 2048
//! doubling to `RS_MAX_TRANSFER`): [`Flow::send`] takes the size the driver
//! asks for, capped at [`MAX_TRANSFER`]; inline sends (`sq_inline`) are a
//! driver choice, the accounting is the same; datagram rsockets; the
//! keepalive timer (the driver calls [`Flow::keepalive`]); InfiniBand's
//! Write-with-Immediate mode.
//!
//! # Call order for a driver
//!
//! 1. [`Flow::new`], zero the 32-byte target SGL region and register it for
//!    remote write, register `rbuf` (plus `4 * rq_size` bytes of message
//!    area), post the queued [`Action::PostRecv`]s.
//! 2. Send [`Flow::local_conn_data`] as private data, call
//!    [`Flow::establish`] with the peer's.
//! 3. After every call, drain [`Flow::poll_action`] and post in order. For
//!    [`Flow::send`], copy the caller's bytes into the returned send-buffer
//!    spans *before* posting; for [`Flow::recv`], copy out of the returned
//!    receive-buffer spans *before* posting (the credit update that follows
//!    lets the peer overwrite them).
//! 4. Feed every completion: [`Flow::on_send_complete`] with the
//!    [`SendTag`] of the work request, [`Flow::on_recv`] with the 4 bytes of
//!    a successful receive, [`Flow::on_recv_failed`] for a failed one.
//!    Receives that complete before [`Flow::establish`] (the peer was
//!    connected first) are kept and handled by it.

use std::collections::VecDeque;
use std::fmt;

use crate::wire::{ByteOrder, ConnDataRepr, Ctrl, Message, Op, Sge, WireError, SGE_LEN, SGL_SIZE};

mod iomap;
pub use iomap::{IomapError, IomapGrant, DIRECT_MAX, IOMAP_SIZE_MAX};

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
/// The largest send or receive buffer [`Flow::new`] accepts (1 GiB), so
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
/// and `rq_size` more again with [`Config::ack_each`].
pub fn recv_slots_for(rq_size: u16, ack_each: bool) -> u16 {
    let per_credit = if ack_each { 2 } else { 1 };
    rq_size.saturating_mul(per_credit).saturating_add(RQ_EXTRA)
}

/// The largest `rq_size` [`Flow::new`] keeps (`rs_set_qp_size`'s limit,
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
    fn of_ring(offset: u32, len: u32, size: u32) -> Spans {
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
    /// [`Flow::send_zcopy`]): the driver supplies the SGE.
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
    /// ([`Flow::send_zcopy`]); returns no send-buffer space.
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

/// What the application gets from [`Flow::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendGrant {
    /// Where in the send buffer to copy the next `spans.len()` bytes.
    pub spans: Spans,
}

/// What the application gets from [`Flow::recv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvGrant {
    /// Where in the receive buffer to copy from.
    pub spans: Spans,
    /// The reading side is closed and nothing is queued: end of stream
    /// (`spans` is then empty).
    pub eof: bool,
}

/// What [`Flow::reserve`] does with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reserve {
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
    /// `rs_error`: see [`Flow::error`].
    Error,
}

/// A peer that broke the protocol; the connection ends (ECONNRESET).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The message word could not be read.
    Malformed(WireError),
    /// A data message beyond the credits we granted.
    CreditsExceeded {
        /// Data messages received before this one (mod 2^16).
        received: u16,
        /// The limit we last granted (mod 2^16).
        limit: u16,
    },
    /// A data message claims more bytes than the ring space we advertised.
    RingOverrun {
        /// Bytes claimed.
        len: u32,
        /// Bytes advertised and not yet filled.
        window: u64,
    },
    /// An `RS_OP_SGL` limit outside `sent ..= sent + peer rq_size` (mod
    /// 2^16): below what we already sent, or more than the peer's receive
    /// queue (its conn data `credits`) can hold.
    CreditLimitOutOfRange {
        /// The new limit.
        limit: u16,
        /// Our data messages sent.
        sent: u16,
        /// The peer's `rq_size` (its conn data `credits`).
        peer_rq: u16,
    },
    /// A data message after the peer's SHUTDOWN or DISCONNECT.
    DataAfterShutdown,
    /// A word rsocket.c never sends to us (`RS_OP_WRITE`, or
    /// `RS_OP_IOMAP_SGL` although we advertised no iomap).
    Unexpected(Op),
    /// An `RS_OP_IOMAP_SGL` for an entry beyond the iomap table we
    /// advertised.
    IomapIndex {
        /// The index in the word.
        index: u16,
        /// Entries we advertised.
        size: u16,
    },
}

/// Why a [`Flow`] call did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlowError {
    /// Not now: no credits, send queue, send buffer, ring space, or data
    /// yet (EAGAIN). Retry after the next completion.
    WouldBlock,
    /// Called before [`Flow::establish`].
    NotConnected,
    /// Sending after our `shutdown(Write)` or the peer's disconnect (EPIPE
    /// / ECONNRESET).
    NotWritable,
    /// A bad [`Config`] or region.
    Config(&'static str),
    /// The peer's conn data cannot be used.
    BadConnData(&'static str),
    /// The peer broke the protocol; the connection is over.
    Protocol(ProtocolError),
    /// A send work request completed with an error (rsocket.c: `EIO`).
    SendFailed,
    /// A completion for a work request this machine did not issue: a
    /// driver bug.
    UnexpectedCompletion(SendTag),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProtocolError::Malformed(e) => write!(f, "malformed message word: {e}"),
            ProtocolError::CreditsExceeded { received, limit } => write!(
                f,
                "peer sent a data message beyond its credits ({received} received, limit {limit}); \
                 its flow control is broken: the connection is reset"
            ),
            ProtocolError::RingOverrun { len, window } => write!(
                f,
                "peer claims {len} bytes written but only {window} bytes of receive ring were \
                 advertised; it wrote outside the ring: the connection is reset"
            ),
            ProtocolError::CreditLimitOutOfRange {
                limit,
                sent,
                peer_rq,
            } => write!(
                f,
                "peer set its credit limit to {limit}, outside {sent}..={sent}+{peer_rq} (data \
                 messages sent .. plus its receive queue); its credit accounting is broken: the \
                 connection is reset"
            ),
            ProtocolError::DataAfterShutdown => write!(
                f,
                "peer sent data after its shutdown/disconnect message: the connection is reset"
            ),
            ProtocolError::Unexpected(op) => write!(
                f,
                "peer sent op {op:?}, which this rsocket never asked for (RS_OP_WRITE is never \
                 transmitted; RS_OP_IOMAP_SGL only toward an advertised iomap table, none was): \
                 the connection is reset"
            ),
            ProtocolError::IomapIndex { index, size } => write!(
                f,
                "peer announced iomap entry {index}, but our table has {size} entries; it wrote \
                 outside the table: the connection is reset"
            ),
        }
    }
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowError::WouldBlock => write!(
                f,
                "no credits, send queue entries, buffer space or data right now; retry after the \
                 next completion (EAGAIN)"
            ),
            FlowError::NotConnected => {
                write!(
                    f,
                    "the connection is not established; exchange conn data first (establish)"
                )
            }
            FlowError::NotWritable => write!(
                f,
                "the sending side is shut down (by shutdown(Write) or the peer's disconnect); \
                 open a new connection to send more"
            ),
            FlowError::Config(why) => write!(f, "bad rsocket configuration: {why}"),
            FlowError::BadConnData(why) => write!(
                f,
                "the peer's rs_conn_data is unusable: {why}; the peer is not a working rsocket"
            ),
            FlowError::Protocol(p) => write!(f, "{p}"),
            FlowError::SendFailed => write!(
                f,
                "a send work request completed with an error (rsocket.c reports EIO); the queue \
                 pair is in error: close the socket"
            ),
            FlowError::UnexpectedCompletion(t) => write!(
                f,
                "completion for {t:?}, which has no outstanding work request; the driver handed \
                 back a tag twice or invented one"
            ),
        }
    }
}

impl std::error::Error for FlowError {}

impl FlowError {
    /// The `std::io` kind a socket API reports for this error. A broken
    /// protocol is `ConnectionReset` (ECONNRESET), as the issue asks.
    pub fn kind(&self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            FlowError::WouldBlock => K::WouldBlock,
            FlowError::NotConnected => K::NotConnected,
            FlowError::NotWritable => K::BrokenPipe,
            FlowError::Config(_) => K::InvalidInput,
            FlowError::BadConnData(_) => K::InvalidData,
            FlowError::Protocol(_) => K::ConnectionReset,
            FlowError::SendFailed | FlowError::UnexpectedCompletion(_) => K::Other,
        }
    }
}

impl From<FlowError> for std::io::Error {
    fn from(e: FlowError) -> std::io::Error {
        std::io::Error::new(e.kind(), e)
    }
}

fn slot(mem: &[u8], i: usize, order: ByteOrder) -> Option<Sge> {
    mem.get(i * SGE_LEN..(i + 1) * SGE_LEN)
        .map(|b| Sge::parse(b, order).expect("16 bytes"))
}

fn set_slot(mem: &mut [u8], i: usize, s: &Sge, order: ByteOrder) {
    s.emit(&mut mem[i * SGE_LEN..(i + 1) * SGE_LEN], order)
        .expect("16 bytes");
}

/// The state of one rsocket stream connection (see the module doc).
#[derive(Debug, Clone)]
pub struct Flow {
    cfg: Config,
    phase: Phase,
    readable: bool,
    writable: bool,
    err: Option<FlowError>,
    peer_order: ByteOrder,
    peer_rq: u16,
    /// Both ends set [`Config::ack_each`]: a credit per message read.
    ack_each: bool,
    early: Vec<[u8; 4]>,
    actions: VecDeque<Action>,

    // Send side.
    sqe_avail: i32,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    sbuf_bytes_avail: u32,
    sbuf_head: u32,
    target_sge: usize,
    remote_sgl: Sge,
    remote_sge: u32,
    pending_ctrl: Option<Ctrl>,
    /// Bytes copied into the send buffer by [`Flow::send_buffered`] and
    /// not yet in a data message: `pend_len` bytes from `pend_start`.
    pend_start: u32,
    pend_len: u32,

    // Receive side.
    rseq_no: u16,
    rseq_comp: u16,
    rmsg: VecDeque<u32>,
    /// Sum of `rmsg`.
    rmsg_bytes: u64,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_msg_index: u16,
    peer_write_closed: bool,
    rx_count: u16,
    rx_limit: u16,
    rx_window: u64,
    /// The receive ring in use (`rbuf_size` at first; see
    /// [`Flow::set_ring_goal`]): halves of it are advertised, reads wrap
    /// at it.
    ring: u32,
    /// What the ring may grow to: the driver's goal, and the registered
    /// region's capacity.
    ring_goal: u32,
    ring_cap: u32,

    // riomap / riowrite (flow/iomap.rs).
    iomap: iomap::Iomaps,
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
            iomap: iomap::Iomaps::default(),
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
    fn has_credit(&self) -> bool {
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

    fn queue_recv(&mut self) {
        self.actions.push_back(Action::PostRecv {
            slot: self.rbuf_msg_index,
        });
        self.rbuf_msg_index += 1;
        if self.rbuf_msg_index == self.recv_slots() {
            self.rbuf_msg_index = 0;
        }
    }

    fn word(&self, m: Message) -> [u8; 4] {
        m.emit()
            .expect("values of this machine fit 29 bits")
            .to_send_payload(self.cfg.order)
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn two_ctrl_avail(&self) -> bool {
        (self
            .ctrl_seqno
            .wrapping_add(1)
            .wrapping_sub(self.ctrl_max_seqno) as i32)
            < 0
    }

    fn fail(&mut self, e: FlowError) -> FlowError {
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

    /// `rs_can_send` (iWARP variant) against the target SGL region.
    pub fn can_send(&self, target: &[u8]) -> bool {
        self.phase == Phase::Connected
            && self.writable
            && self.sqe_avail >= 2
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.has_credit()
            && slot(target, self.target_sge, self.cfg.order).is_some_and(|s| s.length != 0)
    }

    /// Reserves up to `want` bytes of the send buffer and queues their RDMA
    /// Write and the `RS_OP_DATA` Send (`rs_write_data`). Copy the bytes
    /// into the returned spans before posting the actions. Bytes buffered
    /// by [`Flow::send_buffered`] go first (`WouldBlock` while they cannot).
    pub fn send(&mut self, want: u32, target: &mut [u8]) -> Result<SendGrant, FlowError> {
        if self.pend_len > 0 {
            // Buffered bytes go first.
            self.push(target);
            if self.pend_len > 0 {
                return Err(FlowError::WouldBlock);
            }
        }
        self.reserve(want, target, Reserve::Queue)
    }

    /// Zero copy: reserves a data message of up to `want` bytes that the
    /// driver RDMA-Writes straight from the application's registered
    /// memory ([`Source::External`]); no send-buffer space is used.
    /// Returns the bytes the message takes (the driver must keep that
    /// memory unchanged until the Write completes).
    pub fn send_zcopy(&mut self, want: u32, target: &mut [u8]) -> Result<u32, FlowError> {
        if self.pend_len > 0 {
            // Buffered bytes go first.
            self.push(target);
            if self.pend_len > 0 {
                return Err(FlowError::WouldBlock);
            }
        }
        self.reserve(want, target, Reserve::External)
            .map(|g| g.spans.len())
    }

    /// Buffered sending, the enhanced design's path: copies up to `want`
    /// bytes into the send buffer (copy them into the returned spans) and
    /// queues them as data messages as far as credits, send-queue entries
    /// and the peer's ring allow now (when `push` is true); what cannot go
    /// yet stays buffered, and later bytes join it, so that a run of small
    /// writes that finds the wire or the credits busy leaves as one message
    /// ("append") instead of one message each. Nothing waits for more data:
    /// buffered bytes go with the next [`Flow::push`], which the driver
    /// calls whenever a completion or a credit arrives.
    pub fn send_buffered(
        &mut self,
        want: u32,
        target: &mut [u8],
        push: bool,
    ) -> Result<SendGrant, FlowError> {
        self.check_sendable(target)?;
        let n = want.min(self.sbuf_bytes_avail);
        if want > 0 && n == 0 {
            if push {
                self.push(target);
            }
            return Err(FlowError::WouldBlock);
        }
        if self.pend_len == 0 {
            self.pend_start = self.sbuf_head;
        }
        let spans = Spans::of_ring(self.sbuf_head, n, self.cfg.sbuf_size);
        self.sbuf_head = (self.sbuf_head + n) % self.cfg.sbuf_size;
        self.sbuf_bytes_avail -= n;
        self.pend_len += n;
        if push {
            self.push(target);
        }
        Ok(SendGrant { spans })
    }

    /// Whether [`Flow::send_buffered`] would take bytes now (at least
    /// [`SNDLOWAT`] of send buffer free, or all of it when smaller).
    pub fn can_buffer(&self) -> bool {
        self.phase == Phase::Connected
            && self.writable
            && self.sbuf_bytes_avail >= SNDLOWAT.min(self.cfg.sbuf_size)
    }

    /// Free bytes of the send buffer.
    pub fn send_space(&self) -> u32 {
        self.sbuf_bytes_avail
    }

    /// Bytes buffered by [`Flow::send_buffered`] and not yet sent.
    pub fn buffered(&self) -> u32 {
        self.pend_len
    }

    /// Queues buffered bytes as data messages while a credit, two
    /// send-queue entries and ring space in the current target slot are
    /// available; returns the messages queued.
    pub fn push(&mut self, target: &mut [u8]) -> u32 {
        let mut msgs = 0;
        while self.pend_len > 0
            && self.phase == Phase::Connected
            && self.sqe_avail >= 2
            && self.has_credit()
            && target.len() >= TARGET_SGL_LEN
        {
            let Some(dst) = slot(target, self.target_sge, self.cfg.order) else {
                break;
            };
            if dst.length == 0 {
                break;
            }
            let n = self.pend_len.min(MAX_TRANSFER).min(dst.length);
            let spans = Spans::of_ring(self.pend_start, n, self.cfg.sbuf_size);
            self.pend_start = (self.pend_start + n) % self.cfg.sbuf_size;
            self.pend_len -= n;
            let (addr, rkey) = self.take_slot(target, dst, n);
            self.queue_data(
                Source::Sbuf(spans),
                addr,
                rkey,
                n,
                SendTag::DataWrite { len: n },
            );
            msgs += 1;
        }
        if self.pend_len == 0 {
            self.flush_pending_ctrl();
        }
        msgs
    }

    /// Whether a send may be asked for at all (connected, writable, a
    /// whole target SGL region).
    fn check_sendable(&self, target: &[u8]) -> Result<(), FlowError> {
        match self.phase {
            Phase::Error => return Err(self.err.unwrap_or(FlowError::SendFailed)),
            Phase::Init => return Err(FlowError::NotConnected),
            Phase::Disconnected => return Err(FlowError::NotWritable),
            Phase::Connected => {}
        }
        if !self.writable {
            return Err(FlowError::NotWritable);
        }
        if target.len() < TARGET_SGL_LEN {
            return Err(FlowError::Config("target SGL region shorter than 32 bytes"));
        }
        Ok(())
    }

    /// Takes `n` bytes (at most its length) from the front of the current
    /// target slot `dst` for one data message: one credit and two
    /// send-queue entries; advances the slot in `target` and moves to the
    /// next slot when it is used up. Returns the peer address and rkey.
    fn take_slot(&mut self, target: &mut [u8], mut dst: Sge, n: u32) -> (u64, u32) {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 2;
        let at = (dst.addr, dst.key);
        dst.addr = dst.addr.wrapping_add(u64::from(n));
        dst.length -= n;
        set_slot(target, self.target_sge, &dst, self.cfg.order);
        if dst.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE as usize;
        }
        at
    }

    fn queue_data(&mut self, src: Source, addr: u64, rkey: u32, n: u32, tag: SendTag) {
        self.actions.push_back(Action::RdmaWrite {
            src,
            remote_addr: addr,
            rkey,
            tag,
        });
        let payload = self.word(Message::Data { len: n });
        self.actions.push_back(Action::Send {
            payload,
            tag: SendTag::DataMsg,
        });
    }

    fn reserve(
        &mut self,
        want: u32,
        target: &mut [u8],
        how: Reserve,
    ) -> Result<SendGrant, FlowError> {
        self.check_sendable(target)?;
        if want == 0 {
            return Ok(SendGrant {
                spans: Spans::of_ring(self.sbuf_head, 0, self.cfg.sbuf_size),
            });
        }
        if !self.can_send(target) {
            return Err(FlowError::WouldBlock);
        }
        let dst = slot(target, self.target_sge, self.cfg.order).expect("checked length");
        let mut n = want.min(MAX_TRANSFER).min(dst.length);
        if how != Reserve::External {
            n = n.min(self.sbuf_bytes_avail);
        }
        let spans = if how == Reserve::External {
            Spans::of_ring(0, n, n)
        } else {
            let spans = Spans::of_ring(self.sbuf_head, n, self.cfg.sbuf_size);
            self.sbuf_head = (self.sbuf_head + n) % self.cfg.sbuf_size;
            self.sbuf_bytes_avail -= n;
            spans
        };

        let (addr, rkey) = self.take_slot(target, dst, n);
        match how {
            Reserve::Queue => self.queue_data(
                Source::Sbuf(spans),
                addr,
                rkey,
                n,
                SendTag::DataWrite { len: n },
            ),
            Reserve::External => self.queue_data(
                Source::External { len: n },
                addr,
                rkey,
                n,
                SendTag::ZcopyWrite { len: n },
            ),
        }
        Ok(SendGrant { spans })
    }

    /// A send work request completed (`rs_poll_cq`, send branch).
    pub fn on_send_complete(&mut self, tag: SendTag, ok: bool) -> Result<(), FlowError> {
        let ctrl_outstanding = self
            .ctrl_seqno
            .wrapping_sub(self.ctrl_max_seqno.wrapping_sub(QP_CTRL_SIZE));
        let sq_outstanding = i32::from(self.cfg.sq_size) - QP_CTRL_SIZE as i32 - self.sqe_avail;
        match tag {
            SendTag::DataWrite { len } => {
                if sq_outstanding <= 0 || len > self.cfg.sbuf_size - self.sbuf_bytes_avail {
                    return Err(FlowError::UnexpectedCompletion(tag));
                }
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += len;
            }
            SendTag::ZcopyWrite { .. } | SendTag::DataMsg => {
                if sq_outstanding <= 0 {
                    return Err(FlowError::UnexpectedCompletion(tag));
                }
                self.sqe_avail += 1;
            }
            SendTag::SglWrite | SendTag::SglMsg | SendTag::Ctrl(_) | SendTag::Keepalive => {
                if ctrl_outstanding == 0 {
                    return Err(FlowError::UnexpectedCompletion(tag));
                }
                self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                if tag == SendTag::Ctrl(Ctrl::Disconnect) && ok && self.phase == Phase::Connected {
                    self.disconnected();
                }
            }
        }
        if !ok && self.phase == Phase::Connected {
            return Err(self.fail(FlowError::SendFailed));
        }
        self.flush_pending_ctrl();
        self.update_credits();
        Ok(())
    }

    fn disconnected(&mut self) {
        self.phase = Phase::Disconnected;
        self.readable = false;
        self.writable = false;
        self.pending_ctrl = None;
    }

    /// A receive completed successfully with `payload` (`rs_poll_cq`,
    /// receive branch); queues its repost while connected.
    pub fn on_recv(&mut self, payload: &[u8]) -> Result<(), FlowError> {
        if self.phase == Phase::Error {
            return Err(self.err.unwrap_or(FlowError::SendFailed));
        }
        if self.phase == Phase::Init {
            // The peer is connected before we are: its first credit update
            // can complete here before the driver has seen the CM event
            // with its conn data. Keep the words (at most one per posted
            // receive) until `establish`.
            if payload.len() != crate::wire::MSG_SIZE
                || self.early.len() >= usize::from(self.recv_slots())
            {
                return Err(FlowError::NotConnected);
            }
            self.early.push(payload.try_into().expect("4 bytes"));
            return Ok(());
        }
        let msg = match Message::from_send_payload(payload, self.peer_order) {
            Ok(m) => m,
            Err(e) => return Err(self.fail(FlowError::Protocol(ProtocolError::Malformed(e)))),
        };
        if let Err(p) = self.handle(msg) {
            return Err(self.fail(FlowError::Protocol(p)));
        }
        if self.phase == Phase::Connected {
            self.queue_recv();
        }
        self.update_credits();
        Ok(())
    }

    /// A receive completed with an error (flushed): rsocket.c skips it
    /// without reposting.
    pub fn on_recv_failed(&mut self) {}

    fn handle(&mut self, msg: Message) -> Result<(), ProtocolError> {
        match msg {
            Message::Data { len } => {
                // After our own disconnect the peer may still have data in
                // flight; only data after *its* shutdown is a violation.
                if self.peer_write_closed {
                    return Err(ProtocolError::DataAfterShutdown);
                }
                // The limit we granted is never more than rq_size ahead of
                // the count (limit = rseq_no + rq_size, unread <= rq_size),
                // and the count grows one at a time: it reaches the limit
                // exactly, whatever rq_size (up to 0xFFFE).
                if self.rx_limit.wrapping_sub(self.rx_count) == 0 {
                    return Err(ProtocolError::CreditsExceeded {
                        received: self.rx_count,
                        limit: self.rx_limit,
                    });
                }
                if u64::from(len) > self.rx_window {
                    return Err(ProtocolError::RingOverrun {
                        len,
                        window: self.rx_window,
                    });
                }
                self.rx_count = self.rx_count.wrapping_add(1);
                self.rx_window -= u64::from(len);
                self.rmsg.push_back(len);
                self.rmsg_bytes += u64::from(len);
            }
            Message::Sgl { limit } => {
                let limit = limit as u16;
                // A correct peer sends rseq_no + rq_size with
                // sseq_no - rq_size <= rseq_no <= sseq_no.
                if limit.wrapping_sub(self.sseq_no) > self.peer_rq {
                    return Err(ProtocolError::CreditLimitOutOfRange {
                        limit,
                        sent: self.sseq_no,
                        peer_rq: self.peer_rq,
                    });
                }
                self.sseq_comp = limit;
            }
            Message::Ctrl(Ctrl::Disconnect) => {
                self.peer_write_closed = true;
                self.disconnected();
            }
            Message::Ctrl(Ctrl::Shutdown) => {
                self.peer_write_closed = true;
                if self.writable {
                    self.readable = false;
                } else {
                    self.disconnected();
                }
            }
            Message::Ctrl(Ctrl::Keepalive) => {}
            Message::Write { .. } => return Err(ProtocolError::Unexpected(Op::Write)),
            Message::IomapSgl { index } => self.iomap_announced(index)?,
        }
        Ok(())
    }

    /// Whether a read would not block (`rs_conn_have_rdata`): data queued,
    /// or the reading side is closed (a read returns end of stream).
    pub fn poll_readable(&self) -> bool {
        !self.rmsg.is_empty() || !self.readable
    }

    /// Takes up to `max` queued bytes (`rrecv`): returns where they are in
    /// the receive buffer and updates the ring and credits. Queued data is
    /// still delivered after the peer disconnected (rsocket.c: "Continue to
    /// receive any queued data even if the remote side has disconnected"),
    /// and after a local send error, but not after a protocol violation.
    pub fn recv(&mut self, max: u32) -> Result<RecvGrant, FlowError> {
        if self.rmsg.is_empty() {
            return match self.phase {
                Phase::Init => Err(FlowError::NotConnected),
                Phase::Error => Err(self.err.unwrap_or(FlowError::SendFailed)),
                _ if !self.readable => Ok(RecvGrant {
                    spans: Spans::of_ring(self.rbuf_offset, 0, self.ring),
                    eof: true,
                }),
                _ => Err(FlowError::WouldBlock),
            };
        }
        let mut left = max;
        let mut taken = 0u32;
        while left > 0 {
            let Some(head) = self.rmsg.front_mut() else {
                break;
            };
            if left < *head {
                *head -= left;
                taken += left;
                left = 0;
            } else {
                let n = *head;
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
                taken += n;
                left -= n;
            }
        }
        self.rmsg_bytes -= u64::from(taken);
        let spans = Spans::of_ring(self.rbuf_offset, taken, self.ring);
        self.rbuf_offset = (self.rbuf_offset + taken) % self.ring;
        self.rbuf_bytes_avail += taken;
        self.update_credits();
        Ok(RecvGrant { spans, eof: false })
    }

    /// The receive ring in use: `rbuf_size`, or more once it grew.
    pub fn ring_size(&self) -> u32 {
        self.ring
    }

    /// Let the receive ring grow toward `goal` bytes, within `capacity`
    /// (the bytes registered for it, from the start of the receive
    /// region; the message slots must lie beyond). The driver measures the
    /// path (`crate::tune`) and calls this; the ring never shrinks.
    ///
    /// The wire does not change: rsocket.c's sender writes wherever the
    /// receiver's target-SGL entries point, for their length, one entry
    /// after the other (`rs_write_data`), and never reads the size of our
    /// ring. So the ring grows by doubling at the moment its free offset
    /// wraps to 0 (the half at offset 0 has been read, the other half is
    /// still the peer's): instead of advertising the half at 0 again, we
    /// advertise the untouched `[size, 2 * size)` as one entry, the new
    /// half. The peer fills it right after the old second half, so the
    /// reader runs on past the old end instead of wrapping, and from then
    /// on the ring is twice as large, its halves `size` bytes. A ring that
    /// covers twice the bandwidth-delay product keeps the sender busy
    /// (what the peer may have in flight is between one and two halves).
    pub fn set_ring_goal(&mut self, goal: u32, capacity: u32) {
        self.ring_cap = capacity.clamp(self.cfg.rbuf_size, MAX_BUF);
        self.ring_goal = goal.min(self.ring_cap);
        self.update_credits();
    }

    /// Whether the ring doubles at this advertisement (see
    /// [`Flow::set_ring_goal`]).
    fn ring_grows_now(&self) -> bool {
        self.rbuf_free_offset == 0
            && self.ring < self.ring_goal
            && u64::from(self.ring) * 2 <= u64::from(self.ring_cap)
    }

    /// `rs_give_credits` (iWARP) then `rs_send_credits`, as often as it
    /// holds; with [`Flow::acks_each`] also whenever the limit moved.
    fn update_credits(&mut self) {
        while self.phase == Phase::Connected
            && (self.rbuf_bytes_avail >= self.ring >> 1
                || self.rseq_no.wrapping_sub(self.rseq_comp) as i16 >= 0
                || (self.ack_each && self.rseq_no.wrapping_add(self.cfg.rq_size) != self.rx_limit))
            && self.two_ctrl_avail()
        {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            self.rseq_comp = self.rseq_no.wrapping_add(self.cfg.rq_size >> 1);
            // The value is computed in int in rsocket.c: it may pass 0xFFFF.
            let limit = u32::from(self.rseq_no) + u32::from(self.cfg.rq_size);
            self.rx_limit = limit as u16;
            let payload = self.word(Message::Sgl { limit });
            let half = self.ring >> 1;
            if self.rbuf_bytes_avail >= half {
                self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
                let grow = self.ring_grows_now();
                let (offset, len) = if grow {
                    (self.ring, self.ring)
                } else {
                    (self.rbuf_free_offset, half)
                };
                let sge = Sge {
                    addr: self.cfg.rbuf.addr.wrapping_add(u64::from(offset)),
                    key: self.cfg.rbuf.key,
                    length: len,
                };
                // RS_OPT_SWAP_SGL: the entry goes in the peer's order.
                let bytes = sge.to_bytes(self.peer_order);
                self.actions.push_back(Action::RdmaWrite {
                    src: Source::Inline(bytes),
                    remote_addr: self
                        .remote_sgl
                        .addr
                        .wrapping_add(u64::from(self.remote_sge) * SGE_LEN as u64),
                    rkey: self.remote_sgl.key,
                    tag: SendTag::SglWrite,
                });
                self.actions.push_back(Action::Send {
                    payload,
                    tag: SendTag::SglMsg,
                });
                if grow {
                    // Fresh memory: nothing read is used up, and the free
                    // bytes at offset 0 wait for the first new half.
                    if self.rbuf_offset == 0 {
                        // The reader had read everything up to the old
                        // end; the next bytes land at the old end.
                        self.rbuf_offset = self.ring;
                    }
                    self.ring *= 2;
                    tracing::debug!(ring = self.ring, "receive ring grew");
                } else {
                    self.rbuf_bytes_avail -= half;
                    self.rbuf_free_offset += half;
                    if self.rbuf_free_offset >= self.ring {
                        self.rbuf_free_offset = 0;
                    }
                }
                self.rx_window += u64::from(len);
                self.remote_sge += 1;
                if self.remote_sge == self.remote_sgl.length {
                    self.remote_sge = 0;
                }
            } else {
                self.actions.push_back(Action::Send {
                    payload,
                    tag: SendTag::SglMsg,
                });
            }
        }
    }

    fn flush_pending_ctrl(&mut self) {
        // A control word never overtakes buffered data (SHUTDOWN after the
        // last byte).
        if self.phase == Phase::Connected && self.ctrl_avail() && self.pend_len == 0 {
            if let Some(c) = self.pending_ctrl.take() {
                self.post_ctrl(c);
            }
        }
    }

    fn post_ctrl(&mut self, c: Ctrl) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        let payload = self.word(Message::Ctrl(c));
        self.actions.push_back(Action::Send {
            payload,
            tag: SendTag::Ctrl(c),
        });
    }

    /// `rshutdown(how)`: closes a side and queues the control word it
    /// calls for, now or as soon as a control slot is free.
    pub fn shutdown(&mut self, how: Shutdown) -> Result<(), FlowError> {
        if self.phase != Phase::Connected {
            return Ok(());
        }
        let ctrl = match how {
            Shutdown::Both => {
                self.readable = false;
                self.writable = false;
                Ctrl::Disconnect
            }
            Shutdown::Write => {
                self.writable = false;
                if self.readable {
                    Ctrl::Shutdown
                } else {
                    Ctrl::Disconnect
                }
            }
            Shutdown::Read => {
                self.readable = false;
                if self.writable {
                    return Ok(());
                }
                Ctrl::Disconnect
            }
        };
        if self.ctrl_avail() && self.pending_ctrl.is_none() && self.pend_len == 0 {
            self.post_ctrl(ctrl);
        } else {
            self.pending_ctrl = Some(ctrl);
        }
        Ok(())
    }

    /// `rs_conn_all_sends_done`: no work request outstanding, or not
    /// connected any more.
    pub fn all_sends_done(&self) -> bool {
        let ctrl_free = self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) as i32;
        (ctrl_free + self.sqe_avail == i32::from(self.cfg.sq_size) && self.pend_len == 0)
            || self.phase != Phase::Connected
    }

    /// `tcp_svc_send_keepalive`: queues a zero-length RDMA Write if a
    /// control slot is free; returns whether it did.
    pub fn keepalive(&mut self) -> bool {
        if self.phase == Phase::Connected && self.ctrl_avail() {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            self.actions.push_back(Action::RdmaWrite {
                src: Source::Empty,
                remote_addr: 0,
                rkey: 0,
                tag: SendTag::Keepalive,
            });
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests;
