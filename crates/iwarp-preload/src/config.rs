//! The shim's configuration: environment variables, over a `key = value`
//! file (`IWARP_PRELOAD_CONFIG`), over the defaults; and the record of
//! peers that did not answer MPA (the negative cache).

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use iwarp_rsocket::table::Inside;
use iwarp_sockets::Options;

/// What the shim takes over, and how.
#[derive(Debug)]
pub struct Config {
    /// TCP ports to take over (empty: all).
    pub ports: Vec<u16>,
    /// Addresses to take over (the peer's for connect, ours for accept;
    /// empty: all).
    pub addrs: Vec<IpAddr>,
    /// How long a server waits for a client's first bytes (by default
    /// the connect timeout, `IWARP_PRELOAD_CONNECT_MS`).
    pub peek: Duration,
    /// How long a peer that did not answer MPA is remembered.
    pub fallback: Duration,
    /// How long an accepted MPA client may wait for its first use before
    /// the shim makes it a stream anyway (below the client's connect
    /// timeout, so it gets its MPA Reply).
    pub settle_after: Duration,
    /// At most this many MPA accepts wait for their first use or their
    /// exchange at once (see `iwarp_rsocket::settle`).
    pub max_pending: usize,
    /// Where to append one line per connection decision.
    pub stats: Option<String>,
    /// The stream options (`IWARP_SOCKETS_*`).
    pub opts: Options,
}

const KEYS: &[&str] = &[
    "PORTS",
    "ADDRS",
    "PEEK_MS",
    "SETTLE_MS",
    "FALLBACK_SECS",
    "CONNECT_MS",
    "STATS",
    "LOG",
    "EINTR",
    "MAX_PENDING",
];

fn parse_file(path: &str) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "iwarp-preload: cannot read IWARP_PRELOAD_CONFIG={path} ({e}); using the \
                 environment and defaults. Fix the path or unset the variable"
            );
            return m;
        }
    };
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            eprintln!(
                "iwarp-preload: {path}:{}: expected `key = value`; line ignored",
                i + 1
            );
            continue;
        };
        let k = k.trim().to_ascii_uppercase();
        let k = k.strip_prefix("IWARP_PRELOAD_").unwrap_or(&k).to_string();
        if !KEYS.contains(&k.as_str()) {
            eprintln!(
                "iwarp-preload: {path}:{}: unknown key `{k}` (known: {}); line ignored",
                i + 1,
                KEYS.join(", ")
            );
            continue;
        }
        m.insert(k, v.trim().to_string());
    }
    m
}

/// Whether this process runs in secure-execution mode (`AT_SECURE` in
/// its auxiliary vector: setuid, setgid, file capabilities, or an LSM
/// transition). ld.so(8) and getauxval(3): in that mode the dynamic
/// linker ignores `LD_LIBRARY_PATH` and friends and glibc's
/// `secure_getenv(3)` returns nothing; the shim treats its own variables
/// the same way, so that an unprivileged user cannot steer a privileged
/// process (`IWARP_PRELOAD_STATS` would create or append to any file as
/// the process's owner, `IWARP_PRELOAD_CONFIG` would read any file).
pub fn secure_execution() -> bool {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

fn load() -> Config {
    let secure = secure_execution();
    if secure && std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("IWARP_")) {
        // One line, because the program's behaviour differs from what its
        // environment asks and nothing else would say why.
        eprintln!(
            "iwarp-preload: secure execution (setuid, setgid or file capabilities): the \
             IWARP_* environment is ignored and the defaults apply, as ld.so ignores LD_* \
             variables; configure a privileged program by other means"
        );
    }
    load_from(secure, &|k: &str| std::env::var(k).ok())
}

/// The configuration from the variables `env` returns (the process's
/// environment in [`load`]). With `secure` (see [`secure_execution`])
/// every variable is ignored, `IWARP_PRELOAD_CONFIG` and the
/// `IWARP_SOCKETS_*` stream options included: only the defaults apply.
fn load_from(secure: bool, env: &dyn Fn(&str) -> Option<String>) -> Config {
    let env = |k: &str| if secure { None } else { env(k) };
    let file = env("IWARP_PRELOAD_CONFIG")
        .filter(|p| !p.is_empty())
        .map(|p| parse_file(&p))
        .unwrap_or_default();
    let get = |k: &str| {
        env(&format!("IWARP_PRELOAD_{k}"))
            .or_else(|| file.get(k).cloned())
            .filter(|v| !v.trim().is_empty())
    };
    if let Some(filter) = get("LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let num = |k: &str, default: u64| -> u64 {
        match get(k) {
            None => default,
            Some(v) => v.trim().parse().unwrap_or_else(|_| {
                eprintln!("iwarp-preload: IWARP_PRELOAD_{k}={v} is not a number; using {default}");
                default
            }),
        }
    };
    let mut ports = Vec::new();
    for p in get("PORTS").unwrap_or_default().split(',').map(str::trim) {
        if p.is_empty() {
            continue;
        }
        match p.parse::<u16>() {
            Ok(n) => ports.push(n),
            Err(_) => eprintln!("iwarp-preload: IWARP_PRELOAD_PORTS: `{p}` is not a port; ignored"),
        }
    }
    let mut addrs = Vec::new();
    for a in get("ADDRS").unwrap_or_default().split(',').map(str::trim) {
        if a.is_empty() {
            continue;
        }
        match a.parse::<IpAddr>() {
            Ok(ip) => addrs.push(ip),
            Err(_) => {
                eprintln!("iwarp-preload: IWARP_PRELOAD_ADDRS: `{a}` is not an IP address; ignored")
            }
        }
    }
    if get("EINTR").is_some_and(|v| v.trim() == "0") {
        iwarp_rsocket::ops::INTERRUPTIBLE.store(false, std::sync::atomic::Ordering::Relaxed);
    }
    let connect_ms = num("CONNECT_MS", 1000).max(1);
    let connect_timeout = Duration::from_millis(connect_ms);
    let mut opts = Options::from_vars(env);
    opts.connect_timeout = connect_timeout;
    Config {
        ports,
        addrs,
        // An MPA client sends its Request right after the TCP handshake
        // and gives up on its exchange after its connect timeout: waiting
        // that long for the first bytes never decides a live MPA client
        // plain (200 ms did, on a loaded machine: a preloaded client whose
        // Request came late got its own Request echoed back as data).
        // Nobody waits on the program's thread for it (`settle`), except
        // a write-first server's first write to a silent plain client.
        peek: Duration::from_millis(num("PEEK_MS", connect_ms)),
        fallback: Duration::from_secs(num("FALLBACK_SECS", 60)),
        settle_after: Duration::from_millis(num("SETTLE_MS", 300)),
        max_pending: num("MAX_PENDING", 64).clamp(1, 65536) as usize,
        stats: get("STATS"),
        opts,
    }
}

