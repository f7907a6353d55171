//! A listener's memory of the connection proofs it accepted, so that none
//! is accepted twice (issue 26 item 4: a proof read off the wire must be
//! worth nothing on a new connection).
//!
//! A [`ConnProof`](ccache_proto::auth::ConnProof) carries a fresh nonce
//! and the prover's clock, both under the MAC. The listener admits it only
//! if:
//!
//! 1. its time is within `window_ms` of the listener's clock, either way
//!    (the clock skew tolerated between hosts);
//! 2. its time is above the **horizon**: the time of the newest proof this
//!    guard has forgotten, and at first the listener's start (a proof
//!    recorded before a restart is refused by the new process, which never
//!    saw its nonce);
//! 3. its nonce is not among those remembered.
//!
//! Every admitted proof is remembered until its time leaves the window,
//! and then forgotten with the horizon raised to its time; so every proof
//! ever admitted is either remembered or at or below the horizon, and none
//! is admitted twice, whatever the clock does (a clock set back does not
//! revive a forgotten nonce). The memory is bounded: at `cap` nonces the
//! oldest is forgotten early (the horizon rises with it), which refuses
//! only proofs older than everything remembered, that is honest peers
//! whose clock is behind during a burst of more than `cap` connections per
//! window. Only proofs with a right MAC get this far (the caller checks it
//! first), so a flood of forged or replayed proofs costs one HMAC each and
//! changes nothing here.
//!
//! This is the strike register of QUIC's 0-RTT and of Kerberos' replay
//! cache, in the size a cache listener needs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use ccache_proto::auth::NONCE_LEN;

/// Default bound on the nonces one listener remembers: at 24 bytes a
/// nonce (plus the set's and the heap's overhead, about 100 bytes), under
/// 2 MiB; 16,384 connections in a window of 30 s either way is 270 per
/// second, far above what proxies open (a few each, kept).
pub const REPLAY_CAP: usize = 16_384;

/// Why [`ReplayGuard::admit`] refused a proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// The proof's time is more than the window from the listener's clock.
    Skewed {
        /// Proof time minus listener time.
        skew_ms: i64,
        /// The window, either way.
        window_ms: u64,
    },
    /// The proof's time is at or below the horizon.
    BelowHorizon {
        /// The proof's time.
        time_ms: u64,
        /// The horizon.
        horizon_ms: u64,
    },
    /// The nonce was admitted before: a replay.
    Replayed,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejected::Skewed { skew_ms, window_ms } => write!(
                f,
                "the proof's time is {:.1} s {} this listener's clock, more than the {} s allowed (a recorded proof, or the hosts' clocks differ: synchronise them)",
                skew_ms.unsigned_abs() as f64 / 1000.0,
                if *skew_ms < 0 { "behind" } else { "ahead of" },
                window_ms / 1000
            ),
            Rejected::BelowHorizon { time_ms, horizon_ms } => write!(
                f,
                "the proof was made {} ms before the oldest time this listener still remembers (it restarted, or many peers connected since: a recorded proof, or a clock behind; retry)",
                horizon_ms - time_ms + 1
            ),
            Rejected::Replayed => f.write_str(
                "the proof's nonce was already used on another connection: a replayed proof",
            ),
        }
    }
}

/// The nonces of the proofs a listener admitted within the window.
#[derive(Debug)]
pub struct ReplayGuard {
    window_ms: u64,
    cap: usize,
    horizon_ms: u64,
    seen: HashSet<[u8; NONCE_LEN]>,
    by_time: BinaryHeap<Reverse<(u64, [u8; NONCE_LEN])>>,
}

impl ReplayGuard {
    /// A guard for a listener started at `start_ms` (proofs made before it
    /// are refused), admitting proofs within `window_ms` of its clock and
    /// remembering at most `cap` nonces.
    pub fn new(start_ms: u64, window_ms: u64, cap: usize) -> ReplayGuard {
        ReplayGuard {
            window_ms,
            cap: cap.max(1),
            horizon_ms: start_ms.saturating_sub(1),
            seen: HashSet::new(),
            by_time: BinaryHeap::new(),
        }
    }

    /// Nonces remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Proofs at or below this time are refused.
    pub fn horizon_ms(&self) -> u64 {
        self.horizon_ms
    }

