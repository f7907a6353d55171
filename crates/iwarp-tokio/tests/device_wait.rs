//! Waiting on the device that `IWARP_TEST_DEVICE` names (default `soft`)
//! between two queue pairs of one process over `IWARP_TEST_ADDR` (default
//! 127.0.0.1): `iwarp::wait::WaitSet` and this crate's adapter sleep on a
//! kernel device's CQ and QP as they do on the software provider's.
//! `cargo test` runs them on `soft`; `scripts/test-rdmacore.sh` runs this
//! test binary in the QEMU guest on siw0 and rxe0 through the rdma-core
//! provider, whose CQ descriptor is the eventfd its pump thread signals
//! and whose `QueuePair::event_fd` is an eventfd of the QP's event queue
//! (`crates/iwarp-rdmacore/src/events.rs`; before it, `None`).
//!
//! Every wait is bounded ([`T`]); a timeout asserted is a short one
//! (100 ms) that nothing should end early.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, Listener, MpaConfig};
use iwarp::wait::{CqInterest, Interest, Token, Until, WaitSet};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpEvent,
    QpInitAttr, QueuePair, RecvWr, SendWr, SgList, WcStatus, WrOpcode,
};
use iwarp_tokio::{AsyncCq, AsyncListener, AsyncQpEvents};

const T: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(100);
const CQ: Token = Token(1);
const EV: Token = Token(2);

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

fn open() -> Context {
    let name = device();
    Context::open_device(&name)
        .unwrap_or_else(|e| panic!("opening device {name} (IWARP_TEST_DEVICE): {e}"))
}

struct End {
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: Arc<QueuePair>,
    buf: MemoryRegion,
    _ctx: Context,
}

impl End {
    fn new(mode: ProgressMode) -> End {
        let ctx = open();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16).unwrap();
        cq.set_progress(mode).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: 8,
                max_recv_wr: 8,
            })
            .unwrap();
        let buf = pd.reg_mr(64, Access::ALL).unwrap();
        End {
            _pd: pd,
            cq,
            qp: Arc::new(qp),
            buf,
            _ctx: ctx,
        }
    }

    fn recv(&self, wr_id: u64) {
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sgl: SgList::single(self.buf.sge(0, 64)),
            })
            .unwrap();
    }

    fn send(&self, wr_id: u64, len: usize) {
        self.qp
            .post_send(&SendWr {
                wr_id,
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.buf.sge(0, len)),
                signaled: true,
                solicited: false,
            })
            .unwrap();
    }

    /// Take the events queued so far (`Established`).
    fn take_events(&self) {
        while self.qp.next_event(Duration::ZERO).is_some() {}
    }
}

fn param() -> ConnParam {
    ConnParam {
        timeout: T,
        ..ConnParam::default()
    }
}

/// (client, server) connected on the test device, each CQ in `mode`; the
/// server has one receive (wr_id 7) posted.
fn pair(mode: ProgressMode) -> (End, End) {
    let (c, s) = (End::new(mode), End::new(mode));
    s.recv(7);
    let ctx = open();
    let l = Listener::bind_on(&ctx, addr(), MpaConfig::default()).unwrap();
    let to = l.local_addr();
    std::thread::scope(|sc| {
        let srv = sc.spawn(|| {
            let req = l.get_request(Some(T)).unwrap();
            req.accept(&s.qp, &param()).unwrap();
        });
        cm::connect(&c.qp, to, &param()).unwrap();
        srv.join().unwrap();
    });
    (c, s)
}

/// A set of the server's CQ times out when nothing completes, then
/// returns when the client's Send completes the posted receive, in every
/// progress mode.
#[test]
fn a_waitset_on_the_devices_cq_wakes_for_a_completion_and_times_out_without() {
    let modes = [
        ProgressMode::Threaded {
            spin: Duration::ZERO,
        },
        ProgressMode::AppDriven {
            spin: Duration::ZERO,
        },
        ProgressMode::BusyPoll,
    ];
    for mode in modes {
        let (c, s) = pair(mode);
        let mut set = WaitSet::new();
        set.add_cq(&s.cq, CqInterest::Completions, CQ);
        let deadline = Instant::now() + SHORT;
        let w = set.wait(deadline).unwrap();
        assert!(w.is_timeout(), "{} {mode:?}: {w:?}", device());
        assert!(
            Instant::now() >= deadline,
            "{mode:?}: woke before the deadline"
        );
        c.buf.write_at(0, b"ping");
        c.send(1, 4);
        let deadline = Instant::now() + T;
        let w = set.wait(deadline).unwrap();
        assert!(
            w.is_ready(CQ) && Instant::now() < deadline,
            "{} {mode:?}: no completion within {T:?}: {w:?}",
            device()
        );
        let wc = s.cq.poll_one().expect("the completion the wait reported");
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (7, WcStatus::Success, 4)
        );
        let mut got = [0u8; 4];
        s.buf.read_at(0, &mut got);
        assert_eq!(&got, b"ping");
        // The client's Send completion, through its own CQ.
        assert_eq!(c.cq.wait_one(T).unwrap().map(|wc| wc.wr_id), Some(1));
    }
}

