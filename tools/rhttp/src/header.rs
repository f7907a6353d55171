//! The `RDMA:` HTTP header.
//!
//! ```text
//! RDMA        = scheme *( "," OWS param )
//! scheme      = "server-writes" / "client-reads" / "client-writes" / "server-reads"
//! param       = key "=" value
//! key         = "ip" / "port" / "stag" / "to" / "maxlen" / "length" / "token"
//! ```
//!
//! Numbers are decimal or `0x`-prefixed hexadecimal; `ip` is an IPv4 or
//! IPv6 literal. A key may appear once. Which keys a request must carry
//! depends on the scheme ([`RdmaHeader::validate_request`]); responses
//! carry `length` and, for client-reads, `stag` and `to`.
//!
//! `token` (optional in every scheme, 64 bits) is a nonce the client picks
//! for each request; mod_rdma sends it back in the private data of the MPA
//! Request with which it connects back ([`server_private_data`]), so the
//! client accepts the server's connection and not one from whoever reached
//! its listener first. A server that predates it refuses the header (400,
//! unknown parameter) and the client falls back to plain HTTP.

use std::fmt;
use std::net::IpAddr;

/// Who moves the body, and in which direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// GET: the server RDMA-Writes the body into the client's buffer.
    ServerWrites,
    /// GET: the server registers the body, the client RDMA-Reads it.
    ClientReads,
    /// PUT/POST: the server offers buffers (BUF), the client RDMA-Writes.
    ClientWrites,
    /// PUT/POST: the client advertises its buffer, the server RDMA-Reads.
    ServerReads,
}

impl Scheme {
    /// The token used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::ServerWrites => "server-writes",
            Scheme::ClientReads => "client-reads",
            Scheme::ClientWrites => "client-writes",
            Scheme::ServerReads => "server-reads",
        }
    }

    /// Parse a wire token.
    pub fn from_token(s: &str) -> Option<Scheme> {
        Some(match s {
            "server-writes" => Scheme::ServerWrites,
            "client-reads" => Scheme::ClientReads,
            "client-writes" => Scheme::ClientWrites,
            "server-reads" => Scheme::ServerReads,
            _ => return None,
        })
    }

    /// True for the schemes that move a response body (GET).
    pub fn is_get(self) -> bool {
        matches!(self, Scheme::ServerWrites | Scheme::ClientReads)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed `RDMA:` header. Absent parameters are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaHeader {
    pub scheme: Scheme,
    pub ip: Option<IpAddr>,
    pub port: Option<u16>,
    pub stag: Option<u32>,
    pub to: Option<u64>,
    pub maxlen: Option<u64>,
    pub length: Option<u64>,
    pub token: Option<u64>,
}

/// Why an `RDMA:` header was refused. `Display` names the problem the way
/// mod_rdma's 400 response does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    Empty,
    UnknownScheme(String),
    NotKeyValue(String),
    UnknownKey(String),
    DuplicateKey(String),
    BadValue { key: String, value: String },
    Missing { scheme: Scheme, key: &'static str },
    Forbidden { scheme: Scheme, key: &'static str },
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Empty => write!(f, "the RDMA header is empty; it must start with a scheme"),
            HeaderError::UnknownScheme(s) => write!(
                f,
                "unknown scheme {s:?}; use server-writes, client-reads, client-writes or server-reads"
            ),
            HeaderError::NotKeyValue(p) => {
                write!(f, "parameter {p:?} is not of the form key=value")
            }
            HeaderError::UnknownKey(k) => write!(
                f,
                "unknown parameter {k:?}; known: ip, port, stag, to, maxlen, length, token"
            ),
            HeaderError::DuplicateKey(k) => write!(f, "parameter {k:?} appears twice"),
            HeaderError::BadValue { key, value } => {
                write!(f, "parameter {key}={value:?} is not a valid value")
            }
            HeaderError::Missing { scheme, key } => {
                write!(f, "scheme {scheme} needs the parameter {key}")
            }
            HeaderError::Forbidden { scheme, key } => {
                write!(f, "scheme {scheme} does not take the parameter {key}")
            }
        }
    }
}

impl std::error::Error for HeaderError {}

/// Strip the whitespace around a list element, key or value: ASCII only
/// (the C parser's `isspace`), never Unicode spaces such as U+00A0, which
/// are not OWS.
fn trim_ows(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'))
}

fn parse_num(key: &str, value: &str, max: u64) -> Result<u64, HeaderError> {
    let bad = || HeaderError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
    };
    let n = if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u64::from_str_radix(hex, 16).map_err(|_| bad())?
    } else {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        value.parse::<u64>().map_err(|_| bad())?
    };
    if n > max {
        return Err(bad());
    }
    Ok(n)
}

