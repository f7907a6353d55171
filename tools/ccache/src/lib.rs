//! # ccache: the strongly coherent cache's daemons (issue 13)
//!
//! The I/O around [`ccache_proto`]:
//!
//! - [`table`]: the version table, a registered memory region with
//!   `REMOTE_READ` holding one checked 16-byte slot per document.
//! - [`msgio`]: reading and writing the 16-byte IPC message on a stream.
//! - [`appd`]: the application module's servers (`ccappd`): the RDMA
//!   listener that hands out the table's address and rkey, the two-sided
//!   version thread, the Table 1 IPC server, and the update thread.
//! - [`check`]: the proxy's version checks: one RDMA Read of the slot, or
//!   a request to the version thread.
//! - [`http`] and [`proxy`]: `ccproxy`, a minimal HTTP/1.1 caching reverse
//!   proxy that validates every request.
//! - [`sockets`]: the `sockets` mode, the version request over
//!   iWARP sockets (ccappd's listener and the proxy's check).
//! - [`shard`]: documents sharded over application servers (the shard
//!   map file and the proxy's front).
//! - [`load`]: `ccload`'s workloads (Zipf, sizes, access-log replay, a
//!   WorldCup-98-shaped log) and the stale checker.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod appd;
pub mod check;
pub mod http;
pub mod load;
pub mod msgio;
pub mod proxy;
pub mod shard;
pub mod sockets;
pub mod table;

/// Install the `tracing` subscriber (`RUST_LOG`, default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
