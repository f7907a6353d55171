//! Verbs semantics that hold on every device, run on the device that
//! `IWARP_TEST_DEVICE` names (default `soft`, this crate's stack) between
//! two QPs of one process over `IWARP_TEST_ADDR` (default 127.0.0.1).
//! `cargo test` runs them on `soft`; `scripts/test-rdmacore.sh` runs this
//! same test binary in the QEMU guest on Linux siw (siw0) and soft-RoCE
//! (rxe0) through the rdma-core provider, so data movement and the error
//! paths (bad STag, out of bounds, missing rights, a receive too small, a
//! disconnect) are checked on kernel devices too, not only on ours.
//!
//! Only what every transport guarantees is asserted: an error completion
//! where iWARP and InfiniBand both report one, and the data where both
//! move it. What differs (iWARP completes an RDMA Write when it is handed
//! to TCP, so a refused Write shows on the next request; RoCE NAKs the
//! Write itself) is written so either passes, and the soft-only details
//! (Terminate codes, statistics) stay in `ops.rs`.
use std::net::SocketAddr;
use std::time::Duration;

use iwarp::cm::{self, ConnParam, Listener, MpaConfig};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpInitAttr, QueuePair,
    RecvWr, SendWr, SgList, WcOpcode, WcQueue, WcStatus, WorkCompletion, WrOpcode, DRAIN_WR_ID,
};

const T: Duration = Duration::from_secs(10);

fn device() -> String {
    std::env::var("IWARP_TEST_DEVICE")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "soft".into())
}

fn addr() -> SocketAddr {
    let ip = std::env::var("IWARP_TEST_ADDR")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into());
    SocketAddr::new(ip.parse().expect("IWARP_TEST_ADDR is an IP address"), 0)
}

struct End {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    _ctx: Context,
}

impl End {
    fn new() -> End {
        let name = device();
        let ctx = Context::open_device(&name)
            .unwrap_or_else(|e| panic!("opening device {name} (IWARP_TEST_DEVICE): {e}"));
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(64).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: 16,
                max_recv_wr: 16,
            })
            .unwrap();
        End {
            pd,
            cq,
            qp,
            _ctx: ctx,
        }
    }

    fn mr(&self, len: usize, access: Access) -> MemoryRegion {
        self.pd.reg_mr(len, access).unwrap()
    }

    /// The next completion, within [`T`].
    fn wc(&self, what: &str) -> WorkCompletion {
        self.wc_within(T)
            .unwrap_or_else(|| panic!("{what}: no completion within {T:?} on {}", device()))
    }

    fn wc_within(&self, t: Duration) -> Option<WorkCompletion> {
        self.cq.wait_one(t).unwrap()
    }

    fn recv(&self, wr_id: u64, mr: &MemoryRegion, len: usize) {
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sgl: SgList::single(mr.sge(0, len)),
            })
            .unwrap();
    }

    fn send(&self, wr_id: u64, opcode: WrOpcode, sgl: SgList) {
        self.qp
            .post_send(&SendWr {
                wr_id,
                opcode,
                sgl,
                signaled: true,
                solicited: false,
            })
            .unwrap();
    }
}

/// Two connected QPs on the test device. `prep` runs on (client, server)
/// before they connect (post receives there: a Send may arrive at once).
fn pair(prep: impl FnOnce(&End, &End)) -> (End, End) {
    let (c, s) = (End::new(), End::new());
    prep(&c, &s);
    let ctx = Context::open_device(&device()).unwrap();
    let l = Listener::bind_on(&ctx, addr(), MpaConfig::default()).unwrap();
    let to = l.local_addr();
    std::thread::scope(|sc| {
        let srv = sc.spawn(|| {
            let req = l.get_request(Some(T)).unwrap();
            req.accept(&s.qp, &ConnParam::default()).unwrap();
        });
        cm::connect(
            &c.qp,
            to,
            &ConnParam {
                timeout: T,
                ..ConnParam::default()
            },
        )
        .unwrap();
        srv.join().unwrap();
    });
    (c, s)
}

