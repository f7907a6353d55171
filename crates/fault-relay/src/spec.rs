//! Fault specs (`KIND[:KEY=VALUE,...]`, see the crate doc) and
//! `LISTEN=TARGET` mappings: parsing, with errors that name the key.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// Sizes (`at=1M`, `max=64K`) are written as every tool writes them.
pub use iwarp_conf::parse_size;

/// Which direction(s) of a connection a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// From the connecting side to the target.
    Up,
    /// From the target back to the connecting side.
    Down,
    /// Both, each counting its own bytes.
    Both,
}

impl Dir {
    pub(crate) fn covers(self, d: Dir) -> bool {
        self == Dir::Both || self == d
    }
}

/// When a fault fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Once this many bytes of the direction have been forwarded.
    Bytes(u64),
    /// This long after the connection was accepted.
    Time(Duration),
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Close both connections, with RST (`rst`) or FIN.
    Drop { rst: bool },
    /// Stop forwarding for this long, then resume.
    Stall(Duration),
    /// Stop forwarding: half-close the direction, or (`close`) close both
    /// connections gracefully.
    Truncate { close: bool },
    /// Swallow everything from here on and keep the connections open.
    Blackhole,
    /// Flip the byte at the trigger offset.
    Corrupt,
    /// Write in random pieces from here on.
    Reseg { seed: Option<u64>, max: usize },
}

/// Which connections of a mapping a fault applies to (1-based, inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRange {
    pub first: usize,
    pub last: usize,
}

impl ConnRange {
    pub const ALL: ConnRange = ConnRange {
        first: 1,
        last: usize::MAX,
    };
    pub(crate) fn contains(&self, n: usize) -> bool {
        (self.first..=self.last).contains(&n)
    }
}

/// One fault: what, when, where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    pub kind: Kind,
    pub at: Trigger,
    pub dir: Dir,
    /// 0-based mapping index; `None`: every mapping.
    pub map: Option<usize>,
    pub conn: ConnRange,
    /// `wait=signal`: once the trigger is reached, the direction holds
    /// (forwards nothing more) until the relay's [`Signal`](crate::Signal)
    /// is raised, and only then the fault fires. A test uses it to fault a
    /// connection after something it observed (a file the client wrote),
    /// not after a byte count that may come before it.
    pub wait_signal: bool,
}

/// `500ms`, `2s` or a size (`4096`, `64K`, `1M`).
fn parse_trigger(v: &str) -> Result<Trigger, String> {
    if let Some(ms) = v.strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(|m| Trigger::Time(Duration::from_millis(m)))
            .map_err(|_| format!("at={v}: expected e.g. 500ms, 2s or a byte offset like 1M"));
    }
    if let Some(s) = v.strip_suffix('s') {
        if let Ok(s) = s.parse::<u64>() {
            return Ok(Trigger::Time(Duration::from_secs(s)));
        }
    }
    parse_size(v).map(Trigger::Bytes).map_err(|_| {
        format!("at={v}: expected a byte offset (4096, 64K, 1M) or a time (500ms, 2s)")
    })
}

fn parse_ms(key: &str, v: &str) -> Result<Duration, String> {
    let n = v.strip_suffix("ms").unwrap_or(v);
    if let Some(s) = v.strip_suffix('s').filter(|_| !v.ends_with("ms")) {
        if let Ok(s) = s.parse::<u64>() {
            return Ok(Duration::from_secs(s));
        }
    }
    n.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("{key}={v}: expected milliseconds, e.g. {key}=3000 or {key}=3s"))
}

fn parse_conn(v: &str) -> Result<ConnRange, String> {
    let bad = || format!("conn={v}: expected N, N-M or N- (1-based connection numbers)");
    let num = |s: &str| s.parse::<usize>().ok().filter(|&n| n >= 1).ok_or_else(bad);
    let r = match v.split_once('-') {
        None => {
            let n = num(v)?;
            ConnRange { first: n, last: n }
        }
        Some((a, "")) => ConnRange {
            first: num(a)?,
            last: usize::MAX,
        },
        Some((a, b)) => ConnRange {
            first: num(a)?,
            last: num(b)?,
        },
    };
    if r.first > r.last {
        return Err(bad());
    }
    Ok(r)
}

impl FromStr for FaultSpec {
    type Err = String;

