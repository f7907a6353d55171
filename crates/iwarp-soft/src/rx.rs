//! Receive work: reading the socket (into the buffer, or straight into a
//! registered region) and feeding the engine. Who may do it, and when, is
//! decided in `progress.rs`; whoever holds `Conn::rx` runs these passes,
//! which never block unless `RxState::block` says the receive thread reads
//! alone.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use iwarp_proto::engine::{QpState, RxHint};

use crate::state::*;
use crate::sys;

/// Tagged payload at least this long is read straight into the region.
pub const DIRECT_MIN: u32 = 8 * 1024;
/// A buffered read from an empty buffer asks for at most this much, so that
/// a large tagged segment usually ends up partly unread and its remaining
/// payload takes the direct path.
pub const RX_READ: usize = 16 * 1024;
/// While bulk tagged traffic flows (the previous segment was placed
/// directly), a buffered read from an empty buffer asks only for this much:
/// enough for the trailer of one FPDU, the headers of the next and a
/// marker, so the engine can hint the next payload as direct.
pub const HDR_PEEK: usize = 64;
/// Bytes read into the buffer behind a direct placement: an FPDU's pad and
/// CRC (at most 7) and the next tagged header (16), rounded up.
pub const DIRECT_TAIL: usize = 24;

/// Feed buffered bytes to the engine; returns (consumed, engine is stuck,
/// engine has something to send). Receive work never transmits itself:
/// the caller in `progress.rs` decides (`RxState::tx_due`).
pub(super) fn feed(qp: &SoftQp, conn: &Conn, data: &[u8]) -> (usize, bool, bool) {
    if !data.is_empty() {
        conn.heard_from_peer();
    }
    let mut eng = qp.lock_engine();
    let n = eng.handle_input(data, &*qp.mem);
    let stuck = n == 0 && eng.state() != QpState::Rts;
    pump(qp, &mut eng);
    let tx = eng.has_transmit() || eng.wants_close();
    (n, stuck, tx)
}

/// What one receive pass did.
pub(super) enum Pass {
    /// Bytes were read or consumed; call again.
    Progress,
    /// The socket had nothing and the buffer holds no complete unit.
    Idle,
    /// The last read was short, so the socket is probably empty; its bytes
    /// are consumed. (A blocking reader reads again; others stop.)
    Drained,
    /// The connection is over (EOF or an error), with the reason.
    Closed(String),
}

