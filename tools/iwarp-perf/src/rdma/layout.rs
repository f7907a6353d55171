//! The layout both ends agree on: where the control buffer keeps its
//! credit word, staging slots and control messages; the control messages'
//! kinds and length; the work request ids; the sizes of a run's buffers and
//! queues. A leaf module: it knows [`Params`] and nothing of the
//! connections that use it.

use crate::params::{Params, Test};

pub(super) const CTRL_LEN: usize = 4096;
pub(super) const CREDIT_OFF: usize = 0;
pub(super) const STAGE_OFF: usize = 64;
pub(super) const STAGE_SLOTS: u64 = 16;
pub(super) const MSG_OFF: usize = 512;
/// The smallest receive buffer, and the longest control message.
pub(super) const CTRL_MSG: usize = 32;
/// The bytes of a control message that carry something (kind, count, sum).
pub(super) const CTRL_BODY: usize = 24;
pub(super) const DONE: u64 = 0x444f_4e45;
pub(super) const ACK: u64 = 0x0041_434b;

pub(super) const K_DATA: u64 = 1;
pub(super) const K_CTRL: u64 = 2;
pub(super) const K_CREDIT: u64 = 3;
pub(super) const K_RECV: u64 = 4;
/// The client's zero-length Write right after connecting (unsignaled).
pub(super) const K_HELLO: u64 = 5;

/// Extra send-queue entries beyond the data window (credit Writes and
/// control messages).
pub(super) const SQ_EXTRA: u32 = STAGE_SLOTS as u32 + 8;

/// How long a control message (DONE / ACK) is in a run of `size`-byte
/// messages: [`CTRL_BODY`] bytes, or [`CTRL_MSG`] when the messages are
/// themselves `CTRL_BODY` bytes, so that a receive's length alone tells a
/// control message from data. Both ends know `size`. (The Solicited Event
/// flag, which this used to rely on, is not in rdma-core's `ibv_wc`, so a
/// kernel device could not tell.)
pub(super) fn ctrl_len(size: usize) -> usize {
    if size == CTRL_BODY {
        CTRL_MSG
    } else {
        CTRL_BODY
    }
}

/// Whether a receive of `byte_len` bytes is a control message in a run
/// of `size`-byte messages (see [`ctrl_len`]).
pub(super) fn is_ctrl(byte_len: u32, size: usize) -> bool {
    byte_len as usize == ctrl_len(size)
}

pub(super) fn wrid(kind: u64, qp: u32, seq: u64) -> u64 {
    kind << 56 | (u64::from(qp) & 0xffff) << 40 | (seq & ((1 << 40) - 1))
}

pub(super) fn split_wrid(id: u64) -> (u64, usize, u64) {
    (
        id >> 56,
        ((id >> 40) & 0xffff) as usize,
        id & ((1 << 40) - 1),
    )
}

/// Which end of a connection (a `Side`) this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// Slots of the data buffer.
pub(super) fn data_slots(p: &Params) -> usize {
    match p.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw if p.integrity => p.depth as usize,
        Test::WriteLat => 2,
        _ => 1,
    }
}

/// Receive-queue depth of `role`.
pub(super) fn rq_depth(p: &Params, role: Role) -> u32 {
    match (p.test, role) {
        (Test::SendBw, Role::Server) => (p.depth.saturating_mul(2)).clamp(8, 4096),
        (Test::SendLat, _) => 8,
        _ => 4,
    }
}

/// (receive slot size, receive slots) of `role`.
pub(super) fn recv_layout(p: &Params, role: Role) -> (usize, usize) {
    let rq = rq_depth(p, role) as usize;
    match (p.test, role) {
        (Test::SendBw, Role::Server) if p.integrity => (p.size.max(CTRL_MSG), rq),
        (Test::SendBw, Role::Server) | (Test::SendLat, _) => (p.size.max(CTRL_MSG), 1),
        _ => (CTRL_MSG, rq),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_message_is_never_as_long_as_data() {
        for size in [1, 8, 23, 24, 25, 31, 32, 33, 4096, 65536] {
            let n = ctrl_len(size);
            assert_ne!(n, size, "size {size}");
            assert!((CTRL_BODY..=CTRL_MSG).contains(&n), "size {size}: {n}");
            assert!(is_ctrl(n as u32, size));
            assert!(!is_ctrl(size as u32, size));
        }
    }
}
