//! # iwarp-rsocket: descriptors that are iWARP streams, and the C API
//!
//! The layer between C programs and `iwarp_sockets::Stream`:
//!
//! - [`table`]: which descriptor numbers are streams. A stream keeps the
//!   program's descriptor number: its readiness descriptor is `dup2`ed
//!   onto it, so `poll`, `select` and `epoll` work on it natively, and the
//!   socket calls on it come here.
//! - [`attach`]: making a descriptor a stream, after connect or on an
//!   accepted TCP connection whose first bytes are an MPA Request (RFC
//!   5044 §7.1), the way to share a port with plain TCP clients.
//! - [`settle`]: making deferred accepts streams off the program's
//!   threads (one watcher thread per process, placeholders, epoll
//!   registrations kept across the descriptor's replacement).
//! - [`ops`]: the socket calls on a stream, from C arguments, and the
//!   options a TCP socket takes before it becomes one ([`note_sockopt`],
//!   [`fcntl`]).
//! - `classify` (an accepted connection's first bytes: MPA or plain) and
//!   `fd` (descriptor helpers on [`real`]): leaves that [`attach`] and
//!   [`settle`] share, so neither imports the other.
//! - `capi`: the `rsocket.h`-style C API (`include/iwarp_rsocket.h`,
//!   `libiwarp_rsocket.so`).
//! - [`real`]: the C library's functions, for the preload shim
//!   (`crates/iwarp-preload`), which interposes the same names.
//!
//! `unsafe` lives at the C edge only: [`real`] (the function table),
//! [`ops`] (C pointers to slices), `capi` (the exported functions), and
//! descriptor handovers in [`attach`], `fd` and [`table`]; each block says
//! why it holds.

pub mod attach;
mod capi;
mod classify;
pub mod errno;
mod fd;
mod iomap;
pub mod ops;
pub mod real;
pub mod settle;
pub mod table;

pub use capi::*;
pub use iomap::*;
// The socket options and `fcntl` live with the other socket calls (ops),
// which the C API shares; here they stay reachable by their old paths.
pub use ops::{fcntl, note_sockopt, RDMA_IOMAPSIZE, SOL_RDMA};
