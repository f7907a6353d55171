//! The shim's configuration: environment variables, over a TOML file
//! (`IWARP_PRELOAD_CONFIG`), over the defaults, read by the one loader of
//! every tool (`iwarp_conf`, lenient: a bad setting is reported once on
//! stderr and left out, never fatal to the program the shim runs in); and
//! the record of peers that did not answer MPA (the negative cache).

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
    /// At most this many iWARP streams live in the process (each costs
    /// the soft provider's two threads and its buffers), those being made
    /// and the MPA accepts waiting included; past it, MPA clients are
    /// closed at accept (they fall back to TCP) and connects go plain.
    pub max_streams: usize,
    /// Where to append one line per connection decision.
    pub stats: Option<String>,
    /// The stream options (`IWARP_SOCKETS_*`).
    pub opts: Options,
}

/// The settings as written: the TOML file of `IWARP_PRELOAD_CONFIG`, each
/// `IWARP_PRELOAD_KEY` variable overriding its `key` (iwarp_conf, the one
/// loader of every tool). Every key is optional; a bad one is reported
/// and left out ([`iwarp_conf::load_lenient_from`]).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Settings {
    ports: Option<List>,
    addrs: Option<List>,
    peek_ms: Option<Num>,
    settle_ms: Option<Num>,
    fallback_secs: Option<Num>,
    connect_ms: Option<Num>,
    stats: Option<String>,
    log: Option<String>,
    eintr: Option<Flag>,
    max_pending: Option<Num>,
    max_streams: Option<Num>,
}

/// A list as the shim has always taken it, `5201,5202` (a variable, or
/// text in the file), or as TOML writes it: `[5201, 5202]`, or one bare
/// item (`IWARP_PRELOAD_PORTS=5201` arrives as a number).
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum List {
    One(Item),
    Many(Vec<Item>),
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Item {
    N(i64),
    Text(String),
}

impl List {
    /// The items as text, a comma-separated one split.
    fn items(&self) -> Vec<String> {
        let one = |i: &Item| match i {
            Item::N(n) => vec![n.to_string()],
            Item::Text(t) => t
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        };
        match self {
            List::One(i) => one(i),
            List::Many(v) => v.iter().flat_map(one).collect(),
        }
    }
}

/// A count: a number, or text that is one (`peek_ms = "300"`).
#[derive(Debug, Clone, Copy)]
struct Num(u64);

impl<'de> serde::Deserialize<'de> for Num {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Num, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            Text(String),
        }
        let bad = || {
            serde::de::Error::custom(
                "not a whole number (fix: give a number of milliseconds, seconds or connections \
                 as the key says, such as 300)",
            )
        };
        match Raw::deserialize(d).map_err(|_| bad())? {
            Raw::N(n) => Ok(Num(n)),
            Raw::Text(t) => t.trim().parse().map(Num).map_err(|_| bad()),
        }
    }
}

/// `eintr`: `0` (or `false`) turns interruptible blocking calls off.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Flag {
    N(i64),
    B(bool),
    Text(String),
}

impl Flag {
    fn off(&self) -> bool {
        match self {
            Flag::N(n) => *n == 0,
            Flag::B(b) => !b,
            Flag::Text(t) => t.trim() == "0",
        }
    }
}

/// The prefix of the shim's variables; `IWARP_PRELOAD_CONFIG` names the
/// file and is not a setting.
const PREFIX: &str = "IWARP_PRELOAD";
const CONFIG_VAR: &str = "IWARP_PRELOAD_CONFIG";

/// Read the settings: the file, then the variables over it. Each problem
/// is added to `problems` (once), and the shim goes on without that
/// setting: it runs inside someone else's program, which a typo in a
/// variable must never stop. An empty variable counts as unset.
fn read_settings(vars: &[(String, String)], problems: &mut Vec<String>) -> Settings {
    let path = vars
        .iter()
        .find(|(k, _)| k == CONFIG_VAR)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let env = vars
        .iter()
        .filter(|(k, v)| k != CONFIG_VAR && !v.trim().is_empty())
        .map(|(k, v)| (k.into(), v.into()));
    let (s, errors) = iwarp_conf::load_lenient_from::<Settings>(path.as_deref(), PREFIX, env);
    problems.extend(
        errors
            .into_iter()
            .map(|e| format!("{e}; that setting is ignored")),
    );
    s
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
    // Variables whose name or value is not UTF-8 are none of ours.
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("IWARP_"))
        .collect();
    let (c, problems) = load_from(secure, &vars);
    for p in problems {
        eprintln!("iwarp-preload: {p}");
    }
    c
}

