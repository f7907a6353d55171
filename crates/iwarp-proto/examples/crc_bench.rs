//! Microbenchmark of the CRC32C back ends (`wire::crc`): GB/s per back end
//! and buffer size, and nanoseconds per call on header-sized pieces.
//!
//! `cargo run --release -p iwarp-proto --example crc_bench [-- MILLIS]`
//! (MILLIS: time per measurement, default 200). Used by scripts/bench-crc.sh.

use std::hint::black_box;
use std::time::{Duration, Instant};

use iwarp_proto::wire::crc::{self, CrcImpl};

/// Run `f` over `buf` for about `budget`; bytes per second.
fn rate(imp: CrcImpl, buf: &[u8], budget: Duration) -> (f64, u32) {
    let mut c = 0u32;
    // Warm up (page faults, caches, frequency).
    for _ in 0..4 {
        c = imp.append(c, black_box(buf));
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..16 {
            c = imp.append(c, black_box(buf));
        }
        n += 16;
    }
    let secs = start.elapsed().as_secs_f64();
    ((n as f64) * (buf.len() as f64) / secs, c)
}

fn main() {
    let millis: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("MILLIS: a number of milliseconds"))
        .unwrap_or(200);
    let budget = Duration::from_millis(millis);
    let big: Vec<u8> = (0..(1usize << 20) + 64)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8)
        .collect();
    println!(
        "auto: {} (IWARP_CRC={:?} gives {})",
        crc::auto().name(),
        std::env::var(crc::ENV_VAR).unwrap_or_default(),
        match crc::active_from_env() {
            Ok(i) => i.name().to_string(),
            Err(e) => format!("error: {e}"),
        }
    );
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "back end", "64 B", "4 KiB", "64 KiB", "1 MiB", "2 B ns", "18 B ns"
    );
    let mut check = Vec::new();
    for imp in CrcImpl::ALL {
        if !imp.available() {
            println!("{:<20} not available on this CPU", imp.name());
            continue;
        }
        let mut row = format!("{:<20}", imp.name());
        for size in [64usize, 4096, 65536, 1 << 20] {
            // Odd offset: the engine's pieces are not aligned.
            let (r, c) = rate(imp, &big[1..1 + size], budget);
            check.push(c);
            row += &format!(" {:>7.2}GB", r / 1e9);
        }
        for size in [2usize, 18] {
            let (r, c) = rate(imp, &big[3..3 + size], budget);
            check.push(c);
            row += &format!(" {:>8.1}", size as f64 / r * 1e9);
        }
        println!("{row}");
    }
    // Keep the results observable so nothing is optimised away.
    let fold = check.iter().fold(0u32, |a, &c| a.rotate_left(5) ^ c);
    println!("(GB/s = 10^9 bytes/s; checksum of results {fold:#010x})");
}
