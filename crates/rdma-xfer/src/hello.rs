//! Session setup in one round trip (issue 27): the wire format of the
//! setup exchange and the passive side's admission of connections, as pure
//! logic (no sockets, no clock).
//!
//! The active side opens every connection of a session at once, the
//! control connection and all data streams, and each one carries the
//! whole proposal ([`Hello`]: token, its own index, streams, block size,
//! I/O depth). In RDMA mode the `Hello` is the private data of the MPA
//! Request (RFC 5044 §7.1: up to 512 bytes; 255 through rdma_cm on a
//! kernel device) and the [`HelloAck`] rides in the control connection's
//! MPA Reply, so the session is negotiated by the handshakes the
//! connections need anyway: one TCP and one MPA round trip in all, however
//! many streams. In TCP mode the `Hello` is the first bytes of each
//! connection and the `HelloAck` (or a [`Refusal`]) the first bytes the
//! server writes on stream 0.
//!
//! ```text
//!  Hello (28 bytes)                       HelloAck (24 bytes)
//!  0     4      12     16      20   24  28   0     4        12      16   20   24
//!  +-----+------+------+-------+----+---+    +-----+--------+-------+----+---+
//!  |RFX2 |token |index |streams| bs |dep|    |RFX2 |session |streams| bs |dep|
//!  +-----+------+------+-------+----+---+    +-----+--------+-------+----+---+
//!  index: 0..streams for a data stream, CONTROL (0xffffffff) for RDMA mode's
//!  control QP; big-endian like the iWARP headers.
//! ```
//!
//! **Features.** In RDMA mode a Hello may go on with a 4-byte feature
//! word (bytes 28..32, [`feature`]), and the `HelloAck` of such a Hello
//! with the features the passive side shares (bytes 24..28). A peer of
//! 0.4.0 or earlier sends the short forms, which parse as no features,
//! and ignores bytes after the short forms (it parses private data that
//! way already, since rdma_cm may pad it): so both ends use a feature
//! only when both named it, and an old peer gets the old protocol. TCP
//! mode keeps the short forms (its Hello is read as exactly 28 bytes).
//!
//! The passive side ([`Admission`]) takes the connections in any order: the
//! first one with the right token fixes the proposal and the grant
//! (`negotiate`); every later one must present the same token and
//! proposal and an index not yet taken. Anything else is refused with a
//! reason the peer sees (an MPA Reject's private data, or a TCP
//! [`Refusal`]): a wrong token, a duplicate or out-of-range stream, a
//! proposal that differs from the session's, a stream beyond the grant
//! (the active side opened more than the passive side grants: it drops
//! those), or a peer of the older sequential setup.

use std::fmt;
use std::time::Duration;

use crate::{negotiate, Config};

/// Magic of this setup format ("RFX2": version 2, parallel streams).
pub const MAGIC: &[u8; 4] = b"RFX2";
/// Magic of a TCP-mode refusal ("RFXN"), followed by a u32 length and
/// the UTF-8 reason.
pub const REFUSAL_MAGIC: &[u8; 4] = b"RFXN";
/// The index of RDMA mode's control connection.
pub const CONTROL: u32 = u32::MAX;
/// Bytes of a [`Hello`].
pub const HELLO_LEN: usize = 28;
/// Bytes of a [`HelloAck`].
pub const ACK_LEN: usize = 24;
/// Longest wait for one incoming connection's setup (its MPA Request, or
/// a TCP stream's `Hello`) while a session is accepted: a connection that
/// opens TCP and then says nothing is dropped after this long, so it
/// cannot hold the session's own connections up until the deadline. The
/// active side sends its setup right behind the TCP handshake, so only a
/// lost segment's retransmissions (1 s, then 2 s on a fresh connection)
/// come near it.
pub const REQUEST_WAIT: Duration = Duration::from_secs(5);
/// Longest refusal reason (what an MPA Reject carries through rdma_cm).
pub const MAX_REFUSAL: usize = 255;
/// Bytes of a [`Hello`] with its feature word.
pub const HELLO_EXT_LEN: usize = HELLO_LEN + 4;
/// Bytes of a [`HelloAck`] with its feature word.
pub const ACK_EXT_LEN: usize = ACK_LEN + 4;

