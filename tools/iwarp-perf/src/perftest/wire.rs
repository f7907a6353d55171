//! The messages perftest (`ib_write_bw -R` and friends) exchanges over its
//! rdma_cm control connection, as values and bytes (no I/O here).
//!
//! Every message is one RDMA Send of at most 56 bytes (the peer's receive
//! buffer is one `pingpong_dest`), integers in network byte order. The
//! layouts were taken from captures of perftest 4.5-0.17 (Debian 12,
//! version string "6.06") talking to itself over Linux siw, and agree with
//! `rdma_write_keys`/`ctx_xchg_data` in perftest's
//! `perftest_communication.c`.

use std::fmt;

/// Size of a `pingpong_dest` on the wire (and of the peer's receive buffer).
pub const DEST_LEN: usize = 56;
/// Size of the version message (`char version[16]`).
pub const VERSION_LEN: usize = 16;
/// The version we announce: that of the perftest whose wire format we
/// follow. perftest compares versions numerically (e.g. 8-byte iteration
/// counts in the reports from 5.33 on), so a peer treats us like itself.
pub const OUR_VERSION: &str = "6.06";
/// perftest's `cycle_buffer` default (the page size) and cache line size,
/// exchanged after the version.
pub const CYCLE_BUFFER: u32 = 4096;
pub const CACHE_LINE: u32 = 64;

/// A wire message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn need(b: &[u8], n: usize, what: &str) -> Result<(), WireError> {
    if b.len() == n {
        Ok(())
    } else {
        Err(WireError(format!(
            "perftest {what}: expected {n} bytes, got {} (is the peer perftest with -R, and the same test?)",
            b.len()
        )))
    }
}

/// One queue pair's connection data (`struct pingpong_dest`): 56 bytes,
/// each field big-endian; 4 bytes of padding before the 8-byte address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    pub lid: u32,
    /// RDMA Reads the sender may have outstanding (its ORD).
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
    pub gid_index: u32,
}

impl Dest {
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        // 20..24: padding (perftest leaves stack bytes there; we send 0).
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Dest, WireError> {
        need(b, DEST_LEN, "pingpong_dest")?;
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Ok(Dest {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52),
        })
    }
}

/// The version message: the version string, NUL-padded to 16 bytes.
pub fn encode_version(v: &str) -> [u8; VERSION_LEN] {
    let mut b = [0u8; VERSION_LEN];
    let n = v.len().min(VERSION_LEN - 1);
    b[..n].copy_from_slice(&v.as_bytes()[..n]);
    b
}

/// The peer's version string and its numeric value.
pub fn decode_version(b: &[u8]) -> Result<(String, f64), WireError> {
    need(b, VERSION_LEN, "version")?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let s = std::str::from_utf8(&b[..end])
        .map_err(|_| WireError("perftest version: not text".into()))?
        .to_string();
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| WireError(format!("perftest version {s:?}: not a number")))?;
    Ok((s, v))
}

pub fn encode_u32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

