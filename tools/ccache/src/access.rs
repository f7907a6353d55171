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
//! - [`Token`]: the shared access token of a cache deployment, 32 bytes
//!   from the OS random number generator (`/dev/urandom`, random(4)),
//!   stored as 64 hex digits in a file that only its owner may read
//!   (`--token-file`, mode 0600, checked; the same file, or the same
//!   `token_file = "PATH"` line in the `--config` files, on every host).
//!   It is on by default: ccappd makes [`APPD_TOKEN_FILE`] if it is given
//!   none, and its clients refuse to start without one where it is needed
//!   ([`client_token`]); `--insecure-no-token` opts out, on both sides.
//!   The token itself never goes on the wire: a peer proves it holds it
//!   with HMAC-SHA-256 (RFC 2104) over a fresh nonce and a label
//!   ([`Token::proof`], [`ccache_proto::auth`]): a proxy in the MPA
//!   private data of its connection to ccappd's version table, ccappd in
//!   its connection to a proxy's cache state region (RFC 5044 §7.1: the
//!   Request may carry private data for the ULP), a proxy in its push
//!   `REGISTER`, ccappd in its `REGISTERED`. The verifier recomputes the
//!   MAC and compares in constant time ([`Token::verify`]). The MPA
//!   Request's proof also covers the prover's clock
//!   ([`Token::conn_proof`], [`Token::verify_conn`]), and the listener
//!   accepts each nonce once within the time window
//!   ([`crate::replay::ReplayGuard`]): a recorded proof cannot be replayed.

use std::io::{self, Read, Write};

use ccache_proto::auth::{AuthError, ConnProof, Proof, MAC_LEN, NONCE_LEN};
use sha2::{Digest, Sha256};
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

/// ccappd's token file when `--token-file` is not given: in its state
/// directory, which outlives a reboot (a token under `/run`, beside the
/// IPC socket, would be made anew at every boot and lock the proxies out).
pub const APPD_TOKEN_FILE: &str = "/var/lib/ccappd/token";

/// The token a client of ccappd (ccproxy, ccping) runs with: `file`'s;
/// none with `insecure` (`--insecure-no-token`, logged); none if `needs`
/// is `None` (nothing it does takes a token). Otherwise an error that
/// names the cause and the fix: since tokens became the default, ccappd
/// refuses a peer without one, so a proxy that would be refused at every
/// check does not start.
pub fn client_token(
    program: &str,
    file: Option<&Path>,
    insecure: bool,
    needs: Option<&str>,
) -> Result<Option<Token>, String> {
    if let Some(f) = file {
        return Token::load(f, false).map(Some);
    }
    match needs {
        _ if insecure => {
            tracing::warn!("{program} --insecure-no-token: no access proof is sent and none is asked for (ccappd must run with --insecure-no-token too; a closed test network only)");
            Ok(None)
        }
        None => Ok(None),
        Some(what) => Err(format!(
            "{program}: no access token, and {what} needs one (ccappd refuses peers without it). Fix: copy ccappd's token file (by default {APPD_TOKEN_FILE} on its host) to this host, `chmod 600` it, and pass --token-file PATH (or token_file in --config); on a closed test network only, run both ccappd and {program} with --insecure-no-token"
        )),
    }
}

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
        ct_eq(&self.0, presented)
    }

    /// `HMAC-SHA-256(token, label | parts...)` (RFC 2104: `H(K ^ opad,
    /// H(K ^ ipad, text))`, the 32-byte key padded with zeros to SHA-256's
    /// 64-byte block).
    pub fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
        hmac_sha256(&self.0, label, parts)
    }

    /// A fresh proof for `label` covering `covered` (a new nonce from the
    /// OS random number generator).
    pub fn proof(&self, label: &[u8], covered: &[u8]) -> io::Result<Proof> {
        let nonce = nonce()?;
        let mac = self.mac(label, &[&nonce, covered]);
        Ok(Proof { nonce, mac })
    }

    /// Whether `presented` is `mac(label, parts)`, compared in constant
    /// time.
    pub fn check_mac(&self, label: &[u8], parts: &[&[u8]], presented: &[u8]) -> bool {
        ct_eq(&self.mac(label, parts), presented)
    }

    /// Whether `presented` (untrusted private data) is a proof of this
    /// token for `label` covering `covered`; the MACs are compared in time
    /// independent of where they differ.
    pub fn verify(&self, label: &[u8], presented: &[u8], covered: &[u8]) -> Result<Proof, String> {
        let p = Proof::parse(presented).map_err(|e| e.to_string())?;
        if ct_eq(&self.mac(label, &[&p.nonce, covered]), &p.mac) {
            Ok(p)
        } else {
            Err("wrong access proof (the peer's --token-file holds another token)".into())
        }
    }

    /// A fresh connection proof (version 2) for `label`, made at
    /// `time_ms` (the wall clock, [`now_ms`]; a test may give another).
    pub fn conn_proof(&self, label: &[u8], time_ms: u64) -> io::Result<ConnProof> {
        self.conn_proof_covering(label, time_ms, &[])
    }

    /// [`Token::conn_proof`] whose MAC covers `covered` too
    /// (`HMAC(token, label | nonce | time | covered)`: a `REGISTER`'s
    /// registration).
    pub fn conn_proof_covering(
        &self,
        label: &[u8],
        time_ms: u64,
        covered: &[u8],
    ) -> io::Result<ConnProof> {
        let nonce = nonce()?;
        let mac = self.mac(label, &[&nonce, &time_ms.to_be_bytes(), covered]);
        Ok(ConnProof {
            nonce,
            time_ms,
            mac,
        })
    }

    /// Whether `presented` (untrusted MPA Request private data) is a
    /// connection proof of this token for `label`, MACs compared in time
    /// independent of where they differ. Only the MAC: the caller checks
    /// the time and the nonce ([`crate::replay::ReplayGuard`]).
    pub fn verify_conn(&self, label: &[u8], presented: &[u8]) -> Result<ConnProof, ConnDenied> {
        self.verify_conn_covering(label, presented, &[])
    }

    /// [`Token::verify_conn`] for a proof whose MAC covers `covered` too
    /// (ccappd's check of a `REGISTER`).
    pub fn verify_conn_covering(
        &self,
        label: &[u8],
        presented: &[u8],
        covered: &[u8],
    ) -> Result<ConnProof, ConnDenied> {
        let p = ConnProof::parse(presented).map_err(|e| match e {
            AuthError::Outdated => ConnDenied::Outdated(e.to_string()),
            e => ConnDenied::Denied(e.to_string()),
        })?;
        if ct_eq(
            &self.mac(label, &[&p.nonce, &p.time_ms.to_be_bytes(), covered]),
            &p.mac,
        ) {
            Ok(p)
        } else {
            Err(ConnDenied::Denied(
                "wrong access proof (the peer's --token-file holds another token)".into(),
            ))
        }
    }

    /// Read the token of `path` (64 hex digits); with `create`, write a
    /// fresh one (mode 0600) if the file does not exist. A file that its
    /// group or others may read or write is refused (a secret only its
    /// owner may read, as ssh(1) refuses a private key).
    pub fn load(path: &Path, create: bool) -> Result<Token, String> {
        if let Ok(m) = std::fs::metadata(path) {
            if m.mode() & 0o077 != 0 {
                return Err(format!(
                    "--token-file {}: mode {:o} lets others read or change the access token; run `chmod 600 {}`",
                    path.display(),
                    m.mode() & 0o777,
                    path.display()
                ));
            }
        }
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
                "--token-file {}: {e} (ccappd writes one on its first start, by default {APPD_TOKEN_FILE}; copy it to every proxy)",
                path.display()
            )),
        }
    }

    /// ccappd's token: `path`'s, or a fresh one written there (mode 0600)
    /// if it does not exist, its directory made first (mode 0700) if that
    /// is missing too (`/var/lib/ccappd` on a first start).
    pub fn load_or_create(path: &Path) -> Result<Token, String> {
        use std::os::unix::fs::DirBuilderExt;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| {
                        format!(
                            "--token-file {}: creating its directory: {e} (run ccappd as a user who may create it, or pass --token-file PATH to a file ccappd may write)",
                            path.display()
                        )
                    })?;
            }
        }
        Token::load(path, true)
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