impl RdmaHeader {
    /// A header with only the scheme.
    pub fn new(scheme: Scheme) -> RdmaHeader {
        RdmaHeader {
            scheme,
            ip: None,
            port: None,
            stag: None,
            to: None,
            maxlen: None,
            length: None,
            token: None,
        }
    }

    /// Parse the header's value (syntax only; see
    /// [`validate_request`](Self::validate_request)).
    pub fn parse(value: &str) -> Result<RdmaHeader, HeaderError> {
        let mut parts = value.split(',').map(trim_ows);
        let scheme_tok = parts.next().unwrap_or("");
        if scheme_tok.is_empty() {
            return Err(HeaderError::Empty);
        }
        let scheme = Scheme::from_token(scheme_tok)
            .ok_or_else(|| HeaderError::UnknownScheme(scheme_tok.to_string()))?;
        let mut h = RdmaHeader::new(scheme);
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| HeaderError::NotKeyValue(p.to_string()))?;
            let (k, v) = (trim_ows(k), trim_ows(v));
            let dup = || HeaderError::DuplicateKey(k.to_string());
            match k {
                "ip" => {
                    let ip = v.parse::<IpAddr>().map_err(|_| HeaderError::BadValue {
                        key: k.into(),
                        value: v.into(),
                    })?;
                    if h.ip.replace(ip).is_some() {
                        return Err(dup());
                    }
                }
                "port" => {
                    let n = parse_num(k, v, u16::MAX as u64)?;
                    if n == 0 {
                        return Err(HeaderError::BadValue {
                            key: k.into(),
                            value: v.into(),
                        });
                    }
                    if h.port.replace(n as u16).is_some() {
                        return Err(dup());
                    }
                }
                "stag" => {
                    let n = parse_num(k, v, u32::MAX as u64)?;
                    if h.stag.replace(n as u32).is_some() {
                        return Err(dup());
                    }
                }
                "to" => {
                    if h.to.replace(parse_num(k, v, u64::MAX)?).is_some() {
                        return Err(dup());
                    }
                }
                "maxlen" => {
                    if h.maxlen.replace(parse_num(k, v, u64::MAX)?).is_some() {
                        return Err(dup());
                    }
                }
                "length" => {
                    if h.length.replace(parse_num(k, v, u64::MAX)?).is_some() {
                        return Err(dup());
                    }
                }
                "token" => {
                    if h.token.replace(parse_num(k, v, u64::MAX)?).is_some() {
                        return Err(dup());
                    }
                }
                _ => return Err(HeaderError::UnknownKey(k.to_string())),
            }
        }
        Ok(h)
    }

    /// Check that a request header carries exactly what its scheme needs:
    ///
    /// | scheme | required | optional | forbidden |
    /// | --- | --- | --- | --- |
    /// | server-writes | ip port stag to maxlen | | length |
    /// | client-reads | ip port | maxlen | stag to length |
    /// | client-writes | ip port length | | stag to maxlen |
    /// | server-reads | ip port stag to length | | maxlen |
    pub fn validate_request(&self) -> Result<(), HeaderError> {
        let s = self.scheme;
        let need = |present: bool, key: &'static str| {
            if present {
                Ok(())
            } else {
                Err(HeaderError::Missing { scheme: s, key })
            }
        };
        let deny = |present: bool, key: &'static str| {
            if present {
                Err(HeaderError::Forbidden { scheme: s, key })
            } else {
                Ok(())
            }
        };
        need(self.ip.is_some(), "ip")?;
        need(self.port.is_some(), "port")?;
        match s {
            Scheme::ServerWrites => {
                need(self.stag.is_some(), "stag")?;
                need(self.to.is_some(), "to")?;
                need(self.maxlen.is_some(), "maxlen")?;
                deny(self.length.is_some(), "length")
            }
            Scheme::ClientReads => {
                deny(self.stag.is_some(), "stag")?;
                deny(self.to.is_some(), "to")?;
                deny(self.length.is_some(), "length")
            }
            Scheme::ClientWrites => {
                need(self.length.is_some(), "length")?;
                deny(self.stag.is_some(), "stag")?;
                deny(self.to.is_some(), "to")?;
                deny(self.maxlen.is_some(), "maxlen")
            }
            Scheme::ServerReads => {
                need(self.stag.is_some(), "stag")?;
                need(self.to.is_some(), "to")?;
                need(self.length.is_some(), "length")?;
                deny(self.maxlen.is_some(), "maxlen")
            }
        }
    }
}

