//! Session setup in one round of handshakes (issue 27): the active side
//! opens the control connection and every data stream at once, the
//! passive side takes them in any order, and anything that does not
//! belong to the session is refused with a reason instead of hanging it
//! or joining it.
//!
//! The "at once" tests need no clock: a raw server that answers nothing
//! until every connection of the session has arrived. A client that
//! waited for one connection's answer before opening the next would
//! never get there (it fails at its connect timeout).

use std::io::{Cursor, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use iwarp::cm::{self, CmError, ConnParam, Listener, MpaConfig};
use iwarp::{Context, QpInitAttr, QueuePair};
use rdma_xfer::hello::{Hello, HelloAck, Proposal, ACK_LEN, CONTROL, HELLO_LEN, REFUSAL_MAGIC};
use rdma_xfer::{connect, Config, Mode, ReadSource, WriteSink, XferListener};

/// Bound on every wait of these tests.
const WAIT: Duration = Duration::from_secs(10);

fn cfg(streams: u32) -> Config {
    Config {
        streams,
        block_size: 64 << 10,
        iodepth: 2,
        timeout: WAIT,
        connect_timeout: WAIT,
        ..Config::default()
    }
}

fn proposal(streams: u32) -> Proposal {
    Proposal::of(&cfg(streams))
}

/// Raw verbs for a hand-made client or server.
struct Raw {
    ctx: Context,
    pd: iwarp::ProtectionDomain,
    cq: iwarp::CompletionQueue,
}

impl Raw {
    fn new() -> Raw {
        let ctx = Context::open_device("soft").unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256).unwrap();
        Raw { ctx, pd, cq }
    }

    fn qp(&self) -> QueuePair {
        self.pd
            .create_qp(&QpInitAttr {
                send_cq: self.cq.clone(),
                recv_cq: self.cq.clone(),
                max_send_wr: 8,
                max_recv_wr: 8,
            })
            .unwrap()
    }

    /// Connect a fresh QP with `setup` as the MPA Request's private data.
    fn connect(&self, addr: SocketAddr, setup: &[u8]) -> (QueuePair, Result<Vec<u8>, CmError>) {
        let qp = self.qp();
        let r = cm::connect(
            &qp,
            addr,
            &ConnParam {
                private_data: setup.to_vec(),
                timeout: WAIT,
                ..ConnParam::default()
            },
        );
        (qp, r)
    }
}

fn hello(token: u64, index: u32, streams: u32) -> Vec<u8> {
    Hello {
        token,
        index,
        proposal: proposal(streams),
        features: 0,
    }
    .emit()
    .to_vec()
}

fn refused_with(r: Result<Vec<u8>, CmError>, what: &str) {
    match r {
        Err(CmError::Rejected { private_data, .. }) => {
            let why = String::from_utf8_lossy(&private_data);
            assert!(
                why.contains(what),
                "refused with {why:?}, expected {what:?}"
            );
        }
        other => panic!("expected a refusal ({what}), got {other:?}"),
    }
}

#[test]
fn rdma_streams_in_any_order_and_intruders_are_refused_with_a_reason() {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, cfg(2)).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || l.accept(WAIT));
    let c = Raw::new();
    let mut keep = Vec::new();

    refused_with(
        c.connect(addr, &hello(token ^ 1, CONTROL, 2)).1,
        "bad session token",
    );
    refused_with(
        c.connect(addr, b"not a session").1,
        "does not speak rdma-xfer",
    );
    // The setup of the version before this one (sequential streams).
    let mut old = b"RFTX".to_vec();
    old.extend_from_slice(&token.to_be_bytes());
    old.extend_from_slice(&u32::MAX.to_be_bytes());
    refused_with(c.connect(addr, &old).1, "older rdma-xfer setup");

    // A data stream first: it fixes the session's proposal.
    let (qp, r) = c.connect(addr, &hello(token, 1, 2));
    r.expect("stream 1 is part of the session");
    keep.push(qp);
    refused_with(
        c.connect(addr, &hello(token, 1, 2)).1,
        "stream 1 of the session is already open",
    );
    refused_with(
        c.connect(addr, &hello(token, 5, 2)).1,
        "outside the 2 proposed",
    );
    refused_with(c.connect(addr, &hello(token, 0, 3)).1, "proposes");
    let (qp, r) = c.connect(addr, &hello(token, 0, 2));
    r.expect("stream 0 is part of the session");
    keep.push(qp);
    // The control connection last, with the grant in its MPA Reply.
    let (qp, r) = c.connect(addr, &hello(token, CONTROL, 2));
    keep.push(qp);
    let ack = HelloAck::parse(&r.expect("the control connection")).unwrap();
    assert_eq!(ack.granted, proposal(2));

    let t = server.join().unwrap().expect("the session, undisturbed");
    assert_eq!(t.config().streams, 2);
    assert_eq!(t.session_id(), ack.session);
    drop(keep);
}