/// Why [`Token::verify_conn`] refused a proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnDenied {
    /// No proof, garbage, or a MAC of another token or label.
    Denied(String),
    /// A version-1 proof (an old peer).
    Outdated(String),
}

impl std::fmt::Display for ConnDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnDenied::Denied(m) | ConnDenied::Outdated(m) => f.write_str(m),
        }
    }
}

/// The wall clock in milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fresh nonce from the OS random number generator.
pub fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// Equal bytes, in time independent of where they differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// HMAC-SHA-256 (RFC 2104) of `label | parts...` under `key` (at most one
/// 64-byte block).
fn hmac_sha256(key: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(label);
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
    fn hmac_rfc4231_test_case_2() {
        // RFC 4231 §4.3: key "Jefe", data "what do ya want for nothing?".
        let want = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let got = hmac_sha256(b"Jefe", b"what do ya ", &[b"want ", b"for nothing?"]);
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, want);
    }

    #[test]
    fn proofs() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        let p = a.proof(b"label", b"covered").unwrap();
        let q = a.proof(b"label", b"covered").unwrap();
        assert_ne!(p.nonce, q.nonce, "every proof has a fresh nonce");
        assert!(a.verify(b"label", &p.emit(), b"covered").is_ok());
        assert!(a.verify(b"other", &p.emit(), b"covered").is_err());
        assert!(a.verify(b"label", &p.emit(), b"changed").is_err());
        assert!(b
            .verify(b"label", &p.emit(), b"covered")
            .unwrap_err()
            .contains("--token-file"));
        assert!(a
            .verify(b"label", &[], b"covered")
            .unwrap_err()
            .contains("--token-file"));
        let mut bad = p.emit();
        bad[51] ^= 1;
        assert!(a.verify(b"label", &bad, b"covered").is_err());
    }

    #[test]
    fn conn_proofs() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        let p = a.conn_proof(b"label", 1_000).unwrap();
        let q = a.conn_proof(b"label", 1_000).unwrap();
        assert_ne!(p.nonce, q.nonce, "every proof has a fresh nonce");
        assert_eq!(a.verify_conn(b"label", &p.emit()), Ok(p));
        assert!(matches!(
            a.verify_conn(b"other", &p.emit()),
            Err(ConnDenied::Denied(_))
        ));
        let e = b.verify_conn(b"label", &p.emit()).unwrap_err();
        assert!(e.to_string().contains("--token-file"), "{e}");
        // The time is covered by the MAC: a proof moved in time is wrong.
        let mut moved = p;
        moved.time_ms += 1;
        assert!(matches!(
            a.verify_conn(b"label", &moved.emit()),
            Err(ConnDenied::Denied(_))
        ));
        let v1 = a.proof(b"label", &[]).unwrap().emit();
        assert!(matches!(
            a.verify_conn(b"label", &v1),
            Err(ConnDenied::Outdated(_))
        ));
        assert!(matches!(
            a.verify_conn(b"label", &[]),
            Err(ConnDenied::Denied(_))
        ));
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
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::load(&f, false).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
