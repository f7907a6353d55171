//! `rhttp get -r` / `-p`: the crawl of the library's [`rhttp::crawl`]
//! driven over one session, as `wget -r` would fetch it.
//!
//! Order of work: robots.txt first (a plain GET on the crawl's HTTP
//! connection, unless `-e robots=off`), then one level of the crawl at a
//! time, each level's GETs pipelined ([`fetch`]) over the same keep-alive
//! HTTP connection and its one RDMA connection (the session lives for the
//! whole crawl; a new one is opened only when the server closes the
//! connection); then the level's HTML pages are read back from disk for
//! their links. Objects are saved as wget saves them: `-P DIR`, then the
//! host directory (`HOST[:PORT]`, unless `-nH`), then the URL's path
//! ([`rhttp::links::local_path`]); an error answer (4xx, 5xx) is not kept.
//! Each object prints its line as it completes; the end prints wget's
//! `Downloaded: N files, X in Ys (Z)` (wget's units: K, M = 2^10, 2^20
//! bytes).

use std::collections::HashMap;

use rhttp::crawl::{Config, Crawl, Skipped};
use rhttp::robots::{self, Robots};

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use rhttp::http::Url;

use crate::cli::{Args, GetScheme};
use crate::get::{plain_get, GetHooks, GetOpts, Job};
use crate::pipeline::fetch;
use crate::session::{session_for, Session};
use crate::settings::Res;
use crate::stats::{print_stats, report, take_fetched, Fetched};

/// The largest page whose links are read (a larger one is saved but not
/// scanned).
const MAX_PAGE: u64 = 16 << 20;

/// Where `url` is saved.
fn out_path(opts: &GetOpts, url: &Url) -> PathBuf {
    let mut p = opts.dir.clone();
    if opts.crawl.host_dirs {
        p.push(rhttp::links::host_dir(url));
    }
    p.join(rhttp::links::local_path(url))
}

