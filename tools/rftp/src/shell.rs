//! The interactive mode of `rftp`, in the manner of ftp(1): a prompt that
//! reads one command per line from stdin. It works the same when stdin is
//! not a terminal, so it can be scripted:
//!
//! ```text
//! printf 'ls\nrget big.bin\nquit\n' | rftp ftp://alice:secret@127.0.0.1:2121/
//! ```
//!
//! A failed command prints `rftp: CMD: cause` on stderr and the session
//! goes on; the exit status is 1 if any command failed. `get`/`put` use a
//! plain FTP data connection, `rget`/`rput` the RDMA extension (falling
//! back to plain FTP when the server lacks it); the RDMA session is kept
//! across transfers until `streams`/`blocksize`/`iodepth` change.

use std::io::{self, BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use crate::cli;
use crate::client::{self, Ftp, Options, Url, XferSlot};
use crate::util::parse_size;

/// One open control connection.
struct Conn {
    f: Ftp,
    slot: XferSlot,
    host: String,
    port: u16,
    user: Option<String>,
}

/// The interpreter's state.
pub struct Shell {
    o: Options,
    quiet: bool,
    conn: Option<Conn>,
    /// Memory-to-memory size for rget/rput (`mem SIZE`).
    mem: Option<u64>,
    failed: bool,
    interactive: bool,
}

const HELP: &str = "\
Commands (arguments with spaces go in double quotes):
  open HOST [PORT [USER [PASSWORD]]] | open ftp://[user[:pass]@]host[:port]/
  user NAME [PASSWORD]    log in (reads the password from the next line if omitted)
  close                   close the connection
  ls|dir [PATH]           long listing (LIST)      nlist|nls [PATH]  names (NLST)
  cd PATH | cdup | pwd    remote directory         lcd [DIR]  local directory
  get REMOTE [LOCAL]      download over a plain FTP data connection
  put LOCAL [REMOTE]      upload over a plain FTP data connection
  rget REMOTE [LOCAL]     download over RDMA (RADR/RRTR; plain FTP if unsupported)
  rput LOCAL [REMOTE]     upload over RDMA (RADR/RSTR; plain FTP if unsupported)
  mget PATTERN...         get every file NLST lists that matches (* and ?)
  rmget PATTERN...        the same over RDMA
  del|delete|rm PATH      mkdir PATH   rmdir PATH   rename FROM TO
  size PATH               hash PATH (server's SHA-256)
  streams N | blocksize SIZE | iodepth N   RDMA session parameters
  mem SIZE|off            rget/rput move SIZE bytes memory to memory
  verify on|off           checksum check (HASH) after each transfer (default on)
  resume on|off           REST-resume an existing LOCAL.part (default on)
  binary                  TYPE I (transfers are always binary)
  passive                 passive mode is always on (EPSV, then PASV)
  quote LINE              send LINE as a raw command
  status                  connection and transfer settings
  help|?                  this text
  quit|bye|exit           leave";

/// Split a command line into words; double quotes group, `\"` escapes.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => match chars.next() {
                Some(n) => cur.push(n),
                None => return Err("line ends in a backslash".into()),
            },
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("unterminated double quote".into());
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Shell-style match of `name` against `pat` (`*` any run, `?` one char).
pub fn glob_match(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

fn base_name(path: &str) -> Result<PathBuf, String> {
    Path::new(path)
        .file_name()
        .map(PathBuf::from)
        .ok_or_else(|| format!("{path}: names no file; give a local name"))
}

fn on_off(v: Option<&String>) -> Result<bool, String> {
    match v.map(|s| s.to_ascii_lowercase()).as_deref() {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        _ => Err("expected on or off".into()),
    }
}

/// Read a password from `input`, without echo when it is a terminal.
fn read_password(input: &mut dyn BufRead, interactive: bool) -> Result<String, String> {
    let mut line = String::new();
    if interactive {
        eprint!("Password: ");
        let _ = io::stderr().flush();
        let fd = libc::STDIN_FILENO;
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd 0 and a valid pointer to a termios.
        let saved = (unsafe { libc::tcgetattr(fd, &mut t) } == 0).then_some(t);
        if let Some(mut quiet) = saved {
            quiet.c_lflag &= !libc::ECHO;
            // SAFETY: a valid termios obtained from tcgetattr.
            unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
        }
        let r = input.read_line(&mut line);
        if let Some(t) = saved {
            // SAFETY: restores the settings read above.
            unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) };
        }
        eprintln!();
        r.map_err(|e| format!("reading the password: {e}"))?;
    } else {
        input
            .read_line(&mut line)
            .map_err(|e| format!("reading the password: {e}"))?;
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

impl Shell {
    /// A shell with transfer options `o`; `quiet` hides progress bars.
    pub fn new(o: Options, quiet: bool) -> Shell {
        Shell {
            mem: o.mem,
            o,
            quiet,
            conn: None,
            failed: false,
            interactive: io::stdin().is_terminal(),
        }
    }

    /// Connect (and log in if `url` names a user or is anonymous by
    /// default), as `rftp ftp://...` does before the first prompt.
    pub fn open_url(&mut self, url: &Url) -> Result<(), String> {
        self.open(&url.host, url.port)?;
        self.login(&url.user, Some(url.password.clone()), &mut io::empty())?;
        if url.path != "/" && !url.path.is_empty() {
            self.with_conn(|c| c.f.expect(&format!("CWD {}", url.path), |c| c == 250))?;
        }
        Ok(())
    }

    fn open(&mut self, host: &str, port: u16) -> Result<(), String> {
        if let Some(c) = self.conn.take() {
            c.f.quit();
        }
        let mut f = Ftp::connect(host, port, self.o.timeout)?;
        f.set_allow_foreign_data_addr(self.o.allow_foreign_data_addr);
        println!("Connected to {host} port {port}.");
        self.conn = Some(Conn {
            f,
            slot: XferSlot::default(),
            host: host.to_string(),
            port,
            user: None,
        });
        Ok(())
    }

    fn login(
        &mut self,
        user: &str,
        password: Option<String>,
        input: &mut dyn BufRead,
    ) -> Result<(), String> {
        let interactive = self.interactive;
        let c = self.conn.as_mut().ok_or("not connected; use open first")?;
        let (code, reply) = c.f.cmd(&format!("USER {user}"))?;
        match code {
            230 => {}
            331 | 332 => {
                let pw = match password {
                    Some(p) => p,
                    None => read_password(input, interactive)?,
                };
                let (code, text) = c.f.cmd(&format!("PASS {pw}"))?;
                if code != 230 && code != 202 {
                    return Err(format!("login failed: {code} {text}"));
                }
            }
            _ => return Err(format!("login failed: {code} {reply}")),
        }
        c.f.expect("TYPE I", |c| c == 200)?;
        c.user = Some(user.to_string());
        println!("Logged in as {user}.");
        Ok(())
    }

    fn with_conn<T>(
        &mut self,
        op: impl FnOnce(&mut Conn) -> Result<T, String>,
    ) -> Result<T, String> {
        let c = self
            .conn
            .as_mut()
            .ok_or("not connected; use open HOST [PORT]")?;
        let r = op(c);
        if r.is_err() {
            // A dead control connection makes every later command fail
            // the same way: notice it once and say so.
            if c.f.cmd("NOOP").is_err() {
                self.conn = None;
                return r.map_err(|e| {
                    format!("{e}\nrftp: the control connection is gone; use open to reconnect")
                });
            }
        }
        r
    }

    fn transfer_opts(&mut self, rdma: bool) -> (Options, Option<indicatif::ProgressBar>) {
        let mut o = self.o.clone();
        o.tcp = !rdma;
        o.mem = if rdma { self.mem } else { None };
        let pb = cli::progress_bar(self.quiet, o.mem);
        if let Some(pb) = &pb {
            cli::attach(&mut o, pb);
        }
        (o, pb)
    }

    fn get(&mut self, rdma: bool, remote: &str, local: Option<&str>) -> Result<(), String> {
        let (o, pb) = self.transfer_opts(rdma);
        let out = match (local, o.mem) {
            (Some(l), _) => PathBuf::from(l),
            (None, Some(_)) => PathBuf::from("/dev/null"),
            (None, None) => base_name(remote)?,
        };
        let r = self.with_conn(|c| client::get_with(&mut c.f, &mut c.slot, remote, &out, &o));
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        let s = r?;
        let what = if o.mem.is_some() {
            format!("{remote} (memory to memory)")
        } else {
            format!("{remote} -> {}", out.display())
        };
        println!("{}", cli::summary_text(&what, &s));
        Ok(())
    }

    fn put(&mut self, rdma: bool, local: &str, remote: Option<&str>) -> Result<(), String> {
        let (o, pb) = self.transfer_opts(rdma);
        let remote = match remote {
            Some(r) => r.to_string(),
            None => base_name(local)?.to_string_lossy().into_owned(),
        };
        let file = if o.mem.is_some() {
            None
        } else {
            Some(Path::new(local))
        };
        let r = self.with_conn(|c| client::put_with(&mut c.f, &mut c.slot, file, &remote, &o));
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        let s = r?;
        let what = if o.mem.is_some() {
            format!("zeros -> {remote} (memory to memory)")
        } else {
            format!("{local} -> {remote}")
        };
        println!("{}", cli::summary_text(&what, &s));
        Ok(())
    }

    fn mget(&mut self, rdma: bool, patterns: &[String]) -> Result<(), String> {
        if patterns.is_empty() {
            return Err("usage: mget PATTERN...".into());
        }
        let mut errors = Vec::new();
        let mut n = 0;
        for pat in patterns {
            let (dir, fpat) = match pat.rsplit_once('/') {
                Some((d, f)) => (Some(if d.is_empty() { "/" } else { d }), f),
                None => (None, pat.as_str()),
            };
            let names = self.with_conn(|c| c.f.listing("NLST", dir))?;
            for name in names.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let base = name.rsplit('/').next().unwrap_or(name);
                if !glob_match(fpat, base) {
                    continue;
                }
                let remote = match dir {
                    Some(d) if !name.contains('/') => format!("{}/{base}", d.trim_end_matches('/')),
                    _ => name.to_string(),
                };
                n += 1;
                if let Err(e) = self.get(rdma, &remote, Some(base)) {
                    eprintln!("rftp: mget {remote}: {e}");
                    errors.push(remote);
                }
            }
        }
        if n == 0 {
            return Err(format!("no remote file matches {}", patterns.join(" ")));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{} of {n} files failed", errors.len()))
        }
    }

    fn status(&self) {
        match &self.conn {
            Some(c) => println!(
                "Connected to {} port {}{}.",
                c.host,
                c.port,
                c.user
                    .as_ref()
                    .map(|u| format!(" as {u}"))
                    .unwrap_or_else(|| ", not logged in".into())
            ),
            None => println!("Not connected."),
        }
        println!(
            "streams {}, blocksize {}, iodepth {}{}, verify {}, resume {}, mem {}",
            if self.o.streams == 0 {
                "auto".to_string()
            } else {
                self.o.streams.to_string()
            },
            self.o.block_size,
            self.o.effective_iodepth(),
            if self.o.iodepth == 0 { " (auto)" } else { "" },
            if self.o.verify { "on" } else { "off" },
            if self.o.resume { "on" } else { "off" },
            self.mem
                .map(|m| m.to_string())
                .unwrap_or_else(|| "off".into())
        );
        if let Some(d) = self.conn.as_ref().and_then(|c| c.slot.describe()) {
            println!("RDMA session: {d}");
        }
    }

    /// Run one command line. `Ok(false)` means quit.
    pub fn execute(&mut self, line: &str, input: &mut dyn BufRead) -> Result<bool, String> {
        let w = split_words(line)?;
        let Some(cmd) = w.first() else {
            return Ok(true);
        };
        let arg = |i: usize| w.get(i).map(String::as_str);
        let need = |i: usize, usage: &str| -> Result<&str, String> {
            w.get(i)
                .map(String::as_str)
                .ok_or_else(|| format!("usage: {usage}"))
        };
        let num = |i: usize, usage: &str| -> Result<u32, String> {
            let s = need(i, usage)?;
            s.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{s}: expected a positive number; usage: {usage}"))
        };
        let name = cmd.to_ascii_lowercase();
        match name.as_str() {
            "quit" | "bye" | "exit" => {
                if let Some(c) = self.conn.take() {
                    c.f.quit();
                }
                return Ok(false);
            }
            "help" | "?" => println!("{HELP}"),
            "open" => {
                let target = need(1, "open HOST [PORT [USER [PASSWORD]]]")?;
                if target.starts_with("ftp://") {
                    let u = Url::parse(target)?;
                    self.open_url(&u)?;
                } else {
                    let port = match arg(2) {
                        Some(p) => p.parse().map_err(|_| format!("{p}: not a port number"))?,
                        None => 21,
                    };
                    self.open(target, port)?;
                    match arg(3) {
                        Some(u) => self.login(u, arg(4).map(str::to_string), input)?,
                        None => println!("Log in with: user NAME [PASSWORD]"),
                    }
                }
            }
            "user" => {
                let u = need(1, "user NAME [PASSWORD]")?.to_string();
                self.login(&u, arg(2).map(str::to_string), input)?;
            }
            "close" | "disconnect" => match self.conn.take() {
                Some(c) => c.f.quit(),
                None => return Err("not connected".into()),
            },
            "ls" | "dir" | "nlist" | "nls" => {
                let verb = if matches!(name.as_str(), "ls" | "dir") {
                    "LIST"
                } else {
                    "NLST"
                };
                let p = arg(1).map(str::to_string);
                let text = self.with_conn(|c| c.f.listing(verb, p.as_deref()))?;
                print!("{text}");
            }
            "cd" | "cwd" => {
                let p = need(1, "cd PATH")?.to_string();
                self.with_conn(|c| c.f.expect(&format!("CWD {p}"), |c| c == 250))?;
            }
            "cdup" => {
                self.with_conn(|c| c.f.expect("CDUP", |c| c == 250 || c == 200))?;
            }
            "pwd" => {
                let t = self.with_conn(|c| c.f.expect("PWD", |c| c == 257))?;
                println!("{t}");
            }
            "lcd" => {
                let d = match arg(1) {
                    Some(d) => PathBuf::from(d),
                    None => std::env::var_os("HOME")
                        .map(PathBuf::from)
                        .ok_or("HOME is not set; give a directory")?,
                };
                std::env::set_current_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                let now = std::env::current_dir().map_err(|e| e.to_string())?;
                println!("Local directory now {}", now.display());
            }
            "get" | "recv" | "rget" => {
                let r = need(1, "get REMOTE [LOCAL]")?.to_string();
                let l = arg(2).map(str::to_string);
                self.get(name == "rget", &r, l.as_deref())?;
            }
            "put" | "send" | "rput" => {
                let rdma = name == "rput";
                if rdma && self.mem.is_some() {
                    // Memory to memory: zeros to a null sink; the name only
                    // labels the transfer on the server.
                    let remote = arg(1).unwrap_or("mem.bin").to_string();
                    self.put(true, "zeros", Some(&remote))?;
                } else {
                    let l = need(1, "put LOCAL [REMOTE]")?.to_string();
                    let r = arg(2).map(str::to_string);
                    self.put(rdma, &l, r.as_deref())?;
                }
            }
            "mget" | "rmget" => {
                let pats = w[1..].to_vec();
                self.mget(name == "rmget", &pats)?;
            }
            "del" | "delete" | "rm" => {
                let p = need(1, "del PATH")?.to_string();
                self.with_conn(|c| c.f.expect(&format!("DELE {p}"), |c| c == 250))?;
            }
            "mkdir" => {
                let p = need(1, "mkdir PATH")?.to_string();
                let t = self.with_conn(|c| c.f.expect(&format!("MKD {p}"), |c| c == 257))?;
                println!("{t}");
            }
            "rmdir" => {
                let p = need(1, "rmdir PATH")?.to_string();
                self.with_conn(|c| c.f.expect(&format!("RMD {p}"), |c| c == 250))?;
            }
            "rename" => {
                let from = need(1, "rename FROM TO")?.to_string();
                let to = need(2, "rename FROM TO")?.to_string();
                self.with_conn(|c| {
                    c.f.expect(&format!("RNFR {from}"), |c| c == 350)?;
                    c.f.expect(&format!("RNTO {to}"), |c| c == 250)
                })?;
            }
            "size" => {
                let p = need(1, "size PATH")?.to_string();
                let t = self.with_conn(|c| c.f.expect(&format!("SIZE {p}"), |c| c == 213))?;
                println!("{p}: {} bytes", t.trim());
            }
            "hash" => {
                let p = need(1, "hash PATH")?.to_string();
                let h = self.with_conn(|c| c.f.hash(&p))?;
                match h {
                    Some(h) => println!("SHA-256 {h} {p}"),
                    None => return Err("the server has no HASH command".into()),
                }
            }
            "streams" => {
                self.o.streams = num(1, "streams N")?;
                println!("streams {}", self.o.streams);
            }
            "iodepth" => {
                self.o.iodepth = num(1, "iodepth N")?;
                println!("iodepth {}", self.o.iodepth);
            }
            "blocksize" => {
                let s = need(1, "blocksize SIZE (e.g. 1M)")?;
                let b = parse_size(s)?;
                self.o.block_size = u32::try_from(b)
                    .ok()
                    .filter(|b| *b >= rdma_xfer::MIN_BLOCK)
                    .ok_or_else(|| {
                        format!(
                            "{s}: block size must be {} bytes to 4 GiB",
                            rdma_xfer::MIN_BLOCK
                        )
                    })?;
                println!("blocksize {}", self.o.block_size);
            }
            "mem" => {
                let v = need(1, "mem SIZE|off")?;
                self.mem = if v.eq_ignore_ascii_case("off") {
                    None
                } else {
                    Some(parse_size(v)?)
                };
                match self.mem {
                    Some(m) => println!("rget/rput move {m} bytes memory to memory"),
                    None => println!("memory-to-memory mode off"),
                }
            }
            "verify" => {
                self.o.verify = on_off(w.get(1))?;
            }
            "resume" => {
                self.o.resume = on_off(w.get(1))?;
            }
            "binary" | "bin" | "image" => {
                self.with_conn(|c| c.f.expect("TYPE I", |c| c == 200))?;
                println!("Type set to I (binary).");
            }
            "ascii" => {
                return Err("rftp transfers are binary only; files move byte for byte".into())
            }
            "passive" => println!("Passive mode is always on (EPSV, then PASV)."),
            "quote" => {
                if w.len() < 2 {
                    return Err("usage: quote LINE".into());
                }
                let line = w[1..].join(" ");
                let (c, t) = self.with_conn(|c| c.f.cmd(&line))?;
                println!("{c} {t}");
            }
            "status" => self.status(),
            other => return Err(format!("unknown command {other:?}; type help for the list")),
        }
        Ok(true)
    }

    /// Read and run commands until `quit` or end of input. Returns the
    /// exit status: 0 if every command succeeded, 1 otherwise.
    pub fn run(&mut self, input: &mut dyn BufRead) -> i32 {
        loop {
            if self.interactive {
                print!("rftp> ");
                let _ = io::stdout().flush();
            }
            let mut line = String::new();
            match input.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    eprintln!("rftp: reading commands: {e}");
                    self.failed = true;
                    break;
                }
            }
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match self.execute(line, input) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    let name = line.split_whitespace().next().unwrap_or("");
                    eprintln!("rftp: {name}: {e}");
                    self.failed = true;
                }
            }
            let _ = io::stdout().flush();
        }
        if let Some(c) = self.conn.take() {
            c.f.quit();
        }
        i32::from(self.failed)
    }

    /// Record a failure that happened before the prompt (e.g. the initial
    /// `open`), so the exit status reports it.
    pub fn note_failure(&mut self) {
        self.failed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        assert_eq!(
            split_words(r#"put "my file.bin"  x"#).unwrap(),
            ["put", "my file.bin", "x"]
        );
        assert_eq!(split_words(r#"get "a\"b""#).unwrap(), ["get", "a\"b"]);
        assert_eq!(split_words(r#"get """#).unwrap(), ["get", ""]);
        assert!(split_words(r#"get "open"#).is_err());
        assert!(split_words("   ").unwrap().is_empty());
    }

    #[test]
    fn globs() {
        assert!(glob_match("*.bin", "a.bin"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("*.bin", "a.txt"));
        assert!(!glob_match("a?c", "ac"));
        assert!(!glob_match("abc", "abcd"));
    }
}
