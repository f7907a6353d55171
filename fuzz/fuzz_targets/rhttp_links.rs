//! Fuzz target: rhttp's link finder for `rhttp get -r` (tools/rhttp/src/links.rs).
//! The first byte picks the page's URL, the rest is the page. Nothing may
//! panic, and every link `page_links` returns must keep the promises the
//! recursive mode relies on: same host and port as the page (RFC 3986 §5.2
//! resolution never leaves the server), an absolute path without "." or
//! ".." segments (§5.2.4 applied, so applying it again changes nothing),
//! each path once and never the page itself, and a local file name made
//! only of normal components (never outside the output directory).
#![no_main]

use std::collections::HashSet;
use std::path::Component;

use libfuzzer_sys::fuzz_target;
use rhttp::http::Url;
use rhttp::links::{extract, local_path, page_links, remove_dot_segments, resolve};

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
    for u in &links {
        assert!(u.host.eq_ignore_ascii_case(&base.host), "{u:?} left {base:?}");
        assert_eq!(u.port, base.port, "{u:?}");
        assert_ne!(u.path, base.path, "the page itself is not a link");
        assert!(seen.insert(u.path.clone()), "{} twice", u.path);
        let p = u.path.split('?').next().unwrap();
        assert!(p.starts_with('/'), "{u:?}");
        assert_eq!(remove_dot_segments(p), p, "dot segments left in {u:?}");
        let local = local_path(u);
        assert!(local.components().count() > 0, "{u:?}");
        assert!(
            local.components().all(|c| matches!(c, Component::Normal(_))),
            "{u:?} -> {local:?}"
        );
    }
    // resolve() on the raw bytes as one href: the same promises, no panic.
    if let Ok(href) = std::str::from_utf8(html) {
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
