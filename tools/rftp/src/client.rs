//! The client side: an FTP control connection with the RDMA extension,
//! and the `get` / `put` operations of the `rftp` binary.

use std::fs;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_xfer::{BlockSink, FileReader, FileWriter, Mode, NullSink, Transport, ZeroSource};

use crate::checksum::{
    self, Algo, Choice, HashRead, HashSink, HashSource, HashWrite, Journal, Running,
};

/// `ftp://[user[:password]@]host[:port]/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub user: String,
    pub password: String,
    pub host: String,
    pub port: u16,
    pub path: String,
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Url {
    /// Parse an `ftp://` URL; no user means anonymous.
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("ftp://")
            .ok_or_else(|| format!("{s}: only ftp:// URLs are supported"))?;
        let (auth_host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (auth, hostport) = match auth_host.rfind('@') {
            Some(i) => (Some(&auth_host[..i]), &auth_host[i + 1..]),
            None => (None, auth_host),
        };
        let (user, password) = match auth {
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (unescape(u), unescape(p)),
                None => (unescape(a), String::new()),
            },
            None => ("anonymous".to_string(), "rftp@".to_string()),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h.split_once(']').ok_or("unclosed [ in URL host")?;
            (h.to_string(), p.strip_prefix(':').unwrap_or(""))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (hostport.to_string(), ""),
            }
        };
        let port = if port.is_empty() {
            21
        } else {
            port.parse().map_err(|_| format!("{s}: bad port {port}"))?
        };
        if host.is_empty() {
            return Err(format!("{s}: no host"));
        }
        Ok(Url {
            user,
            password,
            host,
            port,
            path: unescape(path),
        })
    }
}

/// An FTP control connection.
#[derive(Debug)]
pub struct Ftp {
    ctrl: BufReader<CtrlRead>,
    out: TcpStream,
    peer: IpAddr,
    timeout: Duration,
    /// The HASH algorithm this connection selected with `OPTS HASH`.
    hash_algo: Option<Algo>,
    /// The algorithms the server's FEAT `HASH` line offers, once asked
    /// (`Some(None)`: FEAT has no HASH line).
    offered: Option<Option<Vec<Algo>>>,
    /// Open data connections to addresses other than the control
    /// connection's peer when a PASV or RADR reply names one
    /// (`--allow-foreign-data-addr`).
    allow_foreign_data_addr: bool,
}

/// The read side of the control connection. Each read waits at most until
/// the deadline of the reply being read, so a server that dribbles a reply
/// a byte at a time cannot hold rftp longer than its timeout per reply.
#[derive(Debug)]
struct CtrlRead {
    s: TcpStream,
    deadline: Option<Instant>,
}

impl Read for CtrlRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.s.set_read_timeout(Some(left))?;
        }
        self.s.read(buf)
    }
}

/// TCP_INFO's smoothed round-trip time of `s` (tcp(7): `tcpi_rtt`, in
/// microseconds), if the kernel gives it.
fn tcp_info_rtt(s: &TcpStream) -> Option<Duration> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero tcp_info is valid (plain integers); getsockopt
    // writes at most `len` bytes into it and sets `len` to what it wrote.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the fd is open for the life of `s`; the pointers are to
    // `info` and `len`, which outlive the call.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0 && info.tcpi_rtt > 0).then(|| Duration::from_micros(u64::from(info.tcpi_rtt)))
}

/// `TCP_CONGESTION` (tcp(7)) on the control connection.
fn set_congestion(s: &TcpStream, cc: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is open for the life of `s`; the pointer and length
    // describe `cc`'s bytes, which the kernel only reads.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    Err(format!(
        "--congestion {cc}: {}; the kernel offers those in \
         /proc/sys/net/ipv4/tcp_available_congestion_control (modprobe tcp_{cc} adds one)",
        io::Error::last_os_error()
    ))
}

