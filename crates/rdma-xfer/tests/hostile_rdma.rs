//! A hostile RDMA source, spoken with raw verbs: it writes a block, sends
//! its `BlockDone`, and then keeps RDMA-Writing the same block (the STag
//! it was granted) while the sink's application holds the block as
//! `&[u8]`. The sink must have ended that STag before handing the block
//! out (RFC 5041 §7.2: a tagged segment naming an invalid STag is refused
//! with a Terminate, DDP layer, tagged buffer error, invalid STag), so:
//!
//! - the bytes the application hashed when it got the block are the
//!   bytes it stores after the hostile writes had their chance, and they
//!   are the source's legitimate data;
//! - the hostile write is refused with that Terminate, never placed;
//! - the sink's transfer ends with an error naming the Terminate.
//!
//! Whether a hostile write was placed is learnt without sleeping: each
//! is followed on the same stream by a zero-length RDMA Read (STag 0,
//! RFC 6581's ready-to-receive form, which the sink answers without its
//! application). The sink processes one DDP stream in order (RFC 5040
//! §5.5), so a Read Response means the Write before it was placed; a
//! Terminate means it was refused.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, QpEvent, QpInitAttr, QueuePair, RecvWr, SendWr,
    SgList, WcStatus, WrOpcode,
};
use rdma_xfer::hello::{Hello, HelloAck, Proposal, CONTROL};
use rdma_xfer::msg::{Grant, Msg, MSG_BUF};
use rdma_xfer::rdma::CTRL_RECVS;
use rdma_xfer::{BlockSink, Config, Error, Mode, XferListener};
use sha2::{Digest, Sha256};

const BS: u32 = 256 << 10;
/// Most batches of hostile writes before the test gives up.
const MAX_BATCHES: u32 = 10_000;

/// When the hostile source writes block 0 again after its `BlockDone`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Style {
    /// Once the sink's application holds it: one write, then a probe.
    WhileHeld,
    /// At once and without pause, batches of writes pipelined behind each
    /// other, so writes are in flight in the sink's receive path (between
    /// the FPDUs of one message, or being read from the socket straight
    /// into the block) when the sink ends the STag.
    Streaming,
}

impl Style {
    fn batch(self) -> usize {
        match self {
            Style::WhileHeld => 1,
            Style::Streaming => 8,
        }
    }
}
/// Bound on every wait of the test.
const WAIT: Duration = Duration::from_secs(10);

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}

/// What happened to the hostile writes.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Batch `n` (0-based), posted after the application got the block,
    /// was placed: the Read behind it was answered.
    Landed(u32),
    /// The sink refused a write with this Terminate (layer, etype, ecode).
    Refused((u8, u8, u8), String),
    /// Something else (a failure of the test's own machinery).
    Other(String),
}

/// The sink's application: hashes each block as it gets it, then (for
/// block 0) lets the hostile source write while it holds the block, then
/// stores the block's bytes.
struct HashThenStore {
    holding: mpsc::Sender<()>,
    outcome: mpsc::Receiver<Outcome>,
    /// (SHA-256 when the block was handed over, bytes stored afterwards).
    blocks: Vec<(Vec<u8>, Vec<u8>)>,
    seen: Option<Outcome>,
}

impl BlockSink for HashThenStore {
    fn write_block(&mut self, data: &[u8]) -> std::io::Result<()> {
        let hashed = Sha256::digest(data).to_vec();
        if self.blocks.is_empty() {
            let _ = self.holding.send(());
            self.seen = Some(
                self.outcome
                    .recv_timeout(WAIT)
                    .unwrap_or_else(|e| Outcome::Other(format!("no report from the source: {e}"))),
            );
        }
        self.blocks.push((hashed, data.to_vec()));
        Ok(())
    }
}

/// The hostile source's verbs objects.
struct Peer {
    _ctx: Context,
    ctrl: QueuePair,
    ctrl_send_cq: CompletionQueue,
    ctrl_recv_cq: CompletionQueue,
    ctrl_msgs: MemoryRegion,
    reposted: u16,
}

