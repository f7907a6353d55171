//! Completion queues: polling, blocking wait with timeout, eventfd.
//!
//! Completions are produced through a QP that is never connected: posting
//! receives and then disconnecting flushes them into the CQ.

use std::time::{Duration, Instant};

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

/// A CQ with wake policy `policy`, and a PD and 64-byte region for the
/// receives that `one_completion` posts.
fn policy_cq(
    policy: iwarp::WakePolicy,
) -> (
    Context,
    iwarp::ProtectionDomain,
    iwarp::CompletionQueue,
    iwarp::MemoryRegion,
) {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    cq.set_wake_policy(policy);
    cq.set_progress(ProgressMode::Threaded {
        spin: Duration::ZERO,
    })
    .unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    (ctx, pd, cq, mr)
}

/// A thread that waits (timeout 5 s) without attending the CQ, so in the
/// background under `WakePolicy::Newest`: returns what `wait` returned.
fn background_waiter(cq: &iwarp::CompletionQueue) -> std::thread::JoinHandle<bool> {
    let cq = cq.clone();
    std::thread::spawn(move || cq.wait(Duration::from_secs(5)).unwrap())
}

/// Wait up to 3 s for `h` to finish; true if it did.
fn finishes<T>(h: &std::thread::JoinHandle<T>) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if h.is_finished() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn newest_policy_wakes_the_foreground_waiter_not_the_background_one() {
    let (_ctx, pd, cq, mr) = policy_cq(iwarp::WakePolicy::Newest);
    let qp1 = one_completion(&pd, &cq, &mr, 1);
    let qp2 = one_completion(&pd, &cq, &mr, 2);
    // The foreground waiter goes to sleep first: the background one is the
    // newest, and still must not be the one woken.
    let fg = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            // Attending: this thread's wait is in the foreground. It takes
            // the completion before its attendance ends (an attendance that
            // ends with completions waiting hands them to the background).
            let _attend = cq.attend();
            let woke = cq.wait(Duration::from_secs(5)).unwrap();
            (woke, cq.poll_one().map(|wc| wc.wr_id))
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let bg = background_waiter(&cq);
    std::thread::sleep(Duration::from_millis(50));
    qp1.disconnect();
    assert!(finishes(&fg), "the foreground waiter is woken");
    assert_eq!(fg.join().unwrap(), (true, Some(1)));
    // The foreground waiter took the wake-up; the background one sleeps on.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !bg.is_finished(),
        "background waiter woken with a foreground one asleep"
    );
    // With nobody else asleep, the next completion wakes it.
    qp2.disconnect();
    assert!(finishes(&bg), "the background waiter is woken once alone");
    assert!(bg.join().unwrap());
    assert_eq!(cq.poll_one().map(|wc| wc.wr_id), Some(2));
}

#[test]
fn attendance_holds_back_the_background_waiter_until_dropped() {
    let (_ctx, pd, cq, mr) = policy_cq(iwarp::WakePolicy::Newest);
    let qp = one_completion(&pd, &cq, &mr, 3);
    let bg = background_waiter(&cq);
    std::thread::sleep(Duration::from_millis(50));
    let attend = cq.attend();
    qp.disconnect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!bg.is_finished(), "woken although a thread attends the CQ");
    assert_eq!(cq.len(), 1);
    drop(attend);
    assert!(
        finishes(&bg),
        "dropping the attendance hands the completion over"
    );
    assert!(bg.join().unwrap());
    assert_eq!(cq.poll_one().map(|wc| wc.wr_id), Some(3));
}

#[test]
fn background_waiter_under_the_default_policy_is_woken_like_any() {
    let (_ctx, pd, cq, mr) = policy_cq(iwarp::WakePolicy::All);
    let qp = one_completion(&pd, &cq, &mr, 4);
    let bg = background_waiter(&cq);
    let _attend = cq.attend();
    std::thread::sleep(Duration::from_millis(50));
    qp.disconnect();
    assert!(finishes(&bg), "WakePolicy::All ignores attendance");
    assert!(bg.join().unwrap());
    assert!(
        cq.wait(Duration::from_millis(60)).unwrap(),
        "a non-empty CQ returns at once"
    );
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
