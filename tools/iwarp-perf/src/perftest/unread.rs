//! Why a control message never arrived: bytes that wait, unread by the
//! device, in a TCP receive queue of this host.
//!
//! Linux siw (`siw_cm.c`, `siw_accept`) sends the MPA Reply and only then
//! points the socket's receive upcall at the queue pair
//! (`siw_qp_socket_assoc`). An FPDU that arrives in between finds the
//! connection manager's upcall, which ignores data in the RDMA_MODE state,
//! and siw reads the socket again only when more data comes. perftest's
//! client sends its first control message as soon as the connection is
//! ESTABLISHED and then waits for the answer, so nothing more comes: both
//! ends wait until one gives up. A loaded host (a vCPU of the guest held
//! between the two calls) widens the window (session 9: one
//! `read_lat-ptcli` in three stressed runs).
//!
//! No user-space code can read those bytes (the socket is the kernel
//! device's), so the run cannot be saved, but it can be told apart from
//! a message that was never sent: the connection's entry in
//! `/proc/net/tcp` shows them (`rx_queue`, RFC 793's RCV.NXT minus what
//! the owner consumed). When both ends are on this host (the guest runs
//! both), the peer's socket is in the table too, so a message of ours
//! that the peer's device never read shows the same way.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The phrase every diagnosis carries (the interop script looks for it).
pub const TAG: &str = "unread in a TCP receive queue";

/// How long a count must stay the same to count as stuck: a device reads
/// what arrives in its receive upcall, so bytes that are merely in flight
/// are gone well within this.
const SETTLE: Duration = Duration::from_millis(200);

/// The `rx_queue` of the IPv4 TCP connection `local` -> `remote` in
/// `table` (the text of `/proc/net/tcp`): `None` if the connection is not
/// in it, not ESTABLISHED, or not IPv4.
pub fn rx_queue(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let (SocketAddr::V4(l), SocketAddr::V4(r)) = (local, remote) else {
        return None;
    };
    table.lines().skip(1).find_map(|line| {
        // sl local_address rem_address st tx_queue:rx_queue ...
        let mut f = line.split_whitespace().skip(1);
        let (la, ra, st, queues) = (f.next()?, f.next()?, f.next()?, f.next()?);
        if st != "01"
            || endpoint(la)? != (*l.ip(), l.port())
            || endpoint(ra)? != (*r.ip(), r.port())
        {
            return None;
        }
        u64::from_str_radix(queues.split_once(':')?.1, 16).ok()
    })
}

/// `0100007F:0CEA` -> (127.0.0.1, 3306): the address is the raw
/// (network-order) word printed as a native integer, the port in host
/// order.
fn endpoint(s: &str) -> Option<(Ipv4Addr, u16)> {
    let (a, p) = s.split_once(':')?;
    if a.len() != 8 {
        return None;
    }
    let a = u32::from_str_radix(a, 16).ok()?;
    let p = u16::from_str_radix(p, 16).ok()?;
    Some((Ipv4Addr::from(a.to_ne_bytes()), p))
}

fn table() -> Option<String> {
    std::fs::read_to_string("/proc/net/tcp").ok()
}

/// Stuck bytes on the connection `local` <-> `peer`: the peer's bytes in
/// our receive queue, or ours in the peer's (visible when the peer is on
/// this host), each the same count twice [`SETTLE`] apart. A sentence for
/// an error message, or `None`.
pub fn diagnose(local: Option<SocketAddr>, peer: Option<SocketAddr>) -> Option<String> {
    let (local, peer) = (local?, peer?);
    let look = |t: &str| (rx_queue(t, local, peer), rx_queue(t, peer, local));
    let first = look(&table()?);
    if first.0.unwrap_or(0) == 0 && first.1.unwrap_or(0) == 0 {
        return None;
    }
    std::thread::sleep(SETTLE);
    let again = look(&table()?);
    let why = "Linux siw's accept race: a message that reaches the passive side between its MPA \
               Reply and siw_qp_socket_assoc is never read (the device reads the socket again \
               only when more data comes); not this program's, see docs/TESTING.md, \"Linux siw's accept race\"";
    match (first, again) {
        ((Some(n), _), (Some(m), _)) if n > 0 && n == m => Some(format!(
            "{n} bytes from {peer} wait {TAG} of this host (connection {local} <- {peer}): \
             the device never read them; {why}"
        )),
        ((_, Some(n)), (_, Some(m))) if n > 0 && n == m => Some(format!(
            "{n} bytes we sent wait {TAG} of this host, the peer's (connection {peer} <- \
             {local}): the peer's device never read them; {why}"
        )),
        _ => None,
    }
}

