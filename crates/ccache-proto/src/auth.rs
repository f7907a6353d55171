//! Access to the cache's RDMA listeners and push channel: the proof of a
//! shared token, and the refusals, as they travel in private data.
//!
//! A deployment shares one 32-byte token between ccappd and its proxies
//! (`--token-file`). The token itself never goes on the wire: a peer
//! proves that it holds it with a MAC (HMAC-SHA-256, computed by the I/O
//! layer; this crate has no dependencies) over a fresh nonce, a label
//! naming what the proof is for, and the data it covers. The verifier
//! recomputes the MAC and compares the two in constant time.
//!
//! ## Where a proof travels
//!
//! - **MPA Request private data** (RFC 5044 §7.1: "Private Data ... may be
//!   used by the ULP"; RFC 6581 keeps it, after the enhanced-setup word):
//!   a proxy connecting to ccappd's version table, and ccappd connecting
//!   to a proxy's cache state region, send a [`ConnProof`] (bound to a
//!   time, accepted once) as the whole private data of their MPA Request.
//!   The listener checks it **before** it creates a queue pair, and
//!   refuses a missing, wrong, replayed or stale one with an
//!   MPA Reject (RFC 5044 §7.1.3: the Reply frame with the Rej bit set)
//!   whose private data is a [`Refusal`]: the version table's
//!   advertisement (address and STag) is only in an accepted Reply.
//! - **Push channel `REGISTER`**: the registration is followed by a
//!   version-2 proof (a [`ConnProof`], label [`LABEL_REGISTER`]) whose MAC
//!   covers the (masked) registration too:
//!   `HMAC(token, label | nonce | time | registration)`. ccappd checks it
//!   like a listener checks an MPA Request's (time window, nonce accepted
//!   once), so a recorded registration is worth nothing. A replay is
//!   refused with push status `AccessDenied`, a stale proof with `Stale`,
//!   a version-1 proof with `Outdated`. The region's address
//!   and STag in it are masked by a key derived from the token and the
//!   nonce (see [`mask_registration`]), so a peer that is not ccappd (a
//!   wrong `--push-appd`) learns neither. ccappd answers `REGISTERED` with
//!   its own 32-byte MAC over the proxy's nonce: a proxy serves pushes only
//!   from a ccappd that proved it holds the token.
//!
//! ## Connection proof, version 2 (60 bytes, MPA Request private data)
//!
//! ```text
//!  0       4                  20             28                      60
//! +-------+------------------+--------------+-----------------------+
//! | "CCA2"| nonce (16)       | time u64     | MAC (32)              |
//! +-------+------------------+--------------+-----------------------+
//! ```
//!
//! `MAC = HMAC-SHA-256(token, label | nonce | time)`, `time` the prover's
//! wall clock in milliseconds since the Unix epoch, big-endian, and the
//! label one of `LABEL_VERSION_TABLE`, `LABEL_STATE_REGION` (version 2
//! labels, `ccache/2 ...`, so no version-1 MAC is ever a version-2 one).
//! A listener accepts a [`ConnProof`] only if its MAC is right, its time
//! is within [`PROOF_WINDOW_MS`] of the listener's clock, and its nonce was
//! not accepted before (the I/O layer keeps the nonces of the window, in a
//! bounded cache with a horizon below which it refuses every proof): a
//! proof read off the wire is worth nothing on a new connection.
//!
//! The proof is not bound to the TCP addresses: the prover builds it
//! before it connects (its source port is not known yet), and across a NAT
//! neither end sees the other's pair. The nonce cache is what refuses a
//! replay at the listener the proof was made for.
//!
//! Version 1 (`"CCA1" | nonce | MAC(label | nonce)`, 52 bytes, labels
//! `ccache/1 ...`) could be replayed; a listener of this version refuses it
//! with [`Refusal::Outdated`] (and an old listener refuses version 2 with
//! its "access denied").
//!
//! ## Proof (52 bytes)
//!
//! ```text
//!  0       4                  20                                 52
//! +-------+------------------+----------------------------------+
//! | "CCA1"| nonce (16)       | MAC (32)                         |
//! +-------+------------------+----------------------------------+
//! ```
//!
//! `MAC = HMAC-SHA-256(token, label | nonce | covered data)`, with one of
//! the `LABEL_*` constants.
//!
//! ## Refusal (8 bytes, MPA Reject private data)
//!
//! ```text
//!  0       4          8
//! +-------+----------+
//! | "CCRJ"| code u32 |
//! +-------+----------+
//! ```
//!
//! Codes: 1 access denied (no proof, a wrong one, or one already used),
//! 2 busy (the listener's live-connection limit is reached), 3 outdated (a
//! version-1 proof: upgrade the peer), 4 stale (the proof's time is
//! outside the listener's window: the clocks differ, or it was recorded).
//!
//! ## Compatibility
//!
//! A listener without a token ignores the Request's private data, as
//! before, so old and new clients connect. A listener with a token refuses
//! a client without one (an old client, or one not given the token file).
//! A client with a token sends its proof to an old listener, which ignores
//! it.

