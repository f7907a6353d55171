//! What a connected session offers whatever carries it ([`Transport`],
//! implemented by `rdma::RdmaSession` and `tcp::TcpSession`), and what one
//! transfer did ([`Stats`]); re-exported at the crate root.

use std::fmt;
use std::time::Duration;

use crate::config::{Config, Mode};
use crate::error::Error;
use crate::io::{BlockSink, BlockSource};
use crate::progress::ProgressFn;

/// What one transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Payload bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
    /// Wall time of the transfer.
    pub elapsed: Duration,
}

impl Stats {
    /// Throughput in bits per second.
    pub fn bits_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 * 8.0 / s
        } else {
            0.0
        }
    }
}

/// A connected transfer session: either side can send or receive, one
/// transfer at a time, as often as wanted.
pub trait Transport: Send + fmt::Debug {
    /// Send everything `src` yields to the peer, which must be in
    /// [`Transport::recv`]. Returns once the peer's sink has finished
    /// (its `Fin`): [`Transport::send_unconfirmed`], then
    /// [`Transport::confirm`].
    fn send(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        let start = std::time::Instant::now();
        let mut st = self.send_unconfirmed(src)?;
        self.confirm()?;
        st.elapsed = start.elapsed();
        Ok(st)
    }
    /// Send everything `src` yields, and return once every block and the
    /// `End` are handed to the transport, without waiting the round trip
    /// for the sink's `Fin` (issue 27: a server can send its final reply
    /// meanwhile). The `Fin` is checked by [`Transport::confirm`], which
    /// the next `send`, `send_unconfirmed` or `recv` calls first. Success
    /// here says only that the source's part is done: whoever reports the
    /// transfer as delivered must confirm it, or check the data end to end
    /// (rftp compares the file's checksum with the server's `HASH`).
    fn send_unconfirmed(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error>;
    /// Wait for the sink's `Fin` of the last [`Transport::send_unconfirmed`]
    /// (at once if there is none outstanding): an error if the sink failed
    /// or acknowledged other than the bytes sent.
    fn confirm(&mut self) -> Result<(), Error>;
    /// Receive one transfer into `sink`, in order.
    fn recv(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error>;
    /// The next transfer on this session comes from the peer, into a
    /// transfer of about `len_hint` bytes: offer the sink's blocks now
    /// (RDMA mode, when both sides have [`hello::feature::PREGRANT`](crate::hello::feature::PREGRANT)), so
    /// the source's first block need not wait a round trip for a grant
    /// after its `Begin`. The next [`Transport::recv`] continues with what
    /// was granted. Does nothing where the feature is missing (TCP mode,
    /// an older peer) or was already done for the next transfer.
    fn prepare_recv(&mut self, len_hint: Option<u64>) -> Result<(), Error> {
        let _ = len_hint;
        Ok(())
    }
    /// Install (or remove) the progress callback.
    fn set_progress(&mut self, cb: Option<ProgressFn>);
    /// The negotiated parameters.
    fn config(&self) -> &Config;
    /// The transport.
    fn mode(&self) -> Mode;
    /// The negotiated session ID.
    fn session_id(&self) -> u64;
}
