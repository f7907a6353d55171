//! An rping-compatible server and client over the `iwarp` verbs.
//!
//! The exchange is rdma-core rping's, message for message (see
//! [`crate::rping`] for the wire protocol and docs/TESTING.md for how it
//! was checked against siw traffic), so `rping -c` on a siw host can ping
//! `iwarp-ping -s`, and `iwarp-ping -c` can ping `rping -s`.
//!
//! Resources follow rping too: one CQ for both queues, a send queue of 16
//! and a receive queue of 2, a 16-byte receive buffer (local write only), a
//! 16-byte send buffer (no remote access), and the ping buffers with local
//! write, remote read and remote write. No private data; IRD = ORD = 1.

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, ConnRequest, Listener};
use iwarp::wait::{Interest, Token, Until, WaitSet};
use iwarp::{Access, ConnInfo, MemoryRegion, SendWr, SgList, WcOpcode, WorkCompletion, WrOpcode};
use iwarp_proto::handshake::MpaConfig;

use crate::endpoint::Endpoint;
use crate::error::ToolError;
use crate::rping::{self, RpingInfo, INFO_LEN, RQ_DEPTH, SQ_DEPTH};

const RECV_WR: u64 = 1;
const SEND_WR: u64 = 2;
const RDMA_WR: u64 = 3;

/// Settings of one side of a ping.
#[derive(Debug, Clone)]
pub struct PingConfig {
    /// Ping buffer size in bytes (`-S`).
    pub size: usize,
    /// Iterations (`-C`); 0 = until interrupted (client only, as rping).
    pub count: u64,
    /// Print the ping data (`-v`).
    pub verbose: bool,
    /// Compare what came back with what was sent (`-V`, client only).
    pub validate: bool,
    /// Bound on the connection setup and on every single wait.
    pub timeout: Duration,
    /// MPA policy.
    pub mpa: MpaConfig,
    /// [`ConnParam::wake_nudge`].
    pub wake_nudge: bool,
}

impl PingConfig {
    /// rping's defaults: 64 bytes, endless, quiet. Like rping
    /// (`responder_resources = initiator_depth = 1`), IRD and ORD are 1.
    pub fn new(mut mpa: MpaConfig) -> PingConfig {
        mpa.ird = 1;
        mpa.ord = 1;
        PingConfig {
            size: rping::DEFAULT_SIZE,
            count: 0,
            verbose: false,
            validate: false,
            timeout: Duration::from_secs(10),
            mpa,
            wake_nudge: true,
        }
    }

    fn conn_param(&self) -> ConnParam {
        ConnParam {
            private_data: Vec::new(),
            mpa: self.mpa.clone(),
            timeout: self.timeout,
            wake_nudge: self.wake_nudge,
            ..ConnParam::default()
        }
    }
}

/// What a finished ping did.
#[derive(Debug, Clone)]
pub struct PingReport {
    /// The other side.
    pub peer: SocketAddr,
    /// Completed iterations.
    pub pings: u64,
    /// Bytes moved by RDMA Read and RDMA Write.
    pub rdma_bytes: u64,
    /// Wall time of the iterations (not the connection setup).
    pub elapsed: Duration,
    /// What MPA negotiated.
    pub conn: Option<ConnInfo>,
    /// Every iteration was compared byte for byte (client with `-V`).
    pub validated: bool,
}

impl PingReport {
    /// One line for humans.
    pub fn summary(&self, role: &str) -> String {
        let per = if self.pings > 0 {
            format!(
                ", {:.1} us per ping",
                self.elapsed.as_secs_f64() * 1e6 / self.pings as f64
            )
        } else {
            String::new()
        };
        format!(
            "{role}: {} ping(s) with {}, {} bytes by RDMA Read/Write{}{}{}",
            self.pings,
            self.peer,
            self.rdma_bytes,
            per,
            self.conn
                .map(|c| format!(", {}", describe_conn(&c)))
                .unwrap_or_default(),
            if self.validated {
                ", data validated"
            } else {
                ""
            }
        )
    }
}