use std::fmt;

/// Magic of a [`Proof`].
pub const PROOF_MAGIC: [u8; 4] = *b"CCA1";
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a MAC (HMAC-SHA-256).
pub const MAC_LEN: usize = 32;
/// Bytes of a [`Proof`].
pub const PROOF_LEN: usize = 4 + NONCE_LEN + MAC_LEN;
/// Magic of a [`ConnProof`] (version 2 of the MPA Request's proof).
pub const CONN_PROOF_MAGIC: [u8; 4] = *b"CCA2";
/// Bytes of a [`ConnProof`].
pub const CONN_PROOF_LEN: usize = 4 + NONCE_LEN + 8 + MAC_LEN;
/// How far a [`ConnProof`]'s time may be from the listener's clock, either
/// way (the clock skew tolerated between hosts, and the time a recorded
/// proof could be tried at a listener that never saw it).
pub const PROOF_WINDOW_MS: u64 = 30_000;
/// Magic of a [`Refusal`].
pub const REFUSAL_MAGIC: [u8; 4] = *b"CCRJ";
/// Bytes of a [`Refusal`].
pub const REFUSAL_LEN: usize = 8;

/// Label of a [`ConnProof`] for ccappd's version table listener.
pub const LABEL_VERSION_TABLE: &[u8] = b"ccache/2 rdma version table";
/// Label of a [`ConnProof`] for a proxy's cache state region listener.
pub const LABEL_STATE_REGION: &[u8] = b"ccache/2 rdma state region";
/// Label of a proxy's (version-2) proof in `REGISTER`.
pub const LABEL_REGISTER: &[u8] = b"ccache/2 push register";
/// Label of ccappd's MAC in `REGISTERED`.
pub const LABEL_REGISTERED: &[u8] = b"ccache/1 push registered";
/// Label of the key stream that masks a registration's address and STag.
pub const LABEL_MASK: &[u8] = b"ccache/1 push mask";

/// A proof of the token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// Fresh random bytes of the prover.
    pub nonce: [u8; NONCE_LEN],
    /// `HMAC(token, label | nonce | covered)`.
    pub mac: [u8; MAC_LEN],
}

impl fmt::Debug for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Proof(..)")
    }
}

/// Private data that is not what a ccache peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// Too few bytes (an empty one: the peer sent no proof).
    Truncated {
        /// Present.
        len: usize,
        /// Needed.
        need: usize,
    },
    /// Not the magic.
    BadMagic([u8; 4]),
    /// A version-1 proof ([`PROOF_MAGIC`]) where version 2 is needed.
    Outdated,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Truncated { len: 0, .. } => {
                f.write_str("no access proof in the private data (the peer has no --token-file)")
            }
            AuthError::Truncated { len, need } => {
                write!(f, "access proof of {len} bytes, need {need}")
            }
            AuthError::BadMagic(m) => {
                write!(f, "private data starts {m:02x?}, not a ccache access proof")
            }
            AuthError::Outdated => f.write_str(
                "a version-1 access proof (CCA1), which can be replayed; this listener needs version 2 (CCA2): upgrade the peer (ccproxy, ccping or ccappd) to this release",
            ),
        }
    }
}

impl std::error::Error for AuthError {}

impl Proof {
    /// Parse the first [`PROOF_LEN`] bytes of untrusted private data.
    pub fn parse(b: &[u8]) -> Result<Proof, AuthError> {
        let b: &[u8; PROOF_LEN] =
            b.get(..PROOF_LEN)
                .and_then(|s| s.try_into().ok())
                .ok_or(AuthError::Truncated {
                    len: b.len(),
                    need: PROOF_LEN,
                })?;
        if b[..4] != PROOF_MAGIC {
            return Err(AuthError::BadMagic([b[0], b[1], b[2], b[3]]));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[4..4 + NONCE_LEN]);
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&b[4 + NONCE_LEN..]);
        Ok(Proof { nonce, mac })
    }

    /// The bytes.
    pub fn emit(&self) -> [u8; PROOF_LEN] {
        let mut b = [0u8; PROOF_LEN];
        b[..4].copy_from_slice(&PROOF_MAGIC);
        b[4..4 + NONCE_LEN].copy_from_slice(&self.nonce);
        b[4 + NONCE_LEN..].copy_from_slice(&self.mac);
        b
    }
}

