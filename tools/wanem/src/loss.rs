//! Loss processes: none, independent (Bernoulli) and the Gilbert-Elliott
//! two-state burst model.
//!
//! Gilbert-Elliott in the notation of Hasslinger and Hohlfeld ("The
//! Gilbert-Elliott Model for Packet Loss in Real Time Services on the
//! Internet", 2008), which Linux netem's `gemodel p r 1-h 1-k` follows:
//! `p` is the probability of moving from the good state to the bad one, `r`
//! from bad to good, `h` the probability that a packet gets through in the bad
//! state and `k` in the good state. So a packet is lost with `1-k` in the good
//! state and `1-h` in the bad state; the stationary share of the bad state is
//! `p/(p+r)`, and the long-run loss rate is
//! `(1-k) r/(p+r) + (1-h) p/(p+r)`. The classic Gilbert model is `h = 0, k = 1`.

use crate::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossModel {
    None,
    /// Each packet lost independently with this probability.
    Bernoulli(f64),
    GilbertElliott {
        p: f64,
        r: f64,
        h: f64,
        k: f64,
    },
}

impl LossModel {
    /// The long-run loss probability.
    pub fn stationary_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli(p) => p,
            LossModel::GilbertElliott { p, r, h, k } => {
                if p + r == 0.0 {
                    1.0 - k // never leaves the good state it starts in
                } else {
                    (1.0 - k) * r / (p + r) + (1.0 - h) * p / (p + r)
                }
            }
        }
    }

    /// Parses `p,r,h,k` (each a probability, `%` allowed); `p,r` alone is the
    /// classic Gilbert model (h = 0, k = 1).
    pub fn parse_ge(s: &str) -> Result<LossModel, String> {
        let parts: Vec<&str> = s.split(',').collect();
        if parts.len() != 2 && parts.len() != 4 {
            return Err(format!(
                "--ge `{s}`: wants `p,r` or `p,r,h,k` (for example `1%,30%,0,1`: bursts of about 3 packets, loss about 3.2%)"
            ));
        }
        let v: Vec<f64> = parts
            .iter()
            .map(|x| crate::units::parse_prob(x))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--ge `{s}`: {e}"))?;
        let (h, k) = if v.len() == 4 {
            (v[2], v[3])
        } else {
            (0.0, 1.0)
        };
        Ok(LossModel::GilbertElliott {
            p: v[0],
            r: v[1],
            h,
            k,
        })
    }
}

/// The state of one direction's loss process.
#[derive(Clone, Debug)]
pub struct Loss {
    model: LossModel,
    bad: bool,
}

impl Loss {
    pub fn new(model: LossModel) -> Loss {
        Loss { model, bad: false }
    }

    /// Decides the fate of the next packet: true means lost.
    pub fn lose(&mut self, rng: &mut Rng) -> bool {
        match self.model {
            LossModel::None => false,
            LossModel::Bernoulli(p) => rng.chance(p),
            LossModel::GilbertElliott { p, r, h, k } => {
                // The packet sees the current state, then the chain steps.
                let lost = if self.bad {
                    !rng.chance(h)
                } else {
                    !rng.chance(k)
                };
                self.bad = if self.bad {
                    !rng.chance(r)
                } else {
                    rng.chance(p)
                };
                lost
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop_assert, proptest, ProptestConfig};

    fn measured(model: LossModel, n: u64, seed: u64) -> f64 {
        let mut rng = Rng::new(seed);
        let mut l = Loss::new(model);
        (0..n).filter(|_| l.lose(&mut rng)).count() as f64 / n as f64
    }

    #[test]
    fn bernoulli_rate() {
        let m = measured(LossModel::Bernoulli(0.01), 1_000_000, 1);
        assert!((m - 0.01).abs() < 0.0005, "{m}");
        assert_eq!(measured(LossModel::None, 1000, 1), 0.0);
    }

    #[test]
    fn ge_bursts_are_longer_than_independent_loss() {
        // Gilbert: p = 1%, r = 25%: mean burst 1/r = 4 packets.
        let model = LossModel::GilbertElliott {
            p: 0.01,
            r: 0.25,
            h: 0.0,
            k: 1.0,
        };
        let mut rng = Rng::new(7);
        let mut l = Loss::new(model);
        let (mut bursts, mut lost, mut prev) = (0u64, 0u64, false);
        for _ in 0..1_000_000 {
            let x = l.lose(&mut rng);
            if x {
                lost += 1;
                if !prev {
                    bursts += 1;
                }
            }
            prev = x;
        }
        let mean_burst = lost as f64 / bursts as f64;
        assert!((mean_burst - 4.0).abs() < 0.3, "mean burst {mean_burst}");
    }

    #[test]
    fn parse_ge() {
        assert_eq!(
            LossModel::parse_ge("1%,30%"),
            Ok(LossModel::GilbertElliott {
                p: 0.01,
                r: 0.3,
                h: 0.0,
                k: 1.0
            })
        );
        assert!(LossModel::parse_ge("1%").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The long-run loss of the chain matches its stationary probability.
        #[test]
        fn ge_long_run_matches_stationary(p in 0.005f64..0.2, r in 0.05f64..0.9,
                                          h in 0.0f64..0.5, k in 0.9f64..1.0, seed in any::<u64>()) {
            let model = LossModel::GilbertElliott { p, r, h, k };
            let want = model.stationary_loss();
            let got = measured(model, 400_000, seed);
            // Bursty losses vary more than binomial ones; 15% relative plus a floor.
            prop_assert!((got - want).abs() < 0.15 * want + 0.002, "got {got}, want {want}");
        }
    }
}
