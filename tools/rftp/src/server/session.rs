//! One control connection: its state, reading command lines (with the
//! login deadline and the pre-login byte limit), the command loop, closing
//! with a reply, and the path helpers every command uses.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::PRE_LOGIN_MAX_BYTES;
use super::served::Served;
use super::state::{MemReservation, Server};
use crate::checksum::Algo;
use crate::cmdline::{self, MAX_LINE};
use crate::confine::{Entry, Found};
use crate::util::resolve;

/// What the control connection brought.
pub(super) enum Input {
    /// A command line, or the reply for a line that cannot be one.
    Line(Result<String, Reply>),
    /// End of stream.
    Eof,
    /// The login deadline passed before a line was complete.
    LoginDeadline,
    /// More than [`PRE_LOGIN_MAX_BYTES`] before login.
    LoginBytes,
}

pub(super) enum DataMode {
    None,
    Passive(TcpListener),
    Active(SocketAddr),
}

pub(super) struct Session {
    pub(super) srv: Arc<Server>,
    pub(super) ctrl: BufReader<TcpStream>,
    pub(super) out: TcpStream,
    /// The client's address (IPv4-mapped addresses as IPv4).
    pub(super) peer: SocketAddr,
    pub(super) local: SocketAddr,
    /// The login deadline (`login_timeout_secs` after connect).
    pub(super) login_by: Instant,
    /// Bytes received before login ([`PRE_LOGIN_MAX_BYTES`]).
    pub(super) pre_login_bytes: usize,
    pub(super) user: Option<String>,
    pub(super) pending_user: Option<String>,
    pub(super) writable: bool,
    pub(super) cwd: String,
    pub(super) rest: u64,
    pub(super) rnfr: Option<PathBuf>,
    pub(super) data: DataMode,
    /// The transfer session and the memory it reserved (dropped together).
    pub(super) xfer: Option<Box<dyn rdma_xfer::Transport>>,
    pub(super) xfer_mem: Option<MemReservation>,
    pub(super) mem: bool,
    /// `OPTS UPLOAD KEEP ON`: an upload cut off keeps what arrived in
    /// order under its target name (for a resume with REST), instead of
    /// discarding it.
    pub(super) keep_partial: bool,
    /// The checksum `HASH` uses (`OPTS HASH`).
    pub(super) hash_algo: Algo,
    /// The client asked for `OPTS HASH`: it will verify, so transfers
    /// compute the running digest (clients that never do pay nothing).
    pub(super) hash_during: bool,
    /// Digests of whole files this session just sent or received, so that
    /// `HASH` right after a transfer costs nothing.
    pub(super) served: Vec<Served>,
}

/// A command's reply.
pub(super) type Reply = (u32, String);

pub(super) fn r(code: u32, text: impl Into<String>) -> Reply {
    (code, text.into())
}

/// The FTP reply for a file-system error.
pub(super) fn io_reply(e: &io::Error, what: &str) -> Reply {
    let code = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => 552,
        _ => match e.kind() {
            io::ErrorKind::NotFound => 550,
            io::ErrorKind::PermissionDenied => 550,
            _ => 451,
        },
    };
    r(code, format!("{what}: {e}"))
}

