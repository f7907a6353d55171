//! The push channel between a proxy and the application module.
//!
//! A proxy that wants pushes connects to the module's push listener (TCP)
//! and sends `REGISTER` with where its cache state region is; the module
//! answers `REGISTERED` and from then on uses **that connection** as the
//! proxy's push endpoint: it sends `PUSH` (an updated document and its
//! version) and `STATE_REQUEST` (the state region's bytes, when it does
//! not read them by RDMA), and the proxy answers each with `PUSH_ACK` or
//! `STATE_REPLY`. When the connection ends, the registration ends (a
//! restarted module is registered with again, a dead proxy is forgotten).
//!
//! ## Frame (all fields big endian)
//!
//! ```text
//!  0      2    3     4          8                  16          20          24
//! +------+----+-----+----------+------------------+-----------+-----------+----------+
//! | "CP" | 1  | kind| document | version u64      | body len  | status    | body ... |
//! +------+----+-----+----------+------------------+-----------+-----------+----------+
//! ```
//!
//! `REGISTER`'s body is a [`Registration`] (40 bytes), followed, where the
//! deployment has an access token, by a 60-byte version-2 proof (a
//! [`crate::auth::ConnProof`]: nonce and the proxy's time) whose MAC covers
//! the registration too (its address and STag then masked; see
//! [`crate::auth`]), so 100 bytes in all;
//! `REGISTERED`'s body is empty, or ccappd's 32-byte MAC; `PUSH`'s is the
//! document; `STATE_REPLY`'s is the region; `PUSH_ACK`'s `status` is a
//! [`PushStatus`]; `ERROR`'s `status` is a [`PushStatus`] too. A body is at
//! most [`MAX_BODY`] bytes.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Header length.
pub const HEADER_LEN: usize = 24;
/// The magic: ASCII "CP".
pub const MAGIC: [u8; 2] = *b"CP";
/// The format this crate speaks.
pub const FORMAT: u8 = 1;
/// Largest body accepted (a document or a state region): 64 MiB.
pub const MAX_BODY: u32 = 64 << 20;
/// Length of a [`Registration`].
pub const REGISTRATION_LEN: usize = 40;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Proxy → module: here is my state region (body: [`Registration`]).
    Register,
    /// Module → proxy: registered; pushes may follow on this connection.
    Registered,
    /// Module → proxy: document `doc` at `version` (body: its bytes).
    Push,
    /// Proxy → module: what became of a push (`status`).
    PushAck,
    /// Module → proxy: send me your state region.
    StateRequest,
    /// Proxy → module: the region's bytes.
    StateReply,
    /// Either way: refused (`status`); the sender closes.
    Error,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Register => 1,
            Kind::Registered => 2,
            Kind::Push => 3,
            Kind::PushAck => 4,
            Kind::StateRequest => 5,
            Kind::StateReply => 6,
            Kind::Error => 15,
        }
    }
    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Register,
            2 => Kind::Registered,
            3 => Kind::Push,
            4 => Kind::PushAck,
            5 => Kind::StateRequest,
            6 => Kind::StateReply,
            15 => Kind::Error,
            _ => return None,
        })
    }
}

/// The outcome of a push at the proxy (and the codes of `ERROR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushStatus {
    /// Stored under its version.
    Stored,
    /// The proxy has this version or a newer one: ignored.
    NotNewer,
    /// The proxy does not have the document cached: ignored (pushes only
    /// refresh cached copies).
    NotCached,
    /// The frame was malformed or unexpected.
    Malformed,
    /// A push whose announced body is larger than the proxy's
    /// `--max-doc-bytes`: refused from its header, before any byte of the
    /// body is read or allocated; the proxy closes the channel.
    TooLarge,
    /// A `REGISTER` without the right access proof (`--token-file`), or a
    /// `REGISTERED` without ccappd's: refused, and the channel closed. A
    /// replayed `REGISTER` (its nonce was used before) gets this too.
    AccessDenied,
    /// A `REGISTER` with a version-1 proof (a proxy older than replay-proof
    /// registrations): upgrade the proxy.
    Outdated,
    /// A `REGISTER` whose proof's time is outside ccappd's window
    /// ([`crate::auth::PROOF_WINDOW_MS`]) or below what it remembers: the
    /// hosts' clocks differ, or the registration was recorded.
    Stale,
    /// A code this version does not know.
    Unknown(u32),
}

impl From<u32> for PushStatus {
    fn from(v: u32) -> PushStatus {
        match v {
            0 => PushStatus::Stored,
            1 => PushStatus::NotNewer,
            2 => PushStatus::NotCached,
            3 => PushStatus::Malformed,
            4 => PushStatus::TooLarge,
            5 => PushStatus::AccessDenied,
            6 => PushStatus::Outdated,
            7 => PushStatus::Stale,
            v => PushStatus::Unknown(v),
        }
    }
}

