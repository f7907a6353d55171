//! The crawl of `rhttp get -r` / `-p` without any I/O: which URLs to
//! fetch, in what order, and which links of a fetched page to follow, as
//! wget's `recur.c` decides (`-l`, `-p`, `-np`, robots.txt), with bounds
//! a hostile server cannot push past.
//!
//! Breadth first: the seeds are depth 0, the links of a page at depth d
//! are depth d + 1, and [`Crawl::next_level`] hands out one depth at a
//! time (the driver pipelines a whole level over its one connection).
//! A link is fetched when all of these hold:
//!
//! 1. it resolves to an `http` URL on the seeds' host and port (one host
//!    only: rhttp never follows a link to another host, port or scheme);
//! 2. its depth is within `-l` (wget: `-l 1` is the page and what it
//!    links), or, with `-p`, it is a page requisite ([`LinkKind`]) of a
//!    page within the depth (fetched, but its own links are not followed);
//! 3. with `--no-parent`, its path is below a seed's directory, unless it
//!    is a page requisite with `-p` (as wget);
//! 4. it was not queued before: the visited set holds the [`key`] of
//!    every URL queued (normalized, RFC 3986 §6.2.2), so a link loop ends;
//! 5. robots.txt allows it (seeds are fetched regardless, as wget does);
//! 6. fewer than `--max-files` URLs were queued so far.
//!
//! Bounds: the visited set and the queue hold at most `max_files` URLs,
//! whatever the pages contain; a link longer than [`MAX_LINK`] bytes is
//! skipped; the depth bounds the levels (`-l inf` is bounded by
//! `max_files` alone). Once `max_files` is reached the rest of a page is
//! only counted, not resolved.

use std::collections::{HashSet, VecDeque};

use crate::http::Url;
use crate::links::{key, normalize, resolve, scan, LinkKind};
use crate::robots::Robots;

/// Links longer than this (bytes, before resolution) are skipped.
pub const MAX_LINK: usize = 4096;

/// How far a crawl goes.
#[derive(Clone, Debug)]
pub struct Config {
    /// Follow links (`-r`); without it only the seeds (and with
    /// `page_requisites` their requisites) are fetched.
    pub recursive: bool,
    /// `-l N`: the deepest level fetched; `None` for `-l inf` (or 0).
    pub depth: Option<u32>,
    /// `-p`: the page requisites of every page fetched within the depth.
    pub page_requisites: bool,
    /// `-np`: never ascend above a seed's directory.
    pub no_parent: bool,
    /// `--max-files`: at most this many URLs queued, seeds included.
    pub max_files: usize,
}

/// A URL to fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub url: Url,
    pub depth: u32,
    /// Fetched only as a page requisite past the depth limit (`-p`): its
    /// links are not followed.
    pub leaf: bool,
}

/// Links not followed, by reason (for the summary).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Another host, port or scheme, or not a URL at all.
    pub elsewhere: u64,
    /// Beyond `-l`.
    pub depth: u64,
    /// Above a seed's directory (`--no-parent`).
    pub parent: u64,
    /// Disallowed by robots.txt.
    pub robots: u64,
    /// Links seen after `max_files` URLs were queued.
    pub max_files: u64,
    /// Longer than [`MAX_LINK`].
    pub too_long: u64,
    /// Queued before (the same normalized URL).
    pub duplicate: u64,
}

/// The state of one crawl.
#[derive(Debug)]
pub struct Crawl {
    cfg: Config,
    host: String,
    port: u16,
    /// The seeds' directories (`--no-parent`), each ending in '/'.
    parents: Vec<String>,
    visited: HashSet<String>,
    queue: VecDeque<Item>,
    robots: Robots,
    pub skipped: Skipped,
}

