//! Sizing FPDUs to the TCP path (RFC 5044 §8) and the data-path socket
//! options, including the per-connection congestion control
//! (`TCP_CONGESTION`, tcp(7)).

use std::time::Duration;

use socket2::{Socket, TcpKeepalive};

/// Largest ULPDU we let the engine build: 16-bit MPA length field, rounded
/// down to a multiple of 4.
pub const MULPDU_CAP: u32 = 65532;

/// MULPDU (largest DDP segment incl. its header) for a TCP connection with
/// maximum segment size `mss` (`TCP_MAXSEG`).
///
/// RFC 5044 sizes FPDUs to fit the effective MSS (EMSS): an FPDU is the
/// 2-byte ULPDU length, the ULPDU, 0-3 pad bytes and the 4-byte CRC field
/// (always present on the wire, zero when CRC is off), plus with markers a
/// 4-byte marker every 512 bytes of the stream. Hence, as in RFC 5044:
/// `MULPDU = EMSS - (6 + EMSS mod 4)` without markers and
/// `MULPDU = EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)` with them.
/// Capped at [`MULPDU_CAP`] (an MSS above 64 KiB, e.g. with large MTUs on
/// loopback, cannot be used whole) and floored at
/// 128 bytes so a broken MSS report cannot stall the stream.
pub fn mulpdu_for_mss(mss: u32, markers: bool) -> u32 {
    let emss = mss.clamp(256, 1 << 20);
    let mut overhead = 6 + emss % 4;
    if markers {
        overhead += 4 * emss.div_ceil(512);
    }
    emss.saturating_sub(overhead).clamp(128, MULPDU_CAP)
}

/// MULPDU for a connection: FPDUs as large as one TCP send of `k` whole
/// segments (a GSO super-segment), up to [`MULPDU_CAP`].
///
/// RFC 5044 §8 asks a sender to align FPDUs with TCP segments (a SHOULD;
/// a receiver must accept FPDUs that span segments, and every receiver
/// here does), and the formula of [`mulpdu_for_mss`] gives one FPDU per
/// segment. Linux siw, the implementation this stack must interoperate
/// with, instead sizes FPDUs to `mss_cache * gso_segs`
/// (`siw_update_tcpseg` in `siw_qp_tx.c`): one FPDU per GSO send, which
/// the kernel then cuts into MSS segments. On an Ethernet MTU (MSS 1448)
/// the per-segment rule means 45 FPDUs, headers, CRC set-ups and receive
/// system calls for every 64 KiB, and measured 0.67x raw TCP for 1 MiB
/// RDMA Writes over a veth pair; 64 KiB FPDUs remove that overhead. So,
/// like siw, we use the largest multiple `k * mss` that fits the 16-bit
/// ULPDU length, keeping FPDU boundaries on segment boundaries whenever
/// FPDUs are full.
///
/// With markers we keep one FPDU per segment: markers exist for receivers
/// that recover FPDU boundaries segment by segment, and the Wireshark
/// dissector finds them only in an FPDU alone in its segment.
pub fn mulpdu_for_path(mss: u32, markers: bool) -> u32 {
    if markers {
        return mulpdu_for_mss(mss, true);
    }
    let mss = mss.clamp(256, 1 << 20);
    let k = ((MULPDU_CAP + 6) / mss).max(1);
    mulpdu_for_mss(k * mss, false)
}

/// Apply the data-path socket options beyond `TCP_NODELAY` (which the
/// connection manager sets before the MPA exchange): keepalive. Errors
/// are logged, not fatal: they only cost performance. On a listening
/// socket, every accepted connection inherits them.
pub(crate) fn tune_socket(sock: &Socket) {
    // Keepalive notices a peer that vanished without FIN/RST (power loss,
    // cable pulled) within about 45 s. SO_SNDBUF/SO_RCVBUF are left to
    // Linux autotuning, which sizes them better than a fixed value.
    // `set_tcp_keepalive` turns SO_KEEPALIVE on itself.
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::warn!(error = %e, "TCP keepalive setup failed");
    }
}

