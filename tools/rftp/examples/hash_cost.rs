//! What verification costs per GiB with each checksum, in process: every
//! algorithm hashes the same GiB in 1 MiB blocks (as a transfer hands them
//! over, in cache), and the process CPU time (getrusage, all threads: BLAKE3
//! spreads a block over rayon's threads) and wall time are printed.
//!
//! `cargo run --release -p rftp --example hash_cost [-- GIB]`

use std::time::Instant;

use rftp::checksum::{Algo, Running, PREFERENCE};

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given; an all-zero rusage
    // is valid (plain integers).
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a pointer to a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let gib: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let block: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    println!("algorithm  CPU s/GiB  wall s/GiB  GiB/s (wall)");
    for algo in PREFERENCE.iter().copied().chain([Algo::Xxh3_128]) {
        let (c0, w0) = (cpu_seconds(), Instant::now());
        let mut r = Running::new(algo);
        for _ in 0..gib * 1024 {
            r.update(&block);
        }
        let d = r.finish();
        let (cpu, wall) = (cpu_seconds() - c0, w0.elapsed().as_secs_f64());
        println!(
            "{:<10} {:>9.3}  {:>10.3}  {:>6.2}   ({}...)",
            algo.wire_name(),
            cpu / gib as f64,
            wall / gib as f64,
            gib as f64 / wall,
            &d[..8]
        );
    }
}
