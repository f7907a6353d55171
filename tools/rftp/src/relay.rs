//! The relay behind `delay-bridge`: a user-space TCP relay that delays
//! each direction by a fixed time and can inject faults, so tests can run
//! real transfers over a path that breaks in controlled ways.
//!
//! Each `LISTEN=TARGET` *mapping* accepts connections and connects each
//! to its target; every connection gets two *directions*: `up` (from the
//! connecting side to the target) and `down` (back). A direction is a
//! reader thread, which reads chunks and stamps them with their arrival
//! time, and a writer thread, which forwards them once the delay has
//! passed. All faults act in the writer, at an exact stream offset (bytes
//! of that direction) or at a time since the connection was accepted.
//!
//! A fault is a [`FaultSpec`], parsed from `KIND[:KEY=VALUE,...]`:
//!
//! | kind | what it does once triggered |
//! | --- | --- |
//! | `drop` | closes both connections: `how=rst` (default) aborts with RST (SO_LINGER 0), `how=fin` closes gracefully |
//! | `stall` | stops forwarding in the direction for `for=MS` (default 1000), then resumes |
//! | `truncate` | stops forwarding in the direction and half-closes it (`how=half`, default; later bytes are swallowed) or closes both connections gracefully (`how=close`) |
//! | `blackhole` | swallows every later byte in the direction, end of stream included, and keeps both connections open |
//! | `corrupt` | flips the byte at stream offset `at` (XOR 0xFF) |
//! | `reseg` | from `at` on, writes the stream in random pieces (1 byte to `max`, log-uniform, default max 65536) spanning the reads' boundaries, seeded by `seed` |
//!
//! Keys common to all kinds: `at=` (alias `after=`) a byte offset (`4096`,
//! `1M`) or a time (`500ms`, `2s`), default 0; `dir=up|down|both`
//! (default both: each direction counts its own bytes); `map=I` (0-based
//! index of the mapping, default every mapping); `conn=N`, `N-M` or `N-`
//! (1-based index of the connection on its mapping, default every one).
//! Each fault fires once per connection and direction.
//!
//! With an [`Alg`], the relay also rewrites the address a peer announces
//! for a second connection (mod_rdma's `RDMA:` header, FTP's EPSV/PASV
//! replies) to a listener of its own, so that connection runs through the
//! relay too, as one more mapping.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::util::parse_size;

/// Read size of the reader threads.
const CHUNK: usize = 64 << 10;
/// The writer joins queued chunks up to this many bytes before it writes.
const JOIN: usize = 256 << 10;
/// How often blocked readers and writers look whether the connection was
/// dropped.
const TICK: Duration = Duration::from_millis(50);

/// Which direction(s) of a connection a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// From the connecting side to the target.
    Up,
    /// From the target back to the connecting side.
    Down,
    /// Both, each counting its own bytes.
    Both,
}

impl Dir {
    fn covers(self, d: Dir) -> bool {
        self == Dir::Both || self == d
    }
}

/// When a fault fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Once this many bytes of the direction have been forwarded.
    Bytes(u64),
    /// This long after the connection was accepted.
    Time(Duration),
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Close both connections, with RST (`rst`) or FIN.
    Drop { rst: bool },
    /// Stop forwarding for this long, then resume.
    Stall(Duration),
    /// Stop forwarding: half-close the direction, or (`close`) close both
    /// connections gracefully.
    Truncate { close: bool },
    /// Swallow everything from here on and keep the connections open.
    Blackhole,
    /// Flip the byte at the trigger offset.
    Corrupt,
    /// Write in random pieces from here on.
    Reseg { seed: Option<u64>, max: usize },
}

/// Which connections of a mapping a fault applies to (1-based, inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRange {
    pub first: usize,
    pub last: usize,
}

impl ConnRange {
    pub const ALL: ConnRange = ConnRange {
        first: 1,
        last: usize::MAX,
    };
    fn contains(&self, n: usize) -> bool {
        (self.first..=self.last).contains(&n)
    }
}

/// One fault: what, when, where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    pub kind: Kind,
    pub at: Trigger,
    pub dir: Dir,
    /// 0-based mapping index; `None`: every mapping.
    pub map: Option<usize>,
    pub conn: ConnRange,
}

/// `500ms`, `2s` or a size (`4096`, `64K`, `1M`).
fn parse_trigger(v: &str) -> Result<Trigger, String> {
    if let Some(ms) = v.strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(|m| Trigger::Time(Duration::from_millis(m)))
            .map_err(|_| format!("at={v}: expected e.g. 500ms, 2s or a byte offset like 1M"));
    }
    if let Some(s) = v.strip_suffix('s') {
        if let Ok(s) = s.parse::<u64>() {
            return Ok(Trigger::Time(Duration::from_secs(s)));
        }
    }
    parse_size(v).map(Trigger::Bytes).map_err(|_| {
        format!("at={v}: expected a byte offset (4096, 64K, 1M) or a time (500ms, 2s)")
    })
}

fn parse_ms(key: &str, v: &str) -> Result<Duration, String> {
    let n = v.strip_suffix("ms").unwrap_or(v);
    if let Some(s) = v.strip_suffix('s').filter(|_| !v.ends_with("ms")) {
        if let Ok(s) = s.parse::<u64>() {
            return Ok(Duration::from_secs(s));
        }
    }
    n.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("{key}={v}: expected milliseconds, e.g. {key}=3000 or {key}=3s"))
}

