//! Ending and keeping alive (`rshutdown`, `tcp_svc_send_keepalive`).

use super::error::FlowError;
use super::state::Flow;
use super::types::{Action, Phase, SendTag, Shutdown, Source};
use crate::wire::Ctrl;

impl Flow {
    /// `rshutdown(how)`: closes a side and queues the control word it
    /// calls for, now or as soon as a control slot is free.
    pub fn shutdown(&mut self, how: Shutdown) -> Result<(), FlowError> {
        if self.phase != Phase::Connected {
            return Ok(());
        }
        let ctrl = match how {
            Shutdown::Both => {
                self.readable = false;
                self.writable = false;
                Ctrl::Disconnect
            }
            Shutdown::Write => {
                self.writable = false;
                if self.readable {
                    Ctrl::Shutdown
                } else {
                    Ctrl::Disconnect
                }
            }
            Shutdown::Read => {
                self.readable = false;
                if self.writable {
                    return Ok(());
                }
                Ctrl::Disconnect
            }
        };
        if self.ctrl_avail() && self.pending_ctrl.is_none() && self.pend_len == 0 {
            self.post_ctrl(ctrl);
        } else {
            self.pending_ctrl = Some(ctrl);
        }
        Ok(())
    }

    /// `rs_conn_all_sends_done`: no work request outstanding, or not
    /// connected any more.
    pub fn all_sends_done(&self) -> bool {
        let ctrl_free = self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) as i32;
        (ctrl_free + self.sqe_avail == i32::from(self.cfg.sq_size) && self.pend_len == 0)
            || self.phase != Phase::Connected
    }

    /// `tcp_svc_send_keepalive`: queues a zero-length RDMA Write if a
    /// control slot is free; returns whether it did.
    pub fn keepalive(&mut self) -> bool {
        if self.phase == Phase::Connected && self.ctrl_avail() {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            self.actions.push_back(Action::RdmaWrite {
                src: Source::Empty,
                remote_addr: 0,
                rkey: 0,
                tag: SendTag::Keepalive,
            });
            true
        } else {
            false
        }
    }
}
