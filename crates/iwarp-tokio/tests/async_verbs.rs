//! The async verbs against the software provider over loopback: connect,
//! accept, completions on the reactor, a silent client, a peer gone. Every
//! wait is bounded ([`T`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::cm::{ConnParam, Listener};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProgressMode, ProtectionDomain, QpInitAttr,
    QueuePair, RecvWr, SendWr, SgList, WcStatus, WrOpcode,
};
use iwarp_proto::handshake::MpaConfig;
use iwarp_tokio::{AsyncCq, AsyncListener};

const T: Duration = Duration::from_secs(10);
const APP: ProgressMode = ProgressMode::AppDriven {
    spin: Duration::ZERO,
};
const THREADED: ProgressMode = ProgressMode::Threaded {
    spin: Duration::ZERO,
};

struct Side {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: AsyncCq,
    qp: Arc<QueuePair>,
}

/// One side: a CQ for both queues, on the reactor in `mode`.
fn side(mode: ProgressMode) -> Side {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq: CompletionQueue = ctx.create_cq(256).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: 64,
            max_recv_wr: 64,
        })
        .unwrap();
    Side {
        _ctx: ctx,
        pd,
        cq: AsyncCq::new(cq, mode).unwrap(),
        qp: Arc::new(qp),
    }
}

fn param() -> ConnParam {
    ConnParam {
        timeout: T,
        ..Default::default()
    }
}

fn listener() -> AsyncListener {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), MpaConfig::default()).unwrap();
    AsyncListener::new(l, Duration::from_secs(1)).unwrap()
}

/// Connect `c` to `s` through `l`: both halves on this runtime.
async fn connect(l: &AsyncListener, c: &Side, s: &Side) {
    let addr: SocketAddr = l.local_addr();
    let client = iwarp_tokio::connect(c.qp.clone(), addr, param());
    let server = async {
        let req = l.next_request().await.unwrap();
        iwarp_tokio::accept(req, s.qp.clone(), param()).await
    };
    let (a, b) = tokio::time::timeout(T, async { tokio::join!(client, server) })
        .await
        .expect("connect and accept within T");
    a.unwrap();
    b.unwrap();
}

fn mr(pd: &ProtectionDomain, len: usize) -> MemoryRegion {
    pd.reg_mr(len, Access::ALL).unwrap()
}

fn send(wr_id: u64, mr: &MemoryRegion, len: usize) -> SendWr {
    SendWr {
        wr_id,
        opcode: WrOpcode::Send,
        sgl: SgList::single(mr.sge(0, len)),
        signaled: true,
        solicited: false,
    }
}

fn recv(qp: &QueuePair, wr_id: u64, mr: &MemoryRegion, len: usize) {
    qp.post_recv(&RecvWr {
        wr_id,
        sgl: SgList::single(mr.sge(0, len)),
    })
    .unwrap();
}

async fn next(cq: &AsyncCq) -> iwarp::WorkCompletion {
    cq.completion_timeout(T)
        .await
        .unwrap()
        .expect("a completion within T")
}

