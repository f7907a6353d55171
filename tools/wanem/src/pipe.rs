//! One direction of the path, sans-IO (no clock, no descriptors): the driver
//! hands it packets with their arrival time and asks for the packets due.
//!
//! Order of the stages, as on a real path behind a bottleneck:
//! size check (MTU) -> link down -> `--drop-syn` -> loss process -> drop-tail
//! byte queue + rate limiter (departure time) -> delay line (+ jitter, FIFO
//! unless reordering) -> out. A packet due while the link is down is lost
//! too: nothing crosses a cut link, queued or on the wire.

use crate::delay::{DelayConfig, DelayLine};
use crate::link::Bottleneck;
use crate::loss::{Loss, LossModel};
use crate::packet::is_tcp_syn;
use crate::rng::Rng;
use crate::units::Nanos;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What one direction does to packets.
#[derive(Clone, Debug, PartialEq)]
pub struct DirConfig {
    pub loss: LossModel,
    /// Bottleneck rate in bit/s; `None`: no rate limit, no queue.
    pub rate: Option<u64>,
    /// Drop-tail queue in bytes (ignored without a rate).
    pub queue: u64,
    pub delay: DelayConfig,
    /// Packets longer than this are dropped (the TUN's MTU keeps them out).
    pub mtu: usize,
    /// Drop the first N TCP SYNs (SYN without ACK) of this direction.
    pub drop_syn: u32,
    /// Bound on the bytes held in the delay line (memory guard).
    pub max_held: u64,
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    Loss,
    Queue,
    Down,
    Syn,
    TooBig,
}

/// Per-direction counters, readable from other threads while running.
#[derive(Debug, Default)]
pub struct Counters {
    pub fwd_pkts: AtomicU64,
    pub fwd_bytes: AtomicU64,
    pub drop_loss: AtomicU64,
    pub drop_queue: AtomicU64,
    pub drop_down: AtomicU64,
    pub drop_syn: AtomicU64,
    pub drop_other: AtomicU64,
}

impl Counters {
    pub fn forwarded(&self, len: usize) {
        self.fwd_pkts.fetch_add(1, Relaxed);
        self.fwd_bytes.fetch_add(len as u64, Relaxed);
    }

    pub fn dropped(&self, why: DropReason) {
        let c = match why {
            DropReason::Loss => &self.drop_loss,
            DropReason::Queue => &self.drop_queue,
            DropReason::Down => &self.drop_down,
            DropReason::Syn => &self.drop_syn,
            DropReason::TooBig => &self.drop_other,
        };
        c.fetch_add(1, Relaxed);
    }

    /// One line: `fwd_pkts=.. fwd_bytes=.. drop_loss=.. ...`.
    pub fn line(&self) -> String {
        format!(
            "fwd_pkts={} fwd_bytes={} drop_loss={} drop_queue={} drop_down={} drop_syn={} drop_other={}",
            self.fwd_pkts.load(Relaxed),
            self.fwd_bytes.load(Relaxed),
            self.drop_loss.load(Relaxed),
            self.drop_queue.load(Relaxed),
            self.drop_down.load(Relaxed),
            self.drop_syn.load(Relaxed),
            self.drop_other.load(Relaxed)
        )
    }
}

/// A packet the pipe is done with.
#[derive(Debug, PartialEq)]
pub enum Out {
    /// Write it to the other side.
    Forward(Vec<u8>),
    /// It came due while the link was down.
    Lost(Vec<u8>),
}

pub struct Pipe {
    cfg: DirConfig,
    rng: Rng,
    loss: Loss,
    link: Bottleneck,
    line: DelayLine<Vec<u8>>,
    held: u64,
    syn_left: u32,
    /// Down windows `[from, until)`.
    down: Vec<(Nanos, Nanos)>,
}

impl Pipe {
    pub fn new(cfg: DirConfig, seed: u64) -> Pipe {
        Pipe {
            rng: Rng::new(seed),
            loss: Loss::new(cfg.loss),
            link: Bottleneck::new(cfg.rate, cfg.queue),
            line: DelayLine::new(cfg.delay),
            held: 0,
            syn_left: cfg.drop_syn,
            down: Vec::new(),
            cfg,
        }
    }

    /// Takes the link down over `[from, until)`.
    pub fn add_down(&mut self, from: Nanos, until: Nanos) {
        if until > from {
            self.down.push((from, until));
        }
    }

    /// Brings the link back up at `now` (ends every window).
    pub fn clear_down(&mut self) {
        self.down.clear();
    }

