//! The settings of deferred settling ([`Settings`], from the preload's
//! configuration) and where its warnings go ([`set_reporter`]).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

/// The MPA frame header: key, flags, revision, private data length (RFC
/// 5044 §7.1).
pub(super) const MPA_HEADER: usize = 20;
/// The longest MPA Request: the header and 512 bytes of private data.
pub(super) const MPA_MAX_REQUEST: usize = MPA_HEADER + 512;

/// How deferred accepts are decided and bounded.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How long an undecided accept waits for its client's first bytes
    /// before it is plain TCP (`IWARP_PRELOAD_PEEK_MS`).
    pub peek: Duration,
    /// How long an MPA accept may wait for its first use before its
    /// exchange starts anyway (`IWARP_PRELOAD_SETTLE_MS`).
    pub settle_after: Duration,
    /// At most this many MPA accepts wait for their first use or their
    /// exchange at once (`IWARP_PRELOAD_MAX_PENDING`).
    pub max_pending: usize,
    /// At most this many iWARP streams live in the process, those being
    /// made and the MPA accepts waiting included
    /// (`IWARP_PRELOAD_MAX_STREAMS`; `crate::table::max_streams`).
    pub max_streams: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            peek: Duration::from_millis(1000),
            settle_after: Duration::from_millis(300),
            max_pending: 64,
            max_streams: crate::table::DEFAULT_MAX_STREAMS,
        }
    }
}

pub(super) static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Sets the [`Settings`] (once, before the first accept; later calls are
/// ignored).
pub fn configure(s: Settings) {
    if SETTINGS.set(s).is_ok() {
        crate::table::set_max_streams(s.max_streams);
    }
}

/// The settings in force.
pub fn settings() -> Settings {
    *SETTINGS.get_or_init(Settings::default)
}

/// Records one decision: `(how, peer, why)` with `how` one of `iwarp`,
/// `plain`, `refused` (the preload's `IWARP_PRELOAD_STATS`).
pub type Reporter = fn(&str, Option<SocketAddr>, &str);
pub(super) static REPORTER: OnceLock<Reporter> = OnceLock::new();

/// Sets where decisions taken here are recorded.
pub fn set_reporter(f: Reporter) {
    let _ = REPORTER.set(f);
}

pub(super) fn report(how: &str, peer: Option<SocketAddr>, why: &str) {
    match REPORTER.get() {
        Some(f) => f(how, peer, why),
        None => tracing::info!(how, ?peer, why, "accept"),
    }
}
