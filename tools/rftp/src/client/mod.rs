//! The client side: an FTP control connection with the RDMA extension,
//! and the `get` / `put` operations of the `rftp` binary.
//!
//! The modules, by role (each imports only the ones above it in this list
//! that it needs; none imports this parent):
//!
//! - `url`: `ftp://` URLs.
//! - `ftp`: the control connection and its commands.
//! - `options`: a transfer's options, the plan for the path, the summary.
//! - `session`: connect and log in; the rdma-xfer session kept across
//!   transfers.
//! - `transfer`: what downloads and uploads share (plain copy, final
//!   reply, checksum verification, memory-to-memory).
//! - `retry`: the retry policy (which failures, what backoff) and the
//!   one retry loop downloads and uploads share.
//! - `get`: downloads, resume and retries.
//! - `put`: uploads.

mod ftp;
mod get;
mod options;
mod put;
mod retry;
mod session;
mod transfer;
mod url;

pub use ftp::{Ftp, Reply};
pub use get::{get, get_retrying, get_with, part_path};
pub use options::{Options, ProgressCb, Summary, DEFAULT_WINDOW};
pub use put::{put, put_retrying, put_with, remote_part};
pub use retry::{backoff, transient};
pub use session::{plan_for_path, plan_sized, session, XferSlot};
pub use url::Url;
