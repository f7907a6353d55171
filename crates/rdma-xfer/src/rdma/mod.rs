//! The RDMA transport: one control QP and N data QPs per session, all on
//! one completion queue.
//!
//! # Control channel and credits
//!
//! An RDMAP Send needs a posted receive at the peer, or the peer's QP
//! goes to error (RFC 5040 §5.3, DDP RFC 5041 §7.2 "no buffer"). Each
//! side posts [`CTRL_RECVS`] receives on the control QP and reposts each
//! one as it consumes it; every message returns the count reposted since
//! the previous message in its `credits` field. A sender spends one credit
//! per message and keeps the last one for a `Credit` message, so two
//! sides that both run out of credits can always return them.
//!
//! # Data channel
//!
//! The source posts, per block, an unsignaled RDMA Write into a granted
//! sink block and a signaled Send carrying `BlockDone` on the same data
//! QP; the Send's completion frees the local block. No credit scheme is
//! needed there: the source sends a `BlockDone` only for a block it holds
//! a grant for, so at most `pool depth` of them are ever unconsumed, and
//! the sink keeps that many receives posted on each data QP plus a batch
//! it reposts together (`data_recv_slots`). Control Sends are signaled
//! only every `CTRL_SIGNAL_EVERY`th time.
//!
//! # Threads
//!
//! The CQ is in [`ProgressMode::Threaded`](iwarp::ProgressMode) with no
//! polling phase (the provider's receive threads read the sockets; `wait`
//! sleeps at once) under [`WakePolicy::Newest`](iwarp::WakePolicy::Newest).
//! The caller's and the dispatcher thread wait with the same
//! `CompletionQueue::wait`; what tells them apart is the attendance.
//!
//! - The **caller's thread** reads (source) or writes (sink) blocks, and
//!   handles completions itself between those steps and while it waits:
//!   it holds an [`Attendance`](iwarp::Attendance) on the CQ for the whole
//!   of `send` / `recv` except while it reads or writes a block, so it
//!   sleeps in `wait` in the foreground and a completion wakes it and
//!   nobody else.
//! - The **dispatcher thread** never attends, so it sleeps in `wait` in
//!   the background: a completion wakes it only while no attending thread
//!   sleeps or is about to poll, that is whenever the caller does not
//!   handle completions (while it reads or writes a block, which may be
//!   disk I/O, and between transfers). Whoever holds `Shared::dispatch`
//!   drains the CQ, reposts receives and routes messages.
//! - The **sender thread** posts the Write + `BlockDone` pairs the
//!   dispatcher thread completes (a grant arriving for a block that waits),
//!   so the dispatcher goes on draining the CQ. A pair completed on the
//!   caller's thread (a block filled while a grant is in hand, or a grant
//!   found while it waits) is posted there: handing it over would cost a
//!   wake-up per block.
//! - The **logger thread** reports progress (`Logger`).
//!
//! Handing each block through dedicated threads cost 12-16 context
//! switches per 1 MiB block, on a 2-CPU machine about a quarter of the
//! CPU time per GB; this arrangement needs 4-6. All waits check a shared
//! failure flag at least every [`TICK`] and give up after
//! [`Config::timeout`].
//!
//! # Modules
//!
//! - `flow`: the credit and grant bookkeeping as sans-IO state machines
//!   (control-channel credits and send slots, the source's block/grant
//!   pairing, the sink's grant and reorder window), tested on their own.
//! - `shared`: what the threads share; carries out `flow`'s actions with
//!   verbs (posting control Sends and block Write + `BlockDone` pairs).
//! - `setup`: verbs resources, connecting and accepting the control QP
//!   and the data streams all at once (the negotiation rides in their MPA
//!   private data, [`crate::hello`]), starting the threads.
//! - `sink`: the sink's blocks, registered for the peer's RDMA Write only
//!   while granted and deregistered right before they are read, so a
//!   source that keeps writing after its `BlockDone` is refused (a
//!   Terminate) instead of changing bytes the application holds.
//! - `threads`: the dispatcher and sender threads and completion handling.
//! - `transfer`: the caller's `send` (source) and `recv` (sink) loops.

mod flow;
mod setup;
mod shared;
mod sink;
mod threads;
mod transfer;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use iwarp::cm::{MpaConfig, Policy};
use iwarp::{MemoryRegion, ProtectionDomain};

