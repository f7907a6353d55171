//! What this process uses: CPU seconds, threads (now and the peak of a
//! run). Shared by iwarp-perf and iwarp-connrate.

use std::time::Duration;

/// User + system CPU seconds consumed by this process so far, from
/// `getrusage(RUSAGE_SELF)`: all threads, live and finished, the
/// provider's included.
pub fn cpu_seconds() -> f64 {
    let Some(ru) = rusage() else {
        return 0.0;
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Context switches of this process so far, voluntary (a thread blocked:
/// a wait for the network or another thread) plus involuntary (preempted),
/// from `getrusage(RUSAGE_SELF)`: each is a thread put to sleep and woken,
/// the unit a connection set-up pays for every hand-off between threads.
pub fn context_switches() -> u64 {
    rusage().map_or(0, |ru| (ru.ru_nvcsw + ru.ru_nivcsw) as u64)
}

fn rusage() -> Option<libc::rusage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole `struct rusage` to the pointer,
    // which points to one we own; RUSAGE_SELF is always valid, so the call
    // cannot fail (we still check its result).
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage returned 0, so it filled the struct (and zeroed
    // memory is a valid rusage anyway).
    Some(unsafe { ru.assume_init() })
}

/// Threads of this process now (`Threads:` in `/proc/self/status`), 0 if
/// unknown.
pub fn threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Samples the process's thread count every 20 ms on a thread of its own
/// (counted too) and keeps the largest: threads come and go with
/// connections, so the count at the end of a run says little.
pub struct ThreadPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

impl ThreadPeak {
    pub fn start() -> ThreadPeak {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("thread-peak".into())
            .spawn(move || {
                let mut peak = threads();
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                    peak = peak.max(threads());
                }
                peak
            })
            .ok();
        ThreadPeak { stop, handle }
    }

    /// Stop sampling; the largest count seen (0 if the sampler could not
    /// start).
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or(0)
    }
}
