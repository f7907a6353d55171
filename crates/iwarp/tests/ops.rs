//! Every RDMAP operation over real loopback sockets, with CRC on and off
//! and with markers, plus the error paths (Terminate codes, error
//! completions, flushes) and peer death.

mod common;

use std::time::{Duration, Instant};

use common::*;
use iwarp::{Access, QpEvent, QpState, SendWr, SgList, WcOpcode, WcStatus, WrOpcode};
use iwarp_proto::handshake::{MpaConfig, Policy, Rtr};
use iwarp_proto::wire::terminate::TermCode;

fn mpa(crc: bool, markers: bool) -> MpaConfig {
    MpaConfig {
        crc: if crc { Policy::Required } else { Policy::Off },
        markers: if markers {
            Policy::Required
        } else {
            Policy::Off
        },
        ..Default::default()
    }
}

fn configs() -> Vec<(&'static str, MpaConfig)> {
    vec![
        ("crc", mpa(true, false)),
        ("no-crc", mpa(false, false)),
        ("crc+markers", mpa(true, true)),
    ]
}

/// Send, Send with Solicited Event, Send with Invalidate (+SE).
fn sends(cfg: MpaConfig, name: &str) {
    let (c, s) = pair_with(cfg, |_, _| {});
    let info = c.qp.conn_info().unwrap();
    eprintln!("[{name}] {info:?}");
    let rbuf = s.mr(1 << 20);
    let sbuf = c.mr(1 << 20);
    for i in 0..4 {
        s.post_recv(100 + i, &rbuf, (i as usize) * 65536, 65536);
    }
    let msg = pattern(40_000, 1);
    sbuf.write_at(0, &msg);

    // Plain Send.
    c.qp.post_send(&wr(1, WrOpcode::Send, &[sbuf.sge(0, msg.len())]))
        .unwrap();
    let wc = c.send_wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::Send),
        "[{name}]"
    );
    let wc = s.recv_wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (100, WcStatus::Success, WcOpcode::Recv),
        "[{name}]"
    );
    assert_eq!(wc.byte_len as usize, msg.len());
    assert!(!wc.solicited && wc.invalidated_rkey.is_none());
    let mut got = vec![0u8; msg.len()];
    rbuf.read_at(0, &mut got);
    assert!(got == msg, "[{name}] Send payload differs");

    // Send with Solicited Event.
    let mut w = wr(2, WrOpcode::Send, &[sbuf.sge(0, 100)]);
    w.solicited = true;
    c.qp.post_send(&w).unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    let wc = s.recv_wc();
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.solicited),
        (101, 100, true),
        "[{name}]"
    );
    assert!(wc.invalidated_rkey.is_none());

    // Send with Invalidate: the server's region is invalid afterwards.
    let target = s.mr(4096);
    let inv = target.rkey();
    c.qp.post_send(&wr(
        3,
        WrOpcode::SendWithInv {
            invalidate_rkey: inv,
        },
        &[sbuf.sge(0, 10)],
    ))
    .unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    let wc = s.recv_wc();
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.invalidated_rkey, wc.solicited),
        (102, 10, Some(inv), false)
    );
    assert!(!target.is_valid(), "[{name}] STag invalidated");
    assert!(s
        .ctx
        .memory_access()
        .check(inv, target.addr(), 1, s.pd.id(), Access::REMOTE_WRITE)
        .is_err());

    // Send with Solicited Event and Invalidate.
    let target2 = s.mr(4096);
    let inv2 = target2.rkey();
    let mut w = wr(
        4,
        WrOpcode::SendWithInv {
            invalidate_rkey: inv2,
        },
        &[sbuf.sge(0, 0)],
    );
    w.sgl = SgList::new();
    w.solicited = true;
    c.qp.post_send(&w).unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    let wc = s.recv_wc();
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.invalidated_rkey, wc.solicited),
        (103, 0, Some(inv2), true)
    );
    assert!(!target2.is_valid());
    assert_eq!(c.qp.state(), QpState::Rts);
    assert_eq!(s.qp.state(), QpState::Rts);
}

#[test]
fn sends_all_configs() {
    for (name, cfg) in configs() {
        sends(cfg, name);
    }
}

