//! rftpd and rftp as processes on loopback: transfers over RDMA and TCP
//! with 1 and 8 streams, unmodified ftplib / curl / lftp against rftpd,
//! and the fault cases (traversal, wrong password, malformed commands,
//! a client killed mid-transfer, disk full, a server without the
//! extension). Every wait is bounded.
//!
//! Also: the main-job demo (`rftp-demo`), the interactive mode driven
//! through stdin, a server killed mid-transfer, and one 1 GiB RDMA
//! transfer verified by SHA-256.
//!
//! `RFTP_BIG=1` moves 1 GiB instead of 64 MiB in the transfer test.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rftp::client::Ftp;
use rftp::util::sha256_file;

const T: Duration = Duration::from_secs(10);

struct Server {
    child: Child,
    port: u16,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start rftpd on a fresh root with `extra` appended to its config; `wrap`
/// runs it under `bash -c 'ulimit ...; exec rftpd ...'` when given.
fn server_with(extra: &str, wrap: Option<&str>, args: &[&str]) -> Server {
    server_full(extra, wrap, args, None)
}

/// As [`server_with`], serving `root` (kept by the caller) when given.
fn server_full(extra: &str, wrap: Option<&str>, args: &[&str], root: Option<&Path>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let root = match root {
        Some(r) => r.to_path_buf(),
        None => {
            let r = dir.path().join("root");
            std::fs::create_dir(&r).unwrap();
            r
        }
    };
    let cfg = dir.path().join("rftpd.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nroot = \"{}\"\nanonymous = true\nlogin_fail_delay_ms = 20\ndata_timeout_secs = 10\n{extra}\n\
             [[users]]\nname = \"alice\"\npassword = \"secret\"\n\
             [[users]]\nname = \"reader\"\npassword_sha256 = \"1c8bfe8f801d79745c4631d09fff36c82aa37fc4cce4fc946683d7b336b63032\"\nwrite = false\n",
            root.display()
        ),
    )
    .unwrap();
    let exe = env!("CARGO_BIN_EXE_rftpd");
    let mut cmd = match wrap {
        Some(prefix) => {
            let mut c = Command::new("bash");
            c.arg("-c").arg(format!(
                "{prefix}; exec {exe} -c {} {}",
                cfg.display(),
                args.join(" ")
            ));
            c
        }
        None => {
            let mut c = Command::new(exe);
            c.arg("-c").arg(&cfg).args(args);
            c
        }
    };
    let mut child = cmd
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("rftpd did not print its address: {line:?}"));
    Server {
        child,
        port,
        root: root.canonicalize().unwrap(),
        _dir: dir,
    }
}

fn server() -> Server {
    server_with("", None, &[])
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("ftp://alice:secret@127.0.0.1:{}/{path}", self.port)
    }
    fn ftp(&self) -> Ftp {
        let mut f = Ftp::connect("127.0.0.1", self.port, T).unwrap();
        f.login("alice", "secret").unwrap();
        f
    }
}