/// Set `TCP_CONGESTION` on `sock` (tcp(7)). `name` is already checked
/// (at most
/// [`TCP_CA_NAME_MAX_LEN`](iwarp_verbs::cm_types::TCP_CA_NAME_MAX_LEN) bytes). Set before `connect` on an
/// active socket, so the first window of data is already paced by the
/// chosen algorithm; on a listening socket, the connections it accepts
/// inherit it.
pub(crate) fn set_congestion(sock: &Socket, name: &str) -> std::io::Result<()> {
    sock.set_tcp_congestion(name.as_bytes())
}

/// The congestion-control algorithm `sock` uses (getsockopt(2)
/// `TCP_CONGESTION`: the name, NUL-padded to `TCP_CA_NAME_MAX`).
pub(crate) fn congestion(sock: &Socket) -> std::io::Result<String> {
    let raw = sock.tcp_congestion()?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Ok(String::from_utf8_lossy(&raw[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn mulpdu_fits_the_mss() {
        // Ethernet MSS 1460: FPDU = 2 + ULPDU + pad + 4 must fit.
        let m = mulpdu_for_mss(1460, false);
        assert_eq!(m, 1460 - 6);
        assert_eq!(iwarp_proto::wire::mpa::fpdu_len(m as usize, true), 1460);
        // With markers, 4 bytes per 512 of stream are lost as well.
        let mk = mulpdu_for_mss(1460, true);
        assert_eq!(mk, 1460 - (6 + 4 * 3));
        // 9000-byte jumbo frames, odd MSS.
        assert_eq!(mulpdu_for_mss(8947, false), 8947 - 6 - 3);
        assert!(iwarp_proto::wire::mpa::fpdu_len(8938, false) <= 8947);
        // Loopback MSS (65483) still fits the 16-bit ULPDU length field;
        // anything larger is capped.
        assert_eq!(mulpdu_for_mss(65483, false), 65474);
        assert_eq!(mulpdu_for_mss(200_000, false), MULPDU_CAP);
        // Nonsense inputs are clamped.
        assert!(mulpdu_for_mss(0, true) >= 128);
        assert_eq!(mulpdu_for_mss(u32::MAX, false), MULPDU_CAP);
    }

    #[test]
    pub(super) fn mulpdu_for_path_uses_whole_segments_up_to_64k() {
        use iwarp_proto::wire::mpa::fpdu_len;
        // Ethernet (MSS 1448): 45 segments per FPDU, exactly.
        let m = mulpdu_for_path(1448, false);
        assert_eq!(fpdu_len(m as usize, true), 45 * 1448);
        assert!(m <= MULPDU_CAP);
        // Jumbo frames (MSS 8948): 7 segments.
        let j = mulpdu_for_path(8948, false);
        assert_eq!(fpdu_len(j as usize, true), 7 * 8948);
        // Loopback: one segment already holds 64 KiB; early-connection
        // MSS of 32 KiB gives two segments.
        assert_eq!(mulpdu_for_path(65483, false), 65474);
        assert_eq!(
            fpdu_len(mulpdu_for_path(32768, false) as usize, true),
            65536
        );
        // With markers, one FPDU per segment as before.
        assert_eq!(mulpdu_for_path(1448, true), mulpdu_for_mss(1448, true));
        // Nonsense inputs stay in range.
        for mss in [0, 1, 255, 257, 100_000, u32::MAX] {
            let m = mulpdu_for_path(mss, false);
            assert!((128..=MULPDU_CAP).contains(&m), "mss {mss}: {m}");
        }
    }

    #[test]
    fn congestion_round_trips_on_a_socket() {
        use socket2::{Domain, Protocol, Type};
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        // reno is built into every Linux kernel (net/ipv4/tcp_cong.c).
        set_congestion(&sock, "reno").unwrap();
        assert_eq!(congestion(&sock).unwrap(), "reno");
        let e = set_congestion(&sock, "nosuch").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        assert!(iwarp_verbs::cm_types::available_congestion_control()
            .iter()
            .any(|a| a == "reno"));
    }
}
