//! Control messages of the transfer protocol: a fixed 32-byte header plus,
//! for `Grant` and `Abort`, a variable tail. Big-endian, like the iWARP
//! headers they ride in (they are the payload of RDMAP Send messages,
//! RFC 5040 §5.3).
//!
//! ```text
//!  0      2    3     4        6       8        16       24       32
//!  +------+----+-----+--------+-------+--------+--------+--------+---- tail
//!  |magic |type|flags|credits | count |   a    |   b    |   c    | ...
//!  +------+----+-----+--------+-------+--------+--------+--------+----
//! ```
//!
//! `credits` returns receive credits to the peer (see [`crate::rdma`]).
//! `count` is the number of 16-byte grant entries (`Grant`) or the length
//! of the UTF-8 reason (`Abort`).

use std::fmt;

/// Magic of every control message ("RF").
pub const MAGIC: u16 = 0x5246;
/// Fixed header length.
pub const HEADER_LEN: usize = 32;
/// Size of a control-message buffer (send slot or posted receive).
pub const MSG_BUF: usize = 1024;
/// Bytes of one grant entry: block index (u32), rkey (u32), address (u64).
pub const GRANT_LEN: usize = 16;
/// Most grants one message carries (batch mode).
pub const MAX_GRANTS: usize = (MSG_BUF - HEADER_LEN) / GRANT_LEN;
/// Most bytes of an `Abort` reason: what fits in one message buffer.
pub const MAX_REASON: usize = MSG_BUF - HEADER_LEN;

/// `reason` cut to at most [`MAX_REASON`] bytes at a character boundary,
/// so what is sent is valid UTF-8 and parses back to itself.
fn clip(reason: &str) -> &str {
    let mut n = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(n) {
        n -= 1;
    }
    &reason[..n]
}

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const TYPE: usize = 2;
    pub const FLAGS: usize = 3;
    pub const CREDITS: Range<usize> = 4..6;
    pub const COUNT: Range<usize> = 6..8;
    pub const A: Range<usize> = 8..16;
    pub const B: Range<usize> = 16..24;
    pub const C: Range<usize> = 24..32;
}

/// One free sink block offered to the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Index of the block in the sink's pool.
    pub block: u32,
    /// STag of the block's memory region.
    pub rkey: u32,
    /// Address of the block (tagged offset base).
    pub addr: u64,
}

/// A decoded control message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Msg {
    /// Active → passive: session setup (token from the out-of-band
    /// exchange, streams, block size and I/O depth wanted).
    Hello {
        token: u64,
        streams: u32,
        block_size: u32,
        iodepth: u32,
    },
    /// Passive → active: session ID and the granted parameters.
    HelloAck {
        session: u64,
        streams: u32,
        block_size: u32,
        iodepth: u32,
    },
    /// Source → sink: a transfer starts; `prerequest` blocks are asked for
    /// at once (pre-request).
    Begin {
        transfer: u64,
        len: Option<u64>,
        prerequest: u32,
    },
    /// Source → sink: ask for `n` more free blocks.
    Request { n: u32 },
    /// Sink → source: a batch of free blocks for transfer `transfer`.
    Grant { transfer: u64, grants: Vec<Grant> },
    /// Source → sink, on a data QP right behind the RDMA Write it
    /// describes: block `seq` of the stream is in sink block `block`.
    BlockDone { seq: u64, len: u32, block: u32 },
    /// Source → sink: no more blocks (`blocks` in all, `bytes` long).
    End { blocks: u64, bytes: u64 },
    /// Sink → source: everything was handed to the writer and flushed.
    Fin { bytes: u64 },
    /// Either way: the transfer failed for `reason`.
    Abort { reason: String },
    /// Returns receive credits only.
    Credit,
}

/// Why a control message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsgError {
    Truncated { len: usize },
    BadMagic(u16),
    UnknownType(u8),
    BadCount { count: usize, len: usize },
}