/// A reply: code and text (lines joined with '\n').
pub type Reply = crate::reply::Reply;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Ftp {
    /// Connect and read the greeting.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Ftp, String> {
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{host}: no address"))?;
        let s = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        s.set_read_timeout(Some(timeout)).map_err(err)?;
        s.set_write_timeout(Some(timeout)).map_err(err)?;
        let _ = s.set_nodelay(true);
        let mut f = Ftp {
            out: s.try_clone().map_err(err)?,
            ctrl: BufReader::new(CtrlRead { s, deadline: None }),
            peer: addr.ip(),
            timeout,
            hash_algo: None,
            offered: None,
            allow_foreign_data_addr: false,
        };
        let (code, text) = f.read_reply().map_err(err)?;
        if code != 220 {
            return Err(format!("server refused the connection: {code} {text}"));
        }
        Ok(f)
    }

    /// The control connection's round-trip time: the smaller of TCP_INFO's
    /// smoothed RTT (`tcpi_rtt`, tcp(7)) and one timed `NOOP` (which also
    /// counts the server's turnaround, so it only wins when the kernel has
    /// few samples yet).
    pub fn rtt(&mut self) -> Result<Duration, String> {
        let t = Instant::now();
        // Any reply is a round trip (a server without NOOP answers 502).
        self.cmd("NOOP")?;
        let noop = t.elapsed();
        Ok(match tcp_info_rtt(&self.out) {
            Some(k) if k > Duration::ZERO => k.min(noop),
            _ => noop,
        })
    }

    /// Allow (or refuse, the default) data connections to an address other
    /// than the control connection's peer when the server names one in a
    /// PASV or RADR reply (see [`crate::reply::check_data_addr`]).
    pub fn set_allow_foreign_data_addr(&mut self, allow: bool) {
        self.allow_foreign_data_addr = allow;
    }

    /// Read one (possibly multi-line) reply, within the timeout for the
    /// whole reply and the bounds of [`crate::reply::read_reply`]. After a
    /// malformed or over-long reply the control connection is shut down:
    /// what follows on it could not be told apart from replies.
    pub fn read_reply(&mut self) -> io::Result<Reply> {
        let timeout = self.timeout;
        // A read timeout shows as EAGAIN ("Resource temporarily
        // unavailable"): say what it means.
        let silent = |e: io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no reply from the server within {} s (the control connection went silent \
                     or dribbles)",
                    timeout.as_secs()
                ),
            ),
            _ => e,
        };
        self.ctrl.get_mut().deadline = Some(Instant::now() + timeout);
        let got = crate::reply::read_reply(&mut self.ctrl);
        self.ctrl.get_mut().deadline = None;
        match got {
            Ok((code, text)) => {
                tracing::debug!(code, %text, "reply");
                Ok((code, text))
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    tracing::warn!(peer = %self.peer, %e, "unusable reply; closing the control connection");
                    let _ = self.out.shutdown(Shutdown::Both);
                }
                Err(silent(e))
            }
        }
    }

    /// Send a command and read its reply.
    pub fn cmd(&mut self, line: &str) -> Result<Reply, String> {
        if line.starts_with("PASS ") {
            tracing::debug!("command PASS ****");
        } else {
            tracing::debug!(command = line, "command");
        }
        self.out
            .write_all(format!("{line}\r\n").as_bytes())
            .map_err(|e| format!("sending {line:.4}: {e}"))?;
        self.read_reply()
            .map_err(|e| format!("reading the reply to {line:.4}: {e}"))
    }

    /// Send a command; an error unless `ok(code)`.
    pub fn expect(&mut self, line: &str, ok: impl Fn(u32) -> bool) -> Result<String, String> {
        let (c, t) = self.cmd(line)?;
        if ok(c) {
            Ok(t)
        } else {
            let shown = if line.starts_with("PASS") {
                "PASS ****"
            } else {
                line
            };
            Err(format!("{shown}: server replied {c} {t}"))
        }
    }

    /// USER / PASS.
    pub fn login(&mut self, user: &str, password: &str) -> Result<(), String> {
        let (c, t) = self.cmd(&format!("USER {user}"))?;
        match c {
            230 => return Ok(()),
            331 | 332 => {}
            _ => return Err(format!("USER: {c} {t}")),
        }
        self.expect(&format!("PASS {password}"), |c| c == 230 || c == 202)
            .map(|_| ())
            .map_err(|e| format!("login failed: {e}"))
    }

    /// Open a passive data connection (EPSV, falling back to PASV). A PASV
    /// address other than the control connection's peer is refused unless
    /// allowed ([`Ftp::set_allow_foreign_data_addr`]).
    pub fn data(&mut self) -> Result<TcpStream, String> {
        let (c, t) = self.cmd("EPSV")?;
        let addr = if c == 229 {
            // RFC 2428 §3: EPSV names only a port, on the control peer.
            SocketAddr::new(self.peer, crate::reply::parse_epsv(&t)?)
        } else {
            let t = self.expect("PASV", |c| c == 227)?;
            let named = crate::reply::parse_pasv(&t)?;
            crate::reply::check_data_addr(
                named,
                self.peer,
                self.allow_foreign_data_addr,
                "PASV reply",
            )?
        };
        let s = TcpStream::connect_timeout(&addr, self.timeout)
            .map_err(|e| format!("data connection to {addr}: {e}"))?;
        s.set_read_timeout(Some(self.timeout)).map_err(err)?;
        s.set_write_timeout(Some(self.timeout)).map_err(err)?;
        Ok(s)
    }

    /// SIZE, if the server knows it.
    pub fn size(&mut self, path: &str) -> Option<u64> {
        match self.cmd(&format!("SIZE {path}")) {
            Ok((213, t)) => t.trim().parse().ok(),
            _ => None,
        }
    }

    /// The server's SHA-256 of `path` (`HASH`), or `None` if it has no
    /// HASH command.
    pub fn hash(&mut self, path: &str) -> Result<Option<String>, String> {
        self.hash_with(path, Algo::Sha256)
    }

    /// `HASH path` with `algo` chosen by `OPTS HASH` first (when it is not
    /// the default). `Ok(None)` if the server has no HASH or not `algo`.
    pub fn hash_with(&mut self, path: &str, algo: Algo) -> Result<Option<String>, String> {
        // A server may know HASH (SHA-256) but not OPTS HASH.
        if !self.select_hash(algo)? && algo != Algo::Sha256 {
            return Ok(None);
        }
        let (c, t) = self.cmd(&format!("HASH {path}"))?;
        match c {
            // draft-bryan-ftpext-hash §3: "213 ALGORITHM START-END HEX
            // PATH"; the algorithm must be the one selected.
            213 => {
                let mut w = t.split_whitespace();
                let named = w.next().unwrap_or("");
                if !named.eq_ignore_ascii_case(algo.wire_name()) {
                    return Err(format!(
                        "the server's HASH reply names {named:.32}, not the {algo} selected: {t:.200}"
                    ));
                }
                w.nth(1)
                    .map(|h| Some(h.to_ascii_lowercase()))
                    .ok_or_else(|| format!("bad HASH reply {t}"))
            }
            500 | 502 | 504 => Ok(None),
            _ => Err(format!("HASH: {c} {t}")),
        }
    }

    /// The algorithms the server offers for HASH (its FEAT `HASH` line,
    /// asked once per connection); `None` when FEAT has no HASH line (or
    /// there is no FEAT).
    pub fn offered_hashes(&mut self) -> Result<Option<Vec<Algo>>, String> {
        if self.offered.is_none() {
            let (c, t) = self.cmd("FEAT")?;
            self.offered = Some(if c == 211 {
                checksum::feat_hash(&t)
            } else {
                None
            });
        }
        Ok(self.offered.clone().flatten())
    }

    /// Choose the checksum for `choice` with the server (rsync style: the
    /// first of [`checksum::PREFERENCE`] the server offers, or the one
    /// asked for) and select it (`OPTS HASH`). `Ok(None)`: the server has no
    /// HASH, the transfer cannot be verified. A server whose FEAT lists no
    /// HASH line is tried with SHA-256 (old servers know only that).
    pub fn negotiate_hash(&mut self, choice: Choice) -> Result<Option<Algo>, String> {
        let offered = self.offered_hashes()?;
        let algo = match (&offered, choice) {
            (Some(list), Choice::Auto) => match Algo::pick(list) {
                Some(a) => a,
                None => return Ok(None),
            },
            (Some(list), Choice::Only(a)) if !list.contains(&a) => {
                return Err(format!(
                    "--checksum {a}: the server offers {} (FEAT HASH); pass --checksum auto or \
                     one of those",
                    if list.is_empty() {
                        "no algorithm rftp knows".to_string()
                    } else {
                        Algo::list(list)
                    }
                ));
            }
            (Some(_), Choice::Only(a)) => a,
            (None, Choice::Auto) => Algo::Sha256,
            (None, Choice::Only(a)) => a,
        };
        if self.select_hash(algo)? || (offered.is_none() && algo == Algo::Sha256) {
            tracing::info!(%algo, offered = ?offered, "checksum negotiated");
            return Ok(Some(algo));
        }
        if offered.is_some() {
            // It was offered, and OPTS HASH refused it anyway.
            return Err(format!(
                "OPTS HASH {algo}: the server refused the checksum it offers in FEAT"
            ));
        }
        Ok(None)
    }

    /// Make `algo` the server's HASH algorithm (`OPTS HASH`), so that it
    /// computes that checksum while it transfers; false if it cannot.
    /// rftpd computes a running digest during transfers only for a
    /// connection that sent `OPTS HASH`, so it is sent once even for the
    /// default algorithm.
    pub fn select_hash(&mut self, algo: Algo) -> Result<bool, String> {
        if self.hash_algo == Some(algo) {
            return Ok(true);
        }
        let (c, _) = self.cmd(&format!("OPTS HASH {algo}"))?;
        if c == 200 {
            self.hash_algo = Some(algo);
        }
        Ok(c == 200)
    }

    /// RADR: set up a transfer session. `Ok(None)` if the server does not
    /// know the extension (the caller falls back to plain FTP).
    /// `autotune`: let the sink size the blocks in flight inside the pool
    /// (false when `--iodepth` is pinned).
    pub fn radr(
        &mut self,
        o: &Options,
        autotune: bool,
    ) -> Result<Option<Box<dyn Transport>>, String> {
        let line = format!(
            "RADR STREAMS={} BS={} DEPTH={} MODE={}",
            o.streams,
            o.block_size,
            o.effective_iodepth(),
            o.xfer_mode
        );
        let (c, t) = self.cmd(&line)?;
        if crate::FALLBACK_CODES.contains(&c) {
            return Ok(None);
        }
        if c != 200 {
            return Err(format!("RADR: {c} {t}"));
        }
        let reply = crate::reply::parse_radr_reply(&t)?;
        let addr = crate::reply::check_data_addr(
            reply.addr,
            self.peer,
            self.allow_foreign_data_addr,
            "RADR reply",
        )?;
        let (token, mode) = (reply.token, reply.mode);
        let cfg = rdma_xfer::Config {
            streams: o.streams,
            block_size: o.block_size,
            iodepth: o.effective_iodepth(),
            timeout: o.timeout,
            connect_timeout: o.timeout,
            crc: o.crc,
            device: o.device.clone(),
            autotune,
            congestion: o.congestion.clone(),
            ..rdma_xfer::Config::default()
        };
        let mut x = rdma_xfer::connect(addr, mode, token, cfg).map_err(err)?;
        x.set_progress(o.progress.clone());
        Ok(Some(x))
    }

    /// A listing (`LIST` or `NLST`, optionally of `path`) over a passive
    /// data connection.
    pub fn listing(&mut self, verb: &str, path: Option<&str>) -> Result<String, String> {
        let mut data = self.data()?;
        let line = match path {
            Some(p) => format!("{verb} {p}"),
            None => verb.to_string(),
        };
        self.expect(&line, |c| c / 100 == 1)?;
        let mut buf = Vec::new();
        data.read_to_end(&mut buf)
            .map_err(|e| format!("{verb}: reading the data connection: {e}"))?;
        drop(data);
        final_reply(self, verb)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// QUIT (best effort).
    pub fn quit(mut self) {
        let _ = self.cmd("QUIT");
    }
}

