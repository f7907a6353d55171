//! Sizing the data in flight to the path (issue 27 §3), as pure logic: no
//! sockets, no clock (times come in as [`Duration`]s since a start the
//! caller picks), so every rule is unit-tested with made-up samples.
//!
//! Two parts, like TCP's own window handling:
//!
//! - [`plan`]: before a session, from the measured round-trip time (and the
//!   delivered rate of an earlier transfer, if there was one), how many
//!   streams, how deep a pool and so how many bytes may be in flight. The
//!   bytes in flight must cover the bandwidth-delay product (BDP), and no
//!   single TCP connection may be asked to carry more than the kernel lets
//!   it keep in flight ([`per_connection_cap`]): that cap, not the
//!   middleware, is what one stream reaches on a long path.
//! - [`Autotune`]: during a transfer, on the sink, how many of the pool's
//!   blocks are granted at once: it grows while the transfer is limited by
//!   the window and shrinks when the delivered rate falls, like Linux's
//!   receive-buffer autotuning (dynamic right-sizing: advertise twice what
//!   arrived in the last round trip), bounded by the pool (the memory the
//!   session registered).
//!
//! Why a per-connection cap: Linux grows a socket's send buffer only up to
//! `net.ipv4.tcp_wmem[2]` (4 MiB by default) and counts the buffers' full
//! size (`skb->truesize`) against it, so about three quarters of it is
//! payload: one connection keeps at most ~3 MiB unacknowledged, 503 Mbit/s
//! at 50 ms RTT whatever the application queues (one iperf3 stream
//! measured 505 Mbit/s on such a path, issue 27). The receive side allows
//! `tcp_rmem[2]` minus the share `tcp_adv_win_scale` keeps for overhead
//! (tcp(7)).

use std::time::Duration;

/// Bytes in flight on a short path (the default window of today's fixed
/// sizing): more than loopback needs, and within the CPU caches' reach.
pub const LAN_WINDOW: u64 = 16 << 20;
/// The rate the first plan of a session is sized for when nothing was
/// measured yet (bits per second). The window then shrinks in the transfer
/// to what the path delivers ([`Autotune`]), and the next plan starts from
/// the delivered rate.
pub const FIRST_PLAN_RATE: f64 = 2.5e9;
/// Most streams the automatic plan opens.
pub const MAX_AUTO_STREAMS: u32 = 8;
/// Largest pool (bytes per side) the automatic plan registers by default.
pub const DEFAULT_MAX_WINDOW: u64 = 64 << 20;

/// What bounds a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest pool in bytes (memory registered per side).
    pub max_window: u64,
    /// Bytes one TCP connection keeps in flight at most
    /// ([`per_connection_cap`]).
    pub per_conn: u64,
    /// Most streams.
    pub max_streams: u32,
}

impl Limits {
    /// The limits of this host: [`DEFAULT_MAX_WINDOW`] (or `max_window`),
    /// the kernel's per-connection cap from `/proc/sys/net/ipv4`, and
    /// [`MAX_AUTO_STREAMS`].
    pub fn of_this_host(max_window: Option<u64>) -> Limits {
        let triple = |name: &str| -> Option<u64> {
            let s = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).ok()?;
            s.split_whitespace().last()?.parse().ok()
        };
        let scale = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_adv_win_scale")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1);
        Limits {
            max_window: max_window.unwrap_or(DEFAULT_MAX_WINDOW),
            per_conn: per_connection_cap(
                triple("tcp_wmem").unwrap_or(4 << 20),
                triple("tcp_rmem").unwrap_or(6 << 20),
                scale,
            ),
            max_streams: MAX_AUTO_STREAMS,
        }
    }
}

/// Bytes of payload one TCP connection can keep in flight on this kernel:
/// the send side's `tcp_wmem[2]` at 3/4 (truesize overhead), the receive
/// side's `tcp_rmem[2]` less what `tcp_adv_win_scale` reserves (tcp(7):
/// a positive scale keeps `rmem / 2^scale` for overhead, a negative one
/// gives the window `rmem / 2^-scale`).
pub fn per_connection_cap(wmem_max: u64, rmem_max: u64, adv_win_scale: i32) -> u64 {
    let send = wmem_max / 4 * 3;
    let recv = if adv_win_scale > 0 {
        rmem_max - (rmem_max >> adv_win_scale.min(31))
    } else {
        rmem_max >> (-adv_win_scale).min(31)
    };
    send.min(recv).max(64 << 10)
}

