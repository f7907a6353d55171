//! # iwarp-proto: the sans-IO core of a software iWARP stack
//!
//! Implements, without sockets, threads or clocks:
//! - RFC 5044 MPA with RFC 6581 enhanced connection setup ([`wire::mpa`],
//!   [`handshake`]),
//! - RFC 5041 DDP ([`wire::ddp`]),
//! - RFC 5040 RDMAP ([`wire::rdmap`], [`wire::terminate`]),
//! - the queue-pair engine that ties them together ([`engine`]),
//! - the one mapping from an error to its Terminate code ([`fault`]).
//!
//! The layers follow smoltcp's: `wire` holds zero-copy packet views with
//! `parse`/`emit` representations; `engine` holds the state machine; the
//! `iwarp` crate is the thin I/O driver and the verbs / connection-manager API.
//! [`mod@env`] is how every library crate of the stack reads an `IWARP_*`
//! variable: not at all in a privileged (setuid) process.
// `deny`, not `forbid`: the CRC32C kernel (`wire::crc`) has to call a
// `#[target_feature]` function after checking the CPU, and `env` asks
// the C library whether the process is privileged (getauxval): the
// crate's only `unsafe`, each allowed on that function alone.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod engine;
pub mod env;
pub mod fault;
pub mod handshake;
pub mod mem;
pub mod wire;
