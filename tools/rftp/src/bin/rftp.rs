//! `rftp`: FTP client with the RDMA extension. See `rftp --help`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rftp::cli;
use rftp::client::{self, Options, Url};
use rftp::config::{ClientConfig, Knob};
use rftp::shell::Shell;
use rftp::util::parse_size;

/// FTP client that moves data over RDMA (software iWARP) when the server
/// offers RADR/RSTR/RRTR, and over a plain FTP data connection otherwise.
///
/// Batch: `rftp get URL`, `rftp put FILE URL`. Interactive (like ftp(1);
/// commands from stdin, also when it is not a terminal): `rftp URL`,
/// `rftp open HOST [PORT]`, or `rftp` alone; type `help` at the prompt.
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Interactive mode connected to ftp://[user[:pass]@]host[:port]/[dir].
    url: Option<String>,
    /// TOML config file with defaults (streams, block_size, iodepth,
    /// max_window, retry, congestion, user, password, timeout_secs, crc,
    /// checksum, device, allow_foreign_data_addr). RFTP_SET_KEY=value in
    /// the environment overrides the file's key (RFTP_SET_STREAMS=8);
    /// flags override both.
    #[arg(short, long, global = true)]
    config: Option<PathBuf>,
    /// Data streams (QPs or TCP connections): a number, or auto (the
    /// default: enough that no connection must carry more than the
    /// kernel's per-connection window of the path's bandwidth-delay
    /// product; see docs/RFTP.md "Tuned to the path").
    #[arg(long, global = true, value_name = "N|auto")]
    streams: Option<String>,
    /// Block size, e.g. 1M or 256K.
    #[arg(long, global = true)]
    block_size: Option<String>,
    /// Blocks in flight per stream: a number (pins the window), or auto
    /// (the default: 1.5 x the bandwidth-delay product from the measured
    /// RTT, at least 16 MiB over all streams, and the receiving side
    /// grows and shrinks the window inside that pool as the rate goes).
    #[arg(long, global = true, value_name = "N|auto")]
    iodepth: Option<String>,
    /// Most bytes an automatic plan may keep in flight (registered per
    /// side), e.g. 64M [default: 64M]. Config key: max_window.
    #[arg(long, global = true, value_name = "SIZE")]
    max_window: Option<String>,
    /// Retry an interrupted get or put up to N times (1 s, 2 s, 4 s, ...
    /// up to 30 s apart), each on a new connection: a get resumes at the
    /// first byte not yet in FILE.part; a put uploads to REMOTE.part,
    /// which rftpd keeps when cut off, resumes after the bytes the server
    /// holds once their checksum matches, and renames it when complete.
    /// Config key: retry.
    #[arg(long, global = true, value_name = "N")]
    retry: Option<u32>,
    /// TCP congestion control of the data connections and the control
    /// connection (reno, cubic, bbr; see
    /// /proc/sys/net/ipv4/tcp_available_congestion_control). Default: the
    /// kernel's. Config key: congestion.
    #[arg(long, global = true, value_name = "ALGO")]
    congestion: Option<String>,
    /// Plain FTP data connection (no RDMA).
    #[arg(long, global = true)]
    tcp: bool,
    /// Transport of the extension's session: rdma, or tcp to compare.
    #[arg(long, global = true, default_value = "rdma")]
    xfer_mode: rdma_xfer::Mode,
    /// Memory-to-memory: move SIZE bytes from a zero source to a null
    /// sink (network measurement; needs the RDMA extension).
    #[arg(long, global = true, value_name = "SIZE")]
    mem: Option<String>,
    /// Skip the checksum comparison with the server (HASH) after the
    /// transfer.
    #[arg(long, global = true)]
    no_verify: bool,
    /// Checksum both ends compute as the data flows and compare (HASH):
    /// auto (default: the first of xxh3, blake3, sha256, crc32c that the
    /// server offers in FEAT), xxh3 (XXH3-128: corruption at memory speed,
    /// not tampering), blake3 or sha256 (cryptographic: tampering too), or
    /// crc32c (32 bits). Config key: checksum.
    #[arg(long, global = true, value_name = "auto|ALG")]
    checksum: Option<rftp::checksum::Choice>,
    /// Start downloads over instead of resuming a FILE.part.
    #[arg(long, global = true)]
    no_resume: bool,
    /// Require MPA CRC32C.
    #[arg(long, global = true)]
    crc: bool,
    /// RDMA device: soft (software iWARP over TCP), auto (a kernel RDMA
    /// device if there is one, else soft), or a kernel device as
    /// `ibv_devices` lists it (siw0, rxe0, mlx5_0). Default: the
    /// IWARP_DEVICE environment variable, else soft. Config key: device.
    #[arg(long, global = true, value_name = "NAME")]
    device: Option<String>,
    /// Seconds any step may take.
    #[arg(long, global = true)]
    timeout: Option<u64>,
    /// Connect data connections to an address other than the control
    /// connection's peer when the server names one (PASV, RADR). Refused by
    /// default: a server could otherwise make rftp connect to any host
    /// (FTP bounce, RFC 2577). Config key: allow_foreign_data_addr.
    #[arg(long, global = true)]
    allow_foreign_data_addr: bool,
    /// Limit downloads to this many bytes per second (e.g. 10M).
    #[arg(long, global = true)]
    limit_rate: Option<String>,
    /// No progress bar.
    #[arg(short, long, global = true)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Download: rftp get ftp://[user[:pass]@]host[:port]/path [-o FILE]
    Get {
        url: String,
        /// Local file (default: the URL's file name).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Upload: rftp put FILE URL (or rftp put --mem SIZE URL)
    Put {
        /// FILE URL, or just URL with --mem.
        #[arg(num_args = 1..=2, required = true)]
        args: Vec<String>,
    },
    /// Interactive mode connected to HOST (log in at the prompt with
    /// `user NAME [PASSWORD]`, or give USER and PASSWORD here).
    Open {
        host: String,
        #[arg(default_value_t = 21)]
        port: u16,
        user: Option<String>,
        password: Option<String>,
    },
}

