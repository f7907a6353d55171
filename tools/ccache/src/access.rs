//! Who may talk to ccappd and to a proxy's state region.
//!
//! - [`Allow`]: the uids and gids whose processes may use ccappd's Table 1
//!   IPC socket. The server reads the connecting process's credentials
//!   with `SO_PEERCRED` (unix(7): "the credentials of the peer process
//!   connected to this socket ... in effect at the time of the call to
//!   connect(2)") and refuses anyone else with `ERROR(not permitted)`. The
//!   socket's file mode (`--ipc-mode`, default 660) is the first fence, the
//!   credential check the second: a socket made world-writable by mistake
//!   still admits only the allowed users.
//! - [`Token`]: the shared access token of a cache deployment. ccappd
//!   presents it in the MPA private data when it connects to read a
//!   proxy's cache state region (RFC 5044 §7.1: the Request may carry
//!   private data for the ULP; RFC 6581's IRD/ORD block comes first, the
//!   token after it), and a proxy presents it in its push registration.
//!   Generated from the OS random number generator (`/dev/urandom`,
//!   random(4)), 32 bytes, stored as 64 hex digits in a file that only its
//!   owner can read (`--token-file`; the same file, or the same
//!   `token-file = PATH` line in the `--config` files, on every host).

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The uid/gid allow-list of the IPC socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    /// Allowed user ids (ccappd's own and root are always allowed).
    pub uids: Vec<u32>,
    /// Allowed group ids (the peer's effective gid at connect time).
    pub gids: Vec<u32>,
}

/// ccappd's own effective uid: the owner of `/proc/self` (proc(5): a
/// process's directory is owned by its effective user and group).
pub fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

impl Allow {
    /// Only ccappd's own uid and root.
    pub fn owner() -> Allow {
        let mut uids = vec![0, own_uid()];
        uids.dedup();
        Allow {
            uids,
            gids: Vec::new(),
        }
    }

    /// Whether a peer with these credentials may use the socket.
    pub fn permits(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// Add users (names from `/etc/passwd`, or numbers).
    pub fn add_users(&mut self, names: &[String]) -> Result<(), String> {
        for n in names {
            let id = resolve(n, Path::new("/etc/passwd")).ok_or_else(|| {
                format!("--ipc-allow-user {n}: no such user in /etc/passwd (give a name or a uid)")
            })?;
            self.uids.push(id);
        }
        Ok(())
    }

    /// Add groups (names from `/etc/group`, or numbers).
    pub fn add_groups(&mut self, names: &[String]) -> Result<(), String> {
        for n in names {
            let id = group_id(n).ok_or_else(|| {
                format!("--ipc-allow-group {n}: no such group in /etc/group (give a name or a gid)")
            })?;
            self.gids.push(id);
        }
        Ok(())
    }
}

/// A group's id: a number, or a name from `/etc/group`.
pub fn group_id(name: &str) -> Option<u32> {
    resolve(name, Path::new("/etc/group"))
}

/// A number, or the third field (the id) of the line of `file` (passwd(5)
/// or group(5) format) whose first field is `name`.
fn resolve(name: &str, file: &Path) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// Bytes of a token.
pub const TOKEN_LEN: usize = 32;

/// A deployment's shared access token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; TOKEN_LEN]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself in a log.
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A fresh token from the OS random number generator.
    pub fn generate() -> io::Result<Token> {
        let mut b = [0u8; TOKEN_LEN];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        Ok(Token(b))
    }

    /// The token's bytes (what goes into private data or a registration).
    pub fn bytes(&self) -> &[u8; TOKEN_LEN] {
        &self.0
    }

    /// Whether `presented` is this token, in time independent of where
    /// they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        if presented.len() != TOKEN_LEN {
            return false;
        }
        let diff = self
            .0
            .iter()
            .zip(presented)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }

    /// Read the token of `path` (64 hex digits); with `create`, write a
    /// fresh one (mode 0600) if the file does not exist.
    pub fn load(path: &Path, create: bool) -> Result<Token, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => Token::parse_hex(text.trim()).map_err(|e| {
                format!(
                    "--token-file {}: {e}; write 64 hex digits there, or delete it and let ccappd generate one",
                    path.display()
                )
            }),
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                let t = Token::generate()
                    .map_err(|e| format!("reading /dev/urandom for a token: {e}"))?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| format!("--token-file {}: creating it: {e}", path.display()))?;
                f.write_all(format!("{}\n", t.hex()).as_bytes())
                    .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
                tracing::info!(file = %path.display(), "generated a new access token; give this file to the proxies (token-file in their --config)");
                Ok(t)
            }
            Err(e) => Err(format!(
                "--token-file {}: {e} (ccappd writes one with --token-file on its first start; copy it to every proxy)",
                path.display()
            )),
        }
    }

    /// 64 hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// From 64 hex digits.
    pub fn parse_hex(s: &str) -> Result<Token, String> {
        if s.len() != 2 * TOKEN_LEN || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "a token is {} hex digits, got {} characters",
                2 * TOKEN_LEN,
                s.len()
            ));
        }
        let mut b = [0u8; TOKEN_LEN];
        for (i, x) in b.iter_mut().enumerate() {
            *x = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(Token(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list() {
        let mut a = Allow::owner();
        assert!(a.permits(0, 12345));
        assert!(a.permits(own_uid(), 12345));
        assert!(!a.permits(4242, 4242));
        a.add_users(&["4242".into()]).unwrap();
        assert!(a.permits(4242, 1));
        a.add_groups(&["root".into()]).unwrap();
        assert!(a.permits(777, 0));
        assert!(a
            .add_users(&["no-such-user-here".into()])
            .unwrap_err()
            .contains("no such user"));
    }

    #[test]
    fn tokens() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_ne!(a, b);
        assert!(a.matches(a.bytes()));
        assert!(!a.matches(b.bytes()));
        assert!(!a.matches(&a.bytes()[..31]));
        assert_eq!(Token::parse_hex(&a.hex()).unwrap(), a);
        assert!(Token::parse_hex("zz").is_err());
        assert_eq!(format!("{a:?}"), "Token(..)");
        let dir = std::env::temp_dir().join(format!("ccache-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        assert!(Token::load(&f, false).is_err());
        let t = Token::load(&f, true).unwrap();
        assert_eq!(Token::load(&f, false).unwrap(), t);
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
