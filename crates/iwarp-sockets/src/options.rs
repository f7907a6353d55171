//! What a stream is made of: ring sizes, queue depths, the connection's
//! MPA terms, and the switches of the enhanced design, so that the
//! paper's "basic" and "enhanced" socket designs can be measured side by
//! side.

use std::time::Duration;

use iwarp::cm::{CongestionControl, MpaConfig, TcpConnect};

/// The socket design a stream follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// Every enhancement on (the default): integrated buffering (one copy
    /// into the registered send ring, one copy out of the receive ring),
    /// coalescing by append, zero copy above [`Options::zcopy_threshold`].
    Enhanced,
    /// The paper's basic design, for comparison: each side also copies
    /// through a private buffer of its own (user buffer → private buffer
    /// → registered ring, and back), every `write` is its own message, no
    /// zero copy. [`Options::basic`] also turns on the socket-level flow
    /// control of [`Options::ack_each`].
    Basic,
}

/// How a stream is set up; [`Options::default`] is rsocket.c's defaults
/// with the enhanced design.
#[derive(Debug, Clone)]
pub struct Options {
    /// Send ring bytes (`SO_SNDBUF`; default 1 MiB, rsocket.c's `def_wmem`
    /// is 128 KiB).
    pub sbuf_size: u32,
    /// Receive ring bytes (`SO_RCVBUF`; default 1 MiB, rsocket.c's
    /// `def_mem` is 128 KiB). The peer may write two halves of it before
    /// the next credit update, so it bounds the data in flight: 128 KiB
    /// held a single loopback stream to about 7 Gbit/s, 1 MiB lets it
    /// reach 15-18 (docs/BENCHMARKS.md). Each side advertises its own, so
    /// a real rsocket peer keeps its sizes.
    pub rbuf_size: u32,
    /// How large the receive ring may grow (bytes; `None`: the kernel's
    /// limit for a TCP receive buffer, `net.ipv4.tcp_rmem`'s third value).
    /// The ring starts at `rbuf_size` and doubles, once per wrap, while
    /// the stream reads more than half of it per round trip (see
    /// [`crate::tune`]): a 1 MiB ring holds a 50 ms path to about 168
    /// Mbit/s, 8 MiB to 1.3 Gbit/s. At most `rbuf_size` (or `Some(0)`)
    /// turns growth off. The wire does not change: rsockets peers write
    /// where our target-SGL entries point.
    pub rbuf_max: Option<u32>,
    /// Send queue entries (rsocket.c `def_sqsize`, 384).
    pub sq_size: u16,
    /// Receive queue entries and credits granted (rsocket.c `def_rqsize`).
    pub rq_size: u16,
    /// The MPA terms (RFC 5044 / RFC 6581) of the connection.
    pub mpa: MpaConfig,
    /// Bound on connection setup: the TCP connect plus the MPA exchange,
    /// or the MPA exchange alone under [`TcpConnect::Kernel`]; the MPA
    /// exchange always gets at least `iwarp::cm::MPA_WAIT_RTTS` round
    /// trips of the path.
    pub connect_timeout: Duration,
    /// What bounds the TCP handshake of `connect` (see
    /// [`iwarp::cm::TcpConnect`]). A handshake that never completed is
    /// told apart from a peer that does not speak MPA by
    /// [`crate::never_reached_tcp`].
    pub tcp_connect: TcpConnect,
    /// The design; see [`Design`].
    pub design: Design,
    /// Coalescing by append: a small write that finds earlier data still
    /// waiting for the wire joins the message being built instead of
    /// taking a message of its own; nothing is ever held back for more
    /// data once the wire is idle. Ignored by [`Design::Basic`].
    pub coalesce: bool,
    /// Writes of at least this many bytes go by zero copy: the caller's
    /// buffer is registered and RDMA-Written straight to the peer's ring,
    /// and `write` returns once the last Write has left (`None`: never,
    /// the default: on loopback the copy into the ring, which lets the
    /// next write overlap the transfer, was as fast or faster at every
    /// size up to 4 MiB; see docs/BENCHMARKS.md). Ignored by
    /// [`Design::Basic`] and by non-blocking streams.
    pub zcopy_threshold: Option<usize>,
    /// The seed paper's socket-level flow control, on top of the ring
    /// credits: the reader returns a credit (`RS_OP_SGL`) after every
    /// message it reads, not after half the window. Only between two ends
    /// that both set it (each then keeps `rq_size` more receives posted
    /// for the other's updates; the private conn-data flag
    /// [`CONN_FLAG_ACK_EACH`](crate::wire::CONN_FLAG_ACK_EACH) says so);
    /// toward rsocket.c, which could not absorb them, it stays off. On by
    /// [`Options::basic`], off by default: the enhanced design has none
    /// ("no redundant flow control").
    pub ack_each: bool,
    /// Busy polling: a blocked `read` or `write` does the receive work of
    /// its own connection in a loop instead of sleeping (lowest latency,
    /// one CPU busy while it waits).
    pub busy_poll: bool,
    /// Keepalive: a zero-length RDMA Write every
    /// [`KEEPALIVE_TICK`](crate::progress::KEEPALIVE_TICK) (`SO_KEEPALIVE`).
    pub keepalive: bool,
    /// How long `close` waits without progress for queued data and the
    /// disconnect message to leave before it drops the connection anyway
    /// (while the peer keeps taking data, `close` keeps waiting).
    pub linger: Duration,
    /// Entries of the iomap table this side advertises (`RDMA_IOMAPSIZE`,
    /// rsocket.c's `iomap_size`, default 0 there and here): how many
    /// `riomap` mappings the *peer* may announce to us, so that our
    /// `riowrite` can reach them. Rounded as `target_iomap_size` carries it
    /// (exact up to 128, then multiples of 256).
    pub iomap_size: u16,
    /// The TCP congestion-control algorithm of the stream's TCP
    /// connection (`TCP_CONGESTION`, tcp(7); `None`: the kernel's
    /// default). A connecting stream sets it before the TCP connect, a
    /// listener on its listening socket (accepted streams inherit it) and
    /// on each accepted connection. rsockets itself keeps no such option:
    /// this is what the kernel's `setsockopt(IPPROTO_TCP, TCP_CONGESTION)`
    /// does for a TCP socket, passed to the TCP connection below the
    /// stream ([`Stream::set_tcp_congestion`](crate::Stream::set_tcp_congestion)
    /// changes it on a live stream). Which to pick: docs/SOCKETS.md,
    /// "Congestion control".
    pub congestion: Option<CongestionControl>,
}

