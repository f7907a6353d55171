//! The iomap half of the rsockets protocol (`riomap`, `riounmap`,
//! `riowrite`), without I/O, as an extension of [`Flow`].
//!
//! # The protocol, from rsocket.c
//!
//! - **The table.** Each side may advertise room for `target_iomap_size`
//!   [`Iomap`] entries (24 bytes: `offset`, then an `rs_sge`) right behind
//!   its two-entry target SGL, in the same registered region
//!   (`rs_init_bufs`: `len = sizeof(rs_sge) * RS_SGL_SIZE +
//!   sizeof(rs_iomap) * target_iomap_size`). The conn data says how many
//!   (`target_iomap_size`, scaled by `rs_value_to_scale(.., 8)`) and sets
//!   `RS_CONN_FLAG_IOMAP`; the peer computes the table's address as
//!   `target_sgl.addr + sizeof(rs_sge) * target_sgl.length` with the
//!   target SGL's rkey (`rs_save_conn_data`). rsocket.c's default size is
//!   0 (`def_iomap_size`); `riostream` asks for 1 (`RDMA_IOMAPSIZE`).
//! - **`riomap(buf, len, PROT_WRITE, 0, offset)`** registers `buf` for
//!   remote write and takes the first free index of the *peer's* table
//!   (`rs_get_iomap_mr`; none free: `ENOMEM`). `offset == -1` maps the
//!   buffer at its own address. The entry is queued and written before the
//!   next `rsend`/`riowrite` (`rs_send_iomaps`): an RDMA Write of the 24
//!   bytes, **in the peer's host order** (byte-swapped under
//!   `RS_OPT_SWAP_SGL`), to `table + index * 24`, then the message word
//!   `RS_OP_IOMAP_SGL | index` (a Send on iWARP). It costs what a data
//!   message costs (`rs_write_iomap`: `sseq_no++`, two send-queue entries,
//!   24 bytes of send buffer), so the peer must have granted a credit.
//! - **The receiver** of `RS_OP_IOMAP_SGL` does nothing but repost the
//!   receive (`rs_poll_cq`: "The iomap was updated, that's nice to know");
//!   its `riowrite` reads the table the peer wrote straight from memory
//!   (`rs_find_iomap`: the first entry with `offset <= o < offset +
//!   sge.length`). Since rsocket.c's `rrecv` counts only data messages in
//!   `rseq_no`, a credit spent on an iomap entry never comes back from an
//!   rsocket.c peer.
//! - **`riowrite(buf, count, offset, flags)`** (`rs_write_direct`): plain
//!   RDMA Writes to `entry.sge.addr + offset - entry.offset` with the
//!   entry's key, each costing one send-queue entry; **no message follows**.
//!   `RS_OP_WRITE` only tags the local work request ("opcode is not
//!   transmitted over the network"); an `RS_OP_WRITE` word that did arrive
//!   would hit rsocket.c's "We really shouldn't be here" branch. The
//!   application tells its peer that the data is there by its own means:
//!   `riostream` polls the last byte of the buffer, a program can also
//!   send a message after the writes (an RDMA Write is placed before a
//!   later Send on the same connection completes, RFC 5040 §5.5, ordering).
//! - **`riounmap(buf, len)`** deregisters the buffer and frees the index
//!   locally; the peer is not told. Its next `riowrite` there hits an
//!   invalid STag and the connection ends with a Terminate (RFC 5041 §5, §7:
//!   the tagged-buffer check fails).
//!
//! # What this module adds
//!
//! - A `riowrite` whose range is not covered by the peer's mappings is
//!   refused before anything is written ([`IomapError::NotMapped`]);
//!   rsocket.c writes up to the end of the mapping and returns the short
//!   count, or 0 without an error when the offset is not mapped at all.
//! - An `RS_OP_IOMAP_SGL` is refused when we advertised no table, names an
//!   index beyond it, or exceeds the credits we granted (rsocket.c accepts
//!   anything). It is counted as a data message and returned as a credit at
//!   once, so a peer that spends credits on iomap entries keeps its window.
//! - The peer's entries are copied out of the table when their
//!   `RS_OP_IOMAP_SGL` arrives ([`Flow::iomap_refresh`]), not read from
//!   memory the peer can rewrite at every `riowrite`.
//! - `riowrite` writes from the caller's memory (zero copy); rsocket.c
//!   copies through its send buffer (the bytes in flight are bounded by the
//!   send queue instead of the send buffer).

use std::fmt;

