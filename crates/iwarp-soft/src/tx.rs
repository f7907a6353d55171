//! Transmit work: building frames from the engine and writing them with
//! one gather `sendmsg` from registered memory, the transmit thread, and
//! the opportunistic non-blocking transmit of other threads (`kick`).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::TryLockError;

use iwarp_proto::engine::TxPiece;
use iwarp_proto::mem::MemError;

use crate::state::*;
use crate::sys;

/// Bytes the transmit path asks the engine for per `poll_transmit`.
pub const TX_BATCH: usize = 64 * 1024;
/// Largest iovec count per `sendmsg` (Linux `IOV_MAX` is 1024).
pub(super) const MAX_IOV: usize = 1024;

impl Conn {
    /// Transmit what the engine has, from the calling thread if `tx` is free
    /// and the socket has room, otherwise by waking the transmit thread.
    /// Never blocks on the network.
    pub(crate) fn kick(&self, qp: &SoftQp) {
        let guard = match self.tx.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.wake_tx();
                return;
            }
        };
        let mut tx = guard;
        let r = flush(qp, self, &mut tx);
        drop(tx);
        self.tx_released();
        match r {
            Flush::Done => {
                if qp.lock_engine().has_transmit() {
                    self.wake_tx();
                }
            }
            Flush::WouldBlock => self.wake_tx(),
            Flush::Closed => {}
        }
    }
}

/// Fault injection for tests of the driver's races (not for applications).
#[doc(hidden)]
pub mod fault {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    static CONFIRM_DELAY_US: AtomicU64 = AtomicU64::new(0);

