//! The latency tests: write_lat, read_lat, send_lat, and the iteration
//! control they share with the TCP side.

use std::time::{Duration, Instant};

use iwarp::{SendWr, SgList, WrOpcode};

use crate::params::Params;
use crate::pattern::{self, Verifier};
use crate::report::LatStats;

use crate::report::ClientResult;

use super::conn::{fill_slot, Conn, Side};
use super::finish::{collect_ctrl, drain_sends, parse_ctrl, passive_limit, wait_done_and_ack};
use super::layout::{is_ctrl, split_wrid, wrid, ACK, DONE, K_DATA, SQ_EXTRA};
use super::wait::{check_wc, Waiter};

/// Warm-up round trips of the latency tests (not recorded).
pub fn warmup(p: &Params) -> u64 {
    if p.duration.is_some() {
        100
    } else {
        p.iters.min(100)
    }
}

/// Iteration control of a latency loop: `warmup` untimed iterations, then
/// a fixed count or a duration, timed from the end of the warm-up.
#[derive(Debug)]
pub struct LatClock {
    warm: u64,
    iters: u64,
    duration: Option<Duration>,
    from: Instant,
}

impl LatClock {
    pub fn new(p: &Params) -> LatClock {
        LatClock {
            warm: warmup(p),
            iters: p.iters,
            duration: p.duration,
            from: Instant::now(),
        }
    }

    /// Call at the top of iteration `i`; false once the run is over.
    pub fn keep_going(&mut self, i: u64) -> bool {
        if i == self.warm {
            self.from = Instant::now();
        }
        match self.duration {
            Some(d) => i < self.warm || self.from.elapsed() < d,
            None => i < self.warm + self.iters,
        }
    }

    /// Time since the warm-up ended.
    pub fn elapsed(&self) -> Duration {
        self.from.elapsed()
    }
}

