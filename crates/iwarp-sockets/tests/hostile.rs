//! A hostile rsockets peer, built from raw verbs, against our `Stream`:
//! malformed or unexpected control messages, data beyond the credits we
//! granted, a byte count beyond the ring we advertised, and RDMA Writes
//! outside the ring. Each must end the connection with `ConnectionReset`,
//! deliver nothing corrupted, and hang nothing. Also: private data that is
//! not an `rs_conn_data`, in both directions.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam, MpaConfig};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, QpInitAttr, QueuePair, RecvWr, SendWr, SgList,
    WcStatus, WrOpcode,
};
use iwarp_sockets::wire::{ByteOrder, ConnDataRepr, Message, MsgWord, Op, Sge};
use iwarp_sockets::{Listener, Options, Stream};

const T: Duration = Duration::from_secs(10);

/// The raw peer: a queue pair with receives posted, a target SGL, and a
/// scratch region for what it sends.
struct Raw {
    _ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    _tsgl: MemoryRegion,
    _rbuf: MemoryRegion,
    scratch: MemoryRegion,
    /// The stream's conn data: where we may write.
    theirs: ConnDataRepr,
    next: usize,
}

impl Raw {
    fn parts() -> (
        Context,
        CompletionQueue,
        QueuePair,
        MemoryRegion,
        MemoryRegion,
        MemoryRegion,
    ) {
        let ctx = Context::open().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(512).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: 128,
                max_recv_wr: 128,
            })
            .unwrap();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let tsgl = pd.reg_mr(32, rw).unwrap();
        let rbuf = pd.reg_mr(8192 + 4 * 128, rw).unwrap();
        let scratch = pd.reg_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
        for slot in 0..128u64 {
            qp.post_recv(&RecvWr {
                wr_id: slot,
                sgl: SgList::single(rbuf.sge(8192 + 4 * slot as usize, 4)),
            })
            .unwrap();
        }
        (ctx, cq, qp, tsgl, rbuf, scratch)
    }

    fn conn_data(tsgl: &MemoryRegion, rbuf: &MemoryRegion) -> Vec<u8> {
        ConnDataRepr {
            order: ByteOrder::NATIVE,
            iomap: false,
            other_flags: 0,
            credits: 64,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: tsgl.addr(),
                key: tsgl.rkey(),
                length: 2,
            },
            data_buf: Sge {
                addr: rbuf.addr(),
                key: rbuf.rkey(),
                length: 4096,
            },
        }
        .to_bytes()
        .to_vec()
    }

    /// Connects to a listening `Stream` server.
    fn connect(addr: SocketAddr) -> Raw {
        let (ctx, cq, qp, tsgl, rbuf, scratch) = Raw::parts();
        let pd = Raw::conn_data(&tsgl, &rbuf);
        let reply = cm::connect(
            &qp,
            addr,
            &ConnParam {
                private_data: pd,
                ..Default::default()
            },
        )
        .unwrap();
        let theirs = ConnDataRepr::parse_bytes(&reply).unwrap();
        Raw {
            _ctx: ctx,
            cq,
            qp,
            _tsgl: tsgl,
            _rbuf: rbuf,
            scratch,
            theirs,
            next: 0,
        }
    }

    fn post(&mut self, opcode: WrOpcode, bytes: &[u8]) {
        let off = self.next;
        self.next = (self.next + 4096) % (1 << 20);
        self.scratch.write_at(off, bytes);
        let sgl = if bytes.is_empty() {
            SgList::new()
        } else {
            SgList::single(self.scratch.sge(off, bytes.len()))
        };
        self.qp
            .post_send(&SendWr {
                wr_id: off as u64,
                opcode,
                sgl,
                signaled: false,
                solicited: false,
            })
            .unwrap();
    }

    fn word(&mut self, w: MsgWord) {
        self.post(WrOpcode::Send, &w.to_send_payload(ByteOrder::NATIVE));
    }

    fn msg(&mut self, m: Message) {
        self.word(m.emit().unwrap());
    }

    /// A legitimate data message: `bytes` at offset `at` of their first
    /// half, then the DATA word.
    fn data(&mut self, at: u64, bytes: &[u8]) {
        let d = self.theirs.data_buf;
        self.post(
            WrOpcode::RdmaWrite {
                remote_addr: d.addr + at,
                rkey: d.key,
            },
            bytes,
        );
        self.msg(Message::Data {
            len: bytes.len() as u32,
        });
    }
}

/// A `Stream` server and the raw client connected to it.
fn server_and_raw() -> (Stream, Raw) {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = l.accept().map(|(s, _)| s);
        let _ = tx.send(r);
    });
    let raw = Raw::connect(addr);
    let s = rx.recv_timeout(T).expect("accepted").unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    (s, raw)
}

/// Reads until an error; returns the bytes read, the error kind, and how
/// long it took. The error's text is checked against `why`.
fn read_until_error_why(s: &Stream, why: &str) -> (Vec<u8>, std::io::ErrorKind, Duration) {
    let t = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return (got, std::io::ErrorKind::UnexpectedEof, t.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => {
                assert!(
                    e.to_string().contains(why),
                    "error {e:?} does not name {why:?}"
                );
                return (got, e.kind(), t.elapsed());
            }
        }
        assert!(t.elapsed() < T, "no error within {T:?}");
    }
}

