//! Path confinement under a race: while a thread keeps swapping a
//! directory of the root for a symlink to a directory outside it, RETR,
//! RRTR, SIZE, HASH, LIST and STOR on a path through that directory must
//! never read, describe or write anything outside the root. Runs with
//! openat2 and with the O_NOFOLLOW fallback (RFTPD_CONFINE_FALLBACK).

mod common;

use std::os::unix::fs::symlink;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server_env;
use rftp::client::{Options, Url};

const SECRET: &[u8] = b"outside the root: must never be served";
/// Downloads the race must have seen of each outcome: served (the real
/// directory in place) and refused naming the symbolic link (rftpd's
/// lexical check or the kernel's confinement caught the swapped-in link).
const EACH: u32 = 20;
/// The loop's cap; at load 29 the old 20 s cap gave 90 served and 134
/// refused, so this is far beyond what the counts need.
const CAP: Duration = Duration::from_secs(90);

fn race(env: &[(&str, &str)]) {
    let s = server_env("", "error", None, env);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("f.bin"), SECRET).unwrap();
    let d = s.root.join("d");
    std::fs::create_dir(&d).unwrap();
    let inside: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.join("f.bin"), &inside).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, d, out) = (stop.clone(), d.clone(), outside.path().to_path_buf());
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
    // Served, refused naming the link, refused otherwise (the directory
    // missing halfway through a swap).
    let (mut served, mut confined, mut refused) = (0u32, 0u32, 0u32);
    // At least 3 s, and until the race has shown both outcomes EACH times:
    // downloads served and downloads refused because of the link. The
    // bound is on that evidence, not on a swap count (on a loaded machine
    // the swapper thread, which yields, swapped fewer than the 1000 times
    // once required within 20 s although the race had plainly run: 894
    // swaps, 90 served, 134 refused; issue 26). CAP only ends a run whose
    // race does not happen, which the assertion below then reports.
    while t0.elapsed() < Duration::from_secs(3)
        || ((served < EACH || confined < EACH) && t0.elapsed() < CAP)
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
                Err(e) if e.contains("symbolic link") => confined += 1,
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
    eprintln!(
        "{env:?}: {swaps} swaps, {served} downloads served, {confined} refused naming the link, \
         {refused} refused otherwise, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        served >= EACH && confined >= EACH,
        "the race did not run: {served} served and {confined} refused naming the link (each \
         needs {EACH}; {refused} refused otherwise, {swaps} swaps) in {:.1} s",
        t0.elapsed().as_secs_f64()
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