/// read_lat server: nothing to do until DONE.
pub(super) fn server_passive(side: &mut Side) -> Result<u64, String> {
    wait_done_and_ack(side, None)?;
    Ok(0)
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Keep the send queue from filling in the latency tests (every request is
/// signaled; completions are reaped lazily).
pub(super) fn reap_lat(
    side: &mut Side,
    outstanding: &mut u64,
    waiter: &mut Waiter,
) -> Result<(), String> {
    loop {
        let n = side.poll_send()?;
        *outstanding = outstanding.saturating_sub(n as u64);
        if *outstanding < u64::from(SQ_EXTRA) {
            return Ok(());
        }
        if n == 0 {
            waiter.wait_cq(&side.scq, "waiting for send completions")?;
        }
    }
}

/// write_lat client: Write our slot 0 into the peer's slot 1 with a stamp in
/// the last byte, poll our slot 1's last byte for the peer's echo.
pub(super) fn client_write_lat(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let warm = warmup(&p);
    let mut samples = Vec::with_capacity(p.iters.min(1 << 24) as usize);
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let mut clock = LatClock::new(&p);
    let mut i = 0u64;
    while clock.keep_going(i) {
        let st = (i % 255 + 1) as u8;
        let c = &side.conns[0];
        if p.integrity {
            fill_slot(
                c,
                size,
                0,
                pattern::seed(c.idx, 0, i),
                Some(st),
                &mut scratch,
            );
        } else {
            c.data.write_at(size - 1, &[st]);
        }
        let t0 = Instant::now();
        post_echo_write(c, i, size)?;
        outstanding += 1;
        waiter.progress();
        while side.conns[0].peek_data(2 * size - 1) != st {
            if !side.scq.is_empty() {
                let n = side.poll_send()?;
                outstanding = outstanding.saturating_sub(n as u64);
            }
            waiter.idle("waiting for the peer's RDMA Write")?;
        }
        let rtt = t0.elapsed();
        if i >= warm {
            samples.push(us(rtt) / 2.0);
        }
        if p.integrity {
            let c = &side.conns[0];
            scratch.resize(size, 0);
            c.data.read_at(size, &mut scratch);
            verifier.check(
                "RDMA Write echo",
                i,
                &mut scratch,
                pattern::seed(0, 1, i),
                Some(st),
            )?;
        }
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
    finish_lat(side, i, samples, clock.elapsed(), verifier.checked)
}

/// The client's DONE / ACK exchange after a latency test.
pub(super) fn finish_lat(
    side: &mut Side,
    total: u64,
    mut samples: Vec<f64>,
    elapsed: Duration,
    verified: u64,
) -> Result<ClientResult, String> {
    let n = samples.len() as u64;
    side.conns[0].send_ctrl(DONE, total, 0)?;
    let mut waiter = Waiter::new(&side.p, &side.scq);
    let acks = collect_ctrl(side, ACK, &mut waiter)?;
    drain_sends(side)?;
    if acks[0].0 != total {
        return Err(format!(
            "the server counted {} round trips, we made {total}",
            acks[0].0
        ));
    }
    let lat = LatStats::from_samples(&mut samples);
    Ok(ClientResult {
        msgs: n,
        elapsed,
        lat,
        verified: verified + acks[0].1,
        span_cpu_s: None,
    })
}

/// write_lat server: poll slot 1's last byte for the client's stamp, echo
/// it with a Write into the client's slot 1; DONE ends the test.
pub(super) fn server_write_lat(side: &mut Side) -> Result<u64, String> {
    let p = side.p;
    let size = p.size;
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let started = Instant::now();
    let mut i = 0u64;
    loop {
        let st = (i % 255 + 1) as u8;
        waiter.progress();
        loop {
            if side.conns[0].peek_data(2 * size - 1) == st {
                break;
            }
            if !side.rcq.is_empty() {
                // DONE: the client finished (it only sends DONE after its
                // last echo arrived, so no Write is in flight).
                let (count, verified) = (i, verifier.checked);
                let mut w = Waiter::new(&p, &side.scq);
                let dones = collect_ctrl(side, DONE, &mut w)?;
                if dones[0].0 != count {
                    return Err(format!(
                        "the client made {} round trips, we echoed {count}",
                        dones[0].0
                    ));
                }
                side.conns[0].send_ctrl(ACK, count, verified)?;
                drain_sends(side)?;
                return Ok(verified);
            }
            if let Err(e) = waiter.idle("waiting for the client's RDMA Write") {
                if i > 0 || started.elapsed() > passive_limit(&p) {
                    return Err(e);
                }
                waiter.progress();
            }
        }
        let c = &side.conns[0];
        if p.integrity {
            scratch.resize(size, 0);
            c.data.read_at(size, &mut scratch);
            verifier.check(
                "RDMA Write",
                i,
                &mut scratch,
                pattern::seed(0, 0, i),
                Some(st),
            )?;
            fill_slot(
                c,
                size,
                0,
                pattern::seed(c.idx, 1, i),
                Some(st),
                &mut scratch,
            );
        } else {
            c.data.write_at(size - 1, &[st]);
        }
        post_echo_write(c, i, size)?;
        outstanding += 1;
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
}

/// read_lat client: one Read at a time; full round trip, as perftest
/// reports for reads.
pub(super) fn client_read_lat(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let warm = warmup(&p);
    let mut samples = Vec::new();
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut scratch = Vec::new();
    let mut clock = LatClock::new(&p);
    let mut i = 0u64;
    while clock.keep_going(i) {
        let c = &side.conns[0];
        let t0 = Instant::now();
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::RdmaRead {
                remote_addr: c.remote.data_addr,
                rkey: c.remote.data_rkey,
            },
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        waiter.progress();
        loop {
            let n = side.poll_send()?;
            if side.wcs[..n]
                .iter()
                .any(|wc| split_wrid(wc.wr_id).0 == K_DATA)
            {
                break;
            }
            if n == 0 {
                waiter.wait_cq(&side.scq, "waiting for the RDMA Read")?;
            }
        }
        let rtt = t0.elapsed();
        if i >= warm {
            samples.push(us(rtt));
        }
        if p.integrity {
            scratch.resize(size, 0);
            side.conns[0].data.read_at(0, &mut scratch);
            verifier.check("RDMA Read", i, &mut scratch, pattern::seed(0, 1, 0), None)?;
        }
        i += 1;
    }
    finish_lat(side, i, samples, clock.elapsed(), verifier.checked)
}

/// send_lat client: Send, wait for the echo's receive completion.
pub(super) fn client_send_lat(side: &mut Side) -> Result<ClientResult, String> {
    let p = side.p;
    let size = p.size;
    let warm = warmup(&p);
    let mut samples = Vec::new();
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let mut clock = LatClock::new(&p);
    let mut i = 0u64;
    while clock.keep_going(i) {
        let c = &side.conns[0];
        if p.integrity {
            fill_slot(c, size, 0, pattern::seed(0, 0, i), None, &mut scratch);
        }
        let t0 = Instant::now();
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::Send,
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        outstanding += 1;
        waiter.progress();
        let wc = loop {
            if let Some(wc) = side.rcq.poll_one() {
                break wc;
            }
            waiter.wait_cq(&side.rcq, "waiting for the echo")?;
        };
        let rtt = t0.elapsed();
        check_wc(&wc)?;
        if i >= warm {
            samples.push(us(rtt) / 2.0);
        }
        let (_, _, seq) = split_wrid(wc.wr_id);
        let c = &mut side.conns[0];
        if wc.byte_len as usize != size {
            return Err(format!(
                "echo {i}: unexpected message of {} bytes",
                wc.byte_len
            ));
        }
        if p.integrity {
            c.recv_bytes(seq, size, &mut scratch);
            verifier.check("Send echo", i, &mut scratch, pattern::seed(0, 1, i), None)?;
        }
        c.post_recv()?;
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
    finish_lat(side, i, samples, clock.elapsed(), verifier.checked)
}

/// send_lat server: echo every Send; DONE ends the test.
pub(super) fn server_send_lat(side: &mut Side) -> Result<u64, String> {
    let p = side.p;
    let size = p.size;
    let mut verifier = Verifier::new(p.corrupt);
    let mut waiter = Waiter::new(&p, &side.scq);
    let mut outstanding = 0u64;
    let mut scratch = Vec::new();
    let started = Instant::now();
    let mut i = 0u64;
    loop {
        waiter.progress();
        let wc = loop {
            if let Some(wc) = side.rcq.poll_one() {
                break wc;
            }
            if let Err(e) = waiter.wait_cq(&side.rcq, "waiting for the client's Send") {
                if i > 0 || started.elapsed() > passive_limit(&p) {
                    return Err(e);
                }
                waiter.progress();
            }
        };
        check_wc(&wc)?;
        let (_, _, seq) = split_wrid(wc.wr_id);
        let c = &mut side.conns[0];
        if is_ctrl(wc.byte_len, size) {
            c.recv_bytes(seq, wc.byte_len as usize, &mut scratch);
            match parse_ctrl(&scratch) {
                Some((DONE, count, _)) if count == i => {}
                Some((DONE, count, _)) => {
                    return Err(format!(
                        "the client made {count} round trips, we echoed {i}"
                    ))
                }
                _ => return Err("malformed control message".into()),
            }
            c.send_ctrl(ACK, i, verifier.checked)?;
            drain_sends(side)?;
            return Ok(verifier.checked);
        }
        if wc.byte_len as usize != size {
            return Err(format!(
                "message {i}: {} bytes, expected {size}",
                wc.byte_len
            ));
        }
        if p.integrity {
            c.recv_bytes(seq, size, &mut scratch);
            verifier.check("Send", i, &mut scratch, pattern::seed(0, 0, i), None)?;
            fill_slot(c, size, 0, pattern::seed(0, 1, i), None, &mut scratch);
        }
        // Repost before answering: the client's next Send may follow the
        // echo immediately.
        c.post_recv()?;
        c.qp.post_send(&SendWr {
            wr_id: wrid(K_DATA, 0, i),
            opcode: WrOpcode::Send,
            sgl: SgList::single(c.data.sge(0, size)),
            signaled: true,
            solicited: false,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        outstanding += 1;
        reap_lat(side, &mut outstanding, &mut waiter)?;
        i += 1;
    }
}

/// write_lat's ping or pong: a signaled RDMA Write of the first `size`
/// bytes of `c`'s data region into the peer's echo slot (offset `size` of
/// its region), whose last byte is the stamp the other side spins on.
fn post_echo_write(c: &Conn, i: u64, size: usize) -> Result<(), String> {
    c.qp.post_send(&SendWr {
        wr_id: wrid(K_DATA, 0, i),
        opcode: WrOpcode::RdmaWrite {
            remote_addr: c.remote.data_addr + size as u64,
            rkey: c.remote.data_rkey,
        },
        sgl: SgList::single(c.data.sge(0, size)),
        signaled: true,
        solicited: false,
    })
    .map_err(|e| format!("post_send: {e}"))
}