impl fmt::Display for RdmaHeader {
    /// The canonical form: scheme, then ip, port, stag, to, maxlen, length,
    /// token (hex for stag, to and token), each present one after ", ".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme.as_str())?;
        if let Some(ip) = self.ip {
            write!(f, ", ip={ip}")?;
        }
        if let Some(p) = self.port {
            write!(f, ", port={p}")?;
        }
        if let Some(s) = self.stag {
            write!(f, ", stag={s:#x}")?;
        }
        if let Some(t) = self.to {
            write!(f, ", to={t:#x}")?;
        }
        if let Some(m) = self.maxlen {
            write!(f, ", maxlen={m}")?;
        }
        if let Some(l) = self.length {
            write!(f, ", length={l}")?;
        }
        if let Some(t) = self.token {
            write!(f, ", token={t:#018x}")?;
        }
        Ok(())
    }
}

/// The prefix of the private data of mod_rdma's MPA Request.
pub const SERVER_PD_PREFIX: &[u8] = b"mod_rdma/1";

/// The private data of the MPA Request with which mod_rdma connects back
/// for a request whose header carried `token`: `"mod_rdma/1"`, then the
/// token as 8 bytes, big-endian (without a token, the prefix alone).
pub fn server_private_data(token: Option<u64>) -> Vec<u8> {
    let mut pd = SERVER_PD_PREFIX.to_vec();
    if let Some(t) = token {
        pd.extend_from_slice(&t.to_be_bytes());
    }
    pd
}

/// Whether `pd`, the private data of an incoming connection request, is
/// mod_rdma's answer to the request that carried `token`. Zero bytes after
/// it are allowed: over InfiniBand and RoCE (rxe) the CM's REQ carries a
/// fixed-size private data field, and rdma_cm hands the listener all of it,
/// the sender's bytes then zeros (rdma_cm(7): "the private data may be
/// padded"). Compared in constant time: how far a guess matched must not
/// show in the time of the refusal.
pub fn private_data_matches(pd: &[u8], token: u64) -> bool {
    let want = server_private_data(Some(token));
    if pd.len() < want.len() {
        return false;
    }
    let (head, pad) = pd.split_at(want.len());
    let diff = head
        .iter()
        .zip(&want)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    let pad = pad.iter().fold(0u8, |acc, b| acc | b);
    (diff | pad) == 0
}