    pub fn is_down(&mut self, now: Nanos) -> bool {
        self.down.retain(|&(_, until)| until > now);
        self.down.iter().any(|&(from, _)| from <= now)
    }

    /// A packet arrives at `now`. On a drop the buffer comes back with the
    /// reason.
    pub fn arrive(&mut self, now: Nanos, pkt: Vec<u8>) -> Result<(), (DropReason, Vec<u8>)> {
        if pkt.len() > self.cfg.mtu {
            return Err((DropReason::TooBig, pkt));
        }
        if self.is_down(now) {
            return Err((DropReason::Down, pkt));
        }
        if self.syn_left > 0 && is_tcp_syn(&pkt) {
            self.syn_left -= 1;
            return Err((DropReason::Syn, pkt));
        }
        if self.loss.lose(&mut self.rng) {
            return Err((DropReason::Loss, pkt));
        }
        if self.held + pkt.len() as u64 > self.cfg.max_held {
            return Err((DropReason::Queue, pkt));
        }
        let Some(dep) = self.link.offer(now, pkt.len()) else {
            return Err((DropReason::Queue, pkt));
        };
        self.held += pkt.len() as u64;
        self.line.push(dep, pkt, &mut self.rng);
        Ok(())
    }

    /// The next packet due at `now`, if any.
    pub fn poll_release(&mut self, now: Nanos) -> Option<Out> {
        let pkt = self.line.pop_due(now)?;
        self.held -= pkt.len() as u64;
        if self.is_down(now) {
            return Some(Out::Lost(pkt));
        }
        Some(Out::Forward(pkt))
    }

    /// When `poll_release` next has something.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.line.next_release()
    }

    /// Packets held (queued or in flight).
    pub fn held_packets(&self) -> usize {
        self.line.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DirConfig {
        DirConfig {
            loss: LossModel::None,
            rate: Some(8_000_000), // 1 byte per microsecond
            queue: 3000,
            delay: DelayConfig {
                delay: 10_000_000,
                jitter: 0,
                reorder: 0.0,
                reorder_gap: 0,
            },
            mtu: 1500,
            drop_syn: 1,
            max_held: 1 << 30,
        }
    }

    fn syn() -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[33] = 0x02;
        p
    }

    #[test]
    fn delay_plus_serialization() {
        let mut p = Pipe::new(cfg(), 1);
        p.arrive(0, vec![0; 1000]).unwrap();
        // 1000 B at 1 B/us = 1 ms on the wire, then 10 ms.
        assert_eq!(p.next_deadline(), Some(11_000_000));
        assert_eq!(p.poll_release(10_999_999), None);
        assert_eq!(
            p.poll_release(11_000_000),
            Some(Out::Forward(vec![0; 1000]))
        );
    }

    #[test]
    fn drops_name_their_reason() {
        let mut p = Pipe::new(cfg(), 1);
        assert_eq!(
            p.arrive(0, vec![0; 1501]).unwrap_err().0,
            DropReason::TooBig
        );
        assert_eq!(p.arrive(0, syn()).unwrap_err().0, DropReason::Syn);
        assert!(p.arrive(0, syn()).is_ok(), "only the first SYN is dropped");
        p.arrive(0, vec![0; 1500]).unwrap();
        assert_eq!(p.arrive(0, vec![0; 1500]).unwrap_err().0, DropReason::Queue);
    }

    #[test]
    fn link_down_window() {
        let mut p = Pipe::new(cfg(), 1);
        p.arrive(0, vec![0; 100]).unwrap(); // due at 10.1 ms
        p.add_down(5_000_000, 20_000_000);
        assert_eq!(
            p.arrive(6_000_000, vec![0; 100]).unwrap_err().0,
            DropReason::Down
        );
        assert_eq!(p.poll_release(10_100_000), Some(Out::Lost(vec![0; 100])));
        assert!(p.arrive(20_000_000, vec![0; 100]).is_ok());
        p.add_down(21_000_000, 30_000_000);
        p.clear_down();
        assert!(!p.is_down(22_000_000));
    }

    #[test]
    fn loss_is_counted_before_the_queue() {
        let mut c = cfg();
        c.loss = LossModel::Bernoulli(1.0);
        let mut p = Pipe::new(c, 1);
        assert_eq!(p.arrive(0, vec![0; 100]).unwrap_err().0, DropReason::Loss);
        assert_eq!(p.held_packets(), 0);
    }
}
