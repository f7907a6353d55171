//! Parsing of the command line's quantities: durations (`50ms`), rates
//! (`1gbit`, tc(8) units: bits per second), sizes (`64k`, `bdp`) and
//! probabilities (`0.1%`). Every error names the value, the unit it wanted and
//! an example.

/// Nanoseconds; the emulator's clock unit.
pub type Nanos = u64;

/// Parses `50ms`, `1.5s`, `200us`, `0`, `10000ns` into nanoseconds.
pub fn parse_duration(s: &str) -> Result<Nanos, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let (num, mult) = split_unit(t, &[("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)])
        .ok_or_else(|| {
            format!(
                "duration `{s}`: needs a unit, one of ns, us, ms, s (for example `50ms` or `1.5s`)"
            )
        })?;
    let v: f64 = num
        .parse()
        .map_err(|_| format!("duration `{s}`: `{num}` is not a number (for example `50ms`)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("duration `{s}`: must be zero or positive"));
    }
    Ok((v * mult).round() as Nanos)
}

/// Parses a rate in bits per second with tc(8)'s units: `bit`, `kbit`,
/// `mbit`, `gbit` (decimal: 1mbit = 1,000,000 bit/s). Byte units (`bps`,
/// `kbps`, ...) mean bytes in tc and are easy to misread, so they are refused.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    if t.ends_with("bps") {
        return Err(format!(
            "rate `{s}`: byte units are refused (tc reads `mbps` as megabytes); write bits, for example `100mbit` or `1gbit`"
        ));
    }
    let (num, mult) = split_unit(
        &t,
        &[("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)],
    )
    .ok_or_else(|| {
        format!("rate `{s}`: needs a unit, one of bit, kbit, mbit, gbit (for example `1gbit`)")
    })?;
    let v: f64 = num
        .parse()
        .map_err(|_| format!("rate `{s}`: `{num}` is not a number (for example `100mbit`)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("rate `{s}`: must be positive"));
    }
    let bits = (v * mult).round();
    if bits < 8.0 {
        return Err(format!("rate `{s}`: below 8 bit/s; use at least `1kbit`"));
    }
    Ok(bits as u64)
}

/// A probability: `0.1%` or `0.001`.
pub fn parse_prob(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = if let Some(p) = t.strip_suffix('%') {
        p.trim()
            .parse::<f64>()
            .map_err(|_| format!("probability `{s}`: `{p}` is not a number (for example `0.1%`)"))?
            / 100.0
    } else {
        t.parse::<f64>().map_err(|_| {
            format!("probability `{s}`: not a number (for example `0.001` or `0.1%`)")
        })?
    };
    if !(0.0..=1.0).contains(&v) {
        return Err(format!(
            "probability `{s}`: must be between 0 and 1 (0% and 100%)"
        ));
    }
    Ok(v)
}

/// The drop-tail queue's size: bytes, or a multiple of the path's
/// bandwidth-delay product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QueueSize {
    Bytes(u64),
    /// `bdp` (1.0), `2bdp`, `0.5bdp`.
    Bdp(f64),
}

/// Parses `65536`, `64k` (KiB), `4m` (MiB), `bdp`, `2bdp`.
pub fn parse_queue(s: &str) -> Result<QueueSize, String> {
    let t = s.trim().to_ascii_lowercase();
    if let Some(m) = t.strip_suffix("bdp") {
        let m = if m.is_empty() {
            1.0
        } else {
            m.parse::<f64>().map_err(|_| {
                format!("queue `{s}`: `{m}` is not a multiplier (for example `bdp` or `2bdp`)")
            })?
        };
        if !(m.is_finite() && m > 0.0) {
            return Err(format!("queue `{s}`: the multiplier must be positive"));
        }
        return Ok(QueueSize::Bdp(m));
    }
    let (num, mult) = match split_unit(&t, &[("k", 1024u64), ("m", 1 << 20), ("g", 1 << 30)]) {
        Some(x) => x,
        None => (t.as_str(), 1),
    };
    let v: u64 = num.parse().map_err(|_| {
        format!("queue `{s}`: not a size; give bytes (`65536`), KiB/MiB (`64k`, `4m`) or `bdp`")
    })?;
    Ok(QueueSize::Bytes(v.saturating_mul(mult)))
}

fn split_unit<'a, T: Copy>(s: &'a str, units: &[(&str, T)]) -> Option<(&'a str, T)> {
    // Longest suffix first is the caller's order.
    units
        .iter()
        .find_map(|(u, m)| s.strip_suffix(u).map(|n| (n.trim(), *m)))
}

/// Formats nanoseconds for humans (`50.000ms`).
pub fn fmt_ns(ns: Nanos) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.3}s", ns as f64 / 1e9)
    } else {
        format!("{:.3}ms", ns as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50ms"), Ok(50_000_000));
        assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration("200us"), Ok(200_000));
        assert_eq!(parse_duration("0"), Ok(0));
        assert!(parse_duration("50").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("-1ms").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("10Mbit"), Ok(10_000_000));
        assert_eq!(parse_rate("2.5mbit"), Ok(2_500_000));
        assert!(parse_rate("10mbps").unwrap_err().contains("byte units"));
        assert!(parse_rate("10").is_err());
    }

    #[test]
    fn probs_and_queues() {
        assert_eq!(parse_prob("0.1%"), Ok(0.001));
        assert_eq!(parse_prob("0.25"), Ok(0.25));
        assert!(parse_prob("150%").is_err());
        assert_eq!(parse_queue("64k"), Ok(QueueSize::Bytes(65536)));
        assert_eq!(parse_queue("1500"), Ok(QueueSize::Bytes(1500)));
        assert_eq!(parse_queue("bdp"), Ok(QueueSize::Bdp(1.0)));
        assert_eq!(parse_queue("2bdp"), Ok(QueueSize::Bdp(2.0)));
        assert!(parse_queue("lots").is_err());
    }
}
