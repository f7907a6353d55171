//! `wanem up`'s settings: command-line flags over an optional TOML file with
//! the same keys (`rtt = "50ms"`, `delay-a-b = "30ms"`, `loss = "0.1%"`,
//! ...), turned into a [`Plan`]: the namespaces, addresses and one
//! [`DirConfig`] per direction.

use crate::delay::DelayConfig;
use crate::loss::LossModel;
use crate::pipe::DirConfig;
use crate::units::{self, Nanos, QueueSize};
use serde::Deserialize;
use std::path::PathBuf;

/// Path settings. Every value may also come from `--config FILE` (TOML,
/// same names: `rtt = "50ms"`, `delay-a-b = "30ms"`, `drop-syn = 1`); a flag
/// given on the command line wins.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct UpArgs {
    /// TOML file with any of these settings (flags override it).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Names this path: namespaces `wan-TAG-a` and `wan-TAG-b`, control
    /// socket /run/wanem/TAG.sock. Letters, digits, `-`, `_`; up to 24.
    #[arg(long)]
    pub tag: Option<String>,
    /// Round-trip time added by the path: each direction gets half as its
    /// one-way delay (e.g. `50ms`).
    #[arg(long)]
    pub rtt: Option<String>,
    /// One-way delay from a to b (overrides half of --rtt).
    #[arg(long)]
    pub delay_a_b: Option<String>,
    /// One-way delay from b to a (overrides half of --rtt).
    #[arg(long)]
    pub delay_b_a: Option<String>,
    /// Each packet's delay varies uniformly by up to +- this (e.g. `2ms`),
    /// without reordering: a packet never overtakes the one ahead of it.
    #[arg(long)]
    pub jitter: Option<String>,
    /// Independent random loss per packet, each direction (`0.1%` or `0.001`).
    #[arg(long)]
    pub loss: Option<String>,
    /// Random loss from a to b only (overrides --loss for that direction;
    /// e.g. `--loss 1% --loss-b-a 0` loses data but no ACKs).
    #[arg(long)]
    pub loss_a_b: Option<String>,
    /// Random loss from b to a only (overrides --loss for that direction).
    #[arg(long)]
    pub loss_b_a: Option<String>,
    /// Gilbert-Elliott burst loss instead of --loss: `p,r[,h,k]`. p: good->bad
    /// per packet, r: bad->good, h: delivery probability in the bad state,
    /// k: in the good state (netem's `gemodel p r 1-h 1-k`). Long-run loss
    /// = (1-k) r/(p+r) + (1-h) p/(p+r); mean burst 1/r packets when h = 0.
    #[arg(long, value_name = "P,R,H,K")]
    pub ge: Option<String>,
    /// Bottleneck rate each direction, tc units in bits: `10mbit`, `1gbit`.
    /// Without it the path has no rate limit and no queue.
    #[arg(long)]
    pub rate: Option<String>,
    /// Drop-tail queue before the bottleneck, in bytes (`65536`, `256k`,
    /// `4m`) or a multiple of the bandwidth-delay product (`bdp`, `2bdp`;
    /// rate x RTT). Default `bdp`; never less than 10 MTU-sized packets.
    #[arg(long)]
    pub queue: Option<String>,
    /// Probability that a packet is held back by --reorder-gap and overtaken
    /// by those behind it (`1%`). Default 0: FIFO.
    #[arg(long)]
    pub reorder: Option<String>,
    /// How long a reordered packet is held back (default 1ms).
    #[arg(long)]
    pub reorder_gap: Option<String>,
    /// MTU of both TUN devices (68..=65535, default 1500). The kernel then
    /// hands the emulator packets of at most this size (no GSO blobs).
    #[arg(long)]
    pub mtu: Option<u32>,
    /// Take the link down this long after start (e.g. `10s`), both ways.
    #[arg(long)]
    pub down_at: Option<String>,
    /// How long the scheduled outage lasts (e.g. `5s`; needs --down-at).
    #[arg(long)]
    pub down_for: Option<String>,
    /// Drop the first N TCP SYNs (SYN without ACK) in each direction, as a
    /// lossy path drops a connection's first attempt.
    #[arg(long, value_name = "N")]
    pub drop_syn: Option<u32>,
    /// Addresses 10.201.N.1 (namespace a) and 10.201.N.2 (b); default 0.
    /// The namespaces are private, so two paths may use the same N.
    #[arg(long, value_name = "N")]
    pub subnet: Option<u8>,
    /// Run the two packet threads SCHED_FIFO (priority 10), so builds or
    /// benchmarks on the same cores do not delay releases (sched(7)). Use
    /// it for timing-sensitive runs; near the emulator's top rate it takes
    /// CPU time from the endpoints.
    #[arg(long)]
    #[serde(default)]
    pub realtime: bool,
    /// Seed of the loss, jitter and reordering processes (default: from the
    /// clock). The same seed gives the same decisions for the same arrivals.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl UpArgs {
    /// Flags over the file's values.
    pub fn merged(self) -> Result<UpArgs, String> {
        let file = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    format!("config {}: {e} (give a readable TOML file)", p.display())
                })?;
                toml::from_str::<UpArgs>(&text).map_err(|e| {
                    format!(
                        "config {}: {e} (keys are the flag names, e.g. rtt = \"50ms\")",
                        p.display()
                    )
                })?
            }
            None => UpArgs::default(),
        };
        macro_rules! pick {
            ($($f:ident),*) => { UpArgs { config: self.config, realtime: self.realtime || file.realtime, $($f: self.$f.or(file.$f)),* } };
        }
        Ok(pick!(
            tag,
            rtt,
            delay_a_b,
            delay_b_a,
            jitter,
            loss,
            loss_a_b,
            loss_b_a,
            ge,
            rate,
            queue,
            reorder,
            reorder_gap,
            mtu,
            down_at,
            down_for,
            drop_syn,
            subnet,
            seed
        ))
    }
}

