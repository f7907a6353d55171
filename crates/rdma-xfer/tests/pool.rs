//! A session's buffer pools cost memory only as transfers use them (issue
//! 27). The source made its whole pool of zeroed, registered blocks before
//! its first block, and the sink wrote every byte of its pool before its
//! first grant: a 100 KB file over a session sized for a long path (64 x
//! 1 MiB here, what rftp's RADR asks for when it goes before the file's
//! size is known) made 128 MiB resident on the two ends. Now the source
//! registers blocks as the transfer needs them and the sink's blocks are
//! touched only where data lands.
//!
//! Its own test binary: the resident set is the process's, and no other
//! test may allocate beside it.

use std::time::Duration;

use rdma_xfer::{connect, Config, Mode, NullSink, XferListener, ZeroSource};

const WAIT: Duration = Duration::from_secs(20);

fn resident() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_small_transfer_touches_few_blocks_of_a_large_pool() {
    let c = Config {
        streams: 1,
        block_size: 1 << 20,
        iodepth: 64,
        timeout: WAIT,
        connect_timeout: WAIT,
        ..Config::default()
    };
    let l = XferListener::bind("127.0.0.1:0".parse().unwrap(), Mode::Rdma, c.clone()).unwrap();
    let (addr, token) = (l.local_addr(), l.token());
    let t = std::thread::spawn(move || l.accept(WAIT).unwrap());
    let mut a = connect(addr, Mode::Rdma, token, c).unwrap();
    let mut b = t.join().unwrap();
    let before = resident();
    std::thread::scope(|s| {
        let h = s.spawn(|| b.recv(&mut NullSink::default()).unwrap());
        a.send(&mut ZeroSource::new(100_000)).unwrap();
        assert_eq!(h.join().unwrap().bytes, 100_000);
    });
    let grew = resident().saturating_sub(before);
    assert!(
        grew < 24 << 20,
        "a 100 KB transfer over a 64 x 1 MiB session made {} MiB resident (at most 24): \
         a pool was made whole",
        grew >> 20
    );
}
