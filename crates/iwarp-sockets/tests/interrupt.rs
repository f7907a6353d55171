//! A blocked call sleeps on its stream's completion queue (its futex, no
//! descriptor beside it) until a completion, its deadline, or an
//! interrupt from a thread that changed the stream under it
//! (`CompletionQueue::interrupt_waiters`). Each case puts a call to sleep
//! with a long deadline of its own, waits until its thread is asleep,
//! changes the stream from another thread, and requires the call back
//! within a second: a missing interrupt shows as a call that runs to its
//! deadline. Its own binary: other tests' streams would not wake these
//! calls, but keep the machine's threads few.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

mod common;

use iwarp_sockets::Stream;

/// How long an interrupted call may take to come back.
const BOUND: Duration = Duration::from_secs(1);
/// The calls' own deadline (SO_RCVTIMEO / SO_SNDTIMEO).
const LONG: Duration = Duration::from_secs(30);
/// Bound of setup steps.
const T: Duration = Duration::from_secs(5);

fn pair() -> (Stream, Stream) {
    common::pair(T)
}

/// The scheduler state of thread `tid` of this process ('S': asleep).
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Block until thread `tid` sleeps (bounded).
fn until_asleep(tid: i32) {
    let give_up = Instant::now() + T;
    while thread_state(tid) != Some('S') {
        assert!(Instant::now() < give_up, "the call never went to sleep");
        thread::yield_now();
    }
}

/// Runs `call` on its own thread, waits until that thread sleeps, runs
/// `interrupt` here, and returns the call's result, which must come
/// within [`BOUND`].
fn interrupted<R: Send + 'static>(
    what: &str,
    call: impl FnOnce() -> R + Send + 'static,
    interrupt: impl FnOnce(),
) -> R {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        // SAFETY: gettid(2) has no preconditions.
        let _ = tx.send(Err(unsafe { libc::gettid() }));
        let _ = tx.send(Ok(call()));
    });
    let tid = rx.recv_timeout(T).unwrap().err().unwrap();
    until_asleep(tid);
    let t = Instant::now();
    interrupt();
    let r = match rx.recv_timeout(BOUND) {
        Ok(r) => r.ok().unwrap(),
        Err(_) => panic!("{what}: the blocked call was not woken within {BOUND:?}"),
    };
    assert!(t.elapsed() < BOUND, "{what}");
    h.join().unwrap();
    r
}

#[test]
fn shutdown_from_another_thread_ends_a_blocked_read() {
    let (_a, b) = pair();
    b.set_read_timeout(Some(LONG)).unwrap();
    let reader = b.clone();
    let r = interrupted(
        "shutdown(Read)",
        move || {
            let mut buf = [0u8; 16];
            (&reader).read(&mut buf)
        },
        || b.shutdown(std::net::Shutdown::Read).unwrap(),
    );
    // No message goes out for SHUT_RD (rsocket.c's rule), so no
    // completion woke the reader: only the interrupt did.
    assert_eq!(r.unwrap(), 0, "end of stream after shutdown(Read)");
}

#[test]
fn shutdown_both_from_another_thread_ends_a_blocked_write() {
    let (a, b) = pair();
    b.set_write_timeout(Some(LONG)).unwrap();
    // One blocking write of more than the peer's ring and our send
    // buffer together, to a peer that never reads: part of it goes at
    // once, then the call sleeps for room that never comes (it may sleep
    // and wake for credits before that; the shutdown finds it asleep or
    // awake and looking, either way it must return).
    let big = vec![7u8; 64 << 20];
    let writer = b.clone();
    let r = interrupted(
        "shutdown(Both)",
        move || (&writer).write(&big),
        || b.shutdown(std::net::Shutdown::Both).unwrap(),
    );
    // The part that went before the shutdown, as send(2) returns it, and
    // now, not at the deadline: before the fix of `write`, a blocking
    // write that had moved part of its buffer waited on after the
    // shutdown for room it could never use.
    let n = r.expect("the part written before the shutdown");
    assert!(n > 0 && n < 64 << 20, "wrote {n} bytes");
    let e = (&b).write(b"x").expect_err("a write after shutdown(Both)");
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    drop(a);
}
