//! `delay-bridge`'s command line: bad arguments give a clear error (moved
//! from rftp's tests with the relay).

use std::process::Command;

#[test]
fn bad_arguments_are_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_delay-bridge"))
        .args(["--listen", "nonsense"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("LISTEN=TARGET"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_delay-bridge"))
        .args([
            "--listen",
            "127.0.0.1:0=127.0.0.1:1",
            "--fault",
            "drop:how=x",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("how=x"), "{err}");
}
