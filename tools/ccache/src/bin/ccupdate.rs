//! `ccupdate`: the update server, as a program of its own.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ccache::appd::{self, UpdaterCfg};
use clap::{CommandFactory, Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SelectArg {
    /// Any document 0..DOCS, uniformly.
    Uniform,
    /// A random document a registered proxy accessed recently.
    Accessed,
}

/// Update server (issue 13): at a set rate, picks a document, takes it from
/// ccappd with UPDATE_REQUEST (waiting until its readers are done),
/// rewrites its file in place, and commits with UPDATE_DONE, which bumps
/// the version. Each commit is appended to the log as `<unix ns> <doc>
/// <version>`. Same as ccappd's built-in update thread (--update-rate),
/// but runnable on its own and stoppable after --count updates.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Read settings from FILE first: TOML whose keys are the long flags
    /// (e.g. `rate = 2`; docs/CACHE.md). CCUPDATE_KEY=value variables
    /// override the file (e.g. CCUPDATE_DOCS=1024), and the command line wins
    /// over both. The old `key = value` syntax with bare values is still
    /// read, with a warning.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Which document each update picks: `accessed` asks ccappd
    /// (PICK_ACCESSED) for a random document that a registered proxy has
    /// accessed recently (the seed: a random accessed document every
    /// second; ccappd needs --push-listen); `uniform` picks any.
    #[arg(long, value_enum, default_value = "uniform")]
    select: SelectArg,
    /// ccappd's IPC socket (its --ipc).
    #[arg(long, default_value = "/run/ccappd/ipc.sock")]
    ipc: PathBuf,
    /// Directory of the documents' files (ccappd's --docroot).
    #[arg(long)]
    docroot: PathBuf,
    /// Documents 0..DOCS are updated.
    #[arg(long, default_value_t = 64)]
    docs: u32,
    /// Bytes per document (must match the files: they are rewritten in place).
    #[arg(long, default_value_t = 8192)]
    doc_size: usize,
    /// Updates per second.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Pieces each file is rewritten in (with a pause between).
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Stop after this many updates (default: run until killed or an error).
    #[arg(long)]
    count: Option<u64>,
    /// Append `<unix ns> <doc> <version>` here for every commit.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Bound on each IPC reply, milliseconds.
    #[arg(long, default_value_t = 10000)]
    timeout_ms: u64,
}

fn main() -> ExitCode {
    ccache::init_logging();
    let a =
        match ccache::args_with_config(&Args::command(), "CCUPDATE", std::env::args_os().collect())
        {
            Ok(args) => Args::parse_from(args),
            Err(e) => {
                eprintln!("ccupdate: {e}");
                return ExitCode::from(2);
            }
        };
    if a.docs == 0 || a.rate <= 0.0 {
        tracing::error!("--docs and --rate must be positive");
        return ExitCode::FAILURE;
    }
    let cfg = UpdaterCfg {
        ipc: a.ipc,
        docroot: a.docroot,
        docs: a.docs,
        doc_size: a.doc_size,
        rate: a.rate,
        steps: a.steps,
        log: a.log,
        timeout: Duration::from_millis(a.timeout_ms.max(1)),
        count: a.count,
        select: match a.select {
            SelectArg::Uniform => appd::Select::Uniform,
            SelectArg::Accessed => appd::Select::Accessed,
        },
    };
    match appd::run_updater(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("update server stopped: {e}");
            ExitCode::FAILURE
        }
    }
}