/// Progress callback: (bytes done, total if known).
pub type ProgressCb = Arc<dyn Fn(u64, Option<u64>) + Send + Sync>;

/// Options of a transfer.
#[derive(Clone)]
pub struct Options {
    /// Data streams; 0 is `auto` (sized to the path, [`plan_for_path`]).
    pub streams: u32,
    pub block_size: u32,
    /// Blocks in flight per stream; 0 picks [`Options::effective_iodepth`]'s
    /// default.
    pub iodepth: u32,
    /// Plain FTP data connection instead of the RDMA extension.
    pub tcp: bool,
    /// Transport of the extension's session (rdma, or tcp for comparison).
    pub xfer_mode: Mode,
    /// Memory-to-memory: this many bytes from a zero source to a null sink.
    pub mem: Option<u64>,
    /// Compare the file's checksum with the server's (`HASH`) after each
    /// transfer; both ends compute it as the data flows.
    pub verify: bool,
    /// The checksum `verify` uses: `auto` (the best the server offers,
    /// [`Ftp::negotiate_hash`]) or one algorithm.
    pub checksum: Choice,
    /// Told the checksum chosen for each transfer (the progress line shows
    /// it).
    pub checksum_note: Option<Arc<dyn Fn(Algo) + Send + Sync>>,
    pub resume: bool,
    pub crc: bool,
    /// RDMA device of the data sessions: `soft`, `auto`, or a kernel
    /// device (`siw0`); `None`: `IWARP_DEVICE`, else `soft`.
    pub device: Option<String>,
    pub timeout: Duration,
    /// Connect data connections (PASV, RADR) to an address other than the
    /// control connection's peer when the server names one
    /// (`--allow-foreign-data-addr`; refused by default).
    pub allow_foreign_data_addr: bool,
    /// Bytes per second at most (tests and polite transfers).
    pub limit_rate: Option<u64>,
    pub progress: Option<rdma_xfer::ProgressFn>,
    pub plain_progress: Option<ProgressCb>,
    /// Largest pool the automatic sizing registers per side (bytes);
    /// `None`: [`rdma_xfer::tune::DEFAULT_MAX_WINDOW`].
    pub max_window: Option<u64>,
    /// Say what the automatic sizing chose and why (stderr), besides the
    /// log.
    pub explain: bool,
    /// TCP congestion control of the control and data connections
    /// (`TCP_CONGESTION`); `None`: the kernel's default.
    pub congestion: Option<String>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("streams", &self.streams)
            .field("block_size", &self.block_size)
            .field("iodepth", &self.iodepth)
            .field("tcp", &self.tcp)
            .field("mem", &self.mem)
            .finish()
    }
}

