//! The configuration of the real binaries: the example file of
//! docs/CACHE.md ("Configuration files") is accepted by ccappd, and a bad
//! key, in a file or in a `PROGRAM_KEY` variable, is refused by each
//! program with its line or its variable. `PROGRAM --config FILE --help`
//! checks the whole configuration (unknown keys in the loader, every value
//! by the flag's own parser, in front of `--help`) and exits without
//! starting anything, so each case is one short process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `bin args` with `vars` added to the environment, bounded.
fn run(bin: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin);
    c.args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        c.env(k, v);
    }
    let child = c.spawn().expect("spawn");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // kill(1) the process this test started, by its pid.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("{bin} {args:?} did not exit within 60 s");
        }
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn tmp(name: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("ccache-config-files-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

/// The first ```toml block after `heading` in docs/CACHE.md.
fn doc_example(heading: &str) -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CACHE.md");
    let doc = std::fs::read_to_string(&doc).unwrap();
    let at = doc.find(heading).expect("the heading in docs/CACHE.md");
    let start = at + doc[at..].find("```toml\n").expect("a ```toml block") + 8;
    let len = doc[start..].find("```").unwrap();
    doc[start..start + len].to_owned()
}

#[test]
fn the_documented_example_is_read_and_variables_override_it() {
    let d = tmp("doc");
    let f = d.0.join("ccappd.toml");
    std::fs::write(&f, doc_example("### Configuration files")).unwrap();
    let f = f.to_str().unwrap();
    let appd = env!("CARGO_BIN_EXE_ccappd");
    let o = run(appd, &["--config", f, "--help"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("deprecated"), "{}", stderr(&o));
    // A variable replaces the file's value: a bad one now fails...
    let o = run(
        appd,
        &["--config", f, "--help"],
        &[("CCAPPD_HYBRID_PERCENT", "200")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--hybrid-percent"), "{}", stderr(&o));
    // ...and a good one replaces the file's bad value, which is then
    // never checked.
    let text = doc_example("### Configuration files");
    assert!(text.contains("hybrid_percent = 10\n"), "{text}");
    std::fs::write(
        f,
        text.replace("hybrid_percent = 10\n", "hybrid_percent = 200\n"),
    )
    .unwrap();
    let o = run(appd, &["--config", f, "--help"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run(
        appd,
        &["--config", f, "--help"],
        &[("CCAPPD_HYBRID_PERCENT", "5")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn each_program_refuses_an_unknown_key_naming_it() {
    let d = tmp("bad");
    let f = d.0.join("bad.toml");
    std::fs::write(&f, "# typo\n\nbogus_key = 1\n").unwrap();
    let f = f.to_str().unwrap();
    for (bin, prefix) in [
        (env!("CARGO_BIN_EXE_ccappd"), "CCAPPD"),
        (env!("CARGO_BIN_EXE_ccproxy"), "CCPROXY"),
        (env!("CARGO_BIN_EXE_ccupdate"), "CCUPDATE"),
    ] {
        let name = prefix.to_ascii_lowercase();
        let o = run(bin, &["--config", f, "--help"], &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {e}");
        assert!(
            e.contains(&format!(
                "--config {f}:3: key `bogus_key`: not a flag of {name}"
            )) && e.contains(&format!("`{name} --help`")),
            "{name}: {e}"
        );
        let var = format!("{prefix}_BOGUS_KEY");
        let o = run(bin, &["--help"], &[(&var, "1")]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {e}");
        assert!(
            e.contains(&format!("environment {var}: key `bogus_key`: not a flag")),
            "{name}: {e}"
        );
    }
}

#[test]
fn ccproxy_without_a_token_refuses_to_start_naming_the_fix() {
    // Tokens are on by default (issue 26 item 4): ccappd refuses a proxy
    // without one, so the proxy refuses to start rather than answer 502 to
    // every request. It exits before binding or connecting anything.
    let proxy = env!("CARGO_BIN_EXE_ccproxy");
    for mode_args in [
        &["--mode", "rdma"][..],
        &["--mode", "tcp", "--push-appd", "127.0.0.1:9"][..],
    ] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--backend", "127.0.0.1:9"];
        args.extend_from_slice(mode_args);
        let o = run(proxy, &args, &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{mode_args:?}: {e}");
        for want in [
            "no access token",
            "/var/lib/ccappd/token",
            "--token-file PATH",
            "--insecure-no-token",
        ] {
            assert!(e.contains(want), "{mode_args:?}: no `{want}` in: {e}");
        }
    }
    // The opt-out is a key of the config file too (checked, not started).
    let d = tmp("no-token");
    let f = d.0.join("ccproxy.toml");
    std::fs::write(&f, "mode = \"rdma\"\ninsecure_no_token = true\n").unwrap();
    let o = run(proxy, &["--config", f.to_str().unwrap(), "--help"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
}
