//! The links of an HTML page, for `rhttp get -r` / `-p` (like wget's
//! `html-url.c`): which URLs a page refers to, what each is for (a page
//! requisite or a page to follow), resolved against the page's URL and
//! normalized, and where each is saved under the output directory.
//!
//! A small scanner, not an HTML parser: it finds the start tags `<a>`,
//! `<area>`, `<img>`, `<link>`, `<script>`, `<source>`, `<iframe>` and
//! `<embed>` and takes their `href`/`src` attribute (quoted with `"` or
//! `'`, or unquoted; the first of a name wins, as in HTML's tokenizer),
//! skipping comments. Everything here is pure and never panics on any
//! input (the page comes from the network). [`scan`] hands each link to a
//! closure, so a page of a million links costs no list of a million
//! strings.
//!
//! Resolution follows RFC 3986 §5.2 for the forms a page uses (absolute
//! `http://` URLs, network-path `//host/p`, absolute paths `/p`,
//! relative paths, query-only `?q`), then the syntax-based normalization
//! of §6.2.2: the host in lower case, percent-encodings in upper case
//! (§6.2.2.1), percent-encoded unreserved characters decoded (§6.2.2.2),
//! characters that may not appear in a URI percent-encoded (§2.1, as
//! browsers do), and `remove_dot_segments` (§5.2.4, after the decoding,
//! so `%2E%2E` is a `..` too). Two spellings of one URL thus compare
//! equal (the crawl's visited set keys on [`key`]), and no link can name
//! a file outside the output directory.

use std::path::PathBuf;

use crate::http::Url;

/// What a link is for; wget's distinction between "inline" links (page
/// requisites, `-p`) and the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// Needed to show the page: `<img src>`, `<script src>`, `<link
    /// href>` whose `rel` names `stylesheet` or `icon`, `<source src>`,
    /// `<embed src>`, `<iframe src>`. `-p` fetches these past the depth
    /// limit, and `--no-parent` does not apply to them (wget's recur.c).
    Requisite,
    /// Another page: `<a href>`, `<area href>`, `<link href>` of any
    /// other `rel` (`next`, `alternate`, ...).
    Follow,
}

/// Tags whose `href` or `src` names an object the page links, the
/// attribute, and what the link is for (`<link>` by its `rel`).
const TAGS: &[(&str, &str, LinkKind)] = &[
    ("a", "href", LinkKind::Follow),
    ("area", "href", LinkKind::Follow),
    ("img", "src", LinkKind::Requisite),
    ("link", "href", LinkKind::Follow),
    ("script", "src", LinkKind::Requisite),
    ("source", "src", LinkKind::Requisite),
    ("iframe", "src", LinkKind::Requisite),
    ("embed", "src", LinkKind::Requisite),
];

/// Call `f` with each link of `html` in document order: the value of the
/// link-bearing attribute of each link-bearing start tag, with the
/// character references `&amp;`, `&quot;`, `&#39;`, `&lt;` and `&gt;`
/// decoded, and what it is for.
pub fn scan(html: &[u8], mut f: impl FnMut(&str, LinkKind)) {
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
        let Some(&(_, want, kind)) = TAGS
            .iter()
            .find(|(t, _, _)| t.as_bytes().eq_ignore_ascii_case(name))
        else {
            continue;
        };
        let mut link: Option<&[u8]> = None;
        let mut rel: Option<&[u8]> = None;
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
            // HTML's tokenizer keeps the first of two attributes of one name.
            if attr.eq_ignore_ascii_case(want.as_bytes()) {
                link.get_or_insert(value);
            } else if attr.eq_ignore_ascii_case(b"rel") {
                rel.get_or_insert(value);
            }
        }
        if let Some(v) = link {
            let kind = if name.eq_ignore_ascii_case(b"link") {
                link_rel_kind(rel.unwrap_or_default())
            } else {
                kind
            };
            f(&decode_refs(&String::from_utf8_lossy(v)), kind);
        }
    }
}

/// `<link rel=...>`: a stylesheet or an icon is a page requisite (its
/// `rel` is a space-separated list of keywords, compared ASCII
/// case-insensitively: `stylesheet`, `icon`, `shortcut icon`,
/// `alternate stylesheet`).
fn link_rel_kind(rel: &[u8]) -> LinkKind {
    let requisite = rel
        .split(|b| b.is_ascii_whitespace())
        .any(|w| w.eq_ignore_ascii_case(b"stylesheet") || w.eq_ignore_ascii_case(b"icon"));
    if requisite {
        LinkKind::Requisite
    } else {
        LinkKind::Follow
    }
}