/// The configuration, read once (inside the library: reading the file
/// must not come back through the shim).
pub fn get() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let _inside = Inside::enter();
        let c = load();
        iwarp_rsocket::settle::configure(iwarp_rsocket::settle::Settings {
            peek: c.peek,
            settle_after: c.settle_after,
            max_pending: c.max_pending,
        });
        iwarp_rsocket::settle::set_reporter(record_accept);
        c
    })
}

/// The decisions the settle watcher takes (an undecided accept found plain
/// or MPA, an exchange that failed) go to the same record as `accept`'s.
fn record_accept(how: &str, peer: Option<SocketAddr>, why: &str) {
    get().record("accept", how, peer, why);
}

impl Config {
    /// Whether connections to or from `a` are taken over.
    pub fn wants(&self, a: &SocketAddr) -> bool {
        (self.ports.is_empty() || self.ports.contains(&a.port()))
            && (self.addrs.is_empty() || self.addrs.contains(&a.ip()))
    }

    /// Records one decision (`IWARP_PRELOAD_STATS` and the log).
    pub fn record(&self, what: &str, how: &str, addr: Option<SocketAddr>, why: &str) {
        let _inside = Inside::enter();
        let addr = addr.map(|a| a.to_string()).unwrap_or_else(|| "?".into());
        tracing::info!(what, how, %addr, why, "iwarp-preload");
        if let Some(path) = &self.stats {
            let line = format!(
                "{} {what} {how} {addr}{}{why}\n",
                std::process::id(),
                if why.is_empty() { "" } else { " " }
            );
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(line.as_bytes());
            }
        }
    }
}

static NEGATIVE: Mutex<Option<HashMap<SocketAddr, Instant>>> = Mutex::new(None);

/// Whether `a` is remembered as a peer that does not speak MPA.
pub fn is_plain_peer(a: &SocketAddr) -> bool {
    let mut g = NEGATIVE.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    match m.get(a) {
        Some(&until) if Instant::now() < until => true,
        Some(_) => {
            m.remove(a);
            false
        }
        None => false,
    }
}

/// Remembers `a` as a plain TCP peer for `for_`.
pub fn remember_plain_peer(a: SocketAddr, for_: Duration) {
    let mut g = NEGATIVE.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(HashMap::new)
        .insert(a, Instant::now() + for_);
}

#[cfg(test)]
mod tests {
    //! The secure-execution gate, layer by layer (scripts/test-preload.sh
    //! "i)" runs a real setuid program): here `load_from` with `secure`
    //! set must ignore every variable, and `secure_execution` must read
    //! the auxiliary vector, which for this unprivileged test process says
    //! "not secure" (the kernel sets AT_SECURE only on a privilege change).
    use super::*;

    fn hostile(k: &str) -> Option<String> {
        match k {
            "IWARP_PRELOAD_STATS" => Some("/etc/iwarp-owned".into()),
            "IWARP_PRELOAD_CONFIG" => Some("/etc/shadow".into()),
            "IWARP_PRELOAD_PORTS" => Some("22".into()),
            "IWARP_PRELOAD_PEEK_MS" => Some("99999".into()),
            "IWARP_SOCKETS_RBUF" => Some("4096".into()),
            "IWARP_SOCKETS_DESIGN" => Some("basic".into()),
            _ => None,
        }
    }

    #[test]
    fn secure_execution_ignores_the_environment() {
        let c = load_from(true, &hostile);
        assert_eq!(c.stats, None, "IWARP_PRELOAD_STATS must not name a file");
        assert!(c.ports.is_empty());
        assert_eq!(c.peek, Duration::from_millis(1000)); // CONNECT_MS
        let defaults = Options {
            connect_timeout: Duration::from_millis(1000), // IWARP_PRELOAD_CONNECT_MS
            ..Options::default()
        };
        assert_eq!(
            format!("{:?}", c.opts),
            format!("{defaults:?}"),
            "IWARP_SOCKETS_* must not apply"
        );
    }

    #[test]
    fn without_secure_execution_the_environment_applies() {
        let c = load_from(false, &hostile);
        assert_eq!(c.stats.as_deref(), Some("/etc/iwarp-owned"));
        assert_eq!(c.ports, vec![22]);
        assert_eq!(c.peek, Duration::from_millis(99999));
    }

    #[test]
    fn an_unprivileged_process_is_not_in_secure_execution() {
        // SAFETY: plain id queries.
        let changed =
            unsafe { libc::getuid() != libc::geteuid() || libc::getgid() != libc::getegid() };
        assert!(!changed, "run the unit tests without setuid");
        assert!(!secure_execution());
    }
}
