//! Session parameters: the transport ([`Mode`]), the [`Config`] each side
//! proposes and its limits, and the passive side's [`negotiate`] (the
//! minimum of both sides). A leaf that `hello`, `tcp`, `rdma` and `tune`
//! import; re-exported at the crate root.

use std::fmt;
use std::time::Duration;

use crate::error::Error;
use crate::hello::feature;

/// Which transport a session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Software iWARP: RDMA Write on the data QPs.
    Rdma,
    /// Plain TCP streams.
    Tcp,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s.to_ascii_lowercase().as_str() {
            "rdma" => Ok(Mode::Rdma),
            "tcp" => Ok(Mode::Tcp),
            _ => Err(format!("unknown transfer mode {s:?}: use rdma or tcp")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Rdma => "rdma",
            Mode::Tcp => "tcp",
        })
    }
}

/// Session parameters. The active side proposes, the passive side grants
/// the minimum of both for streams, block size and I/O depth.
#[derive(Debug, Clone)]
pub struct Config {
    /// Data streams (QPs or TCP connections), 1..=[`MAX_STREAMS`].
    pub streams: u32,
    /// Block size in bytes (a multiple of 4096 keeps `O_DIRECT` usable).
    pub block_size: u32,
    /// Blocks in flight per stream.
    pub iodepth: u32,
    /// Longest wait for any progress (peer silent, CQ empty, ...).
    pub timeout: Duration,
    /// Bound on each connection setup.
    pub connect_timeout: Duration,
    /// Require MPA CRC32C on every FPDU.
    pub crc: bool,
    /// How often the progress callback runs.
    pub progress_interval: Duration,
    /// The RDMA device of [`Mode::Rdma`] sessions: `soft` (this crate's
    /// software iWARP), `auto`, or a kernel device (`siw0`, `rxe0`,
    /// `mlx5_0`) through rdma-core. `None`: `IWARP_DEVICE`, else `soft`
    /// ([`iwarp::Context::open`]).
    pub device: Option<String>,
    /// Let the sink size the blocks in flight inside the pool as the
    /// transfer goes ([`tune::Autotune`](crate::tune::Autotune)); `false` keeps the whole pool
    /// granted (a pinned `--iodepth`). Local: not negotiated.
    pub autotune: bool,
    /// TCP congestion control of the session's connections
    /// (`TCP_CONGESTION`, tcp(7): reno, cubic, bbr, ...); `None` keeps the
    /// kernel's default (`net.ipv4.tcp_congestion_control`). RDMA mode
    /// sets it through the CM ([`iwarp::cm::ConnParam::congestion`]), TCP
    /// mode on its sockets. Local: not negotiated.
    pub congestion: Option<String>,
    /// Protocol features this side offers or grants ([`hello::feature`](crate::hello::feature);
    /// [`hello::feature::ALL`](crate::hello::feature::ALL) by default). In the configuration of an
    /// established session ([`Transport::config`](crate::Transport::config)): the features both
    /// sides share. `0` speaks the setup of rdma-xfer 0.4.0 and earlier,
    /// as an older peer does (for interoperability tests, or to rule a
    /// feature out).
    pub features: u32,
}

/// Most data streams a session may have.
pub const MAX_STREAMS: u32 = 64;
/// Smallest and largest block sizes.
pub const MIN_BLOCK: u32 = 4096;
/// Largest block size (64 MiB).
pub const MAX_BLOCK: u32 = 64 << 20;
/// Largest I/O depth per stream.
pub const MAX_IODEPTH: u32 = 256;

impl Default for Config {
    fn default() -> Config {
        Config {
            streams: 1,
            block_size: 1 << 20,
            iodepth: 4,
            timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
            crc: false,
            progress_interval: Duration::from_millis(200),
            device: None,
            autotune: true,
            congestion: None,
            features: feature::ALL,
        }
    }
}

impl Config {
    /// Check the ranges; returns the config with values clamped where the
    /// fix is obvious.
    pub fn validated(mut self) -> Result<Config, Error> {
        if self.streams == 0 || self.streams > MAX_STREAMS {
            return Err(Error::Config(format!(
                "streams must be 1..={MAX_STREAMS}, got {}",
                self.streams
            )));
        }
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_size) {
            return Err(Error::Config(format!(
                "block size must be {MIN_BLOCK}..={MAX_BLOCK} bytes, got {}",
                self.block_size
            )));
        }
        if self.iodepth == 0 || self.iodepth > MAX_IODEPTH {
            return Err(Error::Config(format!(
                "iodepth must be 1..={MAX_IODEPTH}, got {}",
                self.iodepth
            )));
        }
        if self.timeout.is_zero() {
            self.timeout = Duration::from_secs(1);
        }
        if let Some(c) = &self.congestion {
            iwarp::cm::CongestionControl::new(c)
                .map_err(|e| Error::Config(format!("congestion control: {e}")))?;
        }
        if let Some(d) = &self.device {
            d.parse::<iwarp::DeviceSpec>()
                .map_err(|e| Error::Config(e.to_string()))?;
        }
        Ok(self)
    }

    /// Open the RDMA device this config names ([`Config::device`]).
    pub fn open_device(&self) -> Result<iwarp::Context, Error> {
        match &self.device {
            Some(d) => iwarp::Context::open_device(d),
            None => iwarp::Context::open(),
        }
        .map_err(|e| Error::Setup(e.to_string()))
    }

    /// Blocks in each side's pool.
    pub fn pool_depth(&self) -> u32 {
        self.iodepth * self.streams
    }
}

/// The parameters the passive side grants for a proposal.
pub(crate) fn negotiate(ours: &Config, streams: u32, block_size: u32, iodepth: u32) -> Config {
    let mut c = ours.clone();
    c.streams = streams.clamp(1, ours.streams);
    c.block_size = block_size.clamp(MIN_BLOCK, ours.block_size);
    c.iodepth = iodepth.clamp(1, ours.iodepth);
    c
}
