//! The plain-TCP transport: the same [`Transport`] over N TCP
//! connections, for comparison with RDMA and for peers without it.
//!
//! Setup ([`crate::hello`]): every stream connects at once and opens with
//! a `Hello` (magic, token, its index, the proposal); the passive side
//! answers on stream 0 with the `HelloAck` (session ID, grant) or a
//! refusal. Then each block travels as a frame on stream `seq % N`:
//!
//! ```text
//! kind u32 | len u32 | seq u64 | payload (len bytes)
//! ```
//!
//! `End` (seq = blocks, then 8 bytes of total length) closes the transfer
//! on every stream; the sink answers `Fin` (seq = bytes) or `Abort`
//! (payload = reason) on stream 0.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::hello::{
    Admission, Hello, HelloAck, Proposal, Refusal, Verdict, ACK_LEN, HELLO_LEN, MAGIC, MAX_REFUSAL,
    REFUSAL_MAGIC,
};
use crate::io::{BlockSink, BlockSource};
use crate::progress::Logger;
use crate::{AdmitError, Config, Error, Mode, ProgressFn, Reorder, Stats, Transport, Window};

/// Read the passive side's answer on stream 0: a [`HelloAck`], or a
/// [`Refusal`] with its reason.
fn read_ack(s: &mut TcpStream) -> Result<HelloAck, Error> {
    let mut head = [0u8; 8];
    s.read_exact(&mut head)
        .map_err(|e| setup_err("waiting for the Hello reply", e))?;
    if &head[..4] == REFUSAL_MAGIC {
        let n = (u32_at(&head, 4) as usize).min(MAX_REFUSAL);
        let mut r = vec![0u8; n];
        let _ = s.read_exact(&mut r);
        return Err(Error::Setup(format!(
            "the peer refused the session: {}",
            String::from_utf8_lossy(&r)
        )));
    }
    if &head[..4] != MAGIC {
        return Err(Error::Protocol(format!(
            "{}",
            HelloAck::parse(&head).expect_err("not the magic")
        )));
    }
    let mut ack = [0u8; ACK_LEN];
    ack[..8].copy_from_slice(&head);
    s.read_exact(&mut ack[8..])
        .map_err(|e| setup_err("waiting for the Hello reply", e))?;
    HelloAck::parse(&ack).map_err(|e| Error::Protocol(e.to_string()))
}
const F_BLOCK: u32 = 1;
const F_END: u32 = 2;
const F_FIN: u32 = 3;
const F_ABORT: u32 = 4;
const HDR: usize = 16;

/// A TCP transfer session.
pub struct TcpSession {
    streams: Vec<TcpStream>,
    cfg: Config,
    session: u64,
    logger: Logger,
    broken: Option<String>,
    /// Bytes of the last transfer sent whose `Fin` was not read yet
    /// ([`Transport::send_unconfirmed`]).
    unconfirmed: Option<u64>,
}

impl fmt::Debug for TcpSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpSession")
            .field("session", &format_args!("{:016x}", self.session))
            .field("streams", &self.streams.len())
            .finish()
    }
}

fn setup_err(what: &str, e: io::Error) -> Error {
    Error::Setup(format!("{what}: {e}"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn prep(s: &TcpStream, cfg: &Config) -> io::Result<()> {
    s.set_nodelay(true)?;
    if let Some(cc) = &cfg.congestion {
        set_congestion(s, cc)?;
    }
    s.set_read_timeout(Some(cfg.timeout))?;
    s.set_write_timeout(Some(cfg.timeout))
}

/// `TCP_CONGESTION` (tcp(7)) on `s`. An algorithm the kernel lacks fails
/// with ENOENT: the error names the sysctl that lists what it has.
fn set_congestion(s: &TcpStream, cc: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is open for the life of `s`; the pointer and length
    // describe `cc`'s bytes, which the kernel only reads.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(io::Error::new(
        e.kind(),
        format!(
            "TCP_CONGESTION {cc}: {e}; the kernel offers those in \
             /proc/sys/net/ipv4/tcp_available_congestion_control (modprobe tcp_{cc} adds one)"
        ),
    ))
}

/// A frame header as the sink's readers decode it (`kind | len | seq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameHead {
    /// A block of `len` bytes, `0 < len <= block size`, payload follows.
    Block { len: u32, seq: u64 },
    /// The source's last frame on a stream: `blocks` sent in all; the 8-byte
    /// total length follows.
    End { blocks: u64 },
    /// The source gave up; a reason of `len` bytes follows (read at most
    /// [`MAX_REASON`]).
    Abort { len: u32 },
    /// Anything else, or a block with a length outside `1..=block size`.
    Bad { kind: u32, len: u32 },
}

