//! Work requests and completions of the rdma-core provider: the verbs
//! types to and from libibverbs' structures, with no device state.
//!
//! - [`SendWr`] → `ibv_send_wr` fields ([`send_wr_fields`]), an
//!   [`SgList`](iwarp_proto::engine::SgList) → `ibv_sge`s, and a batch →
//!   verbs' singly linked list, posted with the bad-request pointer mapped
//!   back to its `wr_id` ([`post_chain`], [`map_post_errno`]);
//! - `ibv_wc` → [`WorkCompletion`] ([`map_wc`]). Statuses map one to one
//!   where [`WcStatus`] has a variant ([`map_status`]); `ibv_wc_status`
//!   values with no counterpart (InfiniBand's retry and RNR errors, EEC
//!   errors) become [`WcStatus::GeneralErr`] and are logged with their
//!   name ([`status_name`]).

use std::ffi::c_int;

use iwarp_proto::engine::{
    PostError, SendWr, WcOpcode, WcQueue, WcStatus, WorkCompletion, WrOpcode,
};

use crate::ffi;

/// The completion opcode of a flushed send-queue request: its own, as siw
/// reports it (`siw_sq_flush_wr` keeps the request's opcode).
pub(super) fn flushed_opcode(op: &WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::Send | WrOpcode::SendWithInv { .. } => WcOpcode::Send,
        WrOpcode::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
    }
}

/// `ibv_wc_status` → [`WcStatus`] (one to one where a variant exists).
pub fn map_status(status: i32) -> WcStatus {
    match status {
        ffi::IBV_WC_SUCCESS => WcStatus::Success,
        ffi::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        ffi::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        ffi::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        ffi::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        ffi::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        ffi::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        ffi::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        ffi::IBV_WC_GENERAL_ERR => WcStatus::GeneralErr,
        _ => WcStatus::GeneralErr,
    }
}

/// The `ibv_wc_status` names, for logs (`ibv_wc_status_str`).
pub fn status_name(status: i32) -> &'static str {
    const NAMES: [&str; 22] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("unknown")
}

pub(super) fn map_wc(wc: &ffi::ibv_wc) -> WorkCompletion {
    let status = map_status(wc.status);
    if status == WcStatus::GeneralErr && wc.status != ffi::IBV_WC_GENERAL_ERR {
        tracing::warn!(
            status = wc.status,
            name = status_name(wc.status),
            vendor_err = wc.vendor_err,
            "completion status with no WcStatus variant, reported as GeneralErr"
        );
    }
    // On an error completion only wr_id, status, qp_num and vendor_err are
    // valid (verbs.h); ibverbs marks the queue through the opcode of a
    // successful one. Flushed receives report IBV_WC_RECV on siw and rxe.
    let (opcode, queue) = match wc.opcode {
        ffi::IBV_WC_SEND => (WcOpcode::Send, WcQueue::Send),
        ffi::IBV_WC_RDMA_WRITE => (WcOpcode::RdmaWrite, WcQueue::Send),
        ffi::IBV_WC_RDMA_READ => (WcOpcode::RdmaRead, WcQueue::Send),
        ffi::IBV_WC_RECV | ffi::IBV_WC_RECV_RDMA_WITH_IMM => (WcOpcode::Recv, WcQueue::Recv),
        _ => (WcOpcode::Send, WcQueue::Send),
    };
    WorkCompletion {
        wr_id: wc.wr_id,
        status,
        opcode,
        queue,
        byte_len: wc.byte_len,
        invalidated_rkey: (status == WcStatus::Success && wc.wc_flags & ffi::IBV_WC_WITH_INV != 0)
            .then_some(wc.invalidated_rkey),
        solicited: false,
    }
}