fn parse_conn(v: &str) -> Result<ConnRange, String> {
    let bad = || format!("conn={v}: expected N, N-M or N- (1-based connection numbers)");
    let num = |s: &str| s.parse::<usize>().ok().filter(|&n| n >= 1).ok_or_else(bad);
    let r = match v.split_once('-') {
        None => {
            let n = num(v)?;
            ConnRange { first: n, last: n }
        }
        Some((a, "")) => ConnRange {
            first: num(a)?,
            last: usize::MAX,
        },
        Some((a, b)) => ConnRange {
            first: num(a)?,
            last: num(b)?,
        },
    };
    if r.first > r.last {
        return Err(bad());
    }
    Ok(r)
}

impl FromStr for FaultSpec {
    type Err = String;

    /// `KIND[:KEY=VALUE,...]`, e.g. `drop:at=1M,dir=down,map=1,conn=2,how=rst`.
    fn from_str(s: &str) -> Result<FaultSpec, String> {
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut at = Trigger::Bytes(0);
        let mut dir = Dir::Both;
        let mut map = None;
        let mut conn = ConnRange::ALL;
        let mut how = None;
        let mut dur = None;
        let mut seed = None;
        let mut max = None;
        for kv in rest.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{s}: {kv:?} is not KEY=VALUE"))?;
            match k {
                "at" | "after" => at = parse_trigger(v)?,
                "dir" => {
                    dir = match v {
                        "up" => Dir::Up,
                        "down" => Dir::Down,
                        "both" => Dir::Both,
                        _ => return Err(format!("dir={v}: expected up, down or both")),
                    }
                }
                "map" => {
                    map = Some(v.parse().map_err(|_| {
                        format!("map={v}: expected the 0-based index of a --listen mapping")
                    })?)
                }
                "conn" => conn = parse_conn(v)?,
                "how" => how = Some(v.to_string()),
                "for" => dur = Some(parse_ms("for", v)?),
                "seed" => {
                    seed = Some(
                        v.parse()
                            .map_err(|_| format!("seed={v}: expected an unsigned integer"))?,
                    )
                }
                "max" => {
                    max = Some(
                        parse_size(v)
                            .ok()
                            .and_then(|m| usize::try_from(m).ok())
                            .filter(|&m| (1..=1 << 24).contains(&m))
                            .ok_or_else(|| format!("max={v}: expected 1 to 16M bytes"))?,
                    )
                }
                _ => {
                    return Err(format!(
                        "{s}: unknown key {k:?} (keys: at, dir, map, conn, how, for, seed, max)"
                    ))
                }
            }
        }
        let only = |what: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(format!("{s}: {what} does not apply to {kind}"))
            }
        };
        only("how=", how.is_none() || matches!(kind, "drop" | "truncate"))?;
        only("for=", dur.is_none() || kind == "stall")?;
        only(
            "seed= and max=",
            (seed.is_none() && max.is_none()) || kind == "reseg",
        )?;
        let kind = match kind {
            "drop" => Kind::Drop {
                rst: match how.as_deref() {
                    None | Some("rst") => true,
                    Some("fin") => false,
                    Some(h) => return Err(format!("{s}: how={h}: drop takes how=rst or how=fin")),
                },
            },
            "stall" => Kind::Stall(dur.unwrap_or(Duration::from_secs(1))),
            "truncate" => Kind::Truncate {
                close: match how.as_deref() {
                    None | Some("half") => false,
                    Some("close") => true,
                    Some(h) => {
                        return Err(format!(
                            "{s}: how={h}: truncate takes how=half or how=close"
                        ))
                    }
                },
            },
            "blackhole" => Kind::Blackhole,
            "corrupt" => {
                if !matches!(at, Trigger::Bytes(_)) {
                    return Err(format!("{s}: corrupt needs a byte offset (at=N), not a time"));
                }
                Kind::Corrupt
            }
            "reseg" => Kind::Reseg {
                seed,
                max: max.unwrap_or(1 << 16),
            },
            _ => {
                return Err(format!(
                    "{s}: unknown fault {kind:?} (faults: drop, stall, truncate, blackhole, corrupt, reseg)"
                ))
            }
        };
        Ok(FaultSpec {
            kind,
            at,
            dir,
            map,
            conn,
        })
    }
}

/// `LISTEN=TARGET`, both `IP:PORT`.
pub fn parse_mapping(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (l, t) = s.split_once('=').ok_or_else(|| {
        format!("{s}: expected LISTEN=TARGET, e.g. 127.0.0.1:7000=127.0.0.1:2121")
    })?;
    let l = l
        .parse()
        .map_err(|e| format!("{l}: not an IP:PORT listen address: {e}"))?;
    let t = t
        .parse()
        .map_err(|e| format!("{t}: not an IP:PORT target: {e}"))?;
    Ok((l, t))
}

/// Settings shared by every connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// One-way delay in each direction.
    pub delay: Duration,
    /// Bytes queued per direction at most before the reader waits.
    pub max_inflight: usize,
    pub connect_timeout: Duration,
    pub faults: Vec<FaultSpec>,
    /// Seed of `reseg` faults that name none.
    pub seed: u64,
    /// Rewriting that routes a protocol's secondary connections through
    /// the relay too.
    pub alg: Option<Alg>,
}

/// Application-level rewriting (like a NAT's FTP helper): the address a
/// peer announces for a second connection is replaced by a relay listener
/// that forwards to it, so that connection runs through the relay (and its
/// faults) too. All such connections form one more mapping, number `map`,
/// numbered 1, 2, ... in accept order across their listeners.
#[derive(Clone, Debug, Default)]
pub struct Alg {
    /// mod_rdma: `port=` in `RDMA:` request headers (the listener the
    /// server connects back to), rewritten going `up`.
    pub rdma_header: bool,
    /// FTP: the port of `229` (EPSV) and `227` (PASV) replies, rewritten
    /// going `down`.
    pub ftp_passive: bool,
    /// The mapping number of the relayed connections.
    pub map: usize,
    /// Connections accepted on them so far.
    pub count: Arc<AtomicUsize>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            delay: Duration::ZERO,
            max_inflight: 64 << 20,
            connect_timeout: Duration::from_secs(10),
            faults: Vec::new(),
            seed: 1,
            alg: None,
        }
    }
}