impl Peer {
    fn send(&mut self, msg: &Msg) {
        let off = CTRL_RECVS as usize * MSG_BUF;
        let mut buf = [0u8; MSG_BUF];
        let len = msg.emit(std::mem::take(&mut self.reposted), &mut buf);
        self.ctrl_msgs.write_at(off, &buf[..len]);
        self.ctrl
            .post_send(&SendWr {
                wr_id: 1,
                opcode: WrOpcode::Send,
                sgl: SgList::single(self.ctrl_msgs.sge(off, len)),
                signaled: true,
                solicited: false,
            })
            .expect("posting a control Send");
        let wc = self
            .ctrl_send_cq
            .wait_one(WAIT)
            .unwrap()
            .expect("Send done");
        assert_eq!(wc.status, WcStatus::Success, "control Send {msg:?}");
    }

    fn recv(&mut self) -> Msg {
        let wc = self
            .ctrl_recv_cq
            .wait_one(WAIT)
            .unwrap()
            .expect("a control message from the sink");
        assert_eq!(wc.status, WcStatus::Success, "control receive");
        let off = wc.wr_id as usize * MSG_BUF;
        let mut buf = vec![0u8; wc.byte_len as usize];
        self.ctrl_msgs.read_at(off, &mut buf);
        self.ctrl
            .post_recv(&RecvWr {
                wr_id: wc.wr_id,
                sgl: SgList::single(self.ctrl_msgs.sge(off, MSG_BUF)),
            })
            .unwrap();
        self.reposted += 1;
        Msg::parse(&buf).expect("a well-formed control message").0
    }
}

/// The setup of connection `index` of a 1-stream session (the control
/// connection is `CONTROL`).
fn private_data(token: u64, index: u32) -> Vec<u8> {
    Hello {
        token,
        index,
        proposal: Proposal {
            streams: 1,
            block_size: BS,
            iodepth: 2,
        },
        features: 0,
    }
    .emit()
    .to_vec()
}