/// The length in an `RDMA-Inline:` answer header (docs/MOD_RDMA.md,
/// "Small objects"): `length=N`, the size of the body that follows in the
/// HTTP response itself, where the server answered an `RDMA:` request
/// inline rather than by RDMA. Parameters other than `length` are
/// skipped (a later server may add some); `length` must appear once, as
/// a decimal or `0x` number.
pub fn parse_inline(v: &str) -> Result<u64, String> {
    let mut len = None;
    for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, val)) = p.split_once('=') else {
            return Err(format!("RDMA-Inline: {p:?} is not key=value"));
        };
        if k.trim().eq_ignore_ascii_case("length") {
            if len.is_some() {
                return Err("RDMA-Inline: length given twice".into());
            }
            let val = val.trim();
            let n = match val.strip_prefix("0x").or_else(|| val.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => val.parse(),
            };
            len = Some(n.map_err(|_| format!("RDMA-Inline: bad length {val:?}"))?);
        }
    }
    len.ok_or_else(|| "RDMA-Inline: no length".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_answer_length() {
        assert_eq!(parse_inline("length=2048"), Ok(2048));
        assert_eq!(parse_inline(" length = 0x800 , future=1"), Ok(2048));
        assert!(parse_inline("").is_err());
        assert!(parse_inline("length=2048, length=1").is_err());
        assert!(parse_inline("length=-1").is_err());
        assert!(parse_inline("bogus").is_err());
    }

    #[test]
    fn figure1_example_parses() {
        let h = RdmaHeader::parse(
            "server-writes, ip=127.0.0.1, port=4791, stag=0x1234, to=0x7f0000001000, maxlen=1048576",
        )
        .unwrap();
        assert_eq!(h.scheme, Scheme::ServerWrites);
        assert_eq!(h.ip, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(h.port, Some(4791));
        assert_eq!(h.stag, Some(0x1234));
        assert_eq!(h.to, Some(0x7f00_0000_1000));
        assert_eq!(h.maxlen, Some(1_048_576));
        assert_eq!(h.length, None);
        h.validate_request().unwrap();
    }

    #[test]
    fn display_round_trips() {
        let mut h = RdmaHeader::new(Scheme::ServerReads);
        h.ip = Some("::1".parse().unwrap());
        h.port = Some(9);
        h.stag = Some(0xabcd_ef01);
        h.to = Some(u64::MAX);
        h.length = Some(7);
        let s = h.to_string();
        assert_eq!(
            s,
            "server-reads, ip=::1, port=9, stag=0xabcdef01, to=0xffffffffffffffff, length=7"
        );
        assert_eq!(RdmaHeader::parse(&s).unwrap(), h);
    }

    #[test]
    fn token_round_trips_and_comes_back_in_private_data() {
        let mut h = RdmaHeader::new(Scheme::ClientReads);
        h.ip = Some("127.0.0.1".parse().unwrap());
        h.port = Some(80);
        h.token = Some(0x0123_4567_89ab_cdef);
        let s = h.to_string();
        assert_eq!(
            s,
            "client-reads, ip=127.0.0.1, port=80, token=0x0123456789abcdef"
        );
        assert_eq!(RdmaHeader::parse(&s).unwrap(), h);
        h.validate_request().unwrap();
        let pd = server_private_data(h.token);
        assert_eq!(&pd[..], b"mod_rdma/1\x01\x23\x45\x67\x89\xab\xcd\xef");
        assert!(private_data_matches(&pd, 0x0123_4567_89ab_cdef));
        assert!(!private_data_matches(&pd, 0x0123_4567_89ab_cdee));
        assert!(!private_data_matches(b"mod_rdma/1", 0x0123_4567_89ab_cdef));
        assert!(!private_data_matches(&pd[..17], 0x0123_4567_89ab_cdef));
        // rxe0 hands the listener the REQ's whole private data field: the
        // answer, then zeros (56 bytes in all for rdma_cm over RoCE).
        let mut padded = pd.clone();
        padded.resize(56, 0);
        assert!(private_data_matches(&padded, 0x0123_4567_89ab_cdef));
        padded[40] = 1;
        assert!(!private_data_matches(&padded, 0x0123_4567_89ab_cdef));
        let mut longer = pd.clone();
        longer.push(b'x');
        assert!(!private_data_matches(&longer, 0x0123_4567_89ab_cdef));
    }

    #[test]
    fn whitespace_is_optional() {
        let h = RdmaHeader::parse("client-reads,ip=127.0.0.1,port=80").unwrap();
        h.validate_request().unwrap();
    }

    #[test]
    fn syntax_errors_name_the_problem() {
        assert_eq!(RdmaHeader::parse(""), Err(HeaderError::Empty));
        assert_eq!(
            RdmaHeader::parse("server-pushes, ip=1.2.3.4"),
            Err(HeaderError::UnknownScheme("server-pushes".into()))
        );
        assert_eq!(
            RdmaHeader::parse("client-reads, ip"),
            Err(HeaderError::NotKeyValue("ip".into()))
        );
        assert_eq!(
            RdmaHeader::parse("client-reads, colour=blue"),
            Err(HeaderError::UnknownKey("colour".into()))
        );
        assert_eq!(
            RdmaHeader::parse("client-reads, port=1, port=2"),
            Err(HeaderError::DuplicateKey("port".into()))
        );
        for bad in [
            "client-reads, port=0",
            "client-reads, port=65536",
            "client-reads, port=-1",
            "client-reads, port=",
            "client-reads, ip=localhost",
            "server-writes, stag=0x1ffffffff",
            "server-writes, to=0x",
            "server-writes, maxlen=12k",
            "server-writes, maxlen=99999999999999999999999",
        ] {
            assert!(
                matches!(RdmaHeader::parse(bad), Err(HeaderError::BadValue { .. })),
                "{bad}"
            );
        }
        let msg = RdmaHeader::parse("client-reads, colour=blue")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("colour") && msg.contains("known"), "{msg}");
    }

    #[test]
    fn per_scheme_requirements() {
        let ok = [
            "server-writes, ip=127.0.0.1, port=1, stag=1, to=0, maxlen=10",
            "client-reads, ip=127.0.0.1, port=1",
            "client-reads, ip=127.0.0.1, port=1, maxlen=10",
            "client-writes, ip=127.0.0.1, port=1, length=10",
            "server-reads, ip=127.0.0.1, port=1, stag=1, to=0, length=10",
        ];
        for s in ok {
            RdmaHeader::parse(s).unwrap().validate_request().unwrap();
        }
        let bad = [
            (
                "server-writes, ip=127.0.0.1, port=1, stag=1, to=0",
                "maxlen",
            ),
            ("server-writes, port=1, stag=1, to=0, maxlen=1", "ip"),
            ("client-reads, ip=127.0.0.1", "port"),
            ("client-reads, ip=127.0.0.1, port=1, stag=1", "stag"),
            ("client-writes, ip=127.0.0.1, port=1", "length"),
            ("client-writes, ip=127.0.0.1, port=1, length=1, to=3", "to"),
            ("server-reads, ip=127.0.0.1, port=1, stag=1, length=1", "to"),
            (
                "server-reads, ip=127.0.0.1, port=1, stag=1, to=1, length=1, maxlen=2",
                "maxlen",
            ),
        ];
        for (s, key) in bad {
            let e = RdmaHeader::parse(s)
                .unwrap()
                .validate_request()
                .unwrap_err();
            let k = match e {
                HeaderError::Missing { key, .. } | HeaderError::Forbidden { key, .. } => key,
                other => panic!("{s}: {other:?}"),
            };
            assert_eq!(k, key, "{s}");
        }
    }

    /// The vectors shared with mod_rdma's C parser
    /// (testdata/rdma-vectors/header.txt; format in its README.md).
    #[test]
    fn shared_vectors() {
        crate::vectors::run("header.txt", |want, input| {
            let input = unescape(input.strip_prefix(' ').unwrap_or(input));
            let got = RdmaHeader::parse(&input).and_then(|h| h.validate_request().map(|()| h));
            check_vector(want, &got).map_err(|why| format!("{why} (unescaped: {input:?})"))
        });
    }

    /// Undo the escapes `\\`, `\t`, `\v`, `\f` and `\xHH` of a vector.
    fn unescape(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'\\' {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let (byte, used) = match b[i + 1] {
                b'\\' => (b'\\', 2),
                b't' => (b'\t', 2),
                b'v' => (0x0b, 2),
                b'f' => (0x0c, 2),
                b'x' => (u8::from_str_radix(&s[i + 2..i + 4], 16).expect("\\xHH"), 4),
                c => panic!("bad escape \\{}", c as char),
            };
            out.push(byte);
            i += used;
        }
        String::from_utf8(out).expect("vectors are UTF-8")
    }

    fn vector_num(v: &str) -> u64 {
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => v.parse().unwrap(),
        }
    }

    fn error_kind(e: &HeaderError) -> &'static str {
        match e {
            HeaderError::Empty => "empty",
            HeaderError::UnknownScheme(_) => "scheme",
            HeaderError::NotKeyValue(_) => "not-kv",
            HeaderError::UnknownKey(_) => "unknown-key",
            HeaderError::DuplicateKey(_) => "duplicate",
            HeaderError::BadValue { .. } => "bad-value",
            HeaderError::Missing { .. } => "missing",
            HeaderError::Forbidden { .. } => "forbidden",
        }
    }

    fn check_vector(want: &str, got: &Result<RdmaHeader, HeaderError>) -> Result<(), String> {
        let mut words = want.split(' ');
        match (words.next(), got) {
            (Some("ok"), Err(e)) => Err(format!("expected ok, refused: {e}")),
            (Some("ok"), Ok(h)) => {
                let mut expect = RdmaHeader::new(
                    Scheme::from_token(words.next().unwrap_or("")).ok_or("bad vector scheme")?,
                );
                for kv in words {
                    let (k, v) = kv.split_once('=').ok_or("bad vector parameter")?;
                    match k {
                        "ip" => expect.ip = Some(v.parse().unwrap()),
                        "port" => expect.port = Some(vector_num(v) as u16),
                        "stag" => expect.stag = Some(vector_num(v) as u32),
                        "to" => expect.to = Some(vector_num(v)),
                        "maxlen" => expect.maxlen = Some(vector_num(v)),
                        "length" => expect.length = Some(vector_num(v)),
                        "token" => expect.token = Some(vector_num(v)),
                        _ => return Err(format!("bad vector key {k}")),
                    }
                }
                if *h == expect {
                    Ok(())
                } else {
                    Err(format!("parsed {h:?}, expected {expect:?}"))
                }
            }
            (Some("err"), Ok(h)) => Err(format!("expected an error, accepted: {h}")),
            (Some("err"), Err(e)) => match words.next() {
                Some(kind) if kind != error_kind(e) => {
                    Err(format!("expected {kind}, got {}: {e}", error_kind(e)))
                }
                _ => Ok(()),
            },
            _ => Err(format!("bad verdict {want:?}")),
        }
    }
}
