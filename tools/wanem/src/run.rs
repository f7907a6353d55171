//! The thin I/O driver of `wanem up`: sets up the namespaces and TUN
//! devices, runs one thread per direction (read -> [`Pipe`] -> write at the
//! release time), a control socket, and tears everything down on SIGINT or
//! SIGTERM.

use crate::config::{Plan, DEV};
use crate::pipe::{Counters, DropReason, Out, Pipe};
use crate::sys;
use crate::units::Nanos;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const RUN_DIR: &str = "/run/wanem";

pub fn state_file(tag: &str) -> String {
    format!("{RUN_DIR}/{tag}.env")
}

pub fn ctl_socket(tag: &str) -> String {
    format!("{RUN_DIR}/{tag}.sock")
}

/// A down window `[from, until)` in the clock's nanoseconds; `until == 0`
/// means "up again now".
#[derive(Clone, Copy, Debug, Default)]
struct DownCmd {
    from: Nanos,
    until: Nanos,
}

/// What the threads share.
struct Shared {
    start: Instant,
    stop: AtomicBool,
    down_gen: AtomicU64,
    down_cmd: Mutex<DownCmd>,
    a_to_b: Counters,
    b_to_a: Counters,
}

impl Shared {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn command_down(&self, cmd: DownCmd) {
        *self.down_cmd.lock().unwrap() = cmd;
        self.down_gen.fetch_add(1, Ordering::Release);
    }

    fn stats(&self) -> String {
        let (u, s) = sys::cpu_time();
        let wall = self.start.elapsed().as_secs_f64();
        let cpu = (u + s).as_secs_f64();
        format!(
            "a->b {}\nb->a {}\ncpu user_s={:.3} sys_s={:.3} wall_s={:.3} share={:.1}%\n",
            self.a_to_b.line(),
            self.b_to_a.line(),
            u.as_secs_f64(),
            s.as_secs_f64(),
            wall,
            100.0 * cpu / wall.max(1e-9)
        )
    }
}

/// Removes what `up` made for `tag`: namespaces, state file, socket.
pub fn teardown(tag: &str) {
    let (a, b) = crate::config::ns_names(tag);
    for ns in [&a, &b] {
        if sys::netns_exists(ns) {
            if let Err(e) = sys::ip(&["netns", "del", ns]) {
                tracing::warn!("{e}");
            }
        }
    }
    let _ = std::fs::remove_file(state_file(tag));
    let _ = std::fs::remove_file(ctl_socket(tag));
}

/// `wanem up`: runs until SIGINT/SIGTERM, then cleans up and prints the
/// counters.
pub fn up(plan: Plan) -> Result<(), String> {
    for ns in [&plan.ns_a, &plan.ns_b] {
        if sys::netns_exists(ns) {
            return Err(format!(
                "namespace {ns} exists: a wanem with tag `{}` runs, or one crashed; run `wanem down --tag {}`",
                plan.tag, plan.tag
            ));
        }
    }
    sys::block_stop_signals();
    std::fs::create_dir_all(RUN_DIR).map_err(|e| format!("{RUN_DIR}: {e}"))?;
    let res = setup(&plan).and_then(|(ta, tb)| serve(&plan, ta, tb));
    teardown(&plan.tag);
    res
}

