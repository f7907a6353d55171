//! Receive-ring autotuning: how large the ring a peer RDMA-Writes into
//! must be for the path it crosses, measured as the stream runs (like the
//! kernel's receive-buffer autotuning, `tcp_rcv_space_adjust`).
//!
//! What the peer may have in flight is what we advertised and it has not
//! filled: between one and two halves of the ring (a freed half is
//! advertised again only once it is read). To keep a path of rate `R` and
//! round-trip time `RTT` busy the ring must hold twice the
//! bandwidth-delay product, `2 * R * RTT`; the default 1 MiB ring held a
//! 50 ms path to about 168 Mbit/s (1 MiB per RTT) at best.
//!
//! [`RingTuner`] measures, once per round trip (at least every
//! [`MIN_WINDOW`]), the bytes the application read and the path's RTT
//! (`TCP_INFO`), and asks for `2 * bytes_per_rtt`, rounded up to the
//! initial ring times a power of two and bounded by the memory limit:
//! while the ring is what limits the stream, each measurement asks for
//! more than it has, so it doubles (one step per ring wrap, see
//! [`Flow::set_ring_goal`](crate::flow::Flow::set_ring_goal)) until the
//! path or the application is the limit. A stream whose reader is slow
//! never grows. The ring never shrinks.
//!
//! The memory limit ([`Options::rbuf_max`](crate::Options::rbuf_max),
//! `IWARP_SOCKETS_RBUF_MAX`) defaults to the kernel's own limit for a TCP
//! receive buffer (`net.ipv4.tcp_rmem`, third value), rounded up to the
//! initial ring times a power of two: a stream may hold as much as a
//! kernel TCP socket may. The region is registered that large from the
//! start, but memory is only committed as the ring reaches it (the pages
//! beyond the ring in use are never touched).

use std::time::Duration;

/// The shortest measurement window (on a LAN the RTT is microseconds).
pub const MIN_WINDOW: Duration = Duration::from_millis(10);

/// Where the kernel keeps its TCP receive-buffer limits (tcp(7)).
pub const TCP_RMEM_PATH: &str = "/proc/sys/net/ipv4/tcp_rmem";

/// Used when [`TCP_RMEM_PATH`] cannot be read: the kernel's default
/// third value (6 MiB).
pub const FALLBACK_RMEM_MAX: u32 = 6 << 20;

/// The largest ring the tuner may ask for with initial ring `initial`
/// and memory limit `limit`: `initial * 2^k`, the smallest such value
/// that is at least `limit` (so the limit is reached, not undershot),
/// at most 1 GiB ([`crate::flow::MAX_BUF`]).
pub fn ring_cap(initial: u32, limit: u32) -> u32 {
    let mut cap = u64::from(initial.max(2));
    while cap < u64::from(limit) && cap * 2 <= u64::from(crate::flow::MAX_BUF) {
        cap *= 2;
    }
    cap as u32
}

/// The third value of `net.ipv4.tcp_rmem` in `text` (the file's
/// contents: "min default max").
pub fn parse_rmem_max(text: &str) -> Option<u32> {
    text.split_whitespace()
        .nth(2)?
        .parse::<u64>()
        .ok()
        .map(|v| v.min(u64::from(u32::MAX)) as u32)
}

/// The kernel's TCP receive-buffer limit, or [`FALLBACK_RMEM_MAX`].
pub fn kernel_rmem_max() -> u32 {
    std::fs::read_to_string(TCP_RMEM_PATH)
        .ok()
        .as_deref()
        .and_then(parse_rmem_max)
        .unwrap_or(FALLBACK_RMEM_MAX)
}

/// The measurement state of one stream (sans-IO: the driver passes the
/// clock, the bytes read so far and the RTT).
#[derive(Debug, Clone)]
pub struct RingTuner {
    initial: u32,
    cap: u32,
    goal: u32,
    window_start: Option<Duration>,
    bytes_at_start: u64,
}

impl RingTuner {
    /// A tuner for a ring of `initial` bytes that may grow to `cap`
    /// ([`ring_cap`]).
    pub fn new(initial: u32, cap: u32) -> RingTuner {
        RingTuner {
            initial,
            cap: cap.max(initial),
            goal: initial,
            window_start: None,
            bytes_at_start: 0,
        }
    }

    /// The ring asked for so far.
    pub fn goal(&self) -> u32 {
        self.goal
    }

    /// Whether it can still grow.
    pub fn can_grow(&self) -> bool {
        self.goal < self.cap
    }

    /// Whether a measurement is due at `now` (a window of one RTT, at
    /// least [`MIN_WINDOW`], has passed); the driver reads the RTT only
    /// then.
    pub fn due(&self, now: Duration, rtt_hint: Duration) -> bool {
        match self.window_start {
            None => true,
            Some(t) => now.saturating_sub(t) >= rtt_hint.max(MIN_WINDOW),
        }
    }