/// Whether the test device is Linux siw, where the calling test does not
/// apply (for `why`, printed with the device's name).
fn skipped_on_siw(why: &str) -> bool {
    let d = device();
    if d.starts_with("siw") {
        eprintln!("skipped on {d}: {why}");
        return true;
    }
    false
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn sends_writes_and_reads_move_the_bytes() {
    let rbuf_len = 8192;
    let mut rbuf = None;
    let (c, s) = pair(|_, s| {
        let m = s.mr(rbuf_len, Access::LOCAL_WRITE);
        s.recv(1, &m, rbuf_len);
        rbuf = Some(m);
    });
    let rbuf = rbuf.unwrap();
    // A Send gathered from two SGEs lands in one receive.
    let src = c.mr(8192, Access::LOCAL_WRITE);
    let p = pattern(3000, 7);
    src.write_at(0, &p[..1000]);
    src.write_at(5000, &p[1000..]);
    let sgl = SgList::from_slice(&[src.sge(0, 1000), src.sge(5000, 2000)]).unwrap();
    c.send(10, WrOpcode::Send, sgl);
    let wc = c.wc("Send");
    assert_eq!(wc.status, WcStatus::Success, "Send: {wc:?}");
    let wc = s.wc("receive");
    assert_eq!(wc.status, WcStatus::Success, "receive: {wc:?}");
    assert_eq!(wc.byte_len, 3000);
    let mut got = vec![0u8; 3000];
    rbuf.read_at(0, &mut got);
    assert!(got == p, "the Send's bytes differ");

    // RDMA Write into the server's region, then Read it back into a
    // different local region: 1 byte, a page, 1 MiB.
    let len = 1 << 20;
    let target = s.mr(
        len,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    );
    let wsrc = c.mr(len, Access::LOCAL_WRITE);
    let sink = c.mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for (i, n) in [1usize, 4096, len].into_iter().enumerate() {
        let p = pattern(n, i as u8 + 1);
        wsrc.write_at(0, &p);
        c.send(
            20 + i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: target.addr(),
                rkey: target.rkey(),
            },
            SgList::single(wsrc.sge(0, n)),
        );
        let wc = c.wc("RDMA Write");
        assert_eq!(wc.status, WcStatus::Success, "Write of {n}: {wc:?}");
        c.send(
            30 + i as u64,
            WrOpcode::RdmaRead {
                remote_addr: target.addr(),
                rkey: target.rkey(),
            },
            SgList::single(sink.sge(0, n)),
        );
        let wc = c.wc("RDMA Read");
        assert_eq!(wc.status, WcStatus::Success, "Read of {n}: {wc:?}");
        let mut back = vec![0u8; n];
        sink.read_at(0, &mut back);
        assert!(back == p, "{n} bytes written and read back differ");
        // What the Read returned is what the server's memory holds.
        let mut there = vec![0u8; n];
        target.read_at(0, &mut there);
        assert!(there == p, "{n} bytes in the server's region differ");
    }
}

/// Post a Read of `len` bytes at `remote_addr` with `rkey` and return its
/// completion.
fn read_once(c: &End, remote_addr: u64, rkey: u32, len: usize) -> WorkCompletion {
    let sink = c.mr(len.max(1), Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    c.send(
        1,
        WrOpcode::RdmaRead { remote_addr, rkey },
        SgList::single(sink.sge(0, len)),
    );
    c.wc("RDMA Read that must fail")
}

#[test]
fn a_read_with_an_unknown_stag_fails() {
    let (c, s) = pair(|_, _| {});
    let m = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    // Another key of the same region (a different key byte) is not valid.
    let bad = m.rkey() ^ 0x5a;
    let wc = read_once(&c, m.addr(), bad, 64);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
}

#[test]
fn a_read_past_the_region_fails() {
    let (c, s) = pair(|_, _| {});
    let m = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let wc = read_once(&c, m.addr() + 4096 - 16, m.rkey(), 64);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
}

#[test]
fn a_read_without_remote_read_rights_fails() {
    // Linux siw (6.1) does not check REMOTE_READ on the region a Read
    // Request names: siw_qp_tx.c checks a Read Response's source with no
    // permission bits ("not defined in RDMA core"), so the Read succeeds.
    // Found by this test on siw0; rxe0 and soft refuse it. Not this
    // crate's to fix (the kernel serves the Read).
    if skipped_on_siw("Linux siw serves Reads of regions without REMOTE_READ") {
        return;
    }
    let (c, s) = pair(|_, _| {});
    let m = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wc = read_once(&c, m.addr(), m.rkey(), 64);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
}

#[test]
fn a_write_without_remote_write_rights_is_refused() {
    // On Linux siw (6.1) neither the refused Write nor the Read behind it
    // completed within 10 s in 3 of 14 runs on siw0, with or without a
    // disconnect and after the TCP connection had closed; in the others
    // the Read failed as it must. Not understood yet (docs/RDMA_CORE.md);
    // rxe0 and soft pass every time.
    if skipped_on_siw("Linux siw sometimes completes neither request") {
        return;
    }
    let (c, s) = pair(|_, _| {});
    let ro = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    ro.write_at(0, &[0xee; 64]);
    let src = c.mr(64, Access::LOCAL_WRITE);
    src.write_at(0, &[0x11; 64]);
    c.send(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: ro.addr(),
            rkey: ro.rkey(),
        },
        SgList::single(src.sge(0, 64)),
    );
    // iWARP completes the Write when TCP has it and the responder's
    // Terminate fails what follows; RoCE NAKs the Write itself. Either
    // way the Read behind it cannot succeed.
    let sink = c.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let posted = c.qp.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::RdmaRead {
            remote_addr: ro.addr(),
            rkey: ro.rkey(),
        },
        sgl: SgList::single(sink.sge(0, 64)),
        signaled: true,
        solicited: false,
    });
    // Accepted even if the responder's Terminate was in before it was
    // posted: a queue pair in the error state flushes what is posted (siw
    // `siw_sq_flush_wr`).
    posted.unwrap_or_else(|e| panic!("posting the Read: {e}"));
    // The Read's completion, whatever became of the Write's (Success where
    // the transport completes a Write once sent, an error, or a flush).
    let mut seen = Vec::new();
    let read = loop {
        let wc = c.wc("the Write and the Read behind it");
        seen.push(wc);
        if wc.wr_id == 2 {
            break wc;
        }
    };
    assert_ne!(read.status, WcStatus::Success, "{seen:?}");
    let mut b = [0u8; 64];
    ro.read_at(0, &mut b);
    assert_eq!(b, [0xee; 64], "the refused Write changed the region");
}