/// Bytes in flight the default I/O depth aims at, over all streams.
pub const DEFAULT_WINDOW: u64 = 16 << 20;

impl Options {
    /// The I/O depth a session asks for: `iodepth` if set, else enough
    /// blocks per stream for [`DEFAULT_WINDOW`] bytes in flight in all,
    /// between 2 and 4. More in flight than the path needs only spreads
    /// the transfer over more memory than the CPU caches hold: on loopback,
    /// 8 streams × 4 × 1 MiB cost 5-10 % more CPU per GB than 8 × 2 × 1 MiB
    /// and moved less. Paths with a large bandwidth-delay product need
    /// more (`--iodepth`; see docs/RFTP.md).
    pub fn effective_iodepth(&self) -> u32 {
        if self.iodepth > 0 {
            return self.iodepth;
        }
        let per_block = u64::from(self.block_size.max(1)) * u64::from(self.streams.max(1));
        (DEFAULT_WINDOW / per_block).clamp(2, 4) as u32
    }
}

/// Resolve the `auto` settings of `o` for the path behind `f`: with
/// streams and depth both pinned (or plain FTP) `o` is used as it is;
/// otherwise the control connection's RTT and the rate delivered by the
/// last transfer of this session (`measured`, bits/s) size the session
/// ([`rdma_xfer::tune::plan`]), and what is pinned stays pinned.
pub fn plan_for_path(
    f: &mut Ftp,
    o: &Options,
    measured: Option<f64>,
) -> Result<(Options, Option<rdma_xfer::tune::Plan>), String> {
    if o.tcp || (o.streams > 0 && o.iodepth > 0) {
        let mut o = o.clone();
        o.streams = o.streams.max(1);
        return Ok((o, None));
    }
    let rtt = f.rtt()?;
    let lim = rdma_xfer::tune::Limits::of_this_host(o.max_window);
    let mut lim = lim;
    if o.streams > 0 {
        lim.max_streams = o.streams;
    }
    let mut p = rdma_xfer::tune::plan(rtt, measured, o.block_size, &lim);
    let mut r = o.clone();
    if o.streams > 0 {
        p.streams = o.streams;
        p.why
            .push_str(&format!("; streams pinned at {}", o.streams));
    }
    r.streams = p.streams;
    if o.iodepth > 0 {
        p.iodepth = o.iodepth;
        p.why
            .push_str(&format!("; iodepth pinned at {}", o.iodepth));
    } else {
        r.iodepth = p.iodepth;
    }
    tracing::info!(
        streams = p.streams,
        iodepth = p.iodepth,
        block_size = p.block_size,
        why = %p.why,
        "auto sizing"
    );
    if o.explain {
        eprintln!(
            "rftp: auto: {} stream(s) x {} blocks x {} KiB: {}",
            p.streams,
            p.iodepth,
            p.block_size / 1024,
            p.why
        );
    }
    Ok((r, Some(p)))
}

impl Default for Options {
    fn default() -> Options {
        Options {
            streams: 0,
            block_size: 1 << 20,
            iodepth: 0,
            tcp: false,
            xfer_mode: Mode::Rdma,
            mem: None,
            verify: true,
            checksum: Choice::Auto,
            checksum_note: None,
            resume: true,
            crc: false,
            device: None,
            timeout: Duration::from_secs(30),
            allow_foreign_data_addr: false,
            limit_rate: None,
            progress: None,
            plain_progress: None,
            max_window: None,
            explain: false,
            congestion: None,
        }
    }
}

/// What a transfer did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub bytes: u64,
    /// Bytes that were already there (REST).
    pub resumed_from: u64,
    /// Of those, the bytes read again to take their checksum (the rest came
    /// from the state saved in `FILE.part.sums`); `None` when not resumed
    /// or not verified.
    pub rehashed: Option<u64>,
    pub elapsed: Duration,
    /// "rdma x8", "tcp x1 (extension)", "ftp".
    pub via: String,
    /// The verified checksum (algorithm, hex digest), if verification ran.
    pub checksum: Option<(Algo, String)>,
    /// Retries it took ([`get_retrying`]).
    pub retries: u32,
}

impl Summary {
    /// Throughput in Gbit/s.
    pub fn gbps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 * 8.0 / s / 1e9
        } else {
            0.0
        }
    }
}

/// Sleeps to keep a sink at `rate` bytes per second.
struct Throttle<S> {
    inner: S,
    /// Bytes per second at most; `None`: no limit.
    rate: Option<u64>,
    start: Instant,
    bytes: u64,
}

impl<S: BlockSink> BlockSink for Throttle<S> {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_block(buf)?;
        let Some(rate) = self.rate else {
            return Ok(());
        };
        self.bytes += buf.len() as u64;
        let due = Duration::from_secs_f64(self.bytes as f64 / rate.max(1) as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            std::thread::sleep(wait);
        }
        Ok(())
    }
    fn finish(&mut self) -> io::Result<()> {
        self.inner.finish()
    }
}