pub fn decode_u32(b: &[u8], what: &str) -> Result<u32, WireError> {
    need(b, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// The MTU message: the `enum ibv_mtu` value as a decimal string with its
/// NUL ("3\0" for 1024 bytes).
pub fn encode_mtu(mtu_bytes: u32) -> Vec<u8> {
    let e = match mtu_bytes {
        0..=383 => 1,
        384..=767 => 2,
        768..=1535 => 3,
        1536..=3071 => 4,
        _ => 5,
    };
    let mut v = format!("{e}").into_bytes();
    v.push(0);
    v
}

/// The peer's MTU in bytes.
pub fn decode_mtu(b: &[u8]) -> Result<u32, WireError> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let s = std::str::from_utf8(&b[..end]).unwrap_or("");
    match s.parse::<u32>() {
        Ok(e @ 1..=5) => Ok(128 << e),
        _ => Err(WireError(format!(
            "perftest MTU message {b:02x?}: expected an ibv_mtu value 1..5 as text"
        ))),
    }
}

/// A bandwidth report (`struct bw_report_data`), exchanged as five 8-byte
/// Sends after the run; perftest's server prints the client's.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    pub size: u64,
    pub iters: u64,
    /// MB/s with perftest's MB = 2^20 bytes.
    pub bw_peak: f64,
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five messages in order: size, iterations, peak, average, rate.
    pub fn encode(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    pub fn decode(parts: &[Vec<u8>]) -> Result<BwReport, WireError> {
        if parts.len() != 5 {
            return Err(WireError(format!(
                "perftest report: expected 5 parts, got {}",
                parts.len()
            )));
        }
        let mut v = [0u64; 5];
        for (i, p) in parts.iter().enumerate() {
            need(p, 8, "report")?;
            let mut a = [0u8; 8];
            a.copy_from_slice(p);
            v[i] = u64::from_be_bytes(a);
        }
        Ok(BwReport {
            size: v[0],
            iters: v[1],
            bw_peak: f64::from_bits(v[2]),
            bw_avg: f64::from_bits(v[3]),
            msg_rate: f64::from_bits(v[4]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pingpong_dest as perftest 4.5-0.17 sent it (client of ib_write_bw
    /// on siw0, from a capture): lid 0, out_reads 1, QPN 3, PSN 0x4adc96,
    /// rkey 0x998ab100, vaddr 0x7ff1c1938000, GID from the MAC.
    const CAPTURED: &str =
        "00000000 00000001 00000003 004adc96 998ab100 00000000 00007ff1 c1938000 \
                            52540077 00020000 00000000 00000000 00000000 00000000";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn dest_decodes_a_captured_message_and_round_trips() {
        let b = hex(CAPTURED);
        let d = Dest::decode(&b).unwrap();
        assert_eq!(
            (d.lid, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr),
            (0, 1, 3, 0x4adc96, 0x998a_b100, 0x7ff1_c193_8000)
        );
        assert_eq!(&d.gid[..6], &[0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
        assert_eq!(d.encode().to_vec(), b);
    }

    #[test]
    fn dest_of_wrong_length_is_refused() {
        let e = Dest::decode(&[0u8; 16]).unwrap_err();
        assert!(e.0.contains("expected 56 bytes, got 16"), "{e}");
    }

    #[test]
    fn version_round_trips_and_rejects_garbage() {
        let b = encode_version(OUR_VERSION);
        assert_eq!(&b[..5], b"6.06\0");
        assert_eq!(decode_version(&b).unwrap(), ("6.06".to_string(), 6.06));
        assert!(decode_version(&encode_version("abc")).is_err());
        assert!(decode_version(b"6.06").is_err());
        // The longest string still keeps its NUL.
        assert_eq!(encode_version("0123456789abcdefXYZ")[15], 0);
    }

    #[test]
    fn mtu_and_u32_messages() {
        assert_eq!(encode_mtu(1024), b"3\0");
        assert_eq!(encode_mtu(4096), b"5\0");
        assert_eq!(encode_mtu(256), b"1\0");
        assert_eq!(decode_mtu(b"3\0").unwrap(), 1024);
        assert!(decode_mtu(b"9\0").is_err());
        assert!(decode_mtu(b"").is_err());
        assert_eq!(encode_u32(CYCLE_BUFFER), [0, 0, 0x10, 0]);
        assert_eq!(decode_u32(&[0, 0, 0, 0x40], "cache line").unwrap(), 64);
        assert!(decode_u32(&[0, 0x40], "cache line").is_err());
    }

    #[test]
    fn report_matches_a_captured_one() {
        // ib_write_bw client, 5 x 64 KiB: peak 21.39, avg 17.56 MB/s.
        let parts: Vec<Vec<u8>> = [
            "0000000000010000",
            "0000000000000005",
            "403563b7e9ec58a9",
            "40319022dd3136b4",
            "3f326a8a5e25be51",
        ]
        .iter()
        .map(|s| hex(s))
        .collect();
        let r = BwReport::decode(&parts).unwrap();
        assert_eq!((r.size, r.iters), (65536, 5));
        assert!((r.bw_peak - 21.39).abs() < 0.01 && (r.bw_avg - 17.56).abs() < 0.01);
        assert!((r.msg_rate - 0.000281).abs() < 0.000001);
        let again: Vec<Vec<u8>> = r.encode().iter().map(|p| p.to_vec()).collect();
        assert_eq!(again, parts);
        assert!(BwReport::decode(&parts[..4]).is_err());
        let mut short = parts.clone();
        short[2].pop();
        assert!(BwReport::decode(&short).is_err());
    }
}
