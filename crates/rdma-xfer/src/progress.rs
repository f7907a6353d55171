//! The progress logger: a thread per session that reports bytes moved and
//! the rate, every [`crate::Config::progress_interval`], while a transfer
//! runs.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One progress report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Bytes done.
    pub bytes: u64,
    /// Bytes expected, if known.
    pub total: Option<u64>,
    /// Since the transfer started.
    pub elapsed: Duration,
    /// Bytes per second over the last interval.
    pub rate: f64,
    /// The last report of the transfer.
    pub done: bool,
}

/// The progress callback.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

struct Active {
    cb: ProgressFn,
    start: Instant,
    total: Option<u64>,
    last: (Instant, u64),
}

struct Shared {
    bytes: AtomicU64,
    active: Mutex<Option<Active>>,
    stop: AtomicBool,
    cond: Condvar,
}

/// The logger thread and the byte counter the transfer bumps.
pub(crate) struct Logger {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    cb: Option<ProgressFn>,
}

impl fmt::Debug for Logger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Logger")
            .field("bytes", &self.shared.bytes.load(Ordering::Relaxed))
            .finish()
    }
}

fn report(a: &mut Active, bytes: u64, done: bool) {
    let now = Instant::now();
    let dt = now.duration_since(a.last.0).as_secs_f64();
    let rate = if done {
        let s = now.duration_since(a.start).as_secs_f64();
        if s > 0.0 {
            bytes as f64 / s
        } else {
            0.0
        }
    } else if dt > 0.0 {
        (bytes - a.last.1.min(bytes)) as f64 / dt
    } else {
        0.0
    };
    a.last = (now, bytes);
    (a.cb)(&Progress {
        bytes,
        total: a.total,
        elapsed: now.duration_since(a.start),
        rate,
        done,
    });
}

impl Logger {
    pub(crate) fn new(interval: Duration) -> Logger {
        let shared = Arc::new(Shared {
            bytes: AtomicU64::new(0),
            active: Mutex::new(None),
            stop: AtomicBool::new(false),
            cond: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("xfer-logger".into())
            .spawn(move || {
                let mut g = s.active.lock().unwrap_or_else(|e| e.into_inner());
                while !s.stop.load(Ordering::Acquire) {
                    g = s
                        .cond
                        .wait_timeout(g, interval)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    if let Some(a) = g.as_mut() {
                        report(a, s.bytes.load(Ordering::Relaxed), false);
                    }
                }
            })
            .ok();
        Logger {
            shared,
            thread,
            cb: None,
        }
    }

    pub(crate) fn set_callback(&mut self, cb: Option<ProgressFn>) {
        self.cb = cb;
    }

    /// A transfer starts.
    pub(crate) fn begin(&self, total: Option<u64>) {
        self.shared.bytes.store(0, Ordering::Relaxed);
        if let Some(cb) = &self.cb {
            let now = Instant::now();
            *self.shared.active.lock().unwrap_or_else(|e| e.into_inner()) = Some(Active {
                cb: cb.clone(),
                start: now,
                total,
                last: (now, 0),
            });
        }
    }

    pub(crate) fn add(&self, n: u64) {
        self.shared.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// The transfer ended: one final report if it succeeded.
    pub(crate) fn end(&self, ok: bool) {
        let a = self
            .shared
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let (Some(mut a), true) = (a, ok) {
            report(&mut a, self.shared.bytes.load(Ordering::Relaxed), true);
        }
    }
}

impl Drop for Logger {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cond.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
