//! A queue pair's event queue on the rdma-core provider: what
//! [`QpOps::next_event`](iwarp_verbs::provider::QpOps::next_event) returns
//! (`Established` from the connection manager, `Disconnected` from a
//! local disconnect, from `next_event` itself or from the CQ pump's
//! once-per-tick look at the connection's rdma_cm channel), and the
//! descriptor [`QpOps::event_fd`](iwarp_verbs::provider::QpOps::event_fd)
//! hands out so that `iwarp::wait::WaitSet` or tokio's reactor can sleep
//! until an event waits.
//!
//! The descriptor is an eventfd of our own, readable (level-triggered)
//! exactly while the queue holds an event: set when an event is queued,
//! cleared when the last one is taken, both under the queue's lock, as
//! the software provider does (`iwarp-soft`'s `qp.rs`). Why not a
//! descriptor rdma-core already has:
//!
//! - the CQ's completion channel (`ibv_comp_channel`) signals completions,
//!   not queue-pair events: a queue pair whose peer disconnects with
//!   nothing outstanding flushes nothing, so the channel never fires for
//!   the very event a waiter needs (the reason `event_fd` exists). It is
//!   also the CQ pump's: the pump takes each event (`ibv_get_cq_event`),
//!   acknowledges it (`ibv_ack_cq_events`) and re-arms the CQ
//!   (`ibv_req_notify_cq`), so a second sleeper on it would see it
//!   readable only until the pump took the event;
//! - the connection's rdma_cm event channel is readable for every
//!   rdma_cm event, including those the provider consumes itself, exists
//!   only once connected, and its events are read by the pump and by
//!   `next_event`: readable there does not mean a `QpEvent` waits.
//!
//! The eventfd is made on first use (a program that never asks pays no
//! descriptor). Nothing here touches a device, so it is unit-tested
//! without RDMA.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use iwarp_verbs::provider::QpEvent;
use iwarp_verbs::sys::EventFd;

/// The events of one queue pair, with their descriptor.
#[derive(Debug, Default)]
pub(crate) struct QpEvents {
    q: Mutex<VecDeque<QpEvent>>,
    cond: Condvar,
    /// Made on first use of [`QpEvents::fd`]; readable while `q` is
    /// non-empty (set and cleared with `q` locked).
    efd: OnceLock<EventFd>,
}

impl QpEvents {
    fn lock(&self) -> MutexGuard<'_, VecDeque<QpEvent>> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `ev`, make the descriptor readable and wake `wait`ers.
    pub(crate) fn push(&self, ev: QpEvent) {
        let mut q = self.lock();
        q.push_back(ev);
        if let Some(efd) = self.efd.get() {
            efd.set();
        }
        drop(q);
        self.cond.notify_all();
    }

    /// The oldest event; the descriptor is cleared when it was the last.
    pub(crate) fn pop(&self) -> Option<QpEvent> {
        let mut q = self.lock();
        let ev = q.pop_front()?;
        if q.is_empty() {
            if let Some(efd) = self.efd.get() {
                efd.clear();
            }
        }
        Some(ev)
    }

    /// Sleep up to `timeout` unless an event waits (a `push` ends it).
    pub(crate) fn wait(&self, timeout: Duration) {
        let q = self.lock();
        if q.is_empty() {
            let _ = self.cond.wait_timeout(q, timeout);
        }
    }

    /// The descriptor, readable while an event waits; `None` (logged,
    /// with the fix) if no eventfd can be made: waiters then fall back to
    /// their deadlines, as with the software provider.
    pub(crate) fn fd(&self, qpn: u32) -> Option<RawFd> {
        if let Some(efd) = self.efd.get() {
            return Some(efd.as_raw_fd());
        }
        let efd = match EventFd::new() {
            Ok(efd) => efd,
            Err(e) => {
                tracing::warn!(qpn, error = %e, "no eventfd for the QP's events (raise the open-file limit, ulimit -n); waiters fall back to their deadlines");
                return None;
            }
        };
        // Made under the queue's lock, so it matches the queue from now on
        // (an event queued before it existed makes it readable here).
        let q = self.lock();
        let efd = self.efd.get_or_init(|| efd);
        if !q.is_empty() {
            efd.set();
        }
        Some(efd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    fn readable(fd: RawFd) -> bool {
        iwarp_verbs::sys::poll_one(fd, libc::POLLIN, Duration::ZERO).unwrap() & libc::POLLIN != 0
    }

    #[test]
    fn the_descriptor_is_readable_exactly_while_an_event_waits() {
        let ev = QpEvents::default();
        let fd = ev.fd(1).expect("an eventfd");
        assert_eq!(ev.fd(1), Some(fd), "one descriptor per queue pair");
        assert!(!readable(fd));
        ev.push(QpEvent::Established);
        ev.push(QpEvent::Disconnected);
        assert!(readable(fd));
        assert_eq!(ev.pop(), Some(QpEvent::Established));
        assert!(readable(fd), "one event still waits");
        assert_eq!(ev.pop(), Some(QpEvent::Disconnected));
        assert!(!readable(fd), "the last one taken clears it");
        assert_eq!(ev.pop(), None);
        assert!(!readable(fd));
    }

    #[test]
    fn an_event_queued_before_the_descriptor_was_asked_for_makes_it_readable() {
        let ev = QpEvents::default();
        ev.push(QpEvent::Established);
        let fd = ev.fd(1).expect("an eventfd");
        assert!(readable(fd));
        ev.pop();
        assert!(!readable(fd));
    }

    #[test]
    fn a_push_from_another_thread_wakes_a_poll_on_the_descriptor_and_a_wait() {
        let ev = Arc::new(QpEvents::default());
        let fd = ev.fd(1).expect("an eventfd");
        let t = Duration::from_secs(10);
        let pusher = {
            let ev = ev.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                ev.push(QpEvent::Disconnected);
            })
        };
        let started = Instant::now();
        let r = iwarp_verbs::sys::poll_one(fd, libc::POLLIN, t).unwrap();
        assert!(r & libc::POLLIN != 0 && started.elapsed() < t, "poll woke");
        pusher.join().unwrap();
        // An event waits: `wait` returns at once.
        let started = Instant::now();
        ev.wait(t);
        assert!(started.elapsed() < t);
        assert_eq!(ev.pop(), Some(QpEvent::Disconnected));
    }
}
