//! The writer of one direction: forwards chunks once their delay has
//! passed and applies the faults at their exact stream offset or time.

use std::io::{self, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Rng, Signal};
use crate::conn::{Conn, HELD, JOIN, TICK};
use crate::rewrite::Rewriter;
use crate::spec::{Dir, FaultSpec, Kind, Trigger};

/// Why a writer stops.
pub(crate) enum Stop {
    /// The connection was dropped or a write failed.
    Dead,
}

pub(crate) struct Fault {
    pub(crate) spec: FaultSpec,
    pub(crate) fired: bool,
}

/// The writer of one direction and its fault state.
pub(crate) struct Writer {
    pub(crate) conn: Arc<Conn>,
    pub(crate) d: Dir,
    pub(crate) start: Instant,
    pub(crate) faults: Vec<Fault>,
    /// Stream offset of the next byte (forwarded or swallowed).
    pub(crate) off: u64,
    /// Swallow everything from here on.
    pub(crate) swallow: bool,
    /// End of stream is not passed on (blackhole).
    pub(crate) keep_open: bool,
    pub(crate) reseg: Option<(Rng, usize)>,
    pub(crate) seed: u64,
    /// The rewriter of `Config::alg`, where it applies.
    pub(crate) alg: Option<Rewriter>,
    /// `Config::signal`, for faults with `wait=signal`.
    pub(crate) signal: Signal,
}

