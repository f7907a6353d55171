//! robots.txt (RFC 9309, the Robots Exclusion Protocol) for `rhttp get
//! -r`: which paths of a host the crawl may fetch. wget honours it by
//! default (`-e robots=off` turns it off), and so does rhttp.
//!
//! - Groups (§2.1): one or more `user-agent` lines, then the rules. The
//!   group whose product token matches ours ([`PRODUCT`], compared without
//!   regard to case, §2.2.1) applies; several such groups are combined;
//!   without one, the `*` groups apply; without those, nothing is
//!   disallowed.
//! - Rules (§2.2.2): `allow` and `disallow` with a path pattern; the most
//!   specific match (the longest pattern, in octets) wins, `allow` on a
//!   tie; `*` matches any run of characters and a final `$` the end of the
//!   path (§2.2.3); an empty value is no rule. `/robots.txt` itself is
//!   always allowed. Paths and patterns compare after the percent-encoding
//!   normalization of RFC 3986 §6.2.2 ([`crate::links::normalize_percent`]),
//!   as §2.2.2 asks.
//! - Access results (§2.3.1): a 2xx body is parsed; 4xx ("unavailable")
//!   allows everything; 5xx or no answer ("unreachable") disallows
//!   everything. rhttp follows no redirect, so a 3xx is taken as
//!   unavailable (§2.3.1.2 allows that after five).
//! - Limits (§2.5): only the first [`MAX_BYTES`] are parsed; at most
//!   [`MAX_RULES`] rules are kept (a hostile file of a hundred thousand
//!   `*` patterns would otherwise cost a crawl of ten thousand URLs
//!   minutes of matching); matching is linear in the path per pattern
//!   segment ([`matches()`]).
//!
//! Pure and panic-free on any input (fuzzed by `rhttp_links`).

use crate::links::normalize_percent;

/// Our product token (RFC 9309 §2.2.1), as in the `User-Agent: rhttp/..`
/// we send.
pub const PRODUCT: &str = "rhttp";

/// RFC 9309 §2.5: "crawlers SHOULD impose a parsing limit ... at least
/// 500 kibibytes".
pub const MAX_BYTES: usize = 500 << 10;

/// Most rules kept from the groups that apply to us (any real robots.txt
/// has far fewer; more are ignored with a warning).
pub const MAX_RULES: usize = 1000;

/// One `allow` or `disallow` line, its pattern normalized.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    allow: bool,
    pattern: String,
}

/// The rules of one host that apply to [`PRODUCT`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Robots {
    rules: Vec<Rule>,
    /// 5xx or no answer: nothing may be fetched (RFC 9309 §2.3.1.4).
    disallow_all: bool,
    /// Rules dropped beyond [`MAX_RULES`].
    pub dropped: usize,
}

impl Robots {
    /// Everything allowed (no robots.txt, or robots checks turned off).
    pub fn allow_all() -> Robots {
        Robots {
            rules: Vec::new(),
            disallow_all: false,
            dropped: 0,
        }
    }

    /// From the answer to `GET /robots.txt` (RFC 9309 §2.3.1): `status`
    /// `None` when there was no answer.
    pub fn from_response(status: Option<u16>, body: &[u8]) -> Robots {
        match status {
            Some(200..=299) => Robots::parse(body),
            Some(300..=499) => Robots::allow_all(),
            _ => Robots {
                disallow_all: true,
                ..Robots::allow_all()
            },
        }
    }

