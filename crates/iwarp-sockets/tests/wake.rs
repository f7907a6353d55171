//! Wake-ups that nothing else would deliver (issue 28, "one reactor"):
//! the progress thread sleeps in one `WaitSet` with no slices, and a
//! blocked call sleeps on its completion queue with no slices, so a missed
//! wake-up hangs instead of costing a slice. One test in its own binary:
//! another test's streams would wake the shared progress thread and hide
//! a missing wake-up.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

mod common;

use iwarp_sockets::{Stream, Watermark};

/// Bound of every wait: far below the progress thread's 10 s keepalive
/// tick (its only timed wake-up), far above a loaded machine's delays.
const T: Duration = Duration::from_secs(5);

fn pair() -> (Stream, Stream) {
    common::pair(T)
}

#[test]
fn wake_ups_reach_sleeping_threads() {
    // 1. A stream made while the progress thread sleeps is watched at once.
    // The first pair starts the thread, which then sleeps (nothing moves).
    let (_a0, _b0) = pair();
    let (a, b) = pair();
    // With a watermark callback the completion hook declines (callbacks
    // must not run on the provider's threads), so only the progress
    // thread can deliver `Readable`: it must have added `b` to its set
    // when `b` registered, not at its next keepalive tick.
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    b.set_watermarks(
        1,
        1,
        Some(Arc::new(move |ev| {
            let _ = tx.lock().unwrap().send(ev);
        })),
    );
    (&a).write_all(b"x").unwrap();
    let got = loop {
        match rx.recv_timeout(T) {
            Ok(Watermark::Writable) => continue,
            other => break other,
        }
    };
    assert_eq!(
        got,
        Ok(Watermark::Readable),
        "the progress thread did not see the new stream within {T:?}"
    );
    let mut one = [0u8; 1];
    (&b).read_exact(&mut one).unwrap();
    b.set_watermarks(0, 0, None);

    // 2. `shutdown(Read)` from another thread ends a read blocked without a
    // timeout: no message goes out for it (rsocket.c's rule), so no
    // completion wakes the reader, only the interrupt of its CQ wait.
    let reader = b.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let mut buf = [0u8; 16];
        let _ = tx.send(reader.recv(&mut buf));
    });
    // Not a synchronization: the read returns end of stream whether it
    // starts before or after the shutdown; the pause only makes it likely
    // that the read is asleep when the shutdown comes, which is the case
    // under test.
    thread::sleep(Duration::from_millis(200));
    b.shutdown(std::net::Shutdown::Read).unwrap();
    let r = rx
        .recv_timeout(T)
        .expect("a read blocked before shutdown(Read) was not woken");
    assert_eq!(r.unwrap(), 0, "end of stream after shutdown(Read)");
    h.join().unwrap();

    // 3. A stream the progress thread parked (it woke for completions a
    // blocked read was about to take) comes back to it when only it can
    // take them: blocking reads first (each one sleeps on the CQ), then a
    // watermark callback, which again only the progress thread delivers.
    let (a, b) = pair();
    for i in 0..50u8 {
        let writer = a.try_clone().unwrap();
        let h = thread::spawn(move || (&writer).write_all(&[i]).unwrap());
        let mut one = [0u8; 1];
        (&b).read_exact(&mut one).unwrap();
        assert_eq!(one[0], i);
        h.join().unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    b.set_watermarks(
        1,
        1,
        Some(Arc::new(move |ev| {
            let _ = tx.lock().unwrap().send(ev);
        })),
    );
    (&a).write_all(b"y").unwrap();
    let got = loop {
        match rx.recv_timeout(T) {
            Ok(Watermark::Writable) => continue,
            other => break other,
        }
    };
    assert_eq!(
        got,
        Ok(Watermark::Readable),
        "the progress thread did not take the parked stream back within {T:?}"
    );
}