/// Longest abort reason read from the peer.
pub const MAX_REASON: usize = 4096;

/// Length of a frame header.
pub const FRAME_HDR: usize = HDR;

/// Decode a frame header the sink received, for a session with
/// `block_size`-byte blocks. Never panics; a length the session did not
/// negotiate is `Bad`.
pub fn decode_frame(h: &[u8; HDR], block_size: u32) -> FrameHead {
    let (kind, len, seq) = (u32_at(h, 0), u32_at(h, 4), u64_at(h, 8));
    match kind {
        F_BLOCK if len > 0 && len <= block_size => FrameHead::Block { len, seq },
        F_END => FrameHead::End { blocks: seq },
        F_ABORT => FrameHead::Abort { len },
        _ => FrameHead::Bad { kind, len },
    }
}

/// Encode a frame header (the inverse of [`decode_frame`] for its
/// non-`Bad` results).
pub fn encode_frame(f: FrameHead) -> [u8; HDR] {
    match f {
        FrameHead::Block { len, seq } => frame(F_BLOCK, len, seq),
        FrameHead::End { blocks } => frame(F_END, 0, blocks),
        FrameHead::Abort { len } => frame(F_ABORT, len, 0),
        FrameHead::Bad { kind, len } => frame(kind, len, 0),
    }
}

fn frame(kind: u32, len: u32, seq: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[..4].copy_from_slice(&kind.to_be_bytes());
    h[4..8].copy_from_slice(&len.to_be_bytes());
    h[8..].copy_from_slice(&seq.to_be_bytes());
    h
}

fn io_err(e: io::Error, what: &'static str, timeout: Duration) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout {
            waiting_for: what,
            after: timeout,
        },
        io::ErrorKind::UnexpectedEof => {
            Error::Disconnected("the peer closed the connection".into())
        }
        _ => Error::Disconnected(format!("{what}: {e}")),
    }
}