/// Connect, log in and switch to binary (TYPE I).
pub fn session(url: &Url, o: &Options) -> Result<Ftp, String> {
    let mut f = Ftp::connect(&url.host, url.port, o.timeout)?;
    if let Some(cc) = &o.congestion {
        set_congestion(&f.out, cc)?;
    }
    f.set_allow_foreign_data_addr(o.allow_foreign_data_addr);
    f.login(&url.user, &url.password)?;
    f.expect("TYPE I", |c| c == 200)?;
    Ok(f)
}

/// The extension's transfer session of one control connection, kept
/// across transfers (the server keeps its end until the session fails or
/// the next `RADR`). A new `RADR` is sent only when the parameters change.
#[derive(Debug, Default)]
pub struct XferSlot {
    x: Option<Box<dyn Transport>>,
    /// The RADR line (and CRC setting) the session was made with.
    key: Option<String>,
    /// The server answered RADR with 500/502/504.
    unsupported: bool,
    /// The automatic plan the session was made with, if any.
    plan: Option<rdma_xfer::tune::Plan>,
    /// The rate (bits/s) the last long enough transfer delivered: the next
    /// automatic plan starts from it.
    measured: Option<f64>,
}

impl XferSlot {
    /// The session for `o`: the cached one, a new one, or `None` when `o`
    /// asks for plain FTP or the server lacks the extension. `auto`
    /// settings are sized to the path ([`plan_for_path`]); a cached
    /// automatic session is replaced when the rate measured since asks for
    /// a window at least twice or at most half its own.
    fn get(&mut self, f: &mut Ftp, o: &Options) -> Result<Option<&mut Box<dyn Transport>>, String> {
        if o.tcp || self.unsupported {
            return Ok(None);
        }
        let key = format!(
            "{} {} {} {} {}",
            o.streams,
            o.block_size,
            o.effective_iodepth(),
            o.xfer_mode,
            o.crc
        );
        let auto = o.streams == 0 || o.iodepth == 0;
        let mut stale = self.x.is_none() || self.key.as_deref() != Some(key.as_str());
        let mut resolved = None;
        if auto && (stale || self.measured.is_some()) {
            let (r, p) = plan_for_path(f, o, self.measured.take())?;
            if let (false, Some(old), Some(new)) = (stale, &self.plan, &p) {
                let (a, b) = (old.window(), new.window());
                stale = b >= 2 * a || 2 * b <= a;
                if stale {
                    tracing::info!(
                        old = a,
                        new = b,
                        "auto sizing: a new session for the measured rate"
                    );
                }
            }
            if stale {
                resolved = Some((r, p));
            }
        }
        if stale {
            self.x = None;
            self.key = None;
            let (ro, plan) = match resolved {
                Some((r, p)) => (r, p),
                None => {
                    let mut r = o.clone();
                    r.streams = r.streams.max(1);
                    (r, None)
                }
            };
            match f.radr(&ro, o.iodepth == 0)? {
                Some(x) => {
                    self.x = Some(x);
                    self.key = Some(key);
                    self.plan = plan;
                }
                None => {
                    self.unsupported = true;
                    tracing::warn!("the server does not support RADR; falling back to plain FTP");
                    if o.mem.is_none() {
                        eprintln!(
                            "rftp: server has no RDMA extension; using a plain FTP data connection"
                        );
                    }
                    return Ok(None);
                }
            }
        }
        let x = self.x.as_mut().expect("session set above");
        x.set_progress(o.progress.clone());
        Ok(Some(x))
    }

    /// A transfer of this session moved `st`: remember its rate for the
    /// next automatic plan if it was long enough to say something (at
    /// least twice the pool, so past the start).
    fn note(&mut self, st: &rdma_xfer::Stats) {
        let Some(x) = &self.x else { return };
        let c = x.config();
        let pool = u64::from(c.pool_depth()) * u64::from(c.block_size);
        if st.bytes >= 2 * pool && self.plan.is_some() {
            self.measured = Some(st.bits_per_sec());
        }
    }

    /// The automatic plan of the current session, if it has one.
    pub fn plan(&self) -> Option<&rdma_xfer::tune::Plan> {
        self.plan.as_ref()
    }

    /// Forget the session (after a failed transfer both ends drop it).
    pub fn reset(&mut self) {
        self.x = None;
        self.key = None;
        self.plan = None;
    }

    /// "rdma x8" for the current session, if any.
    pub fn describe(&self) -> Option<String> {
        self.x.as_deref().map(via)
    }
}

fn via(x: &dyn Transport) -> String {
    format!("{} x{}", x.mode(), x.config().streams)
}

fn final_reply(f: &mut Ftp, what: &str) -> Result<(), String> {
    let (c, t) = f
        .read_reply()
        .map_err(|e| format!("{what}: reading the final reply on the control connection: {e}"))?;
    if (200..300).contains(&c) {
        Ok(())
    } else {
        Err(format!("{what}: server replied {c} {t}"))
    }
}

/// Copy the TCP data connection into `dst` from `offset`, reporting
/// progress.
fn copy_plain(
    src: &mut impl Read,
    dst: &mut impl Write,
    o: &Options,
    done0: u64,
    total: Option<u64>,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    let start = Instant::now();
    // The data connection's timeouts show as EAGAIN ("Resource temporarily
    // unavailable"); files never time out.
    let silent = |e: io::Error, what: &str| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the data connection {what} for {} s (the path or the server went silent)",
                o.timeout.as_secs()
            ),
        ),
        _ => e,
    };
    loop {
        let k = match src.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(silent(e, "brought no data")),
        };
        dst.write_all(&buf[..k])
            .map_err(|e| silent(e, "took no data"))?;
        n += k as u64;
        if let Some(p) = &o.plain_progress {
            p(done0 + n, total);
        }
        if let Some(rate) = o.limit_rate {
            let due = Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
            if let Some(w) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(w);
            }
        }
    }
}