/// The bandwidth-delay product in bytes.
pub fn bdp(rate_bps: f64, rtt: Duration) -> u64 {
    (rate_bps.max(0.0) / 8.0 * rtt.as_secs_f64()) as u64
}

/// A session's sizing, with the reason in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub streams: u32,
    pub block_size: u32,
    /// Blocks in flight per stream (the pool is `streams x iodepth`).
    pub iodepth: u32,
    /// Why, for the progress line and the log.
    pub why: String,
}

impl Plan {
    /// Bytes of the pool (the most that can be in flight).
    pub fn window(&self) -> u64 {
        u64::from(self.streams) * u64::from(self.iodepth) * u64::from(self.block_size)
    }
}

/// Size a session for a path of round-trip time `rtt`, delivering
/// `measured_bps` in an earlier transfer (`None`: nothing measured yet,
/// plan for [`FIRST_PLAN_RATE`]), with blocks of `block_size` bytes.
///
/// - The target rate is twice the measured one (room to grow: the next
///   plan doubles again while the path keeps up), or [`FIRST_PLAN_RATE`].
/// - Streams: enough that none carries more than `lim.per_conn` of the
///   target BDP, at most `lim.max_streams`.
/// - Window: 1.5 x BDP (the sink's grant turnaround and the request
///   granularity) plus two blocks per stream (a block is busy for its own
///   transmission time besides the round trip), at least [`LAN_WINDOW`],
///   at most `lim.max_window`; the depth is that over streams x block.
pub fn plan(rtt: Duration, measured_bps: Option<f64>, block_size: u32, lim: &Limits) -> Plan {
    let block = u64::from(block_size.max(crate::MIN_BLOCK));
    let (rate, rate_why) = match measured_bps {
        Some(r) if r > 0.0 => (2.0 * r, format!("2 x the {:.0} Mbit/s delivered", r / 1e6)),
        _ => (
            FIRST_PLAN_RATE,
            format!("{:.1} Gbit/s until measured", FIRST_PLAN_RATE / 1e9),
        ),
    };
    let bdp = bdp(rate, rtt);
    let per_conn = lim.per_conn.max(block);
    let streams = bdp
        .div_ceil(per_conn)
        .clamp(1, u64::from(lim.max_streams.max(1))) as u32;
    let per_stream = u64::from(streams) * block;
    let want = bdp + bdp / 2 + 2 * per_stream;
    // Short paths keep the fixed default: 16 MiB over all streams, 2 to 4
    // blocks per stream (more only spreads the transfer over more memory
    // than the CPU caches hold; docs/RFTP.md).
    let floor = (LAN_WINDOW / per_stream).clamp(2, 4);
    let cap = (lim.max_window / per_stream).max(2);
    let iodepth = want
        .div_ceil(per_stream)
        .max(floor)
        .min(cap)
        .clamp(2, u64::from(crate::MAX_IODEPTH)) as u32;
    let mut why = format!(
        "RTT {:.2} ms, BDP {} at {rate_why}; {streams} stream(s) so that none carries more than \
         the kernel's {} per connection; {} in flight",
        rtt.as_secs_f64() * 1e3,
        mib(bdp),
        mib(per_conn),
        mib(u64::from(streams) * u64::from(iodepth) * block),
    );
    if want.div_ceil(per_stream) > cap {
        why.push_str(&format!(
            " (1.5 BDP + 2 blocks per stream, capped by the {} memory limit)",
            mib(lim.max_window)
        ));
    } else if want.div_ceil(per_stream) < floor {
        why.push_str(" (the short-path default: 16 MiB over all streams, 2-4 blocks per stream)");
    } else {
        why.push_str(" = 1.5 BDP + 2 blocks per stream");
    }
    Plan {
        streams,
        block_size: block as u32,
        iodepth,
        why,
    }
}

