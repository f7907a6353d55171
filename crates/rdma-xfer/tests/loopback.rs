//! Two sessions over 127.0.0.1: every size edge, 1 and 8 streams, RDMA
//! and TCP, files with SHA-256 equality, sink errors, and a peer process
//! killed mid-transfer.

use std::io::{BufRead, BufReader, Cursor};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_xfer::{
    connect, BlockSink, Config, Error, FileReader, FileWriter, Mode, NullSink, ReadSource,
    Transport, WriteSink, XferListener, ZeroSource,
};
use sha2::{Digest, Sha256};

const BS: u32 = 64 << 10;

fn cfg(streams: u32) -> Config {
    Config {
        streams,
        block_size: BS,
        iodepth: 4,
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ salt)
        .collect()
}

fn sha(d: &[u8]) -> Vec<u8> {
    Sha256::digest(d).to_vec()
}

/// A connected pair: (active, passive).
fn pair(mode: Mode, c: Config) -> (Box<dyn Transport>, Box<dyn Transport>) {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), mode, c.clone()).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let t = std::thread::spawn(move || l.accept(Duration::from_secs(10)).unwrap());
    let a = connect(addr, mode, token, c).unwrap();
    (a, t.join().unwrap())
}

/// Move `data` from `src` to `dst`; returns what arrived.
fn transfer(src: &mut Box<dyn Transport>, dst: &mut Box<dyn Transport>, data: &[u8]) -> Vec<u8> {
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut sink = WriteSink(Vec::new());
            let st = dst.recv(&mut sink).unwrap();
            assert_eq!(st.bytes, data.len() as u64);
            sink.0
        });
        let st = src.send(&mut ReadSource(Cursor::new(data))).unwrap();
        assert_eq!(st.bytes, data.len() as u64);
        assert_eq!(st.blocks, (data.len() as u64).div_ceil(u64::from(BS)));
        h.join().unwrap()
    })
}

fn sizes_both_ways(mode: Mode, streams: u32) {
    let (mut a, mut b) = pair(mode, cfg(streams));
    assert_eq!(a.config().streams, streams);
    assert_eq!(a.session_id(), b.session_id());
    let bs = BS as usize;
    for (i, len) in [0, 1, bs - 1, bs, bs + 1, 7 * bs / 2, 40 * bs + 123]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        let got = if i % 2 == 0 {
            transfer(&mut a, &mut b, &data)
        } else {
            transfer(&mut b, &mut a, &data)
        };
        assert_eq!(got.len(), len);
        assert_eq!(sha(&got), sha(&data), "len {len}");
    }
}

#[test]
fn rdma_one_stream_all_sizes_both_directions() {
    sizes_both_ways(Mode::Rdma, 1);
}

#[test]
fn rdma_eight_streams_all_sizes_both_directions() {
    sizes_both_ways(Mode::Rdma, 8);
}

#[test]
fn tcp_one_stream_all_sizes_both_directions() {
    sizes_both_ways(Mode::Tcp, 1);
}

#[test]
fn tcp_eight_streams_all_sizes_both_directions() {
    sizes_both_ways(Mode::Tcp, 8);
}

#[test]
fn stream_count_is_negotiated_down() {
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, cfg(2)).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let t = std::thread::spawn(move || l.accept(Duration::from_secs(10)).unwrap());
    let a = connect(addr, Mode::Rdma, token, cfg(8)).unwrap();
    let b = t.join().unwrap();
    assert_eq!((a.config().streams, b.config().streams), (2, 2));
}

#[test]
fn wrong_token_is_refused() {
    for mode in [Mode::Rdma, Mode::Tcp] {
        let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), mode, cfg(1)).unwrap();
        let (addr, token) = (l.local_addr(), l.token());
        let t = std::thread::spawn(move || l.accept(Duration::from_secs(5)).map(|_| ()));
        let r = connect(addr, mode, token ^ 1, cfg(1));
        assert!(r.is_err(), "{mode}");
        assert!(t.join().unwrap().is_err());
    }
}

#[test]
fn files_with_direct_io_and_progress() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    let dst = dir.path().join("dst.bin");
    let data = pattern(3 * (1 << 20) + 777, 9);
    std::fs::write(&src, &data).unwrap();
    for mode in [Mode::Rdma, Mode::Tcp] {
        let (mut a, mut b) = pair(mode, cfg(4));
        let seen = Arc::new(AtomicU64::new(0));
        let s2 = seen.clone();
        a.set_progress(Some(Arc::new(move |p: &rdma_xfer::Progress| {
            if p.done {
                s2.store(p.bytes, Ordering::SeqCst);
            }
        })));
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut w = FileWriter::create(&dst, 0, true).unwrap();
                b.recv(&mut w).unwrap()
            });
            let mut r = FileReader::open(&src, 0, true).unwrap();
            a.send(&mut r).unwrap();
            h.join().unwrap();
        });
        assert_eq!(sha(&std::fs::read(&dst).unwrap()), sha(&data), "{mode}");
        assert_eq!(seen.load(Ordering::SeqCst), data.len() as u64, "{mode}");
    }
}

