//! The FTP control connection (RFC 959 replies, RFC 2389 FEAT, the HASH
//! draft's OPTS HASH, RFC 3659 SIZE) with the RDMA extension's RADR, the
//! RTT from TCP_INFO and TCP_CONGESTION on the socket.

use std::collections::VecDeque;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdma_xfer::Transport;

use super::options::Options;
use crate::checksum::{self, Algo, Choice};

/// An FTP control connection.
#[derive(Debug)]
pub struct Ftp {
    pub(super) ctrl: BufReader<CtrlRead>,
    pub(super) out: TcpStream,
    pub(super) peer: IpAddr,
    pub(super) timeout: Duration,
    /// The HASH algorithm this connection selected with `OPTS HASH`.
    pub(super) hash_algo: Option<Algo>,
    /// The algorithms the server's FEAT `HASH` line offers, once asked
    /// (`Some(None)`: FEAT has no HASH line).
    pub(super) offered: Option<Option<Vec<Algo>>>,
    /// Open data connections to addresses other than the control
    /// connection's peer when a PASV or RADR reply names one
    /// (`--allow-foreign-data-addr`).
    pub(super) allow_foreign_data_addr: bool,
    /// The server said in its greeting that it is rftpd with the RDMA
    /// extension, so commands may be pipelined ([`Ftp::send_ahead`]).
    pub(super) pipelining: bool,
    /// Commands sent ahead whose replies have not been read yet, in the
    /// order sent (RFC 959 §4.2: replies come in command order).
    pub(super) pending: VecDeque<String>,
    /// Replies to commands sent ahead that were read while waiting for a
    /// later one (e.g. FEAT's, read on the way to USER's).
    pub(super) stash: Vec<(String, Reply)>,
    /// The time from sending the first pipelined batch to its first reply:
    /// an RTT sample that spares the timed NOOP.
    pub(super) rtt_sample: Option<Duration>,
    /// When the first pipelined batch was sent (for `rtt_sample`).
    pub(super) sent_at: Option<Instant>,
}

