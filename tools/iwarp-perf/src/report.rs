//! Results: statistics, perftest-like tables, JSON lines, and process
//! resource usage (peak RSS from `/proc/self/status` `VmHWM`, CPU time from
//! `getrusage`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::params::{Params, Test};

/// What the client of a run measured (iWARP or the TCP baseline).
pub struct ClientResult {
    pub msgs: u64,
    pub elapsed: Duration,
    pub lat: Option<LatStats>,
    pub verified: u64,
    /// Bandwidth runs: the process's CPU seconds over exactly the span of
    /// `elapsed` (from the common start to the last ACK), so the two can be
    /// compared. `None`: the caller's whole window is used.
    pub span_cpu_s: Option<f64>,
}

/// Latency statistics in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatStats {
    pub min: f64,
    pub median: f64,
    pub avg: f64,
    pub p99: f64,
    pub max: f64,
}

impl LatStats {
    /// From per-iteration samples in microseconds (sorted in place).
    pub fn from_samples(s: &mut [f64]) -> Option<LatStats> {
        if s.is_empty() {
            return None;
        }
        s.sort_by(f64::total_cmp);
        let pct = |p: f64| s[(((s.len() - 1) as f64) * p).round() as usize];
        Some(LatStats {
            min: s[0],
            median: pct(0.5),
            avg: s.iter().sum::<f64>() / s.len() as f64,
            p99: pct(0.99),
            max: s[s.len() - 1],
        })
    }
}

/// One measured run on one transport.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub transport: &'static str,
    pub params: Params,
    /// Messages moved (all QPs).
    pub msgs: u64,
    pub elapsed: Duration,
    /// Negotiated CRC / markers (always false for TCP).
    pub crc: bool,
    pub markers: bool,
    pub lat: Option<LatStats>,
    pub peak_rss_kib: u64,
    /// User + system CPU seconds of the whole process
    /// (`getrusage(RUSAGE_SELF)`: every thread, the provider's included),
    /// over the span of `elapsed` when `cpu_over_span`, else over `wall`.
    pub cpu_s: f64,
    /// Bandwidth runs: `cpu_s` covers exactly the measured span.
    pub cpu_over_span: bool,
    /// Wall time of the window `cpu_s` was taken over: connection set-up,
    /// the run and the teardown (so at least `elapsed`).
    pub wall: Duration,
    /// Threads of the process at the end of the run (`/proc/self/status`),
    /// the provider's per-connection threads included.
    pub threads: u64,
    /// Integrity: messages verified.
    pub verified: u64,
}

impl Measurement {
    pub fn bytes(&self) -> u64 {
        self.msgs * self.params.size as u64
    }
    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }
    pub fn gbit_s(&self) -> f64 {
        self.bytes() as f64 * 8.0 / 1e9 / self.secs()
    }
    pub fn mb_s(&self) -> f64 {
        self.bytes() as f64 / 1e6 / self.secs()
    }
    pub fn mmsg_s(&self) -> f64 {
        self.msgs as f64 / 1e6 / self.secs()
    }

    /// Refuse a measurement that cannot be true: more CPU time than
    /// `cores` can give in the window it was taken over, or a measured span
    /// longer than that window. `msgs` is the count the receivers reported
    /// (the clients compare it with what they sent), so the bandwidth is
    /// bounded by what arrived. A failure here is a bug in the harness, not
    /// in the stack under test.
    pub fn check_plausible(&self, cores: usize) -> Result<(), String> {
        let wall = self.wall.as_secs_f64();
        let over = if self.cpu_over_span {
            self.elapsed.as_secs_f64()
        } else {
            wall
        };
        // getrusage counts in microseconds, but the scheduler charges
        // whole ticks to a thread now and then: allow one tick per core.
        let slack = 0.01 * cores as f64 + 0.005;
        if self.cpu_s > cores as f64 * over + slack {
            return Err(format!(
                "impossible measurement ({}): {:.2} CPU seconds in {:.2} s of wall time on {cores} cores; \
                 this is a bug in iwarp-perf's accounting, please report it",
                self.transport, self.cpu_s, over
            ));
        }
        if self.elapsed > self.wall {
            return Err(format!(
                "impossible measurement ({}): the run's span {:.3} s is longer than the {:.3} s it was measured in; \
                 this is a bug in iwarp-perf's clock, please report it",
                self.transport,
                self.elapsed.as_secs_f64(),
                wall
            ));
        }
        Ok(())
    }
}

/// A JSON number with at least 4 decimals and at least 5 significant
/// digits, so that small figures (the bandwidth of 1-byte messages, in
/// Gbit/s) do not round to 0.
fn num(v: f64) -> String {
    if !v.is_finite() {
        return "null".into();
    }
    let mag = if v == 0.0 {
        0
    } else {
        v.abs().log10().floor() as i32
    };
    let decimals = (4 - mag).clamp(4, 15) as usize;
    format!("{v:.decimals$}")
}