/// Connect to the session at `addr`, move block 0 legitimately, then keep
/// writing it after its `BlockDone` once the sink's application holds it.
fn hostile_source(
    style: Style,
    addr: std::net::SocketAddr,
    token: u64,
    legit: &[u8],
    holding: mpsc::Receiver<()>,
    outcome: mpsc::Sender<Outcome>,
) -> Outcome {
    let ctx = Context::open_device("soft").unwrap();
    let pd = ctx.alloc_pd();
    let ctrl_send_cq = ctx.create_cq(64).unwrap();
    let ctrl_recv_cq = ctx.create_cq(64).unwrap();
    let ctrl = pd
        .create_qp(&QpInitAttr {
            send_cq: ctrl_send_cq.clone(),
            recv_cq: ctrl_recv_cq.clone(),
            max_send_wr: 8,
            max_recv_wr: CTRL_RECVS,
        })
        .unwrap();
    let ctrl_msgs = pd
        .reg_mr((CTRL_RECVS as usize + 1) * MSG_BUF, Access::LOCAL_WRITE)
        .unwrap();
    for slot in 0..CTRL_RECVS {
        let off = slot as usize * MSG_BUF;
        ctrl.post_recv(&RecvWr {
            wr_id: u64::from(slot),
            sgl: SgList::single(ctrl_msgs.sge(off, MSG_BUF)),
        })
        .unwrap();
    }
    let param = |pdata| ConnParam {
        private_data: pdata,
        timeout: WAIT,
        ..ConnParam::default()
    };
    let ack = cm::connect(&ctrl, addr, &param(private_data(token, CONTROL))).unwrap();
    let ack = HelloAck::parse(&ack).expect("the grant in the MPA Reply");
    assert_eq!(ack.granted.block_size, BS);
    let mut p = Peer {
        _ctx: ctx.clone(),
        ctrl,
        ctrl_send_cq,
        ctrl_recv_cq,
        ctrl_msgs,
        reposted: 0,
    };
    let data_cq = ctx.create_cq(64).unwrap();
    let data = pd
        .create_qp(&QpInitAttr {
            send_cq: data_cq.clone(),
            recv_cq: data_cq.clone(),
            max_send_wr: 16,
            max_recv_wr: 4,
        })
        .unwrap();
    cm::connect(&data, addr, &param(private_data(token, 0))).unwrap();

    p.send(&Msg::Begin {
        transfer: 1,
        len: Some(u64::from(BS)),
        prerequest: 2,
    });
    let g: Grant = loop {
        match p.recv() {
            Msg::Grant {
                transfer: 1,
                grants,
            } if !grants.is_empty() => break grants[0],
            Msg::Grant { .. } | Msg::Credit => {}
            m => panic!("expected a Grant, got {m:?}"),
        }
    };

    // Block 0, legitimately: its Write, then its BlockDone behind it.
    let block = pd.reg_mr(BS as usize, Access::LOCAL_WRITE).unwrap();
    block.write_at(0, legit);
    let notice = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut buf = [0u8; 64];
    let n = Msg::BlockDone {
        seq: 0,
        len: BS,
        block: g.block,
    }
    .emit(0, &mut buf);
    notice.write_at(0, &buf[..n]);
    let write = |wr_id, mr: &MemoryRegion| SendWr {
        wr_id,
        opcode: WrOpcode::RdmaWrite {
            remote_addr: g.addr,
            rkey: g.rkey,
        },
        sgl: SgList::single(mr.sge(0, BS as usize)),
        signaled: false,
        solicited: false,
    };
    data.post_send_list(&[
        write(10, &block),
        SendWr {
            wr_id: 11,
            opcode: WrOpcode::Send,
            sgl: SgList::single(notice.sge(0, n)),
            signaled: true,
            solicited: false,
        },
    ])
    .unwrap();
    let wc = data_cq.wait_one(WAIT).unwrap().expect("BlockDone sent");
    assert_eq!(wc.status, WcStatus::Success, "BlockDone Send");

    let hostile = pd.reg_mr(BS as usize, Access::LOCAL_WRITE).unwrap();
    let probe = SendWr {
        wr_id: 20,
        opcode: WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 0,
        },
        sgl: SgList::new(),
        signaled: true,
        solicited: false,
    };
    let mut result = None;
    let mut held = false;
    let mut failed = false;
    if style == Style::WhileHeld {
        // Write only once the sink's application holds block 0.
        if holding.recv_timeout(WAIT).is_err() {
            let o = Outcome::Other("the sink never handed block 0 to its application".into());
            let _ = outcome.send(o.clone());
            return o;
        }
        held = true;
    }
    // Keep writing, a batch at a time with a probe Read behind it, until
    // a write is refused, or one posted after the application got the
    // block is placed.
    for i in 0..MAX_BATCHES {
        held |= holding.try_recv().is_ok();
        let held_before = held;
        // Each batch writes its own bytes, so a batch that lands after the
        // application hashed the block always changes it. The previous
        // batch's probe completed, so nothing reads this buffer now.
        hostile.write_at(0, &pattern(BS as usize, 0x80 ^ i as u8));
        let mut wrs = vec![write(12, &hostile); style.batch()];
        wrs.push(probe);
        if data.post_send_list(&wrs).is_err() {
            failed = true;
            break;
        }
        match data_cq.wait_one(WAIT).unwrap() {
            Some(wc) if wc.status == WcStatus::Success => {
                if held_before {
                    result = Some(Outcome::Landed(i));
                    break;
                }
            }
            Some(_) => {
                failed = true;
                break;
            }
            None => {
                result = Some(Outcome::Other("no answer to the probe Read".into()));
                break;
            }
        }
    }
    if result.is_none() && !failed {
        result = Some(Outcome::Other(format!(
            "{MAX_BATCHES} batches of writes, neither refused nor placed after the hand-over"
        )));
    }
    // Refused: the Read was flushed because the sink's Terminate arrived.
    let deadline = Instant::now() + WAIT;
    while result.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match data.next_event(left) {
            Some(QpEvent::TerminateReceived(t)) => {
                result = Some(Outcome::Refused((t.layer, t.etype, t.ecode), t.reason));
            }
            Some(_) => {}
            None => result = Some(Outcome::Other("no Terminate and no answer".into())),
        }
    }
    let result = result.expect("set above");
    let _ = outcome.send(result.clone());
    if matches!(result, Outcome::Landed(_)) {
        // Let the transfer end, so the sink reports what it stored.
        p.send(&Msg::End {
            blocks: 1,
            bytes: u64::from(BS),
        });
        let _ = p.ctrl_recv_cq.wait_one(WAIT);
    }
    result
}