    /// Admit the proof with `nonce` made at `time_ms` (its MAC already
    /// checked) at the listener's time `now_ms`, and remember it; or say
    /// why not.
    pub fn admit(
        &mut self,
        nonce: [u8; NONCE_LEN],
        time_ms: u64,
        now_ms: u64,
    ) -> Result<(), Rejected> {
        let oldest = now_ms.saturating_sub(self.window_ms);
        while self
            .by_time
            .peek()
            .is_some_and(|Reverse((t, _))| *t < oldest)
        {
            self.forget_oldest();
        }
        let skew = i128::from(time_ms) - i128::from(now_ms);
        if skew.unsigned_abs() > u128::from(self.window_ms) {
            return Err(Rejected::Skewed {
                skew_ms: skew.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
                window_ms: self.window_ms,
            });
        }
        self.above_horizon(time_ms)?;
        if self.seen.contains(&nonce) {
            return Err(Rejected::Replayed);
        }
        while self.seen.len() >= self.cap {
            self.forget_oldest();
        }
        // Forgetting early may have raised the horizon past this proof.
        self.above_horizon(time_ms)?;
        self.seen.insert(nonce);
        self.by_time.push(Reverse((time_ms, nonce)));
        Ok(())
    }

    fn above_horizon(&self, time_ms: u64) -> Result<(), Rejected> {
        if time_ms <= self.horizon_ms {
            return Err(Rejected::BelowHorizon {
                time_ms,
                horizon_ms: self.horizon_ms,
            });
        }
        Ok(())
    }

    fn forget_oldest(&mut self) {
        if let Some(Reverse((t, n))) = self.by_time.pop() {
            self.seen.remove(&n);
            self.horizon_ms = self.horizon_ms.max(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u32) -> [u8; NONCE_LEN] {
        let mut b = [0u8; NONCE_LEN];
        b[..4].copy_from_slice(&i.to_be_bytes());
        b
    }

    const W: u64 = 30_000;
    const START: u64 = 1_000_000;

    #[test]
    fn a_nonce_is_admitted_once() {
        let mut g = ReplayGuard::new(START, W, 100);
        assert_eq!(g.admit(n(1), START, START), Ok(()));
        assert_eq!(g.admit(n(1), START, START + 5), Err(Rejected::Replayed));
        assert_eq!(g.admit(n(2), START + 3, START + 5), Ok(()));
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn the_window_and_the_start() {
        let mut g = ReplayGuard::new(START, W, 100);
        let now = START + 60_000;
        // 30.001 s behind and ahead: refused, naming the skew.
        let e = g.admit(n(1), now - W - 1, now).unwrap_err();
        assert_eq!(
            e,
            Rejected::Skewed {
                skew_ms: -30_001,
                window_ms: W
            }
        );
        assert!(e.to_string().contains("30.0 s behind"), "{e}");
        assert!(matches!(
            g.admit(n(2), now + W + 1, now),
            Err(Rejected::Skewed {
                skew_ms: 30_001,
                ..
            })
        ));
        // The edges are in.
        assert_eq!(g.admit(n(3), now - W, now), Ok(()));
        assert_eq!(g.admit(n(4), now + W, now), Ok(()));
        // Made before the listener started (a recording from before a
        // restart), though within the window: refused.
        let mut g = ReplayGuard::new(START, W, 100);
        assert!(matches!(
            g.admit(n(5), START - 1, START + 10),
            Err(Rejected::BelowHorizon { .. })
        ));
        assert_eq!(g.admit(n(5), START, START + 10), Ok(()));
    }

    #[test]
    fn forgotten_nonces_stay_refused_even_if_the_clock_goes_back() {
        let mut g = ReplayGuard::new(START, W, 100);
        assert_eq!(g.admit(n(1), START + 10, START + 10), Ok(()));
        // 31 s later the entry leaves the window and is forgotten...
        assert_eq!(g.admit(n(2), START + 31_000, START + 31_000), Ok(()));
        assert_eq!(g.len(), 1);
        assert_eq!(g.horizon_ms(), START + 10);
        // ...and a clock set back 20 s does not let it in again.
        assert!(matches!(
            g.admit(n(1), START + 10, START + 11_000),
            Err(Rejected::BelowHorizon { .. })
        ));
    }

    #[test]
    fn bounded_under_a_flood_and_no_replay_gets_through() {
        let cap = 64;
        let mut g = ReplayGuard::new(START, W, cap);
        // 10,000 good proofs within one window, out of time order.
        let mut admitted = Vec::new();
        for i in 0..10_000u32 {
            let t = START + 1 + u64::from(i * 7919 % 20_000);
            if g.admit(n(i), t, START + 10_000).is_ok() {
                admitted.push((n(i), t));
            }
            assert!(g.len() <= cap, "{} nonces remembered", g.len());
        }
        assert!(admitted.len() >= cap, "{}", admitted.len());
        // Every admitted proof, tried again, is refused.
        for (nonce, t) in admitted {
            assert!(g.admit(nonce, t, START + 10_000).is_err());
        }
        assert!(g.len() <= cap);
        // A fresh proof at the listener's time still gets in.
        assert_eq!(g.admit(n(99_999), START + 20_001, START + 20_001), Ok(()));
    }
}