impl Session {
    pub(super) fn new(
        srv: Arc<Server>,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> io::Result<Session> {
        let idle = Duration::from_secs(srv.cfg.idle_timeout_secs.max(1));
        stream.set_read_timeout(Some(idle))?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr()?;
        let login_by = Instant::now() + Duration::from_secs(srv.cfg.login_timeout_secs.max(1));
        let srv_hashes = srv.hashes.clone();
        Ok(Session {
            srv,
            out: stream.try_clone()?,
            ctrl: BufReader::new(stream),
            peer,
            local,
            login_by,
            pre_login_bytes: 0,
            user: None,
            pending_user: None,
            writable: false,
            cwd: "/".into(),
            rest: 0,
            rnfr: None,
            data: DataMode::None,
            xfer: None,
            xfer_mem: None,
            mem: false,
            keep_partial: false,
            // SHA-256 for a client that sends HASH without OPTS HASH, as
            // before the negotiation, when it is offered.
            hash_algo: if srv_hashes.contains(&Algo::Sha256) {
                Algo::Sha256
            } else {
                srv_hashes[0]
            },
            hash_during: false,
            served: Vec::new(),
        })
    }

    pub(super) fn reply(&mut self, (code, text): &Reply) -> io::Result<()> {
        let s = crate::reply::emit_reply(*code, text);
        tracing::debug!(peer = %self.peer, reply = %s.trim_end(), "reply");
        self.out.write_all(s.as_bytes())
    }

    /// One command line. Over-long or non-UTF-8 lines become
    /// `Input::Line(Err(reply))`. Before login, the login deadline and
    /// [`PRE_LOGIN_MAX_BYTES`] hold for the whole line, not per read: a
    /// client that sends a byte now and then without ending its line is
    /// cut off at the deadline all the same (every read waits at most until
    /// it).
    pub(super) fn read_command(&mut self) -> io::Result<Input> {
        let idle = Duration::from_secs(self.srv.cfg.idle_timeout_secs.max(1));
        let mut buf = Vec::new();
        // Bytes of an over-long line dropped (up to its end, at most 1 MiB).
        let mut dropped = 0usize;
        loop {
            let before_login = self.user.is_none();
            if before_login {
                let left = self.login_by.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Input::LoginDeadline);
                }
                self.ctrl.get_ref().set_read_timeout(Some(left.min(idle)))?;
            }
            let avail = match self.ctrl.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if before_login
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        )
                        && Instant::now() >= self.login_by =>
                {
                    return Ok(Input::LoginDeadline)
                }
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                return Ok(Input::Eof);
            }
            let nl = avail.iter().position(|&b| b == b'\n');
            let take = nl.map_or(avail.len(), |i| i + 1);
            let keep = take.min((MAX_LINE + 1).saturating_sub(buf.len()));
            buf.extend_from_slice(&avail[..keep]);
            dropped += take - keep;
            self.ctrl.consume(take);
            if before_login {
                self.pre_login_bytes += take;
                if self.pre_login_bytes > PRE_LOGIN_MAX_BYTES {
                    return Ok(Input::LoginBytes);
                }
            }
            if nl.is_some() {
                if dropped > 0 {
                    return Ok(Input::Line(Err(r(500, "Command line too long."))));
                }
                return Ok(Input::Line(cmdline::decode_line(buf)));
            }
            if dropped > 1 << 20 {
                // A megabyte without a line end: not an FTP client.
                return Ok(Input::Eof);
            }
        }
    }

    pub(super) fn run(&mut self) -> io::Result<()> {
        let rdma = if self.srv.cfg.rdma {
            " (RDMA extension: RADR RSTR RRTR)"
        } else {
            ""
        };
        self.reply(&r(220, format!("rftpd ready{rdma}")))?;
        let idle = Duration::from_secs(self.srv.cfg.idle_timeout_secs.max(1));
        let login_limit = Duration::from_secs(self.srv.cfg.login_timeout_secs.max(1));
        let write_limit = Duration::from_secs(30);
        let mut logged_in = false;
        loop {
            // Before login every read and write is bounded by the login
            // deadline (read_command checks it before each read), so a
            // connection that never logs in, sends NOOP forever or dribbles
            // a line does not hold a connection slot for the idle timeout.
            if self.user.is_none() {
                let left = self.login_by.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return self.login_timed_out(login_limit);
                }
                self.out.set_write_timeout(Some(left.min(write_limit)))?;
            } else if !logged_in {
                logged_in = true;
                self.ctrl.get_ref().set_read_timeout(Some(idle))?;
                self.out.set_write_timeout(Some(write_limit))?;
            }
            let line = match self.read_command()? {
                Input::Eof => return Ok(()),
                Input::LoginDeadline => return self.login_timed_out(login_limit),
                Input::LoginBytes => return self.login_too_long(),
                Input::Line(Err(reply)) => {
                    self.reply(&reply)?;
                    continue;
                }
                Input::Line(Ok(l)) => l,
            };
            let (verb, arg) = cmdline::split_command(&line);
            if verb == "PASS" {
                tracing::debug!(peer = %self.peer, "command PASS ****");
            } else {
                tracing::debug!(peer = %self.peer, command = %line, "command");
            }
            if verb == "QUIT" {
                self.reply(&r(221, "Goodbye."))?;
                return Ok(());
            }
            let reply = self.dispatch(&verb, &arg)?;
            if let Some(rep) = reply {
                self.reply(&rep)?;
                if rep.0 == 421 {
                    let _ = self.out.shutdown(Shutdown::Both);
                    return Ok(());
                }
            }
            // RFC 959 §4.1.3: REST is followed by the transfer command;
            // like common servers, allow the data-connection setup and
            // TYPE in between (clients open the data connection first or
            // last).
            if !matches!(
                verb.as_str(),
                "REST" | "PASV" | "EPSV" | "PORT" | "EPRT" | "TYPE"
            ) {
                self.rest = 0;
            }
            if verb != "RNFR" {
                self.rnfr = None;
            }
        }
    }

    /// 421 and close: the connection sent too much without logging in.
    pub(super) fn login_too_long(&mut self) -> io::Result<()> {
        tracing::info!(peer = %self.peer, bytes = self.pre_login_bytes, "too many bytes before login; closing");
        self.close_with(&r(
            421,
            format!(
                "Sent more than {PRE_LOGIN_MAX_BYTES} bytes without logging in; closing. \
                 Reconnect and send USER and PASS."
            ),
        ));
        Ok(())
    }

    /// 421 and close: the connection did not log in in time.
    pub(super) fn login_timed_out(&mut self, limit: Duration) -> io::Result<()> {
        tracing::info!(peer = %self.peer, secs = limit.as_secs(), "no login in time; closing");
        self.close_with(&r(
            421,
            format!(
                "No login within {} s (login_timeout_secs); closing. Reconnect and send USER and PASS.",
                limit.as_secs()
            ),
        ));
        Ok(())
    }

    /// Send `reply` and close so that the client can read it: the write
    /// side is shut (FIN after the reply), then what the client still sends
    /// is read and dropped for a moment (at most 1 s and 64 KiB), since
    /// closing with unread input would reset the connection and the reset
    /// can discard the reply before the client reads it (RFC 1122
    /// §4.2.2.13).
    pub(super) fn close_with(&mut self, reply: &Reply) {
        let _ = self.out.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = self.reply(reply);
        let _ = self.out.shutdown(Shutdown::Write);
        let until = Instant::now() + Duration::from_secs(1);
        let mut drained = 0usize;
        let mut sink = [0u8; 8192];
        while drained < 64 << 10 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.ctrl.get_ref().set_read_timeout(Some(left)).is_err() {
                break;
            }
            match self.ctrl.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        let _ = self.out.shutdown(Shutdown::Both);
    }

    /// The account whose share of the session memory budget this
    /// connection's sessions count against: the user name, or one account
    /// for all anonymous logins.
    pub(super) fn mem_account(&self) -> String {
        match self.user.as_deref() {
            Some("anonymous" | "ftp") if !self.writable => "anonymous".into(),
            Some(u) => u.to_string(),
            None => String::new(),
        }
    }

    pub(super) fn need_login(&self) -> Option<Reply> {
        self.user
            .is_none()
            .then(|| r(530, "Please log in with USER and PASS."))
    }

    pub(super) fn need_write(&self) -> Option<Reply> {
        self.need_login()
            .or_else(|| (!self.writable).then(|| r(550, "Permission denied: read-only access.")))
    }

    pub(super) fn path(&self, arg: &str) -> Result<(String, PathBuf), Reply> {
        if arg.is_empty() {
            return Err(r(501, "Missing path argument."));
        }
        resolve(&self.srv.root, &self.cwd, arg).map_err(|e| r(550, format!("{arg}: {e}.")))
    }

    /// The object at `real` (a path from [`Session::path`]), looked up by
    /// the kernel beneath the root at this moment (see [`confine`]).
    pub(super) fn find(&self, real: &Path) -> io::Result<Found> {
        self.srv.confined.find(self.rel(real)?)
    }

    /// The name `real` inside its parent directory, looked up beneath the
    /// root (for create, rename, delete, mkdir).
    pub(super) fn entry(&self, real: &Path) -> io::Result<Entry> {
        self.srv.confined.entry(self.rel(real)?)
    }

    pub(super) fn rel<'a>(&self, real: &'a Path) -> io::Result<&'a Path> {
        real.strip_prefix(&self.srv.root)
            .map_err(|_| io::Error::new(io::ErrorKind::PermissionDenied, "outside the root"))
    }
}