/// The links of `html` (see [`scan`]), collected.
pub fn extract_links(html: &[u8]) -> Vec<(String, LinkKind)> {
    let mut out = Vec::new();
    scan(html, |h, k| out.push((h.to_string(), k)));
    out
}

/// The link values of `html` (see [`scan`]), collected.
pub fn extract(html: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    scan(html, |h, _| out.push(h.to_string()));
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The few character references that appear in URLs in attributes.
fn decode_refs(s: &str) -> String {
    let s = s.trim();
    if !s.contains('&') {
        return s.to_string();
    }
    s.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// `href` resolved against `base` (RFC 3986 §5.2) and normalized
/// ([`normalize`]), if it is an `http` URL on `base`'s host and port;
/// `None` for other schemes (`mailto:`, `https:`, `javascript:`,
/// `data:`), other hosts, and fragment-only or empty references (the
/// page itself). The fragment is dropped (it never goes to the server).
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
    Some(normalize(&u))
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

/// RFC 3986 §2.3: unreserved = ALPHA / DIGIT / "-" / "." / "_" / "~".
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// May `b` appear literally in a path segment (RFC 3986 §3.3: pchar =
/// unreserved / pct-encoded / sub-delims / ":" / "@"; with "/") or, with
/// `query`, in a query (§3.4: also "?")?
fn literal_ok(b: u8, query: bool) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
        || (query && b == b'?')
}

fn hex_val(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// `%XX` for `b`, upper-case hex (RFC 3986 §2.1: "should use uppercase
/// hexadecimal digits"), written in place: a hostile page's link of
/// thousands of bytes to encode costs no allocation per byte.
fn push_pct(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// Percent-encoding normalization of a path or query (RFC 3986 §6.2.2.1
/// and §6.2.2.2): `%xx` with upper-case hex digits, the encoded
/// unreserved characters decoded, every byte that may not appear
/// literally (space, `"`, `<`, non-ASCII, a `%` not followed by two hex
/// digits, ...) encoded. Idempotent.
pub fn normalize_percent(s: &str, query: bool) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            if let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex_val),
                b.get(i + 2).copied().and_then(hex_val),
            ) {
                let v = h << 4 | l;
                if unreserved(v) {
                    out.push(v as char);
                } else {
                    push_pct(&mut out, v);
                }
                i += 3;
                continue;
            }
        }
        if c != b'%' && literal_ok(c, query) {
            out.push(c as char);
        } else {
            push_pct(&mut out, c);
        }
        i += 1;
    }
    out
}

/// `u` in normal form (RFC 3986 §6.2.2): host in lower case, the path's
/// and query's percent-encodings normalized ([`normalize_percent`]), then
/// the path's dot segments removed (§5.2.4), an empty path as `/`.
pub fn normalize(u: &Url) -> Url {
    let (p, q) = match u.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (u.path.as_str(), None),
    };
    let p = if p.starts_with('/') {
        normalize_percent(p, false)
    } else {
        format!("/{}", normalize_percent(p, false))
    };
    let mut path = remove_dot_segments(&p);
    if let Some(q) = q {
        path.push('?');
        path.push_str(&normalize_percent(q, true));
    }
    Url {
        host: u.host.to_ascii_lowercase(),
        port: u.port,
        path,
    }
}

