//! FTP replies as rftp reads them from the network, and as rftpd writes
//! them: RFC 959 §4.2 reply lines (one line, or a multi-line reply ending
//! at the line that repeats the code followed by a space), the data
//! addresses of RFC 959 §4.1.2 `227` (PASV, scanned as RFC 1123 §4.1.2.6
//! asks) and RFC 2428 §3 `229` (EPSV), and the `200 RADR` reply of the RDMA
//! extension (`docs/RFTP.md`). Pure functions over any [`BufRead`] and over
//! strings, so they can be tested and fuzzed without a socket (the
//! `ftp_reply` fuzz target); [`crate::cmdline`] is the server's side.
//!
//! A server is not trusted: a line longer than [`MAX_REPLY_LINE`] or a
//! reply longer than [`MAX_REPLY_BYTES`] is an error, not a growing
//! buffer, and the data addresses a server names are checked against the
//! control connection's peer by [`check_data_addr`] (no FTP bounce towards
//! a third host, RFC 2577 §3).

use std::io::{self, BufRead};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rdma_xfer::Mode;

/// Reply codes of a server that lacks the RDMA extension (RADR): the
/// client falls back to plain FTP (RFC 959 §4.2: 500 syntax error, 502
/// not implemented, 504 not implemented for that parameter).
pub const FALLBACK_CODES: [u32; 3] = [500, 502, 504];

/// Longest reply line accepted, line end included. RFC 959 sets no limit;
/// rftpd's own lines stay below its 4 KiB command limit plus a path.
pub const MAX_REPLY_LINE: usize = 8192;

/// Longest whole reply accepted (all lines of a multi-line reply).
pub const MAX_REPLY_BYTES: usize = 256 << 10;

/// An FTP reply: code and text (lines joined with `'\n'`, each without its
/// line end and trailing white space; continuation lines as sent).
pub type Reply = (u32, String);

/// The flag and config key that allow data connections to an address other
/// than the control connection's peer (named in the refusal).
pub const ALLOW_FOREIGN_FLAG: &str =
    "--allow-foreign-data-addr (config key allow_foreign_data_addr = true)";

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One line up to and including `'\n'` into `line`, at most `max` bytes.
/// `Ok(false)` at end of stream before any byte.
fn read_line_bounded<R: BufRead>(r: &mut R, line: &mut Vec<u8>, max: usize) -> io::Result<bool> {
    line.clear();
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            if line.is_empty() {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the server closed the control connection after {} bytes of a reply line",
                    line.len()
                ),
            ));
        }
        let room = max - line.len();
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) if i < room => (i + 1, true),
            _ if avail.len() >= room => {
                return Err(invalid(format!(
                    "the server sent a reply line longer than {max} bytes (limit \
                     MAX_REPLY_LINE): a broken or hostile server; the control connection is \
                     abandoned"
                )))
            }
            _ => (avail.len(), false),
        };
        line.extend_from_slice(&avail[..take]);
        r.consume(take);
        if done {
            return Ok(true);
        }
    }
}

/// The reply code of a line: three digits, the first 1 to 5 (RFC 959
/// §4.2), then a space, a hyphen or the end of the line.
fn code_of(line: &str) -> Option<(u32, Option<u8>)> {
    let b = line.as_bytes();
    if b.len() < 3 || !(b'1'..=b'5').contains(&b[0]) || !b[1..3].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let sep = b.get(3).copied();
    if !matches!(sep, None | Some(b' ') | Some(b'-')) {
        return None;
    }
    let code = u32::from(b[0] - b'0') * 100 + u32::from(b[1] - b'0') * 10 + u32::from(b[2] - b'0');
    Some((code, sep))
}

/// A line's text: the bytes as UTF-8 (invalid sequences replaced; some
/// servers send Latin-1), without line end and trailing white space.
fn text_of(line: &[u8]) -> String {
    String::from_utf8_lossy(line).trim_end().to_string()
}

