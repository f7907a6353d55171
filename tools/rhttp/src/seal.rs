//! RDMA bodies bound to the TLS session (docs/MOD_RDMA.md, "HTTPS").
//!
//! Over HTTPS the RDMA connection is still plain TCP, so mod_rdma
//! (`RDMATLS encrypt`, `modules/mod_rdma/seal.c`) seals the body before it
//! moves. The client names the transfer with 16 random bytes,
//! `RDMA-Seal: aes-256-gcm, id=<32 hex digits>`, and both ends derive
//!
//! ```text
//! key      = TLS-Exporter("EXPORTER-iwarp-rdma-body", context = id, 32)
//!            (RFC 8446 §7.5; RFC 5705 §4 for TLS 1.2)
//! record i = AES-256-GCM(key, nonce(i), aad(i), up to 64 KiB of the body)
//!            followed by its 16-byte tag
//! nonce(i) = id[0..4] || i (64 bits, big-endian)
//! aad(i)   = i (64 bits, big-endian) || last (1 for the last record, else 0)
//! ```
//!
//! An empty body is one empty record. The answer carries `RDMA-Seal:
//! aes-256-gcm, id=<id>, length=<plain length>`; the `RDMA:` header's
//! length is the sealed length. [`open_in_place`] checks every record's
//! tag before any byte is released, and the last-record flag and the
//! length make a truncated, extended or reordered body fail too. No I/O
//! here: the exporter's output comes from the TLS connection
//! (`http::Conn::export_keying_material`).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

/// The exporter label (RFC 8446 §7.5: labels are registered or start
/// with "EXPORTER-").
pub const LABEL: &[u8] = b"EXPORTER-iwarp-rdma-body";
/// Plaintext bytes per record.
pub const CHUNK: usize = 64 << 10;
/// The AES-GCM tag after each record.
pub const TAG: usize = 16;
/// The one cipher defined.
pub const CIPHER: &str = "aes-256-gcm";

/// The request header's value: `aes-256-gcm, id=<32 hex digits>`.
pub fn request_header(id: &[u8; 16]) -> String {
    format!("{CIPHER}, id={}", hex(id))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The server's `RDMA-Seal` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: [u8; 16],
    /// The body's length before sealing.
    pub length: u64,
}

/// Parse `aes-256-gcm, id=<32 hex>, length=<digits>` (OWS after commas,
/// each parameter once, no others).
pub fn parse_answer(v: &str) -> Result<Answer, String> {
    let mut parts = v.split(',').map(str::trim);
    let cipher = parts.next().unwrap_or("");
    if !cipher.eq_ignore_ascii_case(CIPHER) {
        return Err(format!("cipher {cipher:?}, not {CIPHER}"));
    }
    let (mut id, mut length) = (None, None);
    for p in parts {
        let (k, val) = p
            .split_once('=')
            .ok_or_else(|| format!("parameter {p:?} has no '='"))?;
        match k {
            "id" if id.is_none() => {
                if val.len() != 32 || !val.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("id {val:?} is not 32 hex digits"));
                }
                let mut b = [0u8; 16];
                for (i, x) in b.iter_mut().enumerate() {
                    *x = u8::from_str_radix(&val[2 * i..2 * i + 2], 16)
                        .map_err(|_| format!("bad id {val:?}"))?;
                }
                id = Some(b);
            }
            "length" if length.is_none() => {
                if val.is_empty() || !val.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("length {val:?} is not a number"));
                }
                length = Some(
                    val.parse::<u64>()
                        .map_err(|_| format!("length {val:?} too large"))?,
                );
            }
            _ => return Err(format!("unknown or repeated parameter {k:?}")),
        }
    }
    Ok(Answer {
        id: id.ok_or("no id")?,
        length: length.ok_or("no length")?,
    })
}

/// The sealed length of a body of `plain` bytes (one tag per record, at
/// least one record), or None if it overflows.
pub fn sealed_len(plain: u64) -> Option<u64> {
    let records = if plain == 0 {
        1
    } else {
        plain.div_ceil(CHUNK as u64)
    };
    plain.checked_add(records.checked_mul(TAG as u64)?)
}

/// Why a sealed body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// The buffer's length is not `sealed_len(plain)`.
    Length { got: usize, want: u64 },
    /// Record `index` (of `records`) failed its tag check.
    Record { index: u64, records: u64 },
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Length { got, want } => write!(
                f,
                "the sealed body is {got} bytes, not the {want} its announced length needs"
            ),
            OpenError::Record { index, records } => write!(
                f,
                "record {index} of {records} of the sealed body failed its AES-256-GCM \
                 authentication: the body was altered on the way (or is not this transfer's); \
                 nothing of it was kept"
            ),
        }
    }
}

