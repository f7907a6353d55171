//! # libiwarp: the C API of the user-space software iWARP stack
//!
//! A C face for the [`iwarp_rs`] crate (RFC 5040 RDMAP, RFC 5041 DDP,
//! RFC 5044 MPA with the RFC 6581 enhancements, over TCP; wire compatible
//! with Linux siw). Names follow libibverbs (`iwarp_alloc_pd` ~
//! `ibv_alloc_pd`, `iwarp_post_send` ~ `ibv_post_send`, ...) and librdmacm
//! (`iwarp_connect` ~ `rdma_connect`, `iwarp_get_request` ~
//! `rdma_get_request`, ...). The header `include/iwarp.h` is generated from
//! this crate by cbindgen and committed; `scripts/test-capi.sh` fails when
//! it is stale. `docs/C_API.md` is the user guide.
//!
//! ## The boundary (modeled on rustls-ffi)
//!
//! - **Panics** never cross into C: every exported function runs its body in
//!   `boundary::guard` (or `guard_value` / `guard_or`), which turns a
//!   panic into `IWARP_ERR_PANIC` (or a documented fallback value) plus an
//!   `iwarp_last_error` message.
//! - **NULL** pointer arguments give `IWARP_ERR_NULL_ARG` (or the documented
//!   fallback for functions that return a value); free functions accept
//!   NULL as a no-op.
//! - **Handles** are opaque: a `Box` of the Rust object behind a pointer to
//!   a struct C cannot see into. The Rust objects are reference counted
//!   internally, so handles may be freed in any order (a QP keeps its CQs
//!   alive, a region keeps the device's region table alive).
//! - **Errors** carry a thread-local message naming the cause and the fix
//!   (see [`error`]).
//! - **`unsafe`** appears only here, at the edge: dereferencing handles and
//!   reading or writing caller memory, each with a `// SAFETY:` comment.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// The exported C names (`iwarp_context`, `IWARP_OK`, ...) are the API.
#![allow(non_camel_case_types)]

// Declaration order is the order of the generated header: results and
// errors, then verbs, then connection management.
pub mod consts;

pub mod error;

pub mod strerror;

pub mod verbs;

pub mod cm;

pub mod boundary;

pub use cm::*;
pub use consts::*;
pub use error::*;
pub use strerror::*;
pub use verbs::*;

/// The library version as a static NUL-terminated string (the crate's, "0.6.0").
#[no_mangle]
pub extern "C" fn iwarp_version() -> *const std::ffi::c_char {
    boundary::guard_value("iwarp_version", c"".as_ptr(), || {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}