/// Protocol features named in the feature word (RDMA mode).
pub mod feature {
    /// The sink may grant blocks for the source's next transfer before
    /// that transfer's `Begin` (as if the `Begin` had pre-requested the
    /// whole pool), and the source keeps such grants for its next
    /// transfer. Saves the grant's round trip after `Begin` (issue 27).
    pub const PREGRANT: u32 = 1;
    /// The active side sends the first FPDU on every connection of the
    /// session: a zero-length RDMA Write (RFC 6581's write-form RTR, a
    /// no-op at RTS) as soon as the connection is established. The
    /// passive side may then hold its own FPDUs until the initiator's
    /// first has arrived, as RFC 5044 §7.1.2's connection startup rules
    /// require of a Responder outside peer-to-peer mode, and as Linux
    /// siw's initiator enforces: an FPDU right behind the MPA Reply fails
    /// its `rdma_connect` (CONNECT_ERROR, status -22). Only the Hello
    /// carries it (the passive side decides), so an older active side,
    /// which never sends first, is not held for.
    pub const FIRST_FPDU: u32 = 2;
    /// Every feature this version implements.
    pub const ALL: u32 = PREGRANT | FIRST_FPDU;
}

/// What the active side asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proposal {
    pub streams: u32,
    pub block_size: u32,
    pub iodepth: u32,
}

impl Proposal {
    /// The proposal of a configuration.
    pub fn of(c: &Config) -> Proposal {
        Proposal {
            streams: c.streams,
            block_size: c.block_size,
            iodepth: c.iodepth,
        }
    }
}

/// The setup message each connection of a session opens with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The token handed over out of band (the FTP `RADR` reply).
    pub token: u64,
    /// Stream index, or [`CONTROL`].
    pub index: u32,
    pub proposal: Proposal,
    /// The [`feature`]s offered (0: the short form, an older peer).
    pub features: u32,
}

/// The passive side's answer on the control connection (stream 0 in TCP
/// mode): the session ID and the granted parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloAck {
    pub session: u64,
    pub granted: Proposal,
    /// The [`feature`]s both sides share (0: the short form).
    pub features: u32,
}

/// Why setup bytes were not understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloError {
    /// Fewer bytes than the format needs.
    Short { len: usize, need: usize },
    /// The older, sequential setup (`RFTX` / `RFTT`).
    OldVersion,
    /// Not rdma-xfer setup at all.
    BadMagic([u8; 4]),
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelloError::Short { len, need } => write!(
                f,
                "rdma-xfer setup of {len} bytes is shorter than the {need} bytes it needs"
            ),
            HelloError::OldVersion => f.write_str(
                "the peer speaks the older rdma-xfer setup (one stream after another): \
                 upgrade both ends to the same version",
            ),
            HelloError::BadMagic(m) => write!(
                f,
                "setup magic {:?} is not {:?}: the peer does not speak rdma-xfer",
                String::from_utf8_lossy(m),
                String::from_utf8_lossy(MAGIC)
            ),
        }
    }
}

impl std::error::Error for HelloError {}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn check(b: &[u8], need: usize) -> Result<(), HelloError> {
    if b.len() >= 4 {
        let m: [u8; 4] = [b[0], b[1], b[2], b[3]];
        if &m == b"RFTX" || &m == b"RFTT" {
            return Err(HelloError::OldVersion);
        }
        if &m != MAGIC {
            return Err(HelloError::BadMagic(m));
        }
    }
    if b.len() < need {
        return Err(HelloError::Short { len: b.len(), need });
    }
    Ok(())
}

