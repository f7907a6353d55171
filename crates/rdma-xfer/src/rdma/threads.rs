//! The dispatcher and sender threads, and the completion handling the
//! caller shares with them.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};

use iwarp::{WcStatus, WorkCompletion};

use crate::msg::{Grant, Msg, MSG_BUF};

use super::base::{
    lock, repost_batch, wr_parts, Fail, DATA_MSG, K_CTRL_RECV, K_CTRL_SEND, K_DATA_RECV,
    K_DATA_SEND, TICK,
};
use super::shared::{Dispatch, Filled, Routes, Shared, SinkEv};

/// The completion dispatcher: drains the CQ until the session stops,
/// starting with what setup stashed.
pub(super) fn dispatcher(sh: &Shared) {
    while !sh.stop.load(Ordering::Acquire) {
        // This thread never attends, so under `WakePolicy::Newest` it
        // sleeps in the background: a completion wakes it only while the
        // caller's thread neither waits nor is about to poll. No polling
        // phase (the CQ's `spin` is zero, see `Setup::new`).
        if !sh.cq.wait(TICK).unwrap_or(false) {
            continue;
        }
        let mut d = lock(&sh.dispatch);
        while let Some(wc) = sh.cq.poll_one() {
            dispatch(sh, &mut d, &wc, true);
        }
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

/// The sender thread: posts the pairs the dispatcher completed.
pub(super) fn sender(sh: &Shared, pairs: &Receiver<(Filled, Grant)>) {
    while !sh.stop.load(Ordering::Acquire) {
        match pairs.recv_timeout(TICK) {
            Ok((b, g)) => {
                if !sh.failed.load(Ordering::Acquire) {
                    sh.post_block(b, g);
                }
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}
