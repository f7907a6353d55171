//! Race-free confinement of file operations to rftpd's root.
//!
//! [`crate::util::resolve`] checks a client's path lexically and then
//! canonicalizes it, but the check and the use are two system calls: a
//! symlink swapped in between (by a local user, or by the client itself
//! through another session) would let the use leave the root. Here every
//! lookup starts from a descriptor of the root and is done by the kernel
//! with `openat2(2)` and `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, which
//! fails with `EXDEV` whenever resolution would leave the root, symlinks
//! and `..` included, at the moment of the lookup. The result is an
//! `O_PATH` descriptor; the operation then names the object (or, for
//! create, rename and delete, a name inside its parent directory) through
//! `/proc/self/fd/N`, which refers to exactly that object, so nothing is
//! looked up twice.
//!
//! Where `openat2` is missing (Linux before 5.6, or seccomp filters that
//! refuse it), [`Root`] walks the path one component at a time with
//! `openat(O_PATH | O_NOFOLLOW)`: stricter, it refuses every symlink
//! instead of only those that leave the root.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// How [`Root`] resolves paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
    Openat2,
    /// One `openat(O_NOFOLLOW)` per component; symlinks are refused.
    NoFollowWalk,
}

/// The served directory, held open.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    mode: Mode,
}

/// An object (file or directory) found beneath the root; [`Found::path`]
/// names exactly it while this value lives.
#[derive(Debug)]
pub struct Found {
    fd: OwnedFd,
}

impl Found {
    /// A path that refers to this object and nothing else.
    pub fn path(&self) -> PathBuf {
        fd_path(self.fd.as_raw_fd())
    }
}

/// A name inside a directory found beneath the root (for create, rename,
/// delete and mkdir, which act on the name, not on what it points to).
#[derive(Debug)]
pub struct Entry {
    dir: OwnedFd,
    name: OsString,
}

impl Entry {
    /// `/proc/self/fd/DIR/NAME`: the directory is pinned, the last
    /// component is one name without a slash. Callers must not follow a
    /// symlink in that last component (create with `O_NOFOLLOW`; rename,
    /// unlink, rmdir and mkdir never do).
    pub fn path(&self) -> PathBuf {
        fd_path(self.dir.as_raw_fd()).join(&self.name)
    }

    /// The name.
    pub fn name(&self) -> &OsStr {
        &self.name
    }
}

fn fd_path(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `openat2(dirfd, path, O_PATH | O_CLOEXEC, RESOLVE_BENEATH | NO_MAGICLINKS)`.
fn openat2_beneath(dir: RawFd, path: &CString) -> io::Result<OwnedFd> {
    // SAFETY: an all-zero open_how is a valid value of this plain C struct
    // (and what the kernel expects of fields we do not set).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `path` is a live NUL-terminated string, `how` a live
    // open_how whose size is passed; the kernel reads both and returns a
    // new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC [| O_DIRECTORY])`.
fn openat_nofollow(dir: RawFd, name: &CString, directory: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if directory {
        flags |= libc::O_DIRECTORY;
    }
    // SAFETY: `name` is a live NUL-terminated string; openat returns a new
    // descriptor or -1.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel refused to leave the root (or to follow a symlink, in the
/// fallback): reported as "permission denied" with the reason.
fn escapes(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::EXDEV) | Some(libc::ELOOP) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the path leaves the served directory (through a symbolic link)",
        ),
        _ => e,
    }
}

impl Root {
    /// Open `dir` (the served root) and pick `openat2` if the kernel has it.
    pub fn open(dir: &Path) -> io::Result<Root> {
        let fd = File::open(dir)?.into();
        let probe = CString::new(".").expect("no NUL");
        let mode = if std::env::var_os("RFTPD_CONFINE_FALLBACK").is_some() {
            Mode::NoFollowWalk
        } else {
            match openat2_beneath(std::os::fd::AsRawFd::as_raw_fd(&fd), &probe) {
                Ok(_) => Mode::Openat2,
                Err(e) => {
                    tracing::warn!(error = %e, "openat2(2) unavailable; confining paths by an O_NOFOLLOW walk (symlinks are refused)");
                    Mode::NoFollowWalk
                }
            }
        };
        Ok(Root { fd, mode })
    }

    /// How paths are resolved.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The object at `rel` (relative to the root; "" is the root).
    pub fn find(&self, rel: &Path) -> io::Result<Found> {
        let parts = components(rel)?;
        let fd = match self.mode {
            Mode::Openat2 => {
                let p = if parts.is_empty() {
                    CString::new(".").expect("no NUL")
                } else {
                    cstr(rel.as_os_str())?
                };
                openat2_beneath(self.fd.as_raw_fd(), &p).map_err(escapes)?
            }
            Mode::NoFollowWalk => self.walk(&parts, parts.len())?,
        };
        Ok(Found { fd })
    }

