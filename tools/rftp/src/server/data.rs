//! The plain FTP data path: PASV/EPSV and PORT/EPRT (RFC 959, RFC 2428),
//! listings (LIST, NLST, MLSD), RETR and STOR (uploads go to a temporary
//! name, renamed when complete).

use std::fs;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::served::FileId;
use super::session::{io_reply, r, DataMode, Reply, Session};
use crate::checksum::{HashRead, HashWrite, Running};
use crate::cmdline;
use crate::confine::Entry;
use crate::reply::same_host;
use crate::util;

impl Session {
    pub(super) fn pasv(&mut self, extended: bool) -> Reply {
        let ip = self.local.ip();
        let l = match TcpListener::bind(SocketAddr::new(ip, 0)) {
            Ok(l) => l,
            Err(e) => return r(425, format!("Cannot open a data port: {e}")),
        };
        let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
        self.data = DataMode::Passive(l);
        if extended {
            r(229, format!("Entering Extended Passive Mode (|||{port}|)"))
        } else {
            // An IPv4 client of a dual-stack listener: its IPv4 address.
            match ip.to_canonical() {
                IpAddr::V4(v4) => {
                    let o = v4.octets();
                    r(
                        227,
                        format!(
                            "Entering Passive Mode ({},{},{},{},{},{})",
                            o[0],
                            o[1],
                            o[2],
                            o[3],
                            port >> 8,
                            port & 255
                        ),
                    )
                }
                IpAddr::V6(_) => r(522, "Use EPSV on IPv6."),
            }
        }
    }

    pub(super) fn port(&mut self, arg: &str, extended: bool) -> Reply {
        let parsed = if extended {
            cmdline::parse_eprt(arg)
        } else {
            cmdline::parse_port(arg)
        };
        let addr = match parsed {
            Ok(a) => a,
            Err(e) => return e,
        };
        // No FTP bounce (RFC 2577 §3): data goes to the client only,
        // compared canonically (EPRT |1|a.b.c.d| from a client that a
        // dual-stack listener sees as ::ffff:a.b.c.d is that client).
        if !same_host(addr.ip(), self.peer.ip()) || addr.port() < 1024 {
            return r(
                504,
                "PORT/EPRT must name your own address and a port >= 1024.",
            );
        }
        self.data = DataMode::Active(addr);
        r(200, "PORT command successful.")
    }