/// Everything `wanem up` sets up, computed before touching the system.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub tag: String,
    pub ns_a: String,
    pub ns_b: String,
    pub addr_a: String,
    pub addr_b: String,
    pub mtu: u32,
    pub a_to_b: DirConfig,
    pub b_to_a: DirConfig,
    /// Scheduled outage: (start after launch, length).
    pub down: Option<(Nanos, Nanos)>,
    pub seed: Option<u64>,
    pub realtime: bool,
}

/// The device name inside both namespaces.
pub const DEV: &str = "wan0";

pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty()
        || tag.len() > 24
        || !tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "tag `{tag}`: use 1 to 24 letters, digits, `-` or `_` (for example `rftp1`)"
        ));
    }
    Ok(())
}

pub fn ns_names(tag: &str) -> (String, String) {
    (format!("wan-{tag}-a"), format!("wan-{tag}-b"))
}

impl Plan {
    pub fn from_args(a: &UpArgs) -> Result<Plan, String> {
        let tag = a
            .tag
            .clone()
            .ok_or("--tag is required (it names the namespaces, e.g. --tag t1)")?;
        check_tag(&tag)?;
        let opt = |v: &Option<String>, f: fn(&str) -> Result<Nanos, String>| {
            v.as_deref().map(f).transpose()
        };
        let rtt = opt(&a.rtt, units::parse_duration)?.unwrap_or(0);
        let d_ab = opt(&a.delay_a_b, units::parse_duration)?.unwrap_or(rtt / 2);
        let d_ba = opt(&a.delay_b_a, units::parse_duration)?.unwrap_or(rtt - rtt / 2);
        let jitter = opt(&a.jitter, units::parse_duration)?.unwrap_or(0);
        let loss = match (&a.loss, &a.ge) {
            (Some(_), Some(_)) => {
                return Err("--loss and --ge both given: pick one loss process".into())
            }
            (Some(l), None) => LossModel::Bernoulli(units::parse_prob(l)?),
            (None, Some(g)) => LossModel::parse_ge(g)?,
            (None, None) => LossModel::None,
        };
        let one_way = |v: &Option<String>| -> Result<LossModel, String> {
            match v {
                Some(_) if a.ge.is_some() => {
                    Err("--loss-a-b/--loss-b-a with --ge: pick one loss process".into())
                }
                Some(l) => Ok(LossModel::Bernoulli(units::parse_prob(l)?)),
                None => Ok(loss),
            }
        };
        let (loss_ab, loss_ba) = (one_way(&a.loss_a_b)?, one_way(&a.loss_b_a)?);
        let rate = a.rate.as_deref().map(units::parse_rate).transpose()?;
        let mtu = a.mtu.unwrap_or(1500);
        if !(68..=65535).contains(&mtu) {
            return Err(format!(
                "--mtu {mtu}: must be 68..=65535 (IPv4 minimum to the TUN maximum)"
            ));
        }
        let queue = match a.queue.as_deref().map(units::parse_queue).transpose()? {
            Some(QueueSize::Bytes(b)) => b,
            Some(QueueSize::Bdp(m)) => bdp(rate, d_ab + d_ba, m),
            None => bdp(rate, d_ab + d_ba, 1.0),
        }
        .max(10 * mtu as u64);
        let reorder = a
            .reorder
            .as_deref()
            .map(units::parse_prob)
            .transpose()?
            .unwrap_or(0.0);
        let reorder_gap = opt(&a.reorder_gap, units::parse_duration)?.unwrap_or(1_000_000);
        let down = match (&a.down_at, &a.down_for) {
            (Some(at), Some(f)) => Some((units::parse_duration(at)?, units::parse_duration(f)?)),
            (None, None) => None,
            _ => {
                return Err(
                    "--down-at and --down-for go together (e.g. --down-at 10s --down-for 5s)"
                        .into(),
                )
            }
        };
        let n = a.subnet.unwrap_or(0);
        let dir = |delay, loss| DirConfig {
            loss,
            rate,
            queue,
            delay: DelayConfig {
                delay,
                jitter,
                reorder,
                reorder_gap,
            },
            mtu: mtu as usize,
            drop_syn: a.drop_syn.unwrap_or(0),
            max_held: 256 << 20,
        };
        let (ns_a, ns_b) = ns_names(&tag);
        Ok(Plan {
            ns_a,
            ns_b,
            addr_a: format!("10.201.{n}.1"),
            addr_b: format!("10.201.{n}.2"),
            mtu,
            a_to_b: dir(d_ab, loss_ab),
            b_to_a: dir(d_ba, loss_ba),
            down,
            seed: a.seed,
            realtime: a.realtime,
            tag,
        })
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        let d = &self.a_to_b;
        format!(
            "{} {}<->{} {} delay a->b {} b->a {} jitter {} loss a->b {:?} b->a {:?} rate {} queue {} B reorder {} mtu {} drop-syn {} down {:?}",
            self.tag,
            self.addr_a,
            self.addr_b,
            DEV,
            units::fmt_ns(d.delay.delay),
            units::fmt_ns(self.b_to_a.delay.delay),
            units::fmt_ns(d.delay.jitter),
            d.loss,
            self.b_to_a.loss,
            d.rate.map_or("unlimited".into(), |r| format!("{r} bit/s")),
            d.queue,
            d.delay.reorder,
            self.mtu,
            d.drop_syn,
            self.down
        )
    }
}

