//! # ccache-proto: the strongly coherent cache's protocol layer (issue 13)
//!
//! Proxies cache dynamic documents and, on **every** request, check the
//! document's current version at the application tier before answering
//! from cache. The application module (`ccappd`) keeps each document's
//! 64-bit version at a fixed slot of a registered memory region, so the
//! proxy's check is one RDMA Read and needs no thread on the application
//! server; a two-sided request to a version thread is the fallback.
//!
//! This crate is sans-IO, like `iwarp-proto` under the verbs crate: no
//! sockets, no threads, no clock, no dependencies beyond `std`.
//!
//! - [`ipc`]: the fixed 16-byte message of the IPC between the application
//!   server / update thread and the application module (Table 1), also used
//!   by the two-sided version request. A zero-copy view with `new_checked`
//!   and a `Repr` with `parse` / `emit`.
//! - [`mrsw`]: the multiple-reader-single-writer state machine of Table 1
//!   (`READ_REQUEST` → `READ_PROCEED` → `READ_DONE`; `UPDATE_REQUEST` waits
//!   for the read queue to drain; new readers wait behind a queued or
//!   running update; `UPDATE_DONE` bumps the version and releases them).
//! - [`slot`]: how one version is laid out in the region (value plus a
//!   check word, so a torn read is detected) and the advertisement of the
//!   region (address, rkey, slot count) carried in the MPA private data.
//! - [`state`]: a proxy's cache state region (most-recently-accessed list
//!   with access time, frequency, weight and cached version), published
//!   with a generation in every part so a concurrent reader never takes a
//!   torn entry; and the push / pull / hybrid [`state::Policy`].
//! - [`push`]: the frames of the push channel (registration, pushed
//!   documents and their acknowledgements, state requests).
//! - [`auth`]: the proof of the shared access token in MPA private data
//!   and in the push registration, and the listeners' refusals.
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod auth;
pub mod ipc;
pub mod mrsw;
pub mod push;
pub mod slot;
pub mod state;
