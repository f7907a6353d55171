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
//! halves, and a **target SGL** (`RS_SGL_SIZE` = 2 [`Sge`](crate::wire::Sge) slots, 32 bytes,
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

mod close;
mod error;
mod iomap;
mod iomaps;
mod recv;
mod send;
mod state;
mod types;

pub use error::{FlowError, ProtocolError};
pub use iomap::{IomapError, IomapGrant, DIRECT_MAX, IOMAP_SIZE_MAX};
pub use state::Flow;
pub use types::{
    max_rq_size, recv_slots_for, Action, Config, Phase, RecvGrant, Region, SendGrant, SendTag,
    Shutdown, Source, Span, Spans, CREDIT_RESERVE, MAX_BUF, MAX_TRANSFER, QP_CTRL_SIZE,
    QP_MAX_SIZE, QP_MIN_SIZE, RQ_EXTRA, SNDLOWAT, TARGET_SGL_LEN,
};

#[cfg(test)]
mod tests;