/// Ping-pong on ONE event-loop thread with both ends application-driven:
/// the only thread that reads either socket is the one running both
/// tasks, so any wait that blocked it would stall the other side (and the
/// test would time out).
#[test]
fn ping_pong_on_one_thread_both_ends_app_driven() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, s) = (side(APP), side(APP));
        let l = listener();
        let (cbuf, sbuf) = (mr(&c.pd, 64), mr(&s.pd, 64));
        // Receives before the connection, so nothing arrives unexpected.
        recv(&s.qp, 1, &sbuf, 64);
        recv(&c.qp, 1, &cbuf, 64);
        connect(&l, &c, &s).await;
        const ROUNDS: u64 = 200;
        let server = async {
            for i in 0..ROUNDS {
                let wc = next(&s.cq).await;
                assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 8));
                let mut b = [0u8; 8];
                sbuf.read_at(0, &mut b);
                assert_eq!(u64::from_le_bytes(b), i);
                recv(&s.qp, i + 2, &sbuf, 64);
                sbuf.write_at(0, &(i + 1000).to_le_bytes());
                s.qp.post_send(&send(i, &sbuf, 8)).unwrap();
                assert_eq!(next(&s.cq).await.status, WcStatus::Success);
            }
        };
        let client = async {
            for i in 0..ROUNDS {
                cbuf.write_at(0, &i.to_le_bytes());
                c.qp.post_send(&send(i, &cbuf, 8)).unwrap();
                // The send's completion and the echo, in either order.
                let mut echo = None;
                for _ in 0..2 {
                    let wc = next(&c.cq).await;
                    assert_eq!(wc.status, WcStatus::Success);
                    if wc.byte_len == 8 && wc.wr_id == i + 1 {
                        echo = Some(wc);
                    }
                }
                assert!(echo.is_some(), "round {i}: no echo");
                let mut b = [0u8; 8];
                cbuf.read_at(0, &mut b);
                assert_eq!(u64::from_le_bytes(b), i + 1000);
                recv(&c.qp, i + 2, &cbuf, 64);
            }
        };
        tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(server, client)
        })
        .await
        .expect("200 round trips within 60 s");
    });
}

/// RDMA Write then Send into a threaded server: the payload is placed and
/// the Send's completion arrives through the eventfd on the reactor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_send_threaded_server() {
    let (c, s) = (side(APP), side(THREADED));
    let l = listener();
    const LEN: usize = 1 << 20;
    let target = mr(&s.pd, LEN);
    let note = mr(&s.pd, 64);
    let src = mr(&c.pd, LEN);
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    src.write_at(0, &data);
    recv(&s.qp, 7, &note, 64);
    connect(&l, &c, &s).await;
    c.qp.post_send(&SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite {
            remote_addr: target.addr(),
            rkey: target.rkey(),
        },
        sgl: SgList::single(src.sge(0, LEN)),
        signaled: true,
        solicited: false,
    })
    .unwrap();
    c.qp.post_send(&send(2, &src, 8)).unwrap();
    let wc = next(&s.cq).await;
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    let mut got = vec![0u8; LEN];
    target.read_at(0, &mut got);
    assert!(got == data, "the written bytes differ");
    for id in [1, 2] {
        let wc = next(&c.cq).await;
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
}

/// A client that opens TCP and never sends its MPA Request: the listener
/// gives up on it after the handshake timeout without stopping the event
/// loop (a timer keeps ticking meanwhile), and the next real client is
/// accepted.
#[test]
fn silent_client_does_not_hold_the_event_loop() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = listener();
        let _silent = std::net::TcpStream::connect(l.local_addr()).unwrap();
        let started = Instant::now();
        let ticks = async {
            let mut n = 0u32;
            while started.elapsed() < Duration::from_millis(800) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                n += 1;
            }
            n
        };
        let (r, n) = tokio::join!(tokio::time::timeout(T, l.next_request()), ticks);
        let e = r.expect("the silent client ends within T").unwrap_err();
        assert!(
            e.to_string().contains("MPA Request"),
            "the error names the missing MPA Request: {e}"
        );
        // 800 ms of 20 ms sleeps: a blocked loop would give about one.
        assert!(n >= 10, "the event loop ticked only {n} times meanwhile");
        let (c, s) = (side(APP), side(APP));
        connect(&l, &c, &s).await;
    });
}

/// The server goes away with work outstanding: the client's completions
/// come back flushed through the reactor, the wait does not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_gone_completes_with_flush_errors() {
    let (c, s) = (side(APP), side(THREADED));
    let l = listener();
    let buf = mr(&c.pd, 64);
    recv(&c.qp, 99, &buf, 64);
    connect(&l, &c, &s).await;
    drop(s);
    let wc = next(&c.cq).await;
    assert_eq!((wc.wr_id, wc.status), (99, WcStatus::WrFlushErr));
    assert!(
        c.cq.completion_timeout(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none(),
        "nothing else was outstanding"
    );
}
