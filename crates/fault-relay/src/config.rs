//! Settings shared by every relayed connection, the address rewriting
//! (ALG) settings, and the seeded generator of `reseg`'s piece sizes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::spec::FaultSpec;

/// Settings shared by every connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// One-way delay in each direction.
    pub delay: Duration,
    /// Bytes queued per direction at most before the reader waits.
    pub max_inflight: usize,
    pub connect_timeout: Duration,
    pub faults: Vec<FaultSpec>,
    /// Seed of `reseg` faults that name none.
    pub seed: u64,
    /// Rewriting that routes a protocol's secondary connections through
    /// the relay too.
    pub alg: Option<Alg>,
    /// What faults with `wait=signal` wait for (a clone raises it).
    pub signal: Signal,
}

/// A flag a test raises to let the faults that wait for it
/// (`wait=signal`) fire; once raised it stays raised. Clones share it.
/// (The `delay-bridge` binary never raises it.)
#[derive(Clone, Debug, Default)]
pub struct Signal(Arc<AtomicBool>);

impl Signal {
    /// Let the waiting faults fire (within the writers' 50 ms tick).
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Signal::raise`] was called.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Application-level rewriting (like a NAT's FTP helper): the address a
/// peer announces for a second connection is replaced by a relay listener
/// that forwards to it, so that connection runs through the relay (and its
/// faults) too. All such connections form one more mapping, number `map`,
/// numbered 1, 2, ... in accept order across their listeners.
#[derive(Clone, Debug, Default)]
pub struct Alg {
    /// mod_rdma: `port=` in `RDMA:` request headers (the listener the
    /// server connects back to), rewritten going `up`.
    pub rdma_header: bool,
    /// FTP: the port of `229` (EPSV) and `227` (PASV) replies, rewritten
    /// going `down`.
    pub ftp_passive: bool,
    /// The mapping number of the relayed connections.
    pub map: usize,
    /// Connections accepted on them so far.
    pub count: Arc<AtomicUsize>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            delay: Duration::ZERO,
            max_inflight: 64 << 20,
            connect_timeout: Duration::from_secs(10),
            faults: Vec::new(),
            seed: 1,
            alg: None,
            signal: Signal::default(),
        }
    }
}

/// xorshift64*: small, seedable, good enough to pick piece sizes.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A piece size in 1..=max, log-uniform: as many 1-15 byte pieces as
    /// 1-2 KiB or 32-64 KiB ones.
    pub fn piece(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros(); // max < 2^bits
        let b = (self.next_u64() % u64::from(bits)) as u32;
        let n = 1 + (self.next_u64() % (1u64 << b)) as usize;
        n.min(max)
    }
}