/// "MPA rev 2, CRC on, markers off" for a negotiated connection.
pub fn describe_conn(c: &ConnInfo) -> String {
    let c = &c.mpa;
    let onoff = |b: bool| if b { "on" } else { "off" };
    format!(
        "MPA rev {}, CRC {}, markers {}/{} (tx/rx), IRD {} ORD {}",
        c.revision,
        onoff(c.crc),
        onoff(c.markers_tx),
        onoff(c.markers_rx),
        c.ird,
        c.ord
    )
}

fn send_wr(wr_id: u64, opcode: WrOpcode, mr: &MemoryRegion, len: usize) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        sgl: SgList::single(mr.sge(0, len)),
        signaled: true,
        solicited: false,
    }
}

/// Read a received control message out of `recv_mr`.
fn take_info(recv_mr: &MemoryRegion, wc: &WorkCompletion) -> Result<RpingInfo, ToolError> {
    if wc.byte_len as usize != INFO_LEN {
        return Err(ToolError::Protocol(format!(
            "received bogus data, size {} (rping control messages are {INFO_LEN} bytes)",
            wc.byte_len
        )));
    }
    let mut b = [0u8; INFO_LEN];
    recv_mr.read_at(0, &mut b);
    RpingInfo::from_bytes(&b).ok_or_else(|| ToolError::Protocol("short control message".into()))
}

/// The rping server: a listener that serves one connection at a time, or
/// many ([`PingServer::serve_forever`]).
#[derive(Debug)]
pub struct PingServer {
    listener: Listener,
    cfg: PingConfig,
}

