//! `CompletionQueue::interrupt_waiters`: it ends a `wait_interruptible`
//! asleep on the CQ (the sockets crate's `shutdown`/`close` rely on it:
//! a blocked call sleeps on the CQ's own futex, with no descriptor beside
//! it), and an interrupt that comes between the caller's mark and its
//! wait is not lost. Every wait here has a long timeout: a missing wake-up
//! shows as a wait that runs to it, which the bounded receives catch.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp_verbs::{CompletionQueue, CqWake, ProgressMode};

/// How long a woken waiter may take to report back: far above a loaded
/// machine's scheduling delay, far below the waits' own timeouts.
const BOUND: Duration = Duration::from_secs(1);

/// A wait's own timeout, which an interrupt must cut short.
const LONG: Duration = Duration::from_secs(60);

/// The scheduler state of thread `tid` of this process ('S': asleep).
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Block until thread `tid` sleeps (bounded: panics after 5 s).
fn until_asleep(tid: i32) {
    let give_up = Instant::now() + Duration::from_secs(5);
    while thread_state(tid) != Some('S') {
        assert!(
            Instant::now() < give_up,
            "the waiter never went to sleep (state {:?})",
            thread_state(tid)
        );
        thread::yield_now();
    }
}

fn cq(mode: ProgressMode) -> CompletionQueue {
    let cq = CompletionQueue::new(4).unwrap();
    cq.set_progress(mode).unwrap();
    cq
}

#[test]
fn interrupt_wakes_a_thread_asleep_in_the_cq_wait() {
    let cq = cq(ProgressMode::Threaded {
        spin: Duration::ZERO,
    });
    let (tx, rx) = mpsc::channel();
    let waiter = cq.clone();
    let h = thread::spawn(move || {
        // SAFETY: gettid(2) has no preconditions.
        let _ = tx.send(Err(unsafe { libc::gettid() }));
        let mark = waiter.interrupt_mark();
        let _ = tx.send(Ok(waiter.wait_interruptible(LONG, mark)));
    });
    let tid = rx.recv_timeout(BOUND).unwrap().unwrap_err();
    // Asleep on the CQ's condition variable (registered, checked, gone
    // to sleep): only the interrupt's notify can wake it now.
    until_asleep(tid);
    assert_eq!(cq.sleepers(), 1, "the asleep thread is the CQ's waiter");
    let t = Instant::now();
    cq.interrupt_waiters();
    let woke = rx
        .recv_timeout(BOUND)
        .expect("interrupt_waiters did not wake the sleeping waiter")
        .unwrap();
    assert_eq!(woke.unwrap(), CqWake::Interrupted);
    assert!(t.elapsed() < BOUND);
    h.join().unwrap();
}

#[test]
fn an_interrupt_after_the_mark_ends_the_wait_at_once() {
    for mode in [
        ProgressMode::Threaded {
            spin: Duration::ZERO,
        },
        ProgressMode::BusyPoll,
    ] {
        let cq = cq(mode);
        // The caller's order: mark, look at its state (another thread
        // changes it and interrupts in between), then wait.
        let mark = cq.interrupt_mark();
        cq.interrupt_waiters();
        let t = Instant::now();
        assert_eq!(
            cq.wait_interruptible(LONG.min(Duration::from_secs(5)), mark)
                .unwrap(),
            CqWake::Interrupted,
            "{mode:?}: an interrupt between the mark and the wait was lost"
        );
        assert!(t.elapsed() < BOUND, "{mode:?}");
        // A fresh mark is past it: the wait runs to its timeout.
        assert_eq!(
            cq.wait_interruptible(Duration::from_millis(20), cq.interrupt_mark())
                .unwrap(),
            CqWake::TimedOut,
            "{mode:?}"
        );
    }
}

#[test]
fn plain_wait_is_not_interrupted() {
    let cq = cq(ProgressMode::Threaded {
        spin: Duration::ZERO,
    });
    let (tx, rx) = mpsc::channel();
    let waiter = cq.clone();
    let timeout = Duration::from_millis(300);
    let h = thread::spawn(move || {
        // SAFETY: gettid(2) has no preconditions.
        let _ = tx.send(Err(unsafe { libc::gettid() }));
        let t = Instant::now();
        let r = waiter.wait(timeout);
        let _ = tx.send(Ok((r, t.elapsed())));
    });
    let tid = rx.recv_timeout(BOUND).unwrap().unwrap_err();
    until_asleep(tid);
    cq.interrupt_waiters();
    let (r, took) = rx.recv_timeout(BOUND + timeout).unwrap().unwrap();
    assert!(!r.unwrap(), "no completion came");
    assert!(
        took >= timeout,
        "wait returned after {took:?}, before its timeout"
    );
    h.join().unwrap();
}
