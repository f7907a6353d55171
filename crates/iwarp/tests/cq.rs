//! Completion queues: polling, blocking wait with timeout, eventfd.
//!
//! Completions are produced through a QP that is never connected: posting
//! receives and then disconnecting flushes them into the CQ.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::wait::{CqInterest, Interest, Token, Until, WaitSet};
use iwarp::{Access, Context, ProgressMode, QpInitAttr, RecvWr, SgList, WcStatus, WorkCompletion};

fn readable(fd: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, zero timeout.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc == 1 && pfd.revents & libc::POLLIN != 0
}

/// A QP (never connected) whose send and receive completions go to `cq`.
fn qp_on(pd: &iwarp::ProtectionDomain, cq: &iwarp::CompletionQueue) -> iwarp::QueuePair {
    pd.create_qp(&QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        max_send_wr: 4,
        max_recv_wr: 4,
    })
    .unwrap()
}

#[test]
fn wait_times_out_on_empty_cq() {
    let ctx = Context::open().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let t = Instant::now();
    assert!(!cq.wait(Duration::from_millis(100)).unwrap());
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(95) && el < Duration::from_secs(2),
        "{el:?}"
    );
    assert!(cq.poll_one().is_none());
    let mut out = [empty(); 4];
    assert_eq!(cq.poll(&mut out), 0);
    assert!(!readable(cq.as_raw_fd()));
}

fn empty() -> WorkCompletion {
    WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: iwarp::WcOpcode::Send,
        queue: iwarp::WcQueue::Send,
        byte_len: 0,
        invalidated_rkey: None,
        solicited: false,
    }
}

#[test]
fn flushed_receives_wake_waiter_and_eventfd() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let qp = qp_on(&pd, &cq);
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    for id in 1..=3 {
        qp.post_recv(&RecvWr {
            wr_id: id,
            sgl: SgList::single(mr.sge(0, 64)),
        })
        .unwrap();
    }
    assert!(!readable(cq.as_raw_fd()));
    let waiter = {
        let cq = cq.clone();
        std::thread::spawn(move || cq.wait(Duration::from_secs(5)).unwrap())
    };
    std::thread::sleep(Duration::from_millis(50));
    qp.disconnect();
    assert!(
        waiter.join().unwrap(),
        "wait returned true once completions arrived"
    );
    assert!(
        readable(cq.as_raw_fd()),
        "eventfd readable while CQ non-empty"
    );
    assert_eq!(cq.len(), 3);
    let mut out = [empty(); 2];
    assert_eq!(cq.poll(&mut out), 2);
    assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2), "FIFO order");
    assert!(out.iter().all(|wc| wc.status == WcStatus::WrFlushErr));
    assert!(readable(cq.as_raw_fd()), "still one left");
    let last = cq.poll_one().unwrap();
    assert_eq!(last.wr_id, 3);
    assert!(
        !readable(cq.as_raw_fd()),
        "eventfd cleared when the CQ drains"
    );
    assert!(cq.is_empty());
    assert!(!cq.wait(Duration::from_millis(10)).unwrap());
}

#[test]
fn eventfd_asked_for_late_is_readable_at_once() {
    // The CQ keeps its eventfd in step only once `as_raw_fd` was called;
    // asking for it while completions already wait must find it readable.
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let qp = qp_on(&pd, &cq);
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&RecvWr {
        wr_id: 9,
        sgl: SgList::single(mr.sge(0, 64)),
    })
    .unwrap();
    qp.disconnect();
    assert!(cq.wait(Duration::from_secs(5)).unwrap());
    assert!(readable(cq.as_raw_fd()), "armed while non-empty");
    assert_eq!(cq.poll_one().unwrap().wr_id, 9);
    assert!(!readable(cq.as_raw_fd()), "cleared once drained");
}

#[test]
fn wait_without_spin_sleeps_and_is_woken() {
    // Threaded with no spin goes straight to sleep: it must still time out
    // on an empty CQ and be woken by completions pushed from another thread.
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    cq.set_progress(ProgressMode::Threaded {
        spin: Duration::ZERO,
    })
    .unwrap();
    let t = Instant::now();
    assert!(!cq.wait(Duration::from_millis(50)).unwrap());
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(45) && el < Duration::from_secs(2),
        "{el:?}"
    );
    let qp = qp_on(&pd, &cq);
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&RecvWr {
        wr_id: 7,
        sgl: SgList::single(mr.sge(0, 64)),
    })
    .unwrap();
    let waiter = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let woke = cq.wait(Duration::from_secs(5)).unwrap();
            (woke, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    qp.disconnect();
    let (woke, el) = waiter.join().unwrap();
    assert!(woke, "woken by the flushed receive");
    assert!(el < Duration::from_secs(4), "woken, not timed out: {el:?}");
    assert_eq!(cq.poll_one().map(|wc| wc.wr_id), Some(7));
}