/// The `ibv_send_wr` opcode, flags, and remote fields of a [`SendWr`].
pub fn send_wr_fields(wr: &SendWr) -> (c_int, u32, u32, u64, u32) {
    let mut flags = 0;
    if wr.signaled {
        flags |= ffi::IBV_SEND_SIGNALED;
    }
    let (op, inv, addr, rkey) = match wr.opcode {
        WrOpcode::Send => (ffi::IBV_WR_SEND, 0, 0, 0),
        WrOpcode::SendWithInv { invalidate_rkey } => {
            (ffi::IBV_WR_SEND_WITH_INV, invalidate_rkey, 0, 0)
        }
        WrOpcode::RdmaWrite { remote_addr, rkey } => (ffi::IBV_WR_RDMA_WRITE, 0, remote_addr, rkey),
        WrOpcode::RdmaRead { remote_addr, rkey } => (ffi::IBV_WR_RDMA_READ, 0, remote_addr, rkey),
    };
    if wr.solicited && matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithInv { .. }) {
        flags |= ffi::IBV_SEND_SOLICITED;
    }
    (op, flags, inv, addr, rkey)
}

/// A work request structure of verbs' singly linked lists.
pub(super) trait Chained: Sized {
    fn set_next(&mut self, next: *mut Self);
}

impl Chained for ffi::ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Chained for ffi::ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Links `chain` (non-empty) into the list verbs takes, hands its head and
/// the bad-request out pointer to `post` (the provider's post call), and
/// maps a failure to the `wr_id` (`id(index)`) of the request it names.
pub(super) fn post_chain<T: Chained>(
    chain: &mut [T],
    id: impl Fn(usize) -> u64,
    post: impl FnOnce(*mut T, *mut *mut T) -> c_int,
) -> Result<(), PostError> {
    let n = chain.len();
    let base = chain.as_mut_ptr();
    for i in 1..n {
        // SAFETY: `i` and `i - 1` are in bounds of `chain`, which is not
        // moved again before `post` returns.
        unsafe { (*base.add(i - 1)).set_next(base.add(i)) };
    }
    let mut bad: *mut T = std::ptr::null_mut();
    let rc = post(base, &mut bad);
    if rc == 0 {
        return Ok(());
    }
    let idx = if bad.is_null() {
        0
    } else {
        // SAFETY: `bad` points into `chain` (verbs.h contract).
        unsafe { bad.offset_from(base) }.max(0) as usize
    };
    Err(map_post_errno(rc, id(idx.min(n - 1))))
}

/// `ibv_post_*` error numbers → [`PostError`]. (A QP in the error state
/// never reaches the device: `Qp::post_flushed`.)
pub fn map_post_errno(errno: i32, wr_id: u64) -> PostError {
    match errno {
        libc::ENOMEM => PostError::QueueFull { wr_id },
        libc::EINVAL => PostError::InvalidWr {
            wr_id,
            why: "refused by the device (opcode, SGE count or length beyond its limits)",
        },
        _ => PostError::QpError { wr_id },
    }
}

