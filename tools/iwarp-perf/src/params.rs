//! Test parameters and the small binary blocks the two ends exchange.
//!
//! The client carries its [`Params`] and its buffer addresses ([`Remote`])
//! in the MPA Request's private data (RFC 5044 §7.1 allows up to 512 bytes;
//! we use 80), the server answers with its own [`Remote`] in the MPA Reply.
//! The raw-TCP baseline sends the same parameter block as the first 80
//! bytes of each connection. So a server needs no options beyond its port:
//! like perftest, both ends run the same test, but here the server adopts
//! what the client asks for.

use std::fmt;
use std::time::Duration;

/// The six tests, named as in perftest (`ib_write_bw` ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    #[value(name = "write_bw")]
    WriteBw,
    #[value(name = "read_bw")]
    ReadBw,
    #[value(name = "send_bw")]
    SendBw,
    #[value(name = "write_lat")]
    WriteLat,
    #[value(name = "read_lat")]
    ReadLat,
    #[value(name = "send_lat")]
    SendLat,
}

impl Test {
    const ALL: [Test; 6] = [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
        }
    }

    pub fn is_bw(self) -> bool {
        matches!(self, Test::WriteBw | Test::ReadBw | Test::SendBw)
    }

    fn code(self) -> u8 {
        Test::ALL.iter().position(|t| *t == self).unwrap_or(0) as u8
    }

    fn from_code(c: u8) -> Option<Test> {
        Test::ALL.get(c as usize).copied()
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything both ends must agree on for one run (one message size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub test: Test,
    /// Message size in bytes (at least 1).
    pub size: usize,
    /// Measured iterations (per QP); ignored when `duration` is set.
    pub iters: u64,
    /// Run for this long instead of `iters`.
    pub duration: Option<Duration>,
    /// Outstanding operations per QP (perftest `-t`).
    pub depth: u32,
    /// Number of QPs (connections).
    pub qps: u32,
    /// Fill, checksum and verify every message.
    pub integrity: bool,
    /// The CQs are in `ProgressMode::BusyPoll` (the waiting thread does the
    /// receive work and never sleeps) instead of `ProgressMode::Threaded`.
    pub busy_poll: bool,
    /// Self-test of `--integrity`: the receiver flips one byte of one
    /// message before checking it, so the run must fail.
    pub corrupt: bool,
    /// Bound on every single wait of the data phase.
    pub timeout: Duration,
}

/// Where a side's buffers are, for the peer's RDMA Write / Read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Remote {
    pub data_addr: u64,
    pub data_len: u64,
    pub data_rkey: u32,
    pub ctrl_addr: u64,
    pub ctrl_rkey: u32,
}

const MAGIC: &[u8; 4] = b"IWPF";
const VERSION: u8 = 1;
/// Length of an encoded request block ([`encode_request`]).
pub const REQUEST_LEN: usize = 80;
/// Length of an encoded reply block ([`encode_reply`]).
pub const REPLY_LEN: usize = 40;

const F_INTEGRITY: u8 = 1;
const F_BUSY: u8 = 2;
const F_CORRUPT: u8 = 4;
const F_LAST: u8 = 8;

/// What a connecting client tells the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub params: Params,
    /// Index of this connection among `params.qps`.
    pub qp_index: u32,
    /// The last run of the client: the server exits after it.
    pub last: bool,
    pub remote: Remote,
}

fn put_remote(b: &mut [u8], r: &Remote) {
    b[0..8].copy_from_slice(&r.data_addr.to_le_bytes());
    b[8..16].copy_from_slice(&r.data_len.to_le_bytes());
    b[16..24].copy_from_slice(&r.ctrl_addr.to_le_bytes());
    b[24..28].copy_from_slice(&r.data_rkey.to_le_bytes());
    b[28..32].copy_from_slice(&r.ctrl_rkey.to_le_bytes());
}

fn get_remote(b: &[u8]) -> Remote {
    Remote {
        data_addr: u64_at(b, 0),
        data_len: u64_at(b, 8),
        ctrl_addr: u64_at(b, 16),
        data_rkey: u32_at(b, 24),
        ctrl_rkey: u32_at(b, 28),
    }
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(w)
}

