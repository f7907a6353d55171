//! What the first bytes of an accepted connection say about it: an MPA
//! Request (an iWARP peer, RFC 5044 §7.1: the Request starts with the
//! 16-byte key "MPA ID Req Frame") or a plain TCP client. A leaf module
//! (no I/O, nothing of this crate): [`crate::attach`] and
//! [`crate::settle`] both decide with it.

/// The 16 bytes an MPA Request starts with (RFC 5044 §7.1, "MPA ID Req
/// Frame"): iwarp-proto's key, the one definition in the workspace.
pub use iwarp_proto::wire::mpa::KEY_REQ as MPA_REQ_KEY;

/// What the first bytes of an accepted connection say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstBytes {
    /// They start with [`MPA_REQ_KEY`]: an MPA Request, an iWARP peer.
    Mpa,
    /// They differ from [`MPA_REQ_KEY`] somewhere: a plain TCP client.
    Plain,
    /// A proper prefix of [`MPA_REQ_KEY`] (or nothing): wait for more.
    NeedMore,
}

/// The decision [`crate::attach::peek_is_mpa`] takes on the bytes peeked so far, without
/// any I/O. Only the first 16 bytes are looked at, so once the answer is
/// [`FirstBytes::Mpa`] or [`FirstBytes::Plain`] more bytes never change it.
pub fn classify_first_bytes(buf: &[u8]) -> FirstBytes {
    let n = buf.len().min(MPA_REQ_KEY.len());
    if buf[..n] != MPA_REQ_KEY[..n] {
        FirstBytes::Plain
    } else if n == MPA_REQ_KEY.len() {
        FirstBytes::Mpa
    } else {
        FirstBytes::NeedMore
    }
}

#[cfg(test)]
mod tests {
    use super::{classify_first_bytes, FirstBytes, MPA_REQ_KEY};

    #[test]
    fn mpa_key_and_a_whole_request_are_mpa() {
        assert_eq!(classify_first_bytes(MPA_REQ_KEY), FirstBytes::Mpa);
        // siw's default Request (siw-default.pcap).
        let req = b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01";
        assert_eq!(classify_first_bytes(req), FirstBytes::Mpa);
    }

    #[test]
    fn partial_key_needs_more() {
        for n in 1..MPA_REQ_KEY.len() {
            assert_eq!(
                classify_first_bytes(&MPA_REQ_KEY[..n]),
                FirstBytes::NeedMore,
                "{n} bytes"
            );
        }
    }

    #[test]
    fn empty_needs_more() {
        assert_eq!(classify_first_bytes(b""), FirstBytes::NeedMore);
    }

    #[test]
    fn plain_http_and_near_misses_are_plain() {
        assert_eq!(
            classify_first_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            FirstBytes::Plain
        );
        assert_eq!(classify_first_bytes(b"G"), FirstBytes::Plain);
        // A Reply key, or a Request key differing in its last byte.
        assert_eq!(classify_first_bytes(b"MPA ID Rep Frame"), FirstBytes::Plain);
        assert_eq!(classify_first_bytes(b"MPA ID Req Fram!"), FirstBytes::Plain);
        // Differs early, before the peer has sent 16 bytes.
        assert_eq!(classify_first_bytes(b"MPB"), FirstBytes::Plain);
    }
}
