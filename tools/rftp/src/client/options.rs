//! A transfer's options, how the session is sized for the path
//! (`plan_for_path`), and the summary a transfer returns.

use std::sync::Arc;
use std::time::Duration;

use rdma_xfer::Mode;

use crate::checksum::{Algo, Choice};

/// Progress callback: (bytes done, total if known).
pub type ProgressCb = Arc<dyn Fn(u64, Option<u64>) + Send + Sync>;

/// Options of a transfer.
#[derive(Clone)]
pub struct Options {
    /// Data streams; 0 is `auto` (sized to the path, [`plan_for_path`](crate::client::plan_for_path)).
    pub streams: u32,
    pub block_size: u32,
    /// Blocks in flight per stream; 0 picks [`Options::effective_iodepth`]'s
    /// default.
    pub iodepth: u32,
    /// Plain FTP data connection instead of the RDMA extension.
    pub tcp: bool,
    /// Transport of the extension's session (rdma, or tcp for comparison).
    pub xfer_mode: Mode,
    /// Memory-to-memory: this many bytes from a zero source to a null sink.
    pub mem: Option<u64>,
    /// Compare the file's checksum with the server's (`HASH`) after each
    /// transfer; both ends compute it as the data flows.
    pub verify: bool,
    /// The checksum `verify` uses: `auto` (the best the server offers,
    /// [`Ftp::negotiate_hash`](crate::client::Ftp::negotiate_hash)) or one algorithm.
    pub checksum: Choice,
    /// Told the checksum chosen for each transfer (the progress line shows
    /// it).
    pub checksum_note: Option<Arc<dyn Fn(Algo) + Send + Sync>>,
    pub resume: bool,
    pub crc: bool,
    /// RDMA device of the data sessions: `soft`, `auto`, or a kernel
    /// device (`siw0`); `None`: `IWARP_DEVICE`, else `soft`.
    pub device: Option<String>,
    pub timeout: Duration,
    /// Connect data connections (PASV, RADR) to an address other than the
    /// control connection's peer when the server names one
    /// (`--allow-foreign-data-addr`; refused by default).
    pub allow_foreign_data_addr: bool,
    /// Bytes per second at most (tests and polite transfers).
    pub limit_rate: Option<u64>,
    pub progress: Option<rdma_xfer::ProgressFn>,
    pub plain_progress: Option<ProgressCb>,
    /// Largest pool the automatic sizing registers per side (bytes);
    /// `None`: [`rdma_xfer::tune::DEFAULT_MAX_WINDOW`].
    pub max_window: Option<u64>,
    /// Say what the automatic sizing chose and why (stderr), besides the
    /// log.
    pub explain: bool,
    /// TCP congestion control of the control and data connections
    /// (`TCP_CONGESTION`); `None`: the kernel's default.
    pub congestion: Option<String>,
    /// The process exits once this `get` or `put` is done (rftp's batch
    /// mode): the transfer session's connections are then left for the
    /// kernel to close at exit, so rftp does not wait a round trip for
    /// the server's FINs after the last reply (issue 27; see
    /// [`XferSlot::leave_to_exit`](crate::client::XferSlot::leave_to_exit)).
    pub exit_after: bool,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("streams", &self.streams)
            .field("block_size", &self.block_size)
            .field("iodepth", &self.iodepth)
            .field("tcp", &self.tcp)
            .field("mem", &self.mem)
            .finish()
    }
}

/// Bytes in flight the default I/O depth aims at, over all streams.
pub const DEFAULT_WINDOW: u64 = 16 << 20;

impl Options {
    /// The I/O depth a session asks for: `iodepth` if set, else enough
    /// blocks per stream for [`DEFAULT_WINDOW`] bytes in flight in all,
    /// between 2 and 4. More in flight than the path needs only spreads
    /// the transfer over more memory than the CPU caches hold: on loopback,
    /// 8 streams × 4 × 1 MiB cost 5-10 % more CPU per GB than 8 × 2 × 1 MiB
    /// and moved less. Paths with a large bandwidth-delay product need
    /// more (`--iodepth`; see docs/RFTP.md).
    pub fn effective_iodepth(&self) -> u32 {
        if self.iodepth > 0 {
            return self.iodepth;
        }
        let per_block = u64::from(self.block_size.max(1)) * u64::from(self.streams.max(1));
        (DEFAULT_WINDOW / per_block).clamp(2, 4) as u32
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            streams: 0,
            block_size: 1 << 20,
            iodepth: 0,
            tcp: false,
            xfer_mode: Mode::Rdma,
            mem: None,
            verify: true,
            checksum: Choice::Auto,
            checksum_note: None,
            resume: true,
            crc: false,
            device: None,
            timeout: Duration::from_secs(30),
            allow_foreign_data_addr: false,
            limit_rate: None,
            progress: None,
            plain_progress: None,
            max_window: None,
            explain: false,
            congestion: None,
            exit_after: false,
        }
    }
}

/// What a transfer did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub bytes: u64,
    /// Bytes that were already there (REST).
    pub resumed_from: u64,
    /// Of those, the bytes read again to take their checksum (the rest came
    /// from the state saved in `FILE.part.sums`); `None` when not resumed
    /// or not verified.
    pub rehashed: Option<u64>,
    pub elapsed: Duration,
    /// "rdma x8", "tcp x1 (extension)", "ftp".
    pub via: String,
    /// The verified checksum (algorithm, hex digest), if verification ran.
    pub checksum: Option<(Algo, String)>,
    /// Retries it took ([`get_retrying`](crate::client::get_retrying)).
    pub retries: u32,
}

impl Summary {
    /// Throughput in Gbit/s.
    pub fn gbps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 * 8.0 / s / 1e9
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn default_iodepth_aims_at_a_16_mib_window() {
        let o = |streams, block_size, iodepth| Options {
            streams,
            block_size,
            iodepth,
            ..Options::default()
        };
        assert_eq!(o(1, 1 << 20, 0).effective_iodepth(), 4);
        assert_eq!(o(4, 1 << 20, 0).effective_iodepth(), 4);
        assert_eq!(o(8, 1 << 20, 0).effective_iodepth(), 2);
        assert_eq!(o(16, 4 << 20, 0).effective_iodepth(), 2, "at least 2");
        assert_eq!(o(1, 64 << 10, 0).effective_iodepth(), 4, "at most 4");
        assert_eq!(o(8, 1 << 20, 7).effective_iodepth(), 7, "a set depth wins");
    }
}
