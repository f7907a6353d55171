//! Fuzz target: rhttp's link finder for `rhttp get -r` (tools/rhttp/src/links.rs).
//! The first byte picks the page's URL, the rest is the page. Nothing may
//! panic, and every link `page_links` returns must keep the promises the
//! recursive mode relies on: same host and port as the page (RFC 3986 §5.2
//! resolution never leaves the server), an absolute path without "." or
//! ".." segments (§5.2.4 applied, so applying it again changes nothing),
//! each path once and never the page itself, and a local file name made
//! only of normal components (never outside the output directory).
//! Also on the same bytes: URL normalization (RFC 3986 §6.2.2) is
//! idempotent; the crawl (`rhttp get -r`'s frontier) queues at most
//! `max_files` URLs, all on the page's host; and robots.txt (RFC 9309)
//! parses and matches without a panic.
#![no_main]

use std::collections::HashSet;
use std::path::Component;

use libfuzzer_sys::fuzz_target;
use rhttp::crawl::{Config, Crawl};
use rhttp::http::Url;
use rhttp::links::{extract, key, local_path, normalize, page_links, remove_dot_segments, resolve};
use rhttp::robots::Robots;

const BASES: &[&str] = &[
    "http://127.0.0.1:8080/site/page.html",
    "http://Example.COM/",
    "http://[::1]:81/a/b/c/?q=1",
    "http://h/..",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, html)) = data.split_first() else {
        return;
    };
    let base = Url::parse(BASES[usize::from(pick) % BASES.len()]).unwrap();
    let hrefs = extract(html);
    let links = page_links(&base, html);
    assert!(links.len() <= hrefs.len());
    let mut seen = HashSet::new();
    for (u, _) in &links {
        assert!(
            u.host.eq_ignore_ascii_case(&base.host),
            "{u:?} left {base:?}"
        );
        assert_eq!(u.port, base.port, "{u:?}");
        assert_ne!(key(u), key(&base), "the page itself is not a link");
        assert_eq!(&normalize(u), u, "links come normalized");
        assert!(seen.insert(u.path.clone()), "{} twice", u.path);
        let p = u.path.split('?').next().unwrap();
        assert!(p.starts_with('/'), "{u:?}");
        assert_eq!(remove_dot_segments(p), p, "dot segments left in {u:?}");
        let local = local_path(u);
        assert!(local.components().count() > 0, "{u:?}");
        assert!(
            local
                .components()
                .all(|c| matches!(c, Component::Normal(_))),
            "{u:?} -> {local:?}"
        );
    }
    // The crawl: bounded by max_files, one host.
    let mut crawl = Crawl::new(
        Config {
            recursive: true,
            depth: Some(3),
            page_requisites: pick & 0x80 != 0,
            no_parent: pick & 0x40 != 0,
            max_files: 8,
        },
        std::slice::from_ref(&base),
    )
    .unwrap();
    // robots.txt: the page as one (parsed once: it is the costliest step).
    let robots = Robots::parse(html);
    crawl.set_robots(robots.clone());
    let seed = crawl.next_level();
    assert_eq!(seed.len(), 1);
    crawl.add_links(&seed[0], html);
    assert!(crawl.queued() <= 8);
    for it in crawl.next_level() {
        assert!(it.url.host.eq_ignore_ascii_case(&base.host) && it.url.port == base.port);
        assert_eq!(it.depth, 1);
    }
    // robots.txt matched against each link.
    for (u, _) in &links {
        let _ = robots.allowed(&u.path);
    }
    // resolve() on the raw bytes as one href: the same promises, no panic.
    if let Ok(href) = std::str::from_utf8(html) {
        let n = normalize(&Url {
            path: href.to_string(),
            ..base.clone()
        });
        assert_eq!(normalize(&n), n, "normalize is idempotent on {href:?}");
        let _ = robots.allowed(href);
        if let Some(u) = resolve(&base, href) {
            assert!(u.host.eq_ignore_ascii_case(&base.host) && u.port == base.port);
            let p = u.path.split('?').next().unwrap();
            assert_eq!(remove_dot_segments(p), p, "{u:?}");
            assert!(local_path(&u)
                .components()
                .all(|c| matches!(c, Component::Normal(_))));
        }
    }
});