#[test]
fn tcp_streams_in_any_order_and_intruders_are_refused_with_a_reason() {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Tcp, cfg(2)).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || {
        let mut t = l.accept(WAIT)?;
        let mut sink = WriteSink(Vec::new());
        t.recv(&mut sink).map(|_| (t.session_id(), sink.0))
    });
    let open = |setup: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(setup).unwrap();
        s
    };
    let refusal = |mut s: TcpStream| {
        let mut r = Vec::new();
        let _ = s.read_to_end(&mut r);
        assert!(r.starts_with(REFUSAL_MAGIC), "not a refusal: {r:?}");
        String::from_utf8_lossy(&r[8..]).into_owned()
    };
    let s1 = open(&hello(token, 1, 2));
    let why = refusal(open(&hello(token ^ 1, 0, 2)));
    assert!(why.contains("bad session token"), "{why}");
    let why = refusal(open(&hello(token, 1, 2)));
    assert!(
        why.contains("stream 1 of the session is already open"),
        "{why}"
    );
    let why = refusal(open(&hello(token, CONTROL, 2)));
    assert!(why.contains("no separate control"), "{why}");
    let mut s0 = open(&hello(token, 0, 2));
    let mut ack = [0u8; ACK_LEN];
    s0.read_exact(&mut ack).unwrap();
    let ack = HelloAck::parse(&ack).unwrap();
    assert_eq!(ack.granted, proposal(2));
    // One block on each stream (frame: kind 1, len, seq), then End on
    // both: the session the intruders tried to join delivers in order.
    let frame = |kind: u32, len: u32, seq: u64| {
        let mut h = kind.to_be_bytes().to_vec();
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(&seq.to_be_bytes());
        h
    };
    let mut s1 = s1;
    for (s, seq, body) in [(&mut s0, 0u64, b"first "), (&mut s1, 1, b"second")] {
        s.write_all(&frame(1, 6, seq)).unwrap();
        s.write_all(body).unwrap();
    }
    for s in [&mut s0, &mut s1] {
        s.write_all(&frame(2, 0, 2)).unwrap();
        s.write_all(&12u64.to_be_bytes()).unwrap();
    }
    let (session, data) = server.join().unwrap().expect("the session, undisturbed");
    assert_eq!(session, ack.session);
    assert_eq!(data, b"first second");
}

/// A raw RDMA server that answers nothing until the control connection
/// and all `streams` data streams have arrived, then accepts them all.
fn patient_rdma_server(l: Listener, streams: u32) -> std::thread::JoinHandle<Vec<QueuePair>> {
    std::thread::spawn(move || {
        let s = Raw::new();
        let mut reqs = Vec::new();
        while reqs.len() < streams as usize + 1 {
            reqs.push(
                l.get_request(Some(WAIT))
                    .expect("every connection arrives unanswered"),
            );
        }
        let mut qps = Vec::new();
        for r in reqs {
            let h = Hello::parse(r.private_data()).unwrap();
            let pd = if h.index == CONTROL {
                HelloAck {
                    session: 7,
                    granted: h.proposal,
                    features: 0,
                }
                .emit()
                .to_vec()
            } else {
                Vec::new()
            };
            let qp = s.qp();
            r.accept(
                &qp,
                &ConnParam {
                    private_data: pd,
                    ..ConnParam::default()
                },
            )
            .unwrap();
            qps.push(qp);
        }
        let _keep = s.ctx;
        qps
    })
}