/// RDMA Write then RDMA Read (single SGE, multi-SGE sink, 4 MiB).
fn write_read(cfg: MpaConfig, name: &str) {
    const BIG: usize = 4 << 20;
    let (c, s) = pair_with(cfg, |_, _| {});
    let remote = s.mr(BIG);
    let local = c.mr(BIG);

    // Write 100 KiB at offset 3, then a 4 MiB write.
    let data = pattern(100 * 1024, 7);
    local.write_at(0, &data);
    let w = wr(
        10,
        WrOpcode::RdmaWrite {
            remote_addr: remote.addr() + 3,
            rkey: remote.rkey(),
        },
        &[local.sge(0, data.len())],
    );
    c.qp.post_send(&w).unwrap();
    let wc = c.send_wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (10, WcStatus::Success, WcOpcode::RdmaWrite),
        "[{name}]"
    );
    // A Read of the same area orders after the Write (RFC 5040 §5.5).
    let sink = c.mr(data.len());
    let r = wr(
        11,
        WrOpcode::RdmaRead {
            remote_addr: remote.addr() + 3,
            rkey: remote.rkey(),
        },
        &[sink.sge(0, data.len())],
    );
    c.qp.post_send(&r).unwrap();
    let wc = c.send_wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (11, WcStatus::Success, WcOpcode::RdmaRead),
        "[{name}]"
    );
    assert_eq!(wc.byte_len as usize, data.len());
    assert!(sink.to_vec() == data, "[{name}] Read back what was written");
    let mut placed = vec![0u8; data.len()];
    remote.read_at(3, &mut placed);
    assert!(placed == data, "[{name}] Write placed the data");

    // Multi-SGE Read sink across two regions.
    let src = pattern(30_000, 9);
    remote.write_at(500_000, &src);
    let (a, b) = (c.mr(10_000), c.mr(40_000));
    let r = wr(
        12,
        WrOpcode::RdmaRead {
            remote_addr: remote.addr() + 500_000,
            rkey: remote.rkey(),
        },
        &[
            a.sge(0, 10_000),
            b.sge(100, 15_000),
            a.sge(0, 0),
            b.sge(20_000, 5_000),
        ],
    );
    c.qp.post_send(&r).unwrap();
    let wc = c.send_wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (12, WcStatus::Success, 30_000),
        "[{name}]"
    );
    assert!(a.to_vec() == src[..10_000]);
    let bv = b.to_vec();
    assert!(bv[100..15_100] == src[10_000..25_000]);
    assert!(bv[20_000..25_000] == src[25_000..30_000]);

    // 4 MiB Write and 4 MiB Read with content checks.
    let big = pattern(BIG, 3);
    local.write_at(0, &big);
    let t = Instant::now();
    c.qp.post_send(&wr(
        13,
        WrOpcode::RdmaWrite {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
        },
        &[local.sge(0, BIG)],
    ))
    .unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    let rsink = c.mr(BIG);
    c.qp.post_send(&wr(
        14,
        WrOpcode::RdmaRead {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
        },
        &[rsink.sge(0, BIG)],
    ))
    .unwrap();
    let wc = c.send_wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len as usize),
        (14, WcStatus::Success, BIG),
        "[{name}]"
    );
    assert!(remote.to_vec() == big, "[{name}] 4 MiB Write content");
    assert!(rsink.to_vec() == big, "[{name}] 4 MiB Read content");
    eprintln!("[{name}] 4 MiB write + read in {:?}", t.elapsed());
    let (cs, ss) = (c.qp.stats(), s.qp.stats());
    eprintln!("[{name}] client {cs:?}\n[{name}] server {ss:?}");
    if !name.contains("markers") {
        // With markers every 512 bytes, runs are too short for the direct path.
        assert!(
            ss.rx_direct_bytes > BIG as u64 / 2,
            "[{name}] Write payload placed zero-copy"
        );
        assert!(
            cs.rx_direct_bytes > BIG as u64 / 2,
            "[{name}] Read Response payload placed zero-copy"
        );
    }
    assert!(cs.tx_bytes > BIG as u64 && ss.tx_bytes > BIG as u64);
    assert!(s.rcq.is_empty(), "tagged operations consume no receive");
}

#[test]
fn write_read_all_configs() {
    for (name, cfg) in configs() {
        write_read(cfg, name);
    }
}

