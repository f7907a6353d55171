//! The FTP command line as rftpd reads it from the network: one line, its
//! verb and argument, and the arguments that carry addresses and session
//! parameters (PORT, EPRT, RADR). Pure functions over bytes and strings,
//! so they can be tested and fuzzed without a socket.

use std::net::{IpAddr, SocketAddr};

use rdma_xfer::Mode;

/// Longest command line accepted (RFC 959 sets no limit; 4 KiB is ample).
pub const MAX_LINE: usize = 4096;

/// An FTP reply: code and text.
pub type Reply = (u32, String);

/// The text of one line read up to and including its `\n`: Telnet IAC
/// sequences dropped (RFC 959 §4.1.3: they may precede ABOR), then UTF-8,
/// without the line end.
pub fn decode_line(mut buf: Vec<u8>) -> Result<String, Reply> {
    buf.retain(|&b| b < 0xf0);
    match String::from_utf8(buf) {
        Ok(s) => Ok(s.trim_end_matches(['\r', '\n']).to_string()),
        Err(_) => Err((501, "Command is not valid UTF-8.".into())),
    }
}

/// Verb (upper case) and argument (as sent) of a command line.
pub fn split_command(line: &str) -> (String, String) {
    match line.split_once(' ') {
        Some((v, a)) => (v.to_ascii_uppercase(), a.to_string()),
        None => (line.to_ascii_uppercase(), String::new()),
    }
}

/// RFC 959 §4.1.2 PORT: `h1,h2,h3,h4,p1,p2`.
pub fn parse_port(arg: &str) -> Result<SocketAddr, Reply> {
    let n: Vec<u8> = arg
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    if n.len() != 6 {
        return Err((501, "PORT syntax: h1,h2,h3,h4,p1,p2".into()));
    }
    Ok(SocketAddr::from((
        [n[0], n[1], n[2], n[3]],
        u16::from(n[4]) << 8 | u16::from(n[5]),
    )))
}

/// RFC 2428 §2 EPRT: `<d>proto<d>address<d>port<d>`, any delimiter.
pub fn parse_eprt(arg: &str) -> Result<SocketAddr, Reply> {
    let d = arg.chars().next().unwrap_or('|');
    let f: Vec<&str> = arg.split(d).collect();
    if f.len() < 5 {
        return Err((501, "EPRT syntax: |proto|address|port|".into()));
    }
    match (f[2].parse::<IpAddr>(), f[3].parse::<u16>()) {
        (Ok(ip), Ok(port)) => Ok(SocketAddr::new(ip, port)),
        _ => Err((501, "EPRT: bad address or port.".into())),
    }
}

/// What a RADR command asks for (`docs/RFTP.md`): each value as sent;
/// the server clamps them to its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RadrArgs {
    pub streams: Option<u32>,
    pub block_size: Option<u32>,
    pub depth: Option<u32>,
    pub mode: Option<Mode>,
}

/// Parse `RADR [STREAMS=n] [BS=n] [DEPTH=n] [MODE=rdma|tcp]`.
pub fn parse_radr(arg: &str) -> Result<RadrArgs, Reply> {
    let mut a = RadrArgs::default();
    for kv in arg.split_whitespace() {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let num = v.parse::<u32>();
        match (k.to_ascii_uppercase().as_str(), num) {
            ("STREAMS", Ok(n)) => a.streams = Some(n),
            ("BS", Ok(n)) => a.block_size = Some(n),
            ("DEPTH", Ok(n)) => a.depth = Some(n),
            ("MODE", _) => match v.parse() {
                Ok(m) => a.mode = Some(m),
                Err(e) => return Err((501, e)),
            },
            _ => return Err((501, format!("RADR: bad parameter {kv:.40}"))),
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_verbs_and_iac() {
        assert_eq!(
            decode_line(b"\xff\xf4\xff\xf2ABOR\r\n".to_vec()).unwrap(),
            "ABOR"
        );
        assert_eq!(decode_line(b"NOOP\n".to_vec()).unwrap(), "NOOP");
        assert_eq!(decode_line(b"USER \xc3\n".to_vec()).unwrap_err().0, 501);
        assert_eq!(
            split_command("retr a b.txt"),
            ("RETR".into(), "a b.txt".into())
        );
        assert_eq!(split_command("pwd"), ("PWD".into(), String::new()));
    }

    #[test]
    fn port_and_eprt() {
        assert_eq!(
            parse_port("127,0,0,1,4,1").unwrap(),
            "127.0.0.1:1025".parse().unwrap()
        );
        assert_eq!(parse_port("127,0,0,1,4").unwrap_err().0, 501);
        assert_eq!(parse_port("127,0,0,1,4,256").unwrap_err().0, 501);
        assert_eq!(
            parse_eprt("|2|::1|2000|").unwrap(),
            "[::1]:2000".parse().unwrap()
        );
        assert_eq!(
            parse_eprt("!1!10.0.0.1!21!").unwrap(),
            "10.0.0.1:21".parse().unwrap()
        );
        assert_eq!(parse_eprt("|1|10.0.0.1|").unwrap_err().0, 501);
        assert_eq!(parse_eprt("|1|10.0.0.999|21|").unwrap_err().0, 501);
        assert_eq!(parse_eprt("").unwrap_err().0, 501);
    }

    #[test]
    fn radr_arguments() {
        assert_eq!(
            parse_radr("STREAMS=8 bs=65536 DEPTH=2 MODE=tcp").unwrap(),
            RadrArgs {
                streams: Some(8),
                block_size: Some(65536),
                depth: Some(2),
                mode: Some(Mode::Tcp)
            }
        );
        assert_eq!(parse_radr("").unwrap(), RadrArgs::default());
        assert!(parse_radr("STREAMS=x")
            .unwrap_err()
            .1
            .contains("bad parameter"));
        assert!(parse_radr("MODE=ib")
            .unwrap_err()
            .1
            .contains("unknown transfer mode"));
        assert!(parse_radr("COLOUR=blue").is_err());
    }
}