/// The wait's error, with the diagnosis appended when there is one.
pub fn explain(e: String, local: Option<SocketAddr>, peer: Option<SocketAddr>) -> String {
    match diagnose(local, peer) {
        Some(d) => {
            // Logged at once too: a caller killed while it tears the
            // connection down still leaves the diagnosis behind.
            tracing::warn!("{d}");
            format!("{e}; {d}")
        }
        None => e,
    }
}

/// For tests: an IPv4 socket address.
#[cfg(test)]
fn v4(a: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::from(a)), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two ends of one connection in the guest (10.77.0.2, server port
    // 18706 = 0x4912), as /proc/net/tcp shows them on x86-64 (little
    // endian): the server's side holds 16 unread bytes (the version), the
    // client's none; plus the listener and a TIME_WAIT entry on the same
    // port with a nonzero queue that must not count.
    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:4912 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2345 1 0000000000000000 100 0 0 10 0
   1: 02004D0A:4912 02004D0A:A1B2 01 00000000:00000014 00:00000000 00000000     0        0 0 1 0000000000000000 20 4 30 10 -1
   2: 02004D0A:A1B2 02004D0A:4912 01 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 20 4 30 10 -1
   3: 02004D0A:4912 02004D0A:C000 06 00000000:00000008 03:00000E21 00000000     0        0 0 3 0000000000000000
";

    #[test]
    fn finds_the_unread_bytes_of_one_direction() {
        if cfg!(target_endian = "big") {
            return; // the table above is a little-endian host's
        }
        let server = v4([10, 77, 0, 2], 18706);
        let client = v4([10, 77, 0, 2], 0xA1B2);
        assert_eq!(rx_queue(TABLE, server, client), Some(0x14));
        assert_eq!(rx_queue(TABLE, client, server), Some(0));
        // Not ESTABLISHED (TIME_WAIT), or not there at all.
        assert_eq!(rx_queue(TABLE, server, v4([10, 77, 0, 2], 0xC000)), None);
        assert_eq!(rx_queue(TABLE, server, v4([10, 77, 0, 3], 0xA1B2)), None);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let t = "header\n 0: 0200:4912 x 01 0:14\n 1: zz\n\n";
        assert_eq!(
            rx_queue(t, v4([10, 77, 0, 2], 18706), v4([1, 2, 3, 4], 1)),
            None
        );
        let v6 = "[::1]:5".parse().unwrap();
        assert_eq!(rx_queue(TABLE, v6, v6), None);
    }

    #[test]
    fn endpoints_decode_as_the_kernel_prints_them() {
        if cfg!(target_endian = "big") {
            return;
        }
        assert_eq!(endpoint("0100007F:0CEA"), Some((Ipv4Addr::LOCALHOST, 3306)));
        assert_eq!(endpoint("0100007F"), None);
        assert_eq!(endpoint("00007F:0CEA"), None);
    }

    /// A live connection on loopback whose server never reads: the
    /// diagnosis finds the client's 16 bytes from either end (as our
    /// server would, and as our client would with the peer on this host),
    /// and nothing once they are read.
    #[test]
    fn live_unread_bytes_are_named_from_both_ends() {
        use std::io::{Read, Write};
        let Ok(l) = std::net::TcpListener::bind("127.0.0.1:0") else {
            return; // no loopback here: nothing to look at
        };
        if table().is_none() {
            return; // no /proc/net/tcp (not Linux, or no procfs)
        }
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let (sl, cl) = (s.local_addr().unwrap(), c.local_addr().unwrap());
        c.write_all(&[7u8; 16]).unwrap();
        // Bounded wait until loopback has queued them at the server.
        let t0 = std::time::Instant::now();
        while rx_queue(&table().unwrap(), sl, cl) != Some(16) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the 16 bytes never showed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let ours = diagnose(Some(sl), Some(cl)).expect("the server's unread bytes");
        assert!(
            ours.contains(TAG) && ours.contains("16 bytes from"),
            "{ours}"
        );
        let theirs = diagnose(Some(cl), Some(sl)).expect("the bytes the client sent");
        assert!(
            theirs.contains(TAG) && theirs.contains("16 bytes we sent"),
            "{theirs}"
        );
        let mut b = [0u8; 16];
        s.read_exact(&mut b).unwrap();
        assert_eq!(diagnose(Some(sl), Some(cl)), None);
        assert_eq!(explain("e".into(), Some(sl), Some(cl)), "e");
    }

    #[test]
    fn no_addresses_no_diagnosis() {
        assert_eq!(diagnose(None, Some(v4([1, 2, 3, 4], 5))), None);
        assert_eq!(explain("e".into(), None, None), "e");
    }
}
