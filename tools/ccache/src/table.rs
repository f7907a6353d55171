//! The version table: one checked slot per document in a registered
//! memory region that proxies RDMA-Read (layout: [`ccache_proto::slot`]).
//!
//! Publishing writes the slot's 16 bytes with one copy into the region;
//! a concurrent RDMA Read of it may see a torn mix, which the slot's check
//! word reveals and the reader reads again. Stores are serialized by the
//! caller (the IPC server holds the Table 1 state lock while it publishes).

use ccache_proto::slot::{self, Advert, SLOT_LEN};
use iwarp::{Access, MemoryRegion, ProtectionDomain};

/// The region and its geometry.
#[derive(Debug)]
pub struct VersionTable {
    mr: MemoryRegion,
    slots: u32,
}

impl VersionTable {
    /// Register a table of `slots` documents, all at version `initial`.
    pub fn new(
        pd: &ProtectionDomain,
        slots: u32,
        initial: u64,
    ) -> Result<VersionTable, iwarp::Error> {
        let len = (slots.max(1) as usize) * SLOT_LEN;
        let mr = pd.reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
        let t = VersionTable { mr, slots };
        for s in 0..slots {
            t.publish(s, initial);
        }
        Ok(t)
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Store `version` in `slot`. Slots outside the table are ignored (the
    /// Table 1 state refuses such documents before anything is published).
    pub fn publish(&self, slot: u32, version: u64) {
        if slot < self.slots {
            self.mr
                .write_at(slot as usize * SLOT_LEN, &slot::encode(slot, version));
        }
    }

    /// The version in `slot` as a proxy would read it: `None` outside the
    /// table, `Some(Err)` if a thousand copies in a row overlapped a
    /// publish.
    pub fn get(&self, slot: u32) -> Option<Result<u64, slot::SlotError>> {
        if slot >= self.slots {
            return None;
        }
        // A copy that overlapped a publish is torn; the next one is not
        // (publishes are a 16-byte copy, far apart).
        let mut last = Err(slot::SlotError::Torn { slot });
        for _ in 0..1000 {
            let mut b = [0u8; SLOT_LEN];
            self.mr.read_at(slot as usize * SLOT_LEN, &mut b);
            last = slot::decode(slot, &b);
            if last.is_ok() {
                break;
            }
            std::hint::spin_loop();
        }
        Some(last)
    }

    /// What the proxies need to read it: the connection reply's private
    /// data.
    pub fn advert(&self) -> Advert {
        Advert {
            slots: self.slots,
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            slot_len: SLOT_LEN as u32,
        }
    }
}