impl Crawl {
    /// A crawl from `seeds`, which must all be on one host and port.
    pub fn new(cfg: Config, seeds: &[Url]) -> Result<Crawl, String> {
        let first = seeds.first().ok_or("no URL to start from")?;
        let first = normalize(first);
        if let Some(other) = seeds
            .iter()
            .find(|u| !u.host.eq_ignore_ascii_case(&first.host) || u.port != first.port)
        {
            return Err(format!(
                "-r and -p crawl one host, and {}:{} is not {}:{}; run rhttp once per host",
                other.host, other.port, first.host, first.port
            ));
        }
        let mut c = Crawl {
            host: first.host.clone(),
            port: first.port,
            parents: Vec::new(),
            visited: HashSet::new(),
            queue: VecDeque::new(),
            robots: Robots::allow_all(),
            skipped: Skipped::default(),
            cfg,
        };
        for s in seeds {
            let u = normalize(s);
            let p = u.path.split('?').next().unwrap_or("/");
            c.parents
                .push(p[..p.rfind('/').map_or(0, |i| i) + 1].to_string());
            if c.visited.len() >= c.cfg.max_files.max(1) {
                c.skipped.max_files += 1;
            } else if c.visited.insert(key(&u)) {
                c.queue.push_back(Item {
                    url: u,
                    depth: 0,
                    leaf: !(c.cfg.recursive || c.cfg.page_requisites),
                });
            } else {
                c.skipped.duplicate += 1;
            }
        }
        Ok(c)
    }

    /// The host's robots.txt rules, for every link from now on.
    pub fn set_robots(&mut self, r: Robots) {
        self.robots = r;
    }

    /// The URLs of the next depth, in the order they were found (empty
    /// when the crawl is over).
    pub fn next_level(&mut self) -> Vec<Item> {
        let Some(d) = self.queue.front().map(|i| i.depth) else {
            return Vec::new();
        };
        let n = self.queue.iter().take_while(|i| i.depth == d).count();
        self.queue.drain(..n).collect()
    }

    /// URLs queued so far (seeds included): at most `max_files`.
    pub fn queued(&self) -> usize {
        self.visited.len()
    }

    /// Whether links of `item`'s page can lead anywhere (if not, the
    /// driver need not read the page).
    pub fn wants_links(&self, item: &Item) -> bool {
        !item.leaf && (self.within_depth(item.depth + 1) || self.cfg.page_requisites)
    }

    fn within_depth(&self, d: u32) -> bool {
        self.cfg.recursive && self.cfg.depth.is_none_or(|max| d <= max)
    }

