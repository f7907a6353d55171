//! `rftp`: FTP client with the RDMA extension. See `rftp --help`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rftp::client::{self, Options, Url};
use rftp::util::parse_size;
use serde::Deserialize;

/// FTP client that moves data over RDMA (software iWARP) when the server
/// offers RADR/RSTR/RRTR, and over a plain FTP data connection otherwise.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// TOML config file with defaults (streams, block_size, iodepth, user,
    /// password, timeout_secs, crc).
    #[arg(short, long, global = true)]
    config: Option<PathBuf>,
    /// Data streams (QPs).
    #[arg(long, global = true)]
    streams: Option<u32>,
    /// Block size, e.g. 1M or 256K.
    #[arg(long, global = true)]
    block_size: Option<String>,
    /// Blocks in flight per stream.
    #[arg(long, global = true)]
    iodepth: Option<u32>,
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
    /// Skip the SHA-256 check (HASH) after the transfer.
    #[arg(long, global = true)]
    no_verify: bool,
    /// Start downloads over instead of resuming a FILE.part.
    #[arg(long, global = true)]
    no_resume: bool,
    /// Require MPA CRC32C.
    #[arg(long, global = true)]
    crc: bool,
    /// Seconds any step may take.
    #[arg(long, global = true)]
    timeout: Option<u64>,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    streams: Option<u32>,
    block_size: Option<String>,
    iodepth: Option<u32>,
    user: Option<String>,
    password: Option<String>,
    timeout_secs: Option<u64>,
    crc: Option<bool>,
}

fn options(a: &Args, fc: &FileConfig) -> Result<Options, String> {
    let mut o = Options::default();
    if let Some(s) = a.streams.or(fc.streams) {
        o.streams = s;
    }
    if let Some(b) = a.block_size.as_ref().or(fc.block_size.as_ref()) {
        o.block_size = u32::try_from(parse_size(b)?).map_err(|_| "block size too large")?;
    }
    if let Some(d) = a.iodepth.or(fc.iodepth) {
        o.iodepth = d;
    }
    if let Some(t) = a.timeout.or(fc.timeout_secs) {
        o.timeout = Duration::from_secs(t.max(1));
    }
    o.tcp = a.tcp;
    o.xfer_mode = a.xfer_mode;
    o.mem = a.mem.as_deref().map(parse_size).transpose()?;
    o.verify = !a.no_verify;
    o.resume = !a.no_resume;
    o.crc = a.crc || fc.crc.unwrap_or(false);
    o.limit_rate = a.limit_rate.as_deref().map(parse_size).transpose()?;
    Ok(o)
}

fn url(s: &str, fc: &FileConfig) -> Result<Url, String> {
    let mut u = Url::parse(s)?;
    if !s.contains('@') {
        if let Some(user) = &fc.user {
            u.user = user.clone();
            u.password = fc.password.clone().unwrap_or_default();
        }
    }
    Ok(u)
}

fn bar(quiet: bool, total: Option<u64>) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    let pb = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::no_length(),
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(pb)
}

fn run(a: &Args) -> Result<(), String> {
    let fc: FileConfig = match &a.config {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )
        .map_err(|e| format!("{}: {e}", p.display()))?,
        None => FileConfig::default(),
    };
    let mut o = options(a, &fc)?;
    let pb = bar(a.quiet, o.mem);
    if let Some(pb) = &pb {
        let p1 = pb.clone();
        o.progress = Some(Arc::new(move |p: &rdma_xfer::Progress| {
            if let Some(t) = p.total {
                p1.set_length(t);
            }
            p1.set_position(p.bytes);
        }));
        let p2 = pb.clone();
        o.plain_progress = Some(Arc::new(move |done, total| {
            if let Some(t) = total {
                p2.set_length(t);
            }
            p2.set_position(done);
        }));
    }
    let (summary, what) = match &a.cmd {
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
            (
                client::get(&u, &out, &o)?,
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
            let s = client::put(file, &u, &o)?;
            let what = format!(
                "{} -> {}",
                file.map(|f| f.display().to_string())
                    .unwrap_or_else(|| "zeros".into()),
                u.path
            );
            (s, what)
        }
    };
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let mib = summary.bytes as f64 / (1u64 << 20) as f64;
    let resumed = if summary.resumed_from > 0 {
        format!(" (resumed at byte {})", summary.resumed_from)
    } else {
        String::new()
    };
    println!(
        "rftp: {what}: {mib:.1} MiB in {:.3} s, {:.2} Gbit/s via {}{resumed}",
        summary.elapsed.as_secs_f64(),
        summary.gbps(),
        summary.via
    );
    if let Some(h) = summary.sha256 {
        println!("rftp: SHA-256 verified: {h}");
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rftp: {e}");
            ExitCode::from(1)
        }
    }
}
