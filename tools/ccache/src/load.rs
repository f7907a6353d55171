//! The load generator's pieces (`ccload`), without threads or sockets:
//! workloads, access-log parsing, a WorldCup-98-shaped log generator, and
//! the stale checker.
//!
//! - [`Zipf`]: document popularity, rank `i` (0-based) drawn with
//!   probability proportional to `1 / (i + 1)^s`.
//! - [`doc_sizes`]: the "20 documents of 200 B – 1 MB" workload's sizes,
//!   spread geometrically and shuffled so that size and popularity are not
//!   correlated.
//! - [`parse_clf`]: one line of Common or Combined Log Format
//!   (`host ident user [date] "request" status bytes ["referer" "agent"]`);
//!   [`Trace::from_log`] turns a whole log into a replay of document
//!   numbers, counting (and skipping) malformed lines.
//! - [`gen_wc98`]: a log shaped like the 1998 World Cup site's: bursty
//!   arrivals, Zipf popularity over a few thousand URLs, mostly small
//!   images and pages with a heavy tail of large files, some `304`s.
//! - [`UpdateLog`]: the update log (`<unix ns> <doc> <version>`, written by
//!   ccappd after the version was published) and [`UpdateLog::required`],
//!   the newest version committed before a request was sent. A response
//!   older than that is **stale**.
//! - [`parse_timing`]: ccproxy's `X-CC-Timing` header (stage times).

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, Write};

/// A small deterministic generator (SplitMix64): the workloads must be
/// reproducible from a seed, and need nothing cryptographic.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Zipf popularity over `n` ranks.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// `n` ranks with exponent `s` (`s = 0` is uniform; the classic web
    /// value is about 0.8–1.0).
    pub fn new(n: u32, s: f64) -> Zipf {
        let n = n.max(1);
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(n as usize);
        for i in 0..n {
            acc += 1.0 / f64::from(i + 1).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// The rank for a uniform `u` in `[0, 1)`.
    pub fn rank(&self, u: f64) -> u32 {
        let i = self.cdf.partition_point(|&c| c <= u);
        i.min(self.cdf.len() - 1) as u32
    }

    /// Draw a rank.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        self.rank(rng.next_f64())
    }

    /// Probability of rank `i`.
    pub fn p(&self, i: u32) -> f64 {
        let i = i as usize;
        self.cdf[i] - if i == 0 { 0.0 } else { self.cdf[i - 1] }
    }
}

/// `n` sizes from `min` to `max` bytes, geometrically spaced (both ends
/// included), then shuffled by `seed` so that a document's popularity rank
/// says nothing about its size.
pub fn doc_sizes(n: u32, min: usize, max: usize, seed: u64) -> Vec<usize> {
    let n = n.max(1) as usize;
    let (lo, hi) = (min.max(1) as f64, max.max(min).max(1) as f64);
    let mut v: Vec<usize> = (0..n)
        .map(|i| {
            if n == 1 {
                lo as usize
            } else {
                (lo * (hi / lo).powf(i as f64 / (n - 1) as f64)).round() as usize
            }
        })
        .collect();
    let mut rng = Rng::new(seed);
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// One access-log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The client (host or address field).
    pub host: String,
    /// Request time, seconds since 1970 (UTC).
    pub time: i64,
    /// Request method.
    pub method: String,
    /// Request target (path and query).
    pub path: String,
    /// Status code.
    pub status: u16,
    /// Response bytes (`-` is 0).
    pub bytes: u64,
}