impl fmt::Display for MsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgError::Truncated { len } => write!(f, "control message of {len} bytes is shorter than the {HEADER_LEN}-byte header"),
            MsgError::BadMagic(m) => write!(f, "control message magic {m:#06x} is not {MAGIC:#06x}: the peer does not speak rdma-xfer"),
            MsgError::UnknownType(t) => write!(f, "unknown control message type {t}"),
            MsgError::BadCount { count, len } => write!(f, "control message announces {count} entries but has {len} bytes"),
        }
    }
}

impl std::error::Error for MsgError {}

const T_HELLO: u8 = 1;
const T_HELLO_ACK: u8 = 2;
const T_BEGIN: u8 = 3;
const T_REQUEST: u8 = 4;
const T_GRANT: u8 = 5;
const T_BLOCK_DONE: u8 = 6;
const T_END: u8 = 7;
const T_FIN: u8 = 8;
const T_ABORT: u8 = 9;
const T_CREDIT: u8 = 10;

fn u64_at(b: &[u8], r: std::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn pair(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

fn split(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

impl Msg {
    /// Bytes [`Msg::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Msg::Grant { grants, .. } => grants.len() * GRANT_LEN,
                Msg::Abort { reason } => clip(reason).len(),
                _ => 0,
            }
    }

    /// Write the message with `credits` returned into `buf` (at least
    /// [`Msg::buffer_len`] bytes); returns the length written.
    ///
    /// # Panics
    /// If `buf` is too short or a `Grant` has more than [`MAX_GRANTS`].
    pub fn emit(&self, credits: u16, buf: &mut [u8]) -> usize {
        let len = self.buffer_len();
        let buf = &mut buf[..len];
        buf.fill(0);
        let (ty, count, a, b, c) = match self {
            Msg::Hello {
                token,
                streams,
                block_size,
                iodepth,
            } => (
                T_HELLO,
                0,
                *token,
                u64::from(*streams),
                pair(*block_size, *iodepth),
            ),
            Msg::HelloAck {
                session,
                streams,
                block_size,
                iodepth,
            } => (
                T_HELLO_ACK,
                0,
                *session,
                u64::from(*streams),
                pair(*block_size, *iodepth),
            ),
            Msg::Begin {
                transfer,
                len,
                prerequest,
            } => (
                T_BEGIN,
                0,
                *transfer,
                len.unwrap_or(u64::MAX),
                u64::from(*prerequest),
            ),
            Msg::Request { n } => (T_REQUEST, 0, 0, 0, u64::from(*n)),
            Msg::Grant { transfer, grants } => {
                assert!(grants.len() <= MAX_GRANTS, "too many grants in one message");
                for (i, e) in grants.iter().enumerate() {
                    let o = HEADER_LEN + i * GRANT_LEN;
                    buf[o..o + 4].copy_from_slice(&e.block.to_be_bytes());
                    buf[o + 4..o + 8].copy_from_slice(&e.rkey.to_be_bytes());
                    buf[o + 8..o + 16].copy_from_slice(&e.addr.to_be_bytes());
                }
                (T_GRANT, grants.len(), *transfer, 0, 0)
            }
            Msg::BlockDone { seq, len, block } => {
                (T_BLOCK_DONE, 0, *seq, u64::from(*len), u64::from(*block))
            }
            Msg::End { blocks, bytes } => (T_END, 0, *blocks, *bytes, 0),
            Msg::Fin { bytes } => (T_FIN, 0, *bytes, 0, 0),
            Msg::Abort { reason } => {
                let n = len - HEADER_LEN;
                buf[HEADER_LEN..].copy_from_slice(&clip(reason).as_bytes()[..n]);
                (T_ABORT, n, 0, 0, 0)
            }
            Msg::Credit => (T_CREDIT, 0, 0, 0, 0),
        };
        buf[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        buf[field::TYPE] = ty;
        buf[field::FLAGS] = 0;
        buf[field::CREDITS].copy_from_slice(&credits.to_be_bytes());
        buf[field::COUNT].copy_from_slice(&(count as u16).to_be_bytes());
        buf[field::A].copy_from_slice(&a.to_be_bytes());
        buf[field::B].copy_from_slice(&b.to_be_bytes());
        buf[field::C].copy_from_slice(&c.to_be_bytes());
        len
    }

    /// Parse an untrusted message; returns it and the credits it returns.
    pub fn parse(buf: &[u8]) -> Result<(Msg, u16), MsgError> {
        if buf.len() < HEADER_LEN {
            return Err(MsgError::Truncated { len: buf.len() });
        }
        let magic = u16::from_be_bytes([buf[0], buf[1]]);
        if magic != MAGIC {
            return Err(MsgError::BadMagic(magic));
        }
        let credits =
            u16::from_be_bytes([buf[field::CREDITS.start], buf[field::CREDITS.start + 1]]);
        let count = usize::from(u16::from_be_bytes([
            buf[field::COUNT.start],
            buf[field::COUNT.start + 1],
        ]));
        let (a, b, c) = (
            u64_at(buf, field::A),
            u64_at(buf, field::B),
            u64_at(buf, field::C),
        );
        let tail = &buf[HEADER_LEN..];
        let msg = match buf[field::TYPE] {
            T_HELLO => {
                let (block_size, iodepth) = split(c);
                Msg::Hello {
                    token: a,
                    streams: b as u32,
                    block_size,
                    iodepth,
                }
            }
            T_HELLO_ACK => {
                let (block_size, iodepth) = split(c);
                Msg::HelloAck {
                    session: a,
                    streams: b as u32,
                    block_size,
                    iodepth,
                }
            }
            T_BEGIN => Msg::Begin {
                transfer: a,
                len: (b != u64::MAX).then_some(b),
                prerequest: c as u32,
            },
            T_REQUEST => Msg::Request { n: c as u32 },
            T_GRANT => {
                if count > MAX_GRANTS || tail.len() < count * GRANT_LEN {
                    return Err(MsgError::BadCount {
                        count,
                        len: buf.len(),
                    });
                }
                Msg::Grant {
                    transfer: a,
                    grants: (0..count)
                        .map(|i| {
                            let o = i * GRANT_LEN;
                            Grant {
                                block: u32_at(tail, o),
                                rkey: u32_at(tail, o + 4),
                                addr: u64_at(tail, o + 8..o + 16),
                            }
                        })
                        .collect(),
                }
            }
            T_BLOCK_DONE => Msg::BlockDone {
                seq: a,
                len: b as u32,
                block: c as u32,
            },
            T_END => Msg::End {
                blocks: a,
                bytes: b,
            },
            T_FIN => Msg::Fin { bytes: a },
            T_ABORT => {
                // A reason longer than a message buffer cannot come from a
                // peer that follows this format (the fuzzer found the
                // round trip breaking on one).
                if count > MAX_REASON || tail.len() < count {
                    return Err(MsgError::BadCount {
                        count,
                        len: buf.len(),
                    });
                }
                // Invalid UTF-8 becomes U+FFFD, which can make the text
                // longer than what arrived: keep it within one buffer.
                let text = String::from_utf8_lossy(&tail[..count]);
                Msg::Abort {
                    reason: clip(&text).to_owned(),
                }
            }
            T_CREDIT => Msg::Credit,
            t => return Err(MsgError::UnknownType(t)),
        };
        Ok((msg, credits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: Msg) {
        let mut buf = [0u8; MSG_BUF];
        let n = m.emit(7, &mut buf);
        assert_eq!(n, m.buffer_len());
        assert_eq!(Msg::parse(&buf[..n]).unwrap(), (m, 7));
    }

    #[test]
    fn every_message_roundtrips() {
        roundtrip(Msg::Hello {
            token: 0xdead_beef_0000_0001,
            streams: 8,
            block_size: 1 << 20,
            iodepth: 4,
        });
        roundtrip(Msg::HelloAck {
            session: 42,
            streams: 2,
            block_size: 4096,
            iodepth: 1,
        });
        roundtrip(Msg::Begin {
            transfer: 3,
            len: Some(0),
            prerequest: 16,
        });
        roundtrip(Msg::Begin {
            transfer: 3,
            len: None,
            prerequest: 16,
        });
        roundtrip(Msg::Request { n: 5 });
        roundtrip(Msg::Grant {
            transfer: 77,
            grants: (0..MAX_GRANTS as u32)
                .map(|i| Grant {
                    block: i,
                    rkey: 0x100 | i,
                    addr: 0x7f00_0000_0000 + u64::from(i),
                })
                .collect(),
        });
        roundtrip(Msg::BlockDone {
            seq: 9,
            len: 12345,
            block: 3,
        });
        roundtrip(Msg::End {
            blocks: 10,
            bytes: 10_000,
        });
        roundtrip(Msg::Fin { bytes: 1 });
        roundtrip(Msg::Abort {
            reason: "disk full".into(),
        });
        roundtrip(Msg::Credit);
    }

    #[test]
    fn abort_reasons_stay_within_one_buffer_and_round_trip() {
        // Too long on the wire: refused.
        let mut buf = vec![0u8; 2 * MSG_BUF];
        let n = Msg::Abort { reason: "x".into() }.emit(0, &mut buf);
        let count = (MAX_REASON + 1) as u16;
        buf[field::COUNT].copy_from_slice(&count.to_be_bytes());
        assert!(n < buf.len());
        assert!(matches!(
            Msg::parse(&buf[..HEADER_LEN + MAX_REASON + 1]),
            Err(MsgError::BadCount { .. })
        ));
        // Invalid UTF-8 at full length grows when replaced (1 byte -> 3):
        // the parsed reason is clipped at a character boundary and then
        // round-trips.
        let mut m = vec![0u8; MSG_BUF];
        Msg::Abort {
            reason: "y".repeat(MAX_REASON),
        }
        .emit(0, &mut m);
        m[HEADER_LEN..].fill(0xff);
        let (parsed, _) = Msg::parse(&m).unwrap();
        let Msg::Abort { reason } = &parsed else {
            panic!("not an Abort: {parsed:?}")
        };
        assert!(reason.len() <= MAX_REASON && reason.starts_with('\u{fffd}'));
        let mut again = vec![0u8; parsed.buffer_len()];
        let k = parsed.emit(0, &mut again);
        assert_eq!(Msg::parse(&again[..k]).unwrap().0, parsed);
        // A long reason of multi-byte characters is cut at a boundary.
        let long = Msg::Abort {
            reason: "é".repeat(MAX_REASON),
        };
        assert!(long.buffer_len() - HEADER_LEN <= MAX_REASON);
        let mut out = vec![0u8; long.buffer_len()];
        let k = long.emit(0, &mut out);
        let (back, _) = Msg::parse(&out[..k]).unwrap();
        assert!(matches!(back, Msg::Abort { ref reason } if reason.chars().all(|c| c == 'é')));
    }

    #[test]
    fn byte_literal_block_done() {
        let bytes = [
            0x52, 0x46, 6, 0, 0, 2, 0, 0, //
            0, 0, 0, 0, 0, 0, 0, 5, //
            0, 0, 0, 0, 0, 0, 0x10, 0, //
            0, 0, 0, 0, 0, 0, 0, 1,
        ];
        assert_eq!(
            Msg::parse(&bytes).unwrap(),
            (
                Msg::BlockDone {
                    seq: 5,
                    len: 4096,
                    block: 1
                },
                2
            )
        );
    }

    #[test]
    fn malformed_messages_are_refused() {
        assert_eq!(
            Msg::parse(&[0x52; 10]),
            Err(MsgError::Truncated { len: 10 })
        );
        let mut buf = [0u8; 64];
        Msg::Credit.emit(0, &mut buf);
        buf[0] = 0;
        assert!(matches!(Msg::parse(&buf), Err(MsgError::BadMagic(_))));
        Msg::Credit.emit(0, &mut buf);
        buf[2] = 200;
        assert_eq!(Msg::parse(&buf), Err(MsgError::UnknownType(200)));
        // A grant count larger than the message.
        Msg::Grant {
            transfer: 0,
            grants: vec![],
        }
        .emit(0, &mut buf);
        buf[6..8].copy_from_slice(&10u16.to_be_bytes());
        assert!(matches!(
            Msg::parse(&buf[..HEADER_LEN + 16]),
            Err(MsgError::BadCount { .. })
        ));
    }
}
