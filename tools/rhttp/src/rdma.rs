//! The client's RDMA side of one HTTP connection: the listener the server
//! connects back to, the connection it made, its buffers and control
//! messages, and the bounded waits that do the connection's receive work
//! (docs/MOD_RDMA.md, "The wire protocol").

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iwarp::cm::{CmError, ConnParam, Listener, MpaConfig, Policy};
use iwarp::wait::{CqInterest, Interest, Token, WaitSet, Wake};
use iwarp::{
    Access, CompletionQueue, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr, QpState,
    QueuePair, RecvWr, SendWr, SgList, WcStatus, WrOpcode,
};
use rhttp::ctrl::{CtrlMsg, Kind, MSG_LEN};
use rhttp::header::{private_data_matches, RdmaHeader, Scheme};
use rhttp::http::Conn;

use crate::settings::{congestion, open_device, Res};
use crate::stats::RDMA_CONNS;

pub(super) const RECV_SLOTS: usize = 8;
pub(super) const CHUNK: usize = 16 << 20;

/// Most requests in flight on one HTTP connection (`--pipeline`): each
/// server-writes request has its own slot of `--max-len` bytes in the
/// receive buffer, and the server's DONE for each may wait, unread, in
/// one of our [`RECV_SLOTS`] posted receives (a Send that finds no
/// posted receive ends the connection, RFC 5040 §5.3).
pub(super) const MAX_PIPELINE: usize = RECV_SLOTS;

/// How long rhttp polls for a completion (a Read Response, the server's
/// DONE), reading the RDMA connection itself, before it sleeps in
/// `poll(2)` (the spin of its [`ProgressMode::AppDriven`] CQs; waits that
/// also watch the HTTP socket sleep at once): on loopback the answer
/// usually comes within it. Longer spins cost the server the CPU on a
/// loaded machine (1 MB client-reads under two busy processes: 0.76-0.97
/// ms with 500 us against 0.28-0.30 with 50).
const SPIN_PROGRESS: Duration = Duration::from_micros(50);

/// The client's RDMA side of one HTTP connection: the listener the server
/// connects back to, and the connection it made (reused while alive).
pub(super) struct Rdma {
    pub(super) pd: ProtectionDomain,
    /// Both CQs are [`ProgressMode::AppDriven`]: this thread does the RDMA
    /// connection's receive work itself whenever it waits (see
    /// [`Rdma::wait_for`]).
    pub(super) send_cq: CompletionQueue,
    pub(super) recv_cq: CompletionQueue,
    pub(super) listener: Listener,
    pub(super) server_ip: IpAddr,
    /// The tokens of the requests that may still make the server connect
    /// (docs/MOD_RDMA.md, "The request token"): the one request in flight,
    /// or every unanswered request of a pipeline; empty between requests,
    /// when no connection is expected.
    pub(super) tokens: Vec<u64>,
    pub(super) qp: Option<QueuePair>,
    pub(super) ctrl: MemoryRegion,
    pub(super) msg: MemoryRegion,
    pub(super) buf: Option<MappedRegion>,
    pub(super) timeout: Duration,
}

/// A registered buffer in an anonymous mapping: its pages are zero-filled
/// on first touch, so advertising a large `maxlen` costs nothing until the
/// server writes that much (`reg_mr` would zero the whole buffer up front).
pub(super) struct MappedRegion {
    pub(super) mr: Option<MemoryRegion>,
    pub(super) ptr: *mut libc::c_void,
    pub(super) len: usize,
}

impl MappedRegion {
    pub(super) fn new(pd: &ProtectionDomain, len: usize, access: Access) -> Res<MappedRegion> {
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "mapping a {len}-byte buffer failed: {}; lower --max-len",
                io::Error::last_os_error()
            ));
        }
        // SAFETY: the mapping stays valid until `drop`, which drops the
        // region (waiting for the driver to finish with it) before unmapping.
        let mr = unsafe { pd.reg_mr_raw(ptr.cast::<u8>(), len, access) };
        match mr {
            Ok(mr) => Ok(MappedRegion {
                mr: Some(mr),
                ptr,
                len,
            }),
            Err(e) => {
                // SAFETY: the mapping made above, not registered.
                unsafe { libc::munmap(ptr, len) };
                Err(format!(
                    "registering a {len}-byte buffer: {e}; lower --max-len (a kernel RDMA \
                     device pins the whole buffer)"
                ))
            }
        }
    }
}

