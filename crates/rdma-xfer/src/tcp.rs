//! The plain-TCP transport: the same [`Transport`] over N TCP
//! connections, for comparison with RDMA and for peers without it.
//!
//! Setup: the first connection carries `Hello` (magic, token, proposal)
//! and the reply (magic, session ID, grant); the other streams open with
//! (magic, session ID, index). Then each block travels as a frame on
//! stream `seq % N`:
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

use crate::io::{BlockSink, BlockSource};
use crate::progress::Logger;
use crate::{
    negotiate, AdmitError, Config, Error, Mode, ProgressFn, Reorder, Stats, Transport, Window,
};

const MAGIC: &[u8; 4] = b"RFTT";
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
    /// The active side.
    pub fn connect(addr: SocketAddr, token: u64, cfg: &Config) -> Result<TcpSession, Error> {
        let open = || -> Result<TcpStream, Error> {
            let s = TcpStream::connect_timeout(&addr, cfg.connect_timeout)
                .map_err(|e| setup_err(&format!("connecting to {addr}"), e))?;
            prep(&s, cfg).map_err(|e| setup_err("socket options", e))?;
            Ok(s)
        };
        let mut first = open()?;
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&token.to_be_bytes());
        for v in [cfg.streams, cfg.block_size, cfg.iodepth] {
            hello.extend_from_slice(&v.to_be_bytes());
        }
        first
            .write_all(&hello)
            .map_err(|e| setup_err("sending Hello", e))?;
        let mut ack = [0u8; 24];
        first
            .read_exact(&mut ack)
            .map_err(|e| setup_err("waiting for the Hello reply", e))?;
        if &ack[..4] != MAGIC {
            return Err(Error::Protocol("bad Hello reply".into()));
        }
        let session = u64_at(&ack, 4);
        let mut neg = cfg.clone();
        neg.streams = u32_at(&ack, 12);
        neg.block_size = u32_at(&ack, 16);
        neg.iodepth = u32_at(&ack, 20);
        let neg = neg
            .validated()
            .map_err(|e| Error::Protocol(format!("peer granted {e}")))?;
        let mut streams = vec![first];
        for i in 1..neg.streams {
            let mut s = open()?;
            let mut h = MAGIC.to_vec();
            h.extend_from_slice(&session.to_be_bytes());
            h.extend_from_slice(&i.to_be_bytes());
            s.write_all(&h)
                .map_err(|e| setup_err("opening a stream", e))?;
            streams.push(s);
        }
        Ok(TcpSession {
            streams,
            logger: Logger::new(neg.progress_interval),
            cfg: neg,
            session,
            broken: None,
        })
    }

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
        let next = || -> Result<TcpStream, Error> {
            loop {
                match l.accept() {
                    Ok((s, peer)) if crate::rdma::refuse(peer, only_from).is_some() => {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    Ok((s, _)) => {
                        s.set_nonblocking(false)
                            .map_err(|e| setup_err("socket options", e))?;
                        let left = deadline.saturating_duration_since(Instant::now());
                        s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
                            .map_err(|e| setup_err("socket options", e))?;
                        return Ok(s);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            return Err(Error::Timeout {
                                waiting_for: "the transfer connection",
                                after: timeout,
                            });
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(setup_err("accepting", e)),
                }
            }
        };
        // A connection with the wrong token is refused, and the session
        // keeps waiting for its own peer until the deadline.
        let (mut first, hello) = loop {
            let mut s = next()?;
            let mut hello = [0u8; 24];
            if let Err(e) = s.read_exact(&mut hello) {
                if Instant::now() >= deadline {
                    return Err(setup_err("waiting for Hello", e));
                }
                continue;
            }
            if &hello[..4] != MAGIC || u64_at(&hello, 4) != token {
                tracing::warn!(peer = ?s.peer_addr().ok(), "rdma-xfer: refused a connection with a wrong session token");
                let _ = s.shutdown(Shutdown::Both);
                continue;
            }
            break (s, hello);
        };
        let neg = negotiate(
            ours,
            u32_at(&hello, 12),
            u32_at(&hello, 16),
            u32_at(&hello, 20),
        );
        let session = crate::random_u64();
        let mut ack = MAGIC.to_vec();
        ack.extend_from_slice(&session.to_be_bytes());
        for v in [neg.streams, neg.block_size, neg.iodepth] {
            ack.extend_from_slice(&v.to_be_bytes());
        }
        first
            .write_all(&ack)
            .map_err(|e| setup_err("sending the Hello reply", e))?;
        let mut slots: Vec<Option<TcpStream>> = (0..neg.streams).map(|_| None).collect();
        slots[0] = Some(first);
        while slots.iter().any(Option::is_none) {
            let mut s = next()?;
            let mut h = [0u8; 16];
            if s.read_exact(&mut h).is_err() {
                continue;
            }
            let i = u32_at(&h, 12) as usize;
            if &h[..4] == MAGIC && u64_at(&h, 4) == session && i < slots.len() && slots[i].is_none()
            {
                slots[i] = Some(s);
            } else {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
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
        let mut s = &self.streams[0];
        let mut h = [0u8; HDR];
        s.read_exact(&mut h)
            .map_err(|e| io_err(e, "the sink to finish", t))?;
        match u32_at(&h, 0) {
            F_FIN if u64_at(&h, 8) == bytes => Ok(Stats {
                bytes,
                blocks: seq,
                elapsed: start.elapsed(),
            }),
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
    fn send(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        self.check()?;
        self.logger.begin(src.len_hint());
        let r = self.send_inner(src);
        self.logger.end(r.is_ok());
        if let Err(e) = &r {
            self.kill(e);
        }
        r
    }

    fn recv(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        self.check()?;
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

#[cfg(test)]
mod tests {
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