    /// Parse a robots.txt body (the first [`MAX_BYTES`] of it).
    pub fn parse(body: &[u8]) -> Robots {
        let body = &body[..body.len().min(MAX_BYTES)];
        let text = String::from_utf8_lossy(body);
        // The rules of the groups naming us, and of the `*` groups.
        let mut ours: Vec<Rule> = Vec::new();
        let mut star: Vec<Rule> = Vec::new();
        let mut named_us = false;
        // The current group's agents: (names us, names *); `in_rules`
        // once a rule was seen (the next user-agent starts a new group).
        let (mut g_ours, mut g_star, mut in_rules) = (false, false, false);
        let mut dropped = 0;
        for line in text.split(['\n', '\r']) {
            let line = line.split('#').next().unwrap_or("");
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("user-agent") {
                if in_rules {
                    (g_ours, g_star, in_rules) = (false, false, false);
                }
                // §2.2.1: the product token is letters, '_' and '-'; a
                // value like "rhttp/1.0" names it too.
                let token: String = v
                    .chars()
                    .take_while(|c| c.is_ascii_alphabetic() || matches!(c, '_' | '-'))
                    .collect();
                if token.eq_ignore_ascii_case(PRODUCT) {
                    g_ours = true;
                    named_us = true;
                } else if v == "*" {
                    g_star = true;
                }
                continue;
            }
            let allow = if k.eq_ignore_ascii_case("allow") {
                true
            } else if k.eq_ignore_ascii_case("disallow") {
                false
            } else {
                continue; // sitemap, crawl-delay, unknown: not ours
            };
            in_rules = true;
            if v.is_empty() || !(g_ours || g_star) {
                continue;
            }
            let rule = Rule {
                allow,
                pattern: normalize_pattern(v),
            };
            for (applies, list) in [(g_ours, &mut ours), (g_star, &mut star)] {
                if !applies {
                    continue;
                }
                if list.len() < MAX_RULES {
                    list.push(rule.clone());
                } else {
                    dropped += 1;
                }
            }
        }
        Robots {
            rules: if named_us { ours } else { star },
            disallow_all: false,
            dropped,
        }
    }

    /// How many rules apply to rhttp.
    pub fn rules(&self) -> usize {
        self.rules.len()
    }

    /// May `path` (an absolute path with its query, as requested) be
    /// fetched?
    pub fn allowed(&self, path: &str) -> bool {
        if path == "/robots.txt" {
            return true;
        }
        if self.disallow_all {
            return false;
        }
        let p = normalize_percent(path, true);
        let mut best: Option<(usize, bool)> = None;
        for r in &self.rules {
            if matches(&r.pattern, &p) {
                let len = r.pattern.len();
                best = match best {
                    Some((l, a)) if l > len || (l == len && a) => Some((l, a)),
                    _ => Some((len, r.allow)),
                };
            }
        }
        best.is_none_or(|(_, allow)| allow)
    }
}

/// A pattern as paths are compared: its percent-encodings normalized,
/// keeping `*` and a final `$` (RFC 9309 §2.2.3).
fn normalize_pattern(v: &str) -> String {
    let (body, end) = match v.strip_suffix('$') {
        Some(b) => (b, "$"),
        None => (v, ""),
    };
    let parts: Vec<String> = body
        .split('*')
        .map(|s| normalize_percent(s, true))
        .collect();
    format!("{}{end}", parts.join("*"))
}