/// The configuration from the variables `vars` (the process's `IWARP_*`
/// environment in [`load`]). With `secure` (see [`secure_execution`])
/// every variable is ignored, `IWARP_PRELOAD_CONFIG` and the
/// `IWARP_SOCKETS_*` stream options included: only the defaults apply.
/// Also returns what was wrong with the settings, one line each (left
/// out; [`load`] prints them).
fn load_from(secure: bool, vars: &[(String, String)]) -> (Config, Vec<String>) {
    let vars = if secure { &[][..] } else { vars };
    let mut problems = Vec::new();
    let s = read_settings(vars, &mut problems);
    if let Some(filter) = s.log.as_deref().filter(|f| !f.trim().is_empty()) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let num = |v: Option<Num>, default: u64| v.map_or(default, |n| n.0);
    let mut ports = Vec::new();
    for p in s.ports.as_ref().map(List::items).unwrap_or_default() {
        match p.parse::<u16>() {
            Ok(n) => ports.push(n),
            Err(_) => problems.push(format!(
                "ports: `{p}` is not a port (fix: a number 0-65535); ignored"
            )),
        }
    }
    let mut addrs = Vec::new();
    for a in s.addrs.as_ref().map(List::items).unwrap_or_default() {
        match a.parse::<IpAddr>() {
            Ok(ip) => addrs.push(ip),
            Err(_) => problems.push(format!(
                "addrs: `{a}` is not an IP address (fix: such as 10.0.0.1 or ::1); ignored"
            )),
        }
    }
    if s.eintr.as_ref().is_some_and(Flag::off) {
        iwarp_rsocket::ops::INTERRUPTIBLE.store(false, std::sync::atomic::Ordering::Relaxed);
    }
    let connect_ms = num(s.connect_ms, 1000).max(1);
    let connect_timeout = Duration::from_millis(connect_ms);
    let env = |k: &str| {
        vars.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    };
    let mut opts = Options::from_vars(env);
    opts.connect_timeout = connect_timeout;
    let c = Config {
        ports,
        addrs,
        // An MPA client sends its Request right after the TCP handshake
        // and gives up on its exchange after its connect timeout: waiting
        // that long for the first bytes never decides a live MPA client
        // plain (200 ms did, on a loaded machine: a preloaded client whose
        // Request came late got its own Request echoed back as data).
        // Nobody waits on the program's thread for it (`settle`), except
        // a write-first server's first write to a silent plain client.
        peek: Duration::from_millis(num(s.peek_ms, connect_ms)),
        fallback: Duration::from_secs(num(s.fallback_secs, 60)),
        settle_after: Duration::from_millis(num(s.settle_ms, 300)),
        max_pending: num(s.max_pending, 64).clamp(1, 65536) as usize,
        max_streams: num(
            s.max_streams,
            iwarp_rsocket::table::DEFAULT_MAX_STREAMS as u64,
        )
        .clamp(1, 65536) as usize,
        stats: s.stats.filter(|p| !p.trim().is_empty()),
        opts,
    };
    (c, problems)
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
            max_streams: c.max_streams,
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

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn hostile() -> Vec<(String, String)> {
        vars(&[
            ("IWARP_PRELOAD_STATS", "/etc/iwarp-owned"),
            ("IWARP_PRELOAD_CONFIG", "/etc/shadow"),
            ("IWARP_PRELOAD_PORTS", "22"),
            ("IWARP_PRELOAD_PEEK_MS", "99999"),
            ("IWARP_SOCKETS_RBUF", "4096"),
            ("IWARP_SOCKETS_DESIGN", "basic"),
        ])
    }

    /// A configuration file that is removed when dropped.
    struct File(std::path::PathBuf);
    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn file(name: &str, text: &str) -> File {
        let f = std::env::temp_dir().join(format!("iwarp-preload-{}-{name}", std::process::id()));
        std::fs::write(&f, text).unwrap();
        File(f)
    }
    fn with_file(f: &File, more: &[(&str, &str)]) -> (Config, Vec<String>) {
        let mut v = vars(more);
        v.push(("IWARP_PRELOAD_CONFIG".into(), f.0.display().to_string()));
        load_from(false, &v)
    }

    #[test]
    fn secure_execution_ignores_the_environment() {
        let (c, problems) = load_from(true, &hostile());
        assert!(problems.is_empty(), "{problems:?}");
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
        let (c, problems) = load_from(false, &hostile());
        assert_eq!(c.stats.as_deref(), Some("/etc/iwarp-owned"));
        assert_eq!(c.ports, vec![22]);
        assert_eq!(c.peek, Duration::from_millis(99999));
        // /etc/shadow is not readable to this test, or (as root) not TOML:
        // reported in a few lines that name the file and nothing of its
        // content, and the variables still apply.
        assert!((1..=4).contains(&problems.len()), "{problems:#?}");
        assert!(
            problems.iter().all(|p| p.starts_with("/etc/shadow")),
            "{problems:#?}"
        );
    }

    #[test]
    fn the_documented_keys_from_a_file_and_the_environment_over_it() {
        let f = file(
            "keys.toml",
            "# the shim's keys\nports = [5201, \"5202\"]\naddrs = \"127.0.0.1, ::1\"\n\
             peek_ms = 250\nsettle_ms = \"150\"\nfallback_secs = 5\nconnect_ms = 2000\n\
             stats = \"/tmp/preload.stats\"\nmax_pending = 8\nmax_streams = 12\n",
        );
        let (c, problems) = with_file(&f, &[]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(c.ports, vec![5201, 5202]);
        assert_eq!(
            c.addrs,
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(
            (
                c.peek,
                c.settle_after,
                c.fallback,
                c.max_pending,
                c.max_streams
            ),
            (
                Duration::from_millis(250),
                Duration::from_millis(150),
                Duration::from_secs(5),
                8,
                12
            )
        );
        assert_eq!(c.opts.connect_timeout, Duration::from_millis(2000));
        assert_eq!(c.stats.as_deref(), Some("/tmp/preload.stats"));
        // The variables as they have always been written override it; an
        // empty one counts as unset.
        let (c, problems) = with_file(
            &f,
            &[
                ("IWARP_PRELOAD_PORTS", "6000,6001"),
                ("IWARP_PRELOAD_PEEK_MS", "40"),
                ("IWARP_PRELOAD_STATS", ""),
                ("IWARP_PRELOAD_MAX_STREAMS", "3"),
            ],
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(c.ports, vec![6000, 6001]);
        assert_eq!(c.max_streams, 3);
        assert_eq!(c.peek, Duration::from_millis(40));
        assert_eq!(c.stats.as_deref(), Some("/tmp/preload.stats"));
        // The old file form, `KEY = value` with the variable's name, where
        // it is TOML (scripts/test-preload.sh writes `ports = N`): the
        // key's case and prefix are the variable's, not the file's.
        let f = file("old.toml", "ports = 7000\npeek_ms = 300\n");
        let (c, problems) = with_file(&f, &[]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!((c.ports, c.peek), (vec![7000], Duration::from_millis(300)));
    }

    #[test]
    fn each_bad_setting_is_reported_once_and_left_out() {
        // Unknown key, bad value, a line that is not TOML, a bad list item,
        // in the file; an unknown variable and a bad value in the
        // environment. Everything else applies.
        let f = file(
            "bad.toml",
            "ports = \"5201, http\"\nportz = 1\npeek_ms = \"soon\"\nlog = debug\n\
             settle_ms = 120\n",
        );
        let (c, problems) = with_file(
            &f,
            &[
                ("IWARP_PRELOAD_FALLBACK_SEC", "5"),
                ("IWARP_PRELOAD_MAX_PENDING", "-3"),
                ("IWARP_PRELOAD_CONNECT_MS", "500"),
            ],
        );
        assert_eq!(c.ports, vec![5201], "{problems:?}");
        assert_eq!(c.settle_after, Duration::from_millis(120));
        assert_eq!(c.opts.connect_timeout, Duration::from_millis(500));
        assert_eq!(
            c.peek,
            Duration::from_millis(500),
            "peek_ms left out: CONNECT_MS"
        );
        assert_eq!(
            (c.fallback, c.max_pending, c.max_streams),
            (Duration::from_secs(60), 64, 256),
            "the documented defaults"
        );
        let name = f.0.display().to_string();
        for want in [
            format!("{name}:2: key `portz`: unknown field"),
            format!("{name}:3: key `peek_ms`: not a whole number"),
            format!("{name}:4: not TOML"),
            "environment IWARP_PRELOAD_FALLBACK_SEC=\"5\": key `fallback_sec`: unknown field"
                .into(),
            "environment IWARP_PRELOAD_MAX_PENDING=\"-3\": key `max_pending`:".into(),
            "ports: `http` is not a port".into(),
        ] {
            assert_eq!(
                problems.iter().filter(|p| p.starts_with(&want)).count(),
                1,
                "{want:?} once in {problems:#?}"
            );
        }
        assert_eq!(problems.len(), 6, "{problems:#?}");
        assert!(problems.iter().all(|p| p.contains("fix")), "{problems:#?}");
    }

    #[test]
    fn an_unreadable_file_is_reported_and_the_environment_applies() {
        let v = vars(&[
            ("IWARP_PRELOAD_CONFIG", "/nonexistent/preload.toml"),
            ("IWARP_PRELOAD_PORTS", "5201"),
        ]);
        let (c, problems) = load_from(false, &v);
        assert_eq!(c.ports, vec![5201]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .starts_with("/nonexistent/preload.toml: cannot read the configuration file")
                && problems[0].ends_with("that setting is ignored"),
            "{problems:?}"
        );
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