/// A zero-copy threshold for hosts where copies are dear (set it in
/// [`Options::zcopy_threshold`] or `IWARP_SOCKETS_ZCOPY`); not the default,
/// see there.
pub const DEFAULT_ZCOPY_THRESHOLD: usize = 256 * 1024;

impl Default for Options {
    fn default() -> Options {
        Options {
            sbuf_size: 1 << 20,
            rbuf_size: 1 << 20,
            rbuf_max: None,
            sq_size: 384,
            rq_size: 384,
            mpa: MpaConfig::default(),
            connect_timeout: Duration::from_secs(5),
            tcp_connect: TcpConnect::WithinTimeout,
            design: Design::Enhanced,
            coalesce: true,
            zcopy_threshold: None,
            ack_each: false,
            busy_poll: false,
            keepalive: false,
            linger: Duration::from_secs(1),
            iomap_size: 0,
            congestion: None,
        }
    }
}

impl Options {
    /// The paper's basic design with the same sizes.
    pub fn basic() -> Options {
        Options {
            design: Design::Basic,
            coalesce: false,
            zcopy_threshold: None,
            ack_each: true,
            ..Options::default()
        }
    }

    /// Options from the environment, over the defaults:
    /// `IWARP_SOCKETS_DESIGN` (`enhanced` | `basic`), `IWARP_SOCKETS_SBUF`,
    /// `IWARP_SOCKETS_RBUF` (bytes), `IWARP_SOCKETS_RBUF_MAX` (bytes, or
    /// `off`: the ring does not grow), `IWARP_SOCKETS_ZCOPY` (bytes, or
    /// `off`), `IWARP_SOCKETS_COALESCE` (`0`/`1`), `IWARP_SOCKETS_BUSY_POLL`
    /// (`0`/`1`), `IWARP_SOCKETS_ACK_EACH` (`0`/`1`, after the design),
    /// `IWARP_SOCKETS_CRC` (`on`/`off`/`optional`),
    /// `IWARP_SOCKETS_IOMAP_SIZE` (entries of the iomap table),
    /// `IWARP_SOCKETS_CONGESTION` (a TCP congestion-control name: `reno`,
    /// `cubic`, `bbr`, ...). Values that do not parse are reported and
    /// ignored. In a privileged process (setuid...) all of them are
    /// ignored ([`iwarp_proto::env`]).
    pub fn from_env() -> Options {
        // Unset in a privileged process (iwarp_proto::env).
        Options::from_vars(|k| iwarp_proto::env::var(k).ok())
    }

