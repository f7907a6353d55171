//! # iwarp-sockets: rsockets over iWARP
//!
//! A byte-stream socket library over RDMA that is wire-compatible with
//! librdmacm's **rsockets** in its iWARP mode (`librdmacm/rsocket.c` of
//! linux-rdma/rdma-core), so that a program using this crate can talk to
//! `rstream`, `riostream` or anything under `librspreload.so` on a host
//! with kernel siw or an iWARP RNIC.
//!
//! The protocol layer is sans-IO, like `iwarp-proto` under the verbs
//! crate: no sockets, no queue pairs, no threads, no clock.
//!
//! - [`wire`]: the formats. The 32-bit message word ([`wire::MsgWord`],
//!   [`wire::Message`]), `struct rs_conn_data` ([`wire::ConnData`] view,
//!   [`wire::ConnDataRepr`]), and the `rs_sge` / `rs_iomap` entries the
//!   peers RDMA-Write into each other ([`wire::Sge`], [`wire::Iomap`]).
//! - [`flow`]: the state machine of one stream connection. It tracks
//!   credits, send-queue and control slots, the send buffer ring, the
//!   peer's target SGL and our receive ring, shutdown and keepalive. It
//!   consumes events and produces [`flow::Action`]s: post a receive, post
//!   an RDMA Write, post a Send.
//!
//! Above it: the driver over the `iwarp` verbs API (`conn`, private),
//! the `std::net`-shaped [`Stream`] and [`Listener`], [`Options`] with the
//! basic and enhanced designs, the [`progress`] thread, and the tokio
//! wrapper. The `rsocket.h`-style C API is the `iwarp-rsocket` crate, the
//! preload shim with its TCP fallback `iwarp-preload`; docs/SOCKETS.md
//! says what works.
//!
//! ## The rsocket.c facts this crate rests on
//!
//! Each fact names where in `librdmacm/rsocket.c` it comes from.
//!
//! | Fact | Source in rsocket.c |
//! |---|---|
//! | The message word is `op << 29 \| value`: 3-bit op, 29-bit value | `rs_msg_set`, `rs_msg_op`, `rs_msg_data` macros; the "Immediate data format" comment |
//! | Ops in order: DATA 0, RSVD_DATA_MORE 1, WRITE 2 (never sent), RSVD_DRA_MORE 3, SGL 4, RSVD 5, IOMAP_SGL 6, CTRL 7 | the anonymous `enum { RS_OP_DATA, ... }` |
//! | CTRL values: DISCONNECT 0, KEEPALIVE 1, SHUTDOWN 2 | `enum { RS_CTRL_DISCONNECT, ... }` |
//! | iWARP sends the word as a 4-byte inline Send, not Write-with-Immediate | `rs_create_ep`: `IBV_TRANSPORT_IWARP` sets `RS_OPT_MSG_SEND`; `rs_post_msg`, `rs_post_write_msg` |
//! | That payload is the sender's **host-order** `uint32_t` (little endian on x86-64/arm64), not `htonl`'d | `rs_post_msg`: `sge.addr = (uintptr_t) &msg`; `rs_poll_cq`: `msg = ((uint32_t *) (rs->rbuf + rs->rbuf_size))[...]` without `ntohl` (only the immediate branch has `ntohl(wc.imm_data)`) |
//! | A data transfer is an RDMA Write into the peer's ring, then the DATA word as a Send | `rs_write_data` → `rs_post_write_msg` |
//! | `rs_conn_data` is 40 bytes, all fields big endian | `struct rs_conn_data`, `rs_format_conn_data` (`htons`, `htonl`, `htonll`) |
//! | `rs_sge` is addr, **key**, length (in that order) | `struct rs_sge` |
//! | `RS_CONN_FLAG_NET` = the sender's host is big endian; a differing peer gets its SGEs byte-swapped | `rs_host_is_net()`, `rs_format_conn_data`, `rs_save_conn_data` (`RS_OPT_SWAP_SGL`), `rs_send_credits` (`bswap_64`/`bswap_32`) |
//! | Only `version == 1` is checked; the length of the private data is not | `raccept`, `rs_do_connect` |
//! | Flag bits other than NET and IOMAP are neither set nor read | `rs_format_conn_data`, `rs_save_conn_data` |
//! | On iWARP nothing precedes `rs_conn_data` in the private data | `rs_conn_data_offset` (header only for `AF_IB`); kernel `cma_connect_iw` passes the private data through |
//! | Credits count data messages; the first credit is the peer's `rq_size`, then `RS_OP_SGL` carries `rseq_no + rq_size` taken mod 2^16 | `rs_save_conn_data` (`sseq_comp = ntohs(conn->credits)`), `rs_send_credits`, `rs_poll_cq` (`(uint16_t) rs_msg_data(msg)`) |
//! | The receive ring is used in halves; the first half goes in the conn data, each freed half is RDMA-Written as an `rs_sge` into the peer's 2-slot target SGL | `rs_init_bufs`, `rs_format_conn_data`, `rs_send_credits`, `RS_SGL_SIZE` |
//! | Sending needs 2 free send-queue entries on iWARP, ≥ 2048 bytes of send buffer, a credit, and a non-empty target slot | `rs_can_send` |
//! | At most 4 control work requests are outstanding, carved out of the send queue | `RS_QP_CTRL_SIZE`, `rs_init_bufs`, `rs_ctrl_avail`, `rs_2ctrl_avail` |
//! | Shutdown: SHUT_RDWR → DISCONNECT; SHUT_WR → SHUTDOWN, or DISCONNECT if no longer readable; SHUT_RD → DISCONNECT only if no longer writable | `rshutdown` |
//! | Keepalive is a zero-length plain RDMA Write to address 0, rkey 0; the peer sees no message | `tcp_svc_send_keepalive` → `rs_post_write` |
//! | The iomap table (`target_iomap_size` entries of `rs_iomap`, 24 bytes) follows the 2-entry target SGL in the same region; the peer finds it at `target_sgl.addr + 16 * target_sgl.length` with the SGL's rkey | `rs_init_bufs`, `rs_save_conn_data` (`remote_iomap`) |
//! | `riomap` takes the first free entry of the peer's table, RDMA-Writes the `rs_iomap` (peer's order) to `table + 24 * index`, then sends `RS_OP_IOMAP_SGL | index`, costing a credit like data | `rs_get_iomap_mr`, `rs_send_iomaps`, `rs_write_iomap` |
//! | `riowrite` is plain RDMA Writes to `entry.addr + offset - entry.offset`; `RS_OP_WRITE` tags the local work request only and is never transmitted; `riounmap` tells the peer nothing | `rs_write_direct`, `rs_post_write`, `riounmap` |
//!
//! ## What we add, between two of our own ends only
//!
//! The basic design's per-message credit return ([`flow::Config::ack_each`])
//! needs a peer that keeps a receive for every update; an end that does
//! says so with [`wire::CONN_FLAG_ACK_EACH`], bit 7 of the conn data's
//! flags, which rsocket.c ignores (above). Nothing else on the wire
//! differs from rsocket.c.
//!
//! ## Where we are stricter than rsocket.c
//!
//! rsocket.c trusts its peer. This crate refuses reserved ops, unknown
//! control values, private data shorter than 40 bytes, data beyond the
//! granted credits or the advertised ring, credit limits that go
//! backwards, and data after the peer's shutdown. Each is an error that
//! ends the connection ([`flow::ProtocolError`], reported as
//! `ConnectionReset`).
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

mod conn;
pub mod flow;
mod held;
mod net;
mod options;
pub mod poll;
pub mod progress;
mod ready;
mod sys;
#[cfg(feature = "tokio")]
pub mod tokio_io;
pub mod tune;
pub mod wire;

pub use conn::{IoMap, Stats, Watermark, WatermarkFn};
pub use held::MAX_HELD;
pub use iwarp::cm::TcpConnect;
pub use net::{never_reached_tcp, Listener, Stream};
pub use options::{Design, Options, DEFAULT_ZCOPY_THRESHOLD};
