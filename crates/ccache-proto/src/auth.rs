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
//!   to a proxy's cache state region, send a [`Proof`] as the whole
//!   private data of their MPA Request. The listener checks it **before**
//!   it creates a queue pair, and refuses a missing or wrong one with an
//!   MPA Reject (RFC 5044 §7.1.3: the Reply frame with the Rej bit set)
//!   whose private data is a [`Refusal`]: the version table's
//!   advertisement (address and STag) is only in an accepted Reply.
//! - **Push channel `REGISTER`**: the registration is followed by a
//!   [`Proof`] whose MAC covers the registration too; the region's address
//!   and STag in it are masked by a key derived from the token and the
//!   nonce (see [`mask_registration`]), so a peer that is not ccappd (a
//!   wrong `--push-appd`) learns neither. ccappd answers `REGISTERED` with
//!   its own 32-byte MAC over the proxy's nonce: a proxy serves pushes only
//!   from a ccappd that proved it holds the token.
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
//! Codes: 1 access denied (no proof, or a wrong one), 2 busy (the
//! listener's live-connection limit is reached).
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
/// Magic of a [`Refusal`].
pub const REFUSAL_MAGIC: [u8; 4] = *b"CCRJ";
/// Bytes of a [`Refusal`].
pub const REFUSAL_LEN: usize = 8;

/// Label of a proof for ccappd's version table listener.
pub const LABEL_VERSION_TABLE: &[u8] = b"ccache/1 rdma version table";
/// Label of a proof for a proxy's cache state region listener.
pub const LABEL_STATE_REGION: &[u8] = b"ccache/1 rdma state region";
/// Label of a proxy's proof in `REGISTER`.
pub const LABEL_REGISTER: &[u8] = b"ccache/1 push register";
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

/// Why a listener refused a connection (MPA Reject private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No proof, or a wrong one.
    AccessDenied,
    /// The listener's live-connection limit is reached.
    Busy,
    /// A code this version does not know.
    Unknown(u32),
}

impl Refusal {
    /// The code on the wire.
    pub fn code(self) -> u32 {
        match self {
            Refusal::AccessDenied => 1,
            Refusal::Busy => 2,
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
            c => Refusal::Unknown(c),
        })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::AccessDenied => f.write_str("access denied: no access proof or a wrong one (give both ends the same --token-file)"),
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
    fn refusal_vector() {
        assert_eq!(
            Refusal::AccessDenied.emit(),
            [b'C', b'C', b'R', b'J', 0, 0, 0, 1]
        );
        assert_eq!(Refusal::Busy.emit(), [b'C', b'C', b'R', b'J', 0, 0, 0, 2]);
        for r in [Refusal::AccessDenied, Refusal::Busy, Refusal::Unknown(9)] {
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