#[test]
fn rtr_modes_then_traffic() {
    for rtr in [Rtr::ZeroLengthWrite, Rtr::ZeroLengthRead] {
        let cfg = MpaConfig {
            rtr: Some(rtr),
            ..Default::default()
        };
        let (c, s) = pair_with(cfg, |_, _| {});
        let info = c.qp.conn_info().unwrap();
        eprintln!("{rtr:?}: negotiated {info:?}");
        let rbuf = s.mr(64);
        s.post_recv(1, &rbuf, 0, 64);
        let sbuf = c.mr(64);
        sbuf.write_at(0, b"after rtr");
        c.qp.post_send(&wr(5, WrOpcode::Send, &[sbuf.sge(0, 9)]))
            .unwrap();
        let wc = c.send_wc();
        assert_eq!(
            (wc.wr_id, wc.status),
            (5, WcStatus::Success),
            "{rtr:?}: the RTR never reaches the CQ"
        );
        assert_eq!(s.recv_wc().byte_len, 9);
        assert_eq!(&rbuf.to_vec()[..9], b"after rtr");
        assert!(c.scq.is_empty() && s.scq.is_empty());
    }
}

/// Expect the whole error choreography: the target sent a Terminate with
/// `code`, the initiator got it, WR `wr_id` completed with `status`, both
/// QPs are in Error and later WRs are flushed.
///
/// As in siw, an RDMA Write (like a Send) completes successfully once it is
/// transmitted and confirmed; if the Terminate arrives first, it completes
/// with the remote access error instead. Either way the work requests still
/// outstanding then (a Read waiting for its response, anything queued)
/// complete with errors.
fn expect_remote_error(c: &Host, s: &Host, wr_id: u64, code: TermCode, status: &[WcStatus]) {
    let sent = s.event(|e| matches!(e, QpEvent::TerminateSent(_)));
    let QpEvent::TerminateSent(t) = sent else {
        unreachable!()
    };
    assert_eq!(
        TermCode::from_wire(t.layer, t.etype, t.ecode),
        code,
        "target's Terminate: {t}"
    );
    let recv = c.event(|e| matches!(e, QpEvent::TerminateReceived(_)));
    let QpEvent::TerminateReceived(t) = recv else {
        unreachable!()
    };
    assert_eq!(
        TermCode::from_wire(t.layer, t.etype, t.ecode),
        code,
        "initiator's view: {t}"
    );
    let wc = c.send_wc();
    assert_eq!(wc.wr_id, wr_id);
    assert!(status.contains(&wc.status), "{}", wc.status.as_str());
    let deadline = Instant::now() + T;
    while (c.qp.state() != QpState::Error || s.qp.state() != QpState::Error)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(c.qp.state(), QpState::Error);
    assert_eq!(s.qp.state(), QpState::Error);
    // A request posted now is flushed, not refused (siw `siw_sq_flush_wr`);
    // its completion follows those of the requests posted before it, which
    // the caller checks first ([`expect_flushed_999`]).
    let mr = c.mr(8);
    c.qp.post_send(&wr(999, WrOpcode::Send, &[mr.sge(0, 8)]))
        .unwrap();
}

/// The request [`expect_remote_error`] posted in the error state, flushed,
/// is the send queue's next completion.
fn expect_flushed_999(c: &Host) {
    let wc = c.send_wc();
    assert_eq!((wc.wr_id, wc.status), (999, WcStatus::WrFlushErr));
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    BadStag,
    KeyMismatch,
    /// An STag the target deregistered, then re-registered 256 times (after
    /// which a key that steps by one per reuse, as siw's, names the live
    /// region again).
    Stale,
    PdMismatch,
    NoRights,
    OutOfBounds,
}

