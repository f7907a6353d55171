//! Who takes the CQ's completions, and how the other thread is woken: the
//! caller's thread while it claims them ([`Claim`]), else the dispatcher
//! thread. A leaf the other files import.
//!
//! Both threads wait through one [`iwarp::wait::WaitSet`] each (issue 28,
//! "one reactor"; docs/WAITING.md):
//!
//! - the **caller** on the CQ and its own [`Bell`] (rung when another
//!   thread marks the session failed), with the session's deadline;
//! - the **dispatcher** on its [`Bell`] only, with no deadline: it is rung
//!   for completions the caller does not claim, and to stop.
//!
//! What decides between them is the CQ's completion hook
//! ([`iwarp::CompletionQueue::set_completion_hook`], [`Handoff::hook`]): a
//! completion that arrives in the empty CQ while the caller claims it makes
//! the CQ's descriptor readable (the caller's set wakes) and rings nobody
//! else; one that arrives while nobody claims rings the dispatcher. So a
//! completion costs one wake-up of one thread, as the retired
//! `WakePolicy::Newest` with an `Attendance` did: with every waiter woken,
//! each completion woke both threads and one of them found nothing (or the
//! other's lock), on two CPUs a quarter of the CPU time per GB.
//!
//! The race a handoff must not lose: the caller lets go of its claim (to
//! read or write a block, which may be disk I/O) just as a completion
//! arrives, and neither thread takes it, so the transfer stalls until the
//! caller claims again (a grant waiting in the CQ while the source reads
//! its next block is a block not sent). [`Claim`]'s drop and the hook are
//! the two halves of a store-then-load pair with sequentially consistent
//! fences between (the caller: unclaim, then look at the CQ; the provider:
//! queue the completion, then look at the claim), so at least one of them
//! sees the other and rings the dispatcher.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use iwarp::CompletionQueue;

/// An eventfd(2) one thread rings and another waits on (in a `WaitSet`):
/// readable from the first [`ring`](Bell::ring) until [`drain`](Bell::drain).
/// Rings never block and never get lost (the counter only adds up).
#[derive(Debug)]
pub(super) struct Bell(OwnedFd);

impl Bell {
    pub(super) fn new() -> io::Result<Bell> {
        // SAFETY: eventfd(2) takes no pointers; a non-negative result is a
        // new descriptor that we own from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(Bell(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Make the bell readable (eventfd(2): a write adds to the counter; it
    /// fails only with EAGAIN at a counter of 2^64-2, still readable).
    pub(super) fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to a descriptor we own.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Make the bell unreadable again (eventfd(2): a read returns the
    /// counter and resets it; EAGAIN if it was zero).
    pub(super) fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from a descriptor
        // we own (non-blocking).
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }

    pub(super) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The claim flag and the two bells (shared with the CQ's hook, so it holds
/// no CQ: no reference cycle).
#[derive(Debug)]
pub(super) struct Handoff {
    /// The caller's thread takes the completions ([`Claim`]).
    claimed: AtomicBool,
    /// Rung for completions nobody claims, and to stop.
    pub(super) dispatcher: Bell,
    /// Rung when another thread marks the session failed.
    pub(super) caller: Bell,
}

impl Handoff {
    pub(super) fn new() -> io::Result<Handoff> {
        Ok(Handoff {
            claimed: AtomicBool::new(false),
            dispatcher: Bell::new()?,
            caller: Bell::new()?,
        })
    }

    /// The CQ's completion hook: run by the provider after it queued
    /// completions into the empty CQ, holding none of its locks. Claimed:
    /// returns false, so the provider makes the CQ's descriptor readable
    /// and the caller's wait ends. Not claimed: rings the dispatcher and
    /// returns true (the descriptor stays as it was: nobody sleeps on it,
    /// and a caller that claims later finds the completions by the CQ's
    /// length before it sleeps).
    pub(super) fn hook(self: &Arc<Handoff>) -> Arc<dyn Fn() -> bool + Send + Sync> {
        let h = self.clone();
        Arc::new(move || {
            // Pairs with the fence in `Claim::drop`: the completion is
            // queued (before this hook runs), then the claim is read.
            fence(Ordering::SeqCst);
            if h.claimed.load(Ordering::SeqCst) {
                return false;
            }
            h.dispatcher.ring();
            true
        })
    }

    /// The caller's thread takes the completions from now until the guard
    /// is dropped; see the module docs. One claim at a time.
    pub(super) fn claim<'a>(&'a self, cq: &'a CompletionQueue) -> Claim<'a> {
        let was = self.claimed.swap(true, Ordering::SeqCst);
        debug_assert!(!was, "one claim at a time");
        Claim { h: self, cq }
    }
}

/// See [`Handoff::claim`]. While it lives, the caller's thread handles the
/// completions between its short steps and whenever it waits: it must look
/// at the CQ before it sleeps and before it drops the claim (the dropping
/// itself hands what is queued to the dispatcher).
#[must_use = "the claim ends when the guard is dropped"]
#[derive(Debug)]
pub(super) struct Claim<'a> {
    h: &'a Handoff,
    cq: &'a CompletionQueue,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.h.claimed.store(false, Ordering::SeqCst);
        // Pairs with the fence in the hook: unclaimed, then the CQ's
        // length is read. A completion the hook saw claimed is seen here.
        fence(Ordering::SeqCst);
        if !self.cq.is_empty() {
            self.h.dispatcher.ring();
        }
    }
}