/// The key of a URL in a crawl's visited set: its [`normalize`]d form,
/// `host:port/path?query`. Two spellings of one resource (`%7e` and
/// `~`, `/a/./b` and `/a/b`, `HOST` and `host`) have one key.
pub fn key(u: &Url) -> String {
    let n = normalize(u);
    format!("{}:{}{}", n.host, n.port, n.path)
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

/// One path segment as a file name: percent-encodings decoded as wget
/// does (`a%20b.html` is saved as `a b.html`), except those that would
/// change the path's shape or make an awkward name: `%2F` (a '/'), NUL
/// and the other control characters stay encoded, and so does a segment
/// that would decode to `.` or `..`.
fn segment_file_name(seg: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex_val),
                b.get(i + 2).copied().and_then(hex_val),
            ) {
                let v = h << 4 | l;
                if v != b'/' && v >= 0x20 && v != 0x7f {
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    if out == b"." || out == b".." {
        return std::ffi::OsString::from(seg);
    }
    std::ffi::OsString::from_vec(out)
}

/// Where `u` is saved under the output directory without the host
/// directory (`wget -nH`): its [`normalize`]d path (so never outside),
/// each segment through `segment_file_name`, `index.html` for a path
/// that ends in '/', the query kept in the name as wget does (with '/'
/// written as `%2F`). Empty segments are skipped.
pub fn local_path(u: &Url) -> PathBuf {
    let n = normalize(u);
    let (p, q) = match n.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (n.path.as_str(), None),
    };
    let mut out = PathBuf::new();
    let segs: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
    for s in &segs {
        out.push(segment_file_name(s));
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

/// The host directory wget makes for `u` (without `-nH`): the host in
/// lower case, with `:PORT` when the port is not 80 (wget's url.c
/// `append_dir_structure`, `FN_PORT_SEP`); an IPv6 literal in brackets.
pub fn host_dir(u: &Url) -> String {
    let h = u.host.to_ascii_lowercase();
    let h = if h.contains(':') { format!("[{h}]") } else { h };
    if u.port == 80 {
        h
    } else {
        format!("{h}:{}", u.port)
    }
}

/// The objects a page links, once each (by [`key`]), in document order,
/// without the page itself: [`scan`] then [`resolve`].
pub fn page_links(base: &Url, html: &[u8]) -> Vec<(Url, LinkKind)> {
    let mut seen = std::collections::HashSet::new();
    seen.insert(key(base));
    let mut out = Vec::new();
    scan(html, |h, k| {
        if let Some(u) = resolve(base, h) {
            if seen.insert(key(&u)) {
                out.push((u, k));
            }
        }
    });
    out
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
    fn link_kinds_follow_wget() {
        use LinkKind::{Follow, Requisite};
        let html = br#"<link rel="Shortcut ICON" href=fav.ico><link href=s.css rel=stylesheet>
            <link rel=next href=p2.html><link href=none.html><a href=a.html src=x.png>
            <area href=map.html><img src=i.png href=h.html><script src=j.js></script>
            <iframe src=f.html></iframe><embed src=e.swf><source src=v.webm>
            <img src=first.png src=second.png>"#;
        let got = extract_links(html);
        let want: Vec<(String, LinkKind)> = [
            ("fav.ico", Requisite),
            ("s.css", Requisite),
            ("p2.html", Follow),
            ("none.html", Follow),
            ("a.html", Follow),
            ("map.html", Follow),
            ("i.png", Requisite),
            ("j.js", Requisite),
            ("f.html", Requisite),
            ("e.swf", Requisite),
            ("v.webm", Requisite),
            ("first.png", Requisite),
        ]
        .iter()
        .map(|(h, k)| (h.to_string(), *k))
        .collect();
        assert_eq!(got, want);
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
            b"<link rel",
            b"<link rel=",
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
        assert_eq!(p(".").as_deref(), Some("/site/"));
        assert_eq!(p("..").as_deref(), Some("/"));
        assert_eq!(p("../").as_deref(), Some("/"));
    }

    /// RFC 3986 §5.4.1's normal examples whose forms rhttp resolves (an
    /// http base and same-host results; the base is
    /// `http://a/b/c/d;p?q`).
    #[test]
    fn rfc3986_normal_examples() {
        let b = Url::parse("http://a/b/c/d;p?q").unwrap();
        for (r, want) in [
            ("g", "/b/c/g"),
            ("./g", "/b/c/g"),
            ("g/", "/b/c/g/"),
            ("/g", "/g"),
            ("?y", "/b/c/d;p?y"),
            ("g?y", "/b/c/g?y"),
            ("g#s", "/b/c/g"),
            ("g?y#s", "/b/c/g?y"),
            (";x", "/b/c/;x"),
            ("g;x", "/b/c/g;x"),
            ("g;x?y#s", "/b/c/g;x?y"),
            (".", "/b/c/"),
            ("./", "/b/c/"),
            ("..", "/b/"),
            ("../", "/b/"),
            ("../g", "/b/g"),
            ("../..", "/"),
            ("../../", "/"),
            ("../../g", "/g"),
            // §5.4.2, abnormal: ".." never above the root.
            ("../../../g", "/g"),
            ("../../../../g", "/g"),
            ("/./g", "/g"),
            ("/../g", "/g"),
            ("g.", "/b/c/g."),
            (".g", "/b/c/.g"),
            ("g..", "/b/c/g.."),
            ("..g", "/b/c/..g"),
            ("./../g", "/b/g"),
            ("./g/.", "/b/c/g/"),
            ("g/./h", "/b/c/g/h"),
            ("g/../h", "/b/c/h"),
            ("g;x=1/./y", "/b/c/g;x=1/y"),
            ("g;x=1/../y", "/b/c/y"),
            ("g?y/./x", "/b/c/g?y/./x"),
            ("g?y/../x", "/b/c/g?y/../x"),
            ("g#s/./x", "/b/c/g"),
            ("g#s/../x", "/b/c/g"),
        ] {
            assert_eq!(resolve(&b, r).map(|u| u.path).as_deref(), Some(want), "{r}");
        }
        // "" is the base document itself; "#s" only a fragment of it.
        assert_eq!(resolve(&b, ""), None);
        assert_eq!(resolve(&b, "#s"), None);
    }

    #[test]
    fn percent_encoding_is_normalized() {
        let n = |p: &str| {
            normalize(&Url {
                host: "H".into(),
                port: 80,
                path: p.into(),
            })
            .path
        };
        // §6.2.2.1: upper-case hex; §6.2.2.2: unreserved decoded.
        assert_eq!(n("/%7euser/%2fx%2F"), "/~user/%2Fx%2F");
        assert_eq!(n("/%41%62%63%2D%2e%5F"), "/Abc-._");
        // Encoded dots are dot segments once decoded.
        assert_eq!(n("/a/%2E%2e/b"), "/b");
        assert_eq!(n("/a/%2e/b"), "/a/b");
        // What may not appear literally is encoded; a lone % too.
        assert_eq!(n("/a b\"<>.png"), "/a%20b%22%3C%3E.png");
        assert_eq!(n("/caf\u{e9}"), "/caf%C3%A9");
        assert_eq!(n("/100%"), "/100%25");
        assert_eq!(n("/%zz%4"), "/%25zz%254");
        // Reserved characters stay as they are, encoded or not.
        assert_eq!(n("/a;b=c,d@e:f!$&'()*+"), "/a;b=c,d@e:f!$&'()*+");
        assert_eq!(n("/%3B"), "/%3B");
        // The query keeps '?' and '/', and its dots.
        assert_eq!(n("/p?a=/../b?c%7e"), "/p?a=/../b?c~");
        assert_eq!(n(""), "/");
        assert_eq!(n("rel"), "/rel");
        for p in ["/%7e/a b/%2E/../x?q=%7e%zz", "/caf\u{e9}/100%", "/%2f%2F"] {
            assert_eq!(n(&n(p)), n(p), "idempotent on {p}");
        }
    }

    #[test]
    fn keys_equate_spellings_of_one_url() {
        let u = |h: &str, p: &str| Url {
            host: h.into(),
            port: 8080,
            path: p.into(),
        };
        assert_eq!(key(&u("Host", "/~a/b")), key(&u("host", "/%7Ea/./b")));
        assert_eq!(key(&u("h", "/a/x/../b")), key(&u("h", "/a/b")));
        assert_eq!(key(&u("h", "/a%20b")), key(&u("h", "/a b")));
        assert_ne!(key(&u("h", "/a/b")), key(&u("h", "/a%2Fb")));
        assert_ne!(key(&u("h", "/a")), key(&u("h", "/a/")));
        assert_ne!(key(&u("h", "/A")), key(&u("h", "/a")));
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
        // Decoded as wget saves them, but never into a '/' or a dot segment.
        assert_eq!(lp("/a%20b.html"), PathBuf::from("a b.html"));
        assert_eq!(lp("/x%2Fy"), PathBuf::from("x%2Fy"));
        assert_eq!(lp("/%2E%2E/%2e/z"), PathBuf::from("z"));
        assert_eq!(lp("/nul%00%0A"), PathBuf::from("nul%00%0A"));
        for p in [
            "/..",
            "/../",
            "/./..",
            "/a/../../..",
            "/%2E%2E",
            "/.%2E/",
            "/%2F..%2F",
        ] {
            let l = lp(p);
            assert!(
                l.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_))),
                "{p} -> {l:?}"
            );
        }
    }

    #[test]
    fn host_directories_as_wget_names_them() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert_eq!(host_dir(&u("http://Example.COM/x")), "example.com");
        assert_eq!(host_dir(&u("http://127.0.0.1:8080/")), "127.0.0.1:8080");
        assert_eq!(host_dir(&u("http://[::1]:81/")), "[::1]:81");
    }

    #[test]
    fn page_links_are_unique_and_exclude_the_page() {
        let html = br#"<img src=a.png><img src="a.png"><a href="page.html">self</a>
            <a href=/site/a.png>again</a><img src=b.png><a href="./%61.png">a, encoded</a>"#;
        let got: Vec<String> = page_links(&base(), html)
            .into_iter()
            .map(|(u, _)| u.path)
            .collect();
        assert_eq!(got, ["/site/a.png", "/site/b.png"]);
    }
}