/// What the sink's side saw: its transfer's result and its application.
fn run(
    style: Style,
) -> (
    Result<rdma_xfer::Stats, Error>,
    HashThenStore,
    Outcome,
    Vec<u8>,
) {
    let cfg = Config {
        streams: 1,
        block_size: BS,
        iodepth: 2,
        timeout: WAIT,
        connect_timeout: WAIT,
        device: Some("soft".into()),
        ..Config::default()
    };
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, cfg).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let (holding_tx, holding_rx) = mpsc::channel();
    let (outcome_tx, outcome_rx) = mpsc::channel();
    let legit = pattern(BS as usize, 0x5a);
    let sink = std::thread::spawn(move || {
        let mut t = l.accept(WAIT).unwrap();
        let mut app = HashThenStore {
            holding: holding_tx,
            outcome: outcome_rx,
            blocks: Vec::new(),
            seen: None,
        };
        let r = t.recv(&mut app);
        (r, app)
    });
    let source = {
        let legit = legit.clone();
        std::thread::spawn(move || {
            hostile_source(style, addr, token, &legit, holding_rx, outcome_tx)
        })
    };
    let seen_by_source = source.join().unwrap();
    let (r, app) = sink.join().unwrap();
    (r, app, seen_by_source, legit)
}

/// The checks both styles share: the application stored what it hashed,
/// the hostile write was refused with the Terminate, and the sink's
/// transfer failed naming it.
fn check(style: Style) -> Vec<u8> {
    let (r, app, seen_by_source, legit) = run(style);
    assert_eq!(app.blocks.len(), 1, "the sink's application got block 0");
    assert_eq!(app.seen.as_ref(), Some(&seen_by_source));
    let (hashed, stored) = &app.blocks[0];
    assert_eq!(
        hashed,
        &Sha256::digest(stored).to_vec(),
        "the block changed while the application held it ({seen_by_source:?}): \
         it hashed one version of the bytes and stored another"
    );
    match &seen_by_source {
        // RFC 5041 §7.2 / RFC 5040 §7: DDP layer (1), tagged buffer error
        // (1), invalid STag (0x00).
        Outcome::Refused(code, _) => assert_eq!(*code, (1, 1, 0x00), "{seen_by_source:?}"),
        o => panic!("the hostile write was not refused with a Terminate: {o:?}"),
    }
    match r {
        Err(Error::Disconnected(why)) => assert!(
            why.contains("Terminate") && why.contains("STag"),
            "the sink's error names the Terminate: {why}"
        ),
        other => panic!("the sink's transfer must fail after a refused write: {other:?}"),
    }
    assert_eq!(stored.len(), legit.len());
    stored.clone()
}

#[test]
fn writes_while_the_application_holds_the_block_are_refused() {
    let stored = check(Style::WhileHeld);
    assert!(
        stored == pattern(BS as usize, 0x5a),
        "the application stored the source's legitimate bytes"
    );
}

#[test]
fn writes_in_flight_when_the_block_is_handed_over_never_land_in_it() {
    // Writes before the hand-over may land (the block then holds them,
    // whole or in part, when it is read); none after it.
    check(Style::Streaming);
}
