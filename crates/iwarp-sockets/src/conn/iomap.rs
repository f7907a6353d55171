//! The driver half of `riomap` / `riounmap` / `riowrite` (the protocol is in
//! [`crate::flow`]'s iomap module): registering the mapped buffers, copying
//! the peer's announced entries out of our table, sending our entries, and
//! the zero-copy direct writes.
//!
//! Our iomap table sits behind the target SGL in the `tsgl` region
//! (`32 + 24 * Options::iomap_size` bytes, remote write), as in rsocket.c's
//! `rs_init_bufs`.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::{Access, MemoryRegion};

use super::maps::LocalMap;
use super::types::{for_spans, verbs_err, Conn, State, Waited};
use crate::flow::{FlowError, IomapError, TARGET_SGL_LEN};
use crate::wire::Sge;

/// A buffer of ours the peer may `riowrite` into (see
/// `Stream::riomap`). Dropping it unmaps it (`riounmap`): the memory is
/// deregistered, so a later write from the peer ends the connection with a
/// Terminate instead of landing.
pub struct IoMap {
    conn: Arc<Conn>,
    id: u64,
    mr: Arc<MemoryRegion>,
    offset: u64,
}

impl std::fmt::Debug for IoMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoMap")
            .field("offset", &self.offset)
            .field("len", &self.mr.len())
            .finish()
    }
}

impl IoMap {
    /// The offset the peer writes at (`riomap`'s return value).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Whether the mapping is empty (never: `riomap` refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// Copies `buf.len()` bytes at `at` (relative to the start of the
    /// buffer, not to [`IoMap::offset`]) out of the buffer. The peer may be
    /// writing meanwhile: the application learns by its own means (a
    /// message, a marker byte) when a range is complete.
    ///
    /// # Panics
    /// If the range is not inside the buffer.
    pub fn read_at(&self, at: usize, buf: &mut [u8]) {
        self.mr.read_at(at, buf);
    }

    /// Writes `data` into the buffer at `at` (local access, e.g. to reset a
    /// marker byte).
    ///
    /// # Panics
    /// If the range is not inside the buffer.
    pub fn write_at(&self, at: usize, data: &[u8]) {
        self.mr.write_at(at, data);
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        self.mr.to_vec()
    }

    /// Unmaps it now (`riounmap`), reporting a failure that `drop` would
    /// swallow.
    pub fn unmap(self) -> io::Result<()> {
        let r = self.conn.unmap(self.id);
        // `drop` finds it gone and does nothing more.
        drop(self);
        r
    }
}

impl Drop for IoMap {
    fn drop(&mut self) {
        let _ = self.conn.unmap(self.id);
    }
}

fn too_long(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "riomap of {len} bytes: a mapping is one rs_sge, whose length is 32 bits; map at \
             most 4 GiB - 1 bytes (and more than 0)"
        ),
    )
}

impl Conn {
    /// Sends our waiting entries (posted at once) and copies the peer's
    /// announced ones out of our table.
    pub(super) fn iomap_progress(&self, st: &mut State) {
        if st.flow.iomap_announced_pending() {
            let mut table = vec![0u8; self.tsgl.len() - TARGET_SGL_LEN];
            self.tsgl.read_at(TARGET_SGL_LEN, &mut table);
            st.flow.iomap_refresh(&table);
        }
        let mut pushed = 0;
        while let Some(g) = st.flow.push_iomap() {
            let mut done = 0;
            for_spans(g.spans, |o, n| {
                self.sbuf.write_at(o, &g.bytes[done..done + n]);
                done += n;
            });
            pushed += 1;
        }
        if pushed > 0 {
            self.pump(st);
            // `pump` counted each entry's Write as a data message.
            st.stats.data_msgs = st.stats.data_msgs.saturating_sub(pushed);
        }
    }

