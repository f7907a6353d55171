//! The stream calls themselves: `rrecv` and `rsend` (copying between the
//! application's buffers and the rings, or zero copy), readiness polls,
//! `rshutdown` and `rclose`; and the receive ring's autotuning
//! ([`crate::tune`]).

use std::io;
use std::time::Instant;

use iwarp::cm::{self};

use crate::flow::{FlowError, Phase, Shutdown, Spans};
use crate::options::Design;

use super::call::Call;
use super::types::{for_spans, verbs_err, Conn, State, Waited};

impl Conn {
    /// Once per round trip while the ring may still grow: measure what
    /// the application read and the path's RTT, and let the ring grow
    /// toward twice the bandwidth-delay product ([`crate::tune`]).
    pub(super) fn tune_ring(&self, st: &mut State) {
        if !st.tuner.can_grow() {
            return;
        }
        let now = self.epoch.elapsed();
        if !st.tuner.due(now, st.rtt) {
            return;
        }
        let Ok(Some(rtt)) = cm::path_rtt(&self.qp) else {
            return;
        };
        st.rtt = rtt;
        if let Some(goal) = st.tuner.sample(now, st.stats.bytes_received, rtt) {
            tracing::debug!(stream = self.id, goal, ?rtt, "receive ring goal raised");
            st.flow.set_ring_goal(goal, self.slots_at);
        }
    }

    /// `rrecv`: up to `buf.len()` bytes; 0 at end of stream.
    pub(crate) fn read(
        &self,
        buf: &mut [u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let mut call = self.begin();
        self.read_inner(&mut call, buf, nonblocking, deadline)
    }

    pub(super) fn read_inner(
        &self,
        call: &mut Call<'_>,
        buf: &mut [u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let max = buf.len().min(u32::MAX as usize) as u32;
        if nonblocking && self.opts.busy_poll {
            // A program that spins on EAGAIN never waits on the CQ, so the
            // receive work (which busy-poll mode leaves to the waiting
            // thread) is done here, with the state unlocked.
            call.unlocked(|| self.cq.progress());
        }
        loop {
            let st = call.st();
            self.drain(st);
            match st.flow.recv(max) {
                Ok(g) if g.eof => {
                    self.refresh(st);
                    return Ok(0);
                }
                Ok(g) => {
                    let n = g.spans.len() as usize;
                    self.copy_out(st, g.spans, &mut buf[..n]);
                    st.stats.bytes_received += n as u64;
                    st.idle = false;
                    self.tune_ring(st);
                    // The credit update the read made possible.
                    self.pump(st);
                    self.refresh(st);
                    return Ok(n);
                }
                Err(FlowError::WouldBlock) => {
                    Self::check_broken(st)?;
                }
                Err(e) => {
                    Self::check_broken(st)?;
                    return Err(e.into());
                }
            }
            if nonblocking {
                self.refresh(st);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if let Waited::TimedOut = call.wait(deadline) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "read timed out (SO_RCVTIMEO)",
                ));
            }
        }
    }

    pub(super) fn copy_out(&self, st: &mut State, spans: Spans, dst: &mut [u8]) {
        if self.opts.design == Design::Basic {
            // The basic design's private receive buffer: ring -> private
            // buffer -> user.
            let n = dst.len();
            if st.basic_buf.len() < n {
                st.basic_buf.resize(n, 0);
            }
            let mut done = 0;
            for_spans(spans, |o, len| {
                self.rbuf.read_at(o, &mut st.basic_buf[done..done + len]);
                done += len;
            });
            dst.copy_from_slice(&st.basic_buf[..n]);
            return;
        }
        let mut done = 0;
        for_spans(spans, |o, len| {
            self.rbuf.read_at(o, &mut dst[done..done + len]);
            done += len;
        });
    }

    pub(super) fn copy_in(&self, st: &mut State, spans: Spans, src: &[u8]) {
        if self.opts.design == Design::Basic {
            let n = src.len();
            if st.basic_buf.len() < n {
                st.basic_buf.resize(n, 0);
            }
            st.basic_buf[..n].copy_from_slice(src);
            let mut done = 0;
            for_spans(spans, |o, len| {
                self.sbuf.write_at(o, &st.basic_buf[done..done + len]);
                done += len;
            });
            return;
        }
        let mut done = 0;
        for_spans(spans, |o, len| {
            self.sbuf.write_at(o, &src[done..done + len]);
            done += len;
        });
    }