impl TcpSession {
    /// The active side: every stream connects at once and opens with the
    /// whole proposal ([`crate::hello`]); the grant comes back on stream
    /// 0. Two round trips (TCP handshake, Hello/HelloAck) however many
    /// streams.
    pub fn connect(addr: SocketAddr, token: u64, cfg: &Config) -> Result<TcpSession, Error> {
        let proposal = Proposal::of(cfg);
        let open = |index: u32| -> Result<TcpStream, Error> {
            let mut s = TcpStream::connect_timeout(&addr, cfg.connect_timeout)
                .map_err(|e| setup_err(&format!("connecting stream {index} to {addr}"), e))?;
            prep(&s, cfg).map_err(|e| setup_err("socket options", e))?;
            // TCP mode has no features: the short form, which peers of any
            // version read as exactly HELLO_LEN bytes.
            let hello = Hello {
                token,
                index,
                proposal,
                features: 0,
            };
            s.write_all(&hello.emit_short())
                .map_err(|e| setup_err(&format!("sending stream {index}'s Hello"), e))?;
            Ok(s)
        };
        // connect(2) blocks for a round trip: one thread per stream.
        let mut opened: Vec<Result<TcpStream, Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..cfg.streams)
                .map(|i| scope.spawn(move || open(i)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Setup("a connect thread panicked".into())))
                })
                .collect()
        });
        // The grant comes on stream 0. A stream beyond it may find the
        // session's listener already closed (the passive side stops
        // listening once its granted streams are in): that refusal is the
        // answer, not a failure; it and any such stream that got through
        // are dropped here.
        let rest = opened.split_off(1);
        let mut first = opened.pop().expect("stream 0 was opened")?;
        let ack = read_ack(&mut first)?;
        let neg = ack.apply(cfg).map_err(Error::Protocol)?;
        let streams = granted(first, rest, neg.streams)?;
        Ok(TcpSession {
            streams,
            logger: Logger::new(neg.progress_interval),
            cfg: neg,
            session: ack.session,
            broken: None,
            unconfirmed: None,
        })
    }

    /// The passive side: streams in any order, matched by token and index
    /// ([`Admission`]); anything else gets a [`Refusal`] and is closed, and
    /// the session goes on waiting for its own streams until `timeout`.
    pub(crate) fn accept(
        l: &TcpListener,
        token: u64,
        ours: &Config,
        only_from: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<TcpSession, Error> {
        let deadline = Instant::now() + timeout;
        l.set_nonblocking(true)
            .map_err(|e| setup_err("listener", e))?;
        let session = crate::random_u64();
        let mut adm = Admission::new(token, ours, false, session);
        let mut slots: Vec<Option<TcpStream>> = Vec::new();
        while !adm.complete() {
            let mut s = loop {
                match l.accept() {
                    Ok((s, peer)) if crate::rdma::refuse(peer, only_from).is_some() => {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            let (got, of) = adm.admitted();
                            tracing::warn!(got, of, "rdma-xfer: session setup timed out");
                            return Err(Error::Timeout {
                                waiting_for: if adm.granted().is_none() {
                                    "the transfer connection"
                                } else {
                                    "the transfer streams"
                                },
                                after: timeout,
                            });
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(setup_err("accepting", e)),
                }
            };
            // A connection that says nothing is dropped after
            // REQUEST_WAIT, so it cannot hold the session up.
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.min(crate::hello::REQUEST_WAIT);
            let mut hello = [0u8; HELLO_LEN];
            let got = s
                .set_nonblocking(false)
                .and_then(|_| s.set_read_timeout(Some(wait.max(Duration::from_millis(10)))))
                .and_then(|_| s.read_exact(&mut hello));
            if let Err(e) = got {
                tracing::debug!(peer = ?s.peer_addr().ok(), %e, "rdma-xfer: a connection sent no Hello");
                continue;
            }
            let i = match adm.admit(&hello) {
                Verdict::Stream(i) => i as usize,
                v => {
                    let reason = match v {
                        Verdict::Refuse(r) => r,
                        // Admission refuses CONTROL in TCP mode already.
                        _ => "rdma-xfer: refused: no control connection in TCP mode".into(),
                    };
                    tracing::warn!(peer = ?s.peer_addr().ok(), %reason, "rdma-xfer: refused a connection during session setup");
                    let _ = s.write_all(&Refusal(reason).emit());
                    let _ = s.shutdown(Shutdown::Both);
                    continue;
                }
            };
            let neg = adm.granted().expect("an admitted stream fixed the grant");
            if slots.is_empty() {
                slots = (0..neg.streams).map(|_| None).collect();
            }
            if i == 0 {
                let ack = adm.ack().expect("granted").emit_short();
                s.write_all(&ack)
                    .map_err(|e| setup_err("sending the Hello reply", e))?;
            }
            slots[i] = Some(s);
        }
        let mut neg = adm.granted().expect("complete").clone();
        neg.features = 0;
        let streams: Vec<TcpStream> = slots.into_iter().flatten().collect();
        for s in &streams {
            prep(s, &neg).map_err(|e| setup_err("socket options", e))?;
        }
        Ok(TcpSession {
            streams,
            logger: Logger::new(neg.progress_interval),
            cfg: neg,
            session,
            broken: None,
            unconfirmed: None,
        })
    }

    fn check(&self) -> Result<(), Error> {
        match &self.broken {
            Some(s) => Err(Error::Broken(s.clone())),
            None => Ok(()),
        }
    }

    fn kill(&mut self, e: &Error) {
        self.broken = Some(e.to_string());
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Close them: a peer still writing gets a reset at once instead of
        // filling a socket nobody reads until its timeout.
        self.streams.clear();
    }

    /// After a failed write: did the sink say why?
    fn peer_reason(&self) -> Option<String> {
        let mut s = self.streams.first()?;
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut h = [0u8; HDR];
        s.read_exact(&mut h).ok()?;
        if u32_at(&h, 0) != F_ABORT {
            return None;
        }
        let mut r = vec![0u8; (u32_at(&h, 4) as usize).min(4096)];
        s.read_exact(&mut r).ok()?;
        Some(String::from_utf8_lossy(&r).into_owned())
    }

    fn send_inner(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        let start = Instant::now();
        let n = self.streams.len() as u64;
        let mut buf = vec![0u8; self.cfg.block_size as usize];
        let (mut seq, mut bytes) = (0u64, 0u64);
        let t = self.cfg.timeout;
        loop {
            let k = src.read_block(&mut buf).map_err(|e| {
                let reason = e.to_string();
                let mut s = &self.streams[0];
                let _ = s.write_all(&frame(F_ABORT, reason.len() as u32, 0));
                let _ = s.write_all(reason.as_bytes());
                Error::Local(e)
            })?;
            if k == 0 {
                break;
            }
            let mut s = &self.streams[(seq % n) as usize];
            let r = s
                .write_all(&frame(F_BLOCK, k as u32, seq))
                .and_then(|_| s.write_all(&buf[..k]));
            if let Err(e) = r {
                return Err(match self.peer_reason() {
                    Some(r) => Error::PeerAborted(r),
                    None => io_err(e, "the sink to take data", t),
                });
            }
            self.logger.add(k as u64);
            seq += 1;
            bytes += k as u64;
        }
        for mut s in &self.streams {
            s.write_all(&frame(F_END, 0, seq))
                .and_then(|_| s.write_all(&bytes.to_be_bytes()))
                .map_err(|e| io_err(e, "the sink to take data", t))?;
        }
        // The sink's Fin is read by `confirm` (Transport::send_unconfirmed).
        self.unconfirmed = Some(bytes);
        Ok(Stats {
            bytes,
            blocks: seq,
            elapsed: start.elapsed(),
        })
    }

    /// Read the sink's answer to the last transfer sent, if not read yet.
    fn confirm_inner(&mut self) -> Result<(), Error> {
        let Some(bytes) = self.unconfirmed.take() else {
            return Ok(());
        };
        let t = self.cfg.timeout;
        let mut s = &self.streams[0];
        let mut h = [0u8; HDR];
        s.read_exact(&mut h)
            .map_err(|e| io_err(e, "the sink to finish", t))?;
        match u32_at(&h, 0) {
            F_FIN if u64_at(&h, 8) == bytes => Ok(()),
            F_FIN => Err(Error::Protocol(format!(
                "sink acknowledged {} bytes, {bytes} were sent",
                u64_at(&h, 8)
            ))),
            F_ABORT => {
                let mut r = vec![0u8; (u32_at(&h, 4) as usize).min(4096)];
                let _ = s.read_exact(&mut r);
                Err(Error::PeerAborted(String::from_utf8_lossy(&r).into_owned()))
            }
            k => Err(Error::Protocol(format!("unexpected reply frame {k}"))),
        }
    }

    fn recv_inner(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        enum Ev {
            Block(u64, Vec<u8>),
            End(u64, u64),
            Abort(String),
            Err(Error),
        }
        let start = Instant::now();
        let bs = self.cfg.block_size;
        let t = self.cfg.timeout;
        let (tx, rx) = mpsc::sync_channel::<Ev>(self.cfg.pool_depth() as usize);
        let streams = &self.streams;
        let logger = &self.logger;
        // The reorder window: the negotiated pool depth, and at least two
        // blocks per stream so that every stream can have one block in
        // flight beside the one being read. A reader holds a block header
        // until the block is inside the window, so the sink holds at most
        // `width` blocks plus the headers its readers wait on.
        let window = Window::new(u64::from(self.cfg.pool_depth()).max(2 * streams.len() as u64));
        let window = &window;
        let result = std::thread::scope(|scope| {
            // Owned here: dropped when this closure returns, which unblocks
            // readers stuck on a full channel before the scope joins them.
            let rx = rx;
            for s in streams {
                let tx = tx.clone();
                scope.spawn(move || {
                    let mut s = s;
                    loop {
                        let mut h = [0u8; HDR];
                        if let Err(e) = s.read_exact(&mut h) {
                            let _ = tx.send(Ev::Err(io_err(e, "the next block", t)));
                            return;
                        }
                        let ev = match decode_frame(&h, bs) {
                            FrameHead::Block { len, seq } => {
                                // Hold the payload in the socket (TCP
                                // pushes back on the source) until the
                                // block is inside the reorder window.
                                match window.admit(seq, t) {
                                    Ok(()) => {}
                                    Err(AdmitError::Closed) => return,
                                    Err(AdmitError::TimedOut { seq, delivered }) => {
                                        let _ = tx.send(Ev::Err(Error::Protocol(format!(
                                            "block {seq} waited {:.1} s while block {delivered} \
                                             never arrived (reorder window {} blocks): the \
                                             source skipped a block or a stream stalled",
                                            t.as_secs_f64(),
                                            window.width()
                                        ))));
                                        return;
                                    }
                                }
                                let mut b = vec![0u8; len as usize];
                                match s.read_exact(&mut b) {
                                    Ok(()) => Ev::Block(seq, b),
                                    Err(e) => Ev::Err(io_err(e, "the next block", t)),
                                }
                            }
                            FrameHead::End { blocks } => {
                                let mut b = [0u8; 8];
                                match s.read_exact(&mut b) {
                                    Ok(()) => Ev::End(blocks, u64::from_be_bytes(b)),
                                    Err(e) => Ev::Err(io_err(e, "the next block", t)),
                                }
                            }
                            FrameHead::Abort { len } => {
                                let mut r = vec![0u8; (len as usize).min(MAX_REASON)];
                                let _ = s.read_exact(&mut r);
                                Ev::Abort(String::from_utf8_lossy(&r).into_owned())
                            }
                            FrameHead::Bad { kind, len } => Ev::Err(Error::Protocol(format!(
                                "bad frame kind {kind} len {len} (block size {bs})"
                            ))),
                        };
                        let last = !matches!(ev, Ev::Block(..));
                        if tx.send(ev).is_err() || last {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            let mut reorder = Reorder::with_window(window.width());
            let mut ends = 0usize;
            let mut end = None;
            let mut bytes = 0u64;
            let fail = |e: Error| {
                window.close();
                for s in streams {
                    let _ = s.shutdown(Shutdown::Both);
                }
                Err(e)
            };
            loop {
                if ends == streams.len() {
                    let (blocks, total) = end.unwrap_or((0, 0));
                    if reorder.delivered() != blocks || total != bytes {
                        return fail(Error::Protocol(format!(
                            "source announced {blocks} blocks / {total} bytes, {} / {bytes} arrived",
                            reorder.delivered()
                        )));
                    }
                    if let Err(e) = sink.finish() {
                        return fail(Error::Local(e));
                    }
                    window.close();
                    return Ok(Stats {
                        bytes,
                        blocks,
                        elapsed: start.elapsed(),
                    });
                }
                match rx.recv_timeout(t + Duration::from_secs(1)) {
                    Ok(Ev::Block(seq, b)) => {
                        if let Err(e) = reorder.insert(seq, b) {
                            return fail(Error::Protocol(e.to_string()));
                        }
                        while let Some(b) = reorder.pop() {
                            if let Err(e) = sink.write_block(&b) {
                                let reason = e.to_string();
                                let mut s = &streams[0];
                                let _ = s.write_all(&frame(F_ABORT, reason.len() as u32, 0));
                                let _ = s.write_all(reason.as_bytes());
                                return fail(Error::Local(e));
                            }
                            logger.add(b.len() as u64);
                            bytes += b.len() as u64;
                        }
                        window.advance(reorder.delivered());
                    }
                    Ok(Ev::End(blocks, total)) => {
                        ends += 1;
                        end = Some((blocks, total));
                    }
                    Ok(Ev::Abort(r)) => return fail(Error::PeerAborted(r)),
                    Ok(Ev::Err(e)) => return fail(e),
                    Err(_) => {
                        return fail(Error::Timeout {
                            waiting_for: "the next block",
                            after: t,
                        })
                    }
                }
            }
        });
        if let Ok(st) = &result {
            let mut s = &self.streams[0];
            s.write_all(&frame(F_FIN, 0, st.bytes))
                .map_err(|e| io_err(e, "sending Fin", t))?;
        }
        result
    }
}

impl Transport for TcpSession {
    fn send_unconfirmed(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        self.confirm()?;
        self.logger.begin(src.len_hint());
        let r = self.send_inner(src);
        self.logger.end(r.is_ok());
        if let Err(e) = &r {
            self.kill(e);
        }
        r
    }

    fn confirm(&mut self) -> Result<(), Error> {
        self.check()?;
        let r = self.confirm_inner();
        if let Err(e) = &r {
            self.kill(e);
        }
        r
    }

    fn recv(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        self.confirm()?;
        self.logger.begin(None);
        let r = self.recv_inner(sink);
        self.logger.end(r.is_ok());
        if let Err(e) = &r {
            self.kill(e);
        }
        r
    }

    fn set_progress(&mut self, cb: Option<ProgressFn>) {
        self.logger.set_callback(cb);
    }

    fn config(&self) -> &Config {
        &self.cfg
    }

    fn mode(&self) -> Mode {
        Mode::Tcp
    }

    fn session_id(&self) -> u64 {
        self.session
    }
}

/// Stream 0 and the other streams up to the passive side's `grant`: every
/// granted stream must have connected; what lies beyond the grant (refused
/// by a listener already closed, or connected and now dropped) does not
/// matter.
fn granted<S>(first: S, mut rest: Vec<Result<S, Error>>, grant: u32) -> Result<Vec<S>, Error> {
    rest.truncate((grant as usize).saturating_sub(1));
    let mut streams = vec![first];
    for s in rest {
        streams.push(s?);
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refused_stream_beyond_the_grant_is_not_a_failure() {
        // rftp's limits test saw this: 2 streams proposed, 1 granted, and
        // stream 1's connect refused because the session's listener had
        // closed; the whole connect failed.
        let refused = || Err(super::Error::Setup("connecting stream 1: refused".into()));
        assert_eq!(super::granted(0u32, vec![refused()], 1).unwrap(), vec![0]);
        assert_eq!(
            super::granted(0u32, vec![Ok(1), refused()], 2).unwrap(),
            vec![0, 1]
        );
        // A granted stream that failed fails the session.
        assert!(super::granted(0u32, vec![refused(), Ok(2)], 3).is_err());
        assert_eq!(
            super::granted(0u32, vec![Ok(1), Ok(2)], 3).unwrap(),
            vec![0, 1, 2]
        );
    }

    use super::*;

    #[test]
    fn frame_headers_decode_from_byte_literals() {
        let block = [0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        assert_eq!(
            decode_frame(&block, 4096),
            FrameHead::Block { len: 4096, seq: 7 }
        );
        assert_eq!(encode_frame(decode_frame(&block, 4096)), block);
        // One byte more than the negotiated block size is refused.
        assert_eq!(
            decode_frame(&block, 4095),
            FrameHead::Bad { kind: 1, len: 4096 }
        );
        let empty = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(matches!(decode_frame(&empty, 4096), FrameHead::Bad { .. }));
        let end = [0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        assert_eq!(decode_frame(&end, 4096), FrameHead::End { blocks: 256 });
        let abort = [0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            decode_frame(&abort, 4096),
            FrameHead::Abort { len: u32::MAX }
        );
        // Fin goes to the source, never to the sink's readers.
        let fin = [0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        assert!(matches!(
            decode_frame(&fin, 4096),
            FrameHead::Bad { kind: 3, .. }
        ));
    }
}