    /// Registers `mr` as a mapping at `offset` (`None`: its address) and
    /// sends its entry as soon as a credit allows.
    fn map_region(
        &self,
        mr: MemoryRegion,
        offset: Option<u64>,
        raw: Option<(usize, usize)>,
    ) -> io::Result<(u64, Arc<MemoryRegion>, u64)> {
        let len = u32::try_from(mr.len())
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| too_long(mr.len()))?;
        let offset = offset.unwrap_or(mr.addr());
        let mut st = self.lock();
        Self::check_broken(&st)?;
        let index = st
            .flow
            .map_remote(
                offset,
                Sge {
                    addr: mr.addr(),
                    key: mr.rkey(),
                    length: len,
                },
            )
            .map_err(io::Error::from)?;
        let mr = Arc::new(mr);
        let id = st.iomaps.next_id;
        st.iomaps.next_id += 1;
        st.iomaps.maps.push(LocalMap {
            id,
            index,
            _mr: mr.clone(),
            raw,
        });
        self.iomap_progress(&mut st);
        self.pump(&mut st);
        self.refresh(&mut st);
        tracing::debug!(conn = self.id, index, offset, len, "riomap");
        Ok((id, mr, offset))
    }

    /// `riomap` of a buffer the library allocates (zeroed).
    pub(crate) fn riomap(self: &Arc<Self>, len: usize, offset: Option<u64>) -> io::Result<IoMap> {
        if len == 0 || len > u32::MAX as usize {
            return Err(too_long(len));
        }
        let mr = self
            .pd
            .reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(verbs_err)?;
        mr.fill(0);
        let (id, mr, offset) = self.map_region(mr, offset, None)?;
        Ok(IoMap {
            conn: self.clone(),
            id,
            mr,
            offset,
        })
    }

    /// `riomap` of the caller's memory (the C API).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until
    /// [`Conn::riounmap_raw`] for it returns or the connection is dropped,
    /// and nothing else may rely on its contents meanwhile (the peer writes
    /// into it at any time).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn riomap_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        offset: Option<u64>,
    ) -> io::Result<u64> {
        if ptr.is_null() || len == 0 || len > u32::MAX as usize {
            return Err(too_long(len));
        }
        // SAFETY: forwarded from the caller.
        let mr = unsafe { crate::sys::register_target(&self.pd, ptr, len) }.map_err(verbs_err)?;
        self.map_region(mr, offset, Some((ptr as usize, len)))
            .map(|(_, _, off)| off)
    }

    /// `riounmap(buf, len)` of a [`Conn::riomap_raw`] mapping.
    pub(crate) fn riounmap_raw(&self, ptr: *mut u8, len: usize) -> io::Result<()> {
        let id = {
            let st = self.lock();
            st.iomaps
                .maps
                .iter()
                .find(|m| m.raw == Some((ptr as usize, len)))
                .map(|m| m.id)
        };
        match id {
            Some(id) => self.unmap(id),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "riounmap: no mapping of {len} bytes at {ptr:p} on this socket (riounmap takes \
                     the buffer and length given to riomap)"
                ),
            )),
        }
    }

    /// Removes mapping `id`; the memory is deregistered once the last
    /// handle is gone (at once for C mappings).
    fn unmap(&self, id: u64) -> io::Result<()> {
        let gone = {
            let mut st = self.lock();
            let Some(at) = st.iomaps.maps.iter().position(|m| m.id == id) else {
                return Ok(());
            };
            let m = st.iomaps.maps.remove(at);
            let r = st.flow.unmap_remote(m.index);
            tracing::debug!(conn = self.id, index = m.index, "riounmap");
            (m, r)
        };
        // Deregister outside the lock (it waits for the driver threads).
        let (m, r) = gone;
        drop(m);
        r.map_err(io::Error::from)
    }

    /// At close, after the queue pair is disconnected: deregisters the C
    /// caller's mappings (`rclose` ends them, as rsocket.c's
    /// `rs_free_iomappings` does), so that the caller may free the memory
    /// once `rclose` returns. [`IoMap`]s own their memory and end with
    /// their handles.
    pub(super) fn iomap_close(&self) {
        let raw: Vec<LocalMap> = {
            let mut st = self.lock();
            let (raw, keep) = std::mem::take(&mut st.iomaps.maps)
                .into_iter()
                .partition(|m| m.raw.is_some());
            st.iomaps.maps = keep;
            raw
        };
        // Deregistered outside the lock.
        drop(raw);
    }

    /// The peer's mappings as known now: `(offset, length)`.
    pub(crate) fn peer_iomaps(&self) -> Vec<(u64, u32)> {
        let mut st = self.lock();
        self.drain(&mut st);
        self.iomap_progress(&mut st);
        st.flow
            .peer_iomaps()
            .map(|(_, e)| (e.offset, e.sge.length))
            .collect()
    }

    /// `riowrite`: RDMA-Writes `buf` straight from the caller's memory into
    /// the peer's mappings at `offset` (zero copy on both sides; no message
    /// follows, as in rsocket.c). The whole range must lie in the peer's
    /// announced mappings (`InvalidInput` otherwise, nothing written).
    /// Blocking: returns when every byte has been handed to the transport;
    /// non-blocking: writes what the send queue takes now (`WouldBlock` if
    /// nothing). Either way the Writes from `buf` have completed when it
    /// returns.
    pub(crate) fn riowrite(
        &self,
        buf: &[u8],
        offset: u64,
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let mut call = self.begin();
        call.unlocked(|| self.riowrite_inner(buf, offset, nonblocking, deadline))
    }

    fn riowrite_inner(
        &self,
        buf: &[u8],
        offset: u64,
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        {
            let mut st = self.lock();
            self.drain(&mut st);
            self.iomap_progress(&mut st);
            self.pump(&mut st);
            Self::check_broken(&st)?;
            st.flow
                .check_direct(offset, buf.len() as u64)
                .map_err(io::Error::from)?;
        }
        let mr = crate::sys::register_source(&self.pd, buf).map_err(verbs_err)?;
        let mut st = self.lock();
        let mut done = 0usize;
        let mut err = None;
        while done < buf.len() {
            self.drain(&mut st);
            if let Err(e) = Self::check_broken(&st) {
                err = Some(e);
                break;
            }
            match st
                .flow
                .write_direct(offset + done as u64, (buf.len() - done) as u64)
            {
                Ok(n) => {
                    st.zc_sge = Some(mr.sge(done, n as usize));
                    self.pump(&mut st);
                    // `pump` counts a Write from application memory as a
                    // data message; a direct write is none.
                    st.stats.data_msgs = st.stats.data_msgs.saturating_sub(1);
                    done += n as usize;
                }
                Err(IomapError::Flow(FlowError::WouldBlock)) => {
                    if nonblocking {
                        if done == 0 {
                            err = Some(io::ErrorKind::WouldBlock.into());
                        }
                        break;
                    }
                    let (g, w) = self.wait(st, deadline);
                    st = g;
                    if let Waited::TimedOut = w {
                        err = Some(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            "riowrite timed out (SO_SNDTIMEO)",
                        ));
                        break;
                    }
                }
                Err(e) => {
                    err = Some(e.into());
                    break;
                }
            }
        }
        // Every Write from `buf` must be done before it is released.
        while st.zc_inflight > 0 {
            self.drain(&mut st);
            if st.zc_inflight == 0 {
                break;
            }
            let (g, _) = self.wait(st, Some(Instant::now() + Duration::from_millis(100)));
            st = g;
        }
        st.stats.iowrite_bytes += done as u64;
        st.idle = false;
        self.refresh(&mut st);
        drop(st);
        drop(mr);
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }
}
