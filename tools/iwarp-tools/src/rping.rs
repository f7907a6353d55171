//! The wire protocol of rdma-core's `rping` (`librdmacm/examples/rping.c`).
//!
//! rping is a ping-pong over one reliable connection. Every control message
//! is a 16-byte Send carrying a [`RpingInfo`] (`struct rping_rdma_info`:
//! big-endian `buf`, `rkey`, `size`). One iteration, as seen on the wire
//! between two Linux siw hosts (`siw-default.pcap`, port 7174):
//!
//! 1. client → server: Send {start_buf, start rkey, size} (the Read source);
//! 2. server: RDMA Read of `size` bytes from it into its own buffer;
//! 3. server → client: Send "go ahead" (16 bytes; rping never fills the
//!    server's send buffer, so it is all zeros);
//! 4. client → server: Send {rdma_buf, rdma rkey, size} (the Write sink);
//! 5. server: RDMA Write of `strlen(buf) + 1` bytes of what it read;
//! 6. server → client: Send "go ahead" (zeros again).
//!
//! The client then compares its source and sink buffers (`-V`) and prints
//! the sink (`-v`). Either side refuses a Send that is not exactly 16 bytes
//! ("Received bogus data").
//!
//! The ping data is `"rdma-ping-%d: "` followed by printable ASCII from 'A'
//! to 'z' (65..=122) that wraps around; the first character advances by one
//! per iteration, and the last byte of the buffer is a NUL.

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's default ping size (`-S`).
pub const DEFAULT_SIZE: usize = 64;
/// Largest ping size rping accepts: `RPING_BUFSIZE - 1`.
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// Smallest ping size rping accepts: `sizeof(stringify(INT_MAX)) +
/// sizeof(RPING_MSG_FMT)` = 11 + 15.
pub const MIN_SIZE: usize = 26;
/// Size of a control message on the wire.
pub const INFO_LEN: usize = 16;
/// rping's send-queue depth (`RPING_SQ_DEPTH`).
pub const SQ_DEPTH: u32 = 16;
/// rping posts at most this many receives (`max_recv_wr`).
pub const RQ_DEPTH: u32 = 2;

/// `struct rping_rdma_info`: where the peer may Read from or Write to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RpingInfo {
    /// Tagged offset (the buffer's virtual address on the advertising side).
    pub buf: u64,
    /// STag of the buffer's memory region.
    pub rkey: u32,
    /// Bytes to transfer.
    pub size: u32,
}

impl RpingInfo {
    /// Encode as the 16 big-endian bytes rping sends.
    pub fn to_bytes(self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[0..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Decode a received control message; `None` unless it is exactly
    /// [`INFO_LEN`] bytes (rping's "Received bogus data" check).
    pub fn from_bytes(b: &[u8]) -> Option<RpingInfo> {
        let b: &[u8; INFO_LEN] = b.try_into().ok()?;
        Some(RpingInfo {
            buf: u64::from_be_bytes(b[0..8].try_into().ok()?),
            rkey: u32::from_be_bytes(b[8..12].try_into().ok()?),
            size: u32::from_be_bytes(b[12..16].try_into().ok()?),
        })
    }
}

/// The first pattern character of iteration `ping` (rping's `start`).
pub fn start_char(ping: u64) -> u8 {
    b'A' + (ping % 58) as u8
}

/// Fill `buf` with rping's ping data for iteration `ping`, exactly as the
/// rping client does: the `"rdma-ping-%d: "` prefix (truncated like
/// `snprintf` if the buffer is small), then the wrapping 'A'..='z' pattern
/// starting at [`start_char`], then a NUL in the last byte.
pub fn fill_ping(buf: &mut [u8], ping: u64) {
    if buf.is_empty() {
        return;
    }
    // rping keeps the counter in an `int` and formats it with %d.
    let prefix = format!("rdma-ping-{}: ", ping as i32);
    let n = prefix.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let mut c = start_char(ping);
    for b in &mut buf[n..] {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    let last = buf.len() - 1;
    buf[last] = 0;
}

/// The ping data of iteration `ping` for a `size`-byte buffer.
pub fn ping_data(size: usize, ping: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    fill_ping(&mut v, ping);
    v
}

/// The bytes up to (not including) the first NUL, as `printf("%s")` shows
/// them.
pub fn c_str(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    &buf[..end]
}

/// The RDMA Write length the rping server uses: `strlen(rdma_buf) + 1`,
/// capped at the buffer (and at the sink size the client advertised).
pub fn echo_len(buf: &[u8], sink_size: usize) -> usize {
    (c_str(buf).len() + 1).min(buf.len()).min(sink_size)
}

/// Check a ping size the way rping's `-S` does.
pub fn check_size(size: usize) -> Result<(), String> {
    if (MIN_SIZE..=MAX_SIZE).contains(&size) {
        Ok(())
    } else {
        Err(format!(
            "invalid size {size} (valid range is {MIN_SIZE} to {MAX_SIZE})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The first Send of siw-default.pcap (frame 8, client 10.77.0.3 → server
    // port 7174): rping's start buffer advertisement.
    const SIW_ADV: [u8; 16] = [
        0x00, 0x00, 0x55, 0x83, 0xee, 0xf0, 0xdd, 0x50, 0xd2, 0x1b, 0x4e, 0x00, 0x00, 0x00, 0x00,
        0x40,
    ];

    #[test]
    fn info_decodes_the_siw_capture() {
        let info = RpingInfo::from_bytes(&SIW_ADV).unwrap();
        assert_eq!(info.buf, 0x0000_5583_eef0_dd50);
        assert_eq!(info.rkey, 0xd21b_4e00);
        assert_eq!(info.size, 64);
        assert_eq!(info.to_bytes(), SIW_ADV);
    }

    #[test]
    fn info_rejects_other_lengths() {
        assert_eq!(RpingInfo::from_bytes(&SIW_ADV[..15]), None);
        assert_eq!(RpingInfo::from_bytes(&[0u8; 17]), None);
        assert_eq!(
            RpingInfo::from_bytes(&[0u8; 16]),
            Some(RpingInfo::default())
        );
    }

    #[test]
    fn ping_data_matches_the_siw_capture() {
        // Read Response payloads of siw-default.pcap, iterations 0 and 2.
        let p0 = b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\0";
        let p2 = b"rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst\0";
        assert_eq!(ping_data(64, 0), p0.to_vec());
        assert_eq!(ping_data(64, 2), p2.to_vec());
        assert_eq!(echo_len(&ping_data(64, 0), 64), 64);
    }

    #[test]
    fn pattern_wraps_from_z_to_a() {
        let d = ping_data(200, 0);
        let body = &d[13..199];
        assert_eq!(body[57], b'z');
        assert_eq!(body[58], b'A');
        assert_eq!(start_char(57), b'z');
        assert_eq!(start_char(58), b'A');
        assert!(ping_data(200, 1000)[..].starts_with(b"rdma-ping-1000: "));
    }

    #[test]
    fn tiny_buffers_truncate_like_snprintf() {
        let d = ping_data(MIN_SIZE, 2_147_483_647);
        assert_eq!(d.len(), MIN_SIZE);
        assert_eq!(d[MIN_SIZE - 1], 0);
        assert!(d.starts_with(b"rdma-ping-2147483647: "));
        let mut small = [0xffu8; 5];
        fill_ping(&mut small, 0);
        assert_eq!(&small, b"rdma\0");
    }

    #[test]
    fn size_limits_follow_rping() {
        assert!(check_size(25).is_err());
        assert!(check_size(26).is_ok());
        assert!(check_size(65535).is_ok());
        assert!(check_size(65536).is_err());
    }
}