/// A proof of the token for one connection (version 2): see the module
/// documentation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConnProof {
    /// Fresh random bytes of the prover.
    pub nonce: [u8; NONCE_LEN],
    /// The prover's wall clock, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `HMAC(token, label | nonce | time_ms as 8 big-endian bytes)`.
    pub mac: [u8; MAC_LEN],
}

impl fmt::Debug for ConnProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnProof(time_ms: {}, ..)", self.time_ms)
    }
}

impl ConnProof {
    /// Parse the first [`CONN_PROOF_LEN`] bytes of untrusted private data.
    /// A version-1 proof is [`AuthError::Outdated`].
    pub fn parse(b: &[u8]) -> Result<ConnProof, AuthError> {
        if b.len() >= 4 && b[..4] == PROOF_MAGIC {
            return Err(AuthError::Outdated);
        }
        let b: &[u8; CONN_PROOF_LEN] = b
            .get(..CONN_PROOF_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(AuthError::Truncated {
                len: b.len(),
                need: CONN_PROOF_LEN,
            })?;
        if b[..4] != CONN_PROOF_MAGIC {
            return Err(AuthError::BadMagic([b[0], b[1], b[2], b[3]]));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[4..20]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[20..28]);
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&b[28..]);
        Ok(ConnProof {
            nonce,
            time_ms: u64::from_be_bytes(t),
            mac,
        })
    }

    /// The bytes.
    pub fn emit(&self) -> [u8; CONN_PROOF_LEN] {
        let mut b = [0u8; CONN_PROOF_LEN];
        b[..4].copy_from_slice(&CONN_PROOF_MAGIC);
        b[4..20].copy_from_slice(&self.nonce);
        b[20..28].copy_from_slice(&self.time_ms.to_be_bytes());
        b[28..].copy_from_slice(&self.mac);
        b
    }
}

/// Why a listener refused a connection (MPA Reject private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No proof, or a wrong one.
    AccessDenied,
    /// The listener's live-connection limit is reached.
    Busy,
    /// A version-1 proof: the peer must be upgraded.
    Outdated,
    /// The proof's time is outside the listener's window (or below what
    /// its nonce cache still remembers).
    Stale,
    /// A code this version does not know.
    Unknown(u32),
}

impl Refusal {
    /// The code on the wire.
    pub fn code(self) -> u32 {
        match self {
            Refusal::AccessDenied => 1,
            Refusal::Busy => 2,
            Refusal::Outdated => 3,
            Refusal::Stale => 4,
            Refusal::Unknown(c) => c,
        }
    }

    /// The bytes.
    pub fn emit(self) -> [u8; REFUSAL_LEN] {
        let mut b = [0u8; REFUSAL_LEN];
        b[..4].copy_from_slice(&REFUSAL_MAGIC);
        b[4..].copy_from_slice(&self.code().to_be_bytes());
        b
    }

    /// The refusal in a Reject's private data, if it holds one.
    pub fn parse(b: &[u8]) -> Option<Refusal> {
        if b.len() < REFUSAL_LEN || b[..4] != REFUSAL_MAGIC {
            return None;
        }
        Some(match u32::from_be_bytes([b[4], b[5], b[6], b[7]]) {
            1 => Refusal::AccessDenied,
            2 => Refusal::Busy,
            3 => Refusal::Outdated,
            4 => Refusal::Stale,
            c => Refusal::Unknown(c),
        })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::AccessDenied => f.write_str("access denied: no access proof, a wrong one, or one already used (give both ends the same --token-file; a listener older than replay-proof tokens refuses every version-2 proof: upgrade it too)"),
            Refusal::Outdated => f.write_str("outdated access proof: the listener needs version 2 (replay-proof tokens); upgrade this program to the listener's release"),
            Refusal::Stale => write!(f, "stale access proof: its time is more than {} s from the listener's clock (synchronise the two hosts' clocks, e.g. with chrony or systemd-timesyncd; right after the listener restarts, a host whose clock is behind is refused until it catches up: retry)", PROOF_WINDOW_MS / 1000),
            Refusal::Busy => f.write_str("busy: the listener's live-connection limit is reached (raise --rdma-max-conns / --state-rdma-max-conns there, or use fewer --check-conns)"),
            Refusal::Unknown(c) => write!(f, "refused with code {c}"),
        }
    }
}

