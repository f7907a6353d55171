//! `iwarp::wait::WaitSet`: one wait over completion queues and outside
//! descriptors, in each progress mode. No assertion is timed: a wait that
//! must wake is given a long deadline ([`T`]) and must not time out; a
//! wait that must time out must say so and not return before its
//! deadline.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::*;
use iwarp::wait::{CqInterest, Interest, Token, Until, WaitSet, Wake};
use iwarp::{CompletionQueue, MemoryRegion, ProgressMode, WcStatus, WrOpcode};
use iwarp_proto::handshake::MpaConfig;

const CQ: Token = Token(1);
const PIPE: Token = Token(2);

const THREADED: ProgressMode = ProgressMode::Threaded {
    spin: Duration::ZERO,
};
const DRIVEN: ProgressMode = ProgressMode::AppDriven {
    spin: Duration::ZERO,
};

/// A connected pair whose server receive CQ is in `mode` (set before
/// connecting), with `n` receives posted on the server.
fn pair_in(mode: ProgressMode, n: u64) -> (Host, Host, MemoryRegion, MemoryRegion) {
    let (client, server) = pair_with(MpaConfig::default(), |_, s| {
        s.rcq.set_progress(mode).unwrap();
    });
    let cbuf = client.mr(4096);
    let sbuf = server.mr(4096);
    for i in 0..n {
        server.post_recv(100 + i, &sbuf, 2048, 64);
    }
    (client, server, cbuf, sbuf)
}

fn send(h: &Host, mr: &MemoryRegion, i: u64) {
    mr.write_at(0, &i.to_le_bytes());
    h.qp.post_send(&iwarp::SendWr {
        signaled: false,
        ..wr(i, WrOpcode::Send, &[mr.sge(0, 8)])
    })
    .unwrap();
}

/// A set of `cq` (for its completions) and the read end of a pipe.
fn set_of(cq: &CompletionQueue, pipe: &std::io::PipeReader) -> WaitSet {
    let mut set = WaitSet::new();
    set.add_cq(cq, CqInterest::Completions, CQ);
    set.add_fd(pipe.as_raw_fd(), Interest::READABLE, PIPE);
    set
}

/// Wait with deadline [`T`] and expect the CQ to be ready, not the pipe.
fn expect_cq(set: &mut WaitSet) {
    let deadline = Instant::now() + T;
    let w = set.wait(deadline).unwrap();
    // Not a timing assertion (T is the tests' bound for any completion):
    // a set that only noticed the CQ when its deadline passed was not
    // woken by it.
    assert!(
        !w.is_timeout() && Instant::now() < deadline,
        "no completion woke the wait within {T:?}"
    );
    assert!(w.is_ready(CQ), "{w:?}");
    assert!(!w.is_ready(PIPE), "{w:?}");
}

/// The client sends `i` after a moment (so that the waiter is asleep, or
/// spinning, by then; the test holds without the delay, it only makes the
/// sleep path the one exercised).
fn send_later<'s>(s: &'s std::thread::Scope<'s, '_>, client: &'s Host, buf: &'s MemoryRegion) {
    s.spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        send(client, buf, 1);
    });
}

#[test]
fn threaded_cq_wakes_the_wait_for_a_completion() {
    let (client, server, cbuf, _sbuf) = pair_in(THREADED, 1);
    let (r, _w) = std::io::pipe().unwrap();
    let mut set = set_of(&server.rcq, &r);
    std::thread::scope(|s| {
        send_later(s, &client, &cbuf);
        expect_cq(&mut set);
    });
    let wc = server
        .rcq
        .poll_one()
        .expect("the completion is left in the CQ");
    assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Success));
}

/// Application-driven: the receive threads stay parked, so the Send is
/// read only because the waiting thread does the receive work when the
/// CQ's descriptor (the socket) becomes readable.
#[test]
fn app_driven_cq_wakes_and_the_waiting_thread_reads_the_socket() {
    let (client, server, cbuf, sbuf) = pair_in(DRIVEN, 1);
    let (r, _w) = std::io::pipe().unwrap();
    let mut set = set_of(&server.rcq, &r);
    let before = server.qp.stats().rx_polled_bytes;
    std::thread::scope(|s| {
        send_later(s, &client, &cbuf);
        expect_cq(&mut set);
    });
    let wc = server.rcq.poll_one().unwrap();
    assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Success));
    let mut got = [0u8; 8];
    sbuf.read_at(2048, &mut got);
    assert_eq!(u64::from_le_bytes(got), 1);
    assert!(
        server.qp.stats().rx_polled_bytes > before,
        "the waiting thread read the Send: {:?}",
        server.qp.stats()
    );
}