impl PingServer {
    /// Listen on `addr` (port 0 picks a free port).
    pub fn bind(addr: SocketAddr, cfg: PingConfig) -> Result<PingServer, ToolError> {
        let ctx = crate::cli::open_context().map_err(|e| ToolError::Listen {
            addr,
            cause: crate::error::chain(&e),
        })?;
        let listener =
            Listener::bind_on(&ctx, addr, cfg.mpa.clone()).map_err(|e| ToolError::Listen {
                addr,
                cause: crate::error::chain(&e),
            })?;
        Ok(PingServer { listener, cfg })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Wait for a connection request; `None` waits until one arrives
    /// ([`Until::Forever`] on the listener's descriptor).
    pub fn next_request(&self, wait: Option<Duration>) -> Result<ConnRequest, ToolError> {
        let start = Instant::now();
        let until = wait.map_or(Until::Forever, Until::after);
        // Sleep on the listener's descriptor (the listening socket, or the
        // rdma_cm event channel) until a connection waits, then take it:
        // `get_request` finds it at once (a timeout of zero would not even
        // look), and the accepted connection gets the CM's grace
        // (cm::REQUEST_GRACE) for its MPA Request.
        let mut set = WaitSet::new();
        set.add_fd(self.listener.as_raw_fd(), Interest::READABLE, Token(0));
        loop {
            let wake = set.wait(until).map_err(|e| ToolError::Accept {
                cause: format!("waiting for a client to connect: {e}"),
            })?;
            if wake.is_timeout() {
                return Err(ToolError::Timeout {
                    what: "a client to connect",
                    after: wait.unwrap_or_default(),
                });
            }
            match self.listener.get_request(Some(cm::REQUEST_GRACE)) {
                Ok(req) => return Ok(req),
                Err(cm::CmError::Timeout { .. }) => continue,
                Err(e) => {
                    // A peer that is not an MPA endpoint (or gave up) must not
                    // stop the server; report it and keep listening.
                    tracing::warn!("rejected an incoming connection: {e}");
                    if wait.is_some_and(|w| start.elapsed() >= w) {
                        return Err(ToolError::Accept {
                            cause: crate::error::chain(&e),
                        });
                    }
                }
            }
        }
    }

    /// Accept one client and serve it until it disconnects.
    pub fn serve_one(
        &self,
        wait: Option<Duration>,
        out: &mut dyn Write,
    ) -> Result<PingReport, ToolError> {
        let req = self.next_request(wait)?;
        serve(req, &self.cfg, out)
    }

    /// rping -P: serve every client in its own thread, forever.
    pub fn serve_forever(&self) -> Result<(), ToolError> {
        loop {
            let req = self.next_request(None)?;
            let cfg = self.cfg.clone();
            let peer = req.peer_addr();
            std::thread::Builder::new()
                .name(format!("ping-{peer}"))
                .spawn(move || match serve(req, &cfg, &mut std::io::stdout()) {
                    Ok(r) => eprintln!("iwarp-ping: {}", r.summary("server")),
                    Err(e) => eprintln!("iwarp-ping: server: client {peer}: {e}"),
                })
                .map_err(|e| ToolError::Internal(format!("cannot start a server thread: {e}")))?;
        }
    }
}

/// rping_test_server for one accepted connection.
pub fn serve(
    req: ConnRequest,
    cfg: &PingConfig,
    out: &mut dyn Write,
) -> Result<PingReport, ToolError> {
    let peer = req.peer_addr();
    let ep = Endpoint::new(SQ_DEPTH, RQ_DEPTH, cfg.timeout)?;
    ep.ignore_send_completions(true);
    let recv_mr = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    // Never filled in, as in rping: the "go ahead" messages are 16 zeros.
    let send_mr = ep.reg(INFO_LEN, Access::NONE)?;
    // rping sizes this buffer with -S; taking the largest size rping allows
    // lets a client ping with any size.
    let rdma_mr = ep.reg(
        rping::MAX_SIZE + 1,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
    )?;
    ep.post_recv("receive", RECV_WR, &recv_mr, 0, INFO_LEN)?;
    req.accept(&ep.qp, &cfg.conn_param())
        .map_err(|e| ToolError::Accept {
            cause: crate::error::chain(&e),
        })?;
    let conn = ep.qp.conn_info();
    tracing::info!(%peer, ?conn, "client connected");

    let start = Instant::now();
    let (mut pings, mut bytes) = (0u64, 0u64);
    loop {
        // Wait for the client's source advertisement; a disconnect here is
        // the normal end (the client finished its count).
        let wc = match ep.wait_for("the client's RDMA Read advertisement", WcOpcode::Recv) {
            Ok(wc) => wc,
            Err(ToolError::Disconnected { .. }) => break,
            Err(e) => return Err(e),
        };
        let src = take_info(&recv_mr, &wc)?;
        ep.post_recv("receive", RECV_WR, &recv_mr, 0, INFO_LEN)?;
        tracing::debug!(
            addr = format_args!("{:#x}", src.buf),
            rkey = format_args!("{:#x}", src.rkey),
            size = src.size,
            "read advertisement"
        );
        let size = src.size as usize;
        if size == 0 || size > rdma_mr.len() - 1 {
            return Err(ToolError::Protocol(format!(
                "client advertised {size} bytes; supported sizes are 1 to {}",
                rping::MAX_SIZE
            )));
        }

        rdma_mr.fill(0);
        let rd = send_wr(
            RDMA_WR,
            WrOpcode::RdmaRead {
                remote_addr: src.buf,
                rkey: src.rkey,
            },
            &rdma_mr,
            size,
        );
        ep.post_send("RDMA Read", &rd)?;
        ep.wait_for("the RDMA Read of the ping data", WcOpcode::RdmaRead)?;
        let data = rdma_mr.to_vec();
        if cfg.verbose {
            let _ = writeln!(
                out,
                "server ping data: {}",
                String::from_utf8_lossy(rping::c_str(&data[..size]))
            );
        }

        ep.post_send(
            "go-ahead Send",
            &send_wr(SEND_WR, WrOpcode::Send, &send_mr, INFO_LEN),
        )?;

        let wc = ep.wait_for("the client's RDMA Write advertisement", WcOpcode::Recv)?;
        let sink = take_info(&recv_mr, &wc)?;
        ep.post_recv("receive", RECV_WR, &recv_mr, 0, INFO_LEN)?;
        tracing::debug!(
            addr = format_args!("{:#x}", sink.buf),
            rkey = format_args!("{:#x}", sink.rkey),
            size = sink.size,
            "write advertisement"
        );

        let len = rping::echo_len(&data[..size], sink.size as usize);
        let wr = send_wr(
            RDMA_WR,
            WrOpcode::RdmaWrite {
                remote_addr: sink.buf,
                rkey: sink.rkey,
            },
            &rdma_mr,
            len,
        );
        ep.post_send("RDMA Write", &wr)?;
        ep.wait_for("the RDMA Write of the echo", WcOpcode::RdmaWrite)?;

        ep.post_send(
            "go-ahead Send",
            &send_wr(SEND_WR, WrOpcode::Send, &send_mr, INFO_LEN),
        )?;
        pings += 1;
        bytes += (size + len) as u64;
    }
    let elapsed = start.elapsed();
    ep.qp.disconnect();
    Ok(PingReport {
        peer,
        pings,
        rdma_bytes: bytes,
        elapsed,
        conn,
        validated: false,
    })
}

/// rping_test_client: connect to `addr` and ping `cfg.count` times.
pub fn run_client(
    addr: SocketAddr,
    cfg: &PingConfig,
    out: &mut dyn Write,
) -> Result<PingReport, ToolError> {
    rping::check_size(cfg.size).map_err(ToolError::Protocol)?;
    let ep = Endpoint::new(SQ_DEPTH, RQ_DEPTH, cfg.timeout)?;
    ep.ignore_send_completions(true);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let recv_mr = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let send_mr = ep.reg(INFO_LEN, Access::NONE)?;
    let rdma_mr = ep.reg(cfg.size, rw)?;
    let start_mr = ep.reg(cfg.size, rw)?;
    ep.post_recv("receive", RECV_WR, &recv_mr, 0, INFO_LEN)?;

    cm::connect(&ep.qp, addr, &cfg.conn_param()).map_err(|e| ToolError::connect(addr, &e))?;
    let conn = ep.qp.conn_info();
    tracing::info!(%addr, ?conn, "connected");

    let start = Instant::now();
    let mut ping = 0u64;
    while cfg.count == 0 || ping < cfg.count {
        let expect = rping::ping_data(cfg.size, ping);
        start_mr.write_at(0, &expect);
        rdma_mr.fill(0);

        let adv = RpingInfo {
            buf: start_mr.addr(),
            rkey: start_mr.rkey(),
            size: cfg.size as u32,
        };
        send_mr.write_at(0, &adv.to_bytes());
        ep.post_send(
            "Send of the RDMA Read advertisement",
            &send_wr(SEND_WR, WrOpcode::Send, &send_mr, INFO_LEN),
        )?;
        let wc = ep.wait_for("the server's go-ahead after its RDMA Read", WcOpcode::Recv)?;
        take_info(&recv_mr, &wc)?;
        ep.post_recv("receive", RECV_WR, &recv_mr, 0, INFO_LEN)?;

        let adv = RpingInfo {
            buf: rdma_mr.addr(),
            rkey: rdma_mr.rkey(),
            size: cfg.size as u32,
        };
        send_mr.write_at(0, &adv.to_bytes());
        ep.post_send(
            "Send of the RDMA Write advertisement",
            &send_wr(SEND_WR, WrOpcode::Send, &send_mr, INFO_LEN),
        )?;
        let wc = ep.wait_for("the server's go-ahead after its RDMA Write", WcOpcode::Recv)?;
        take_info(&recv_mr, &wc)?;
        ep.post_recv("receive", RECV_WR, &recv_mr, 0, INFO_LEN)?;

        let got = rdma_mr.to_vec();
        if cfg.validate && got != expect {
            let at = got
                .iter()
                .zip(&expect)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(ToolError::Mismatch(format!(
                "ping {ping}: the echo differs from the ping data at byte {at} of {} (got {:#04x}, sent {:#04x})",
                cfg.size, got[at], expect[at]
            )));
        }
        if cfg.verbose {
            let _ = writeln!(
                out,
                "ping data: {}",
                String::from_utf8_lossy(rping::c_str(&got))
            );
        }
        ping += 1;
    }
    let elapsed = start.elapsed();
    ep.qp.disconnect();
    let bytes = ping * 2 * cfg.size as u64;
    Ok(PingReport {
        peer: addr,
        pings: ping,
        rdma_bytes: bytes,
        elapsed,
        conn,
        validated: cfg.validate,
    })
}