    /// The name `rel` inside its (existing) parent directory.
    pub fn entry(&self, rel: &Path) -> io::Result<Entry> {
        let parts = components(rel)?;
        let Some((name, dirs)) = parts.split_last() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the root itself cannot be created, renamed or removed",
            ));
        };
        let dir = match self.mode {
            Mode::Openat2 => {
                let parent: PathBuf = dirs.iter().collect();
                let p = if dirs.is_empty() {
                    CString::new(".").expect("no NUL")
                } else {
                    cstr(parent.as_os_str())?
                };
                openat2_beneath(self.fd.as_raw_fd(), &p).map_err(escapes)?
            }
            Mode::NoFollowWalk => self.walk(dirs, dirs.len())?,
        };
        Ok(Entry {
            dir,
            name: name.to_os_string(),
        })
    }

    /// The fallback: component by component, no symlinks at all.
    fn walk(&self, parts: &[&OsStr], n: usize) -> io::Result<OwnedFd> {
        let mut cur = openat_nofollow(
            self.fd.as_raw_fd(),
            &CString::new(".").expect("no NUL"),
            true,
        )?;
        for (i, p) in parts.iter().take(n).enumerate() {
            let last = i + 1 == n;
            cur = openat_nofollow(cur.as_raw_fd(), &cstr(p)?, !last)
                .map_err(escapes)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOTDIR) if !last => io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "a directory of the path is a symbolic link or not a directory",
                    ),
                    _ => e,
                })?;
            if last {
                // O_PATH | O_NOFOLLOW opens a symlink itself: refuse it, or
                // a later open through /proc/self/fd would follow it.
                let f = File::from(cur);
                if f.metadata()?.file_type().is_symlink() {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "the path is a symbolic link (not followed without openat2)",
                    ));
                }
                cur = f.into();
            }
        }
        Ok(cur)
    }
}

/// The normal components of `rel`; anything else (`..`, a root, a prefix)
/// is refused, so a caller cannot bypass the lexical check by accident.
fn components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    rel.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "only plain names below the root",
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f.txt"), b"inside").unwrap();
        std::fs::write(d.path().join("secret"), b"outside").unwrap();
        symlink(d.path().join("secret"), root.join("out-abs")).unwrap();
        symlink("../secret", root.join("out-rel")).unwrap();
        symlink(d.path(), root.join("out-dir")).unwrap();
        symlink("sub/f.txt", root.join("in-link")).unwrap();
        (d, root)
    }

    fn roots(root: &Path) -> Vec<Root> {
        let a = Root::open(root).unwrap();
        let b = Root {
            fd: File::open(root).unwrap().into(),
            mode: Mode::NoFollowWalk,
        };
        vec![a, b]
    }

    #[test]
    fn finds_inside_and_refuses_every_way_out() {
        let (_d, root) = tree();
        for r in roots(&root) {
            let f = r.find(Path::new("sub/f.txt")).unwrap();
            assert_eq!(std::fs::read(f.path()).unwrap(), b"inside", "{:?}", r.mode);
            for bad in ["out-abs", "out-rel", "out-dir/secret", "out-dir"] {
                let e = r.find(Path::new(bad)).unwrap_err();
                assert_eq!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied,
                    "{bad} {:?}: {e}",
                    r.mode
                );
            }
            assert!(r.find(Path::new("../secret")).is_err());
            assert!(r.find(Path::new("/etc/passwd")).is_err());
            let e = r.entry(Path::new("out-dir/new")).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{:?}", r.mode);
            // The root itself.
            assert!(r.find(Path::new("")).unwrap().path().is_dir());
        }
        // A symlink that stays inside works with openat2 only.
        let r = Root::open(&root).unwrap();
        if r.mode() == Mode::Openat2 {
            let f = r.find(Path::new("in-link")).unwrap();
            assert_eq!(std::fs::read(f.path()).unwrap(), b"inside");
        }
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_after_the_lookup_is_not_followed() {
        let (d, root) = tree();
        for r in roots(&root) {
            let e = r.entry(Path::new("sub/new.txt")).unwrap();
            // Swap: sub becomes a link to the directory outside.
            std::fs::rename(root.join("sub"), root.join("sub.old")).unwrap();
            symlink(d.path(), root.join("sub")).unwrap();
            std::fs::write(e.path(), b"x").unwrap();
            assert!(root.join("sub.old/new.txt").exists(), "{:?}", r.mode);
            assert!(!d.path().join("new.txt").exists(), "{:?}", r.mode);
            std::fs::remove_file(root.join("sub")).unwrap();
            std::fs::rename(root.join("sub.old"), root.join("sub")).unwrap();
            std::fs::remove_file(root.join("sub/new.txt")).unwrap();
        }
    }
}