    /// A measurement at `now` (any monotonic clock), with `bytes_read`
    /// read by the application since the stream began and the path's
    /// `rtt`. Returns the new goal when it grew.
    pub fn sample(&mut self, now: Duration, bytes_read: u64, rtt: Duration) -> Option<u32> {
        let Some(start) = self.window_start else {
            self.window_start = Some(now);
            self.bytes_at_start = bytes_read;
            return None;
        };
        let elapsed = now.saturating_sub(start);
        if elapsed < rtt.max(MIN_WINDOW) || elapsed.is_zero() {
            return None;
        }
        let bytes = bytes_read.saturating_sub(self.bytes_at_start);
        self.window_start = Some(now);
        self.bytes_at_start = bytes_read;
        // Bytes per RTT at the rate of this window, twice (see the module
        // docs), in u128 so no product overflows.
        let want = 2 * u128::from(bytes) * rtt.as_nanos() / elapsed.as_nanos();
        let mut goal = u64::from(self.goal);
        while u128::from(goal) < want && goal < u64::from(self.cap) {
            goal *= 2;
        }
        let goal = goal.min(u64::from(self.cap)) as u32;
        if goal > self.goal {
            self.goal = goal;
            return Some(goal);
        }
        None
    }

    /// The initial ring.
    pub fn initial(&self) -> u32 {
        self.initial
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_cap_is_the_initial_ring_doubled_up_to_the_limit() {
        assert_eq!(ring_cap(1 << 20, 6 << 20), 8 << 20);
        assert_eq!(ring_cap(1 << 20, 1 << 20), 1 << 20);
        assert_eq!(ring_cap(1 << 20, 0), 1 << 20);
        assert_eq!(ring_cap(3 << 20, 8 << 20), 12 << 20);
        assert_eq!(ring_cap(1 << 20, u32::MAX), crate::flow::MAX_BUF);
    }

    #[test]
    fn the_kernel_limit_is_the_third_value_of_tcp_rmem() {
        assert_eq!(parse_rmem_max("4096\t131072\t6291456\n"), Some(6291456));
        assert_eq!(parse_rmem_max("4096 131072"), None);
        assert_eq!(parse_rmem_max("a b c"), None);
        assert_eq!(parse_rmem_max("1 2 99999999999"), Some(u32::MAX));
    }

    /// A ring-limited stream: each window reads what the ring lets
    /// through (`ring` per RTT); the tuner doubles until the cap.
    #[test]
    fn a_ring_limited_stream_doubles_to_the_cap() {
        let rtt = 50 * MS;
        let mut t = RingTuner::new(1 << 20, 8 << 20);
        let (mut now, mut read) = (Duration::ZERO, 0u64);
        assert_eq!(
            t.sample(now, read, rtt),
            None,
            "the first call starts a window"
        );
        let mut goals = Vec::new();
        for _ in 0..10 {
            // Three quarters of the current ring per RTT.
            read += u64::from(t.goal()) * 3 / 4;
            now += rtt;
            if let Some(g) = t.sample(now, read, rtt) {
                goals.push(g);
            }
        }
        assert_eq!(goals, [2 << 20, 4 << 20, 8 << 20]);
        assert!(!t.can_grow());
    }

    /// A path-limited stream asks for twice the bandwidth-delay product,
    /// rounded up to a power-of-two multiple, and stays there.
    #[test]
    fn a_path_limited_stream_settles_at_twice_the_bdp() {
        let rtt = 50 * MS;
        // 100 Mbit/s: 625,000 bytes per RTT, twice is 1.25 MB -> 2 MiB.
        let per_rtt = 625_000u64;
        let mut t = RingTuner::new(1 << 20, 64 << 20);
        let (mut now, mut read) = (Duration::ZERO, 0u64);
        t.sample(now, read, rtt);
        for _ in 0..20 {
            read += per_rtt;
            now += rtt;
            t.sample(now, read, rtt);
        }
        assert_eq!(t.goal(), 2 << 20);
    }

    #[test]
    fn a_slow_reader_or_a_lan_path_does_not_grow() {
        // A LAN: 10 Gbit/s at 100 us is 125 KB per RTT; measured over
        // 10 ms windows that is 2 * 125 KB, well inside 1 MiB.
        let mut t = RingTuner::new(1 << 20, 8 << 20);
        let rtt = Duration::from_micros(100);
        let (mut now, mut read) = (Duration::ZERO, 0u64);
        t.sample(now, read, rtt);
        for _ in 0..100 {
            // 1 ms later: not a whole window yet.
            assert!(!t.due(now + MS, rtt));
            now += MIN_WINDOW;
            read += 12_500_000; // 10 Gbit/s for 10 ms
            assert_eq!(t.sample(now, read, rtt), None);
        }
        // A WAN reader that reads 100 KB per RTT: nothing to gain.
        let mut t = RingTuner::new(1 << 20, 8 << 20);
        let rtt = 50 * MS;
        t.sample(Duration::ZERO, 0, rtt);
        for i in 1..20u64 {
            assert_eq!(t.sample(rtt * i as u32, 100_000 * i, rtt), None);
        }
        assert_eq!(t.goal(), 1 << 20);
    }

    #[test]
    fn a_window_shorter_than_the_rtt_measures_nothing() {
        let mut t = RingTuner::new(1 << 20, 8 << 20);
        let rtt = 50 * MS;
        t.sample(Duration::ZERO, 0, rtt);
        assert!(!t.due(20 * MS, rtt));
        assert_eq!(t.sample(20 * MS, 10 << 20, rtt), None);
        assert!(t.due(50 * MS, rtt));
    }
}
