//! What the rftpd process tests share: start rftpd on a fresh root.
// Each test binary that includes this module uses a different part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rftp::client::Ftp;

pub const T: Duration = Duration::from_secs(10);

pub struct Server {
    child: Child,
    pub port: u16,
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// rftpd with user alice/secret, `extra` appended to its config, logging
/// at `log` (RUST_LOG) to `log_file` if given.
pub fn server_logged(extra: &str, log: &str, log_file: Option<&std::path::Path>) -> Server {
    server_env(extra, log, log_file, &[])
}

/// As [`server_logged`], with extra environment variables for rftpd.
pub fn server_env(
    extra: &str,
    log: &str,
    log_file: Option<&std::path::Path>,
    env: &[(&str, &str)],
) -> Server {
    server_full("127.0.0.1:0", extra, log, log_file, env)
}

/// rftpd listening on `listen` (e.g. `[::]:0`), with `extra` config.
pub fn server_at(listen: &str, extra: &str) -> Server {
    server_full(listen, extra, "error", None, &[])
}

fn server_full(
    listen: &str,
    extra: &str,
    log: &str,
    log_file: Option<&std::path::Path>,
    env: &[(&str, &str)],
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let cfg = dir.path().join("rftpd.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"{listen}\"\nroot = \"{}\"\ndata_timeout_secs = 5\n{extra}\n\
             [[users]]\nname = \"alice\"\npassword = \"secret\"\n",
            root.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rftpd"));
    cmd.arg("-c")
        .arg(&cfg)
        .env("RUST_LOG", log)
        .envs(env.iter().copied())
        .stdout(Stdio::piped());
    if let Some(f) = log_file {
        cmd.stderr(std::fs::File::create(f).unwrap());
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().rsplit(':').next().unwrap().parse().unwrap();
    Server {
        child,
        port,
        root: root.canonicalize().unwrap(),
        _dir: dir,
    }
}

pub fn server(extra: &str) -> Server {
    server_logged(extra, "error", None)
}

impl Server {
    pub fn ftp(&self) -> Ftp {
        let mut f = Ftp::connect("127.0.0.1", self.port, T).unwrap();
        f.login("alice", "secret").unwrap();
        f
    }
    pub fn url(&self, path: &str) -> String {
        format!("ftp://alice:secret@127.0.0.1:{}/{path}", self.port)
    }
}

/// Write `len` pseudo-random bytes (xorshift64 from `seed`) to `path`, a
/// MiB at a time.
pub fn write_random(path: &std::path::Path, len: usize, seed: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut x = seed | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for c in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
}

/// A port for rftpd's fixed RADR listener (`rdma_port`), which rftpd binds
/// later. A port from `bind(":0")`, released at once, can be taken in the
/// meantime as the source port of any outgoing connection (the kernel
/// hands both out of `ip_local_port_range`): a CI run failed so, with
/// EADDRINUSE at RADR. These come from below that range, are free when
/// handed out, and are distinct within the test process (its tests run in
/// parallel).
pub fn fixed_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let ephemeral_lo: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let lo: u16 = 10_000;
    let span = ephemeral_lo.saturating_sub(lo).max(1);
    // Processes of other test binaries start elsewhere in the span.
    let start = std::process::id() % u32::from(span);
    for _ in 0..span {
        let i = u32::from(NEXT.fetch_add(1, Ordering::Relaxed));
        let p = lo + ((start + i) % u32::from(span)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port between {lo} and {ephemeral_lo}");
}