/// Fit a session's plan to one transfer of `size` bytes (issue 27): a
/// transfer small against the path's bandwidth-delay product does not
/// need the streams and the pool that fill the path.
///
/// - Block: a transfer smaller than one block gets one block of its own
///   size (rounded up to 4 KiB, at least [`crate::MIN_BLOCK`]): no
///   memory registered for bytes that never come.
/// - Streams: no more than the transfer has blocks (blocks go to streams
///   in turn, so a stream without a block idles), and one per
///   `lim.per_conn` bytes of the transfer: a transfer that fits in what
///   one TCP connection keeps in flight is one round of that connection,
///   and more streams only add connections to open and to ramp up. A
///   200 KB file gets one stream whatever the path.
/// - Depth: no more blocks in flight per stream than the transfer gives
///   each stream, so the whole transfer can be granted at once (and the
///   first block goes out on the first grant, with no ramp).
///
/// Never more than `p` asks for: it only shrinks a plan.
pub fn fit_to_size(p: &Plan, size: u64, lim: &Limits) -> Plan {
    let min_block = u64::from(crate::MIN_BLOCK);
    let mut block = u64::from(p.block_size.max(crate::MIN_BLOCK));
    if size < block {
        block = size.div_ceil(4096).saturating_mul(4096).max(min_block);
    }
    let blocks = size.div_ceil(block).max(1);
    let by_size = size.div_ceil(lim.per_conn.max(min_block)).max(1);
    let streams = u64::from(p.streams.max(1)).min(blocks).min(by_size) as u32;
    let iodepth = u64::from(p.iodepth.max(1)).min(blocks.div_ceil(u64::from(streams))) as u32;
    let mut why = p.why.clone();
    if (streams, iodepth, block as u32) != (p.streams, p.iodepth, p.block_size) {
        why.push_str(&format!(
            "; fitted to the {} transfer ({blocks} block(s) of {}): {streams} stream(s) x {iodepth}",
            mib(size),
            mib(block)
        ));
    }
    Plan {
        streams,
        block_size: block as u32,
        iodepth: iodepth.max(1),
        why,
    }
}

/// [`plan`], then [`fit_to_size`] when the transfer's size is known.
pub fn plan_for(
    rtt: Duration,
    measured_bps: Option<f64>,
    block_size: u32,
    size: Option<u64>,
    lim: &Limits,
) -> Plan {
    let p = plan(rtt, measured_bps, block_size, lim);
    match size {
        Some(n) => fit_to_size(&p, n, lim),
        None => p,
    }
}

/// The sink's first window (blocks granted at once) for a transfer of
/// `len` bytes (if the source announced it) in a pool of `pool` blocks of
/// `block` bytes, when [`Autotune`] would start at `start`: a transfer
/// that fits the pool is granted whole, so it needs no growing.
pub fn first_window(start: u32, pool: u32, block: u32, len: Option<u64>) -> u32 {
    let need = len.map_or(0, |n| n.div_ceil(u64::from(block.max(1))));
    let need = need.min(u64::from(pool)) as u32;
    start.max(need).min(pool.max(1))
}

fn mib(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
    } else {
        format!("{} KiB", b.div_ceil(1024))
    }
}

