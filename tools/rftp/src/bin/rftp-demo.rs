//! `rftp-demo`: the main job. Starts rftpd on a free 127.0.0.1 port
//! serving a temporary root, writes a test file of pseudo-random bytes,
//! uploads it (`rput`) and downloads it again (`rget`) over software iWARP
//! with a progress bar, and checks the SHA-256 on both ends: the local
//! original, the server's `HASH` of the uploaded copy, and the downloaded
//! copy. Exits non-zero on any error or mismatch; removes its temporary
//! directory and stops the server in every case.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::ProgressBar;
use rftp::cli;
use rftp::client::{self, Options, Url};
use rftp::server::{serve, ServerConfig};
use rftp::util::{hex, parse_size};
use sha2::{Digest, Sha256};

/// Start rftpd on loopback and move a file through it with rftp over
/// software iWARP (RDMA Write), verifying SHA-256 on both ends.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Size of the test file (e.g. 256M, 1G).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Data streams (QPs).
    #[arg(long, default_value_t = 4)]
    streams: u32,
    /// Block size.
    #[arg(long, default_value = "1M")]
    block_size: String,
    /// Blocks in flight per stream.
    #[arg(long, default_value_t = 4)]
    iodepth: u32,
    /// Directory for the temporary files (default: $TMPDIR or /tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds any single step may take.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    /// Internal: run the server with this config (the demo re-executes
    /// itself so that rftpd is a separate process).
    #[arg(long, hide = true, value_name = "CONFIG")]
    serve: Option<PathBuf>,
}

/// Removes the directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!(
                "rftp-demo: could not remove {}: {e}; delete it by hand",
                self.0.display()
            );
        }
    }
}

/// Kills and reaps the server when dropped.
struct ServerProc(Child);

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Write `len` pseudo-random bytes (xorshift64) and return their SHA-256.
fn write_test_file(path: &Path, len: u64, seed: u64) -> Result<String, String> {
    let mut f = std::fs::File::create(path)
        .map_err(|e| format!("creating {}: {e}; pick another --dir", path.display()))?;
    let mut h = Sha256::new();
    let mut x = seed | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for c in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        h.update(&buf[..n]);
        f.write_all(&buf[..n])
            .map_err(|e| format!("writing {}: {e}; pick another --dir", path.display()))?;
        left -= n as u64;
    }
    f.sync_all().ok();
    Ok(hex(&h.finalize()))
}

/// Start `rftp-demo --serve CONFIG` and read the address it listens on.
fn start_server(cfg: &Path, timeout: Duration) -> Result<(ServerProc, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating rftp-demo itself: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--serve").arg(cfg).stdout(Stdio::piped());
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the server: {e}"))?;
    let stdout = child.stdout.take().ok_or("server stdout missing")?;
    let proc = ServerProc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    let line = match rx.recv_timeout(timeout) {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err(format!("reading the server's address: {e}")),
        Err(_) => return Err(format!("the server did not start within {timeout:?}")),
    };
    let addr = line
        .trim()
        .strip_prefix("rftpd listening on ")
        .ok_or_else(|| format!("the server did not start: {line:?}"))?
        .to_string();
    Ok((proc, addr))
}

/// The server side (`--serve CONFIG`): rftpd's `serve`.
fn serve_main(cfg: &Path) -> ExitCode {
    // Die with the demo even if it is killed outright.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and has no
    // memory-safety preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    let cfg = match ServerConfig::load(Some(cfg)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rftpd: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match std::net::TcpListener::bind(&cfg.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rftpd: cannot listen on {}: {e}", cfg.listen);
            return ExitCode::from(1);
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("rftpd listening on {a}"),
        Err(e) => {
            eprintln!("rftpd: {e}");
            return ExitCode::from(1);
        }
    }
    let _ = std::io::stdout().flush();
    match serve(listener, cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rftpd: {e}");
            ExitCode::from(1)
        }
    }
}

