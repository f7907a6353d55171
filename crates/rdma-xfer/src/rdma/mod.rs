//! The RDMA transport: one control QP and N data QPs per session, all on
//! one completion queue.
//!
//! # Control channel and credits
//!
//! An RDMAP Send needs a posted receive at the peer, or the peer's QP
//! goes to error (RFC 5040 §5.3, DDP RFC 5041 §7.2 "no buffer"). Each
//! side posts [`CTRL_RECVS`] receives on the control QP and reposts each
//! one as it consumes it; every message returns the count reposted since
//! the previous message in its `credits` field. A sender spends one credit
//! per message and keeps the last one for a `Credit` message, so two
//! sides that both run out of credits can always return them.
//!
//! # Data channel
//!
//! The source posts, per block, an unsignaled RDMA Write into a granted
//! sink block and a signaled Send carrying `BlockDone` on the same data
//! QP; the Send's completion frees the local block. No credit scheme is
//! needed there: the source sends a `BlockDone` only for a block it holds
//! a grant for, so at most `pool depth` of them are ever unconsumed, and
//! the sink keeps that many receives posted on each data QP plus a batch
//! it reposts together (`data_recv_slots`). Control Sends are signaled
//! only every `CTRL_SIGNAL_EVERY`th time.
//!
//! # Threads
//!
//! The CQ is in [`ProgressMode::Threaded`](iwarp::ProgressMode) with no
//! polling phase (the provider's receive threads read the sockets; a wait
//! sleeps at once). Every wait is an [`iwarp::wait::WaitSet`] wait, with
//! a deadline or a bell that ends it (docs/WAITING.md); which thread a
//! completion wakes is decided by the caller's claim (`handoff`).
//!
//! - The **caller's thread** reads (source) or writes (sink) blocks, and
//!   handles completions itself between those steps and while it waits:
//!   it claims the CQ's completions for the whole of `send` / `recv`
//!   except while it reads or writes a block. Claimed, a completion makes
//!   the CQ's descriptor readable, which its `WaitSet` (the CQ and its
//!   own bell, to the session's deadline) sleeps on; nobody else wakes.
//! - The **dispatcher thread** sleeps on its bell alone: the CQ's
//!   completion hook rings it for a completion nobody claims, and the
//!   caller rings it when it lets go of its claim with completions queued,
//!   that is whenever the caller does not handle completions (while it
//!   reads or writes a block, which may be disk I/O, and between
//!   transfers). Whoever holds `Shared::dispatch` drains the CQ, reposts
//!   receives and routes messages.
//! - The **sender thread** posts the Write + `BlockDone` pairs the
//!   dispatcher thread completes (a grant arriving for a block that waits),
//!   so the dispatcher goes on draining the CQ. A pair completed on the
//!   caller's thread (a block filled while a grant is in hand, or a grant
//!   found while it waits) is posted there: handing it over would cost a
//!   wake-up per block.
//! - The **logger thread** reports progress (`Logger`).
//!
//! Handing each block through dedicated threads cost 12-16 context
//! switches per 1 MiB block, on a 2-CPU machine about a quarter of the
//! CPU time per GB; this arrangement needs 4-6. The caller's waits give up
//! at [`Config::timeout`](crate::Config::timeout), or at once when another
//! thread marks the session failed (it rings the caller's bell); the
//! session's drop rings the dispatcher and sends the sender its stop.
//!
//! # Modules
//!
//! - `base`: the channel sizes, work-request IDs, MPA settings and the
//!   failure every thread sees; a leaf the other files import.
//! - `handoff`: the caller's claim on the completions, the CQ's hook that
//!   rings the dispatcher for the others, the threads' bells; a leaf.
//! - `session`: [`RdmaSession`] itself, its `Transport` face and teardown.
//! - `flow`: the credit and grant bookkeeping as sans-IO state machines
//!   (control-channel credits and send slots, the source's block/grant
//!   pairing, the sink's grant and reorder window), tested on their own.
//! - `shared`: what the threads share (and the messages they pass each
//!   other); carries out `flow`'s actions with
//!   verbs (posting control Sends and block Write + `BlockDone` pairs).
//! - `setup`: verbs resources, connecting and accepting the control QP
//!   and the data streams all at once (the negotiation rides in their MPA
//!   private data, [`crate::hello`]), starting the threads.
//! - `sink`: the sink's blocks, registered for the peer's RDMA Write only
//!   while granted and deregistered right before they are read, so a
//!   source that keeps writing after its `BlockDone` is refused (a
//!   Terminate) instead of changing bytes the application holds; and the
//!   sink's state of one transfer (grant window, autotuning).
//! - `threads`: the dispatcher and sender threads and completion handling.
//! - `transfer`: the caller's `send` (source) and `recv` (sink) loops.

mod base;
mod flow;
mod handoff;
mod session;
mod setup;
mod shared;
mod sink;
mod threads;
mod transfer;

pub use base::CTRL_RECVS;
pub(crate) use base::{mpa_config, refuse};
pub use session::RdmaSession;

#[cfg(test)]
mod refuse_tests {
    use super::refuse;
    use std::net::{IpAddr, SocketAddr};

    fn at(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 4000)
    }

    #[test]
    fn a_v4_mapped_peer_is_the_same_host_as_its_ipv4_address() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(refuse(at("::ffff:127.0.0.1"), Some(v4)), None);
        assert_eq!(refuse(at("127.0.0.1"), Some(mapped)), None);
        assert_eq!(refuse(at("::1"), Some("::1".parse().unwrap())), None);
        assert_eq!(refuse(at("10.1.2.3"), None), None);
    }

    #[test]
    fn another_host_is_refused() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(refuse(at("127.0.0.2"), Some(v4)).is_some());
        assert!(refuse(at("::ffff:127.0.0.2"), Some(v4)).is_some());
        assert!(refuse(at("::1"), Some(v4)).is_some());
    }
}