/// `rhttp get -r` / `-p` over `urls` (one host).
pub(super) fn cmd_crawl(
    a: &Args,
    urls: &[String],
    scheme: GetScheme,
    hooks: &GetHooks,
    opts: &GetOpts,
) -> Res<bool> {
    let c = &opts.crawl;
    let seeds = urls
        .iter()
        .map(|u| Url::parse(u))
        .collect::<Res<Vec<Url>>>()?;
    let mut crawl = Crawl::new(
        Config {
            recursive: opts.recursive,
            depth: c.level,
            page_requisites: c.page_requisites,
            no_parent: c.no_parent,
            max_files: c.max_files,
        },
        &seeds,
    )?;
    let depth = if hooks.any() { 1 } else { opts.depth };
    let started = Instant::now();
    let mut session: Option<Session> = None;
    if c.robots {
        crawl.set_robots(fetch_robots(a, &mut session, &seeds[0])?);
    }
    let (mut files, mut bytes, mut all_ok) = (0u64, 0u64, true);
    loop {
        let level = crawl.next_level();
        if level.is_empty() {
            break;
        }
        let jobs: Vec<Job> = level
            .iter()
            .map(|it| Job {
                out: out_path(opts, &it.url),
                url: it.url.clone(),
            })
            .collect();
        tracing::debug!(
            depth = level[0].depth,
            urls = jobs.len(),
            "fetching a level"
        );
        take_fetched();
        all_ok &= fetch(a, &mut session, &jobs, scheme, hooks, depth, opts)?;
        let done: HashMap<String, Fetched> = take_fetched()
            .into_iter()
            .map(|f| (f.path.clone(), f))
            .collect();
        for (it, job) in level.iter().zip(&jobs) {
            match done.get(&it.url.path) {
                Some(f) if (200..300).contains(&f.status) => {
                    files += 1;
                    bytes += f.bytes;
                    if f.html && crawl.wants_links(it) {
                        if let Some(html) = read_page(&job.out) {
                            let n = crawl.add_links(it, &html);
                            tracing::debug!(page = %it.url.path, queued = n, "links");
                        }
                    }
                }
                // wget keeps no error answers.
                _ => {
                    let _ = std::fs::remove_file(&job.out);
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    report_skipped(&crawl.skipped, c.max_files);
    report(format_args!(
        "Downloaded: {files} files, {} in {} ({})",
        human_size(bytes),
        human_secs(secs),
        wget_rate(bytes as f64 / secs.max(1e-9))
    ));
    print_stats(opts.stats, started);
    Ok(all_ok)
}

/// Collects at most [`robots::MAX_BYTES`] of a body, then fails (the rest
/// is not read: the connection is then given up).
struct Capped(Vec<u8>);

impl Write for Capped {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let room = robots::MAX_BYTES - self.0.len();
        if room == 0 && !b.is_empty() {
            return Err(io::Error::other(format!(
                "longer than {} bytes",
                robots::MAX_BYTES
            )));
        }
        let n = b.len().min(room);
        self.0.extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `GET /robots.txt` over plain HTTP on the crawl's connection (not
/// counted in `--stats`' requests), and its rules (RFC 9309 §2.3.1).
fn fetch_robots(a: &Args, session: &mut Option<Session>, seed: &Url) -> Res<Robots> {
    let url = Url {
        path: "/robots.txt".into(),
        ..seed.clone()
    };
    let s = session_for(session, &url, a)?;
    let mut body = Capped(Vec::new());
    let (status, why) = match plain_get(s, &url, &mut body, a) {
        Ok(o) => (Some(o.status), None),
        Err(e) => {
            // Mid-body or no answer: this connection is done with.
            *session = None;
            (None, Some(e))
        }
    };
    let r = match (status, why) {
        (None, Some(e)) if body.0.len() >= robots::MAX_BYTES => {
            tracing::warn!(
                "robots.txt: {e}; the first {} bytes are used",
                robots::MAX_BYTES
            );
            Robots::parse(&body.0)
        }
        _ => Robots::from_response(status, &body.0),
    };
    let verdict = match status {
        Some(200..=299) => format!("{} rules for rhttp", r.rules()),
        Some(300..=499) => "none: everything allowed (RFC 9309 2.3.1.3)".into(),
        _ if r.rules() > 0 => format!("{} rules for rhttp (truncated)", r.rules()),
        _ => "unreachable: only the given URLs are fetched (RFC 9309 2.3.1.4)".into(),
    };
    report(format_args!(
        "GET http://{}/robots.txt: {}, {verdict}; -e robots=off ignores it",
        url.host_header(),
        status.map_or_else(|| "no answer".to_string(), |s| s.to_string())
    ));
    if r.dropped > 0 {
        tracing::warn!(
            "robots.txt: more than {} rules apply to rhttp; {} ignored",
            robots::MAX_RULES,
            r.dropped
        );
    }
    Ok(r)
}

/// The links the crawl did not follow, by reason, on one line.
fn report_skipped(k: &Skipped, max_files: usize) {
    let parts: Vec<String> = [
        (k.elsewhere, "to other hosts, ports or schemes"),
        (k.depth, "beyond --level"),
        (k.parent, "above the start (--no-parent)"),
        (k.robots, "disallowed by robots.txt"),
        (k.too_long, "too long"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, why)| format!("{n} {why}"))
    .collect();
    if !parts.is_empty() {
        report(format_args!(
            "rhttp: links not followed: {}",
            parts.join(", ")
        ));
    }
    if k.max_files > 0 {
        report(format_args!(
            "rhttp: --max-files {max_files} reached: {} more links not followed (raise --max-files to go on)",
            k.max_files
        ));
    }
}

/// The saved page, if it is there and small enough to scan for links.
fn read_page(path: &PathBuf) -> Option<Vec<u8>> {
    let f = File::open(path).ok()?;
    if f.metadata().ok()?.len() > MAX_PAGE {
        tracing::warn!(page = %path.display(), "page larger than {MAX_PAGE} bytes: links not followed");
        return None;
    }
    let mut v = Vec::new();
    f.take(MAX_PAGE).read_to_end(&mut v).ok()?;
    Some(v)
}

/// A byte count as wget's `human_readable` writes it: `512`, `9.8K`,
/// `5.0M`, `12M`, `1.1G` (powers of 1024; one decimal below 10).
fn human_size(n: u64) -> String {
    if n < 1024 {
        return n.to_string();
    }
    let mut v = n as f64;
    for unit in ["K", "M", "G", "T", "P"] {
        v /= 1024.0;
        if v < 1024.0 || unit == "P" {
            return if v < 10.0 {
                format!("{v:.1}{unit}")
            } else {
                format!("{v:.0}{unit}")
            };
        }
    }
    unreachable!("the loop returns at P")
}

/// Seconds as wget writes a download time: `0.004s`, `0.12s`, `3.4s`,
/// `1m 5s`.
fn human_secs(s: f64) -> String {
    if s < 0.1 {
        format!("{s:.3}s")
    } else if s < 10.0 {
        format!("{s:.2}s")
    } else if s < 100.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m {}s", (s / 60.0) as u64, (s % 60.0) as u64)
    }
}

/// A rate as wget's `retr_rate` writes it: B/s, KB/s, MB/s or GB/s in
/// powers of 1024, 0 to 2 decimals by magnitude.
fn wget_rate(bps: f64) -> String {
    let (mut v, mut unit) = (bps, "B/s");
    for u in ["KB/s", "MB/s", "GB/s"] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    let prec = if v >= 99.95 {
        0
    } else if v >= 9.995 {
        1
    } else {
        2
    };
    format!("{v:.prec$} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_wget_writes_them() {
        assert_eq!(human_size(512), "512");
        assert_eq!(human_size(10_000), "9.8K");
        assert_eq!(human_size(5 << 20), "5.0M");
        assert_eq!(human_size(12 << 20), "12M");
        assert_eq!(human_size(1_200_000_000), "1.1G");
        assert_eq!(human_secs(0.004), "0.004s");
        assert_eq!(human_secs(0.123), "0.12s");
        assert_eq!(human_secs(65.0), "65.0s");
        assert_eq!(human_secs(125.0), "2m 5s");
        assert_eq!(wget_rate(500.0), "500 B/s");
        assert_eq!(wget_rate(5.0 * 1048576.0), "5.00 MB/s");
        assert_eq!(wget_rate(716.0 * 1048576.0), "716 MB/s");
        assert_eq!(wget_rate(1.5 * 1073741824.0), "1.50 GB/s");
    }

    #[test]
    fn robots_body_is_capped() {
        let mut c = Capped(Vec::new());
        assert!(c.write_all(&vec![b'a'; robots::MAX_BYTES]).is_ok());
        assert!(c.write_all(b"more").is_err());
        assert_eq!(c.0.len(), robots::MAX_BYTES);
    }
}