/// A progress bar on a terminal, progress lines otherwise.
fn progress(quiet: bool, size: u64, o: &mut Options, label: &str) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    if std::io::stderr().is_terminal() {
        let pb = cli::progress_bar(false, Some(size))?;
        cli::attach(o, &pb);
        Some(pb)
    } else {
        cli::attach_lines(o, label);
        None
    }
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn demo(a: &Args) -> Result<(), String> {
    let size = parse_size(&a.size)?;
    let block_size = u32::try_from(parse_size(&a.block_size)?)
        .map_err(|_| "--block-size: at most 4 GiB".to_string())?;
    let timeout = Duration::from_secs(a.timeout.max(1));
    let base = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = TempDir(base.join(format!(
        "rftp-demo-{}-{:08x}",
        std::process::id(),
        rdma_xfer::random_u64() as u32
    )));
    let root = tmp.0.join("root");
    std::fs::create_dir_all(&root).map_err(|e| {
        format!(
            "creating {}: {e}; pass --dir to a writable directory",
            root.display()
        )
    })?;
    let password = format!("{:016x}", rdma_xfer::random_u64());
    let cfg_path = tmp.0.join("rftpd.toml");
    let text = format!(
        "listen = {}\nroot = {}\nblock_size = {}\niodepth = {}\nmax_streams = {}\ndata_timeout_secs = {}\n\n[[users]]\nname = \"demo\"\npassword = {}\nwrite = true\n",
        toml_str("127.0.0.1:0"),
        toml_str(&root.to_string_lossy()),
        block_size.max(rdma_xfer::MIN_BLOCK),
        a.iodepth.max(1),
        a.streams.max(1),
        a.timeout.max(1),
        toml_str(&password),
    );
    std::fs::write(&cfg_path, text).map_err(|e| format!("writing {}: {e}", cfg_path.display()))?;

    let (server, addr) = start_server(&cfg_path, timeout)?;
    println!(
        "rftp-demo: rftpd (pid {}) listening on {addr}, root {}",
        server.0.id(),
        root.display()
    );

    let src = tmp.0.join("source.bin");
    let t = Instant::now();
    let want = write_test_file(&src, size, rdma_xfer::random_u64())?;
    println!(
        "rftp-demo: wrote {} ({size} bytes of pseudo-random data) in {:.2} s\nrftp-demo: SHA-256 of the original: {want}",
        src.display(),
        t.elapsed().as_secs_f64()
    );

    let url = Url::parse(&format!("ftp://demo:{password}@{addr}/demo.bin"))?;
    let base_opts = Options {
        streams: a.streams.max(1),
        block_size,
        iodepth: a.iodepth.max(1),
        timeout,
        // The demo shows three SHA-256 values side by side (the original,
        // the server's HASH, the download), so it asks for SHA-256 rather
        // than the negotiated default.
        checksum: rftp::checksum::Choice::Only(rftp::checksum::Algo::Sha256),
        ..Options::default()
    };

    // Upload over RDMA: rput.
    let mut o = base_opts.clone();
    println!("rftp-demo: rput {} -> {addr}/demo.bin", src.display());
    let pb = progress(a.quiet, size, &mut o, "rput");
    let up = client::put(Some(&src), &url, &o);
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let up = up.map_err(|e| format!("upload: {e}"))?;
    println!("{}", cli::summary_text("rput source.bin -> demo.bin", &up));
    if !up.via.starts_with("rdma") {
        return Err(format!(
            "upload went via {}, not RDMA: the server did not accept RADR",
            up.via
        ));
    }
    let server_side = up
        .checksum
        .clone()
        .map(|(_, h)| h)
        .ok_or("the server did not report a SHA-256 (HASH) for the upload")?;

    // Download over RDMA: rget.
    let back = tmp.0.join("downloaded.bin");
    let mut o = base_opts.clone();
    println!("rftp-demo: rget {addr}/demo.bin -> {}", back.display());
    let pb = progress(a.quiet, size, &mut o, "rget");
    let down = client::get(&url, &back, &o);
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let down = down.map_err(|e| format!("download: {e}"))?;
    println!(
        "{}",
        cli::summary_text("rget demo.bin -> downloaded.bin", &down)
    );
    let downloaded =
        rftp::util::sha256_file(&back).map_err(|e| format!("hashing {}: {e}", back.display()))?;

    println!("rftp-demo: SHA-256 original       {want}");
    println!("rftp-demo: SHA-256 on the server  {server_side}");
    println!("rftp-demo: SHA-256 downloaded     {downloaded}");
    if want != server_side || want != downloaded {
        return Err("SHA-256 MISMATCH: the data changed in transit".into());
    }
    println!(
        "rftp-demo: OK: {} MiB up at {:.2} Gbit/s and down at {:.2} Gbit/s over software iWARP ({}, block {} B, iodepth {}); SHA-256 verified on both ends",
        size >> 20,
        up.gbps(),
        down.gbps(),
        up.via,
        block_size,
        base_opts.iodepth
    );
    Ok(())
}

fn main() -> ExitCode {
    rftp::init_logging("warn");
    let a = Args::parse();
    if let Some(cfg) = &a.serve {
        // SAFETY: see rftpd: ignoring SIGXFSZ has no preconditions.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        }
        return serve_main(cfg);
    }
    match demo(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rftp-demo: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}