    /// `rsend`: blocking streams send everything (or fail); non-blocking
    /// ones send what fits now.
    pub(crate) fn write(
        &self,
        buf: &[u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let mut call = self.begin();
        self.write_inner(&mut call, buf, nonblocking, deadline)
    }

    pub(super) fn write_inner(
        &self,
        call: &mut Call<'_>,
        buf: &[u8],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !nonblocking {
            if let Some(t) = self.opts.zcopy() {
                if buf.len() >= t {
                    return call.unlocked(|| self.write_zcopy(buf, deadline));
                }
            }
        }
        let mut done = 0usize;
        // Whether this call did the receive work yet (busy-poll mode).
        let mut progressed = false;
        // The stream stopped taking bytes after some of `buf` went.
        let mut ended = false;
        call.st().stats.writes += 1;
        loop {
            let st = call.st();
            self.drain(st);
            Self::check_broken(st)?;
            let coalesce = self.opts.coalescing();
            while done < buf.len() {
                let want = (buf.len() - done).min(u32::MAX as usize) as u32;
                let mut t = self.target();
                let before = t;
                let r = if coalesce {
                    let push = Self::should_push(st);
                    let waiting = st.flow.buffered();
                    let r = st.flow.send_buffered(want, &mut t, push);
                    if r.is_ok() && waiting > 0 && done == 0 {
                        // This write joined bytes that wait for the wire.
                        st.stats.appended += 1;
                    }
                    r
                } else {
                    st.flow.send(want, &mut t)
                };
                self.write_back(&before, &t);
                match r {
                    Ok(g) => {
                        let n = g.spans.len() as usize;
                        if n == 0 {
                            break;
                        }
                        self.copy_in(st, g.spans, &buf[done..done + n]);
                        done += n;
                    }
                    Err(FlowError::WouldBlock) => break,
                    Err(e) => {
                        if done > 0 {
                            // Shut down (or failed) after part of the
                            // buffer went: return that part, as send(2)
                            // does; the next write reports the error. A
                            // blocking write must not wait on for room
                            // it can never use.
                            ended = true;
                            break;
                        }
                        return Err(match e {
                            FlowError::NotWritable => io::Error::new(
                                io::ErrorKind::BrokenPipe,
                                "the stream is shut down for writing (by shutdown or the peer's \
                                 disconnect)",
                            ),
                            other => other.into(),
                        });
                    }
                }
            }
            self.push_buffered(st);
            self.pump(st);
            st.idle = false;
            if done == buf.len() || (nonblocking && done > 0) || ended {
                st.stats.bytes_sent += done as u64;
                self.refresh(st);
                return Ok(done);
            }
            if nonblocking {
                if self.opts.busy_poll && !progressed {
                    // A program that spins on EAGAIN never waits on the CQ,
                    // so the receive work that may return credits (which
                    // busy-poll mode leaves to the waiting thread) is done
                    // here, then the write tries again. Only when blocked: a
                    // write that can go at once must not pay a `recv` first,
                    // which was a system call on every ping-pong reply's
                    // path.
                    progressed = true;
                    call.unlocked(|| self.cq.progress());
                    continue;
                }
                self.refresh(st);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if let Waited::TimedOut = call.wait(deadline) {
                call.st().stats.bytes_sent += done as u64;
                if done > 0 {
                    return Ok(done);
                }
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "write timed out (SO_SNDTIMEO)",
                ));
            }
        }
    }

    /// Zero copy: registers `buf`, RDMA-Writes it straight into the peer's
    /// ring, and returns when every Write from it has completed.
    pub(super) fn write_zcopy(&self, buf: &[u8], deadline: Option<Instant>) -> io::Result<usize> {
        let mr = crate::sys::register_source(&self.pd, buf).map_err(verbs_err)?;
        let mut st = self.lock();
        st.stats.writes += 1;
        let mut done = 0usize;
        let mut err = None;
        while done < buf.len() {
            self.drain(&mut st);
            if let Err(e) = Self::check_broken(&st) {
                err = Some(e);
                break;
            }
            let want = (buf.len() - done).min(u32::MAX as usize) as u32;
            let mut t = self.target();
            let before = t;
            let r = st.flow.send_zcopy(want, &mut t);
            self.write_back(&before, &t);
            match r {
                Ok(n) => {
                    st.zc_sge = Some(mr.sge(done, n as usize));
                    self.pump(&mut st);
                    done += n as usize;
                }
                Err(FlowError::WouldBlock) => {
                    let (g, w) = self.wait(st, deadline);
                    st = g;
                    if let Waited::TimedOut = w {
                        err = Some(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            "write timed out (SO_SNDTIMEO)",
                        ));
                        break;
                    }
                }
                Err(e) => {
                    err = Some(e.into());
                    break;
                }
            }
        }
        // Every Write from `buf` must be done before it is released: wait
        // for their completions (or the flush of a failed connection),
        // without a deadline.
        while st.zc_inflight > 0 {
            self.drain(&mut st);
            if st.zc_inflight == 0 {
                break;
            }
            // Each completion (or the flush of a failed connection) wakes
            // this wait; no deadline.
            let (g, _) = self.wait(st, None);
            st = g;
        }
        st.stats.zcopy_bytes += done as u64;
        st.stats.bytes_sent += done as u64;
        st.idle = false;
        self.refresh(&mut st);
        drop(st);
        drop(mr);
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Whether a read would not block.
    pub(crate) fn poll_read(&self) -> bool {
        let mut st = self.lock();
        self.drain(&mut st);
        st.flow.poll_readable() || st.broken.is_some()
    }