#[test]
fn memory_to_memory() {
    for mode in [Mode::Rdma, Mode::Tcp] {
        let (mut a, mut b) = pair(mode, cfg(2));
        let len = 16u64 << 20;
        let n = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut n = NullSink::default();
                b.recv(&mut n).unwrap();
                n.bytes
            });
            a.send(&mut ZeroSource::new(len)).unwrap();
            h.join().unwrap()
        });
        assert_eq!(n, len);
    }
}

struct FailingSink(usize);
impl BlockSink for FailingSink {
    fn write_block(&mut self, _: &[u8]) -> std::io::Result<()> {
        if self.0 == 0 {
            return Err(std::io::Error::other("No space left on device (test)"));
        }
        self.0 -= 1;
        Ok(())
    }
}

#[test]
fn sink_error_reaches_the_source() {
    for mode in [Mode::Rdma, Mode::Tcp] {
        let (mut a, mut b) = pair(mode, cfg(2));
        let start = Instant::now();
        let (sr, rr) = std::thread::scope(|s| {
            let h = s.spawn(|| b.recv(&mut FailingSink(3)));
            let sr = a.send(&mut ZeroSource::new(64 << 20));
            (sr, h.join().unwrap())
        });
        assert!(matches!(rr, Err(Error::Local(_))), "{mode}: {rr:?}");
        let e = sr.unwrap_err();
        assert!(
            matches!(e, Error::PeerAborted(ref r) if r.contains("No space")) || mode == Mode::Tcp,
            "{mode}: {e}"
        );
        assert!(start.elapsed() < Duration::from_secs(8), "{mode}");
        // The session is unusable afterwards, and says so.
        assert!(a.send(&mut ZeroSource::new(1)).is_err());
    }
}

#[test]
fn silent_peer_times_out() {
    let mut c = cfg(1);
    c.timeout = Duration::from_millis(800);
    let (mut a, _b) = pair(Mode::Rdma, c);
    // Nobody receives: the source waits for grants that never come.
    let start = Instant::now();
    let e = a.send(&mut ZeroSource::new(1 << 20)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// The child half of the kill test: a slow sink that is killed.
#[test]
fn killed_peer_child() {
    let Ok(mode) = std::env::var("XFER_KILL_CHILD") else {
        return;
    };
    let mode: Mode = mode.parse().unwrap();
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), mode, cfg(4)).unwrap();
    println!("LISTEN {} {}", l.local_addr(), l.token());
    let mut s = l.accept(Duration::from_secs(10)).unwrap();
    struct Slow;
    impl BlockSink for Slow {
        fn write_block(&mut self, _: &[u8]) -> std::io::Result<()> {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        }
    }
    let _ = s.recv(&mut Slow);
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn peer_killed_mid_transfer_gives_a_clear_error() {
    for mode in ["rdma", "tcp"] {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "killed_peer_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("XFER_KILL_CHILD", mode)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (addr, token) = loop {
            let line = lines.next().expect("child printed its address").unwrap();
            if let Some(at) = line.find("LISTEN ") {
                let mut it = line[at + 7..].split_whitespace();
                break (
                    it.next().unwrap().parse().unwrap(),
                    it.next().unwrap().parse::<u64>().unwrap(),
                );
            }
        };
        let m: Mode = mode.parse().unwrap();
        let mut a = connect(addr, m, token, cfg(4)).unwrap();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            child.kill().unwrap();
            child.wait().unwrap();
        });
        let start = Instant::now();
        let e = a.send(&mut ZeroSource::new(1 << 30)).unwrap_err();
        killer.join().unwrap();
        assert!(
            matches!(e, Error::Disconnected(_) | Error::Timeout { .. }),
            "{mode}: {e}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{mode}: {:?}",
            start.elapsed()
        );
        eprintln!("{mode}: {e} after {:?}", start.elapsed());
    }
}

/// A pool of one block (1 stream, depth 1 and 2) must keep asking for
/// grants: the pre-request threshold rounds up.
#[test]
fn shallowest_pools_do_not_stall() {
    for mode in [Mode::Rdma, Mode::Tcp] {
        for depth in [1, 2, 3] {
            let c = Config {
                iodepth: depth,
                ..cfg(1)
            };
            let (mut a, mut b) = pair(mode, c);
            let data = pattern(40 * BS as usize + 123, depth as u8);
            let got = transfer(&mut a, &mut b, &data);
            assert_eq!(sha(&got), sha(&data), "{mode} depth {depth}");
            let got = transfer(&mut b, &mut a, &data);
            assert_eq!(sha(&got), sha(&data), "{mode} depth {depth} back");
        }
    }
}