/// The read side of the control connection. Each read waits at most until
/// the deadline of the reply being read, so a server that dribbles a reply
/// a byte at a time cannot hold rftp longer than its timeout per reply.
#[derive(Debug)]
pub(super) struct CtrlRead {
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
pub(super) fn tcp_info_rtt(s: &TcpStream) -> Option<Duration> {
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
pub(super) fn set_congestion(s: &TcpStream, cc: &str) -> Result<(), String> {
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

pub(super) fn err(e: impl std::fmt::Display) -> String {
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
            pipelining: false,
            pending: VecDeque::new(),
            stash: Vec::new(),
            rtt_sample: None,
            sent_at: None,
        };
        let (code, text) = f.read_reply().map_err(err)?;
        if code != 220 {
            return Err(format!("server refused the connection: {code} {text}"));
        }
        // Only rftpd (whose greeting names the extension) gets pipelined
        // commands: RFC 959 servers answer in command order, but some
        // discard what arrives before they asked for it (lftp's
        // ftp:sync-mode exists for them), so other servers get one command
        // at a time.
        f.pipelining = text.starts_with("rftpd ") && text.contains("RADR");
        Ok(f)
    }

    /// The control connection's round-trip time: the smaller of TCP_INFO's
    /// smoothed RTT (`tcpi_rtt`, tcp(7)) and one timed `NOOP` (which also
    /// counts the server's turnaround, so it only wins when the kernel has
    /// few samples yet).
    pub fn rtt(&mut self) -> Result<Duration, String> {
        // A pipelined batch already timed a round trip: no NOOP.
        if let Some(sample) = self.rtt_sample {
            return Ok(match tcp_info_rtt(&self.out) {
                Some(k) => k.min(sample),
                None => sample,
            });
        }
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

    /// Whether this connection pipelines commands (the server is rftpd).
    pub fn pipelining(&self) -> bool {
        self.pipelining
    }

    /// Send `lines` now, in one write, without waiting for their replies
    /// (pipelining, RFC 959 §4.2: "the server replies in command order"):
    /// a later [`Ftp::cmd`] of the same line reads its reply instead of
    /// sending it again. Does nothing unless [`Ftp::pipelining`]. Only
    /// commands whose failure is harmless to the ones after them belong
    /// in one batch.
    pub fn send_ahead(&mut self, lines: &[String]) -> Result<(), String> {
        if !self.pipelining || lines.is_empty() {
            return Ok(());
        }
        let mut buf = String::new();
        for l in lines {
            if l.starts_with("PASS ") {
                tracing::debug!("command PASS **** (sent ahead)");
            } else {
                tracing::debug!(command = %l, "command (sent ahead)");
            }
            buf.push_str(l);
            buf.push_str("\r\n");
        }
        self.out
            .write_all(buf.as_bytes())
            .map_err(|e| format!("sending {:.4}: {e}", lines[0]))?;
        if self.rtt_sample.is_none() && self.sent_at.is_none() {
            self.sent_at = Some(Instant::now());
        }
        self.pending.extend(lines.iter().cloned());
        Ok(())
    }

    /// Read the next reply on the wire and note the pipelined batch's
    /// round trip if this is its first reply.
    fn next_reply(&mut self) -> io::Result<Reply> {
        let got = self.read_reply();
        if let Some(t) = self.sent_at.take() {
            self.rtt_sample = Some(t.elapsed());
        }
        got
    }

    /// Send a command and read its reply. A command sent ahead
    /// ([`Ftp::send_ahead`]) is not sent again: its reply is read (the
    /// replies to commands sent before it are kept for their own `cmd`).
    /// A new command drops the kept replies: the server's state has moved
    /// past them.
    pub fn cmd(&mut self, line: &str) -> Result<Reply, String> {
        if let Some(i) = self.stash.iter().position(|(l, _)| l == line) {
            return Ok(self.stash.remove(i).1);
        }
        let fresh = !self.pending.iter().any(|l| l == line);
        if fresh {
            self.stash.clear();
            if line.starts_with("PASS ") {
                tracing::debug!("command PASS ****");
            } else {
                tracing::debug!(command = line, "command");
            }
            self.out
                .write_all(format!("{line}\r\n").as_bytes())
                .map_err(|e| format!("sending {line:.4}: {e}"))?;
            self.pending.push_back(line.to_string());
        }
        loop {
            let l = self.pending.pop_front().expect("the line is pending");
            let r = self
                .next_reply()
                .map_err(|e| format!("reading the reply to {l:.4}: {e}"))?;
            if l == line {
                return Ok(r);
            }
            if !fresh {
                self.stash.push((l, r));
            } else {
                tracing::debug!(command = %l, code = r.0, "reply to a command sent ahead, not used");
            }
        }
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

    /// USER / PASS. When pipelining, FEAT (allowed before login, RFC 2389
    /// §3), USER, PASS and `then` go in one batch: a refused login makes
    /// the rest fail harmlessly (530), and is reported as before.
    pub fn login_with(
        &mut self,
        user: &str,
        password: &str,
        then: &[String],
    ) -> Result<(), String> {
        if self.pipelining {
            let mut batch = vec![
                "FEAT".to_string(),
                format!("USER {user}"),
                format!("PASS {password}"),
            ];
            batch.extend(then.iter().cloned());
            self.send_ahead(&batch)?;
        }
        self.login(user, password)
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

    /// The algorithm [`Ftp::negotiate_hash`] would select for `choice`,
    /// from FEAT alone (no `OPTS HASH` sent): `Ok(None)` when the server
    /// offers none rftp knows.
    pub fn pick_hash(&mut self, choice: Choice) -> Result<Option<Algo>, String> {
        let offered = self.offered_hashes()?;
        Ok(Some(match (&offered, choice) {
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
        }))
    }

    /// Choose the checksum for `choice` with the server (rsync style: the
    /// first of [`checksum::PREFERENCE`] the server offers, or the one
    /// asked for) and select it (`OPTS HASH`). `Ok(None)`: the server has no
    /// HASH, the transfer cannot be verified. A server whose FEAT lists no
    /// HASH line is tried with SHA-256 (old servers know only that).
    pub fn negotiate_hash(&mut self, choice: Choice) -> Result<Option<Algo>, String> {
        let Some(algo) = self.pick_hash(choice)? else {
            return Ok(None);
        };
        let offered = self.offered_hashes()?;
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
        match self.radr_reply(&radr_line(o))? {
            Some(to) => radr_connect(to, o, autotune).map(Some),
            None => Ok(None),
        }
    }

    /// The reply to `line` (a RADR, sent now or read if sent ahead): where
    /// the session connects and its token, or `None` if the server does
    /// not know the extension.
    pub(super) fn radr_reply(&mut self, line: &str) -> Result<Option<RadrTarget>, String> {
        let (c, t) = self.cmd(line)?;
        if crate::reply::FALLBACK_CODES.contains(&c) {
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
        Ok(Some(RadrTarget {
            addr,
            token: reply.token,
            mode: reply.mode,
        }))
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

    /// QUIT (best effort). rftpd's 221 is not waited for (a round trip
    /// that tells nothing: the client is done either way).
    pub fn quit(mut self) {
        if self.pipelining {
            let _ = self.out.write_all(b"QUIT\r\n");
            let _ = self.out.shutdown(Shutdown::Write);
            return;
        }
        let _ = self.cmd("QUIT");
    }
}

/// Where a RADR reply says the transfer session connects.
#[derive(Debug, Clone, Copy)]
pub(super) struct RadrTarget {
    addr: SocketAddr,
    token: u64,
    mode: rdma_xfer::Mode,
}

/// Connect the transfer session a RADR reply named, with `o`'s streams,
/// block size and depth (what the RADR line asked for).
pub(super) fn radr_connect(
    to: RadrTarget,
    o: &Options,
    autotune: bool,
) -> Result<Box<dyn Transport>, String> {
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
    let mut x = rdma_xfer::connect(to.addr, to.mode, to.token, cfg).map_err(err)?;
    x.set_progress(o.progress.clone());
    Ok(x)
}

/// What the control connection says once a transfer's data path (the
/// RDMA or TCP-mode session, or a plain data connection) has failed: see
/// [`Ftp::after_data_loss`].
#[derive(Debug)]
pub(super) enum AfterLoss {
    /// The server's reply (its account of the transfer, e.g. 426).
    Reply(Reply),
    /// The control connection itself broke (reset, closed, unusable).
    Broken(io::Error),
    /// No reply within the timeout: the control connection is quiet.
    Silent(io::Error),
}

impl AfterLoss {
    /// `Broken`'s cause, worded to name the control connection.
    pub(super) fn broken(e: &io::Error) -> String {
        let s = e.to_string();
        if s.contains("control connection") {
            s
        } else {
            format!("the control connection broke: {s}")
        }
    }
}

impl Ftp {
    /// The transfer's data path failed: read the server's reply on the
    /// control connection, bounded by the timeout like every reply. A
    /// transfer session's loss is often the control connection's, seen
    /// first: rftpd ends a client's transfer session with its control
    /// connection, and a client blocked on the session learns of that
    /// before it reads the control connection (under load, the order
    /// varies from run to run). A blocking read, not a peek, because the
    /// reset or close of the control connection may reach this socket
    /// after the session's end did (the relay or the server closes one,
    /// then the other): waiting for the reply (or the end) tells which
    /// one broke without guessing at timing, and a working control
    /// connection answers at once (rftpd's 426).
    pub(super) fn after_data_loss(&mut self) -> AfterLoss {
        match self.read_reply() {
            Ok(r) => AfterLoss::Reply(r),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => AfterLoss::Silent(e),
            Err(e) => AfterLoss::Broken(e),
        }
    }
}

/// The RADR command line for the session `o` asks for.
pub(super) fn radr_line(o: &Options) -> String {
    format!(
        "RADR STREAMS={} BS={} DEPTH={} MODE={}",
        o.streams,
        o.block_size,
        o.effective_iodepth(),
        o.xfer_mode
    )
}

/// The final reply of a transfer or listing: Ok for 2xx, else an error
/// naming `what` and the reply.
pub(super) fn final_reply(f: &mut Ftp, what: &str) -> Result<(), String> {
    let (c, t) = f
        .read_reply()
        .map_err(|e| format!("{what}: reading the final reply on the control connection: {e}"))?;
    if (200..300).contains(&c) {
        Ok(())
    } else {
        Err(format!("{what}: server replied {c} {t}"))
    }
}
