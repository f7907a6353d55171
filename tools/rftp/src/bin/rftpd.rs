//! `rftpd`: FTP server with the RDMA extension. See `rftpd --help` and
//! docs/RFTP.md.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rftp::server::{serve, ServerConfig};

/// FTP server (RFC 959/2389/2428/3659, HASH) with an RDMA data path
/// (RADR/RSTR/RRTR) over software iWARP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML config file (listen, root, anonymous, users, limits, RDMA
    /// settings; see docs/RFTP.md). RFTPD_SET_KEY=value in the environment
    /// overrides the file's key (RFTPD_SET_MAX_STREAMS=8); flags override
    /// both.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Control address, e.g. 127.0.0.1:2121 (port 0 picks one).
    #[arg(short, long)]
    listen: Option<String>,
    /// Directory to serve.
    #[arg(short, long)]
    root: Option<PathBuf>,
    /// Allow anonymous read-only logins.
    #[arg(long)]
    anonymous: bool,
    /// Do not offer the RDMA extension.
    #[arg(long)]
    no_rdma: bool,
    /// Most data streams granted to a client.
    #[arg(long)]
    max_streams: Option<u32>,
    /// RDMA device: soft (software iWARP over TCP), auto (a kernel RDMA
    /// device if there is one, else soft), or a kernel device as
    /// `ibv_devices` lists it (siw0, rxe0, mlx5_0). Default: the
    /// IWARP_DEVICE environment variable, else soft. Config key: device.
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// TCP congestion control of the transfer sessions' connections
    /// (reno, cubic, bbr: /proc/sys/net/ipv4/tcp_available_congestion_control).
    /// Default: the kernel's. Config key: congestion.
    #[arg(long, value_name = "ALGO")]
    congestion: Option<String>,
}

fn main() -> ExitCode {
    rftp::init_logging("info");
    let a = Args::parse();
    let mut cfg = match ServerConfig::load(a.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rftpd: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(l) = a.listen {
        cfg.listen = l;
    }
    if let Some(r) = a.root {
        cfg.root = r;
    }
    if a.anonymous {
        cfg.anonymous = true;
    }
    if a.no_rdma {
        cfg.rdma = false;
    }
    if let Some(n) = a.max_streams {
        cfg.max_streams = n;
    }
    if let Some(d) = a.device {
        cfg.device = Some(d);
    }
    if let Some(c) = a.congestion {
        cfg.congestion = Some(c);
    }
    if let Some(c) = &cfg.congestion {
        if let Err(e) = iwarp::cm::CongestionControl::new(c) {
            eprintln!("rftpd: congestion = {c:?}: {e}");
            return ExitCode::from(2);
        }
    }
    if cfg.rdma {
        // Fail at start, with the reason and the fix, rather than at the
        // first RADR.
        let opened = match &cfg.device {
            Some(d) => iwarp::Context::open_device(d),
            None => iwarp::Context::open(),
        };
        match opened {
            Ok(ctx) => tracing::info!(device = ctx.device_name(), "RDMA device"),
            Err(e) => {
                eprintln!(
                    "rftpd: RDMA device {}: {e}",
                    cfg.device.as_deref().unwrap_or("(IWARP_DEVICE)")
                );
                return ExitCode::from(2);
            }
        }
    }
    // A file-size limit (ulimit -f) must give EFBIG and an FTP error
    // reply, not kill the server.
    // SAFETY: setting a signal disposition to SIG_IGN has no
    // preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let listener = match TcpListener::bind(&cfg.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rftpd: cannot listen on {}: {e}", cfg.listen);
            return ExitCode::from(1);
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("rftpd listening on {a}"),
        Err(e) => eprintln!("rftpd: {e}"),
    }
    match serve(listener, cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rftpd: {e}");
            ExitCode::from(1)
        }
    }
}