fn json_body(m: &Measurement, out: &mut String) {
    let p = &m.params;
    let _ = write!(
        out,
        "\"transport\":\"{}\",\"test\":\"{}\",\"size\":{},\"iters\":{},\"depth\":{},\"qps\":{},\"crc\":{},\"markers\":{},\"mode\":\"{}\",\"integrity\":{},\"elapsed_s\":{},\"bw_gbit_s\":{},\"bw_mb_s\":{},\"msg_rate_mmsg_s\":{}",
        m.transport,
        p.test,
        p.size,
        m.msgs,
        p.depth,
        p.qps,
        m.crc,
        m.markers,
        if p.busy_poll { "busy_poll" } else { "event" },
        p.integrity,
        num(m.secs()),
        num(m.gbit_s()),
        num(m.mb_s()),
        num(m.mmsg_s()),
    );
    match &m.lat {
        Some(l) => {
            let _ = write!(
                out,
                ",\"t_min_us\":{},\"t_median_us\":{},\"t_avg_us\":{},\"t_p99_us\":{},\"t_max_us\":{}",
                num(l.min),
                num(l.median),
                num(l.avg),
                num(l.p99),
                num(l.max)
            );
        }
        None => out.push_str(
            ",\"t_min_us\":null,\"t_median_us\":null,\"t_avg_us\":null,\"t_p99_us\":null,\"t_max_us\":null",
        ),
    }
    // The CRC32C back end this process ran (IWARP_CRC, wire::crc), null
    // when no CRC was computed.
    match crc_impl(m) {
        Some(name) => {
            let _ = write!(out, ",\"crc_impl\":\"{name}\"");
        }
        None => out.push_str(",\"crc_impl\":null"),
    }
    let _ = write!(
        out,
        ",\"peak_rss_kib\":{},\"peak_rss_mib\":{},\"cpu_s\":{},\"wall_s\":{},\"threads\":{},\"verified\":{}",
        m.peak_rss_kib,
        num(m.peak_rss_kib as f64 / 1024.0),
        num(m.cpu_s),
        num(m.wall.as_secs_f64()),
        m.threads,
        m.verified
    );
}

/// The CRC32C implementation that ran for `m`: iWARP with CRC negotiated.
pub fn crc_impl(m: &Measurement) -> Option<&'static str> {
    (m.transport == "iwarp" && m.crc).then(iwarp_proto::wire::crc::impl_name)
}

/// One JSON object (one line) for a single measurement.
pub fn json_one(m: &Measurement) -> String {
    let mut s = String::from("{");
    json_body(m, &mut s);
    s.push('}');
    s
}

/// iWARP / TCP ratios: bandwidth and message rate (higher is better for
/// iWARP), median latency (lower is better for iWARP).
pub fn ratios(iw: &Measurement, tcp: &Measurement) -> (f64, f64, Option<f64>) {
    let bw = iw.gbit_s() / tcp.gbit_s();
    let rate = iw.mmsg_s() / tcp.mmsg_s();
    let lat = match (&iw.lat, &tcp.lat) {
        (Some(a), Some(b)) => Some(a.median / b.median),
        _ => None,
    };
    (bw, rate, lat)
}

/// One JSON object (one line) for a `--compare` pair.
pub fn json_compare(iw: &Measurement, tcp: &Measurement) -> String {
    let (bw, rate, lat) = ratios(iw, tcp);
    let p = &iw.params;
    let mut s = format!(
        "{{\"test\":\"{}\",\"size\":{},\"depth\":{},\"qps\":{},\"crc\":{},\"crc_impl\":{},\"markers\":{},\"iwarp\":{{",
        p.test,
        p.size,
        p.depth,
        p.qps,
        iw.crc,
        crc_impl(iw).map_or("null".into(), |n| format!("\"{n}\"")),
        iw.markers
    );
    json_body(iw, &mut s);
    s.push_str("},\"tcp\":{");
    json_body(tcp, &mut s);
    let _ = write!(
        s,
        "}},\"ratio\":{{\"bw\":{},\"msg_rate\":{},\"lat_median\":{}}}}}",
        num(bw),
        num(rate),
        lat.map_or("null".into(), num)
    );
    s
}

/// The perftest-style table header for `test`.
pub fn header(test: Test, compare: bool) -> String {
    let first = if compare { " transport " } else { "" };
    if test.is_bw() {
        format!(
            "{first} #bytes     #msgs   depth qps   BW[Gb/s]    BW[MB/s]   MsgRate[Mpps]  CPU[s]  Wall[s]  Thr    RSS[MiB]"
        )
    } else {
        format!(
            "{first} #bytes    #iters   t_min[us]  t_median[us]  t_avg[us]  t_p99[us]  t_max[us]  CPU[s]  RSS[MiB]"
        )
    }
}