impl From<PushStatus> for u32 {
    fn from(s: PushStatus) -> u32 {
        match s {
            PushStatus::Stored => 0,
            PushStatus::NotNewer => 1,
            PushStatus::NotCached => 2,
            PushStatus::Malformed => 3,
            PushStatus::TooLarge => 4,
            PushStatus::AccessDenied => 5,
            PushStatus::Outdated => 6,
            PushStatus::Stale => 7,
            PushStatus::Unknown(v) => v,
        }
    }
}

/// A malformed frame header or registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// Too few bytes.
    Truncated {
        /// Present.
        len: usize,
        /// Needed.
        need: usize,
    },
    /// Not "CP".
    BadMagic([u8; 2]),
    /// A format other than [`FORMAT`].
    BadFormat(u8),
    /// An unknown kind.
    UnknownKind(u8),
    /// A body above [`MAX_BODY`].
    TooLong(u32),
    /// A registration's address family is neither 0, 4 nor 6.
    BadFamily(u8),
}

impl fmt::Display for PushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Truncated { len, need } => write!(f, "push frame truncated: {len} of {need} bytes (peer closed mid-frame)"),
            PushError::BadMagic(m) => write!(f, "push frame starts {m:02x?}, not \"CP\": the peer is not a ccappd/ccproxy push channel"),
            PushError::BadFormat(v) => write!(f, "push frame format {v}, this build speaks {FORMAT}: run matching ccappd and ccproxy"),
            PushError::UnknownKind(k) => write!(f, "push frame kind {k} is unknown"),
            PushError::TooLong(n) => write!(f, "push frame body of {n} bytes exceeds the limit of {MAX_BODY}"),
            PushError::BadFamily(x) => write!(f, "registration address family {x}, expected 0 (none), 4 or 6"),
        }
    }
}

impl std::error::Error for PushError {}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Kind.
    pub kind: Kind,
    /// Document (zero if none).
    pub doc: u32,
    /// Version (zero if none).
    pub version: u64,
    /// Bytes of body that follow.
    pub body_len: u32,
    /// Status ([`PushStatus`] code) in `PUSH_ACK` and `ERROR`.
    pub status: u32,
}

impl Header {
    /// A header with no body, version or status.
    pub fn new(kind: Kind, doc: u32) -> Header {
        Header {
            kind,
            doc,
            version: 0,
            body_len: 0,
            status: 0,
        }
    }

    /// Parse untrusted bytes (the first [`HEADER_LEN`]).
    pub fn parse(b: &[u8]) -> Result<Header, PushError> {
        if b.len() < HEADER_LEN {
            return Err(PushError::Truncated {
                len: b.len(),
                need: HEADER_LEN,
            });
        }
        if b[0..2] != MAGIC {
            return Err(PushError::BadMagic([b[0], b[1]]));
        }
        if b[2] != FORMAT {
            return Err(PushError::BadFormat(b[2]));
        }
        let kind = Kind::from_code(b[3]).ok_or(PushError::UnknownKind(b[3]))?;
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[8..16]);
        let body_len = u32_at(16);
        if body_len > MAX_BODY {
            return Err(PushError::TooLong(body_len));
        }
        Ok(Header {
            kind,
            doc: u32_at(4),
            version: u64::from_be_bytes(v),
            body_len,
            status: u32_at(20),
        })
    }

    /// The header's bytes.
    pub fn emit(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = FORMAT;
        b[3] = self.kind.code();
        b[4..8].copy_from_slice(&self.doc.to_be_bytes());
        b[8..16].copy_from_slice(&self.version.to_be_bytes());
        b[16..20].copy_from_slice(&self.body_len.to_be_bytes());
        b[20..24].copy_from_slice(&self.status.to_be_bytes());
        b
    }
}

/// Where a proxy's cache state region is.
///
/// ```text
///  0       1    2        4                20              28       32       36        40
/// +-------+----+--------+-----------------+---------------+--------+--------+---------+
/// |family | 0  | port   | address (16)    | region addr   | rkey   | length | reserved|
/// +-------+----+--------+-----------------+---------------+--------+--------+---------+
/// ```
///
/// `family` 4 or 6 with `address`/`port`: the proxy's iWARP listener for
/// RDMA Reads of the region (IPv4 in the first 4 address bytes); 0: no
/// RDMA, the module asks for the region with `STATE_REQUEST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The proxy's iWARP listener for state reads, if any.
    pub rdma: Option<SocketAddr>,
    /// Tagged address of the region's first byte.
    pub addr: u64,
    /// The region's rkey.
    pub rkey: u32,
    /// The region's length in bytes.
    pub len: u32,
}

