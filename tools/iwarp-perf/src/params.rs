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
/// 2: the request fits InfiniBand/RoCE's rdma_cm private data (56 bytes;
/// version 1 had 80, which `rdma_connect` refuses with EINVAL on rxe).
/// 3: up to 1024 QPs (two more bits each for the count and the index).
const VERSION: u8 = 3;
/// Length of an encoded request block ([`encode_request`]): the most
/// private data an rdma_cm connect request carries on InfiniBand and RoCE
/// (92 bytes of the CM REQ less rdma_cm's 36-byte header). iWARP allows
/// 512 (RFC 5044 §7.1), so 56 fits every transport.
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | `IWPF` |
/// | 4 | version |
/// | 5 | test |
/// | 6 | flags (integrity, busy poll, corrupt, last run; bits 4-7: high bits of the next two) |
/// | 7 | QPs - 1 (low 8 of 10 bits) |
/// | 8 | this QP's index (low 8 of 10 bits) |
/// | 9 | `--timeout` in whole seconds (rounded up, 1..=255) |
/// | 10..12 | depth (u16) |
/// | 12..16 | message size (u32) |
/// | 16..20 | iterations (u32) |
/// | 20..24 | `--duration` in ms (u32, 0: none) |
/// | 24..56 | the client's buffers ([`Remote`]) |
///
/// Integers are little-endian. [`Params::check_wire`] keeps the values in
/// range.
pub const REQUEST_LEN: usize = 56;
// rdma_connect on rxe refused version 1's 80 bytes with EINVAL.
const _: () = assert!(REQUEST_LEN <= 56);
/// Length of an encoded reply block ([`encode_reply`]).
pub const REPLY_LEN: usize = 40;

const F_INTEGRITY: u8 = 1;
const F_BUSY: u8 = 2;
const F_CORRUPT: u8 = 4;
const F_LAST: u8 = 8;
/// Version 3: bits 4-5 of the flags byte carry bits 8-9 of `qps - 1`, bits
/// 6-7 bits 8-9 of the QP index, so a run has up to [`MAX_QPS`]
/// connections (the 56-byte block has no other room).
const QPS_HI_SHIFT: u8 = 4;
const INDEX_HI_SHIFT: u8 = 6;

/// Most connections one run may have (10 bits on the wire).
pub const MAX_QPS: u32 = 1024;

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

impl Params {
    /// Whether these parameters fit the request block (see
    /// [`REQUEST_LEN`]); the command line checks its own limits, which
    /// are within these, so this guards the encoding itself.
    pub fn check_wire(&self) -> Result<(), String> {
        if !(1..=MAX_QPS).contains(&self.qps) {
            return Err(format!("{} QPs: 1 to {MAX_QPS} fit the protocol", self.qps));
        }
        if self.depth == 0 || self.depth > u32::from(u16::MAX) {
            return Err(format!("depth {}: 1 to 65535 fit the protocol", self.depth));
        }
        if self.size == 0 || self.size > u32::MAX as usize {
            return Err(format!(
                "message size {} does not fit the protocol",
                self.size
            ));
        }
        if self.iters == 0 || self.iters > u64::from(u32::MAX) {
            return Err(format!(
                "{} iterations: 1 to {} fit the protocol",
                self.iters,
                u32::MAX
            ));
        }
        Ok(())
    }
}