/// Why a log line was not understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogError(pub String);

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LogError {}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `10/Oct/2000:13:55:36 -0700` → seconds since 1970 (UTC).
pub fn parse_clf_time(s: &str) -> Result<i64, LogError> {
    let bad = || LogError(format!("bad date {s:?} (want dd/Mon/yyyy:hh:mm:ss +zzzz)"));
    let (dt, zone) = s.split_once(' ').ok_or_else(bad)?;
    let mut p = dt.splitn(4, ':');
    let date = p.next().ok_or_else(bad)?;
    let num = |x: Option<&str>, max: u32| -> Result<u32, LogError> {
        let x = x.ok_or_else(bad)?;
        if x.len() != 2 || !x.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let v: u32 = x.parse().map_err(|_| bad())?;
        if v > max {
            return Err(bad());
        }
        Ok(v)
    };
    let (hh, mm, ss) = (num(p.next(), 23)?, num(p.next(), 59)?, num(p.next(), 60)?);
    let mut d = date.split('/');
    let day: u32 = d
        .next()
        .and_then(|x| x.parse().ok())
        .filter(|&x| (1..=31).contains(&x))
        .ok_or_else(bad)?;
    let mon = d
        .next()
        .and_then(|x| MONTHS.iter().position(|&m| m == x))
        .ok_or_else(bad)? as u32
        + 1;
    let year: i64 = d
        .next()
        .filter(|x| x.len() == 4)
        .and_then(|x| x.parse().ok())
        .ok_or_else(bad)?;
    if d.next().is_some() {
        return Err(bad());
    }
    let zb = zone.as_bytes();
    if zb.len() != 5 || !(zb[0] == b'+' || zb[0] == b'-') || !zb[1..].iter().all(u8::is_ascii_digit)
    {
        return Err(bad());
    }
    let zh: i64 = zone[1..3].parse().map_err(|_| bad())?;
    let zm: i64 = zone[3..5].parse().map_err(|_| bad())?;
    let off = (zh * 3600 + zm * 60) * if zb[0] == b'-' { -1 } else { 1 };
    let local = days_from_civil(year, mon, day) * 86_400
        + i64::from(hh) * 3600
        + i64::from(mm) * 60
        + i64::from(ss);
    Ok(local - off)
}