fn options(a: &Args, fc: &ClientConfig) -> Result<Options, String> {
    let mut o = Options::default();
    let knob =
        |flag: &Option<String>, file: &Option<Knob>, what: &str| -> Result<Option<u32>, String> {
            match (flag, file) {
                (Some(f), _) => Knob::Word(f.clone()).value(what).map(Some),
                (None, Some(k)) => k.value(what).map(Some),
                (None, None) => Ok(None),
            }
        };
    if let Some(s) = knob(&a.streams, &fc.streams, "--streams")? {
        o.streams = s;
    }
    if let Some(w) = a.max_window.as_deref().map(parse_size).transpose()? {
        o.max_window = Some(w);
    } else if let Some(w) = fc.max_window {
        o.max_window = Some(w);
    }
    o.congestion = a.congestion.clone().or_else(|| fc.congestion.clone());
    if let Some(c) = &o.congestion {
        iwarp::cm::CongestionControl::new(c).map_err(|e| format!("--congestion {c}: {e}"))?;
    }
    o.explain = !a.quiet;
    if let Some(b) = &a.block_size {
        o.block_size = u32::try_from(parse_size(b)?).map_err(|_| "block size too large")?;
    } else if let Some(b) = fc.block_size {
        o.block_size = b;
    }
    if let Some(d) = knob(&a.iodepth, &fc.iodepth, "--iodepth")? {
        o.iodepth = d;
    }
    if let Some(t) = a.timeout.or(fc.timeout_secs) {
        o.timeout = Duration::from_secs(t.max(1));
    }
    o.tcp = a.tcp;
    o.xfer_mode = a.xfer_mode;
    o.mem = a.mem.as_deref().map(parse_size).transpose()?;
    o.verify = !a.no_verify;
    if let Some(c) = a.checksum {
        o.checksum = c;
    } else if let Some(c) = fc.checksum {
        o.checksum = c;
    }
    o.resume = !a.no_resume;
    o.crc = a.crc || fc.crc.unwrap_or(false);
    o.allow_foreign_data_addr =
        a.allow_foreign_data_addr || fc.allow_foreign_data_addr.unwrap_or(false);
    o.device = a.device.clone().or_else(|| fc.device.clone());
    if let Some(d) = &o.device {
        // Fail now, with the reason and the fix, rather than at the first
        // RDMA transfer.
        iwarp::Context::open_device(d).map_err(|e| format!("--device {d}: {e}"))?;
    }
    o.limit_rate = a.limit_rate.as_deref().map(parse_size).transpose()?;
    Ok(o)
}