fn record_nonce(id: &[u8; 16], i: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&id[..4]);
    n[4..].copy_from_slice(&i.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn record_aad(i: u64, last: bool) -> [u8; 9] {
    let mut a = [0u8; 9];
    a[..8].copy_from_slice(&i.to_be_bytes());
    a[8] = u8::from(last);
    a
}

fn key_of(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

/// Seal `plain` as mod_rdma does (tests, and a reference for the format).
pub fn seal(key: &[u8; 32], id: &[u8; 16], plain: &[u8]) -> Vec<u8> {
    let k = key_of(key);
    let mut out = Vec::with_capacity(sealed_len(plain.len() as u64).unwrap_or(0) as usize);
    let mut chunks: Vec<&[u8]> = plain.chunks(CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let n = chunks.len();
    for (i, c) in chunks.into_iter().enumerate() {
        let mut rec = c.to_vec();
        let tag = k
            .seal_in_place_separate_tag(
                record_nonce(id, i as u64),
                Aad::from(record_aad(i as u64, i + 1 == n)),
                &mut rec,
            )
            .expect("sealing a record of at most 64 KiB");
        out.extend_from_slice(&rec);
        out.extend_from_slice(tag.as_ref());
    }
    out
}

/// Open a sealed body of announced plain length `plain` in place: on
/// success the first `plain` bytes of `buf` are the body. Every record is
/// checked before this returns Ok, so a caller that releases bytes only
/// after it releases none of a forged body.
pub fn open_in_place(
    key: &[u8; 32],
    id: &[u8; 16],
    plain: u64,
    buf: &mut [u8],
) -> Result<usize, OpenError> {
    let want = sealed_len(plain).unwrap_or(u64::MAX);
    if buf.len() as u64 != want {
        return Err(OpenError::Length {
            got: buf.len(),
            want,
        });
    }
    let k = key_of(key);
    let records = want - plain;
    let records = records / TAG as u64;
    let plain = plain as usize;
    let (mut src, mut dst) = (0usize, 0usize);
    for i in 0..records {
        let n = (plain - dst).min(CHUNK);
        let rec = &mut buf[src..src + n + TAG];
        k.open_in_place(
            record_nonce(id, i),
            Aad::from(record_aad(i, i + 1 == records)),
            rec,
        )
        .map_err(|_| OpenError::Record { index: i, records })?;
        buf.copy_within(src..src + n, dst);
        src += n + TAG;
        dst += n;
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const ID: [u8; 16] = *b"0123456789abcdef";

    fn body(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn lengths() {
        assert_eq!(sealed_len(0), Some(16));
        assert_eq!(sealed_len(1), Some(17));
        assert_eq!(sealed_len(CHUNK as u64), Some(CHUNK as u64 + 16));
        assert_eq!(sealed_len(CHUNK as u64 + 1), Some(CHUNK as u64 + 33));
        assert_eq!(sealed_len(u64::MAX), None);
    }

    #[test]
    fn round_trip_at_record_edges() {
        for n in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17] {
            let p = body(n);
            let mut s = seal(&KEY, &ID, &p);
            assert_eq!(s.len() as u64, sealed_len(n as u64).unwrap());
            assert_eq!(open_in_place(&KEY, &ID, n as u64, &mut s), Ok(n));
            assert_eq!(&s[..n], &p[..], "n={n}");
        }
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let p = body(2 * CHUNK + 5);
        let s = seal(&KEY, &ID, &p);
        for at in [0, 1, CHUNK, CHUNK + 15, CHUNK + 16, s.len() - 1] {
            let mut t = s.clone();
            t[at] ^= 1;
            assert!(matches!(
                open_in_place(&KEY, &ID, p.len() as u64, &mut t),
                Err(OpenError::Record { .. })
            ));
        }
    }

    #[test]
    fn truncation_reordering_and_another_transfer_are_refused() {
        let p = body(3 * CHUNK);
        let s = seal(&KEY, &ID, &p);
        let rec = CHUNK + TAG;
        // The first two records alone, announced as a 2-record body: the
        // second is not flagged last.
        let mut t = s[..2 * rec].to_vec();
        assert_eq!(
            open_in_place(&KEY, &ID, 2 * CHUNK as u64, &mut t),
            Err(OpenError::Record {
                index: 1,
                records: 2
            })
        );
        // Records 0 and 1 swapped.
        let mut t = s.clone();
        t[..rec].copy_from_slice(&s[rec..2 * rec]);
        t[rec..2 * rec].copy_from_slice(&s[..rec]);
        assert!(open_in_place(&KEY, &ID, p.len() as u64, &mut t).is_err());
        // Another transfer: its id is the exporter's context, so its key
        // differs (below); its nonces differ too (the id's first 4 bytes).
        let mut t = s.clone();
        assert!(open_in_place(&KEY, b"X123456789abcdef", p.len() as u64, &mut t).is_err());
        let mut t = s.clone();
        assert!(open_in_place(&[8; 32], &ID, p.len() as u64, &mut t).is_err());
        // A length that does not match the announced one.
        let mut t = s[..s.len() - 1].to_vec();
        assert!(matches!(
            open_in_place(&KEY, &ID, p.len() as u64, &mut t),
            Err(OpenError::Length { .. })
        ));
    }

    #[test]
    fn headers() {
        assert_eq!(
            request_header(&ID),
            "aes-256-gcm, id=30313233343536373839616263646566"
        );
        let a =
            parse_answer("aes-256-gcm, id=30313233343536373839616263646566, length=42").unwrap();
        assert_eq!(a, Answer { id: ID, length: 42 });
        for bad in [
            "chacha20, id=30313233343536373839616263646566, length=1",
            "aes-256-gcm, id=3031, length=1",
            "aes-256-gcm, id=30313233343536373839616263646566",
            "aes-256-gcm, length=1",
            "aes-256-gcm, id=30313233343536373839616263646566, length=-1",
            "aes-256-gcm, id=30313233343536373839616263646566, length=1, length=2",
            "aes-256-gcm, id=30313233343536373839616263646566, length=1, x=2",
        ] {
            assert!(parse_answer(bad).is_err(), "{bad}");
        }
    }
}