use crate::io::{BlockSink, BlockSource};
use crate::progress::Logger;
use crate::{Config, Error, Mode, ProgressFn, Stats, Transport};

use flow::{CtrlCredits, SinkWindow, SourcePairing};
use shared::*;
use threads::*;

/// Receives posted on the control QP.
pub const CTRL_RECVS: u32 = 32;
/// Control-message send slots.
const CTRL_SLOTS: u32 = 32;
/// Every this many control Sends one is signaled; its completion frees
/// its slot and every slot posted before it (one send queue completes in
/// order). The last free slot is always signaled, so slots come back.
/// Each signaled completion wakes the dispatcher, and the sink sends a
/// Grant per block: signaling each one cost a wake-up per block.
const CTRL_SIGNAL_EVERY: u32 = CTRL_SLOTS / 4;
/// Size of a data-QP message slot.
const DATA_MSG: usize = 64;
/// Most consumed data receives the dispatcher collects before reposting
/// them in one call (each post takes the QP's engine lock, which the
/// receive thread holds while it places data: a repost per block often
/// had to wait for it).
const DATA_REPOST_MAX: u32 = 32;

/// Why a connection from `peer` is refused when the session accepts only
/// `only_from` (logged here; the text goes into the MPA reject).
pub(crate) fn refuse(peer: SocketAddr, only_from: Option<IpAddr>) -> Option<String> {
    let ip = only_from?;
    // An IPv4 peer of a dual-stack socket shows as ::ffff:a.b.c.d (RFC 4291
    // §2.5.5.2): the same host as a.b.c.d.
    if peer.ip().to_canonical() == ip.to_canonical() {
        return None;
    }
    tracing::warn!(%peer, expected = %ip, "rdma-xfer: refused a connection from an address other than the control connection's");
    Some("rdma-xfer: refused: not the address that opened the session".into())
}

/// Receives posted per data QP for a pool of `depth` blocks: `depth` (at
/// most one BlockDone per granted block is in flight) plus the batch that
/// may wait to be reposted.
fn data_recv_slots(depth: u32) -> u32 {
    depth + repost_batch(depth)
}

/// How many consumed data receives are reposted together.
fn repost_batch(depth: u32) -> u32 {
    depth.clamp(1, DATA_REPOST_MAX)
}
/// How often blocked waits look at the failure flag.
pub const TICK: Duration = Duration::from_millis(50);

const K_CTRL_RECV: u64 = 1;
const K_CTRL_SEND: u64 = 2;
const K_DATA_RECV: u64 = 3;
const K_DATA_SEND: u64 = 4;
const K_DATA_WRITE: u64 = 5;
/// The active side's first FPDU on a connection (`setup::first_fpdu`),
/// unsignaled: it never completes unless flushed.
const K_FIRST_FPDU: u64 = 6;

fn wr_id(kind: u64, qp: usize, val: u64) -> u64 {
    kind << 56 | (qp as u64 & 0xff) << 48 | (val & 0xffff_ffff_ffff)
}

fn wr_parts(id: u64) -> (u64, usize, u64) {
    (
        id >> 56,
        ((id >> 48) & 0xff) as usize,
        id & 0xffff_ffff_ffff,
    )
}

/// The MPA settings of rdma-xfer connections.
pub(crate) fn mpa_config(crc: bool) -> MpaConfig {
    MpaConfig {
        crc: if crc {
            Policy::Required
        } else {
            Policy::Optional
        },
        ..MpaConfig::default()
    }
}

