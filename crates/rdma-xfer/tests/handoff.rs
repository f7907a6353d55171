//! Who takes the completions, and what ends a wait (src/rdma/handoff.rs):
//! a completion the caller does not claim reaches the dispatcher thread; a
//! silent peer ends the caller's wait at its deadline; dropping a session
//! stops its threads through their bells, with no timer to wait out.
//!
//! Every wait here is bounded (a watchdog channel), so a broken wake path
//! fails the test instead of hanging it; sessions are dropped only through
//! [`drop_bounded`] (a failing test leaks them: their drop might hang).

use std::io;
use std::mem::ManuallyDrop;
use std::sync::mpsc;
use std::time::Duration;

use rdma_xfer::{connect, BlockSink, BlockSource, Config, Error, Mode, Transport, XferListener};

/// How long a watchdog waits for what should take milliseconds.
const WAIT: Duration = Duration::from_secs(10);
const BS: u32 = 64 << 10;

fn cfg(timeout: Duration) -> Config {
    Config {
        streams: 1,
        block_size: BS,
        iodepth: 4,
        timeout,
        connect_timeout: WAIT,
        ..Config::default()
    }
}

type Session = ManuallyDrop<Box<dyn Transport>>;

/// A connected RDMA pair: (active, passive).
fn pair(c: Config) -> (Session, Session) {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, c.clone()).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let t = std::thread::spawn(move || l.accept(WAIT).unwrap());
    let a = connect(addr, Mode::Rdma, token, c).unwrap();
    (ManuallyDrop::new(a), ManuallyDrop::new(t.join().unwrap()))
}

/// Drop the sessions on another thread; fail if that does not end soon.
fn drop_bounded(sessions: Vec<Session>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in sessions {
            drop(ManuallyDrop::into_inner(s));
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(WAIT)
        .expect("the sessions' threads stopped when they were dropped");
}

/// One block, then a read that waits (like a slow disk) until the sink
/// has that block, then the end. It says when that read starts.
struct SlowSecondRead {
    reads: u32,
    started: mpsc::Sender<()>,
    sink_has_it: mpsc::Receiver<()>,
}

impl BlockSource for SlowSecondRead {
    fn read_block(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        match self.reads {
            1 => {
                buf.fill(7);
                Ok(buf.len())
            }
            2 => {
                let _ = self.started.send(());
                self.sink_has_it.recv_timeout(WAIT).map_err(|_| {
                    io::Error::other(
                        "the first block never reached the sink while the source read its \
                         second: nobody took the sink's grant off the source's CQ",
                    )
                })?;
                Ok(0)
            }
            _ => Ok(0),
        }
    }
}

struct Tell(Option<mpsc::Sender<()>>, u64);

impl BlockSink for Tell {
    fn write_block(&mut self, buf: &[u8]) -> io::Result<()> {
        self.1 += buf.len() as u64;
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
        Ok(())
    }
}

/// The sink grants only once the source reads its second block, that is
/// once the source's caller has let go of its claim: the grant's
/// completion must ring the source's dispatcher thread, which pairs it
/// with the first block and has it sent. Without that ring the grant
/// stays in the CQ until the read gives up.
#[test]
fn a_grant_arriving_while_the_source_reads_is_taken_by_the_dispatcher() {
    let (mut a, mut b) = pair(cfg(WAIT));
    let (started_tx, started_rx) = mpsc::channel();
    let (has_tx, has_rx) = mpsc::channel();
    let src = std::thread::spawn(move || {
        let mut src = SlowSecondRead {
            reads: 0,
            started: started_tx,
            sink_has_it: has_rx,
        };
        let r = a.send(&mut src).map(|st| st.bytes);
        (r, a)
    });
    started_rx
        .recv_timeout(WAIT)
        .expect("the source reached its second read");
    let mut sink = Tell(Some(has_tx), 0);
    let got = b.recv(&mut sink);
    let (sent, a) = src.join().unwrap();
    assert_eq!(sent.unwrap(), u64::from(BS));
    assert_eq!(got.unwrap().bytes, u64::from(BS));
    assert_eq!(sink.1, u64::from(BS));
    drop_bounded(vec![a, b]);
}

/// A sink that never calls `recv` grants nothing: the source fills its
/// pool and waits for a block to come back, until its deadline, and says
/// so (one wait to the deadline, no slices to count).
#[test]
fn a_silent_sink_times_the_source_out_at_its_deadline() {
    let timeout = Duration::from_millis(300);
    let (mut a, b) = pair(cfg(timeout));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = a.send(&mut rdma_xfer::ZeroSource::new(64 * u64::from(BS)));
        let _ = tx.send((r.map(|st| st.bytes), a));
    });
    let (r, a) = rx
        .recv_timeout(WAIT)
        .expect("the source's wait ended at its deadline");
    match r {
        Err(Error::Timeout { after, .. }) => assert!(after >= timeout, "{after:?}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop_bounded(vec![a, b]);
}

/// Dropping a session (after a transfer, so every thread has work behind
/// it) stops its dispatcher and sender threads: they sleep on a bell and a
/// channel with no deadline, so only the drop's ring and stop message end
/// them.
#[test]
fn dropping_sessions_stops_their_threads() {
    let (mut a, mut b) = pair(cfg(WAIT));
    std::thread::scope(|s| {
        let h = s.spawn(|| b.recv(&mut rdma_xfer::NullSink::default()).unwrap());
        a.send(&mut rdma_xfer::ZeroSource::new(4 * u64::from(BS)))
            .unwrap();
        assert_eq!(h.join().unwrap().bytes, 4 * u64::from(BS));
    });
    drop_bounded(vec![a, b]);
}