impl Writer {
    pub(crate) fn write(&self, mut data: &[u8]) -> Result<(), Stop> {
        let (_, mut dst) = self.conn.side(self.d);
        while !data.is_empty() {
            if self.conn.dead() {
                return Err(Stop::Dead);
            }
            match dst.write(data) {
                Ok(0) => return Err(Stop::Dead),
                Ok(n) => data = &data[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => {
                    tracing::debug!(conn = %self.conn.id, d = ?self.d, %e, "relay write ended");
                    let _ = dst.shutdown(Shutdown::Both);
                    return Err(Stop::Dead);
                }
            }
        }
        Ok(())
    }

    pub(crate) fn emit(&mut self, data: &[u8]) -> Result<(), Stop> {
        match &mut self.reseg {
            None => self.write(data),
            Some((rng, max)) => {
                let max = *max;
                let mut p = 0;
                let mut pieces = Vec::new();
                while p < data.len() {
                    let n = rng.piece(max).min(data.len() - p);
                    pieces.push(p..p + n);
                    p += n;
                }
                for r in pieces {
                    self.write(&data[r])?;
                }
                Ok(())
            }
        }
    }

    /// Fire the faults due at the current offset and time.
    pub(crate) fn fire_due(&mut self) -> Result<(), Stop> {
        let now = self.start.elapsed();
        for i in 0..self.faults.len() {
            let f = &self.faults[i];
            if f.fired || f.spec.kind == Kind::Corrupt {
                continue;
            }
            let due = match f.spec.at {
                Trigger::Bytes(n) => self.off >= n,
                Trigger::Time(t) => now >= t,
            };
            if !due {
                continue;
            }
            if f.spec.wait_signal && !self.signal.is_raised() {
                // Hold the direction here (nothing more is forwarded)
                // until the test raises the signal.
                tracing::info!(conn = %self.conn.id, d = ?self.d, offset = self.off, "fault due: holding until the signal");
                while !self.signal.is_raised() {
                    if self.conn.dead() {
                        return Err(Stop::Dead);
                    }
                    std::thread::sleep(TICK);
                }
            }
            self.faults[i].fired = true;
            let kind = self.faults[i].spec.kind;
            tracing::info!(conn = %self.conn.id, d = ?self.d, offset = self.off, ?kind, "fault fires");
            match kind {
                Kind::Drop { rst } => {
                    self.conn.kill(rst);
                    return Err(Stop::Dead);
                }
                Kind::Stall(t) => {
                    let until = Instant::now() + t;
                    while Instant::now() < until {
                        if self.conn.dead() {
                            return Err(Stop::Dead);
                        }
                        std::thread::sleep(TICK.min(until - Instant::now()));
                    }
                    tracing::info!(conn = %self.conn.id, d = ?self.d, "stall over");
                }
                Kind::Truncate { close } => {
                    if close {
                        self.conn.kill(false);
                        return Err(Stop::Dead);
                    }
                    let (_, dst) = self.conn.side(self.d);
                    let _ = dst.shutdown(Shutdown::Write);
                    self.swallow = true;
                }
                Kind::Blackhole => {
                    self.swallow = true;
                    self.keep_open = true;
                }
                Kind::Reseg { seed, max } => {
                    self.reseg = Some((Rng::new(seed.unwrap_or(self.seed)), max));
                }
                Kind::Corrupt => {}
            }
        }
        Ok(())
    }

    /// The next byte offset past `self.off` where a fault fires.
    pub(crate) fn next_cut(&self) -> Option<u64> {
        self.faults
            .iter()
            .filter(|f| !f.fired && f.spec.kind != Kind::Corrupt)
            .filter_map(|f| match f.spec.at {
                Trigger::Bytes(n) if n > self.off => Some(n),
                _ => None,
            })
            .min()
    }

    /// Forward (or swallow) one batch of bytes, firing faults on the way.
    pub(crate) fn process(&mut self, mut buf: Vec<u8>) -> Result<(), Stop> {
        let end = self.off + buf.len() as u64;
        for f in &self.faults {
            if let (Kind::Corrupt, Trigger::Bytes(n)) = (f.spec.kind, f.spec.at) {
                if (self.off..end).contains(&n) {
                    tracing::info!(conn = %self.conn.id, d = ?self.d, offset = n, "corrupting a byte");
                    buf[(n - self.off) as usize] ^= 0xff;
                }
            }
        }
        let mut pos = 0usize;
        while pos < buf.len() {
            self.fire_due()?;
            if self.swallow {
                self.off += (buf.len() - pos) as u64;
                return Ok(());
            }
            let stop = match self.next_cut() {
                Some(c) if c < end => (c - self.off) as usize + pos,
                _ => buf.len(),
            };
            self.emit(&buf[pos..stop])?;
            self.off += (stop - pos) as u64;
            pos = stop;
        }
        self.fire_due()
    }

    pub(crate) fn run(mut self, rx: Receiver<(Instant, Vec<u8>)>, delay: Duration) {
        let mut held: Option<(Instant, Vec<u8>)> = None;
        let r = (|| -> Result<(), Stop> {
            self.fire_due()?;
            loop {
                let (t, mut buf) = match held.take() {
                    Some(c) => c,
                    None => match rx.recv_timeout(TICK) {
                        Ok(c) => c,
                        Err(RecvTimeoutError::Timeout) => {
                            if self.conn.dead() {
                                return Err(Stop::Dead);
                            }
                            self.fire_due()?;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            if let Some(rest) =
                                self.alg.as_mut().map(|a| std::mem::take(&mut a.held))
                            {
                                self.process(rest)?;
                            }
                            return Ok(());
                        }
                    },
                };
                loop {
                    let wait = (t + delay).saturating_duration_since(Instant::now());
                    if wait.is_zero() {
                        break;
                    }
                    if self.conn.dead() {
                        return Err(Stop::Dead);
                    }
                    std::thread::sleep(wait.min(TICK));
                }
                // Join what else is queued and due, so writes span the
                // boundaries of the reads.
                while buf.len() < JOIN {
                    match rx.try_recv() {
                        Ok((t2, b2)) if t2 + delay <= Instant::now() => buf.extend_from_slice(&b2),
                        Ok(c) => {
                            held = Some(c);
                            break;
                        }
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
                if let Some(alg) = &mut self.alg {
                    buf = alg.feed(&buf);
                }
                self.process(buf)?;
            }
        })();
        match r {
            Ok(()) if self.keep_open => {
                // Neither the end of stream nor the close may reach the
                // other side: the sockets stay open until the relay exits.
                tracing::debug!(conn = %self.conn.id, d = ?self.d, "end of stream swallowed");
                HELD.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(self.conn.clone());
            }
            // The reader also stops when the connection was dropped: no
            // FIN then (it would precede the RST).
            Ok(()) if self.conn.dead() => {}
            Ok(()) => {
                let (_, dst) = self.conn.side(self.d);
                let _ = dst.shutdown(Shutdown::Write);
            }
            Err(Stop::Dead) => {}
        }
        if self.conn.done.fetch_add(1, Ordering::Relaxed) == 1 && !self.conn.dead() {
            tracing::debug!(conn = %self.conn.id, "both directions ended");
        }
    }
}