fn remote_fault(read: bool, fault: Fault) {
    let (c, s) = pair();
    let local = c.mr(4096);
    let other_pd = s.ctx.alloc_pd();
    let good = s.mr(4096);
    let foreign = other_pd.reg_mr(4096, Access::ALL).unwrap();
    let ro = s.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    // A receive posted at the target is flushed when the QP fails.
    let rb = s.mr(64);
    s.post_recv(77, &rb, 0, 64);
    let mut stale_live = None;
    let (addr, rkey) = match fault {
        Fault::Stale => {
            let first = s.mr(4096);
            let (a, k) = (first.addr(), first.rkey());
            drop(first);
            for _ in 0..256 {
                drop(stale_live.take());
                stale_live = Some(s.mr(4096));
            }
            (a, k)
        }
        Fault::BadStag => (good.addr(), 0x00ff_ff00),
        Fault::KeyMismatch => (good.addr(), good.rkey() ^ 0x5a),
        Fault::PdMismatch => (foreign.addr(), foreign.rkey()),
        Fault::NoRights => (ro.addr(), ro.rkey()),
        Fault::OutOfBounds => (good.addr() + 4000, good.rkey()),
    };
    let op = if read {
        WrOpcode::RdmaRead {
            remote_addr: addr,
            rkey,
        }
    } else {
        WrOpcode::RdmaWrite {
            remote_addr: addr,
            rkey,
        }
    };
    // A Read behind the failing request, posted together with it: it is
    // outstanding (waiting for a response that never comes) when the
    // Terminate arrives.
    let sink = c.mr(64);
    let behind = wr(
        51,
        WrOpcode::RdmaRead {
            remote_addr: good.addr(),
            rkey: good.rkey(),
        },
        &[sink.sge(0, 64)],
    );
    c.qp.post_send_list(&[wr(50, op, &[local.sge(0, 200)]), behind])
        .unwrap();
    let err = if read {
        iwarp_proto::engine::term_code_for_read_source
    } else {
        iwarp_proto::engine::term_code_for_tagged
    };
    let memerr = match fault {
        Fault::BadStag | Fault::Stale => iwarp::MemError::InvalidStag,
        Fault::KeyMismatch => iwarp::MemError::KeyMismatch,
        Fault::PdMismatch => iwarp::MemError::PdMismatch,
        Fault::NoRights => iwarp::MemError::AccessRights,
        Fault::OutOfBounds => iwarp::MemError::Bounds,
    };
    // A Read fails with the access error; a Write completed when it was
    // sent, unless the Terminate overtook its transmit confirmation.
    let status: &[WcStatus] = if read {
        &[WcStatus::RemAccessErr]
    } else {
        &[WcStatus::Success, WcStatus::RemAccessErr]
    };
    expect_remote_error(&c, &s, 50, err(memerr), status);
    let wc = c.send_wc();
    assert_eq!(wc.wr_id, 51, "{fault:?}");
    assert_ne!(
        wc.status,
        WcStatus::Success,
        "{fault:?}: the Read after the fault must fail"
    );
    eprintln!(
        "{fault:?}: read behind it completed with {}",
        wc.status.as_str()
    );
    expect_flushed_999(&c);
    assert!(sink.to_vec().iter().all(|&b| b == 0), "nothing placed");
    if let Some(live) = &stale_live {
        assert!(
            live.to_vec().iter().all(|&b| b == 0),
            "the stale STag reached the live region"
        );
    }
    let wc = s.recv_wc();
    assert_eq!(
        (wc.wr_id, wc.status),
        (77, WcStatus::WrFlushErr),
        "{fault:?}"
    );
}

#[test]
fn write_faults_terminate() {
    for f in [
        Fault::BadStag,
        Fault::KeyMismatch,
        Fault::Stale,
        Fault::PdMismatch,
        Fault::NoRights,
        Fault::OutOfBounds,
    ] {
        eprintln!("write {f:?}");
        remote_fault(false, f);
    }
}

#[test]
fn read_faults_terminate() {
    for f in [
        Fault::BadStag,
        Fault::KeyMismatch,
        Fault::Stale,
        Fault::PdMismatch,
        Fault::NoRights,
        Fault::OutOfBounds,
    ] {
        eprintln!("read {f:?}");
        remote_fault(true, f);
    }
}

#[test]
fn write_to_invalidated_stag_fails() {
    let (c, s) = pair();
    let rb = s.mr(64);
    s.post_recv(1, &rb, 0, 64);
    let target = s.mr(4096);
    let local = c.mr(64);
    c.qp.post_send(&wr(
        1,
        WrOpcode::SendWithInv {
            invalidate_rkey: target.rkey(),
        },
        &[local.sge(0, 4)],
    ))
    .unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    assert_eq!(s.recv_wc().invalidated_rkey, Some(target.rkey()));
    let t2 = s.mr(64);
    t2.fill(1);
    let write = wr(
        2,
        WrOpcode::RdmaWrite {
            remote_addr: target.addr(),
            rkey: target.rkey(),
        },
        &[local.sge(0, 8)],
    );
    let read = wr(
        3,
        WrOpcode::RdmaRead {
            remote_addr: t2.addr(),
            rkey: t2.rkey(),
        },
        &[local.sge(0, 8)],
    );
    c.qp.post_send_list(&[write, read]).unwrap();
    expect_remote_error(
        &c,
        &s,
        2,
        TermCode::DdpTaggedInvalidStag,
        &[WcStatus::Success, WcStatus::RemAccessErr],
    );
    let wc = c.send_wc();
    assert_eq!(wc.wr_id, 3);
    assert_ne!(wc.status, WcStatus::Success);
    expect_flushed_999(&c);
    assert!(
        target.to_vec().iter().all(|&b| b == 0),
        "nothing written to the invalidated region"
    );
}