use super::error::{FlowError, ProtocolError};
use super::state::Flow;
use super::types::{Action, Phase, SendTag, Source, Spans, TARGET_SGL_LEN};
use crate::wire::{iomap_scale_to_value, iomap_value_to_scale, Iomap, Message, Op, Sge, IOMAP_LEN};

/// The largest table `target_iomap_size` can describe
/// (`rs_scale_to_value(0xff, 8)`).
pub const IOMAP_SIZE_MAX: u16 = 0x7f << 8;

/// Bytes of one direct write at most: larger `riowrite`s are split, so that
/// the first pieces leave while later ones are posted.
pub const DIRECT_MAX: u32 = 1 << 20;

/// What the driver copies into the send buffer for one queued entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IomapGrant {
    /// Where in the send buffer the 24 bytes go (copy before posting).
    pub spans: Spans,
    /// The entry, in the peer's order.
    pub bytes: [u8; IOMAP_LEN],
    /// The index it is written to.
    pub index: u16,
}

/// What is wrong with an iomap call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IomapError {
    /// The connection refuses it (not connected, broken, shut down, or it
    /// would block).
    Flow(FlowError),
    /// Every entry of the peer's table is in use (`size` entries).
    NoSlot {
        /// Entries the peer advertised.
        size: u16,
    },
    /// No mapping of ours has this index (`riounmap` of something never
    /// mapped, or unmapped twice).
    UnknownIndex(u16),
    /// `riowrite` of `len` bytes at `offset`: not all of it lies in the
    /// peer's announced mappings.
    NotMapped {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The first byte not covered.
        gap: u64,
    },
    /// The table size can only be set before the connection exists.
    TooLate,
}

impl fmt::Display for IomapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IomapError::Flow(e) => e.fmt(f),
            IomapError::NoSlot { size: 0 } => write!(
                f,
                "riomap: the peer advertised no iomap entries (target_iomap_size 0), so it cannot \
                 learn about a mapping; the peer must set RDMA_IOMAPSIZE (rsocket.c) or \
                 Options::iomap_size (this library) before connecting"
            ),
            IomapError::NoSlot { size } => write!(
                f,
                "riomap: all {size} entries of the peer's iomap table are in use; riounmap one \
                 first, or have the peer advertise more (RDMA_IOMAPSIZE / Options::iomap_size)"
            ),
            IomapError::UnknownIndex(i) => write!(
                f,
                "riounmap: no mapping with index {i} (never mapped, or already unmapped)"
            ),
            IomapError::NotMapped { offset, len, gap } => write!(
                f,
                "riowrite of {len} bytes at offset {offset:#x}: byte {gap:#x} lies in no region \
                 the peer mapped with riomap (or its mapping has not arrived yet); write only \
                 inside the peer's mappings"
            ),
            IomapError::TooLate => write!(
                f,
                "the iomap table size is part of the connection's private data: set it before \
                 connecting"
            ),
        }
    }
}

impl std::error::Error for IomapError {}

impl IomapError {
    /// The `std::io` kind (the errno of the C API): `ENOMEM` for a full
    /// table as in rsocket.c, `EINVAL` for bad offsets and indices.
    pub fn kind(&self) -> std::io::ErrorKind {
        match self {
            IomapError::Flow(e) => e.kind(),
            IomapError::NoSlot { .. } => std::io::ErrorKind::OutOfMemory,
            IomapError::UnknownIndex(_) | IomapError::NotMapped { .. } | IomapError::TooLate => {
                std::io::ErrorKind::InvalidInput
            }
        }
    }
}

impl From<FlowError> for IomapError {
    fn from(e: FlowError) -> IomapError {
        IomapError::Flow(e)
    }
}

impl From<IomapError> for std::io::Error {
    fn from(e: IomapError) -> std::io::Error {
        match e {
            IomapError::Flow(f) => f.into(),
            other => std::io::Error::new(other.kind(), other),
        }
    }
}

impl Flow {
    /// Sets the number of entries of our iomap table (advertised in the
    /// conn data; the driver registers [`Flow::target_region_len`] bytes).
    /// The size is rounded down to what `target_iomap_size` can carry
    /// (exact up to 128, then multiples of 256 up to [`IOMAP_SIZE_MAX`]);
    /// returns it.
    pub fn set_iomap_size(&mut self, entries: u16) -> Result<u16, IomapError> {
        if self.phase != Phase::Init {
            return Err(IomapError::TooLate);
        }
        let n = iomap_scale_to_value(iomap_value_to_scale(entries.min(IOMAP_SIZE_MAX)));
        self.iomap.local_size = n;
        self.iomap.peer = vec![None; usize::from(n)];
        Ok(n)
    }