/// Read one reply (RFC 959 §4.2): `xyz text`, or `xyz-text`, more lines,
/// and `xyz text` (`xyz` alone is accepted as the end too). Errors:
/// end of stream (`UnexpectedEof`), a malformed first line or an
/// over-long line or reply (`InvalidData`), and the reader's own errors.
pub fn read_reply<R: BufRead>(r: &mut R) -> io::Result<Reply> {
    let mut line = Vec::new();
    if !read_line_bounded(r, &mut line, MAX_REPLY_LINE)? {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the control connection",
        ));
    }
    let first = text_of(&line);
    let Some((code, sep)) = code_of(&first) else {
        return Err(invalid(format!(
            "malformed FTP reply {:?}: a reply starts with a three-digit code (RFC 959 §4.2)",
            first.chars().take(40).collect::<String>()
        )));
    };
    let mut text = first.get(4..).unwrap_or("").to_string();
    if sep != Some(b'-') {
        return Ok((code, text));
    }
    let mut total = line.len();
    loop {
        if !read_line_bounded(r, &mut line, MAX_REPLY_LINE)? {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the server closed the control connection inside a multi-line {code} reply"
                ),
            ));
        }
        total += line.len();
        if total > MAX_REPLY_BYTES {
            return Err(invalid(format!(
                "the server's multi-line {code} reply exceeds {MAX_REPLY_BYTES} bytes (limit \
                 MAX_REPLY_BYTES): a broken or hostile server; the control connection is \
                 abandoned"
            )));
        }
        let l = text_of(&line);
        text.push('\n');
        // RFC 959 §4.2: the last line has the same code followed by Space.
        if let Some((c, None | Some(b' '))) = code_of(&l) {
            if c == code {
                text.push_str(l.get(4..).unwrap_or(""));
                return Ok((code, text));
            }
        }
        text.push_str(&l);
    }
}

/// A reply as rftpd sends it: a multi-line reply's first line `xyz-`,
/// continuation lines indented by a space (so none can look like the end),
/// and the last line `xyz `; each line ends in CRLF.
pub fn emit_reply(code: u32, text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').map(|l| l.trim_end_matches('\r')).collect();
    let last = lines.len() - 1;
    let mut s = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i == last {
            s.push_str(&format!("{code} {l}\r\n"));
        } else if i == 0 {
            s.push_str(&format!("{code}-{l}\r\n"));
        } else {
            s.push_str(&format!(" {l}\r\n"));
        }
    }
    s
}

/// The port of an RFC 2428 §3 EPSV reply: `229 text (<d><d><d>port<d>)`,
/// the delimiter `<d>` any printable ASCII character but a digit.
pub fn parse_epsv(text: &str) -> Result<u16, String> {
    let bad = || format!("bad EPSV reply {text:.80}: expected (|||port|) (RFC 2428 §3)");
    let inner = text
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inner, _)| inner)
        .ok_or_else(bad)?;
    let d = inner.chars().next().ok_or_else(bad)?;
    if !d.is_ascii_graphic() || d.is_ascii_digit() {
        return Err(bad());
    }
    let f: Vec<&str> = inner.split(d).collect();
    match f.as_slice() {
        ["", "", "", port, ""] => match port.parse::<u16>() {
            Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The address of a `227` PASV reply: six comma-separated numbers
/// `h1,h2,h3,h4,p1,p2` (RFC 959 §4.1.2), found by scanning for the first
/// digit, since servers differ in what surrounds them (RFC 1123 §4.1.2.6).
pub fn parse_pasv(text: &str) -> Result<SocketAddr, String> {
    let bad = || format!("bad PASV reply {text:.80}: expected h1,h2,h3,h4,p1,p2 (RFC 959 §4.1.2)");
    let start = text.find(|c: char| c.is_ascii_digit()).ok_or_else(bad)?;
    let mut n = [0u8; 6];
    let mut fields = text[start..].splitn(6, ',');
    for (i, slot) in n.iter_mut().enumerate() {
        let f = fields.next().ok_or_else(bad)?.trim_start();
        // The last number ends at the first non-digit.
        let f = if i == 5 {
            let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
            &f[..end]
        } else {
            f.trim_end()
        };
        if f.is_empty() || f.len() > 3 || !f.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        *slot = f.parse().map_err(|_| bad())?;
    }
    let port = u16::from(n[4]) << 8 | u16::from(n[5]);
    if port == 0 {
        return Err(bad());
    }
    Ok(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(n[0], n[1], n[2], n[3])),
        port,
    ))
}

/// What a `200 RADR ADDR=ip:port TOKEN=hex MODE=rdma|tcp [STREAMS=n]`
/// reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadrReply {
    pub addr: SocketAddr,
    pub token: u64,
    pub mode: Mode,
    pub streams: Option<u32>,
}