/// Run a command, killing it after `limit`.
fn run_limited(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} did not finish in {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rftp(args: &[&str]) -> (bool, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rftp"));
    // These tests compare SHA-256 digests (sha256_file); the negotiated
    // default (XXH3-128) is tested in verify.rs.
    c.args(args)
        .args(["-q", "--checksum", "sha256"])
        .env("RUST_LOG", "warn");
    let out = run_limited(c, Duration::from_secs(90));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn transfers_over_rdma_and_tcp_with_1_and_8_streams() {
    let s = server();
    let big = std::env::var_os("RFTP_BIG").is_some();
    let len = if big { 1 << 30 } else { (64 << 20) + 12_345 };
    common::write_random(&s.root.join("src.bin"), len, 0x9e37_79b9_7f4a_7c15);
    let want = sha256_file(&s.root.join("src.bin")).unwrap();
    let local = tempfile::tempdir().unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("rdma x1", &["--streams", "1"]),
        ("rdma x8", &["--streams", "8"]),
        ("tcp x1", &["--streams", "1", "--xfer-mode", "tcp"]),
        ("tcp x8", &["--streams", "8", "--xfer-mode", "tcp"]),
        ("ftp", &["--tcp"]),
    ];
    for (i, (via, extra)) in cases.iter().enumerate() {
        let out = local.path().join(format!("get{i}.bin"));
        let start = Instant::now();
        let src_url = s.url("src.bin");
        let mut args = vec!["get", &src_url as &str, "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (ok, text) = rftp(&args);
        assert!(ok, "{via}: {text}");
        assert!(text.contains(&format!("via {via}")), "{via}: {text}");
        assert!(
            text.contains(&format!("SHA-256 verified: {want}")),
            "{via}: {text}"
        );
        assert_eq!(sha256_file(&out).unwrap(), want);
        eprintln!(
            "get {via}: {:?} {}",
            start.elapsed(),
            text.lines().next().unwrap_or("")
        );
        if big {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{via}: 1 GiB took {:?}",
                start.elapsed()
            );
        }
        let name = format!("put{i}.bin");
        let url = s.url(&name);
        let mut args = vec!["put", out.to_str().unwrap(), &url as &str];
        args.extend_from_slice(extra);
        let (ok, text) = rftp(&args);
        assert!(ok, "put {via}: {text}");
        assert!(text.contains("SHA-256 verified"), "put {via}: {text}");
        assert_eq!(sha256_file(&s.root.join(&name)).unwrap(), want);
        std::fs::remove_file(&out).unwrap();
    }
    // Sizes that are not multiples of the block size, and an empty file.
    for len in [0usize, 1, 4095, 1 << 20, (1 << 20) + 1] {
        let name = format!("n{len}.bin");
        common::write_random(&s.root.join(&name), len, 0x9e37_79b9_7f4a_7c15);
        let out = local.path().join(&name);
        let (ok, text) = rftp(&[
            "get",
            &s.url(&name),
            "-o",
            out.to_str().unwrap(),
            "--streams",
            "8",
            "--block-size",
            "64K",
        ]);
        assert!(ok && text.contains("SHA-256 verified"), "{len}: {text}");
        assert_eq!(std::fs::metadata(&out).unwrap().len(), len as u64);
    }
    // Memory to memory, both directions.
    for cmd in ["get", "put"] {
        let (ok, text) = rftp(&[cmd, "--mem", "256M", &s.url("x"), "--streams", "8"]);
        assert!(
            ok && text.contains("256.0 MiB") && text.contains("via rdma x8"),
            "{cmd}: {text}"
        );
    }
}

#[test]
fn python_ftplib_against_rftpd() {
    let s = server();
    common::write_random(&s.root.join("f.bin"), 300_000, 0x9e37_79b9_7f4a_7c15);
    let script = r#"
import ftplib, io, sys, hashlib
port = int(sys.argv[1])
f = ftplib.FTP()
f.connect("127.0.0.1", port, timeout=10)
f.login("alice", "secret")
lines = []
f.retrlines("LIST", lines.append)
assert any("f.bin" in l for l in lines), lines
assert "f.bin" in f.nlst()
facts = dict(f.mlsd())
assert facts["f.bin"]["size"] == "300000", facts
assert f.size("f.bin") == 300000
buf = io.BytesIO()
f.retrbinary("RETR f.bin", buf.write)
data = buf.getvalue()
assert len(data) == 300000
tail = io.BytesIO()
f.retrbinary("RETR f.bin", tail.write, rest=100000)
assert tail.getvalue() == data[100000:]
f.storbinary("STOR up.bin", io.BytesIO(data))
assert f.size("up.bin") == 300000
resp = f.sendcmd("HASH up.bin")
assert hashlib.sha256(data).hexdigest() in resp, resp
assert f.sendcmd("EPSV").startswith("229")
f.af = 10  # use EPSV for the next transfer, as ftplib does on IPv6
buf2 = io.BytesIO()
f.retrbinary("RETR up.bin", buf2.write)
assert buf2.getvalue() == data
f.af = 2
f.mkd("d")
f.cwd("d")
assert f.pwd() == "/d"
f.cwd("..")
f.rename("up.bin", "d/moved.bin")
f.delete("d/moved.bin")
f.rmd("d")
assert "MDTM" in f.sendcmd("FEAT") or True
f.quit()
print("ftplib ok")
"#;
    let mut c = Command::new("python3");
    c.arg("-c").arg(script).arg(s.port.to_string());
    let out = run_limited(c, Duration::from_secs(60));
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ftplib ok"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn curl(args: &[&str]) -> Output {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "30"]).args(args);
    run_limited(c, Duration::from_secs(40))
}

#[test]
fn curl_against_rftpd() {
    let s = server();
    common::write_random(&s.root.join("c.bin"), 1_000_000, 0x9e37_79b9_7f4a_7c15);
    let local = tempfile::tempdir().unwrap();
    let base = format!("ftp://alice:secret@127.0.0.1:{}", s.port);
    // LIST
    let out = curl(&[&format!("{base}/")]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("c.bin"));
    // RETR (curl uses EPSV first, SIZE, then RETR)
    let dst = local.path().join("c.bin");
    let out = curl(&["-o", dst.to_str().unwrap(), &format!("{base}/c.bin")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sha256_file(&dst).unwrap(),
        sha256_file(&s.root.join("c.bin")).unwrap()
    );
    // REST via a range
    let out = curl(&["-r", "999000-", &format!("{base}/c.bin")]);
    assert!(out.status.success());
    assert_eq!(out.stdout, std::fs::read(&dst).unwrap()[999_000..]);
    // STOR
    let out = curl(&["-T", dst.to_str().unwrap(), &format!("{base}/up.bin")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sha256_file(&s.root.join("up.bin")).unwrap(),
        sha256_file(&dst).unwrap()
    );
    // Anonymous read works, anonymous write is refused.
    let anon = format!("ftp://127.0.0.1:{}", s.port);
    assert!(curl(&[&format!("{anon}/c.bin"), "-o", "/dev/null"])
        .status
        .success());
    assert!(
        !curl(&["-T", dst.to_str().unwrap(), &format!("{anon}/anon.bin")])
            .status
            .success()
    );
    assert!(!s.root.join("anon.bin").exists());
    // Wrong password
    let out = curl(&[&format!("ftp://alice:nope@127.0.0.1:{}/", s.port)]);
    assert!(!out.status.success());
}

#[test]
fn lftp_against_rftpd_if_installed() {
    if Command::new("lftp").arg("--version").output().is_err() {
        eprintln!("lftp not installed; skipped (scripts/test-rftp.sh installs it)");
        return;
    }
    let s = server();
    common::write_random(&s.root.join("l.bin"), 2_000_000, 0x9e37_79b9_7f4a_7c15);
    let local = tempfile::tempdir().unwrap();
    let script = format!(
        "set cmd:fail-exit yes; set net:max-retries 1; set net:timeout 10; set ftp:ssl-allow no; \
         cls -l; get l.bin -o {d}/l.bin; put {d}/l.bin -o l2.bin; bye",
        d = local.path().display()
    );
    let mut c = Command::new("lftp");
    c.args([
        "-u",
        "alice,secret",
        "-p",
        &s.port.to_string(),
        "-e",
        &script,
        "127.0.0.1",
    ]);
    let out = run_limited(c, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let want = sha256_file(&s.root.join("l.bin")).unwrap();
    assert_eq!(sha256_file(&local.path().join("l.bin")).unwrap(), want);
    assert_eq!(sha256_file(&s.root.join("l2.bin")).unwrap(), want);
}

#[test]
fn path_traversal_is_refused() {
    let s = server();
    std::fs::write(s.root.join("ok.txt"), b"fine").unwrap();
    std::os::unix::fs::symlink("/etc", s.root.join("etc-link")).unwrap();
    let mut f = s.ftp();
    for cmd in [
        "RETR ../../../../etc/passwd",
        "SIZE ../../etc/passwd",
        "CWD ..",
        "CWD /../..",
        "RETR etc-link/passwd",
        "CWD etc-link",
        "HASH etc-link/hostname",
        "DELE ../x",
        "MKD ../escape",
        "STOR ../escape.txt",
    ] {
        let (c, t) = f.cmd(cmd).unwrap();
        assert!(c == 550 || c == 553, "{cmd}: {c} {t}");
    }
    // An absolute path is inside the root, not the host's /.
    let (c, _) = f.cmd("SIZE /etc/passwd").unwrap();
    assert_eq!(c, 550);
    assert_eq!(f.cmd("SIZE /ok.txt").unwrap(), (213, "4".into()));
    assert_eq!(f.cmd("PWD").unwrap().0, 257);
    assert!(!s.root.parent().unwrap().join("escape").exists());
}

#[test]
fn wrong_password_is_refused_and_rate_limited() {
    let s = server_with(
        "login_fail_limit = 3\nlogin_fail_window_secs = 60",
        None,
        &[],
    );
    let mut f = Ftp::connect("127.0.0.1", s.port, T).unwrap();
    let mut codes = Vec::new();
    for _ in 0..3 {
        f.cmd("USER alice").unwrap();
        codes.push(f.cmd("PASS wrong").unwrap().0);
        if codes.last() == Some(&421) {
            break;
        }
    }
    assert_eq!(codes, [530, 530, 421]);
    // Locked out: even the right password is refused for now.
    let mut g = Ftp::connect("127.0.0.1", s.port, T).unwrap();
    assert_eq!(g.cmd("USER alice").unwrap().0, 421);
    // A read-only user (SHA-256 password) cannot be tried either.
    assert!(Ftp::connect("127.0.0.1", s.port, T)
        .unwrap()
        .login("reader", "letmein")
        .is_err());
}

#[test]
fn read_only_user_and_hashed_password() {
    let s = server();
    let mut f = Ftp::connect("127.0.0.1", s.port, T).unwrap();
    f.login("reader", "letmein").unwrap();
    assert_eq!(f.cmd("MKD x").unwrap().0, 550);
    assert_eq!(f.cmd("STOR x").unwrap().0, 550);
    assert_eq!(f.cmd("RSTR x").unwrap().0, 550);
}

#[test]
fn malformed_commands_get_5xx_and_the_server_keeps_serving() {
    let s = server();
    let mut raw = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    let mut rd = BufReader::new(raw.try_clone().unwrap());
    let mut line = String::new();
    rd.read_line(&mut line).unwrap();
    assert!(line.starts_with("220"));
    let long = format!("USER {}\r\n", "a".repeat(10_000));
    let cases: Vec<Vec<u8>> = vec![
        b"FOO bar\r\n".to_vec(),
        b"\xff\xfe\x80garbage\r\n".to_vec(),
        long.into_bytes(),
        b"\r\n".to_vec(),
        b"RETR\r\n".to_vec(),
        b"USER alice\r\n".to_vec(),
        b"PASS secret\r\n".to_vec(),
        b"RETR\r\n".to_vec(),
        b"PORT 1,2,3\r\n".to_vec(),
        b"EPRT |9|x|y|\r\n".to_vec(),
        b"REST abc\r\n".to_vec(),
        b"TYPE Z\r\n".to_vec(),
        b"RADR STREAMS=banana\r\n".to_vec(),
        b"RNTO x\r\n".to_vec(),
        b"NOOP\r\n".to_vec(),
    ];
    let mut codes = Vec::new();
    for c in &cases {
        raw.write_all(c).unwrap();
        line.clear();
        rd.read_line(&mut line).unwrap();
        codes.push(line.get(..3).unwrap_or("").to_string());
    }
    let want = [
        "500", "501", "500", "500", "530", "331", "230", "501", "501", "501", "501", "504", "501",
        "503", "200",
    ];
    assert_eq!(codes, want);
    // A client that vanishes mid-command does not hurt the others.
    let mut gone = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    gone.write_all(b"USER al").unwrap();
    drop(gone);
    let mut f = s.ftp();
    assert_eq!(f.cmd("NOOP").unwrap().0, 200);
}

#[test]
fn killed_client_leaves_no_partial_file_and_rest_resumes() {
    let s = server();
    let len = 32 << 20;
    common::write_random(&s.root.join("r.bin"), len, 0x9e37_79b9_7f4a_7c15);
    let want = sha256_file(&s.root.join("r.bin")).unwrap();
    let local = tempfile::tempdir().unwrap();
    let out = local.path().join("r.bin");
    for mode in [&["--streams", "2"][..], &["--tcp"][..]] {
        // A slow download, killed after a moment.
        let mut child = Command::new(env!("CARGO_BIN_EXE_rftp"))
            .args([
                "get",
                &s.url("r.bin"),
                "-o",
                out.to_str().unwrap(),
                "-q",
                "--limit-rate",
                "16M",
            ])
            .args(mode)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kill it once bytes have reached the part file (bounded), not
        // after a guessed time: on a loaded machine the session's set-up
        // alone can take longer than any fixed sleep.
        let part = rftp::client::part_path(&out);
        let t0 = std::time::Instant::now();
        while std::fs::metadata(&part).map_or(0, |m| m.len()) == 0
            && t0.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!out.exists(), "{mode:?}: no file under the final name");
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        assert!(have > 0 && have < len as u64, "{mode:?}: partial {have}");
        let (ok, text) = rftp(&["get", &s.url("r.bin"), "-o", out.to_str().unwrap()]);
        assert!(ok, "{mode:?}: {text}");
        assert!(text.contains("resumed at byte"), "{mode:?}: {text}");
        assert!(
            text.contains(&format!("SHA-256 verified: {want}")),
            "{text}"
        );
        assert!(!part.exists());
        std::fs::remove_file(&out).unwrap();
    }
    // Upload side: a client that vanishes mid-STOR leaves nothing under
    // the final name (nor its temporary file).
    let mut f = s.ftp();
    let mut data = f.data().unwrap();
    assert_eq!(f.cmd("STOR half.bin").unwrap().0, 150);
    data.write_all(&vec![7u8; 1 << 20]).unwrap();
    drop(data);
    drop(f);
    let deadline = Instant::now() + T;
    loop {
        let names: Vec<String> = std::fs::read_dir(&s.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        // The server sees a clean EOF here, so it may keep the upload
        // (RFC 959 stream mode ends at EOF); what must never exist is a
        // temporary file, or a final name before the upload ended.
        if names.iter().all(|n| !n.contains("rftp-part")) {
            break;
        }
        assert!(Instant::now() < deadline, "temp file left: {names:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn disk_full_is_an_ftp_error_reply() {
    // A 2 MiB file-size limit on the server: writes past it fail (EFBIG).
    let s = server_with("", Some("ulimit -f 2048"), &[]);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("big.bin");
    common::write_random(&src, 8 << 20, 0x9e37_79b9_7f4a_7c15);
    for mode in [&["--streams", "2"][..], &["--tcp"][..]] {
        let mut args = vec!["put", src.to_str().unwrap()];
        let url = s.url("full.bin");
        args.push(&url);
        args.extend_from_slice(mode);
        let (ok, text) = rftp(&args);
        assert!(!ok, "{mode:?}: {text}");
        assert!(text.contains("552"), "{mode:?}: {text}");
        assert!(!s.root.join("full.bin").exists());
    }
    let mut f = s.ftp();
    assert_eq!(f.cmd("NOOP").unwrap().0, 200, "server still serving");
}

#[test]
fn server_without_the_extension_makes_the_client_fall_back() {
    let s = server_with("", None, &["--no-rdma"]);
    common::write_random(&s.root.join("p.bin"), 3 << 20, 0x9e37_79b9_7f4a_7c15);
    let local = tempfile::tempdir().unwrap();
    let out = local.path().join("p.bin");
    let (ok, text) = rftp(&[
        "get",
        &s.url("p.bin"),
        "-o",
        out.to_str().unwrap(),
        "--streams",
        "8",
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("via ftp") && text.contains("SHA-256 verified"),
        "{text}"
    );
    let mut f = s.ftp();
    let (c, t) = f.cmd("FEAT").unwrap();
    assert!(c == 211 && !t.contains("RADR"), "{t}");
    assert_eq!(f.cmd("RADR STREAMS=2").unwrap().0, 502);
}

#[test]
fn connection_limit() {
    let s = server_with("max_per_ip = 2", None, &[]);
    let _a = Ftp::connect("127.0.0.1", s.port, T).unwrap();
    let _b = Ftp::connect("127.0.0.1", s.port, T).unwrap();
    let e = Ftp::connect("127.0.0.1", s.port, T).unwrap_err();
    assert!(e.contains("421"), "{e}");
    let mut buf = Vec::new();
    let _ = TcpStream::connect(("127.0.0.1", s.port)).map(|mut c| c.read_to_end(&mut buf));
}

#[test]
fn killed_server_leaves_only_the_part_file_and_rest_resumes() {
    let keep = tempfile::tempdir().unwrap();
    let root = keep.path().canonicalize().unwrap();
    let len = 32 << 20;
    common::write_random(&root.join("k.bin"), len, 0x9e37_79b9_7f4a_7c15);
    let want = sha256_file(&root.join("k.bin")).unwrap();
    let local = tempfile::tempdir().unwrap();
    let out = local.path().join("k.bin");
    let part = rftp::client::part_path(&out);
    for mode in [&["--streams", "4"][..], &["--tcp"][..]] {
        let mut s = server_full("", None, &[], Some(&root));
        let mut child = Command::new(env!("CARGO_BIN_EXE_rftp"))
            .args(["get", &s.url("k.bin"), "-o", out.to_str().unwrap(), "-q"])
            .args(["--limit-rate", "16M", "--timeout", "10"])
            .args(mode)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        s.child.kill().unwrap();
        s.child.wait().unwrap();
        // The client must notice within a bounded time and fail clearly.
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > Duration::from_secs(15) {
                let _ = child.kill();
                panic!("{mode:?}: rftp still running 15 s after the server died");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "{mode:?}: {err}");
        assert!(
            err.contains("download failed") && err.contains("kept for a resume"),
            "{mode:?}: unclear error: {err}"
        );
        assert!(!out.exists(), "{mode:?}: a file under the final name");
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        assert!(have > 0 && have < len as u64, "{mode:?}: partial {have}");
        // A new server on the same root: the next get resumes with REST.
        let s2 = server_full("", None, &[], Some(&root));
        let mut args = vec!["get", "-o", out.to_str().unwrap()];
        let u = s2.url("k.bin");
        args.push(&u);
        args.extend_from_slice(mode);
        let (ok, text) = rftp(&args);
        assert!(ok, "{mode:?}: {text}");
        assert!(
            text.contains(&format!("resumed at byte {have}")),
            "{mode:?}: {text}"
        );
        assert!(
            text.contains(&format!("SHA-256 verified: {want}")),
            "{text}"
        );
        assert!(!part.exists());
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn one_gib_over_rdma_verified_by_sha256() {
    // tmpfs when there is one, so the disk does not set the pace.
    let shm = Path::new("/dev/shm");
    let mk = || {
        if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        }
    };
    let keep = mk();
    let root = keep.path().canonicalize().unwrap();
    common::write_random(&root.join("g.bin"), 1 << 30, 0x9e37_79b9_7f4a_7c15);
    let want = sha256_file(&root.join("g.bin")).unwrap();
    let s = server_full("", None, &[], Some(&root));
    let local = mk();
    let out = local.path().join("g.bin");
    let start = Instant::now();
    let (ok, text) = rftp(&[
        "get",
        &s.url("g.bin"),
        "-o",
        out.to_str().unwrap(),
        "--streams",
        "8",
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("1024.0 MiB") && text.contains("via rdma x8"),
        "{text}"
    );
    assert!(
        text.contains(&format!("SHA-256 verified: {want}")),
        "{text}"
    );
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 1 << 30);
    eprintln!("1 GiB get + hashes: {:?}: {text}", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn demo_runs_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_rftp-demo"));
    c.args([
        "--size",
        "9M",
        "--streams",
        "2",
        "--block-size",
        "256K",
        "--dir",
    ])
    .arg(dir.path())
    .env("RUST_LOG", "warn");
    let out = run_limited(c, Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let hash_of = |label: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(label))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {label:?} line: {text}"))
            .to_string()
    };
    let orig = hash_of("rftp-demo: SHA-256 original");
    assert_eq!(orig.len(), 64, "{text}");
    assert_eq!(hash_of("rftp-demo: SHA-256 on the server"), orig);
    assert_eq!(hash_of("rftp-demo: SHA-256 downloaded"), orig);
    assert!(text.contains("via rdma x2"), "{text}");
    assert!(text.contains("SHA-256 verified on both ends"), "{text}");
    // Progress lines (stderr is not a terminal here).
    assert!(text.contains("rput: ") && text.contains("(100%)"), "{text}");
    // Cleaned up after itself: the temp dir is empty, no server left.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // Bad input: a clear error and a non-zero status.
    let mut c = Command::new(env!("CARGO_BIN_EXE_rftp-demo"));
    c.args(["--size", "lots"]);
    let out = run_limited(c, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("lots"), "{err}");
    let mut c = Command::new(env!("CARGO_BIN_EXE_rftp-demo"));
    c.args(["--size", "1M", "--dir", "/proc/self/no-such-dir"]);
    let out = run_limited(c, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--dir"), "{err}");
}

/// Run `rftp ARGS` with `script` on stdin; (exit status, stdout, stderr).
fn rftp_script(args: &[&str], script: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rftp"))
        .args(args)
        .args(["-q", "--checksum", "sha256"])
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("rftp script did not finish: {script}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn interactive_mode_through_stdin() {
    let s = server();
    common::write_random(&s.root.join("a.bin"), 3_000_000, 0x9e37_79b9_7f4a_7c15);
    common::write_random(&s.root.join("ab.bin"), 70_000, 0x9e37_79b9_7f4a_7c15);
    let want = sha256_file(&s.root.join("a.bin")).unwrap();
    let local = tempfile::tempdir().unwrap();
    let l = |n: &str| local.path().join(n).to_str().unwrap().to_string();
    // Every command succeeds: exit status 0.
    let script = format!(
        "ls\nstreams 2\nblocksize 256K\niodepth 3\nrget a.bin {a1}\nget a.bin {a2}\n\
         rput {a1} up1.bin\nput {a2} up2.bin\nsize up1.bin\nhash up2.bin\n\
         mkdir d\ncd d\npwd\ncdup\nrename up1.bin d/moved.bin\nls d\n\
         lcd {dir}\nmget ab*\nrmget a.b?n\nmem 32M\nrget zero\nrput\nmem off\nstatus\n\
         del d/moved.bin\nrmdir d\nbinary\npassive\nquote NOOP\nhelp\nquit\nls\n",
        a1 = l("a1.bin"),
        a2 = l("a2.bin"),
        dir = local.path().display()
    );
    let (code, out, err) = rftp_script(&[&s.url("")], &script);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("a.bin") && out.contains("ab.bin"), "{out}");
    assert!(
        out.contains("via rdma x2") && out.contains("via ftp"),
        "{out}"
    );
    assert_eq!(
        out.matches(&format!("SHA-256 verified: {want}")).count(),
        5,
        "{out}"
    );
    assert!(out.contains("up1.bin: 3000000 bytes"), "{out}");
    assert!(out.contains(&format!("SHA-256 {want} up2.bin")), "{out}");
    assert!(out.contains("\"/d\" is the current directory"), "{out}");
    assert!(out.contains("moved.bin"), "{out}");
    assert!(
        out.contains("32.0 MiB") && out.contains("memory to memory"),
        "{out}"
    );
    assert!(out.contains("RDMA session: rdma x2"), "{out}");
    assert!(out.contains("200 ") && out.contains("rget REMOTE"), "{out}");
    for f in ["a1.bin", "a2.bin", "ab.bin"] {
        assert!(local.path().join(f).exists(), "{f}: {out}");
    }
    assert_eq!(sha256_file(&s.root.join("up2.bin")).unwrap(), want);
    assert!(!s.root.join("d").exists());

    // Errors are reported, the session goes on, and the status is 1.
    let script = format!(
        "frobnicate\nget ../../../etc/passwd {p}\nrget missing.bin {m}\nstreams zero\n\
         blocksize 1\ncd /nowhere\nput /no/such/file x\nrput \"unterminated\nascii\n\
         rget a.bin {ok}\nquit\n",
        p = l("passwd"),
        m = l("missing.bin"),
        ok = l("ok.bin")
    );
    let (code, out, err) = rftp_script(&[&s.url("")], &script);
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    for needle in [
        "rftp: frobnicate: unknown command",
        "rftp: get: RETR ../../../etc/passwd: server replied 5",
        "rftp: rget: RRTR missing.bin: server replied 550",
        "rftp: streams: zero: expected a positive number",
        "rftp: blocksize: 1: block size must be",
        "rftp: cd: CWD /nowhere: server replied 550",
        "rftp: put: opening /no/such/file",
        "unterminated double quote",
        "binary only",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in stderr: {err}");
    }
    assert!(out.contains(&format!("SHA-256 verified: {want}")), "{out}");
    for f in ["passwd", "missing.bin", "passwd.part", "missing.bin.part"] {
        assert!(!local.path().join(f).exists(), "{f} left behind");
    }

    // `rftp open HOST PORT` with a login at the prompt; a wrong password
    // is refused and a right one works on the same connection.
    let port = s.port.to_string();
    let (code, out, err) = rftp_script(
        &["open", "127.0.0.1", &port],
        "ls\nuser alice wrong\nuser alice\nsecret\npwd\nquit\n",
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("rftp: ls: ") && err.contains("530"), "{err}");
    assert!(err.contains("login failed: 530"), "{err}");
    assert!(
        out.contains("Logged in as alice") && out.contains("\"/\""),
        "{out}"
    );

    // Not connected at all, then open a URL from the prompt.
    let (code, out, err) = rftp_script(
        &[],
        &format!(
            "ls\nopen {}\nsize a.bin\nclose\nsize a.bin\nquit\n",
            s.url("")
        ),
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("rftp: ls: not connected"), "{err}");
    assert!(out.contains("a.bin: 3000000 bytes"), "{out}");
    assert!(err.contains("rftp: size: not connected"), "{err}");
}

#[test]
fn interactive_mode_notices_a_dead_server() {
    let mut s = server();
    common::write_random(&s.root.join("a.bin"), 1000, 0x9e37_79b9_7f4a_7c15);
    let mut child = Command::new(env!("CARGO_BIN_EXE_rftp"))
        .arg(s.url(""))
        .args(["-q", "--timeout", "5"])
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"size a.bin\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    stdin.write_all(b"ls\nls\nquit\n").unwrap();
    drop(stdin);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("rftp did not finish after the server died");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{o}{e}");
    assert!(o.contains("a.bin: 1000 bytes"), "{o}");
    assert!(e.contains("the control connection is gone"), "{e}");
    assert!(e.contains("rftp: ls: not connected"), "{e}");
}

/// Start the fault relay ([`fault_relay`], the test-support crate behind
/// `delay-bridge`, in this process) with `pairs` (`LISTEN=TARGET`) and a
/// one-way delay of `delay_ms`; returns the listen addresses. Its threads
/// live until the test process ends.
fn bridge(pairs: &[String], delay_ms: &str) -> Vec<String> {
    let maps: Vec<_> = pairs
        .iter()
        .map(|p| fault_relay::parse_mapping(p).unwrap_or_else(|e| panic!("{p}: {e}")))
        .collect();
    let cfg = fault_relay::Config {
        delay: Duration::from_secs_f64(delay_ms.parse::<f64>().unwrap() / 1e3),
        ..fault_relay::Config::default()
    };
    fault_relay::start(&maps, cfg)
        .expect("starting the fault relay")
        .iter()
        .map(|a| a.to_string())
        .collect()
}

#[test]
fn delay_bridge_adds_rtt_and_carries_an_rdma_session() {
    // rftpd with a fixed RADR port, announcing the bridge's address.
    let xport = common::fixed_port();
    let bport = common::fixed_port();
    let s = server_with(
        &format!("rdma_port = {xport}\nrdma_advertise = \"127.0.0.1:{bport}\""),
        None,
        &[],
    );
    common::write_random(&s.root.join("d.bin"), 5 << 20, 0x9e37_79b9_7f4a_7c15);
    let want = sha256_file(&s.root.join("d.bin")).unwrap();
    let addrs = bridge(
        &[
            format!("127.0.0.1:0=127.0.0.1:{}", s.port),
            format!("127.0.0.1:{bport}=127.0.0.1:{xport}"),
        ],
        "20",
    );
    let cport: u16 = addrs[0].rsplit(':').next().unwrap().parse().unwrap();
    // 20 ms each way: a NOOP round trip takes at least 40 ms.
    let mut f = Ftp::connect("127.0.0.1", cport, T).unwrap();
    let t = Instant::now();
    assert_eq!(f.cmd("NOOP").unwrap().0, 200);
    let rtt = t.elapsed();
    assert!(
        rtt >= Duration::from_millis(40) && rtt < Duration::from_millis(1000),
        "{rtt:?}"
    );
    drop(f);
    let local = tempfile::tempdir().unwrap();
    let out = local.path().join("d.bin");
    let url = format!("ftp://alice:secret@127.0.0.1:{cport}/d.bin");
    let (ok, text) = rftp(&["get", &url, "-o", out.to_str().unwrap(), "--streams", "4"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("via rdma x4") && text.contains(&format!("SHA-256 verified: {want}")),
        "{text}"
    );
}

#[test]
fn fixed_rdma_port_busy_is_a_425_and_bad_advertise_is_refused() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    // std binds with SO_REUSEADDR but without SO_REUSEPORT, and is
    // listening: the server's bind must fail.
    let s = server_with(&format!("rdma_port = {port}"), None, &[]);
    let mut f = s.ftp();
    let (c, t) = f.cmd("RADR STREAMS=1").unwrap();
    assert_eq!(c, 425, "{t}");
    assert!(t.contains("rdma_port"), "{t}");
    assert_eq!(f.cmd("NOOP").unwrap().0, 200);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        format!(
            "root = \"{}\"\nrdma_advertise = \"here\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rftpd"))
        .arg("-c")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("rdma_advertise"),
        "{err}"
    );
}
