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

mod call;
mod complete;
mod io;
mod iomap;
mod maps;
mod post;
mod setup;
mod types;
mod wrid;

pub use iomap::IoMap;
pub(crate) use setup::{accept, connect};
pub(crate) use types::{cm_err, Conn};
pub use types::{Stats, Watermark, WatermarkFn};