#[test]
fn send_without_receive_terminates() {
    let (c, s) = pair();
    let local = c.mr(64);
    c.qp.post_send(&wr(7, WrOpcode::Send, &[local.sge(0, 16)]))
        .unwrap();
    let sent = s.event(|e| matches!(e, QpEvent::TerminateSent(_)));
    let QpEvent::TerminateSent(t) = sent else {
        unreachable!()
    };
    assert_eq!(
        TermCode::from_wire(t.layer, t.etype, t.ecode),
        TermCode::DdpUntaggedNoBuffer,
        "{t}"
    );
    let got = c.event(|e| matches!(e, QpEvent::TerminateReceived(_)));
    let QpEvent::TerminateReceived(t) = got else {
        unreachable!()
    };
    assert_eq!(
        TermCode::from_wire(t.layer, t.etype, t.ecode),
        TermCode::DdpUntaggedNoBuffer,
        "{t}"
    );
    // The Send may have completed before the Terminate came back (as in
    // siw, a Send completes once transmitted); either way it completes.
    let wc = c.send_wc();
    assert_eq!(wc.wr_id, 7);
    eprintln!(
        "send without receive completed with: {}",
        wc.status.as_str()
    );
    let deadline = Instant::now() + T;
    while c.qp.state() != QpState::Error && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(c.qp.state(), QpState::Error);
    assert_eq!(s.qp.state(), QpState::Error);
}

#[test]
fn receive_too_small_is_a_local_length_error() {
    let (c, s) = pair();
    let rb = s.mr(64);
    s.post_recv(1, &rb, 0, 8);
    let local = c.mr(64);
    c.qp.post_send(&wr(2, WrOpcode::Send, &[local.sge(0, 32)]))
        .unwrap();
    let wc = s.recv_wc();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocLenErr));
    let ev = s.event(|e| matches!(e, QpEvent::TerminateSent(_)));
    let QpEvent::TerminateSent(t) = ev else {
        unreachable!()
    };
    assert_eq!(
        TermCode::from_wire(t.layer, t.etype, t.ecode),
        TermCode::DdpUntaggedTooLong,
        "{t}"
    );
}

#[test]
fn peer_killed_mid_transfer_flushes_within_a_second() {
    const N: u64 = 48;
    let (c, s) = pair();
    let remote = s.mr(2 << 20);
    // Writes gather from the first MiB, Reads land in the second: a verbs
    // consumer must not let one outstanding operation write bytes another
    // one reads (ThreadSanitizer reports it as a race).
    let local = c.mr(2 << 20);
    for i in 0..N {
        let at = if i % 2 == 0 { 0 } else { 1 << 20 };
        let op = if i % 2 == 0 {
            WrOpcode::RdmaWrite {
                remote_addr: remote.addr(),
                rkey: remote.rkey(),
            }
        } else {
            WrOpcode::RdmaRead {
                remote_addr: remote.addr() + (1 << 20),
                rkey: remote.rkey(),
            }
        };
        c.qp.post_send(&wr(i, op, &[local.sge(at, 1 << 20)]))
            .unwrap();
    }
    let rb = c.mr(64);
    c.post_recv(1000, &rb, 0, 64);
    // Kill the server side abruptly.
    let killed = Instant::now();
    drop(s);
    let mut seen = 0;
    let mut flushed = 0;
    while seen < N {
        let left = Duration::from_secs(1).saturating_sub(killed.elapsed());
        let wc = c
            .scq
            .wait_one(left)
            .unwrap()
            .unwrap_or_else(|| panic!("only {seen} of {N} completed within 1 s"));
        assert_eq!(wc.wr_id, seen, "in order");
        if wc.status == WcStatus::WrFlushErr {
            flushed += 1;
        } else {
            assert_eq!(wc.status, WcStatus::Success);
        }
        seen += 1;
    }
    let wc = c
        .rcq
        .wait_one(Duration::from_secs(1).saturating_sub(killed.elapsed()))
        .unwrap()
        .expect("receive flushed");
    assert_eq!((wc.wr_id, wc.status), (1000, WcStatus::WrFlushErr));
    eprintln!("{flushed} of {N} flushed after {:?}", killed.elapsed());
    assert!(killed.elapsed() < Duration::from_secs(1));
    c.event(|e| *e == QpEvent::Disconnected);
    assert_eq!(c.qp.state(), QpState::Error);
}

