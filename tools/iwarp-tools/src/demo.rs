//! Loopback demonstrations: a server thread and a client in one process.
//!
//! [`run_exchange`] is a small RDMA conversation over one connection:
//!
//! 1. the server advertises a data region (and, for the opcode tour, two
//!    small regions the client will invalidate) in a Send;
//! 2. with [`ExchangeOpts::all_opcodes`], the client sends a Send, a Send
//!    with Solicited Event, a Send with Invalidate and a Send with Solicited
//!    Event and Invalidate, and the server checks each receive's payload,
//!    solicited flag and invalidated STag;
//! 3. the client RDMA-Writes a pattern into the data region and RDMA-Reads
//!    it back, comparing byte for byte;
//! 4. the client asks the server (Send) to verify its region; the server
//!    answers with a Send;
//! 5. with [`ExchangeOpts::bad_stag_write`], the client finally Writes to
//!    a region the server invalidated in step 2, so the server must answer
//!    with a Terminate (RFC 5040 §4.8; RFC 5041 §7.2 invalid STag), which
//!    both sides must report.
//!
//! That covers every RDMAP opcode of RFC 5040 §4.3: Write, Read Request,
//! Read Response, Send, Send with Invalidate, Send with SE, Send with SE
//! and Invalidate, and Terminate.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, Listener};
use iwarp::{Access, MemoryRegion, QpEvent, SendWr, SgList, WcOpcode, WrOpcode};
use iwarp_proto::engine::TermInfo;
use iwarp_proto::handshake::MpaConfig;

use crate::endpoint::Endpoint;
use crate::error::{chain, ToolError};
use crate::ping::describe_conn;

/// Receive slot size on both sides.
const SLOT: usize = 32 * 1024;
/// Receives the server posts up front.
const SERVER_RECVS: usize = 6;
/// Seed of the RDMA Write pattern.
const WRITE_SEED: u8 = 0x5a;
/// Length of the server's advertisement.
const INFO_LEN: usize = 32;

/// The Sends of the opcode tour: (what, payload length, solicited, which
/// server region to invalidate: 0 = none, 1 = A, 2 = B).
const SENDS: [(&str, usize, bool, u8); 4] = [
    ("Send", 100, false, 0),
    ("Send with Solicited Event", 3000, true, 0),
    ("Send with Invalidate", 30_000, false, 1),
    ("Send with SE and Invalidate", 300, true, 2),
];

/// What [`run_exchange`] should do.
#[derive(Debug, Clone)]
pub struct ExchangeOpts {
    /// MPA policy of both sides.
    pub mpa: MpaConfig,
    /// Address the server listens on (port 0 = any free port).
    pub listen: SocketAddr,
    /// Bytes to RDMA Write and read back.
    pub write_len: usize,
    /// Include the four Send variants (with invalidation).
    pub all_opcodes: bool,
    /// End with a Write to an invalidated STag, provoking a Terminate.
    pub bad_stag_write: bool,
    /// Bound on connection setup and on every wait.
    pub timeout: Duration,
}

/// What happened, for printing.
#[derive(Debug, Default, Clone)]
pub struct ExchangeReport {
    /// One line per step, in order.
    pub steps: Vec<String>,
    /// Bytes moved by RDMA Write and Read.
    pub rdma_bytes: u64,
    /// Bytes moved by Sends (both directions).
    pub send_bytes: u64,
    /// The negotiated connection.
    pub conn: String,
    /// The Terminate the server sent, if one was provoked.
    pub terminate: Option<TermInfo>,
}

/// Deterministic test data: `len` bytes derived from `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seed as u32 * 7 + (i >> 8) as u32) as u8
        })
        .collect()
}

/// The server's advertisement: data region, and the two regions the client
/// may invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServerInfo {
    data_addr: u64,
    data_rkey: u32,
    data_len: u32,
    inv_a_addr: u64,
    inv_a_rkey: u32,
    inv_b_rkey: u32,
}

