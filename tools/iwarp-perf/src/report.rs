//! Results: statistics, perftest-like tables, JSON lines, and process
//! resource usage (peak RSS from `/proc/self/status` `VmHWM`, CPU time from
//! `getrusage`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::params::{Params, Test};

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
    /// User + system CPU seconds of the whole process during the run.
    pub cpu_s: f64,
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
        ",\"peak_rss_kib\":{},\"peak_rss_mib\":{},\"cpu_s\":{},\"verified\":{}",
        m.peak_rss_kib,
        num(m.peak_rss_kib as f64 / 1024.0),
        num(m.cpu_s),
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
            "{first} #bytes     #msgs   depth qps  BW[Gb/s]    BW[MB/s]   MsgRate[Mpps]  CPU[s]  RSS[MiB]"
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
            "{first} {:<9} {:<9} {:<5} {:<3} {:>9.3}  {:>10.1}  {:>13.4}  {:>6.2}  {:>8.1}",
            p.size,
            m.msgs,
            p.depth,
            p.qps,
            m.gbit_s(),
            m.mb_s(),
            m.mmsg_s(),
            m.cpu_s,
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

/// User + system CPU seconds consumed by this process so far, from
/// `/proc/self/stat` (fields 14 and 15, in USER_HZ ticks, which Linux fixes
/// at 100 for this interface): all threads, including the driver's.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The command name (field 2) may contain spaces; fields resume after
    // its closing parenthesis, starting with field 3.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(14) + ticks(15)) as f64 / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn json_numbers_keep_small_values() {
        assert_eq!(num(23.456_789), "23.4568");
        assert_eq!(num(0.0), "0.0000");
        assert_eq!(num(0.000_032_1), "0.000032100");
        assert!(num(1e-9).parse::<f64>().unwrap() > 0.0);
        assert_eq!(num(f64::NAN), "null");
    }
}