    /// Entries of our iomap table.
    pub fn iomap_size(&self) -> u16 {
        self.iomap.local_size
    }

    /// Entries of the peer's iomap table (0 before [`Flow::establish`]).
    pub fn peer_iomap_size(&self) -> u16 {
        self.iomap.remote.length as u16
    }

    /// Bytes of the region that holds the target SGL and our iomap table.
    pub fn target_region_len(&self) -> usize {
        TARGET_SGL_LEN + IOMAP_LEN * usize::from(self.iomap.local_size)
    }

    /// `riomap`: takes a free entry of the peer's table for `region`
    /// mapped at `offset` and queues it; the driver sends it with
    /// [`Flow::push_iomap`]. Returns the index.
    pub fn map_remote(&mut self, offset: u64, region: Sge) -> Result<u16, IomapError> {
        match self.phase {
            Phase::Connected => {}
            Phase::Init => return Err(FlowError::NotConnected.into()),
            Phase::Disconnected => return Err(FlowError::NotWritable.into()),
            Phase::Error => return Err(self.err.unwrap_or(FlowError::SendFailed).into()),
        }
        let Some(i) = self.iomap.used.iter().position(|u| !u) else {
            return Err(IomapError::NoSlot {
                size: self.peer_iomap_size(),
            });
        };
        self.iomap.used[i] = true;
        let index = i as u16;
        self.iomap.queue.push_back((
            index,
            Iomap {
                offset,
                sge: region,
            },
        ));
        Ok(index)
    }

    /// `riounmap`: frees entry `index` of the peer's table (an entry still
    /// queued is not sent). The peer is not told (as in rsocket.c): the
    /// driver deregisters the memory, so a later write from the peer ends
    /// the connection with a Terminate instead of landing.
    pub fn unmap_remote(&mut self, index: u16) -> Result<(), IomapError> {
        match self.iomap.used.get_mut(usize::from(index)) {
            Some(u) if *u => *u = false,
            _ => return Err(IomapError::UnknownIndex(index)),
        }
        self.iomap.queue.retain(|(i, _)| *i != index);
        Ok(())
    }

    /// Whether entries wait to be written into the peer's table.
    pub fn iomap_pending(&self) -> bool {
        !self.iomap.queue.is_empty()
    }

    /// Queues the RDMA Write of the next waiting entry and its
    /// `RS_OP_IOMAP_SGL` word (`rs_write_iomap`) if a credit, two send-queue
    /// entries and 24 bytes of send buffer are free and no buffered bytes
    /// wait (they would share the send buffer's tail); copy
    /// [`IomapGrant::bytes`] into its spans before posting.
    pub fn push_iomap(&mut self) -> Option<IomapGrant> {
        let len = IOMAP_LEN as u32;
        if self.iomap.queue.is_empty()
            || self.phase != Phase::Connected
            || !self.writable
            || self.pend_len > 0
            || self.sqe_avail < 2
            || !self.has_credit()
            || self.sbuf_bytes_avail < len
        {
            return None;
        }
        let (index, entry) = self.iomap.queue.pop_front()?;
        let mut bytes = [0u8; IOMAP_LEN];
        // In the peer's order (rs_send_iomaps under RS_OPT_SWAP_SGL).
        entry
            .emit(&mut bytes, self.peer_order)
            .expect("24-byte buffer");
        let spans = Spans::of_ring(self.sbuf_head, len, self.cfg.sbuf_size);
        self.sbuf_head = (self.sbuf_head + len) % self.cfg.sbuf_size;
        self.sbuf_bytes_avail -= len;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 2;
        self.actions.push_back(Action::RdmaWrite {
            src: Source::Sbuf(spans),
            remote_addr: self
                .iomap
                .remote
                .addr
                .wrapping_add(u64::from(index) * IOMAP_LEN as u64),
            rkey: self.iomap.remote.key,
            tag: SendTag::DataWrite { len },
        });
        let payload = self.word(Message::IomapSgl { index });
        self.actions.push_back(Action::Send {
            payload,
            tag: SendTag::DataMsg,
        });
        Some(IomapGrant {
            spans,
            bytes,
            index,
        })
    }