#[test]
fn local_disconnect_flushes_and_peer_sees_it() {
    let (c, s) = pair();
    let rb = s.mr(64);
    s.post_recv(5, &rb, 0, 64);
    let crb = c.mr(64);
    c.post_recv(6, &crb, 0, 64);
    c.qp.disconnect();
    let wc = c.recv_wc();
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::WrFlushErr));
    c.event(|e| *e == QpEvent::Disconnected);
    s.event(|e| *e == QpEvent::Disconnected);
    let wc = s.recv_wc();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
    // After the disconnect (rdma_disconnect moves an iWARP QP to the error
    // state) a posted request is flushed, not refused.
    let w = SendWr {
        wr_id: 9,
        opcode: WrOpcode::Send,
        sgl: SgList::new(),
        signaled: true,
        solicited: false,
    };
    c.qp.post_send(&w).unwrap();
    let wc = c.send_wc();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WrFlushErr));
}

#[test]
fn many_small_sends_both_directions() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 2000;
    const RQ: u64 = 32;
    let (c, s) = pair_with(MpaConfig::default(), |_, _| {});
    let (cb, sb) = (c.mr(64 * RQ as usize), s.mr(64 * RQ as usize));
    for i in 0..RQ {
        c.post_recv(i, &cb, (i as usize) * 64, 64);
        s.post_recv(i, &sb, (i as usize) * 64, 64);
    }
    let (csrc, ssrc) = (c.mr(64), s.mr(64));
    // Receives each side has re-posted: the peer may have at most RQ more
    // Sends outstanding than that (credit-based flow control, as every
    // RDMA application needs: a Send without a receive is fatal).
    let reposted = [AtomicU64::new(0), AtomicU64::new(0)];
    std::thread::scope(|sc| {
        for (idx, me, my_buf, src) in [(0usize, &c, &cb, &csrc), (1, &s, &sb, &ssrc)] {
            let reposted = &reposted;
            sc.spawn(move || {
                let (mut sent, mut recvd, mut done) = (0u64, 0u64, 0u64);
                let deadline = Instant::now() + Duration::from_secs(20);
                while (done < N || recvd < N) && Instant::now() < deadline {
                    while sent < N && sent < reposted[1 - idx].load(Ordering::Acquire) + RQ {
                        me.qp
                            .post_send(&wr(sent, WrOpcode::Send, &[src.sge(0, 64)]))
                            .unwrap();
                        sent += 1;
                    }
                    while let Some(wc) = me.scq.poll_one() {
                        assert_eq!(wc.status, WcStatus::Success);
                        done += 1;
                    }
                    while let Some(wc) = me.rcq.poll_one() {
                        assert_eq!(wc.status, WcStatus::Success);
                        recvd += 1;
                        me.post_recv(wc.wr_id, my_buf, (wc.wr_id as usize) * 64, 64);
                        reposted[idx].fetch_add(1, Ordering::Release);
                    }
                    std::thread::yield_now();
                }
                assert_eq!((done, recvd), (N, N));
            });
        }
    });
}

