//! The caller's side of a transfer: `send` (source) and `recv` (sink),
//! which handle completions themselves while they wait.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use iwarp::wait::{Until, Wake};

use crate::io::{BlockSink, BlockSource};
use crate::msg::{Grant, Msg, MAX_GRANTS};
use crate::{Error, Stats};

use super::base::{lock, Fail};
use super::session::RdmaSession;
use super::shared::{Shared, SinkEv};
use super::sink::SinkState;
use super::threads::dispatch;

impl RdmaSession {
    /// Wait on `rx` up to the session timeout, or until another thread
    /// marks the session failed. The calling thread must hold a
    /// [`Claim`](super::handoff::Claim) (`send_inner`, `recv_inner` and
    /// `confirm_inner` do), or the completions it sleeps for would ring
    /// the dispatcher instead and this wait would end only at its deadline.
    ///
    /// While it waits, the caller takes completions off the CQ itself
    /// (claimed, they wake this thread and not the dispatcher thread): the
    /// completion that ends the wait costs one wake-up of this thread
    /// instead of one of the dispatcher and another of this thread. While
    /// the caller is busy elsewhere (reading or writing a block), the
    /// dispatcher thread handles the completions.
    pub(super) fn wait<T>(&self, rx: &Receiver<T>, what: &'static str) -> Result<T, Error> {
        let sh = &*self.shared;
        let start = Instant::now();
        let until = Until::after(self.cfg.timeout);
        let mut waits = lock(&self.waits);
        loop {
            // What the peer delivered before the session failed is taken
            // first: a sink sends its Fin and then closes (its posted
            // receives flush behind the Fin, on the same connection), so a
            // failure seen first would lose a transfer that completed
            // (session 11: 4 % of runs of setup.rs under load).
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            sh.check()?;
            let mut d = lock(&sh.dispatch);
            while let Some(wc) = sh.cq.poll_one() {
                dispatch(sh, &mut d, &wc, false);
            }
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            sh.check()?;
            // Sleep holding the token: the dispatcher thread cannot be
            // halfway through routing an event to us meanwhile. One wait to
            // the deadline: a completion (claimed, it makes the CQ's
            // descriptor readable) or the caller's bell ends it.
            match waits.wait(until) {
                Ok(Wake::Ready(_)) => {}
                Ok(Wake::Timeout) => {
                    sh.set_fail(Fail::Timeout(what, start.elapsed()));
                    return Err(sh.check().unwrap_err());
                }
                Err(e) => {
                    sh.set_fail(Fail::Local(format!("waiting for completions: {e}")));
                    return Err(sh.check().unwrap_err());
                }
            }
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
        let mut claim = Some(sh.handoff.claim(&sh.cq));
        loop {
            let idx = match free.pop() {
                Some(i) => i,
                None => {
                    let i = self.wait(&self.freed_rx, "a local block to be sent")?;
                    self.logger.add(u64::from(lens[i as usize]));
                    i
                }
            };
            // The pool grows as the transfer needs blocks (`free` hands out
            // new indices in order): a small file registers one block, and
            // a large one starts sending after its first block, not after
            // the whole zeroed pool (issue 27).
            while self.src_pool.len() <= idx as usize {
                let mr = self.src_block().map_err(|e| self.fail_local(e))?;
                self.src_pool.push(mr);
            }
            let mr = &self.src_pool[idx as usize];
            // SAFETY: block `idx` is in no outstanding work request (it is
            // free: never posted, or its BlockDone Send completed, which
            // on one send queue follows its Write), and its region has
            // local access only, so the peer cannot write it either.
            let buf = unsafe { mr.as_mut_slice() };
            // A read may take long (a disk): the dispatcher thread takes
            // over the completions meanwhile.
            self.poll_completions();
            drop(claim.take());
            let n = src.read_block(buf).map_err(|e| self.fail_local(e))?;
            claim = Some(sh.handoff.claim(&sh.cq));
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
        // From here the control connection alone decides the outcome (a
        // data stream's close is the sink's, after its Fin: `dispatch`).
        self.shared.awaiting_fin.store(true, Ordering::Release);
        self.shared.ctrl_send(Msg::End { blocks: seq, bytes });
        // Collect the remaining Send completions so every block is free for
        // the next transfer (local: each means its bytes went to TCP). The
        // sink's Fin is awaited by `confirm` (Transport::send_unconfirmed).
        while free.len() < depth as usize {
            let i = self.wait(&self.freed_rx, "the last sends to complete")?;
            self.logger.add(u64::from(lens[i as usize]));
            free.push(i);
        }
        self.unconfirmed = Some(bytes);
        Ok(Stats {
            bytes,
            blocks: seq,
            elapsed: start.elapsed(),
        })
    }

    /// Wait for the sink's `Fin` of the last transfer sent, if not yet.
    pub(super) fn confirm_inner(&mut self) -> Result<(), Error> {
        let Some(bytes) = self.unconfirmed.take() else {
            return Ok(());
        };
        let sh = self.shared.clone();
        let _claim = sh.handoff.claim(&sh.cq);
        let got = self.wait(&self.fin_rx, "the sink to finish");
        self.shared.awaiting_fin.store(false, Ordering::Release);
        let got = got?;
        if got != bytes {
            self.shared.set_fail(Fail::Protocol(format!(
                "sink acknowledged {got} bytes, {bytes} were sent"
            )));
            return Err(self.shared.check().unwrap_err());
        }
        Ok(())
    }

    /// Grant the sink's blocks for the peer's next transfer before its
    /// `Begin`, when both sides have [`crate::hello::feature::PREGRANT`]
    /// (else nothing: the grants follow the `Begin`).
    pub(super) fn prepare_recv_inner(&mut self, len: Option<u64>) -> Result<(), Error> {
        if self.cfg.features & crate::hello::feature::PREGRANT == 0 || self.pre.is_some() {
            return Ok(());
        }
        self.shared.check()?;
        if self.sink_pool.is_empty() {
            self.sink_pool = self.sink_pool()?;
        }
        // The feature: a pregrant answers the whole pool's pre-request
        // that the Begin will carry.
        let depth = self.cfg.pool_depth();
        let mut st = SinkState::new(&self.cfg, self.received + 1, len, depth);
        let mut batch = Vec::new();
        self.grant_wanted(&mut st, &mut batch)?;
        self.send_grants(st.transfer, &mut batch);
        tracing::debug!(
            transfer = st.transfer,
            window = st.tune.window(),
            "rdma-xfer: sink blocks granted ahead of the source's Begin"
        );
        self.pre = Some(st);
        Ok(())
    }

    /// Grant every block `st` lets go now, sending full batches.
    fn grant_wanted(&mut self, st: &mut SinkState, batch: &mut Vec<Grant>) -> Result<(), Error> {
        while let Some(b) = st.w.next_grant() {
            // Registered again (a new STag) if it was read since its last
            // grant.
            let (rkey, addr) = self.sink_pool[b as usize]
                .grant(&self.pd)
                .map_err(|e| self.fail_local(e))?;
            st.granted_at[b as usize] = Some(Instant::now());
            batch.push(Grant {
                block: b,
                rkey,
                addr,
            });
            if batch.len() == MAX_GRANTS {
                self.send_grants(st.transfer, batch);
            }
        }
        Ok(())
    }

    fn send_grants(&self, transfer: u64, batch: &mut Vec<Grant>) {
        if !batch.is_empty() {
            self.shared.ctrl_send(Msg::Grant {
                transfer,
                grants: std::mem::take(batch),
            });
        }
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
        let mut claim = Some(sh.handoff.claim(&sh.cq));
        let pre = self.pre.take();
        // With blocks granted ahead, the source may use them before its
        // Begin arrives: a BlockDone rides on a data stream, the Begin on
        // the control connection, and nothing orders the two (RFC 5040
        // §5.5 orders messages within one stream only). They wait here.
        let mut early = std::collections::VecDeque::new();
        let (transfer, len, prerequest) = loop {
            match self.wait(&self.sink_rx, "the source to begin")? {
                SinkEv::Begin {
                    transfer,
                    len,
                    prerequest,
                } => break (transfer, len, prerequest),
                SinkEv::Abort(r) => return Err(Error::PeerAborted(r)),
                ev @ SinkEv::Block { .. } if pre.is_some() => early.push_back(ev),
                ev => tracing::debug!(?ev, "stale event before Begin ignored"),
            }
        };
        let proto = |s: &Shared, m: String| {
            s.ctrl_send(Msg::Abort { reason: m.clone() });
            s.set_fail(Fail::Protocol(m));
            s.check().unwrap_err()
        };
        self.received = transfer;
        let start = Instant::now();
        self.logger.begin(len);
        let mut st = match pre {
            Some(mut st) if st.transfer == transfer => {
                // Granted ahead as if the Begin asked for the whole pool;
                // its length may let the whole transfer be granted now.
                st.start_at(depth, self.cfg.block_size, len, self.cfg.autotune);
                st
            }
            Some(st) => {
                return Err(proto(
                    &self.shared,
                    format!(
                        "Begin of transfer {transfer}, but the sink granted blocks for transfer {} \
                         (a source numbers its transfers 1, 2, ... in a session)",
                        st.transfer
                    ),
                ))
            }
            None => SinkState::new(&self.cfg, transfer, len, prerequest),
        };
        let mut batch: Vec<Grant> = Vec::new();
        loop {
            // Grant what is free and wanted; send the batch when it is full
            // or when there is nothing else to do.
            self.grant_wanted(&mut st, &mut batch)?;
            if let Some(done) = st.w.finished() {
                let (blocks, bytes) = done.map_err(|m| proto(&self.shared, m))?;
                drop(claim.take());
                sink.finish().map_err(|e| self.fail_local(e))?;
                self.shared.ctrl_send(Msg::Fin { bytes });
                return Ok(Stats {
                    bytes,
                    blocks,
                    elapsed: start.elapsed(),
                });
            }
            self.poll_completions();
            let ev = match early.pop_front() {
                Some(ev) => ev,
                None => match self.sink_rx.try_recv() {
                    Ok(ev) => ev,
                    Err(_) => {
                        self.send_grants(transfer, &mut batch);
                        self.wait(&self.sink_rx, "the next block")?
                    }
                },
            };
            match ev {
                SinkEv::Request(n) => st.w.on_request(n),
                SinkEv::Block { seq, len, block } => {
                    st.w.on_block_done(seq, len, block)
                        .map_err(|m| proto(&self.shared, m))?;
                    // A grant to its BlockDone: a round trip plus one
                    // block's transmission (Autotune keeps the minimum).
                    if let Some(t) = st.granted_at.get_mut(block as usize).and_then(Option::take) {
                        st.tune.on_rtt(t.elapsed());
                    }
                    while let Some((b, l)) = st.w.next_ready() {
                        // The source says (BlockDone, behind its Write on
                        // the same stream) that it is done with block `b`.
                        // A hostile one may go on writing: end its access
                        // first, so the bytes the sink gets stay put.
                        self.sink_pool[b as usize].retire();
                        let block = self.sink_pool[b as usize].contents();
                        let data = &block.expect("a retired block is readable")[..l as usize];
                        self.poll_completions();
                        drop(claim.take());
                        sink.write_block(data).map_err(|e| self.fail_local(e))?;
                        claim = Some(sh.handoff.claim(&sh.cq));
                        self.logger.add(u64::from(l));
                        st.w.written(b, l);
                        st.tune.on_delivered(u64::from(l));
                    }
                    if self.cfg.autotune {
                        if let Some(c) = st.tune.tick(start.elapsed()) {
                            tracing::info!(
                                from = c.from,
                                to = c.to,
                                pool = depth,
                                why = %c.why,
                                "rdma-xfer: window (blocks in flight) changed"
                            );
                            st.w.set_limit(c.to);
                        }
                    }
                }
                SinkEv::End { blocks, bytes } => st.w.on_end(blocks, bytes),
                SinkEv::Abort(r) => return Err(Error::PeerAborted(r)),
                SinkEv::Begin { .. } => {
                    return Err(proto(&self.shared, "Begin during a transfer".into()))
                }
            }
        }
    }
}