    /// An `RS_OP_IOMAP_SGL` word arrived: entry `index` of our table was
    /// written. Counted as a data message (the peer spent a credit on it)
    /// and consumed at once.
    pub(super) fn iomap_announced(&mut self, index: u16) -> Result<(), ProtocolError> {
        if self.iomap.local_size == 0 {
            return Err(ProtocolError::Unexpected(Op::IomapSgl));
        }
        if index >= self.iomap.local_size {
            return Err(ProtocolError::IomapIndex {
                index,
                size: self.iomap.local_size,
            });
        }
        if self.peer_write_closed {
            return Err(ProtocolError::DataAfterShutdown);
        }
        if self.rx_limit.wrapping_sub(self.rx_count) == 0 {
            return Err(ProtocolError::CreditsExceeded {
                received: self.rx_count,
                limit: self.rx_limit,
            });
        }
        self.rx_count = self.rx_count.wrapping_add(1);
        self.rseq_no = self.rseq_no.wrapping_add(1);
        if !self.iomap.announced.contains(&index) {
            self.iomap.announced.push(index);
        }
        Ok(())
    }

    /// Whether announced entries wait to be copied out
    /// ([`Flow::iomap_refresh`]).
    pub fn iomap_announced_pending(&self) -> bool {
        !self.iomap.announced.is_empty()
    }

    /// Copies the announced entries out of `table` (our iomap table: the
    /// bytes of the target region after the target SGL, in our order). An
    /// entry of length 0 removes the mapping.
    pub fn iomap_refresh(&mut self, table: &[u8]) {
        for index in std::mem::take(&mut self.iomap.announced) {
            let at = usize::from(index) * IOMAP_LEN;
            let entry = table
                .get(at..at + IOMAP_LEN)
                .and_then(|b| Iomap::parse(b, self.cfg.order).ok())
                .filter(|e| e.sge.length > 0);
            if let Some(slot) = self.iomap.peer.get_mut(usize::from(index)) {
                *slot = entry;
            }
        }
    }

    /// The peer's mappings as known now (index, entry).
    pub fn peer_iomaps(&self) -> impl Iterator<Item = (u16, Iomap)> + '_ {
        self.iomap
            .peer
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.map(|e| (i as u16, e)))
    }

    /// The peer's mapping that holds byte `offset` (`rs_find_iomap`).
    fn find_iomap(&self, offset: u64) -> Option<Iomap> {
        self.iomap
            .peer
            .iter()
            .flatten()
            .copied()
            .find(|e| offset >= e.offset && offset - e.offset < u64::from(e.sge.length))
    }

    /// Checks that `len` bytes at `offset` lie in the peer's mappings
    /// (several adjacent ones may cover the range).
    pub fn check_direct(&self, offset: u64, len: u64) -> Result<(), IomapError> {
        let end = offset.checked_add(len).ok_or(IomapError::NotMapped {
            offset,
            len,
            gap: u64::MAX,
        })?;
        let mut at = offset;
        while at < end {
            let Some(e) = self.find_iomap(at) else {
                return Err(IomapError::NotMapped {
                    offset,
                    len,
                    gap: at,
                });
            };
            at = e.offset + u64::from(e.sge.length);
        }
        Ok(())
    }

    /// `rs_write_direct`: queues one RDMA Write of up to `want` bytes for
    /// byte `offset` of the peer's mappings, from application memory
    /// ([`Source::External`], tagged [`SendTag::ZcopyWrite`]); no message
    /// follows. Returns the bytes it takes (up to the end of the mapping
    /// and [`DIRECT_MAX`]); `WouldBlock` while no send-queue entry is free.
    pub fn write_direct(&mut self, offset: u64, want: u64) -> Result<u32, IomapError> {
        self.check_sendable_direct()?;
        let Some(e) = self.find_iomap(offset) else {
            return Err(IomapError::NotMapped {
                offset,
                len: want,
                gap: offset,
            });
        };
        if want == 0 {
            return Ok(0);
        }
        if self.sqe_avail < 1 {
            return Err(FlowError::WouldBlock.into());
        }
        let into = offset - e.offset;
        let n = want
            .min(u64::from(e.sge.length) - into)
            .min(u64::from(DIRECT_MAX)) as u32;
        self.sqe_avail -= 1;
        self.actions.push_back(Action::RdmaWrite {
            src: Source::External { len: n },
            remote_addr: e.sge.addr.wrapping_add(into),
            rkey: e.sge.key,
            tag: SendTag::ZcopyWrite { len: n },
        });
        Ok(n)
    }

    fn check_sendable_direct(&self) -> Result<(), IomapError> {
        match self.phase {
            Phase::Error => Err(self.err.unwrap_or(FlowError::SendFailed).into()),
            Phase::Init => Err(FlowError::NotConnected.into()),
            Phase::Disconnected => Err(FlowError::NotWritable.into()),
            Phase::Connected if !self.writable => Err(FlowError::NotWritable.into()),
            Phase::Connected => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