    /// `KIND[:KEY=VALUE,...]`, e.g. `drop:at=1M,dir=down,map=1,conn=2,how=rst`.
    fn from_str(s: &str) -> Result<FaultSpec, String> {
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut at = Trigger::Bytes(0);
        let mut dir = Dir::Both;
        let mut map = None;
        let mut conn = ConnRange::ALL;
        let mut how = None;
        let mut dur = None;
        let mut seed = None;
        let mut max = None;
        let mut wait_signal = false;
        for kv in rest.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{s}: {kv:?} is not KEY=VALUE"))?;
            match k {
                "at" | "after" => at = parse_trigger(v)?,
                "dir" => {
                    dir = match v {
                        "up" => Dir::Up,
                        "down" => Dir::Down,
                        "both" => Dir::Both,
                        _ => return Err(format!("dir={v}: expected up, down or both")),
                    }
                }
                "map" => {
                    map = Some(v.parse().map_err(|_| {
                        format!("map={v}: expected the 0-based index of a --listen mapping")
                    })?)
                }
                "conn" => conn = parse_conn(v)?,
                "how" => how = Some(v.to_string()),
                "for" => dur = Some(parse_ms("for", v)?),
                "seed" => {
                    seed = Some(
                        v.parse()
                            .map_err(|_| format!("seed={v}: expected an unsigned integer"))?,
                    )
                }
                "max" => {
                    max = Some(
                        parse_size(v)
                            .ok()
                            .and_then(|m| usize::try_from(m).ok())
                            .filter(|&m| (1..=1 << 24).contains(&m))
                            .ok_or_else(|| format!("max={v}: expected 1 to 16M bytes"))?,
                    )
                }
                "wait" => {
                    if v != "signal" {
                        return Err(format!(
                            "wait={v}: the one thing a fault can wait for is wait=signal"
                        ));
                    }
                    wait_signal = true;
                }
                _ => {
                    return Err(format!(
                    "{s}: unknown key {k:?} (keys: at, dir, map, conn, how, for, seed, max, wait)"
                ))
                }
            }
        }
        let only = |what: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(format!("{s}: {what} does not apply to {kind}"))
            }
        };
        only("how=", how.is_none() || matches!(kind, "drop" | "truncate"))?;
        only("for=", dur.is_none() || kind == "stall")?;
        only(
            "seed= and max=",
            (seed.is_none() && max.is_none()) || kind == "reseg",
        )?;
        let kind = match kind {
            "drop" => Kind::Drop {
                rst: match how.as_deref() {
                    None | Some("rst") => true,
                    Some("fin") => false,
                    Some(h) => return Err(format!("{s}: how={h}: drop takes how=rst or how=fin")),
                },
            },
            "stall" => Kind::Stall(dur.unwrap_or(Duration::from_secs(1))),
            "truncate" => Kind::Truncate {
                close: match how.as_deref() {
                    None | Some("half") => false,
                    Some("close") => true,
                    Some(h) => {
                        return Err(format!(
                            "{s}: how={h}: truncate takes how=half or how=close"
                        ))
                    }
                },
            },
            "blackhole" => Kind::Blackhole,
            "corrupt" => {
                if !matches!(at, Trigger::Bytes(_)) {
                    return Err(format!("{s}: corrupt needs a byte offset (at=N), not a time"));
                }
                Kind::Corrupt
            }
            "reseg" => Kind::Reseg {
                seed,
                max: max.unwrap_or(1 << 16),
            },
            _ => {
                return Err(format!(
                    "{s}: unknown fault {kind:?} (faults: drop, stall, truncate, blackhole, corrupt, reseg)"
                ))
            }
        };
        Ok(FaultSpec {
            kind,
            at,
            dir,
            map,
            conn,
            wait_signal,
        })
    }
}

/// `LISTEN=TARGET`, both `IP:PORT`.
pub fn parse_mapping(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (l, t) = s.split_once('=').ok_or_else(|| {
        format!("{s}: expected LISTEN=TARGET, e.g. 127.0.0.1:7000=127.0.0.1:2121")
    })?;
    let l = l
        .parse()
        .map_err(|e| format!("{l}: not an IP:PORT listen address: {e}"))?;
    let t = t
        .parse()
        .map_err(|e| format!("{t}: not an IP:PORT target: {e}"))?;
    Ok((l, t))
}
