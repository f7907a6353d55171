//! `wanem`: the WAN path emulator's command line. See docs/WAN.md.

use clap::{Parser, Subcommand};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use wanem::config::{check_tag, Plan, UpArgs};
use wanem::{run, sys};

/// A packet-level WAN path emulator: two network namespaces joined by TUN
/// devices through a user-space link with delay, jitter, loss (random or
/// Gilbert-Elliott bursts), a bottleneck rate with a drop-tail byte queue,
/// reordering, MTU and link outages. Both ends' kernel TCP see the path end
/// to end. Needs root. Namespace a is 10.201.N.1, b is 10.201.N.2; run
/// programs there with `ip netns exec wan-TAG-a CMD` (or scripts/lib/wan.sh).
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Examples:\n  wanem up --tag t1 --rtt 50ms --rate 1gbit --queue bdp --loss 0.1%\n  ip netns exec wan-t1-a ping 10.201.0.2\n  wanem ctl --tag t1 stats\n  wanem ctl --tag t1 down 5\n  wanem down --tag t1"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the namespaces and run the path in the foreground until
    /// SIGINT/SIGTERM; then remove the namespaces and print the counters.
    Up(Box<UpArgs>),
    /// Stop the wanem of TAG if it still runs, and remove its namespaces and
    /// files (cleanup after a crash; safe to run when nothing is there).
    Down {
        #[arg(long)]
        tag: String,
    },
    /// Talk to a running wanem: `stats` (counters per direction, CPU time),
    /// `down SECONDS` (link down now, both ways), `up` (end an outage).
    Ctl {
        #[arg(long)]
        tag: String,
        /// stats | down SECONDS | up
        #[arg(required = true, num_args = 1..=2)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Up(a) => a
            .merged()
            .and_then(|a| Plan::from_args(&a))
            .and_then(run::up),
        Cmd::Down { tag } => down(&tag),
        Cmd::Ctl { tag, command } => ctl(&tag, &command.join(" ")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wanem: {e}");
            ExitCode::FAILURE
        }
    }
}

fn down(tag: &str) -> Result<(), String> {
    check_tag(tag)?;
    if let Ok(env) = std::fs::read_to_string(run::state_file(tag)) {
        let pid = env
            .lines()
            .find_map(|l| l.strip_prefix("WAN_PID="))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(pid) = pid.filter(|&p| sys::process_is(p, "wanem")) {
            sys::terminate(pid);
            let t0 = Instant::now();
            while sys::process_is(pid, "wanem") && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    run::teardown(tag);
    Ok(())
}

fn ctl(tag: &str, cmd: &str) -> Result<(), String> {
    check_tag(tag)?;
    let path = run::ctl_socket(tag);
    let mut s = UnixStream::connect(&path)
        .map_err(|e| format!("{path}: {e} (is `wanem up --tag {tag}` running?)"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{cmd}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("{path}: {e}"))?;
    print!("{out}");
    if out.starts_with("error") {
        return Err("command refused".into());
    }
    Ok(())
}
