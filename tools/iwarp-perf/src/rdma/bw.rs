//! The bandwidth tests: write_bw, read_bw, send_bw (client and server).

use std::time::Instant;

use iwarp::{SendWr, SgList, WrOpcode};

use crate::params::Test;
use crate::pattern::{self, Verifier};

use crate::report::ClientResult;

use super::conn::{fill_slot, stamp, Side};
use super::finish::{collect_ctrl, drain_sends, parse_ctrl, passive_limit};
use super::layout::{data_slots, is_ctrl, rq_depth, split_wrid, wrid, Role, ACK, DONE, K_DATA};
use super::wait::{check_wc, Waiter};

#[derive(Default, Clone)]
pub(super) struct BwState {
    posted: u64,
    completed: u64,
    sent_sum: u64,
    /// Reads verified (read_bw `--integrity`).
    verified: u64,
}

/// The client of write_bw / read_bw / send_bw.
pub(super) fn client_bw(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let slots = data_slots(&p) as u64;
    let window = match p.test {
        Test::ReadBw => p.depth.min(side.ord()),
        _ => p.depth,
    } as u64;
    // perftest signals every Nth request; the last one of a fixed count is
    // always signaled, and in duration mode the DONE message's completion
    // covers the unsignaled tail.
    let sig_every = if p.integrity { 1 } else { (window / 4).max(1) };
    // Credits: send_bw always, write_bw with --integrity.
    let credit_floor = match p.test {
        Test::SendBw => Some(u64::from(rq_depth(&p, Role::Server))),
        Test::WriteBw if p.integrity => Some(slots),
        _ => None,
    };
    let mut verifiers: Vec<Verifier> = (0..p.qps).map(|_| Verifier::new(p.corrupt)).collect();
    let mut st = vec![BwState::default(); side.conns.len()];
    let mut wrs: Vec<SendWr> = Vec::with_capacity(64);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut scratch = Vec::new();
    let cpu0 = crate::report::cpu_seconds();
    let start = Instant::now();
    let end_at = p.duration.map(|d| start + d);
    let mut stop_posting = false;
    loop {
        let mut progress = false;
        let mut credit_blocked = false;
        if !stop_posting {
            if let Some(t) = end_at {
                stop_posting = Instant::now() >= t;
            }
        }
        for (ci, c) in side.conns.iter().enumerate() {
            let s = &mut st[ci];
            let credit = credit_floor.map(|f| c.credit(f));
            wrs.clear();
            // In duration mode posting stops at a signaling boundary, so
            // the last request posted is a signaled one.
            while s.posted - s.completed < window
                && wrs.len() < 64
                && !(stop_posting && s.posted % sig_every == 0)
            {
                let i = s.posted;
                if end_at.is_none() && i >= p.iters {
                    break;
                }
                if let Some(cr) = credit {
                    if i >= cr {
                        credit_blocked = true;
                        break;
                    }
                }
                let slot = (i % slots) as usize;
                let last_one = end_at.is_none() && i + 1 == p.iters;
                let signaled = last_one || (i + 1) % sig_every == 0;
                let opcode = match p.test {
                    Test::WriteBw => WrOpcode::RdmaWrite {
                        remote_addr: c.remote.data_addr + (slot * size) as u64,
                        rkey: c.remote.data_rkey,
                    },
                    Test::ReadBw => WrOpcode::RdmaRead {
                        remote_addr: c.remote.data_addr + (slot * size) as u64,
                        rkey: c.remote.data_rkey,
                    },
                    _ => WrOpcode::Send,
                };
                if p.integrity && p.test != Test::ReadBw {
                    let st_byte = (p.test == Test::WriteBw).then(|| stamp(i, slots));
                    let crc = fill_slot(
                        c,
                        size,
                        slot,
                        pattern::seed(c.idx, 0, i),
                        st_byte,
                        &mut scratch,
                    );
                    s.sent_sum = s.sent_sum.wrapping_add(u64::from(crc));
                }
                wrs.push(SendWr {
                    wr_id: wrid(K_DATA, c.idx, i),
                    opcode,
                    sgl: SgList::single(c.data.sge(slot * size, size)),
                    signaled,
                    solicited: false,
                });
                s.posted += 1;
            }
            if !wrs.is_empty() {
                c.qp.post_send_list(&wrs)
                    .map_err(|e| format!("QP {}: post_send: {e}", c.idx))?;
                progress = true;
            }
        }
        let n = side.poll_send()?;
        for k in 0..n {
            let wc = side.wcs[k];
            let (kind, qi, seq) = split_wrid(wc.wr_id);
            if kind != K_DATA {
                continue;
            }
            let s = &mut st[qi];
            let upto = seq + 1;
            if p.integrity && p.test == Test::ReadBw {
                let c = &side.conns[qi];
                for i in s.completed.max(s.verified)..upto {
                    let slot = (i % slots) as usize;
                    side.scratch.resize(size, 0);
                    c.data.read_at(slot * size, &mut side.scratch);
                    verifiers[qi].check(
                        "RDMA Read",
                        i,
                        &mut side.scratch,
                        pattern::seed(c.idx, 1, slot as u64),
                        None,
                    )?;
                    s.verified = i + 1;
                }
            }
            s.completed = s.completed.max(upto);
        }
        if n > 0 {
            progress = true;
        }
        let all_posted = st.iter().all(|s| match end_at {
            Some(_) => stop_posting && s.posted % sig_every == 0,
            None => s.posted >= p.iters,
        });
        if all_posted && st.iter().all(|s| s.completed == s.posted) {
            break;
        }
        if progress {
            waiter.progress();
            continue;
        }
        // Blocked on credits: they arrive as RDMA Writes into memory, with
        // no completion here (and the requests still outstanding may all be
        // unsignaled), so poll the credit word.
        if credit_blocked {
            waiter.idle("waiting for credits from the receiver")?;
        } else {
            waiter.wait_cq(&side.scq, "waiting for send completions")?;
        }
    }
    // The final handshake: DONE (messages, checksum sum) on every
    // connection, then the ACKs. send_bw needs a credit for DONE too.
    for (ci, c) in side.conns.iter_mut().enumerate() {
        if let Some(f) = credit_floor.filter(|_| p.test == Test::SendBw) {
            let mut w = Waiter::new(&p, &side.scq);
            while st[ci].posted >= c.credit(f) {
                w.idle("waiting for a credit for the final DONE message")?;
            }
        }
        c.send_ctrl(DONE, st[ci].posted, st[ci].sent_sum)?;
    }
    let acks = collect_ctrl(side, ACK, &mut waiter)?;
    let elapsed = start.elapsed();
    let span_cpu_s = Some(crate::report::cpu_seconds() - cpu0);
    drain_sends(side)?;
    let mut verified = 0;
    for (ci, (count, sum)) in acks.iter().enumerate() {
        if *count != st[ci].posted {
            return Err(format!(
                "QP {ci}: the server saw {count} messages, we sent {}",
                st[ci].posted
            ));
        }
        if p.integrity && p.test != Test::ReadBw {
            if *sum != st[ci].sent_sum {
                return Err(format!(
                    "INTEGRITY FAILURE: QP {ci}: checksum sum at the receiver {sum:#x}, at the sender {:#x}",
                    st[ci].sent_sum
                ));
            }
            verified += count;
        }
    }
    verified += verifiers.iter().map(|v| v.checked).sum::<u64>();
    Ok(ClientResult {
        msgs: st.iter().map(|s| s.posted).sum(),
        elapsed,
        lat: None,
        verified,
        span_cpu_s,
    })
}

