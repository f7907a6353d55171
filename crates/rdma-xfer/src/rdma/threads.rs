//! The dispatcher and sender threads, and the completion handling the
//! caller shares with them.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use iwarp::wait::{Interest, Token, Until, WaitSet};
use iwarp::{WcStatus, WorkCompletion};

use crate::msg::{Msg, MSG_BUF};

use super::base::{
    lock, repost_batch, wr_parts, Fail, DATA_MSG, K_CTRL_RECV, K_CTRL_SEND, K_DATA_RECV,
    K_DATA_SEND,
};
use super::shared::{Dispatch, Routes, Shared, SinkEv, ToSender};

/// The completion dispatcher: drains the CQ (first what arrived during
/// setup), then sleeps until its bell rings, until the session stops.
///
/// It waits on its bell alone, never on the CQ: the CQ's hook rings it
/// for completions that arrive while the caller's thread does not claim
/// them, and the caller rings it when it lets go of a claim with
/// completions queued (`handoff`). So a completion the caller takes never
/// wakes this thread. The session's drop rings it to stop; no deadline.
pub(super) fn dispatcher(sh: &Shared) {
    let bell = &sh.handoff.dispatcher;
    let mut set = WaitSet::new();
    set.add_fd(bell.fd(), Interest::READABLE, Token(0));
    while !sh.stop.load(Ordering::Acquire) {
        {
            let mut d = lock(&sh.dispatch);
            while let Some(wc) = sh.cq.poll_one() {
                dispatch(sh, &mut d, &wc, true);
            }
        }
        if let Err(e) = set.wait(Until::Forever) {
            sh.set_fail(Fail::Local(format!(
                "the completion thread could not wait on its eventfd: {e}"
            )));
            return;
        }
        // Drained before the CQ is: a ring from now on is not lost.
        bell.drain();
    }
}

/// Handle one completion. `on_dispatcher`: the dispatcher thread runs
/// this (pairs it completes go to the sender thread; a waiting caller
/// posts them itself).
pub(super) fn dispatch(sh: &Shared, d: &mut Dispatch, wc: &WorkCompletion, on_dispatcher: bool) {
    let Dispatch {
        routes: out,
        consumed,
    } = d;
    let (kind, qp, val) = wr_parts(wc.wr_id);
    if wc.status != WcStatus::Success {
        let why = if wc.status == WcStatus::WrFlushErr {
            if sh.failed.load(Ordering::Acquire) {
                return;
            }
            if kind == K_DATA_RECV && sh.awaiting_fin.load(Ordering::Acquire) {
                // The source has sent everything and awaits the sink's Fin,
                // which comes on the control connection; a sink closes its
                // data streams right after sending it, and their closes can
                // be seen here before the Fin (another connection, another
                // receive thread). The control connection decides: its Fin
                // comes before its own close (TCP's order), and a sink that
                // fails closes it without one (its flush fails the session,
                // with a Terminate's reason from any QP, `why_flushed`).
                tracing::debug!(
                    stream = qp,
                    "rdma-xfer: a data stream closed while the sink's Fin is awaited"
                );
                return;
            }
            sh.why_flushed()
        } else {
            format!("work request failed: {}", wc.status.as_str())
        };
        sh.set_fail(Fail::Disconnected(why));
        return;
    }
    match kind {
        K_CTRL_RECV => {
            let mut buf = vec![0u8; wc.byte_len as usize];
            sh.ctrl_msgs.read_at(val as usize * MSG_BUF, &mut buf);
            if let Err(e) = sh.post_ctrl_recv(val as u32) {
                sh.set_fail(Fail::Disconnected(e.to_string()));
                return;
            }
            match Msg::parse(&buf) {
                Ok((m, credits)) => {
                    sh.on_ctrl_recv(credits);
                    route(sh, out, m, on_dispatcher);
                }
                Err(e) => sh.set_fail(Fail::Protocol(e.to_string())),
            }
        }
        K_CTRL_SEND => sh.on_ctrl_send_done(val as u32),
        K_DATA_RECV => {
            let mut buf = [0u8; DATA_MSG];
            let len = (wc.byte_len as usize).min(DATA_MSG);
            sh.data_msgs
                .read_at(sh.data_recv_off(qp, val as u32), &mut buf[..len]);
            let Some(batch) = consumed.get_mut(qp) else {
                sh.set_fail(Fail::Protocol(format!(
                    "completion for unknown stream {qp}"
                )));
                return;
            };
            batch.push(val as u32);
            if batch.len() >= repost_batch(sh.depth) as usize {
                let r = sh.post_data_recvs(qp, batch);
                batch.clear();
                if let Err(e) = r {
                    sh.set_fail(Fail::Disconnected(e.to_string()));
                    return;
                }
            }
            match Msg::parse(&buf[..len]) {
                Ok((Msg::BlockDone { seq, len, block }, _)) => {
                    let _ = out.sink_tx.send(SinkEv::Block { seq, len, block });
                }
                Ok((m, _)) => sh.set_fail(Fail::Protocol(format!(
                    "unexpected message on a data stream: {m:?}"
                ))),
                Err(e) => sh.set_fail(Fail::Protocol(e.to_string())),
            }
        }
        K_DATA_SEND => {
            if let Some(q) = sh.queued.get(qp) {
                // Saturating: a count never goes below zero.
                let _ = q.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
            }
            let _ = out.freed_tx.send(val as u32);
        }
        _ => {}
    }
}

pub(super) fn route(sh: &Shared, out: &Routes, m: Msg, on_dispatcher: bool) {
    match m {
        Msg::Grant { transfer, grants } => {
            let via = on_dispatcher.then_some(&out.pair_tx);
            sh.offer(None, Some((transfer, grants)), via);
        }
        Msg::Fin { bytes } => {
            let _ = out.fin_tx.send(bytes);
        }
        Msg::Begin {
            transfer,
            len,
            prerequest,
        } => {
            let _ = out.sink_tx.send(SinkEv::Begin {
                transfer,
                len,
                prerequest,
            });
        }
        Msg::Request { n } => {
            let _ = out.sink_tx.send(SinkEv::Request(n));
        }
        Msg::End { blocks, bytes } => {
            let _ = out.sink_tx.send(SinkEv::End { blocks, bytes });
        }
        Msg::Abort { reason } => {
            let _ = out.sink_tx.send(SinkEv::Abort(reason.clone()));
            sh.set_fail(Fail::PeerAborted(reason));
        }
        Msg::Credit => {}
        m => sh.set_fail(Fail::Protocol(format!("unexpected control message {m:?}"))),
    }
}

/// The sender thread: posts the pairs the dispatcher completed, until the
/// session's drop sends `None` (the channel's sending end lives in
/// `Shared`, which this thread holds, so it never disconnects first).
pub(super) fn sender(sh: &Shared, pairs: &Receiver<ToSender>) {
    while let Ok(Some((b, g))) = pairs.recv() {
        if !sh.failed.load(Ordering::Acquire) {
            sh.post_block(b, g);
        }
    }
}
