//! Posting to a queue pair in the error state flushes, as in Linux siw
//! (`siw_post_send` → `siw_sq_flush_wr`, `siw_post_receive` →
//! `siw_rq_flush_wr`) and rdma-core devices: the request is accepted and
//! completes at once with `WrFlushErr`, which is what `ib_drain_qp` relies
//! on. The engine-level details (ordering behind a frame in flight, the
//! send queue's depth) are in `iwarp-proto`'s `engine_pair.rs`; the drain
//! that every device must pass is in `device_ops.rs`.

mod common;

use std::time::{Duration, Instant};

use common::{pair, wr, Host, T};
use iwarp::{
    PostError, QpEvent, QpState, RecvWr, SendWr, SgList, WcOpcode, WcQueue, WcStatus, WrOpcode,
};

/// Wait (bounded) until `host`'s QP reports `state`.
fn wait_state(host: &Host, state: QpState) {
    let deadline = Instant::now() + T;
    while host.qp.state() != state {
        assert!(
            Instant::now() < deadline,
            "QP still in {:?} after {T:?}, want {state:?}",
            host.qp.state()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `ib_drain_qp` by hand on a QP the peer put in the error state with a
/// Terminate: marker requests posted afterwards (a signaled send, an
/// unsignaled Write, a Read, a receive) are accepted and come back flushed,
/// each with its own opcode, no bytes, in posting order per queue.
#[test]
fn requests_posted_after_a_terminate_come_back_flushed() {
    let (c, s) = pair();
    let local = c.mr(64);
    // A Send with no receive posted at the server: the server terminates.
    c.qp.post_send(&wr(1, WrOpcode::Send, &[local.sge(0, 16)]))
        .unwrap();
    c.event(|e| matches!(e, QpEvent::TerminateReceived(_)));
    wait_state(&c, QpState::Error);
    assert_eq!(c.send_wc().wr_id, 1, "the Send completes either way");
    assert!(c.scq.is_empty() && c.rcq.is_empty());

    c.qp.post_recv(&RecvWr {
        wr_id: 10,
        sgl: SgList::single(local.sge(0, 64)),
    })
    .unwrap();
    let mut unsignaled = wr(
        12,
        WrOpcode::RdmaWrite {
            remote_addr: 0,
            rkey: 0,
        },
        &[local.sge(0, 8)],
    );
    unsignaled.signaled = false;
    c.qp.post_send_list(&[
        wr(11, WrOpcode::Send, &[local.sge(0, 8)]),
        unsignaled,
        wr(
            13,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            &[local.sge(0, 8)],
        ),
    ])
    .unwrap();
    let got: Vec<_> = (0..3)
        .map(|_| c.send_wc())
        .map(|w| (w.wr_id, w.status, w.opcode, w.queue, w.byte_len))
        .collect();
    let f = WcStatus::WrFlushErr;
    assert_eq!(
        got,
        vec![
            (11, f, WcOpcode::Send, WcQueue::Send, 0),
            (12, f, WcOpcode::RdmaWrite, WcQueue::Send, 0),
            (13, f, WcOpcode::RdmaRead, WcQueue::Send, 0),
        ]
    );
    let r = c.recv_wc();
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.queue, r.byte_len),
        (10, f, WcOpcode::Recv, WcQueue::Recv, 0)
    );
    drop(s);
}

/// A QP in the error state flushes into its CQ, and a CQ that already holds
/// its depth refuses the request instead (siw `siw_sqe_complete` /
/// `siw_rqe_complete`: `-ENOMEM` and `bad_wr`), so a loop that posts until
/// the queue refuses ends. Polling makes room again.
#[test]
fn a_flushed_post_into_a_full_cq_is_refused_until_polled() {
    let Host { scq, rcq, qp, .. } = Host::with_cq_depths(4, 2);
    // Never connected, then disconnected: `Closed`, which flushes like
    // `Error` (rdma_disconnect moves an iWARP QP to ERROR).
    qp.disconnect();
    assert_eq!(qp.state(), QpState::Closed);
    let send = |id| SendWr {
        wr_id: id,
        opcode: WrOpcode::Send,
        sgl: SgList::new(),
        signaled: false,
        solicited: false,
    };
    let mut posted = 0u64;
    let refused = loop {
        match qp.post_send(&send(posted)) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= 4, "posted {posted} into a CQ of depth 4");
    };
    assert_eq!(posted, 4);
    assert_eq!(refused, PostError::CqFull { wr_id: 4 });
    assert!(refused.to_string().contains("poll the CQ"), "{refused}");
    assert_eq!(scq.len(), 4);
    // A list stops at the first request that finds the CQ full; those
    // before it were posted (bad_wr).
    assert!(scq.poll_one().is_some());
    assert_eq!(
        qp.post_send_list(&[send(10), send(11), send(12)]),
        Err(PostError::CqFull { wr_id: 11 })
    );
    let ids: Vec<_> = std::iter::from_fn(|| scq.poll_one())
        .map(|w| (w.wr_id, w.status))
        .collect();
    let f = WcStatus::WrFlushErr;
    assert_eq!(ids, vec![(1, f), (2, f), (3, f), (10, f)]);
    qp.post_send(&send(20)).unwrap();
    assert_eq!(scq.poll_one().map(|w| w.wr_id), Some(20));

    let recv = |id| RecvWr {
        wr_id: id,
        sgl: SgList::new(),
    };
    qp.post_recv_list(&[recv(30), recv(31)]).unwrap();
    assert_eq!(
        qp.post_recv(&recv(32)),
        Err(PostError::CqFull { wr_id: 32 })
    );
    assert_eq!(rcq.poll_one().map(|w| (w.wr_id, w.status)), Some((30, f)));
    qp.post_recv(&recv(33)).unwrap();
    let ids: Vec<_> = std::iter::from_fn(|| rcq.poll_one())
        .map(|w| w.wr_id)
        .collect();
    assert_eq!(ids, vec![31, 33]);
}

/// Receives posted before the connection are flushed by the drain of a
/// QP that never connected; the markers stay out of what it returns.
#[test]
fn draining_a_qp_that_never_connected_flushes_its_receives() {
    let h = Host::new();
    let m = h.mr(64);
    for id in [1, 2] {
        h.post_recv(id, &m, 0, 64);
    }
    let wcs = h.qp.drain(T).unwrap();
    let ids: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(h.scq.is_empty() && h.rcq.is_empty());
    // Draining again finds nothing more.
    assert!(h.qp.drain(T).unwrap().is_empty());
}