    /// Make every writer pause this long between writing a whole frame and
    /// confirming it to the engine, widening the window in which the peer
    /// can read the frame and close first. Process-wide; zero turns it off.
    pub fn set_confirm_delay(d: Duration) {
        CONFIRM_DELAY_US.store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// One relaxed load per frame when off.
    #[inline]
    pub(super) fn after_frame_written() {
        let us = CONFIRM_DELAY_US.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flush {
    /// Nothing left to send.
    Done,
    /// The socket is full.
    WouldBlock,
    /// The connection is gone.
    Closed,
}

/// Write one batch of the current frame from `tx.off` on; returns the bytes
/// written.
///
/// A small remainder (at most [`SMALL_SEND`] bytes: the frame of a short
/// message) is copied into a stack buffer and written with one `send`, like
/// the inline data of an RNIC's work request: for a few hundred bytes the
/// copy is cheaper than `sendmsg`'s message header and iovec import, and it
/// is on the latency path of every small message. Everything else goes out
/// with one gather `sendmsg` straight from the frame's inline bytes and
/// the registered regions.
pub(super) fn write_some(qp: &SoftQp, conn: &Conn, tx: &mut TxState) -> io::Result<usize> {
    let r = gather_and_send(qp, conn, tx);
    // On every exit, errors included: no pointer outlives this call, and
    // no region stays pinned.
    tx.iov.0.clear();
    tx.hold.clear();
    r
}

/// The body of [`write_some`], which empties `iov` and `hold` after it.
pub(super) fn gather_and_send(qp: &SoftQp, conn: &Conn, tx: &mut TxState) -> io::Result<usize> {
    let left = tx.frame_len.saturating_sub(tx.off);
    if left == 0 {
        return Ok(0);
    }
    let small = left <= SMALL_SEND;
    let mut copied = 0usize;
    let mut skip = tx.off;
    let TxState {
        frame,
        hold,
        iov,
        small: copy,
        ..
    } = tx;
    let copy = &mut copy.0[..];
    for piece in &frame.pieces {
        let (plen, ptr): (usize, *const u8) = match *piece {
            TxPiece::Inline { start, len } => {
                let (s, l) = (start as usize, len as usize);
                let bytes = frame.inline.get(s..s + l).ok_or_else(|| {
                    io::Error::other("engine frame piece outside its inline buffer")
                })?;
                if skip >= l {
                    skip -= l;
                    continue;
                }
                if small {
                    let b = &bytes[skip..];
                    copy[copied..copied + b.len()].copy_from_slice(b);
                    copied += b.len();
                    skip = 0;
                    continue;
                }
                (l, bytes.as_ptr())
            }
            TxPiece::Mem { stag, to, len } => {
                if skip >= len as usize {
                    skip -= len as usize;
                    continue;
                }
                let gone = |e: MemError| {
                    io::Error::other(format!(
                        "memory region {stag:#010x} deregistered while a work request was sending from it: {e}"
                    ))
                };
                if small {
                    let n = len as usize - skip;
                    qp.mem
                        .copy_out(stag, to + skip as u64, &mut copy[copied..copied + n])
                        .map_err(|e| match e {
                            MemError::Bounds => {
                                io::Error::other(format!("transmit from {stag:#010x}: {e}"))
                            }
                            e => gone(e),
                        })?;
                    copied += n;
                    skip = 0;
                    continue;
                }
                let region = qp.mem.resolve(stag).map_err(gone)?;
                let p = region
                    .ptr_at(to, len as u64)
                    .map_err(|e| io::Error::other(format!("transmit from {stag:#010x}: {e}")))?;
                hold.push(region);
                (len as usize, p as *const u8)
            }
        };
        if skip >= plen {
            skip -= plen;
            continue;
        }
        iov.0.push(libc::iovec {
            iov_base: ptr.wrapping_add(skip) as *mut libc::c_void,
            iov_len: plen - skip,
        });
        skip = 0;
        if iov.0.len() == MAX_IOV {
            break;
        }
    }
    let fd = conn.sock.as_raw_fd();
    // With markers each write is one FPDU (see `flush`); MSG_EOR ends the
    // kernel's buffer there, so TCP never appends the next FPDU to it and
    // the FPDU leaves in a segment of its own (tcp(7): since Linux 4.7 a
    // write with MSG_EOR is not merged with later writes).
    let flags = if conn.fpdu_per_segment {
        libc::MSG_EOR
    } else {
        0
    };
    if small {
        return sys::send_nonblocking(fd, &copy[..copied], flags);
    }
    if iov.0.is_empty() {
        return Ok(0);
    }
    // SAFETY: each iovec points into `frame.inline` (borrowed for this
    // call) or into a registered region whose `Arc` is in `hold`, so all of
    // it is readable until the call returns; the call does not block.
    unsafe { sys::send_iovecs(fd, &iov.0, flags) }
}

/// Write everything the engine has, `tx` held; returns `WouldBlock` when the
/// socket is full (never waits: the transmit thread waits for `POLLOUT`
/// after releasing `tx`, see `tx_loop`).
pub(super) fn flush(qp: &SoftQp, conn: &Conn, tx: &mut TxState) -> Flush {
    loop {
        if conn.stop.load(Ordering::Acquire) {
            return Flush::Closed;
        }
        if tx.off < tx.frame_len {
            match write_some(qp, conn, tx) {
                Ok(n) => {
                    tx.off += n;
                    qp.counters.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    conn.wrote_bytes();
                    if tx.off >= tx.frame_len {
                        fault::after_frame_written();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    conn.tx_partial.store(true, Ordering::Relaxed);
                    return Flush::WouldBlock;
                }
                Err(e) => {
                    conn.connection_lost(qp, &format!("write failed: {e}"), Some(tx));
                    return Flush::Closed;
                }
            }
            continue;
        }
        let mut eng = qp.lock_engine();
        if tx.frame_len > 0 {
            eng.confirm_transmit();
            tx.frame.clear();
            tx.frame_len = 0;
            tx.off = 0;
            pump(qp, &mut eng);
        }
        // With markers, one FPDU per frame: RFC 5044 §8 asks the sender to
        // align FPDUs with TCP segments, and markers exist for receivers
        // that find FPDUs segment by segment (Wireshark's dissector among
        // them): an FPDU cut across two segments is lost to them. A budget
        // of one byte makes the engine emit exactly one FPDU (at least one
        // is always emitted), and `gather_and_send` writes it with MSG_EOR.
        let batch = if conn.fpdu_per_segment { 1 } else { TX_BATCH };
        if eng.has_transmit() && eng.poll_transmit(&mut tx.frame, batch, &*qp.mem) {
            tx.frame_len = tx.frame.len();
            continue;
        }
        let close = eng.wants_close();
        drop(eng);
        if close {
            conn.shut_write();
        }
        conn.tx_partial.store(false, Ordering::Relaxed);
        return Flush::Done;
    }
}

pub(super) fn tx_loop(qp: &SoftQp, conn: &Conn) {
    loop {
        let woken = {
            let mut woken = lock(&conn.wake);
            if !*woken && !conn.stop.load(Ordering::Acquire) {
                let sleep = conn.tx_sleep();
                woken = conn
                    .wake_cond
                    .wait_timeout(woken, sleep)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::replace(&mut *woken, false)
        };
        if conn.stop.load(Ordering::Acquire) {
            break;
        }
        // Every wake-up and every TICK: is the peer still there?
        if conn.give_up_if_silent(qp) {
            break;
        }
        let woken = conn.maybe_probe(qp) || woken;
        let woken = conn.maybe_nudge(qp) || woken;
        if !woken {
            continue;
        }
        // Write until done, waiting for socket space holding nothing: a
        // thread in `progress` (an application waiting for this very
        // transfer) may take `tx` meanwhile and push the frame on itself
        // as soon as the peer makes room, instead of waiting for this
        // thread to be scheduled.
        let closed = loop {
            let mut tx = lock(&conn.tx);
            let r = flush(qp, conn, &mut tx);
            if r != Flush::WouldBlock {
                break r == Flush::Closed;
            }
            drop(tx);
            if let Err(e) = iwarp_verbs::sys::poll_one(conn.sock.as_raw_fd(), libc::POLLOUT, TICK) {
                let mut tx = lock(&conn.tx);
                conn.connection_lost(qp, &format!("poll failed: {e}"), Some(&mut tx));
                break true;
            }
            // Every TICK of waiting for room, too: a peer that never opens
            // its window again must not hold the outstanding work forever.
            if conn.give_up_if_silent(qp) {
                break true;
            }
        };
        conn.tx_released();
        if closed {
            break;
        }
        if qp.lock_engine().has_transmit() {
            conn.wake_tx();
        }
    }
    conn.shut_write();
    tracing::trace!(qpn = qp.qpn, "tx thread exits");
}