impl Hello {
    /// The wire bytes, with the feature word ([`HELLO_EXT_LEN`] bytes) or
    /// without it when no feature is offered ([`HELLO_LEN`]).
    pub fn emit(&self) -> Vec<u8> {
        let mut b = self.emit_short().to_vec();
        if self.features != 0 {
            b.extend_from_slice(&self.features.to_be_bytes());
        }
        b
    }

    /// The short form ([`HELLO_LEN`] bytes, no feature word): what TCP
    /// mode and peers of 0.4.0 and earlier send.
    pub fn emit_short(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..12].copy_from_slice(&self.token.to_be_bytes());
        b[12..16].copy_from_slice(&self.index.to_be_bytes());
        b[16..20].copy_from_slice(&self.proposal.streams.to_be_bytes());
        b[20..24].copy_from_slice(&self.proposal.block_size.to_be_bytes());
        b[24..28].copy_from_slice(&self.proposal.iodepth.to_be_bytes());
        b
    }

    /// Parse untrusted bytes (longer input, e.g. padded private data, is
    /// accepted; the rest is ignored).
    pub fn parse(b: &[u8]) -> Result<Hello, HelloError> {
        check(b, HELLO_LEN)?;
        Ok(Hello {
            token: u64_at(b, 4),
            index: u32_at(b, 12),
            proposal: Proposal {
                streams: u32_at(b, 16),
                block_size: u32_at(b, 20),
                iodepth: u32_at(b, 24),
            },
            features: if b.len() >= HELLO_EXT_LEN {
                u32_at(b, HELLO_LEN)
            } else {
                0
            },
        })
    }
}

impl HelloAck {
    /// The wire bytes, with the feature word ([`ACK_EXT_LEN`] bytes) or
    /// without it when no feature is shared ([`ACK_LEN`]).
    pub fn emit(&self) -> Vec<u8> {
        let mut b = self.emit_short().to_vec();
        if self.features != 0 {
            b.extend_from_slice(&self.features.to_be_bytes());
        }
        b
    }

    /// The short form ([`ACK_LEN`] bytes, no feature word).
    pub fn emit_short(&self) -> [u8; ACK_LEN] {
        let mut b = [0u8; ACK_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..12].copy_from_slice(&self.session.to_be_bytes());
        b[12..16].copy_from_slice(&self.granted.streams.to_be_bytes());
        b[16..20].copy_from_slice(&self.granted.block_size.to_be_bytes());
        b[20..24].copy_from_slice(&self.granted.iodepth.to_be_bytes());
        b
    }

    /// Parse untrusted bytes.
    pub fn parse(b: &[u8]) -> Result<HelloAck, HelloError> {
        check(b, ACK_LEN)?;
        Ok(HelloAck {
            session: u64_at(b, 4),
            granted: Proposal {
                streams: u32_at(b, 12),
                block_size: u32_at(b, 16),
                iodepth: u32_at(b, 20),
            },
            features: if b.len() >= ACK_EXT_LEN {
                u32_at(b, ACK_LEN)
            } else {
                0
            },
        })
    }

    /// The active side's configuration after this grant, checked: a grant
    /// above the proposal (or out of range) is the peer's protocol error.
    pub fn apply(&self, ours: &Config) -> Result<Config, String> {
        let g = self.granted;
        if g.streams > ours.streams || g.block_size > ours.block_size || g.iodepth > ours.iodepth {
            return Err(format!(
                "the peer granted {g:?}, more than the {:?} asked for",
                Proposal::of(ours)
            ));
        }
        let mut c = ours.clone();
        c.streams = g.streams;
        c.block_size = g.block_size;
        c.iodepth = g.iodepth;
        c.features = self.features & ours.features & feature::ALL;
        c.validated()
            .map_err(|e| format!("the peer granted {g:?}: {e}"))
    }
}

