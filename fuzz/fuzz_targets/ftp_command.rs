//! Fuzz target: the FTP command line as rftpd reads it from the network
//! (line decoding, verb/argument split) and the arguments that carry
//! addresses and session parameters (PORT, EPRT, RADR). Nothing may panic;
//! what parses must survive a round trip through its canonical form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rftp::cmdline::{decode_line, parse_eprt, parse_port, parse_radr, split_command, MAX_LINE};

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_LINE + 1 {
        return;
    }
    let Ok(line) = decode_line(data.to_vec()) else {
        return;
    };
    assert!(!line.ends_with('\n'));
    let (verb, arg) = split_command(&line);
    assert!(!verb.contains(' '));
    assert_eq!(verb, verb.to_ascii_uppercase());
    if let Ok(a) = parse_port(&arg) {
        let ip = match a.ip() {
            std::net::IpAddr::V4(v4) => v4.octets(),
            std::net::IpAddr::V6(_) => panic!("PORT gave an IPv6 address"),
        };
        let canon = format!(
            "{},{},{},{},{},{}",
            ip[0],
            ip[1],
            ip[2],
            ip[3],
            a.port() >> 8,
            a.port() & 0xff
        );
        assert_eq!(parse_port(&canon).unwrap(), a);
    }
    if let Ok(a) = parse_eprt(&arg) {
        let proto = if a.is_ipv4() { 1 } else { 2 };
        let canon = format!("|{proto}|{}|{}|", a.ip(), a.port());
        assert_eq!(parse_eprt(&canon).unwrap(), a);
    }
    if let Ok(r) = parse_radr(&arg) {
        let mut canon = String::new();
        if let Some(n) = r.streams {
            canon += &format!("STREAMS={n} ");
        }
        if let Some(n) = r.block_size {
            canon += &format!("BS={n} ");
        }
        if let Some(n) = r.depth {
            canon += &format!("DEPTH={n} ");
        }
        if let Some(m) = r.mode {
            canon += &format!("MODE={m}");
        }
        assert_eq!(parse_radr(&canon).unwrap(), r);
    }
});