/// xorshift64*: small, seedable, good enough to pick piece sizes.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A piece size in 1..=max, log-uniform: as many 1-15 byte pieces as
    /// 1-2 KiB or 32-64 KiB ones.
    pub fn piece(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros(); // max < 2^bits
        let b = (self.next_u64() % u64::from(bits)) as u32;
        let n = 1 + (self.next_u64() % (1u64 << b)) as usize;
        n.min(max)
    }
}

/// The two sockets of one relayed connection.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    dead: AtomicBool,
    /// Directions whose writer has finished.
    done: AtomicUsize,
    id: String,
}

impl Conn {
    fn dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }
    /// Close both connections: with RST (SO_LINGER 0; the sockets close
    /// when the threads, which notice within a tick, let go of them) or
    /// with FIN at once.
    fn kill(&self, rst: bool) {
        if rst {
            for s in [&self.client, &self.server] {
                let l = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: a valid socket descriptor and a linger struct of
                // the size passed.
                unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&l as *const libc::linger).cast(),
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    );
                }
            }
        } else {
            let _ = self.client.shutdown(Shutdown::Both);
            let _ = self.server.shutdown(Shutdown::Both);
        }
        self.dead.store(true, Ordering::Relaxed);
    }
    fn side(&self, d: Dir) -> (&TcpStream, &TcpStream) {
        match d {
            Dir::Up => (&self.client, &self.server),
            _ => (&self.server, &self.client),
        }
    }
}

/// Read from `src`, stamp each chunk with its arrival time, queue it.
fn reader(conn: Arc<Conn>, d: Dir, tx: SyncSender<(Instant, Vec<u8>)>) {
    let (mut src, _) = conn.side(d);
    loop {
        if conn.dead() {
            break;
        }
        let mut buf = vec![0u8; CHUNK];
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                buf.truncate(n);
                if tx.send((Instant::now(), buf)).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                tracing::debug!(conn = %conn.id, ?d, %e, "relay read ended");
                // Pass a reset on as a reset, not as an end of stream.
                if e.kind() == io::ErrorKind::ConnectionReset {
                    conn.kill(true);
                }
                break;
            }
        }
    }
    // Dropping tx tells the writer: end of stream.
}

/// Blackholed connections, kept open until the process exits.
static HELD: std::sync::Mutex<Vec<Arc<Conn>>> = std::sync::Mutex::new(Vec::new());

/// Why a writer stops.
enum Stop {
    /// The connection was dropped or a write failed.
    Dead,
}

struct Fault {
    spec: FaultSpec,
    fired: bool,
}

/// The writer of one direction and its fault state.
struct Writer {
    conn: Arc<Conn>,
    d: Dir,
    start: Instant,
    faults: Vec<Fault>,
    /// Stream offset of the next byte (forwarded or swallowed).
    off: u64,
    /// Swallow everything from here on.
    swallow: bool,
    /// End of stream is not passed on (blackhole).
    keep_open: bool,
    reseg: Option<(Rng, usize)>,
    seed: u64,
    /// The rewriter of `Config::alg`, where it applies.
    alg: Option<Rewriter>,
}

