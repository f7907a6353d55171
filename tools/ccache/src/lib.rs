//! # ccache: the strongly coherent cache's daemons (issue 13)
//!
//! The I/O around [`ccache_proto`]:
//!
//! - [`table`]: the version table, a registered memory region with
//!   `REMOTE_READ` holding one checked 16-byte slot per document.
//! - [`ipc`]: ccappd's Table 1 IPC server (per-client output queues,
//!   peer credentials, connection and hold limits).
//! - [`access`]: the IPC allow-list (`SO_PEERCRED`) and the deployment's
//!   access token (HMAC proofs of it).
//! - [`listen`]: the RDMA listeners of the version table and of a proxy's
//!   state region: handshakes off the accept path with a deadline, a
//!   bound on live connections, the token checked before any queue pair.
//! - [`msgio`]: reading and writing the 16-byte IPC message on a stream.
//! - [`appd`]: the application module's servers (`ccappd`): the RDMA
//!   listener that hands out the table's address and rkey, the two-sided
//!   version thread, the Table 1 IPC server, and the update thread.
//! - [`check`]: the proxy's version checks: one RDMA Read of the slot, or
//!   a request to the version thread.
//! - [`proxy`]: `ccproxy`, an HTTP/1.1 caching reverse proxy (hyper on
//!   tokio) that validates every request.
//! - [`acheck`]: the version checks on the proxy's event loop.
//! - [`state`]: the proxy's cache and its cache state region (the
//!   most-recently-accessed list the module reads), with the Figure 12
//!   counters (misses, wasted updates).
//! - [`push`]: adaptive push-pull: the proxy's registration and push
//!   channel, and the module's pusher (state reads, policy, pushes).
//! - [`sockets`]: the `sockets` mode, the version request over
//!   iWARP sockets (ccappd's listener and the proxy's check).
//! - [`shard`]: documents sharded over application servers (the shard
//!   map file and the proxy's front).
//! - [`load`]: `ccload`'s workloads (Zipf, sizes, access-log replay, a
//!   WorldCup-98-shaped log) and the stale checker.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod access;
pub mod acheck;
pub mod appd;
pub mod check;
pub mod ipc;
pub mod listen;
pub mod load;
pub mod msgio;
pub mod proxy;
pub mod push;
pub mod shard;
pub mod sockets;
pub mod state;
pub mod table;

/// Install the `tracing` subscriber (`RUST_LOG`, default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The command line with a config file's settings in front of it.
///
/// If the arguments hold `--config FILE` (or `--config=FILE`), each line
/// `key = value` of FILE becomes `--key value` (`key = true` becomes
/// `--key`, `key = false` is left out; blank lines and `#` comments are
/// skipped), inserted before the command line's own arguments, so that a
/// flag given on the command line wins (the binaries parse with
/// `args_override_self`). The keys are the long flags' names.
pub fn args_with_config(args: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    let mut path = None;
    let mut it = args.iter().enumerate().skip(1);
    while let Some((_, a)) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            path = it.next().map(|(_, p)| std::path::PathBuf::from(p));
        } else if let Some(p) = a.strip_prefix("--config=") {
            path = Some(p.into());
        }
    }
    let Some(path) = path else { return Ok(args) };
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let mut out = vec![args[0].clone()];
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            format!(
                "{}:{}: expected `key = value`, got {line:?}",
                path.display(),
                n + 1
            )
        })?;
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        if k.is_empty() || k == "config" {
            return Err(format!("{}:{}: bad key {k:?}", path.display(), n + 1));
        }
        match v {
            "true" => out.push(format!("--{k}").into()),
            "false" => {}
            v => {
                out.push(format!("--{k}").into());
                out.push(v.into());
            }
        }
    }
    out.extend(args.into_iter().skip(1));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::args_with_config;
    use std::ffi::OsString;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn config_file_args_come_first() {
        let dir = std::env::temp_dir().join(format!("ccache-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.conf");
        std::fs::write(&f, "# push\npush-policy = hybrid\nhybrid-percent=30 # hot\n\ninit-docs = true\nverbose = false\n").unwrap();
        let got = args_with_config(os(&[
            "ccappd",
            "--config",
            f.to_str().unwrap(),
            "--hybrid-percent",
            "10",
        ]))
        .unwrap();
        assert_eq!(
            got,
            os(&[
                "ccappd",
                "--push-policy",
                "hybrid",
                "--hybrid-percent",
                "30",
                "--init-docs",
                "--config",
                f.to_str().unwrap(),
                "--hybrid-percent",
                "10"
            ])
        );
        assert_eq!(
            args_with_config(os(&["x", "--docs", "3"])).unwrap(),
            os(&["x", "--docs", "3"])
        );
        std::fs::write(&f, "nonsense\n").unwrap();
        let e = args_with_config(os(&["x", &format!("--config={}", f.display())])).unwrap_err();
        assert!(e.contains(":1: expected `key = value`"), "{e}");
        assert!(args_with_config(os(&["x", "--config", "/nonexistent/c"]))
            .unwrap_err()
            .contains("/nonexistent/c"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