/// `recv` into `buf` (plain `recv`, not `recvmsg`: a busy poller calls this
/// in a loop, and `recvmsg` costs a message header and iovec import per
/// call on top); non-blocking unless `block`.
pub(super) fn recv_buf(fd: std::os::fd::RawFd, buf: &mut [u8], block: bool) -> sys::Recv {
    if !block {
        return sys::recv_nb(fd, buf);
    }
    match sys::recv_blocking(fd, buf) {
        Ok(n) => sys::Recv::Data(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => sys::Recv::Empty,
        Err(e) => sys::Recv::Failed(e),
    }
}

/// One step of receive work, never blocking: feed buffered bytes to the
/// engine, or read once from the socket (straight into a registered region
/// when the engine hints tagged payload, otherwise into the buffer).
pub(super) fn rx_pass(qp: &SoftQp, conn: &Conn, rx: &mut RxState) -> Pass {
    let fd = conn.sock.as_raw_fd();
    rx.ready();
    if rx.start < rx.end {
        rx.hint_buffered = false;
        let (n, stuck, tx) = feed(qp, conn, &rx.buf[rx.start..rx.end]);
        rx.tx_due |= tx;
        rx.start += n;
        if stuck {
            // The QP left RTS (Terminate sent or received): it accepts no
            // more input. Discard until the peer closes.
            rx.start = rx.end;
        }
        if rx.start == rx.end {
            (rx.start, rx.end) = (0, 0);
        } else if n > 0 {
            return Pass::Progress;
        } else {
            // The engine needs more bytes to make progress.
            rx.buf.copy_within(rx.start..rx.end, 0);
            rx.end -= rx.start;
            rx.start = 0;
            if rx.end == rx.buf.len() {
                return Pass::Closed(format!(
                    "engine consumed nothing from a full {RX_BUF}-byte buffer"
                ));
            }
        }
    }
    if std::mem::take(&mut rx.short) {
        return Pass::Drained;
    }
    let hint = if rx.end == 0 && !rx.hint_buffered {
        let h = qp.lock_engine().rx_hint();
        rx.hint_buffered = matches!(h, RxHint::Buffered);
        h
    } else {
        RxHint::Buffered
    };
    if rx.end == 0 && rx.peeked {
        // Bulk tagged traffic continues while a header-sized read leads
        // straight into tagged payload again.
        rx.bulk = matches!(hint, RxHint::Direct { .. });
    }
    rx.peeked = false;
    match hint {
        // In bulk mode, also finish a segment's shorter remainder directly.
        RxHint::Direct { stag, to, len } if len >= DIRECT_MIN || rx.bulk => {
            let Ok(region) = qp.mem.resolve(stag) else {
                // Deregistered meanwhile: let the engine see the bytes (and
                // fail the access) through the buffered path.
                return match recv_buf(fd, &mut rx.buf, false) {
                    sys::Recv::Data(0) => Pass::Closed("EOF".into()),
                    sys::Recv::Data(n) => {
                        rx.end = n;
                        Pass::Progress
                    }
                    sys::Recv::Empty => Pass::Idle,
                    sys::Recv::Failed(e) => Pass::Closed(format!("read failed: {e}")),
                };
            };
            // The engine validated the range; check again, we are about to
            // let the kernel write there.
            let ptr = match region.ptr_at(to, len as u64) {
                Ok(p) => p,
                Err(e) => {
                    return Pass::Closed(format!(
                        "direct placement outside region {stag:#010x}: {e}"
                    ))
                }
            };
            // One scatter read takes the payload into the region and the
            // FPDU's trailer plus the next header into the buffer, so a bulk
            // stream costs one system call per FPDU.
            let mut iov = [
                libc::iovec {
                    iov_base: ptr.cast(),
                    iov_len: len as usize,
                },
                libc::iovec {
                    iov_base: rx.buf.as_mut_ptr().cast(),
                    iov_len: DIRECT_TAIL,
                },
            ];
            // SAFETY: the first iovec lies inside the region (checked just
            // above), which stays allocated while `region` (an Arc) is held:
            // owned memory lives in the Arc, raw memory is kept alive by the
            // `reg_mr_raw` contract and the MemoryRegion's Drop, which waits
            // for this Arc. The second is the start of `rx.buf`, which is
            // empty (`end == 0`) and at least DIRECT_TAIL long. The call
            // does not block, so the region is held only for one copy.
            let r = unsafe { sys::recv_iovecs(fd, &mut iov) };
            drop(region);
            match r {
                Ok(0) => Pass::Closed("EOF".into()),
                Ok(n) => {
                    // Payload placed straight into memory is news from the
                    // peer too (a long Read Response on a slow path).
                    conn.heard_from_peer();
                    rx.bulk = true;
                    rx.short = n < len as usize + DIRECT_TAIL;
                    let direct = n.min(len as usize);
                    rx.end = n - direct;
                    qp.counters
                        .rx_direct_bytes
                        .fetch_add(direct as u64, Ordering::Relaxed);
                    qp.counters
                        .rx_buffered_bytes
                        .fetch_add(rx.end as u64, Ordering::Relaxed);
                    rx.hint_buffered = false;
                    let mut eng = qp.lock_engine();
                    eng.handle_direct(direct, &*qp.mem);
                    pump(qp, &mut eng);
                    rx.tx_due |= eng.has_transmit() || eng.wants_close();
                    Pass::Progress
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Pass::Idle,
                Err(e) => Pass::Closed(format!("read failed: {e}")),
            }
        }
        _ => {
            let want = match (rx.end, rx.bulk) {
                (0, true) => {
                    rx.peeked = true;
                    HDR_PEEK
                }
                (0, false) => RX_READ,
                _ => rx.buf.len() - rx.end,
            };
            let end = rx.end;
            match recv_buf(fd, &mut rx.buf[end..end + want], rx.block) {
                sys::Recv::Data(0) => Pass::Closed("EOF".into()),
                sys::Recv::Data(n) => {
                    rx.end += n;
                    rx.short = n < want;
                    qp.counters
                        .rx_buffered_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    Pass::Progress
                }
                sys::Recv::Empty => {
                    rx.peeked = false;
                    Pass::Idle
                }
                sys::Recv::Failed(e) => Pass::Closed(format!("read failed: {e}")),
            }
        }
    }
}
