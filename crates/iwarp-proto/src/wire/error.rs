//! The parse error of every wire header ([`Error`], [`Result`]): a leaf
//! that the header modules import and `wire` re-exports, so no header
//! module reaches up to its parent for it.

use core::fmt;

/// A parse error of a wire header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the header (or than the lengths it
    /// announces).
    Truncated,
    /// The bytes are present but violate the format; the string names the
    /// rule.
    Malformed(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "buffer too short for the header it should contain"),
            Error::Malformed(why) => write!(f, "malformed header: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of a wire parse.
pub type Result<T> = core::result::Result<T, Error>;
