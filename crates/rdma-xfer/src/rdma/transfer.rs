//! The caller's side of a transfer: `send` (source) and `recv` (sink),
//! which handle completions themselves while they wait.

use std::sync::mpsc::Receiver;
use std::time::Instant;

use crate::io::{BlockSink, BlockSource};
use crate::msg::{Grant, Msg, MAX_GRANTS};
use crate::{Error, Stats};

use super::*;

impl RdmaSession {
    /// Wait on `rx` up to the session timeout, watching the failure flag.
    /// The calling thread must hold an [`Attendance`](iwarp::Attendance)
    /// on the CQ (`send_inner` and `recv_inner` do), or it would sleep in
    /// the background like the dispatcher thread.
    ///
    /// While it waits, the caller takes completions off the CQ itself (the
    /// CQ wakes the newest attending waiter only, so the dispatcher thread
    /// sleeps meanwhile): the completion that ends the wait costs one
    /// wake-up of this thread instead of one of the dispatcher and another
    /// of this thread. While the caller is busy elsewhere (reading or
    /// writing a block), the dispatcher thread handles the completions.
    pub(super) fn wait<T>(&self, rx: &Receiver<T>, what: &'static str) -> Result<T, Error> {
        let sh = &*self.shared;
        let start = Instant::now();
        loop {
            sh.check()?;
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            let mut d = lock(&sh.dispatch);
            while let Some(wc) = sh.cq.poll_one() {
                dispatch(sh, &mut d, &wc, false);
            }
            sh.check()?;
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            let waited = start.elapsed();
            if waited >= self.cfg.timeout {
                sh.set_fail(Fail::Timeout(what, waited));
                return Err(sh.check().unwrap_err());
            }
            // Sleep holding the token: the dispatcher thread cannot be
            // halfway through routing an event to us meanwhile. The caller
            // holds an `Attendance`, so this sleeps in the foreground.
            let _ = sh.cq.wait(TICK.min(self.cfg.timeout - waited));
        }
    }

    pub(super) fn fail_local(&self, e: std::io::Error) -> Error {
        let reason = e.to_string();
        self.shared.ctrl_send(Msg::Abort {
            reason: reason.clone(),
        });
        self.shared.set_fail(Fail::Local(reason));
        Error::Local(e)
    }

    pub(super) fn send_inner(&mut self, src: &mut dyn BlockSource) -> Result<Stats, Error> {
        self.shared.check()?;
        if self.src_pool.is_empty() {
            self.src_pool = self.src_pool()?;
        }
        let start = Instant::now();
        let depth = self.cfg.pool_depth();
        self.transfer += 1;
        let transfer = self.transfer;
        // Grants carry their transfer: the pairing stage drops stale ones
        // (set before Begin goes out, so none of this transfer's is early).
        lock(&self.shared.pairing).begin(transfer);
        self.shared.ctrl_send(Msg::Begin {
            transfer,
            len: src.len_hint(),
            prerequest: depth,
        });
        let mut free: Vec<u32> = (0..depth).rev().collect();
        let mut lens = vec![0u32; depth as usize];
        let (mut seq, mut bytes) = (0u64, 0u64);
        // This thread handles the completions between its short steps (see
        // `poll_completions`); the dispatcher thread only while it reads.
        let sh = self.shared.clone();
        let mut attend = Some(sh.cq.attend());
        loop {
            let idx = match free.pop() {
                Some(i) => i,
                None => {
                    let i = self.wait(&self.freed_rx, "a local block to be sent")?;
                    self.logger.add(u64::from(lens[i as usize]));
                    i
                }
            };
            let mr = &self.src_pool[idx as usize];
            // SAFETY: block `idx` is in no outstanding work request (it is
            // free: never posted, or its BlockDone Send completed, which
            // on one send queue follows its Write), and its region has
            // local access only, so the peer cannot write it either.
            let buf = unsafe { mr.as_mut_slice() };
            // A read may take long (a disk): the dispatcher thread takes
            // over the completions meanwhile.
            self.poll_completions();
            drop(attend.take());
            let n = src.read_block(buf).map_err(|e| self.fail_local(e))?;
            attend = Some(sh.cq.attend());
            if n == 0 {
                free.push(idx);
                break;
            }
            lens[idx as usize] = n as u32;
            self.shared
                .offer(Some((mr.sge(0, n), seq, idx)), None, None);
            self.poll_completions();
            seq += 1;
            bytes += n as u64;
        }
        self.shared.ctrl_send(Msg::End { blocks: seq, bytes });
        let got = self.wait(&self.fin_rx, "the sink to finish")?;
        if got != bytes {
            self.shared.set_fail(Fail::Protocol(format!(
                "sink acknowledged {got} bytes, {bytes} were sent"
            )));
            return Err(self.shared.check().unwrap_err());
        }
        // Collect the remaining Send completions so every block is free for
        // the next transfer.
        while free.len() < depth as usize {
            let i = self.wait(&self.freed_rx, "the last sends to complete")?;
            self.logger.add(u64::from(lens[i as usize]));
            free.push(i);
        }
        Ok(Stats {
            bytes,
            blocks: seq,
            elapsed: start.elapsed(),
        })
    }

    /// Handle the completions waiting in the CQ from this thread, unless
    /// another thread is at it; never blocks for long.
    pub(super) fn poll_completions(&self) {
        let sh = &*self.shared;
        if sh.cq.is_empty() {
            return;
        }
        if let Ok(mut d) = sh.dispatch.try_lock() {
            while let Some(wc) = sh.cq.poll_one() {
                dispatch(sh, &mut d, &wc, false);
            }
        }
    }