impl Writer {
    fn write(&self, mut data: &[u8]) -> Result<(), Stop> {
        let (_, mut dst) = self.conn.side(self.d);
        while !data.is_empty() {
            if self.conn.dead() {
                return Err(Stop::Dead);
            }
            match dst.write(data) {
                Ok(0) => return Err(Stop::Dead),
                Ok(n) => data = &data[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => {
                    tracing::debug!(conn = %self.conn.id, d = ?self.d, %e, "relay write ended");
                    let _ = dst.shutdown(Shutdown::Both);
                    return Err(Stop::Dead);
                }
            }
        }
        Ok(())
    }

    fn emit(&mut self, data: &[u8]) -> Result<(), Stop> {
        match &mut self.reseg {
            None => self.write(data),
            Some((rng, max)) => {
                let max = *max;
                let mut p = 0;
                let mut pieces = Vec::new();
                while p < data.len() {
                    let n = rng.piece(max).min(data.len() - p);
                    pieces.push(p..p + n);
                    p += n;
                }
                for r in pieces {
                    self.write(&data[r])?;
                }
                Ok(())
            }
        }
    }

    /// Fire the faults due at the current offset and time.
    fn fire_due(&mut self) -> Result<(), Stop> {
        let now = self.start.elapsed();
        for i in 0..self.faults.len() {
            let f = &self.faults[i];
            if f.fired || f.spec.kind == Kind::Corrupt {
                continue;
            }
            let due = match f.spec.at {
                Trigger::Bytes(n) => self.off >= n,
                Trigger::Time(t) => now >= t,
            };
            if !due {
                continue;
            }
            self.faults[i].fired = true;
            let kind = self.faults[i].spec.kind;
            tracing::info!(conn = %self.conn.id, d = ?self.d, offset = self.off, ?kind, "fault fires");
            match kind {
                Kind::Drop { rst } => {
                    self.conn.kill(rst);
                    return Err(Stop::Dead);
                }
                Kind::Stall(t) => {
                    let until = Instant::now() + t;
                    while Instant::now() < until {
                        if self.conn.dead() {
                            return Err(Stop::Dead);
                        }
                        std::thread::sleep(TICK.min(until - Instant::now()));
                    }
                    tracing::info!(conn = %self.conn.id, d = ?self.d, "stall over");
                }
                Kind::Truncate { close } => {
                    if close {
                        self.conn.kill(false);
                        return Err(Stop::Dead);
                    }
                    let (_, dst) = self.conn.side(self.d);
                    let _ = dst.shutdown(Shutdown::Write);
                    self.swallow = true;
                }
                Kind::Blackhole => {
                    self.swallow = true;
                    self.keep_open = true;
                }
                Kind::Reseg { seed, max } => {
                    self.reseg = Some((Rng::new(seed.unwrap_or(self.seed)), max));
                }
                Kind::Corrupt => {}
            }
        }
        Ok(())
    }

    /// The next byte offset past `self.off` where a fault fires.
    fn next_cut(&self) -> Option<u64> {
        self.faults
            .iter()
            .filter(|f| !f.fired && f.spec.kind != Kind::Corrupt)
            .filter_map(|f| match f.spec.at {
                Trigger::Bytes(n) if n > self.off => Some(n),
                _ => None,
            })
            .min()
    }

    /// Forward (or swallow) one batch of bytes, firing faults on the way.
    fn process(&mut self, mut buf: Vec<u8>) -> Result<(), Stop> {
        let end = self.off + buf.len() as u64;
        for f in &self.faults {
            if let (Kind::Corrupt, Trigger::Bytes(n)) = (f.spec.kind, f.spec.at) {
                if (self.off..end).contains(&n) {
                    tracing::info!(conn = %self.conn.id, d = ?self.d, offset = n, "corrupting a byte");
                    buf[(n - self.off) as usize] ^= 0xff;
                }
            }
        }
        let mut pos = 0usize;
        while pos < buf.len() {
            self.fire_due()?;
            if self.swallow {
                self.off += (buf.len() - pos) as u64;
                return Ok(());
            }
            let stop = match self.next_cut() {
                Some(c) if c < end => (c - self.off) as usize + pos,
                _ => buf.len(),
            };
            self.emit(&buf[pos..stop])?;
            self.off += (stop - pos) as u64;
            pos = stop;
        }
        self.fire_due()
    }

    fn run(mut self, rx: Receiver<(Instant, Vec<u8>)>, delay: Duration) {
        let mut held: Option<(Instant, Vec<u8>)> = None;
        let r = (|| -> Result<(), Stop> {
            self.fire_due()?;
            loop {
                let (t, mut buf) = match held.take() {
                    Some(c) => c,
                    None => match rx.recv_timeout(TICK) {
                        Ok(c) => c,
                        Err(RecvTimeoutError::Timeout) => {
                            if self.conn.dead() {
                                return Err(Stop::Dead);
                            }
                            self.fire_due()?;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            if let Some(rest) =
                                self.alg.as_mut().map(|a| std::mem::take(&mut a.held))
                            {
                                self.process(rest)?;
                            }
                            return Ok(());
                        }
                    },
                };
                loop {
                    let wait = (t + delay).saturating_duration_since(Instant::now());
                    if wait.is_zero() {
                        break;
                    }
                    if self.conn.dead() {
                        return Err(Stop::Dead);
                    }
                    std::thread::sleep(wait.min(TICK));
                }
                // Join what else is queued and due, so writes span the
                // boundaries of the reads.
                while buf.len() < JOIN {
                    match rx.try_recv() {
                        Ok((t2, b2)) if t2 + delay <= Instant::now() => buf.extend_from_slice(&b2),
                        Ok(c) => {
                            held = Some(c);
                            break;
                        }
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
                if let Some(alg) = &mut self.alg {
                    buf = alg.feed(&buf);
                }
                self.process(buf)?;
            }
        })();
        match r {
            Ok(()) if self.keep_open => {
                // Neither the end of stream nor the close may reach the
                // other side: the sockets stay open until the relay exits.
                tracing::debug!(conn = %self.conn.id, d = ?self.d, "end of stream swallowed");
                HELD.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(self.conn.clone());
            }
            // The reader also stops when the connection was dropped: no
            // FIN then (it would precede the RST).
            Ok(()) if self.conn.dead() => {}
            Ok(()) => {
                let (_, dst) = self.conn.side(self.d);
                let _ = dst.shutdown(Shutdown::Write);
            }
            Err(Stop::Dead) => {}
        }
        if self.conn.done.fetch_add(1, Ordering::Relaxed) == 1 && !self.conn.dead() {
            tracing::debug!(conn = %self.conn.id, "both directions ended");
        }
    }
}

/// What a [`Rewriter`] rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rewrite {
    /// `RDMA: scheme, ip=A, port=P, ...` request headers (mod_rdma): the
    /// server connects back to A:P. The IP is kept (the server allows only
    /// the client's address), so the relay listener binds on A.
    RdmaHeader,
    /// `229 ... (|||P|)` and `227 ... (h1,h2,h3,h4,p1,p2)` replies (FTP
    /// passive mode): the client connects to P on the server. The relay
    /// listener binds on the address the client reached the relay at.
    FtpPassive,
}

/// Rewrites the addresses of [`Alg`] in one direction of a connection.
///
/// Only lines that start with the prefix (`RDMA:`, `229 `, `227 `) are
/// touched; bytes of such a line are held back until its end arrives (the
/// sender always completes the line, so nothing waits for ever). A body
/// that happens to hold such a line would be rewritten too.
struct Rewriter {
    what: Rewrite,
    alg: Alg,
    cfg: Arc<Config>,
    /// The relay's own address on the client side (FTP: where to listen).
    local: std::net::IpAddr,
    /// The target's address (FTP: where EPSV ports are).
    server: std::net::IpAddr,
    /// Announced address -> relay listener port.
    ports: std::collections::HashMap<SocketAddr, u16>,
    /// The previous byte ended a line.
    line_start: bool,
    /// An incomplete line that starts (or may start) with a prefix.
    held: Vec<u8>,
}

impl Rewriter {
    fn new(
        what: Rewrite,
        alg: Alg,
        cfg: Arc<Config>,
        local: std::net::IpAddr,
        server: std::net::IpAddr,
    ) -> Rewriter {
        Rewriter {
            what,
            alg,
            cfg,
            local,
            server,
            ports: Default::default(),
            line_start: true,
            held: Vec::new(),
        }
    }

    fn prefixes(&self) -> &'static [&'static [u8]] {
        match self.what {
            Rewrite::RdmaHeader => &[b"RDMA:"],
            Rewrite::FtpPassive => &[b"229 ", b"227 "],
        }
    }

    /// The bytes to forward for `data`, rewritten; some may be held back.
    fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(data);
        let mut out = Vec::with_capacity(buf.len() + 8);
        let mut i = 0;
        while i < buf.len() {
            if self.line_start {
                let rest = &buf[i..];
                let mut whole = false;
                let mut partial = false;
                for p in self.prefixes() {
                    let n = rest.len().min(p.len());
                    if rest[..n].eq_ignore_ascii_case(&p[..n]) {
                        whole |= n == p.len();
                        partial = true;
                    }
                }
                if partial {
                    match rest.iter().position(|&b| b == b'\n') {
                        Some(e) => {
                            let line = &rest[..=e];
                            if whole {
                                let l = self.rewrite(line);
                                out.extend_from_slice(&l);
                            } else {
                                out.extend_from_slice(line);
                            }
                            i += e + 1;
                            continue;
                        }
                        None if rest.len() <= 4096 => {
                            self.held = rest.to_vec();
                            return out;
                        }
                        None => {}
                    }
                }
            }
            // Forward up to and including the next line end.
            match buf[i..].iter().position(|&b| b == b'\n') {
                Some(e) => {
                    out.extend_from_slice(&buf[i..=i + e]);
                    i += e + 1;
                    self.line_start = true;
                }
                None => {
                    out.extend_from_slice(&buf[i..]);
                    self.line_start = false;
                    break;
                }
            }
        }
        out
    }