/// The checksum of a transfer under `o`: negotiated with the server when
/// verifying (`None` when not verifying or the server has no HASH), and
/// told to `o.checksum_note`.
fn chosen_checksum(f: &mut Ftp, o: &Options) -> Result<Option<Algo>, String> {
    if !o.verify {
        return Ok(None);
    }
    let algo = f.negotiate_hash(o.checksum)?;
    match algo {
        Some(a) => {
            if let Some(n) = &o.checksum_note {
                n(a);
            }
        }
        None => eprintln!("rftp: the server offers no HASH; the transfer is not verified"),
    }
    Ok(algo)
}

/// Why [`verify`] failed: the digests differ, or the server could not be
/// asked.
enum VerifyError {
    Mismatch(String),
    Other(String),
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerifyError::Mismatch(e) | VerifyError::Other(e) => f.write_str(e),
        }
    }
}

/// Compare `ours` (the checksum computed as the data flowed) with the
/// server's for `remote`.
fn verify(
    f: &mut Ftp,
    remote: &str,
    local: &Path,
    ours: Running,
) -> Result<Option<(Algo, String)>, VerifyError> {
    let algo = ours.algo();
    let ours = ours.finish();
    let Some(theirs) = f.hash_with(remote, algo).map_err(VerifyError::Other)? else {
        eprintln!("rftp: server offers no {algo} HASH; not verified");
        return Ok(None);
    };
    if ours != theirs {
        return Err(VerifyError::Mismatch(format!(
            "{algo} mismatch for {}: local {ours}, server {theirs}; the copy differs from the \
             server's file: transfer it again",
            local.display()
        )));
    }
    Ok(Some((algo, ours)))
}

/// The `.part` name a download is written to before it is complete.
pub fn part_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// Download `url` to `out` (or, in memory mode, to a null sink) on a new
/// control connection.
pub fn get(url: &Url, out: &Path, o: &Options) -> Result<Summary, String> {
    let mut f = session(url, o)?;
    let mut slot = XferSlot::default();
    let s = get_with(&mut f, &mut slot, &url.path, out, o)?;
    f.quit();
    Ok(s)
}

/// Memory-to-memory: `len` bytes from a zero source to a null sink, in the
/// direction `download` says. `OPTS RDMA MEM` is switched off afterwards so
/// the control connection can go on with file transfers.
fn mem_transfer(
    f: &mut Ftp,
    slot: &mut XferSlot,
    remote: &str,
    len: u64,
    download: bool,
    o: &Options,
) -> Result<Summary, String> {
    let x = slot
        .get(f, o)?
        .ok_or("memory-to-memory mode needs the server's RDMA extension (RADR); drop --tcp")?;
    let via_s = via(&**x);
    f.expect("OPTS RDMA MEM ON", |c| c == 200)?;
    let res = if download {
        f.expect(&format!("RRTR {len}"), |c| c / 100 == 1)
            .and_then(|_| x.recv(&mut NullSink::default()).map_err(err))
    } else {
        f.expect(&format!("RSTR {remote}"), |c| c / 100 == 1)
            .and_then(|_| x.send(&mut ZeroSource::new(len)).map_err(err))
    };
    let st = match res {
        Ok(st) => st,
        Err(e) => {
            slot.reset();
            let _ = f.cmd("OPTS RDMA MEM OFF");
            return Err(e);
        }
    };
    slot.note(&st);
    let what = if download { "RRTR" } else { "RSTR" };
    let done = final_reply(f, what);
    let _ = f.cmd("OPTS RDMA MEM OFF");
    done?;
    Ok(Summary {
        bytes: st.bytes,
        resumed_from: 0,
        rehashed: None,
        elapsed: st.elapsed,
        via: via_s,
        checksum: None,
        retries: 0,
    })
}