/// XOR a registration's region address (bytes 20..28) and STag (28..32)
/// with the first 12 bytes of `key` (the I/O layer derives it as
/// `HMAC(token, LABEL_MASK | nonce)`). Applying it twice gives the
/// registration back.
pub fn mask_registration(reg: &mut [u8; crate::push::REGISTRATION_LEN], key: &[u8; MAC_LEN]) {
    for (b, k) in reg[20..32].iter_mut().zip(key) {
        *b ^= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_vector_and_errors() {
        let p = Proof {
            nonce: [0x11; NONCE_LEN],
            mac: [0xab; MAC_LEN],
        };
        let b = p.emit();
        assert_eq!(&b[..4], b"CCA1");
        assert_eq!(&b[4..20], &[0x11; 16]);
        assert_eq!(&b[20..], &[0xab; 32]);
        assert_eq!(Proof::parse(&b), Ok(p));
        let mut long = b.to_vec();
        long.extend_from_slice(b"tail");
        assert_eq!(Proof::parse(&long), Ok(p));
        assert_eq!(
            Proof::parse(&[]),
            Err(AuthError::Truncated { len: 0, need: 52 })
        );
        assert!(AuthError::Truncated { len: 0, need: 52 }
            .to_string()
            .contains("--token-file"));
        assert_eq!(
            Proof::parse(&b[..51]),
            Err(AuthError::Truncated { len: 51, need: 52 })
        );
        let mut bad = b;
        bad[3] = b'2';
        assert_eq!(Proof::parse(&bad), Err(AuthError::BadMagic(*b"CCA2")));
        assert_eq!(format!("{p:?}"), "Proof(..)");
    }

    #[test]
    fn conn_proof_vector_and_errors() {
        let p = ConnProof {
            nonce: [0x11; NONCE_LEN],
            time_ms: 0x0102_0304_0506_0708,
            mac: [0xab; MAC_LEN],
        };
        let b = p.emit();
        assert_eq!(b.len(), 60);
        assert_eq!(&b[..4], b"CCA2");
        assert_eq!(&b[4..20], &[0x11; 16]);
        assert_eq!(&b[20..28], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[28..], &[0xab; 32]);
        assert_eq!(ConnProof::parse(&b), Ok(p));
        assert_eq!(
            ConnProof::parse(&b[..59]),
            Err(AuthError::Truncated { len: 59, need: 60 })
        );
        assert_eq!(
            ConnProof::parse(&[]),
            Err(AuthError::Truncated { len: 0, need: 60 })
        );
        // A version-1 proof names the upgrade, whatever its length.
        let v1 = Proof {
            nonce: [0x11; NONCE_LEN],
            mac: [0xab; MAC_LEN],
        }
        .emit();
        assert_eq!(ConnProof::parse(&v1), Err(AuthError::Outdated));
        assert!(AuthError::Outdated.to_string().contains("upgrade"));
        let mut bad = b;
        bad[3] = b'9';
        assert_eq!(ConnProof::parse(&bad), Err(AuthError::BadMagic(*b"CCA9")));
        assert_ne!(LABEL_VERSION_TABLE, b"ccache/1 rdma version table");
        assert!(format!("{p:?}").starts_with("ConnProof(time_ms"));
    }

    #[test]
    fn refusal_vector() {
        assert_eq!(
            Refusal::AccessDenied.emit(),
            [b'C', b'C', b'R', b'J', 0, 0, 0, 1]
        );
        assert_eq!(Refusal::Busy.emit(), [b'C', b'C', b'R', b'J', 0, 0, 0, 2]);
        for r in [
            Refusal::AccessDenied,
            Refusal::Busy,
            Refusal::Outdated,
            Refusal::Stale,
            Refusal::Unknown(9),
        ] {
            assert_eq!(Refusal::parse(&r.emit()), Some(r));
        }
        assert_eq!(Refusal::parse(b"no QP"), None);
        assert_eq!(Refusal::parse(&[]), None);
        assert!(Refusal::AccessDenied.to_string().contains("--token-file"));
    }

    #[test]
    fn mask_is_an_involution_on_address_and_stag_only() {
        let mut r = [7u8; crate::push::REGISTRATION_LEN];
        let k = [0x5a; MAC_LEN];
        mask_registration(&mut r, &k);
        assert_eq!(&r[..20], &[7; 20]);
        assert_eq!(&r[20..32], &[7 ^ 0x5a; 12]);
        assert_eq!(&r[32..], &[7; 8]);
        mask_registration(&mut r, &k);
        assert_eq!(r, [7; crate::push::REGISTRATION_LEN]);
    }
}
