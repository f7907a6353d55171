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
//! Each imports only the ones listed before it (no circle, nothing taken
//! from this module):
//!
//! - `layout`: what both ends agree on: the control buffer's layout, the
//!   control messages, work request ids, buffer and queue sizes.
//! - `wait`: bounded waiting ([`wait::Waiter`]), the CQs' progress mode,
//!   completion checks.
//! - `conn`: setup — one connection's QP and buffers, a [`Side`], connect
//!   and accept.
//! - `finish`: the final DONE / ACK exchange of control messages.
//! - `bw`: the bandwidth tests (client and server).
//! - `lat`: the latency tests and the iteration clock shared with TCP.

mod bw;
mod conn;
mod finish;
mod lat;
mod layout;
mod wait;

use std::time::Instant;

use iwarp_proto::handshake::{MpaConfig, Policy};

use crate::params::Test;
use crate::report::ClientResult;

pub use conn::{accept, connect, Side};
pub use lat::{warmup, LatClock};

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

/// Run the client role of the test.
pub fn run_client(side: &mut Side) -> Result<ClientResult, String> {
    match side.p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => bw::client_bw(side),
        Test::WriteLat => lat::client_write_lat(side),
        Test::ReadLat => lat::client_read_lat(side),
        Test::SendLat => lat::client_send_lat(side),
    }
}

/// Run the server role of the test; returns messages verified.
pub fn run_server(side: &mut Side) -> Result<u64, String> {
    let v = match side.p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => bw::server_bw(side),
        Test::WriteLat => lat::server_write_lat(side),
        Test::ReadLat => lat::server_passive(side),
        Test::SendLat => lat::server_send_lat(side),
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