/// Download `remote` to `out` on an open, logged-in control connection,
/// over the slot's RDMA session (made if needed) or plain FTP.
pub fn get_with(
    f: &mut Ftp,
    slot: &mut XferSlot,
    remote: &str,
    out: &Path,
    o: &Options,
) -> Result<Summary, String> {
    if let Some(len) = o.mem {
        return mem_transfer(f, slot, remote, len, true, o);
    }
    let start = Instant::now();
    let algo = chosen_checksum(f, o)?;
    let total = f.size(remote);
    let part = part_path(out);
    let mut offset = if o.resume {
        fs::metadata(&part).map(|m| m.len()).unwrap_or(0)
    } else {
        0
    };
    if total.is_some_and(|t| offset > t) {
        offset = 0;
    }
    // The checksum runs over the part a resume keeps (from the state saved
    // beside it, FILE.part.sums, plus what the part holds past that state),
    // then over the blocks as they arrive, saving its state after each.
    let mut rehashed = None;
    let run = match algo {
        None => None,
        Some(a) if offset > 0 => {
            let (run, read) = checksum::resume_prefix(&part, offset, a)
                .map_err(|e| format!("hashing {}: {e}", part.display()))?;
            tracing::info!(offset, %a, hashed_again = read, "resuming: checksum of the kept part");
            rehashed = Some(read);
            Some(run)
        }
        Some(a) => {
            Journal::remove(&part);
            Some(Running::new(a))
        }
    };
    let journal = || algo.map(|_| Journal::new(&part));
    let run_out: Option<Running>;
    let x = slot.get(f, o)?;
    let rest = |f: &mut Ftp| -> Result<(), String> {
        if offset > 0 {
            tracing::info!(offset, "resuming download");
            f.expect(&format!("REST {offset}"), |c| c == 350)?;
        }
        Ok(())
    };
    let via_s;
    let bytes = if let Some(x) = x {
        via_s = via(&**x);
        // Create the .part before asking, so a local error costs no
        // transfer; an empty .part made here goes if the server refuses.
        let w = FileWriter::create(&part, offset, true).map_err(|e| {
            format!(
                "creating {}: {e}; check that its directory exists and is writable",
                part.display()
            )
        })?;
        if let Err(e) = rest(f).and_then(|_| f.expect(&format!("RRTR {remote}"), |c| c / 100 == 1))
        {
            drop(w);
            if offset == 0 {
                let _ = fs::remove_file(&part);
            }
            return Err(e);
        }
        let mut w = Throttle {
            inner: HashSink {
                inner: w,
                run,
                journal: journal(),
            },
            rate: o.limit_rate,
            start: Instant::now(),
            bytes: 0,
        };
        let r = x.recv(&mut w);
        let HashSink {
            inner: w,
            run: hashed,
            ..
        } = w.inner;
        drop(w);
        run_out = hashed;
        let st = match r {
            Ok(st) => st,
            Err(e) => {
                slot.reset();
                // The server's reply says more than "peer aborted" if it failed.
                let srv = f
                    .read_reply()
                    .map(|(c, t)| format!(" (server: {c} {t})"))
                    .unwrap_or_default();
                return Err(format!(
                    "download failed: {e}{srv}; the partial file {} is kept for a resume",
                    part.display()
                ));
            }
        };
        slot.note(&st);
        final_reply(f, "RRTR")?;
        st.bytes
    } else {
        via_s = "ftp".to_string();
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(offset == 0)
            .open(&part)
            .map_err(|e| {
                format!(
                    "creating {}: {e}; check that its directory exists and is writable",
                    part.display()
                )
            })?;
        file.set_len(offset).map_err(err)?;
        use std::io::Seek;
        file.seek(io::SeekFrom::Start(offset)).map_err(err)?;
        // RFC 959 §4.1.3: REST immediately precedes RETR, so the data
        // connection is set up first.
        let started = f.data().and_then(|d| {
            rest(f)?;
            f.expect(&format!("RETR {remote}"), |c| c / 100 == 1)
                .map(|_| d)
        });
        let mut data = match started {
            Ok(d) => d,
            Err(e) => {
                drop(file);
                if offset == 0 {
                    let _ = fs::remove_file(&part);
                }
                return Err(e);
            }
        };
        let mut dst = HashWrite {
            inner: file,
            run,
            journal: journal(),
        };
        let n = copy_plain(&mut data, &mut dst, o, offset, total).map_err(|e| {
            format!(
                "download failed: {e}; the partial file {} is kept for a resume",
                part.display()
            )
        })?;
        run_out = dst.run;
        drop(data);
        if let Some(t) = total.filter(|t| offset + n < *t) {
            let srv = f
                .read_reply()
                .map(|(c, t)| format!(" (server: {c} {t})"))
                .unwrap_or_else(|e| format!(" ({e})"));
            return Err(format!(
                "download failed: the data connection ended after {} of {t} bytes{srv}; the partial file {} is kept for a resume",
                offset + n,
                part.display()
            ));
        }
        final_reply(f, "RETR")?;
        n
    };
    let elapsed = start.elapsed();
    // Verify before the rename: a copy that differs from the server's file
    // must not appear under the final name (nor stay as a part to resume).
    let checksum = match run_out {
        Some(run) => verify(f, remote, out, run).map_err(|e| {
            let _ = fs::remove_file(&part);
            Journal::remove(&part);
            format!("{e} ({} deleted)", part.display())
        })?,
        None => None,
    };
    fs::rename(&part, out)
        .map_err(|e| format!("renaming {} to {}: {e}", part.display(), out.display()))?;
    Journal::remove(&part);
    Ok(Summary {
        bytes,
        resumed_from: offset,
        rehashed,
        elapsed,
        via: via_s,
        checksum,
        retries: 0,
    })
}

/// Whether a failed transfer may succeed on a new connection: the path or
/// the server went away or silent (reset, timeout, a lost session, 421 /
/// 425 / 426, RFC 959 §4.2: "transient negative completion"). A checksum
/// mismatch, a local file error or a permanent 5xx reply is not retried.
pub fn transient(e: &str) -> bool {
    let permanent = [
        "mismatch",
        "creating ",
        "opening ",
        "renaming ",
        "local I/O error",
        "invalid transfer configuration",
    ];
    if permanent.iter().any(|p| e.contains(p)) {
        return false;
    }
    let transient = [
        "connection",
        "Connection",
        "timed out",
        "no reply",
        "Broken pipe",
        "went silent",
        "stopped responding",
        "vanished",
        "unreachable",
        ": 421 ",
        ": 425 ",
        ": 426 ",
        "replied 421",
        "replied 425",
        "replied 426",
        "session setup failed",
    ];
    transient.iter().any(|p| e.contains(p))
}

/// The wait before retry `n` (1-based): 1 s, doubling, at most 30 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

/// [`get`], tried again up to `retries` times (after [`backoff`]) when it
/// fails for a [`transient`] reason: each retry opens a new control
/// connection and transfer session and resumes at the end of `FILE.part`
/// (`REST`), the first byte not yet written in order, so nothing already
/// received is sent again; the checksum of the kept part is taken before
/// the rest arrives, and the whole file is verified at the end as usual.
/// `say` reports each failure and retry (the progress line). Returns the
/// last attempt's summary, with `retries` and `first_offset` telling what
/// happened.
pub fn get_retrying(
    url: &Url,
    out: &Path,
    o: &Options,
    retries: u32,
    say: &dyn Fn(&str),
) -> Result<Summary, String> {
    let mut o = o.clone();
    let mut n = 0;
    loop {
        let e = match get(url, out, &o) {
            Ok(mut s) => {
                s.retries = n;
                return Ok(s);
            }
            Err(e) => e,
        };
        if n >= retries || !transient(&e) {
            if n > 0 {
                return Err(format!(
                    "{e} (after {n} retr{})",
                    if n == 1 { "y" } else { "ies" }
                ));
            }
            return Err(e);
        }
        n += 1;
        let kept = fs::metadata(part_path(out)).map(|m| m.len()).unwrap_or(0);
        let wait = backoff(n);
        say(&format!(
            "rftp: transfer interrupted: {e}; retry {n} of {retries} in {} s, resuming at byte \
             {kept} (kept in {})",
            wait.as_secs(),
            part_path(out).display(),
        ));
        tracing::info!(retry = n, retries, kept, error = %e, "download interrupted; retrying");
        std::thread::sleep(wait);
        // Resume from what this run kept, even under --no-resume (which
        // is about a part left by an earlier run).
        o.resume = true;
    }
}

