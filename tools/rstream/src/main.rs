//! iwarp-rstream: librdmacm's `rstream` benchmark over `iwarp-sockets`.
//!
//! Same short options, same exchange, same table as rdma-core's
//! `librdmacm/examples/rstream.c`, so either end can be the real
//! `rstream` (on a host with kernel siw or an iWARP RNIC) and the other
//! end this tool. Our own additions are long options only.
//!
//! - [`report`]: the table (`size_str`, `cnt_str`, the row layout) and
//!   JSON lines;
//! - [`transport`]: rsockets over iWARP or plain TCP behind one type, driven
//!   like rstream drives its socket (non-blocking loop, blocking, or poll);
//! - [`bench`](mod@bench): the client/server exchange and the test plan.
#![deny(unsafe_op_in_unsafe_fn)]

mod bench;
mod report;
mod transport;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use iwarp::cm::Policy;
use iwarp_sockets::Options;

use bench::{Config, Plan, Role};
use transport::{Kind, Mode, Setup};

/// The socket design of `iwarp-sockets` to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DesignArg {
    /// Integrated buffering, coalescing by append, zero copy above the
    /// threshold (the default).
    Enhanced,
    /// The paper's basic design: a private copy on each side, one message
    /// per write, no zero copy.
    Basic,
}

/// MPA CRC policy (RFC 5044 §7.1, the C flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CrcArg {
    /// Ask for CRC and refuse a peer that will not use it.
    #[value(alias = "on")]
    Required,
    /// Use CRC if the peer asks (siw's default is not to ask).
    Optional,
    /// Never use CRC.
    Off,
}

/// rstream-compatible stream benchmark over software iWARP (rsockets wire
/// protocol).
///
/// Without -s it is the server: it listens (on -b, port -p) and serves one
/// client run. With -s it is the client. Either end may be rdma-core's
/// `rstream` on a host with kernel soft-iWARP (siw) or an iWARP RNIC.
///
/// With none of -C, -I, -S N it runs rstream's sweep: latency tests
/// (ping-pong, 64 B / 4 KiB / 64 KiB / 1 MiB, or every size with -S all)
/// on one connection, then bandwidth tests on a second. Otherwise one
/// test named `custom` (-C transfers of -S bytes each way, -I times).
/// Both ends print rstream's table: name bytes xfers iters total time
/// Gb/sec usec/xfer (usec/xfer is one-way: half the round trip of a
/// latency test). Exit status 0 when every test passed, 1 otherwise.
#[derive(Debug, Parser)]
#[command(
    name = "iwarp-rstream",
    disable_version_flag = true,
    after_help = "Test options (-T, may repeat): s|socket (plain TCP), a|async (poll before each call), \
b|blocking, n|nonblocking (the default: a busy loop), v|verify (check every byte), \
f|fork (as rstream: plain TCP, served in turn), r|resolve (accepted; addresses are resolved the same way).\n\n\
Examples:\n  iwarp-rstream -b 10.77.0.1 -T v                       # server\n  \
iwarp-rstream -s 10.77.0.1 -T v -C 1 -I 1000 -S 64     # 64-byte ping-pong x1000\n  \
iwarp-rstream -s 10.77.0.1 -T v -C 100 -S 65536        # bandwidth, 64 KiB transfers\n  \
iwarp-rstream -s 127.0.0.1 -S 64 -C 1 -I 10000 --tcp --busy-poll --json\n\n\
Logging: RUST_LOG=debug writes protocol events to stderr."
)]
struct Args {
    /// Server address: run as the client and connect to it.
    #[arg(short = 's', value_name = "server_address")]
    server: Option<String>,
    /// Bind address (the server listens on it; default any).
    #[arg(short = 'b', value_name = "bind_address")]
    bind: Option<String>,
    /// Address format: name, ip, ipv6 (numeric only), or gid (not supported).
    #[arg(short = 'f', value_name = "address_format")]
    format: Option<String>,
    /// SO_SNDBUF / SO_RCVBUF in bytes (default 512 KiB, as rstream); an
    /// rsocket's rings are twice this, as in rsocket.c.
    #[arg(short = 'B', value_name = "buffer_size")]
    buffer_size: Option<u32>,
    /// Inline size (accepted for compatibility; iwarp-sockets decides
    /// inline sends itself).
    #[arg(short = 'i', value_name = "inline_size")]
    inline_size: Option<u32>,
    /// Iterations (a custom test).
    #[arg(short = 'I', value_name = "iterations")]
    iterations: Option<u32>,
    /// Transfers per direction and iteration (a custom test).
    #[arg(short = 'C', value_name = "transfer_count")]
    count: Option<u32>,
    /// Transfer size in bytes (a custom test), or `all` for every size of
    /// the sweep.
    #[arg(short = 'S', value_name = "transfer_size or all")]
    size: Option<String>,
    /// Port (0 on the server: any free one, printed on stderr).
    #[arg(short = 'p', value_name = "port_number", default_value_t = 7471)]
    port: u16,
    /// Keepalive (SO_KEEPALIVE on; the time is reported as rstream does).
    #[arg(short = 'k', value_name = "keepalive_time")]
    keepalive: Option<u32>,
    /// Test option; see below.
    #[arg(short = 'T', value_name = "test_option", action = ArgAction::Append)]
    test: Vec<String>,

