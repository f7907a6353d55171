//! iwarp-perf's wire formats, as a library so that they can be fuzzed
//! (`fuzz/fuzz_targets/perf_wire.rs`) and tested without the program.
//!
//! - [`params`]: iwarp-perf's own protocol: the request block a client
//!   carries in its MPA Request's private data (RFC 5044 §7.1) or as the
//!   first bytes of a raw-TCP baseline connection, and the server's reply
//!   block in the MPA Reply.
//! - [`perftest_wire`]: the control messages perftest (`ib_write_bw -R`
//!   ...) exchanges over its rdma_cm connection.
//! - [`proc_stats`]: the process's CPU seconds and threads, for both
//!   programs (iwarp-perf and iwarp-connrate).
//!
//! Every decoder takes untrusted bytes from the peer and returns an error
//! naming what is wrong; none panics.

pub mod params;
#[path = "perftest/wire.rs"]
pub mod perftest_wire;
pub mod proc_stats;