/// Seconds since 1970 → `30/Apr/1998:21:30:17 +0000`.
pub fn format_clf_time(t: i64) -> String {
    let (y, m, d) = civil_from_days(t.div_euclid(86_400));
    let s = t.rem_euclid(86_400);
    format!(
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// The quoted field at the start of `s` (after optional spaces): its
/// contents (with `\"` and `\\` kept as written) and the rest.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches(' ');
    let b = s.as_bytes();
    if b.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some((&s[1..i], &s[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

/// Parse one Common or Combined Log Format line.
pub fn parse_clf(line: &str) -> Result<LogEntry, LogError> {
    let e = |what: &str| LogError(what.to_string());
    let line = line.trim_end_matches(['\r', '\n']);
    let mut rest = line;
    let mut field = || -> Result<&str, LogError> {
        let r = rest.trim_start_matches(' ');
        let end = r.find(' ').ok_or_else(|| e("line ends before the date"))?;
        rest = &r[end..];
        Ok(&r[..end])
    };
    let host = field()?.to_string();
    let _ident = field()?;
    let _user = field()?;
    let r = rest.trim_start_matches(' ');
    let r = r
        .strip_prefix('[')
        .ok_or_else(|| e("no [date] after host, ident and user"))?;
    let (date, r) = r.split_once(']').ok_or_else(|| e("unterminated [date]"))?;
    let time = parse_clf_time(date)?;
    let (req, r) = quoted(r).ok_or_else(|| e("no quoted request line after the date"))?;
    let mut parts = req.split(' ').filter(|p| !p.is_empty());
    let method = parts
        .next()
        .filter(|m| m.bytes().all(|b| b.is_ascii_uppercase()))
        .ok_or_else(|| e("request line has no method"))?
        .to_string();
    let path = parts
        .next()
        .ok_or_else(|| e("request line has no target"))?
        .to_string();
    if !path.starts_with('/') && !path.starts_with("http") {
        return Err(e("request target is not a path"));
    }
    let mut tail = r.split(' ').filter(|p| !p.is_empty());
    let status: u16 = tail
        .next()
        .filter(|s| s.len() == 3)
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| e("status is not a 3-digit code"))?;
    let bytes = match tail.next() {
        Some("-") => 0,
        Some(b) => b
            .parse()
            .map_err(|_| e("bytes field is neither a number nor -"))?,
        None => return Err(e("no bytes field")),
    };
    Ok(LogEntry {
        host,
        time,
        method,
        path,
        status,
        bytes,
    })
}

/// An access log turned into a replay: each replayed request's document
/// number, in log order.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Document of each replayed request.
    pub docs: Vec<u32>,
    /// Largest response size seen per document (its file size for the
    /// replay), indexed by document number.
    pub sizes: Vec<u64>,
    /// Distinct URLs seen.
    pub urls: usize,
    /// Lines read.
    pub lines: usize,
    /// Lines that are not CLF (skipped).
    pub malformed: usize,
    /// Well-formed lines that are not a successful GET (skipped).
    pub skipped: usize,
    /// The first few malformed lines: (line number, reason).
    pub first_errors: Vec<(usize, String)>,
}

impl Trace {
    /// Read a log. GETs answered 200 or 304 are replayed; each distinct
    /// path gets a document number by first appearance, taken modulo
    /// `max_docs` if given (documents must exist on the servers).
    pub fn from_log(r: impl BufRead, max_docs: Option<u32>) -> io::Result<Trace> {
        let mut t = Trace::default();
        let mut ids: HashMap<String, u32> = HashMap::new();
        for line in r.split(b'\n') {
            let line = line?;
            t.lines += 1;
            let Ok(s) = std::str::from_utf8(&line) else {
                t.note_bad("not UTF-8".into());
                continue;
            };
            if s.trim().is_empty() {
                t.lines -= 1;
                continue;
            }
            let ent = match parse_clf(s) {
                Ok(x) => x,
                Err(err) => {
                    t.note_bad(err.0);
                    continue;
                }
            };
            if ent.method != "GET" || !(ent.status == 200 || ent.status == 304) {
                t.skipped += 1;
                continue;
            }
            let next = ids.len() as u32;
            let id = *ids.entry(ent.path).or_insert(next);
            let doc = match max_docs {
                Some(m) => id % m.max(1),
                None => id,
            };
            if t.sizes.len() <= doc as usize {
                t.sizes.resize(doc as usize + 1, 0);
            }
            t.sizes[doc as usize] = t.sizes[doc as usize].max(ent.bytes);
            t.docs.push(doc);
        }
        t.urls = ids.len();
        Ok(t)
    }

    fn note_bad(&mut self, why: String) {
        self.malformed += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push((self.lines, why));
        }
    }
}

/// Settings of [`gen_wc98`].
#[derive(Debug, Clone)]
pub struct Wc98 {
    /// Lines to write.
    pub requests: u64,
    /// Distinct URLs.
    pub urls: u32,
    /// Zipf exponent of URL popularity.
    pub zipf: f64,
    /// Distinct clients.
    pub clients: u32,
    /// Mean requests per second outside bursts.
    pub base_rate: f64,
    /// Rate multiplier during a burst (a goal, a half-time).
    pub burst: f64,
    /// Malformed lines to mix in (for parser tests), spread evenly.
    pub malformed: u64,
    /// Seed.
    pub seed: u64,
    /// Time of the first line (seconds since 1970).
    pub start: i64,
}

impl Default for Wc98 {
    fn default() -> Wc98 {
        Wc98 {
            requests: 100_000,
            urls: 3000,
            zipf: 0.9,
            clients: 5000,
            base_rate: 200.0,
            burst: 8.0,
            malformed: 0,
            seed: 1998,
            // 1998-06-10 00:00:00 UTC, the first day of the tournament.
            start: 897_436_800,
        }
    }
}

/// One URL of the generated site: path and size.
fn wc98_url(i: u32, rng: &mut Rng) -> (String, u64) {
    // The 1998 site: about 88 % images, 10 % pages, a few large files.
    let u = rng.next_f64();
    // A log-normal-ish size: exp of a sum of uniforms.
    let g = (0..4).map(|_| rng.next_f64()).sum::<f64>() - 2.0;
    if u < 0.88 {
        let size = (1500.0 * (1.2 * g).exp()).clamp(100.0, 60_000.0) as u64;
        (format!("/images/img_{i}.gif"), size)
    } else if u < 0.98 {
        let size = (6000.0 * (1.0 * g).exp()).clamp(500.0, 200_000.0) as u64;
        (format!("/english/html/page_{i}.html"), size)
    } else {
        let size = (150_000.0 * (1.5 * g).exp()).clamp(20_000.0, 1_048_576.0) as u64;
        (format!("/english/files/file_{i}.zip"), size)
    }
}

/// Write a WorldCup-98-shaped access log in Common Log Format: arrivals
/// whose rate switches between a base rate and bursts (exponential
/// durations), URL popularity Zipf over `urls` paths with fixed sizes per
/// URL, about 7 % `304 Not Modified` (size `-`), a few `404`s.
pub fn gen_wc98(w: &mut impl Write, cfg: &Wc98) -> io::Result<()> {
    let mut rng = Rng::new(cfg.seed);
    let urls: Vec<(String, u64)> = (0..cfg.urls.max(1))
        .map(|i| wc98_url(i, &mut rng))
        .collect();
    // Popularity rank → URL: shuffled, so paths do not sort by popularity.
    let mut order: Vec<u32> = (0..urls.len() as u32).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let zipf = Zipf::new(urls.len() as u32, cfg.zipf);
    let client_zipf = Zipf::new(cfg.clients.max(1), 0.6);
    let mut t = cfg.start as f64;
    let mut in_burst = false;
    let mut phase_end = t + 60.0;
    let every_bad = cfg
        .requests
        .checked_div(cfg.malformed)
        .map_or(u64::MAX, |n| n.max(1));
    let mut bad_written = 0;
    for n in 0..cfg.requests {
        if t >= phase_end {
            in_burst = !in_burst;
            let mean = if in_burst { 30.0 } else { 300.0 };
            phase_end = t - mean * (1.0 - rng.next_f64()).ln();
        }
        let rate = cfg.base_rate.max(0.001) * if in_burst { cfg.burst.max(1.0) } else { 1.0 };
        t -= (1.0 - rng.next_f64()).ln() / rate;
        if n % every_bad == every_bad / 2 && bad_written < cfg.malformed {
            bad_written += 1;
            let junk = match bad_written % 4 {
                0 => "garbage without any structure".to_string(),
                1 => format!(
                    "10.0.0.1 - - [{}] \"GET /x HTTP/1.0\" 2OO 12",
                    format_clf_time(t as i64)
                ),
                2 => "10.0.0.1 - - [99/Foo/1998:25:00:00 +0000] \"GET / HTTP/1.0\" 200 1".into(),
                _ => format!(
                    "10.0.0.1 - - [{}] \"GET /unterminated",
                    format_clf_time(t as i64)
                ),
            };
            writeln!(w, "{junk}")?;
            continue;
        }
        let (path, size) = &urls[order[zipf.sample(&mut rng) as usize] as usize];
        let client = client_zipf.sample(&mut rng);
        let r = rng.next_f64();
        let (status, bytes) = if r < 0.07 {
            (304, "-".to_string())
        } else if r < 0.075 {
            (404, "318".to_string())
        } else {
            (200, size.to_string())
        };
        writeln!(
            w,
            "{}.{}.{}.{} - - [{}] \"GET {path} HTTP/1.0\" {status} {bytes}",
            10 + (client >> 24 & 0x7f),
            client >> 16 & 0xff,
            client >> 8 & 0xff,
            client & 0xff,
            format_clf_time(t as i64)
        )?;
    }
    Ok(())
}

/// The update log: per document, (commit time ns, version), sorted, with
/// the running maximum of the version.
#[derive(Debug, Clone, Default)]
pub struct UpdateLog {
    commits: HashMap<u32, Vec<(u128, u64)>>,
    /// Lines that are not `<ns> <doc> <version>`.
    pub bad_lines: usize,
    /// Lines read.
    pub lines: usize,
}

impl UpdateLog {
    /// Parse a log (`<unix ns> <doc> <version>` per line).
    pub fn read(r: impl BufRead) -> io::Result<UpdateLog> {
        let mut log = UpdateLog::default();
        log.add(r, |_| true)?;
        log.finish();
        Ok(log)
    }

    /// Parse several logs, one per shard of `n`: the log of shard `j`
    /// counts only for documents `d` with `d % n == j` (every module has
    /// a slot for every document, and its update thread may update
    /// documents it does not serve; those commits are not the served
    /// versions).
    pub fn read_sharded(rs: Vec<impl BufRead>) -> io::Result<UpdateLog> {
        let n = rs.len().max(1) as u32;
        let mut log = UpdateLog::default();
        for (j, r) in rs.into_iter().enumerate() {
            log.add(r, |d| d % n == j as u32)?;
        }
        log.finish();
        Ok(log)
    }

    fn add(&mut self, r: impl BufRead, keep: impl Fn(u32) -> bool) -> io::Result<()> {
        let log = self;
        for line in r.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            log.lines += 1;
            let p: Vec<&str> = line.split_whitespace().collect();
            let parsed = match p.as_slice() {
                [t, d, v] => match (t.parse::<u128>(), d.parse::<u32>(), v.parse::<u64>()) {
                    (Ok(t), Ok(d), Ok(v)) => Some((t, d, v)),
                    _ => None,
                },
                _ => None,
            };
            match parsed {
                Some((t, d, v)) if keep(d) => log.commits.entry(d).or_default().push((t, v)),
                Some(_) => {}
                None => log.bad_lines += 1,
            }
        }
        Ok(())
    }

    fn finish(&mut self) {
        for cs in self.commits.values_mut() {
            cs.sort_unstable();
            let mut m = 0;
            for c in cs.iter_mut() {
                m = m.max(c.1);
                c.1 = m;
            }
        }
    }

    /// The newest version of `doc` committed strictly before `t0` (unix
    /// ns); `None` if the log has no commit of it before then.
    pub fn required(&self, doc: u32, t0: u128) -> Option<u64> {
        let cs = self.commits.get(&doc)?;
        let i = cs.partition_point(|&(t, _)| t < t0);
        (i > 0).then(|| cs[i - 1].1)
    }

    /// Commits in the log (all documents).
    pub fn commits(&self) -> usize {
        self.commits.values().map(Vec::len).sum()
    }
}

/// The verdict on one response against the update log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// At least as new as required.
    Fresh,
    /// Older than the newest version committed before the request.
    Stale {
        /// Served.
        served: u64,
        /// Required.
        required: u64,
    },
    /// A 200 without `X-CC-Version`.
    Unversioned,
    /// The log has no commit of the document before the request.
    NoLogEntry,
}

