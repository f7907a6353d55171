//! The progress pool keeps both ends of an in-process connection on one
//! pool thread (issue 29 item 2: the pool's idle CPU at 16 connections).
//!
//! With only the fewest-connections rule, a process holding both ends of
//! its connections registered them alternately, so with two pool threads
//! every client end landed on one thread and every server end on the
//! other. In a bulk transfer the sending ends cost more (on loopback the
//! kernel runs the TCP receive path in the sender's context), so one
//! thread was saturated while the other idled with work waiting. The rule
//! is checked here where it is decided: each connection's two ends share
//! a thread, and the pairs are spread evenly over the threads.
//!
//! Its own binary: the pool is process-wide and its size is read when the
//! first pooled connection starts it.

mod common;

use common::*;
use iwarp::soft::pool::placement;
use iwarp::soft::{pool_stats, set_progress_engine, ProgressEngine, ENV_THREADS};

#[test]
fn both_ends_of_an_in_process_connection_share_a_pool_thread() {
    std::env::set_var(ENV_THREADS, "2");
    set_progress_engine(ProgressEngine::Pool);
    const PAIRS: usize = 6;
    let pairs: Vec<_> = (0..PAIRS).map(|_| pair()).collect();
    let stats = pool_stats();
    assert_eq!((stats.threads, stats.connections), (2, 2 * PAIRS));

    let ends = placement();
    assert_eq!(ends.len(), 2 * PAIRS, "every end is pooled: {ends:?}");
    for &(local, peer, thread) in &ends {
        let other = ends
            .iter()
            .find(|&&(l, p, _)| l == peer && p == local)
            .unwrap_or_else(|| {
                panic!("the other end of {local} -> {peer} is not pooled: {ends:?}")
            });
        assert_eq!(
            other.2, thread,
            "{local} -> {peer} is on pool thread {thread}, its other end on {}: \
             sends and receives are split over the threads (placement: {ends:?})",
            other.2
        );
    }
    let on_first = ends.iter().filter(|e| e.2 == 0).count();
    assert_eq!(
        on_first, PAIRS,
        "the pairs are spread evenly over the two threads: {ends:?}"
    );
    drop(pairs);
}
