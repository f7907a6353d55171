//! The environment, as library code may read it: not at all in a
//! privileged process.
//!
//! The stack's library crates end up inside other people's programs (the
//! preload shim `libiwarp_preload.so`, `libiwarp_rsocket.so`, the C API
//! `libiwarp.so`), and some of those programs are privileged: setuid or
//! setgid, or with file capabilities. The person who starts such a program
//! controls its environment but not its privileges, so a library must not
//! let the environment steer it there, the rule glibc applies to its own
//! variables (ld.so(8): `LD_PRELOAD`, `LD_LIBRARY_PATH`... are ignored in
//! "secure-execution mode") and offers to everyone else as
//! `secure_getenv(3)`.
//!
//! So every `IWARP_*` variable a library crate reads (`IWARP_DEVICE`,
//! `IWARP_CRC`, `IWARP_PROGRESS`, `IWARP_PROGRESS_THREADS`,
//! `IWARP_RDMA_CORE`, the `IWARP_SOCKETS_*` stream options) goes through
//! [`var`], which reads as unset under secure execution
//! ([`secure_execution`]: `AT_SECURE` in the auxiliary vector, what
//! `secure_getenv` checks). The built-in defaults then apply. The preload
//! shim's own `IWARP_PRELOAD_*` settings follow the same rule in
//! `iwarp-preload`'s config module, which also says so on stderr.
//!
//! Programs (rftp, rhttp, iwarp-perf...) may read their environment with
//! `std::env` directly: nobody installs them setuid, and their own
//! variables are theirs to interpret. The rule is for code that runs in
//! someone else's process.

use std::env::VarError;

/// Whether this process runs in secure-execution mode: the kernel set
/// `AT_SECURE` in its auxiliary vector because it gained privileges at
/// `execve` (setuid, setgid, file capabilities) or a security module asked
/// for it (getauxval(3), ld.so(8)). Fixed for the life of the process.
#[cfg(all(target_os = "linux", not(miri)))]
#[allow(unsafe_code)] // the one FFI call of this module
pub fn secure_execution() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector the kernel put on
    // the initial stack, which the C library saved at start-up and never
    // frees; it takes a plain integer and has no other effect (it sets
    // errno to ENOENT for an unknown type, and AT_SECURE is known).
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Whether this process runs in secure-execution mode. Outside Linux there
/// is no `AT_SECURE` to read: a process counts as privileged (the
/// environment is ignored) when its real and effective user or group ids
/// differ, what `issetugid(2)` approximates.
#[cfg(all(unix, not(target_os = "linux")))]
#[allow(unsafe_code)] // the FFI calls of this module
pub fn secure_execution() -> bool {
    // SAFETY: the four calls take no arguments and cannot fail (POSIX).
    unsafe { libc::getuid() != libc::geteuid() || libc::getgid() != libc::getegid() }
}

/// Under Miri, which cannot call `getauxval`: the interpreted test process
/// is never privileged (the sanitizer step runs the CRC tests, which read
/// `IWARP_CRC`, under Miri).
#[cfg(all(target_os = "linux", miri))]
pub fn secure_execution() -> bool {
    false
}

/// Whether this process runs in secure-execution mode: never, on a
/// system without set-user-id programs.
#[cfg(not(unix))]
pub fn secure_execution() -> bool {
    false
}

/// [`std::env::var`] for library code: the variable's value, or
/// `Err(VarError::NotPresent)` when it is unset **or the process is in
/// secure execution** ([`secure_execution`]), so that the defaults apply
/// in a privileged process (see the module documentation).
pub fn var(name: &str) -> Result<String, VarError> {
    var_if(!secure_execution(), name)
}

/// [`var`] with the secure-execution answer given (`trust`: the process
/// is not in secure execution), so that both cases can be tested in an
/// ordinary process.
fn var_if(trust: bool, name: &str) -> Result<String, VarError> {
    if trust {
        std::env::var(name)
    } else {
        Err(VarError::NotPresent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One variable no other test reads, set once (set_var is process-wide:
    // tests run on threads of one process). Only this test module reads it.
    const NAME: &str = "IWARP_ENV_RS_UNIT_TEST";

    fn set() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // set_var races with readers of the same variable on other
        // threads: set once, before any read, and nothing else reads NAME.
        ONCE.call_once(|| std::env::set_var(NAME, "nosuch"));
    }

    #[test]
    fn a_trusted_process_reads_the_variable() {
        set();
        assert_eq!(var_if(true, NAME).as_deref(), Ok("nosuch"));
        assert_eq!(
            var_if(true, "IWARP_ENV_RS_NEVER_SET"),
            Err(VarError::NotPresent)
        );
    }

    #[test]
    fn secure_execution_reads_every_variable_as_unset() {
        set();
        assert_eq!(var_if(false, NAME), Err(VarError::NotPresent));
        // Even one every process has.
        assert!(
            std::env::var_os("PATH").is_some(),
            "the test needs PATH set"
        );
        assert_eq!(var_if(false, "PATH"), Err(VarError::NotPresent));
    }

    /// The library crates that end up in other people's processes (the
    /// preload shim links all but `iwarp-ffi`, which is `libiwarp.so`).
    const LIBRARY_CRATES: &[&str] = &[
        "iwarp-proto",
        "iwarp-verbs",
        "iwarp-soft",
        "iwarp-rdmacore",
        "iwarp",
        "iwarp-sockets",
        "iwarp-rsocket",
        "iwarp-preload",
        "iwarp-ffi",
        "iwarp-tokio",
    ];
    /// Where a library crate may read the environment otherwise: this
    /// module, and the preload's configuration, which checks
    /// `secure_execution` itself (and says so on stderr).
    const ALLOWED: &[&str] = &["iwarp-proto/src/env.rs", "iwarp-preload/src/config.rs"];

    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn library_crates_read_the_environment_only_through_var() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        if !crates.join("iwarp-sockets/src").is_dir() {
            // A packaged iwarp-proto, without the workspace around it.
            eprintln!("not in the workspace: nothing to check");
            return;
        }
        let mut found = Vec::new();
        for c in LIBRARY_CRATES {
            let mut files = Vec::new();
            rust_files(&crates.join(c).join("src"), &mut files);
            for f in files {
                let rel = f
                    .strip_prefix(&crates)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if ALLOWED.contains(&rel.as_str()) {
                    continue;
                }
                let text = std::fs::read_to_string(&f).unwrap();
                for (i, line) in text.lines().enumerate() {
                    let code = line.trim_start();
                    let reads = [
                        "env::var(",
                        "env::var_os(",
                        "env::vars(",
                        "env::vars_os(",
                        "getenv(",
                    ]
                    .iter()
                    .any(|p| code.contains(p));
                    if reads
                        && !code.starts_with("//")
                        && !code.contains("proto::env::var(")
                        && !code.contains("crate::env::var(")
                    {
                        found.push(format!("{rel}:{}: {code}", i + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "library code reads the environment without iwarp_proto::env::var (a setuid \
             program's user could steer it); use that:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn the_test_process_is_not_in_secure_execution_and_var_reads_through() {
        // `cargo test` is not setuid: if this failed, the tests above would
        // not tell the two cases of `var` apart in a real process.
        assert!(!secure_execution());
        set();
        assert_eq!(var(NAME).as_deref(), Ok("nosuch"));
    }
}