/// Upload `file` to `url` (or, in memory mode, zeros to a null sink) on a
/// new control connection.
pub fn put(file: Option<&Path>, url: &Url, o: &Options) -> Result<Summary, String> {
    let mut f = session(url, o)?;
    let mut slot = XferSlot::default();
    let s = put_with(&mut f, &mut slot, file, &url.path, o)?;
    f.quit();
    Ok(s)
}

/// Upload `file` as `remote` on an open, logged-in control connection.
pub fn put_with(
    f: &mut Ftp,
    slot: &mut XferSlot,
    file: Option<&Path>,
    remote: &str,
    o: &Options,
) -> Result<Summary, String> {
    if let Some(len) = o.mem {
        return mem_transfer(f, slot, remote, len, false, o);
    }
    let start = Instant::now();
    let file = file.ok_or("put needs a FILE (or --mem SIZE)")?;
    let algo = chosen_checksum(f, o)?;
    // Open before any command, so a missing file costs no round trip and
    // leaves the server's state alone.
    let r =
        FileReader::open(file, 0, true).map_err(|e| format!("opening {}: {e}", file.display()))?;
    // The checksum runs over the blocks as they are read.
    let mut r = HashSource {
        inner: r,
        run: algo.map(Running::new),
    };
    let run_out;
    let x = slot.get(f, o)?;
    let via_s;
    let bytes = if let Some(x) = x {
        via_s = via(&**x);
        f.expect(&format!("RSTR {remote}"), |c| c / 100 == 1)?;
        let sent = x.send(&mut r);
        run_out = r.run;
        let st = match sent {
            Ok(st) => st,
            Err(e) => {
                slot.reset();
                let srv = f
                    .read_reply()
                    .map(|(c, t)| format!(": server replied {c} {t}"))
                    .unwrap_or_default();
                return Err(format!("upload failed: {e}{srv}"));
            }
        };
        slot.note(&st);
        final_reply(f, "RSTR")?;
        st.bytes
    } else {
        drop(r);
        via_s = "ftp".to_string();
        let src = fs::File::open(file).map_err(|e| format!("opening {}: {e}", file.display()))?;
        let total = src.metadata().map(|m| m.len()).ok();
        let mut src = HashRead {
            inner: src,
            run: algo.map(Running::new),
        };
        let mut data = f.data()?;
        f.expect(&format!("STOR {remote}"), |c| c / 100 == 1)?;
        let n = copy_plain(&mut src, &mut data, o, 0, total);
        run_out = src.run;
        let _ = data.shutdown(Shutdown::Write);
        drop(data);
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                let srv = f
                    .read_reply()
                    .map(|(c, t)| format!(": server replied {c} {t}"))
                    .unwrap_or_default();
                return Err(format!("upload failed: {e}{srv}"));
            }
        };
        final_reply(f, "STOR")?;
        n
    };
    let elapsed = start.elapsed();
    // An upload whose copy differs from the local file must not stay on
    // the server under its final name: delete it (DELE) and say so.
    let checksum = match run_out {
        Some(run) => match verify(f, remote, file, run) {
            Ok(c) => c,
            Err(VerifyError::Mismatch(e)) => {
                let what = match f.cmd(&format!("DELE {remote}")) {
                    Ok((c, _)) if c / 100 == 2 => format!("the server's copy {remote} was deleted"),
                    Ok((c, t)) => format!("deleting the server's copy {remote} failed: {c} {t}"),
                    Err(err) => format!("deleting the server's copy {remote} failed: {err}"),
                };
                return Err(format!("{e} ({what})"));
            }
            Err(e) => return Err(e.to_string()),
        },
        None => None,
    };
    Ok(Summary {
        bytes,
        resumed_from: 0,
        rehashed: None,
        elapsed,
        via: via_s,
        checksum,
        retries: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_iodepth_aims_at_a_16_mib_window() {
        let o = |streams, block_size, iodepth| Options {
            streams,
            block_size,
            iodepth,
            ..Options::default()
        };
        assert_eq!(o(1, 1 << 20, 0).effective_iodepth(), 4);
        assert_eq!(o(4, 1 << 20, 0).effective_iodepth(), 4);
        assert_eq!(o(8, 1 << 20, 0).effective_iodepth(), 2);
        assert_eq!(o(16, 4 << 20, 0).effective_iodepth(), 2, "at least 2");
        assert_eq!(o(1, 64 << 10, 0).effective_iodepth(), 4, "at most 4");
        assert_eq!(o(8, 1 << 20, 7).effective_iodepth(), 7, "a set depth wins");
    }

    #[test]
    fn urls() {
        let u = Url::parse("ftp://bob:p%40ss@127.0.0.1:2121/dir/f.bin").unwrap();
        assert_eq!(
            u,
            Url {
                user: "bob".into(),
                password: "p@ss".into(),
                host: "127.0.0.1".into(),
                port: 2121,
                path: "/dir/f.bin".into()
            }
        );
        let u = Url::parse("ftp://host/x").unwrap();
        assert_eq!((u.user.as_str(), u.port), ("anonymous", 21));
        let u = Url::parse("ftp://[::1]:99/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 99));
        assert!(Url::parse("http://x/").is_err());
        assert!(Url::parse("ftp://:1/").is_err());
    }
}
