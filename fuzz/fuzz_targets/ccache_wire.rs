//! Fuzz target: the coherent cache's wire formats from `ccache-proto`,
//! all of which arrive from another process: the 16-byte IPC message, a
//! proxy's cache state region (read by RDMA Read or over the push
//! channel), and the push channel's frame header and registration.
//! Nothing may panic; whatever parses emits back to the same meaning, and
//! the push policy decides on any parsed state without panicking.
#![no_main]

use ccache_proto::ipc::Repr;
use ccache_proto::push::{Header, Registration};
use ccache_proto::state::{Policy, Region, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Repr::from_bytes(data) {
        assert_eq!(Repr::from_bytes(&r.to_bytes()), Ok(r));
    }
    if let Ok(h) = Header::parse(data) {
        assert_eq!(Header::parse(&h.emit()), Ok(h));
    }
    if let Ok(r) = Registration::parse(data) {
        assert_eq!(Registration::parse(&r.emit()), Ok(r));
    }
    if let Ok(v) = Region::new_checked(data) {
        let _ = (v.header_ok(), v.trailer_generation(), v.published_us());
        for i in 0..v.count().min(64) {
            let _ = v.entry(i);
        }
    }
    if let Ok(s) = Snapshot::parse(data) {
        assert_eq!(Snapshot::parse(&s.to_bytes()), Ok(s.clone()));
        let doc = data.last().copied().map_or(0, u32::from);
        for p in [Policy::Pull, Policy::Push, Policy::Hybrid { percent: 20 }] {
            let _ = p.decide(&s, doc, u64::MAX);
        }
    }
});