/// Parse the text of a `200` reply to RADR. Every key at most once;
/// unknown keys (later extensions) and words without `=` are ignored.
pub fn parse_radr_reply(text: &str) -> Result<RadrReply, String> {
    let (mut addr, mut token, mut mode, mut streams) = (None, None, None, None);
    for kv in text.split_whitespace() {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        let dup = || format!("RADR reply names {k} twice: {text:.120}");
        match k {
            "ADDR" => {
                let a: SocketAddr = v
                    .parse()
                    .map_err(|e| format!("RADR reply: bad ADDR {v:.60}: {e}"))?;
                if a.port() == 0 {
                    return Err(format!("RADR reply: ADDR {a} has port 0"));
                }
                addr.replace(a).map_or(Ok(()), |_| Err(dup()))?;
            }
            "TOKEN" => {
                if v.is_empty() || v.len() > 16 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("RADR reply: bad TOKEN {v:.40}: 1 to 16 hex digits"));
                }
                let t = u64::from_str_radix(v, 16).map_err(|e| format!("RADR token: {e}"))?;
                token.replace(t).map_or(Ok(()), |_| Err(dup()))?;
            }
            "MODE" => {
                let m: Mode = v.parse()?;
                mode.replace(m).map_or(Ok(()), |_| Err(dup()))?;
            }
            "STREAMS" => {
                let n: u32 = v
                    .parse()
                    .map_err(|_| format!("RADR reply: bad STREAMS {v:.20}"))?;
                streams.replace(n).map_or(Ok(()), |_| Err(dup()))?;
            }
            _ => {}
        }
    }
    let lacks = |k: &str| format!("RADR reply lacks {k}: {text:.120}");
    Ok(RadrReply {
        addr: addr.ok_or_else(|| lacks("ADDR="))?,
        token: token.ok_or_else(|| lacks("TOKEN="))?,
        mode: mode.ok_or_else(|| lacks("MODE="))?,
        streams,
    })
}