impl std::ops::Deref for MappedRegion {
    type Target = MemoryRegion;
    fn deref(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("registered until drop")
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: the region that referred to the mapping is gone.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

impl Rdma {
    pub(super) fn new(http: &Conn, timeout: Duration, crc: Policy) -> Res<Rdma> {
        let ctx = open_device().map_err(|e| format!("opening the RDMA device: {e}"))?;
        let pd = ctx.alloc_pd();
        let send_cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
        let recv_cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
        for cq in [&send_cq, &recv_cq] {
            cq.set_progress(ProgressMode::AppDriven {
                spin: SPIN_PROGRESS,
            })
            .map_err(|e| format!("setting up the completion queues: {e}"))?;
        }
        // The address the server will connect back to, in canonical form:
        // over an IPv4-mapped HTTP connection (http://[::ffff:127.0.0.1]/)
        // the socket's address is ::ffff:a.b.c.d, which an IPv6-only
        // listener cannot bind, and the server sees an IPv4 client.
        let local = SocketAddr::new(http.local.ip().to_canonical(), 0);
        let mpa = MpaConfig {
            crc,
            ..MpaConfig::default()
        };
        let listener = Listener::bind_on(&ctx, local, mpa)
            .map_err(|e| format!("listening for the server's RDMA connection on {local}: {e}"))?;
        if let Some(cc) = congestion() {
            // Accepted connections inherit it (tcp(7), TCP_CONGESTION).
            listener
                .set_congestion(cc)
                .map_err(|e| format!("--congestion {cc}: {e}"))?;
        }
        let ctrl = pd
            .reg_mr(RECV_SLOTS * MSG_LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        // Slot 0: signaled control messages ([`Rdma::send_ctrl`]); slot
        // 1 + i: the unsignaled DONE of pipeline slot i.
        let msg = pd
            .reg_mr((1 + MAX_PIPELINE) * MSG_LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        tracing::debug!(addr = %listener.local_addr(), "RDMA listener up");
        Ok(Rdma {
            pd,
            send_cq,
            recv_cq,
            listener,
            server_ip: http.peer.ip(),
            tokens: Vec::new(),
            qp: None,
            ctrl,
            msg,
            buf: None,
            timeout,
        })
    }

    pub(super) fn port(&self) -> u16 {
        self.listener.local_addr().port()
    }

    pub(super) fn ip(&self) -> IpAddr {
        self.listener.local_addr().ip()
    }

    /// The data buffer, grown to at least `len` bytes.
    pub(super) fn buf(&mut self, len: u64) -> Res<&MappedRegion> {
        let len = len.max(1);
        if self.buf.as_ref().is_none_or(|b| (b.len() as u64) < len) {
            self.buf = None;
            let len =
                usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
            self.buf = Some(MappedRegion::new(
                &self.pd,
                len,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )?);
        }
        Ok(self.buf.as_ref().expect("just set"))
    }

    /// Disconnect the RDMA connection; the listener stays, so the server
    /// can connect again.
    pub(super) fn close_connection(&mut self) {
        if let Some(qp) = self.qp.take() {
            qp.disconnect();
            // Its posted receives were flushed into the CQs, which the next
            // connection shares: drop them.
            while self.recv_cq.poll_one().is_some() || self.send_cq.poll_one().is_some() {}
        }
    }

    pub(super) fn live(&self) -> bool {
        // This thread reads the connection only while it waits (the CQs
        // are application-driven): let it see an end or a Terminate that
        // came since.
        self.recv_cq.progress();
        self.qp.as_ref().is_some_and(|q| q.state() == QpState::Rts)
    }

    /// Take `req` if it is the server's connection for the request that
    /// waits: from the HTTP server's address (compared canonically, so
    /// ::ffff:127.0.0.1 is 127.0.0.1) and with the request's token in its
    /// private data. Anything else is an impostor (another host, another
    /// local user who found the port, a stale connection): rejected with
    /// a log line, and `Ok(false)` so the caller keeps waiting for the
    /// server -- refusing must not fail the transfer, or the impostor
    /// would have won anyway.
    pub(super) fn accept(&mut self, req: iwarp::cm::ConnRequest) -> Res<bool> {
        let peer = req.peer_addr();
        if peer.ip().to_canonical() != self.server_ip.to_canonical() {
            tracing::warn!(
                %peer,
                server = %self.server_ip,
                "refused an RDMA connection that is not from the HTTP server"
            );
            let _ = req.reject(b"rhttp: not the HTTP server");
            return Ok(false);
        }
        if self.tokens.is_empty() {
            tracing::warn!(%peer, "refused an RDMA connection while none was expected");
            let _ = req.reject(b"rhttp: no request waits for a connection");
            return Ok(false);
        }
        let Some(k) = self
            .tokens
            .iter()
            .position(|&t| private_data_matches(req.private_data(), t))
        else {
            tracing::warn!(
                %peer,
                private_data = ?req.private_data(),
                "refused an RDMA connection without this request's token in its private data \
                 (an impostor, or a server that does not send tokens back)"
            );
            let _ = req.reject(b"rhttp: wrong or missing request token");
            return Ok(false);
        };
        let qp = self
            .pd
            .create_qp(&QpInitAttr {
                send_cq: self.send_cq.clone(),
                recv_cq: self.recv_cq.clone(),
                max_send_wr: 64,
                max_recv_wr: RECV_SLOTS as u32,
            })
            .map_err(|e| e.to_string())?;
        for i in 0..RECV_SLOTS {
            self.post_slot(&qp, i)?;
        }
        req.accept(&qp, &ConnParam::default())
            .map_err(|e| format!("accepting the server's RDMA connection: {e}"))?;
        tracing::debug!(
            %peer,
            congestion = iwarp::cm::tcp_congestion(&qp).unwrap_or_default(),
            "RDMA connection from the server accepted"
        );
        self.qp = Some(qp);
        self.tokens.remove(k);
        RDMA_CONNS.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    pub(super) fn post_slot(&self, qp: &QueuePair, i: usize) -> Res<()> {
        qp.post_recv(&RecvWr {
            wr_id: i as u64,
            sgl: SgList::single(self.ctrl.sge(i * MSG_LEN, MSG_LEN)),
        })
        .map_err(|e| format!("posting a receive: {e}"))
    }

    /// The `RDMA:` header of a new request with `scheme`, naming our
    /// listener and carrying a fresh token (after [`Rdma::prepare`]).
    /// With `pipelined`, the tokens of earlier unanswered requests stay
    /// valid ([`Rdma::forget_token`] drops each when its answer is in).
    pub(super) fn request_header(&mut self, scheme: Scheme, pipelined: bool) -> Res<RdmaHeader> {
        self.prepare(pipelined)?;
        let token = new_token()?;
        self.tokens.push(token);
        let mut h = RdmaHeader::new(scheme);
        h.ip = Some(self.ip());
        h.port = Some(self.port());
        h.token = Some(token);
        Ok(h)
    }

    /// Before a request: refuse connections that wait in the listener (no
    /// request expects one now: the server connects while a request
    /// waits for it), and forget a dead connection.
    ///
    /// Each waiting connection is taken without waiting for more
    /// (`get_request` with a zero timeout looks once) and judged by
    /// [`Rdma::accept`]: between requests no token is expected, so it is
    /// refused with a reason in the MPA Reply; in a pipeline, a connection
    /// for an earlier unanswered request is still the server's. One whose
    /// MPA Request has not come yet gets the CM's grace for it (2 s on the
    /// software provider); one that sends a bad Request is closed by
    /// `get_request` and the next one is looked at. At most
    /// [`STALE_MAX`] are taken here, so a listener that keeps failing
    /// cannot hold the request back; the rest meet [`Rdma::expect_conn`].
    pub(super) fn prepare(&mut self, pipelined: bool) -> Res<()> {
        if !self.live() {
            self.qp = None;
        }
        if !pipelined {
            self.tokens.clear();
            if self.qp.is_none() {
                // No connection: [`Rdma::expect_conn`] watches the
                // listener with the HTTP socket and refuses what waits
                // there (no token matches one from before this request),
                // so a look now would only cost a system call per request.
                return Ok(());
            }
        }
        for _ in 0..STALE_MAX {
            match self.listener.get_request(Some(Duration::ZERO)) {
                Ok(req) => {
                    self.accept(req)?;
                }
                Err(CmError::Timeout { .. }) => break,
                Err(e) => tracing::warn!(error = %e, "bad RDMA connection attempt"),
            }
        }
        Ok(())
    }

    /// The answer to the request that carried `token` is in: the server
    /// will not connect for it any more.
    pub(super) fn forget_token(&mut self, token: u64) {
        self.tokens.retain(|&t| t != token);
    }

    /// After sending a request with an RDMA header: wait until the server
    /// connected (unless a connection is alive) or answered over HTTP.
    /// Connections that are not the server's are refused and the wait
    /// goes on ([`Rdma::accept`]).
    pub(super) fn expect_conn(&mut self, http: &Conn) -> Res<()> {
        if self.live() {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        // Sleep until a connection or the HTTP answer arrives.
        let mut set = WaitSet::new();
        set.add_fd(self.listener.as_raw_fd(), Interest::READABLE, LISTENER);
        set.add_fd(http.stream().as_raw_fd(), Interest::READABLE, HTTP);
        loop {
            let (conn_ready, http_ready) = match set.wait(deadline).map_err(wait_error)? {
                Wake::Timeout => {
                    return Err(format!(
                        "the server neither connected to {}:{} nor answered within {:?}",
                        self.ip(),
                        self.port(),
                        self.timeout
                    ))
                }
                w => (w.is_ready(LISTENER), w.is_ready(HTTP)),
            };
            if conn_ready {
                // A connection waits: its MPA Request is due at once, so a
                // peer that connects and sends nothing holds us up for
                // MPA_REQUEST_WAIT at most, not until the deadline.
                let left = deadline.saturating_duration_since(Instant::now());
                match self.listener.get_request(Some(MPA_REQUEST_WAIT.min(left))) {
                    Ok(req) => {
                        if self.accept(req)? {
                            return Ok(());
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "bad RDMA connection attempt"),
                }
            }
            if (http_ready && http.answer_ready()) || http.has_buffered() {
                return Ok(());
            }
        }
    }

    /// Test hook (`--x-hold-accept`): wait, at most the connection
    /// timeout, until a connection waits in the listener, without taking
    /// it. The server connects from its fixups hook, after Apache has
    /// stat'ed the file and before the handler reads it, and then waits
    /// in its connect for our MPA Reply.
    pub(super) fn wait_pending(&self) -> Res<()> {
        let mut set = WaitSet::new();
        set.add_fd(self.listener.as_raw_fd(), Interest::READABLE, LISTENER);
        match set
            .wait(Instant::now() + self.timeout)
            .map_err(wait_error)?
        {
            Wake::Timeout => Err(format!(
                "--x-hold-accept: the server did not connect to {}:{} within {:?}",
                self.ip(),
                self.port(),
                self.timeout
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn qp(&self) -> Res<&QueuePair> {
        self.qp.as_ref().ok_or_else(|| {
            "the server answered with RDMA but never opened an RDMA connection".to_string()
        })
    }

    /// Post one send-queue request and wait for its completion.
    pub(super) fn run(&self, wr_id: u64, opcode: WrOpcode, sgl: SgList) -> Res<()> {
        let qp = self.qp()?;
        qp.post_send(&SendWr {
            wr_id,
            opcode,
            sgl,
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("posting {opcode:?}: {e}"))?;
        match self.wait_wc(&self.send_cq) {
            Ok(wc) if wc.status == WcStatus::Success => Ok(()),
            Ok(wc) => {
                let why = qp
                    .next_event(Duration::from_millis(200))
                    .map(|e| format!(" ({e:?})"))
                    .unwrap_or_default();
                Err(format!("{opcode:?} failed: {:?}{why}", wc.status))
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn send_ctrl(&self, m: &CtrlMsg) -> Res<()> {
        self.msg.write_at(0, &m.encode());
        self.run(1, WrOpcode::Send, SgList::single(self.msg.sge(0, MSG_LEN)))
    }

    /// The DONE of a client-reads body, as a Send with Invalidate of the
    /// server's `stag` (RFC 5040 §5.3, §6.7.2: the Data Sink invalidates
    /// the STag before it delivers the Send): from then on a Read of it on
    /// this stream is refused with a Terminate (invalid STag), whenever
    /// the server's worker gets to release the body. `slot`: a pipeline
    /// slot's own message buffer, posted unsignaled (its completion would
    /// stand between the Reads' on the send CQ; the buffer is written
    /// again only after a later Read completed, and completions come in
    /// order, so this Send is gone by then); `None`: signaled, waited for.
    pub(super) fn send_done(&self, stag: u32, len: u64, slot: Option<usize>) -> Res<()> {
        let m = CtrlMsg {
            kind: Kind::Done,
            stag,
            length: len.min(u32::MAX as u64) as u32,
            to: 0,
            offset: 0,
        };
        let opcode = WrOpcode::SendWithInv {
            invalidate_rkey: stag,
        };
        let Some(i) = slot else {
            self.msg.write_at(0, &m.encode());
            return self.run(1, opcode, SgList::single(self.msg.sge(0, MSG_LEN)));
        };
        let at = (1 + i) * MSG_LEN;
        self.msg.write_at(at, &m.encode());
        self.qp()?
            .post_send(&SendWr {
                wr_id: 3,
                opcode,
                sgl: SgList::single(self.msg.sge(at, MSG_LEN)),
                signaled: false,
                solicited: false,
            })
            .map_err(|e| format!("posting the DONE: {e}"))
    }

    /// Wait for a control message, or (with `http`) return `None` as soon
    /// as the HTTP response starts arriving.
    pub(super) fn wait_ctrl(&self, http: Option<&Conn>) -> Res<Option<CtrlMsg>> {
        let qp = self.qp()?;
        let wc = match http {
            Some(h) => match self.wait_for(h)? {
                Some(wc) => wc,
                None => return Ok(None),
            },
            None => self.wait_wc(&self.recv_cq)?,
        };
        if wc.status != WcStatus::Success {
            return Err(format!("RDMA connection failed: {:?}", wc.status));
        }
        let i = wc.wr_id as usize;
        let mut b = [0u8; MSG_LEN];
        self.ctrl.read_at(i * MSG_LEN, &mut b);
        self.post_slot(qp, i)?;
        let m = CtrlMsg::decode(&b[..wc.byte_len as usize])
            .map_err(|e| format!("bad message from the server: {e}"))?;
        Ok(Some(m))
    }

    /// Wait for a completion on `cq`, doing the RDMA connection's receive
    /// work meanwhile: the CQ polls for up to [`SPIN_PROGRESS`], then
    /// sleeps in `poll(2)` on the connection's socket
    /// ([`ProgressMode::AppDriven`]).
    pub(super) fn wait_wc(&self, cq: &CompletionQueue) -> Res<iwarp::WorkCompletion> {
        self.qp()?;
        cq.wait_one(self.timeout)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no completion within {:?}", self.timeout))
    }

    /// Wait until the HTTP answer starts arriving, doing the RDMA
    /// connection's receive work meanwhile (the server may be reading our
    /// buffer, or writing into it). Completions stay in their CQs: both
    /// CQs are in the wait set for their receive work only
    /// ([`CqInterest::Progress`]).
    pub(super) fn wait_http(&self, http: &Conn) -> Res<()> {
        if self.qp.is_none() {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        let mut set = http_set(http);
        set.add_cq(&self.send_cq, CqInterest::Progress, RDMA);
        set.add_cq(&self.recv_cq, CqInterest::Progress, RDMA);
        loop {
            if http.has_buffered() {
                return Ok(());
            }
            match set.wait(deadline).map_err(wait_error)? {
                Wake::Timeout => return Err(format!("no HTTP answer within {:?}", self.timeout)),
                w if w.is_ready(HTTP) && http.answer_ready() => return Ok(()),
                _ => {}
            }
        }
    }

    /// Wait for a completion on the receive CQ (`Some`), or until the HTTP
    /// response starts arriving (`None`).
    ///
    /// This thread does the RDMA connection's receive work itself while it
    /// waits ([`ProgressMode::AppDriven`]): the wait set reads whatever the
    /// socket holds, and otherwise the thread sleeps at once (an answer
    /// may not come by RDMA at all: no spin) on the CQ's fd (the
    /// connection's socket and the CQ's completions) and the HTTP socket.
    /// The stack's receive thread stays parked, so the data is read by the
    /// one thread that is waiting for it: on a loaded machine each extra
    /// thread that must be scheduled can cost a time slice of the
    /// processes that keep the CPUs busy.
    pub(super) fn wait_for(&self, http: &Conn) -> Res<Option<iwarp::WorkCompletion>> {
        self.qp()?;
        let cq = &self.recv_cq;
        let deadline = Instant::now() + self.timeout;
        let mut set = http_set(http);
        set.add_cq(cq, CqInterest::Completions, RDMA);
        set.set_spin(Some(Duration::ZERO));
        loop {
            if let Some(wc) = cq.poll_one() {
                return Ok(Some(wc));
            }
            if http.has_buffered() {
                return Ok(None);
            }
            match set.wait(deadline).map_err(wait_error)? {
                Wake::Timeout => {
                    return Err(format!(
                        "no control message or HTTP answer within {:?}",
                        self.timeout
                    ))
                }
                // The answer is coming; take a completion that came with it.
                w if w.is_ready(HTTP) && http.answer_ready() => return Ok(cq.poll_one()),
                _ => {}
            }
        }
    }
}

/// Tokens of the wait sets: the HTTP socket, the RDMA connection's CQs,
/// the RDMA listener.
pub(super) const HTTP: Token = Token(0);
pub(super) const RDMA: Token = Token(1);
const LISTENER: Token = Token(2);

/// A wait set of the HTTP connection's socket, readable when response
/// bytes arrive (check [`Conn::answer_ready`] when it is).
pub(super) fn http_set(http: &Conn) -> WaitSet {
    let mut set = WaitSet::new();
    set.add_fd(http.stream().as_raw_fd(), Interest::READABLE, HTTP);
    set
}

/// A failed `poll(2)` of a wait set (not a timeout).
pub(super) fn wait_error(e: io::Error) -> String {
    format!("waiting for the RDMA connection or the HTTP answer: {e}")
}

/// Most connections [`Rdma::prepare`] takes from the listener before a
/// request.
const STALE_MAX: usize = 16;

/// How long a connection to our RDMA listener may take to send its MPA
/// Request once accepted (the server sends it right after connecting).
pub(super) const MPA_REQUEST_WAIT: Duration = Duration::from_secs(2);

/// A fresh request token: 64 bits from the kernel's random source
/// (`getrandom(2)`, the pool behind `/dev/urandom`: one system call per
/// request, where opening, reading and closing the device took three), so
/// that no one who cannot see the request can guess it.
pub(super) fn new_token() -> Res<u64> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: the pointer and length name the unwritten tail of `b`,
        // a live local array; getrandom(2) writes at most that many bytes.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("getrandom(2) for the request token failed: {e}"));
        }
        got += n as usize;
    }
    Ok(u64::from_be_bytes(b))
}