/// Application-driven, with the data already in the socket and the
/// deadline already passed: the wait still does the receive work first
/// and reports the completion.
#[test]
fn app_driven_data_already_in_the_socket_is_ready_without_sleeping() {
    let (client, server, cbuf, _sbuf) = pair_in(DRIVEN, 1);
    let (r, _w) = std::io::pipe().unwrap();
    let mut set = set_of(&server.rcq, &r);
    send(&client, &cbuf, 1);
    arrived(&server.rcq);
    let w = set.wait(Until::Deadline(Instant::now())).unwrap();
    assert!(w.is_ready(CQ), "{w:?}");
}

/// Wait (bounded) until bytes reach the socket of an application-driven
/// CQ's queue pair; nobody reads them (the receive threads are parked), so
/// the CQ stays empty until a wait does the receive work.
fn arrived(cq: &CompletionQueue) {
    let mut pfd = libc::pollfd {
        fd: cq.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, passed with its count.
    let rc = unsafe { libc::poll(&mut pfd, 1, T.as_millis() as i32) };
    assert_eq!(rc, 1, "the Send never reached the server's socket");
    assert!(cq.is_empty(), "nobody did the receive work yet");
}

/// Busy-poll: a ping-pong of Sends through a set (a busy CQ and a pipe);
/// the waiting threads, not only the receive threads, read the bytes.
#[test]
fn busy_poll_cq_wakes_and_the_waiting_thread_does_the_receive_work() {
    const N: u64 = 200;
    let (client, server) = pair_with(MpaConfig::default(), |c, s| {
        c.rcq.set_progress(ProgressMode::BusyPoll).unwrap();
        s.rcq.set_progress(ProgressMode::BusyPoll).unwrap();
    });
    let cbuf = client.mr(4096);
    let sbuf = server.mr(4096);
    for i in 0..4 {
        client.post_recv(100 + i, &cbuf, 2048, 64);
        server.post_recv(200 + i, &sbuf, 2048, 64);
    }
    fn recv(h: &Host, set: &mut WaitSet) -> iwarp::WorkCompletion {
        expect_cq(set);
        h.rcq.poll_one().unwrap()
    }
    let (r1, _w1) = std::io::pipe().unwrap();
    let (r2, _w2) = std::io::pipe().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut set = set_of(&server.rcq, &r2);
            for i in 0..N {
                let wc = recv(&server, &mut set);
                assert_eq!(wc.status, WcStatus::Success, "server recv {i}");
                server.post_recv(wc.wr_id, &sbuf, 2048, 64);
                send(&server, &sbuf, i);
            }
        });
        let mut set = set_of(&client.rcq, &r1);
        for i in 0..N {
            send(&client, &cbuf, i);
            let wc = recv(&client, &mut set);
            assert_eq!(wc.status, WcStatus::Success, "client recv {i}");
            let mut got = [0u8; 8];
            cbuf.read_at(2048, &mut got);
            assert_eq!(u64::from_le_bytes(got), i, "echo {i}");
            client.post_recv(wc.wr_id, &cbuf, 2048, 64);
        }
    });
    let (cs, ss) = (client.qp.stats(), server.qp.stats());
    assert!(
        cs.rx_polled_bytes > 0 && ss.rx_polled_bytes > 0,
        "the busy waiters read nothing: client {cs:?}, server {ss:?}"
    );
}

/// An outside descriptor ends the wait, beside a CQ in each mode.
#[test]
fn an_outside_descriptor_wakes_the_wait_in_every_mode() {
    for mode in [THREADED, DRIVEN, ProgressMode::BusyPoll] {
        let (_client, server, _cbuf, _sbuf) = pair_in(mode, 1);
        let (r, w) = std::io::pipe().unwrap();
        let mut set = set_of(&server.rcq, &r);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                (&w).write_all(b"x").unwrap();
            });
            let deadline = Instant::now() + T;
            let wake = set.wait(deadline).unwrap();
            assert!(
                !wake.is_timeout() && Instant::now() < deadline,
                "{mode:?}: the pipe did not wake it"
            );
            assert!(wake.is_ready(PIPE), "{mode:?}: {wake:?}");
            assert!(!wake.is_ready(CQ), "{mode:?}: {wake:?}");
            match wake {
                Wake::Ready(ev) => assert!(ev[0].readable && !ev[0].writable),
                Wake::Timeout => unreachable!(),
            }
        });
    }
}