    /// A relay listener on `bind` forwarding to `target` (one per target).
    fn listener(&mut self, bind: std::net::IpAddr, target: SocketAddr) -> Option<u16> {
        if let Some(&o) = self.ports.get(&target) {
            return Some(o);
        }
        match TcpListener::bind(SocketAddr::new(bind, 0))
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
        {
            Ok((o, l)) => {
                tracing::info!(%target, relay_port = o, map = self.alg.map, what = ?self.what, "second connection relayed");
                serve_counted(
                    l,
                    target,
                    self.alg.map,
                    self.cfg.clone(),
                    self.alg.count.clone(),
                );
                self.ports.insert(target, o);
                Some(o)
            }
            Err(e) => {
                tracing::warn!(%target, %e, "cannot relay the second connection; line left alone");
                None
            }
        }
    }

    fn rewrite(&mut self, line: &[u8]) -> Vec<u8> {
        let Ok(text) = std::str::from_utf8(line) else {
            return line.to_vec();
        };
        let new = match self.what {
            Rewrite::RdmaHeader => self.rewrite_rdma(text),
            Rewrite::FtpPassive => self.rewrite_ftp(text),
        };
        new.map_or_else(|| line.to_vec(), String::into_bytes)
    }

    /// `RDMA: scheme, ip=A, port=P, ...` with P replaced by the port of a
    /// relay listener on A that forwards to A:P.
    fn rewrite_rdma(&mut self, text: &str) -> Option<String> {
        let param = |k: &str| {
            text.split([',', ':'])
                .map(str::trim)
                .find_map(|p| p.strip_prefix(k))
                .map(|v| v.trim_end_matches(['\r', '\n']).to_string())
        };
        let (ip, port) = (param("ip=")?, param("port=")?);
        let ip: std::net::IpAddr = ip.parse().ok()?;
        let p: u16 = port.parse().ok()?;
        let ours = self.listener(ip, SocketAddr::new(ip, p))?;
        Some(text.replacen(&format!("port={port}"), &format!("port={ours}"), 1))
    }

    /// `229 Entering Extended Passive Mode (|||P|)` or `227 Entering
    /// Passive Mode (h1,h2,h3,h4,p1,p2)`: P on the server becomes a relay
    /// listener's port (and, for 227, the address the relay's).
    fn rewrite_ftp(&mut self, text: &str) -> Option<String> {
        let open = text.find('(')?;
        let close = open + text[open..].find(')')?;
        let inner = &text[open + 1..close];
        let server = self.server;
        let repl = if let Some(p) = inner.strip_prefix("|||").and_then(|r| r.strip_suffix('|')) {
            let p: u16 = p.parse().ok()?;
            let ours = self.listener(self.local, SocketAddr::new(server, p))?;
            format!("|||{ours}|")
        } else {
            let n: Vec<u16> = inner
                .split(',')
                .map(|x| x.trim().parse().ok())
                .collect::<Option<_>>()?;
            if n.len() != 6 || n.iter().any(|&x| x > 255) {
                return None;
            }
            let ip = std::net::Ipv4Addr::new(n[0] as u8, n[1] as u8, n[2] as u8, n[3] as u8);
            let ours = self.listener(self.local, SocketAddr::new(ip.into(), n[4] * 256 + n[5]))?;
            let std::net::IpAddr::V4(me) = self.local else {
                return None;
            };
            let o = me.octets();
            format!(
                "{},{},{},{},{},{}",
                o[0],
                o[1],
                o[2],
                o[3],
                ours / 256,
                ours % 256
            )
        };
        Some(format!("{}({repl}){}", &text[..open], &text[close + 1..]))
    }
}