fn url(s: &str, fc: &ClientConfig) -> Result<Url, String> {
    let mut u = Url::parse(s)?;
    if !s.contains('@') {
        if let Some(user) = &fc.user {
            u.user = user.clone();
            u.password = fc.password.clone().unwrap_or_default();
        }
    }
    Ok(u)
}

fn run(a: &Args) -> Result<u8, String> {
    let fc = ClientConfig::load(a.config.as_deref())?;
    let mut o = options(a, &fc)?;
    let cmd = match &a.cmd {
        Some(c @ (Cmd::Get { .. } | Cmd::Put { .. })) => c,
        other => return Ok(interactive(a, other.as_ref(), &fc, o)),
    };
    // One transfer, then exit: the session's connections are left for the
    // kernel to close (no round trip for the server's FINs).
    o.exit_after = true;
    let pb = cli::progress_bar(a.quiet, o.mem);
    if let Some(pb) = &pb {
        cli::attach(&mut o, pb);
    }
    let (summary, what) = match cmd {
        Cmd::Get { url: u, output } => {
            let u = url(u, &fc)?;
            let out = match output {
                Some(o) => o.clone(),
                None => PathBuf::from(
                    Path::new(&u.path)
                        .file_name()
                        .ok_or("the URL names no file; pass -o FILE")?,
                ),
            };
            let retries = a.retry.or(fc.retry).unwrap_or(0);
            let say = |m: &str| match &pb {
                Some(pb) => pb.println(m),
                None => eprintln!("{m}"),
            };
            (
                client::get_retrying(&u, &out, &o, retries, &say)?,
                format!("{} -> {}", u.path, out.display()),
            )
        }
        Cmd::Put { args } => {
            let (file, u) = match (args.as_slice(), o.mem) {
                ([u], Some(_)) => (None, u),
                ([f, u], _) => (Some(Path::new(f)), u),
                _ => return Err("put needs FILE URL (or --mem SIZE URL)".into()),
            };
            let u = url(u, &fc)?;
            let retries = a.retry.or(fc.retry).unwrap_or(0);
            let say = |m: &str| match &pb {
                Some(pb) => pb.println(m),
                None => eprintln!("{m}"),
            };
            let s = match file {
                Some(file) => client::put_retrying(file, &u, &o, retries, &say)?,
                None => client::put(file, &u, &o)?,
            };
            let what = format!(
                "{} -> {}",
                file.map(|f| f.display().to_string())
                    .unwrap_or_else(|| "zeros".into()),
                u.path
            );
            (s, what)
        }
        Cmd::Open { .. } => unreachable!("handled by interactive()"),
    };
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    println!("{}", cli::summary_text(&what, &summary));
    Ok(0)
}

/// The interactive mode; returns the exit status.
fn interactive(a: &Args, cmd: Option<&Cmd>, fc: &ClientConfig, o: client::Options) -> u8 {
    let mut sh = Shell::new(o, a.quiet);
    let opened = match (cmd, &a.url) {
        (
            Some(Cmd::Open {
                host,
                port,
                user,
                password,
            }),
            _,
        ) => {
            let mut line = format!("open \"{host}\" {port}");
            if let Some(u) = user.as_ref().or(fc.user.as_ref()) {
                line.push_str(&format!(" \"{u}\""));
                if let Some(p) = password.as_ref().or(fc.password.as_ref()) {
                    line.push_str(&format!(" \"{}\"", p.replace('"', "\\\"")));
                }
            }
            sh.execute(&line, &mut std::io::stdin().lock()).map(|_| ())
        }
        (_, Some(u)) => url(u, fc).and_then(|u| sh.open_url(&u)),
        (_, None) => Ok(()),
    };
    if let Err(e) = opened {
        eprintln!("rftp: {e}");
        sh.note_failure();
    }
    let code = sh.run(&mut std::io::stdin().lock());
    u8::try_from(code).unwrap_or(1)
}

fn main() -> ExitCode {
    rftp::init_logging("warn");
    let a = Args::parse();
    match run(&a) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("rftp: {e}");
            ExitCode::from(1)
        }
    }
}
