//! Memory-to-memory throughput of one rdma-xfer session over 127.0.0.1:
//! a [`ZeroSource`] into a [`NullSink`], both ends in this process, so
//! what is measured is the transport and the sink's per-block work.
//!
//! ```sh
//! cargo run --release -p rdma-xfer --example xfer_bench -- [MiB] [streams] [block KiB] [runs] [rdma|tcp]
//! ```
//!
//! Defaults: 1024 MiB, 1 stream, 1024 KiB blocks, 3 runs, rdma. Prints
//! one line per run (MB/s, MB = 10^6 bytes) and the median.

use std::time::Duration;

use rdma_xfer::{connect, Config, Mode, NullSink, XferListener, ZeroSource};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib: u64 = arg(&args, 0, 1024);
    let streams: u32 = arg(&args, 1, 1);
    let block_kib: u32 = arg(&args, 2, 1024);
    let runs: usize = arg(&args, 3, 3);
    let mode: Mode = arg(&args, 4, Mode::Rdma);
    let cfg = Config {
        streams,
        block_size: block_kib << 10,
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    let l = XferListener::bind("127.0.0.1:0".parse().expect("address"), mode, cfg.clone())
        .expect("binding the listener");
    let (addr, token) = (l.local_addr(), l.token());
    let server = std::thread::spawn(move || l.accept(Duration::from_secs(10)));
    let mut src = connect(addr, mode, token, cfg).expect("connecting");
    let mut dst = server
        .join()
        .expect("accept thread")
        .expect("accepting the session");
    let len = mib << 20;
    let mut rates = Vec::new();
    for run in 0..runs {
        let st = std::thread::scope(|s| {
            let sink = s.spawn(|| dst.recv(&mut NullSink::default()));
            let sent = src.send(&mut ZeroSource::new(len)).expect("send");
            let got = sink.join().expect("sink thread").expect("recv");
            assert_eq!(got.bytes, len);
            sent
        });
        let mbs = st.bytes as f64 / st.elapsed.as_secs_f64() / 1e6;
        println!(
            "run {run}: {} MiB in {:.3} s: {mbs:.0} MB/s",
            mib,
            st.elapsed.as_secs_f64()
        );
        rates.push(mbs);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    if let Some(m) = rates.get(rates.len() / 2) {
        println!("median {m:.0} MB/s ({mode}, {streams} stream(s), {block_kib} KiB blocks)");
    }
}