/// Relay one accepted connection (the `n`th on mapping `map`) to `target`.
fn relay(
    client: TcpStream,
    target: SocketAddr,
    map: usize,
    n: usize,
    cfg: &Arc<Config>,
) -> io::Result<()> {
    let server = TcpStream::connect_timeout(&target, cfg.connect_timeout)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(TICK))?;
        s.set_write_timeout(Some(TICK))?;
    }
    let conn = Arc::new(Conn {
        id: format!("{map}/{n}"),
        client,
        server,
        dead: AtomicBool::new(false),
        done: AtomicUsize::new(0),
    });
    let start = Instant::now();
    let depth = (cfg.max_inflight / CHUNK).max(1);
    for d in [Dir::Up, Dir::Down] {
        let faults: Vec<Fault> = cfg
            .faults
            .iter()
            .filter(|f| f.dir.covers(d) && f.map.is_none_or(|m| m == map) && f.conn.contains(n))
            .map(|f| Fault {
                spec: f.clone(),
                fired: false,
            })
            .collect();
        let w = Writer {
            conn: conn.clone(),
            d,
            start,
            faults,
            off: 0,
            swallow: false,
            keep_open: false,
            reseg: None,
            seed: cfg.seed ^ ((n as u64) << 32) ^ ((map as u64) << 48) ^ u64::from(d == Dir::Up),
            alg: cfg.alg.as_ref().filter(|a| a.map != map).and_then(|a| {
                let what = match d {
                    Dir::Up if a.rdma_header => Rewrite::RdmaHeader,
                    Dir::Down if a.ftp_passive => Rewrite::FtpPassive,
                    _ => return None,
                };
                let local = conn.client.local_addr().ok()?.ip();
                Some(Rewriter::new(
                    what,
                    a.clone(),
                    cfg.clone(),
                    local,
                    target.ip(),
                ))
            }),
        };
        let (tx, rx) = sync_channel(depth);
        let c = conn.clone();
        let delay = cfg.delay;
        std::thread::spawn(move || reader(c, d, tx));
        std::thread::spawn(move || w.run(rx, delay));
    }
    Ok(())
}

/// Accept connections on `sock` (mapping number `map`) forever and relay
/// each to `target`.
pub fn serve(
    sock: TcpListener,
    target: SocketAddr,
    map: usize,
    cfg: Arc<Config>,
) -> JoinHandle<()> {
    serve_counted(sock, target, map, cfg, Arc::new(AtomicUsize::new(0)))
}

/// [`serve`], numbering connections with `count` (shared by the
/// listeners of one mapping).
fn serve_counted(
    sock: TcpListener,
    target: SocketAddr,
    map: usize,
    cfg: Arc<Config>,
    count: Arc<AtomicUsize>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for c in sock.incoming() {
            match c {
                Ok(c) => {
                    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                    let peer = c.peer_addr().ok();
                    tracing::debug!(map, conn = n, ?peer, "accepted");
                    if let Err(e) = relay(c, target, map, n, &cfg) {
                        tracing::warn!(?peer, %target, %e, "cannot reach the target");
                    }
                }
                Err(e) => tracing::warn!(%e, "accept failed"),
            }
        }
    })
}

