//! Path confinement under a race: while a thread keeps swapping a
//! directory of the root for a symlink to a directory outside it, RETR,
//! RRTR, SIZE, HASH, LIST and STOR on a path through that directory must
//! never read, describe or write anything outside the root. Runs with
//! openat2 and with the O_NOFOLLOW fallback (RFTPD_CONFINE_FALLBACK).

mod common;

use std::os::unix::fs::symlink;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server_env;
use rftp::client::{Options, Url};

const SECRET: &[u8] = b"outside the root: must never be served";

fn race(env: &[(&str, &str)]) {
    let s = server_env("", "error", None, env);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("f.bin"), SECRET).unwrap();
    let d = s.root.join("d");
    std::fs::create_dir(&d).unwrap();
    let inside: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.join("f.bin"), &inside).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    // Swaps so far, for the loop below to wait for enough of them.
    let swapped = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, d, out) = (stop.clone(), d.clone(), outside.path().to_path_buf());
        let swapped = swapped.clone();
        let real = s.root.join("d.real");
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // 50 ms of swapping as fast as possible, then 50 ms with
                // the real directory in place (so that some transfers
                // also succeed, showing the race runs against working
                // operations).
                let phase = Instant::now();
                while phase.elapsed() < Duration::from_millis(50) {
                    // d: real directory -> symlink to outside -> real directory.
                    std::fs::rename(&d, &real).unwrap();
                    symlink(&out, &d).unwrap();
                    std::thread::yield_now();
                    std::fs::remove_file(&d).unwrap();
                    std::fs::rename(&real, &d).unwrap();
                    n += 1;
                    swapped.store(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            n
        })
    };

    let url = Url::parse(&s.url("d/f.bin")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("got.bin");
    let t0 = Instant::now();
    let (mut served, mut refused) = (0, 0);
    // At least 3 s, and until some downloads were served, some refused
    // and the swapper swapped over 1000 times (at most 20 s): on a loaded
    // machine 3 s gave fewer than 1000 swaps.
    while t0.elapsed() < Duration::from_secs(3)
        || ((served < 3 || refused == 0 || swapped.load(Ordering::Relaxed) <= 1000)
            && t0.elapsed() < Duration::from_secs(20))
    {
        let mut f = rftp::client::session(&url, &Options::default()).unwrap();
        for cmd in ["SIZE d/f.bin", "HASH d/f.bin"] {
            let (c, t) = f.cmd(cmd).unwrap();
            assert!(
                !t.contains(&SECRET.len().to_string()) || c != 213,
                "{cmd} described the outside file: {c} {t}"
            );
        }
        let listing = f.listing("LIST", Some("d")).unwrap_or_default();
        assert!(
            !listing.contains(&format!(" {} ", SECRET.len())),
            "{listing}"
        );
        f.quit();
        for tcp in [true, false] {
            let o = Options {
                tcp,
                verify: false,
                resume: false,
                ..Options::default()
            };
            match rftp::client::get(&url, &out, &o) {
                Ok(_) => {
                    let got = std::fs::read(&out).unwrap();
                    assert_ne!(got, SECRET, "a file outside the root was served");
                    assert_eq!(got, inside);
                    served += 1;
                }
                Err(_) => refused += 1,
            }
        }
        let up = dir.path().join("up.bin");
        std::fs::write(&up, b"upload").unwrap();
        let put_url = Url::parse(&s.url("d/up.bin")).unwrap();
        let _ = rftp::client::put(Some(&up), &put_url, &Options::default());
        assert!(
            !outside.path().join("up.bin").exists(),
            "an upload was written outside the root"
        );
        assert!(
            std::fs::read_dir(outside.path()).unwrap().count() == 1,
            "something was created outside the root"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("{env:?}: {swaps} swaps, {served} downloads served, {refused} refused");
    assert!(
        swaps > 1000 && served > 0 && refused > 0,
        "the race did not run: {swaps} swaps, {served} served, {refused} refused"
    );
    assert_eq!(std::fs::read(outside.path().join("f.bin")).unwrap(), SECRET);
}

#[test]
fn a_symlink_swapped_in_during_transfers_never_leads_outside_the_root() {
    race(&[]);
}

#[test]
fn the_same_with_the_nofollow_fallback() {
    race(&[("RFTPD_CONFINE_FALLBACK", "1")]);
}
