//! What one run of rhttp did: each GET's result ([`Outcome`]) and its
//! result line, the crawl's record of it ([`Fetched`]), and the counters
//! `--stats` prints.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rhttp::http::Url;

use crate::settings::url_scheme;

/// Print one transfer's result line on stderr with a single `write`
/// (stderr is unbuffered: `eprintln!` wrote each formatted piece with its
/// own system call, about twenty per line).
pub(crate) fn report(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut s = line.to_string();
    s.push('\n');
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// What one GET did.
pub(crate) struct Outcome {
    pub(crate) status: u16,
    pub(crate) bytes: u64,
    pub(crate) via: String,
    /// The body is an HTML page (`get::is_html`), for -r.
    pub(crate) html: bool,
}

/// Counters for `--stats` (and the test command): what one run of rhttp
/// did on the network.
pub(crate) static HTTP_CONNS: AtomicU64 = AtomicU64::new(0);
pub(crate) static RDMA_CONNS: AtomicU64 = AtomicU64::new(0);
pub(crate) static REQUESTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static RDMA_BODIES: AtomicU64 = AtomicU64::new(0);
pub(crate) static BODY_BYTES: AtomicU64 = AtomicU64::new(0);

/// What became of each GET since the last [`take_fetched`] (for -r: the
/// status, and whether the body is a page to read links from).
pub(crate) static FETCHED: std::sync::Mutex<Vec<Fetched>> = std::sync::Mutex::new(Vec::new());

/// One GET's result, as the crawl needs it.
pub(crate) struct Fetched {
    pub(crate) path: String,
    pub(crate) status: u16,
    pub(crate) bytes: u64,
    pub(crate) html: bool,
}

pub(crate) fn take_fetched() -> Vec<Fetched> {
    std::mem::take(&mut *FETCHED.lock().unwrap_or_else(|e| e.into_inner()))
}

/// `--stats` (`on`): the run's counters on one line.
pub(crate) fn print_stats(on: bool, started: Instant) {
    if on {
        report(format_args!(
            "rhttp: stats: {} requests, {} bodies by RDMA, {} body bytes, {} HTTP connections, \
             {} RDMA connections, {:.3} ms",
            REQUESTS.load(Ordering::Relaxed),
            RDMA_BODIES.load(Ordering::Relaxed),
            BODY_BYTES.load(Ordering::Relaxed),
            HTTP_CONNS.load(Ordering::Relaxed),
            RDMA_CONNS.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64() * 1e3
        ));
    }
}

/// The result line of one GET, and whether it succeeded.
pub(crate) fn report_get(url: &Url, o: &Outcome, secs: f64) -> bool {
    FETCHED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Fetched {
            path: url.path.clone(),
            status: o.status,
            bytes: o.bytes,
            html: o.html,
        });
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    BODY_BYTES.fetch_add(o.bytes, Ordering::Relaxed);
    if o.via.starts_with("RDMA") {
        RDMA_BODIES.fetch_add(1, Ordering::Relaxed);
    }
    report(format_args!(
        "GET {}://{}{}: {} {} bytes via {} in {:.3} ms ({:.1} MB/s)",
        url_scheme(),
        url.host_header(),
        url.path,
        o.status,
        o.bytes,
        o.via,
        secs * 1e3,
        o.bytes as f64 / secs.max(1e-9) / 1e6
    ));
    o.status < 400
}