/// Judge a 200 response for `doc`, sent at `t0`, that served `version`.
pub fn judge(log: &UpdateLog, doc: u32, t0: u128, version: Option<u64>) -> Verdict {
    let Some(v) = version else {
        return Verdict::Unversioned;
    };
    match log.required(doc, t0) {
        None => Verdict::NoLogEntry,
        Some(r) if v < r => Verdict::Stale {
            served: v,
            required: r,
        },
        Some(_) => Verdict::Fresh,
    }
}

/// ccproxy's `X-CC-Timing: check=12;fetch=0;module=3;total=40` (µs), as
/// (name, value) pairs; malformed pairs are skipped.
pub fn parse_timing(h: &str) -> Vec<(&str, u64)> {
    h.split(';')
        .filter_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_normalized() {
        let z = Zipf::new(20, 1.0);
        let total: f64 = (0..20).map(|i| z.p(i)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        // 1/H_20 = 0.27795 for rank 0, half of that for rank 1.
        assert!((z.p(0) - 0.277_95).abs() < 1e-4, "{}", z.p(0));
        assert!((z.p(1) / z.p(0) - 0.5).abs() < 1e-9);
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_9), 19);
        let mut rng = Rng::new(7);
        let mut counts = [0u32; 20];
        for _ in 0..100_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        let f0 = f64::from(counts[0]) / 100_000.0;
        assert!((f0 - z.p(0)).abs() < 0.01, "rank 0 drawn {f0}");
        assert!(counts[0] > counts[5] && counts[5] > counts[19]);
        let u = Zipf::new(4, 0.0);
        assert!((0..4).all(|i| (u.p(i) - 0.25).abs() < 1e-12));
    }

    #[test]
    fn sizes_span_the_range() {
        let s = doc_sizes(20, 200, 1 << 20, 3);
        assert_eq!(s.len(), 20);
        assert_eq!(*s.iter().min().unwrap(), 200);
        assert_eq!(*s.iter().max().unwrap(), 1 << 20);
        let mut sorted = s.clone();
        sorted.sort_unstable();
        assert_ne!(s, sorted, "shuffled");
        for w in sorted.windows(2) {
            let r = w[1] as f64 / w[0] as f64;
            assert!((r - 1.57).abs() < 0.02, "geometric step {r}");
        }
        assert_eq!(doc_sizes(1, 8192, 8192, 0), vec![8192]);
    }

    #[test]
    fn clf_common_and_combined() {
        let c = parse_clf(
            "127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326",
        )
        .unwrap();
        assert_eq!(c.host, "127.0.0.1");
        assert_eq!(c.method, "GET");
        assert_eq!(c.path, "/apache_pb.gif");
        assert_eq!(c.status, 200);
        assert_eq!(c.bytes, 2326);
        // 2000-10-10 20:55:36 UTC.
        assert_eq!(c.time, 971_211_336);
        let d = parse_clf(
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET /a?q=\\\"x y\\\" HTTP/1.1\" 304 - \"http://r/\" \"Mozilla/4.08 [en] (Win98)\"\r\n",
        )
        .unwrap();
        assert_eq!(d.path, "/a?q=\\\"x");
        assert_eq!((d.status, d.bytes), (304, 0));
    }

    #[test]
    fn clf_malformed_lines_are_errors() {
        for l in [
            "",
            "garbage",
            "h - - 10/Oct/2000:13:55:36 +0000 \"GET / HTTP/1.0\" 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000 \"GET / HTTP/1.0\" 200 1",
            "h - - [10/Foo/2000:13:55:36 +0000] \"GET / HTTP/1.0\" 200 1",
            "h - - [32/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.0\" 200 1",
            "h - - [10/Oct/2000:24:55:36 +0000] \"GET / HTTP/1.0\" 200 1",
            "h - - [10/Oct/2000:13:55:36 0000] \"GET / HTTP/1.0\" 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000] GET / HTTP/1.0 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.0 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"\" 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET\" 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET x HTTP/1.0\" 200 1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.0\" 2OO 1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.0\" 200",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.0\" 200 x1",
            "h - - [10/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.0\" 999 1",
        ] {
            assert!(parse_clf(l).is_err(), "accepted {l:?}");
        }
    }

    #[test]
    fn clf_time_round_trips() {
        for t in [0, 897_436_800, 951_782_400, 971_211_336, 1_764_000_000] {
            let s = format_clf_time(t);
            assert_eq!(parse_clf_time(&s).unwrap(), t, "{s}");
        }
        // 2000-02-29 (leap day) exists; 1998 had none but the parser does
        // not validate day-of-month beyond 31, so only the format matters.
        assert_eq!(format_clf_time(951_782_400), "29/Feb/2000:00:00:00 +0000");
    }

    #[test]
    fn trace_counts_and_skips() {
        let log = "\
a - - [10/Oct/2000:13:55:36 +0000] \"GET /x HTTP/1.0\" 200 100
this line is broken
a - - [10/Oct/2000:13:55:37 +0000] \"GET /y HTTP/1.0\" 200 50
a - - [10/Oct/2000:13:55:38 +0000] \"POST /x HTTP/1.0\" 200 10

a - - [10/Oct/2000:13:55:39 +0000] \"GET /x HTTP/1.0\" 304 -
a - - [10/Oct/2000:13:55:40 +0000] \"GET /z HTTP/1.0\" 404 9
\x01 control junk
a - - [10/Oct/2000:13:55:41 +0000] \"GET /z HTTP/1.0\" 200 70
";
        let t = Trace::from_log(log.as_bytes(), None).unwrap();
        assert_eq!(t.docs, vec![0, 1, 0, 2]);
        assert_eq!(t.sizes, vec![100, 50, 70]);
        assert_eq!((t.lines, t.malformed, t.skipped, t.urls), (8, 2, 2, 3));
        assert_eq!(t.first_errors[0].0, 2);
        let bytes = b"a - - [10/Oct/2000:13:55:36 +0000] \"GET /x HTTP/1.0\" 200 1\n\xff\xfe\n";
        let t = Trace::from_log(&bytes[..], None).unwrap();
        assert_eq!(
            (t.malformed, t.first_errors[0].1.as_str()),
            (1, "not UTF-8")
        );
        let t = Trace::from_log(log.as_bytes(), Some(2)).unwrap();
        assert_eq!(t.docs, vec![0, 1, 0, 0]);
    }

    #[test]
    fn wc98_log_parses_with_its_shape() {
        let cfg = Wc98 {
            requests: 20_000,
            urls: 2000,
            malformed: 8,
            ..Wc98::default()
        };
        let mut out = Vec::new();
        gen_wc98(&mut out, &cfg).unwrap();
        let t = Trace::from_log(&out[..], None).unwrap();
        assert_eq!(t.lines, 20_000);
        assert_eq!(t.malformed, 8);
        assert!(t.skipped > 0 && t.skipped < 400, "404s: {}", t.skipped);
        assert!(t.urls > 500 && t.urls <= 2000, "{} urls", t.urls);
        // Zipf: the most requested URL gets far more than 1/urls.
        let mut counts = vec![0u32; t.urls];
        for &d in &t.docs {
            counts[d as usize] += 1;
        }
        let max = *counts.iter().max().unwrap() as f64 / t.docs.len() as f64;
        assert!(max > 0.02, "top URL share {max}");
        let big = t.sizes.iter().filter(|&&s| s > 100_000).count();
        assert!(big > 0 && *t.sizes.iter().max().unwrap() <= 1 << 20);
        // Time goes forward.
        let times: Vec<i64> = String::from_utf8(out)
            .unwrap()
            .lines()
            .filter_map(|l| parse_clf(l).ok())
            .map(|e| e.time)
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert!(times[0] >= cfg.start);
    }

    #[test]
    fn update_log_and_stale_verdicts() {
        let log = "100 3 5\n200 3 6\nnot a line\n300 3 7\n150 4 9\n\n1 2\n";
        let l = UpdateLog::read(log.as_bytes()).unwrap();
        assert_eq!((l.lines, l.bad_lines, l.commits()), (6, 2, 4));
        assert_eq!(l.required(3, 100), None);
        assert_eq!(l.required(3, 101), Some(5));
        assert_eq!(l.required(3, 250), Some(6));
        assert_eq!(l.required(3, 1000), Some(7));
        assert_eq!(l.required(9, 1000), None);
        assert_eq!(judge(&l, 3, 250, Some(6)), Verdict::Fresh);
        assert_eq!(judge(&l, 3, 250, Some(7)), Verdict::Fresh);
        assert_eq!(
            judge(&l, 3, 301, Some(6)),
            Verdict::Stale {
                served: 6,
                required: 7
            }
        );
        assert_eq!(judge(&l, 3, 301, None), Verdict::Unversioned);
        assert_eq!(judge(&l, 3, 50, Some(5)), Verdict::NoLogEntry);
        // Out-of-order lines (two updaters) are sorted.
        let l = UpdateLog::read("300 1 8\n100 1 7\n".as_bytes()).unwrap();
        assert_eq!(l.required(1, 200), Some(7));
        // Two shards: shard 0's log counts for even documents only.
        let l = UpdateLog::read_sharded(vec![
            "100 0 5\n100 1 900\n".as_bytes(),
            "100 0 900\n100 1 6\n".as_bytes(),
        ])
        .unwrap();
        assert_eq!((l.required(0, 200), l.required(1, 200)), (Some(5), Some(6)));
    }

    #[test]
    fn timing_header() {
        assert_eq!(
            parse_timing("check=12;fetch=0; module=3;total=40;bad;x=y"),
            vec![("check", 12), ("fetch", 0), ("module", 3), ("total", 40)]
        );
    }
}