/// A QP on `cq` with one receive posted (`wr_id`): disconnecting it pushes
/// one flushed completion.
fn one_completion(
    pd: &iwarp::ProtectionDomain,
    cq: &iwarp::CompletionQueue,
    mr: &iwarp::MemoryRegion,
    wr_id: u64,
) -> iwarp::QueuePair {
    let qp = qp_on(pd, cq);
    qp.post_recv(&RecvWr {
        wr_id,
        sgl: SgList::single(mr.sge(0, 64)),
    })
    .unwrap();
    qp
}

/// A threaded CQ with no polling phase, and a PD and 64-byte region for
/// the receives that `one_completion` posts.
fn threaded_cq() -> (
    Context,
    iwarp::ProtectionDomain,
    iwarp::CompletionQueue,
    iwarp::MemoryRegion,
) {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    cq.set_progress(ProgressMode::Threaded {
        spin: Duration::ZERO,
    })
    .unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    (ctx, pd, cq, mr)
}

/// What rdma-xfer's caller relies on (its `rdma/handoff.rs`, which
/// replaced `WakePolicy::Newest` and `Attendance`): a `WaitSet` of a CQ
/// and an outside descriptor, the CQ with a completion hook that declines
/// (returns false), is woken by a completion that arrives while it sleeps:
/// the provider makes the CQ's descriptor readable after the hook.
#[test]
fn a_wait_set_wakes_for_a_completion_its_hook_declines() {
    let (_ctx, pd, cq, mr) = threaded_cq();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    cq.set_completion_hook(Some(Arc::new(move || {
        r.fetch_add(1, Ordering::SeqCst);
        false
    })));
    let qp = one_completion(&pd, &cq, &mr, 3);
    let (pipe_r, _pipe_w) = std::io::pipe().unwrap();
    let waiter = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            let mut set = WaitSet::new();
            set.add_cq(&cq, CqInterest::Completions, Token(1));
            set.add_fd(pipe_r.as_raw_fd(), Interest::READABLE, Token(2));
            let w = set.wait(Until::after(Duration::from_secs(5))).unwrap();
            (w.is_ready(Token(1)), w.is_ready(Token(2)))
        })
    };
    // Likely asleep by then (if not, the wait finds the completion by the
    // CQ's length: the same answer).
    std::thread::sleep(Duration::from_millis(50));
    qp.disconnect();
    assert_eq!(
        waiter.join().unwrap(),
        (true, false),
        "woken by the CQ only"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the hook ran once");
    assert_eq!(cq.poll_one().map(|wc| wc.wr_id), Some(3));
}

/// The other half: a hook that takes the completions (returns true, as
/// rdma-xfer's does when it rings its dispatcher instead) leaves the CQ's
/// descriptor alone, yet a `WaitSet` on the CQ that still holds them
/// returns at once (it reads the CQ's length before it sleeps), so a
/// thread that takes over the CQ later cannot sleep past them.
#[test]
fn a_wait_set_finds_completions_a_hook_kept_off_the_descriptor() {
    let (_ctx, pd, cq, mr) = threaded_cq();
    let fd = cq.as_raw_fd();
    let (tx, rx) = std::sync::mpsc::channel();
    cq.set_completion_hook(Some(Arc::new(move || {
        let _ = tx.send(());
        true
    })));
    let qp = one_completion(&pd, &cq, &mr, 4);
    qp.disconnect();
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the hook ran for the flushed receive");
    assert!(
        !readable(fd),
        "the hook took it: the descriptor stays clear"
    );
    let (pipe_r, _pipe_w) = std::io::pipe().unwrap();
    let mut set = WaitSet::new();
    set.add_cq(&cq, CqInterest::Completions, Token(1));
    set.add_fd(pipe_r.as_raw_fd(), Interest::READABLE, Token(2));
    // A deadline already passed: only the CQ's length can make it ready.
    let w = set.wait(Until::Deadline(Instant::now())).unwrap();
    assert!(w.is_ready(Token(1)), "{w:?}");
    assert_eq!(cq.poll_one().map(|wc| wc.wr_id), Some(4));
}

#[test]
fn paused_descriptor_updates_skip_arrivals_and_resume_in_step() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let qp = qp_on(&pd, &cq);
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let fd = cq.as_raw_fd();
    cq.set_fd_updates(false);
    for wr_id in [1, 2] {
        qp.post_recv(&RecvWr {
            wr_id,
            sgl: SgList::single(mr.sge(0, 64)),
        })
        .unwrap();
    }
    qp.disconnect();
    assert!(cq.wait(Duration::from_secs(5)).unwrap());
    assert!(!readable(fd), "paused: arrivals leave the descriptor alone");
    // Resuming with completions queued makes it readable at once...
    cq.set_fd_updates(true);
    assert!(readable(fd));
    assert_eq!(cq.poll_one().unwrap().wr_id, 1);
    assert!(readable(fd), "still one left");
    // ...and a pause while readable, drained meanwhile, resumes cleared.
    cq.set_fd_updates(false);
    assert_eq!(cq.poll_one().unwrap().wr_id, 2);
    cq.set_fd_updates(true);
    assert!(!readable(fd), "resumed empty: cleared");
}