/// Nothing happens: the wait says Timeout, and not before its deadline.
#[test]
fn the_deadline_is_honoured_in_every_mode() {
    for mode in [THREADED, DRIVEN, ProgressMode::BusyPoll] {
        let (_client, server, _cbuf, _sbuf) = pair_in(mode, 1);
        let (r, _w) = std::io::pipe().unwrap();
        let mut set = set_of(&server.rcq, &r);
        let deadline = Instant::now() + Duration::from_millis(150);
        let wake = set.wait(deadline).unwrap();
        assert!(wake.is_timeout(), "{mode:?}: {wake:?}");
        assert!(
            Instant::now() >= deadline,
            "{mode:?}: returned before the deadline"
        );
    }
    // A set of only a descriptor, too.
    let (r, _w) = std::io::pipe().unwrap();
    let mut set = WaitSet::new();
    set.add_fd(r.as_raw_fd(), Interest::READABLE, PIPE);
    let deadline = Instant::now() + Duration::from_millis(50);
    assert!(set.wait(deadline).unwrap().is_timeout());
    assert!(Instant::now() >= deadline);
}

/// A completion already queued makes the wait return at once: even with
/// a deadline that has passed, it is reported, not a timeout.
#[test]
fn a_queued_completion_is_ready_at_once() {
    for mode in [THREADED, DRIVEN, ProgressMode::BusyPoll] {
        let (client, server, cbuf, _sbuf) = pair_in(mode, 1);
        send(&client, &cbuf, 1);
        assert!(server.rcq.wait(T).unwrap(), "{mode:?}: no completion");
        let (r, _w) = std::io::pipe().unwrap();
        let mut set = set_of(&server.rcq, &r);
        let wake = set.wait(Until::Deadline(Instant::now())).unwrap();
        assert!(wake.is_ready(CQ), "{mode:?}: {wake:?}");
    }
}

/// A progress-only CQ does the receive work but its completions do not
/// end the wait: with only such a CQ and a quiet pipe, the wait times
/// out, and the Send the waiting thread read is in the CQ.
#[test]
fn a_progress_only_cq_is_serviced_but_does_not_wake() {
    let (client, server, cbuf, _sbuf) = pair_in(DRIVEN, 1);
    let (r, _w) = std::io::pipe().unwrap();
    let mut set = WaitSet::new();
    set.add_cq(&server.rcq, CqInterest::Progress, CQ);
    set.add_fd(r.as_raw_fd(), Interest::READABLE, PIPE);
    send(&client, &cbuf, 1);
    arrived(&server.rcq);
    let wake = set.wait(Until::Deadline(Instant::now())).unwrap();
    assert!(wake.is_timeout(), "{wake:?}");
    assert!(
        !server.rcq.is_empty(),
        "the waiting thread did the receive work"
    );
}

#[test]
fn waiting_forever_on_an_empty_set_is_refused() {
    let e = WaitSet::new().wait(Until::Forever).unwrap_err();
    assert!(e.to_string().contains("empty WaitSet"), "{e}");
}

/// A set of one CQ and nothing else waits through the CQ's own `wait`:
/// it wakes for a completion in each mode, and times out.
#[test]
fn a_set_of_one_cq_wakes_and_times_out_in_every_mode() {
    for mode in [THREADED, DRIVEN, ProgressMode::BusyPoll] {
        let (client, server, cbuf, _sbuf) = pair_in(mode, 1);
        let mut set = WaitSet::new();
        set.add_cq(&server.rcq, CqInterest::Completions, CQ);
        let deadline = Instant::now() + Duration::from_millis(50);
        assert!(set.wait(deadline).unwrap().is_timeout(), "{mode:?}");
        assert!(Instant::now() >= deadline, "{mode:?}");
        std::thread::scope(|s| {
            send_later(s, &client, &cbuf);
            let deadline = Instant::now() + T;
            let w = set.wait(deadline).unwrap();
            assert!(
                w.is_ready(CQ) && Instant::now() < deadline,
                "{mode:?}: {w:?}"
            );
        });
    }
}

/// A queue pair that fails with nothing outstanding flushes nothing, so
/// no completion says so; its event descriptor wakes the wait instead.
#[test]
fn a_qp_event_wakes_the_wait_through_the_event_fd() {
    const EV: Token = Token(3);
    let (client, server) = pair();
    let efd = server
        .qp
        .event_fd()
        .expect("the soft provider has an event fd");
    let (r, _w) = std::io::pipe().unwrap();
    let mut set = set_of(&server.rcq, &r);
    set.add_fd(efd, Interest::READABLE, EV);
    // `pair` took the Established event: nothing waits now.
    assert!(set
        .wait(Until::Deadline(Instant::now()))
        .unwrap()
        .is_timeout());
    client.qp.disconnect();
    let deadline = Instant::now() + T;
    let w = set.wait(deadline).unwrap();
    assert!(
        w.is_ready(EV) && !w.is_ready(CQ) && Instant::now() < deadline,
        "{w:?}"
    );
    assert!(server.qp.next_event(Duration::ZERO).is_some());
    // Taken: the descriptor is clear again.
    while server.qp.next_event(Duration::ZERO).is_some() {}
    assert!(set
        .wait(Until::Deadline(Instant::now()))
        .unwrap()
        .is_timeout());
}
