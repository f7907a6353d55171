//! # ccache: the strongly coherent cache's daemons (issue 13)
//!
//! The I/O around [`ccache_proto`]:
//!
//! - [`table`]: the version table, a registered memory region with
//!   `REMOTE_READ` holding one checked 16-byte slot per document.
//! - [`ipc`]: ccappd's Table 1 IPC server (per-client output queues,
//!   peer credentials, connection and hold limits).
//! - [`access`]: the IPC allow-list (`SO_PEERCRED`) and the deployment's
//!   access token (HMAC proofs of it).
//! - [`listen`]: the RDMA listeners of the version table and of a proxy's
//!   state region: handshakes off the accept path with a deadline, a
//!   bound on live connections, the token checked before any queue pair.
//! - [`msgio`]: reading and writing the 16-byte IPC message on a stream.
//! - [`appd`]: the application module's servers (`ccappd`): the RDMA
//!   listener that hands out the table's address and rkey, the two-sided
//!   version thread, the Table 1 IPC server, and the update thread.
//! - [`docs`]: the document files ccappd serves and updates (a leaf:
//!   `appd` writes them, `push` reads them).
//! - [`check`]: the proxy's version checks: one RDMA Read of the slot, or
//!   a request to the version thread.
//! - [`proxy`]: `ccproxy`, an HTTP/1.1 caching reverse proxy (hyper on
//!   tokio) that validates every request.
//! - [`acheck`]: the version checks on the proxy's event loop.
//! - [`state`]: the proxy's cache and its cache state region (the
//!   most-recently-accessed list the module reads), with the Figure 12
//!   counters (misses, wasted updates).
//! - [`push`]: adaptive push-pull: the proxy's registration and push
//!   channel, and the module's pusher (state reads, policy, pushes).
//! - [`sockets`]: the `sockets` mode, the version request over
//!   iWARP sockets (ccappd's listener and the proxy's check).
//! - [`shard`]: documents sharded over application servers (the shard
//!   map file and the proxy's front).
//! - [`config`]: the TOML configuration files (`--config FILE`), the
//!   flags as their schema, the command line overriding them.
//! - [`load`]: `ccload`'s workloads (Zipf, sizes, access-log replay, a
//!   WorldCup-98-shaped log) and the stale checker.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod access;
pub mod acheck;
pub mod appd;
mod blocking;
pub mod check;
pub mod check_parts;
pub mod config;
pub mod docs;
pub mod ipc;
pub mod listen;
pub mod load;
pub mod msgio;
pub mod proxy;
pub mod push;
pub mod replay;
pub mod shard;
pub mod sockets;
pub mod state;
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

pub use config::args_with_config;
