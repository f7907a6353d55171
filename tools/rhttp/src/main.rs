//! `rhttp`: an HTTP client like wget/curl that moves bodies by RDMA
//! (software iWARP) when the server runs mod_rdma, and falls back to plain
//! HTTP when it does not. See `rhttp --help` and `docs/MOD_RDMA.md`.
//!
//! Files by role, each importing only the ones listed before it (no
//! circle, nothing taken from this file):
//!
//! - `cli.rs`: the command line and the parsers of its values;
//! - `settings.rs`: the run's settings chosen once (TLS, device,
//!   congestion control, the default `--max-len`);
//! - `stats.rs`: each GET's result line and the `--stats` counters;
//! - `sink.rs`: where a body goes (file or stdout) and the progress bar;
//! - `rdma.rs`: the RDMA side of a session (listener, connection,
//!   buffers, control messages, bounded waits);
//! - `session.rs`: one HTTP connection plus its RDMA side;
//! - `get.rs`: `get` one request at a time (plain, server-writes,
//!   client-reads) and the options of `get`;
//! - `put.rs`: uploads and the `probe-stag` test command;
//! - `pipeline.rs`: pipelined GETs, and [`pipeline::fetch`], which runs a
//!   list of GETs one at a time or pipelined;
//! - `recursive.rs`: `get -r`/`-p` (the crawl itself is the library's
//!   `crawl`);
//! - this file: `main` and the `get` command.
//!
//! The protocol codecs are the library's (`lib.rs`).

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rhttp::http::Url;

mod cli;
mod get;
mod pipeline;
mod put;
mod rdma;
mod recursive;
mod session;
mod settings;
mod sink;
mod stats;

use cli::{Args, Cmd, GetScheme};
use get::{CrawlOpts, GetHooks, GetOpts, Job};
use put::{cmd_probe, cmd_put, PutHooks};
use session::Session;
use settings::{open_device, Res, CONGESTION, DEVICE, TLS};
use stats::print_stats;

fn cmd_get(
    a: &Args,
    urls: &[String],
    outputs: &[PathBuf],
    scheme: GetScheme,
    hooks: GetHooks,
    opts: &GetOpts,
) -> Res<bool> {
    if opts.tree() {
        if !outputs.is_empty() {
            return Err("-r and -p save every object under -P DIR by its path; drop -o".into());
        }
        return recursive::cmd_crawl(a, urls, scheme, &hooks, opts);
    }
    let mut depth = if hooks.any() { 1 } else { opts.depth };
    let started = Instant::now();
    let mut pages = Vec::new();
    let mut https = None;
    for (i, u) in urls.iter().enumerate() {
        let (url, tls) = Url::parse_any(u)?;
        if *https.get_or_insert(tls) != tls {
            return Err(format!(
                "{u:?}: give either http:// or https:// URLs in one command, not both"
            ));
        }
        let out = outputs
            .get(i)
            .cloned()
            .unwrap_or_else(|| PathBuf::from(url.file_name()));
        pages.push(Job { url, out });
    }
    if https == Some(true) {
        let tls = rhttp::http::tls_config(a.cacert.as_deref(), a.insecure)?;
        let _ = TLS.set(tls);
        // One request at a time: rdma_get seals and checks each body.
        depth = 1;
    }
    let mut session: Option<Session> = None;
    let all_ok = pipeline::fetch(a, &mut session, &pages, scheme, &hooks, depth, opts)?;
    print_stats(opts.stats, started);
    Ok(all_ok)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr)
        .init();
    let a = Args::parse();
    let _ = DEVICE.set(a.device.clone());
    let _ = CONGESTION.set(a.congestion.clone());
    if !a.plain {
        // Fail at start, with the reason and the fix, rather than at the
        // first RDMA request.
        if let Err(e) = open_device() {
            eprintln!("rhttp: {e}");
            return ExitCode::from(2);
        }
    }
    let r = match &a.cmd {
        Cmd::Get {
            urls,
            recursive,
            level,
            page_requisites,
            no_parent,
            no_host_directories,
            no,
            execute,
            max_files,
            directory_prefix,
            pipeline,
            stats,
            output,
            scheme,
            x_hold_ms,
            x_hold_accept,
            x_drop_rdma_after,
            x_pause_before_request,
            x_tamper_sealed,
        } => cmd_get(
            &a,
            urls,
            output,
            *scheme,
            GetHooks {
                hold: *x_hold_ms,
                hold_accept: *x_hold_accept,
                drop_rdma_after: *x_drop_rdma_after,
                pause_before_request: *x_pause_before_request,
                tamper_sealed: *x_tamper_sealed,
            },
            &GetOpts {
                recursive: *recursive,
                dir: directory_prefix.clone(),
                depth: pipeline.unwrap_or(if *recursive || *page_requisites { 8 } else { 1 })
                    as usize,
                stats: *stats,
                crawl: CrawlOpts {
                    level: level.map_or(Some(5), |l| l.0),
                    page_requisites: *page_requisites,
                    no_parent: *no_parent || no.iter().any(|n| n == "p"),
                    host_dirs: !(*no_host_directories || no.iter().any(|n| n == "H")),
                    robots: execute.last().copied().unwrap_or(true),
                    max_files: *max_files as usize,
                },
            },
        ),
        Cmd::Put {
            file,
            url,
            post,
            scheme,
            output,
            x_abort_at_buf,
            x_bad_stag,
        } => {
            let method = if *post { "POST" } else { "PUT" };
            let hooks = PutHooks {
                abort_at_buf: *x_abort_at_buf,
                bad_stag: *x_bad_stag,
            };
            cmd_put(method, &a, file, url, *scheme, output.as_ref(), hooks)
        }
        Cmd::ProbeStag {
            url,
            stag,
            to,
            len,
            beyond,
        } => cmd_probe(&a, url, *stag, *to, *len, *beyond),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rhttp: {e}");
            ExitCode::from(2)
        }
    }
}
