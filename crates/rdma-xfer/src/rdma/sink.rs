//! Sink blocks: memory the peer may RDMA-Write only while it is granted.
//!
//! A sink block is handed to the application as `&[u8]`
//! ([`BlockSink::write_block`](crate::BlockSink::write_block)). A Rust
//! shared reference promises that the bytes do not change while it lives,
//! so the peer must not be able to write the block then. A hostile source
//! can keep RDMA-Writing a block after its `BlockDone` (nothing in RDMAP
//! stops a peer from using an STag it was given, RFC 5040 §6.4 only
//! checks the STag, the access rights and the bounds), and an application
//! would then hash one version of the bytes and store another.
//!
//! So every block is registered (`reg_mr_raw`) only while it is granted,
//! and deregistered right before it is read ([`SinkBlock::retire`]):
//!
//! - Deregistration ends the STag. A tagged segment that names it
//!   afterwards fails the STag check (RFC 5041 §7.2, "invalid STag") and
//!   the sink answers with a Terminate: the connection dies, the write
//!   lands nowhere (the memory is no longer in the device's table).
//! - It is synchronised with placement already in flight. With the
//!   software provider, a segment is placed on the receive thread straight
//!   into the region, either by a copy under the region table's read lock
//!   (deregistration takes the write lock, so it waits for that copy) or
//!   by a direct `recv` into the memory, for which the receive thread holds
//!   a reference to the region (dropping a `reg_mr_raw` region waits until
//!   that reference is gone). With rdma-core, `ibv_dereg_mr` returning
//!   means the device no longer accesses the memory. Bytes that landed
//!   before the deregistration are simply what the block holds when it is
//!   read; nothing lands after it.
//! - The next grant registers the block again, under a new STag (the
//!   verbs crate draws a fresh key and does not reuse the index for a long
//!   time), so the STag the peer held stays invalid.
//!
//! The memory is this module's own page-aligned allocation (`O_DIRECT`
//! needs aligned buffers), never reachable through a Rust reference while
//! it is registered: [`SinkBlock::contents`] gives one only while the
//! block is retired, and its borrow keeps [`SinkBlock::grant`] from
//! registering the block again while the slice lives.
//!
//! Each block is an anonymous private mapping (mmap(2)): page-aligned and
//! zero-filled by the kernel on first touch. `std::alloc::alloc_zeroed`
//! with page alignment writes every byte instead (the system allocator
//! only uses calloc for small alignments), so making the pool touched
//! 42 MiB between the session's MPA Reply and its first grant, the client's
//! critical path before the first data (issue 27); now the pages are
//! touched when the data lands in them.

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::time::Instant;

use iwarp::{Access, MemoryRegion, ProtectionDomain};

use crate::Config;
use crate::Error;

use super::flow::SinkWindow;

/// Alignment and size granule of a block's memory.
const PAGE: usize = 4096;

/// One sink block (see the module docs).
pub(crate) struct SinkBlock {
    ptr: NonNull<u8>,
    /// Bytes mapped (`len` rounded up to whole pages).
    size: usize,
    len: usize,
    /// The registration while the block is granted (the peer may write).
    mr: Option<MemoryRegion>,
}

// SAFETY: a `SinkBlock` owns its allocation (freed only in `Drop`) and is
// used by one thread at a time through `&mut self` / `&self`; the raw
// pointer is what makes the type `!Send`, and sending the owner of a heap
// buffer to another thread is sound. The peer's writes are synchronised by
// the registration (module docs), not by the thread that owns the block.
unsafe impl Send for SinkBlock {}

impl fmt::Debug for SinkBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkBlock")
            .field("len", &self.len)
            .field("rkey", &self.mr.as_ref().map(|m| m.rkey()))
            .finish()
    }
}

