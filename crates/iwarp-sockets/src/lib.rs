//! placeholder
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod flow;
pub mod wire;
