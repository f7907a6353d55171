//! A hostile TCP-mode source, spoken raw: it never sends block 0 and
//! streams later blocks as fast as the socket takes them. The sink must
//! hold no more than its reorder window, push back through TCP, and end
//! the transfer with an error that names the missing block.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_xfer::hello::{Hello, HelloAck, Proposal, ACK_LEN};
use rdma_xfer::{BlockSink, Config, Error, Mode, XferListener};

const BS: u32 = 64 << 10;

/// Counts what reaches the sink; nothing should.
struct CountSink(Arc<AtomicU64>);

impl BlockSink for CountSink {
    fn write_block(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.0.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn frame(kind: u32, len: u32, seq: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&kind.to_be_bytes());
    h[4..8].copy_from_slice(&len.to_be_bytes());
    h[8..].copy_from_slice(&seq.to_be_bytes());
    h
}

#[test]
fn a_source_that_skips_block_0_is_held_to_the_window_and_fails_clearly() {
    let cfg = Config {
        streams: 1,
        block_size: BS,
        iodepth: 4,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Tcp, cfg.clone()).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || {
        let mut t = l.accept(Duration::from_secs(10)).unwrap();
        let got = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let r = t.recv(&mut CountSink(got.clone()));
        (r, got.load(Ordering::Relaxed), t0.elapsed())
    });

    // Hello: token, stream 0, the proposal.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = Hello {
        token,
        index: 0,
        proposal: Proposal {
            streams: 1,
            block_size: BS,
            iodepth: 4,
        },
        features: 0,
    };
    s.write_all(&hello.emit()).unwrap();
    let mut ack = [0u8; ACK_LEN];
    s.read_exact(&mut ack).unwrap();
    HelloAck::parse(&ack).unwrap();

    // Blocks 1, 2, 3, ... (never 0), 256 MiB in all if the sink took them.
    let written = Arc::new(AtomicU64::new(0));
    let w = written.clone();
    let mut ws = s.try_clone().unwrap();
    ws.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let writer = std::thread::spawn(move || {
        let payload = vec![0x5au8; BS as usize];
        for seq in 1..4096u64 {
            if ws.write_all(&frame(1, BS, seq)).is_err() || ws.write_all(&payload).is_err() {
                return;
            }
            w.fetch_add(u64::from(BS), Ordering::Relaxed);
        }
    });

    let (r, delivered, took) = server.join().unwrap();
    let e = r.expect_err("a transfer without block 0 must fail");
    assert!(matches!(e, Error::Protocol(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("block 0 never arrived"), "{msg}");
    assert!(msg.contains("reorder window 4 blocks"), "{msg}");
    assert_eq!(delivered, 0, "nothing may reach the sink out of order");
    assert!(took < Duration::from_secs(5), "failed after {took:?}");
    // The sink read at most its window (plus what sits in the socket
    // buffers): the source was pushed back long before 256 MiB.
    let sent = written.load(Ordering::Relaxed);
    assert!(
        sent < 64 << 20,
        "the source wrote {sent} bytes: the sink kept reading without a window"
    );
    drop(s);
    writer.join().unwrap();
}
