//! # iwarp-tools: command-line tools for the software iWARP stack
//!
//! - `iwarp-ping` ([`ping`]): rdma-core `rping`'s protocol, byte for byte
//!   ([`rping`]), so it can ping and be pinged by rping on a Linux siw host.
//! - `iwarp-demo` ([`demo`]): loopback demonstrations in one process, and
//!   the traffic generator `scripts/tshark-check.sh` captures (every RDMAP
//!   opcode, ending in a Terminate).
//!
//! The binaries are thin: argument parsing in `src/bin`, everything else
//! here so that it is unit-tested. Logging goes through `tracing`, filtered
//! by `RUST_LOG` ([`trace`]).
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod cli;
pub mod demo;
pub mod endpoint;
pub mod error;
pub mod ping;
pub mod rping;
pub mod trace;
