//! The result table, in `rstream`'s exact layout, and its JSON twin.
//!
//! rstream (librdmacm/examples/rstream.c, `show_perf`) prints one header
//! and one row per test:
//!
//! ```text
//! name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer
//! 64_lat    64      1       100k    12m        1.23s      0.08       6.17
//! ```
//!
//! - `name`: `custom` for a custom test (`-C`/`-I`/`-S N`), otherwise the
//!   size followed by `_lat` or `_bw`;
//! - `bytes`: the transfer size, `xfers`: transfers per direction and
//!   iteration, `iters`: iterations, `total`: `iters * xfers * bytes * 2`
//!   (both directions);
//! - sizes are printed by `size_str` (powers of 1024, one decimal below
//!   10: `1.5k`), counts by `cnt_str` (powers of 1000, truncated: `100k`);
//! - `time` in seconds, `Gb/sec` = total bits / 1e9 / seconds,
//!   `usec/xfer` = microseconds / iters / (xfers * 2): the one-way time of
//!   one transfer, so for a latency test half the round trip.
//!
//! The functions here reproduce those helpers (`size_str`, `cnt_str`,
//! `size_to_count` of librdmacm/examples/common.c) byte for byte, so a
//! script that parses rstream's output parses ours.

use std::fmt::Write as _;
use std::time::Duration;

/// `size_str`: a byte count in binary units, one decimal when the integer
/// part is a single digit and the fraction is not zero (`1.5k`, `12k`,
/// `4m`).
pub fn size_str(size: u64) -> String {
    let (base, mag) = if size >= 1 << 30 {
        (1u64 << 30, "g")
    } else if size >= 1 << 20 {
        (1 << 20, "m")
    } else if size >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let whole = size / base;
    let fraction = if whole < 10 {
        (size % base) * 10 / base
    } else {
        0
    };
    if fraction != 0 {
        format!("{whole}.{fraction}{mag}")
    } else {
        format!("{whole}{mag}")
    }
}

/// `cnt_str`: a count in decimal units, truncated (`100k`, `1m`, `2b`).
pub fn cnt_str(cnt: u64) -> String {
    if cnt >= 1_000_000_000 {
        format!("{}b", cnt / 1_000_000_000)
    } else if cnt >= 1_000_000 {
        format!("{}m", cnt / 1_000_000)
    } else if cnt >= 1000 {
        format!("{}k", cnt / 1000)
    } else {
        cnt.to_string()
    }
}

/// `size_to_count`: how many transfers (bandwidth) or iterations (latency)
/// a size gets in the size sweep.
pub fn size_to_count(size: usize) -> u32 {
    if size >= 1 << 20 {
        100
    } else if size >= 1 << 16 {
        1000
    } else if size >= 1 << 10 {
        10_000
    } else {
        100_000
    }
}

/// The header line (without the newline).
pub fn header() -> String {
    format!(
        "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
        "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
    )
}

/// What one test measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// `custom`, `64_lat`, `1m_bw`, ...
    pub name: String,
    /// Bytes per transfer.
    pub size: usize,
    /// Transfers per direction and iteration.
    pub count: u32,
    /// Iterations.
    pub iterations: u32,
    /// Wall time of the timed part.
    pub elapsed: Duration,
    /// On an rsockets stream: the application writes of the timed part and
    /// the data messages they went out as (coalescing makes the second
    /// smaller). `None` over TCP.
    pub msgs: Option<(u64, u64)>,
}

impl Sample {
    /// Bytes moved, both directions.
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.iterations) * u64::from(self.count) * self.size as u64 * 2
    }

    /// rstream's time base: whole microseconds (`gettimeofday`), at least
    /// one so the divisions below stay finite.
    fn usec(&self) -> f64 {
        (self.elapsed.as_micros().max(1)) as f64
    }

    /// Gigabits per second (decimal).
    pub fn gbps(&self) -> f64 {
        (self.total_bytes() * 8) as f64 / (1000.0 * self.usec())
    }

    /// Microseconds per one-way transfer.
    pub fn usec_per_xfer(&self) -> f64 {
        (self.usec() / f64::from(self.iterations.max(1))) / (f64::from(self.count.max(1)) * 2.0)
    }

    /// The table row (without the newline), as `show_perf` prints it.
    pub fn row(&self) -> String {
        // rstream keeps the name in a char[10]: at most 9 characters.
        let name: String = self.name.chars().take(9).collect();
        format!(
            "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8.2}s{:>10.2}{:>11.2}",
            name,
            size_str(self.size as u64),
            cnt_str(u64::from(self.count)),
            cnt_str(u64::from(self.iterations)),
            size_str(self.total_bytes()),
            self.usec() / 1e6,
            self.gbps(),
            self.usec_per_xfer(),
        )
    }

    /// One JSON object (one line) with the raw figures and the context.
    pub fn json(&self, transport: &str, design: &str, role: &str) -> String {
        let mut s = String::from("{");
        let _ = write!(
            s,
            "\"name\":\"{}\",\"transport\":\"{}\",\"design\":\"{}\",\"role\":\"{}\",\
             \"bytes\":{},\"xfers\":{},\"iters\":{},\"total_bytes\":{},\
             \"seconds\":{:.6},\"gbps\":{:.4},\"usec_per_xfer\":{:.3}",
            json_escape(&self.name),
            json_escape(transport),
            json_escape(design),
            json_escape(role),
            self.size,
            self.count,
            self.iterations,
            self.total_bytes(),
            self.elapsed.as_secs_f64(),
            self.gbps(),
            self.usec_per_xfer(),
        );
        if let Some((writes, msgs)) = self.msgs {
            let _ = write!(s, ",\"writes\":{writes},\"data_msgs\":{msgs}");
        }
        s.push('}');
        s
    }
}