    /// Whether a write would not block.
    pub(crate) fn poll_write(&self) -> bool {
        let mut st = self.lock();
        self.drain(&mut st);
        st.broken.is_some() || !st.flow.is_writable() || self.can_write(&st)
    }

    /// (readable, writable, broken) now: what `poll_read`, `poll_write`
    /// say, and whether the stream is broken (reset or closed).
    pub(crate) fn poll_state(&self) -> (bool, bool, bool) {
        let mut st = self.lock();
        self.drain(&mut st);
        let broken = st.broken.is_some();
        let readable = st.flow.poll_readable() || broken;
        let writable = broken || !st.flow.is_writable() || self.can_write(&st);
        (readable, writable, broken)
    }

    /// The completion queue, in busy-poll mode only.
    pub(crate) fn busy_poll_cq(&self) -> Option<&iwarp::CompletionQueue> {
        self.opts.busy_poll.then_some(&self.cq)
    }

    pub(super) fn can_write(&self, st: &State) -> bool {
        if self.opts.coalescing() {
            st.flow.can_buffer()
        } else {
            st.flow.can_send(&self.target())
        }
    }

    /// Bytes that can be read now.
    pub(crate) fn bytes_readable(&self) -> u64 {
        let mut st = self.lock();
        self.drain(&mut st);
        st.flow.bytes_queued()
    }

    /// `rshutdown`.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut st = self.lock();
        self.drain(&mut st);
        if st.flow.phase() == Phase::Connected {
            st.flow.shutdown(how).map_err(io::Error::from)?;
            self.pump(&mut st);
        }
        self.refresh(&mut st);
        // A thread blocked in a read after `SHUT_RD` must return end of
        // stream now: no completion need come to wake it.
        self.wake_waiters(&mut st);
        Ok(())
    }

    /// `rclose`: disconnect message, linger (bounded), tear down.
    pub(crate) fn close(&self) {
        {
            let mut st = self.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            self.wake_waiters(&mut st);
            self.drain(&mut st);
            if st.flow.phase() == Phase::Connected && st.broken.is_none() {
                let _ = st.flow.shutdown(Shutdown::Both);
                self.pump(&mut st);
            }
            // Linger while the data still queued keeps moving: give up
            // after `linger` without progress (a peer that stopped reading;
            // a dead peer resets the stream at once).
            let mut deadline = Instant::now() + self.opts.linger;
            while !st.flow.all_sends_done() && st.broken.is_none() {
                let seen = st.completions;
                let (g, w) = self.wait(st, Some(deadline));
                st = g;
                self.drain(&mut st);
                // Progress counts even when it is noticed only after the
                // deadline (a wake-up late on a loaded machine): the wait
                // timed out, but the peer did take data, so linger on.
                if st.completions != seen {
                    deadline = Instant::now() + self.opts.linger;
                } else if let Waited::TimedOut = w {
                    if !st.flow.all_sends_done() {
                        tracing::debug!(
                            conn = self.id,
                            buffered = st.flow.buffered(),
                            "close: the peer took nothing for the linger time; dropping what is queued"
                        );
                    }
                    break;
                }
            }
        }
        crate::progress::deregister(self.id);
        self.cq.set_completion_hook(None);
        self.qp.disconnect();
        self.iomap_close();
        let mut st = self.lock();
        self.broke(
            &mut st,
            io::ErrorKind::NotConnected,
            "the stream is closed".into(),
        );
        self.refresh(&mut st);
        self.wake_waiters(&mut st);
    }
}
