//! The iWARP side of the tests, on the `iwarp` verbs API.
//!
//! # Roles
//!
//! The **client** (the side that connects) drives every test and measures:
//! it posts the Writes, Reads and Sends of the bandwidth tests and is the
//! pinging side of the latency tests. The **server** (the side that
//! accepts) is passive in write_bw / read_bw / read_lat, keeps receives
//! posted in send_bw, and echoes in write_lat / send_lat.
//!
//! # Buffers of one connection
//!
//! - `data`: the message buffers. One message slot normally (every
//!   operation uses the same bytes, as perftest does); with `--integrity`
//!   one slot per outstanding operation, so each in-flight message keeps
//!   its own pattern. write_lat uses slot 0 as its source and lets the
//!   peer write into slot 1.
//! - `recv`: receive buffers (send tests: message-sized; otherwise only
//!   the 32-byte control messages).
//! - `ctrl`: 4 KiB: a credit word the peer RDMA-Writes (`[v, !v]`, so a
//!   torn read is detected), staging slots for our own credit Writes, and
//!   the control message being sent.
//!
//! # Flow control and the final handshake
//!
//! iWARP has no receiver-not-ready retry: a Send that finds no posted
//! receive is fatal (RFC 5040 §5.3, the QP is terminated). So send_bw
//! runs on credits: the receiver RDMA-Writes its count of posted receives
//! into the sender's credit word and the sender never sends past it. With
//! `--integrity`, write_bw uses the same credits to keep the sender from
//! overwriting a slot the receiver has not verified yet.
//!
//! Every test ends with a handshake of two control messages (Sends with
//! the Solicited Event flag, which is how the receiver tells them from
//! data): the client sends DONE (messages sent, checksum sum) after its
//! last operation completed, the server answers ACK (messages seen,
//! checksum sum). The client stops its clock at the ACK, so a bandwidth
//! includes the time for the last byte to be placed at the receiver.
//!
//! # Waiting
//!
//! Each side sets its two CQs' progress mode before connecting:
//! `ProgressMode::BusyPoll` with `--busy-poll` (the waiting thread does the
//! receive work and never sleeps), else `ProgressMode::Threaded` with
//! `iwarp::DEFAULT_SPIN` (receive threads read; `wait` polls briefly, then
//! sleeps). Every wait goes through `iwarp::wait::WaitSet` (docs/WAITING.md):
//! a wait for a completion is the set's wait on that CQ, bounded by
//! `--timeout`. Waits on memory (write_lat's last byte, credit words,
//! write_bw `--integrity` stamps) spin in `Waiter::idle`, calling the
//! set's busy round (`WaitSet::progress`) in busy-poll mode.
//!
//! # Modules
//!
//! - `conn`: setup — one connection's QP and buffers, a [`Side`], connect
//!   and accept.
//! - `bw`: the bandwidth tests (client and server).
//! - `lat`: the latency tests and the iteration clock shared with TCP.
//! - `wait`: shared helpers — bounded waiting, completion checks, the
//!   final DONE / ACK handshake.

mod bw;
mod conn;
mod lat;
mod wait;

use std::time::{Duration, Instant};

use iwarp_proto::handshake::{MpaConfig, Policy};

use crate::params::{Params, Test};
use crate::report::LatStats;

use bw::{client_bw, server_bw};
pub use conn::{accept, connect, Side};
use conn::{fill_slot, stamp};
use lat::*;
pub use lat::{warmup, LatClock};
use wait::*;

const CTRL_LEN: usize = 4096;
const CREDIT_OFF: usize = 0;
const STAGE_OFF: usize = 64;
const STAGE_SLOTS: u64 = 16;
const MSG_OFF: usize = 512;
/// The smallest receive buffer, and the longest control message.
const CTRL_MSG: usize = 32;
/// The bytes of a control message that carry something (kind, count, sum).
const CTRL_BODY: usize = 24;
const DONE: u64 = 0x444f_4e45;
const ACK: u64 = 0x0041_434b;

const K_DATA: u64 = 1;
const K_CTRL: u64 = 2;
const K_CREDIT: u64 = 3;
const K_RECV: u64 = 4;
/// The client's zero-length Write right after connecting (unsignaled).
const K_HELLO: u64 = 5;

/// Extra send-queue entries beyond the data window (credit Writes and
/// control messages).
const SQ_EXTRA: u32 = STAGE_SLOTS as u32 + 8;

