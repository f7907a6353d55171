//! Helpers shared by server and client: path confinement, directory
//! listings, RFC 3659 time stamps, SHA-256 of files.

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// `..` above the root.
    Escapes,
    /// A symbolic link (or the path itself) leads outside the root.
    SymlinkOut,
    /// NUL or other unusable bytes.
    Invalid,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PathError::Escapes => "path escapes the root",
            PathError::SymlinkOut => "path leads outside the root through a symbolic link",
            PathError::Invalid => "invalid path",
        })
    }
}

/// Resolve the client's `arg` against the virtual working directory
/// `cwd` ("/"-rooted) inside `root` (canonical). Returns the normalized
/// virtual path and the real path. `..` may not climb above the root,
/// and the longest existing prefix of the real path, with symbolic links
/// resolved, must stay inside `root`.
pub fn resolve(root: &Path, cwd: &str, arg: &str) -> Result<(String, PathBuf), PathError> {
    if arg.contains('\0') {
        return Err(PathError::Invalid);
    }
    let joined = if arg.starts_with('/') {
        arg.to_string()
    } else {
        format!("{cwd}/{arg}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(PathError::Escapes);
                }
            }
            p => parts.push(p),
        }
    }
    let mut real = root.to_path_buf();
    for p in &parts {
        real.push(p);
    }
    // Every component must be a normal name (no prefix or root sneaked in).
    if real
        .strip_prefix(root)
        .map(|r| r.components().any(|c| !matches!(c, Component::Normal(_))))
        .unwrap_or(true)
    {
        return Err(PathError::Invalid);
    }
    let mut probe = real.clone();
    loop {
        match probe.canonicalize() {
            Ok(c) => {
                if !c.starts_with(root) {
                    return Err(PathError::SymlinkOut);
                }
                break;
            }
            Err(_) => {
                // A dangling symlink is refused outright.
                if probe.symlink_metadata().is_ok() {
                    return Err(PathError::SymlinkOut);
                }
                if !probe.pop() {
                    break;
                }
            }
        }
    }
    Ok((format!("/{}", parts.join("/")), real))
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's
/// `civil_from_days`).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn parts(t: SystemTime) -> (i64, u32, u32, u64, u64, u64) {
    let s = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil((s / 86_400) as i64);
    let r = s % 86_400;
    (y, m, d, r / 3600, r / 60 % 60, r % 60)
}

/// RFC 3659 §2.3 time-val: `YYYYMMDDHHMMSS` in UTC.
pub fn mdtm(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = parts(t);
    format!("{y:04}{mo:02}{d:02}{h:02}{mi:02}{s:02}")
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// One `ls -l` style line (what curl, lftp and ftplib expect from LIST).
pub fn list_line(name: &str, md: &Metadata) -> String {
    let kind = if md.is_dir() {
        'd'
    } else if md.file_type().is_symlink() {
        'l'
    } else {
        '-'
    };
    let mode = md.permissions().mode();
    let mut perms = String::with_capacity(9);
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        perms.push(if bits & 4 != 0 { 'r' } else { '-' });
        perms.push(if bits & 2 != 0 { 'w' } else { '-' });
        perms.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    let (_, mo, d, h, mi, _) = parts(md.modified().unwrap_or(UNIX_EPOCH));
    format!(
        "{kind}{perms} {:>3} ftp ftp {:>12} {} {d:>2} {h:02}:{mi:02} {name}",
        md.nlink(),
        md.len(),
        MONTHS[(mo - 1) as usize]
    )
}

/// One RFC 3659 §7 MLSD fact line.
pub fn mlsd_line(name: &str, md: &Metadata) -> String {
    let ty = if md.is_dir() { "dir" } else { "file" };
    format!(
        "type={ty};size={};modify={}; {name}",
        md.len(),
        mdtm(md.modified().unwrap_or(UNIX_EPOCH))
    )
}

/// SHA-256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    crate::checksum::file_digest(path, crate::checksum::Algo::Sha256)
}

/// Lowercase hex (it lives with the digests, in [`crate::checksum`]).
pub use crate::checksum::hex;

/// Sizes are written as every tool writes them (crates/iwarp-conf):
/// `4096`, `512K`, `64M`, `1GiB`, `2T`.
pub use iwarp_conf::parse_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confinement() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("a")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("in")).unwrap();
        assert_eq!(resolve(&root, "/", "a").unwrap().0, "/a");
        assert_eq!(resolve(&root, "/a", "..").unwrap().0, "/");
        assert_eq!(resolve(&root, "/a", "../a/./x").unwrap().0, "/a/x");
        assert_eq!(resolve(&root, "/", "/a").unwrap().1, root.join("a"));
        assert_eq!(resolve(&root, "/", ".."), Err(PathError::Escapes));
        assert_eq!(
            resolve(&root, "/a", "../../etc/passwd"),
            Err(PathError::Escapes)
        );
        assert_eq!(
            resolve(&root, "/", "out/passwd"),
            Err(PathError::SymlinkOut)
        );
        assert_eq!(resolve(&root, "/", "out"), Err(PathError::SymlinkOut));
        assert!(resolve(&root, "/", "in/new").is_ok());
        assert_eq!(resolve(&root, "/", "a\0b"), Err(PathError::Invalid));
    }

    #[test]
    fn time_and_sizes() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(
            mdtm(UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 3_723)),
            "20000229010203"
        );
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("x").is_err());
    }
}