fn setup(plan: &Plan) -> Result<(OwnedFd, OwnedFd), String> {
    for ns in [&plan.ns_a, &plan.ns_b] {
        sys::ip(&["netns", "add", ns])?;
        sys::ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    let ta = sys::open_tun_in(&plan.ns_a, DEV, plan.mtu)?;
    let tb = sys::open_tun_in(&plan.ns_b, DEV, plan.mtu)?;
    for (ns, me, peer) in [
        (&plan.ns_a, &plan.addr_a, &plan.addr_b),
        (&plan.ns_b, &plan.addr_b, &plan.addr_a),
    ] {
        // Point to point: the peer is reached through the TUN, nothing else is routed.
        sys::ip(&["-n", ns, "addr", "add", me, "peer", peer, "dev", DEV])?;
        // A deeper device queue than tun's 500, so a burst from the sender's
        // stack waits for us instead of being dropped where we cannot count it.
        sys::ip(&["-n", ns, "link", "set", DEV, "txqueuelen", "10000"])?;
    }
    Ok((ta, tb))
}

fn serve(plan: &Plan, ta: OwnedFd, tb: OwnedFd) -> Result<(), String> {
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        down_gen: AtomicU64::new(0),
        down_cmd: Mutex::new(DownCmd::default()),
        a_to_b: Counters::default(),
        b_to_a: Counters::default(),
    });
    let seed = plan.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut pab = Pipe::new(plan.a_to_b.clone(), seed);
    let mut pba = Pipe::new(plan.b_to_a.clone(), seed ^ 0x5555_5555_5555_5555);
    if let Some((at, len)) = plan.down {
        pab.add_down(at, at + len);
        pba.add_down(at, at + len);
    }
    let sock_path = ctl_socket(&plan.tag);
    let _ = std::fs::remove_file(&sock_path);
    let listener =
        UnixListener::bind(&sock_path).map_err(|e| format!("control socket {sock_path}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;

    let (fa, fb) = (ta.as_raw_fd(), tb.as_raw_fd());
    let threads = vec![
        spawn_dir("a->b", fa, fb, pab, shared.clone(), true, plan.realtime),
        spawn_dir("b->a", fb, fa, pba, shared.clone(), false, plan.realtime),
        {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name("ctl".into())
                .spawn(move || control(listener, sh))
                .map_err(|e| e.to_string())?
        },
    ];
    let env = format!(
        "WAN_TAG={}\nWAN_NS_A={}\nWAN_NS_B={}\nWAN_ADDR_A={}\nWAN_ADDR_B={}\nWAN_DEV={DEV}\nWAN_MTU={}\nWAN_PID={}\nWAN_CTL={sock_path}\n",
        plan.tag,
        plan.ns_a,
        plan.ns_b,
        plan.addr_a,
        plan.addr_b,
        plan.mtu,
        std::process::id()
    );
    std::fs::write(state_file(&plan.tag), env)
        .map_err(|e| format!("{}: {e}", state_file(&plan.tag)))?;
    tracing::info!("up: {}", plan.describe());

    while !shared.stop.load(Ordering::Relaxed) {
        if let Some(sig) = sys::wait_signal(Duration::from_millis(200)) {
            tracing::info!("signal {sig}: stopping");
            shared.stop.store(true, Ordering::Relaxed);
        }
        if threads.iter().any(|t| t.is_finished()) {
            shared.stop.store(true, Ordering::Relaxed);
        }
    }
    let mut err = None;
    for t in threads {
        if let Ok(Err(e)) = t.join() {
            err = Some(e);
        }
    }
    print!("wanem {} stats:\n{}", plan.tag, shared.stats());
    drop((ta, tb));
    err.map_or(Ok(()), Err)
}

fn spawn_dir(
    name: &'static str,
    fd_in: RawFd,
    fd_out: RawFd,
    pipe: Pipe,
    sh: Arc<Shared>,
    ab: bool,
    realtime: bool,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if realtime {
                if let Err(e) = sys::set_fifo(10) {
                    tracing::warn!("{name}: --realtime: SCHED_FIFO refused: {e} (needs root or CAP_SYS_NICE); running at normal priority");
                }
            }
            let counters = if ab { &sh.a_to_b } else { &sh.b_to_a };
            let r = direction(name, fd_in, fd_out, pipe, &sh, counters);
            if let Err(e) = &r {
                tracing::error!("{name}: {e}");
            }
            r
        })
        .expect("spawn")
}

/// Longest sleep, so a stop or a control command is seen promptly.
const MAX_WAIT: Duration = Duration::from_millis(20);
/// Below this the loop spins instead of sleeping: a wakeup can come tens of
/// microseconds late, and a release must not.
const SPIN: Nanos = 20_000;

