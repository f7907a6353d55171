//! Device selection of rftp and rftpd (`--device`, config key `device`):
//! a bad name or a kernel device that is not there stops the program at
//! start with the cause and the fix, before any connection.

use std::process::Command;
use std::time::Duration;

fn host_has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// Runs `cmd` (bounded), returns (exit code, stderr).
fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let mut child = cmd
        .env_remove("IWARP_DEVICE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not exit within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn rftp_refuses_a_bad_or_missing_device_at_start() {
    // Port 1 on loopback: nobody listens; the device check comes first.
    let url = "ftp://a:b@127.0.0.1:1/x";
    let (code, err) =
        run(Command::new(env!("CARGO_BIN_EXE_rftp"))
            .args(["get", "--device", "no/such", "-q", url]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("invalid device name"), "{err}");
    if !host_has_rdma_device() {
        let (code, err) =
            run(Command::new(env!("CARGO_BIN_EXE_rftp"))
                .args(["get", "--device", "siw0", "-q", url]));
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("--device soft"), "{err}");
    }
}

#[test]
fn rftpd_takes_the_device_from_flag_or_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("rftpd.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nroot = \"{}\"\ndevice = \"no/such\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let (code, err) = run(Command::new(env!("CARGO_BIN_EXE_rftpd"))
        .arg("-c")
        .arg(&cfg));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid device name"), "{err}");
    if !host_has_rdma_device() {
        // The flag overrides the config file.
        let (code, err) = run(Command::new(env!("CARGO_BIN_EXE_rftpd"))
            .arg("-c")
            .arg(&cfg)
            .args(["--device", "siw0"]));
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("RDMA device siw0") && err.contains("--device soft"),
            "{err}"
        );
    }
}
