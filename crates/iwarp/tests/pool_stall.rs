//! A pool thread never sleeps on one connection's transmit lock (issue 29
//! item 2, the progress pool's idle gaps).
//!
//! An application thread holds a connection's transmit lock while it
//! writes inline (`post_send`), and under CPU contention it can be
//! preempted there for a scheduler slice or more. A pool thread that
//! needed the same lock used to wait for it (a plain `lock` in
//! `pool.rs`'s `tx_work`: futex waits of up to 17 ms seen with `perf
//! trace` on a loaded machine), and every other connection it serves
//! stalled with it. Now it leaves the work to the holder, which queues it
//! when it lets go.
//!
//! The preemption is made deterministic: the completion hook of one
//! connection's send CQ runs on the posting thread inside its inline
//! write, with the transmit lock held, and there it blocks until the test
//! lets it go (a hook must not block; this one stands in for the
//! scheduler). Meanwhile another post on that connection makes the pool
//! want its lock, and a second connection, served by the same pool
//! thread, must complete a ping-pong. Without the fix that ping-pong
//! cannot finish before the hold ends; the test ends the hold only after
//! the ping-pong, with a bound.
//!
//! Its own binary: the pool (one thread, so both connections share it)
//! is process-wide and starts with the first pooled connection.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::*;
use iwarp::soft::pool::audit;
use iwarp::soft::{pool_stats, set_progress_engine, ProgressEngine, ENV_THREADS};
use iwarp::{WcStatus, WrOpcode};

/// How long the ping-pong may take while the lock is held (20 round trips
/// take milliseconds; the bound is for a loaded machine).
const PING_PONG_BOUND: Duration = Duration::from_secs(5);
/// How long the hook holds the lock at most if nobody lets it go.
const HOLD_MAX: Duration = Duration::from_secs(10);

#[test]
fn a_held_transmit_lock_does_not_stall_the_pool_threads_other_connections() {
    // One pool thread for every connection of this process (read when the
    // pool starts, at the first pooled connection below).
    std::env::set_var(ENV_THREADS, "1");
    set_progress_engine(ProgressEngine::Pool);
    let (a_cli, a_srv) = pair();
    let (b_cli, b_srv) = pair();
    let stats = pool_stats();
    assert_eq!(
        (stats.threads, stats.connections),
        (1, 4),
        "one pool thread serving both pairs"
    );

    // A: RDMA Writes into the server's region (both ends are in this
    // process, so its address and rkey need no exchange).
    let a_dst = a_srv.mr(8192);
    let a_src = a_cli.mr(8192);
    a_src.write_at(0, &pattern(8192, 0x3c));
    let write = |wr_id: u64, off: usize| {
        wr(
            wr_id,
            WrOpcode::RdmaWrite {
                remote_addr: a_dst.addr() + off as u64,
                rkey: a_dst.rkey(),
            },
            &[a_src.sge(off, 4096)],
        )
    };

    // The hook: on the holder thread only, once, block (with A's transmit
    // lock held, inside the inline write) until released.
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release_tx, release) = mpsc::channel::<()>();
    let release = std::sync::Mutex::new(release);
    let armed = Arc::new(AtomicBool::new(true));
    let holding = Arc::new(AtomicBool::new(false));
    let holder_id = std::sync::OnceLock::<std::thread::ThreadId>::new();
    let holder_id = Arc::new(holder_id);
    {
        let (armed, holding, holder_id) = (armed.clone(), holding.clone(), holder_id.clone());
        let entered_tx = std::sync::Mutex::new(entered_tx);
        a_cli.scq.set_completion_hook(Some(Arc::new(move || {
            if holder_id.get() == Some(&std::thread::current().id())
                && armed.swap(false, Ordering::SeqCst)
            {
                holding.store(true, Ordering::SeqCst);
                let _ = entered_tx.lock().unwrap().send(());
                let _ = release.lock().unwrap().recv_timeout(HOLD_MAX);
                holding.store(false, Ordering::SeqCst);
            }
            false
        })));
    }
    let left_before = audit::counts().tx_left;

    std::thread::scope(|s| {
        let holder = s.spawn(|| {
            holder_id.set(std::thread::current().id()).unwrap();
            a_cli.qp.post_send(&write(1, 0)).unwrap();
        });
        entered
            .recv_timeout(T)
            .expect("the posting thread's inline write ran the completion hook");
        // Another post on A finds its transmit lock held and hands the
        // work to A's pool thread, which wants the lock now.
        a_cli.qp.post_send(&write(2, 4096)).unwrap();

        // B, served by the same pool thread: 20 Send round trips, each
        // needing the pool thread to read at both ends.
        let t0 = Instant::now();
        let (b_cbuf, b_sbuf) = (b_cli.mr(64), b_srv.mr(64));
        for i in 0..20u64 {
            b_srv.post_recv(i, &b_sbuf, 0, 64);
            b_cli.post_recv(i, &b_cbuf, 0, 64);
            let ping = wr(i, WrOpcode::Send, &[b_cbuf.sge(0, 8)]);
            b_cli.qp.post_send(&ping).unwrap();
            let wc = wait_until(&b_srv.rcq, t0 + PING_PONG_BOUND, "B's ping");
            assert_eq!(wc.status, WcStatus::Success);
            let pong = wr(i, WrOpcode::Send, &[b_sbuf.sge(0, 8)]);
            b_srv.qp.post_send(&pong).unwrap();
            let wc = wait_until(&b_cli.rcq, t0 + PING_PONG_BOUND, "B's pong");
            assert_eq!(wc.status, WcStatus::Success);
        }
        assert!(
            holding.load(Ordering::SeqCst),
            "B's ping-pong finished only after A's transmit lock was let go: the pool thread waited for it"
        );
        release_tx.send(()).unwrap();
        holder.join().unwrap();
    });
    assert!(
        audit::counts().tx_left > left_before,
        "the pool thread found A's transmit lock held (the case under test)"
    );

    // The work the pool left to the holder went out: both Writes complete
    // and land.
    let mut done = Vec::new();
    let deadline = Instant::now() + T;
    while done.len() < 2 {
        let wc = wait_until(&a_cli.scq, deadline, "A's Writes");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        done.push(wc.wr_id);
    }
    done.sort_unstable();
    assert_eq!(done, [1, 2]);
    // A send completion says the Write left, not that it landed: a Send
    // behind the Writes completes at the server after they were placed
    // (RFC 5040 §5.5, messages are delivered in order).
    let (a_sbuf, a_cbuf) = (a_srv.mr(64), a_cli.mr(64));
    a_srv.post_recv(99, &a_sbuf, 0, 64);
    a_cli
        .qp
        .post_send(&wr(3, WrOpcode::Send, &[a_cbuf.sge(0, 8)]))
        .unwrap();
    let wc = wait_until(&a_srv.rcq, Instant::now() + T, "A's Send behind the Writes");
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = vec![0u8; 8192];
    a_dst.read_at(0, &mut got);
    assert!(got == pattern(8192, 0x3c), "A's Writes placed");
}

/// One completion from `cq` before `deadline`, or a panic naming `what`.
fn wait_until(cq: &iwarp::CompletionQueue, deadline: Instant, what: &str) -> iwarp::WorkCompletion {
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {what}");
        cq.wait(left).unwrap();
    }
}