impl Registration {
    /// Parse untrusted bytes.
    pub fn parse(b: &[u8]) -> Result<Registration, PushError> {
        if b.len() < REGISTRATION_LEN {
            return Err(PushError::Truncated {
                len: b.len(),
                need: REGISTRATION_LEN,
            });
        }
        let port = u16::from_be_bytes([b[2], b[3]]);
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[4..20]);
        let rdma = match b[0] {
            0 => None,
            4 => Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
                port,
            )),
            6 => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), port)),
            f => return Err(PushError::BadFamily(f)),
        };
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[20..28]);
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok(Registration {
            rdma,
            addr: u64::from_be_bytes(x),
            rkey: u32_at(28),
            len: u32_at(32),
        })
    }

    /// The bytes.
    pub fn emit(&self) -> [u8; REGISTRATION_LEN] {
        let mut b = [0u8; REGISTRATION_LEN];
        match self.rdma {
            None => {}
            Some(SocketAddr::V4(s)) => {
                b[0] = 4;
                b[2..4].copy_from_slice(&s.port().to_be_bytes());
                b[4..8].copy_from_slice(&s.ip().octets());
            }
            Some(SocketAddr::V6(s)) => {
                b[0] = 6;
                b[2..4].copy_from_slice(&s.port().to_be_bytes());
                b[4..20].copy_from_slice(&s.ip().octets());
            }
        }
        b[20..28].copy_from_slice(&self.addr.to_be_bytes());
        b[28..32].copy_from_slice(&self.rkey.to_be_bytes());
        b[32..36].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_vector_and_errors() {
        let h = Header {
            kind: Kind::Push,
            doc: 7,
            version: 0x0102_0304_0506_0708,
            body_len: 5,
            status: 0,
        };
        let b = [
            b'C', b'P', 1, 3, 0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 5, 0, 0, 0, 0,
        ];
        assert_eq!(h.emit(), b);
        assert_eq!(Header::parse(&b), Ok(h));
        assert_eq!(
            Header::parse(&b[..23]),
            Err(PushError::Truncated { len: 23, need: 24 })
        );
        let m = |i: usize, v: u8| {
            let mut x = b;
            x[i] = v;
            Header::parse(&x)
        };
        assert_eq!(m(1, b'X'), Err(PushError::BadMagic(*b"CX")));
        assert_eq!(m(2, 2), Err(PushError::BadFormat(2)));
        assert_eq!(m(3, 9), Err(PushError::UnknownKind(9)));
        assert_eq!(m(16, 0x04), Err(PushError::TooLong(0x0400_0005)));
        for k in [
            Kind::Register,
            Kind::Registered,
            Kind::Push,
            Kind::PushAck,
            Kind::StateRequest,
            Kind::StateReply,
            Kind::Error,
        ] {
            let h = Header::new(k, 1);
            assert_eq!(Header::parse(&h.emit()), Ok(h));
        }
        for s in [
            PushStatus::Stored,
            PushStatus::NotNewer,
            PushStatus::NotCached,
            PushStatus::Malformed,
            PushStatus::TooLarge,
            PushStatus::AccessDenied,
            PushStatus::Outdated,
            PushStatus::Stale,
            PushStatus::Unknown(9),
        ] {
            assert_eq!(PushStatus::from(u32::from(s)), s);
        }
    }

    #[test]
    fn registration_vector_and_errors() {
        let r = Registration {
            rdma: Some("10.1.2.3:7480".parse().unwrap()),
            addr: 0x1122_3344_5566_7788,
            rkey: 0xaabb_ccdd,
            len: 168,
        };
        let mut want = [0u8; 40];
        want[..8].copy_from_slice(&[4, 0, 0x1d, 0x38, 10, 1, 2, 3]);
        want[20..28].copy_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        want[28..36].copy_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 168]);
        assert_eq!(r.emit(), want);
        assert_eq!(Registration::parse(&want), Ok(r));
        let v6 = Registration {
            rdma: Some("[::1]:9".parse().unwrap()),
            ..r
        };
        assert_eq!(Registration::parse(&v6.emit()), Ok(v6));
        let none = Registration { rdma: None, ..r };
        assert_eq!(none.emit()[0], 0);
        assert_eq!(Registration::parse(&none.emit()), Ok(none));
        let mut bad = want;
        bad[0] = 5;
        assert_eq!(Registration::parse(&bad), Err(PushError::BadFamily(5)));
        assert_eq!(
            Registration::parse(&want[..39]),
            Err(PushError::Truncated { len: 39, need: 40 })
        );
    }
}