fn expect_reset(s: &Stream, good: &[u8], why: &str) {
    let (got, kind, took) = read_until_error_why(s, why);
    // What was delivered is legitimate data; bytes still queued when the
    // violation is seen are dropped (the peer may have written anywhere in
    // the ring before its bad word), so this is a prefix, maybe empty.
    assert!(
        good.starts_with(&got),
        "delivered {got:?}, not a prefix of {good:?}"
    );
    assert_eq!(kind, std::io::ErrorKind::ConnectionReset);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Writes fail too, at once.
    let e = s.send(b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

#[test]
fn legitimate_data_is_delivered() {
    let (s, mut raw) = server_and_raw();
    raw.data(0, b"hello");
    let mut buf = [0u8; 5];
    (&s).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
}

#[test]
fn a_reserved_op_resets_the_stream() {
    for op in [Op::RsvdDataMore, Op::RsvdDraMore, Op::Rsvd] {
        let (s, mut raw) = server_and_raw();
        raw.data(0, b"good");
        raw.word(MsgWord::new(op, 5).unwrap());
        expect_reset(&s, b"good", "malformed message word");
    }
}

#[test]
fn an_unknown_control_value_and_unasked_ops_reset_the_stream() {
    for (w, why) in [
        (
            MsgWord::new(Op::Ctrl, 77).unwrap(),
            "malformed message word",
        ),
        (MsgWord::new(Op::Write, 16).unwrap(), "never asked for"),
        (MsgWord::new(Op::IomapSgl, 0).unwrap(), "never asked for"),
    ] {
        let (s, mut raw) = server_and_raw();
        raw.data(0, b"ok");
        raw.word(w);
        expect_reset(&s, b"ok", why);
    }
}

#[test]
fn a_short_message_word_resets_the_stream() {
    let (s, mut raw) = server_and_raw();
    raw.data(0, b"abc");
    raw.post(WrOpcode::Send, &[1, 2]);
    expect_reset(&s, b"abc", "malformed message word");
}

#[test]
fn data_beyond_the_credits_granted_resets_the_stream() {
    let (s, mut raw) = server_and_raw();
    // The stream granted rq_size (384) credits; send one more data message
    // of one byte each without reading anything on the other side.
    let credits = Options::default().rq_size as u64;
    for i in 0..=credits {
        raw.data(i % 4096, b"z");
    }
    // Read nothing until all of it has arrived: no credit is returned.
    thread::sleep(Duration::from_millis(500));
    let (got, kind, _) = read_until_error_why(&s, "beyond its credits");
    assert!(got.iter().all(|&b| b == b'z'));
    assert!(got.len() as u64 <= credits);
    assert_eq!(kind, std::io::ErrorKind::ConnectionReset);
}

#[test]
fn a_byte_count_beyond_the_advertised_ring_resets_the_stream() {
    let (s, mut raw) = server_and_raw();
    raw.data(0, b"fine");
    // Claim more bytes than the half advertised (64 KiB) without writing.
    raw.msg(Message::Data { len: 1 << 20 });
    expect_reset(&s, b"fine", "outside the ring");
}

#[test]
fn an_rdma_write_outside_the_ring_is_refused_with_a_terminate() {
    let (s, mut raw) = server_and_raw();
    raw.data(0, b"before");
    let d = raw.theirs.data_buf;
    // Far past the end of the receive region (registered as large as the
    // ring may grow, at most 1 GiB): the memory check refuses it.
    raw.post(
        WrOpcode::RdmaWrite {
            remote_addr: d.addr + (2 << 30),
            rkey: d.key,
        },
        b"evil",
    );
    expect_reset(&s, b"before", "iWARP connection failed");
    // The raw peer was told why: a Terminate, its queue pair in error.
    let t = Instant::now();
    let mut terminated = false;
    while t.elapsed() < T && !terminated {
        if let Some(ev) = raw.qp.next_event(Duration::from_millis(100)) {
            terminated = format!("{ev:?}").contains("Terminate");
        }
    }
    assert!(terminated, "the hostile peer received no Terminate");
    // And its outstanding work completes with errors, nothing hangs.
    let mut flushed = false;
    let t = Instant::now();
    while t.elapsed() < T && !flushed {
        if let Ok(Some(wc)) = raw.cq.wait_one(Duration::from_millis(100)) {
            flushed = wc.status != WcStatus::Success;
        }
    }
    assert!(flushed);
}

#[test]
fn private_data_that_is_not_an_rs_conn_data_is_refused_both_ways() {
    // A plain verbs client at our listener: rejected, and the listener
    // goes on to serve the next (good) client.
    let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(l.accept().map(|(s, _)| s));
    });
    let (_c, _cq, qp, _t, _r, _s) = Raw::parts();
    let e = cm::connect(
        &qp,
        addr,
        &ConnParam {
            private_data: b"not rsockets".to_vec(),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, cm::CmError::Rejected { .. } | cm::CmError::Closed { .. }),
        "{e}"
    );
    let good = Stream::connect(addr).unwrap();
    let served = rx.recv_timeout(T).expect("accepted").unwrap();
    drop((good, served));

    // Our client against a verbs server whose reply is not an
    // rs_conn_data: InvalidData, no hang.
    let vl = cm::Listener::bind("127.0.0.1:0".parse().unwrap(), MpaConfig::default()).unwrap();
    let vaddr = vl.local_addr();
    let h = thread::spawn(move || {
        let (_c, _cq, qp, _t, _r, _s) = Raw::parts();
        let req = vl.get_request(Some(T)).unwrap();
        req.accept(
            &qp,
            &ConnParam {
                private_data: vec![9; 8],
                ..Default::default()
            },
        )
        .unwrap();
        thread::sleep(Duration::from_millis(500));
    });
    let e = Stream::connect(vaddr).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    h.join().unwrap();
}