fn direction(
    name: &str,
    fd_in: RawFd,
    fd_out: RawFd,
    mut pipe: Pipe,
    sh: &Shared,
    counters: &Counters,
) -> Result<(), String> {
    sys::set_timer_slack(1);
    let mut scratch = vec![0u8; 65536];
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let mut seen_gen = 0;
    let mut write_errors = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let g = sh.down_gen.load(Ordering::Acquire);
        if g != seen_gen {
            seen_gen = g;
            let c = *sh.down_cmd.lock().unwrap();
            if c.until == 0 {
                pipe.clear_down();
            } else {
                pipe.add_down(c.from, c.until);
            }
        }
        let now = sh.now();
        while let Some(out) = pipe.poll_release(now) {
            let p = match out {
                Out::Forward(p) => {
                    match sys::write(fd_out, &p) {
                        Ok(_) => counters.forwarded(p.len()),
                        Err(e) => {
                            counters.dropped(DropReason::TooBig);
                            write_errors += 1;
                            if write_errors.is_power_of_two() {
                                tracing::warn!("{name}: write to TUN: {e} ({write_errors} so far)");
                            }
                        }
                    }
                    p
                }
                Out::Lost(p) => {
                    counters.dropped(DropReason::Down);
                    p
                }
            };
            if pool.len() < 4096 {
                pool.push(p);
            }
        }
        // Take what is waiting, a bounded batch so releases are not starved.
        for _ in 0..64 {
            match sys::read(fd_in, &mut scratch) {
                Ok(n) => {
                    let mut v = pool.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(&scratch[..n]);
                    if let Err((why, v)) = pipe.arrive(sh.now(), v) {
                        counters.dropped(why);
                        pool.push(v);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(format!("read from TUN: {e}")),
            }
        }
        let now = sh.now();
        let wait = match pipe.next_deadline() {
            Some(d) if d <= now => continue,
            Some(d) => d - now,
            None => MAX_WAIT.as_nanos() as Nanos,
        };
        if wait <= SPIN {
            std::hint::spin_loop();
            continue;
        }
        let t = Duration::from_nanos(wait - SPIN).min(MAX_WAIT);
        sys::wait_readable(fd_in, t).map_err(|e| format!("ppoll: {e}"))?;
    }
    Ok(())
}

/// The control socket: one line per connection, one answer.
/// `stats` | `down SECONDS` | `up`.
fn control(listener: UnixListener, sh: Arc<Shared>) -> Result<(), String> {
    while !sh.stop.load(Ordering::Relaxed) {
        let (conn, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = sys::wait_readable(listener.as_raw_fd(), Duration::from_millis(100));
                continue;
            }
            Err(e) => return Err(format!("control socket: {e}")),
        };
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut line = String::new();
        let mut r = BufReader::new(&conn);
        if r.read_line(&mut line).is_err() {
            continue;
        }
        let answer = command(line.trim(), &sh);
        let _ = (&conn).write_all(answer.as_bytes());
    }
    Ok(())
}

fn command(cmd: &str, sh: &Shared) -> String {
    let mut w = cmd.split_whitespace();
    match (w.next(), w.next()) {
        (Some("stats"), None) => sh.stats(),
        (Some("down"), Some(secs)) => match secs.parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => {
                let from = sh.now();
                sh.command_down(DownCmd {
                    from,
                    until: from + (s * 1e9) as Nanos,
                });
                tracing::info!("link down for {s} s (control socket)");
                format!("ok down {s}\n")
            }
            _ => format!("error: `down {secs}`: give seconds > 0, e.g. `down 5`\n"),
        },
        (Some("up"), None) => {
            sh.command_down(DownCmd::default());
            tracing::info!("link up (control socket)");
            "ok up\n".into()
        }
        _ => format!("error: unknown command `{cmd}`: use `stats`, `down SECONDS` or `up`\n"),
    }
}
