//! The binaries read their configuration through the shared loader: a
//! `RFTPD_SET_*` / `RFTP_SET_*` variable overrides the file's key, and a
//! misspelt key, in the file or in a variable, stops the program at start
//! naming where it is and the fix. Each case fails before any connection
//! (the settings are checked first), so nothing listens or connects.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `cmd` with a clean `IWARP_DEVICE`, bounded at 60 s; returns (exit
/// code, stderr).
fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let child = cmd
        .env_remove("IWARP_DEVICE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => {
            let out = out.unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into(),
            )
        }
        Err(_) => {
            // SAFETY: plain kill(2) of the child we spawned.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{cmd:?} did not exit within 60 s");
        }
    }
}

#[test]
fn rftpd_takes_rftpd_set_variables_over_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("rftpd.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nroot = \"{}\"\nrdma = false\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let rftpd = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rftpd"));
        c.arg("-c").arg(&cfg);
        c
    };
    // The variable turns RDMA back on with a device that cannot exist.
    let (code, err) = run(rftpd()
        .env("RFTPD_SET_RDMA", "true")
        .env("RFTPD_SET_DEVICE", "no/such"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid device name"), "{err}");
    // A misspelt variable is refused, named, with the fix.
    let (code, err) = run(rftpd().env("RFTPD_SET_MAX_STREEMS", "4"));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("environment RFTPD_SET_MAX_STREEMS=\"4\": key `max_streems`: unknown field")
            && err.contains("or unset RFTPD_SET_MAX_STREEMS"),
        "{err}"
    );
    // A misspelt key in the file: its line.
    std::fs::write(&cfg, "listen = \"127.0.0.1:0\"\nmax_streems = 4\n").unwrap();
    let (code, err) = run(&mut rftpd());
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("{}:2: key `max_streems`", cfg.display())),
        "{err}"
    );
}

#[test]
fn rftp_takes_rftp_set_variables() {
    // Port 1 on loopback: nobody listens; the settings are checked first.
    let url = "ftp://a:b@127.0.0.1:1/x";
    let rftp = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rftp"));
        c.args(["get", "-q", url]);
        c
    };
    let (code, err) = run(rftp().env("RFTP_SET_DEVICE", "no/such"));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--device no/such: invalid device name"),
        "{err}"
    );
    let (code, err) = run(rftp().env("RFTP_SET_CHECKSUM", "md5"));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("environment RFTP_SET_CHECKSUM=\"md5\": key `checksum`: unknown checksum"),
        "{err}"
    );
}