#[test]
fn bidirectional_bulk_does_not_deadlock() {
    // Both sides write a lot at once: with a receive thread that blocked on
    // writes, both peers could end up in write() with nobody reading.
    const LEN: usize = 4 << 20;
    const N: u64 = 8;
    let (c, s) = pair();
    let (cm, sm) = (c.mr(LEN), s.mr(LEN));
    cm.write_at(0, &pattern(LEN, 1));
    sm.write_at(0, &pattern(LEN, 2));
    let (csink, ssink) = (c.mr(LEN), s.mr(LEN));
    // A Write's completion at its sender does not say that the target has
    // placed it: each side ends with a Send, and reads its sink only after
    // that Send's receive completion (RDMA ordering, RFC 5040 section 5.5:
    // the Writes before it are placed). Reading at once raced with the
    // receive thread still placing the last Write (ThreadSanitizer
    // reported it, session 9).
    let (cflag, sflag) = (c.mr(8), s.mr(8));
    c.post_recv(100, &cflag, 0, 8);
    s.post_recv(100, &sflag, 0, 8);
    std::thread::scope(|sc| {
        for (me, src, dst) in [(&c, &cm, &ssink), (&s, &sm, &csink)] {
            sc.spawn(move || {
                for i in 0..N {
                    let op = WrOpcode::RdmaWrite {
                        remote_addr: dst.addr(),
                        rkey: dst.rkey(),
                    };
                    me.qp.post_send(&wr(i, op, &[src.sge(0, LEN)])).unwrap();
                }
                me.qp
                    .post_send(&wr(N, WrOpcode::Send, &[src.sge(0, 8)]))
                    .unwrap();
                for i in 0..=N {
                    let wc = me
                        .scq
                        .wait_one(Duration::from_secs(30))
                        .unwrap()
                        .expect("write completes");
                    assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
                }
            });
        }
    });
    assert_eq!(c.recv_wc().status, WcStatus::Success);
    assert_eq!(s.recv_wc().status, WcStatus::Success);
    assert!(ssink.to_vec() == cm.to_vec());
    assert!(csink.to_vec() == sm.to_vec());
}

#[test]
fn raw_registered_memory_round_trip() {
    let (c, s) = pair();
    let mut backing = vec![0u8; 64 * 1024];
    // SAFETY: `backing` is only accessed through the region until it is
    // dropped below, and outlives it.
    let raw = unsafe {
        s.pd.reg_mr_raw(backing.as_mut_ptr(), backing.len(), Access::ALL)
    }
    .unwrap();
    let local = c.mr(64 * 1024);
    let data = pattern(64 * 1024, 5);
    local.write_at(0, &data);
    let op = WrOpcode::RdmaWrite {
        remote_addr: raw.addr(),
        rkey: raw.rkey(),
    };
    c.qp.post_send(&wr(1, op, &[local.sge(0, data.len())]))
        .unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    // Read it back so the Write is known to be placed.
    let sink = c.mr(64 * 1024);
    let op = WrOpcode::RdmaRead {
        remote_addr: raw.addr(),
        rkey: raw.rkey(),
    };
    c.qp.post_send(&wr(2, op, &[sink.sge(0, data.len())]))
        .unwrap();
    assert_eq!(c.send_wc().status, WcStatus::Success);
    drop(raw);
    assert!(backing == data);
    assert!(sink.to_vec() == data);
}

/// Deregistering the source of an RDMA Write while it is being sent (raw,
/// caller-owned memory, whose `Drop` waits until no driver thread holds the
/// region): the drop returns promptly, the Write completes (with an error
/// if it was cut short, the connection then being closed), and nothing
/// hangs. The driver must not keep the region pinned after a failed send.
#[test]
fn deregistering_the_source_mid_write_neither_hangs_nor_crashes() {
    const LEN: usize = 64 << 20;
    let (client, server) = pair();
    let target = server.mr(LEN);
    let mut backing = vec![0x5au8; LEN];
    // SAFETY: `backing` outlives `mr` (dropped explicitly below, before
    // `backing`) and is not touched through Rust references meanwhile.
    let mr = unsafe {
        client
            .pd
            .reg_mr_raw(backing.as_mut_ptr(), LEN, Access::LOCAL_WRITE)
    }
    .unwrap();
    client
        .qp
        .post_send(&wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: target.addr(),
                rkey: target.rkey(),
            },
            &[mr.sge(0, LEN)],
        ))
        .unwrap();
    let t0 = Instant::now();
    drop(mr);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "deregistration waited {:?}",
        t0.elapsed()
    );
    let wc = client.send_wc();
    assert_eq!(wc.wr_id, 1);
    if wc.status != WcStatus::Success {
        // Cut short: the connection is closed on both ends.
        assert_eq!(client.qp.state(), QpState::Error, "{wc:?}");
        server.event(|e| matches!(e, QpEvent::Disconnected | QpEvent::TerminateReceived(_)));
    }
    drop(backing);
}