#[test]
fn a_send_longer_than_the_receive_fails_at_the_receiver() {
    let mut small = None;
    let (c, s) = pair(|_, s| {
        let m = s.mr(64, Access::LOCAL_WRITE);
        s.recv(1, &m, 64);
        small = Some(m);
    });
    let src = c.mr(4096, Access::LOCAL_WRITE);
    c.send(2, WrOpcode::Send, SgList::single(src.sge(0, 4096)));
    let wc = s.wc("receive too small");
    assert_eq!(wc.wr_id, 1);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
    drop(small);
}

#[test]
fn a_disconnect_flushes_the_posted_receives() {
    let mut bufs = None;
    let (c, s) = pair(|_, s| {
        let m = s.mr(256, Access::LOCAL_WRITE);
        s.recv(1, &m, 128);
        s.recv(2, &m, 128);
        bufs = Some(m);
    });
    c.qp.disconnect();
    for want in [1, 2] {
        let wc = s.wc("flushed receive");
        assert_eq!(wc.wr_id, want);
        assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
    }
    drop(bufs);
}

/// After the QP is in the error state (here: the peer disconnected), a
/// posted request is not refused: the device completes it with a flush
/// status, the send queue's even when unsignaled (siw `siw_post_send` →
/// `siw_sq_flush_wr`, `siw_post_receive` → `siw_rq_flush_wr`; rxe
/// likewise). `ib_drain_qp` is built on that.
#[test]
fn requests_posted_in_the_error_state_are_flushed() {
    let (c, s) = pair(|_, _| {});
    s.qp.disconnect();
    // The client learns of the disconnect and moves to the error state.
    let deadline = std::time::Instant::now() + T;
    while !matches!(c.qp.state(), iwarp::QpState::Error | iwarp::QpState::Closed) {
        assert!(
            std::time::Instant::now() < deadline,
            "client QP still {:?} {T:?} after the peer's disconnect on {}",
            c.qp.state(),
            device()
        );
        let _ = c.qp.next_event(Duration::from_millis(20));
    }
    let m = c.mr(64, Access::LOCAL_WRITE);
    c.recv(1, &m, 64);
    c.qp.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        sgl: SgList::single(m.sge(0, 8)),
        signaled: false,
        solicited: false,
    })
    .unwrap_or_else(|e| panic!("posting in the error state on {}: {e}", device()));
    let mut got = [c.wc("flushed receive"), c.wc("flushed unsignaled Send")];
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        got.map(|w| (w.wr_id, w.status, w.queue)),
        [
            (1, WcStatus::WrFlushErr, WcQueue::Recv),
            (2, WcStatus::WrFlushErr, WcQueue::Send)
        ],
        "on {}",
        device()
    );
    assert!(c.wc_within(Duration::from_millis(100)).is_none());
}

/// `QueuePair::drain`, the `ib_drain_qp` equivalent, on a connected QP
/// with receives outstanding: every request posted before it comes back
/// (flushed) among what it returns, its own markers do not, and the CQ is
/// empty afterwards.
#[test]
fn drain_returns_the_outstanding_requests_flushed() {
    let mut bufs = None;
    let (c, s) = pair(|c, _| {
        let m = c.mr(256, Access::LOCAL_WRITE);
        for id in [1, 2, 3] {
            c.recv(id, &m, 64);
        }
        bufs = Some(m);
    });
    let wcs =
        c.qp.drain(T)
            .unwrap_or_else(|e| panic!("drain on {}: {e}", device()));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let f = WcStatus::WrFlushErr;
    assert_eq!(got, vec![(1, f), (2, f), (3, f)], "on {}", device());
    assert!(wcs.iter().all(|w| w.wr_id != DRAIN_WR_ID));
    // ibv_poll_cq(3): with a status other than success only wr_id,
    // status, qp_num and vendor_err are valid. siw0 sets the opcode of a
    // flushed receive, rxe0 does not; the software provider does.
    if device() == "soft" {
        assert!(wcs.iter().all(|w| w.opcode == WcOpcode::Recv));
    }
    assert!(c.cq.is_empty(), "{} left in the CQ", c.cq.len());
    drop((bufs, s));
}