impl ServerInfo {
    fn to_bytes(self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[0..8].copy_from_slice(&self.data_addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.data_rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.data_len.to_be_bytes());
        b[16..24].copy_from_slice(&self.inv_a_addr.to_be_bytes());
        b[24..28].copy_from_slice(&self.inv_a_rkey.to_be_bytes());
        b[28..32].copy_from_slice(&self.inv_b_rkey.to_be_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Option<ServerInfo> {
        if b.len() != INFO_LEN {
            return None;
        }
        let u64_at = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Some(ServerInfo {
            data_addr: u64_at(0),
            data_rkey: u32_at(8),
            data_len: u32_at(12),
            inv_a_addr: u64_at(16),
            inv_a_rkey: u32_at(24),
            inv_b_rkey: u32_at(28),
        })
    }
}

fn send(wr_id: u64, opcode: WrOpcode, mr: &MemoryRegion, len: usize, solicited: bool) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        sgl: SgList::single(mr.sge(0, len)),
        signaled: true,
        solicited,
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// The server half: runs in its own thread.
fn server(
    listener: Listener,
    opts: &ExchangeOpts,
) -> Result<(Vec<String>, Option<TermInfo>), ToolError> {
    let t = opts.timeout;
    let mut notes = Vec::new();
    let req = {
        let start = Instant::now();
        loop {
            match listener.get_request(Some(
                t.saturating_sub(start.elapsed())
                    .max(Duration::from_millis(1)),
            )) {
                Ok(r) => break r,
                Err(e) if start.elapsed() >= t => {
                    return Err(ToolError::Accept { cause: chain(&e) });
                }
                Err(e) => tracing::warn!("server: ignoring a failed connection attempt: {e}"),
            }
        }
    };
    let ep = Endpoint::new(16, SERVER_RECVS as u32, t)?;
    let data_mr = ep.reg(opts.write_len.max(1), Access::ALL)?;
    let inv_a = ep.reg(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let inv_b = ep.reg(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let recv_mr = ep.reg(SERVER_RECVS * SLOT, Access::LOCAL_WRITE)?;
    let msg_mr = ep.reg(SLOT, Access::NONE)?;
    for i in 0..SERVER_RECVS {
        ep.post_recv("receive", i as u64, &recv_mr, i * SLOT, SLOT)?;
    }
    req.accept(
        &ep.qp,
        &ConnParam {
            private_data: Vec::new(),
            mpa: opts.mpa.clone(),
            timeout: t,
            ..ConnParam::default()
        },
    )
    .map_err(|e| ToolError::Accept { cause: chain(&e) })?;

    let info = ServerInfo {
        data_addr: data_mr.addr(),
        data_rkey: data_mr.rkey(),
        data_len: opts.write_len as u32,
        inv_a_addr: inv_a.addr(),
        inv_a_rkey: inv_a.rkey(),
        inv_b_rkey: inv_b.rkey(),
    };
    msg_mr.write_at(0, &info.to_bytes());
    ep.post_send(
        "advertisement Send",
        &send(100, WrOpcode::Send, &msg_mr, INFO_LEN, false),
    )?;
    ep.wait_for("the advertisement Send", WcOpcode::Send)?;

    let read_slot = |wr_id: u64, len: u32| {
        let mut v = vec![0u8; len as usize];
        recv_mr.read_at(wr_id as usize * SLOT, &mut v);
        v
    };
    if opts.all_opcodes {
        for (i, &(what, len, solicited, inv)) in SENDS.iter().enumerate() {
            let wc = ep.wait_for("a Send from the client", WcOpcode::Recv)?;
            let data = read_slot(wc.wr_id, wc.byte_len);
            let want_inv = match inv {
                1 => Some(inv_a.rkey()),
                2 => Some(inv_b.rkey()),
                _ => None,
            };
            if data != pattern(i as u8, len) {
                return Err(ToolError::Mismatch(format!(
                    "server: {what}: received {} bytes that differ from the {len} sent",
                    data.len()
                )));
            }
            if wc.solicited != solicited || wc.invalidated_rkey != want_inv {
                return Err(ToolError::Mismatch(format!(
                    "server: {what}: solicited={} invalidated={:?}, expected solicited={solicited} invalidated={want_inv:?}",
                    wc.solicited, wc.invalidated_rkey
                )));
            }
            let inv_text = want_inv.map_or("none".to_string(), |k| format!("STag {k:#010x}"));
            notes.push(format!(
                "server received {what} ({len} bytes, solicited={solicited}, invalidated {inv_text}): ok"
            ));
        }
        if inv_a.is_valid() || inv_b.is_valid() {
            return Err(ToolError::Mismatch(
                "server: a region named by Send with Invalidate is still valid".into(),
            ));
        }
        notes.push("server: both regions named by Send with Invalidate are now invalid".into());
    }

    // The client's request to verify the written data.
    let wc = ep.wait_for("the client's verify request", WcOpcode::Recv)?;
    let req = read_slot(wc.wr_id, wc.byte_len);
    let verdict = match <[u8; 8]>::try_from(req.as_slice()) {
        Ok(b) if u64::from_be_bytes(b) as usize == opts.write_len => {
            let mut got = vec![0u8; opts.write_len];
            data_mr.read_at(0, &mut got);
            match first_difference(&got, &pattern(WRITE_SEED, opts.write_len)) {
                None => format!(
                    "ok: all {} bytes written by RDMA Write are correct",
                    opts.write_len
                ),
                Some(at) => format!("MISMATCH at byte {at} of the region written by RDMA Write"),
            }
        }
        _ => format!("bad verify request of {} bytes", req.len()),
    };
    notes.push(format!("server verified its region: {verdict}"));
    msg_mr.write_at(0, verdict.as_bytes());
    ep.post_send(
        "verdict Send",
        &send(101, WrOpcode::Send, &msg_mr, verdict.len(), false),
    )?;

    let term = if opts.bad_stag_write {
        // The client answers the verdict at once with the bad Write, so the
        // QP may enter the error state before the verdict's completion is
        // reported; only the Terminate matters here.
        let info = ep.wait_event("the Terminate for the bad-STag Write", |ev| match ev {
            QpEvent::TerminateSent(i) => Some(Ok(i.clone())),
            QpEvent::TerminateReceived(i) => Some(Err(i.clone())),
            _ => None,
        })?;
        match info {
            Ok(i) => {
                notes.push(format!(
                    "server rejected the bad-STag RDMA Write with a Terminate: {i}"
                ));
                Some(i)
            }
            Err(i) => {
                return Err(ToolError::TerminateReceived {
                    what: "the bad-STag Write",
                    info: i,
                });
            }
        }
    } else {
        // The client disconnects as soon as it has the verdict, which may
        // flush the verdict's completion here; the disconnect is what counts.
        ep.wait_event("the client to disconnect", |ev| {
            matches!(ev, QpEvent::Disconnected).then_some(())
        })?;
        None
    };
    Ok((notes, term))
}

/// Run the exchange described in the module documentation.
pub fn run_exchange(opts: &ExchangeOpts) -> Result<ExchangeReport, ToolError> {
    let listener =
        Listener::bind(opts.listen, opts.mpa.clone()).map_err(|e| ToolError::Listen {
            addr: opts.listen,
            cause: chain(&e),
        })?;
    let addr = listener.local_addr();
    let (tx, rx) = mpsc::channel();
    let sopts = opts.clone();
    let handle = std::thread::Builder::new()
        .name("demo-server".into())
        .spawn(move || {
            let _ = tx.send(server(listener, &sopts));
        })
        .map_err(|e| ToolError::Internal(format!("cannot start the server thread: {e}")))?;

    let client_result = client(addr, opts);
    // The server's waits are bounded by the timeout; allow it that long to
    // finish after the client.
    let server_result = rx
        .recv_timeout(opts.timeout + Duration::from_secs(2))
        .map_err(|_| ToolError::Timeout {
            what: "the server thread to finish",
            after: opts.timeout,
        })?;
    let _ = handle.join();

    let mut report = client_result?;
    let (notes, term) = server_result?;
    report.steps.extend(notes);
    if opts.bad_stag_write {
        match (&report.terminate, &term) {
            (Some(_), Some(t)) => report.terminate = Some(t.clone()),
            _ => {
                return Err(ToolError::Protocol(
                    "the bad-STag Write did not produce a Terminate on both sides".into(),
                ))
            }
        }
    }
    Ok(report)
}

fn client(addr: SocketAddr, opts: &ExchangeOpts) -> Result<ExchangeReport, ToolError> {
    let mut r = ExchangeReport::default();
    let ep = Endpoint::new(16, 2, opts.timeout)?;
    let recv_mr = ep.reg(2 * SLOT, Access::LOCAL_WRITE)?;
    let msg_mr = ep.reg(SLOT, Access::NONE)?;
    let src_mr = ep.reg(opts.write_len.max(1), Access::NONE)?;
    let sink_mr = ep.reg(opts.write_len.max(1), Access::LOCAL_WRITE)?;
    let expect = pattern(WRITE_SEED, opts.write_len);
    src_mr.write_at(0, &expect);
    for i in 0..2 {
        ep.post_recv("receive", i, &recv_mr, i as usize * SLOT, SLOT)?;
    }
    cm::connect(
        &ep.qp,
        addr,
        &ConnParam {
            private_data: Vec::new(),
            mpa: opts.mpa.clone(),
            timeout: opts.timeout,
            ..ConnParam::default()
        },
    )
    .map_err(|e| ToolError::connect(addr, &e))?;
    r.conn = ep
        .qp
        .conn_info()
        .map(|c| describe_conn(&c))
        .unwrap_or_default();
    r.steps
        .push(format!("client connected to {addr} ({})", r.conn));

    let wc = ep.wait_for("the server's advertisement", WcOpcode::Recv)?;
    let mut b = vec![0u8; wc.byte_len as usize];
    recv_mr.read_at(wc.wr_id as usize * SLOT, &mut b);
    let info = ServerInfo::from_bytes(&b).ok_or_else(|| {
        ToolError::Protocol(format!(
            "server advertisement of {} bytes, expected {INFO_LEN}",
            b.len()
        ))
    })?;
    r.send_bytes += INFO_LEN as u64;
    r.steps.push(format!(
        "received the server's advertisement: region {:#x} rkey {:#010x} ({} bytes)",
        info.data_addr, info.data_rkey, info.data_len
    ));
    if (info.data_len as usize) < opts.write_len {
        return Err(ToolError::Protocol(format!(
            "server region of {} bytes is too small",
            info.data_len
        )));
    }

    if opts.all_opcodes {
        for (i, &(what, len, solicited, inv)) in SENDS.iter().enumerate() {
            msg_mr.write_at(0, &pattern(i as u8, len));
            let opcode = match inv {
                1 => WrOpcode::SendWithInv {
                    invalidate_rkey: info.inv_a_rkey,
                },
                2 => WrOpcode::SendWithInv {
                    invalidate_rkey: info.inv_b_rkey,
                },
                _ => WrOpcode::Send,
            };
            ep.post_send(what, &send(10 + i as u64, opcode, &msg_mr, len, solicited))?;
            ep.wait_for(what, WcOpcode::Send)?;
            r.send_bytes += len as u64;
            r.steps.push(format!("{what:<30} {len:>8} bytes  sent"));
        }
    }

    let t0 = Instant::now();
    let wr = send(
        20,
        WrOpcode::RdmaWrite {
            remote_addr: info.data_addr,
            rkey: info.data_rkey,
        },
        &src_mr,
        opts.write_len,
        false,
    );
    ep.post_send("RDMA Write", &wr)?;
    ep.wait_for("the RDMA Write", WcOpcode::RdmaWrite)?;
    let dt = t0.elapsed();
    r.rdma_bytes += opts.write_len as u64;
    r.steps.push(format!(
        "{:<30} {:>8} bytes  done in {:.2} ms",
        "RDMA Write",
        opts.write_len,
        dt.as_secs_f64() * 1e3
    ));

    let t0 = Instant::now();
    let wr = send(
        21,
        WrOpcode::RdmaRead {
            remote_addr: info.data_addr,
            rkey: info.data_rkey,
        },
        &sink_mr,
        opts.write_len,
        false,
    );
    ep.post_send("RDMA Read", &wr)?;
    let wc = ep.wait_for("the RDMA Read", WcOpcode::RdmaRead)?;
    let dt = t0.elapsed();
    let got = sink_mr.to_vec();
    if let Some(at) = first_difference(&got[..opts.write_len], &expect) {
        return Err(ToolError::Mismatch(format!(
            "RDMA Read returned different data at byte {at} of {} (completion byte_len {})",
            opts.write_len, wc.byte_len
        )));
    }
    r.rdma_bytes += opts.write_len as u64;
    r.steps.push(format!(
        "{:<30} {:>8} bytes  done in {:.2} ms, content matches what was written",
        "RDMA Read",
        opts.write_len,
        dt.as_secs_f64() * 1e3
    ));

    msg_mr.write_at(0, &(opts.write_len as u64).to_be_bytes());
    ep.post_send("verify Send", &send(30, WrOpcode::Send, &msg_mr, 8, false))?;
    ep.wait_for("the verify Send", WcOpcode::Send)?;
    r.send_bytes += 8;
    let wc = ep.wait_for("the server's verdict", WcOpcode::Recv)?;
    let mut v = vec![0u8; wc.byte_len as usize];
    recv_mr.read_at(wc.wr_id as usize * SLOT, &mut v);
    let verdict = String::from_utf8_lossy(&v).into_owned();
    r.send_bytes += v.len() as u64;
    if !verdict.starts_with("ok") {
        return Err(ToolError::Mismatch(format!(
            "the server reports: {verdict}"
        )));
    }

    if opts.bad_stag_write {
        // inv_a was invalidated by our Send with Invalidate: any access to
        // it must now fail on the server (RFC 5041 §7.2, invalid STag).
        msg_mr.write_at(0, &[0xee; 64]);
        let wr = send(
            40,
            WrOpcode::RdmaWrite {
                remote_addr: info.inv_a_addr,
                rkey: info.inv_a_rkey,
            },
            &msg_mr,
            64,
            false,
        );
        ep.post_send("bad-STag RDMA Write", &wr)?;
        let info = ep.wait_event("the server's Terminate", |ev| match ev {
            QpEvent::TerminateReceived(i) => Some(i.clone()),
            _ => None,
        })?;
        r.steps.push(format!(
            "{:<30} {:>8} bytes  to invalidated STag {:#010x}: peer answered with Terminate: {info}",
            "RDMA Write (bad STag)", 64, wr_rkey(&wr)
        ));
        r.terminate = Some(info);
    }
    ep.qp.disconnect();
    Ok(r)
}

fn wr_rkey(wr: &SendWr) -> u32 {
    match wr.opcode {
        WrOpcode::RdmaWrite { rkey, .. } | WrOpcode::RdmaRead { rkey, .. } => rkey,
        WrOpcode::SendWithInv { invalidate_rkey } => invalidate_rkey,
        _ => 0,
    }
}

/// Render a report as indented lines.
pub fn render(report: &ExchangeReport) -> String {
    let mut s = String::new();
    for step in &report.steps {
        let _ = writeln!(s, "  {step}");
    }
    let _ = writeln!(
        s,
        "  moved {} bytes by RDMA Write/Read and {} bytes by Send",
        report.rdma_bytes, report.send_bytes
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_info_round_trips() {
        let i = ServerInfo {
            data_addr: 0x1122_3344_5566_7788,
            data_rkey: 0xabcd_ef01,
            data_len: 204_800,
            inv_a_addr: 0x99,
            inv_a_rkey: 0x100,
            inv_b_rkey: 0x200,
        };
        assert_eq!(ServerInfo::from_bytes(&i.to_bytes()), Some(i));
        assert_eq!(ServerInfo::from_bytes(&[0u8; 31]), None);
    }

    #[test]
    fn patterns_differ_by_seed_and_position() {
        let a = pattern(1, 1000);
        assert_eq!(a, pattern(1, 1000));
        assert_ne!(a, pattern(2, 1000));
        // Not periodic with a short period: byte i and i + 256 differ.
        assert_ne!(a[..256], a[256..512]);
    }

    #[test]
    fn first_difference_finds_the_byte() {
        assert_eq!(first_difference(b"abc", b"abc"), None);
        assert_eq!(first_difference(b"abc", b"abd"), Some(2));
        assert_eq!(first_difference(b"ab", b"abc"), Some(2));
    }
}