fn json_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

/// The sizes of the sweep, each with the option level that enables it
/// (`test_size[]` of rstream.c): level 0 runs by default, level 1 only
/// with `-S all`.
pub const SWEEP: [(usize, u8); 33] = {
    let mut t = [(0usize, 1u8); 33];
    t[0] = (64, 0);
    let mut i = 1;
    let mut shift = 7;
    while shift <= 22 {
        let p = 1usize << shift;
        // 4 KiB, 64 KiB and 1 MiB are in the default sweep.
        let level = if shift == 12 || shift == 16 || shift == 20 {
            0
        } else {
            1
        };
        t[i] = (p, level);
        t[i + 1] = (p + (p >> 1), 1);
        i += 2;
        shift += 1;
    }
    t
};

/// The sweep's test name for a size: `64_lat`, `1.5k_bw`.
pub fn sweep_name(size: usize, latency: bool) -> String {
    format!(
        "{}_{}",
        size_str(size as u64),
        if latency { "lat" } else { "bw" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_str_matches_common_c() {
        for (n, s) in [
            (0u64, "0"),
            (64, "64"),
            (1000, "1000"),
            (1024, "1k"),
            (1536, "1.5k"),
            (1100, "1k"), // fraction truncated to 0: no decimal
            (12288, "12k"),
            (65536, "64k"),
            (98304, "96k"),
            (1 << 20, "1m"),
            (3 << 19, "1.5m"),
            (6 << 20, "6m"),
            (12_800_000, "12m"),
            (1 << 30, "1g"),
            (5 << 29, "2.5g"),
        ] {
            assert_eq!(size_str(n), s, "{n}");
        }
    }

    #[test]
    fn cnt_str_matches_common_c() {
        for (n, s) in [
            (1u64, "1"),
            (999, "999"),
            (1000, "1k"),
            (1999, "1k"),
            (100_000, "100k"),
            (1_000_000, "1m"),
            (2_500_000_000, "2b"),
        ] {
            assert_eq!(cnt_str(n), s);
        }
    }

    #[test]
    fn the_header_and_a_row_have_rstreams_columns() {
        assert_eq!(
            header(),
            "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer"
        );
        let s = Sample {
            name: "64_lat".into(),
            size: 64,
            count: 1,
            iterations: 100_000,
            elapsed: Duration::from_micros(1_234_567),
            msgs: None,
        };
        assert_eq!(s.total_bytes(), 12_800_000);
        // 1.234567 s; 102.4 Mbit / 1.234567 s = 0.083 Gb/s; 1234567 / 100000 / 2 us.
        assert_eq!(
            s.row(),
            "64_lat    64      1       100k    12m         1.23s      0.08       6.17"
        );
        let j = s.json("rsockets", "enhanced", "client");
        assert!(j.starts_with("{\"name\":\"64_lat\",\"transport\":\"rsockets\""));
        assert!(j.contains("\"total_bytes\":12800000"));
    }

    #[test]
    fn a_name_longer_than_rstreams_buffer_is_cut_to_nine() {
        let s = Sample {
            name: "1234567890ab".into(),
            size: 1,
            count: 1,
            iterations: 1,
            elapsed: Duration::from_secs(1),
            msgs: Some((10, 4)),
        };
        assert!(s
            .json("rsockets", "enhanced", "client")
            .ends_with(",\"writes\":10,\"data_msgs\":4}"));
        assert!(s.row().starts_with("123456789 "));
    }

    #[test]
    fn the_sweep_is_rstreams_table() {
        assert_eq!(SWEEP.len(), 33);
        assert_eq!(SWEEP[0], (64, 0));
        assert_eq!(SWEEP[1], (128, 1));
        assert_eq!(SWEEP[2], (192, 1));
        assert_eq!(SWEEP[32], (6 << 20, 1));
        let default: Vec<usize> = SWEEP
            .iter()
            .filter(|(_, l)| *l == 0)
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(default, [64, 4096, 65536, 1 << 20]);
        assert_eq!(sweep_name(1536, true), "1.5k_lat");
        assert_eq!(sweep_name(6 << 20, false), "6m_bw");
        assert_eq!(size_to_count(64), 100_000);
        assert_eq!(size_to_count(1024), 10_000);
        assert_eq!(size_to_count(65536), 1000);
        assert_eq!(size_to_count(1 << 20), 100);
    }
}
