//! The state of one stream ([`Conn`], [`State`]) and the small helpers
//! every part of it shares; a leaf: it imports no other part of `conn`
//! but the iomap table ([`super::maps`]).

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use iwarp::cm::{self};
use iwarp::{
    CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendWr, SgList,
};

use super::maps::LocalMaps;
use crate::flow::{Flow, Spans};
use crate::options::Options;
use crate::ready::Readiness;
use crate::tune::RingTuner;
use crate::wire::SGE_LEN;

/// Bytes of one `ctl` slot (an `rs_sge`; a message word uses 4 of them).
pub(super) const CTL_SLOT: usize = SGE_LEN;

thread_local! {
    /// The stream whose completion hook this thread is running (see
    /// [`Conn::on_completions`]).
    pub(super) static HOOK_CONN: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

pub(super) static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// Counters of one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `write` calls that moved data.
    pub writes: u64,
    /// Data messages (RDMA Write + `RS_OP_DATA`) put on the wire.
    pub data_msgs: u64,
    /// Writes that joined a held message instead of taking their own.
    pub appended: u64,
    /// Bytes sent by zero copy.
    pub zcopy_bytes: u64,
    /// Bytes written into the peer's mappings by `riowrite` (not part of
    /// the stream, not in `bytes_sent`).
    pub iowrite_bytes: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received (read by the application).
    pub bytes_received: u64,
    /// Credit updates (`RS_OP_SGL`) sent: about one per `rq_size / 2`
    /// messages read, or one per message read between two basic-design
    /// ends (`flow::Config::ack_each`).
    pub credit_updates: u64,
}

/// What a watermark callback is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watermark {
    /// At least the receive watermark is readable, or the stream reached
    /// end of stream or an error (a read returns at once).
    Readable,
    /// At least the send watermark of send buffer is free, or the stream
    /// can no longer be written (a write returns at once).
    Writable,
}

/// A watermark callback (see `Stream::set_watermarks`).
pub type WatermarkFn = Arc<dyn Fn(Watermark) + Send + Sync>;

/// The watermarks and callback of a stream.
#[derive(Default)]
pub(super) struct Marks {
    pub(super) cb: Option<WatermarkFn>,
    pub(super) rcvlowat: u64,
    pub(super) sndlowat: u32,
    /// Fired, and the condition has not gone false since.
    pub(super) read_fired: bool,
    pub(super) write_fired: bool,
    /// To call once the lock is released.
    pub(super) due: Vec<Watermark>,
}

pub(super) struct State {
    pub(super) flow: Flow,
    pub(super) marks: Marks,
    /// Next `ctl` slot.
    pub(super) ctl_next: usize,
    /// Data Writes posted and not yet completed (on their way to the wire).
    pub(super) inflight: u32,
    /// Zero-copy Writes posted and not yet completed.
    pub(super) zc_inflight: u32,
    /// The SGE of the next [`Source::External`] Write.
    pub(super) zc_sge: Option<iwarp::Sge>,
    /// Why the stream is broken, once it is.
    pub(super) broken: Option<(io::ErrorKind, String)>,
    pub(super) closed: bool,
    /// A keepalive tick passed with no traffic.
    pub(super) idle: bool,
    /// Completions handled so far (progress, for `close`'s linger).
    pub(super) completions: u64,
    /// Active side: the peer's first message has not arrived yet (see
    /// [`Conn::first_word`]).
    pub(super) awaiting_first_word: bool,
    pub(super) stats: Stats,
    pub(super) sends: Vec<SendWr>,
    /// Receives to post; between pumps, at most [`RECV_DEFER`] of them
    /// wait here (see [`Conn::pump`]).
    pub(super) recvs: Vec<RecvWr>,
    /// The private buffer of [`Design::Basic`].
    pub(super) basic_buf: Vec<u8>,
    /// Receive-ring autotuning ([`crate::tune`]).
    pub(super) tuner: RingTuner,
    /// The path's RTT at the last measurement.
    pub(super) rtt: Duration,
    /// Our `riomap` mappings (conn/iomap.rs).
    pub(super) iomaps: LocalMaps,
}