/// Encode a request (layout at [`REQUEST_LEN`]). Values out of the
/// block's range are clamped: callers check [`Params::check_wire`] first.
pub fn encode_request(r: &Request) -> Vec<u8> {
    let p = &r.params;
    let clamp32 = |v: u64| v.min(u64::from(u32::MAX)) as u32;
    let mut b = vec![0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[5] = p.test.code();
    b[6] = (if p.integrity { F_INTEGRITY } else { 0 })
        | (if p.busy_poll { F_BUSY } else { 0 })
        | (if p.corrupt { F_CORRUPT } else { 0 })
        | (if r.last { F_LAST } else { 0 });
    let qps1 = p.qps.clamp(1, MAX_QPS) - 1;
    let index = r.qp_index.min(MAX_QPS - 1);
    b[6] |= ((qps1 >> 8) as u8) << QPS_HI_SHIFT | ((index >> 8) as u8) << INDEX_HI_SHIFT;
    b[7] = qps1 as u8;
    b[8] = index as u8;
    b[9] = p.timeout.as_secs_f64().ceil().clamp(1.0, 255.0) as u8;
    b[10..12].copy_from_slice(&(p.depth.min(u32::from(u16::MAX)) as u16).to_le_bytes());
    b[12..16].copy_from_slice(&clamp32(p.size as u64).to_le_bytes());
    b[16..20].copy_from_slice(&clamp32(p.iters).to_le_bytes());
    let dur_ms = p.duration.map_or(0, |d| d.as_millis().max(1) as u64);
    b[20..24].copy_from_slice(&clamp32(dur_ms).to_le_bytes());
    put_remote(&mut b[24..56], &r.remote);
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
    let qps = (u32::from((flags >> QPS_HI_SHIFT) & 3) << 8 | u32::from(b[7])) + 1;
    let qp_index = u32::from((flags >> INDEX_HI_SHIFT) & 3) << 8 | u32::from(b[8]);
    let depth = u32::from(u16::from_le_bytes([b[10], b[11]]));
    let size = u32_at(b, 12);
    let iters = u64::from(u32_at(b, 16));
    if size == 0 || depth == 0 || iters == 0 || qp_index >= qps {
        return Err(format!(
            "invalid parameters from the peer: size {size}, depth {depth}, iterations {iters}, QP {qp_index} of {qps}"
        ));
    }
    let dur_ms = u64::from(u32_at(b, 20));
    Ok(Request {
        params: Params {
            test,
            size: size as usize,
            iters,
            duration: (dur_ms > 0).then(|| Duration::from_millis(dur_ms)),
            depth,
            qps,
            integrity: flags & F_INTEGRITY != 0,
            busy_poll: flags & F_BUSY != 0,
            corrupt: flags & F_CORRUPT != 0,
            timeout: Duration::from_secs(u64::from(b[9].max(1))),
        },
        qp_index,
        last: flags & F_LAST != 0,
        remote: get_remote(&b[24..56]),
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

    fn request(qps: u32, qp_index: u32) -> Request {
        Request {
            params: Params {
                test: Test::WriteBw,
                size: 4096,
                iters: 10,
                duration: None,
                depth: 4096,
                qps,
                integrity: false,
                busy_poll: true,
                corrupt: false,
                timeout: Duration::from_millis(1500),
            },
            qp_index,
            last: false,
            remote: Remote::default(),
        }
    }

    #[test]
    fn the_request_fits_infiniband_and_roce_private_data() {
        let r = request(256, 255);
        let b = encode_request(&r);
        assert_eq!(b.len(), REQUEST_LEN);
        let d = decode_request(&b).unwrap();
        assert_eq!((d.params.qps, d.qp_index), (256, 255));
        assert_eq!(d.params.depth, 4096);
        // --timeout goes in whole seconds, rounded up.
        assert_eq!(d.params.timeout, Duration::from_secs(2));
        assert!(d.params.busy_poll && !d.last);
    }

    #[test]
    fn requests_out_of_range_are_refused() {
        let mut b = encode_request(&request(2, 1));
        b[8] = 2; // QP index 2 of 2
        assert!(decode_request(&b).unwrap_err().contains("QP 2 of 2"));
        let mut b = encode_request(&request(1, 0));
        b[4] = 1; // version 1 (80 bytes)
        assert!(decode_request(&b).unwrap_err().contains("version 1"));
        let mut p = request(1, 0).params;
        assert!(p.check_wire().is_ok());
        p.iters = u64::from(u32::MAX) + 1;
        assert!(p.check_wire().unwrap_err().contains("iterations"));
        p.iters = 1;
        p.qps = 1024;
        assert!(p.check_wire().is_ok());
        p.qps = 1025;
        assert!(p.check_wire().unwrap_err().contains("1 to 1024"));
    }

    #[test]
    fn a_thousand_qps_fit_the_block() {
        for (qps, idx) in [(1024, 1023), (1000, 999), (257, 256), (513, 2), (300, 299)] {
            let r = request(qps, idx);
            let mut b = encode_request(&r);
            assert_eq!(b.len(), REQUEST_LEN);
            let d = decode_request(&b).unwrap();
            assert_eq!((d.params.qps, d.qp_index), (qps, idx));
            // The high bits share the flags byte: the flags still decode.
            assert!(d.params.busy_poll && !d.params.integrity && !d.last);
            // An index at or past the count is refused with the high bits too.
            b[6] |= 3 << INDEX_HI_SHIFT;
            b[8] = 0xff;
            if qps < 1024 {
                assert!(decode_request(&b)
                    .unwrap_err()
                    .contains(&format!("of {qps}")));
            }
        }
    }
}
