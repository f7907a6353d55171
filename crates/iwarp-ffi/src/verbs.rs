//! Verbs (libibverbs names): device, protection domain, memory regions,
//! completion queues, queue pairs, posting and polling.
//!
//! One file per object, as libibverbs' `verbs.h` groups them: the C types
//! (`verbs/types.rs`), device and protection domain (`device.rs`), memory
//! regions (`mr.rs`), completion queues (`cq.rs`), queue pairs (`qp.rs`).

// In this order: cbindgen writes include/iwarp.h in the order it reads the
// modules, and the header keeps the order verbs.rs had as one file.
mod types;

mod device;

mod mr;

mod cq;

mod qp;

#[cfg(test)]
mod tests;

pub use cq::*;
pub use device::*;
pub use mr::*;
pub use qp::*;
pub use types::*;