    /// Socket design of the rsockets side.
    #[arg(long, value_enum, default_value_t = DesignArg::Enhanced)]
    design: DesignArg,
    /// Busy polling: a waiting call polls its own completion queue instead
    /// of sleeping (lowest latency, one CPU busy).
    #[arg(long)]
    busy_poll: bool,
    /// Also run every test over plain kernel TCP on the same port, right
    /// after the rsockets one (both ends need --tcp); rows labelled tcp.
    #[arg(long)]
    tcp: bool,
    /// JSON lines (one object per test) instead of the table.
    #[arg(long)]
    json: bool,
    /// MPA CRC policy of the rsockets connection.
    #[arg(long, value_enum, default_value_t = CrcArg::Optional)]
    crc: CrcArg,
    /// Zero-copy threshold in bytes, or `off` (enhanced design only).
    #[arg(long, value_name = "BYTES|off")]
    zcopy: Option<String>,
    /// A credit update after every message read, the basic design's
    /// socket-level flow control (default: on with --design basic, off
    /// with enhanced; in effect only if the peer's end sets it too).
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    ack_each: Option<String>,
    /// How large the receive ring may grow with the path (bytes, or `off`:
    /// it stays at -B x 2 as rstream's ring does, since rstream sets
    /// SO_RCVBUF and rsocket.c never resizes a ring). Default: up to the
    /// kernel's TCP receive-buffer limit (iwarp-sockets' autotuning).
    #[arg(long, value_name = "BYTES|off")]
    rbuf_max: Option<String>,
    /// Bound in seconds on connecting, accepting, and on any transfer that
    /// makes no progress.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    timeout: f64,
}

/// The `-T` settings (`set_test_opt` of rstream.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TestOpts {
    sockets: bool,
    async_poll: bool,
    nonblocking: bool,
    verify: bool,
}

impl Default for TestOpts {
    fn default() -> TestOpts {
        TestOpts {
            sockets: false,
            async_poll: false,
            nonblocking: true,
            verify: false,
        }
    }
}

fn starts_with_ci(arg: &str, word: &str) -> bool {
    arg.len() >= word.len() && arg[..word.len()].eq_ignore_ascii_case(word)
}

/// Applies one `-T` argument: a single letter, or a word matched by its
/// prefix, case-insensitively, as rstream does.
fn test_opt(t: &mut TestOpts, arg: &str) -> Result<(), String> {
    let letter = if arg.chars().count() == 1 {
        arg.chars().next()
    } else {
        [
            ("socket", 's'),
            ("async", 'a'),
            ("block", 'b'),
            ("nonblock", 'n'),
            ("resolve", 'r'),
            ("verify", 'v'),
            ("fork", 'f'),
        ]
        .iter()
        .find(|(w, _)| starts_with_ci(arg, w))
        .map(|(_, c)| *c)
    };
    match letter {
        Some('s') | Some('f') => t.sockets = true,
        Some('a') => t.async_poll = true,
        Some('b') => t.nonblocking = false,
        Some('n') => t.nonblocking = true,
        Some('r') => {}
        Some('v') => t.verify = true,
        _ => {
            return Err(format!(
                "unknown test option -T {arg}: use s|socket, a|async, b|blocking, \
                 n|nonblocking, v|verify, f|fork or r|resolve"
            ))
        }
    }
    Ok(())
}

