//! The final handshake of every test: the client sends DONE (messages
//! sent, checksum sum) after its last operation completed, the server
//! answers ACK (messages seen, checksum sum); both as control messages
//! (see `layout`).

use std::time::{Duration, Instant};

use iwarp::WcStatus;

use crate::params::Params;

use super::conn::Side;
use super::layout::{is_ctrl, split_wrid, ACK, DONE};
use super::wait::{check_wc, Waiter};

pub(super) fn parse_ctrl(b: &[u8]) -> Option<(u64, u64, u64)> {
    if b.len() < 24 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    Some((w(0), w(8), w(16)))
}

/// Wait for one control message of `kind` on every connection (data
/// receives must not arrive meanwhile). Returns (count, sum) per QP.
pub(super) fn collect_ctrl(
    side: &mut Side,
    kind: u64,
    waiter: &mut Waiter,
) -> Result<Vec<(u64, u64)>, String> {
    let mut got: Vec<Option<(u64, u64)>> = vec![None; side.conns.len()];
    let mut buf = Vec::new();
    waiter.progress();
    while got.iter().any(Option::is_none) {
        side.poll_send()?;
        let n = side.rcq.poll(&mut side.wcs);
        if n == 0 {
            waiter.wait_cq(&side.rcq, "waiting for the peer's final handshake message")?;
            continue;
        }
        waiter.progress();
        for k in 0..n {
            let wc = side.wcs[k];
            let (_, qi, seq) = split_wrid(wc.wr_id);
            if wc.status == WcStatus::WrFlushErr && got.get(qi).is_some_and(Option::is_some) {
                // The peer closed after its last message: expected.
                continue;
            }
            check_wc(&wc)?;
            let c = side
                .conns
                .get(qi)
                .ok_or_else(|| format!("completion for unknown QP {qi}"))?;
            c.recv_bytes(seq, wc.byte_len as usize, &mut buf);
            match parse_ctrl(&buf) {
                Some((k2, count, sum)) if is_ctrl(wc.byte_len, side.p.size) && k2 == kind => {
                    got[qi] = Some((count, sum))
                }
                _ => {
                    return Err(format!(
                    "QP {qi}: unexpected message of {} bytes while waiting for the final handshake",
                    wc.byte_len
                ))
                }
            }
        }
    }
    Ok(got.into_iter().map(|g| g.unwrap_or_default()).collect())
}

/// Wait until every control message and credit Write has completed, so
/// that the last control message has left before the QPs are torn down.
pub(super) fn drain_sends(side: &mut Side) -> Result<(), String> {
    let mut w = Waiter::new(&side.p, &side.scq);
    loop {
        let n = side.poll_send_ext(true)?;
        if side
            .conns
            .iter()
            .all(|c| c.ctrl_done >= c.ctrl_posted && c.stage_done >= c.stage_posted)
        {
            return Ok(());
        }
        if n == 0 {
            w.wait_cq(&side.scq, "waiting for the last control message to leave")?;
        } else {
            w.progress();
        }
    }
}

/// How long a passive server waits in total for the client's DONE.
pub(super) fn passive_limit(p: &Params) -> Duration {
    p.timeout * 60 + p.duration.unwrap_or_default()
}

/// Wait (bounded) for DONE on every connection and answer ACK.
pub(super) fn wait_done_and_ack(side: &mut Side, seen: Option<u64>) -> Result<(), String> {
    let p = side.p;
    let started = Instant::now();
    let mut waiter = Waiter::new(&p, &side.scq);
    loop {
        match collect_ctrl(side, DONE, &mut waiter) {
            Ok(dones) => {
                for (qi, (count, _)) in dones.iter().enumerate() {
                    side.conns[qi].send_ctrl(ACK, seen.unwrap_or(*count), 0)?;
                }
                return drain_sends(side);
            }
            Err(e)
                if e.starts_with("timed out")
                    && started.elapsed() < passive_limit(&p)
                    && side
                        .conns
                        .iter()
                        .all(|c| c.qp.state() == iwarp::QpState::Rts) => {}
            Err(e) => return Err(e),
        }
    }
}
