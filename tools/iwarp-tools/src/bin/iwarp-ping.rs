//! iwarp-ping: rping (rdma-core) over the user-space iWARP stack.
//!
//! Same flags and the same wire protocol as rping, so either side can be
//! rping on a Linux siw host:
//!
//! ```text
//! iwarp-ping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P]
//! iwarp-ping -c [-vVd] [-S size] [-C count] -a addr [-p port]
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, ArgGroup, Parser};
use iwarp_tools::cli::{self, PolicyArg};
use iwarp_tools::ping::{self, PingConfig, PingServer};
use iwarp_tools::rping;

/// rping-compatible ping over software iWARP (RDMA Send, RDMA Read, RDMA Write).
///
/// The client advertises a buffer, the server RDMA-Reads it, the client
/// advertises a second buffer, the server RDMA-Writes the data back; with
/// -V the client checks that the echo equals what it sent. The messages,
/// their sizes and the data pattern are rping's, so the peer may be
/// `rping -s` / `rping -c` on a Linux soft-iWARP (siw) host.
#[derive(Debug, Parser)]
#[command(
    name = "iwarp-ping",
    disable_version_flag = true,
    group(ArgGroup::new("role").required(true).args(["server", "client"])),
    after_help = "Examples:\n  iwarp-ping -s -a 0.0.0.0                 # server on port 7174\n  iwarp-ping -c -a 192.0.2.1 -C 10 -V -v   # 10 validated pings\n  rping -c -a <this host> -C 10 -V -v      # rping on a siw host against iwarp-ping -s\n\nLogging: RUST_LOG=debug (or -d) writes protocol events to stderr.\nExit status: 0 on success, 1 on failure, 2 on bad arguments."
)]
struct Args {
    /// Server side.
    #[arg(short = 's')]
    server: bool,
    /// Client side.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's to connect to (client), or to bind to (server;
    /// default 0.0.0.0, use -a ::0 for IPv6).
    #[arg(short = 'a', value_name = "ADDR")]
    addr: Option<String>,
    /// TCP port.
    #[arg(short = 'p', value_name = "PORT", default_value_t = rping::DEFAULT_PORT)]
    port: u16,
    /// Ping count; 0 pings until interrupted (client).
    #[arg(short = 'C', value_name = "COUNT", default_value_t = 0)]
    count: u64,
    /// Ping data size in bytes (26 to 65535).
    #[arg(short = 'S', value_name = "SIZE", default_value_t = rping::DEFAULT_SIZE,
          value_parser = parse_size)]
    size: usize,
    /// Display ping data to stdout.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate ping data (client).
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output (-dd for more); RUST_LOG overrides.
    #[arg(short = 'd', action = ArgAction::Count)]
    debug: u8,
    /// Persistent server: serve any number of clients, each in its own thread.
    #[arg(short = 'P', requires = "server")]
    persistent: bool,
    /// MPA CRC32c policy: required (alias on), optional, or off.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = PolicyArg::Optional)]
    crc: PolicyArg,
    /// MPA markers policy: required (alias on), optional, or off.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = PolicyArg::Off)]
    markers: PolicyArg,
    /// Peer-to-peer mode (RFC 6581): request this ready-to-receive message
    /// (client), or accept a client's request for it (server). siw needs
    /// its `peer_to_peer` module parameter for this mode.
    #[arg(long, value_enum, value_name = "KIND")]
    rtr: Option<cli::RtrArg>,
    /// Do not nudge a silent peer early in the connection (see
    /// ConnParam::wake_nudge; needed only for a peer that refuses
    /// zero-length RDMA Writes).
    #[arg(long)]
    no_wake_nudge: bool,
    /// Seconds allowed for the connection setup and for each step of a ping.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = cli::parse_secs)]
    timeout: Duration,
    /// RDMA device: soft (software iWARP over TCP), auto (a kernel RDMA
    /// device if there is one, else soft), or a kernel device as
    /// `ibv_devices` lists it (siw0, rxe0, mlx5_0). Default: the
    /// IWARP_DEVICE environment variable, else soft. (--crc, --markers and
    /// --rtr apply to soft only: a kernel device negotiates MPA itself.)
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a size in bytes"))?;
    rping::check_size(n)?;
    Ok(n)
}

fn main() -> ExitCode {
    let args = Args::parse();
    iwarp_tools::trace::init(args.debug);
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp-ping: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    if let Some(d) = &args.device {
        let opened = cli::set_device(d)?;
        tracing::info!(device = %opened, "RDMA device");
    }
    let mut mpa = cli::mpa_config(args.crc, args.markers);
    mpa.rtr = args.rtr.map(Into::into);
    let mut cfg = PingConfig::new(mpa);
    cfg.wake_nudge = !args.no_wake_nudge;
    cfg.size = args.size;
    cfg.count = args.count;
    cfg.verbose = args.verbose;
    cfg.validate = args.validate;
    cfg.timeout = args.timeout;
    let mut out = std::io::stdout();

    if args.server {
        let host = args.addr.as_deref().unwrap_or("0.0.0.0");
        let addr = cli::resolve(host, args.port)?;
        let server = PingServer::bind(addr, cfg).map_err(|e| e.to_string())?;
        eprintln!(
            "iwarp-ping: server listening on {} (MPA CRC {}, markers {})",
            server.local_addr(),
            args.crc,
            args.markers
        );
        if args.persistent {
            return server.serve_forever().map_err(|e| e.to_string());
        }
        let report = server
            .serve_one(None, &mut out)
            .map_err(|e| e.to_string())?;
        let _ = out.flush();
        eprintln!("iwarp-ping: {}", report.summary("server"));
        return Ok(());
    }

    let host = args
        .addr
        .as_deref()
        .ok_or("the client needs the server's address: iwarp-ping -c -a ADDR")?;
    let addr = cli::resolve(host, args.port)?;
    let report = ping::run_client(addr, &cfg, &mut out).map_err(|e| e.to_string())?;
    let _ = out.flush();
    eprintln!("iwarp-ping: {}", report.summary("client"));
    Ok(())
}
