//! # iwarp-conf: settings parsing shared by the tools
//!
//! One fact, one place (issue 28): how a size is written on a command line
//! or in a configuration file, and how a configuration file and the
//! environment are read, are decided here, once, for every tool and
//! test-support crate that takes them (rftp, ccache, the fault relay
//! behind `delay-bridge`). Without features the crate has no
//! dependencies, so anything may depend on it without pulling in more,
//! and nothing in it can import upwards. The `toml` feature adds
//! [`load`] (serde and toml) and the field deserializers of [`de`]; [`load_lenient`] is the same loader for
//! a program that must go on whatever its settings say (each bad setting
//! left out and reported, the rest applied: the LD_PRELOAD shim).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "toml")]
pub mod de;
#[cfg(feature = "toml")]
mod file;
mod size;

#[cfg(feature = "toml")]
pub use file::{load, load_from, load_lenient, load_lenient_from};
pub use size::parse_size;
