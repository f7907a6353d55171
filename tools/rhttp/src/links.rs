//! The links of an HTML page, for `rhttp get -r` (like `wget -r -l1`):
//! which URLs a page refers to, resolved against the page's URL, on the
//! same host, and where each is saved under the output directory.
//!
//! A small scanner, not an HTML parser: it finds the start tags `<a>`,
//! `<img>`, `<link>`, `<script>`, `<source>`, `<iframe>` and `<embed>`
//! and takes their `href`/`src` attributes (quoted with `"` or `'`, or
//! unquoted), skipping comments. Everything here is pure and never
//! panics on any input (the page comes from the network).
//!
//! Resolution follows RFC 3986 §5.2 for the forms a page uses (absolute
//! `http://` URLs, network-path `//host/p`, absolute paths `/p`,
//! relative paths), with its `remove_dot_segments` (§5.2.4), so no link
//! can name a file outside the output directory.

use std::path::PathBuf;

use crate::http::Url;

/// Tags whose `href` or `src` names an object the page links.
const TAGS: &[&str] = &["a", "img", "link", "script", "source", "iframe", "embed"];

/// The `href`/`src` attribute values of the link-bearing start tags of
/// `html`, in document order, with the character references `&amp;`,
/// `&quot;`, `&#39;`, `&lt;` and `&gt;` decoded.
pub fn extract(html: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = html[i..].iter().position(|&b| b == b'<') {
        i += off + 1;
        if html[i..].starts_with(b"!--") {
            // A comment runs to "-->" (or to the end).
            match find(&html[i + 3..], b"-->") {
                Some(e) => i += 3 + e + 3,
                None => break,
            }
            continue;
        }
        let name_len = html[i..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        let name = &html[i..i + name_len];
        i += name_len;
        if !TAGS.iter().any(|t| t.as_bytes().eq_ignore_ascii_case(name)) {
            continue;
        }
        // Attributes up to '>'.
        loop {
            while i < html.len() && (html[i].is_ascii_whitespace() || html[i] == b'/') {
                i += 1;
            }
            if i >= html.len() || html[i] == b'>' {
                break;
            }
            let a0 = i;
            while i < html.len()
                && !html[i].is_ascii_whitespace()
                && !matches!(html[i], b'=' | b'>' | b'/')
            {
                i += 1;
            }
            let attr = &html[a0..i];
            while i < html.len() && html[i].is_ascii_whitespace() {
                i += 1;
            }
            if i >= html.len() || html[i] != b'=' {
                if a0 == i {
                    i += 1; // a stray character: step over it
                }
                continue; // an attribute without a value
            }
            i += 1;
            while i < html.len() && html[i].is_ascii_whitespace() {
                i += 1;
            }
            let value = match html.get(i) {
                Some(&q @ (b'"' | b'\'')) => {
                    let v0 = i + 1;
                    let len = html[v0..].iter().position(|&b| b == q);
                    let v1 = len.map_or(html.len(), |l| v0 + l);
                    i = (v1 + 1).min(html.len());
                    &html[v0..v1]
                }
                _ => {
                    let v0 = i;
                    while i < html.len() && !html[i].is_ascii_whitespace() && html[i] != b'>' {
                        i += 1;
                    }
                    &html[v0..i]
                }
            };
            if attr.eq_ignore_ascii_case(b"href") || attr.eq_ignore_ascii_case(b"src") {
                out.push(decode_refs(&String::from_utf8_lossy(value)));
            }
        }
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The few character references that appear in URLs in attributes.
fn decode_refs(s: &str) -> String {
    s.trim()
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// `href` resolved against `base` (RFC 3986 §5.2), if it is an `http`
/// URL on `base`'s host and port; `None` for other schemes (`mailto:`,
/// `https:`, `javascript:`, `data:`), other hosts, and fragment-only
/// references. The fragment is dropped (it never goes to the server).
pub fn resolve(base: &Url, href: &str) -> Option<Url> {
    let href = href.split('#').next().unwrap_or("");
    if href.is_empty() {
        return None;
    }
    let u = if let Some(rest) = href.strip_prefix("//") {
        Url::parse(&format!("http://{rest}")).ok()?
    } else if has_scheme(href) {
        let (scheme, rest) = href.split_once(':')?;
        if !scheme.eq_ignore_ascii_case("http") {
            return None;
        }
        Url::parse(&format!("http:{rest}")).ok()?
    } else {
        let path = if href.starts_with('/') {
            href.to_string()
        } else if let Some(q) = href.strip_prefix('?') {
            format!("{}?{q}", base.path.split('?').next().unwrap_or("/"))
        } else {
            // Merge (§5.2.3): the base path up to its last '/', then href.
            let bp = base.path.split('?').next().unwrap_or("/");
            let dir = &bp[..bp.rfind('/').map_or(0, |i| i + 1)];
            format!("{}{href}", if dir.is_empty() { "/" } else { dir })
        };
        Url {
            host: base.host.clone(),
            port: base.port,
            path,
        }
    };
    if !u.host.eq_ignore_ascii_case(&base.host) || u.port != base.port {
        return None;
    }
    let (p, q) = match u.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (u.path.as_str(), None),
    };
    let mut path = remove_dot_segments(p);
    if let Some(q) = q {
        path.push('?');
        path.push_str(q);
    }
    Some(Url { path, ..u })
}

/// RFC 3986 §3.1: `scheme ":"`, the scheme starting with a letter.
fn has_scheme(s: &str) -> bool {
    match s.find(':') {
        Some(i) if i > 0 => {
            let sch = &s[..i];
            sch.as_bytes()[0].is_ascii_alphabetic()
                && sch
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
                && !sch.contains('/')
        }
        _ => false,
    }
}

/// RFC 3986 §5.2.4 on an absolute path: "." and ".." segments removed,
/// ".." never above the root.
pub fn remove_dot_segments(path: &str) -> String {
    let mut segs: Vec<&str> = Vec::new();
    let parts: Vec<&str> = path.split('/').collect();
    let last = parts.len().saturating_sub(1);
    for (i, s) in parts.iter().enumerate().skip(1) {
        match *s {
            "." => {
                if i == last {
                    segs.push("");
                }
            }
            ".." => {
                segs.pop();
                if i == last {
                    segs.push("");
                }
            }
            s => segs.push(s),
        }
    }
    format!("/{}", segs.join("/"))
}

/// Where `u` is saved under the output directory, like `wget -nH`: its
/// path (after [`remove_dot_segments`], so never outside), `index.html`
/// for a path that ends in '/', the query kept in the name as wget does
/// (with '/' written as `%2F`). Empty segments are skipped.
pub fn local_path(u: &Url) -> PathBuf {
    let (p, q) = match u.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (u.path.as_str(), None),
    };
    let p = remove_dot_segments(p);
    let mut out = PathBuf::new();
    let segs: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
    for s in &segs {
        out.push(s);
    }
    if p.ends_with('/') || segs.is_empty() {
        out.push("index.html");
    }
    if let Some(q) = q {
        let mut name = out
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(format!("?{}", q.replace('/', "%2F")));
        out.set_file_name(name);
    }
    out
}

/// The objects a page links, once each, in document order, without the
/// page itself: [`extract`] then [`resolve`].
pub fn page_links(base: &Url, html: &[u8]) -> Vec<Url> {
    let mut seen = std::collections::HashSet::new();
    seen.insert(base.path.clone());
    extract(html)
        .iter()
        .filter_map(|h| resolve(base, h))
        .filter(|u| seen.insert(u.path.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Url {
        Url::parse("http://127.0.0.1:8080/site/page.html").unwrap()
    }

    #[test]
    fn extracts_href_and_src_of_link_tags_only() {
        let html = br#"<html><head><LINK rel=stylesheet href="/s.css"><script src='a.js'></script>
            <!-- <img src="commented.png"> --></head>
            <body><IMG SRC=pic1.png alt="x"><img alt='<y>' src = "pic 2.png"/>
            <p href="not-a-link.html">text</p><a name=top></a>
            <a class="c" href="x.html?a=1&amp;b=2">x</a><img src></body>"#;
        assert_eq!(
            extract(html),
            ["/s.css", "a.js", "pic1.png", "pic 2.png", "x.html?a=1&b=2"]
        );
    }

    #[test]
    fn extract_survives_truncated_and_hostile_input() {
        for html in [
            &b"<img src=\"unterminated"[..],
            b"<img src=",
            b"<a",
            b"<!-- never closed <img src=a.png>",
            b"<<<<>>>>=\"'",
            b"<img ===== src=ok.png>",
            b"\xff\xfe<img src=\xff.png>",
        ] {
            let _ = extract(html);
        }
        assert_eq!(extract(b"<img ===== src=ok.png>"), ["ok.png"]);
    }

    #[test]
    fn resolves_relative_absolute_and_dot_segments() {
        let b = base();
        let p = |h: &str| resolve(&b, h).map(|u| u.path);
        assert_eq!(p("pic.png").as_deref(), Some("/site/pic.png"));
        assert_eq!(p("img/pic.png").as_deref(), Some("/site/img/pic.png"));
        assert_eq!(p("/top.png").as_deref(), Some("/top.png"));
        assert_eq!(p("../up.png").as_deref(), Some("/up.png"));
        assert_eq!(p("../../../../etc/passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(p("./a/./b/../c.png").as_deref(), Some("/site/a/c.png"));
        assert_eq!(p("x.html#frag").as_deref(), Some("/site/x.html"));
        assert_eq!(p("?q=1").as_deref(), Some("/site/page.html?q=1"));
        assert_eq!(
            p("http://127.0.0.1:8080/abs.png").as_deref(),
            Some("/abs.png")
        );
        assert_eq!(p("//127.0.0.1:8080/net.png").as_deref(), Some("/net.png"));
    }

    #[test]
    fn other_hosts_schemes_and_fragments_are_skipped() {
        let b = base();
        for h in [
            "http://example.com/a.png",
            "http://127.0.0.1:8081/a.png",
            "//other/a.png",
            "https://127.0.0.1:8080/a.png",
            "mailto:a@b",
            "javascript:void(0)",
            "data:image/png;base64,AAAA",
            "#top",
            "",
            "a:",
        ] {
            assert_eq!(resolve(&b, h), None, "{h}");
        }
    }

    #[test]
    fn local_paths_stay_inside_the_directory() {
        let lp = |p: &str| {
            local_path(&Url {
                host: "h".into(),
                port: 80,
                path: p.into(),
            })
        };
        assert_eq!(lp("/"), PathBuf::from("index.html"));
        assert_eq!(lp("/a/b.png"), PathBuf::from("a/b.png"));
        assert_eq!(lp("/a/"), PathBuf::from("a/index.html"));
        assert_eq!(lp("/../../etc/passwd"), PathBuf::from("etc/passwd"));
        assert_eq!(lp("//x//y"), PathBuf::from("x/y"));
        assert_eq!(lp("/q.cgi?a=1/2"), PathBuf::from("q.cgi?a=1%2F2"));
        for p in ["/..", "/../", "/./..", "/a/../../.."] {
            let l = lp(p);
            assert!(
                l.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_))),
                "{p} -> {l:?}"
            );
        }
    }

    #[test]
    fn page_links_are_unique_and_exclude_the_page() {
        let html = br#"<img src=a.png><img src="a.png"><a href="page.html">self</a>
            <a href=/site/a.png>again</a><img src=b.png>"#;
        let got: Vec<String> = page_links(&base(), html)
            .into_iter()
            .map(|u| u.path)
            .collect();
        assert_eq!(got, ["/site/a.png", "/site/b.png"]);
    }
}