fn resolve(host: &str, port: u16, numeric: bool) -> Result<SocketAddr, String> {
    if numeric {
        return host
            .parse::<IpAddr>()
            .map(|ip| SocketAddr::new(ip, port))
            .map_err(|_| format!("{host:?} is not a numeric address (-f ip)"));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("getaddrinfo: {host}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("getaddrinfo: {host}: no address"))
}

fn config(a: &Args) -> Result<Config, String> {
    let mut t = TestOpts::default();
    for arg in &a.test {
        test_opt(&mut t, arg)?;
    }
    let numeric = match a.format.as_deref() {
        None => false,
        Some(f) if starts_with_ci(f, "ip") => true,
        Some(f) if starts_with_ci(f, "gid") => {
            return Err("-f gid: InfiniBand GIDs (AF_IB) do not exist on iWARP".into())
        }
        Some(_) => {
            eprintln!("Warning: unknown address format");
            false
        }
    };

    let mut custom = a.count.is_some() || a.iterations.is_some();
    let mut all = false;
    let mut size = 1000usize;
    if let Some(s) = &a.size {
        if starts_with_ci(s, "all") {
            all = true;
        } else {
            size = s
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1 << 30).contains(n))
                .ok_or_else(|| format!("-S {s}: a transfer size of 1 to 2^30 bytes, or all"))?;
            custom = true;
        }
    }
    let plan = if custom {
        Plan::Custom {
            size,
            count: a.count.unwrap_or(1000).max(1),
            iterations: a.iterations.unwrap_or(1).max(1),
        }
    } else {
        Plan::Sweep { all }
    };

    let role = match &a.server {
        Some(host) => Role::Client {
            server: resolve(host, a.port, numeric)?,
            bind: a
                .bind
                .as_deref()
                .map(|b| resolve(b, 0, numeric))
                .transpose()?,
        },
        None => Role::Server {
            listen: match a.bind.as_deref() {
                Some(b) => resolve(b, a.port, numeric)?,
                None => SocketAddr::from(([0, 0, 0, 0], a.port)),
            },
        },
    };

    let mut opts = match a.design {
        DesignArg::Enhanced => Options::default(),
        DesignArg::Basic => Options::basic(),
    };
    // rstream sets SO_SNDBUF/SO_RCVBUF to -B or 512 KiB; rsocket.c makes
    // its rings twice the value.
    let buffer = a.buffer_size.unwrap_or(1 << 19);
    let ring = buffer.saturating_mul(2).clamp(8192, 1 << 30) & !1;
    opts.sbuf_size = ring;
    opts.rbuf_size = ring;
    opts.busy_poll = a.busy_poll;
    opts.keepalive = a.keepalive.is_some();
    opts.mpa.crc = match a.crc {
        CrcArg::Required => Policy::Required,
        CrcArg::Optional => Policy::Optional,
        CrcArg::Off => Policy::Off,
    };
    if let Some(z) = &a.zcopy {
        opts.zcopy_threshold = if z == "off" {
            None
        } else {
            Some(
                z.parse()
                    .map_err(|_| format!("--zcopy {z}: a byte count or off"))?,
            )
        };
    }
    if let Some(v) = &a.ack_each {
        opts.ack_each = v == "on";
    }
    if let Some(m) = &a.rbuf_max {
        opts.rbuf_max = Some(if m == "off" {
            0
        } else {
            m.parse()
                .map_err(|_| format!("--rbuf-max {m}: a byte count or off"))?
        });
    }
    if !(a.timeout > 0.0 && a.timeout.is_finite()) {
        return Err("--timeout: a positive number of seconds".into());
    }
    let timeout = Duration::from_secs_f64(a.timeout);

    let kinds = if t.sockets {
        if a.tcp {
            return Err(
                "--tcp adds a TCP baseline to rsockets; with -T s there is only TCP".into(),
            );
        }
        vec![Kind::Tcp]
    } else if a.tcp {
        vec![Kind::Rsockets, Kind::Tcp]
    } else {
        vec![Kind::Rsockets]
    };
    if let (Role::Client { bind: Some(b), .. }, true) = (&role, kinds.contains(&Kind::Rsockets)) {
        eprintln!(
            "iwarp-rstream: -b {} applies to TCP only; the rsockets connection takes the \
             source address the kernel picks",
            b.ip()
        );
    }
    if let Some(k) = a.keepalive {
        println!("Keepalive: ON");
        println!("  time: {k}");
    }
    let _ = a.inline_size;

    Ok(Config {
        role,
        plan,
        kinds,
        verify: t.verify,
        mode: Mode {
            nonblocking: t.nonblocking,
            async_poll: t.async_poll,
            stall: timeout,
        },
        setup: Setup {
            opts,
            tcp_buffer: buffer as usize,
            keepalive: a.keepalive.is_some(),
        },
        timeout,
        json: a.json,
        design: match a.design {
            DesignArg::Enhanced => "enhanced",
            DesignArg::Basic => "basic",
        },
    })
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    init_logging();
    let args = Args::parse();
    let cfg = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("iwarp-rstream: {e}");
            return ExitCode::from(2);
        }
    };
    match bench::run(&cfg) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp-rstream: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut v = vec!["iwarp-rstream"];
        v.extend_from_slice(args);
        config(&Args::try_parse_from(v).map_err(|e| e.to_string())?)
    }

    #[test]
    fn test_options_follow_rstream() {
        let mut t = TestOpts::default();
        for a in ["v", "Verify", "b"] {
            test_opt(&mut t, a).unwrap();
        }
        assert!(t.verify && !t.nonblocking && !t.sockets);
        test_opt(&mut t, "nonblocking").unwrap();
        assert!(t.nonblocking);
        test_opt(&mut t, "sockets").unwrap();
        assert!(t.sockets);
        assert!(test_opt(&mut t, "x").is_err());
        assert!(
            test_opt(&mut t, "ve").is_err(),
            "two letters must spell a word"
        );
    }

    #[test]
    fn plans_and_roles() {
        let c = parse(&["-s", "127.0.0.1", "-C", "10", "-S", "64", "-T", "v"]).unwrap();
        assert_eq!(
            c.plan,
            Plan::Custom {
                size: 64,
                count: 10,
                iterations: 1
            }
        );
        assert!(c.verify && c.mode.nonblocking);
        assert!(matches!(c.role, Role::Client { server, .. } if server.port() == 7471));
        let c = parse(&["-b", "127.0.0.1", "-p", "9000", "-S", "all"]).unwrap();
        assert_eq!(c.plan, Plan::Sweep { all: true });
        assert!(matches!(c.role, Role::Server { listen } if listen.port() == 9000));
        assert_eq!(c.setup.opts.rbuf_size, 1 << 20);
        let c = parse(&["-T", "s", "-B", "65536"]).unwrap();
        assert_eq!(c.kinds, [Kind::Tcp]);
        assert_eq!(c.setup.tcp_buffer, 65536);
        let c = parse(&["--tcp", "--design", "basic", "-I", "5"]).unwrap();
        assert_eq!(c.kinds, [Kind::Rsockets, Kind::Tcp]);
        assert_eq!(c.design, "basic");
        assert!(c.setup.opts.ack_each);
        let d = parse(&["--design", "basic", "--ack-each", "off"]).unwrap();
        assert!(!d.setup.opts.ack_each);
        let d = parse(&["--ack-each", "on"]).unwrap();
        assert!(d.setup.opts.ack_each && d.design == "enhanced");
        assert!(parse(&["--ack-each", "maybe"]).is_err());
        assert_eq!(parse(&[]).unwrap().setup.opts.rbuf_max, None);
        assert_eq!(
            parse(&["--rbuf-max", "off"]).unwrap().setup.opts.rbuf_max,
            Some(0)
        );
        assert_eq!(
            parse(&["--rbuf-max", "4194304"])
                .unwrap()
                .setup
                .opts
                .rbuf_max,
            Some(4 << 20)
        );
        assert!(parse(&["--rbuf-max", "lots"]).is_err());
        assert!(matches!(
            c.plan,
            Plan::Custom {
                size: 1000,
                count: 1000,
                iterations: 5
            }
        ));
        assert!(parse(&["-S", "0"]).is_err());
        assert!(parse(&["-f", "gid"]).is_err());
        assert!(parse(&["-T", "s", "--tcp"]).is_err());
    }
}