/// The `ibv_sge` array of an SG list, and how many entries it uses.
pub(super) fn sges(
    sgl: &iwarp_proto::engine::SgList,
) -> ([ffi::ibv_sge; iwarp_proto::engine::MAX_SGE], usize) {
    let mut out = [ffi::ibv_sge::default(); iwarp_proto::engine::MAX_SGE];
    let s = sgl.as_slice();
    for (o, i) in out.iter_mut().zip(s) {
        *o = ffi::ibv_sge {
            addr: i.addr,
            length: i.length,
            lkey: i.lkey,
        };
    }
    (out, s.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_proto::engine::{SgList, Sge};

    #[test]
    fn statuses_map_one_to_one_where_a_variant_exists() {
        let pairs = [
            (ffi::IBV_WC_SUCCESS, WcStatus::Success),
            (ffi::IBV_WC_LOC_LEN_ERR, WcStatus::LocLenErr),
            (ffi::IBV_WC_LOC_QP_OP_ERR, WcStatus::LocQpOpErr),
            (ffi::IBV_WC_LOC_PROT_ERR, WcStatus::LocProtErr),
            (ffi::IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlushErr),
            (ffi::IBV_WC_REM_ACCESS_ERR, WcStatus::RemAccessErr),
            (ffi::IBV_WC_REM_OP_ERR, WcStatus::RemOpErr),
            (ffi::IBV_WC_REM_INV_REQ_ERR, WcStatus::RemInvReqErr),
            (ffi::IBV_WC_GENERAL_ERR, WcStatus::GeneralErr),
        ];
        for (ibv, ours) in pairs {
            assert_eq!(map_status(ibv), ours, "{}", status_name(ibv));
        }
        for other in [
            ffi::IBV_WC_LOC_EEC_OP_ERR,
            ffi::IBV_WC_MW_BIND_ERR,
            ffi::IBV_WC_BAD_RESP_ERR,
            ffi::IBV_WC_LOC_ACCESS_ERR,
            ffi::IBV_WC_RETRY_EXC_ERR,
            ffi::IBV_WC_RNR_RETRY_EXC_ERR,
            ffi::IBV_WC_LOC_RDD_VIOL_ERR,
            ffi::IBV_WC_REM_INV_RD_REQ_ERR,
            ffi::IBV_WC_REM_ABORT_ERR,
            ffi::IBV_WC_INV_EECN_ERR,
            ffi::IBV_WC_INV_EEC_STATE_ERR,
            ffi::IBV_WC_FATAL_ERR,
            ffi::IBV_WC_RESP_TIMEOUT_ERR,
            99,
        ] {
            assert_eq!(map_status(other), WcStatus::GeneralErr);
        }
        assert_eq!(
            status_name(ffi::IBV_WC_RNR_RETRY_EXC_ERR),
            "RNR retry counter exceeded"
        );
        assert_eq!(status_name(-1), "unknown");
    }

    #[test]
    fn completions_map_opcode_queue_and_invalidate() {
        let mut wc = ffi::ibv_wc {
            wr_id: 7,
            opcode: ffi::IBV_WC_RECV,
            byte_len: 13,
            wc_flags: ffi::IBV_WC_WITH_INV,
            invalidated_rkey: 0x1234,
            ..Default::default()
        };
        let w = map_wc(&wc);
        assert_eq!(
            (w.wr_id, w.opcode, w.queue, w.byte_len),
            (7, WcOpcode::Recv, WcQueue::Recv, 13)
        );
        assert_eq!(w.invalidated_rkey, Some(0x1234));
        wc.opcode = ffi::IBV_WC_RDMA_READ;
        wc.wc_flags = 0;
        let w = map_wc(&wc);
        assert_eq!(
            (w.opcode, w.queue, w.invalidated_rkey),
            (WcOpcode::RdmaRead, WcQueue::Send, None)
        );
        wc.status = ffi::IBV_WC_WR_FLUSH_ERR;
        assert_eq!(map_wc(&wc).status, WcStatus::WrFlushErr);
    }

    #[test]
    fn work_requests_map_to_ibv_fields() {
        let sgl = SgList::single(Sge {
            addr: 0x1000,
            length: 8,
            lkey: 5,
        });
        let mut wr = SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaRead {
                remote_addr: 0x2000,
                rkey: 9,
            },
            sgl,
            signaled: true,
            solicited: true,
        };
        assert_eq!(
            send_wr_fields(&wr),
            (ffi::IBV_WR_RDMA_READ, ffi::IBV_SEND_SIGNALED, 0, 0x2000, 9)
        );
        wr.opcode = WrOpcode::SendWithInv {
            invalidate_rkey: 0x77,
        };
        assert_eq!(
            send_wr_fields(&wr),
            (
                ffi::IBV_WR_SEND_WITH_INV,
                ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_SOLICITED,
                0x77,
                0,
                0
            )
        );
        wr.opcode = WrOpcode::RdmaWrite {
            remote_addr: 1,
            rkey: 2,
        };
        wr.signaled = false;
        assert_eq!(send_wr_fields(&wr), (ffi::IBV_WR_RDMA_WRITE, 0, 0, 1, 2));
        let (s, n) = sges(&sgl);
        assert_eq!((n, s[0].addr, s[0].length, s[0].lkey), (1, 0x1000, 8, 5));
        assert_eq!(
            map_post_errno(libc::ENOMEM, 3),
            PostError::QueueFull { wr_id: 3 }
        );
        assert!(matches!(
            map_post_errno(libc::EINVAL, 3),
            PostError::InvalidWr { wr_id: 3, .. }
        ));
        assert_eq!(
            map_post_errno(libc::EIO, 3),
            PostError::QpError { wr_id: 3 }
        );
    }
}