#[derive(Default, Clone)]
pub(super) struct RxState {
    /// Next message to see.
    expected: u64,
    /// DONE (count, sum) once received.
    done: Option<(u64, u64)>,
    acked: bool,
}

/// The server of write_bw / read_bw / send_bw.
pub(super) fn server_bw(side: &mut Side) -> Result<u64, String> {
    let p = side.p;
    let slots = data_slots(&p) as u64;
    let size = p.size;
    let check_writes = p.integrity && p.test == Test::WriteBw;
    let grant_step = match p.test {
        Test::SendBw => (u64::from(rq_depth(&p, Role::Server)) / 4).max(1),
        _ => (slots / 2).max(1),
    };
    let mut st = vec![RxState::default(); side.conns.len()];
    let mut verifiers: Vec<Verifier> = (0..p.qps).map(|_| Verifier::new(p.corrupt)).collect();
    let mut waiter = Waiter::new(&p, &side.scq);
    let passive_limit = passive_limit(&p);
    let started = Instant::now();
    let mut buf = Vec::new();
    loop {
        let mut progress = false;
        let n = side.rcq.poll(&mut side.wcs);
        for k in 0..n {
            let wc = side.wcs[k];
            check_wc(&wc)?;
            let (_, qi, seq) = split_wrid(wc.wr_id);
            let s = &mut st[qi];
            let c = &mut side.conns[qi];
            if is_ctrl(wc.byte_len, size) {
                c.recv_bytes(seq, wc.byte_len as usize, &mut buf);
                match parse_ctrl(&buf) {
                    Some((DONE, count, sum)) => s.done = Some((count, sum)),
                    _ => return Err(format!("QP {qi}: malformed control message")),
                }
                continue;
            }
            if p.test != Test::SendBw {
                return Err(format!(
                    "QP {qi}: unexpected Send of {} bytes in {}",
                    wc.byte_len, p.test
                ));
            }
            if wc.byte_len as usize != size {
                return Err(format!(
                    "QP {qi}: message {} has {} bytes, expected {size}",
                    s.expected, wc.byte_len
                ));
            }
            if p.integrity {
                c.recv_bytes(seq, size, &mut buf);
                verifiers[qi].check(
                    "Send",
                    s.expected,
                    &mut buf,
                    pattern::seed(c.idx, 0, s.expected),
                    None,
                )?;
            }
            s.expected += 1;
            c.post_recv()?;
        }
        if n > 0 {
            progress = true;
        }
        if check_writes {
            for (qi, c) in side.conns.iter().enumerate() {
                let s = &mut st[qi];
                let limit = s.done.map_or(u64::MAX, |d| d.0);
                while s.expected < limit {
                    let i = s.expected;
                    let slot = (i % slots) as usize;
                    let want = stamp(i, slots);
                    if c.peek_data(slot * size + size - 1) != want {
                        break;
                    }
                    buf.resize(size, 0);
                    c.data.read_at(slot * size, &mut buf);
                    verifiers[qi].check(
                        "RDMA Write",
                        i,
                        &mut buf,
                        pattern::seed(c.idx, 0, i),
                        Some(want),
                    )?;
                    s.expected += 1;
                    progress = true;
                }
            }
        }
        // Credits: posted receives (send_bw) or verified + slots (write_bw).
        for (qi, c) in side.conns.iter_mut().enumerate() {
            let v = match p.test {
                Test::SendBw => c.recv_posted,
                Test::WriteBw if check_writes => st[qi].expected + slots,
                _ => continue,
            };
            if st[qi].done.is_none() && c.grant(v, grant_step, !progress)? {
                progress = true;
            }
        }
        side.poll_send()?;
        for (qi, c) in side.conns.iter_mut().enumerate() {
            let s = &mut st[qi];
            if let (Some((count, _)), false) = (s.done, s.acked) {
                let seen = match p.test {
                    Test::SendBw => s.expected,
                    Test::WriteBw if check_writes => s.expected,
                    _ => count,
                };
                if seen == count {
                    c.send_ctrl(ACK, seen, verifiers[qi].sum)?;
                    s.acked = true;
                    progress = true;
                } else if seen > count {
                    return Err(format!(
                        "QP {qi}: received {seen} messages, the client sent {count}"
                    ));
                }
            }
        }
        if st.iter().all(|s| s.acked) {
            break;
        }
        if progress {
            waiter.progress();
            continue;
        }
        let grants_pending = side.conns.iter().any(|c| {
            c.stage_done < c.stage_posted || (p.test == Test::SendBw && c.granted < c.recv_posted)
        });
        if check_writes || grants_pending {
            waiter.idle("waiting for RDMA Writes or credit Writes to complete")?;
        } else {
            // Passive: wait as long as the client runs (bounded).
            let mut w = Waiter::new(&p, &side.scq);
            if let Err(e) = w.wait_cq(&side.rcq, "waiting for data") {
                if started.elapsed() > passive_limit
                    || side
                        .conns
                        .iter()
                        .any(|c| c.qp.state() != iwarp::QpState::Rts)
                {
                    return Err(e);
                }
            }
        }
    }
    drain_sends(side)?;
    Ok(verifiers.iter().map(|v| v.checked).sum())
}