/// `m` x bandwidth-delay product in bytes (0 without a rate).
fn bdp(rate: Option<u64>, rtt: Nanos, m: f64) -> u64 {
    rate.map_or(0, |r| (r as f64 / 8.0 * rtt as f64 / 1e9 * m) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(tag: &str) -> UpArgs {
        UpArgs {
            tag: Some(tag.into()),
            ..Default::default()
        }
    }

    #[test]
    fn rtt_splits_and_bdp_queue() {
        let mut a = args("t");
        a.rtt = Some("50ms".into());
        a.rate = Some("1gbit".into());
        let p = Plan::from_args(&a).unwrap();
        assert_eq!(p.a_to_b.delay.delay, 25_000_000);
        assert_eq!(p.b_to_a.delay.delay, 25_000_000);
        assert_eq!(p.a_to_b.queue, 6_250_000);
        assert_eq!(p.ns_a, "wan-t-a");
        a.delay_a_b = Some("40ms".into());
        a.queue = Some("1500".into());
        let p = Plan::from_args(&a).unwrap();
        assert_eq!(p.a_to_b.delay.delay, 40_000_000);
        assert_eq!(p.a_to_b.queue, 15_000, "at least 10 MTU");
    }

    #[test]
    fn errors_name_the_fix() {
        assert!(Plan::from_args(&UpArgs::default())
            .unwrap_err()
            .contains("--tag"));
        assert!(Plan::from_args(&args("a b"))
            .unwrap_err()
            .contains("letters"));
        let mut a = args("t");
        a.loss = Some("1%".into());
        a.ge = Some("1%,10%".into());
        assert!(Plan::from_args(&a).unwrap_err().contains("pick one"));
        let mut a = args("t");
        a.down_at = Some("1s".into());
        assert!(Plan::from_args(&a).unwrap_err().contains("together"));
    }

    #[test]
    fn config_file_under_flags() {
        let dir = std::env::temp_dir().join(format!("wanem-cfg-{}", std::process::id()));
        std::fs::write(
            &dir,
            "tag = \"f\"\nrtt = \"10ms\"\nloss = \"1%\"\ndrop-syn = 2\n",
        )
        .unwrap();
        let a = UpArgs {
            config: Some(dir.clone()),
            rtt: Some("20ms".into()),
            ..Default::default()
        };
        let m = a.merged().unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(m.tag.as_deref(), Some("f"));
        assert_eq!(m.rtt.as_deref(), Some("20ms"));
        assert_eq!(m.drop_syn, Some(2));
        let p = Plan::from_args(&m).unwrap();
        assert_eq!(p.a_to_b.loss, LossModel::Bernoulli(0.01));
        let p = Plan::from_args(&UpArgs {
            loss_b_a: Some("0".into()),
            ..m
        })
        .unwrap();
        assert_eq!(p.a_to_b.loss, LossModel::Bernoulli(0.01));
        assert_eq!(p.b_to_a.loss, LossModel::Bernoulli(0.0));
    }
}
