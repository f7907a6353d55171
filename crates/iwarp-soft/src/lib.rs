//! # iwarp-soft: the software provider
//!
//! The sans-IO engine of [`iwarp_proto`] driven over
//! a TCP socket, with a receive thread, a transmit thread, and the
//! opportunistic work done by application threads.
//!
//! # Files
//!
//! The same roles as the rdma-core provider's files (`iwarp-rdmacore`)
//! where they make sense:
//!
//! - `device.rs`: the device (`SoftDevice`: `DeviceOps` of
//!   `iwarp_verbs::device_ops`). Completion queues need no device object:
//!   a QP completes into the verbs `CompletionQueue` directly, so there is
//!   no `cq.rs`.
//! - `mr.rs`: protection domains (`SoftPd`: `PdOps`); memory regions need
//!   nothing beyond the context's region table.
//! - `qp.rs`: the queue pair as the verbs layer sees it (creating one,
//!   `QpOps` and `CqSource` of `iwarp_verbs::provider`).
//! - [`cm`]: the connection manager (TCP connect/accept and the MPA
//!   handshake, RFC 5044 §7 and RFC 6581), which hands a handshaken socket
//!   to `conn`; the connection-manager parts of the seam (`DeviceCm`,
//!   `QpCm`, `ListenerOps`, `RequestOps`).
//! - `state.rs`: the leaf every other file works on: `SoftQp` (the engine
//!   behind its mutex, the event queue, the connection once there is one),
//!   `Conn` (socket, receive and transmit state, the flags of who reads),
//!   the engine guard and `pump`. It imports no sibling.
//! - `conn.rs`: what a connection does with that state: liveness rules,
//!   handing the right to read between threads, losing the connection.
//! - `rx.rs`: one receive pass (buffered or straight into a region).
//! - `tx.rs`: frames out of the engine and onto the socket, and the
//!   transmit thread.
//! - `progress.rs`: **who reads this socket now** (the receive thread, a
//!   polling application thread, or only application threads), how the
//!   receive thread steps aside, and starting and tearing down a
//!   connection's threads; on `rx` and `tx`.
//! - [`pool`]: the progress pool, the other engine: a fixed set of
//!   threads (epoll, edge-triggered) that does the receive and transmit
//!   work of every connection of the process, chosen with
//!   `IWARP_PROGRESS=pool` or [`set_progress_engine`]; on `rx` and `tx`,
//!   used by `progress` to start a connection. The default is still one
//!   receive and one transmit thread per connection, described below; on
//!   a pooled connection the pool thread plays both threads' parts (see
//!   the `pool` module docs), and the receive work is handed between it
//!   and application threads by `Conn::claim_rx` instead of the `rx`
//!   lock's `try_lock`.
//! - `link.rs`: FPDU sizing from the TCP MSS and the socket options.
//! - `sys.rs`: the data-path system calls (`recv` into registered memory,
//!   gather `sendmsg` from it, `TCP_INFO`, `SIOCOUTQ`).
//!
//! So the files form a chain with no circle: `state` at the bottom;
//! `conn`, `rx`, `tx`, `qp` on it; `pool` on `rx` and `tx`; `progress` on
//! those and `pool`; `mr` on `qp`, `device` on `mr`; `cm` on `device`,
//! `qp` and `state`. The crate depends on `iwarp-verbs` (the verbs types
//! and the seam's traits) and `iwarp-proto`, never on the facade `iwarp`
//! or on the other provider.
//!
//! # `unsafe`
//!
//! Only at the memory edge, each use with a `// SAFETY:` comment: `sys.rs`
//! (the system calls that take pointers into registered memory, and
//! `TCP_INFO`/`SIOCOUTQ`), its two pointer-taking callers `rx.rs` (one
//! scatter `recv` straight into a region) and `tx.rs` (one gather
//! `sendmsg` from regions), `Send` for the reusable iovec buffer that is
//! empty between those calls (`state.rs`, where the transmit state
//! lives), and the progress pool's `epoll` calls (`pool.rs`). The other
//! files have none.
//!
//! # Threads and locks
//!
//! Per connected QP there is one **receive thread** and one **transmit
//! thread**; application threads also do receive work when they call
//! `CompletionQueue::progress`, or wait in a busy-poll or application-driven CQ (`Conn::progress`). The state they share:
//!
//! | lock | guards | held across |
//! |------|--------|-------------|
//! | `rx` (`Mutex<RxState>`) | the receive buffer and the right to read the socket | non-blocking `recv` calls and engine calls, and the receive thread's blocking `recv` while no application thread polls (`rx_exclusive`, which returns once one does). The receive thread `lock`s it, application threads only `try_lock` it |
//! | `tx` (`Mutex<TxState>`) | the frame being written and how much of it is out | non-blocking `send`/`sendmsg` calls and engine calls; never a wait (the transmit thread waits for socket space holding nothing). Every thread but the transmit thread only `try_lock`s it |
//! | `engine` (`Mutex<Engine>`) | the sans-IO engine | engine calls only; never a system call on the socket |
//! | MR table (`RwLock`, read side) | region lookup | the lookup only (the region's `Arc` is cloned out) |
//! | CQ / event queue mutexes | the queues | a push or a pop |
//!
//! Lock order is `rx` → `tx` → `engine` → MR table / CQ / event queue;
//! nothing is ever acquired in the other direction, so the locks cannot
//! deadlock. (A CQ's list of attached QPs is taken only by a polling
//! thread, before any of these, and with `try_lock`.)
//!
//! **Receive work** (`rx_pass`), by whoever holds `rx`, never blocks:
//! lock the engine to ask [`Engine::rx_hint`](iwarp_proto::engine::Engine::rx_hint), unlock, then read with a
//! non-blocking `recv` (a `Buffered` hint is kept until the next bytes are
//! fed, since only input can turn it into `Direct`: a busy poller's empty
//! looks take no engine lock): large tagged payload (≥ [`DIRECT_MIN`]) goes
//! straight into the target region (zero-copy placement; the region is held
//! only for that copy), everything else into a reusable 256 KiB buffer.
//! Buffered reads from an empty buffer are kept short ([`RX_READ`], or
//! [`HDR_PEEK`] during bulk tagged traffic) so that segment payloads are
//! left in the socket for the direct path rather than copied twice. Then it
//! locks the engine, feeds the bytes ([`Engine::handle_input`](iwarp_proto::engine::Engine::handle_input) /
//! [`Engine::handle_direct`](iwarp_proto::engine::Engine::handle_direct)), drains completions into the CQs and events
//! into the QP's event queue, unlocks, and if the engine has something to
//! send tries one *non-blocking* transmit pass (or wakes the transmit
//! thread). Nobody doing receive work ever blocks on a write, so two peers
//! that are both sending a lot cannot end up both blocked in `write` with
//! nobody reading.
//!
//! **Receive thread** (`rx_loop`): while no application thread calls
//! `progress`, it holds `rx` and blocks in `recv` (one system call per
//! wake-up); once one does, it waits for readability with `poll` holding
//! no lock, then takes `rx` and drains the socket. This is what
//! makes one-sided operations progress while the application computes
//! (RFC 5040 requires no help from the target's application). While an
//! application thread busy-polls, the receive thread steps aside (see
//! `rx_loop`) so that arriving data does not wake a second thread to
//! compete for the CPU: the polling thread reads its own socket, as a
//! spinning TCP reader does, which removes a thread hand-off from every
//! message's latency.
//!
//! **Transmit path.** Whoever holds `tx` loops: lock the engine,
//! [`Engine::poll_transmit`](iwarp_proto::engine::Engine::poll_transmit) into the shared [`TxFrame`](iwarp_proto::engine::TxFrame), unlock, write the
//! frame's pieces with one gather `sendmsg` (inline headers from the frame,
//! payload straight from registered memory; a frame of at most
//! [`SMALL_SEND`] bytes is copied and written with one `send`), handle
//! partial writes, and
//! once the whole frame is out lock the engine and
//! [`Engine::confirm_transmit`](iwarp_proto::engine::Engine::confirm_transmit). An application thread in `post_send` takes
//! `tx` only with `try_lock` and only writes non-blocking: on `EAGAIN` or
//! if `tx` is busy it wakes the transmit thread, which is the only one that
//! waits for socket space (with `poll`, in 100 ms slices so it notices a
//! stop request), and it waits *without* holding `tx`: an application
//! thread in `progress` (waiting for this very transfer) pushes a partly
//! written frame on itself whenever it finds `tx` free, so a large Write or
//! Read Response keeps moving while the transmit thread waits to be
//! scheduled. After releasing `tx`, every writer re-checks
//! [`Engine::has_transmit`](iwarp_proto::engine::Engine::has_transmit) and wakes the transmit thread if work appeared
//! meanwhile; the wake flag is sticky, so no wake-up is lost.
//!
//! **Teardown.** EOF, a read error or a write error first confirms a frame
//! that is already entirely in the socket (the receive thread sets the stop
//! flag and takes `tx` with a bounded `try_lock` wait, so a Send the peer
//! read just before closing still completes successfully), then calls
//! [`Engine::on_peer_closed`](iwarp_proto::engine::Engine::on_peer_closed) (every other outstanding work request is
//! flushed into the CQs at once), queues [`QpEvent::Disconnected`](iwarp_verbs::QpEvent::Disconnected), sets the stop
//! flag and shuts the socket down, which wakes a thread blocked in `read`
//! or `poll`. When the engine [`wants_close`](iwarp_proto::engine::Engine::wants_close) (after a
//! Terminate, or a local close) the transmit path writes what is left and
//! shuts down the write side, so the peer sees EOF. `disconnect` and `Drop`
//! give the last frames up to [`LINGER`] to leave, shut the socket down in
//! both directions and wait (bounded) for both threads to exit.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
mod conn;
mod device;
pub(crate) mod link;
mod mr;
pub mod pool;
mod progress;
mod qp;
mod rx;
mod state;
mod sys;
mod tx;

pub use device::SoftDevice;
pub use link::{mulpdu_for_mss, mulpdu_for_path, MULPDU_CAP};
pub use pool::{
    pool_stats, progress_engine, set_progress_engine, PoolStats, ProgressEngine, ENV_ENGINE,
    ENV_THREADS,
};
pub use progress::{ENV_FIN_WAIT, FIN_WAIT, LINGER};
pub use rx::{DIRECT_MIN, DIRECT_TAIL, HDR_PEEK, RX_READ};
pub use state::{RX_BUF, SMALL_SEND};
pub use tx::{fault, TX_BATCH};