#[test]
fn rdma_client_opens_every_connection_before_any_answer() {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), MpaConfig::default()).unwrap();
    let addr = l.local_addr();
    let server = patient_rdma_server(l, 4);
    let t = connect(addr, Mode::Rdma, 1, cfg(4)).expect("connected without a per-stream answer");
    assert_eq!((t.config().streams, t.session_id()), (4, 7));
    assert_eq!(server.join().unwrap().len(), 5);
}

#[test]
fn tcp_client_opens_every_stream_before_any_answer() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        l.set_nonblocking(false).unwrap();
        let mut got = Vec::new();
        for _ in 0..4 {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            let mut h = [0u8; HELLO_LEN];
            s.read_exact(&mut h)
                .expect("every Hello arrives unanswered");
            got.push((Hello::parse(&h).unwrap(), s));
        }
        let (h, s0) = got.iter_mut().find(|(h, _)| h.index == 0).unwrap();
        let ack = HelloAck {
            session: 7,
            granted: h.proposal,
            features: 0,
        };
        s0.write_all(&ack.emit()).unwrap();
        got
    });
    let t = connect(addr, Mode::Tcp, 1, cfg(4)).expect("connected");
    assert_eq!((t.config().streams, t.session_id()), (4, 7));
    let mut idx: Vec<u32> = server
        .join()
        .unwrap()
        .iter()
        .map(|(h, _)| h.index)
        .collect();
    idx.sort();
    assert_eq!(idx, [0, 1, 2, 3]);
}

/// A sink sends its `Fin` and closes the session at once (the server
/// thread returns and drops it), so the flushes of the source's receives
/// follow the `Fin` closely. The transfer completed: the source's `send`
/// says so. It said `Disconnected("the peer closed the connection or
/// vanished")` when the source looked at the session's failure before at
/// the `Fin` it had, or took a data stream's close, seen before the `Fin`
/// on another connection, for a failure (session 11: 4 % of runs of the
/// test below under load). One run catches it rarely; `SESSIONS` runs in
/// about a second catch it most of the time under load.
#[test]
fn a_sink_that_closes_right_after_its_fin_confirms_the_transfer() {
    const SESSIONS: usize = 25;
    for mode in [Mode::Rdma, Mode::Tcp] {
        for i in 0..SESSIONS {
            let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), mode, cfg(2)).unwrap();
            let (addr, token) = (l.local_addr(), l.token());
            let server = std::thread::spawn(move || {
                let mut t = l.accept(WAIT)?;
                let mut sink = WriteSink(Vec::new());
                t.recv(&mut sink).map(|_| sink.0)
                // `t` closes here, right after its Fin.
            });
            let mut t =
                connect(addr, mode, token, cfg(2)).unwrap_or_else(|e| panic!("{mode}: {e}"));
            let data: Vec<u8> = (0..100_000u32).map(|x| (x * 3) as u8).collect();
            let sent = t.send(&mut ReadSource(Cursor::new(&data)));
            let got = server.join().unwrap();
            sent.unwrap_or_else(|e| {
                panic!(
                    "{mode}, session {i}: the sink finished ({:?}) but the source says {e}",
                    got.as_ref().map(|g| g.len())
                )
            });
            assert!(got.unwrap() == data, "{mode}: the data differs");
        }
    }
}

#[test]
fn fewer_streams_granted_than_proposed_still_transfer() {
    for mode in [Mode::Rdma, Mode::Tcp] {
        let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), mode, cfg(2)).unwrap();
        let (addr, token) = (l.local_addr(), l.token());
        let server = std::thread::spawn(move || {
            let mut t = l.accept(WAIT)?;
            let mut sink = WriteSink(Vec::new());
            t.recv(&mut sink).map(|_| (t.config().streams, sink.0))
        });
        let mut t = connect(addr, mode, token, cfg(6)).unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert_eq!(t.config().streams, 2, "{mode}");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        t.send(&mut ReadSource(Cursor::new(&data))).unwrap();
        let (streams, got) = server.join().unwrap().unwrap();
        assert_eq!(streams, 2, "{mode}");
        assert!(got == data, "{mode}: the data differs");
    }
}