/// The peer disconnects while nothing is outstanding on the server:
/// nothing completes, so only the QP's event descriptor can end the
/// server's wait; it is readable until the event is taken.
#[test]
fn the_qp_event_fd_wakes_a_waitset_when_the_peer_disconnects() {
    let (c, s) = pair(ProgressMode::Threaded {
        spin: Duration::ZERO,
    });
    // The receive was posted for `pair`'s other uses: take it out of the
    // way with a Send, so nothing is outstanding on the server.
    c.send(1, 4);
    assert_eq!(s.cq.wait_one(T).unwrap().map(|wc| wc.wr_id), Some(7));
    assert_eq!(c.cq.wait_one(T).unwrap().map(|wc| wc.wr_id), Some(1));
    s.take_events();
    let efd = s.qp.event_fd().unwrap_or_else(|| {
        panic!(
            "{}: QueuePair::event_fd is None: the provider gives no descriptor for QP events",
            device()
        )
    });
    let mut set = WaitSet::new();
    set.add_cq(&s.cq, CqInterest::Completions, CQ);
    set.add_fd(efd, Interest::READABLE, EV);
    let w = set.wait(Instant::now() + SHORT).unwrap();
    assert!(w.is_timeout(), "{}: nothing happened yet: {w:?}", device());
    c.qp.disconnect();
    let deadline = Instant::now() + T;
    let w = set.wait(deadline).unwrap();
    assert!(
        w.is_ready(EV) && !w.is_ready(CQ) && Instant::now() < deadline,
        "{}: the peer's disconnect did not wake the wait within {T:?}: {w:?}",
        device()
    );
    // Readable until taken, and the event is the disconnect. (A short
    // deadline, not one already passed: the set returns at once for a
    // ready descriptor, but one whose deadline has passed does not look.)
    let w = set.wait(Instant::now() + SHORT).unwrap();
    assert!(w.is_ready(EV), "{}: no longer readable: {w:?}", device());
    let mut evs = Vec::new();
    while let Some(ev) = s.qp.next_event(Duration::ZERO) {
        evs.push(ev);
    }
    assert!(
        evs.contains(&QpEvent::Disconnected),
        "{}: events {evs:?}",
        device()
    );
    let w = set.wait(Until::after(SHORT)).unwrap();
    assert!(w.is_timeout(), "{}: taken, yet ready: {w:?}", device());
}

/// The adapter on the device: connect and accept as futures, a completion
/// awaited on the reactor, a bounded wait that times out, and the QP's
/// event descriptor on tokio's reactor for the peer's disconnect.
#[test]
fn the_tokio_adapter_runs_on_the_device() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mode = ProgressMode::AppDriven {
            spin: Duration::ZERO,
        };
        let (c, s) = (End::new(mode), End::new(mode));
        s.recv(7);
        let (ccq, scq) = (
            AsyncCq::new(c.cq.clone(), mode).unwrap(),
            AsyncCq::new(s.cq.clone(), mode).unwrap(),
        );
        let l = Listener::bind_on(&open(), addr(), MpaConfig::default()).unwrap();
        let l = AsyncListener::new(l, T).unwrap();
        let to = l.local_addr();
        let server = async {
            let req = l.next_request().await.unwrap();
            iwarp_tokio::accept(req, s.qp.clone(), param()).await
        };
        let client = iwarp_tokio::connect(c.qp.clone(), to, param());
        let (a, b) = tokio::time::timeout(T, async { tokio::join!(client, server) })
            .await
            .expect("connect and accept within T");
        a.unwrap();
        b.unwrap();
        assert!(
            scq.completion_timeout(SHORT).await.unwrap().is_none(),
            "nothing was sent yet"
        );
        c.buf.write_at(0, b"async");
        c.send(1, 5);
        let wc = scq
            .completion_timeout(T)
            .await
            .unwrap()
            .expect("the Send within T");
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (7, WcStatus::Success, 5)
        );
        let wc = ccq
            .completion_timeout(T)
            .await
            .unwrap()
            .expect("its completion");
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));

        s.take_events();
        let events = AsyncQpEvents::new(s.qp.clone()).unwrap();
        assert_eq!(
            events.next_timeout(SHORT).await.unwrap(),
            None,
            "no event yet"
        );
        c.qp.disconnect();
        // Nothing is outstanding on the server: only the event tells. In
        // application-driven mode the receive work that notices the peer's
        // close runs when the CQ is polled, so the loop awaits both.
        let ev = tokio::time::timeout(T, async {
            tokio::select! {
                ev = events.next() => ev.unwrap(),
                wc = scq.completion() => panic!("nothing was outstanding, yet {wc:?}"),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{}: the peer's disconnect within {T:?}", device()));
        assert_eq!(ev, QpEvent::Disconnected, "{}", device());
    });
}