/// One table row.
pub fn row(m: &Measurement, compare: bool) -> String {
    let p = &m.params;
    let first = if compare {
        format!(" {:<9} ", m.transport)
    } else {
        String::new()
    };
    let rss = m.peak_rss_kib as f64 / 1024.0;
    match (&m.lat, p.test.is_bw()) {
        (Some(l), false) => format!(
            "{first} {:<9} {:<9} {:>9.2}  {:>12.2}  {:>9.2}  {:>9.2}  {:>9.2}  {:>6.2}  {:>8.1}",
            p.size, m.msgs, l.min, l.median, l.avg, l.p99, l.max, m.cpu_s, rss
        ),
        _ => format!(
            "{first} {:<9} {:<9} {:<5} {:<4} {:>9.3}  {:>10.1}  {:>13.4}  {:>6.2}  {:>7.2}  {:<5}  {:>8.1}",
            p.size,
            m.msgs,
            p.depth,
            p.qps,
            m.gbit_s(),
            m.mb_s(),
            m.mmsg_s(),
            m.cpu_s,
            m.wall.as_secs_f64(),
            m.threads,
            rss
        ),
    }
}

/// The ratio line printed under a `--compare` pair.
pub fn ratio_row(iw: &Measurement, tcp: &Measurement) -> String {
    let (bw, rate, lat) = ratios(iw, tcp);
    match lat {
        Some(l) if !iw.params.test.is_bw() => {
            format!(" ratio      iWARP/TCP median latency {l:.3}x (lower is better)")
        }
        _ => format!(" ratio      iWARP/TCP bandwidth {bw:.3}x, message rate {rate:.3}x"),
    }
}

/// Peak resident set size of this process (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Reset the peak RSS to the current RSS (Linux ≥ 4.0: `5` in
/// `clear_refs`), so each phase of `--compare` reports its own peak.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub use iwarp_perf::proc_stats::{cpu_seconds, ThreadPeak};

/// Cores this process may run on (affinity and cgroup limits included).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_perf::proc_stats::threads;

    #[test]
    fn stats() {
        let mut s: Vec<f64> = (1..=100).map(f64::from).collect();
        s.reverse();
        let l = LatStats::from_samples(&mut s).unwrap();
        assert_eq!(l.min, 1.0);
        assert_eq!(l.max, 100.0);
        assert_eq!(l.p99, 99.0);
        assert!((l.median - 50.0).abs() <= 1.0);
        assert!(LatStats::from_samples(&mut []).is_none());
        assert!(peak_rss_kib() > 0);
    }

    fn measurement(cpu_s: f64, elapsed_ms: u64, wall_ms: u64) -> Measurement {
        Measurement {
            transport: "tcp",
            params: Params {
                test: Test::WriteBw,
                size: 4096,
                iters: 1,
                duration: None,
                depth: 1,
                qps: 256,
                integrity: false,
                busy_poll: false,
                corrupt: false,
                timeout: Duration::from_secs(1),
            },
            msgs: 1,
            elapsed: Duration::from_millis(elapsed_ms),
            crc: false,
            markers: false,
            lat: None,
            peak_rss_kib: 1,
            cpu_s,
            cpu_over_span: true,
            wall: Duration::from_millis(wall_ms),
            threads: 1,
            verified: 0,
        }
    }

    #[test]
    fn impossible_measurements_are_refused() {
        // The figure issue 29 found: 22.2 CPU-s in 3.2 s on 2 cores.
        let e = measurement(22.2, 3200, 3200)
            .check_plausible(2)
            .unwrap_err();
        assert!(
            e.contains("22.20 CPU seconds in 3.20 s") && e.contains("2 cores"),
            "{e}"
        );
        // A span longer than the window it was taken in.
        let e = measurement(1.0, 4000, 3000).check_plausible(2).unwrap_err();
        assert!(e.contains("span"), "{e}");
        // Two busy cores for the whole window, plus a tick: plausible.
        assert!(measurement(6.41, 3200, 3400).check_plausible(2).is_ok());
        assert!(measurement(6.5, 3200, 3400).check_plausible(2).is_err());
        assert!(measurement(6.5, 3200, 3400).check_plausible(4).is_ok());
    }

    #[test]
    fn rusage_counts_this_threads_work() {
        let c0 = cpu_seconds();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(100) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let used = cpu_seconds() - c0;
        // At least part of the 100 ms of spinning (a loaded machine may
        // deschedule us), never more than the wall time allows.
        assert!(used > 0.0 && used <= 0.1 * cores() as f64 + 0.05, "{used}");
        assert!(threads() >= 1);
    }

    #[test]
    fn json_numbers_keep_small_values() {
        assert_eq!(num(23.456_789), "23.4568");
        assert_eq!(num(0.0), "0.0000");
        assert_eq!(num(0.000_032_1), "0.000032100");
        assert!(num(1e-9).parse::<f64>().unwrap() > 0.0);
        assert_eq!(num(f64::NAN), "null");
    }
}