pub fn encode_request(r: &Request) -> Vec<u8> {
    let p = &r.params;
    let mut b = vec![0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[5] = p.test.code();
    b[6] = (if p.integrity { F_INTEGRITY } else { 0 })
        | (if p.busy_poll { F_BUSY } else { 0 })
        | (if p.corrupt { F_CORRUPT } else { 0 })
        | (if r.last { F_LAST } else { 0 });
    b[8..16].copy_from_slice(&(p.size as u64).to_le_bytes());
    b[16..24].copy_from_slice(&p.iters.to_le_bytes());
    let dur_ms = p.duration.map_or(0, |d| d.as_millis().max(1) as u64);
    b[24..32].copy_from_slice(&dur_ms.to_le_bytes());
    b[32..36].copy_from_slice(&p.depth.to_le_bytes());
    b[36..40].copy_from_slice(&p.qps.to_le_bytes());
    b[40..44].copy_from_slice(&r.qp_index.to_le_bytes());
    let t_ms = p.timeout.as_millis().min(u32::MAX as u128) as u32;
    b[44..48].copy_from_slice(&t_ms.to_le_bytes());
    put_remote(&mut b[48..80], &r.remote);
    b
}

pub fn decode_request(b: &[u8]) -> Result<Request, String> {
    if b.len() < REQUEST_LEN || &b[0..4] != MAGIC {
        return Err(format!(
            "the peer is not an iwarp-perf client ({} bytes of private data without the IWPF block)",
            b.len()
        ));
    }
    if b[4] != VERSION {
        return Err(format!(
            "iwarp-perf protocol version {} from the peer, {VERSION} here: run the same build on both ends",
            b[4]
        ));
    }
    let test = Test::from_code(b[5]).ok_or_else(|| format!("unknown test code {}", b[5]))?;
    let flags = b[6];
    let size = u64_at(b, 8);
    let depth = u32_at(b, 32);
    let qps = u32_at(b, 36);
    if size == 0 || size > u32::MAX as u64 || depth == 0 || qps == 0 {
        return Err(format!(
            "invalid parameters from the peer: size {size}, depth {depth}, qps {qps}"
        ));
    }
    let dur_ms = u64_at(b, 24);
    Ok(Request {
        params: Params {
            test,
            size: size as usize,
            iters: u64_at(b, 16),
            duration: (dur_ms > 0).then(|| Duration::from_millis(dur_ms)),
            depth,
            qps,
            integrity: flags & F_INTEGRITY != 0,
            busy_poll: flags & F_BUSY != 0,
            corrupt: flags & F_CORRUPT != 0,
            timeout: Duration::from_millis(u64::from(u32_at(b, 44)).max(100)),
        },
        qp_index: u32_at(b, 40),
        last: flags & F_LAST != 0,
        remote: get_remote(&b[48..80]),
    })
}

pub fn encode_reply(r: &Remote) -> Vec<u8> {
    let mut b = vec![0u8; REPLY_LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    put_remote(&mut b[8..40], r);
    b
}

pub fn decode_reply(b: &[u8]) -> Result<Remote, String> {
    if b.len() < REPLY_LEN || &b[0..4] != MAGIC || b[4] != VERSION {
        return Err(format!(
            "the server's MPA Reply carries no iwarp-perf block ({} bytes of private data): is it an iwarp-perf server of the same version?",
            b.len()
        ));
    }
    Ok(get_remote(&b[8..40]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            params: Params {
                test: Test::SendLat,
                size: 65537,
                iters: 12345,
                duration: Some(Duration::from_millis(1500)),
                depth: 64,
                qps: 3,
                integrity: true,
                busy_poll: false,
                corrupt: true,
                timeout: Duration::from_secs(7),
            },
            qp_index: 2,
            last: true,
            remote: Remote {
                data_addr: 0x7f00_1234_5000,
                data_len: 1 << 20,
                data_rkey: 0x1234_56ab,
                ctrl_addr: 0x7f00_9999_0000,
                ctrl_rkey: 0x0000_02cd,
            },
        };
        let b = encode_request(&r);
        assert_eq!(b.len(), REQUEST_LEN);
        assert_eq!(decode_request(&b).unwrap(), r);
        let rep = encode_reply(&r.remote);
        assert_eq!(decode_reply(&rep).unwrap(), r.remote);
        assert!(decode_request(&rep).is_err());
        assert!(decode_reply(&[]).is_err());
    }
}