    pub(super) fn recv_inner(&mut self, sink: &mut dyn BlockSink) -> Result<Stats, Error> {
        self.shared.check()?;
        if self.sink_pool.is_empty() {
            self.sink_pool = self.sink_pool()?;
        }
        let depth = self.cfg.pool_depth();
        // As in `send_inner`: this thread handles the completions (from
        // here on, so that it waits for Begin in the foreground too), the
        // dispatcher thread while it writes.
        let sh = self.shared.clone();
        let mut attend = Some(sh.cq.attend());
        let (transfer, len, prerequest) = loop {
            match self.wait(&self.sink_rx, "the source to begin")? {
                SinkEv::Begin {
                    transfer,
                    len,
                    prerequest,
                } => break (transfer, len, prerequest),
                SinkEv::Abort(r) => return Err(Error::PeerAborted(r)),
                ev => tracing::debug!(?ev, "stale event before Begin ignored"),
            }
        };
        let start = Instant::now();
        self.logger.begin(len);
        let mut w = SinkWindow::new(depth, self.cfg.block_size, prerequest);
        // The window inside the pool (crate::tune): never under today's
        // fixed default (16 MiB, 2-4 blocks per stream), grown while it
        // limits, shrunk when the rate falls.
        let streams = self.cfg.streams.max(1);
        let floor = (crate::tune::LAN_WINDOW / u64::from(self.cfg.block_size.max(1)))
            .clamp(u64::from(2 * streams), u64::from(4 * streams)) as u32;
        let mut tune = crate::tune::Autotune::new(depth, floor, self.cfg.block_size);
        // A transfer that fits the pool is granted whole at once: the
        // first round of grants covers it, no growing (issue 27 §3).
        tune.start_at(crate::tune::first_window(
            tune.window(),
            depth,
            self.cfg.block_size,
            len,
        ));
        if self.cfg.autotune {
            w.set_limit(tune.window());
        }
        let mut granted_at: Vec<Option<Instant>> = vec![None; depth as usize];
        let mut batch: Vec<Grant> = Vec::new();
        let proto = |s: &Shared, m: String| {
            s.ctrl_send(Msg::Abort { reason: m.clone() });
            s.set_fail(Fail::Protocol(m));
            s.check().unwrap_err()
        };
        loop {
            // Grant what is free and wanted; send the batch when it is full
            // or when there is nothing else to do.
            while let Some(b) = w.next_grant() {
                // Registered again (a new STag) if it was read since its
                // last grant.
                let (rkey, addr) = self.sink_pool[b as usize]
                    .grant(&self.pd)
                    .map_err(|e| self.fail_local(e))?;
                granted_at[b as usize] = Some(Instant::now());
                batch.push(Grant {
                    block: b,
                    rkey,
                    addr,
                });
                if batch.len() == MAX_GRANTS {
                    self.shared.ctrl_send(Msg::Grant {
                        transfer,
                        grants: std::mem::take(&mut batch),
                    });
                }
            }
            if let Some(done) = w.finished() {
                let (blocks, bytes) = done.map_err(|m| proto(&self.shared, m))?;
                drop(attend.take());
                sink.finish().map_err(|e| self.fail_local(e))?;
                self.shared.ctrl_send(Msg::Fin { bytes });
                return Ok(Stats {
                    bytes,
                    blocks,
                    elapsed: start.elapsed(),
                });
            }
            self.poll_completions();
            let ev = match self.sink_rx.try_recv() {
                Ok(ev) => ev,
                Err(_) => {
                    if !batch.is_empty() {
                        self.shared.ctrl_send(Msg::Grant {
                            transfer,
                            grants: std::mem::take(&mut batch),
                        });
                    }
                    self.wait(&self.sink_rx, "the next block")?
                }
            };
            match ev {
                SinkEv::Request(n) => w.on_request(n),
                SinkEv::Block { seq, len, block } => {
                    w.on_block_done(seq, len, block)
                        .map_err(|m| proto(&self.shared, m))?;
                    // A grant to its BlockDone: a round trip plus one
                    // block's transmission (Autotune keeps the minimum).
                    if let Some(t) = granted_at.get_mut(block as usize).and_then(Option::take) {
                        tune.on_rtt(t.elapsed());
                    }
                    while let Some((b, l)) = w.next_ready() {
                        // The source says (BlockDone, behind its Write on
                        // the same stream) that it is done with block `b`.
                        // A hostile one may go on writing: end its access
                        // first, so the bytes the sink gets stay put.
                        self.sink_pool[b as usize].retire();
                        let block = self.sink_pool[b as usize].contents();
                        let data = &block.expect("a retired block is readable")[..l as usize];
                        self.poll_completions();
                        drop(attend.take());
                        sink.write_block(data).map_err(|e| self.fail_local(e))?;
                        attend = Some(sh.cq.attend());
                        self.logger.add(u64::from(l));
                        w.written(b, l);
                        tune.on_delivered(u64::from(l));
                    }
                    if self.cfg.autotune {
                        if let Some(c) = tune.tick(start.elapsed()) {
                            tracing::info!(
                                from = c.from,
                                to = c.to,
                                pool = depth,
                                why = %c.why,
                                "rdma-xfer: window (blocks in flight) changed"
                            );
                            w.set_limit(c.to);
                        }
                    }
                }
                SinkEv::End { blocks, bytes } => w.on_end(blocks, bytes),
                SinkEv::Abort(r) => return Err(Error::PeerAborted(r)),
                SinkEv::Begin { .. } => {
                    return Err(proto(&self.shared, "Begin during a transfer".into()))
                }
            }
        }
    }
}