    /// [`Options::from_env`] over any lookup of those variables.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Options {
        let mut o = Options::default();
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        if let Some(v) = get("IWARP_SOCKETS_DESIGN") {
            match v.as_str() {
                "basic" => o = Options::basic(),
                "enhanced" => {}
                _ => tracing::warn!(value = %v, "IWARP_SOCKETS_DESIGN must be enhanced or basic"),
            }
        }
        for (k, slot) in [
            ("IWARP_SOCKETS_SBUF", &mut o.sbuf_size),
            ("IWARP_SOCKETS_RBUF", &mut o.rbuf_size),
        ] {
            if let Some(v) = get(k) {
                match v.parse::<u32>() {
                    Ok(n) if n >= 4096 => *slot = n & !1,
                    _ => tracing::warn!(key = k, value = %v, "not a byte count >= 4096; ignored"),
                }
            }
        }
        if let Some(v) = get("IWARP_SOCKETS_RBUF_MAX") {
            match v.as_str() {
                "off" | "0" => o.rbuf_max = Some(0),
                n => match n.parse::<u32>() {
                    Ok(n) => o.rbuf_max = Some(n),
                    Err(_) => tracing::warn!(value = %v, "IWARP_SOCKETS_RBUF_MAX: bytes or off"),
                },
            }
        }
        if let Some(v) = get("IWARP_SOCKETS_ZCOPY") {
            match v.as_str() {
                "off" | "0" => o.zcopy_threshold = None,
                n => match n.parse::<usize>() {
                    Ok(n) => o.zcopy_threshold = Some(n),
                    Err(_) => tracing::warn!(value = %v, "IWARP_SOCKETS_ZCOPY: bytes or off"),
                },
            }
        }
        if let Some(v) = get("IWARP_SOCKETS_IOMAP_SIZE") {
            match v.parse::<u16>() {
                Ok(n) => o.iomap_size = n,
                Err(_) => tracing::warn!(value = %v, "IWARP_SOCKETS_IOMAP_SIZE: entries, 0-32512"),
            }
        }
        if let Some(v) = get("IWARP_SOCKETS_CONGESTION") {
            match v.parse::<CongestionControl>() {
                Ok(cc) => o.congestion = Some(cc),
                Err(e) => tracing::warn!(error = %e, "IWARP_SOCKETS_CONGESTION ignored"),
            }
        }
        if let Some(v) = get("IWARP_SOCKETS_COALESCE") {
            o.coalesce = v != "0";
        }
        if let Some(v) = get("IWARP_SOCKETS_ACK_EACH") {
            o.ack_each = v != "0";
        }
        if let Some(v) = get("IWARP_SOCKETS_BUSY_POLL") {
            o.busy_poll = v != "0";
        }
        if let Some(v) = get("IWARP_SOCKETS_CRC") {
            use iwarp::cm::Policy;
            o.mpa.crc = match v.as_str() {
                "on" | "required" => Policy::Required,
                "off" => Policy::Off,
                _ => Policy::Optional,
            };
        }
        o
    }

    /// Whether writes coalesce.
    pub(crate) fn coalescing(&self) -> bool {
        self.coalesce && self.design == Design::Enhanced
    }

    /// The zero-copy threshold in force.
    pub(crate) fn zcopy(&self) -> Option<usize> {
        match self.design {
            Design::Enhanced => self.zcopy_threshold,
            Design::Basic => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Options {
        Options::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_design_and_its_switches_from_variables() {
        let d = with(&[]);
        assert_eq!(d.design, Design::Enhanced);
        assert!(d.coalesce && !d.ack_each);
        let b = with(&[("IWARP_SOCKETS_DESIGN", "basic")]);
        assert_eq!(b.design, Design::Basic);
        assert!(!b.coalesce && b.ack_each);
        // Each switch over the design, whichever order they are read in.
        let b = with(&[
            ("IWARP_SOCKETS_ACK_EACH", "0"),
            ("IWARP_SOCKETS_DESIGN", "basic"),
        ]);
        assert!(b.design == Design::Basic && !b.ack_each);
        let e = with(&[("IWARP_SOCKETS_ACK_EACH", "1")]);
        assert!(e.design == Design::Enhanced && e.ack_each);
        // Values that do not parse leave the defaults.
        let j = with(&[
            ("IWARP_SOCKETS_DESIGN", "fast"),
            ("IWARP_SOCKETS_SBUF", "12"),
            ("IWARP_SOCKETS_ZCOPY", "lots"),
        ]);
        assert_eq!(j.design, Design::Enhanced);
        assert_eq!(j.sbuf_size, Options::default().sbuf_size);
        assert_eq!(j.zcopy_threshold, None);
        let z = with(&[
            ("IWARP_SOCKETS_ZCOPY", "65536"),
            ("IWARP_SOCKETS_RBUF", "8193"),
        ]);
        assert_eq!(z.zcopy_threshold, Some(65536));
        assert_eq!(z.rbuf_size, 8192);
    }

    #[test]
    fn ring_limit_from_the_environment() {
        assert_eq!(with(&[]).rbuf_max, None);
        assert_eq!(with(&[("IWARP_SOCKETS_RBUF_MAX", "off")]).rbuf_max, Some(0));
        assert_eq!(
            with(&[("IWARP_SOCKETS_RBUF_MAX", "16777216")]).rbuf_max,
            Some(16 << 20)
        );
        assert_eq!(with(&[("IWARP_SOCKETS_RBUF_MAX", "lots")]).rbuf_max, None);
    }

    #[test]
    fn congestion_from_the_environment() {
        assert_eq!(with(&[]).congestion, None);
        let b = with(&[("IWARP_SOCKETS_CONGESTION", "bbr")]);
        assert_eq!(b.congestion.as_ref().map(|c| c.as_str()), Some("bbr"));
        // A name the kernel would cut (16 bytes) is refused here.
        let long = with(&[("IWARP_SOCKETS_CONGESTION", "abcdefghijklmnop")]);
        assert_eq!(long.congestion, None);
    }
}