/// The sink's in-transfer window in blocks: grows while the transfer is
/// limited by it, shrinks when the delivered rate falls, within
/// `min..=pool`.
///
/// Feed it round-trip samples ([`Autotune::on_rtt`]: a grant to the
/// matching `BlockDone`, which includes one block's transmission, so the
/// minimum is kept), delivered bytes ([`Autotune::on_delivered`]) and the
/// time ([`Autotune::tick`]); once per round trip `tick` compares what
/// arrived with the window:
///
/// - at least half the window arrived in the round trip: the window is
///   what limits, so it becomes twice the delivered amount (at most the
///   pool), as receive autotuning advertises twice what arrived;
/// - for four round trips in a row, twice the delivered amount was under
///   half the window and under the most delivered in a round trip so far:
///   the rate fell (a slower path, a congested link, a slow disk), so the
///   window comes down to twice the delivered amount (at least `min`),
///   which keeps fewer blocks queued at a bottleneck. A round that
///   delivers more than any before is the start (TCP's slow start, or
///   each stream's climb after a loss) and never counts: at 100 ms RTT
///   and 1 % loss 8 streams need seconds to open their windows, and the
///   window shrank from 64 blocks to 16 three seconds into the transfer
///   (issue 27), holding the streams back while they opened.
#[derive(Debug, Clone)]
pub struct Autotune {
    pool: u32,
    min: u32,
    window: u32,
    block: u64,
    rtt: Option<Duration>,
    mark: Duration,
    delivered: u64,
    low_rounds: u32,
    /// The most delivered in one round trip so far.
    peak: u64,
}

/// A window change and its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub from: u32,
    pub to: u32,
    pub why: String,
}

impl Autotune {
    /// A window over a pool of `pool` blocks of `block` bytes, never under
    /// `min` blocks, starting at half the pool.
    pub fn new(pool: u32, min: u32, block: u32) -> Autotune {
        let min = min.clamp(1, pool.max(1));
        Autotune {
            pool: pool.max(1),
            min,
            window: (pool / 2).max(min),
            block: u64::from(block.max(1)),
            rtt: None,
            mark: Duration::ZERO,
            delivered: 0,
            low_rounds: 0,
            peak: 0,
        }
    }

    /// Start at `blocks` (within `min..=pool`) instead of half the pool
    /// ([`first_window`]).
    pub fn start_at(&mut self, blocks: u32) {
        self.window = blocks.clamp(self.min, self.pool);
    }

    /// The window in blocks now.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// The smallest round trip seen.
    pub fn rtt(&self) -> Option<Duration> {
        self.rtt
    }

    /// A round-trip sample.
    pub fn on_rtt(&mut self, d: Duration) {
        if d > Duration::ZERO && self.rtt.is_none_or(|r| d < r) {
            self.rtt = Some(d);
        }
    }

    /// `bytes` more reached the sink.
    pub fn on_delivered(&mut self, bytes: u64) {
        self.delivered += bytes;
    }

