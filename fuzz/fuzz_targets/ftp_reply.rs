//! Fuzz target: FTP replies as rftp reads them from a server it does not
//! trust (`rftp::reply`): the bounded reply reader (single and multi-line
//! replies, RFC 959 §4.2), the PASV (227) and EPSV (229) data addresses,
//! the RADR reply, and the check that a data address is the control
//! connection's peer. Nothing may panic or read past the bounds; what
//! parses must survive a round trip through its canonical form.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use rftp::reply::{
    check_data_addr, emit_reply, parse_epsv, parse_pasv, parse_radr_reply, read_reply,
    MAX_REPLY_BYTES, MAX_REPLY_LINE,
};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the reader's buffer size, so lines split across
    // reads at every position.
    let Some((&cap, stream)) = data.split_first() else {
        return;
    };
    let mut r =
        std::io::BufReader::with_capacity(usize::from(cap).max(1), std::io::Cursor::new(stream));
    let mut consumed = 0usize;
    // Replies one after another, as on a control connection.
    while let Ok((code, text)) = read_reply(&mut r) {
        assert!((100..600).contains(&code), "code {code}");
        // Bytes taken off the stream: read from it, less what is buffered.
        let now = r.get_ref().position() as usize - r.buffer().len();
        assert!(now > consumed, "a reply consumed nothing");
        assert!(
            now - consumed <= MAX_REPLY_BYTES + MAX_REPLY_LINE,
            "a reply of {} bytes passed the bounds",
            now - consumed
        );
        consumed = now;
        check_text(code, &text);
    }
    // The same bytes as reply text, once.
    if let Ok(t) = std::str::from_utf8(stream) {
        check_text(227, t);
    }
});

fn check_text(code: u32, text: &str) {
    // What rftpd would send for this text reads back the same.
    if !text.contains('\r') && text.split('\n').all(|l| l.len() < MAX_REPLY_LINE - 8) {
        let wire = emit_reply(code, text);
        if wire.len() <= MAX_REPLY_BYTES {
            let (c, t) = read_reply(&mut wire.as_bytes()).expect("an emitted reply reads back");
            assert_eq!(c, code);
            let lines: Vec<&str> = text.split('\n').collect();
            let want: Vec<String> = lines
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let l = if i > 0 && i + 1 < lines.len() {
                        format!(" {l}")
                    } else {
                        l.to_string()
                    };
                    l.trim_end().to_string()
                })
                .collect();
            assert_eq!(t, want.join("\n"));
        }
    }
    if let Ok(port) = parse_epsv(text) {
        assert_ne!(port, 0);
        assert_eq!(
            parse_epsv(&format!("Entering Extended Passive Mode (|||{port}|)")),
            Ok(port)
        );
    }
    if let Ok(a) = parse_pasv(text) {
        assert_ne!(a.port(), 0);
        let IpAddr::V4(v4) = a.ip() else {
            panic!("PASV gave an IPv6 address");
        };
        let o = v4.octets();
        let canon = format!(
            "Entering Passive Mode ({},{},{},{},{},{})",
            o[0],
            o[1],
            o[2],
            o[3],
            a.port() >> 8,
            a.port() & 0xff
        );
        assert_eq!(parse_pasv(&canon), Ok(a));
        check_addr(a);
    }
    if let Ok(rr) = parse_radr_reply(text) {
        assert_ne!(rr.addr.port(), 0);
        let mut canon = format!(
            "RADR ADDR={} TOKEN={:016x} MODE={}",
            rr.addr, rr.token, rr.mode
        );
        if let Some(n) = rr.streams {
            canon += &format!(" STREAMS={n}");
        }
        assert_eq!(parse_radr_reply(&canon), Ok(rr));
        check_addr(rr.addr);
    }
}

/// A named address passes the peer check only if it is the peer (or
/// unspecified), whatever the family; allowing foreign addresses passes it
/// unchanged.
fn check_addr(named: SocketAddr) {
    let peer = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    match check_data_addr(named, peer, false, "fuzz") {
        Ok(a) => {
            assert_eq!(a.port(), named.port());
            assert_eq!(a.ip().to_canonical(), peer, "{named} passed as the peer");
        }
        Err(e) => {
            assert!(!named.ip().is_unspecified());
            assert_ne!(named.ip().to_canonical(), peer);
            assert!(e.contains("--allow-foreign-data-addr"), "{e}");
        }
    }
    if !named.ip().is_unspecified() {
        assert_eq!(check_data_addr(named, peer, true, "fuzz"), Ok(named));
    }
}