/// Bind every mapping and serve it; returns the bound addresses in order.
pub fn start(maps: &[(SocketAddr, SocketAddr)], cfg: Config) -> io::Result<Vec<SocketAddr>> {
    let cfg = Arc::new(cfg);
    let mut socks = Vec::new();
    for (l, t) in maps {
        let s = TcpListener::bind(l)?;
        socks.push((s.local_addr()?, s, *t));
    }
    let mut addrs = Vec::new();
    for (i, (a, s, t)) in socks.into_iter().enumerate() {
        serve(s, t, i, cfg.clone());
        addrs.push(a);
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> FaultSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn fault_specs_parse_and_bad_ones_are_named() {
        let f = spec("drop:at=1M,dir=down,map=1,conn=2,how=fin");
        assert_eq!(f.kind, Kind::Drop { rst: false });
        assert_eq!(f.at, Trigger::Bytes(1 << 20));
        assert_eq!((f.dir, f.map), (Dir::Down, Some(1)));
        assert_eq!(f.conn, ConnRange { first: 2, last: 2 });
        assert_eq!(spec("drop").kind, Kind::Drop { rst: true });
        assert_eq!(spec("drop").at, Trigger::Bytes(0));
        assert_eq!(
            spec("stall:after=500ms,for=2s").kind,
            Kind::Stall(Duration::from_secs(2))
        );
        assert_eq!(
            spec("stall:after=500ms").at,
            Trigger::Time(Duration::from_millis(500))
        );
        assert_eq!(
            spec("stall:at=3s").at,
            Trigger::Time(Duration::from_secs(3))
        );
        assert_eq!(
            spec("truncate:how=close").kind,
            Kind::Truncate { close: true }
        );
        assert_eq!(spec("blackhole:conn=2-").conn.last, usize::MAX);
        assert_eq!(spec("corrupt:at=4096").at, Trigger::Bytes(4096));
        assert_eq!(
            spec("reseg:seed=7,max=13").kind,
            Kind::Reseg {
                seed: Some(7),
                max: 13
            }
        );
        for (bad, says) in [
            ("explode", "unknown fault"),
            ("drop:how=slowly", "how=rst or how=fin"),
            ("drop:when=1", "unknown key"),
            ("drop:at", "not KEY=VALUE"),
            ("drop:at=soon", "byte offset"),
            ("drop:dir=sideways", "up, down or both"),
            ("drop:conn=0", "1-based"),
            ("drop:conn=3-2", "N-M"),
            ("drop:map=x", "--listen"),
            ("stall:for=x", "milliseconds"),
            ("drop:for=1", "does not apply"),
            ("corrupt:at=5ms", "byte offset"),
            ("reseg:max=0", "1 to 16M"),
            ("blackhole:seed=1", "does not apply"),
        ] {
            let e = bad.parse::<FaultSpec>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn pieces_are_tiny_odd_and_large() {
        let mut r = Rng::new(7);
        let p: Vec<usize> = (0..10_000).map(|_| r.piece(65536)).collect();
        assert!(p.iter().all(|&n| (1..=65536).contains(&n)));
        assert!(p.iter().filter(|&&n| n < 16).count() > 500);
        assert!(p.iter().filter(|&&n| n > 16384).count() > 200);
        assert!(p.iter().filter(|&&n| n % 2 == 1).count() > 2000);
        let mut a = Rng::new(7);
        assert!(
            (0..100).all(|i| a.piece(65536) == p[i]),
            "same seed, same pieces"
        );
        assert!(Rng::new(1).piece(1) == 1);
    }

    /// A target that records what each accepted connection sent and how
    /// its stream ended; it sends `reply` on each connection first.
    struct Sink {
        addr: SocketAddr,
        got: std::sync::mpsc::Receiver<(Vec<u8>, String)>,
    }

    fn sink(reply: Vec<u8>) -> Sink {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                let tx = tx.clone();
                let reply = reply.clone();
                std::thread::spawn(move || {
                    let _ = c.write_all(&reply);
                    c.set_read_timeout(Some(Duration::from_millis(800)))
                        .unwrap();
                    let mut all = Vec::new();
                    let mut b = vec![0u8; 65536];
                    let end = loop {
                        match c.read(&mut b) {
                            Ok(0) => break "eof".to_string(),
                            Ok(n) => all.extend_from_slice(&b[..n]),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                break "open".to_string()
                            }
                            Err(e) => break format!("{:?}", e.kind()),
                        }
                    };
                    let _ = tx.send((all, end));
                });
            }
        });
        Sink { addr, got }
    }

    fn relay_to(target: SocketAddr, faults: &[&str]) -> SocketAddr {
        let cfg = Config {
            faults: faults.iter().map(|f| spec(f)).collect(),
            ..Config::default()
        };
        start(&[("127.0.0.1:0".parse().unwrap(), target)], cfg).unwrap()[0]
    }

    fn data(n: usize) -> Vec<u8> {
        let mut r = Rng::new(3);
        (0..n).map(|_| r.next_u64() as u8).collect()
    }

    /// Send `d` through `relay`, then read what comes back until the end;
    /// returns (what came back, how it ended, what the target got and how
    /// that ended).
    fn exchange(
        relay: SocketAddr,
        s: &Sink,
        d: &[u8],
        close: bool,
    ) -> (Vec<u8>, String, Vec<u8>, String) {
        let mut c = TcpStream::connect(relay).unwrap();
        let _ = c.write_all(d);
        if close {
            let _ = c.shutdown(Shutdown::Write);
        }
        c.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let mut back = Vec::new();
        let mut b = vec![0u8; 65536];
        let end = loop {
            match c.read(&mut b) {
                Ok(0) => break "eof".to_string(),
                Ok(n) => back.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break "open".to_string(),
                Err(e) => break format!("{:?}", e.kind()),
            }
        };
        let (got, tend) = s.got.recv_timeout(Duration::from_secs(10)).unwrap();
        (back, end, got, tend)
    }

    #[test]
    fn clean_and_resegmented_streams_arrive_whole() {
        let d = data(3 << 20);
        let s = sink(data(100_000));
        for faults in [
            &[][..],
            &["reseg:seed=9,max=4000"][..],
            &["reseg:at=1000"][..],
        ] {
            let r = relay_to(s.addr, faults);
            let (back, end, got, tend) = exchange(r, &s, &d, true);
            assert_eq!((end.as_str(), tend.as_str()), ("eof", "eof"), "{faults:?}");
            assert!(got == d && back == data(100_000), "{faults:?}");
        }
    }

    #[test]
    fn truncate_forwards_exactly_n_bytes_then_half_closes() {
        let d = data(200_000);
        let s = sink(b"hello".to_vec());
        let r = relay_to(s.addr, &["truncate:at=70001,dir=up"]);
        let (back, _end, got, tend) = exchange(r, &s, &d, false);
        assert_eq!(got.len(), 70001);
        assert_eq!(got, d[..70001]);
        assert_eq!(tend, "eof");
        assert_eq!(back, b"hello", "the other direction still flows");
    }

    #[test]
    fn drop_with_rst_and_with_fin() {
        let d = data(300_000);
        let s = sink(Vec::new());
        let r = relay_to(s.addr, &["drop:at=100000,dir=up,how=rst"]);
        let (_, end, got, tend) = exchange(r, &s, &d, false);
        assert_eq!(got.len(), 100_000);
        assert_eq!(
            (end.as_str(), tend.as_str()),
            ("ConnectionReset", "ConnectionReset")
        );
        let r = relay_to(s.addr, &["drop:at=100000,dir=up,how=fin"]);
        let (_, end, got, tend) = exchange(r, &s, &d, false);
        assert_eq!(got.len(), 100_000);
        assert_eq!((end.as_str(), tend.as_str()), ("eof", "eof"));
        // By time, with nothing flowing.
        let r = relay_to(s.addr, &["drop:at=200ms"]);
        let t = Instant::now();
        let (_, end, _, tend) = exchange(r, &s, b"", false);
        assert_eq!(
            (end.as_str(), tend.as_str()),
            ("ConnectionReset", "ConnectionReset")
        );
        assert!(t.elapsed() < Duration::from_millis(1400));
    }

    #[test]
    fn blackhole_swallows_and_keeps_the_connections_open() {
        let d = data(300_000);
        let s = sink(Vec::new());
        let r = relay_to(s.addr, &["blackhole:at=12345,dir=up", "blackhole:dir=down"]);
        let (_, end, got, tend) = exchange(r, &s, &d, true);
        assert_eq!(got, d[..12345]);
        assert_eq!(
            (end.as_str(), tend.as_str()),
            ("open", "open"),
            "no FIN passed on"
        );
    }

    #[test]
    fn corrupt_flips_exactly_one_byte() {
        let d = data(300_000);
        let s = sink(Vec::new());
        let r = relay_to(s.addr, &["corrupt:at=200001,dir=up", "reseg:seed=3"]);
        let (_, _, got, _) = exchange(r, &s, &d, true);
        assert_eq!(got.len(), d.len());
        let diff: Vec<usize> = (0..d.len()).filter(|&i| got[i] != d[i]).collect();
        assert_eq!(diff, vec![200_001]);
        assert_eq!(got[200_001], d[200_001] ^ 0xff);
    }

    #[test]
    fn stall_pauses_then_resumes_and_faults_pick_connections() {
        let d = data(50_000);
        let s = sink(Vec::new());
        let r = relay_to(s.addr, &["stall:at=10000,for=600,dir=up,conn=2"]);
        // Connection 1: no stall.
        let t = Instant::now();
        let (_, _, got, _) = exchange(r, &s, &d, true);
        assert_eq!(got, d);
        let quick = t.elapsed();
        // Connection 2: stalled 600 ms, then complete.
        let t = Instant::now();
        let (_, _, got, _) = exchange(r, &s, &d, true);
        assert_eq!(got, d);
        let slow = t.elapsed();
        assert!(
            slow >= quick + Duration::from_millis(500),
            "{quick:?} {slow:?}"
        );
    }
    #[test]
    fn connect_back_headers_are_rewritten_to_a_relay_listener() {
        let client_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = client_listener.local_addr().unwrap().port();
        let a = Alg {
            rdma_header: true,
            map: 1,
            ..Alg::default()
        };
        let cfg = Arc::new(Config {
            alg: Some(a.clone()),
            ..Config::default()
        });
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        let mut alg = Rewriter::new(Rewrite::RdmaHeader, a, cfg, lo, lo);
        let req = format!(
            "GET /f HTTP/1.1\r\nHost: h\r\nRDMA: client-reads, ip=127.0.0.1, port={p}, maxlen=9\r\n\r\n"
        );
        // Fed a byte at a time: the RDMA line is held until complete,
        // everything else passes at once.
        let mut out = Vec::new();
        for (i, b) in req.as_bytes().iter().enumerate() {
            let o = alg.feed(&[*b]);
            if i == 2 {
                assert_eq!(o, b"T", "not held outside an RDMA: line");
            }
            out.extend(o);
        }
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.ends_with("\r\n\r\n") && out.starts_with("GET /f HTTP/1.1\r\nHost: h\r\n"),
            "{out}"
        );
        let line = out.lines().find(|l| l.starts_with("RDMA:")).unwrap();
        let port: u16 = line
            .split("port=")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_ne!(port, p);
        assert!(
            line.starts_with("RDMA: client-reads, ip=127.0.0.1, port=")
                && line.ends_with(", maxlen=9"),
            "{line}"
        );
        // The same listener again: the same relay port.
        let again = String::from_utf8(alg.feed(req.as_bytes()).clone()).unwrap();
        assert!(again.contains(&format!("port={port},")), "{again}");
        // The relay port reaches the client's listener.
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"ping").unwrap();
        let (mut a, _) = client_listener.accept().unwrap();
        let mut b = [0u8; 4];
        a.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        // Other lines and bodies pass untouched.
        let body = b"xRDMA: ip=1.2.3.4, port=5\r\n".to_vec();
        assert_eq!(alg.feed(&body), body);
    }
    #[test]
    fn ftp_passive_replies_are_rewritten_to_a_relay_listener() {
        let data_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = data_listener.local_addr().unwrap().port();
        let a = Alg {
            ftp_passive: true,
            map: 1,
            ..Alg::default()
        };
        let cfg = Arc::new(Config {
            alg: Some(a.clone()),
            ..Config::default()
        });
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        let mut alg = Rewriter::new(Rewrite::FtpPassive, a, cfg, lo, lo);
        let mut out = Vec::new();
        let epsv = format!("200 ok\r\n229 Entering Extended Passive Mode (|||{p}|)\r\n");
        for chunk in epsv.as_bytes().chunks(5) {
            out.extend(alg.feed(chunk));
        }
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("200 ok\r\n229 Entering Extended Passive Mode (|||"),
            "{out}"
        );
        let port: u16 = out
            .split("|||")
            .nth(1)
            .unwrap()
            .split('|')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_ne!(port, p);
        let pasv = format!(
            "227 Entering Passive Mode (127,0,0,1,{},{}).\r\n",
            p / 256,
            p % 256
        );
        let out2 = String::from_utf8(alg.feed(pasv.as_bytes())).unwrap();
        assert_eq!(
            out2,
            format!(
                "227 Entering Passive Mode (127,0,0,1,{},{}).\r\n",
                port / 256,
                port % 256
            ),
            "the same target, the same relay listener"
        );
        // The relay port reaches the server's data listener, counted on
        // mapping 1.
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"data").unwrap();
        let (mut s, _) = data_listener.accept().unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"data");
        assert_eq!(alg.alg.count.load(Ordering::Relaxed), 1);
        // Other replies pass untouched.
        assert_eq!(
            alg.feed(b"226 Transfer complete (1 2)\r\n"),
            b"226 Transfer complete (1 2)\r\n"
        );
    }
}