/// Does `pattern` match `path` (RFC 9309 §2.2.3): the pattern matches a
/// prefix of the path, `*` any run of characters, a final `$` the end.
/// The literal pieces between `*`s are found leftmost-first, which is
/// exact for `*`-only patterns and linear in the path per piece.
pub fn matches(pattern: &str, path: &str) -> bool {
    let (pat, anchored) = match pattern.strip_suffix('$') {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let mut pieces = pat.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = path.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    if pieces.is_empty() {
        return !anchored || rest.is_empty();
    }
    let (last, middle) = pieces.split_last().expect("not empty");
    for piece in middle {
        match rest.find(piece) {
            Some(i) => rest = &rest[i + piece.len()..],
            None => return false,
        }
    }
    // After the last '*': anywhere in what is left, or at its end when
    // anchored (the leftmost match of the earlier pieces leaves the most
    // room for it).
    if anchored {
        rest.ends_with(last)
    } else {
        rest.contains(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_pick_ours_else_star() {
        let txt = b"# comment\nUser-agent: *\nDisallow: /private/\n\n\
            User-agent: Googlebot\nDisallow: /\n";
        let r = Robots::parse(txt);
        assert!(r.allowed("/index.html"));
        assert!(!r.allowed("/private/x.html"));
        assert!(r.allowed("/privateer.html"));

        let txt = b"User-agent: *\nDisallow: /\n\nUser-Agent: RHTTP/0.1\nDisallow: /cgi-bin\n";
        let r = Robots::parse(txt);
        assert!(r.allowed("/index.html"), "our group, not *, applies");
        assert!(!r.allowed("/cgi-bin/x"));

        // Two agents share one group; two groups naming us are combined.
        let txt = b"user-agent: other\nuser-agent: rhttp\ndisallow: /a\n\
            user-agent: x\ndisallow: /x\nuser-agent: rhttp\ndisallow: /b\n";
        let r = Robots::parse(txt);
        assert!(!r.allowed("/a") && !r.allowed("/b") && r.allowed("/x"));
        // No group for us or for *: everything allowed.
        assert!(Robots::parse(b"User-agent: other\nDisallow: /\n").allowed("/"));
        // A rule before any user-agent belongs to no group.
        assert!(Robots::parse(b"Disallow: /\n").allowed("/"));
    }

    #[test]
    fn longest_match_wins_and_allow_wins_ties() {
        let r = Robots::parse(b"User-agent: *\nDisallow: /a\nAllow: /a/b\nDisallow: /a/b/c\n");
        assert!(!r.allowed("/a/x"));
        assert!(r.allowed("/a/b/x"));
        assert!(!r.allowed("/a/b/c/x"));
        let r = Robots::parse(b"User-agent: *\nDisallow: /p\nAllow: /p\n");
        assert!(r.allowed("/p"), "allow wins a tie (RFC 9309 2.2.2)");
        // An empty disallow is no rule.
        assert!(Robots::parse(b"User-agent: *\nDisallow:\n").allowed("/x"));
        // /robots.txt is always allowed.
        assert!(Robots::parse(b"User-agent: *\nDisallow: /\n").allowed("/robots.txt"));
    }

    #[test]
    fn wildcards_and_end_anchor() {
        assert!(matches("/*.gif$", "/a/b.gif"));
        assert!(!matches("/*.gif$", "/a/b.gif?x"));
        assert!(matches("/*.gif", "/a/b.gif?x"));
        assert!(matches("/a*b*c", "/a-b-x-c-y"));
        assert!(!matches("/a*b*c", "/a-c-b"));
        assert!(matches("/a*", "/a"));
        assert!(matches("*", "/anything"));
        assert!(matches("/x$", "/x"));
        assert!(!matches("/x$", "/xy"));
        assert!(matches("/a*a$", "/aa"));
        assert!(!matches("/a*a$", "/a"), "pieces do not overlap");
        assert!(matches("/a*ab$", "/aaab"));
        let r = Robots::parse(b"User-agent: *\nDisallow: /*.cgi$\nDisallow: /tmp*/\n");
        assert!(!r.allowed("/x/run.cgi") && r.allowed("/x/run.cgi?q"));
        assert!(!r.allowed("/tmpfiles/a") && r.allowed("/tmp"));
    }

    #[test]
    fn percent_encodings_compare_normalized() {
        let r = Robots::parse(b"User-agent: *\nDisallow: /%7ejoe/\nDisallow: /a%3cb\n");
        assert!(!r.allowed("/~joe/index.html"));
        assert!(!r.allowed("/%7Ejoe/index.html"));
        assert!(!r.allowed("/a%3Cb"));
        assert!(!r.allowed("/a<b"));
    }

    #[test]
    fn access_results() {
        let body = b"User-agent: *\nDisallow: /x\n";
        assert!(!Robots::from_response(Some(200), body).allowed("/x"));
        assert!(Robots::from_response(Some(404), body).allowed("/x"));
        assert!(Robots::from_response(Some(301), body).allowed("/x"));
        assert!(!Robots::from_response(Some(503), body).allowed("/y"));
        assert!(!Robots::from_response(None, b"").allowed("/y"));
        assert!(Robots::from_response(Some(503), b"").allowed("/robots.txt"));
    }

    #[test]
    fn limits_hold_against_a_hostile_file() {
        // Many rules: the first MAX_RULES kept.
        let mut txt = b"User-agent: *\n".to_vec();
        for i in 0..(MAX_RULES + 10) {
            txt.extend_from_slice(format!("Disallow: /r{i}/\n").as_bytes());
        }
        let r = Robots::parse(&txt);
        assert_eq!(r.dropped, 10);
        assert!(!r.allowed("/r0/x") && r.allowed(&format!("/r{}/x", MAX_RULES + 5)));
        // Past MAX_BYTES nothing is read.
        let mut txt = b"User-agent: *\n".to_vec();
        txt.resize(MAX_BYTES, b'\n');
        txt.extend_from_slice(b"Disallow: /\n");
        assert!(Robots::parse(&txt).allowed("/x"));
        // Junk parses to something, without a panic.
        for junk in [
            &b"\xff\xfe:::\n*$"[..],
            b"Disallow",
            b"user-agent:\ndisallow:$",
            b":",
        ] {
            let _ = Robots::parse(junk).allowed("/");
        }
    }
}
