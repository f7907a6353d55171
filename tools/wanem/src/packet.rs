//! Just enough IP parsing to spot a TCP SYN (RFC 791 / RFC 8200 headers,
//! RFC 9293 §3.1 flags) for `--drop-syn`. Anything unparsable is "not a SYN".

/// True for a TCP segment with SYN set and ACK clear: a connection request
/// (RFC 9293 §3.5), not the SYN-ACK answering it.
pub fn is_tcp_syn(p: &[u8]) -> bool {
    let (proto, l4) = match p.first().map(|b| b >> 4) {
        Some(4) => {
            if p.len() < 20 {
                return false;
            }
            let ihl = (p[0] & 0x0f) as usize * 4;
            // A non-first fragment carries no TCP header (RFC 791: fragment offset).
            let frag_off = u16::from_be_bytes([p[6], p[7]]) & 0x1fff;
            if ihl < 20 || frag_off != 0 {
                return false;
            }
            (p[9], ihl)
        }
        // IPv6 with TCP as the first next header (extension headers: not a SYN here).
        Some(6) if p.len() >= 40 => (p[6], 40),
        _ => return false,
    };
    const TCP: u8 = 6;
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    if proto != TCP || p.len() < l4 + 14 {
        return false;
    }
    let flags = p[l4 + 13];
    flags & SYN != 0 && flags & ACK == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_tcp(flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[20 + 13] = flags;
        p
    }

    #[test]
    fn syn_detection() {
        assert!(is_tcp_syn(&v4_tcp(0x02)));
        assert!(!is_tcp_syn(&v4_tcp(0x12))); // SYN-ACK
        assert!(!is_tcp_syn(&v4_tcp(0x10)));
        let mut udp = v4_tcp(0x02);
        udp[9] = 17;
        assert!(!is_tcp_syn(&udp));
        assert!(!is_tcp_syn(&v4_tcp(0x02)[..30])); // truncated
        let mut v6 = vec![0u8; 60];
        v6[0] = 0x60;
        v6[6] = 6;
        v6[40 + 13] = 0x02;
        assert!(is_tcp_syn(&v6));
        assert!(!is_tcp_syn(&[]));
    }
}