/// A TCP-mode refusal: [`REFUSAL_MAGIC`], the reason's length (u32), the
/// reason (at most [`MAX_REFUSAL`] bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl Refusal {
    /// The wire bytes.
    pub fn emit(&self) -> Vec<u8> {
        let r = clip(&self.0);
        let mut b = REFUSAL_MAGIC.to_vec();
        b.extend_from_slice(&(r.len() as u32).to_be_bytes());
        b.extend_from_slice(r.as_bytes());
        b
    }
}

/// `s` cut to [`MAX_REFUSAL`] bytes at a character boundary.
pub fn clip(s: &str) -> &str {
    let mut n = s.len().min(MAX_REFUSAL);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// What to do with one incoming connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accept it as the control connection (RDMA mode) and answer with
    /// [`Admission::ack`].
    Control,
    /// Accept it as data stream `index`.
    Stream(u32),
    /// Refuse it with this reason (logged here; the peer sees the text).
    Refuse(String),
}

/// The passive side of session setup: which connections belong to the
/// session, in whatever order they arrive.
#[derive(Debug, Clone)]
pub struct Admission {
    token: u64,
    ours: Config,
    /// RDMA mode has a separate control connection; in TCP mode stream 0
    /// carries the setup.
    control: Option<bool>,
    proposal: Option<Proposal>,
    granted: Option<Config>,
    session: u64,
    streams: Vec<bool>,
    /// The features the control connection's Hello offered.
    offered: u32,
}

impl Admission {
    /// A session that presents `token`, granted at most `ours`;
    /// `separate_control`: RDMA mode (a control connection besides the
    /// streams). `session` is the ID the [`HelloAck`] will carry.
    pub fn new(token: u64, ours: &Config, separate_control: bool, session: u64) -> Admission {
        Admission {
            token,
            ours: ours.clone(),
            control: separate_control.then_some(false),
            proposal: None,
            granted: None,
            session,
            streams: Vec::new(),
            offered: 0,
        }
    }

    /// The granted configuration, once the first connection fixed it.
    pub fn granted(&self) -> Option<&Config> {
        self.granted.as_ref()
    }

    /// The answer for the control connection (RDMA) or stream 0 (TCP):
    /// the grant, and the features both sides have (those the control
    /// connection's Hello offered that [`Config::features`] allows).
    pub fn ack(&self) -> Option<HelloAck> {
        self.granted.as_ref().map(|g| HelloAck {
            session: self.session,
            granted: Proposal::of(g),
            features: self.offered & self.ours.features & feature::ALL,
        })
    }

    /// Every connection of the session was admitted.
    pub fn complete(&self) -> bool {
        self.granted.is_some() && self.control != Some(false) && self.streams.iter().all(|&s| s)
    }

    /// Streams admitted so far, out of those granted.
    pub fn admitted(&self) -> (usize, usize) {
        (
            self.streams.iter().filter(|&&s| s).count(),
            self.streams.len(),
        )
    }

