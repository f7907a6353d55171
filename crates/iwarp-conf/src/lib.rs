//! # iwarp-conf: settings parsing shared by the tools
//!
//! One fact, one place (issue 28): how a size is written on a command line
//! or in a configuration file is decided here, once, for every tool and
//! test-support crate that takes one (rftp, the fault relay behind
//! `delay-bridge`). The crate has no dependencies, so anything may depend
//! on it without pulling in more, and nothing in it can import upwards.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod size;

pub use size::parse_size;
