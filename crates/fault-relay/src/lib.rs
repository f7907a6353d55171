//! # fault-relay: the relay behind `delay-bridge`
//!
//! A test-support crate (issue 28): the fault-injecting relay every test
//! that needs one uses, as a library ([`start`]) or as the `delay-bridge`
//! binary. It is a user-space TCP relay that delays
//! each direction by a fixed time and can inject faults, so tests can run
//! real transfers over a path that breaks in controlled ways.
//!
//! Each `LISTEN=TARGET` *mapping* accepts connections and connects each
//! to its target; every connection gets two *directions*: `up` (from the
//! connecting side to the target) and `down` (back). A direction is a
//! reader thread, which reads chunks and stamps them with their arrival
//! time, and a writer thread, which forwards them once the delay has
//! passed. All faults act in the writer, at an exact stream offset (bytes
//! of that direction) or at a time since the connection was accepted.
//!
//! A fault is a [`FaultSpec`], parsed from `KIND[:KEY=VALUE,...]`:
//!
//! | kind | what it does once triggered |
//! | --- | --- |
//! | `drop` | closes both connections: `how=rst` (default) aborts with RST (SO_LINGER 0), `how=fin` closes gracefully |
//! | `stall` | stops forwarding in the direction for `for=MS` (default 1000), then resumes |
//! | `truncate` | stops forwarding in the direction and half-closes it (`how=half`, default; later bytes are swallowed) or closes both connections gracefully (`how=close`) |
//! | `blackhole` | swallows every later byte in the direction, end of stream included, and keeps both connections open |
//! | `corrupt` | flips the byte at stream offset `at` (XOR 0xFF) |
//! | `reseg` | from `at` on, writes the stream in random pieces (1 byte to `max`, log-uniform, default max 65536) spanning the reads' boundaries, seeded by `seed` |
//!
//! Keys common to all kinds: `at=` (alias `after=`) a byte offset (`4096`,
//! `1M`) or a time (`500ms`, `2s`), default 0; `dir=up|down|both`
//! (default both: each direction counts its own bytes); `map=I` (0-based
//! index of the mapping, default every mapping); `conn=N`, `N-M` or `N-`
//! (1-based index of the connection on its mapping, default every one).
//! Each fault fires once per connection and direction. `wait=signal`
//! (library only): once due, the fault holds its direction (forwards
//! nothing) until the test raises [`Config::signal`], then fires, so a
//! fault can follow an event the test observed instead of a byte count.
//!
//! With an [`Alg`], the relay also rewrites the address a peer announces
//! for a second connection (mod_rdma's `RDMA:` header, FTP's EPSV/PASV
//! replies) to a listener of its own, so that connection runs through the
//! relay too, as one more mapping.
//!
//! Modules by role: `spec` (fault specs and mappings), `config` (shared
//! settings), `conn` (a connection's sockets and readers), `writer` (delay
//! and faults), `rewrite` (the ALG), `relay` (the accept loop).
#![deny(unsafe_op_in_unsafe_fn)]

mod config;
mod conn;
mod relay;
mod rewrite;
mod spec;
mod writer;

#[cfg(test)]
mod tests;

pub use config::{Alg, Config, Rng, Signal};
pub use relay::{serve, start};
pub use spec::{parse_mapping, parse_size, ConnRange, Dir, FaultSpec, Kind, Trigger};