/// How long a control message (DONE / ACK) is in a run of `size`-byte
/// messages: [`CTRL_BODY`] bytes, or [`CTRL_MSG`] when the messages are
/// themselves `CTRL_BODY` bytes, so that a receive's length alone tells a
/// control message from data. Both ends know `size`. (The Solicited Event
/// flag, which this used to rely on, is not in rdma-core's `ibv_wc`, so a
/// kernel device could not tell.)
fn ctrl_len(size: usize) -> usize {
    if size == CTRL_BODY {
        CTRL_MSG
    } else {
        CTRL_BODY
    }
}

/// Whether a receive of `byte_len` bytes is a control message in a run
/// of `size`-byte messages (see [`ctrl_len`]).
fn is_ctrl(byte_len: u32, size: usize) -> bool {
    byte_len as usize == ctrl_len(size)
}

fn wrid(kind: u64, qp: u32, seq: u64) -> u64 {
    kind << 56 | (u64::from(qp) & 0xffff) << 40 | (seq & ((1 << 40) - 1))
}

fn split_wrid(id: u64) -> (u64, usize, u64) {
    (
        id >> 56,
        ((id >> 40) & 0xffff) as usize,
        id & ((1 << 40) - 1),
    )
}

/// Which end a [`Side`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// The MPA configuration for `--crc` / `--markers`: `Some(true)` requires,
/// `Some(false)` refuses, `None` (a server without the option) follows the
/// client. IRD/ORD are requested as `depth`, so read_bw can keep `depth`
/// Reads outstanding (RFC 6581 negotiates the minimum of both ends).
pub fn mpa_config(crc: Option<bool>, markers: Option<bool>, ird_ord: u32) -> MpaConfig {
    let pol = |o: Option<bool>| match o {
        Some(true) => Policy::Required,
        Some(false) => Policy::Off,
        None => Policy::Optional,
    };
    let v = ird_ord.clamp(1, 0x3fff) as u16;
    MpaConfig {
        crc: pol(crc),
        markers: pol(markers),
        ird: v,
        ord: v,
        ..MpaConfig::default()
    }
}

/// Slots of the data buffer.
fn data_slots(p: &Params) -> usize {
    match p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw if p.integrity => p.depth as usize,
        Test::WriteLat => 2,
        _ => 1,
    }
}

/// Receive-queue depth of `role`.
fn rq_depth(p: &Params, role: Role) -> u32 {
    match (p.test, role) {
        (Test::SendBw, Role::Server) => (p.depth.saturating_mul(2)).clamp(8, 4096),
        (Test::SendLat, _) => 8,
        _ => 4,
    }
}

/// (receive slot size, receive slots) of `role`.
fn recv_layout(p: &Params, role: Role) -> (usize, usize) {
    let rq = rq_depth(p, role) as usize;
    match (p.test, role) {
        (Test::SendBw, Role::Server) if p.integrity => (p.size.max(CTRL_MSG), rq),
        (Test::SendBw, Role::Server) | (Test::SendLat, _) => (p.size.max(CTRL_MSG), 1),
        _ => (CTRL_MSG, rq),
    }
}

/// What the client measured.
pub struct ClientResult {
    pub msgs: u64,
    pub elapsed: Duration,
    pub lat: Option<LatStats>,
    pub verified: u64,
    /// Bandwidth runs: the process's CPU seconds over exactly the span of
    /// `elapsed` (from the common start to the last ACK), so the two can be
    /// compared. `None`: the caller's whole window is used.
    pub span_cpu_s: Option<f64>,
}

/// Run the client role of the test.
pub fn run_client(side: &mut Side) -> Result<ClientResult, String> {
    match side.p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => client_bw(side),
        Test::WriteLat => client_write_lat(side),
        Test::ReadLat => client_read_lat(side),
        Test::SendLat => client_send_lat(side),
    }
}

/// Run the server role of the test; returns messages verified.
pub fn run_server(side: &mut Side) -> Result<u64, String> {
    let v = match side.p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => server_bw(side),
        Test::WriteLat => server_write_lat(side),
        Test::ReadLat => server_passive(side),
        Test::SendLat => server_send_lat(side),
    }?;
    // The client closes first, once it has our ACK; closing before that
    // could flush its last receive. Bounded by --timeout.
    let deadline = Instant::now() + side.p.timeout;
    for c in &side.conns {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match c.qp.next_event(left) {
                Some(iwarp::QpEvent::Disconnected) | None => break,
                Some(_) => {}
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_message_is_never_as_long_as_data() {
        for size in [1, 8, 23, 24, 25, 31, 32, 33, 4096, 65536] {
            let n = ctrl_len(size);
            assert_ne!(n, size, "size {size}");
            assert!((CTRL_BODY..=CTRL_MSG).contains(&n), "size {size}: {n}");
            assert!(is_ctrl(n as u32, size));
            assert!(!is_ctrl(size as u32, size));
        }
    }
}