    /// The time is `now`: once a round trip has passed since the last
    /// look, maybe change the window.
    pub fn tick(&mut self, now: Duration) -> Option<Change> {
        let rtt = self.rtt?;
        let span = now.checked_sub(self.mark)?;
        if span < rtt.max(Duration::from_micros(100)) {
            return None;
        }
        // Delivered per round trip over the span.
        let per_rtt = (self.delivered as f64 * rtt.as_secs_f64() / span.as_secs_f64()) as u64;
        self.mark = now;
        self.delivered = 0;
        let win_bytes = u64::from(self.window) * self.block;
        let twice = (2 * per_rtt).div_ceil(self.block).min(u64::from(u32::MAX)) as u32;
        let from = self.window;
        let new_peak = per_rtt > self.peak;
        self.peak = self.peak.max(per_rtt);
        if 2 * per_rtt >= win_bytes {
            self.low_rounds = 0;
            let to = twice.clamp(self.window, self.pool);
            if to > from {
                self.window = to;
                return Some(Change {
                    from,
                    to,
                    why: format!(
                        "{} arrived in a {:.1} ms round trip: the window limits, grow",
                        mib(per_rtt),
                        rtt.as_secs_f64() * 1e3
                    ),
                });
            }
            return None;
        }
        if 2 * per_rtt * 2 < win_bytes && !new_peak {
            self.low_rounds += 1;
            if self.low_rounds >= 4 {
                self.low_rounds = 0;
                let to = twice.clamp(self.min, self.window);
                if to < from {
                    self.window = to;
                    return Some(Change {
                        from,
                        to,
                        why: format!(
                            "only {} per {:.1} ms round trip for 4 round trips: the rate fell, shrink",
                            mib(per_rtt),
                            rtt.as_secs_f64() * 1e3
                        ),
                    });
                }
            }
        } else {
            self.low_rounds = 0;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn lim() -> Limits {
        // Linux defaults: tcp_wmem[2] 4 MiB, tcp_rmem[2] 6 MiB, scale 1.
        Limits {
            max_window: DEFAULT_MAX_WINDOW,
            per_conn: per_connection_cap(4 * MIB, 6 * MIB, 1),
            max_streams: MAX_AUTO_STREAMS,
        }
    }

    #[test]
    fn per_connection_cap_follows_the_kernel_limits() {
        assert_eq!(per_connection_cap(4 * MIB, 6 * MIB, 1), 3 * MIB);
        // The receive side limits when tcp_rmem is small.
        assert_eq!(per_connection_cap(4 * MIB, 2 * MIB, 1), MIB);
        assert_eq!(
            per_connection_cap(32 * MIB, 6 * MIB, 2),
            6 * MIB - 6 * MIB / 4
        );
        assert_eq!(per_connection_cap(32 * MIB, 8 * MIB, -1), 4 * MIB);
        // 3 MiB at 50 ms is the 503 Mbit/s one iperf3 stream reaches.
        let mbps = 3.0 * MIB as f64 * 8.0 / 0.05 / 1e6;
        assert!((500.0..510.0).contains(&mbps), "{mbps}");
    }

    #[test]
    fn loopback_keeps_one_stream_and_the_lan_window() {
        let p = plan(Duration::from_micros(50), None, 1 << 20, &lim());
        // Today's fixed default on a short path: 1 x 4 x 1 MiB.
        assert_eq!((p.streams, p.iodepth), (1, 4), "{p:?}");
        assert!(p.why.contains("short-path default"), "{}", p.why);
        let p8 = plan(Duration::from_micros(50), Some(40e9), 1 << 20, &lim());
        assert!(p8.window() <= LAN_WINDOW, "{p8:?}");
    }

    #[test]
    fn a_long_path_gets_streams_and_a_window_over_the_bdp() {
        let rtt = Duration::from_millis(50);
        let p = plan(rtt, None, 1 << 20, &lim());
        let bdp = bdp(FIRST_PLAN_RATE, rtt);
        // No stream above the kernel's per-connection cap.
        assert!(bdp.div_ceil(u64::from(p.streams)) <= 3 * MIB, "{p:?}");
        assert!(p.window() >= bdp + bdp / 2, "{p:?}");
        assert!(p.window() <= DEFAULT_MAX_WINDOW, "{p:?}");
        // The 1 Gbit/s figures of issue 27: 1 stream x 4 x 1 MiB covers
        // 0.67 of a 50 ms BDP at 1 Gbit/s; the plan covers it many times.
        assert!(p.window() >= 4 * super::bdp(1e9, rtt), "{p:?}");
        assert!(p.why.contains("RTT 50.00 ms"), "{}", p.why);
    }

    #[test]
    fn the_plan_grows_with_the_measured_rate_and_shrinks_when_it_drops() {
        let rtt = Duration::from_millis(50);
        let slow = plan(rtt, Some(100e6), 1 << 20, &lim());
        let fast = plan(rtt, Some(900e6), 1 << 20, &lim());
        let faster = plan(rtt, Some(2e9), 1 << 20, &lim());
        assert!(slow.window() < fast.window(), "{slow:?} {fast:?}");
        assert!(fast.window() < faster.window(), "{fast:?} {faster:?}");
        assert!(slow.streams <= fast.streams && fast.streams <= faster.streams);
        assert!(fast.why.contains("2 x the 900 Mbit/s"), "{}", fast.why);
    }

    #[test]
    fn memory_and_stream_limits_bound_the_plan() {
        let l = Limits {
            max_window: 24 * MIB,
            ..lim()
        };
        let p = plan(Duration::from_millis(200), None, 1 << 20, &l);
        assert_eq!(p.streams, MAX_AUTO_STREAMS);
        assert!(p.window() <= 24 * MIB, "{p:?}");
        assert!(p.iodepth >= 2);
        assert!(p.why.contains("memory limit"), "{}", p.why);
        // A tiny memory limit still leaves two blocks per stream.
        let tiny = Limits {
            max_window: 1,
            ..lim()
        };
        let p = plan(Duration::from_millis(100), None, 1 << 20, &tiny);
        assert_eq!(p.iodepth, 2);
    }

    /// A sink on a path where `rate` bytes/s arrive while the window
    /// allows: what is delivered per round trip is min(window, rate x rtt).
    fn drive(a: &mut Autotune, rtt: Duration, rate: f64, rounds: u32, t: &mut Duration) {
        for _ in 0..rounds {
            let win = a.window() as f64 * MIB as f64;
            let per_rtt = win.min(rate * rtt.as_secs_f64());
            a.on_delivered(per_rtt as u64);
            *t += rtt;
            a.tick(*t);
        }
    }

    #[test]
    fn autotune_grows_on_a_fat_path_up_to_the_pool() {
        let rtt = Duration::from_millis(50);
        let mut a = Autotune::new(64, 4, 1 << 20);
        assert_eq!(a.window(), 32);
        a.on_rtt(rtt + Duration::from_millis(9));
        a.on_rtt(rtt);
        let mut t = Duration::ZERO;
        // 10 Gbit/s path: 62 MB per round trip, more than the pool.
        drive(&mut a, rtt, 1.25e9, 3, &mut t);
        assert_eq!(a.window(), 64, "bounded by the pool");
    }

    #[test]
    fn autotune_shrinks_when_the_rate_drops_and_grows_back() {
        let rtt = Duration::from_millis(50);
        let mut a = Autotune::new(64, 4, 1 << 20);
        a.on_rtt(rtt);
        let mut t = Duration::ZERO;
        drive(&mut a, rtt, 1.25e9, 2, &mut t);
        assert_eq!(a.window(), 64);
        // The path now delivers 100 Mbit/s: 0.6 MiB per round trip.
        drive(&mut a, rtt, 12.5e6, 3, &mut t);
        assert_eq!(a.window(), 64, "waits four round trips");
        drive(&mut a, rtt, 12.5e6, 1, &mut t);
        assert_eq!(a.window(), 4, "twice 0.6 MiB, at least min");
        // Back to a fat path: doubles per round trip.
        drive(&mut a, rtt, 1.25e9, 1, &mut t);
        assert_eq!(a.window(), 8);
        drive(&mut a, rtt, 1.25e9, 4, &mut t);
        assert_eq!(a.window(), 64);
    }

    #[test]
    fn autotune_does_not_shrink_while_the_streams_open() {
        // issue 27, 100 ms RTT, 1 % loss: a 64-block pool, and 8 streams
        // whose delivery grows slowly (slow start and losses) from 1 MiB
        // per round trip: each round delivers more than the last, so the
        // rate did not fall, and the window stays until it limits.
        let rtt = Duration::from_millis(200);
        let mut a = Autotune::new(64, 16, 1 << 20);
        a.start_at(64);
        a.on_rtt(rtt);
        let mut t = Duration::ZERO;
        for mib in [1u64, 2, 3, 4, 5, 6, 8, 10] {
            a.on_delivered(mib * MIB);
            t += rtt;
            assert_eq!(a.tick(t), None, "{mib} MiB per round trip");
        }
        assert_eq!(a.window(), 64);
        // Then the rate falls for good (under half the peak): it shrinks
        // after four round trips, as before.
        for _ in 0..4 {
            a.on_delivered(2 * MIB);
            t += rtt;
            a.tick(t);
        }
        assert_eq!(a.window(), 16, "twice 2 MiB, at least min");
    }

    #[test]
    fn autotune_holds_without_an_rtt_or_within_a_round_trip() {
        let mut a = Autotune::new(16, 2, 1 << 20);
        a.on_delivered(1 << 30);
        assert_eq!(a.tick(Duration::from_secs(1)), None, "no RTT yet");
        a.on_rtt(Duration::from_millis(100));
        let c = a.tick(Duration::from_millis(1000)).expect("grows");
        assert_eq!((c.from, c.to), (8, 16));
        assert!(c.why.contains("grow"), "{}", c.why);
        a.on_delivered(1 << 30);
        assert_eq!(
            a.tick(Duration::from_millis(1050)),
            None,
            "within a round trip"
        );
    }

    #[test]
    fn a_small_transfer_gets_one_stream_and_no_more_pool_than_it_needs() {
        // The plan for a 50 ms path asks for several streams and a deep
        // pool; a 200 KB file needs one stream and one block of its size.
        let rtt = Duration::from_millis(50);
        let p = plan(rtt, None, 1 << 20, &lim());
        assert!(p.streams > 1, "{p:?}");
        let f = fit_to_size(&p, 200_000, &lim());
        assert_eq!((f.streams, f.iodepth), (1, 1), "{f:?}");
        assert_eq!(f.block_size, 200_704, "200 000 rounded up to 4 KiB");
        assert!(
            f.why.contains("fitted to the 196 KiB transfer"),
            "{}",
            f.why
        );
        // 1 MB: still one block, one stream.
        let f = fit_to_size(&p, 1_000_000, &lim());
        assert_eq!((f.streams, f.iodepth), (1, 1), "{f:?}");
        // 10 MB: 10 blocks, at most one stream per 3 MiB (4), each with
        // its share of the blocks in flight at once.
        let f = fit_to_size(&p, 10_000_000, &lim());
        assert_eq!((f.streams, f.block_size), (4, 1 << 20), "{f:?}");
        assert_eq!(f.iodepth, 3, "10 blocks over 4 streams");
        assert!(u64::from(f.streams * f.iodepth) * (1 << 20) >= 10_000_000);
        // 100 MB and more: the path's plan, untouched.
        let f = fit_to_size(&p, 100_000_000, &lim());
        assert_eq!(f, p);
        // Nothing at all: the smallest session.
        let f = fit_to_size(&p, 0, &lim());
        assert_eq!(
            (f.streams, f.iodepth, f.block_size),
            (1, 1, crate::MIN_BLOCK)
        );
    }

    #[test]
    fn fitting_never_grows_a_plan() {
        let l = lim();
        for rtt_ms in [0.05, 10.0, 50.0, 100.0] {
            let rtt = Duration::from_secs_f64(rtt_ms / 1e3);
            for size in [
                0u64,
                1,
                4096,
                200 << 10,
                1 << 20,
                10 << 20,
                100 << 20,
                1 << 30,
            ] {
                let p = plan(rtt, None, 1 << 20, &l);
                let f = plan_for(rtt, None, 1 << 20, Some(size), &l);
                assert!(
                    f.streams >= 1 && f.streams <= p.streams,
                    "{rtt_ms} {size}: {f:?}"
                );
                assert!(
                    f.iodepth >= 1 && f.iodepth <= p.iodepth,
                    "{rtt_ms} {size}: {f:?}"
                );
                assert!(f.block_size >= crate::MIN_BLOCK && f.block_size <= p.block_size);
                assert!(f.window() <= p.window());
                // Big enough to take the whole transfer at once, or the
                // path's plan.
                assert!(f.window() >= size.min(p.window()), "{rtt_ms} {size}: {f:?}");
            }
        }
        assert_eq!(
            plan_for(Duration::from_millis(10), None, 1 << 20, None, &l),
            plan(Duration::from_millis(10), None, 1 << 20, &l)
        );
    }

    #[test]
    fn a_transfer_that_fits_the_pool_is_granted_whole_at_once() {
        // Autotune would start at half of a 16-block pool.
        assert_eq!(first_window(8, 16, 1 << 20, Some(12 << 20)), 12);
        assert_eq!(first_window(8, 16, 1 << 20, Some(100 << 20)), 16);
        assert_eq!(first_window(8, 16, 1 << 20, Some(1)), 8);
        assert_eq!(first_window(8, 16, 1 << 20, None), 8);
        let mut a = Autotune::new(16, 4, 1 << 20);
        a.start_at(first_window(a.window(), 16, 1 << 20, Some(12 << 20)));
        assert_eq!(a.window(), 12);
        a.start_at(100);
        assert_eq!(a.window(), 16, "bounded by the pool");
    }
}