/// One connection (see the module docs).
pub(crate) struct Conn {
    pub(super) id: usize,
    pub(super) opts: Options,
    pub(super) _ctx: Context,
    pub(super) pd: ProtectionDomain,
    pub(super) cq: CompletionQueue,
    pub(super) qp: QueuePair,
    pub(super) rbuf: MemoryRegion,
    pub(super) tsgl: MemoryRegion,
    pub(super) sbuf: MemoryRegion,
    pub(super) ctl: MemoryRegion,
    /// Where the message slots begin in `rbuf`: after the largest ring
    /// it may grow to ([`crate::tune`]).
    pub(super) slots_at: u32,
    /// The clock of the ring tuner.
    pub(super) epoch: Instant,
    pub(super) sq_size: usize,
    pub(super) state: Mutex<State>,
    pub(super) ready: Readiness,
    /// Threads waiting on the completion queue in a stream call: they
    /// drain it themselves, so the progress thread keeps out meanwhile;
    /// `shutdown`, `close` and other waiters' drains interrupt them
    /// (`CompletionQueue::interrupt_waiters`). Changed only with `state`
    /// locked.
    pub(super) cq_waiters: AtomicUsize,
    /// The progress thread stopped watching the CQ descriptor because a
    /// call was waiting on it (see [`crate::progress`]); whoever finds
    /// completions nobody will take while this is set hands the stream
    /// back ([`Conn::unpark`]).
    pub(crate) parked: AtomicBool,
    /// Threads inside `read`/`write` (see [`Conn::begin`]). Changed only
    /// with `state` locked.
    pub(super) in_call: AtomicUsize,
    pub(super) local: Option<SocketAddr>,
    pub(super) peer: Option<SocketAddr>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.id)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish()
    }
}

/// A connection-manager error as the `io::Error` a socket call returns.
pub(crate) fn cm_err(e: cm::CmError) -> io::Error {
    use cm::CmError as E;
    let kind = match &e {
        E::Refused { .. } => io::ErrorKind::ConnectionRefused,
        E::Timeout { .. } => io::ErrorKind::TimedOut,
        E::Rejected { .. } => io::ErrorKind::ConnectionRefused,
        E::Closed { .. } => io::ErrorKind::ConnectionReset,
        E::Bind { source, .. } => source.kind(),
        E::Connect { source, .. } => source.kind(),
        // The kind of setsockopt(2)'s errno (ENOENT: NotFound, no such
        // algorithm; EPERM: PermissionDenied), with the message that says
        // where to look.
        E::Congestion { source, .. } => source.kind(),
        E::NotConnected => io::ErrorKind::NotConnected,
        E::Unsupported { .. } => io::ErrorKind::Unsupported,
        _ => io::ErrorKind::Other,
    };
    // The error itself rides inside (same text): a caller can still ask
    // what failed (`crate::never_reached_tcp`).
    io::Error::new(kind, e)
}

pub(super) fn verbs_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("iWARP verbs: {e}"))
}

/// Receives a pump may leave for the next one (see [`Conn::pump`]).
pub(super) const RECV_DEFER: usize = 1;

pub(super) fn recv_wr(rbuf: &MemoryRegion, slots_at: u32, slot: u16) -> RecvWr {
    RecvWr {
        wr_id: u64::from(slot),
        sgl: SgList::single(rbuf.sge(slots_at as usize + 4 * usize::from(slot), 4)),
    }
}

pub(super) fn for_spans(spans: Spans, mut f: impl FnMut(usize, usize)) {
    for s in [Some(spans.first), spans.second].into_iter().flatten() {
        if s.len > 0 {
            f(s.offset as usize, s.len as usize);
        }
    }
}

/// Why a wait ended without progress.
pub(super) enum Waited {
    Again,
    TimedOut,
}

impl Conn {
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// The readiness descriptor; kept in step from the first call on.
    pub(crate) fn readiness_fd(&self) -> RawFd {
        let fd = self.ready.fd();
        let mut st = self.lock();
        self.refresh(&mut st);
        fd
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The TCP congestion control of the connection (getsockopt
    /// `TCP_CONGESTION` on its TCP socket).
    pub(crate) fn tcp_congestion(&self) -> io::Result<String> {
        cm::tcp_congestion(&self.qp).map_err(cm_err)
    }

    /// Change the TCP congestion control of the live connection.
    pub(crate) fn set_tcp_congestion(&self, cc: &cm::CongestionControl) -> io::Result<()> {
        cm::set_tcp_congestion(&self.qp, cc).map_err(cm_err)
    }

    pub(crate) fn options(&self) -> &Options {
        &self.opts
    }

    pub(crate) fn stats(&self) -> Stats {
        self.lock().stats
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