    pub(super) fn open_data(&mut self) -> Result<TcpStream, Reply> {
        let t = Duration::from_secs(self.srv.cfg.data_timeout_secs.max(1));
        let s = match std::mem::replace(&mut self.data, DataMode::None) {
            DataMode::None => return Err(r(425, "Use PASV, EPSV, PORT or EPRT first.")),
            DataMode::Active(a) => TcpStream::connect_timeout(&a, t)
                .map_err(|e| r(425, format!("Cannot open data connection: {e}")))?,
            DataMode::Passive(l) => {
                l.set_nonblocking(true).map_err(|e| r(425, e.to_string()))?;
                let start = Instant::now();
                loop {
                    match l.accept() {
                        Ok((s, a)) if same_host(a.ip(), self.peer.ip()) => break s,
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if start.elapsed() > t {
                                return Err(r(425, "No data connection arrived in time."));
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(r(425, format!("Data connection failed: {e}"))),
                    }
                }
            }
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(t));
        let _ = s.set_write_timeout(Some(t));
        Ok(s)
    }

    pub(super) fn listing(&mut self, verb: &str, arg: &str) -> io::Result<Option<Reply>> {
        // Options like "-la" (sent by some clients) are ignored.
        let target = arg
            .split_whitespace()
            .filter(|a| !a.starts_with('-'))
            .collect::<Vec<_>>()
            .join(" ");
        let (_, p) = match self.path(if target.is_empty() { "." } else { &target }) {
            Ok(x) => x,
            Err(e) => return Ok(Some(e)),
        };
        let mut lines = Vec::new();
        // The directory is looked up beneath the root; its entries are
        // listed as they are (a symlink as a symlink, never followed).
        let found = match self.find(&p) {
            Ok(f) => f,
            Err(e) => return Ok(Some(io_reply(&e, &target))),
        };
        match fs::metadata(found.path()) {
            Ok(m) if m.is_dir() => {
                let mut names: Vec<_> = match fs::read_dir(found.path()) {
                    Ok(rd) => rd.filter_map(Result::ok).collect(),
                    Err(e) => return Ok(Some(io_reply(&e, &target))),
                };
                names.sort_by_key(|e| e.file_name());
                for e in names {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let Ok(md) = e.metadata() else { continue };
                    lines.push(match verb {
                        "NLST" => name,
                        "MLSD" => util::mlsd_line(&name, &md),
                        _ => util::list_line(&name, &md),
                    });
                }
            }
            Ok(m) if verb != "MLSD" => {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                lines.push(if verb == "NLST" {
                    target.clone()
                } else {
                    util::list_line(&name, &m)
                });
            }
            Ok(_) => return Ok(Some(r(501, "MLSD needs a directory."))),
            Err(e) => return Ok(Some(io_reply(&e, &target))),
        }
        let mut data = match self.open_data() {
            Ok(d) => d,
            Err(e) => return Ok(Some(e)),
        };
        self.reply(&r(150, "Here comes the listing."))?;
        let mut text = lines.join("\r\n");
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        Ok(Some(match data.write_all(text.as_bytes()) {
            Ok(()) => r(226, "Listing sent."),
            Err(e) => r(426, format!("Listing aborted: {e}")),
        }))
    }

    pub(super) fn retr(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        let (_, p) = match self.path(arg) {
            Ok(x) => x,
            Err(e) => return Ok(Some(e)),
        };
        let offset = self.rest;
        let found = match self.find(&p) {
            Ok(f) => f,
            Err(e) => return Ok(Some(io_reply(&e, arg))),
        };
        let mut f = match fs::metadata(found.path()) {
            Ok(m) if m.is_file() => match fs::File::open(found.path()) {
                Ok(f) => f,
                Err(e) => return Ok(Some(io_reply(&e, arg))),
            },
            Ok(_) => return Ok(Some(r(550, format!("{arg}: not a plain file.")))),
            Err(e) => return Ok(Some(io_reply(&e, arg))),
        };
        if offset > 0 {
            use std::io::Seek;
            if let Err(e) = f.seek(io::SeekFrom::Start(offset)) {
                return Ok(Some(io_reply(&e, arg)));
            }
        }
        let mut data = match self.open_data() {
            Ok(d) => d,
            Err(e) => return Ok(Some(e)),
        };
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        let before = FileId::of(&p);
        self.reply(&r(
            150,
            format!(
                "Opening BINARY data connection for {arg} ({} bytes).",
                size.saturating_sub(offset)
            ),
        ))?;
        // A whole file is hashed as it is sent, for a HASH that follows.
        let mut src = HashRead {
            inner: f,
            run: self.hash_during.then(|| Running::new(self.hash_algo)),
        };
        let res = io::copy(&mut src, &mut data);
        let _ = data.shutdown(Shutdown::Write);
        Ok(Some(match res {
            Ok(n) => {
                tracing::info!(peer = %self.peer, file = %arg, bytes = n, offset, "RETR done");
                if offset == 0 {
                    self.record_digest(&p, src.run, before);
                }
                r(226, "Transfer complete.")
            }
            Err(e) => r(426, format!("Transfer aborted: {e}")),
        }))
    }

    /// A temporary name beside `target`, for uploads.
    pub(super) fn temp_for(target: &Path) -> PathBuf {
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        target.with_file_name(format!(
            ".{name}.rftp-part-{:08x}",
            rdma_xfer::random_u64() as u32
        ))
    }

    pub(super) fn stor(&mut self, arg: &str) -> io::Result<Option<Reply>> {
        let (_, p) = match self.need_write().map_or_else(|| self.path(arg), Err) {
            Ok(x) => x,
            Err(e) => return Ok(Some(e)),
        };
        if self.find(&p).is_ok_and(|f| f.path().is_dir()) {
            return Ok(Some(r(550, format!("{arg}: is a directory."))));
        }
        let offset = self.rest;
        let (target, tmp, mut f) = match self.create_temp(&p) {
            Ok(x) => x,
            Err(e) => return Ok(Some(io_reply(&e, arg))),
        };
        if let Err(e) = self.continue_upload(&p, &mut f, offset) {
            let _ = fs::remove_file(tmp.path());
            return Ok(Some(io_reply(&e, arg)));
        }
        let mut data = match self.open_data() {
            Ok(d) => d,
            Err(e) => {
                let _ = fs::remove_file(tmp.path());
                return Ok(Some(e));
            }
        };
        self.reply(&r(150, format!("Ready to receive {arg}.")))?;
        let mut dst = HashWrite {
            inner: f,
            run: self.hash_during.then(|| Running::new(self.hash_algo)),
            journal: None,
        };
        let res = copy_in(&mut data, &mut dst)
            .and_then(|n| dst.inner.sync_data().map(|_| n).map_err(CopyErr::Write));
        let HashWrite { inner: f, run, .. } = dst;
        drop(f);
        Ok(Some(match res {
            Ok(n) => match fs::rename(tmp.path(), target.path()) {
                Ok(()) => {
                    tracing::info!(peer = %self.peer, file = %arg, bytes = n, "STOR done");
                    if offset == 0 {
                        self.record_digest(&p, run, None);
                    }
                    r(226, "Transfer complete.")
                }
                Err(e) => {
                    let _ = fs::remove_file(tmp.path());
                    io_reply(&e, arg)
                }
            },
            Err(CopyErr::Read(e)) => {
                let what = self.end_cut_upload(&tmp, &target, arg);
                // The data connection's read timeout shows as EAGAIN.
                let why = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                        "no data on the data connection for {} s (data_timeout_secs)",
                        self.srv.cfg.data_timeout_secs.max(1)
                    ),
                    _ => e.to_string(),
                };
                r(426, format!("Connection lost; {what}: {why}"))
            }
            Err(CopyErr::Write(e)) => {
                let _ = fs::remove_file(tmp.path());
                io_reply(&e, arg)
            }
        }))
    }

    /// Resume an upload at `offset` (REST, RFC 3659 §5): the first
    /// `offset` bytes of the existing file `p` are copied into the new
    /// temporary file `f` (through its own handle, never by name), and `f`
    /// is positioned at `offset`. Nothing to do at 0.
    pub(super) fn continue_upload(
        &self,
        p: &Path,
        f: &mut fs::File,
        offset: u64,
    ) -> io::Result<()> {
        if offset == 0 {
            return Ok(());
        }
        let mut src = fs::File::open(self.find(p)?.path())?;
        let copied = io::copy(&mut (&mut src).take(offset), f)?;
        if copied < offset {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("REST {offset} is past the end of the file ({copied} bytes)"),
            ));
        }
        f.set_len(offset)?;
        use std::io::Seek;
        f.seek(io::SeekFrom::Start(offset))?;
        Ok(())
    }

    /// An upload was cut off: with `OPTS UPLOAD KEEP ON` what arrived in
    /// order becomes the target (so `SIZE` and `HASH` tell the client what
    /// to resume from), otherwise the temporary file goes. Returns what
    /// happened, for the 426 reply.
    pub(super) fn end_cut_upload(&self, tmp: &Entry, target: &Entry, arg: &str) -> String {
        if self.keep_partial {
            let kept = fs::metadata(tmp.path()).map(|m| m.len()).unwrap_or(0);
            match fs::rename(tmp.path(), target.path()) {
                Ok(()) => {
                    tracing::info!(peer = %self.peer, file = %arg, kept, "upload cut off; kept for a resume");
                    return format!(
                        "the {kept} bytes received are kept as {arg} for a resume (REST {kept})"
                    );
                }
                Err(e) => {
                    tracing::warn!(peer = %self.peer, file = %arg, %e, "keeping a cut-off upload failed")
                }
            }
        }
        let _ = fs::remove_file(tmp.path());
        "upload discarded".to_string()
    }

    /// The upload's temporary file beside `target`, created exclusively
    /// and without following a symlink, both names looked up beneath the
    /// root: (target's entry, temp's entry, the open file).
    pub(super) fn create_temp(&self, target: &Path) -> io::Result<(Entry, Entry, fs::File)> {
        use std::os::unix::fs::OpenOptionsExt;
        let t = self.entry(target)?;
        let tmp = self.entry(&Self::temp_for(target))?;
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp.path())?;
        Ok((t, tmp, f))
    }
}

pub(super) enum CopyErr {
    Read(io::Error),
    Write(io::Error),
}

pub(super) fn copy_in(src: &mut impl Read, dst: &mut impl Write) -> Result<u64, CopyErr> {
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    loop {
        let k = match src.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyErr::Read(e)),
        };
        dst.write_all(&buf[..k]).map_err(CopyErr::Write)?;
        n += k as u64;
    }
}
