//! Pieces the `rftp` and `rftp-demo` binaries share: the progress bar
//! (bytes, live rate, ETA) and the one-line transfer summary.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

use crate::client::{Options, Summary};

/// A progress bar on stderr, or `None` when `quiet`. indicatif draws
/// nothing when stderr is not a terminal.
pub fn progress_bar(quiet: bool, total: Option<u64>) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    let pb = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::no_length(),
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(pb)
}

/// Route both progress callbacks of `o` (RDMA session and plain FTP data
/// connection) to `pb`.
pub fn attach(o: &mut Options, pb: &ProgressBar) {
    let p1 = pb.clone();
    o.progress = Some(Arc::new(move |p: &rdma_xfer::Progress| {
        if let Some(t) = p.total {
            p1.set_length(t);
        }
        p1.set_position(p.bytes);
    }));
    let p2 = pb.clone();
    o.plain_progress = Some(Arc::new(move |done, total| {
        if let Some(t) = total {
            p2.set_length(t);
        }
        p2.set_position(done);
    }));
    let p3 = pb.clone();
    o.checksum_note = Some(Arc::new(move |a| p3.set_message(a.to_string())));
}

/// Remove the progress callbacks again.
pub fn detach(o: &mut Options) {
    o.progress = None;
    o.plain_progress = None;
    o.checksum_note = None;
}

/// `rftp: WHAT: 256.0 MiB in 0.412 s, 5.21 Gbit/s via rdma x4`, plus the
/// verified SHA-256 on a second line when there is one.
pub fn summary_text(what: &str, s: &Summary) -> String {
    let mib = s.bytes as f64 / (1u64 << 20) as f64;
    let resumed = match (s.resumed_from, s.rehashed) {
        (0, _) => String::new(),
        (at, Some(n)) => format!(
            " (resumed at byte {at}; {n} bytes of the kept part hashed again, the rest from its saved checksum state)"
        ),
        (at, None) => format!(" (resumed at byte {at})"),
    };
    let retried = match s.retries {
        0 => String::new(),
        1 => " after 1 retry".to_string(),
        n => format!(" after {n} retries"),
    };
    let mut t = format!(
        "rftp: {what}: {mib:.1} MiB in {:.3} s, {:.2} Gbit/s via {}{resumed}{retried}",
        s.elapsed.as_secs_f64(),
        s.gbps(),
        s.via
    );
    if let Some((algo, h)) = &s.checksum {
        t.push_str(&format!("\nrftp: {algo} verified: {h}"));
    }
    t
}

/// Progress as plain lines on stderr (for logs, where a bar is not drawn):
/// `LABEL: 120.0/300.0 MiB (40%), 3.91 Gbit/s, XXH3-128` about twice a
/// second.
pub fn attach_lines(o: &mut Options, label: &str) {
    let label = label.to_string();
    let algo = Arc::new(std::sync::Mutex::new(String::new()));
    let a2 = algo.clone();
    o.checksum_note = Some(Arc::new(move |a| {
        *a2.lock().unwrap_or_else(|e| e.into_inner()) = format!(", {a}");
    }));
    let last = std::sync::Mutex::new(None::<std::time::Instant>);
    o.progress = Some(Arc::new(move |p: &rdma_xfer::Progress| {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let due = match *last {
            Some(t) => t.elapsed() >= std::time::Duration::from_millis(500),
            None => true,
        };
        if !(due || p.done) {
            return;
        }
        *last = Some(std::time::Instant::now());
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let (total, pct) = match p.total {
            Some(t) if t > 0 => (
                format!("/{:.1}", mib(t)),
                format!(" ({:.0}%)", p.bytes as f64 * 100.0 / t as f64),
            ),
            _ => (String::new(), String::new()),
        };
        let algo = algo.lock().unwrap_or_else(|e| e.into_inner()).clone();
        eprintln!(
            "{label}: {:.1}{total} MiB{pct}, {:.2} Gbit/s{algo}",
            mib(p.bytes),
            p.rate * 8.0 / 1e9
        );
    }));
    o.plain_progress = None;
}