    /// Queue the links of the page `page` (fetched, HTML) as the rules of
    /// the module doc allow; returns how many were queued.
    pub fn add_links(&mut self, page: &Item, html: &[u8]) -> usize {
        if !self.wants_links(page) {
            return 0;
        }
        let depth = page.depth + 1;
        let follow = self.within_depth(depth);
        let mut added = 0;
        scan(html, |href, kind| {
            if self.visited.len() >= self.cfg.max_files {
                self.skipped.max_files += 1;
                return;
            }
            if href.len() > MAX_LINK {
                self.skipped.too_long += 1;
                return;
            }
            let requisite = self.cfg.page_requisites && kind == LinkKind::Requisite;
            if !follow && !requisite {
                self.skipped.depth += 1;
                return;
            }
            let Some(u) = resolve(&page.url, href) else {
                self.skipped.elsewhere += 1;
                return;
            };
            if !u.host.eq_ignore_ascii_case(&self.host) || u.port != self.port {
                self.skipped.elsewhere += 1;
                return;
            }
            if self.cfg.no_parent
                && !requisite
                && !self.parents.iter().any(|p| u.path.starts_with(p.as_str()))
            {
                self.skipped.parent += 1;
                return;
            }
            let k = key(&u);
            if self.visited.contains(&k) {
                self.skipped.duplicate += 1;
                return;
            }
            if !self.robots.allowed(&u.path) {
                self.skipped.robots += 1;
                return;
            }
            self.visited.insert(k);
            self.queue.push_back(Item {
                url: u,
                depth,
                leaf: !follow,
            });
            added += 1;
        });
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            recursive: true,
            depth: Some(5),
            page_requisites: false,
            no_parent: false,
            max_files: 10_000,
        }
    }

    fn url(p: &str) -> Url {
        Url::parse(&format!("http://h:8080{p}")).unwrap()
    }

    fn paths(items: &[Item]) -> Vec<&str> {
        items.iter().map(|i| i.url.path.as_str()).collect()
    }

    /// Crawl a site given as (path, page) pairs; the paths fetched, in order.
    fn crawl(cfg: Config, seed: &str, site: &[(&str, &str)]) -> (Vec<String>, Skipped) {
        let mut c = Crawl::new(cfg, &[url(seed)]).unwrap();
        let mut got = Vec::new();
        loop {
            let level = c.next_level();
            if level.is_empty() {
                break;
            }
            for it in &level {
                got.push(it.url.path.clone());
                if let Some((_, html)) = site.iter().find(|(p, _)| *p == it.url.path) {
                    c.add_links(it, html.as_bytes());
                }
            }
        }
        (got, c.skipped)
    }

    #[test]
    fn breadth_first_within_the_depth() {
        let site = [
            (
                "/",
                r#"<a href="a.html">a</a><img src="i.png"><a href=http://x/>x</a>"#,
            ),
            ("/a.html", r#"<a href="b.html">b</a><a href="/">home</a>"#),
            ("/b.html", r#"<a href="c.html">c</a>"#),
            ("/c.html", r#"<a href="d.html">d</a>"#),
        ];
        let (got, sk) = crawl(
            Config {
                depth: Some(2),
                ..cfg()
            },
            "/",
            &site,
        );
        assert_eq!(got, ["/", "/a.html", "/i.png", "/b.html"]);
        assert_eq!(sk.elsewhere, 1);
        assert_eq!(sk.duplicate, 1);
        assert_eq!(
            sk.depth, 0,
            "b.html, at the last level, is not even scanned"
        );
        let (got, _) = crawl(
            Config {
                depth: None,
                ..cfg()
            },
            "/",
            &site,
        );
        assert_eq!(got.len(), 6, "-l inf: {got:?}");
        let (got, _) = crawl(
            Config {
                depth: Some(0),
                ..cfg()
            },
            "/",
            &site,
        );
        assert_eq!(
            got,
            ["/"],
            "-l 0 here means the seed only; the CLI maps 0 to inf as wget"
        );
    }

    #[test]
    fn page_requisites_past_the_depth_and_alone() {
        let site = [
            ("/", r#"<a href="a.html">a</a><img src="top.png">"#),
            (
                "/a.html",
                r#"<a href="b.html">b</a><img src="a.png"><link rel=stylesheet href=a.css><iframe src=f.html></iframe>"#,
            ),
            ("/f.html", r#"<img src="inner.png">"#),
        ];
        let c1 = Config {
            depth: Some(1),
            page_requisites: true,
            ..cfg()
        };
        let (got, _) = crawl(c1, "/", &site);
        // a.html's requisites come although they are at depth 2; the
        // iframe is fetched as one but not followed; b.html is not.
        assert_eq!(
            got,
            ["/", "/a.html", "/top.png", "/a.png", "/a.css", "/f.html"]
        );
        // -p without -r: the page and its requisites only.
        let c2 = Config {
            recursive: false,
            page_requisites: true,
            ..cfg()
        };
        let (got, _) = crawl(c2, "/a.html", &site);
        assert_eq!(got, ["/a.html", "/a.png", "/a.css", "/f.html"]);
        // Neither: the seed alone.
        let c3 = Config {
            recursive: false,
            ..cfg()
        };
        assert_eq!(crawl(c3, "/a.html", &site).0, ["/a.html"]);
    }

    #[test]
    fn no_parent_keeps_below_the_seed_directory_except_requisites() {
        let site = [(
            "/d/",
            r#"<a href="../up.html">up</a><a href="sub/x.html">x</a><a href="/d">no slash</a><img src="/img/logo.png">"#,
        )];
        let c = Config {
            no_parent: true,
            ..cfg()
        };
        let (got, sk) = crawl(c.clone(), "/d/", &site);
        assert_eq!(got, ["/d/", "/d/sub/x.html"]);
        assert_eq!(sk.parent, 3);
        let (got, _) = crawl(
            Config {
                page_requisites: true,
                ..c
            },
            "/d/",
            &site,
        );
        assert_eq!(got, ["/d/", "/d/sub/x.html", "/img/logo.png"]);
        // The directory of /d/page.html is /d/.
        let site = [(
            "/d/page.html",
            r#"<a href="other.html">o</a><a href="/e/">e</a>"#,
        )];
        let (got, _) = crawl(
            Config {
                no_parent: true,
                ..cfg()
            },
            "/d/page.html",
            &site,
        );
        assert_eq!(got, ["/d/page.html", "/d/other.html"]);
    }

    #[test]
    fn robots_txt_applies_to_links_not_seeds() {
        let site = [(
            "/private/",
            r#"<a href="a.html">a</a><a href="/pub/b.html">b</a>"#,
        )];
        let mut c = Crawl::new(cfg(), &[url("/private/")]).unwrap();
        c.set_robots(Robots::parse(b"User-agent: *\nDisallow: /private/\n"));
        let l0 = c.next_level();
        assert_eq!(paths(&l0), ["/private/"], "the seed is fetched regardless");
        c.add_links(&l0[0], site[0].1.as_bytes());
        assert_eq!(paths(&c.next_level()), ["/pub/b.html"]);
        assert_eq!(c.skipped.robots, 1);
    }

    #[test]
    fn a_link_loop_ends_by_the_visited_set() {
        // Two pages linking each other under several spellings of each URL.
        let site = [
            (
                "/a.html",
                r#"<a href="b.html">b</a><a href="./b.html#x">b</a><a href="/%62.html">b</a><a href="HTTP://H:8080/a.html">a</a>"#,
            ),
            (
                "/b.html",
                r#"<a href="a.html">a</a><a href="/./a.html">a</a><a href="%61.html">a</a>"#,
            ),
        ];
        let (got, sk) = crawl(
            Config {
                depth: None,
                ..cfg()
            },
            "/a.html",
            &site,
        );
        assert_eq!(got, ["/a.html", "/b.html"]);
        assert_eq!(sk.duplicate, 6);
    }

    #[test]
    fn a_growing_loop_ends_by_the_depth() {
        // Every page links a deeper one (/x/, /x/x/, ...): new URLs forever.
        let mut c = Crawl::new(
            Config {
                depth: Some(5),
                ..cfg()
            },
            &[url("/x/")],
        )
        .unwrap();
        let mut fetched = 0;
        loop {
            let level = c.next_level();
            if level.is_empty() {
                break;
            }
            for it in &level {
                fetched += 1;
                c.add_links(it, br#"<a href="x/">deeper</a>"#);
            }
        }
        assert_eq!(fetched, 6, "depths 0..=5");
        // -l inf: max_files bounds it.
        let mut c = Crawl::new(
            Config {
                depth: None,
                max_files: 50,
                ..cfg()
            },
            &[url("/x/")],
        )
        .unwrap();
        let mut fetched = 0;
        while let Some(it) = c.next_level().pop() {
            fetched += 1;
            c.add_links(&it, br#"<a href="x/">deeper</a>"#);
        }
        assert_eq!(fetched, 50);
    }

    #[test]
    fn a_million_links_queue_at_most_max_files() {
        let mut html = String::with_capacity(14_000_000);
        for i in 0..1_000_000 {
            html.push_str(&format!("<a href=f{i}>"));
        }
        let mut c = Crawl::new(
            Config {
                max_files: 10_000,
                ..cfg()
            },
            &[url("/")],
        )
        .unwrap();
        let seed = c.next_level();
        let t = std::time::Instant::now();
        let added = c.add_links(&seed[0], html.as_bytes());
        let took = t.elapsed();
        assert_eq!(added, 9_999);
        assert_eq!(c.queued(), 10_000);
        assert_eq!(c.skipped.max_files, 1_000_000 - 9_999);
        assert_eq!(c.next_level().len(), 9_999);
        // Not a timing assertion: printed for the record.
        eprintln!("a page of 1e6 links scanned in {took:?}");
    }

    #[test]
    fn long_links_and_other_hosts_are_skipped() {
        let long = format!("<a href=\"{}\">", "a".repeat(MAX_LINK + 1));
        let html = format!("{long}<a href=http://other:8080/x><a href=//h:8081/y><a href=ok>");
        let mut c = Crawl::new(cfg(), &[url("/")]).unwrap();
        let seed = c.next_level();
        c.add_links(&seed[0], html.as_bytes());
        assert_eq!(paths(&c.next_level()), ["/ok"]);
        assert_eq!(c.skipped.too_long, 1);
        assert_eq!(c.skipped.elsewhere, 2);
    }

    #[test]
    fn seeds_of_two_hosts_are_refused() {
        let e = Crawl::new(cfg(), &[url("/"), Url::parse("http://other/").unwrap()]).unwrap_err();
        assert!(e.contains("one host"), "{e}");
        // Same host in other case: one crawl; a repeated seed once.
        let c = Crawl::new(cfg(), &[url("/"), Url::parse("http://H:8080/./").unwrap()]).unwrap();
        assert_eq!(c.queued(), 1);
    }
}
