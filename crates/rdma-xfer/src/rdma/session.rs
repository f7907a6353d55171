//! The RDMA session ([`RdmaSession`]): what it holds, its [`Transport`]
//! face and its teardown. Its setup (`setup`) and its transfers
//! (`transfer`) are `impl RdmaSession` blocks in their own files.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use iwarp::wait::WaitSet;
use iwarp::{MemoryRegion, ProtectionDomain};

use super::base::lock;
use super::shared::{Shared, SinkEv};
use super::sink::{SinkBlock, SinkState};
use crate::io::{BlockSink, BlockSource};
use crate::progress::Logger;
use crate::{Config, Error, Mode, ProgressFn, Stats, Transport};

/// An RDMA transfer session.
pub struct RdmaSession {
    pub(super) shared: Arc<Shared>,
    pub(super) cfg: Config,
    pub(super) session: u64,
    pub(super) pd: ProtectionDomain,
    /// Source staging blocks: local access only, the peer cannot touch
    /// them. Registered at the first `send`.
    pub(super) src_pool: Vec<MemoryRegion>,
    /// Sink landing blocks, allocated at the first `recv`; each is
    /// registered for remote write only while it is granted (`sink`).
    pub(super) sink_pool: Vec<SinkBlock>,
    pub(super) freed_rx: Receiver<u32>,
    pub(super) fin_rx: Receiver<u64>,
    pub(super) sink_rx: Receiver<SinkEv>,
    /// The caller's wait: the CQ and the caller's bell (see `setup`); a
    /// mutex only because `wait` takes `&self`, never contended.
    pub(super) waits: Mutex<WaitSet>,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) logger: Logger,
    /// The last transfer this side sent (the source numbers them 1, 2, …
    /// in a session).
    pub(super) transfer: u64,
    /// The last transfer this side received: the next one the peer sends
    /// is `received + 1`, which is what a pregrant is for.
    pub(super) received: u64,
    /// The sink's grants for the next transfer, made before its `Begin`
    /// ([`Transport::prepare_recv`]).
    pub(super) pre: Option<SinkState>,
    /// Bytes of the last transfer sent whose `Fin` was not awaited yet
    /// ([`Transport::send_unconfirmed`]).
    pub(super) unconfirmed: Option<u64>,
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
        // Stop the threads: the dispatcher sleeps on its bell, the sender
        // on its channel (neither looks at `stop` on a timer).
        self.shared.stop.store(true, Ordering::Release);
        self.shared.handoff.dispatcher.ring();
        let _ = lock(&self.shared.dispatch).routes.pair_tx.send(None);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The hook holds the bells; the CQ may outlive the session.
        self.shared.cq.set_completion_hook(None);
        // All at once: each disconnect waits a round trip for the peer's
        // FIN (iwarp-soft's graceful close), so one after the other cost
        // a round trip per stream at the end of every session (issue 27:
        // 0.27 s of a 2.4 s 100 MB get with 6 streams at 50 ms RTT).
        std::thread::scope(|s| {
            for qp in std::iter::once(&self.shared.ctrl_qp).chain(&self.shared.data_qps) {
                // A thread that cannot start: that one waits in line.
                if std::thread::Builder::new()
                    .spawn_scoped(s, move || qp.disconnect())
                    .is_err()
                {
                    qp.disconnect();
                }
            }
        });
    }
}