/// A failure that every thread of the session sees.
#[derive(Debug, Clone)]
enum Fail {
    PeerAborted(String),
    Disconnected(String),
    Protocol(String),
    Timeout(&'static str, Duration),
    Local(String),
}

impl Fail {
    fn to_error(&self) -> Error {
        match self.clone() {
            Fail::PeerAborted(s) => Error::PeerAborted(s),
            Fail::Disconnected(s) => Error::Disconnected(s),
            Fail::Protocol(s) => Error::Protocol(s),
            Fail::Timeout(w, a) => Error::Timeout {
                waiting_for: w,
                after: a,
            },
            Fail::Local(s) => Error::Broken(s),
        }
    }
}

/// An RDMA transfer session.
pub struct RdmaSession {
    shared: Arc<Shared>,
    cfg: Config,
    session: u64,
    pd: ProtectionDomain,
    /// Source staging blocks: local access only, the peer cannot touch
    /// them. Registered at the first `send`.
    src_pool: Vec<MemoryRegion>,
    /// Sink landing blocks, allocated at the first `recv`; each is
    /// registered for remote write only while it is granted (`sink`).
    sink_pool: Vec<sink::SinkBlock>,
    freed_rx: Receiver<u32>,
    fin_rx: Receiver<u64>,
    sink_rx: Receiver<SinkEv>,
    threads: Vec<JoinHandle<()>>,
    logger: Logger,
    /// The last transfer this side sent (the source numbers them 1, 2, …
    /// in a session).
    transfer: u64,
    /// The last transfer this side received: the next one the peer sends
    /// is `received + 1`, which is what a pregrant is for.
    received: u64,
    /// The sink's grants for the next transfer, made before its `Begin`
    /// ([`Transport::prepare_recv`]).
    pre: Option<transfer::SinkState>,
    /// Bytes of the last transfer sent whose `Fin` was not awaited yet
    /// ([`Transport::send_unconfirmed`]).
    unconfirmed: Option<u64>,
}

impl fmt::Debug for RdmaSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaSession")
            .field("session", &format_args!("{:016x}", self.session))
            .field("streams", &self.cfg.streams)
            .field("block_size", &self.cfg.block_size)
            .field("iodepth", &self.cfg.iodepth)
            .finish()
    }
}

/// Lock a mutex, ignoring poisoning (a panic elsewhere must not take the
/// session's bookkeeping down with it; failures go through `set_fail`).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Transport for RdmaSession {
    fn send_unconfirmed(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        self.confirm()?;
        self.logger.begin(src.len_hint());
        let r = self.send_inner(src);
        self.logger.end(r.is_ok());
        r
    }

    fn confirm(&mut self) -> Result<(), Error> {
        self.confirm_inner()
    }

    fn recv(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        self.confirm()?;
        let r = self.recv_inner(sink);
        self.logger.end(r.is_ok());
        r
    }

    fn prepare_recv(&mut self, len_hint: Option<u64>) -> Result<(), Error> {
        self.prepare_recv_inner(len_hint)
    }

    fn set_progress(&mut self, cb: Option<ProgressFn>) {
        self.logger.set_callback(cb);
    }

    fn config(&self) -> &Config {
        &self.cfg
    }

    fn mode(&self) -> Mode {
        Mode::Rdma
    }

    fn session_id(&self) -> u64 {
        self.session
    }
}

impl Drop for RdmaSession {
    fn drop(&mut self) {
        if let Some(bytes) = self.unconfirmed {
            // Nobody asked (the application checks the data end to end or
            // did not care): say what is known, in the log only.
            match self.fin_rx.try_recv() {
                Ok(got) if got == bytes => {}
                Ok(got) => tracing::warn!(
                    got,
                    bytes,
                    "rdma-xfer: the sink acknowledged other than the bytes of the last transfer sent"
                ),
                Err(_) => tracing::debug!(
                    bytes,
                    "rdma-xfer: session closed before the sink's Fin of the last transfer arrived"
                ),
            }
        }
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for qp in &self.shared.data_qps {
            qp.disconnect();
        }
        self.shared.ctrl_qp.disconnect();
    }
}

#[cfg(test)]
mod refuse_tests {
    use super::refuse;
    use std::net::{IpAddr, SocketAddr};

    fn at(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 4000)
    }

    #[test]
    fn a_v4_mapped_peer_is_the_same_host_as_its_ipv4_address() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(refuse(at("::ffff:127.0.0.1"), Some(v4)), None);
        assert_eq!(refuse(at("127.0.0.1"), Some(mapped)), None);
        assert_eq!(refuse(at("::1"), Some("::1".parse().unwrap())), None);
        assert_eq!(refuse(at("10.1.2.3"), None), None);
    }

    #[test]
    fn another_host_is_refused() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(refuse(at("127.0.0.2"), Some(v4)).is_some());
        assert!(refuse(at("::ffff:127.0.0.2"), Some(v4)).is_some());
        assert!(refuse(at("::1"), Some(v4)).is_some());
    }
}