impl SinkBlock {
    /// A zeroed, page-aligned, unregistered block of `len` bytes; its
    /// pages are not touched until used (module docs).
    pub(crate) fn new(len: usize) -> Result<SinkBlock, Error> {
        let oom = |e: Option<io::Error>| {
            Error::Local(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "allocating a {len}-byte sink block failed{}: use a smaller block size or I/O depth",
                    e.map(|e| format!(" ({e})")).unwrap_or_default()
                ),
            ))
        };
        let size = len
            .max(1)
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| oom(None))?;
        // SAFETY: a new anonymous private mapping: no address hint, no
        // file; the kernel picks a page-aligned range that overlaps
        // nothing of ours. Unmapped once, in `Drop`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(oom(Some(io::Error::last_os_error())));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| oom(None))?;
        Ok(SinkBlock {
            ptr,
            size,
            len,
            mr: None,
        })
    }

    /// Register the block for the peer's RDMA Write, unless it still is,
    /// and return its (rkey, address) for a grant.
    pub(crate) fn grant(&mut self, pd: &ProtectionDomain) -> io::Result<(u32, u64)> {
        if self.mr.is_none() {
            // SAFETY: `ptr..ptr + len` is our allocation, valid for reads
            // and writes until `Drop`, which deregisters before freeing.
            // No Rust reference to it exists while it is registered:
            // `contents` gives one only while `mr` is `None`, and its
            // borrow of `self` prevents this `&mut self` call meanwhile.
            let mr = unsafe {
                pd.reg_mr_raw(
                    self.ptr.as_ptr(),
                    self.len,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
            }
            .map_err(|e| {
                io::Error::other(format!(
                    "registering a sink block for the peer's RDMA Write failed: {e}"
                ))
            })?;
            self.mr = Some(mr);
        }
        let mr = self.mr.as_ref().expect("registered just above");
        Ok((mr.rkey(), mr.addr()))
    }

    /// End the peer's access before the block is read: deregister it
    /// (RFC 5040 §6.4 / RFC 5041 §7.2: a later segment naming its STag is
    /// refused with a Terminate). Returns once no placement into the
    /// memory is in progress or can start (module docs).
    pub(crate) fn retire(&mut self) {
        if let Some(mr) = self.mr.take() {
            let rkey = mr.rkey();
            drop(mr);
            tracing::trace!(rkey = format_args!("{rkey:#010x}"), "sink block retired");
        }
    }

    /// The block's bytes, while it is retired (`None` while the peer may
    /// write it).
    pub(crate) fn contents(&self) -> Option<&[u8]> {
        if self.mr.is_some() {
            return None;
        }
        // SAFETY: the memory is our live allocation of `len` bytes, and it
        // is not registered: no peer or device writes it (`retire` waited
        // for placement in flight), and `grant` needs `&mut self`, which
        // the returned borrow excludes.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }
}

impl Drop for SinkBlock {
    fn drop(&mut self) {
        // Deregister first: dropping the region waits for placement in
        // flight, after which the memory can go.
        self.retire();
        // SAFETY: `ptr..ptr + size` is the mapping `new` made, unmapped
        // once, here, after the registration is gone (no placement into
        // it can be in flight) and with no slice of it alive (`contents`
        // borrows `self`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_readable_only_while_retired_and_regrants_under_a_new_stag() {
        let ctx = iwarp::Context::open_device("soft").unwrap();
        let pd = ctx.alloc_pd();
        let mut b = SinkBlock::new(10_000).unwrap();
        assert_eq!(b.contents().map(<[u8]>::len), Some(10_000));
        assert_eq!(b.ptr.as_ptr() as usize % PAGE, 0, "page-aligned");
        let (k1, a1) = b.grant(&pd).unwrap();
        assert!(b.contents().is_none(), "no slice while the peer may write");
        assert_eq!(
            b.grant(&pd).unwrap(),
            (k1, a1),
            "a granted block keeps its STag"
        );
        b.retire();
        assert!(b.contents().unwrap().iter().all(|&x| x == 0));
        let (k2, a2) = b.grant(&pd).unwrap();
        assert_eq!(a2, a1);
        assert_ne!(k2, k1, "a new grant has a new STag");
        let stale = ctx
            .memory_access()
            .check(k1, a1, 1, pd.id(), Access::REMOTE_WRITE);
        assert_eq!(
            stale,
            Err(iwarp::MemError::InvalidStag),
            "the old STag is dead"
        );
    }

    /// issue 27: making the pool does not touch its memory (the kernel
    /// zero-fills a page when the data first lands in it). Before, the
    /// page-aligned `alloc_zeroed` wrote every byte: 64 MiB resident for
    /// 64 blocks of 1 MiB, on the client's path to its first grant.
    #[test]
    fn making_a_pool_does_not_touch_its_memory() {
        fn resident() -> u64 {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap();
            let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
            pages * PAGE as u64
        }
        let before = resident();
        let pool: Vec<SinkBlock> = (0..64).map(|_| SinkBlock::new(1 << 20).unwrap()).collect();
        let grew = resident().saturating_sub(before);
        assert!(
            grew < 16 << 20,
            "64 MiB of sink blocks made {} MiB resident (at most 16)",
            grew >> 20
        );
        // Zero-filled all the same (reading touches the pages now).
        assert!(pool[63].contents().unwrap().iter().all(|&b| b == 0));
    }

    /// The price of the re-key per block on the software provider:
    /// `cargo test --release -p rdma-xfer sink_rekey_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn sink_rekey_cost() {
        let ctx = iwarp::Context::open_device("soft").unwrap();
        let pd = ctx.alloc_pd();
        let mut b = SinkBlock::new(1 << 20).unwrap();
        let n = 20_000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            b.grant(&pd).unwrap();
            b.retire();
        }
        let per = t.elapsed() / n;
        println!("grant + retire of a 1 MiB sink block: {per:?} each");
    }
}

/// The sink's side of one transfer from its first grant on: the grant and
/// reorder window, the autotuned limit, and when each block was granted.
#[derive(Debug)]
pub(super) struct SinkState {
    pub(super) transfer: u64,
    pub(super) w: SinkWindow,
    pub(super) tune: crate::tune::Autotune,
    pub(super) granted_at: Vec<Option<Instant>>,
}

impl SinkState {
    /// Transfer `transfer` of about `len` bytes, whose source asked for
    /// `prerequest` grants.
    pub(super) fn new(cfg: &Config, transfer: u64, len: Option<u64>, prerequest: u32) -> SinkState {
        let depth = cfg.pool_depth();
        // The window inside the pool (crate::tune): never under today's
        // fixed default (16 MiB, 2-4 blocks per stream), grown while it
        // limits, shrunk when the rate falls.
        let streams = cfg.streams.max(1);
        let floor = (crate::tune::LAN_WINDOW / u64::from(cfg.block_size.max(1)))
            .clamp(u64::from(2 * streams), u64::from(4 * streams)) as u32;
        let mut st = SinkState {
            transfer,
            w: SinkWindow::new(depth, cfg.block_size, prerequest),
            tune: crate::tune::Autotune::new(depth, floor, cfg.block_size),
            granted_at: vec![None; depth as usize],
        };
        st.start_at(depth, cfg.block_size, len, cfg.autotune);
        st
    }

    /// A transfer that fits the pool is granted whole at once: the first
    /// round of grants covers it, no growing (issue 27 §3). Only grows.
    pub(super) fn start_at(&mut self, depth: u32, block: u32, len: Option<u64>, autotune: bool) {
        self.tune.start_at(crate::tune::first_window(
            self.tune.window(),
            depth,
            block,
            len,
        ));
        if autotune {
            self.w.set_limit(self.tune.window());
        }
    }
}
