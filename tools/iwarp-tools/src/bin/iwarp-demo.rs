//! iwarp-demo: the software iWARP stack talking to itself over loopback.
//!
//! Without a subcommand it runs an rping-style ping and a Write/Read/Send
//! exchange with CRC on, and reports what moved and whether the content
//! arrived intact. `opcodes` is the traffic generator of
//! `scripts/tshark-check.sh`; `ping` is the ping part alone.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{ArgAction, Parser, Subcommand};
use iwarp_tools::cli::{self, PolicyArg};
use iwarp_tools::demo::{self, ExchangeOpts};
use iwarp_tools::ping::{self, PingConfig, PingServer};
use iwarp_tools::rping;

/// Demonstrate the user-space iWARP stack over 127.0.0.1, in one process.
///
/// With no subcommand: an rping-compatible ping (server and client), then
/// an RDMA Write / RDMA Read / Send exchange with MPA CRC on, checking the
/// content byte for byte. Exits 0 on success, 1 (with the reason) on
/// failure.
#[derive(Debug, Parser)]
#[command(
    name = "iwarp-demo",
    disable_version_flag = true,
    after_help = "Examples:\n  iwarp-demo                                   # the full demo\n  iwarp-demo opcodes --crc on --markers off --port 47741\n  iwarp-demo ping -C 100 -S 4096 -v\n\nLogging: RUST_LOG=debug (or -d) writes protocol events to stderr."
)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Seconds allowed for the connection setup and for each step.
    #[arg(long, global = true, value_name = "SECS", default_value = "10", value_parser = cli::parse_secs)]
    timeout: Duration,
    /// Debug output (-dd for more); RUST_LOG overrides.
    #[arg(short = 'd', global = true, action = ArgAction::Count)]
    debug: u8,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Issue every RDMAP opcode once over one connection, ending with a
    /// Write to an invalidated STag that the peer answers with a Terminate.
    ///
    /// Order: Send, Send with Solicited Event, Send with Invalidate, Send
    /// with SE and Invalidate, a large RDMA Write, an RDMA Read of the same
    /// data (Read Request + Read Responses), two control Sends, and the
    /// bad-STag RDMA Write (Terminate).
    Opcodes {
        /// MPA CRC32c: on or off (required/optional also accepted).
        #[arg(long, value_enum, default_value_t = PolicyArg::Required)]
        crc: PolicyArg,
        /// MPA markers: on or off (required/optional also accepted).
        #[arg(long, value_enum, default_value_t = PolicyArg::Off)]
        markers: PolicyArg,
        /// TCP port on 127.0.0.1 (0 = any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Bytes of the RDMA Write and Read (large enough to need many FPDUs).
        #[arg(long, default_value_t = 200 * 1024)]
        size: usize,
    },
    /// rping-style ping: iwarp-ping server and client in one process.
    Ping {
        /// Ping count.
        #[arg(short = 'C', default_value_t = 5)]
        count: u64,
        /// Ping data size in bytes (26 to 65535).
        #[arg(short = 'S', default_value_t = rping::DEFAULT_SIZE)]
        size: usize,
        /// Print the ping data.
        #[arg(short = 'v')]
        verbose: bool,
        /// MPA CRC32c policy.
        #[arg(long, value_enum, default_value_t = PolicyArg::Required)]
        crc: PolicyArg,
        /// MPA markers policy.
        #[arg(long, value_enum, default_value_t = PolicyArg::Off)]
        markers: PolicyArg,
        /// TCP port on 127.0.0.1 (0 = any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    iwarp_tools::trace::init(args.debug);
    let t0 = Instant::now();
    let result = match &args.cmd {
        None => run_default(args.timeout),
        Some(Cmd::Opcodes {
            crc,
            markers,
            port,
            size,
        }) => run_opcodes(*crc, *markers, *port, *size, args.timeout),
        Some(Cmd::Ping {
            count,
            size,
            verbose,
            crc,
            markers,
            port,
        }) => run_ping(*count, *size, *verbose, *crc, *markers, *port, args.timeout).map(|_| ()),
    };
    match result {
        Ok(()) => {
            println!("iwarp-demo: OK ({:.2} s)", t0.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iwarp-demo: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn run_ping(
    count: u64,
    size: usize,
    verbose: bool,
    crc: PolicyArg,
    markers: PolicyArg,
    port: u16,
    timeout: Duration,
) -> Result<ping::PingReport, String> {
    rping::check_size(size)?;
    let mut cfg = PingConfig::new(cli::mpa_config(crc, markers));
    cfg.size = size;
    cfg.count = count;
    cfg.verbose = verbose;
    cfg.validate = true;
    cfg.timeout = timeout;
    let server = PingServer::bind(loopback(port), cfg.clone()).map_err(|e| e.to_string())?;
    let addr = server.local_addr();
    println!("ping: iwarp-ping server on {addr}, client sends {count} ping(s) of {size} bytes (MPA CRC {crc}, markers {markers})");
    let handle = std::thread::Builder::new()
        .name("ping-server".into())
        .spawn(move || {
            server
                .serve_one(Some(timeout), &mut std::io::sink())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| format!("cannot start the server thread: {e}"))?;
    let mut out = std::io::stdout();
    let client = ping::run_client(addr, &cfg, &mut out).map_err(|e| format!("ping client: {e}"));
    // The server ends when the client disconnects (or after its timeout).
    let server = handle
        .join()
        .map_err(|_| "the ping server thread panicked".to_string())?;
    let client = client?;
    let server = server.map_err(|e| format!("ping server: {e}"))?;
    println!("  {}", client.summary("client"));
    println!("  {}", server.summary("server"));
    if server.pings != client.pings {
        return Err(format!(
            "the server served {} pings, the client sent {}",
            server.pings, client.pings
        ));
    }
    Ok(client)
}

fn run_default(timeout: Duration) -> Result<(), String> {
    println!("iwarp-demo: software iWARP (RDMAP/DDP/MPA over TCP) on 127.0.0.1, server and client in one process\n");
    println!("[1/2] rping-compatible ping");
    run_ping(
        5,
        rping::DEFAULT_SIZE,
        true,
        PolicyArg::Required,
        PolicyArg::Off,
        0,
        timeout,
    )?;

    println!("\n[2/2] RDMA Write, RDMA Read and Send with MPA CRC on");
    let opts = ExchangeOpts {
        mpa: cli::mpa_config(PolicyArg::Required, PolicyArg::Off),
        listen: loopback(0),
        write_len: 1024 * 1024,
        all_opcodes: false,
        bad_stag_write: false,
        timeout,
    };
    let report = demo::run_exchange(&opts).map_err(|e| e.to_string())?;
    print!("{}", demo::render(&report));
    Ok(())
}

fn run_opcodes(
    crc: PolicyArg,
    markers: PolicyArg,
    port: u16,
    size: usize,
    timeout: Duration,
) -> Result<(), String> {
    if size == 0 || size > u32::MAX as usize / 2 {
        return Err(format!("--size {size} is out of range (1 to 2 GiB)"));
    }
    println!("opcodes: every RDMAP opcode on 127.0.0.1:{port} (MPA CRC {crc}, markers {markers}, {size}-byte Write/Read)");
    let opts = ExchangeOpts {
        mpa: cli::mpa_config(crc, markers),
        listen: loopback(port),
        write_len: size,
        all_opcodes: true,
        bad_stag_write: true,
        timeout,
    };
    let report = demo::run_exchange(&opts).map_err(|e| e.to_string())?;
    print!("{}", demo::render(&report));
    Ok(())
}