    /// Judge a connection that opened with `setup` (the MPA Request's
    /// private data, or the first [`HELLO_LEN`] bytes of a TCP stream).
    /// An accepted connection counts as admitted at once: if accepting it
    /// then fails, the session fails.
    pub fn admit(&mut self, setup: &[u8]) -> Verdict {
        let h = match Hello::parse(setup) {
            Ok(h) => h,
            Err(e) => return Verdict::Refuse(format!("rdma-xfer: refused: {e}")),
        };
        if h.token != self.token {
            return Verdict::Refuse("rdma-xfer: refused: bad session token".into());
        }
        match self.proposal {
            Some(p) if p != h.proposal => {
                return Verdict::Refuse(format!(
                    "rdma-xfer: refused: the connection proposes {:?}, the session {p:?}",
                    h.proposal
                ))
            }
            Some(_) => {}
            None => {
                let p = h.proposal;
                if p.streams == 0 || p.block_size == 0 || p.iodepth == 0 {
                    return Verdict::Refuse(format!(
                        "rdma-xfer: refused: the proposal {p:?} has a zero field"
                    ));
                }
                let g = negotiate(&self.ours, p.streams, p.block_size, p.iodepth);
                self.streams = vec![false; g.streams as usize];
                self.granted = Some(g);
                self.proposal = Some(p);
            }
        }
        let proposed = h.proposal.streams;
        let granted = self.streams.len() as u32;
        match h.index {
            CONTROL => match self.control {
                Some(false) => {
                    self.control = Some(true);
                    self.offered = h.features;
                    Verdict::Control
                }
                Some(true) => Verdict::Refuse(
                    "rdma-xfer: refused: the session's control connection is already open".into(),
                ),
                None => Verdict::Refuse(
                    "rdma-xfer: refused: a TCP-mode session has no separate control connection"
                        .into(),
                ),
            },
            i if i < granted => {
                if self.streams[i as usize] {
                    Verdict::Refuse(format!(
                        "rdma-xfer: refused: stream {i} of the session is already open"
                    ))
                } else {
                    self.streams[i as usize] = true;
                    Verdict::Stream(i)
                }
            }
            i if i < proposed => Verdict::Refuse(format!(
                "rdma-xfer: refused: stream {i} not granted: the server grants {granted} stream(s)"
            )),
            i => Verdict::Refuse(format!(
                "rdma-xfer: refused: stream index {i} is outside the {proposed} proposed"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(streams: u32) -> Config {
        Config {
            streams,
            block_size: 1 << 20,
            iodepth: 8,
            ..Config::default()
        }
    }

    fn hello(token: u64, index: u32, streams: u32) -> [u8; HELLO_LEN] {
        Hello {
            token,
            index,
            proposal: Proposal {
                streams,
                block_size: 1 << 20,
                iodepth: 4,
            },
            features: 0,
        }
        .emit_short()
    }

    #[test]
    fn byte_literals() {
        let h = [
            b'R', b'F', b'X', b'2', 0, 0, 0, 0, 0, 0, 0, 7, //
            0xff, 0xff, 0xff, 0xff, 0, 0, 0, 5, 0, 0x10, 0, 0, 0, 0, 0, 4,
        ];
        let p = Hello::parse(&h).unwrap();
        assert_eq!(
            p,
            Hello {
                token: 7,
                index: CONTROL,
                proposal: Proposal {
                    streams: 5,
                    block_size: 1 << 20,
                    iodepth: 4
                },
                features: 0,
            }
        );
        assert_eq!(p.emit(), h);
        let a = [
            b'R', b'F', b'X', b'2', 0, 0, 0, 0, 0, 0, 0, 9, //
            0, 0, 0, 2, 0, 0, 0x10, 0, 0, 0, 0, 1,
        ];
        let ack = HelloAck::parse(&a).unwrap();
        assert_eq!(ack.session, 9);
        assert_eq!(
            ack.granted,
            Proposal {
                streams: 2,
                block_size: 4096,
                iodepth: 1
            }
        );
        assert_eq!(ack.emit(), a);
        // Padded private data (as rdma_cm may deliver it) still parses.
        let mut padded = h.to_vec();
        padded.extend_from_slice(&[0; 30]);
        assert_eq!(Hello::parse(&padded).unwrap(), p);
        assert_eq!(
            Refusal("no".into()).emit(),
            [b'R', b'F', b'X', b'N', 0, 0, 0, 2, b'n', b'o']
        );
    }

    #[test]
    fn the_feature_word_is_optional_both_ways() {
        // A Hello with features: 32 bytes, the word last.
        let h = Hello {
            token: 7,
            index: CONTROL,
            proposal: Proposal {
                streams: 1,
                block_size: 4096,
                iodepth: 2,
            },
            features: feature::PREGRANT,
        };
        let b = h.emit();
        assert_eq!(b.len(), HELLO_EXT_LEN);
        assert_eq!(b[28..], [0, 0, 0, 1]);
        assert_eq!(Hello::parse(&b).unwrap(), h);
        // What a peer of 0.4.0 reads of it: the first 28 bytes, the same
        // session (it parses longer private data that way).
        assert_eq!(&b[..HELLO_LEN], &h.emit_short()[..]);
        // The short form (an older peer, TCP mode) has no features, and
        // zero padding (rdma_cm) none either.
        let short = Hello::parse(&b[..HELLO_LEN]).unwrap();
        assert_eq!(short.features, 0);
        let mut padded = h.emit_short().to_vec();
        padded.extend_from_slice(&[0; 60]);
        assert_eq!(Hello::parse(&padded).unwrap().features, 0);
        // The answer carries the features only when it shares one.
        let ack = HelloAck {
            session: 9,
            granted: h.proposal,
            features: feature::PREGRANT,
        };
        assert_eq!(ack.emit().len(), ACK_EXT_LEN);
        assert_eq!(HelloAck::parse(&ack.emit()).unwrap(), ack);
        let old = HelloAck::parse(&ack.emit()[..ACK_LEN]).unwrap();
        assert_eq!(old.features, 0);
        assert_eq!(HelloAck { features: 0, ..ack }.emit().len(), ACK_LEN);
    }

    #[test]
    fn features_are_those_both_sides_have() {
        let ext = |token: u64, index: u32, features: u32| {
            let mut h = Hello::parse(&hello(token, index, 1)).unwrap();
            h.features = features;
            h.emit()
        };
        // A new active side and a new passive side: every feature of this
        // version; unknown bits are not echoed.
        let mut a = Admission::new(1, &ours(1), true, 5);
        assert_eq!(a.admit(&ext(1, 0, feature::PREGRANT)), Verdict::Stream(0));
        assert_eq!(a.admit(&ext(1, CONTROL, 0xff)), Verdict::Control);
        let ack = a.ack().unwrap();
        assert_eq!(ack.features, feature::ALL);
        assert_eq!(feature::ALL, feature::PREGRANT | feature::FIRST_FPDU);
        let neg = ack.apply(&ours(1)).unwrap();
        assert_eq!(neg.features, feature::ALL);
        // An older active side (short Hello): none, and a short answer.
        let mut a = Admission::new(1, &ours(1), true, 5);
        a.admit(&hello(1, CONTROL, 1));
        assert_eq!(a.ack().unwrap().features, 0);
        assert_eq!(a.ack().unwrap().emit().len(), ACK_LEN);
        // A passive side configured without the feature (as an older one
        // answers): none, whatever the active side offers; and an active
        // side without it ignores a grant of it.
        let old = Config {
            features: 0,
            ..ours(1)
        };
        let mut a = Admission::new(1, &old, true, 5);
        a.admit(&ext(1, CONTROL, feature::PREGRANT));
        assert_eq!(a.ack().unwrap().features, 0);
        let ack = HelloAck {
            features: feature::PREGRANT,
            ..a.ack().unwrap()
        };
        assert_eq!(ack.apply(&old).unwrap().features, 0);
    }

    #[test]
    fn impossible_and_foreign_input_is_refused() {
        assert_eq!(
            Hello::parse(&hello(1, 0, 1)[..27]),
            Err(HelloError::Short { len: 27, need: 28 })
        );
        assert_eq!(
            Hello::parse(b"RFT"),
            Err(HelloError::Short { len: 3, need: 28 })
        );
        assert_eq!(
            Hello::parse(b"RFTX\0\0\0\0\0\0\0\x01\xff\xff\xff\xff"),
            Err(HelloError::OldVersion)
        );
        assert!(matches!(
            HelloAck::parse(&[0x41; 24]),
            Err(HelloError::BadMagic(_))
        ));
        assert!(HelloError::OldVersion.to_string().contains("upgrade"));
    }

    #[test]
    fn a_grant_above_the_proposal_is_an_error() {
        let c = ours(2);
        let ok = HelloAck {
            session: 1,
            granted: Proposal {
                streams: 1,
                block_size: 4096,
                iodepth: 2,
            },
            features: 0,
        };
        let g = ok.apply(&c).unwrap();
        assert_eq!((g.streams, g.block_size, g.iodepth), (1, 4096, 2));
        let too_many = HelloAck {
            granted: Proposal {
                streams: 3,
                ..ok.granted
            },
            ..ok
        };
        assert!(too_many.apply(&c).unwrap_err().contains("more than"));
        let zero = HelloAck {
            granted: Proposal {
                streams: 0,
                ..ok.granted
            },
            ..ok
        };
        assert!(zero.apply(&c).is_err());
    }

    #[test]
    fn streams_are_admitted_in_any_order_and_the_control_last() {
        let mut a = Admission::new(42, &ours(8), true, 99);
        assert!(a.granted().is_none() && !a.complete());
        assert_eq!(a.admit(&hello(42, 2, 3)), Verdict::Stream(2));
        assert_eq!(a.granted().unwrap().streams, 3);
        assert_eq!(a.admit(&hello(42, 0, 3)), Verdict::Stream(0));
        assert_eq!(a.admit(&hello(42, 1, 3)), Verdict::Stream(1));
        assert!(!a.complete(), "the control connection is missing");
        assert_eq!(a.admit(&hello(42, CONTROL, 3)), Verdict::Control);
        assert!(a.complete());
        let ack = a.ack().unwrap();
        assert_eq!((ack.session, ack.granted.streams), (99, 3));
        assert_eq!(ack.granted.iodepth, 4);
    }

    #[test]
    fn intruders_and_extras_are_refused_with_a_reason() {
        let mut a = Admission::new(42, &ours(2), true, 1);
        let refused = |v: Verdict, what: &str| match v {
            Verdict::Refuse(r) => assert!(r.contains(what), "{r:?} lacks {what:?}"),
            v => panic!("expected a refusal ({what}), got {v:?}"),
        };
        // A wrong token fixes nothing.
        refused(a.admit(&hello(41, 0, 2)), "bad session token");
        assert!(a.granted().is_none());
        refused(
            a.admit(b"GET / HTTP/1.1\r\n\r\n..........."),
            "does not speak",
        );
        refused(a.admit(b"RFTX\0\0\0\0\0\0\0\x2a\xff\xff\xff\xff"), "older");
        // The client proposes 4, the server grants 2.
        assert_eq!(a.admit(&hello(42, CONTROL, 4)), Verdict::Control);
        refused(a.admit(&hello(42, CONTROL, 4)), "already open");
        assert_eq!(a.admit(&hello(42, 1, 4)), Verdict::Stream(1));
        refused(
            a.admit(&hello(42, 1, 4)),
            "stream 1 of the session is already open",
        );
        refused(
            a.admit(&hello(42, 3, 4)),
            "stream 3 not granted: the server grants 2",
        );
        refused(a.admit(&hello(42, 4, 4)), "outside the 4 proposed");
        refused(a.admit(&hello(42, 0, 8)), "proposes");
        assert_eq!(a.admitted(), (1, 2));
        assert!(!a.complete());
        assert_eq!(a.admit(&hello(42, 0, 4)), Verdict::Stream(0));
        assert!(a.complete());
    }

    #[test]
    fn tcp_mode_has_no_control_connection() {
        let mut a = Admission::new(5, &ours(2), false, 1);
        assert!(matches!(
            a.admit(&hello(5, CONTROL, 2)),
            Verdict::Refuse(r) if r.contains("no separate control")
        ));
        assert_eq!(a.admit(&hello(5, 1, 2)), Verdict::Stream(1));
        assert_eq!(a.admit(&hello(5, 0, 2)), Verdict::Stream(0));
        assert!(a.complete());
    }

    #[test]
    fn a_zero_proposal_is_refused() {
        let mut a = Admission::new(5, &ours(2), false, 1);
        let mut h = hello(5, 0, 2);
        h[16..20].copy_from_slice(&0u32.to_be_bytes());
        assert!(matches!(a.admit(&h), Verdict::Refuse(r) if r.contains("zero")));
        assert!(a.granted().is_none());
    }
}
