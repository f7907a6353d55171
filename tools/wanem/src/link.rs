//! The bottleneck: a drop-tail queue sized in bytes in front of a link that
//! serializes one packet at a time at a fixed rate (the mahimahi / Dummynet
//! model). A packet's departure time is fixed when it is accepted:
//! `departure = max(arrival, link free) + size * 8 / rate`; the queue holds
//! every accepted packet that has not finished its departure, and a packet
//! that would push the queue over its byte limit is dropped on arrival (tail
//! drop).

use crate::units::Nanos;
use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct Bottleneck {
    /// Bits per second; `None` is an infinitely fast link with no queue.
    rate: Option<u64>,
    limit: u64,
    free_at: Nanos,
    backlog: VecDeque<(Nanos, u32)>,
    bytes: u64,
}

impl Bottleneck {
    /// `limit` is the queue's size in bytes; a packet larger than the limit
    /// is always dropped, so give at least one MTU (the config does).
    pub fn new(rate: Option<u64>, limit: u64) -> Bottleneck {
        Bottleneck {
            rate,
            limit,
            free_at: 0,
            backlog: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Time on the wire for `len` bytes, rounded up so the link never runs
    /// faster than its rate.
    pub fn serialization(&self, len: usize) -> Nanos {
        match self.rate {
            None => 0,
            Some(r) => ((len as u128 * 8 * 1_000_000_000).div_ceil(r as u128)) as Nanos,
        }
    }

    /// Bytes accepted and not yet departed at `now`.
    pub fn queued(&mut self, now: Nanos) -> u64 {
        while let Some(&(dep, len)) = self.backlog.front() {
            if dep > now {
                break;
            }
            self.backlog.pop_front();
            self.bytes -= len as u64;
        }
        self.bytes
    }

    /// Offers a packet of `len` bytes arriving at `now`: its departure time,
    /// or `None` when the queue is full (tail drop).
    pub fn offer(&mut self, now: Nanos, len: usize) -> Option<Nanos> {
        if self.rate.is_none() {
            return Some(now);
        }
        if self.queued(now) + len as u64 > self.limit {
            return None;
        }
        let dep = self.free_at.max(now) + self.serialization(len);
        self.free_at = dep;
        self.backlog.push_back((dep, len as u32));
        self.bytes += len as u64;
        Some(dep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, proptest};

    #[test]
    fn serialization_time() {
        let b = Bottleneck::new(Some(1_000_000_000), 1 << 20);
        assert_eq!(b.serialization(1500), 12_000);
        let b = Bottleneck::new(Some(3), 1 << 20);
        assert_eq!(b.serialization(1), 2_666_666_667); // rounded up
    }

    #[test]
    fn tail_drop_at_the_byte_limit() {
        // 10 Mbit/s: 1500 B take 1.2 ms; the queue holds 3000 B.
        let mut b = Bottleneck::new(Some(10_000_000), 3000);
        assert_eq!(b.offer(0, 1500), Some(1_200_000));
        assert_eq!(b.offer(0, 1500), Some(2_400_000));
        assert_eq!(b.offer(0, 1500), None); // 4500 > 3000
        assert_eq!(b.offer(0, 100), None);
        // After the first departs there is room again.
        assert_eq!(b.offer(1_200_000, 1500), Some(3_600_000));
        assert_eq!(b.queued(3_600_000), 0);
    }

    #[test]
    fn unlimited_rate_passes_through() {
        let mut b = Bottleneck::new(None, 0);
        assert_eq!(b.offer(5, 9000), Some(5));
    }

    proptest! {
        /// Whatever the arrivals, the link never releases faster than its
        /// rate: the bytes departed by any time t, counted from the first
        /// arrival, fit in rate * elapsed plus one packet in service.
        #[test]
        fn never_faster_than_the_rate(rate in 1_000_000u64..10_000_000_000,
                                      limit in 1500u64..1_000_000,
                                      arrivals in proptest::collection::vec((0u64..200_000, 40usize..1500), 1..300)) {
            let mut b = Bottleneck::new(Some(rate), limit);
            let mut now = 0;
            let mut deps = Vec::new();
            let mut last = 0;
            for (gap, len) in arrivals {
                now += gap;
                if let Some(d) = b.offer(now, len) {
                    prop_assert!(d >= now + b.serialization(len));
                    prop_assert!(d >= last, "departures keep FIFO order");
                    last = d;
                    deps.push((now, d, len));
                }
                prop_assert!(b.queued(now) <= limit);
            }
            // Any window [deps[i].arrival, deps[j].departure] carries at most rate * window.
            for i in 0..deps.len() {
                let mut bytes = 0u128;
                for &(_, d, len) in &deps[i..] {
                    bytes += len as u128;
                    let window = (d - deps[i].0) as u128;
                    prop_assert!(bytes * 8 * 1_000_000_000 <= rate as u128 * window,
                        "{bytes} B in {window} ns at {rate} bit/s");
                }
            }
        }
    }
}
