//! Verified transfers: both ends hash as the data flows, rftpd answers
//! HASH from the transfer's running digest, a resumed download hashes the
//! part it keeps, and a mismatch fails with both digests named. rftp and
//! rftpd run as processes; every wait is bounded.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{server, server_logged};
use rftp::checksum::{file_digest, Algo};

fn write_random(path: &Path, len: usize) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(path, data).unwrap();
}

/// Run rftp with `args`; (success, stdout + stderr).
fn rftp(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rftp"))
        .args(args)
        .args(["-q", "--timeout", "10"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn get_and_put_verify_with_running_digests_in_every_mode() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let s = server_logged("", "rftp=debug", Some(log.path()));
    write_random(&s.root.join("src.bin"), 9 << 20);
    let dir = tempfile::tempdir().unwrap();
    for (algo, flags) in [
        (Algo::Xxh3_128, vec!["--streams", "8"]),
        (Algo::Blake3, vec!["--checksum", "blake3", "--tcp"]),
        (Algo::Sha256, vec!["--checksum", "sha256", "--streams", "8"]),
        (Algo::Sha256, vec!["--xfer-mode", "tcp", "--streams", "2"]),
        (Algo::Sha256, vec!["--tcp"]),
        (Algo::Crc32c, vec!["--checksum", "crc32c", "--streams", "4"]),
        (Algo::Crc32c, vec!["--checksum", "crc32c", "--tcp"]),
    ] {
        let out = dir.path().join("got.bin");
        let _ = std::fs::remove_file(&out);
        let mut args = vec!["get", "--no-resume"];
        args.extend(&flags);
        let url = s.url("src.bin");
        let o = out.to_str().unwrap();
        args.extend([url.as_str(), "-o", o]);
        let (ok, text) = rftp(&args);
        assert!(ok, "{flags:?}: {text}");
        let want = file_digest(&s.root.join("src.bin"), algo).unwrap();
        assert_eq!(file_digest(&out, algo).unwrap(), want);
        // The upload back is verified the same way.
        let back = format!("back-{algo}-{}.bin", flags.len());
        let url = s.url(&back);
        let mut args = vec!["put"];
        args.extend(&flags);
        args.extend([o, url.as_str()]);
        let (ok, text) = rftp(&args);
        assert!(ok, "put {flags:?}: {text}");
        assert_eq!(file_digest(&s.root.join(&back), algo).unwrap(), want);
    }
    // rftpd answered HASH from the digests it computed while transferring
    // (7 downloads, 7 uploads), not by reading the files again.
    std::thread::sleep(Duration::from_millis(200));
    let text = std::fs::read_to_string(log.path()).unwrap();
    let served = text
        .matches("HASH from the transfer's running digest")
        .count();
    assert_eq!(served, 14, "{text}");
}

#[test]
fn a_resumed_download_hashes_the_kept_part_and_a_wrong_one_is_caught() {
    let s = server("");
    let src = s.root.join("f.bin");
    write_random(&src, 6 << 20);
    let data = std::fs::read(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("f.bin");
    let part = dir.path().join("f.bin.part");
    let url = s.url("f.bin");
    let o = out.to_str().unwrap();

    // An intact part: resumed, verified.
    std::fs::write(&part, &data[..(2 << 20) + 123]).unwrap();
    let (ok, text) = rftp(&["get", &url, "-o", o]);
    assert!(ok, "{text}");
    assert_eq!(std::fs::read(&out).unwrap(), data);

    // A part that differs from the server's file in one byte: the resumed
    // file is wrong, and the check says so with both digests.
    for algo in ["xxh3", "blake3", "sha256", "crc32c"] {
        let _ = std::fs::remove_file(&out);
        let mut bad = data[..3 << 20].to_vec();
        bad[1000] ^= 0x40;
        std::fs::write(&part, &bad).unwrap();
        let (ok, text) = rftp(&["get", "--checksum", algo, &url, "-o", o]);
        assert!(!ok, "{algo}: a wrong resumed part passed: {text}");
        let name = algo.parse::<Algo>().unwrap().wire_name();
        assert!(text.contains(&format!("{name} mismatch")), "{text}");
        assert!(
            text.contains("local ") && text.contains("server "),
            "{text}"
        );
    }
}

/// The checksum is negotiated (the best both offer, rsync style), in both
/// directions, with a server that offers fewer, with a server from before
/// the negotiation (SHA-256 only), and a client that asks for one the
/// server does not offer is told what it offers.
#[test]
fn checksums_are_negotiated_both_ways_and_with_an_old_server() {
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().join("got.bin");
    let o = o.to_str().unwrap();
    for (config, flags, want) in [
        ("", vec![], Some(Algo::Xxh3_128)),
        ("", vec!["--tcp"], Some(Algo::Xxh3_128)),
        (
            "hash_algorithms = [\"CRC32C\", \"BLAKE3\"]",
            vec![],
            Some(Algo::Blake3),
        ),
        (
            "hash_algorithms = [\"CRC32C\", \"BLAKE3\"]",
            vec!["--checksum", "crc32c"],
            Some(Algo::Crc32c),
        ),
        // An rftpd from before the negotiation offered SHA-256 only (and
        // CRC32C on request): auto takes SHA-256.
        (
            "hash_algorithms = [\"SHA-256\"]",
            vec![],
            Some(Algo::Sha256),
        ),
        (
            "hash_algorithms = [\"SHA-256\"]",
            vec!["--tcp"],
            Some(Algo::Sha256),
        ),
        (
            "hash_algorithms = [\"SHA-256\", \"CRC32C\"]",
            vec![],
            Some(Algo::Sha256),
        ),
        // Asked for one the server does not offer: refused, naming them.
        (
            "hash_algorithms = [\"SHA-256\"]",
            vec!["--checksum", "xxh3"],
            None,
        ),
    ] {
        let s = server(config);
        write_random(&s.root.join("src.bin"), (2 << 20) + 17);
        let _ = std::fs::remove_file(o);
        let url = s.url("src.bin");
        let mut args = vec!["get", "--no-resume", url.as_str(), "-o", o];
        args.extend(&flags);
        let (ok, text) = rftp(&args);
        let Some(algo) = want else {
            assert!(!ok, "{config} {flags:?}: {text}");
            assert!(
                text.contains("--checksum XXH3-128: the server offers SHA-256 (FEAT HASH)"),
                "{config} {flags:?}: {text}"
            );
            assert!(!dir.path().join("got.bin.part").exists());
            continue;
        };
        assert!(ok, "{config} {flags:?}: {text}");
        let digest = file_digest(&s.root.join("src.bin"), algo).unwrap();
        assert!(
            text.contains(&format!("{algo} verified: {digest}")),
            "{config} {flags:?}: want {algo}: {text}"
        );
        // The other direction negotiates the same.
        let up = s.url("up.bin");
        let mut args = vec!["put", o, up.as_str()];
        args.extend(&flags);
        let (ok, text) = rftp(&args);
        assert!(ok, "put {config} {flags:?}: {text}");
        assert!(
            text.contains(&format!("{algo} verified: {digest}")),
            "put {config} {flags:?}: want {algo}: {text}"
        );
    }
}

/// FEAT lists what is offered with the selection starred, and `OPTS HASH`
/// of an algorithm not offered gets 501 naming the offered ones
/// (draft-bryan-ftpext-hash §4), the selection unchanged.
#[test]
fn feat_lists_the_offer_and_opts_hash_refuses_with_the_list() {
    let s = server("");
    let mut f = s.ftp();
    let (c, t) = f.cmd("FEAT").unwrap();
    assert_eq!(c, 211);
    assert!(t.contains("HASH XXH3-128;BLAKE3;SHA-256*;CRC32C"), "{t}");
    let (c, t) = f.cmd("OPTS HASH MD5").unwrap();
    assert_eq!(c, 501, "{t}");
    assert!(t.contains("offers XXH3-128;BLAKE3;SHA-256;CRC32C"), "{t}");
    assert_eq!(f.cmd("OPTS HASH").unwrap().1, "SHA-256", "unchanged");
    assert_eq!(f.cmd("OPTS HASH BLAKE3").unwrap(), (200, "BLAKE3".into()));
    let (c, t) = f.cmd("FEAT").unwrap();
    assert!(c == 211 && t.contains("BLAKE3*;SHA-256;"), "{t}");
    f.quit();
    let old = server("hash_algorithms = [\"SHA-256\"]");
    let mut f = old.ftp();
    let (c, t) = f.cmd("OPTS HASH XXH3-128").unwrap();
    assert_eq!(c, 501, "{t}");
    assert!(t.contains("offers SHA-256 (FEAT HASH)"), "{t}");
    let (_, t) = f.cmd("FEAT").unwrap();
    assert!(
        t.contains("HASH SHA-256*\n") || t.ends_with("HASH SHA-256*"),
        "{t}"
    );
}