/// True if `a` and `b` are the same host: compared canonically, so an
/// IPv4-mapped IPv6 address (`::ffff:127.0.0.1`, RFC 4291 §2.5.5.2) equals
/// its IPv4 address.
pub fn same_host(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// The address to open a data connection to, given the address a server
/// named (`what`: "PASV reply", "RADR reply") and the control connection's
/// `peer`. An unspecified address (`0.0.0.0`, `::`) means the peer. Any
/// other address must be the peer's (compared by [`same_host`]) unless
/// `allow_foreign`: otherwise a server could make rftp connect to a third
/// host (FTP bounce the other way, RFC 2577 §3).
pub fn check_data_addr(
    named: SocketAddr,
    peer: IpAddr,
    allow_foreign: bool,
    what: &str,
) -> Result<SocketAddr, String> {
    if named.ip().is_unspecified() {
        return Ok(SocketAddr::new(peer, named.port()));
    }
    if same_host(named.ip(), peer) || allow_foreign {
        return Ok(named);
    }
    Err(format!(
        "the server's {what} names {named} for the data connection, not the control \
         connection's peer {peer}: refused, since a server could otherwise make rftp connect to \
         any host (FTP bounce, RFC 2577 §3); if this server really serves data from another \
         address, pass {ALLOW_FOREIGN_FLAG}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rd(b: &[u8]) -> io::Result<Reply> {
        read_reply(&mut io::BufReader::with_capacity(7, b))
    }

    #[test]
    fn single_and_multi_line_replies() {
        assert_eq!(rd(b"220 ready\r\n").unwrap(), (220, "ready".into()));
        assert_eq!(rd(b"200\r\n").unwrap(), (200, String::new()));
        assert_eq!(
            rd(b"211-Extensions supported:\r\n EPSV\r\n211-not the end\r\n211 End\r\n").unwrap(),
            (
                211,
                "Extensions supported:\n EPSV\n211-not the end\nEnd".into()
            )
        );
        // Another code followed by a space does not end the reply.
        assert_eq!(
            rd(b"150-a\r\n226 b\r\n150 c\r\n").unwrap(),
            (150, "a\n226 b\nc".into())
        );
        // Latin-1 text is replaced, not an error.
        assert_eq!(rd(b"550 caf\xe9\r\n").unwrap().0, 550);
        assert_eq!(rd(b"").unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            rd(b"220 no end").unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            rd(b"211-a\r\n b\r\n").unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        for bad in [
            &b"+12 x\r\n"[..],
            b"22 x\r\n",
            b"620 x\r\n",
            b"2200 x\r\n",
            b"\r\n",
        ] {
            let e = rd(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
            assert!(e.to_string().contains("RFC 959 §4.2"), "{e}");
        }
    }

    #[test]
    fn reply_bounds() {
        let mut long = b"220 ".to_vec();
        long.resize(MAX_REPLY_LINE - 2, b'x');
        long.extend_from_slice(b"\r\n");
        assert_eq!(rd(&long).unwrap().1.len(), MAX_REPLY_LINE - 6);
        let mut over = b"220 ".to_vec();
        over.resize(MAX_REPLY_LINE + 100, b'x');
        let e = rd(&over).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 8192 bytes"), "{e}");
        let mut many = b"211-start\r\n".to_vec();
        while many.len() <= MAX_REPLY_BYTES {
            many.extend_from_slice(b" more of the same\r\n");
        }
        many.extend_from_slice(b"211 End\r\n");
        let e = rd(&many).unwrap_err();
        assert!(e.to_string().contains("exceeds 262144 bytes"), "{e}");
    }

    #[test]
    fn emitted_replies_read_back() {
        for (code, text) in [
            (220, "ready"),
            (211, "Extensions:\nEPSV\n211 not the end\nEnd"),
            (257, "\"/a\"\"b\" is the current directory."),
        ] {
            let wire = emit_reply(code, text);
            let (c, t) = rd(wire.as_bytes()).unwrap();
            assert_eq!(c, code);
            let lines: Vec<&str> = text.split('\n').collect();
            let want: Vec<String> = lines
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    if i > 0 && i + 1 < lines.len() {
                        format!(" {l}")
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            assert_eq!(t, want.join("\n"));
        }
    }

    #[test]
    fn epsv_and_pasv() {
        assert_eq!(
            parse_epsv("Entering Extended Passive Mode (|||6446|)").unwrap(),
            6446
        );
        assert_eq!(parse_epsv("ok (!!!21!)").unwrap(), 21);
        for bad in [
            "(|||0|)",
            "(|||65536|)",
            "(||1|6446|)",
            "(|||+1|)",
            "(1116446|)",
            "no parens",
            "(|||6446|",
            "()",
        ] {
            assert!(parse_epsv(bad).is_err(), "{bad}");
        }
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            parse_pasv("Entering Passive Mode (127,0,0,1,4,1)").unwrap(),
            a("127.0.0.1:1025")
        );
        assert_eq!(
            parse_pasv("Entering Passive Mode 10,0,0,5,195,80.").unwrap(),
            a("10.0.0.5:50000")
        );
        assert_eq!(parse_pasv("=10, 1, 2, 3, 0, 21").unwrap(), a("10.1.2.3:21"));
        for bad in [
            "(127,0,0,1,4)",
            "(127,0,0,1,4,256)",
            "(127,0,0,1,0,0)",
            "(127,0,0,1,x,1)",
            "(127,0,0,1,0001,1)",
            "none",
        ] {
            assert!(parse_pasv(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn radr_replies() {
        let r = parse_radr_reply(
            "RADR ADDR=127.0.0.1:40123 TOKEN=9f1c0d2e3a4b5c6d MODE=rdma STREAMS=8",
        )
        .unwrap();
        assert_eq!(
            r,
            RadrReply {
                addr: "127.0.0.1:40123".parse().unwrap(),
                token: 0x9f1c_0d2e_3a4b_5c6d,
                mode: Mode::Rdma,
                streams: Some(8)
            }
        );
        let r = parse_radr_reply("RADR ADDR=[::1]:9 TOKEN=1 MODE=tcp FUTURE=x").unwrap();
        assert_eq!((r.addr.port(), r.token, r.streams), (9, 1, None));
        for (bad, why) in [
            ("RADR TOKEN=1 MODE=tcp", "lacks ADDR="),
            ("RADR ADDR=1.2.3.4:5 MODE=tcp", "lacks TOKEN="),
            ("RADR ADDR=1.2.3.4:5 TOKEN=1", "lacks MODE="),
            ("RADR ADDR=1.2.3.4:0 TOKEN=1 MODE=tcp", "port 0"),
            (
                "RADR ADDR=1.2.3.4:5 TOKEN=12345678901234567 MODE=tcp",
                "hex digits",
            ),
            ("RADR ADDR=1.2.3.4:5 TOKEN=+1 MODE=tcp", "hex digits"),
            (
                "RADR ADDR=1.2.3.4:5 ADDR=1.2.3.4:6 TOKEN=1 MODE=tcp",
                "twice",
            ),
            (
                "RADR ADDR=1.2.3.4:5 TOKEN=1 MODE=ib",
                "unknown transfer mode",
            ),
        ] {
            let e = parse_radr_reply(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn data_addresses_must_be_the_peers() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            check_data_addr(a("127.0.0.1:5"), peer, false, "PASV reply").unwrap(),
            a("127.0.0.1:5")
        );
        assert_eq!(
            check_data_addr(a("0.0.0.0:5"), peer, false, "PASV reply").unwrap(),
            a("127.0.0.1:5")
        );
        // An IPv4-mapped address is the same host.
        assert!(check_data_addr(a("[::ffff:127.0.0.1]:5"), peer, false, "x").is_ok());
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(check_data_addr(a("127.0.0.1:5"), mapped, false, "x").is_ok());
        assert!(check_data_addr(a("[::1]:5"), "::1".parse().unwrap(), false, "x").is_ok());
        let e = check_data_addr(a("10.9.8.7:25"), peer, false, "RADR reply").unwrap_err();
        assert!(e.contains("10.9.8.7:25"), "{e}");
        assert!(e.contains("--allow-foreign-data-addr"), "{e}");
        assert!(e.contains("allow_foreign_data_addr = true"), "{e}");
        assert!(check_data_addr(a("[::1]:5"), peer, false, "x").is_err());
        assert_eq!(
            check_data_addr(a("10.9.8.7:25"), peer, true, "x").unwrap(),
            a("10.9.8.7:25")
        );
    }
}
